//! `gpu-deploy-guard check`: the webhook's decision, offline, on Node files.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Serialize;

use std::process::ExitCode;

use clap::ValueEnum;

use crate::core::config::Config;
use crate::core::facts::{ClusterFacts, operator_defaults};
use crate::core::labels::{Change, ChangeError};
use crate::core::operands::{
    DEPLOY_PREFIX, GPU_PRESENT_KEY, Labels, NFD_NVIDIA_PCI_KEYS, Operand, OperandSet,
};
use crate::core::operands::{Stack, Workload};
use crate::core::operator::{LabelAction, Pass, has_nfd_gpu, labelling_pass};
use crate::core::pauses::{Build, Resume, resumes};
use crate::core::placement::Placement;
use crate::core::policy::{self, Decision, Verdict};
use crate::core::review::{Operation, Review};
use crate::core::rules::Finding;
use crate::core::version::{self, Followed};
use crate::flags::{NOT_GIVEN, OperatorVersionArg};
use crate::k8s::daemonset::learn_daemonsets;
use crate::k8s::node::NodeFileError;
use crate::k8s::read;

#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error(transparent)]
    Node(#[from] NodeFileError),
    #[error(transparent)]
    Config(#[from] crate::core::config::ConfigError),
    #[error(transparent)]
    Change(#[from] ChangeError),
    #[error("--operation create judges a new node: it takes no --old-node")]
    CreateWithOldNode,
}

/// Applies kubectl-style changes to a node's labels, as `kubectl label` would; returns a note
/// for each removal of a label that is not there.
pub fn apply_changes(labels: &mut Labels, changes: &[Change]) -> Vec<String> {
    let mut notes = Vec::new();
    for change in changes {
        match change {
            Change::Set(k, v) => {
                labels.insert(k.clone(), v.clone());
            }
            Change::Remove(k) => {
                if labels.remove(k).is_none() {
                    notes.push(format!("label {k:?} is not on the node; nothing to remove"));
                }
            }
        }
    }
    notes
}

/// Everything `check` needs, already parsed from the command line.
#[derive(Clone, Debug, Default)]
pub struct CheckInput {
    pub node: PathBuf,
    pub old_node: Option<PathBuf>,
    pub changes: Vec<String>,
    pub create: bool,
    pub user: Option<String>,
    pub groups: Vec<String>,
    pub config: Option<PathBuf>,
    /// Without a version given by `operator_version` or the config file, `facts.version` stands.
    pub facts: ClusterFacts,
    pub operator_version: OperatorVersionArg,
}

/// The outcome of one check, ready to print.
#[derive(Debug)]
pub struct CheckOutcome {
    pub node: String,
    pub operation: Operation,
    pub verdict: Verdict,
    pub before_labels: Option<Labels>,
    pub after_labels: Labels,
    /// Notes about the input that did not stop the check (a removed label that was not there).
    pub notes: Vec<String>,
    /// What the GPU Operator's next labelling pass does to the labels after the request.
    pub operator: Pass,
    /// The operator version that pass follows, and where it came from.
    pub version: Followed,
    /// The stack that pass follows.
    pub stack: Stack,
    /// The operands the node's labels select that its taints (all of them, condition taints
    /// too: the node as it is now) or a required node affinity stop, after the request.
    pub placement: BTreeMap<Operand, Placement>,
    /// Of those, the ones whose pod the node runs after the request (kept under a taint).
    pub kept: OperandSet,
}

/// The verdict on the input, ready to print.
pub fn evaluate(input: &CheckInput) -> Result<CheckOutcome, CheckError> {
    let config = match &input.config {
        Some(path) => read::config_file(path)?,
        None => Config::default(),
    };
    let mut facts = input.facts.clone();
    facts.operator = version::resolve(input.operator_version.given(&config), facts.operator);
    let facts = &facts;
    let changes = input
        .changes
        .iter()
        .map(|c| Change::parse(c))
        .collect::<Result<Vec<_>, _>>()?;
    if input.create && input.old_node.is_some() {
        return Err(CheckError::CreateWithOldNode);
    }
    let node = read::node_file(&input.node)?;
    let mut notes = Vec::new();
    let old_node = input.old_node.as_deref().map(read::node_file).transpose()?;
    let (before, mut after) = match &old_node {
        Some(old) => (Some(old.labels().clone()), node.labels().clone()),
        None if input.create => (None, node.labels().clone()),
        None => (Some(node.labels().clone()), node.labels().clone()),
    };
    notes.extend(apply_changes(&mut after, &changes));
    let operation = if input.create {
        Operation::Create
    } else {
        Operation::Update
    };
    let review = Review {
        node: node.name(),
        operation,
        old_labels: before.as_ref(),
        labels: &after,
        username: input.user.as_deref().unwrap_or_default(),
        groups: &input.groups,
        dry_run: false,
        unknown_not_copied: 0,
        old_placement: old_node.as_ref().map(|n| &n.placement),
        placement: &node.placement,
    };
    let verdict = policy::decide(&review, facts, &config.policy);
    let operator = labelling_pass(&after, facts.operator.era(), &facts.sandbox, facts.stack);
    let swept = operator
        .actions
        .values()
        .any(|a| matches!(a, LabelAction::Sweep));
    if swept && operator.workload.is_none() && !operator.operands_disabled && !has_nfd_gpu(&after) {
        // The findings judge the node as NFD labels it; the pass below is what the operator
        // does while NFD has not: say so, or the answer would both add a label and sweep it.
        notes.push(format!(
            "no NFD label names an NVIDIA PCI device here ({}=true): the GPU Operator sees no GPU \
             on this node, so its next labelling pass sweeps its deploy labels (below); the \
             findings judge the node as it is once NFD labels it",
            NFD_NVIDIA_PCI_KEYS[0]
        ));
    }
    let now = policy::runs(
        node.name(),
        &after,
        &node.placement,
        Some(verdict.before),
        facts,
    );
    Ok(CheckOutcome {
        placement: now.blocked,
        kept: now.set,
        node: node.name().to_owned(),
        operation,
        verdict,
        before_labels: before,
        after_labels: after,
        notes,
        operator,
        version: facts.operator.clone(),
        stack: facts.stack.in_era(facts.operator.era()),
    })
}

/// `check -o json`'s document ([`CheckOutcome::to_json`]).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Out<'a> {
    node: &'a str,
    operation: Operation,
    allowed: bool,
    decision: Decision,
    message: Option<&'a str>,
    findings: &'a [Finding],
    warnings: &'a [String],
    operands: Operands,
    audit_annotations: BTreeMap<&'static str, String>,
    notes: &'a [String],
    operator: OperatorOut<'a>,
    /// The selected operands a taint or the required node affinity stops, by operand.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    placement: BTreeMap<&'static str, PlacementOut>,
}
/// Where the DaemonSet controller leaves one operand the labels select.
#[derive(Serialize)]
struct PlacementOut {
    state: &'static str,
    /// The taint that stops it (`key=value:Effect`), when a taint does.
    #[serde(skip_serializing_if = "Option::is_none")]
    taint: Option<String>,
}
/// What the operator's next labelling pass does, per deploy label.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct OperatorOut<'a> {
    version: &'a str,
    era: &'static str,
    assumed: Option<&'a str>,
    /// Set when the version is outside the model: what is decided instead.
    #[serde(skip_serializing_if = "Option::is_none")]
    outside_model: Option<String>,
    /// Which custom resource drives the pass: cluster-policy, gpu-cluster (the DRA
    /// stack) or both (then nothing is labelled).
    stack: &'static str,
    workload: Option<&'static str>,
    labels: BTreeMap<&'a str, LabelOut<'a>>,
    /// gpu.present and every deploy label once the pass is done.
    labels_after: BTreeMap<&'a str, &'a str>,
}
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct LabelOut<'a> {
    value: Option<&'a str>,
    action: &'static str,
    after: Option<&'a str>,
    /// The value the end of a pause writes back, for a label a pause holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    resumes_as: Option<&'a str>,
    /// The component that writes it (k8s-driver-manager, mig-manager,
    /// vgpu-device-manager).
    #[serde(skip_serializing_if = "Option::is_none")]
    resumed_by: Option<&'static str>,
}
#[derive(Serialize)]
struct Operands {
    before: BTreeMap<&'static str, bool>,
    after: BTreeMap<&'static str, bool>,
}

