//! A `serve` process for the hardening tests, and the clients that attack it: HTTPS with or
//! without a client certificate, raw HTTP/2 with chosen flow-control windows, raw TLS.
#![allow(dead_code)] // not every helper is used by every test

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use gpu_deploy_guard::certs;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

pub const BIN: &str = env!("CARGO_BIN_EXE_gpu-deploy-guard");

pub type TlsStream = tokio_rustls::client::TlsStream<TcpStream>;

pub use crate::process_support::free_port;

/// A running `serve` with a certificate for 127.0.0.1 from its own CA; killed when dropped.
pub struct Serve {
    child: Child,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub ca: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Serve {
    /// Starts `serve` with `extra` flags and waits until it is ready.
    pub async fn start(extra: &[&str]) -> Serve {
        Self::spawn(None, extra).await
    }

    /// Like [`Serve::start`], with the process's open-file limit set to `nofile`.
    pub async fn start_with_nofile(nofile: u32, extra: &[&str]) -> Serve {
        Self::spawn(Some(nofile), extra).await
    }

    /// Like [`Serve::start`], serving `bundle` (written to `tls.crt` and `tls.key` in
    /// [`Serve::dir`]).
    pub async fn start_with_bundle(bundle: certs::Bundle, extra: &[&str]) -> Serve {
        Self::spawn_with(None, bundle, extra).await
    }

    async fn spawn(nofile: Option<u32>, extra: &[&str]) -> Serve {
        let bundle = certs::generate(
            &["localhost".to_owned()],
            &["127.0.0.1".parse().unwrap()],
            2,
        )
        .unwrap();
        Self::spawn_with(nofile, bundle, extra).await
    }

    async fn spawn_with(nofile: Option<u32>, bundle: certs::Bundle, extra: &[&str]) -> Serve {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        std::fs::write(&cert, &bundle.cert_pem).unwrap();
        std::fs::write(&key, &bundle.key_pem).unwrap();
        let log = dir.path().join("serve.log");
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let mut command = match nofile {
            Some(n) => {
                let mut c = Command::new("prlimit");
                c.arg(format!("--nofile={n}:{n}")).arg(BIN);
                c
            }
            None => Command::new(BIN),
        };
        command.args([
            "serve",
            "--no-cluster-watch",
            "--listen",
            &addr.to_string(),
            "--admin-listen",
            &admin.to_string(),
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ]);
        if !extra.contains(&"--shutdown-delay") {
            command.args(["--shutdown-delay", "0s"]);
        }
        command
            .args(extra)
            .env("RUST_LOG", "info")
            .env("GLIBC_TUNABLES", chart_malloc_tunables())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        let child = command.spawn().unwrap();
        let mut serve = Serve {
            child,
            addr,
            admin,
            ca: bundle.ca_pem,
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while serve.readyz_status().await != Some(200) {
            if let Ok(Some(status)) = serve.child.try_wait() {
                panic!(
                    "serve exited with {status} before it was ready:\n{}",
                    serve.log_text()
                );
            }
            assert!(
                Instant::now() < deadline,
                "serve not ready after 30 s:\n{}",
                serve.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        serve
    }

    /// The directory holding the serving certificate (`tls.crt`, `tls.key`) and the log.
    pub fn dir(&self) -> &std::path::Path {
        self._dir.path()
    }

    /// The admin port's `/metrics` text; empty if it did not answer.
    pub async fn metrics(&self) -> String {
        let response = plain_client(Duration::from_secs(5))
            .get(format!("http://{}/metrics", self.admin))
            .send()
            .await;
        match response {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    /// The value of one sample of `/metrics` (`name{labels}` as written there), if present.
    pub async fn metric(&self, series: &str) -> Option<f64> {
        let text = self.metrics().await;
        text.lines().find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn status_field_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no {field} in /proc/{}/status", self.pid()))
    }

    /// The highest resident memory of the process so far, in bytes.
    pub fn peak_rss(&self) -> u64 {
        self.status_field_kib("VmHWM:") * 1024
    }

    /// The resident memory of the process now, in bytes.
    pub fn rss(&self) -> u64 {
        self.status_field_kib("VmRSS:") * 1024
    }

    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The length of the longest line `serve` logged so far.
    pub fn longest_log_line(&self) -> usize {
        std::fs::read(&self.log)
            .unwrap_or_default()
            .split(|b| *b == b'\n')
            .map(<[u8]>::len)
            .max()
            .unwrap_or(0)
    }

    pub fn sigterm(&mut self) {
        self.signal("TERM");
    }

    /// Sends the signal `name` (`TERM`, `HUP`, `USR1`…).
    pub fn signal(&mut self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// The exit status, once the process has exited.
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits for the process to exit; `false` if it is still running after `limit`.
    pub async fn wait_exit(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    pub async fn readyz_status(&self) -> Option<u16> {
        plain_client(Duration::from_secs(2))
            .get(format!("http://{}/readyz", self.admin))
            .send()
            .await
            .ok()
            .map(|r| r.status().as_u16())
    }

    /// How long `/livez` took to answer 200, or `limit` if it did not within it.
    pub async fn livez_latency(&self, limit: Duration) -> Duration {
        let begun = Instant::now();
        let ok = plain_client(limit)
            .get(format!("http://{}/livez", self.admin))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200);
        if ok { begun.elapsed() } else { limit }
    }

    pub async fn assert_livez(&self, within: Duration) {
        let took = self.livez_latency(within * 5).await;
        assert!(took < within, "/livez took {took:?} (bound {within:?})");
    }

    pub async fn post_review(&self, body: Vec<u8>) -> (u16, Vec<u8>) {
        post_review_to(self.addr, &self.ca, body).await
    }

    /// POSTs a good review with `identity` as client certificate: the status, or `None` if
    /// the connection or TLS handshake was refused.
    pub async fn post_with_identity(&self, identity: Option<&reqwest::Identity>) -> Option<u16> {
        let mut builder = https_client(&self.ca);
        if let Some(identity) = identity {
            builder = builder.identity(identity.clone());
        }
        builder
            .build()
            .unwrap()
            .post(format!("https://{}/validate", self.addr))
            .header("content-type", "application/json")
            .body(good_review())
            .send()
            .await
            .ok()
            .map(|r| r.status().as_u16())
    }
}

pub fn plain_client(timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(timeout)
        .build()
        .unwrap()
}

fn https_client(ca: &str) -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .use_rustls_tls()
        .no_proxy()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(ca.as_bytes()).unwrap())
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(60))
}

/// POSTs `body` to `/validate` over HTTP/1.1: status and body; status 0 if the exchange failed.
pub async fn post_review_to(addr: SocketAddr, ca: &str, body: Vec<u8>) -> (u16, Vec<u8>) {
    post_to(addr, ca, "/validate", body).await
}

/// POSTs `body` to `path` over HTTP/1.1: status and body; status 0 if the exchange failed.
pub async fn post_to(addr: SocketAddr, ca: &str, path: &str, body: Vec<u8>) -> (u16, Vec<u8>) {
    let client = https_client(ca).http1_only().build().unwrap();
    let response = match client
        .post(format!("https://{addr}{path}"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("request failed: {e}");
            return (0, Vec::new());
        }
    };
    let status = response.status().as_u16();
    (status, response.bytes().await.unwrap_or_default().to_vec())
}

/// A raw TLS connection trusting a CA, offering ALPN protocols: the server tests' own.
pub use crate::server_support::tls_connect;

/// An HTTP/2 client connection whose stream receive window is chosen by the test; the h2
/// library answers the server's PINGs as long as the connection runs.
pub struct H2Conn {
    send: h2::client::SendRequest<Bytes>,
    pub ping_pong: Option<h2::PingPong>,
    conn: JoinHandle<Result<(), h2::Error>>,
}

impl H2Conn {
    pub async fn connect(addr: SocketAddr, ca: &str, window: u32) -> H2Conn {
        Self::connect_with(addr, ca, window).await.unwrap()
    }

    /// A connection with the default window, or why it could not be made.
    pub async fn connect_raw(addr: SocketAddr, ca: &str) -> anyhow::Result<H2Conn> {
        Self::connect_with(addr, ca, 65_535).await
    }

    async fn connect_with(addr: SocketAddr, ca: &str, window: u32) -> anyhow::Result<H2Conn> {
        let tls = tls_connect(addr, ca, &[b"h2"]).await?;
        let (send, mut conn) = h2::client::Builder::new()
            .initial_window_size(window)
            .handshake::<_, Bytes>(tls)
            .await?;
        let ping_pong = conn.ping_pong();
        let conn = tokio::spawn(conn);
        Ok(H2Conn {
            send,
            ping_pong,
            conn,
        })
    }

    /// Sends a review; resolves with the response head.
    pub async fn send(&mut self, body: Vec<u8>) -> h2::client::ResponseFuture {
        let mut send = self.send.clone().ready().await.unwrap();
        let request = http::Request::post("https://localhost/validate")
            .header("content-type", "application/json")
            .body(())
            .unwrap();
        let (response, mut stream) = send.send_request(request, false).unwrap();
        stream.send_data(Bytes::from(body), true).unwrap();
        response
    }

    /// Sends a review and reads the whole answer.
    pub async fn post(&mut self, body: Vec<u8>) -> (u16, Vec<u8>) {
        let response = tokio::time::timeout(Duration::from_secs(20), self.send(body).await)
            .await
            .expect("no response within 20 s")
            .unwrap();
        let status = response.status().as_u16();
        let mut body = response.into_body();
        let mut bytes = Vec::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.unwrap();
            let _ = body.flow_control().release_capacity(chunk.len());
            bytes.extend_from_slice(&chunk);
        }
        (status, bytes)
    }

    /// Resolves when the connection has ended (GOAWAY and all streams done, or closed).
    pub async fn closed(&mut self) {
        let _ = (&mut self.conn).await;
    }
}

impl Drop for H2Conn {
    fn drop(&mut self) {
        self.conn.abort();
    }
}

/// A CA for client certificates, and certificates it signs.
pub struct ClientCa {
    pub ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl ClientCa {
    pub fn new(name: &str) -> ClientCa {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = params.self_signed(&key).unwrap();
        ClientCa {
            ca_pem: ca.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A client certificate for `name`, with its key, as reqwest takes it.
    pub fn client_identity(&self, name: &str) -> reqwest::Identity {
        self.identity_with(name, &[ExtendedKeyUsagePurpose::ClientAuth])
    }

    /// A certificate for `name` with the extended key usages `usages`, and its key.
    pub fn identity_with(
        &self,
        name: &str,
        usages: &[ExtendedKeyUsagePurpose],
    ) -> reqwest::Identity {
        let (cert, key) = self.leaf_pem(name, usages);
        reqwest::Identity::from_pem(format!("{cert}{key}").as_bytes()).unwrap()
    }

    /// A leaf (not CA) certificate for `name` signed by this CA, and its key, in PEM.
    pub fn leaf_pem(&self, name: &str, usages: &[ExtendedKeyUsagePurpose]) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = usages.to_vec();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// A serving certificate for 127.0.0.1 valid from `not_before` to `not_after`, as a
    /// bundle with this CA.
    pub fn serving_bundle(
        &self,
        not_before: time::OffsetDateTime,
        not_after: time::OffsetDateTime,
    ) -> certs::Bundle {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        params.subject_alt_names = vec![rcgen::SanType::IpAddress("127.0.0.1".parse().unwrap())];
        params.is_ca = IsCa::ExplicitNoCa;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.not_before = not_before;
        params.not_after = not_after;
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        certs::Bundle {
            ca_pem: self.ca_pem.clone(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

/// A Node UPDATE review: `old` labels before, `new` after, both on node `name`.
pub fn review(name: &str, old: &[(String, String)], new: &[(String, String)]) -> Vec<u8> {
    let labels = |pairs: &[(String, String)]| {
        Value::Object(
            pairs
                .iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect(),
        )
    };
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "3b8d6f0e-7a52-4d2c-9a0e-1f2b3c4d5e6f",
            "kind": {"group": "", "version": "v1", "kind": "Node"},
            "resource": {"group": "", "version": "v1", "resource": "nodes"},
            "name": name,
            "operation": "UPDATE",
            "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters"]},
            "object": {"apiVersion": "v1", "kind": "Node",
                       "metadata": {"name": name, "labels": labels(new)}},
            "oldObject": {"apiVersion": "v1", "kind": "Node",
                          "metadata": {"name": name, "labels": labels(old)}},
            "dryRun": false
        }
    }))
    .unwrap()
}

/// A review the webhook allows: a GPU node keeps the device plugin and the toolkit.
pub fn good_review() -> Vec<u8> {
    let labels: Vec<(String, String)> = [
        ("nvidia.com/gpu.present", "true"),
        ("nvidia.com/gpu.deploy.device-plugin", "true"),
        ("nvidia.com/gpu.deploy.container-toolkit", "true"),
        ("kubernetes.io/hostname", "gpu-node-1"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let mut new = labels.clone();
    new.push(("example.com/team".to_owned(), "ml".to_owned()));
    review("gpu-node-1", &labels, &new)
}

pub fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

/// Polls `check` every 100 ms until it returns true or `limit` passes.
pub async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The chart's `mallocTunables`: `serve` runs here with the allocator settings it has in the
/// Deployment.
pub fn chart_malloc_tunables() -> String {
    let values = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/helm/gpu-deploy-guard/values.yaml"
    ))
    .unwrap();
    let line = values
        .lines()
        .find_map(|l| l.strip_prefix("mallocTunables: "))
        .expect("the chart's values.yaml sets mallocTunables");
    line.trim_matches('"').to_owned()
}
