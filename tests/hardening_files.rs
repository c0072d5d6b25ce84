//! `serve` and the files it reads: the configuration, the serving certificate and the client
//! CA. Someone able to write a mounted ConfigMap or Secret must not be able to hang the
//! process, grow its memory, turn a rule off unseen, serve a certificate no client accepts
//! while /readyz says ready, or make a leaf a trust anchor.

mod hardening_support;
mod process_support;
mod server_support;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use hardening_support::*;
use rcgen::ExtendedKeyUsagePurpose;
use time::OffsetDateTime;

/// `serve` with `extra` flags on ports that are free, expected to stop at start-up; its output.
/// Killed after 20 s, so a hang fails the test instead of holding it.
fn serve_fails(extra: &[&str]) -> (Output, Duration) {
    let started = Instant::now();
    let mut child = Command::new("timeout")
        .args([
            "20",
            BIN,
            "serve",
            "--no-cluster-watch",
            "--listen",
            "127.0.0.1:0",
        ])
        .args(["--admin-listen", "127.0.0.1:0"])
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let _ = &mut child;
    let output = child.wait_with_output().unwrap();
    (output, started.elapsed())
}

fn assert_refused(extra: &[&str], needles: &[&str]) {
    let (o, took) = serve_fails(extra);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        o.status.code(),
        Some(2),
        "{extra:?} after {took:?}: {stderr}"
    );
    for needle in needles {
        assert!(
            stderr.contains(needle),
            "{extra:?}: no {needle:?} in {stderr}"
        );
    }
    // Generous on a loaded machine; a hang is stopped at 20 s (exit 124).
    assert!(took < Duration::from_secs(15), "{extra:?} took {took:?}");
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn a_config_fifo_or_device_stops_start_up_at_once_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("config.yaml");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    assert_refused(
        &["--config", path_str(&fifo)],
        &["config.yaml", "not a regular file"],
    );
    assert_refused(
        &["--config", "/dev/zero"],
        &["/dev/zero", "not a regular file"],
    );
}

#[test]
fn a_config_rule_listed_twice_stops_start_up_naming_the_rule() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "rules:\n  device-plugin-without-toolkit: deny\n  device-plugin-without-toolkit: off\n",
    )
    .unwrap();
    assert_refused(
        &["--config", path_str(&config)],
        &[
            "config.yaml",
            "`rules.device-plugin-without-toolkit` is given twice",
        ],
    );
}

#[test]
fn config_aliases_and_deep_nesting_stop_start_up_at_once() {
    let dir = tempfile::tempdir().unwrap();
    // 140 KB of aliases that would expand to gigabytes.
    let laughs = dir.path().join("laughs.yaml");
    let mut text =
        "exemptions:\n  usernames: &a [lol, lol, lol, lol, lol, lol, lol, lol]\n".to_owned();
    while text.len() < 140_000 {
        text.push_str("  # padding\n");
    }
    std::fs::write(&laughs, text).unwrap();
    assert_refused(
        &["--config", path_str(&laughs)],
        &["laughs.yaml", "anchors"],
    );

    let deep = dir.path().join("deep.yaml");
    std::fs::write(&deep, "[".repeat(200_000)).unwrap();
    assert_refused(&["--config", path_str(&deep)], &["deep.yaml"]);

    let big = dir.path().join("big.yaml");
    std::fs::write(&big, format!("mode: warn\n{}", "#".repeat(1024 * 1024 + 1))).unwrap();
    assert_refused(
        &["--config", path_str(&big)],
        &["big.yaml", "larger than the limit of 1048576 bytes"],
    );
}

