//! The webhook listener over real sockets: TLS, HTTP versions, certificate
//! rotation, and start-up failures.

mod server_support;

use std::path::Path;
use std::time::Duration;

use gpu_deploy_guard::metrics::Metrics;
use gpu_deploy_guard::serve::server::{ServeError, Server};
use gpu_deploy_guard::serve::tls::TlsSource;
use server_support::*;
use std::sync::Arc;

const RELOAD_FAILURES: &str = r#"gpu_deploy_guard_tls_certificate_reloads_total{result="failure"}"#;
const RELOAD_SUCCESSES: &str =
    r#"gpu_deploy_guard_tls_certificate_reloads_total{result="success"}"#;
const EXPIRY: &str = "gpu_deploy_guard_tls_certificate_expiry_timestamp_seconds";

fn not_after(bundle: &gpu_deploy_guard::certs::Bundle) -> f64 {
    let der = leaf_der(bundle);
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    cert.validity().not_after.timestamp() as f64
}

#[tokio::test]
async fn serves_http1_and_http2_to_a_client_trusting_the_ca() {
    let pki = bundle(30);
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = write_pair(dir.path(), &pki);
    let server = start(options(TlsSource::Files { cert, key }), hello_app()).await;
    let url = format!("https://{}/", server.addr);

    let h1 = client(&pki.ca_pem).http1_only().build().unwrap();
    let response = h1.get(&url).send().await.unwrap();
    assert_eq!(response.version(), reqwest::Version::HTTP_11);
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), "hello");

    // No version forced: the client offers h2 and http/1.1 by ALPN and the
    // server must pick h2.
    let h2 = client(&pki.ca_pem).build().unwrap();
    let response = h2.get(&url).send().await.unwrap();
    assert_eq!(response.version(), reqwest::Version::HTTP_2);
    assert_eq!(response.text().await.unwrap(), "hello");

    // The loaded certificate's expiry is exported.
    assert_eq!(
        sample(&server.metrics.encode(), EXPIRY),
        Some(not_after(&pki))
    );

    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_client_not_trusting_the_ca_is_refused_and_others_are_unaffected() {
    let pki = bundle(30);
    let stranger = bundle(30);
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = write_pair(dir.path(), &pki);
    let server = start(options(TlsSource::Files { cert, key }), hello_app()).await;
    let url = format!("https://{}/", server.addr);

    let untrusting = client(&stranger.ca_pem).build().unwrap();
    let err = untrusting.get(&url).send().await.unwrap_err();
    assert!(err.is_connect(), "expected a TLS failure, got {err:?}");
    assert!(
        tls_connect(server.addr, &stranger.ca_pem, &[])
            .await
            .is_err()
    );

    // Garbage instead of a ClientHello is a failed handshake, nothing more.
    {
        use tokio::io::AsyncWriteExt;
        let mut raw = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        raw.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
    }

    let trusting = client(&pki.ca_pem).build().unwrap();
    let response = trusting.get(&url).send().await.unwrap();
    assert_eq!(response.status(), 200);

    server.stop().await.unwrap();
}

#[tokio::test]
async fn self_signed_serves_localhost_and_writes_its_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca_path = dir.path().join("ca.crt");
    let opts = options(TlsSource::SelfSigned {
        write_ca: Some(ca_path.clone()),
    });
    let server = start(opts, hello_app()).await;
    let ca_pem = std::fs::read_to_string(&ca_path).unwrap();

    for host in ["localhost", "127.0.0.1"] {
        let client = client(&ca_pem)
            .resolve("localhost", server.addr)
            .build()
            .unwrap();
        let url = format!("https://{host}:{}/", server.addr.port());
        let response = client.get(&url).send().await.unwrap();
        assert_eq!(response.text().await.unwrap(), "hello", "via {host}");
    }
    assert!(sample(&server.metrics.encode(), EXPIRY).unwrap() > 0.0);
    server.stop().await.unwrap();
}

/// A directory laid out the way the kubelet mounts a Secret: the data in a
/// timestamped directory, `..data` pointing at it, and the visible files
/// pointing through `..data`.
struct SecretMount {
    dir: tempfile::TempDir,
    generation: u32,
}

