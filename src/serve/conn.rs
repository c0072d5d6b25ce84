//! One listener's connections: TLS, HTTP/1.1 or HTTP/2 by ALPN, the timeouts that stop a slow
//! or silent client from holding a connection, and draining.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::http::{HeaderValue, header};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;
use tracing::{debug, warn};

use super::idle;
use super::parse::parse_duration;
use super::pool::{Pool, Slot};
use crate::metrics::Metrics;

/// HTTP/2 ping interval. Detects a peer that vanished without closing (its
/// node died) sooner than the idle timeout would; a peer that answers is
/// still closed by the idle timeout (see `serve/idle.rs`).
const H2_KEEPALIVE: Duration = Duration::from_secs(30);

/// HTTP/1.1 read buffer: the largest request head, and the most body bytes
/// read ahead of the handler, per connection. The API server's heads are
/// well under 4 KiB.
const H1_MAX_BUF: usize = 64 * 1024;

/// HTTP/2 flow-control windows: the most body bytes a client may send ahead
/// of the handler, per stream and per connection.
const H2_STREAM_WINDOW: u32 = crate::webhook::BODY_WINDOW as u32;
const H2_CONN_WINDOW: u32 = 512 * 1024;

/// How long an admin connection may stay idle: Prometheus scrapes every 15 to 60 s and
/// reconnects at no cost; the kubelet's probes open a connection each.
pub(super) const ADMIN_IDLE_TIMEOUT: Duration = Duration::from_secs(5);

/// Time for an admin request head.
const ADMIN_HEADER_TIMEOUT: Duration = Duration::from_secs(2);

/// How each webhook connection is served: its HTTP/2 streams and its timeouts.
#[derive(clap::Args, Clone, Debug)]
pub struct ConnArgs {
    /// HTTP/2 requests in flight per connection.
    #[arg(
        long,
        env = "GDG_MAX_CONCURRENT_STREAMS",
        default_value_t = 64,
        display_order = 12
    )]
    pub max_concurrent_streams: u32,
    // Its whole body sent (an HTTP/2 client may grant no window) and no write to the socket
    // blocked longer.
    /// Time for a client to take an answer (an HTTP/2 client granting no window, a client
    /// that stops reading); the connection is closed after it.
    #[arg(long, env = "GDG_WRITE_TIMEOUT", default_value = "10s", value_parser = parse_duration,
          display_order = 13)]
    pub write_timeout: Duration,
    // Also spreads connections over replicas.
    /// The longest a webhook connection lives before the client is asked to reconnect
    /// (HTTP/2 GOAWAY, HTTP/1.1 `Connection: close`): a client authenticated by a CA since
    /// removed from --client-ca stops being served after it (plus the idle timeout at most).
    #[arg(long, env = "GDG_MAX_CONNECTION_AGE", default_value = "10m", value_parser = parse_duration,
          display_order = 16)]
    pub max_connection_age: Duration,
    /// Time for a request's head to arrive, from the start of a connection or from the first byte
    /// of a later request on it.
    #[arg(long, env = "GDG_HEADER_TIMEOUT", default_value = "5s", value_parser = parse_duration,
          display_order = 17)]
    pub header_timeout: Duration,
    // See `serve/idle.rs`.
    /// How long an idle HTTP/1.1 keep-alive connection stays open. Keep it above the API server's
    /// 90 s, so the API server closes idle connections first and never sends a review on a
    /// connection being closed.
    #[arg(long, env = "GDG_IDLE_TIMEOUT", default_value = "120s", value_parser = parse_duration,
          display_order = 18)]
    pub idle_timeout: Duration,
    /// Time for a TLS handshake.
    #[arg(long, env = "GDG_HANDSHAKE_TIMEOUT", default_value = "5s", value_parser = parse_duration,
          display_order = 21)]
    pub handshake_timeout: Duration,
}

