//! An NVIDIADriver resource as the decision reads it (`docs/gpu-operator.md` §11.4): which
//! nodes it claims, and where its driver DaemonSets run under each operator version.

use crate::core::era::OperatorVersion;
use crate::core::operands::{
    GPU_PRESENT_KEY, Labels, NFD_KERNEL_KEY, NFD_OS_KEYS, selector_matches,
};
use crate::core::placement::{Effect, GPU_TAINT_KEY, PodPlacement, Toleration};

/// The node label every `gpu` and `vgpu` driver DaemonSet selects besides its pool.
pub const DRIVER_DEPLOY_KEY: &str = "nvidia.com/gpu.deploy.driver";
/// The node label a `vgpu-host-manager` NVIDIADriver's DaemonSets select instead.
pub const VGPU_MANAGER_DEPLOY_KEY: &str = "nvidia.com/gpu.deploy.vgpu-manager";

/// An NVIDIADriver resource as the decision reads it: which nodes it claims and where its
/// driver DaemonSets run (`docs/gpu-operator.md` §11.4).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NvidiaDriver {
    pub name: String,
    /// `spec.nodeSelector`; absent means `nvidia.com/gpu.present: "true"`, while an empty one
    /// claims every node (`GetNodeSelector`).
    pub node_selector: Option<Labels>,
    /// `spec.driverType` is `vgpu-host-manager`: its DaemonSets select the vGPU manager's
    /// deploy label, not the driver's.
    pub vgpu_host_manager: bool,
    /// `spec.usePrecompiled`: its pools are per OS and kernel.
    pub precompiled: bool,
    /// `spec.default` (v26.7): it serves the GPU nodes no other NVIDIADriver claims.
    pub default: bool,
    /// `spec.tolerations`: its driver DaemonSets tolerate `nvidia.com/gpu:NoSchedule` and
    /// these, never the ClusterPolicy's (`docs/gpu-operator.md` §13).
    pub tolerations: Vec<Toleration>,
}

/// The OS pool a node falls in for an NVIDIADriver: NFD's `system-os_release.ID` and
/// `VERSION_ID`, and with `usePrecompiled` the kernel (`getNodePools`,
/// `internal/state/nodepool.go`): one driver DaemonSet per pool.
pub type PoolKey = (String, String, Option<String>);

impl NvidiaDriver {
    /// The pool of a node with these labels, whether or not this resource selects it; `None`
    /// without the NFD labels a pool needs.
    pub fn pool_key(&self, labels: &Labels) -> Option<PoolKey> {
        let [id, version] = NFD_OS_KEYS.map(|k| labels.get(k).cloned());
        let kernel = if self.precompiled {
            Some(labels.get(NFD_KERNEL_KEY)?.clone())
        } else {
            None
        };
        Some((id?, version?, kernel))
    }

    /// The pool this resource renders a DaemonSet for from a node with these labels: the
    /// operator lists the nodes its selector (over `gpu.present=true`) picks and makes one pool
    /// per OS among them.
    pub fn renders(&self, labels: &Labels) -> Option<PoolKey> {
        let gpu = labels.get(GPU_PRESENT_KEY).is_some_and(|v| v == "true");
        let picked = self
            .node_selector
            .as_ref()
            .is_none_or(|selector| selector_matches(selector, labels));
        (gpu && picked).then(|| self.pool_key(labels)).flatten()
    }

    /// The nodes it claims, as the operator's overlap check reads them.
    pub fn claims(&self, labels: &Labels) -> bool {
        match &self.node_selector {
            Some(selector) => selector_matches(selector, labels),
            None => labels.get(GPU_PRESENT_KEY).is_some_and(|v| v == "true"),
        }
    }

    /// Its driver DaemonSets' pod template as placement reads it: the asset's `nvidia.com/gpu`
    /// toleration, then `spec.tolerations` (gpu-operator@v26.7.0
    /// `manifests/state-driver/0500_daemonset.yaml` l.86–92).
    pub fn template(&self) -> PodPlacement {
        let mut tolerations = vec![Toleration::exists(GPU_TAINT_KEY, Some(Effect::NoSchedule))];
        tolerations.extend(self.tolerations.iter().cloned());
        PodPlacement::tolerating(tolerations)
    }

    /// Whether its driver DaemonSets run on a node with these labels under the operator of
    /// this version: the deploy label, a GPU, its node selector, and the NFD labels that put
    /// the node in a pool. In v23.9 every driver type's DaemonSet selects the driver's deploy
    /// label; from v24.3 a `vgpu-host-manager` one selects the vGPU manager's
    /// (gpu-operator@v23.9.2, v24.3.0 `manifests/state-driver/0500_daemonset.yaml`).
    pub fn selects(&self, labels: &Labels, version: &OperatorVersion) -> bool {
        let pooled = NFD_OS_KEYS.iter().all(|k| labels.contains_key(*k))
            && (!self.precompiled || labels.contains_key(NFD_KERNEL_KEY));
        let key =
            if self.vgpu_host_manager && version.vgpu_host_manager_selects_vgpu_manager_label() {
                VGPU_MANAGER_DEPLOY_KEY
            } else {
                DRIVER_DEPLOY_KEY
            };
        pooled
            && labels.get(key).is_some_and(|v| v == "true")
            && labels.get(GPU_PRESENT_KEY).is_some_and(|v| v == "true")
            && self
                .node_selector
                .as_ref()
                .is_none_or(|selector| selector_matches(selector, labels))
    }
}
