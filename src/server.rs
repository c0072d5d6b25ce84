//! The HTTPS listener for the webhook, the plain-HTTP admin listener, and
//! graceful shutdown.
//!
//! This layer deals only with connections: TLS, HTTP/1.1 and HTTP/2,
//! timeouts that stop a slow or silent client from holding a connection,
//! and draining in-flight reviews on SIGTERM so a rolling update never cuts
//! an API server request in half. What a request means is the router's job.

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, State};
use axum::http::{StatusCode, header};
use axum::routing::get;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;
use tracing::{debug, info, warn};

mod idle;

use crate::metrics::Metrics;
use crate::tls::{Tls, TlsError, TlsSource};

/// How long the admin listener may take to finish its own requests once the
/// webhook has drained; a scrape or probe answers in milliseconds.
const ADMIN_DRAIN: Duration = Duration::from_secs(2);

/// HTTP/2 ping interval on idle connections. Detects a peer that vanished
/// without closing (its node died), which would otherwise hold the
/// connection forever; HTTP/1.1 gets the same from the idle timeout.
const H2_KEEPALIVE: Duration = Duration::from_secs(30);

#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// HTTPS for the webhook. Port 0 picks a free port; see [`Server::local_addr`].
    pub listen: SocketAddr,
    /// Plain HTTP: `/livez`, `/readyz`, `/metrics`.
    pub admin_listen: SocketAddr,
    pub tls: TlsSource,
    /// How often the certificate files are checked for a rotation.
    pub reload_interval: Duration,
    /// Time allowed to send a request head: from the start of a connection, and from the first
    /// byte of each later request on it.
    pub header_timeout: Duration,
    /// How long an HTTP/1.1 keep-alive connection may wait for its next request. Longer than the
    /// API server's 90 s, so that the API server, not us, closes idle connections (see
    /// `server/idle.rs`).
    pub idle_timeout: Duration,
    /// Time allowed for the TLS handshake.
    pub handshake_timeout: Duration,
    /// After shutdown starts, the longest in-flight requests may run on.
    pub drain_timeout: Duration,
    /// After SIGTERM, how long to keep accepting while readiness is already 503: Kubernetes
    /// takes a moment to drop the endpoint, and the API server must not be refused meanwhile.
    pub shutdown_delay: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        addr: SocketAddr,
        what: &'static str,
        source: std::io::Error,
    },
    #[error("{0} must be greater than zero")]
    ZeroDuration(&'static str),
}

// ---------------------------------------------------------------------------
// Readiness

const STARTING: u8 = 0;
const SERVING: u8 = 1;
const DRAINING: u8 = 2;

/// Whether the webhook should get traffic, as `/readyz` reports it. Not
/// ready until the server is serving and every registered [`Gate`] is open;
/// not ready again once shutdown starts, so the endpoint is taken out of
/// the Service before the listener closes.
#[derive(Clone, Default)]
pub struct Readiness {
    inner: Arc<ReadinessInner>,
}

#[derive(Default)]
struct ReadinessInner {
    phase: AtomicU8,
    gates: Mutex<Vec<Gate>>,
}

/// A named condition that holds readiness back until opened, e.g. a cluster
/// cache that has to sync before decisions can be made.
#[derive(Clone, Debug)]
pub struct Gate {
    name: &'static str,
    open: Arc<AtomicBool>,
}

impl Gate {
    pub fn name(&self) -> &'static str {
        self.name
    }
    pub fn open(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
    /// Closes the gate again, e.g. when a cache loses its watch.
    pub fn close(&self) {
        self.open.store(false, Ordering::SeqCst);
    }
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::SeqCst)
    }
}

/// Why the webhook is not ready.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotReady {
    Starting,
    Draining,
    /// Names of the gates not yet open.
    Waiting(Vec<&'static str>),
}

impl fmt::Display for NotReady {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotReady::Starting => f.write_str("starting"),
            NotReady::Draining => f.write_str("draining"),
            NotReady::Waiting(names) => write!(f, "waiting for: {}", names.join(", ")),
        }
    }
}

