//! `gpu-deploy-guard serve`: its flags, and the process that wires the webhook, the listeners
//! and the cluster watch together.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::ValueEnum;

use super::conn::AbortOnDrop;
use super::lease::Election;
use super::limits::RequestArgs;
use super::readiness::Readiness;
use super::server::{self, ServerArgs};
use super::watch::{elect, watch_cluster};
use super::watch_config::{ClusterArgs, WatchConfig};
use crate::core::config::Config;
use crate::core::facts::{ClusterFacts, PolicySource, operator_defaults};
use crate::core::version::{self, Followed};
use crate::events::{EventMetrics, Events, recorder};
use crate::flags::OperatorVersionArg;
use crate::k8s::deployment::{self, Unread};
use crate::k8s::fleet::SharedFleet;
use crate::k8s::read;
use crate::metrics::Metrics;
use crate::webhook::{self, Webhook};

// Each area's flags are defined beside the code that reads them and flattened here.
// `display_order` keeps `serve --help` listing them in the order they have always had.
#[derive(clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    /// YAML configuration: rule actions, mode, exemptions, operator namespace and version.
    #[arg(long, env = "GDG_CONFIG", display_order = 5)]
    pub config: Option<PathBuf>,
    #[command(flatten, next_display_order = 6)]
    pub operator_version: OperatorVersionArg,
    /// Log format.
    #[arg(long, env = "GDG_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, display_order = 7)]
    pub log_format: LogFormat,
    #[command(flatten)]
    pub requests: RequestArgs,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// The shortest `--event-window`.
const MIN_EVENT_WINDOW: Duration = Duration::from_secs(1);

/// Why the version is assumed with `--no-cluster-watch` and no version given.
const NOT_WATCHED: &str = "no --operator-version given and the cluster is not watched: the newest version the model follows";

#[derive(Copy, Clone, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
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
    let ServeArgs {
        server: options,
        config,
        operator_version,
        log_format: _,
        requests,
        cluster,
    } = args;
    let config = match &config {
        Some(path) => read::config_file(path)?,
        None => Config::default(),
    };
    if !cluster.events.no_events && cluster.events.event_window < MIN_EVENT_WINDOW {
        anyhow::bail!(
            "--event-window {:?} is shorter than 1s: the window is what keeps a node's Events \
             from repeating at every review",
            cluster.events.event_window
        );
    }
    let metrics = Arc::new(Metrics::new());
    let max_connections = options.max_connections();
    let limits = requests.limits(max_connections)?;
    tracing::info!(
        "{}",
        super::limits::RequestMemory::of(max_connections, &limits)
    );
    let given = operator_version.given(&config);
    let mut facts = operator_defaults();
    facts.operator = version::resolve(
        given.clone(),
        if cluster.no_cluster_watch {
            Followed::assumed(NOT_WATCHED)
        } else {
            deployment::operator_version(&config.operator_namespace, Err(&Unread::NotYet))
        },
    );
    let (facts_tx, facts_rx) = tokio::sync::watch::channel(Arc::new(facts));
    let version_rx = facts_rx.clone();
    let fleet = Arc::new(SharedFleet::default());
    let mut webhook = Webhook::watching(config.policy.clone(), facts_rx, metrics.clone(), limits);
    if !cluster.no_cluster_watch {
        webhook.fleet = Some(fleet.clone());
    }
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
        let watch = if cluster.no_cluster_watch {
            tracing::info!(
                "cluster watch off: deciding with the GPU Operator's default operand switches"
            );
            tracing::info!("{}", facts_tx.borrow().operator.describe());
            None
        } else {
            start_cluster_watch(
                &config,
                given,
                &cluster,
                facts_tx,
                fleet,
                metrics.clone(),
                &readiness,
            )
            .await
        };
        if let Some(watch) = &watch {
            webhook.events = watch.events.clone();
        }
        let app = webhook::router(Arc::new(webhook));
        let served = server::run_until_signalled(options, app, metrics, readiness).await;
        if let Some(watch) = watch {
            watch.stop().await;
        }
        served
    })
}

/// The cluster watch, the audit's election and the Events' sender, stopped together.
struct ClusterWatch {
    task: AbortOnDrop<()>,
    election: Election,
    /// The Events the webhook offers its refusals to; `None` with `--no-events`.
    events: Option<Arc<Events>>,
    recorder: Option<AbortOnDrop<()>>,
}

impl ClusterWatch {
    /// Stops watching; a holder of the audit's Lease hands it over.
    async fn stop(self) {
        drop(self.task);
        drop(self.recorder);
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
            metrics.version.set(
                &f.operator.version.text,
                f.operator.era().name(),
                f.operator.source.state(),
            );
        }
        if facts.changed().await.is_err() {
            return;
        }
    }
}

/// Starts watching the cluster; `/readyz` waits (bounded) for its first sync. Without any
/// cluster access the webhook still serves, on the operator's defaults, and says so.
async fn start_cluster_watch(
    config: &Config,
    operator_version: Option<Followed>,
    cluster: &ClusterArgs,
    facts_tx: tokio::sync::watch::Sender<Arc<ClusterFacts>>,
    fleet: Arc<SharedFleet>,
    metrics: Arc<Metrics>,
    readiness: &Readiness,
) -> Option<ClusterWatch> {
    let client = match kube::Client::try_default().await {
        Ok(client) => client,
        Err(error) => {
            tracing::warn!(%error, "cannot reach the cluster: deciding with the GPU Operator's default operand switches");
            let mut facts = operator_defaults();
            facts.source = PolicySource::NoAccess(error.to_string());
            facts.operator = version::resolve(
                operator_version,
                Followed::assumed("the cluster cannot be reached"),
            );
            let _ = facts_tx.send(Arc::new(facts));
            return None;
        }
    };
    let gate = readiness.gate("cluster-sync");
    let mut watch = WatchConfig::new(config.operator_namespace.clone(), config.policy.clone());
    watch.report = cluster.report;
    watch.report_format = cluster.report_format;
    watch.operator_version = operator_version;
    watch.page_size = cluster.list_page_size;
    watch.max_node_series = cluster.max_node_series;
    watch.lease = cluster.lease.config(&client);
    let mut recorder = None;
    if !cluster.events.no_events {
        let event_metrics = metrics.with_registry(EventMetrics::register);
        let (events, queue) = Events::new(cluster.events.event_window, event_metrics);
        let instance = recorder::instance(cluster.lease.audit_lease_identity.as_deref());
        recorder = Some(AbortOnDrop(tokio::spawn(recorder::run(
            client.clone(),
            queue,
            events.clone(),
            instance,
        ))));
        watch.events = Some(events);
    }
    let events = watch.events.clone();
    let election = elect(&client, &watch);
    let leadership = election.leadership();
    let task = tokio::spawn(watch_cluster(
        client,
        watch,
        facts_tx,
        metrics,
        fleet,
        leadership,
        move || gate.open(),
    ));
    Some(ClusterWatch {
        task: AbortOnDrop(task),
        election,
        events,
        recorder,
    })
}
