//! The `gpu-deploy-guard` command: parses arguments and calls into the library.
#![forbid(unsafe_code)]

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};

use gpu_deploy_guard::admission::{self, Limits, Webhook};
use gpu_deploy_guard::audit::cli::AuditArgs;
use gpu_deploy_guard::check::{self, CheckInput};
use gpu_deploy_guard::cluster_policy::{facts_from_cluster_policy_file, operator_defaults};
use gpu_deploy_guard::cluster_watch::{WatchConfig, watch_cluster};
use gpu_deploy_guard::config::Config;
use gpu_deploy_guard::metrics::Metrics;
use gpu_deploy_guard::policy::ClusterFacts;
use gpu_deploy_guard::server::{self, Readiness, ServeOptions};
use gpu_deploy_guard::{certs, tls};

/// Keeps NVIDIA GPU Operator deploy labels (nvidia.com/gpu.deploy.*) from breaking a node's GPU stack.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the validating admission webhook (HTTPS) and the admin port (probes, metrics).
    Serve(ServeArgs),
    /// Decide offline what the webhook would answer for a change to a Node.
    Check(CheckArgs),
    /// Write a CA and a serving certificate for the webhook, and print the caBundle.
    Certs(CertsArgs),
    /// Check that every operand a node's labels call for runs there (a cluster or files).
    Audit(AuditArgs),
}

#[derive(clap::Args)]
struct ServeArgs {
    /// HTTPS address of the webhook (POST /validate).
    #[arg(long, env = "GDG_LISTEN", default_value = "0.0.0.0:8443")]
    listen: SocketAddr,
    /// Plain-HTTP address of /livez, /readyz and /metrics.
    #[arg(long, env = "GDG_ADMIN_LISTEN", default_value = "0.0.0.0:8080")]
    admin_listen: SocketAddr,
    /// PEM certificate chain to serve; re-read when the file changes. Without it, a
    /// self-signed certificate for localhost is made in memory (for trying it out only).
    #[arg(long, env = "GDG_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "GDG_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// With the self-signed certificate: write its CA here so a client can trust it.
    #[arg(long, env = "GDG_WRITE_CA", conflicts_with = "tls_cert")]
    write_ca: Option<PathBuf>,
    /// YAML configuration: rule actions, mode, exemptions, operator namespace.
    #[arg(long, env = "GDG_CONFIG")]
    config: Option<PathBuf>,
    /// Log format.
    #[arg(long, env = "GDG_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Largest request body accepted, in bytes (413 above).
    #[arg(long, env = "GDG_MAX_BODY_BYTES", default_value_t = Limits::default().max_body_bytes)]
    max_body_bytes: usize,
    /// Time for a request's head to arrive, from the start of a connection or from the first byte
    /// of a later request on it.
    #[arg(long, env = "GDG_HEADER_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    header_timeout: Duration,
    /// How long an idle HTTP/1.1 keep-alive connection stays open. Keep it above the API server's
    /// 90 s, so the API server closes idle connections first and never sends a review on a
    /// connection being closed.
    #[arg(long, env = "GDG_IDLE_TIMEOUT", default_value = "120s", value_parser = parse_duration)]
    idle_timeout: Duration,
    /// Time for a request's body to arrive.
    #[arg(long, env = "GDG_BODY_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    body_timeout: Duration,
    /// Time for a whole request, body included.
    #[arg(long, env = "GDG_REQUEST_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    request_timeout: Duration,
    /// Time for a TLS handshake.
    #[arg(long, env = "GDG_HANDSHAKE_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    handshake_timeout: Duration,
    /// After SIGTERM, how long in-flight reviews may take to finish.
    #[arg(long, env = "GDG_DRAIN_TIMEOUT", default_value = "20s", value_parser = parse_duration)]
    drain_timeout: Duration,
    /// After SIGTERM, how long to keep serving with /readyz at 503 before draining, so the
    /// endpoint is gone from the Service before the listener closes.
    #[arg(long, env = "GDG_SHUTDOWN_DELAY", default_value = "3s", value_parser = parse_duration)]
    shutdown_delay: Duration,
    /// Do not read the cluster: decide with the GPU Operator's default operand switches and
    /// run no continuous audit. Without this, the ClusterPolicy, the operand DaemonSets, their
    /// pods and the nodes are watched (in-cluster config or KUBECONFIG).
    #[arg(long, env = "GDG_NO_CLUSTER_WATCH")]
    no_cluster_watch: bool,
    /// Write the continuous audit as ClusterPolicyReport `gpu-deploy-guard` (wgpolicyk8s.io/v1alpha2).
    #[arg(long, env = "GDG_REPORT", conflicts_with = "no_cluster_watch")]
    report: bool,
    /// How often the certificate files are checked for rotation.
    #[arg(long, env = "GDG_TLS_RELOAD_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    tls_reload_interval: Duration,
}

