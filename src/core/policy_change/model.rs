//! What a GPU-policy decision is made of: the request ([`PolicyReview`], [`PolicyChange`]),
//! the fleet it is made over ([`Fleet`], [`NodeGroup`]) and what runs on each group of nodes
//! before and after it ([`Outcome`]). Types only: the fleet rules (`core/rules/fleet.rs`) read
//! them, the decision (`core/policy_change.rs`) makes them.

use crate::core::facts::ClusterFacts;
use crate::core::nvidia_driver::NvidiaDriver;
use crate::core::operands::{Labels, OperandSet};
use crate::core::placement::NodePlacement;
use crate::core::review::Operation;

/// The annotation by which a ClusterPolicy change says the hosts bring their own container
/// toolkit: set (or changed) in the request that turns `spec.toolkit.enabled` off, it lets the
/// change through and is recorded in the audit annotations.
pub const HOST_TOOLKIT_ANNOTATION: &str = "gpu-deploy-guard.nvidia.com/toolkit-on-hosts";

/// Which kind of GPU-policy object a request changes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum PolicyKind {
    ClusterPolicy,
    NvidiaDriver,
    /// v26.7's DRA stack: judged only for whether it may exist beside a ClusterPolicy.
    GpuCluster,
}

impl PolicyKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::ClusterPolicy => "ClusterPolicy",
            PolicyKind::NvidiaDriver => "NVIDIADriver",
            PolicyKind::GpuCluster => "GPUCluster",
        }
    }
}

/// What the request changes.
#[derive(Clone, Copy, Debug)]
pub enum PolicyChange<'a> {
    ClusterPolicy {
        /// The facts under the old and the new object (for CREATE, `before` is the facts the
        /// cluster has now).
        before: &'a ClusterFacts,
        after: &'a ClusterFacts,
        /// [`HOST_TOOLKIT_ANNOTATION`], when this request sets or changes it.
        host_toolkit: Option<&'a str>,
        /// Other ClusterPolicy objects that exist (the operator follows one and ignores the rest).
        others: &'a [String],
        /// The NVIDIADriver resources, for the hand-over `driver.useNvidiaDriverCRD` makes.
        drivers: &'a [NvidiaDriver],
    },
    NvidiaDriver {
        facts: &'a ClusterFacts,
        /// This resource before (None for CREATE) and after (None for DELETE).
        before: Option<&'a NvidiaDriver>,
        after: Option<&'a NvidiaDriver>,
        /// Every other NVIDIADriver resource.
        others: &'a [NvidiaDriver],
    },
    GpuCluster {
        /// The facts the cluster has now, and those once the GPUCluster is as the request
        /// leaves it (for DELETE, the same).
        facts: &'a ClusterFacts,
        after: &'a ClusterFacts,
        /// The ClusterPolicy that exists, when one does.
        cluster_policy: Option<&'a str>,
    },
}

/// One request to judge.
#[derive(Clone, Copy, Debug)]
pub struct PolicyReview<'a> {
    pub kind: PolicyKind,
    pub name: &'a str,
    pub operation: Operation,
    pub username: &'a str,
    pub groups: &'a [String],
    pub dry_run: bool,
    pub change: PolicyChange<'a>,
}

/// Nodes with identical decision-relevant labels and taints.
#[derive(Clone, Debug)]
pub struct NodeGroup<'a> {
    pub labels: Labels,
    /// Their taints and cordon (a decision reads what lasts: [`NodePlacement::lasting`]).
    pub placement: NodePlacement,
    /// Sorted.
    pub nodes: Vec<&'a str>,
}

/// The fleet the decision is made over.
#[derive(Clone, Copy)]
pub enum Fleet<'a> {
    /// The nodes, grouped; `keeps` says which label keys the groups hold (the records keep
    /// only what decisions read, so a selector may name a key they lack).
    Known {
        groups: &'a [NodeGroup<'a>],
        keeps: &'a dyn Fn(&str) -> bool,
    },
    /// The nodes are not read (yet): the decision falls back to the policy alone, and says why.
    Unknown(&'a str),
}

/// What runs on one group of nodes, before and after the change.
///
/// Before is what runs now: the nodes' labels under the old facts. After is what runs once the
/// change is applied: the same labels under the new facts, relabelled by the operator's pass
/// when the change alters the pass itself (`sandboxWorkloads`). What the pass would change
/// anyway is not the request's doing, and is left out.
pub struct Outcome<'g, 'a> {
    pub(crate) group: &'g NodeGroup<'a>,
    pub(crate) before_labels: Labels,
    pub(crate) after_labels: Labels,
    pub(crate) before: OperandSet,
    pub(crate) after: OperandSet,
    /// The operands after the pass under the old and the new sandbox settings (equal when the
    /// change leaves them alone): what a `sandboxWorkloads` change swaps.
    pub(crate) relabel_before: OperandSet,
    pub(crate) relabel_after: OperandSet,
    pub(crate) driver_before: bool,
    pub(crate) driver_after: bool,
}

impl<'g, 'a> Outcome<'g, 'a> {
    /// A change that leaves the group's labels and operands as they are; only where a driver
    /// DaemonSet runs may differ.
    pub(crate) fn labels_kept(
        group: &'g NodeGroup<'a>,
        ops: OperandSet,
        driver_before: bool,
        driver_after: bool,
    ) -> Self {
        Outcome {
            group,
            driver_before,
            driver_after,
            before_labels: group.labels.clone(),
            after_labels: group.labels.clone(),
            before: ops,
            after: ops,
            relabel_before: ops,
            relabel_after: ops,
        }
    }
}