impl CheckOutcome {
    /// 0 allowed (with or without warnings), 1 denied.
    pub fn exit_code(&self) -> i32 {
        if self.verdict.allowed() { 0 } else { 1 }
    }

    pub fn to_json(&self) -> String {
        let v = &self.verdict;
        let written = resumes(
            self.before_labels.as_ref().unwrap_or(&self.after_labels),
            Build::of(&self.version.version),
        );
        let out = Out {
            node: &self.node,
            operation: self.operation,
            allowed: v.allowed(),
            decision: v.decision,
            message: v.message.as_deref(),
            findings: &v.findings,
            warnings: &v.warnings,
            operands: Operands {
                before: v.before.to_map(),
                after: v.after.to_map(),
            },
            audit_annotations: v.audit_annotations().into_iter().collect(),
            notes: &self.notes,
            operator: self.operator_out(&written),
            placement: self
                .placement
                .iter()
                .map(|(op, p)| {
                    let out = PlacementOut {
                        state: p.state(self.kept.contains(*op)).as_str(),
                        taint: p.taint().map(ToString::to_string),
                    };
                    (op.name(), out)
                })
                .collect(),
        };
        // Plain data with string keys: serialization cannot fail.
        serde_json::to_string_pretty(&out).unwrap_or_default() + "\n"
    }