#[test]
fn huge_certificate_files_and_long_chains_stop_start_up_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let pki = gpu_deploy_guard::certs::generate(&["localhost".to_owned()], &[], 2).unwrap();
    let key = dir.path().join("tls.key");
    std::fs::write(&key, &pki.key_pem).unwrap();
    let huge = dir.path().join("tls.crt");
    // 100 MB would be read whole before; the cap refuses it from its size.
    let file = std::fs::File::create(&huge).unwrap();
    file.set_len(100 * 1024 * 1024).unwrap();
    assert_refused(
        &["--tls-cert", path_str(&huge), "--tls-key", path_str(&key)],
        &["tls.crt", "larger than the limit"],
    );
    let chain = dir.path().join("chain.crt");
    std::fs::write(&chain, pki.cert_pem.repeat(9)).unwrap();
    assert_refused(
        &["--tls-cert", path_str(&chain), "--tls-key", path_str(&key)],
        &["chain.crt", "9 certificates in the chain"],
    );
    let ca = dir.path().join("ca.crt");
    let file = std::fs::File::create(&ca).unwrap();
    file.set_len(100 * 1024 * 1024).unwrap();
    assert_refused(
        &["--client-ca", path_str(&ca)],
        &["ca.crt", "larger than the limit"],
    );
}

#[test]
fn a_leaf_in_the_client_ca_file_is_not_a_trust_anchor() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ClientCa::new("apiserver-ca");
    let (leaf, _) = ca.leaf_pem("intruder", &[ExtendedKeyUsagePurpose::ClientAuth]);
    let bundle = dir.path().join("client-ca.crt");
    std::fs::write(&bundle, format!("{}{leaf}", ca.ca_pem)).unwrap();
    assert_refused(
        &["--client-ca", path_str(&bundle)],
        &[
            "client-ca.crt",
            "certificate 2 (CN=intruder) is not a CA certificate",
        ],
    );
}

#[tokio::test]
async fn a_serving_certificate_not_yet_valid_is_not_loaded_and_counted() {
    let ca = ClientCa::new("serving-ca");
    let now = OffsetDateTime::now_utc();
    let serve = Serve::start_with_bundle(
        ca.serving_bundle(
            now - time::Duration::hours(1),
            now + time::Duration::days(1),
        ),
        &["--tls-reload-interval", "200ms"],
    )
    .await;
    // A rotation to a certificate that starts tomorrow: every handshake would fail.
    let future = ca.serving_bundle(now + time::Duration::days(1), now + time::Duration::days(2));
    std::fs::write(serve.dir().join("tls.crt"), &future.cert_pem).unwrap();
    std::fs::write(serve.dir().join("tls.key"), &future.key_pem).unwrap();
    let counted = eventually(Duration::from_secs(15), || async {
        serve
            .metric(
                r#"gpu_deploy_guard_tls_certificate_reload_failures_total{reason="not-yet-valid"}"#,
            )
            .await
            == Some(1.0)
    })
    .await;
    assert!(counted, "{}", serve.metrics().await);
    // The previous pair is still served, and still ready.
    assert_eq!(serve.post_review(good_review()).await.0, 200);
    assert_eq!(serve.readyz_status().await, Some(200));
    // Counted once, not at every poll.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        serve
            .metric(
                r#"gpu_deploy_guard_tls_certificate_reload_failures_total{reason="not-yet-valid"}"#
            )
            .await,
        Some(1.0)
    );
}

#[tokio::test]
async fn readyz_fails_once_the_certificate_in_use_expires_with_no_valid_one() {
    let ca = ClientCa::new("serving-ca");
    let now = OffsetDateTime::now_utc();
    // Valid for a few seconds from the start: long enough to start, then expired.
    let serve = Serve::start_with_bundle(
        ca.serving_bundle(
            now - time::Duration::hours(1),
            now + time::Duration::seconds(6),
        ),
        &["--tls-reload-interval", "200ms"],
    )
    .await;
    let not_ready = eventually(Duration::from_secs(30), || async {
        serve.readyz_status().await == Some(503)
    })
    .await;
    assert!(
        not_ready,
        "/readyz still 200 with an expired certificate:\n{}",
        serve.log_text()
    );
    let reason = plain_client(Duration::from_secs(5))
        .get(format!("http://{}/readyz", serve.admin))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(reason, "waiting for: serving-certificate");
    // A valid one rotated in makes it ready again.
    let fresh = ca.serving_bundle(
        now - time::Duration::hours(1),
        now + time::Duration::days(1),
    );
    std::fs::write(serve.dir().join("tls.key"), &fresh.key_pem).unwrap();
    std::fs::write(serve.dir().join("tls.crt"), &fresh.cert_pem).unwrap();
    let ready = eventually(Duration::from_secs(15), || async {
        serve.readyz_status().await == Some(200)
    })
    .await;
    assert!(ready, "not ready again after a valid rotation");
    assert_eq!(serve.post_review(good_review()).await.0, 200);
}

