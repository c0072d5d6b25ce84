//! `gpu-deploy-guard serve`: its flags, and the process that wires the webhook, the listeners
//! and the cluster watch together.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::ValueEnum;

use super::conn::AbortOnDrop;
use super::lease::{Election, LeaseConfig};
use super::readiness::Readiness;
use super::server::{self, ServeOptions};
use super::tls;
use super::watch::{WatchConfig, elect, watch_cluster};
use crate::cli::version::{OperatorVersionArg, apply_given};
use crate::core::config::Config;
use crate::core::facts::{
    ClusterFacts, PolicySource, VersionSource, assumed_version, operator_defaults,
};
use crate::core::operator::OperatorVersion;
use crate::k8s::deployment::{self, Unread};
use crate::k8s::fleet::Fleet;
use crate::k8s::read;
use crate::metrics::Metrics;
use crate::webhook::{self, Limits, Webhook};

#[derive(clap::Args)]
pub struct ServeArgs {
    /// HTTPS address of the webhook (POST /validate).
    #[arg(long, env = "GDG_LISTEN", default_value = "0.0.0.0:8443", value_parser = parse_listen)]
    pub listen: SocketAddr,
    /// Plain-HTTP address of /livez, /readyz and /metrics. In a pod, the kubelet's probes and
    /// Prometheus reach it on the pod IP: `--admin-listen=$(POD_IP):8080` binds only there
    /// (the Helm chart's default); a bare IPv6 address before the port is read too.
    #[arg(long, env = "GDG_ADMIN_LISTEN", default_value = "0.0.0.0:8080", value_parser = parse_listen)]
    pub admin_listen: SocketAddr,
    /// PEM certificate chain to serve; re-read when the file changes. Without it, a
    /// self-signed certificate for localhost is made in memory (for trying it out only).
    #[arg(long, env = "GDG_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "GDG_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// With the self-signed certificate: write its CA here so a client can trust it.
    #[arg(long, env = "GDG_WRITE_CA", conflicts_with = "tls_cert")]
    pub write_ca: Option<PathBuf>,
    /// YAML configuration: rule actions, mode, exemptions, operator namespace and version.
    #[arg(long, env = "GDG_CONFIG")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub operator_version: OperatorVersionArg,
    /// Log format.
    #[arg(long, env = "GDG_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Largest request body accepted, in bytes (413 above). The API server sends at most about
    /// 3 MiB per review.
    #[arg(long, env = "GDG_MAX_BODY_BYTES", default_value_t = Limits::default().max_body_bytes)]
    pub max_body_bytes: usize,
    /// Request body bytes held at once across all connections; a body waits for room (503
    /// after the body timeout). At least --max-body-bytes.
    #[arg(long, env = "GDG_MAX_INFLIGHT_BODY_BYTES", default_value_t = Limits::default().max_inflight_body_bytes)]
    pub max_inflight_body_bytes: usize,
    /// Webhook connections served at once; more wait in the listen backlog. The default is
    /// 128, or less when the open-file limit is low (it stays below it).
    #[arg(long, env = "GDG_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Requests in flight from one client address across all its connections (HTTP/2
    /// streams and HTTP/1.1 requests); more are answered 503 at once. The default is half of
    /// --max-connections, so that a source at its share leaves connections the pool may close
    /// for another (src/webhook/shares.rs).
    #[arg(long, env = "GDG_MAX_REQUESTS_PER_SOURCE")]
    pub max_requests_per_source: Option<usize>,
    /// HTTP/2 requests in flight per connection.
    #[arg(long, env = "GDG_MAX_CONCURRENT_STREAMS", default_value_t = 64)]
    pub max_concurrent_streams: u32,
    /// Time for a client to take an answer (an HTTP/2 client granting no window, a client
    /// that stops reading); the connection is closed after it.
    #[arg(long, env = "GDG_WRITE_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub write_timeout: Duration,
    /// PEM CA bundle: require a client certificate signed by it (the API server presents one
    /// when its AdmissionConfiguration gives the webhook a kubeconfig; see
    /// docs/client-certificates.md). Re-read when the file changes.
    #[arg(long, env = "GDG_CLIENT_CA")]
    pub client_ca: Option<PathBuf>,
    /// With --client-ca: the names a client certificate may carry (its subject's common name,
    /// or a DNS, URI or email subject alternative name), comma-separated; empty allows any
    /// certificate the CA signed. The clientAuth extended key usage is always required.
    #[arg(
        long,
        env = "GDG_CLIENT_CA_ALLOWED_NAMES",
        value_delimiter = ',',
        requires = "client_ca"
    )]
    pub client_ca_allowed_names: Vec<String>,
    /// The longest a webhook connection lives before the client is asked to reconnect
    /// (HTTP/2 GOAWAY, HTTP/1.1 `Connection: close`): a client authenticated by a CA since
    /// removed from --client-ca stops being served after it (plus the idle timeout at most).
    #[arg(long, env = "GDG_MAX_CONNECTION_AGE", default_value = "10m", value_parser = parse_duration)]
    pub max_connection_age: Duration,
    /// Time for a request's head to arrive, from the start of a connection or from the first byte
    /// of a later request on it.
    #[arg(long, env = "GDG_HEADER_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub header_timeout: Duration,
    /// How long an idle HTTP/1.1 keep-alive connection stays open. Keep it above the API server's
    /// 90 s, so the API server closes idle connections first and never sends a review on a
    /// connection being closed.
    #[arg(long, env = "GDG_IDLE_TIMEOUT", default_value = "120s", value_parser = parse_duration)]
    pub idle_timeout: Duration,
    /// Time for a request's body to arrive.
    #[arg(long, env = "GDG_BODY_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub body_timeout: Duration,
    /// Time for a whole request, body included.
    #[arg(long, env = "GDG_REQUEST_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub request_timeout: Duration,
    /// Time for a TLS handshake.
    #[arg(long, env = "GDG_HANDSHAKE_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub handshake_timeout: Duration,
    /// After SIGTERM, how long in-flight reviews may take to finish.
    #[arg(long, env = "GDG_DRAIN_TIMEOUT", default_value = "20s", value_parser = parse_duration)]
    pub drain_timeout: Duration,
    /// After SIGTERM, how long to keep serving with /readyz at 503 before draining, so the
    /// endpoint is gone from the Service before the listener closes.
    #[arg(long, env = "GDG_SHUTDOWN_DELAY", default_value = "3s", value_parser = parse_duration)]
    pub shutdown_delay: Duration,
    /// Do not read the cluster: decide with the GPU Operator's default operand switches and
    /// run no continuous audit. Without this, the ClusterPolicy, the operand DaemonSets, their
    /// pods, the operator's Deployment (for its version) and the nodes are watched (in-cluster
    /// config or KUBECONFIG).
    #[arg(long, env = "GDG_NO_CLUSTER_WATCH")]
    pub no_cluster_watch: bool,
    /// Write the continuous audit as ClusterPolicyReport `gpu-deploy-guard` (wgpolicyk8s.io/v1alpha2).
    #[arg(long, env = "GDG_REPORT", conflicts_with = "no_cluster_watch")]
    pub report: bool,
    /// Name of the coordination.k8s.io Lease that elects the one replica running the continuous
    /// audit (pod watch, gauges, report); every replica answers reviews.
    #[arg(
        long,
        env = "GDG_AUDIT_LEASE",
        default_value = "gpu-deploy-guard-audit"
    )]
    pub audit_lease: String,
    /// Namespace of the audit's Lease: the pod's own (the chart passes it), else the
    /// kubeconfig's namespace.
    #[arg(long, env = "POD_NAMESPACE")]
    pub audit_lease_namespace: Option<String>,
    /// This replica's name in the Lease: the pod's name (the chart passes it), else the host
    /// name and process id.
    #[arg(long, env = "POD_NAME")]
    pub audit_lease_identity: Option<String>,
    /// How long the Lease holds without renewal: the longest a dead auditor's work waits
    /// for another replica to take over (a replica that stops cleanly hands over at once).
    #[arg(long, env = "GDG_AUDIT_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub audit_lease_duration: Duration,
    /// Run the continuous audit in this replica without an election (one replica only).
    #[arg(long, env = "GDG_NO_AUDIT_LEASE")]
    pub no_audit_lease: bool,
    /// Objects per page when listing the nodes and the operator's pods; one page is held in
    /// memory at a time.
    #[arg(long, env = "GDG_LIST_PAGE_SIZE", default_value_t = super::watch::DEFAULT_PAGE_SIZE,
          value_parser = clap::value_parser!(u32).range(1..=500))]
    pub list_page_size: u32,
    /// How often the certificate files are checked for rotation.
    #[arg(long, env = "GDG_TLS_RELOAD_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub tls_reload_interval: Duration,
}

