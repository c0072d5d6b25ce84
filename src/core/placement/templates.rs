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
use crate::core::operands::{OnGpuCluster, Operand, OperandSet, Stack};

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
    /// The ClusterPolicy's fields that reach the operand pod templates: a change of one rolls
    /// the DaemonSets it reaches.
    pub inputs: TemplateInputs,
}

/// The ClusterPolicy fields that reach operand pod templates (the operator's `Transform*`
/// functions: `docs/gpu-operator.md` §13), each as its path and its value in canonical JSON
/// (keys sorted), sorted by path; an unset field is absent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TemplateInputs {
    /// Those that reach the container toolkit's template alone (`spec.toolkit`'s image,
    /// env, resources…, `spec.cdi`).
    pub toolkit: Vec<(String, String)>,
    /// Those that reach every ClusterPolicy operand's template (`spec.daemonsets`'
    /// tolerations, priority class, labels and annotations; the validator's image, which
    /// every operand's validation init container runs).
    pub every: Vec<(String, String)>,
}

/// What a ClusterPolicy change rolls: the operands whose pod template it changes, and why.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rollout {
    pub operands: OperandSet,
    /// The fields changed, as `path: old -> new` (`unset` for an absent field).
    pub changed: Vec<String>,
}

impl TemplateInputs {
    /// What changing the fields from `self` to `after` rolls.
    pub fn rollout(&self, after: &TemplateInputs) -> Rollout {
        let toolkit = changed_fields(&self.toolkit, &after.toolkit);
        let every = changed_fields(&self.every, &after.every);
        let mut operands = OperandSet::EMPTY;
        if !toolkit.is_empty() {
            operands.insert(Operand::ContainerToolkit);
        }
        if !every.is_empty() {
            operands = Operand::all().collect();
        }
        Rollout {
            operands,
            changed: toolkit.into_iter().chain(every).collect(),
        }
    }
}

/// `path: old -> new` for each path whose value differs (both lists sorted by path).
fn changed_fields(before: &[(String, String)], after: &[(String, String)]) -> Vec<String> {
    let old: BTreeMap<&str, &str> = before.iter().map(|(k, v)| (&**k, &**v)).collect();
    let new: BTreeMap<&str, &str> = after.iter().map(|(k, v)| (&**k, &**v)).collect();
    let paths: std::collections::BTreeSet<&str> = old.keys().chain(new.keys()).copied().collect();
    paths
        .into_iter()
        .filter(|p| old.get(p) != new.get(p))
        .map(|p| {
            let shown = |v: Option<&&str>| v.map_or_else(|| "unset".to_owned(), |v| brief(v));
            format!("{p}: {} -> {}", shown(old.get(p)), shown(new.get(p)))
        })
        .collect()
}

/// A field's JSON as a message shows it: at most 60 characters.
fn brief(json: &str) -> String {
    const SHOWN: usize = 60;
    match json.char_indices().nth(SHOWN) {
        Some((at, _)) => format!("{}…", &json[..at]),
        None => json.to_owned(),
    }
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

    /// Whether the operator renders `op`'s DaemonSet from the ClusterPolicy on this stack (not
    /// an NVIDIADriver's driver, not the GPUCluster's DaemonSets).
    pub fn from_cluster_policy(op: Operand, stack: Stack, nvidia_drivers: bool) -> bool {
        match stack {
            Stack::GpuCluster => false,
            _ => !(op == Operand::Driver && nvidia_drivers),
        }
    }

    /// These templates under another ClusterPolicy's `spec.daemonsets.tolerations`: each live
    /// template the ClusterPolicy renders takes the tolerations the operator renders from the
    /// new list (the live ones were rendered from the old list).
    pub fn with_policy_tolerations(
        &self,
        tolerations: &[Toleration],
        era: Era,
        stack: Stack,
        nvidia_drivers: bool,
    ) -> Templates {
        let mut out = Templates {
            policy_tolerations: tolerations.to_vec(),
            ..self.clone()
        };
        if tolerations == self.policy_tolerations.as_slice() {
            return out;
        }
        let rendered = Templates {
            policy_tolerations: tolerations.to_vec(),
            ..Templates::default()
        };
        for (op, template) in &mut out.daemonsets {
            if Templates::from_cluster_policy(*op, stack, nvidia_drivers) {
                template.tolerations =
                    rendered.rendered_tolerations(*op, era, stack, nvidia_drivers);
            }
        }
        out
    }

    /// What a ClusterPolicy change from these templates to `after`'s rolls: its template
    /// fields ([`TemplateInputs::rollout`]), and a changed `spec.daemonsets.tolerations`, which
    /// reaches every operand's template, however it was read.
    pub fn rollout(&self, after: &Templates) -> Rollout {
        const FIELD: &str = "spec.daemonsets.tolerations";
        let mut rollout = self.inputs.rollout(&after.inputs);
        if self.policy_tolerations != after.policy_tolerations {
            rollout.operands = Operand::all().collect();
            if !rollout.changed.iter().any(|c| c.starts_with(FIELD)) {
                rollout.changed.push(FIELD.to_owned());
            }
        }
        rollout
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
