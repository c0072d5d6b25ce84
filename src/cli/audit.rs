//! `gpu-deploy-guard audit`: its flags and the shell that reads, audits and prints.
//!
//! Exit codes: 0 clean, 1 an operand missing or a broken pairing, 2 bad input
//! (an unreadable or malformed file, an unknown node, no cluster to reach).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::audit::apply::apply_report;
use crate::audit::report::{self, Timestamp};
use crate::audit::{AuditReport, audit, output};
use crate::core::config::{Config, ConfigError};
use crate::core::facts::{PolicySource, operator_defaults};
use crate::core::version;
use crate::core::version::Followed;
use crate::flags::{NOT_GIVEN, OperatorVersionArg};
use crate::k8s::api::{self as cluster, ClusterError, Fence};
use crate::k8s::cluster_policy::ClusterPolicyError;
use crate::k8s::daemonset::learn_daemonsets;
use crate::k8s::list::{self as files, FileError};
use crate::k8s::read;

#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// `<node> OK` or `<node> MISSING <operand>`, then `<node> device-plugin-without-toolkit`.
    #[default]
    Lines,
    /// `<node> driver=yes toolkit=yes ...` per node, then `TOTAL_PODS=<n>`.
    Matrix,
    /// Per node and operand: expected, running, pod, phase; and the findings.
    Json,
    /// A wgpolicyk8s.io/v1alpha2 ClusterPolicyReport, as YAML.
    Report,
}