impl SecretMount {
    fn new(cert_pem: &str, key_pem: &str) -> Self {
        let mut mount = SecretMount {
            dir: tempfile::tempdir().unwrap(),
            generation: 0,
        };
        mount.swap(cert_pem, key_pem);
        for file in ["tls.crt", "tls.key"] {
            std::os::unix::fs::symlink(Path::new("..data").join(file), mount.path().join(file))
                .unwrap();
        }
        mount
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn source(&self) -> TlsSource {
        TlsSource::Files {
            cert: self.path().join("tls.crt"),
            key: self.path().join("tls.key"),
        }
    }

    /// Replaces the contents atomically, as the kubelet does: write a new
    /// timestamped directory, then rename a new symlink over `..data`.
    fn swap(&mut self, cert_pem: &str, key_pem: &str) {
        self.generation += 1;
        let data = format!("..2026_01_01_00_00_00.{:09}", self.generation);
        std::fs::create_dir(self.path().join(&data)).unwrap();
        std::fs::write(self.path().join(&data).join("tls.crt"), cert_pem).unwrap();
        std::fs::write(self.path().join(&data).join("tls.key"), key_pem).unwrap();
        let tmp = self.path().join("..data_tmp");
        std::os::unix::fs::symlink(&data, &tmp).unwrap();
        std::fs::rename(&tmp, self.path().join("..data")).unwrap();
    }
}

#[tokio::test]
async fn rotation_through_a_secret_symlink_swap_and_broken_pairs_keep_the_old_one() {
    let first = bundle(30);
    let second = bundle(60);
    let mut mount = SecretMount::new(&first.cert_pem, &first.key_pem);
    let server = start(options(mount.source()), hello_app()).await;

    assert_eq!(
        peer_leaf(server.addr, &first.ca_pem).await.unwrap(),
        leaf_der(&first)
    );

    // A new pair under a different CA: new connections get it.
    mount.swap(&second.cert_pem, &second.key_pem);
    let rotated = eventually(Duration::from_secs(10), || async {
        peer_leaf(server.addr, &second.ca_pem).await.ok() == Some(leaf_der(&second))
    })
    .await;
    assert!(rotated, "the rotated certificate was not served within 10s");
    let metrics = server.metrics.encode();
    assert_eq!(sample(&metrics, RELOAD_SUCCESSES), Some(1.0), "{metrics}");
    assert_eq!(sample(&metrics, EXPIRY), Some(not_after(&second)));

    // A garbage key, then a key of another certificate: each is one
    // counted failure, and the second pair stays in use.
    let stranger = bundle(90);
    let broken = [
        (second.cert_pem.clone(), "not a key".to_string()),
        (second.cert_pem.clone(), stranger.key_pem.clone()),
    ];
    for (round, (cert, key)) in broken.iter().enumerate() {
        mount.swap(cert, key);
        let expected = (round + 1) as f64;
        let counted = eventually(Duration::from_secs(10), || async {
            sample(&server.metrics.encode(), RELOAD_FAILURES) == Some(expected)
        })
        .await;
        assert!(
            counted,
            "failure {expected} not counted: {}",
            server.metrics.encode()
        );
        assert_eq!(
            peer_leaf(server.addr, &second.ca_pem).await.unwrap(),
            leaf_der(&second),
            "a broken pair replaced the certificate"
        );
    }
    // A broken pair is reported once, not on every poll.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let metrics = server.metrics.encode();
    assert_eq!(sample(&metrics, RELOAD_FAILURES), Some(2.0), "{metrics}");
    assert_eq!(sample(&metrics, EXPIRY), Some(not_after(&second)));

    // Fixing the files recovers.
    mount.swap(&stranger.cert_pem, &stranger.key_pem);
    let recovered = eventually(Duration::from_secs(10), || async {
        peer_leaf(server.addr, &stranger.ca_pem).await.ok() == Some(leaf_der(&stranger))
    })
    .await;
    assert!(recovered, "a good pair after broken ones was not picked up");

    server.stop().await.unwrap();
}

async fn bind_error(tls: TlsSource) -> ServeError {
    match Server::bind(options(tls), Arc::new(Metrics::new())).await {
        Ok(_) => panic!("bind succeeded"),
        Err(e) => e,
    }
}

#[tokio::test]
async fn start_up_fails_naming_the_bad_file() {
    let pki = bundle(30);
    let other = bundle(30);
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = write_pair(dir.path(), &pki);
    let files = |cert: &Path, key: &Path| TlsSource::Files {
        cert: cert.to_path_buf(),
        key: key.to_path_buf(),
    };
    let write = |name: &str, contents: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, contents).unwrap();
        path
    };

    let missing = dir.path().join("missing.crt");
    let err = bind_error(files(&missing, &key)).await.to_string();
    assert!(
        err.contains("missing.crt") && err.contains("cannot read"),
        "{err}"
    );

    let missing_key = dir.path().join("missing.key");
    let err = bind_error(files(&cert, &missing_key)).await.to_string();
    assert!(err.contains("missing.key"), "{err}");

    let garbage = write("garbage.crt", "this is not a certificate\n");
    let err = bind_error(files(&garbage, &key)).await.to_string();
    assert!(
        err.contains("garbage.crt") && err.contains("no PEM certificate"),
        "{err}"
    );

    let bad_base64 = write(
        "bad-base64.crt",
        "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
    );
    let err = bind_error(files(&bad_base64, &key)).await.to_string();
    assert!(err.contains("bad-base64.crt"), "{err}");

    let not_x509 = write(
        "not-x509.crt",
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    );
    let err = bind_error(files(&not_x509, &key)).await.to_string();
    assert!(
        err.contains("not-x509.crt") && err.contains("X.509"),
        "{err}"
    );

    let garbage_key = write("garbage.key", "not a key either\n");
    let err = bind_error(files(&cert, &garbage_key)).await.to_string();
    assert!(
        err.contains("garbage.key") && err.contains("no PEM private key"),
        "{err}"
    );

    let other_key = write("other.key", &other.key_pem);
    let err = bind_error(files(&cert, &other_key)).await;
    assert!(matches!(
        err,
        gpu_deploy_guard::serve::server::ServeError::Tls(_)
    ));
    let err = err.to_string();
    assert!(
        err.contains("other.key") && err.contains("does not belong"),
        "{err}"
    );

    // A certificate that expired yesterday.
    let expired_key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    params.not_before = time::OffsetDateTime::now_utc() - time::Duration::days(30);
    params.not_after = time::OffsetDateTime::now_utc() - time::Duration::days(1);
    let expired = params.self_signed(&expired_key).unwrap();
    let expired_cert = write("expired.crt", &expired.pem());
    let expired_key = write("expired.key", &expired_key.serialize_pem());
    let err = bind_error(files(&expired_cert, &expired_key))
        .await
        .to_string();
    assert!(
        err.contains("expired.crt") && err.contains("expired at"),
        "{err}"
    );
}

