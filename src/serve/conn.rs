//! One listener's connections: TLS, HTTP/1.1 or HTTP/2 by ALPN, the timeouts that stop a slow
//! or silent client from holding a connection, and draining.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;
use tracing::{debug, warn};

use super::idle;
use super::server::ServeOptions;
use crate::metrics::Metrics;

/// HTTP/2 ping interval on idle connections. Detects a peer that vanished
/// without closing (its node died), which would otherwise hold the
/// connection forever; HTTP/1.1 gets the same from the idle timeout.
const H2_KEEPALIVE: Duration = Duration::from_secs(30);

/// Per-connection settings shared by all connections of a listener.
pub(super) struct ConnConfig {
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
    pub(super) fn new(opts: &ServeOptions, metrics: Option<Arc<Metrics>>) -> Self {
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
pub(super) struct Acceptor {
    pub(super) listener: TcpListener,
    /// `None` for the plain-HTTP admin listener.
    pub(super) tls: Option<TlsAcceptor>,
    pub(super) app: Router,
    pub(super) conn: Arc<ConnConfig>,
    pub(super) what: &'static str,
}

/// The connections of a listener that has stopped accepting.
pub(super) struct Connections {
    pub(super) graceful: GracefulShutdown,
    tasks: JoinSet<()>,
    what: &'static str,
}

impl Acceptor {
    /// Accepts until `stop` resolves, one task per connection, then closes
    /// the listener (new connections are refused from then on) and hands
    /// back the open connections for draining.
    pub(super) async fn run(self, stop: impl Future<Output = ()>) -> Connections {
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
    pub(super) async fn drain(mut self, limit: Duration) {
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
pub(super) struct AbortOnDrop<T>(pub(super) JoinHandle<T>);

impl<T> AbortOnDrop<T> {
    pub(super) async fn join(mut self) -> Option<T> {
        (&mut self.0).await.ok()
    }
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
