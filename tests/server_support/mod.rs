//! Shared helpers for the server and TLS tests: certificates on disk, a
//! running server, and clients that trust (or do not trust) its CA.
#![allow(dead_code)] // each test binary uses a different subset

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpu_deploy_guard::certs::{self, Bundle};
use gpu_deploy_guard::metrics::Metrics;
use gpu_deploy_guard::serve::readiness::Readiness;
use gpu_deploy_guard::serve::server::{ConnArgs, Server, ServerArgs};
use gpu_deploy_guard::serve::tls::{TlsArgs, TlsSource};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

pub const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// A fresh CA and a certificate for 127.0.0.1 and localhost.
pub fn bundle(validity_days: u32) -> Bundle {
    certs::generate(&["localhost".to_string()], &[LOCALHOST], validity_days).unwrap()
}

/// Writes the bundle's certificate and key as plain files in `dir`.
pub fn write_pair(dir: &Path, bundle: &Bundle) -> (PathBuf, PathBuf) {
    let cert = dir.join("tls.crt");
    let key = dir.join("tls.key");
    std::fs::write(&cert, &bundle.cert_pem).unwrap();
    std::fs::write(&key, &bundle.key_pem).unwrap();
    (cert, key)
}

pub fn leaf_der(bundle: &Bundle) -> Vec<u8> {
    CertificateDer::from_pem_slice(bundle.cert_pem.as_bytes())
        .unwrap()
        .to_vec()
}

/// Options listening on free ports of 127.0.0.1, with short timeouts so
/// tests do not wait long.
pub fn options(tls: TlsSource) -> ServerArgs {
    let (tls_cert, tls_key, write_ca) = match tls {
        TlsSource::Files { cert, key } => (Some(cert), Some(key), None),
        TlsSource::SelfSigned { write_ca } => (None, None, write_ca),
    };
    ServerArgs {
        listen: SocketAddr::new(LOCALHOST, 0),
        admin_listen: SocketAddr::new(LOCALHOST, 0),
        tls: TlsArgs {
            tls_cert,
            tls_key,
            write_ca,
            client_ca: None,
            client_ca_allowed_names: Vec::new(),
            tls_reload_interval: Duration::from_millis(100),
        },
        max_connections: Some(64),
        conn: ConnArgs {
            max_concurrent_streams: 16,
            write_timeout: Duration::from_secs(5),
            max_connection_age: Duration::from_secs(600),
            header_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(4),
            handshake_timeout: Duration::from_secs(1),
        },
        drain_timeout: Duration::from_secs(10),
        shutdown_delay: Duration::ZERO,
    }
}

/// A router answering `GET /` with "hello".
pub fn hello_app() -> axum::Router {
    axum::Router::new().route("/", axum::routing::get(|| async { "hello" }))
}

pub struct Running {
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub metrics: Arc<Metrics>,
    pub readiness: Readiness,
    stop: Option<oneshot::Sender<()>>,
    pub task: JoinHandle<anyhow::Result<()>>,
}

impl Running {
    /// Triggers the shutdown future given to `serve`.
    pub fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Triggers shutdown and waits (bounded) for `serve` to return.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.shutdown();
        tokio::time::timeout(Duration::from_secs(20), &mut self.task)
            .await
            .expect("server did not stop within 20s")
            .expect("server task panicked")
    }
}

pub async fn start(opts: ServerArgs, app: axum::Router) -> Running {
    start_with(opts, app, Readiness::new()).await
}

pub async fn start_with(opts: ServerArgs, app: axum::Router, readiness: Readiness) -> Running {
    let metrics = Arc::new(Metrics::new());
    let server = Server::bind(opts, metrics.clone()).await.unwrap();
    let (addr, admin) = (server.local_addr(), server.admin_addr());
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn({
        let readiness = readiness.clone();
        async move {
            server
                .serve(app, readiness, async {
                    let _ = stopped.await;
                })
                .await
                .map_err(anyhow::Error::from)
        }
    });
    Running {
        addr,
        admin,
        metrics,
        readiness,
        stop: Some(stop),
        task,
    }
}

/// An HTTPS client trusting only `ca_pem`, with no connection reuse so
/// every request makes a new TLS connection.
pub fn client(ca_pem: &str) -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .use_rustls_tls()
        .no_proxy()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap())
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
}

/// A plain HTTP client for the admin port.
pub fn plain_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// A raw TLS connection trusting `ca_pem`, offering `alpn`.
pub async fn tls_connect(
    addr: SocketAddr,
    ca_pem: &str,
    alpn: &[&[u8]],
) -> std::io::Result<TlsStream<TcpStream>> {
    tls_over(TcpStream::connect(addr).await?, ca_pem, alpn).await
}

/// TLS over a TCP connection already made (from a chosen source address, say).
pub async fn tls_over(
    tcp: TcpStream,
    ca_pem: &str,
    alpn: &[&[u8]],
) -> std::io::Result<TlsStream<TcpStream>> {
    let addr = tcp.peer_addr()?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    TlsConnector::from(Arc::new(config))
        .connect(ServerName::IpAddress(addr.ip().into()), tcp)
        .await
}

/// The leaf certificate a new connection to `addr` is served.
pub async fn peer_leaf(addr: SocketAddr, ca_pem: &str) -> std::io::Result<Vec<u8>> {
    let stream = tls_connect(addr, ca_pem, &[b"http/1.1"]).await?;
    let leaf = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(|c| c.to_vec())
        .expect("server sent a certificate");
    Ok(leaf)
}

/// Polls `check` every 50 ms until it returns true or `limit` passes.
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
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The value of one sample line of an OpenMetrics exposition, e.g.
/// `gpu_deploy_guard_tls_certificate_reloads_total{result="failure"}`.
pub fn sample(exposition: &str, series: &str) -> Option<f64> {
    exposition.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?;
        rest.strip_prefix(' ')?.trim().parse().ok()
    })
}
