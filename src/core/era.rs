//! What the model knows about GPU Operator versions, in one place: the releases it follows, the
//! eras they fall in ([`Era`]), and, as named predicates, every behaviour that changes from one
//! release to the next. Code elsewhere asks a predicate (`era.has_gpu_cluster()`), never
//! compares eras or release numbers itself, so a new operator version is a new era or release
//! here, its predicates, and a row's `since`/`until` in the operand table
//! (`docs/gpu-operator.md`, the eras).

use std::fmt;

/// A span of operator versions whose labelling code is the same.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Era {
    /// v22.9.x – v23.3.x: no kata manager nor confidential-computing manager.
    V23_3,
    /// v23.6.x – v25.10.x (named for v24.9, the first release the model was made from).
    V24_9,
    /// v26.3.x: sandbox mode, kata sandbox device plugin.
    V26_3,
    /// v26.7.x and later: `client`, empty values reset, DRA keys, non-GPU nodes swept.
    V26_7,
}

/// A release's major and minor number (`v25.3.4` is `(25, 3)`).
pub type Release = (u32, u32);

/// The first release of each era, oldest first (`docs/gpu-operator.md`, the eras).
const ERA_STARTS: [(Release, Era); 4] = [
    ((22, 9), Era::V23_3),
    ((23, 6), Era::V24_9),
    ((26, 3), Era::V26_3),
    ((26, 7), Era::V26_7),
];
/// The newest release the model was checked against.
const NEWEST_MODELLED: Release = (26, 7);

impl Era {
    pub const NEWEST: Era = Era::V26_7;
    /// Every era, oldest first.
    pub const ALL: [Era; 4] = [Era::V23_3, Era::V24_9, Era::V26_3, Era::V26_7];

    pub fn name(self) -> &'static str {
        match self {
            Era::V23_3 => "v23.3",
            Era::V24_9 => "v24.9",
            Era::V26_3 => "v26.3",
            Era::V26_7 => "v26.7",
        }
    }

    /// The era of a release; a release older than every modelled one is the oldest era's, a
    /// newer one the newest era's.
    pub fn of(release: Release) -> Era {
        let (_, oldest) = ERA_STARTS[0];
        ERA_STARTS
            .iter()
            .rev()
            .find(|(start, _)| release >= *start)
            .map_or(oldest, |(_, era)| *era)
    }

    /// This era is `era` or a later one (`const`, for the operand table's model).
    pub const fn reaches(self, era: Era) -> bool {
        self as u8 >= era as u8
    }

    /// `spec.sandboxWorkloads.mode` exists (v26.3+): an operand may need a mode, and a
    /// vm-passthrough node in `kata` mode gets the kata sandbox device plugin.
    pub const fn has_sandbox_mode(self) -> bool {
        self.reaches(Era::V26_3)
    }

    /// `cdi.nriPluginEnabled` false -> true makes the operator delete the `nvidia`
    /// RuntimeClasses (v26.3+, `docs/gpu-operator.md` §11.6).
    pub fn nri_plugin_deletes_runtime_classes(self) -> bool {
        self.reaches(Era::V26_3)
    }

    /// With `driver.useNvidiaDriverCRD` off, the NVIDIADriver resources are set `disabled`,
    /// deploy nothing and keep the DaemonSets they have (v26.3+); before, the operator
    /// reconciles them whatever the flag says, so one created with the flag off runs beside the
    /// ClusterPolicy's driver DaemonSet (`docs/gpu-operator.md` §11.3).
    pub fn disables_nvidia_drivers_when_crd_off(self) -> bool {
        self.reaches(Era::V26_3)
    }

    /// Without a ClusterPolicy the NVIDIADriver reconcile fails ("no ClusterPolicy object found
    /// in the cluster") and deploys nothing (before v26.7; v26.7 reconciles it with the host
    /// root `/`, `docs/gpu-operator.md` §11.3).
    pub fn nvidia_drivers_need_cluster_policy(self) -> bool {
        !self.reaches(Era::V26_7)
    }

    /// An NVIDIADriver pool its new selector drops keeps its DaemonSet running (before v26.3,
    /// `docs/gpu-operator.md` §11.4).
    pub fn keeps_dropped_driver_pools(self) -> bool {
        !self.reaches(Era::V26_3)
    }

    /// The GPUCluster (DRA) stack exists (v26.7+): a GPUCluster drives the nodes, and with a
    /// ClusterPolicy as well the operator reconciles neither (`docs/gpu-operator.md` §12).
    pub fn has_gpu_cluster(self) -> bool {
        self.reaches(Era::V26_7)
    }

    /// The node-labelling controller strips the operator's labels from every node without
    /// `gpu.present=true` (v26.7+); before, a node that never was a GPU node is left alone.
    pub fn sweeps_non_gpu_nodes(self) -> bool {
        self.reaches(Era::V26_7)
    }

    /// An empty deploy label in the node's set is set to `true` like an absent one (v26.7+);
    /// before, it stays empty.
    pub fn resets_empty_values(self) -> bool {
        self.reaches(Era::V26_7)
    }

    /// Turning `driver.useNvidiaDriverCRD` on leaves the ClusterPolicy's driver pods running,
    /// orphaned, until the NVIDIADriver upgrade replaces them (v26.7+).
    pub fn orphans_policy_driver_on_handover(self) -> bool {
        self.reaches(Era::V26_7)
    }

    /// A default NVIDIADriver takes the nodes no other one claims, so sharing a node with a
    /// non-default one is no conflict (v26.7+, `AssignOwners`).
    pub fn default_nvidia_driver_takes_the_rest(self) -> bool {
        self.reaches(Era::V26_7)
    }

    /// The vGPU device manager's init container waits only for `vgpu-manager-ready`, which
    /// no host-installed vGPU manager ends (before v26.7, `docs/gpu-operator.md` §7).
    pub fn vgpu_device_manager_needs_operator_vgpu_manager(self) -> bool {
        !self.reaches(Era::V26_7)
    }

    /// The vGPU device manager's asset tolerates `nvidia.com/gpu` like every other operand's
    /// (v26.7+); before, it carries no toleration (`docs/gpu-operator.md` §13).
    pub fn vgpu_device_manager_tolerates_gpu_taint(self) -> bool {
        self.reaches(Era::V26_7)
    }
}

