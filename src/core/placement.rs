//! Where the DaemonSet controller puts an operand's pod, beyond the deploy label: the node's
//! taints against the pod's tolerations, and the pod template's required node affinity.
//!
//! The controller (kubernetes v1.34 `pkg/controller/daemon/daemon_controller.go`,
//! `NodeShouldRunDaemonPod` and `predicates`) answers two questions per node: should a pod run
//! here (`shouldRun`: create one when there is none) and may a running one stay
//! (`shouldContinueRunning`). The node selector, the required node affinity and the template's
//! `nodeName` decide both; then an untolerated `NoSchedule` or `NoExecute` taint makes
//! `shouldRun` false, and only an untolerated `NoExecute` makes `shouldContinueRunning` false
//! too. `PreferNoSchedule` changes nothing. The tolerations read are the template's plus those
//! the controller adds to every daemon pod ([`added_tolerates`]), so a cordoned node
//! (`spec.unschedulable`, tainted `node.kubernetes.io/unschedulable:NoSchedule`) keeps and gets
//! its daemon pods. Sources, line by line: `docs/gpu-operator.md` §13.

mod affinity;
mod templates;
mod toleration;

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use crate::core::operands::{Operand, OperandSet};

pub use affinity::{NodeAffinity, Requirement, SelectorOperator, Term};
pub use templates::{GPU_TAINT_KEY, Rollout, TemplateInputs, Templates};
pub use toleration::{TolerationError, TolerationOperator, added_tolerates};

/// A taint's effect (`spec.taints[].effect`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Effect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

impl Effect {
    pub const ALL: [Effect; 3] = [
        Effect::NoSchedule,
        Effect::PreferNoSchedule,
        Effect::NoExecute,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Effect::NoSchedule => "NoSchedule",
            Effect::PreferNoSchedule => "PreferNoSchedule",
            Effect::NoExecute => "NoExecute",
        }
    }

    /// The effect named `text` exactly as the API spells it; the API server refuses any other
    /// (`validateTaintEffect`), so a file carrying one gets an error that lists the three.
    pub fn parse(text: &str) -> Result<Effect, String> {
        Effect::ALL
            .into_iter()
            .find(|e| e.as_str() == text)
            .ok_or_else(|| {
                format!(
                    "unknown taint effect {text:?}: the API server accepts NoSchedule, PreferNoSchedule and NoExecute"
                )
            })
    }

    /// The controller and the scheduler read these two; `PreferNoSchedule` only scores.
    pub fn keeps_pods_off(self) -> bool {
        matches!(self, Effect::NoSchedule | Effect::NoExecute)
    }
}

impl fmt::Display for Effect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// More taints than this on one node is no node a cluster runs: the webhook refuses such a
/// request rather than walk it, and a node record keeps no more.
pub const MAX_TAINTS: usize = 1_024;

/// One taint of a node.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Taint {
    pub key: String,
    /// Empty when the taint has none.
    pub value: String,
    pub effect: Effect,
}

impl Taint {
    /// A taint from its three fields as the API writes them (absent and empty alike), with the
    /// API server's own checks: a key, and one of the three effects.
    pub fn parse(key: &str, value: &str, effect: &str) -> Result<Taint, String> {
        if key.is_empty() {
            return Err("a taint needs a key".to_owned());
        }
        Ok(Taint::new(key, value, Effect::parse(effect)?))
    }

    pub fn new(key: &str, value: &str, effect: Effect) -> Taint {
        Taint {
            key: key.to_owned(),
            value: value.to_owned(),
            effect,
        }
    }
}

/// As `kubectl taint` writes it: `key=value:Effect`, or `key:Effect` without a value.
impl fmt::Display for Taint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.value.is_empty() {
            write!(f, "{}:{}", self.key, self.effect)
        } else {
            write!(f, "{}={}:{}", self.key, self.value, self.effect)
        }
    }
}

/// The taint the node lifecycle controller gives a cordoned node (`spec.unschedulable`), which
/// the scheduler's NodeUnschedulable filter also reads from the field itself.
pub const UNSCHEDULABLE_KEY: &str = "node.kubernetes.io/unschedulable";

