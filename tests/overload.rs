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

use std::time::{Duration, Instant};

use hardening_support::*;
use serde_json::Value;

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
