//! `serve` as a process under hostile requests and connection patterns: what one request, one
//! connection or many of them can cost, measured from the outside (/proc of the process, the
//! bytes of the reply, how long /livez takes to answer).
//!
//! Every case must keep the process under the Deployment's 64 Mi memory limit and `/livez`
//! answering, and refuse or bound what it cannot serve, naming the problem.

mod hardening_support;
mod process_support;
mod server_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hardening_support::*;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The Deployment's memory limit.
const LIMIT_64_MIB: u64 = 64 * 1024 * 1024;

/// The most of the request a reply may repeat, with room for the message around it.
const SHORT_REPLY: usize = 2048;

/// Asserts that the peak resident memory of `serve` stayed under the Deployment's limit.
fn assert_peak_under_limit(serve: &Serve, what: &str) {
    let peak = serve.peak_rss();
    eprintln!("{what}: peak RSS {} MiB", peak / (1024 * 1024));
    assert!(
        peak < LIMIT_64_MIB,
        "{what}: peak RSS {} MiB, over the 64 MiB limit",
        peak / (1024 * 1024)
    );
}

// ---------------------------------------------------------------------------
// 1. Memory amplification

#[tokio::test]
async fn a_long_name_with_many_unknown_keys_is_refused_without_amplification() {
    let serve = Serve::start(&["--max-body-bytes", "8388608"]).await;
    let name = "n".repeat(1024 * 1024);
    let labels: Vec<(String, String)> = (0..400)
        .map(|i| {
            (
                format!("nvidia.com/gpu.deploy.unknown-{i}"),
                "true".to_owned(),
            )
        })
        .collect();
    let body = review(&name, &[], &labels);
    let (status, reply) = serve.post_review(body).await;
    let text = String::from_utf8_lossy(&reply);
    eprintln!(
        "reply: {} bytes, status {status}; peak RSS {} MiB",
        reply.len(),
        serve.peak_rss() >> 20
    );
    assert_eq!(status, 400, "{}", truncate(&text, 500));
    assert!(
        reply.len() <= SHORT_REPLY,
        "reply of {} bytes for a refused request",
        reply.len()
    );
    assert!(
        text.contains("name") && text.contains("253"),
        "the refusal does not say the name is too long: {}",
        truncate(&text, 500)
    );
    assert_peak_under_limit(&serve, "1 MiB name, 400 unknown keys");
    serve.assert_livez(Duration::from_secs(2)).await;
}

