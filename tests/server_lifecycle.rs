//! Admin endpoints, readiness over the server's life, graceful drain and
//! connection timeouts, over real sockets.

mod server_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use gpu_deploy_guard::metrics::Metrics;
use gpu_deploy_guard::serve::readiness::{NotReady, Readiness, admin_router};
use gpu_deploy_guard::serve::tls::TlsSource;
use server_support::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tower::ServiceExt;

async fn admin_get(router: &axum::Router, path: &str) -> (StatusCode, String, Option<String>) {
    let response = router
        .clone()
        .oneshot(Request::get(path).body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string());
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    (
        status,
        String::from_utf8(body.to_vec()).unwrap(),
        content_type,
    )
}

#[tokio::test]
async fn readiness_follows_phase_and_gates() {
    let readiness = Readiness::new();
    let router = admin_router(Arc::new(Metrics::new()), readiness.clone());

    assert_eq!(admin_get(&router, "/livez").await.0, StatusCode::OK);
    let (status, body, _) = admin_get(&router, "/readyz").await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, "starting")
    );
    // Turning "not serving" before ever serving is still "starting".
    readiness.set_serving(false);
    assert_eq!(readiness.status(), Err(NotReady::Starting));

    let cache = readiness.gate("cluster-cache");
    let audit = readiness.gate("audit");
    assert_eq!(readiness.gate("cluster-cache").name(), "cluster-cache");
    readiness.set_serving(true);
    let (status, body, _) = admin_get(&router, "/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body, "waiting for: cluster-cache, audit");

    cache.open();
    assert_eq!(readiness.status(), Err(NotReady::Waiting(vec!["audit"])));
    // The same name gives the same gate: opening the copy counts.
    readiness.gate("audit").open();
    assert!(audit.is_open());
    assert_eq!(admin_get(&router, "/readyz").await.0, StatusCode::OK);
    assert_eq!(admin_get(&router, "/readyz").await.1, "ready");

    readiness.set_serving(false);
    let (status, body, _) = admin_get(&router, "/readyz").await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, "draining")
    );
    assert_eq!(admin_get(&router, "/livez").await.1, "ok");
}

#[tokio::test]
async fn admin_port_serves_probes_and_metrics() {
    let readiness = Readiness::new();
    let gate = readiness.gate("cluster-cache");
    let server = start_with(
        options(TlsSource::SelfSigned { write_ca: None }),
        hello_app(),
        readiness,
    )
    .await;
    let admin = plain_client();
    let url = |path: &str| format!("http://{}{path}", server.admin);

    let livez = admin.get(url("/livez")).send().await.unwrap();
    assert_eq!(livez.status(), 200);
    assert_eq!(livez.text().await.unwrap(), "ok");

    let readyz = admin.get(url("/readyz")).send().await.unwrap();
    assert_eq!(readyz.status(), 503);
    assert_eq!(readyz.text().await.unwrap(), "waiting for: cluster-cache");
    gate.open();
    let readyz = admin.get(url("/readyz")).send().await.unwrap();
    assert_eq!(readyz.status(), 200);

    let metrics = admin.get(url("/metrics")).send().await.unwrap();
    assert_eq!(metrics.status(), 200);
    assert_eq!(
        metrics.headers()["content-type"],
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    let text = metrics.text().await.unwrap();
    assert!(
        text.contains("gpu_deploy_guard_tls_certificate_expiry_timestamp_seconds"),
        "{text}"
    );
    assert!(text.ends_with("# EOF\n"), "{text}");

    server.stop().await.unwrap();
}

/// A router whose `/slow` handler reports that it started, then sleeps.
fn slow_app(started: mpsc::UnboundedSender<()>, sleep: Duration) -> axum::Router {
    axum::Router::new().route(
        "/slow",
        axum::routing::get(move || {
            let started = started.clone();
            async move {
                let _ = started.send(());
                tokio::time::sleep(sleep).await;
                "done"
            }
        }),
    )
}

#[tokio::test]
async fn shutdown_drains_in_flight_requests_and_refuses_new_ones() {
    let dir = tempfile::tempdir().unwrap();
    let ca_path = dir.path().join("ca.crt");
    let (started, mut handler_started) = mpsc::unbounded_channel();
    let mut server = start(
        options(TlsSource::SelfSigned {
            write_ca: Some(ca_path.clone()),
        }),
        slow_app(started, Duration::from_secs(1)),
    )
    .await;
    let ca_pem = std::fs::read_to_string(&ca_path).unwrap();
    let url = format!("https://{}/slow", server.addr);
    let admin = plain_client();
    let readyz = format!("http://{}/readyz", server.admin);
    assert_eq!(admin.get(&readyz).send().await.unwrap().status(), 200);

    // One request per protocol: HTTP/1.1 is closed after its response,
    // HTTP/2 gets a GOAWAY that must still let the open stream finish.
    let mut in_flight = Vec::new();
    for http1 in [true, false] {
        let builder = client(&ca_pem);
        let client = if http1 { builder.http1_only() } else { builder }
            .build()
            .unwrap();
        let url = url.clone();
        in_flight.push(tokio::spawn(async move {
            let response = client.get(&url).send().await?;
            let version = response.version();
            let status = response.status();
            Ok::<_, reqwest::Error>((version, status, response.text().await?))
        }));
    }
    for _ in 0..2 {
        tokio::time::timeout(Duration::from_secs(10), handler_started.recv())
            .await
            .expect("slow handlers did not start");
    }

    server.shutdown();
    let draining = eventually(Duration::from_secs(5), || async {
        match admin.get(&readyz).send().await {
            Ok(r) => r.status() == 503 && r.text().await.unwrap_or_default() == "draining",
            Err(_) => false,
        }
    })
    .await;
    assert!(draining, "/readyz did not report draining during the drain");
    let refused = eventually(Duration::from_secs(5), || async {
        tokio::net::TcpStream::connect(server.addr).await.is_err()
    })
    .await;
    assert!(refused, "new connections still accepted after shutdown");

    let mut versions = Vec::new();
    for request in in_flight {
        let (version, status, body) = request.await.unwrap().expect("in-flight request failed");
        assert_eq!((status.as_u16(), body.as_str()), (200, "done"));
        versions.push(version);
    }
    assert_eq!(
        versions,
        [reqwest::Version::HTTP_11, reqwest::Version::HTTP_2]
    );

    let admin_addr = server.admin;
    server.stop().await.expect("run returns Ok after draining");
    assert!(
        tokio::net::TcpStream::connect(admin_addr).await.is_err(),
        "admin port still open after run returned"
    );
}

#[tokio::test]
async fn drain_is_bounded_by_drain_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let ca_path = dir.path().join("ca.crt");
    let (started, mut handler_started) = mpsc::unbounded_channel();
    let mut opts = options(TlsSource::SelfSigned {
        write_ca: Some(ca_path.clone()),
    });
    opts.drain_timeout = Duration::from_millis(300);
    let server = start(opts, slow_app(started, Duration::from_secs(60))).await;
    let ca_pem = std::fs::read_to_string(&ca_path).unwrap();

    let client = client(&ca_pem)
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let url = format!("https://{}/slow", server.addr);
    let request = tokio::spawn(async move { client.get(&url).send().await });
    handler_started.recv().await.unwrap();

    let begun = Instant::now();
    server
        .stop()
        .await
        .expect("run returns Ok after the drain timeout");
    assert!(
        begun.elapsed() < Duration::from_secs(15),
        "{:?}",
        begun.elapsed()
    );
    let outcome = tokio::time::timeout(Duration::from_secs(10), request)
        .await
        .expect("the cut request did not end")
        .unwrap();
    assert!(
        outcome.is_err(),
        "a request outliving the drain was not cut"
    );
}