#[derive(Copy, Clone, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(clap::Args)]
struct CheckArgs {
    /// The Node as `kubectl get node NAME -o json|yaml` prints it (`-` for standard input).
    #[arg(long)]
    node: PathBuf,
    /// The Node before the change; then --node is the Node after it.
    #[arg(long)]
    old_node: Option<PathBuf>,
    /// Label changes in kubectl syntax, applied to --node: `key=value` sets, `key-` removes.
    #[arg(value_name = "CHANGE")]
    changes: Vec<String>,
    /// Judge the request as an update of the node, or as its creation (registration).
    #[arg(long, value_enum, default_value_t = CheckOperation::Update)]
    operation: CheckOperation,
    /// The requesting user (matters for exemptions).
    #[arg(long)]
    user: Option<String>,
    /// A group of the requesting user; repeat for several.
    #[arg(long = "group")]
    groups: Vec<String>,
    /// YAML configuration, as given to `serve`.
    #[arg(long, env = "GDG_CONFIG")]
    config: Option<PathBuf>,
    /// The ClusterPolicy (`kubectl get clusterpolicy -o yaml`): its operand switches apply.
    /// Without it, the GPU Operator's defaults are assumed, as `serve` does when it cannot read one.
    #[arg(long, value_name = "FILE")]
    cluster_policy: Option<PathBuf>,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Output::Text)]
    output: Output,
}

#[derive(Copy, Clone, PartialEq, Eq, ValueEnum)]
enum CheckOperation {
    Create,
    Update,
}

#[derive(Copy, Clone, PartialEq, Eq, ValueEnum)]
enum Output {
    Text,
    Json,
}

#[derive(clap::Args)]
struct CertsArgs {
    /// Directory to write ca.crt, tls.crt and tls.key into (created when missing).
    #[arg(long)]
    out: PathBuf,
    /// DNS name of the webhook Service, e.g. gpu-deploy-guard.gpu-deploy-guard.svc; repeatable.
    #[arg(long = "dns", num_args = 1..)]
    dns: Vec<String>,
    /// IP address to put in the certificate; repeatable.
    #[arg(long = "ip", num_args = 1..)]
    ips: Vec<IpAddr>,
    /// Days the certificates stay valid.
    #[arg(long, default_value_t = 365)]
    days: u32,
    /// Overwrite existing files.
    #[arg(long)]
    force: bool,
}

/// Parses `500ms`, `5s`, `2m` or a bare number of seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => text.split_at(i),
        None => (text, "s"),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 500ms, 5s or 2m"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        _ => return Err(format!("{text:?}: unknown unit {unit:?} (use ms, s or m)")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => report(serve(args)),
        Command::Check(args) => run_check(args),
        Command::Certs(args) => report(write_certs(args)),
        Command::Audit(args) => gpu_deploy_guard::audit::cli::run(args),
    }
}