/// Why the version is assumed with `--no-cluster-watch` and no version given.
const NOT_WATCHED: &str = "no --operator-version given and the cluster is not watched: the newest version the model follows";

#[derive(Copy, Clone, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Parses a listen address: `IP:PORT`, `[IPv6]:PORT`, or a bare IPv6 address and a port
/// (`fd00::12:8080`, the last colon separating the port), which is what `$(POD_IP):PORT`
/// gives in an IPv6 pod.
pub fn parse_listen(text: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let bad =
        || format!("{text:?} is not an address like 0.0.0.0:8080, 10.0.0.7:8080 or [fd00::7]:8080");
    let (ip, port) = text.rsplit_once(':').ok_or_else(bad)?;
    let ip: std::net::Ipv6Addr = ip.parse().map_err(|_| bad())?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    Ok(SocketAddr::from((ip, port)))
}

/// Parses a duration: `500ms`, `5s`, `2m`, `1h`, `1m30s` (humantime), a bare number of seconds,
/// or a decimal number of `ms`, `s` or `m` (`1.5s`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let invalid = |e: &dyn std::fmt::Display| format!("{text:?}: {e}");
    if let Ok(seconds) = text.parse::<f64>() {
        return Duration::try_from_secs_f64(seconds).map_err(|e| invalid(&e));
    }
    if let Some(at) = text.find(|c: char| c.is_ascii_alphabetic())
        && text[..at].contains('.')
    {
        let (number, unit) = text.split_at(at);
        let scale = match unit {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            _ => return Err(format!("{text:?}: a fraction takes the unit ms, s or m")),
        };
        let value: f64 = number.parse().map_err(|e| invalid(&e))?;
        return Duration::try_from_secs_f64(value * scale).map_err(|e| invalid(&e));
    }
    humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration like 500ms, 5s, 2m or 1m30s: {e}"))
}

fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only for a terminal: in a pod's log they are escape sequences.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        // Request fields are escaped: a `\n` or ESC in a uid must not forge a line.
        LogFormat::Text => builder.fmt_fields(super::logs::text_fields()).init(),
    }
}

/// Runs `serve` until a terminating signal (SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 or
/// SIGUSR2), then drains; a second one ends the drain at once.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    init_logs(args.log_format);
    let (no_cluster_watch, report) = (args.no_cluster_watch, args.report);
    let audit = AuditOptions {
        lease: (!args.no_audit_lease).then(|| LeaseArgs {
            name: args.audit_lease.clone(),
            namespace: args.audit_lease_namespace.clone(),
            identity: args.audit_lease_identity.clone(),
            duration: args.audit_lease_duration,
        }),
        page_size: args.list_page_size,
    };
    let config = match &args.config {
        Some(path) => read::config_file(path)?,
        None => Config::default(),
    };
    let tls = match (args.tls_cert, args.tls_key) {
        (Some(cert), Some(key)) => tls::TlsSource::Files { cert, key },
        _ => tls::TlsSource::SelfSigned {
            write_ca: args.write_ca,
        },
    };
    let metrics = Arc::new(Metrics::new());
    if args.max_inflight_body_bytes < args.max_body_bytes {
        anyhow::bail!(
            "--max-inflight-body-bytes ({}) must be at least --max-body-bytes ({})",
            args.max_inflight_body_bytes,
            args.max_body_bytes
        );
    }
    let max_connections = args
        .max_connections
        .unwrap_or_else(super::limits::default_max_connections);
    if args.max_requests_per_source == Some(0) {
        anyhow::bail!("--max-requests-per-source must be at least 1");
    }
    let limits = Limits {
        max_body_bytes: args.max_body_bytes,
        max_inflight_body_bytes: args.max_inflight_body_bytes,
        body_timeout: args.body_timeout,
        request_timeout: args.request_timeout,
        max_requests_per_source: args
            .max_requests_per_source
            .unwrap_or((max_connections / 2).max(1)),
    };
    tracing::info!(
        "{}",
        super::limits::RequestMemory::of(max_connections, &limits)
    );
    let given = args.operator_version.given(&config);
    let mut facts = operator_defaults();
    (facts.version, facts.version_source) = if no_cluster_watch {
        assumed_version(NOT_WATCHED)
    } else {
        deployment::operator_version(&config.operator_namespace, Err(&Unread::NotYet))
    };
    apply_given(&mut facts, given.clone());
    let (facts_tx, facts_rx) = tokio::sync::watch::channel(Arc::new(facts));
    let version_rx = facts_rx.clone();
    let fleet = Arc::new(Fleet::default());
    let mut webhook = Webhook::watching(config.policy.clone(), facts_rx, metrics.clone(), limits);
    if !no_cluster_watch {
        webhook.fleet = Some(fleet.clone());
    }
    let options = ServeOptions {
        listen: args.listen,
        admin_listen: args.admin_listen,
        tls,
        reload_interval: args.tls_reload_interval,
        header_timeout: args.header_timeout,
        idle_timeout: args.idle_timeout,
        handshake_timeout: args.handshake_timeout,
        drain_timeout: args.drain_timeout,
        shutdown_delay: args.shutdown_delay,
        write_timeout: args.write_timeout,
        max_connections,
        max_concurrent_streams: args.max_concurrent_streams,
        client_ca: args.client_ca,
        client_ca_allowed_names: args.client_ca_allowed_names,
        max_connection_age: args.max_connection_age,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let readiness = Readiness::new();
        let _version_metric = AbortOnDrop(tokio::spawn(publish_operator_version(
            version_rx,
            metrics.clone(),
        )));
        // Dropped (and so stopped) when serving ends.
        let watch = if no_cluster_watch {
            tracing::info!(
                "cluster watch off: deciding with the GPU Operator's default operand switches"
            );
            tracing::info!("{}", facts_tx.borrow().version_described());
            None
        } else {
            start_cluster_watch(
                &config,
                given,
                report,
                &audit,
                facts_tx,
                fleet,
                metrics.clone(),
                &readiness,
            )
            .await
        };
        let app = webhook::router(Arc::new(webhook));
        let served = server::run_until_signalled(options, app, metrics, readiness).await;
        if let Some(watch) = watch {
            watch.stop().await;
        }
        served
    })
}

