//! The components that pause deploy labels around their work on a node, and what they write
//! back when it ends (`docs/gpu-operator.md` §6).
//!
//! k8s-driver-manager (around a driver install), mig-manager (around a MIG reconfiguration)
//! and vgpu-device-manager (around a vGPU reconfiguration) each read their deploy labels once,
//! before pausing them, and at the end write back what they read, un-paused: whatever a person
//! wrote to those labels in between is overwritten. The labels the guard sees during a pause
//! are the values the pause wrote, so the value each label gets back is known from the label
//! as it was before a request, not from what the request writes. Labels a component does not
//! own are not touched by its end.

use crate::core::era::OperatorVersion;
use crate::core::operands::{DEPLOY_PREFIX, DRIVER_PAUSE, Labels, MIG_PAUSE, Operand, VGPU_PAUSE};

/// How a release's k8s-driver-manager is built: a bash script up to v0.8.1 (GPU Operator up to
/// v25.3), Go from v0.9.0 (v25.10) (`gpu-operator@<tag> deployments/gpu-operator/values.yaml`,
/// `driver.manager.version`). mig-manager and vgpu-device-manager pause and resume alike in
/// both (`docs/gpu-operator.md` §6).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Build {
    /// `driver-manager` (NVIDIA/k8s-driver-manager v0.8.1): it owns ten keys, and its resume
    /// (`_maybe_set_true`: `sed -r "s/paused-for-driver-upgrade//g" | tr -d "_"`) deletes every
    /// underscore of the value.
    Shell,
    /// `cmd/driver-manager/main.go` (v0.9.0 – v0.12.0).
    Go,
}

impl Build {
    /// The build the GPU Operator of this version ships.
    pub fn of(version: &OperatorVersion) -> Build {
        if version.ships_go_driver_manager() {
            Build::Go
        } else {
            Build::Shell
        }
    }
}

/// A component that pauses deploy labels.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Pauser {
    /// `k8s-driver-manager`, the driver DaemonSet's init container.
    DriverManager,
    /// `nvidia-mig-manager` (mig-parted's reconfigure).
    MigManager,
    /// `nvidia-vgpu-device-manager`.
    VgpuDeviceManager,
}

/// Every pauser, in the order their ends are applied (a driver upgrade outlasts the others).
const PAUSERS: [Pauser; 3] = [
    Pauser::VgpuDeviceManager,
    Pauser::MigManager,
    Pauser::DriverManager,
];

