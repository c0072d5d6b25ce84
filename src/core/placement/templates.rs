//! Each operand's pod template as placement reads it, from the best source there is: the live
//! DaemonSet, else what the GPU Operator renders from the policy for the version it runs.
//!
//! Every operand asset of a ClusterPolicy carries one toleration, `nvidia.com/gpu` `Exists`
//! `NoSchedule` (the vGPU device manager's none before v26.7), and `spec.daemonsets.tolerations`,
//! when not empty, replaces it on every operand (`applyCommonDaemonsetConfig`,
//! gpu-operator@v26.7.0 `controllers/object_controls.go` l.826–827). The GPUCluster's DaemonSets
//! take only `GPUCluster.spec.daemonsets.tolerations`. `docs/gpu-operator.md` §13.

use std::collections::BTreeMap;

use super::{Effect, PodPlacement, Toleration};
use crate::core::era::Era;
use crate::core::operands::{OnGpuCluster, Operand, Stack};

/// The toleration every ClusterPolicy operand's asset carries.
pub const GPU_TAINT_KEY: &str = "nvidia.com/gpu";

/// The operand pod templates placement reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Templates {
    /// `spec.daemonsets.tolerations` of the ClusterPolicy (or, on the DRA stack, of the
    /// GPUCluster) the operator follows; empty when unset.
    pub policy_tolerations: Vec<Toleration>,
    /// The templates of the operand DaemonSets that were listed (the webhook's watch, `check
    /// --daemonsets`): these are what the controller reads, and win.
    pub daemonsets: BTreeMap<Operand, PodPlacement>,
}

impl Templates {
    /// Operand `op`'s template: its live DaemonSet's, else the one the operator renders
    /// (`nvidia_drivers`: NVIDIADriver resources deploy the drivers).
    pub fn of(&self, op: Operand, era: Era, stack: Stack, nvidia_drivers: bool) -> PodPlacement {
        if let Some(live) = self.daemonsets.get(&op) {
            return live.clone();
        }
        PodPlacement::tolerating(self.rendered_tolerations(op, era, stack, nvidia_drivers))
    }

    /// The tolerations the operator gives `op`'s DaemonSet on this stack and version. An
    /// NVIDIADriver's driver DaemonSet tolerates `nvidia.com/gpu` and then its own
    /// `spec.tolerations`, never the ClusterPolicy's.
    fn rendered_tolerations(
        &self,
        op: Operand,
        era: Era,
        stack: Stack,
        nvidia_drivers: bool,
    ) -> Vec<Toleration> {
        let gpu = || vec![Toleration::exists(GPU_TAINT_KEY, Some(Effect::NoSchedule))];
        if op == Operand::Driver && (nvidia_drivers || stack == Stack::GpuCluster) {
            return gpu();
        }
        let dra_stack = stack == Stack::GpuCluster
            && matches!(op.info().on_gpu_cluster, OnGpuCluster::Added(_));
        if dra_stack || !self.policy_tolerations.is_empty() {
            return self.policy_tolerations.clone();
        }
        if op == Operand::VgpuDeviceManager && !era.vgpu_device_manager_tolerates_gpu_taint() {
            return Vec::new();
        }
        gpu()
    }
}