/// A version the model does not follow, on which side.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Outside {
    /// Before the oldest modelled release.
    Older,
    /// After the newest modelled release.
    Newer,
}

/// An operator version (the one a decision follows, with where it came from, is
/// [`Followed`](crate::core::version::Followed)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperatorVersion {
    pub era: Era,
    /// As given or read (`v25.3.4`), or the era's name when assumed.
    pub text: String,
    /// Older or newer than every version the model follows: decided as its nearest era.
    pub outside: Option<Outside>,
    /// Its major and minor number (the newest modelled release when assumed).
    pub release: Release,
}

impl OperatorVersion {
    /// The newest modelled version, for when nothing says which one runs.
    pub fn newest() -> OperatorVersion {
        OperatorVersion {
            era: Era::NEWEST,
            text: Era::NEWEST.name().to_owned(),
            outside: None,
            release: NEWEST_MODELLED,
        }
    }

    /// Reads `v25.3.4`, `25.3.4`, `v26.7.0-rc.1`: the major and minor number decide.
    pub fn parse(text: &str) -> Result<OperatorVersion, String> {
        let bad = || format!("{text:?} is not a GPU Operator version like v25.3.4");
        let t = text.trim().trim_start_matches('v');
        let mut parts = t.split(['.', '-', '+']);
        let major: u32 = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let minor: u32 = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let release = (major, minor);
        let outside = if release < ERA_STARTS[0].0 {
            Some(Outside::Older)
        } else if release > NEWEST_MODELLED {
            Some(Outside::Newer)
        } else {
            None
        };
        Ok(OperatorVersion {
            era: Era::of(release),
            text: format!("v{}", t),
            outside,
            release,
        })
    }

    /// For a version outside the model, what is decided instead, in words.
    pub fn outside_model(&self) -> Option<String> {
        let (side, bound) = match self.outside? {
            Outside::Older => ("older than", ERA_STARTS[0].0),
            Outside::Newer => ("newer than", NEWEST_MODELLED),
        };
        let which = match self.outside? {
            Outside::Older => "oldest",
            Outside::Newer => "newest",
        };
        Some(format!(
            "outside the model: {side} v{}.{}, its {which} version; decided as {}",
            bound.0,
            bound.1,
            self.era.name()
        ))
    }

    /// Its k8s-driver-manager is the Go build, from v0.9.0 (GPU Operator v25.10 and later);
    /// before, the bash script (`gpu-operator@<tag> deployments/gpu-operator/values.yaml`,
    /// `driver.manager.version`).
    pub fn ships_go_driver_manager(&self) -> bool {
        self.release >= (25, 10)
    }

    /// `spec.cdi.enabled` is on when absent (v25.10 and later); before, off. The only operand
    /// or runtime switch whose default differs between the releases the model follows: the
    /// nil case of `CDIConfigSpec.IsEnabled` and the CRD's `+kubebuilder:default` move together
    /// (gpu-operator@v25.3.4 `api/nvidia/v1/clusterpolicy_types.go` l.2065 false, @v25.10.1
    /// l.2156 true; `docs/gpu-operator.md` §11.8).
    pub fn cdi_on_by_default(&self) -> bool {
        self.release >= (25, 10)
    }

    /// A `vgpu-host-manager` NVIDIADriver's DaemonSets select the vGPU manager's deploy label
    /// (v24.3 and later); before, every driver type's selects the driver's
    /// (gpu-operator@v23.9.2, v24.3.0 `manifests/state-driver/0500_daemonset.yaml`).
    pub fn vgpu_host_manager_selects_vgpu_manager_label(&self) -> bool {
        self.release >= (24, 3)
    }
}

impl fmt::Display for OperatorVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_map_to_eras() {
        for (v, era) in [
            ("v24.9.2", Era::V24_9),
            ("v25.3.4", Era::V24_9),
            ("25.10.1", Era::V24_9),
            ("v26.3.0", Era::V26_3),
            ("v26.7.0", Era::V26_7),
            ("v27.1.0-rc.1", Era::V26_7),
            ("v23.9.1", Era::V24_9),
            ("v23.6.0", Era::V24_9),
            ("v23.3.2", Era::V23_3),
            ("v22.9.0", Era::V23_3),
        ] {
            assert_eq!(OperatorVersion::parse(v).unwrap().era, era, "{v}");
        }
        assert!(OperatorVersion::parse("latest").is_err());
        let a = OperatorVersion::newest();
        assert_eq!((a.era, a.to_string()), (Era::V26_7, "v26.7".to_owned()));
    }
}
