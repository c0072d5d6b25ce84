//! What runs on a node, as the pod rules read it: each operand's pod and its phase.

use serde::{Deserialize, Serialize};

use crate::core::operands::Operand;
use crate::core::placement::PlacementState;

/// `status.phase` of a Pod.
/// Ordered from the most to the least useful, so that the best pod of several sorts first.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum PodPhase {
    Running,
    Pending,
    Succeeded,
    Failed,
    /// `Unknown`, or a phase this program does not know.
    #[default]
    Unknown,
}

impl<'de> Deserialize<'de> for PodPhase {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Phase;
        impl serde::de::Visitor<'_> for Phase {
            type Value = PodPhase;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a pod phase string")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<PodPhase, E> {
                Ok(match v {
                    "Running" => PodPhase::Running,
                    "Pending" => PodPhase::Pending,
                    "Succeeded" => PodPhase::Succeeded,
                    "Failed" => PodPhase::Failed,
                    _ => PodPhase::Unknown,
                })
            }
        }
        d.deserialize_str(Phase)
    }
}

impl PodPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            PodPhase::Running => "Running",
            PodPhase::Pending => "Pending",
            PodPhase::Succeeded => "Succeeded",
            PodPhase::Failed => "Failed",
            PodPhase::Unknown => "Unknown",
        }
    }
}

/// One operand on one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OperandState {
    pub operand: Operand,
    /// Where a taint or the required node affinity stops the DaemonSet controller (kept
    /// running but not re-created, evicted, not placed, not selected); `None` when nothing
    /// does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement: Option<PlacementState>,
    /// The DaemonSet controller should run it here (label, ClusterPolicy, real selector).
    pub expected: bool,
    /// A pod of it is Running here.
    pub running: bool,
    /// Its pod here (a Running one when there is one).
    pub pod: Option<String>,
    pub phase: Option<PodPhase>,
}