    /// The operator's next labelling pass, for [`Self::to_json`]; `written`: the values the
    /// ends of the node's pauses write back.
    fn operator_out<'a>(&'a self, written: &'a [(String, Resume)]) -> OperatorOut<'a> {
        OperatorOut {
            version: &self.version.version.text,
            era: self.version.era().name(),
            assumed: self.version.source.assumed(),
            outside_model: self.version.version.outside_model(),
            stack: self.stack.name(),
            workload: self.operator.workload.map(Workload::name),
            labels: self
                .operator
                .actions
                .iter()
                .map(|(k, a)| {
                    let (resumes_as, resumed_by) =
                        match (written.iter().find(|(key, _)| key == k), a) {
                            (Some((_, r)), _) => (Some(r.value.as_str()), Some(r.by.name())),
                            (None, LabelAction::RestoreFromPaused { to }) => {
                                (Some(to.as_str()), None)
                            }
                            _ => (None, None),
                        };
                    (
                        &k[DEPLOY_PREFIX.len()..],
                        LabelOut {
                            value: self.after_labels.get(k).map(String::as_str),
                            action: a.as_str(),
                            after: self.operator.labels.get(k).map(String::as_str),
                            resumes_as,
                            resumed_by,
                        },
                    )
                })
                .collect(),
            labels_after: self
                .operator
                .labels
                .iter()
                .filter(|(k, _)| k.starts_with(DEPLOY_PREFIX) || *k == GPU_PRESENT_KEY)
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect(),
        }
    }
}

#[derive(clap::Args)]
pub struct CheckArgs {
    /// The Node as `kubectl get node NAME -o json|yaml` prints it (`-` for standard input).
    #[arg(long)]
    pub node: PathBuf,
    /// The Node before the change; then --node is the Node after it.
    #[arg(long)]
    pub old_node: Option<PathBuf>,
    /// Label changes in kubectl syntax, applied to --node: `key=value` sets, `key-` removes.
    #[arg(value_name = "CHANGE")]
    pub changes: Vec<String>,
    /// Judge the request as an update of the node, or as its creation (registration).
    #[arg(long, value_enum, default_value_t = CheckOperation::Update)]
    pub operation: CheckOperation,
    /// The requesting user (matters for exemptions).
    #[arg(long)]
    pub user: Option<String>,
    /// A group of the requesting user; repeat for several.
    #[arg(long = "group")]
    pub groups: Vec<String>,
    /// YAML configuration, as given to `serve`.
    #[arg(long, env = "GDG_CONFIG")]
    pub config: Option<PathBuf>,
    /// The ClusterPolicy (`kubectl get clusterpolicy -o yaml`): its operand switches apply.
    /// Without it, the GPU Operator's defaults are assumed, as `serve` does when it cannot read one.
    #[arg(long, value_name = "FILE")]
    pub cluster_policy: Option<PathBuf>,
    /// The GPUCluster (`kubectl get gpucluster -o yaml`, GPU Operator v26.7+): the nodes are on
    /// the DRA stack, or, with --cluster-policy too, the operator reconciles neither.
    #[arg(long, value_name = "FILE")]
    pub gpu_cluster: Option<PathBuf>,
    /// The operator's DaemonSets (`kubectl get daemonsets -n gpu-operator -o json`): their
    /// real nodeSelectors, tolerations and required node affinity decide where each operand
    /// is placed. Without it, the tolerations the operator renders from --cluster-policy.
    #[arg(long, value_name = "FILE")]
    pub daemonsets: Option<PathBuf>,
    /// The ResourceSlices (`kubectl get resourceslices -o json`): a node NVIDIA's GPU DRA
    /// driver (gpu.nvidia.com) publishes slices for is judged for the device plugin beside it.
    /// Without it that rule is not evaluated.
    #[arg(long, value_name = "FILE")]
    pub resource_slices: Option<PathBuf>,
    /// Every DaemonSet (`kubectl get daemonsets -A -o json`): one outside the operator's
    /// namespace that runs the NVIDIA device plugin is judged where it places its pods.
    /// Without it that rule is not evaluated.
    #[arg(long, value_name = "FILE")]
    pub all_daemonsets: Option<PathBuf>,
    #[command(flatten)]
    pub operator_version: OperatorVersionArg,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

#[derive(Copy, Clone, PartialEq, Eq, ValueEnum)]
pub enum CheckOperation {
    Create,
    Update,
}

#[derive(Copy, Clone, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Text,
    Json,
}