#[tokio::test]
async fn a_hundred_thousand_unknown_keys_give_one_finding_and_a_bounded_reply() {
    let serve = Serve::start(&["--max-body-bytes", "8388608"]).await;
    let labels: Vec<(String, String)> = (0..100_000)
        .map(|i| (format!("nvidia.com/gpu.deploy.k{i}"), "true".to_owned()))
        .collect();
    let body = review("node-a", &[], &labels);
    let (status, reply) = serve.post_review(body).await;
    eprintln!("reply: {} bytes, status {status}", reply.len());
    assert_eq!(status, 200);
    assert!(
        reply.len() <= 64 * 1024,
        "reply of {} bytes for one request",
        reply.len()
    );
    let reply: Value = serde_json::from_slice(&reply).unwrap();
    let warnings = reply["response"]["warnings"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    eprintln!("{} warnings", warnings.len());
    assert!(
        !warnings.is_empty() && warnings.len() <= 10,
        "{} warnings",
        warnings.len()
    );
    let unknown: Vec<&Value> = warnings
        .iter()
        .filter(|w| {
            w.as_str()
                .unwrap_or_default()
                .contains("known deploy label")
        })
        .collect();
    assert_eq!(
        unknown.len(),
        1,
        "unknown keys not one warning: {warnings:?}"
    );
    assert!(
        unknown[0].as_str().unwrap().contains("100000"),
        "the warning does not say how many keys: {unknown:?}"
    );
    assert_peak_under_limit(&serve, "100k unknown keys");
    serve.assert_livez(Duration::from_secs(2)).await;
}

#[tokio::test]
async fn label_keys_and_values_outside_kubernetes_syntax_are_refused_naming_which() {
    let serve = Serve::start(&[]).await;
    let long_prefix = format!("{}.com/x", "p".repeat(260));
    let long_name = format!("example.com/{}", "n".repeat(64));
    let cases: [(&str, String, String); 4] = [
        ("prefix", long_prefix, "v".to_owned()),
        ("name", long_name, "v".to_owned()),
        ("name", "example.com/".to_owned(), "v".to_owned()),
        ("value", "example.com/a".to_owned(), "v".repeat(64)),
    ];
    for (what, key, value) in cases {
        let body = review("node-a", &[], &[(key.clone(), value)]);
        let (status, reply) = serve.post_review(body).await;
        let text = String::from_utf8_lossy(&reply).into_owned();
        assert_eq!(status, 400, "{what}: {}", truncate(&text, 300));
        assert!(reply.len() <= SHORT_REPLY, "{what}: {} bytes", reply.len());
        assert!(
            text.contains("label") && text.contains(what),
            "{what} not named: {text}"
        );
    }
}

// ---------------------------------------------------------------------------
// 2. CPU work on the async workers

#[tokio::test]
async fn huge_unknown_deploy_keys_leave_livez_answering() {
    // Two 8 MB bodies do not fit the in-flight room at once: the second waits for the first.
    // On a loaded machine (CI builds in the background) that wait passed the default 5 s body
    // timeout and got a 503; this test is about /livez and the refusals, not that timeout.
    let serve = Serve::start(&[
        "--max-body-bytes",
        "8388608",
        "--body-timeout",
        "60s",
        "--request-timeout",
        "60s",
    ])
    .await;
    let key = format!(
        "nvidia.com/gpu.deploy.{}",
        "x".repeat(7 * 1024 * 1024 + 900 * 1024)
    );
    let body = Arc::new(review("node-a", &[], &[(key, "true".to_owned())]));
    // At least as many requests as the runtime has workers.
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut sent = Vec::new();
    for _ in 0..workers.max(2) {
        let (serve_addr, ca, body) = (serve.addr, serve.ca.clone(), body.clone());
        sent.push(tokio::spawn(async move {
            post_review_to(serve_addr, &ca, body.as_ref().clone()).await
        }));
    }
    // /livez keeps answering while they are handled.
    let begun = Instant::now();
    let mut slowest = Duration::ZERO;
    while !sent.iter().all(|s| s.is_finished()) && begun.elapsed() < Duration::from_secs(60) {
        slowest = slowest.max(serve.livez_latency(Duration::from_secs(30)).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut statuses = Vec::new();
    for s in sent {
        let (status, reply) = s.await.unwrap();
        assert!(reply.len() <= SHORT_REPLY, "reply of {} bytes", reply.len());
        statuses.push(status);
    }
    eprintln!(
        "statuses {statuses:?}; slowest /livez {slowest:?}; all answered after {:?}",
        begun.elapsed()
    );
    assert!(statuses.iter().all(|s| *s == 400), "{statuses:?}");
    assert!(
        slowest < Duration::from_secs(2),
        "/livez took {slowest:?} while the webhook was busy"
    );
    assert_peak_under_limit(&serve, "7.9 MiB unknown keys");
}

// ---------------------------------------------------------------------------
// 3. What is held in flight

#[tokio::test]
async fn an_http2_connection_answering_pings_is_closed_when_idle() {
    let serve = Serve::start(&["--idle-timeout", "3s"]).await;
    let mut h2 = H2Conn::connect(serve.addr, &serve.ca, 65_535).await;
    let (status, _) = h2.post(good_review()).await;
    assert_eq!(status, 200);
    // The client keeps the connection busy with PINGs, which the server answers, but sends no
    // request: it is idle.
    let mut pings = h2.ping_pong.take().unwrap();
    let pinger = tokio::spawn(async move {
        loop {
            if pings.ping(h2::Ping::opaque()).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    let closed = tokio::time::timeout(Duration::from_secs(20), h2.closed()).await;
    pinger.abort();
    assert!(
        closed.is_ok(),
        "an idle HTTP/2 connection answering PINGs still open after 20 s (idle timeout 3 s)"
    );
}

#[tokio::test]
async fn connections_beyond_the_descriptor_limit_wait_and_livez_answers() {
    // A descriptor limit of 256: without a bound below it, accepting fails for every port.
    let serve = Serve::start_with_nofile(256, &[]).await;
    let mut held = Vec::new();
    let mut attempts = Vec::new();
    for _ in 0..400 {
        let (addr, ca) = (serve.addr, serve.ca.clone());
        attempts.push(tokio::spawn(async move {
            tokio::time::timeout(Duration::from_secs(5), H2Conn::connect_raw(addr, &ca)).await
        }));
    }
    let mut established = 0;
    for attempt in attempts {
        if let Ok(Ok(Ok(conn))) = attempt.await {
            established += 1;
            held.push(conn);
        }
    }
    let fds = serve.open_fds();
    eprintln!("{established} of 400 connections established; serve has {fds} descriptors open");
    assert!(fds < 256, "{fds} descriptors open");
    serve.assert_livez(Duration::from_secs(2)).await;
    assert_peak_under_limit(&serve, "400 connections");
    // Once they go, the webhook serves again.
    drop(held);
    let served = eventually(Duration::from_secs(20), || async {
        post_review_to(serve.addr, &serve.ca, good_review()).await.0 == 200
    })
    .await;
    assert!(served, "no review served after the connections closed");
}

#[tokio::test]
async fn many_slow_large_bodies_stay_under_the_memory_limit() {
    let serve = Serve::start(&[
        "--max-body-bytes",
        "8388608",
        "--body-timeout",
        "60s",
        "--request-timeout",
        "60s",
    ])
    .await;
    const LEN: usize = 8_000_000;
    let written = Arc::new(AtomicU64::new(0));
    let mut senders = Vec::new();
    for _ in 0..16 {
        let (addr, ca, written) = (serve.addr, serve.ca.clone(), written.clone());
        senders.push(tokio::spawn(async move {
            let mut tls = tls_connect(addr, &ca, &[b"http/1.1"]).await.unwrap();
            let head = format!(
                "POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
                 Content-Length: {LEN}\r\n\r\n"
            );
            tls.write_all(head.as_bytes()).await.unwrap();
            let chunk = vec![b' '; 64 * 1024];
            let mut left = LEN - 1;
            while left > 0 {
                let n = left.min(chunk.len());
                if tls.write_all(&chunk[..n]).await.is_err() {
                    return;
                }
                tls.flush().await.ok();
                written.fetch_add(n as u64, Ordering::Relaxed);
                left -= n;
            }
            // Hold back the last byte.
            std::future::pending::<()>().await;
        }));
    }
    // Until every body but its last byte is sent, or the server stops taking bytes.
    let target = 16 * (LEN as u64 - 1);
    let begun = Instant::now();
    let mut last = (0, Instant::now());
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = written.load(Ordering::Relaxed);
        if now >= target || begun.elapsed() > Duration::from_secs(40) {
            break;
        }
        if now != last.0 {
            last = (now, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(3) {
            break;
        }
    }
    eprintln!(
        "{} MiB of bodies sent in {:?}",
        written.load(Ordering::Relaxed) / (1024 * 1024),
        begun.elapsed()
    );
    serve.assert_livez(Duration::from_secs(2)).await;
    assert_peak_under_limit(&serve, "16 slow 8 MB bodies");
    for s in &senders {
        s.abort();
    }
}

#[tokio::test]
async fn an_http2_client_granting_no_window_does_not_hold_the_shutdown() {
    let mut serve = Serve::start(&["--drain-timeout", "40s"]).await;
    let mut h2 = H2Conn::connect(serve.addr, &serve.ca, 0).await;
    // The response head arrives; its body never can.
    let response = h2.send(good_review()).await;
    let response = tokio::time::timeout(Duration::from_secs(10), response)
        .await
        .expect("no response head")
        .unwrap();
    assert_eq!(response.status(), 200);
    let begun = Instant::now();
    serve.sigterm();
    let exited = serve.wait_exit(Duration::from_secs(60)).await;
    let took = begun.elapsed();
    eprintln!("serve exited after {took:?} (drain timeout 40 s)");
    assert!(exited, "serve did not exit within 60 s of SIGTERM");
    assert!(
        took < Duration::from_secs(25),
        "shutdown waited {took:?} for a response the client never reads"
    );
    drop(response);
}

#[tokio::test]
async fn sigterm_tells_clients_to_go_when_the_shutdown_delay_starts() {
    let mut serve = Serve::start(&["--shutdown-delay", "8s"]).await;
    // An HTTP/2 connection with a review behind it, now idle.
    let mut h2 = H2Conn::connect(serve.addr, &serve.ca, 65_535).await;
    assert_eq!(h2.post(good_review()).await.0, 200);
    // An HTTP/1.1 keep-alive connection.
    let mut h1 = tls_connect(serve.addr, &serve.ca, &[b"http/1.1"])
        .await
        .unwrap();
    let head = raw_h1_review(&mut h1).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");

    let begun = Instant::now();
    serve.sigterm();
    let readyz = eventually(Duration::from_secs(3), || async {
        serve.readyz_status().await == Some(503)
    })
    .await;
    assert!(readyz, "/readyz not 503 after SIGTERM");
    // HTTP/2: GOAWAY at once, so the connection ends well before the 8 s delay.
    let closed = tokio::time::timeout(Duration::from_secs(5), h2.closed()).await;
    assert!(
        closed.is_ok(),
        "no GOAWAY within 5 s of SIGTERM (delay 8 s): {:?}",
        begun.elapsed()
    );
    // HTTP/1.1: the next response says `Connection: close`, and is still served.
    let head = raw_h1_review(&mut h1).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("connection: close"),
        "response during the shutdown delay does not close the connection:\n{head}"
    );
    assert!(
        begun.elapsed() < Duration::from_secs(7),
        "checks ran past the delay"
    );
    assert!(serve.wait_exit(Duration::from_secs(40)).await);
}

// ---------------------------------------------------------------------------
// 5. Rejected input echoed whole

/// A Node review whose `field` (a pointer into the review) is replaced by `value`.
fn review_with(field: &str, value: Value) -> Vec<u8> {
    let mut v: Value = serde_json::from_slice(&review(
        "gpu-0",
        &[],
        &[("nvidia.com/gpu.deploy.dcgm".into(), "true".into())],
    ))
    .unwrap();
    *v.pointer_mut(field).unwrap() = value;
    serde_json::to_vec(&v).unwrap()
}

#[tokio::test]
async fn large_wrongly_typed_fields_are_refused_at_the_cost_of_one_copy() {
    // The default body limit, the chart's in-flight budget: 16 at once, as many as the budget
    // lets in. U+0085 is two bytes in UTF-8 and is escaped by Debug formatting, so an error
    // that echoed the field whole would cost several times the body.
    let serve = Serve::start(&[]).await;
    let nel = "\u{85}".repeat(1_700_000);
    let bodies = [
        ("/request/dryRun", Value::String(nel.clone())),
        ("/request/userInfo/groups", Value::String(nel.clone())),
        ("/request/object/metadata/labels", Value::String(nel)),
    ];
    for (field, value) in bodies {
        let body = review_with(field, value);
        let mut posts = Vec::new();
        for _ in 0..16 {
            let (addr, ca, body) = (serve.addr, serve.ca.clone(), body.clone());
            posts.push(tokio::spawn(async move {
                post_review_to(addr, &ca, body).await
            }));
        }
        for p in posts {
            let (status, reply) = p.await.unwrap();
            assert!(status == 400 || status == 503, "{field}: status {status}");
            assert!(
                reply.len() <= SHORT_REPLY,
                "{field}: a reply of {} bytes",
                reply.len()
            );
            if status == 400 {
                let text = String::from_utf8_lossy(&reply);
                let name = field.rsplit('/').next().unwrap();
                assert!(text.contains(name), "{field}: {}", truncate(&text, 300));
            }
        }
        serve.assert_livez(Duration::from_secs(2)).await;
        assert_peak_under_limit(
            &serve,
            &format!("16 reviews of 3.4 MB with a wrongly typed {field}"),
        );
    }
}

#[tokio::test]
async fn policy_reviews_of_many_small_fields_cost_the_fields_the_decision_reads() {
    // A ClusterPolicy of 150,000 small objects (3.3 MB), 16 at once: read whole into trees,
    // 240,000 small fields took about 36 MiB each; only the fields the decision reads are kept.
    let serve = Serve::start(&[]).await;
    let policy = |spec: Value| {
        json!({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
               "metadata": {"name": "cluster-policy"}, "spec": spec})
    };
    let mut spec: serde_json::Map<String, Value> = (0..150_000)
        .map(|i| (format!("k{i}"), json!({"a": i})))
        .collect();
    // A switch it does read: with no nodes known (no cluster watch), the policy alone refuses
    // the toolkit switched off, which shows the field was kept.
    spec.insert("toolkit".into(), json!({"enabled": false}));
    let body = serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": "nvidia.com", "version": "v1", "kind": "ClusterPolicy"},
            "name": "cluster-policy",
            "operation": "UPDATE",
            "userInfo": {"username": "alice"},
            "object": policy(Value::Object(spec)),
            "oldObject": policy(json!({})),
        }
    }))
    .unwrap();
    eprintln!("policy review body: {} bytes", body.len());
    let mut posts = Vec::new();
    for _ in 0..16 {
        let (addr, ca, body) = (serve.addr, serve.ca.clone(), body.clone());
        posts.push(tokio::spawn(async move {
            post_to(addr, &ca, "/validate/gpu-policy", body).await
        }));
    }
    let mut answered = 0;
    for p in posts {
        let (status, reply) = p.await.unwrap();
        let text = String::from_utf8_lossy(&reply).into_owned();
        assert!(
            status == 200 || status == 503,
            "status {status}: {}",
            truncate(&text, 300)
        );
        if status == 200 {
            answered += 1;
            let answer: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(
                answer["response"]["allowed"],
                false,
                "{}",
                truncate(&text, 300)
            );
            assert!(
                text.contains("spec.toolkit.enabled true -> false"),
                "{}",
                truncate(&text, 300)
            );
        }
    }
    assert!(answered > 0, "no policy review was answered");
    serve.assert_livez(Duration::from_secs(2)).await;
    assert_peak_under_limit(&serve, "16 policy reviews of 150,000 small objects");
}

#[tokio::test]
async fn an_8_mb_bad_kind_is_not_echoed() {
    let serve = Serve::start(&["--max-body-bytes", "8388608"]).await;
    let kind = "k".repeat(8_000_000);
    // Nothing else wrong: the kind is what gets refused.
    let body = serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": kind,
    }))
    .unwrap();
    let (status, reply) = serve.post_review(body).await;
    eprintln!(
        "reply: {} bytes, status {status}; longest log line {} bytes",
        reply.len(),
        serve.longest_log_line()
    );
    assert_eq!(status, 400);
    assert!(
        reply.len() <= SHORT_REPLY,
        "reply of {} bytes to a bad kind",
        reply.len()
    );
    let text = String::from_utf8_lossy(&reply);
    assert!(text.contains("kind"), "{}", truncate(&text, 300));
    assert_peak_under_limit(&serve, "8 MB bad kind");
    let longest = serve.longest_log_line();
    eprintln!("longest log line: {longest} bytes");
    assert!(longest <= 4096, "a log line of {longest} bytes");
}