impl Pauser {
    pub fn name(self) -> &'static str {
        match self {
            Pauser::DriverManager => "k8s-driver-manager",
            Pauser::MigManager => "mig-manager",
            Pauser::VgpuDeviceManager => "vgpu-device-manager",
        }
    }

    /// When it writes the labels back.
    pub fn when(self) -> &'static str {
        match self {
            Pauser::DriverManager => "when the driver upgrade ends",
            Pauser::MigManager => "when the MIG reconfiguration ends",
            Pauser::VgpuDeviceManager => "when the vGPU reconfiguration ends",
        }
    }

    /// The deploy labels it reads before pausing and writes back at the end, and
    /// whether it writes one only when it had a value. NVIDIA/k8s-driver-manager v0.12.0
    /// `cmd/driver-manager/main.go` (`fetchCurrentLabels`, `rescheduleGPUOperatorComponents`);
    /// NVIDIA/mig-parted v0.15.0 `pkg/mig/reconfigure/reconfigure.go`
    /// (`getCurrentNodeLabels`, `restartKubernetesGPUClients`); NVIDIA/vgpu-device-manager
    /// v0.5.0 `cmd/nvidia-k8s-vgpu-dm/main.go` (`getNodeStateLabels`,
    /// `rescheduleGPUOperands`). Keys an older release does not know are not on its nodes.
    fn keys(self, build: Build) -> &'static [(Operand, bool)] {
        use Operand as O;
        match self {
            // NVIDIA/k8s-driver-manager v0.8.1 `driver-manager` (`_fetch_current_labels`,
            // `_reschedule_gpu_operator_components`): every key written, an absent one as "".
            Pauser::DriverManager if build == Build::Shell => &[
                (O::OperatorValidator, false),
                (O::ContainerToolkit, false),
                (O::DevicePlugin, false),
                (O::GpuFeatureDiscovery, false),
                (O::DcgmExporter, false),
                (O::Dcgm, false),
                (O::Nvsm, false),
                (O::SandboxValidator, false),
                (O::SandboxDevicePlugin, false),
                (O::VgpuDeviceManager, false),
            ],
            Pauser::DriverManager => &[
                (O::OperatorValidator, false),
                (O::ContainerToolkit, false),
                (O::DevicePlugin, false),
                (O::GpuFeatureDiscovery, false),
                (O::DcgmExporter, false),
                (O::Dcgm, false),
                (O::MigManager, true),
                (O::Nvsm, false),
                (O::SandboxValidator, false),
                (O::SandboxDevicePlugin, false),
                (O::VgpuDeviceManager, false),
                (O::Client, true),
                (O::DraDriver, false),
                (O::DraValidator, false),
                (O::DcgmDra, false),
                (O::DcgmExporterDra, false),
            ],
            Pauser::MigManager => &[
                (O::DevicePlugin, false),
                (O::GpuFeatureDiscovery, false),
                (O::DcgmExporter, false),
                (O::Dcgm, false),
                (O::Nvsm, false),
                (O::Client, true),
            ],
            Pauser::VgpuDeviceManager => &[
                (O::SandboxDevicePlugin, false),
                (O::SandboxValidator, false),
            ],
        }
    }

    /// Whether a label's value shows this component's pause.
    fn marks(self, value: &str) -> bool {
        match self {
            Pauser::DriverManager => value.contains(DRIVER_PAUSE),
            Pauser::MigManager => value == MIG_PAUSE,
            Pauser::VgpuDeviceManager => value == VGPU_PAUSE,
        }
    }

    /// The value it writes back for a label its pause left as `value` (`maybeSetTrue` of what
    /// it read, which the pause wrote as `maybeSetPaused`).
    fn resume(self, value: &str, build: Build) -> String {
        match self {
            // `false` stays; the pause marker goes: `paused-for-driver-upgrade` → `true`,
            // `v_paused-for-driver-upgrade` → `v` (the shell deletes every underscore of `v`
            // too); `""` stays `""`.
            Pauser::DriverManager => match value {
                "false" => "false".to_owned(),
                DRIVER_PAUSE => "true".to_owned(),
                _ if build == Build::Shell => value.replace(DRIVER_PAUSE, "").replace('_', ""),
                _ => value.replace(DRIVER_PAUSE, "").trim_matches('_').to_owned(),
            },
            Pauser::MigManager => if value == "false" { "false" } else { "true" }.to_owned(),
            Pauser::VgpuDeviceManager => match value {
                "false" | "" => value.to_owned(),
                _ => "true".to_owned(),
            },
        }
    }
}

/// The component whose pause a label's value shows (`paused-for-driver-upgrade`,
/// `v_paused-for-driver-upgrade`, `paused-for-mig-change`, `paused-for-vgpu-change`).
pub fn paused_by(value: &str) -> Option<Pauser> {
    PAUSERS.into_iter().rev().find(|p| p.marks(value))
}

/// What a refusal says to do about a label paused by `pauser`: wait for (or finish) the work
/// that paused it, never write it `true` by hand (the component writes it back itself, and a
/// `true` written in between starts the operand before that work is done).
pub fn wait_for_pause(pauser: Pauser, key: &str, value: &str) -> String {
    format!(
        "{key}={value:?} is {}'s pause, which it writes back {}: wait for that (or finish what paused the node) \
         instead of setting {key}=true by hand",
        pauser.name(),
        pauser.when()
    )
}

/// What the end of a pause writes to one label, and which component writes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resume {
    pub value: String,
    pub by: Pauser,
}

/// The pauses under way on a node with these labels, and what each writes back to which label
/// (full keys), from the labels as the pauses left them. A label one component owns that is
/// absent was deleted during the pause: what it read is not known, and it is left out.
pub fn resumes(labels: &Labels, build: Build) -> Vec<(String, Resume)> {
    let mut out: Vec<(String, Resume)> = Vec::new();
    for pauser in PAUSERS {
        let active = labels
            .iter()
            .any(|(k, v)| k.starts_with(DEPLOY_PREFIX) && pauser.marks(v));
        if !active {
            continue;
        }
        for (op, only_if_set) in pauser.keys(build) {
            let key = op.key();
            let Some(value) = labels.get(key) else {
                continue;
            };
            if *only_if_set && value.is_empty() {
                continue;
            }
            let resume = Resume {
                value: pauser.resume(value, build),
                by: pauser,
            };
            match out.iter_mut().find(|(k, _)| *k == key) {
                Some((_, r)) => *r = resume,
                None => out.push((key.to_owned(), resume)),
            }
        }
    }
    out
}

