//! `gpu-deploy-guard check-policy`: the webhook's decision on a ClusterPolicy, NVIDIADriver or
//! GPUCluster change, offline: the old and the new object and a node list in, the decision over those
//! nodes out. The kubectl plugin's `policy` command prints the same report for a change
//! against the live cluster.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::ValueEnum;
use serde::Serialize;
use serde_json::Value;

use crate::core::config::Config;
use crate::core::facts::{ClusterFacts, PolicySource, operator_defaults};
use crate::core::nvidia_driver::NvidiaDriver;
use crate::core::policy::{Decision, Policy, Verdict};
use crate::core::policy_change::{PolicyKind, Shift};
use crate::core::review::Operation;
use crate::core::rules::fleet::name_nodes;
use crate::core::version;
use crate::core::version::Followed;
use crate::flags::{NOT_GIVEN, OperatorVersionArg};
use crate::k8s::daemonset::learn_daemonsets;
use crate::k8s::fleet::{LabelFilter, NodeIndex, SharedFleet};
use crate::k8s::node::NodeView;
use crate::k8s::{document, list, nvidia_driver, read};
use crate::policy_decision::{ObjectChange, decide_and_predict};

#[derive(clap::Args)]
pub struct CheckPolicyArgs {
    /// The object after the change: a ClusterPolicy, an NVIDIADriver or a GPUCluster (YAML or
    /// JSON, `-` for standard input). Without it, the change deletes --old.
    #[arg(long, value_name = "FILE")]
    new: Option<PathBuf>,
    /// The object before the change. Without it, the change creates --new.
    #[arg(long, value_name = "FILE")]
    old: Option<PathBuf>,
    /// The nodes the change reaches: `kubectl get nodes -o json` (a NodeList, or one Node).
    #[arg(long, value_name = "FILE")]
    nodes: PathBuf,
    /// The cluster's other NVIDIADriver resources (`kubectl get nvidiadrivers -o json`).
    #[arg(long, value_name = "FILE")]
    nvidia_drivers: Option<PathBuf>,
    /// The operand DaemonSets (`kubectl get daemonsets -n gpu-operator -o json`): their real
    /// nodeSelectors decide where each operand runs, as the webhook reads them from the cluster.
    #[arg(long, value_name = "FILE")]
    daemonsets: Option<PathBuf>,
    /// The cluster's ClusterPolicy, for an NVIDIADriver change (whether it hands the driver to
    /// NVIDIADriver resources). Default: the operator's defaults.
    #[arg(long, value_name = "FILE")]
    cluster_policy: Option<PathBuf>,
    /// The cluster's GPUCluster (GPU Operator v26.7+), for a ClusterPolicy change: one created
    /// beside it is refused.
    #[arg(long, value_name = "FILE")]
    gpu_cluster: Option<PathBuf>,
    /// The webhook's YAML configuration (rules, mode, exemptions); default: the built-in one.
    #[arg(long, env = "GDG_CONFIG")]
    config: Option<PathBuf>,
    #[command(flatten)]
    operator_version: OperatorVersionArg,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Text)]
    output: Format,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Text,
    Json,
}