static CORDON: std::sync::LazyLock<Taint> =
    std::sync::LazyLock::new(|| Taint::new(UNSCHEDULABLE_KEY, "", Effect::NoSchedule));

pub use toleration::Toleration;

/// What placement reads of a node besides its labels.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct NodePlacement {
    /// `spec.taints`.
    pub taints: Vec<Taint>,
    /// `spec.unschedulable` (cordoned).
    pub unschedulable: bool,
}

/// Taints that say a node's condition, which their controllers remove once the condition
/// clears: the node lifecycle controller's (`TaintNodesByCondition`, and not-ready/unreachable
/// for `NoExecute` too: kubernetes v1.34 `pkg/controller/nodelifecycle`) and the cloud
/// controller's while a node initialises or is shut down. `node.kubernetes.io/out-of-service`
/// is set by a person and lasts.
const CONDITION_TAINTS: [&str; 9] = [
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
    "node.kubernetes.io/memory-pressure",
    "node.kubernetes.io/disk-pressure",
    "node.kubernetes.io/pid-pressure",
    "node.kubernetes.io/network-unavailable",
    UNSCHEDULABLE_KEY,
    "node.cloudprovider.kubernetes.io/uninitialized",
    "node.cloudprovider.kubernetes.io/shutdown",
];

impl Taint {
    /// A taint a controller sets for a passing condition of the node and removes when it clears.
    pub fn is_condition(&self) -> bool {
        CONDITION_TAINTS.contains(&self.key.as_str())
    }
}

impl NodePlacement {
    /// The node once its conditions clear: without the taints that say a passing condition
    /// ([`Taint::is_condition`]). A request is judged on what lasts: a node that is not ready
    /// now gets the pods its labels select once it is. Borrowed when there is none to drop.
    pub fn lasting(&self) -> std::borrow::Cow<'_, NodePlacement> {
        if !self.taints.iter().any(Taint::is_condition) {
            return std::borrow::Cow::Borrowed(self);
        }
        std::borrow::Cow::Owned(NodePlacement {
            taints: self
                .taints
                .iter()
                .filter(|t| !t.is_condition())
                .cloned()
                .collect(),
            unschedulable: self.unschedulable,
        })
    }

    /// The taints the controller and the scheduler hold a pod against: `spec.taints`, plus
    /// the unschedulable taint of a cordoned node when the lifecycle controller has not written
    /// it yet (the scheduler reads the field directly).
    pub fn effective_taints(&self) -> impl Iterator<Item = &Taint> + '_ {
        let cordon = (self.unschedulable
            && !self.taints.iter().any(|t| t.key == UNSCHEDULABLE_KEY))
        .then_some(&*CORDON);
        self.taints.iter().chain(cordon)
    }

    pub fn is_tainted(&self) -> bool {
        !self.taints.is_empty() || self.unschedulable
    }
}

/// What placement reads of an operand's pod template besides its nodeSelector.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PodPlacement {
    /// `spec.template.spec.tolerations`, without those the controller adds.
    pub tolerations: Vec<Toleration>,
    /// `spec.template.spec.hostNetwork`: the controller then also tolerates
    /// `node.kubernetes.io/network-unavailable`.
    pub host_network: bool,
    /// `spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution`.
    pub affinity: Option<NodeAffinity>,
}

impl PodPlacement {
    /// A template with these tolerations and nothing else.
    pub fn tolerating(tolerations: Vec<Toleration>) -> PodPlacement {
        PodPlacement {
            tolerations,
            ..PodPlacement::default()
        }
    }

    /// The first of the node's taints (in its order) with an effect `counts` that neither the
    /// template nor the controller tolerates.
    fn untolerated(&self, node: &NodePlacement, counts: impl Fn(Effect) -> bool) -> Option<Taint> {
        node.effective_taints()
            .find(|taint| {
                counts(taint.effect)
                    && !added_tolerates(taint, self.host_network)
                    && !self.tolerations.iter().any(|t| t.tolerates(taint))
            })
            .cloned()
    }