/// Reads until the peer closes (EOF or error) and returns how long that took
/// and what was read.
async fn time_until_closed(mut stream: impl AsyncRead + Unpin) -> (Duration, Vec<u8>) {
    let begun = Instant::now();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let read_all = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(15), read_all)
        .await
        .expect("connection still open after 15s");
    (begun.elapsed(), seen)
}

/// The connection must be closed by the 1 s header timeout of [`options`]: not at
/// once (that would be some other error) and well before the 4 s idle timeout.
fn assert_closed_by_timeout(elapsed: Duration, what: &str) {
    assert!(
        elapsed >= Duration::from_millis(500) && elapsed < Duration::from_millis(3500),
        "{what}: closed after {elapsed:?}, expected about 1s"
    );
}

/// The connection must be closed by the 4 s idle timeout of [`options`].
fn assert_closed_when_idle(elapsed: Duration, what: &str) {
    assert!(
        elapsed >= Duration::from_millis(3500) && elapsed <= Duration::from_secs(12),
        "{what}: closed after {elapsed:?}, expected about 4s"
    );
}

/// Sends `GET /` on an HTTP/1.1 connection and reads the whole "hello" answer.
async fn get_hello(stream: &mut (impl AsyncRead + AsyncWrite + Unpin)) {
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut response = Vec::new();
    while !response.ends_with(b"hello") {
        let mut buf = [0u8; 1024];
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before answering");
        response.extend_from_slice(&buf[..n]);
    }
    assert!(response.starts_with(b"HTTP/1.1 200"));
}