#[tokio::test]
async fn nothing_echoed_from_a_bad_request_exceeds_a_short_bound() {
    let serve = Serve::start(&["--max-body-bytes", "8388608"]).await;
    let huge = "z".repeat(2_000_000);
    let bodies = [
        // Unknown operation.
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
               "request": {"uid": "u", "kind": {"group": "", "version": "v1", "kind": "Node"},
                           "operation": huge}}),
        // Not a Node.
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
               "request": {"uid": "u", "kind": {"group": huge, "version": "v1", "kind": "Pod"},
                           "operation": "UPDATE"}}),
        // Wrong version.
        json!({"apiVersion": huge, "kind": "AdmissionReview"}),
        // A uid no API server sends.
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
               "request": {"uid": huge, "kind": {"group": "", "version": "v1", "kind": "Node"},
                           "operation": "UPDATE", "name": "n",
                           "object": {"metadata": {"name": "n"}},
                           "oldObject": {"metadata": {"name": "n"}}}}),
    ];
    for body in bodies {
        let (status, reply) = serve.post_review(serde_json::to_vec(&body).unwrap()).await;
        let text = String::from_utf8_lossy(&reply).into_owned();
        assert_eq!(status, 400, "{}", truncate(&text, 300));
        assert!(
            reply.len() <= SHORT_REPLY,
            "reply of {} bytes: {}",
            reply.len(),
            truncate(&text, 300)
        );
    }
    let longest = serve.longest_log_line();
    assert!(longest <= 4096, "a log line of {longest} bytes");
}