#[tokio::test]
async fn certificate_is_checked_before_any_port_is_bound() {
    // The webhook address is taken, and the certificate is missing: the
    // error must be about the certificate, proving it was loaded first.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut opts = options(TlsSource::Files {
        cert: "/nonexistent/tls.crt".into(),
        key: "/nonexistent/tls.key".into(),
    });
    opts.listen = taken.local_addr().unwrap();
    let err = Server::bind(opts, Arc::new(Metrics::new()))
        .await
        .err()
        .unwrap();
    assert!(matches!(err, ServeError::Tls(_)), "{err}");
    assert!(err.to_string().contains("/nonexistent/tls.crt"), "{err}");
}

#[tokio::test]
async fn addresses_in_use_fail_start_up_naming_the_address() {
    let pki = bundle(30);
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = write_pair(dir.path(), &pki);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_addr = taken.local_addr().unwrap();
    let source = TlsSource::Files { cert, key };

    let mut opts = options(source.clone());
    opts.listen = taken_addr;
    let err = Server::bind(opts, Arc::new(Metrics::new()))
        .await
        .err()
        .unwrap();
    let msg = err.to_string();
    assert!(matches!(err, ServeError::Bind { .. }), "{msg}");
    assert!(
        msg.contains(&taken_addr.to_string()) && msg.contains("webhook"),
        "{msg}"
    );

    let mut opts = options(source.clone());
    opts.admin_listen = taken_addr;
    let msg = Server::bind(opts, Arc::new(Metrics::new()))
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        msg.contains(&taken_addr.to_string()) && msg.contains("admin"),
        "{msg}"
    );

    // run() surfaces the same message through anyhow.
    let mut opts = options(source);
    opts.listen = taken_addr;
    let err = gpu_deploy_guard::serve::server::run(
        opts,
        hello_app(),
        Arc::new(Metrics::new()),
        gpu_deploy_guard::serve::readiness::Readiness::new(),
        std::future::pending(),
    )
    .await
    .unwrap_err();
    assert!(
        format!("{err:#}").contains(&taken_addr.to_string()),
        "{err:#}"
    );
}

#[tokio::test]
async fn zero_durations_are_refused() {
    let mut opts = options(TlsSource::SelfSigned { write_ca: None });
    opts.tls.tls_reload_interval = Duration::ZERO;
    let err = Server::bind(opts, Arc::new(Metrics::new()))
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("reload_interval"), "{err}");
}