/// Runs `check`: prints the verdict; exit 0 allowed, 1 denied, 2 bad input.
pub fn run(args: CheckArgs) -> ExitCode {
    let facts = match &args.cluster_policy {
        Some(path) => match read::cluster_policy_file(path) {
            Ok(policy) => policy.facts,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        },
        None => operator_defaults(),
    };
    let facts = match &args.gpu_cluster {
        Some(path) => match crate::k8s::gpu_cluster::file(path) {
            Ok(gc) => facts.with_gpu_cluster(
                &gc.name,
                gc.disabled,
                gc.tolerations,
                args.cluster_policy.is_some(),
            ),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        },
        None => facts,
    };
    let mut facts = ClusterFacts {
        operator: Followed::assumed(NOT_GIVEN),
        ..facts
    };
    if let Some(path) = &args.daemonsets {
        match crate::k8s::list::read_daemonsets(path) {
            Ok(ds) => learn_daemonsets(&mut facts, &ds),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        }
    }
    if let Some(path) = &args.resource_slices {
        match super::audit::read_slices(path) {
            Ok(nodes) => facts.dra_nodes = nodes,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        }
    }
    if let Some(path) = &args.all_daemonsets {
        let namespace = match &args.config {
            Some(config) => match read::config_file(config) {
                Ok(c) => c.operator_namespace,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            },
            None => crate::core::policy::DEFAULT_OPERATOR_NAMESPACE.to_owned(),
        };
        match super::audit::read_foreign_plugins(path, &namespace) {
            Ok(plugins) => facts.foreign_plugins = plugins,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        }
    }
    let input = CheckInput {
        node: args.node,
        old_node: args.old_node,
        changes: args.changes,
        create: args.operation == CheckOperation::Create,
        user: args.user,
        groups: args.groups,
        config: args.config,
        facts,
        operator_version: args.operator_version,
    };
    match evaluate(&input) {
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

mod text;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubectl_change_syntax_is_parsed_and_checked() {
        assert_eq!(
            Change::parse("nvidia.com/gpu.deploy.dcgm=false").unwrap(),
            Change::Set("nvidia.com/gpu.deploy.dcgm".into(), "false".into())
        );
        assert_eq!(
            Change::parse("nvidia.com/gpu.deploy.nvsm=").unwrap(),
            Change::Set("nvidia.com/gpu.deploy.nvsm".into(), String::new())
        );
        assert_eq!(
            Change::parse("nvidia.com/gpu.deploy.dcgm-").unwrap(),
            Change::Remove("nvidia.com/gpu.deploy.dcgm".into())
        );
        for (bad, needle) in [
            ("nvidia.com/gpu.deploy.dcgm", "expected key=value"),
            ("nvidia.com/gpu.deploy.dcgm= true", "label value \" true\""),
            ("Bad_Prefix/x=1", "prefix \"Bad_Prefix\""),
            ("nvidia.com/=1", "label name \"\""),
        ] {
            let msg = Change::parse(bad).unwrap_err().to_string();
            assert!(msg.contains(needle), "{bad}: {msg}");
            assert!(msg.starts_with(&format!("change {bad:?}")), "{msg}");
        }
    }

    #[test]
    fn long_values_are_refused_like_the_api_server_does() {
        let long = format!("a={}", "x".repeat(64));
        assert!(Change::parse(&long).is_err());
        let ok = format!("a={}", "x".repeat(63));
        assert!(Change::parse(&ok).is_ok());
    }
}
