//! The HTTPS listener for the webhook, the plain-HTTP admin listener, and
//! graceful shutdown.
//!
//! This layer deals only with connections: TLS, HTTP/1.1 and HTTP/2,
//! timeouts that stop a slow or silent client from holding a connection,
//! and draining in-flight reviews on SIGTERM so a rolling update never cuts
//! an API server request in half. What a request means is the router's job.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{info, warn};

pub use super::conn::ConnArgs;
use super::conn::{AbortOnDrop, Acceptor, ConnConfig, Connections, Stage};
use super::parse::{parse_duration, parse_listen};
use super::pool::Pool;
use super::readiness::{Readiness, admin_router};
use super::tls::{Tls, TlsArgs, TlsError};
use crate::metrics::Metrics;

/// How long the admin listener may take to finish its own requests once the
/// webhook has drained; a scrape or probe answers in milliseconds.
const ADMIN_DRAIN: Duration = Duration::from_secs(2);

/// Connections the admin port serves at once: probes and scrapes need a few.
const ADMIN_MAX_CONNECTIONS: usize = 32;

/// Admin connections from one source: the kubelet and Prometheus need a couple each, and a
/// flood from one address leaves the rest to them.
const ADMIN_MAX_PER_SOURCE: usize = 8;

/// TLS handshakes in progress at once on the webhook port: a full handshake takes
/// milliseconds, and the API server keeps its connections, so a small pool serves it; the
/// pool's fairness (`serve/pool.rs`) keeps a flood of silent connections from taking it.
pub const MAX_HANDSHAKES: usize = 64;

/// The server's flags: where it listens, its certificate ([`TlsArgs`]), its connections
/// ([`ConnArgs`]), and how it shuts down.
#[derive(clap::Args, Clone, Debug)]
pub struct ServerArgs {
    // Port 0 picks a free port; see [`Server::local_addr`].
    /// HTTPS address of the webhook (POST /validate).
    #[arg(long, env = "GDG_LISTEN", default_value = "0.0.0.0:8443", value_parser = parse_listen,
          display_order = 0)]
    pub listen: SocketAddr,
    /// Plain-HTTP address of /livez, /readyz and /metrics. In a pod, the kubelet's probes and
    /// Prometheus reach it on the pod IP: `--admin-listen=$(POD_IP):8080` binds only there
    /// (the Helm chart's default); a bare IPv6 address before the port is read too.
    #[arg(long, env = "GDG_ADMIN_LISTEN", default_value = "0.0.0.0:8080", value_parser = parse_listen,
          display_order = 1)]
    pub admin_listen: SocketAddr,
    #[command(flatten)]
    pub tls: TlsArgs,
    // Keep it below the open-file limit (see [`limits::default_max_connections`]).
    /// Webhook connections served at once; more wait in the listen backlog. The default is
    /// 128, or less when the open-file limit is low (it stays below it).
    #[arg(long, env = "GDG_MAX_CONNECTIONS", display_order = 10)]
    pub max_connections: Option<usize>,
    #[command(flatten)]
    pub conn: ConnArgs,
    /// After SIGTERM, how long in-flight reviews may take to finish.
    #[arg(long, env = "GDG_DRAIN_TIMEOUT", default_value = "20s", value_parser = parse_duration,
          display_order = 22)]
    pub drain_timeout: Duration,
    // Kubernetes takes a moment to drop the endpoint, and the API server must not be refused
    // meanwhile. HTTP/2 connections get a GOAWAY and HTTP/1.1 answers `Connection: close` from
    // its start, so clients move to another replica before the drain.
    /// After SIGTERM, how long to keep serving with /readyz at 503 before draining, so the
    /// endpoint is gone from the Service before the listener closes.
    #[arg(long, env = "GDG_SHUTDOWN_DELAY", default_value = "3s", value_parser = parse_duration,
          display_order = 23)]
    pub shutdown_delay: Duration,
}