/// How the continuous audit is elected and how the lists are paged.
struct AuditOptions {
    lease: Option<LeaseArgs>,
    page_size: u32,
}

struct LeaseArgs {
    name: String,
    namespace: Option<String>,
    identity: Option<String>,
    duration: Duration,
}

impl LeaseArgs {
    fn config(&self, client: &kube::Client) -> LeaseConfig {
        LeaseConfig {
            name: self.name.clone(),
            namespace: self
                .namespace
                .clone()
                .unwrap_or_else(|| client.default_namespace().to_owned()),
            identity: self.identity.clone().unwrap_or_else(default_identity),
            duration: self.duration,
        }
    }
}

/// The host name and process id: unique among replicas outside a pod too.
fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default();
    let host = if host.is_empty() {
        "gpu-deploy-guard".to_owned()
    } else {
        host
    };
    format!("{host}-{}", std::process::id())
}

/// The cluster watch and the audit's election, stopped together.
struct ClusterWatch {
    task: AbortOnDrop<()>,
    election: Election,
}

impl ClusterWatch {
    /// Stops watching; a holder of the audit's Lease hands it over.
    async fn stop(self) {
        drop(self.task);
        self.election.stop(Duration::from_secs(2)).await;
    }
}

/// Keeps `operator_version_info` on the version the decisions follow, whatever changes it.
async fn publish_operator_version(
    mut facts: tokio::sync::watch::Receiver<Arc<ClusterFacts>>,
    metrics: Arc<Metrics>,
) {
    loop {
        {
            let f = facts.borrow_and_update();
            metrics.set_operator_version(
                &f.version.text,
                f.version.era.name(),
                f.version_source.state(),
            );
        }
        if facts.changed().await.is_err() {
            return;
        }
    }
}