    /// The controller's answer for a node the operand's selector picks (`selected`): the
    /// template's required node affinity, then the taints.
    pub fn place(
        &self,
        name: &str,
        labels: &crate::core::operands::Labels,
        selected: bool,
        node: &NodePlacement,
    ) -> Placement {
        let affine = self
            .affinity
            .as_ref()
            .is_none_or(|a| a.matches(name, labels));
        if !selected || !affine {
            return Placement::NotSelected;
        }
        if let Some(taint) = self.untolerated(node, |e| e == Effect::NoExecute) {
            return Placement::Evicted(taint);
        }
        match self.untolerated(node, Effect::keeps_pods_off) {
            Some(taint) => Placement::Kept(taint),
            None => Placement::Placed,
        }
    }
}

/// The DaemonSet controller's answer for one operand on one node.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(tag = "placement", content = "taint", rename_all = "kebab-case")]
pub enum Placement {
    /// Not picked by the selector or the required node affinity: no pod, and a running one is
    /// deleted.
    NotSelected,
    /// Picked and tolerated: the controller creates the pod and re-creates it whenever it goes.
    Placed,
    /// Picked, but this `NoSchedule` taint is not tolerated: a running pod stays
    /// (`shouldContinueRunning`), and once it goes (a rollout, a deletion, an eviction) it is
    /// never created again; no pod is created where none runs.
    Kept(Taint),
    /// Picked, but this `NoExecute` taint is not tolerated: a running pod is evicted and none is
    /// created.
    Evicted(Taint),
}

impl Placement {
    /// A pod of the operand is created here when none runs.
    pub fn creates(&self) -> bool {
        matches!(self, Placement::Placed)
    }

    /// A pod that runs here now keeps running (until something deletes it).
    pub fn keeps_running(&self) -> bool {
        matches!(self, Placement::Placed | Placement::Kept(_))
    }

    /// The taint that keeps the pod off, if one does.
    pub fn taint(&self) -> Option<&Taint> {
        match self {
            Placement::Kept(t) | Placement::Evicted(t) => Some(t),
            Placement::NotSelected | Placement::Placed => None,
        }
    }

    /// The operand's state on a node, given whether its pod runs there now.
    pub fn state(&self, running: bool) -> PlacementState {
        match (self, running) {
            (Placement::NotSelected, _) => PlacementState::NotSelected,
            (Placement::Placed, _) => PlacementState::Placed,
            (Placement::Kept(_), true) => PlacementState::StaysNotRecreated,
            (Placement::Kept(_), false) => PlacementState::NotPlaced,
            (Placement::Evicted(_), _) => PlacementState::Evicted,
        }
    }
}

/// An operand's placement on a node once it is known whether its pod runs: what `check`, the
/// audit and the report show.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PlacementState {
    /// Selected and tolerated: runs, and is re-created when it goes.
    Placed,
    /// Runs under an untolerated `NoSchedule` taint: stays, but is never re-created.
    StaysNotRecreated,
    /// An untolerated `NoExecute` taint: evicted, never created.
    Evicted,
    /// An untolerated `NoSchedule` taint and no pod: never created.
    NotPlaced,
    /// The selector or the required node affinity does not pick the node.
    NotSelected,
}

impl PlacementState {
    pub fn as_str(self) -> &'static str {
        match self {
            PlacementState::Placed => "placed",
            PlacementState::StaysNotRecreated => "stays-not-recreated",
            PlacementState::Evicted => "evicted",
            PlacementState::NotPlaced => "not-placed",
            PlacementState::NotSelected => "not-selected",
        }
    }
}

/// The operands a node runs, and the selected ones its taints stop.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Runs {
    /// Whose pod runs there: placed, or kept running under a `NoSchedule` taint the
    /// template does not tolerate.
    pub set: OperandSet,
    /// Of `set`, those kept running under such a taint: once their pod goes (a rollout, a
    /// deletion) it is never created again.
    pub not_recreated: OperandSet,
    /// The selected operands a taint stops, with the controller's answer (kept or evicted).
    pub blocked: BTreeMap<Operand, Placement>,
}

#[cfg(test)]
mod tests;