impl Readiness {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a gate that must be opened before the webhook is ready.
    /// Asking twice for the same name returns the same gate.
    pub fn gate(&self, name: &'static str) -> Gate {
        let mut gates = self.inner.gates.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(gate) = gates.iter().find(|g| g.name == name) {
            return gate.clone();
        }
        let gate = Gate {
            name,
            open: Arc::new(AtomicBool::new(false)),
        };
        gates.push(gate.clone());
        gate
    }

    /// `true` once the listener accepts connections; `false` when it stops
    /// (which reads as draining, unless it never served at all).
    pub fn set_serving(&self, serving: bool) {
        let phase = &self.inner.phase;
        if serving {
            phase.store(SERVING, Ordering::SeqCst);
        } else {
            let _ = phase.compare_exchange(SERVING, DRAINING, Ordering::SeqCst, Ordering::SeqCst);
        }
    }

    pub fn status(&self) -> Result<(), NotReady> {
        match self.inner.phase.load(Ordering::SeqCst) {
            STARTING => return Err(NotReady::Starting),
            DRAINING => return Err(NotReady::Draining),
            _ => {}
        }
        let gates = self.inner.gates.lock().unwrap_or_else(|e| e.into_inner());
        let closed: Vec<_> = gates
            .iter()
            .filter(|g| !g.is_open())
            .map(|g| g.name)
            .collect();
        if closed.is_empty() {
            Ok(())
        } else {
            Err(NotReady::Waiting(closed))
        }
    }

    pub fn is_ready(&self) -> bool {
        self.status().is_ok()
    }
}

// ---------------------------------------------------------------------------
// Admin endpoints

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// `/livez` (always 200 while the process answers), `/readyz` (200 or 503
/// with the reason) and `/metrics` (OpenMetrics text).
pub fn admin_router(metrics: Arc<Metrics>, readiness: Readiness) -> Router {
    Router::new()
        .route("/livez", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(readiness): State<Readiness>| async move {
                match readiness.status() {
                    Ok(()) => (StatusCode::OK, "ready".to_string()),
                    Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, reason.to_string()),
                }
            }),
        )
        .with_state(readiness)
        .route(
            "/metrics",
            get(move || async move { ([(header::CONTENT_TYPE, OPENMETRICS)], metrics.encode()) }),
        )
}

// ---------------------------------------------------------------------------
// Serving

/// A server with its certificate loaded and both ports bound, not yet
/// accepting. Splitting bind from serve lets a caller (or a test) learn the
/// actual addresses when asked to listen on port 0.
pub struct Server {
    opts: ServeOptions,
    tls: Tls,
    listener: TcpListener,
    admin_listener: TcpListener,
    local_addr: SocketAddr,
    admin_addr: SocketAddr,
    metrics: Arc<Metrics>,
}

impl Server {
    /// Loads the certificate first, so a bad file fails start-up naming the
    /// file before any port is taken, then binds the webhook and admin ports.
    pub async fn bind(opts: ServeOptions, metrics: Arc<Metrics>) -> Result<Self, ServeError> {
        for (name, value) in [
            ("reload_interval", opts.reload_interval),
            ("header_timeout", opts.header_timeout),
            ("idle_timeout", opts.idle_timeout),
            ("handshake_timeout", opts.handshake_timeout),
            ("drain_timeout", opts.drain_timeout),
        ] {
            if value.is_zero() {
                return Err(ServeError::ZeroDuration(name));
            }
        }
        let tls = Tls::load(&opts.tls, &metrics)?;
        let (listener, local_addr) = bind(opts.listen, "webhook").await?;
        let (admin_listener, admin_addr) = bind(opts.admin_listen, "admin").await?;
        Ok(Self {
            opts,
            tls,
            listener,
            admin_listener,
            local_addr,
            admin_addr,
            metrics,
        })
    }