/// Checks that every operand a node's labels call for runs there, from a cluster or from files.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct AuditArgs {
    /// Audit files instead of a cluster: the JSON of `kubectl get nodes -o json` (`-` reads
    /// standard input).
    #[arg(long, env = "GDG_AUDIT_NODES", value_name = "FILE", requires = "pods")]
    pub nodes: Option<PathBuf>,
    /// With --nodes: the JSON of `kubectl get pods -n gpu-operator -o json`.
    #[arg(long, env = "GDG_AUDIT_PODS", value_name = "FILE", requires = "nodes")]
    pub pods: Option<PathBuf>,
    /// With --nodes: the JSON of `kubectl get daemonsets -n gpu-operator -o json`. Their real
    /// nodeSelectors are used, and an operand without a DaemonSet is expected nowhere.
    #[arg(
        long,
        env = "GDG_AUDIT_DAEMONSETS",
        value_name = "FILE",
        requires = "nodes"
    )]
    pub daemonsets: Option<PathBuf>,
    /// With --nodes: the ClusterPolicy, as `kubectl get clusterpolicy -o yaml` writes it.
    /// Without it the GPU Operator's default operand switches are assumed.
    #[arg(
        long,
        env = "GDG_CLUSTER_POLICY",
        value_name = "FILE",
        requires = "nodes"
    )]
    pub cluster_policy: Option<PathBuf>,
    /// With --nodes: the GPUCluster (GPU Operator v26.7+), as `kubectl get gpucluster -o yaml`
    /// writes it: the nodes are on the DRA stack, or, with --cluster-policy too, the operator
    /// reconciles neither.
    #[arg(long, env = "GDG_GPU_CLUSTER", value_name = "FILE", requires = "nodes")]
    pub gpu_cluster: Option<PathBuf>,
    /// With --nodes: the JSON of `kubectl get resourceslices -o json`. Nodes NVIDIA's GPU DRA
    /// driver (gpu.nvidia.com) publishes slices for are judged for the device plugin beside
    /// it; slices of other drivers are named and not read. Without it that rule is not
    /// evaluated.
    #[arg(
        long,
        env = "GDG_RESOURCE_SLICES",
        value_name = "FILE",
        requires = "nodes"
    )]
    pub resource_slices: Option<PathBuf>,
    /// With --nodes: the JSON of `kubectl get daemonsets -A -o json`. A DaemonSet outside the
    /// operator's namespace that runs the NVIDIA device plugin is judged where it places its
    /// pods. Without it that rule is not evaluated.
    #[arg(
        long,
        env = "GDG_ALL_DAEMONSETS",
        value_name = "FILE",
        requires = "nodes"
    )]
    pub all_daemonsets: Option<PathBuf>,
    /// Output format.
    #[arg(short, long, env = "GDG_AUDIT_OUTPUT", value_enum, default_value_t = Format::Lines)]
    pub output: Format,
    /// Audit only this node.
    #[arg(long, env = "GDG_AUDIT_NODE", value_name = "NAME")]
    pub node: Option<String>,
    /// With --node: print `device-plugin-without-toolkit` (exit 1) when the device plugin runs
    /// there without the container toolkit, else `ok` (exit 0).
    #[arg(long, env = "GDG_AUDIT_ORDER_CHECK", requires = "node")]
    pub order_check: bool,
    /// The webhook's configuration file: rule actions and the operator namespace.
    #[arg(long, env = "GDG_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The GPU Operator's namespace [default: the config's operatorNamespace, else gpu-operator].
    #[arg(
        short = 'n',
        long,
        env = "GDG_OPERATOR_NAMESPACE",
        value_name = "NAMESPACE"
    )]
    pub namespace: Option<String>,
    #[command(flatten)]
    pub operator_version: OperatorVersionArg,
    /// Also write the audit to the cluster as report gpu-deploy-guard (server-side apply;
    /// needs create and patch on clusterpolicyreports.wgpolicyk8s.io, or on
    /// clusterreports.openreports.io with `--report-format openreports`).
    #[arg(long, env = "GDG_AUDIT_REPORT", conflicts_with = "nodes")]
    pub report: bool,
    /// The report's API, for `--report` and `-o report`: wgpolicyk8s (ClusterPolicyReport) or
    /// openreports (ClusterReport).
    #[arg(
        long,
        env = "GDG_REPORT_FORMAT",
        value_enum,
        default_value = "wgpolicyk8s"
    )]
    pub report_format: report::Format,
}

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    File(#[from] FileError),
    #[error(transparent)]
    ClusterPolicy(#[from] ClusterPolicyError),
    #[error(transparent)]
    GpuCluster(#[from] crate::k8s::gpu_cluster::GpuClusterError),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error("node {node} is not among the {count} nodes audited")]
    UnknownNode { node: String, count: usize },
    #[error("--nodes and --pods go together: give both files, or neither to audit the cluster")]
    FilePair,
    #[error("cannot start the runtime for the cluster calls: {0}")]
    Runtime(std::io::Error),
}

/// Runs `audit`: files without a runtime, a cluster on a single-threaded one.
pub fn run(args: AuditArgs) -> ExitCode {
    if args.nodes.is_some() || args.pods.is_some() {
        return finish(audit_files(&args).and_then(|r| render(&args, r)));
    }
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => finish(
            rt.block_on(audit_cluster(&args))
                .and_then(|r| render(&args, r)),
        ),
        Err(e) => finish(Err(AuditError::Runtime(e))),
    }
}

fn load_config(args: &AuditArgs) -> Result<Config, AuditError> {
    Ok(match &args.config {
        Some(path) => read::config_file(path)?,
        None => Config::default(),
    })
}

/// The audit of `--nodes` and `--pods` (and the optional files next to them).
pub fn audit_files(args: &AuditArgs) -> Result<AuditReport, AuditError> {
    let (Some(nodes_path), Some(pods_path)) = (&args.nodes, &args.pods) else {
        return Err(AuditError::FilePair);
    };
    let config = load_config(args)?;
    let (nodes, pods) = files::read_nodes_and_pods(nodes_path, pods_path)?;
    let mut facts = operator_defaults();
    if let Some(path) = &args.cluster_policy {
        let p = read::cluster_policy_file(path)?;
        facts = p.facts;
        facts.source = PolicySource::Found(p.name);
    }
    if let Some(path) = &args.gpu_cluster {
        let gc = crate::k8s::gpu_cluster::file(path)?;
        facts = facts.with_gpu_cluster(
            &gc.name,
            gc.disabled,
            gc.tolerations,
            args.cluster_policy.is_some(),
        );
    }
    if let Some(path) = &args.daemonsets {
        let ds = files::read_daemonsets(path)?;
        learn_daemonsets(&mut facts, &ds);
    }
    if let Some(path) = &args.resource_slices {
        facts.dra_nodes = read_slices(path)?;
    }
    if let Some(path) = &args.all_daemonsets {
        let namespace = args
            .namespace
            .as_ref()
            .unwrap_or(&config.operator_namespace);
        facts.foreign_plugins = read_foreign_plugins(path, namespace)?;
    }
    facts.operator = version::resolve(
        args.operator_version.given(&config),
        Followed::assumed(NOT_GIVEN),
    );
    Ok(audit(&nodes, &pods, &facts, &config.policy))
}

async fn audit_cluster(args: &AuditArgs) -> Result<AuditReport, AuditError> {
    let config = load_config(args)?;
    let namespace = args
        .namespace
        .clone()
        .unwrap_or(config.operator_namespace.clone());
    let client = cluster::connect().await?;
    let mut snap = cluster::snapshot(&client, &namespace).await?;
    if snap.facts.source.is_unavailable() {
        eprintln!("warning: {}", snap.facts.source.describe());
    }
    for note in &snap.notes {
        eprintln!("note: {note}");
    }
    snap.facts.operator =
        version::resolve(args.operator_version.given(&config), snap.facts.operator);
    let result = audit(&snap.nodes, &snap.pods, &snap.facts, &config.policy);
    if args.report {
        let mut built = report::build(&result, now()).in_format(args.report_format);
        apply_report(&client, &mut built, &Fence::Any).await?;
    }
    Ok(result)
}

fn now() -> Timestamp {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Timestamp {
        seconds: i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
        // Whole seconds: the report changes only when its findings do.
        nanos: 0,
    }
}

/// The text to print and the exit code, for an audit already made.
pub fn render(args: &AuditArgs, mut result: AuditReport) -> Result<(String, u8), AuditError> {
    if let Some(name) = &args.node {
        let count = result.nodes.len();
        result.nodes.retain(|n| &n.name == name);
        if result.nodes.is_empty() {
            return Err(AuditError::UnknownNode {
                node: name.clone(),
                count,
            });
        }
        if args.order_check {
            return Ok(output::order_check(&result.nodes[0]));
        }
    }
    let text = match args.output {
        Format::Lines => output::lines(&result),
        Format::Matrix => output::matrix(&result),
        Format::Json => output::json(&result),
        Format::Report => report::build(&result, now())
            .in_format(args.report_format)
            .to_yaml(),
    };
    Ok((text, result.exit_code()))
}

fn finish(outcome: Result<(String, u8), AuditError>) -> ExitCode {
    match outcome {
        Ok((text, code)) => {
            let mut stdout = std::io::stdout().lock();
            // A closed pipe (`| head`) is not worth a panic.
            let _ = stdout.write_all(text.as_bytes());
            let _ = stdout.flush();
            ExitCode::from(code)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// The nodes of a ResourceSlice list file; what it holds that is not read is said on stderr.
pub(crate) fn read_slices(
    path: &std::path::Path,
) -> Result<crate::core::dra::DraNodes, files::FileError> {
    let slices = files::read_resource_slices(path)?;
    let (nodes, notes) = crate::core::dra::read_all(
        slices
            .iter()
            .map(crate::k8s::resource_slice::ResourceSliceView::as_ref),
    );
    for note in notes {
        eprintln!("note: {}: {note}", crate::k8s::read::display(path));
    }
    Ok(nodes)
}

/// The device plugins outside `operator_namespace` of a file of every DaemonSet.
pub(crate) fn read_foreign_plugins(
    path: &std::path::Path,
    operator_namespace: &str,
) -> Result<crate::core::foreign::ForeignPlugins, files::FileError> {
    let all = files::read_all_daemonsets(path)?;
    let plugins = crate::k8s::foreign::foreign_plugins(&all, operator_namespace);
    Ok(crate::core::seen::Seen::Known(std::sync::Arc::new(plugins)))
}