/// The labels once every pause has ended: the request's labels (`new`), with each label a
/// pausing component owns set to what it writes back ([`resumes`] of the labels before the
/// request, `old`, or of `new` when there are none), and any other paused value a person wrote
/// restored as its marker says. `None` when nothing is paused, so the labels stay as they are.
pub fn after_pauses(old: Option<&Labels>, new: &Labels, build: Build) -> Option<Labels> {
    let written = resumes(old.unwrap_or(new), build);
    let paused_left = new
        .iter()
        .any(|(k, v)| k.starts_with(DEPLOY_PREFIX) && restored_value(v).is_some());
    if written.is_empty() && !paused_left {
        return None;
    }
    let mut labels = new.clone();
    for (key, resume) in written {
        labels.insert(key, resume.value);
    }
    for (k, v) in labels.iter_mut() {
        if k.starts_with(DEPLOY_PREFIX)
            && let Some(to) = restored_value(v)
        {
            *v = if build == Build::Shell && Pauser::DriverManager.marks(v) {
                Pauser::DriverManager.resume(v, build)
            } else {
                to
            };
        }
    }
    Some(labels)
}

/// The value a paused label gets back when the pause ends, as its markers say; `None` when it
/// is not paused. The one answer to "what does a paused value come back as", for the labelling
/// model ([`LabelAction::RestoreFromPaused`](crate::core::operator::LabelAction)) and for
/// [`after_pauses`]; only the shell k8s-driver-manager differs ([`Pauser::resume`]).
///
/// k8s-driver-manager (`maybeSetTrue`): `paused-for-driver-upgrade` → `true`,
/// `v_paused-for-driver-upgrade` → `v`. mig-parted and vgpu-device-manager: `paused-for-mig-change`
/// and `paused-for-vgpu-change` → `true`.
pub fn restored_value(value: &str) -> Option<String> {
    match value {
        DRIVER_PAUSE | MIG_PAUSE | VGPU_PAUSE => Some("true".to_owned()),
        _ => value
            .strip_suffix(DRIVER_PAUSE)
            .and_then(|v| v.strip_suffix('_'))
            .map(|v| restored_value(v).unwrap_or_else(|| v.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(items: &[&str]) -> Labels {
        items
            .iter()
            .map(|it| {
                let (k, v) = it.split_once('=').unwrap();
                let k = if k.contains('/') {
                    k.to_owned()
                } else {
                    format!("{DEPLOY_PREFIX}{k}")
                };
                (k, v.to_owned())
            })
            .collect()
    }

    fn key(suffix: &str) -> String {
        format!("{DEPLOY_PREFIX}{suffix}")
    }

    #[test]
    fn each_component_writes_back_what_it_read() {
        let cases: [(Pauser, &str, &str); 12] = [
            (Pauser::DriverManager, "paused-for-driver-upgrade", "true"),
            (Pauser::DriverManager, "false", "false"),
            (Pauser::DriverManager, "", ""),
            (
                Pauser::DriverManager,
                "foo_paused-for-driver-upgrade",
                "foo",
            ),
            (
                Pauser::DriverManager,
                "pre-installed_paused-for-driver-upgrade",
                "pre-installed",
            ),
            (Pauser::DriverManager, "true", "true"),
            (Pauser::MigManager, "paused-for-mig-change", "true"),
            (Pauser::MigManager, "false", "false"),
            (Pauser::MigManager, "true", "true"),
            (Pauser::VgpuDeviceManager, "paused-for-vgpu-change", "true"),
            (Pauser::VgpuDeviceManager, "false", "false"),
            (Pauser::VgpuDeviceManager, "", ""),
        ];
        for (pauser, value, back) in cases {
            assert_eq!(
                pauser.resume(value, Build::Go),
                back,
                "{pauser:?} {value:?}"
            );
        }
    }

    /// A toolkit switched off during a driver upgrade: k8s-driver-manager writes back the
    /// `true` it read before pausing.
    #[test]
    fn an_edit_during_a_driver_upgrade_is_overwritten_by_what_the_manager_read() {
        let old = labels(&[
            "container-toolkit=paused-for-driver-upgrade",
            "device-plugin=paused-for-driver-upgrade",
            "dcgm=false",
            "driver=true",
        ]);
        let mut new = old.clone();
        new.insert(key("container-toolkit"), "false".into());
        new.insert(key("dcgm"), "true".into());
        let after = after_pauses(Some(&old), &new, Build::Go).unwrap();
        assert_eq!(after[&key("container-toolkit")], "true");
        assert_eq!(after[&key("device-plugin")], "true");
        // An unpaused label it owns goes back to what it read too.
        assert_eq!(after[&key("dcgm")], "false");
        // The driver's own label is not one it pauses.
        assert_eq!(after[&key("driver")], "true");
        let written = resumes(&old, Build::Go);
        assert!(written.iter().all(|(_, r)| r.by == Pauser::DriverManager));
    }

    /// A device plugin switched off during a MIG change comes back `true`, while the toolkit,
    /// which mig-manager never pauses, stays as the request leaves it.
    #[test]
    fn a_mig_change_brings_back_what_it_paused_and_leaves_the_toolkit() {
        let old = labels(&[
            "container-toolkit=true",
            "device-plugin=paused-for-mig-change",
            "gpu-feature-discovery=paused-for-mig-change",
        ]);
        let mut new = old.clone();
        new.insert(key("container-toolkit"), "false".into());
        new.insert(key("device-plugin"), "false".into());
        let after = after_pauses(Some(&old), &new, Build::Go).unwrap();
        assert_eq!(after[&key("device-plugin")], "true");
        assert_eq!(after[&key("container-toolkit")], "false");
        assert_eq!(after[&key("gpu-feature-discovery")], "true");
    }

    #[test]
    fn nothing_paused_leaves_the_labels_and_a_written_marker_is_restored() {
        let plain = labels(&["dcgm=false", "device-plugin=true"]);
        assert_eq!(after_pauses(Some(&plain), &plain, Build::Go), None);
        let marker = labels(&["example.com/x=paused-for-mig-change"]);
        assert_eq!(after_pauses(None, &marker, Build::Go), None);
        // A person writing a pause marker, with no pause under way.
        let mut new = plain.clone();
        new.insert(key("dcgm"), "paused-for-mig-change".into());
        let after = after_pauses(Some(&plain), &new, Build::Go).unwrap();
        assert_eq!(after[&key("dcgm")], "true");
        // mig-manager and client only when they had a value; a deleted label is unknown.
        let old = labels(&["device-plugin=paused-for-driver-upgrade", "mig-manager="]);
        let r = resumes(&old, Build::Go);
        assert_eq!(r.len(), 1, "{r:?}");
    }

    /// Up to GPU Operator v25.3 the driver manager is a shell script: it owns ten keys (not
    /// mig-manager) and deletes every underscore of a value it resumes.
    #[test]
    fn the_shell_driver_manager_owns_ten_keys_and_deletes_underscores() {
        let old = labels(&[
            "device-plugin=paused-for-driver-upgrade",
            "mig-manager=true",
            "nvsm=a_b_paused-for-driver-upgrade",
        ]);
        let shell = resumes(&old, Build::Shell);
        let get = |written: &[(String, Resume)], k: &str| {
            written
                .iter()
                .find(|(name, _)| *name == key(k))
                .map(|(_, r)| r.value.clone())
        };
        assert_eq!(get(&shell, "device-plugin").as_deref(), Some("true"));
        assert_eq!(get(&shell, "nvsm").as_deref(), Some("ab"));
        assert_eq!(
            get(&shell, "mig-manager"),
            None,
            "the shell does not own it"
        );
        // An absent owned key is left out (what it read is not known).
        assert_eq!(get(&shell, "container-toolkit"), None);
        let go = resumes(&old, Build::Go);
        assert_eq!(get(&go, "nvsm").as_deref(), Some("a_b"));
        assert_eq!(get(&go, "mig-manager").as_deref(), Some("true"));
        // A person's mig-manager=false during the upgrade stays with the shell, not with Go.
        let new = labels(&[
            "device-plugin=paused-for-driver-upgrade",
            "mig-manager=false",
            "nvsm=a_b_paused-for-driver-upgrade",
        ]);
        let after = |build| after_pauses(Some(&old), &new, build).unwrap();
        assert_eq!(after(Build::Shell)[&key("mig-manager")], "false");
        assert_eq!(after(Build::Go)[&key("mig-manager")], "true");
        // The versions: shell to v25.3, Go from v25.10.
        let v = |t: &str| Build::of(&OperatorVersion::parse(t).unwrap());
        assert_eq!(v("v25.3.4"), Build::Shell);
        assert_eq!(v("v23.9.0"), Build::Shell);
        assert_eq!(v("v25.10.0"), Build::Go);
        assert_eq!(Build::of(&OperatorVersion::newest()), Build::Go);
    }

    #[test]
    fn paused_values_come_back() {
        assert_eq!(
            restored_value("paused-for-driver-upgrade").as_deref(),
            Some("true")
        );
        assert_eq!(
            restored_value("paused-for-mig-change").as_deref(),
            Some("true")
        );
        assert_eq!(
            restored_value("paused-for-vgpu-change").as_deref(),
            Some("true")
        );
        assert_eq!(
            restored_value("foo_paused-for-driver-upgrade").as_deref(),
            Some("foo")
        );
        assert_eq!(
            restored_value("pre-installed_paused-for-driver-upgrade").as_deref(),
            Some("pre-installed")
        );
        assert_eq!(restored_value("true"), None);
        assert_eq!(restored_value("false"), None);
    }
}