    /// The address the webhook (HTTPS) listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The address the admin (plain HTTP) listener is on.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// Serves until `shutdown` resolves, then drains; see [`run`].
    pub async fn serve(
        self,
        app: Router,
        readiness: Readiness,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        let Server {
            opts,
            tls,
            listener,
            admin_listener,
            local_addr,
            admin_addr,
            metrics,
        } = self;
        let _reloader = tls
            .spawn_reloader(opts.reload_interval, metrics.clone())
            .map(AbortOnDrop);

        let conn = Arc::new(ConnConfig::new(&opts, Some(metrics.clone())));
        let (admin_stop, admin_stopped) = tokio::sync::oneshot::channel::<()>();
        let admin = Acceptor {
            listener: admin_listener,
            tls: None,
            app: admin_router(metrics, readiness.clone()),
            conn: Arc::new(ConnConfig::new(&opts, None)),
            what: "admin",
        };
        let admin = AbortOnDrop(tokio::spawn(admin.run(async {
            let _ = admin_stopped.await;
        })));

        let webhook = Acceptor {
            listener,
            tls: Some(tls.acceptor()),
            app,
            conn,
            what: "webhook",
        };
        info!(%local_addr, %admin_addr, "serving");
        readiness.set_serving(true);
        let stopping = readiness.clone();
        let delay = opts.shutdown_delay;
        let connections = webhook
            .run(async move {
                shutdown.await;
                // Report draining before the listener closes, so a probe
                // from now on explains why the endpoint is going away.
                stopping.set_serving(false);
                if !delay.is_zero() {
                    info!(delay = ?delay, "readiness is 503; still accepting until the endpoint is removed");
                    tokio::time::sleep(delay).await;
                }
            })
            .await;
        info!(
            open = connections.graceful.count(),
            limit = ?opts.drain_timeout,
            "shutting down: no new connections, letting requests in flight finish"
        );
        connections.drain(opts.drain_timeout).await;

        let _ = admin_stop.send(());
        match admin.join().await {
            Some(connections) => connections.drain(ADMIN_DRAIN).await,
            None => warn!("admin listener task ended abnormally"),
        }
        info!("shut down");
        Ok(())
    }
}

async fn bind(
    addr: SocketAddr,
    what: &'static str,
) -> Result<(TcpListener, SocketAddr), ServeError> {
    let err = |source| ServeError::Bind { addr, what, source };
    let listener = TcpListener::bind(addr).await.map_err(err)?;
    let local = listener.local_addr().map_err(err)?;
    Ok((listener, local))
}

/// Loads TLS, binds both ports, serves `app` over HTTPS and the admin
/// endpoints over HTTP until `shutdown` resolves, then drains in-flight
/// requests for at most `drain_timeout` and returns.
pub async fn run(
    opts: ServeOptions,
    app: Router,
    metrics: Arc<Metrics>,
    readiness: Readiness,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    Server::bind(opts, metrics)
        .await?
        .serve(app, readiness, shutdown)
        .await?;
    Ok(())
}

/// Resolves on SIGTERM (what the kubelet sends) or Ctrl-C.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let term = async {
        match signal(SignalKind::terminate()) {
            Ok(mut sigterm) => {
                sigterm.recv().await;
            }
            Err(error) => {
                warn!(%error, "cannot listen for SIGTERM; only Ctrl-C will stop the server");
                std::future::pending::<()>().await;
            }
        }
    };
    let interrupt = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            warn!(%error, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        () = term => info!("SIGTERM received"),
        () = interrupt => info!("interrupt received"),
    }
}

// ---------------------------------------------------------------------------
// Connections

/// Per-connection settings shared by all connections of a listener.
struct ConnConfig {
    /// The protocol is fixed per connection from ALPN, so hyper never has to
    /// sniff the first bytes: sniffing waits for data with no timeout, which
    /// would let a silent client hold a connection forever.
    h1: auto::Builder<TokioExecutor>,
    h2: auto::Builder<TokioExecutor>,
    header_timeout: Duration,
    idle_timeout: Duration,
    handshake_timeout: Duration,
    /// Where handshakes and timeouts are counted; `None` for the admin listener.
    metrics: Option<Arc<Metrics>>,
}