/// Starts watching the cluster; `/readyz` waits (bounded) for its first sync. Without any
/// cluster access the webhook still serves, on the operator's defaults, and says so.
#[allow(clippy::too_many_arguments)]
async fn start_cluster_watch(
    config: &Config,
    operator_version: Option<(OperatorVersion, VersionSource)>,
    report: bool,
    audit: &AuditOptions,
    facts_tx: tokio::sync::watch::Sender<Arc<ClusterFacts>>,
    fleet: Arc<Fleet>,
    metrics: Arc<Metrics>,
    readiness: &Readiness,
) -> Option<ClusterWatch> {
    let client = match kube::Client::try_default().await {
        Ok(client) => client,
        Err(error) => {
            tracing::warn!(%error, "cannot reach the cluster: deciding with the GPU Operator's default operand switches");
            let mut facts = operator_defaults();
            facts.source = PolicySource::NoAccess(error.to_string());
            (facts.version, facts.version_source) =
                assumed_version("the cluster cannot be reached");
            apply_given(&mut facts, operator_version);
            let _ = facts_tx.send(Arc::new(facts));
            return None;
        }
    };
    let gate = readiness.gate("cluster-sync");
    let mut watch = WatchConfig::new(config.operator_namespace.clone(), config.policy.clone());
    watch.report = report;
    watch.operator_version = operator_version;
    watch.page_size = audit.page_size;
    watch.lease = audit.lease.as_ref().map(|lease| lease.config(&client));
    let election = elect(&client, &watch);
    let leader = election.leader.clone();
    let task = tokio::spawn(watch_cluster(
        client,
        watch,
        facts_tx,
        metrics,
        fleet,
        leader,
        move || gate.open(),
    ));
    Some(ClusterWatch {
        task: AbortOnDrop(task),
        election,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_parse_with_a_bare_ipv6_pod_ip() {
        let ok = |t: &str| parse_listen(t).unwrap().to_string();
        assert_eq!(ok("0.0.0.0:8080"), "0.0.0.0:8080");
        assert_eq!(ok("10.244.1.7:8080"), "10.244.1.7:8080");
        assert_eq!(ok("[fd00::7]:8080"), "[fd00::7]:8080");
        // `$(POD_IP):8080` in an IPv6 pod.
        assert_eq!(ok("fd00:10:244::7:8080"), "[fd00:10:244::7]:8080");
        assert_eq!(ok("::1:8080"), "[::1]:8080");
        for bad in [
            "",
            "8080",
            "10.244.1.7",
            "10.244.1.7:http",
            "$(POD_IP):8080",
            "fd00::7:99999",
        ] {
            let e = parse_listen(bad).unwrap_err();
            assert!(e.contains("is not an address like"), "{bad}: {e}");
        }
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert!(
            parse_duration("5x")
                .unwrap_err()
                .contains("unknown time unit")
        );
        assert!(parse_duration("1.5h").unwrap_err().contains("ms, s or m"));
        assert!(parse_duration("fast").is_err());
    }
}