/// Per-connection settings shared by all connections of a listener.
pub(super) struct ConnConfig {
    /// The protocol is fixed per connection from ALPN, so hyper never has to
    /// sniff the first bytes: sniffing waits for data with no timeout, which
    /// would let a silent client hold a connection forever.
    h1: auto::Builder<TokioExecutor>,
    h2: auto::Builder<TokioExecutor>,
    header_timeout: Duration,
    idle_timeout: Duration,
    write_timeout: Duration,
    handshake_timeout: Duration,
    /// `--max-connection-age`; `None` on the admin listener.
    max_age: Option<Duration>,
    /// Where handshakes and timeouts are counted; `None` for the admin listener.
    metrics: Option<Arc<Metrics>>,
}

impl ConnConfig {
    pub(super) fn new(opts: &ConnArgs, metrics: Option<Arc<Metrics>>) -> Self {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .keep_alive(true)
            .max_buf_size(H1_MAX_BUF)
            // hyper's timer would also close idle keep-alive connections after the header
            // timeout; `idle::Clock` tells the two apart instead.
            .header_read_timeout(None);
        builder
            .http2()
            .timer(TokioTimer::new())
            .keep_alive_interval(H2_KEEPALIVE)
            .max_concurrent_streams(opts.max_concurrent_streams)
            .initial_stream_window_size(H2_STREAM_WINDOW)
            .initial_connection_window_size(H2_CONN_WINDOW);
        Self {
            h1: builder.clone().http1_only(),
            h2: builder.http2_only(),
            header_timeout: opts.header_timeout,
            idle_timeout: opts.idle_timeout,
            write_timeout: opts.write_timeout,
            handshake_timeout: opts.handshake_timeout,
            max_age: metrics.as_ref().map(|_| opts.max_connection_age),
            metrics,
        }
    }

    /// The admin port's: probes and scrapes send their request at once and seldom reuse a
    /// connection for long, so idle and silent connections are closed soon, leaving the
    /// slots to the kubelet.
    pub(super) fn admin(opts: &ConnArgs) -> Self {
        let mut config = Self::new(opts, None);
        config.idle_timeout = ADMIN_IDLE_TIMEOUT;
        config.header_timeout = config.header_timeout.min(ADMIN_HEADER_TIMEOUT);
        config
    }

    fn count_handshake(&self, result: &'static str) {
        if let Some(metrics) = &self.metrics {
            metrics.connections.observe_handshake(result);
        }
    }

    fn count_timeout(&self, reason: &'static str) {
        if let Some(metrics) = &self.metrics {
            metrics.connections.observe_timeout(reason);
        }
    }

    fn count_open(&self, delta: i64) {
        if let Some(metrics) = &self.metrics {
            metrics.connections.add_open(delta);
        }
    }
}

/// Where shutdown is, as every connection sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stage {
    Serving,
    /// The shutdown delay: still accepting, but clients are told to go: HTTP/2 connections
    /// open at its start get a GOAWAY, HTTP/1.1 answers say `Connection: close`.
    Leaving,
    /// No new connections; every connection finishes what it has and closes.
    Draining,
}

/// One listener's accept loop.
pub(super) struct Acceptor {
    pub(super) listener: TcpListener,
    /// `None` for the plain-HTTP admin listener.
    pub(super) tls: Option<TlsAcceptor>,
    pub(super) app: Router,
    pub(super) conn: Arc<ConnConfig>,
    /// The listener's connection slots, shared fairly between sources.
    pub(super) pool: Arc<Pool>,
    pub(super) what: &'static str,
}

/// The connections of a listener that has stopped accepting.
pub(super) struct Connections {
    stage: watch::Sender<Stage>,
    pub(super) tasks: JoinSet<()>,
    what: &'static str,
}