/// Exit 0 on success; on failure, the error chain on stderr and exit 2.
fn report(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    init_logs(args.log_format);
    let (no_cluster_watch, report) = (args.no_cluster_watch, args.report);
    let config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    let tls = match (args.tls_cert, args.tls_key) {
        (Some(cert), Some(key)) => tls::TlsSource::Files { cert, key },
        _ => tls::TlsSource::SelfSigned {
            write_ca: args.write_ca,
        },
    };
    let metrics = Arc::new(Metrics::new());
    let limits = Limits {
        max_body_bytes: args.max_body_bytes,
        body_timeout: args.body_timeout,
        request_timeout: args.request_timeout,
    };
    let (facts_tx, facts_rx) = tokio::sync::watch::channel(Arc::new(operator_defaults()));
    let webhook = Webhook {
        policy: config.policy.clone(),
        facts: facts_rx,
        metrics: metrics.clone(),
        limits,
    };
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
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let readiness = Readiness::new();
        // Dropped (and so stopped) when serving ends.
        let _watch = if no_cluster_watch {
            tracing::info!(
                "cluster watch off: deciding with the GPU Operator's default operand switches"
            );
            None
        } else {
            start_cluster_watch(&config, report, facts_tx, metrics.clone(), &readiness).await
        };
        let app = admission::router(Arc::new(webhook));
        server::run(options, app, metrics, readiness, server::shutdown_signal()).await
    })
}

/// Starts watching the cluster; `/readyz` waits (bounded) for its first sync. Without any
/// cluster access the webhook still serves, on the operator's defaults, and says so.
async fn start_cluster_watch(
    config: &Config,
    report: bool,
    facts_tx: tokio::sync::watch::Sender<Arc<ClusterFacts>>,
    metrics: Arc<Metrics>,
    readiness: &Readiness,
) -> Option<AbortOnDrop> {
    let client = match kube::Client::try_default().await {
        Ok(client) => client,
        Err(error) => {
            tracing::warn!(%error, "cannot reach the cluster: deciding with the GPU Operator's default operand switches");
            let mut facts = operator_defaults();
            facts.assumed = Some(format!(
                "no cluster access ({error}): the GPU Operator's default operand switches are assumed"
            ));
            let _ = facts_tx.send(Arc::new(facts));
            return None;
        }
    };
    let gate = readiness.gate("cluster-sync");
    let mut watch = WatchConfig::new(config.operator_namespace.clone(), config.policy.clone());
    watch.report = report;
    let task = tokio::spawn(watch_cluster(client, watch, facts_tx, metrics, move || {
        gate.open()
    }));
    Some(AbortOnDrop(task))
}

/// Stops the cluster watch when serving ends.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn run_check(args: CheckArgs) -> ExitCode {
    let facts = match &args.cluster_policy {
        Some(path) => match facts_from_cluster_policy_file(path) {
            Ok(facts) => facts,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        },
        None => operator_defaults(),
    };
    let input = CheckInput {
        node: args.node,
        old_node: args.old_node,
        changes: args.changes,
        create: args.operation == CheckOperation::Create,
        user: args.user,
        groups: args.groups,
        config: args.config,
        facts,
    };
    match check::run(&input) {
        Ok(outcome) => {
            let text = match args.output {
                Output::Json => outcome.to_json(),
                Output::Text => outcome.to_text(),
            };
            print!("{text}");
            ExitCode::from(outcome.exit_code() as u8)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn write_certs(args: CertsArgs) -> anyhow::Result<()> {
    if args.dns.is_empty() && args.ips.is_empty() {
        anyhow::bail!("give at least one --dns NAME or --ip IP for the certificate");
    }
    let bundle = certs::generate(&args.dns, &args.ips, args.days)?;
    certs::write_dir(&args.out, &bundle, args.force)?;
    eprintln!(
        "wrote {0}/ca.crt, {0}/tls.crt and {0}/tls.key; the caBundle for the webhook configuration:",
        args.out.display()
    );
    println!("{}", certs::ca_bundle_base64(&bundle));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("5h").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("fast").is_err());
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