impl ConnConfig {
    fn new(opts: &ServeOptions, metrics: Option<Arc<Metrics>>) -> Self {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .keep_alive(true)
            // hyper's timer would also close idle keep-alive connections after the header
            // timeout; `idle::Clock` tells the two apart instead.
            .header_read_timeout(None);
        builder
            .http2()
            .timer(TokioTimer::new())
            .keep_alive_interval(H2_KEEPALIVE);
        Self {
            h1: builder.clone().http1_only(),
            h2: builder.http2_only(),
            header_timeout: opts.header_timeout,
            idle_timeout: opts.idle_timeout,
            handshake_timeout: opts.handshake_timeout,
            metrics,
        }
    }

    fn count_handshake(&self, result: &'static str) {
        if let Some(metrics) = &self.metrics {
            metrics.observe_handshake(result);
        }
    }

    fn count_timeout(&self, reason: &'static str) {
        if let Some(metrics) = &self.metrics {
            metrics.observe_connection_timeout(reason);
        }
    }
}

/// One listener's accept loop.
struct Acceptor {
    listener: TcpListener,
    /// `None` for the plain-HTTP admin listener.
    tls: Option<TlsAcceptor>,
    app: Router,
    conn: Arc<ConnConfig>,
    what: &'static str,
}

/// The connections of a listener that has stopped accepting.
struct Connections {
    graceful: GracefulShutdown,
    tasks: JoinSet<()>,
    what: &'static str,
}

impl Acceptor {
    /// Accepts until `stop` resolves, one task per connection, then closes
    /// the listener (new connections are refused from then on) and hands
    /// back the open connections for draining.
    async fn run(self, stop: impl Future<Output = ()>) -> Connections {
        let Acceptor {
            listener,
            tls,
            app,
            conn,
            what,
        } = self;
        let graceful = GracefulShutdown::new();
        let mut tasks = JoinSet::new();
        tokio::pin!(stop);
        loop {
            tokio::select! {
                biased;
                () = &mut stop => break,
                Some(joined) = tasks.join_next(), if !tasks.is_empty() => {
                    if let Err(error) = joined
                        && error.is_panic()
                    {
                        warn!(listener = what, %error, "connection task panicked");
                    }
                }
                accepted = listener.accept() => match accepted {
                    Ok((tcp, peer)) => {
                        // Reviews are small request/response pairs: send them
                        // at once instead of waiting to fill a segment.
                        let _ = tcp.set_nodelay(true);
                        // Taken before the handshake so draining also waits
                        // for connections still negotiating TLS.
                        let watcher = graceful.watcher();
                        let serve = serve_connection(
                            tcp, peer, tls.clone(), app.clone(), conn.clone(), watcher,
                        );
                        tasks.spawn(serve);
                    }
                    Err(error) if is_per_connection(&error) => {
                        debug!(listener = what, %error, "accept failed for one connection");
                    }
                    Err(error) => {
                        // Out of file descriptors or similar: retrying at
                        // once would spin; give connections time to close.
                        warn!(listener = what, %error, "cannot accept connections; retrying in 1s");
                        tokio::select! {
                            () = &mut stop => break,
                            () = tokio::time::sleep(Duration::from_secs(1)) => {}
                        }
                    }
                },
            }
        }
        drop(listener);
        Connections {
            graceful,
            tasks,
            what,
        }
    }
}

fn is_per_connection(error: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        error.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    )
}