impl ServerArgs {
    /// `--max-connections`, or the default for this process's open-file limit.
    pub fn max_connections(&self) -> usize {
        self.max_connections
            .unwrap_or_else(super::limits::default_max_connections)
    }
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
    #[error("{0} must be greater than zero")]
    ZeroLimit(&'static str),
}

/// A server with its certificate loaded and both ports bound, not yet
/// accepting. Splitting bind from serve lets a caller (or a test) learn the
/// actual addresses when asked to listen on port 0.
pub struct Server {
    opts: ServerArgs,
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
    pub async fn bind(opts: ServerArgs, metrics: Arc<Metrics>) -> Result<Self, ServeError> {
        for (name, value) in [
            ("reload_interval", opts.tls.tls_reload_interval),
            ("header_timeout", opts.conn.header_timeout),
            ("idle_timeout", opts.conn.idle_timeout),
            ("handshake_timeout", opts.conn.handshake_timeout),
            ("drain_timeout", opts.drain_timeout),
            ("write_timeout", opts.conn.write_timeout),
            ("max_connection_age", opts.conn.max_connection_age),
        ] {
            if value.is_zero() {
                return Err(ServeError::ZeroDuration(name));
            }
        }
        if opts.max_connections() == 0 {
            return Err(ServeError::ZeroLimit("max_connections"));
        }
        if opts.conn.max_concurrent_streams == 0 {
            return Err(ServeError::ZeroLimit("max_concurrent_streams"));
        }
        let tls = Tls::load(
            &opts.tls.source(),
            opts.tls.client_ca.as_deref(),
            &opts.tls.client_ca_allowed_names,
            &metrics,
        )?;
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
        self.serve_until(app, readiness, shutdown, std::future::pending())
            .await
    }

    /// Like [`Server::serve`]; when `hurry` resolves during the shutdown delay or the drain,
    /// both end at once and the connections still open are cut.
    pub async fn serve_until(
        self,
        app: Router,
        readiness: Readiness,
        shutdown: impl Future<Output = ()> + Send + 'static,
        hurry: impl Future<Output = ()> + Send + 'static,
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
            .spawn_reloader(
                opts.tls.tls_reload_interval,
                metrics.clone(),
                readiness.gate("serving-certificate"),
            )
            .map(AbortOnDrop);

        let max_connections = opts.max_connections();
        metrics.connections.set_limit(max_connections);
        let conn = Arc::new(ConnConfig::new(&opts.conn, Some(metrics.clone())));
        let admin = Acceptor {
            listener: admin_listener,
            tls: None,
            app: admin_router(metrics.clone(), readiness.clone()),
            conn: Arc::new(ConnConfig::admin(&opts.conn)),
            pool: Pool::new(
                "admin",
                ADMIN_MAX_CONNECTIONS,
                ADMIN_MAX_PER_SOURCE,
                ADMIN_MAX_CONNECTIONS,
                Some(metrics.clone()),
            ),
            what: "admin",
        };
        let admin = AdminThread::start(admin)?;

        let webhook = Acceptor {
            listener,
            tls: Some(tls.acceptor()),
            app,
            conn,
            pool: Pool::new(
                "webhook",
                max_connections,
                max_connections,
                MAX_HANDSHAKES,
                Some(metrics.clone()),
            ),
            what: "webhook",
        };
        info!(%local_addr, %admin_addr, max_connections, "serving");
        readiness.set_serving(true);
        let stopping = readiness.clone();
        let delay = opts.shutdown_delay;
        let (hurried_tx, hurried) = watch::channel(false);
        let _hurry = AbortOnDrop(tokio::spawn(async move {
            hurry.await;
            hurried_tx.send_replace(true);
        }));
        let hurried_in_delay = hurried.clone();
        let connections = webhook
            .run(move |stage: watch::Sender<Stage>| {
                stop_when(shutdown, stopping, delay, hurried_in_delay, stage)
            })
            .await;
        info!(
            open = connections.tasks.len(),
            limit = ?opts.drain_timeout,
            "shutting down: no new connections, letting requests in flight finish"
        );
        drain(connections, opts.drain_timeout, hurried).await;
        admin.stop().await;
        info!("shut down");
        Ok(())
    }
}

/// Waits for `shutdown`, then reports draining and, for the shutdown `delay` (ended early once
/// `hurried`), tells clients to go while the listener still accepts.
async fn stop_when(
    shutdown: impl Future<Output = ()>,
    stopping: Readiness,
    delay: Duration,
    mut hurried: watch::Receiver<bool>,
    stage: watch::Sender<Stage>,
) {
    shutdown.await;
    // Report draining before the listener closes, so a probe
    // from now on explains why the endpoint is going away.
    stopping.set_serving(false);
    if !delay.is_zero() {
        // Clients are told to go now, while they can still reach this replica.
        stage.send_replace(Stage::Leaving);
        info!(delay = ?delay, "readiness is 503; still accepting until the endpoint \
              is removed; HTTP/2 clients sent GOAWAY, HTTP/1.1 answers close");
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            _ = hurried.wait_for(|h| *h) => {
                warn!("second signal: ending the shutdown delay now");
            }
        }
    }
}

