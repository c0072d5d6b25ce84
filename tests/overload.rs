//! `serve` as a process under the second round of attacks: what a client with network reach
//! alone can take from the others (connection slots, handshakes, the in-flight body budget,
//! the admin port's probes), what request fields can do to the text log, and how every
//! terminating signal ends the process.
//!
//! Attackers connect from 127.0.0.9 and the good client from 127.0.0.1, so that the server
//! sees two sources, as it would see a hostile pod and the API server.

mod hardening_support;
mod process_support;
mod server_support;

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hardening_support::*;
use serde_json::Value;
use server_support::tls_over;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};

/// The attackers' source address.
const ATTACKER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 9));

/// A TCP connection to `addr` from [`ATTACKER`].
async fn connect_from_attacker(addr: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(ATTACKER, 0))?;
    socket.connect(addr).await
}

/// An HTTP/2 connection from [`ATTACKER`]; the h2 library answers PINGs while it runs.
async fn h2_from_attacker(
    addr: SocketAddr,
    ca: &str,
) -> anyhow::Result<(h2::client::SendRequest<Bytes>, tokio::task::JoinHandle<()>)> {
    let tcp = connect_from_attacker(addr).await?;
    let tls = tls_over(tcp, ca, &[b"h2"]).await?;
    let (send, conn) = h2::client::handshake(tls).await?;
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok((send, task))
}

/// `count` good reviews from 127.0.0.1 one after the other, each on a new connection: how
/// many were answered 200 and the slowest answer.
async fn good_reviews(serve: &Serve, count: usize) -> (usize, Duration) {
    let mut ok = 0;
    let mut slowest = Duration::ZERO;
    for _ in 0..count {
        let begun = Instant::now();
        let result = tokio::time::timeout(
            Duration::from_secs(10),
            post_review_to(serve.addr, &serve.ca, good_review()),
        )
        .await;
        slowest = slowest.max(begun.elapsed());
        if matches!(result, Ok((200, _))) {
            ok += 1;
        }
    }
    (ok, slowest)
}

// ---------------------------------------------------------------------------
// The admin port

