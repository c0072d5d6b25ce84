//! The pod rules: each judges what actually runs on one node (its operands' pods), which says
//! more than what its labels imply. Each is the function of its row of [`RULES`](super::RULES)
//! (`Check::Pods`); the audit runs them before the label rules, with the history rules, which
//! read the same context ([`PodCtx`]).

use super::{Change, Check, Found, RULES, Rule};
use crate::core::advertised::{Advertised, GFD_COUNT_KEY};
use crate::core::facts::ClusterFacts;
use crate::core::lasting::History;
use crate::core::operands::Operand;
use crate::core::pods::OperandState;

/// Everything a rule on what the audit alone sees reads.
pub struct PodCtx<'r> {
    pub node: &'r str,
    /// Every operand expected on the node or with a pod there.
    pub operands: &'r [OperandState],
    pub facts: &'r ClusterFacts,
    /// How long the node's timed labels have lasted ([`History::NONE`] offline).
    pub history: History<'r>,
    /// What the node's status advertises of NVIDIA GPUs (`None`: no status was read).
    pub advertised: Option<Advertised>,
    /// How many GPUs GPU feature discovery counts there (`nvidia.com/gpu.count`).
    pub gfd_count: Option<u32>,
}

impl PodCtx<'_> {
    /// Runs every pod rule for which `wanted` holds, in table order.
    pub fn run(&self, wanted: impl Fn(Rule) -> bool, out: &mut Vec<Found>) {
        for spec in RULES.iter().filter(|s| wanted(s.rule)) {
            for check in spec.checks {
                if let Check::Pods(check) = check {
                    check(self, out);
                }
            }
        }
    }

    fn operand(&self, op: Operand) -> Option<&OperandState> {
        self.operands.iter().find(|s| s.operand == op)
    }

    fn running(&self, op: Operand) -> bool {
        self.operand(op).is_some_and(|s| s.running)
    }
}

fn found(rule: Rule, message: String) -> Found {
    Found {
        rule,
        change: Change::Existing,
        warning: message.clone(),
        message,
    }
}

/// `device-plugin-without-toolkit` on the pods: the device plugin runs and the operator's
/// container toolkit does not.
pub(super) fn device_plugin_without_toolkit(ctx: &PodCtx<'_>, out: &mut Vec<Found>) {
    if !ctx.running(Operand::DevicePlugin)
        || ctx.running(Operand::ContainerToolkit)
        || !ctx.facts.toolkit_managed
    {
        return;
    }
    let node = ctx.node;
    let plugin = ctx
        .operand(Operand::DevicePlugin)
        .and_then(|s| s.pod.as_deref())
        .unwrap_or_default();
    let toolkit = match ctx.operand(Operand::ContainerToolkit) {
        Some(OperandState {
            pod: Some(pod),
            phase: Some(phase),
            ..
        }) => format!("its container toolkit pod {pod} is {}", phase.as_str()),
        _ => "no container toolkit pod runs there".to_owned(),
    };
    out.push(found(
        Rule::DevicePluginWithoutToolkit,
        format!(
            "node {node} runs the NVIDIA device plugin (pod {plugin}) but {toolkit}, so GPU pods scheduled \
             there fail to start; set {}=true or {}=false.",
            Operand::ContainerToolkit.key(),
            Operand::DevicePlugin.key()
        ),
    ));
}

/// `operand-not-running`: an expected operand has no Running pod on the node.
pub(super) fn operand_not_running(ctx: &PodCtx<'_>, out: &mut Vec<Found>) {
    let parts: Vec<String> = ctx
        .operands
        .iter()
        .filter(|s| s.expected && !s.running)
        .map(|s| {
            let op = s.operand;
            let why = match (&s.pod, s.phase) {
                (Some(pod), Some(phase)) => format!("pod {pod} is {}", phase.as_str()),
                _ => "no pod".to_owned(),
            };
            let selected_by = match ctx.facts.selectors.get(&op) {
                Some(_) => "its DaemonSet's nodeSelector".to_owned(),
                None => format!("{}=true", op.key()),
            };
            format!("{op} ({selected_by}; {why})")
        })
        .collect();
    if parts.is_empty() {
        return;
    }
    out.push(found(
        Rule::OperandNotRunning,
        format!(
            "node {}: expected operands are not running: {}.",
            ctx.node,
            parts.join(", ")
        ),
    ));
}

/// `gpus-not-advertised`: the device plugin runs and the node offers the scheduler no NVIDIA
/// GPU, although the kubelet lists a GPU resource (the plugin registered it once) or GPU feature
/// discovery counts GPUs there. A node whose status was not read, or that nothing says has a
/// GPU, is not judged.
pub(super) fn gpus_not_advertised(ctx: &PodCtx<'_>, out: &mut Vec<Found>) {
    let Some(advertised) = ctx.advertised else {
        return;
    };
    if !ctx.running(Operand::DevicePlugin) || !advertised.none_allocatable() {
        return;
    }
    let counted = ctx.gfd_count.filter(|n| *n > 0);
    let node = ctx.node;
    let plugin = ctx
        .operand(Operand::DevicePlugin)
        .and_then(|s| s.pod.as_deref())
        .unwrap_or_default();
    let (what, why) = if advertised.listed {
        (
            format!(
                "its status advertises 0 allocatable NVIDIA GPUs (capacity {})",
                advertised.capacity
            ),
            "The kubelet sets a GPU resource to 0 when the plugin reports its devices unhealthy \
             or its socket goes away (NVIDIA/k8s-device-plugin#1698), and after a MIG change \
             until the restarted plugin registers again (NVIDIA/gpu-operator#2833)",
        )
    } else if let Some(n) = counted {
        (
            format!(
                "GPU feature discovery counts {n} GPU(s) ({GFD_COUNT_KEY}={n}) and its status \
                 lists no NVIDIA GPU resource"
            ),
            "The plugin never registered its GPUs with the kubelet: it found no device it could \
             open (NVML failing, the driver not loaded, a wrong MIG strategy) and waits",
        )
    } else {
        return;
    };
    let message = format!(
        "node {node} runs the NVIDIA device plugin (pod {plugin}) but {what}, so the scheduler \
         places no GPU pod there while every operand looks healthy. {why}. Read the device plugin \
         pod's log and the node's GPUs (nvidia-smi); deleting the plugin pod makes it register \
         again once the cause is fixed."
    );
    out.push(Found {
        rule: Rule::GpusNotAdvertised,
        change: Change::Existing,
        warning: format!("node {node} runs the device plugin but advertises no allocatable GPU"),
        message,
    });
}