impl Acceptor {
    /// Accepts until the future `stop` makes resolves, one task per
    /// connection, then closes the listener (new connections are refused from
    /// then on) and hands back the open connections for draining. `stop` gets
    /// the stage sender, to tell connections when the shutdown delay starts.
    pub(super) async fn run<F, Fut>(self, stop: F) -> Connections
    where
        F: FnOnce(watch::Sender<Stage>) -> Fut,
        Fut: Future<Output = ()>,
    {
        let Acceptor {
            listener,
            tls,
            app,
            conn,
            pool,
            what,
        } = self;
        let (stage, _) = watch::channel(Stage::Serving);
        let stop = stop(stage.clone());
        let mut tasks = JoinSet::new();
        tokio::pin!(stop);
        let mut full = false;
        loop {
            // Room first: when every connection is busy, new connections wait in the kernel's
            // backlog and cost no descriptor. When some are idle, a new one is accepted and
            // the pool decides which to close (`serve/pool.rs`).
            if !pool.has_room() {
                if !full {
                    full = true;
                    warn!(
                        listener = what,
                        "connection limit reached and none idle; new connections wait in the backlog"
                    );
                }
                tokio::select! {
                    biased;
                    () = &mut stop => break,
                    Some(joined) = tasks.join_next(), if !tasks.is_empty() => {
                        log_joined(what, joined);
                        continue;
                    }
                    () = pool.room() => {}
                }
            }
            full = false;
            tokio::select! {
                biased;
                () = &mut stop => break,
                Some(joined) = tasks.join_next(), if !tasks.is_empty() => log_joined(what, joined),
                accepted = listener.accept() => match accepted {
                    Ok((tcp, peer)) => {
                        let slot = match pool.admit(peer.ip(), tls.is_some()) {
                            Ok(slot) => slot,
                            Err(refused) => {
                                debug!(listener = what, %peer, reason = refused.reason(),
                                       "no place for the connection; closed");
                                continue;
                            }
                        };
                        // Reviews are small request/response pairs: send them
                        // at once instead of waiting to fill a segment.
                        let _ = tcp.set_nodelay(true);
                        let serve = serve_connection(
                            tcp, peer, tls.clone(), app.clone(), conn.clone(), stage.subscribe(),
                            slot,
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
        Connections { stage, tasks, what }
    }
}

fn log_joined(what: &'static str, joined: Result<(), tokio::task::JoinError>) {
    if let Err(error) = joined
        && error.is_panic()
    {
        warn!(listener = what, %error, "connection task panicked");
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
    pub(super) async fn drain(mut self, limit: Duration) {
        let what = self.what;
        self.stage.send_replace(Stage::Draining);
        let all_done = async {
            while let Some(joined) = self.tasks.join_next().await {
                log_joined(what, joined);
            }
        };
        match tokio::time::timeout(limit, all_done).await {
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

/// Counts a connection open for as long as it lives.
struct Open {
    conn: Arc<ConnConfig>,
}

impl Open {
    fn new(conn: Arc<ConnConfig>) -> Self {
        conn.count_open(1);
        Open { conn }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.conn.count_open(-1);
    }
}

/// Serves one connection until it ends, or until its pool closes it to admit another.
async fn serve_connection(
    tcp: TcpStream,
    peer: SocketAddr,
    tls: Option<TlsAcceptor>,
    app: Router,
    conn: Arc<ConnConfig>,
    stage: watch::Receiver<Stage>,
    slot: Slot,
) {
    let _open = Open::new(conn.clone());
    tokio::select! {
        () = serve_admitted(tcp, peer, tls, app, conn.clone(), stage, &slot) => {}
        () = slot.evicted() => debug!(%peer, "closed to make room for another connection"),
    }
}

async fn serve_admitted(
    tcp: TcpStream,
    peer: SocketAddr,
    tls: Option<TlsAcceptor>,
    app: Router,
    conn: Arc<ConnConfig>,
    stage: watch::Receiver<Stage>,
    slot: &Slot,
) {
    let Some(acceptor) = tls else {
        return serve_h1(&conn, tcp, peer, app, stage, slot).await;
    };
    let handshake = tokio::time::timeout(conn.handshake_timeout, acceptor.accept(tcp)).await;
    slot.handshake_done();
    let stream = match handshake {
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
        let clock = idle::Clock::http2(conn.idle_timeout, conn.write_timeout);
        slot.serving(clock.clone());
        serve_clocked(&conn, &conn.h2, stream, peer, app, stage, clock, true).await;
    } else {
        serve_h1(&conn, stream, peer, app, stage, slot).await;
    }
}

/// HTTP/1.1, with the header, idle and write timeouts of [`idle::Clock`].
async fn serve_h1<IO>(
    conn: &ConnConfig,
    io: IO,
    peer: SocketAddr,
    app: Router,
    stage: watch::Receiver<Stage>,
    slot: &Slot,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let clock = idle::Clock::http1(conn.header_timeout, conn.idle_timeout, conn.write_timeout);
    slot.serving(clock.clone());
    serve_clocked(conn, &conn.h1, io, peer, app, stage, clock, false).await;
}

/// Serves a connection until it ends or its [`idle::Clock`] expires.
#[allow(clippy::too_many_arguments)]
async fn serve_clocked<IO>(
    conn: &ConnConfig,
    builder: &auto::Builder<TokioExecutor>,
    io: IO,
    peer: SocketAddr,
    app: Router,
    stage: watch::Receiver<Stage>,
    clock: Arc<idle::Clock>,
    http2: bool,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io = idle::Watched::new(io, clock.clone());
    tokio::select! {
        () = serve_http(builder, io, peer, app, stage, clock.clone(), http2, conn.max_age) => {}
        expired = clock.expired() => {
            conn.count_timeout(expired.reason());
            debug!(%peer, reason = expired.describe(), "closing the connection");
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn serve_http<IO>(
    builder: &auto::Builder<TokioExecutor>,
    io: IO,
    peer: SocketAddr,
    app: Router,
    mut stage: watch::Receiver<Stage>,
    clock: Arc<idle::Clock>,
    http2: bool,
    max_age: Option<Duration>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // Past its age a connection is asked to go as in the shutdown delay: HTTP/1.1 answers
    // `Connection: close` (an idle one is then closed by the idle timeout, never under a
    // request on its way), HTTP/2 gets a GOAWAY, which the client sees before any new stream.
    let too_old = max_age.map(|age| tokio::time::Instant::now() + age);
    let leaving = stage.clone();
    let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        // Lets handlers log who called them via axum's ConnectInfo extractor.
        request.extensions_mut().insert(ConnectInfo(peer));
        let app = app.clone();
        let clock = clock.clone();
        let close = !http2
            && (*leaving.borrow() != Stage::Serving
                || too_old.is_some_and(|at| tokio::time::Instant::now() >= at));
        async move {
            clock.request_started();
            let response = app.oneshot(request).await;
            clock.handler_done();
            response.map(|mut response| {
                if close {
                    // During the shutdown delay: the client reconnects, to another replica.
                    response
                        .headers_mut()
                        .insert(header::CONNECTION, HeaderValue::from_static("close"));
                }
                response.map(|body| idle::Tracked::new(body, clock))
            })
        }
    });
    let connection = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(connection);
    // A connection accepted during the shutdown delay is served until the drain.
    let mut shutting = false;
    if *stage.borrow_and_update() == Stage::Draining {
        connection.as_mut().graceful_shutdown();
        shutting = true;
    }
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(error) = result {
                    debug!(%peer, %error, "connection ended with an error");
                }
                return;
            }
            () = sleep_until_or_never(too_old), if http2 && !shutting => {
                debug!(%peer, "connection reached its maximum age; GOAWAY");
                connection.as_mut().graceful_shutdown();
                shutting = true;
            }
            changed = stage.changed(), if !shutting => {
                let now = if changed.is_ok() { *stage.borrow_and_update() } else { Stage::Draining };
                if now == Stage::Draining || (http2 && now == Stage::Leaving) {
                    connection.as_mut().graceful_shutdown();
                    shutting = true;
                }
            }
        }
    }
}

async fn sleep_until_or_never(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Aborts a background task when its owner goes away, so nothing outlives
/// `serve` even if the caller drops it half-way.
pub(super) struct AbortOnDrop<T>(pub(super) JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