#[tokio::test]
async fn client_ca_reloads_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("client-ca.crt");
    let (first, second) = (ClientCa::new("first-ca"), ClientCa::new("second-ca"));
    std::fs::write(&path, &first.ca_pem).unwrap();
    let serve = Serve::start(&[
        "--client-ca",
        path_str(&path),
        "--tls-reload-interval",
        "200ms",
    ])
    .await;
    std::fs::write(&path, "not a certificate").unwrap();
    let failed = eventually(Duration::from_secs(15), || async {
        serve
            .metric(r#"gpu_deploy_guard_tls_client_ca_reloads_total{result="failure"}"#)
            .await
            == Some(1.0)
    })
    .await;
    assert!(failed, "{}", serve.metrics().await);
    std::fs::write(&path, &second.ca_pem).unwrap();
    let loaded = eventually(Duration::from_secs(15), || async {
        serve
            .metric(r#"gpu_deploy_guard_tls_client_ca_reloads_total{result="success"}"#)
            .await
            == Some(1.0)
    })
    .await;
    assert!(loaded, "{}", serve.metrics().await);
}

#[tokio::test]
async fn a_connection_authenticated_by_a_removed_ca_is_closed_at_its_maximum_age() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("client-ca.crt");
    let (old, new) = (ClientCa::new("old-ca"), ClientCa::new("new-ca"));
    std::fs::write(&path, &old.ca_pem).unwrap();
    let serve = Serve::start(&[
        "--client-ca",
        path_str(&path),
        "--tls-reload-interval",
        "200ms",
        "--max-connection-age",
        "3s",
    ])
    .await;
    let identity = old.client_identity("kube-apiserver");
    let client = reqwest::Client::builder()
        .use_rustls_tls()
        .no_proxy()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(serve.ca.as_bytes()).unwrap())
        .identity(identity)
        .http2_prior_knowledge()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let post = || async {
        client
            .post(format!("https://{}/validate", serve.addr))
            .header("content-type", "application/json")
            .body(good_review())
            .send()
            .await
            .map(|r| r.status().as_u16())
            .ok()
    };
    assert_eq!(post().await, Some(200));
    std::fs::write(&path, &new.ca_pem).unwrap();
    // Once the connection made under the old CA ages out, the client must handshake again,
    // and the new CA refuses it. Reviews every 300 ms keep the connection busy, so the idle
    // timeout (120 s) plays no part.
    let refused = eventually(Duration::from_secs(20), || async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        post().await.is_none()
    })
    .await;
    assert!(
        refused,
        "still served on a connection authorised by a removed CA"
    );
}

#[tokio::test]
async fn client_certificates_need_client_auth_and_an_allowed_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("client-ca.crt");
    let ca = ClientCa::new("apiserver-ca");
    std::fs::write(&path, &ca.ca_pem).unwrap();
    let serve = Serve::start(&[
        "--client-ca",
        path_str(&path),
        "--client-ca-allowed-names",
        "kube-apiserver,apiserver.example",
    ])
    .await;
    let allowed = ca.client_identity("kube-apiserver");
    assert_eq!(serve.post_with_identity(Some(&allowed)).await, Some(200));
    let other_name = ca.client_identity("intruder");
    assert_eq!(serve.post_with_identity(Some(&other_name)).await, None);
    // The right name, but a serving certificate: no clientAuth usage.
    let server_only = ca.identity_with("kube-apiserver", &[ExtendedKeyUsagePurpose::ServerAuth]);
    assert_eq!(serve.post_with_identity(Some(&server_only)).await, None);
    let no_usage = ca.identity_with("kube-apiserver", &[]);
    assert_eq!(serve.post_with_identity(Some(&no_usage)).await, None);
}