// ---------------------------------------------------------------------------
// 4. Client certificates

#[tokio::test]
async fn client_ca_requires_a_client_certificate_signed_by_it_and_follows_rotation() {
    let dir = tempfile::tempdir().unwrap();
    let client_ca_path = dir.path().join("client-ca.crt");
    let trusted = ClientCa::new("apiserver-ca");
    let other = ClientCa::new("other-ca");
    std::fs::write(&client_ca_path, &trusted.ca_pem).unwrap();
    let serve = Serve::start(&[
        "--client-ca",
        client_ca_path.to_str().unwrap(),
        "--tls-reload-interval",
        "200ms",
    ])
    .await;

    let with_trusted = trusted.client_identity("kube-apiserver");
    let with_other = other.client_identity("intruder");
    assert_eq!(
        serve.post_with_identity(None).await,
        None,
        "served without a client certificate"
    );
    assert_eq!(
        serve.post_with_identity(Some(&with_other)).await,
        None,
        "served a client certificate from another CA"
    );
    assert_eq!(
        serve.post_with_identity(Some(&with_trusted)).await,
        Some(200)
    );
    serve.assert_livez(Duration::from_secs(2)).await;

    // The file is re-read: after rotation only the new CA's clients are served.
    std::fs::write(&client_ca_path, &other.ca_pem).unwrap();
    let rotated = eventually(Duration::from_secs(15), || async {
        serve.post_with_identity(Some(&with_other)).await == Some(200)
    })
    .await;
    assert!(rotated, "the rotated client CA was not loaded");
    assert_eq!(serve.post_with_identity(Some(&with_trusted)).await, None);

    // A broken file keeps the CA in use.
    std::fs::write(&client_ca_path, "not a certificate").unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(serve.post_with_identity(Some(&with_other)).await, Some(200));
}

#[test]
fn client_ca_that_is_not_a_certificate_stops_start_up_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("client-ca.crt");
    std::fs::write(&bad, "nothing here").unwrap();
    let o = std::process::Command::new(BIN)
        .args([
            "serve",
            "--no-cluster-watch",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--client-ca",
            bad.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("client-ca.crt") && stderr.contains("certificate"),
        "{stderr}"
    );
}

// ---------------------------------------------------------------------------
// helpers local to these tests

/// Sends a review on an HTTP/1.1 connection kept alive and returns the response head.
async fn raw_h1_review(tls: &mut TlsStream) -> String {
    let body = good_review();
    let head = format!(
        "POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).await.unwrap();
    tls.write_all(&body).await.unwrap();
    tls.flush().await.unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 8192];
    let read = async {
        loop {
            let n = tls.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed before answering");
            seen.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&seen);
            if let Some(end) = text.find("\r\n\r\n") {
                let head = text[..end].to_owned();
                let length: usize = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse().unwrap())
                    })
                    .unwrap_or(0);
                if seen.len() >= end + 4 + length {
                    return head;
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("no response within 10 s")
}