/// Lets the requests in flight finish within `limit`; once `hurried`, cuts the connections
/// still open.
async fn drain(connections: Connections, limit: Duration, mut hurried: watch::Receiver<bool>) {
    if *hurried.borrow() {
        // Cut at once: the JoinSet aborts its tasks when dropped.
        drop(connections);
    } else {
        tokio::select! {
            () = connections.drain(limit) => {}
            _ = hurried.wait_for(|h| *h) => {
                warn!("second signal: ending the drain now, cutting the connections still open");
            }
        }
    }
}

/// The admin listener on a thread and runtime of its own, so that probes and
/// scrapes are answered however busy the webhook's workers are.
struct AdminThread {
    stop: tokio::sync::oneshot::Sender<()>,
    done: tokio::sync::oneshot::Receiver<()>,
}

impl AdminThread {
    fn start(admin: Acceptor) -> Result<Self, ServeError> {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (finished, done) = tokio::sync::oneshot::channel::<()>();
        let addr = admin.listener.local_addr().ok();
        let listener = admin.listener.into_std();
        let spawn_error = |source| ServeError::Bind {
            addr: addr.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0))),
            what: "admin",
            source,
        };
        let listener = listener.map_err(spawn_error)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(spawn_error)?;
        std::thread::Builder::new()
            .name("admin".to_owned())
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = match TcpListener::from_std(listener) {
                        Ok(listener) => listener,
                        Err(error) => return warn!(%error, "admin listener unusable"),
                    };
                    let admin = Acceptor { listener, ..admin };
                    let connections = admin
                        .run(|_| async {
                            let _ = stopped.await;
                        })
                        .await;
                    connections.drain(ADMIN_DRAIN).await;
                });
                let _ = finished.send(());
            })
            .map_err(spawn_error)?;
        Ok(AdminThread { stop, done })
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        if self.done.await.is_err() {
            warn!("admin listener thread ended abnormally");
        }
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
    opts: ServerArgs,
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

/// Like [`run`], until a terminating signal, then drains; a second signal ends the drain at
/// once. Every signal whose default is to end the process (SIGTERM from the kubelet, SIGINT,
/// SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2) drains: none of them may cut reviews in flight.
pub async fn run_until_signalled(
    opts: ServerArgs,
    app: Router,
    metrics: Arc<Metrics>,
    readiness: Readiness,
) -> anyhow::Result<()> {
    // Listening before anything else: from here on these signals no longer kill.
    let signals = Signals::listen();
    let (first, second) = (signals.clone(), signals);
    Server::bind(opts, metrics)
        .await?
        .serve_until(
            app,
            readiness,
            async move { first.nth(1).await },
            async move { second.nth(2).await },
        )
        .await?;
    Ok(())
}

/// Counts the terminating signals received.
#[derive(Clone)]
pub struct Signals {
    count: watch::Receiver<usize>,
}

impl Signals {
    /// Starts listening for SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2. Must be
    /// called within a Tokio runtime.
    pub fn listen() -> Self {
        use tokio::signal::unix::{SignalKind, signal};
        let (tx, count) = watch::channel(0usize);
        let tx = Arc::new(tx);
        for (kind, name) in [
            (SignalKind::terminate(), "SIGTERM"),
            (SignalKind::interrupt(), "SIGINT"),
            (SignalKind::hangup(), "SIGHUP"),
            (SignalKind::quit(), "SIGQUIT"),
            (SignalKind::user_defined1(), "SIGUSR1"),
            (SignalKind::user_defined2(), "SIGUSR2"),
        ] {
            let mut stream = match signal(kind) {
                Ok(stream) => stream,
                Err(error) => {
                    warn!(%error, signal = name, "cannot listen for this signal");
                    continue;
                }
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                while stream.recv().await.is_some() {
                    let n = {
                        let mut n = 0;
                        tx.send_modify(|c| {
                            *c += 1;
                            n = *c;
                        });
                        n
                    };
                    if n == 1 {
                        info!(signal = name, "signal received: draining");
                    } else {
                        warn!(signal = name, "another signal received: stopping now");
                    }
                }
            });
        }
        Signals { count }
    }

    /// Resolves once `n` signals have been received.
    pub async fn nth(mut self, n: usize) {
        let _ = self.count.wait_for(|c| *c >= n).await;
    }
}