#[tokio::test]
async fn stalled_or_silent_clients_are_cut_and_others_still_served() {
    let dir = tempfile::tempdir().unwrap();
    let ca_path = dir.path().join("ca.crt");
    let server = start(
        options(TlsSource::SelfSigned {
            write_ca: Some(ca_path.clone()),
        }),
        hello_app(),
    )
    .await;
    let ca_pem = std::fs::read_to_string(&ca_path).unwrap();
    let addr = server.addr;

    // Half a request line, then nothing.
    let mut half = tls_connect(addr, &ca_pem, &[b"http/1.1"]).await.unwrap();
    half.write_all(b"GET / HT").await.unwrap();
    half.flush().await.unwrap();
    let half = tokio::spawn(time_until_closed(half));

    // No TLS handshake at all.
    let silent_tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let silent_tcp = tokio::spawn(time_until_closed(silent_tcp));

    // HTTP/2 negotiated, but no connection preface.
    let silent_h2 = tls_connect(addr, &ca_pem, &[b"h2"]).await.unwrap();
    assert_eq!(silent_h2.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let silent_h2 = tokio::spawn(time_until_closed(silent_h2));

    // A complete request, then an idle keep-alive connection: kept for the idle timeout, not
    // cut at the header timeout.
    let mut idle = tls_connect(addr, &ca_pem, &[b"http/1.1"]).await.unwrap();
    get_hello(&mut idle).await;
    let idle = tokio::spawn(time_until_closed(idle));

    // A kept connection idle for longer than the header timeout still serves the next request;
    // then the head of a third one stalls half-way and the header timeout applies again.
    let mut reused = tls_connect(addr, &ca_pem, &[b"http/1.1"]).await.unwrap();
    get_hello(&mut reused).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    get_hello(&mut reused).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    reused.write_all(b"GET / HT").await.unwrap();
    reused.flush().await.unwrap();
    let reused = tokio::spawn(time_until_closed(reused));

    // Meanwhile a normal client is served.
    let ok = client(&ca_pem).build().unwrap();
    let response = ok.get(format!("https://{addr}/")).send().await.unwrap();
    assert_eq!(response.text().await.unwrap(), "hello");

    let (elapsed, _) = half.await.unwrap();
    assert_closed_by_timeout(elapsed, "half request line");
    let (elapsed, _) = silent_tcp.await.unwrap();
    assert_closed_by_timeout(elapsed, "no TLS handshake");
    let (elapsed, _) = silent_h2.await.unwrap();
    assert_closed_by_timeout(elapsed, "no HTTP/2 preface");
    let (elapsed, _) = reused.await.unwrap();
    assert_closed_by_timeout(elapsed, "half request head on a kept connection");
    let (elapsed, _) = idle.await.unwrap();
    assert_closed_when_idle(elapsed, "idle keep-alive");

    // Each cut is counted: the half line, the stalled second head and the missing preface by
    // the header timeout, the idle connection by the idle timeout, the silent TCP connection
    // as a handshake timeout; the five TLS clients above shook hands.
    let metrics = server.metrics.encode();
    for line in [
        r#"gpu_deploy_guard_webhook_connection_timeouts_total{reason="header"} 3"#,
        r#"gpu_deploy_guard_webhook_connection_timeouts_total{reason="idle"} 1"#,
        r#"gpu_deploy_guard_webhook_tls_handshakes_total{result="timeout"} 1"#,
        r#"gpu_deploy_guard_webhook_tls_handshakes_total{result="failure"} 0"#,
    ] {
        assert!(metrics.contains(line), "{line} missing from\n{metrics}");
    }

    let response = ok.get(format!("https://{addr}/")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    server.stop().await.unwrap();
}

#[tokio::test]
async fn handlers_see_the_peer_address() {
    use axum::extract::ConnectInfo;
    use std::net::SocketAddr;
    let app = axum::Router::new().route(
        "/peer",
        axum::routing::get(|ConnectInfo(peer): ConnectInfo<SocketAddr>| async move {
            peer.ip().to_string()
        }),
    );
    let dir = tempfile::tempdir().unwrap();
    let ca_path = dir.path().join("ca.crt");
    let server = start(
        options(TlsSource::SelfSigned {
            write_ca: Some(ca_path.clone()),
        }),
        app,
    )
    .await;
    let ca_pem = std::fs::read_to_string(&ca_path).unwrap();
    let body = client(&ca_pem)
        .build()
        .unwrap()
        .get(format!("https://{}/peer", server.addr))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(body, "127.0.0.1");
    server.stop().await.unwrap();
}

#[tokio::test]
async fn during_the_shutdown_delay_new_requests_are_still_served() {
    let dir = tempfile::tempdir().unwrap();
    let ca_path = dir.path().join("ca.crt");
    let mut opts = options(TlsSource::SelfSigned {
        write_ca: Some(ca_path.clone()),
    });
    opts.shutdown_delay = Duration::from_secs(2);
    let mut server = start(opts, hello_app()).await;
    let ca_pem = std::fs::read_to_string(&ca_path).unwrap();
    let admin = plain_client();
    let readyz = format!("http://{}/readyz", server.admin);

    server.shutdown();
    let draining = eventually(Duration::from_secs(1), || async {
        match admin.get(&readyz).send().await {
            Ok(r) => r.status() == 503,
            Err(_) => false,
        }
    })
    .await;
    assert!(draining, "/readyz is not 503 at the start of the delay");
    // Readiness already says 503, yet a new connection is served: the endpoint
    // may still be in the Service for a moment.
    let client = client(&ca_pem).build().unwrap();
    let response = client
        .get(format!("https://{}/", server.addr))
        .send()
        .await
        .expect("refused during the shutdown delay");
    assert_eq!(response.text().await.unwrap(), "hello");
    server.stop().await.expect("run returns Ok after the delay");
}