impl Connections {
    /// Asks every connection to finish (HTTP/1.1: close after the current
    /// response; HTTP/2: GOAWAY) and waits up to `limit`; whatever is still
    /// open then is cut.
    async fn drain(mut self, limit: Duration) {
        let what = self.what;
        match tokio::time::timeout(limit, self.graceful.shutdown()).await {
            Ok(()) => debug!(listener = what, "all connections finished"),
            Err(_) => warn!(
                listener = what,
                open = self.tasks.len(),
                "drain timeout reached; closing the connections still open"
            ),
        }
        self.tasks.shutdown().await;
    }
}

async fn serve_connection(
    tcp: TcpStream,
    peer: SocketAddr,
    tls: Option<TlsAcceptor>,
    app: Router,
    conn: Arc<ConnConfig>,
    watcher: Watcher,
) {
    let Some(acceptor) = tls else {
        return serve_h1(&conn, tcp, peer, app, watcher).await;
    };
    let stream = match tokio::time::timeout(conn.handshake_timeout, acceptor.accept(tcp)).await {
        Ok(Ok(stream)) => {
            conn.count_handshake("success");
            stream
        }
        Ok(Err(error)) => {
            conn.count_handshake("failure");
            return debug!(%peer, %error, "TLS handshake failed");
        }
        Err(_) => {
            conn.count_handshake("timeout");
            return debug!(%peer, "TLS handshake timed out");
        }
    };
    // RFC 9113 §3.2: HTTP/2 over TLS is chosen by ALPN only; anything else,
    // including no ALPN at all, is HTTP/1.1.
    if stream.get_ref().1.alpn_protocol() == Some(b"h2") {
        // hyper's HTTP/2 server has no timeout for the client preface; wait
        // for its first bytes here, bounded like an HTTP/1.1 header.
        let mut stream = BufReader::new(stream);
        match tokio::time::timeout(conn.header_timeout, stream.fill_buf()).await {
            Ok(Ok(first)) if !first.is_empty() => {}
            Ok(Ok(_)) => return debug!(%peer, "HTTP/2 client closed before its preface"),
            Ok(Err(error)) => return debug!(%peer, %error, "HTTP/2 connection failed"),
            Err(_) => {
                conn.count_timeout("header");
                return debug!(%peer, "HTTP/2 client sent no preface in time");
            }
        }
        serve_http(&conn.h2, stream, peer, app, watcher, None).await;
    } else {
        serve_h1(&conn, stream, peer, app, watcher).await;
    }
}

/// HTTP/1.1, with the header and idle timeouts of [`idle::Clock`].
async fn serve_h1<IO>(conn: &ConnConfig, io: IO, peer: SocketAddr, app: Router, watcher: Watcher)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let clock = idle::Clock::new(conn.header_timeout, conn.idle_timeout);
    let io = idle::Watched::new(io, clock.clone());
    tokio::select! {
        () = serve_http(&conn.h1, io, peer, app, watcher, Some(clock.clone())) => {}
        expired = clock.expired() => {
            conn.count_timeout(expired.reason());
            debug!(%peer, reason = expired.describe(), "closing the connection");
        }
    }
}

async fn serve_http<IO>(
    builder: &auto::Builder<TokioExecutor>,
    io: IO,
    peer: SocketAddr,
    app: Router,
    watcher: Watcher,
    clock: Option<Arc<idle::Clock>>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        // Lets handlers log who called them via axum's ConnectInfo extractor.
        request.extensions_mut().insert(ConnectInfo(peer));
        let app = app.clone();
        let clock = clock.clone();
        async move {
            if let Some(clock) = &clock {
                clock.request_started();
            }
            let response = app.oneshot(request).await;
            if let Some(clock) = &clock {
                clock.request_finished();
            }
            response
        }
    });
    let connection = builder.serve_connection(TokioIo::new(io), service);
    if let Err(error) = watcher.watch(connection).await {
        debug!(%peer, %error, "connection ended with an error");
    }
}

/// Aborts a background task when its owner goes away, so nothing outlives
/// `serve` even if the caller drops it half-way.
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> AbortOnDrop<T> {
    async fn join(mut self) -> Option<T> {
        (&mut self.0).await.ok()
    }
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