#[derive(Debug, thiserror::Error)]
pub enum CheckPolicyError {
    #[error("give --new (the object after the change), --old (before it), or both")]
    NoObject,
    #[error("cannot read {path}: {error}")]
    Read { path: String, error: String },
    #[error("{path}: {problem}")]
    Object { path: String, problem: String },
    #[error("--old is a {old} and --new a {new}: both must be the same object")]
    Mismatch { old: String, new: String },
    #[error(transparent)]
    Nodes(#[from] list::FileError),
    #[error(transparent)]
    Config(#[from] crate::core::config::ConfigError),
    #[error(transparent)]
    ClusterPolicy(#[from] crate::k8s::cluster_policy::ClusterPolicyError),
    #[error(transparent)]
    GpuCluster(#[from] crate::k8s::gpu_cluster::GpuClusterError),
    #[error("{0}")]
    Review(String),
}

pub fn run(args: CheckPolicyArgs) -> ExitCode {
    match check(&args) {
        Ok((text, code)) => {
            print!("{text}");
            ExitCode::from(code)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// A JSON or YAML file as a value, and its name for messages.
fn value(path: &Path) -> Result<(String, Value), CheckPolicyError> {
    let shown = read::display(path);
    let text = read::text(path).map_err(|e| CheckPolicyError::Read {
        path: shown.clone(),
        error: e.to_string(),
    })?;
    let value = document::json_or_yaml(&text).map_err(|problem| CheckPolicyError::Object {
        path: shown.clone(),
        problem: format!("neither JSON nor YAML: {problem}"),
    })?;
    Ok((shown, value))
}

fn object(path: &Path) -> Result<(PolicyKind, Value), CheckPolicyError> {
    let (shown, value) = value(path)?;
    let api_version = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let kind = value
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let kind = match (api_version, kind) {
        ("nvidia.com/v1", "ClusterPolicy") => PolicyKind::ClusterPolicy,
        (v, "NVIDIADriver") if v.starts_with("nvidia.com/") => PolicyKind::NvidiaDriver,
        ("nvidia.com/v1alpha1", "GPUCluster") => PolicyKind::GpuCluster,
        _ => {
            return Err(CheckPolicyError::Object {
                path: shown,
                problem: format!(
                    "expected a nvidia.com/v1 ClusterPolicy, a nvidia.com NVIDIADriver or a nvidia.com/v1alpha1 GPUCluster, found {:?} {:?}",
                    api_version, kind
                ),
            });
        }
    };
    Ok((kind, value))
}

fn drivers(path: &Path) -> Result<Vec<NvidiaDriver>, CheckPolicyError> {
    let (shown, value) = value(path)?;
    let items: Vec<Value> = match value.get("items").and_then(Value::as_array) {
        Some(items) => items.clone(),
        None => vec![value],
    };
    items
        .iter()
        .map(|o| {
            nvidia_driver::from_object(o).map_err(|problem| CheckPolicyError::Object {
                path: shown.clone(),
                problem,
            })
        })
        .collect()
}

/// The report and the exit code: 0 allowed, 1 denied.
pub fn check(args: &CheckPolicyArgs) -> Result<(String, u8), CheckPolicyError> {
    let config = match &args.config {
        Some(path) => read::config_file(path)?,
        None => Config::default(),
    };
    let new = args.new.as_deref().map(object).transpose()?;
    let old = args.old.as_deref().map(object).transpose()?;
    let (kind, operation) = match (&old, &new) {
        (None, None) => return Err(CheckPolicyError::NoObject),
        (Some((o, _)), Some((n, _))) if o != n => {
            return Err(CheckPolicyError::Mismatch {
                old: o.as_str().to_owned(),
                new: n.as_str().to_owned(),
            });
        }
        (Some(_), Some((k, _))) => (*k, Operation::Update),
        (None, Some((k, _))) => (*k, Operation::Create),
        (Some((k, _)), None) => (*k, Operation::Delete),
    };
    let mut facts = operator_defaults();
    if let Some(path) = &args.cluster_policy {
        let p = read::cluster_policy_file(path)?;
        facts = ClusterFacts {
            source: PolicySource::Found(p.name),
            ..p.facts
        };
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
    if let Some(path) = &args.nvidia_drivers {
        facts.nvidia_drivers = Some(drivers(path)?);
    }
    if let Some(path) = &args.daemonsets {
        learn_daemonsets(&mut facts, &list::read_daemonsets(path)?);
    }
    facts.operator = version::resolve(
        args.operator_version.given(&config),
        Followed::assumed(NOT_GIVEN),
    );
    let nodes = list::read_nodes(&args.nodes)?;
    let keys: Vec<String> = [&new, &old]
        .into_iter()
        .flatten()
        .flat_map(|(_, v)| node_selector_keys(v))
        .collect();
    let fleet = fleet_of(&nodes, &facts, &keys);
    let name = new
        .as_ref()
        .or(old.as_ref())
        .and_then(|(_, v)| v.pointer("/metadata/name"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let change = ObjectChange {
        kind,
        operation,
        name: &name,
        object: new.as_ref().map(|(_, v)| v),
        old: old.as_ref().map(|(_, v)| v),
        username: "",
        groups: &[],
        dry_run: true,
    };
    report(args.output, &change, &facts, &fleet, &config.policy).map_err(CheckPolicyError::Review)
}

/// The label keys of an object's `spec.nodeSelector` (an NVIDIADriver's).
pub fn node_selector_keys(object: &Value) -> Vec<String> {
    object
        .pointer("/spec/nodeSelector")
        .and_then(Value::as_object)
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

/// The webhook's decision on `change` over `fleet`, and where each operand runs before and
/// after it, as a report; and its exit code. What `check-policy` and the plugin's preview print.
pub fn report(
    format: Format,
    change: &ObjectChange<'_>,
    facts: &ClusterFacts,
    fleet: &SharedFleet,
    policy: &Policy,
) -> Result<(String, u8), String> {
    let (verdict, shifts) =
        decide_and_predict(change, facts, fleet, policy).map_err(|e| e.to_string())?;
    Ok(render(
        format,
        change.kind,
        change.name,
        change.operation,
        &verdict,
        &shifts,
        facts,
    ))
}

/// The node records of `nodes`, as the webhook keeps them once it has read the labels the
/// change's own nodeSelectors name (`selector_keys`), listed.
pub fn fleet_of(nodes: &[NodeView], facts: &ClusterFacts, selector_keys: &[String]) -> SharedFleet {
    let fleet = SharedFleet::default();
    {
        let mut state = fleet.lock();
        state.nodes = NodeIndex::new(LabelFilter::new(facts).with_keys(selector_keys));
        for n in nodes {
            state.nodes.apply(n);
        }
        state.synced = true;
    }
    fleet
}

#[derive(Serialize)]
struct JsonReport<'a> {
    object: String,
    operation: &'static str,
    nodes: Option<usize>,
    decision: Decision,
    message: Option<&'a str>,
    warnings: &'a [String],
    findings: Vec<JsonFinding<'a>>,
    /// Where each operand runs now and after the change.
    operands: Vec<JsonShift<'a>>,
    cluster_facts: &'a str,
}

#[derive(Serialize)]
struct JsonShift<'a> {
    operand: &'static str,
    before: usize,
    after: usize,
    starts: &'a [String],
    stops: &'a [String],
}

#[derive(Serialize)]
struct JsonFinding<'a> {
    rule: &'static str,
    action: &'static str,
    message: &'a str,
}

/// The report of one decision, as text or JSON, and its exit code.
fn render(
    format: Format,
    kind: PolicyKind,
    name: &str,
    operation: Operation,
    verdict: &Verdict,
    shifts: &[Shift],
    facts: &ClusterFacts,
) -> (String, u8) {
    let code = u8::from(!verdict.allowed());
    let nodes = verdict.policy_change.as_ref().and_then(|n| n.nodes);
    let object = format!("{}/{}", kind.as_str(), name);
    if format == Format::Json {
        let report = JsonReport {
            object,
            operation: operation.as_str(),
            nodes,
            decision: verdict.decision,
            message: verdict.message.as_deref(),
            warnings: &verdict.warnings,
            findings: verdict
                .findings
                .iter()
                .map(|f| JsonFinding {
                    rule: f.rule.id(),
                    action: f.action.as_str(),
                    message: &f.message,
                })
                .collect(),
            operands: shifts
                .iter()
                .map(|s| JsonShift {
                    operand: s.operand.name(),
                    before: s.before,
                    after: s.after,
                    starts: &s.starts,
                    stops: &s.stops,
                })
                .collect(),
            cluster_facts: &verdict.cluster_facts,
        };
        let mut text = serde_json::to_string_pretty(&report).unwrap_or_default();
        text.push('\n');
        return (text, code);
    }
    let mut out = String::new();
    let over = nodes.map_or("the policy alone (no nodes)".to_owned(), |n| {
        format!("{n} node{}", if n == 1 { "" } else { "s" })
    });
    let _ = writeln!(
        out,
        "{object} {}: {} (decided over {over})",
        operation.as_str(),
        verdict.decision.as_str()
    );
    for f in &verdict.findings {
        let _ = writeln!(
            out,
            "  {:<5} {}: {}",
            f.action.as_str(),
            f.rule.id(),
            f.message
        );
    }
    if verdict.findings.is_empty() {
        let _ = writeln!(out, "  no finding");
    }
    render_shifts(&mut out, shifts);
    if let Some(why) = facts.operator.source.assumed() {
        let _ = writeln!(
            out,
            "note: GPU Operator {} assumed ({why}); --operator-version says which one runs",
            facts.operator.version.text
        );
    }
    (out, code)
}

/// "what runs where" in text: a line for each operand the change starts or stops somewhere,
/// one line for the rest.
fn render_shifts(out: &mut String, shifts: &[Shift]) {
    if shifts.is_empty() {
        return;
    }
    let _ = writeln!(out, "operands, on how many nodes now -> after the change:");
    let mut same = Vec::new();
    for s in shifts {
        if s.starts.is_empty() && s.stops.is_empty() {
            same.push(format!("{} ({})", s.operand, s.before));
            continue;
        }
        let mut line = format!("  {:<28} {} -> {}", s.operand.name(), s.before, s.after);
        for (verb, nodes) in [("starts on", &s.starts), ("stops on", &s.stops)] {
            if !nodes.is_empty() {
                let (_, names) = name_nodes(nodes.iter().map(String::as_str));
                let _ = write!(line, "; {verb} {names}");
            }
        }
        let _ = writeln!(out, "{line}");
    }
    if !same.is_empty() {
        let _ = writeln!(out, "  unchanged: {}", same.join(", "));
    }
}
