//! The cluster's settings that choose which operands a node gets: its workload, the
//! ClusterPolicy's sandbox mode, and which custom resource (stack) drives the operator.

use crate::core::era::Era;

/// The one name a GPUCluster may have (its CRD's validation rule,
/// gpu-operator@v26.7.0 `api/nvidia/v1alpha1/gpucluster_types.go`).
pub const GPU_CLUSTER_NAME: &str = "gpu-cluster";

/// Which of the operator's custom resources drives the node labelling and the operands.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum Stack {
    /// A ClusterPolicy (or none known): the device-plugin stack.
    #[default]
    ClusterPolicy,
    /// A GPUCluster and no ClusterPolicy (v26.7 and later): the DRA stack, whose nodes get the
    /// DRA operands' deploy labels and lose the device-plugin stack's.
    GpuCluster,
    /// Both exist: the v26.7 operator refuses to reconcile either (each controller errors out,
    /// the node-labelling reconcile labels nothing), so labels and DaemonSets stay as they are.
    Both,
}

impl Stack {
    /// The stack the operator of this era follows: before v26.7 there is no GPUCluster.
    pub fn in_era(self, era: Era) -> Stack {
        if era.has_gpu_cluster() {
            self
        } else {
            Stack::ClusterPolicy
        }
    }

    /// As `check -o json` and the audit's JSON spell it.
    pub fn name(self) -> &'static str {
        match self {
            Stack::ClusterPolicy => "cluster-policy",
            Stack::GpuCluster => "gpu-cluster",
            Stack::Both => "both",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Stack::ClusterPolicy => "ClusterPolicy (device-plugin) stack",
            Stack::GpuCluster => "GPUCluster (DRA) stack",
            Stack::Both => {
                "a ClusterPolicy and a GPUCluster both exist: the operator reconciles neither and labels no node"
            }
        }
    }
}

/// `nvidia.com/gpu.workload.config`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Workload {
    Container,
    VmPassthrough,
    VmVgpu,
}

impl Workload {
    pub const ALL: [Workload; 3] = [
        Workload::Container,
        Workload::VmPassthrough,
        Workload::VmVgpu,
    ];

    pub fn parse(v: &str) -> Option<Workload> {
        match v {
            "container" => Some(Workload::Container),
            "vm-passthrough" => Some(Workload::VmPassthrough),
            "vm-vgpu" => Some(Workload::VmVgpu),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Workload::Container => "container",
            Workload::VmPassthrough => "vm-passthrough",
            Workload::VmVgpu => "vm-vgpu",
        }
    }
}

/// `spec.sandboxWorkloads.mode` (v26.3 and later; CRD default kubevirt).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum SandboxMode {
    #[default]
    KubeVirt,
    Kata,
}

impl SandboxMode {
    pub const ALL: [SandboxMode; 2] = [SandboxMode::KubeVirt, SandboxMode::Kata];

    /// As the ClusterPolicy spells it.
    pub fn name(self) -> &'static str {
        match self {
            SandboxMode::KubeVirt => "kubevirt",
            SandboxMode::Kata => "kata",
        }
    }

    /// The mode the operator of this era follows: before v26.3 there is no mode, and
    /// vm-passthrough nodes get what `kubevirt` gives them later.
    pub const fn in_era(self, era: Era) -> SandboxMode {
        if era.has_sandbox_mode() {
            self
        } else {
            SandboxMode::KubeVirt
        }
    }
}