#[tokio::test]
async fn idle_admin_connections_from_one_source_leave_livez_answering() {
    let serve = Serve::start(&[]).await;
    // 40 keep-alive connections that made one request each and stay idle: more than the
    // admin port's 32 slots.
    let mut idle = Vec::new();
    for _ in 0..40 {
        let Ok(mut tcp) = connect_from_attacker(serve.admin).await else {
            continue;
        };
        let _ = tcp
            .write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
            .await;
        idle.push(tcp);
    }
    let mut answered = 0;
    for _ in 0..10 {
        // Generous for a loaded machine; before, 28 of 29 probes failed at the kubelet's 1 s.
        if serve.livez_latency(Duration::from_secs(3)).await < Duration::from_secs(3) {
            answered += 1;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(answered, 10, "/livez answered {answered} of 10 probes");
    assert_eq!(serve.readyz_status().await, Some(200));
    // The flood is named.
    let metrics = serve.metrics().await;
    assert!(
        metrics.contains(r#"gpu_deploy_guard_connection_pool_top_source_connections{pool="admin",source="127.0.0.9"} 8"#),
        "{metrics}"
    );
    drop(idle);
}

// ---------------------------------------------------------------------------
// The in-flight body budget

#[tokio::test]
async fn streams_declaring_large_bodies_they_never_send_do_not_delay_good_reviews() {
    let serve = Serve::start(&[]).await;
    let (mut send, _conn) = h2_from_attacker(serve.addr, &serve.ca).await.unwrap();
    // 8 streams a second, each declaring 3.5 MiB and sending nothing, for the whole test:
    // with the declared length reserved, four of them held the 14 MiB budget.
    let attack = tokio::spawn(async move {
        let mut held = Vec::new();
        for _ in 0..200 {
            let Ok(ready) = send.clone().ready().await else {
                break;
            };
            send = ready;
            let request = http::Request::post("https://localhost/validate")
                .header("content-type", "application/json")
                .header("content-length", (3 * 1024 * 1024 + 512 * 1024).to_string())
                .body(())
                .unwrap();
            match send.send_request(request, false) {
                Ok(stream) => held.push(stream),
                Err(_) => break,
            }
            tokio::time::sleep(Duration::from_millis(125)).await;
        }
        held.len()
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (ok, slowest) = good_reviews(&serve, 10).await;
    attack.abort();
    // The 5 s body timeout is what a good review waited for before; 3 s leaves room for a
    // loaded machine.
    assert_eq!(ok, 10, "{ok} of 10 good reviews answered");
    assert!(
        slowest < Duration::from_secs(3),
        "slowest good review took {slowest:?}"
    );
}

// ---------------------------------------------------------------------------
// Requests in flight per source

/// Keeps one request in progress on an HTTP/2 connection from [`ATTACKER`], reconnecting when
/// the connection closes: each request sends its first byte and never the rest, and the next
/// one starts as soon as it is answered.
async fn hold_a_request_open(addr: SocketAddr, ca: String) {
    loop {
        let Ok((send, conn)) = h2_from_attacker(addr, &ca).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let mut send = send;
        loop {
            let Ok(ready) = send.clone().ready().await else {
                break;
            };
            send = ready;
            let request = http::Request::post("https://localhost/validate")
                .header("content-type", "application/json")
                .header("content-length", "1000")
                .body(())
                .unwrap();
            let Ok((response, mut body)) = send.send_request(request, false) else {
                break;
            };
            let _ = body.send_data(Bytes::from_static(b"{"), false);
            if response.await.is_err() {
                break;
            }
        }
        conn.abort();
    }
}

#[tokio::test]
async fn a_request_in_progress_on_every_connection_of_one_source_does_not_shut_out_another() {
    // A small pool, so that the test needs few connections; the share is half of it, as it
    // is at the default 256.
    let serve = Serve::start(&["--max-connections", "32"]).await;
    let attackers: Vec<_> = (0..32)
        .map(|_| tokio::spawn(hold_a_request_open(serve.addr, serve.ca.clone())))
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Before the share, every connection held a request in progress, so the pool could close
    // none of them for the good client, which waited for a body timeout (5 s) each time.
    let (ok, slowest) = good_reviews(&serve, 10).await;
    let metrics = serve.metrics().await;
    for attacker in attackers {
        attacker.abort();
    }
    assert_eq!(
        ok, 10,
        "{ok} of 10 good reviews answered; slowest {slowest:?}"
    );
    assert!(
        slowest < Duration::from_secs(3),
        "slowest good review took {slowest:?}"
    );
    assert!(
        metrics.contains(
            r#"gpu_deploy_guard_source_share_last_refused{share="requests",source="127.0.0.9"} 16"#
        ),
        "{metrics}"
    );
    serve.assert_livez(Duration::from_secs(2)).await;
}

// ---------------------------------------------------------------------------
// Connection slots

#[tokio::test]
async fn idle_connections_from_one_source_do_not_starve_another() {
    // A small pool, so that the test needs few connections; the rule is the same at 256.
    let serve = Serve::start(&["--max-connections", "32"]).await;
    let mut held = Vec::new();
    // Idle HTTP/2 connections answering PINGs, and silent TCP connections, from 127.0.0.9:
    // more than the pool holds.
    for _ in 0..24 {
        if let Ok(conn) = h2_from_attacker(serve.addr, &serve.ca).await {
            held.push(conn.1);
        }
    }
    let mut silent = Vec::new();
    for _ in 0..40 {
        if let Ok(Ok(tcp)) =
            tokio::time::timeout(Duration::from_secs(2), connect_from_attacker(serve.addr)).await
        {
            silent.push(tcp);
        }
    }
    let (ok, slowest) = good_reviews(&serve, 12).await;
    assert_eq!(
        ok, 12,
        "{ok} of 12 good reviews answered; slowest {slowest:?}"
    );
    assert!(
        slowest < Duration::from_secs(5),
        "slowest good review took {slowest:?}"
    );
    let metrics = serve.metrics().await;
    assert!(
        metrics.contains(r#"gpu_deploy_guard_connection_pool_top_source_connections{pool="webhook",source="127.0.0.9"}"#),
        "{metrics}"
    );
    let evicted: f64 = metrics
        .lines()
        .filter(|l| {
            l.starts_with("gpu_deploy_guard_connection_pool_evictions_total{pool=\"webhook\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(evicted > 0.0, "{metrics}");
    serve.assert_livez(Duration::from_secs(2)).await;
    drop((held, silent));
}

// ---------------------------------------------------------------------------
// Signals

#[tokio::test]
async fn every_terminating_signal_drains_and_exits_zero() {
    for signal in ["TERM", "INT", "HUP", "QUIT", "USR1", "USR2"] {
        let mut serve = Serve::start(&[]).await;
        serve.signal(signal);
        assert!(
            serve.wait_exit(Duration::from_secs(30)).await,
            "SIG{signal}: still running after 30 s"
        );
        let status = serve.exit_status().unwrap();
        assert_eq!(
            status.code(),
            Some(0),
            "SIG{signal} ended serve with {status} instead of a drain:\n{}",
            serve.log_text()
        );
        assert!(serve.log_text().contains("shut down"), "SIG{signal}");
    }
}

#[tokio::test]
async fn a_second_signal_ends_the_drain_at_once() {
    // A 60 s shutdown delay: without the second signal, serve would run for a minute more.
    let mut serve = Serve::start(&["--shutdown-delay", "60s"]).await;
    serve.sigterm();
    let draining = eventually(Duration::from_secs(5), || async {
        serve.readyz_status().await == Some(503)
    })
    .await;
    assert!(draining, "/readyz not 503 after SIGTERM");
    assert!(serve.exit_status().is_none(), "exited before the delay");
    let begun = Instant::now();
    serve.signal("INT");
    // Generous for a loaded machine; the delay alone would take 60 s.
    assert!(
        serve.wait_exit(Duration::from_secs(15)).await,
        "a second signal did not end the shutdown delay"
    );
    eprintln!("exited {:?} after the second signal", begun.elapsed());
    assert_eq!(serve.exit_status().unwrap().code(), Some(0));
}

// ---------------------------------------------------------------------------
// Text logs

#[tokio::test]
async fn request_fields_cannot_forge_text_log_lines() {
    let serve = Serve::start(&[]).await;
    let forged = "\n2099-01-01T00:00:00.000000Z  INFO FORGED: admission review allowed\u{1b}[2J";
    let mut review: Value = serde_json::from_slice(&good_review()).unwrap();
    // A change the webhook denies, so the review is logged at info.
    let request = &mut review["request"];
    request["uid"] = Value::String(format!("uid{forged}"));
    request["userInfo"]["username"] = Value::String(format!("user{forged}"));
    request["object"]["metadata"]["labels"]["nvidia.com/gpu.deploy.container-toolkit"] =
        Value::String("false".to_owned());
    let (status, _) = serve
        .post_review(serde_json::to_vec(&review).unwrap())
        .await;
    assert_eq!(status, 200);
    // A bad request is logged with its uid too.
    review["apiVersion"] = Value::String(format!("v9{forged}"));
    let (status, _) = serve
        .post_review(serde_json::to_vec(&review).unwrap())
        .await;
    assert_eq!(status, 400);
    let logged = eventually(Duration::from_secs(5), || async {
        serve.log_text().matches("FORGED").count() >= 2
    })
    .await;
    assert!(logged, "the reviews were not logged:\n{}", serve.log_text());
    let log = serve.log_text();
    for line in log.lines() {
        assert!(!line.starts_with("2099"), "a forged line:\n{log}");
    }
    assert!(
        !log.contains('\u{1b}'),
        "an escape sequence reached the log:\n{log}"
    );
    assert!(
        log.contains("\\n2099-01-01"),
        "the newline is not shown escaped:\n{log}"
    );
}
