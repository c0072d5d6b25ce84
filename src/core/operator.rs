//! What the GPU Operator and its helpers will do to a node's deploy labels, by version.
//!
//! A pure model of the operator's labelling pass (`gpuStateLabels` and the
//! `gpuWorkloadConfiguration` methods of `controllers/state_manager.go`, the
//! v26.7 node-labelling controller) and of the components that pause and
//! restore labels (k8s-driver-manager, mig-parted, vgpu-device-manager).
//! `docs/gpu-operator.md` holds the facts and their sources; the end-to-end
//! oracle (`tests/e2e/oracle/`) holds this model to the real operator.

use std::collections::BTreeMap;
use std::fmt;

use crate::core::operands::Labels;

const DEPLOY: &str = "nvidia.com/gpu.deploy.";
const GPU_PRESENT: &str = "nvidia.com/gpu.present";
const OPERANDS: &str = "nvidia.com/gpu.deploy.operands";
const WORKLOAD: &str = "nvidia.com/gpu.workload.config";
const MIG_CAPABLE: &str = "nvidia.com/mig.capable";
const PRODUCT: &str = "nvidia.com/gpu.product";
const VGPU_HOST_DRIVER: &str = "nvidia.com/vgpu.host-driver-version";
const NFD_KEYS: [&str; 3] = [
    "feature.node.kubernetes.io/pci-10de.present",
    "feature.node.kubernetes.io/pci-0302_10de.present",
    "feature.node.kubernetes.io/pci-0300_10de.present",
];

/// A span of operator versions whose labelling code is the same.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Era {
    /// v24.9.x – v25.10.x.
    V24_9,
    /// v26.3.x: sandbox mode, kata sandbox device plugin.
    V26_3,
    /// v26.7.x and later: `client`, empty values reset, DRA keys, non-GPU nodes swept.
    V26_7,
}

impl Era {
    pub const NEWEST: Era = Era::V26_7;

    pub fn name(self) -> &'static str {
        match self {
            Era::V24_9 => "v24.9",
            Era::V26_3 => "v26.3",
            Era::V26_7 => "v26.7",
        }
    }
}

/// The operator version a decision assumes, and where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperatorVersion {
    pub era: Era,
    /// As given or read (`v25.3.4`), or the era's name when assumed.
    pub text: String,
    /// Why the version is assumed rather than known; `None` when it was read or given.
    pub assumed: Option<String>,
}

impl OperatorVersion {
    /// The newest modelled version, for when nothing says which one runs.
    pub fn assumed(why: &str) -> OperatorVersion {
        OperatorVersion {
            era: Era::NEWEST,
            text: Era::NEWEST.name().to_owned(),
            assumed: Some(why.to_owned()),
        }
    }

    /// Reads `v25.3.4`, `25.3.4`, `v26.7.0-rc.1`: the major and minor number decide.
    pub fn parse(text: &str) -> Result<OperatorVersion, String> {
        let bad = || format!("{text:?} is not a GPU Operator version like v25.3.4");
        let t = text.trim().trim_start_matches('v');
        let mut parts = t.split(['.', '-', '+']);
        let major: u32 = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let minor: u32 = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let era = match (major, minor) {
            (m, _) if m < 26 => Era::V24_9,
            (26, n) if n < 7 => Era::V26_3,
            _ => Era::V26_7,
        };
        Ok(OperatorVersion {
            era,
            text: format!("v{}", t),
            assumed: None,
        })
    }
}

impl fmt::Display for OperatorVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.assumed {
            None => write!(f, "{}", self.text),
            Some(why) => write!(f, "{} (assumed: {why})", self.text),
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

/// The ClusterPolicy's sandbox settings, as far as labelling needs them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sandbox {
    pub enabled: bool,
    /// `defaultWorkload` when it is a valid workload.
    pub default_workload: Option<Workload>,
    pub mode: SandboxMode,
}

/// What the operator (or the component that paused it) will do to one deploy label.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LabelAction {
    /// Absent (or, from v26.7, empty): the operator sets it to `true`.
    Add,
    /// In the node's set with a value: left as it is.
    Keep,
    /// Outside the node's set: the operator deletes it, whatever its value.
    Sweep,
    /// Paused by k8s-driver-manager, mig-manager or vgpu-device-manager: comes back as `to`.
    RestoreFromPaused { to: String },
    /// A key the operator does not manage (nvsm, unknown keys, ...): nobody changes it.
    Untouched,
}

impl LabelAction {
    pub fn as_str(&self) -> &'static str {
        match self {
            LabelAction::Add => "add",
            LabelAction::Keep => "keep",
            LabelAction::Sweep => "sweep",
            LabelAction::RestoreFromPaused { .. } => "restore-from-paused",
            LabelAction::Untouched => "untouched",
        }
    }
}

/// The outcome of one labelling pass over a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pass {
    /// The node's labels after the pass (all of them, not only deploy labels).
    pub labels: Labels,
    /// Per deploy-label key present before or after: what happens to it.
    pub actions: BTreeMap<String, LabelAction>,
    /// The workload the operator applies (None: not a GPU node, nothing applied).
    pub workload: Option<Workload>,
    /// `operands=false`: every operator label goes.
    pub operands_disabled: bool,
}

fn key(suffix: &str) -> String {
    format!("{DEPLOY}{suffix}")
}

const CONTAINER: [&str; 8] = [
    "driver",
    "gpu-feature-discovery",
    "container-toolkit",
    "device-plugin",
    "dcgm",
    "dcgm-exporter",
    "node-status-exporter",
    "operator-validator",
];
const PASSTHROUGH: [&str; 5] = [
    "sandbox-device-plugin",
    "sandbox-validator",
    "vfio-manager",
    "kata-manager",
    "cc-manager",
];
const VGPU: [&str; 5] = [
    "sandbox-device-plugin",
    "vgpu-manager",
    "vgpu-device-manager",
    "sandbox-validator",
    "cc-manager",
];
const KATA_PLUGIN: &str = "kata-sandbox-device-plugin";
const KUBEVIRT_PLUGIN: &str = "sandbox-device-plugin";
const MIG_MANAGER: &str = "mig-manager";
const CLIENT: &str = "client";
/// The GPUCluster (DRA) stack's keys, swept from ClusterPolicy nodes from v26.7.
const DRA: [&str; 5] = [
    "driver",
    "dra-driver",
    "dra-validator",
    "dcgm-dra",
    "dcgm-exporter-dra",
];

/// `gpuStateLabels[workload]` as `getEffectiveStateLabels` returns it.
pub fn label_set(era: Era, workload: Workload, mode: SandboxMode) -> Vec<&'static str> {
    let mut set: Vec<&'static str> = match workload {
        Workload::Container => CONTAINER.to_vec(),
        Workload::VmPassthrough => PASSTHROUGH.to_vec(),
        Workload::VmVgpu => VGPU.to_vec(),
    };
    if era >= Era::V26_3 && workload == Workload::VmPassthrough && mode == SandboxMode::Kata {
        set.retain(|s| *s != KUBEVIRT_PLUGIN);
        set.push(KATA_PLUGIN);
    }
    if era >= Era::V26_7 {
        set.push(CLIENT);
    }
    set
}

/// Every key the operator may delete in a sweep or for `operands=false`.
fn managed_keys(era: Era) -> Vec<&'static str> {
    let mut keys: Vec<&'static str> = CONTAINER
        .iter()
        .chain(PASSTHROUGH.iter())
        .chain(VGPU.iter())
        .copied()
        .collect();
    keys.push(MIG_MANAGER);
    if era >= Era::V26_3 {
        keys.push(KATA_PLUGIN);
    }
    if era >= Era::V26_7 {
        keys.push(CLIENT);
        keys.extend(DRA);
    }
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// Whether the operator manages this deploy-label suffix in this era.
pub fn is_managed(era: Era, suffix: &str) -> bool {
    managed_keys(era).contains(&suffix)
}

/// An NFD label says the node has an NVIDIA PCI device (`hasGPULabels`).
pub fn has_nfd_gpu(labels: &Labels) -> bool {
    NFD_KEYS
        .iter()
        .any(|k| labels.get(*k).is_some_and(|v| v == "true"))
}

/// `hasMIGCapableGPU`: never on a vGPU host; `nvidia.com/mig.capable` when present, else the
/// product name.
pub fn mig_capable(labels: &Labels) -> bool {
    if labels.get(VGPU_HOST_DRIVER).is_some_and(|v| !v.is_empty()) {
        return false;
    }
    if let Some(v) = labels.get(MIG_CAPABLE) {
        return v == "true";
    }
    labels.get(PRODUCT).is_some_and(|p| {
        let p = p.to_ascii_lowercase();
        p.contains("h100") || p.contains("a100") || p.contains("a30")
    })
}

/// `getWorkloadConfig`: container without sandbox workloads; else the node's valid label, else
/// the default workload, else container.
pub fn workload(labels: &Labels, sandbox: &Sandbox) -> Workload {
    if !sandbox.enabled {
        return Workload::Container;
    }
    labels
        .get(WORKLOAD)
        .and_then(|v| Workload::parse(v))
        .or(sandbox.default_workload)
        .unwrap_or(Workload::Container)
}

fn remove_all(labels: &mut Labels, era: Era) {
    for s in managed_keys(era) {
        labels.remove(&key(s));
    }
}

/// One labelling pass of the operator over a node (`labelGPUNodes`), as this era does it.
pub fn labelling_pass(before: &Labels, era: Era, sandbox: &Sandbox) -> Pass {
    let mut labels = before.clone();
    let nfd = has_nfd_gpu(&labels);
    let present = labels.get(GPU_PRESENT).is_some_and(|v| v == "true");
    if !present && nfd {
        labels.insert(GPU_PRESENT.to_owned(), "true".to_owned());
    } else if present && !nfd {
        labels.insert(GPU_PRESENT.to_owned(), "false".to_owned());
        remove_all(&mut labels, era);
    }
    let gpu = labels.get(GPU_PRESENT).is_some_and(|v| v == "true");
    let mut applied = None;
    let operands_disabled = labels.get(OPERANDS).is_some_and(|v| v == "false");
    if !gpu {
        // v26.7's node-labelling controller strips every node without gpu.present=true.
        if era >= Era::V26_7 {
            remove_all(&mut labels, era);
        }
    } else if operands_disabled {
        remove_all(&mut labels, era);
    } else {
        let w = workload(&labels, sandbox);
        applied = Some(w);
        let set = label_set(era, w, sandbox.mode);
        for s in managed_keys(era) {
            if set.contains(&s) || (s == MIG_MANAGER && w == Workload::Container) {
                continue;
            }
            labels.remove(&key(s));
        }
        for s in &set {
            let k = key(s);
            let missing = match labels.get(&k) {
                None => true,
                Some(v) => v.is_empty() && era >= Era::V26_7,
            };
            if missing {
                labels.insert(k, "true".to_owned());
            }
        }
        if w == Workload::Container
            && mig_capable(&labels)
            && !labels.contains_key(&key(MIG_MANAGER))
        {
            labels.insert(key(MIG_MANAGER), "true".to_owned());
        }
    }
    let mut actions = BTreeMap::new();
    let keys = before
        .keys()
        .chain(labels.keys())
        .filter(|k| k.starts_with(DEPLOY) && k.as_str() != OPERANDS);
    for k in keys {
        let action = match (before.get(k), labels.get(k)) {
            (None, Some(_)) => LabelAction::Add,
            (Some(_), None) => LabelAction::Sweep,
            (Some(old), Some(new)) if old != new => LabelAction::Add,
            (Some(v), Some(_)) => match restored_value(v) {
                Some(to) => LabelAction::RestoreFromPaused { to },
                None if applied.is_some() && is_managed(era, &k[DEPLOY.len()..]) => {
                    LabelAction::Keep
                }
                None => LabelAction::Untouched,
            },
            (None, None) => continue,
        };
        actions.insert(k.clone(), action);
    }
    Pass {
        labels,
        actions,
        workload: applied,
        operands_disabled,
    }
}

const DRIVER_PAUSE: &str = "paused-for-driver-upgrade";

/// The value a paused label gets back when the pause ends; `None` when it is not paused.
///
/// k8s-driver-manager (`maybeSetTrue`): `paused-for-driver-upgrade` → `true`,
/// `v_paused-for-driver-upgrade` → `v`. mig-parted and vgpu-device-manager: `paused-for-mig-change`
/// and `paused-for-vgpu-change` → `true`.
pub fn restored_value(value: &str) -> Option<String> {
    match value {
        DRIVER_PAUSE | "paused-for-mig-change" | "paused-for-vgpu-change" => {
            Some("true".to_owned())
        }
        _ => value
            .strip_suffix(DRIVER_PAUSE)
            .and_then(|v| v.strip_suffix('_'))
            .map(|v| restored_value(v).unwrap_or_else(|| v.to_owned())),
    }
}

/// The labels once every pause has ended: what the node will run again.
pub fn after_pauses(labels: &Labels) -> Labels {
    labels
        .iter()
        .map(|(k, v)| {
            let v = if k.starts_with(DEPLOY) {
                restored_value(v).unwrap_or_else(|| v.clone())
            } else {
                v.clone()
            };
            (k.clone(), v)
        })
        .collect()
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
                    key(k)
                };
                (k, v.to_owned())
            })
            .collect()
    }

    fn gpu(set: &[&str], extra: &[&str]) -> Labels {
        let mut l = labels(&["nvidia.com/gpu.present=true"]);
        for s in set {
            l.insert(key(s), "true".into());
        }
        l.extend(labels(extra));
        l
    }

    const NFD: &str = "feature.node.kubernetes.io/pci-10de.present=true";

    fn deploy_only(l: &Labels) -> Labels {
        l.iter()
            .filter(|(k, _)| k.starts_with(DEPLOY) || *k == GPU_PRESENT)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    fn pass(before: &[&str], era: Era, sandbox: &Sandbox) -> Labels {
        deploy_only(&labelling_pass(&labels(before), era, sandbox).labels)
    }

    const OFF: Sandbox = Sandbox {
        enabled: false,
        default_workload: None,
        mode: SandboxMode::KubeVirt,
    };
    fn on(default: Option<Workload>, mode: SandboxMode) -> Sandbox {
        Sandbox {
            enabled: true,
            default_workload: default,
            mode,
        }
    }

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
        ] {
            assert_eq!(OperatorVersion::parse(v).unwrap().era, era, "{v}");
        }
        assert!(OperatorVersion::parse("latest").is_err());
        let a = OperatorVersion::assumed("no operator Deployment found");
        assert_eq!(a.era, Era::V26_7);
        assert_eq!(
            a.to_string(),
            "v26.7 (assumed: no operator Deployment found)"
        );
    }

    #[test]
    fn new_gpu_node_gets_the_container_set() {
        let want = gpu(&CONTAINER, &[]);
        assert_eq!(pass(&[NFD], Era::V24_9, &OFF), want);
        assert_eq!(pass(&[NFD], Era::V26_3, &OFF), want);
        let mut v267 = want.clone();
        v267.insert(key("client"), "true".into());
        assert_eq!(pass(&[NFD], Era::V26_7, &OFF), v267);
    }

    #[test]
    fn mig_manager_on_mig_capable_container_nodes_only() {
        let mig = gpu(&CONTAINER, &["mig-manager=true"]);
        assert_eq!(
            pass(&[NFD, "nvidia.com/mig.capable=true"], Era::V24_9, &OFF),
            mig
        );
        assert_eq!(
            pass(
                &[NFD, "nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB"],
                Era::V24_9,
                &OFF
            ),
            mig
        );
        assert_eq!(
            pass(
                &[NFD, "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"],
                Era::V24_9,
                &OFF
            ),
            mig
        );
        let plain = gpu(&CONTAINER, &[]);
        assert_eq!(
            pass(
                &[
                    NFD,
                    "nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB",
                    "nvidia.com/mig.capable=false"
                ],
                Era::V24_9,
                &OFF
            ),
            plain
        );
        assert_eq!(
            pass(
                &[
                    NFD,
                    "nvidia.com/mig.capable=true",
                    "nvidia.com/vgpu.host-driver-version=550.90.05"
                ],
                Era::V24_9,
                &OFF
            ),
            plain
        );
        // Kept whatever its value, never swept on a container node.
        assert_eq!(
            pass(
                &[NFD, "mig-manager=false", "nvidia.com/mig.capable=true"],
                Era::V24_9,
                &OFF
            ),
            gpu(&CONTAINER, &["mig-manager=false"])
        );
        assert_eq!(
            pass(&[NFD, "mig-manager=true"], Era::V26_7, &OFF)[&key("mig-manager")],
            "true"
        );
        // Swept on other workloads.
        let s = on(None, SandboxMode::KubeVirt);
        assert_eq!(
            pass(
                &[
                    NFD,
                    "mig-manager=true",
                    "nvidia.com/gpu.workload.config=vm-vgpu"
                ],
                Era::V24_9,
                &s
            ),
            gpu(&VGPU, &[])
        );
    }

    #[test]
    fn values_are_kept_and_empty_ones_reset_from_v26_7() {
        let before = [
            NFD,
            "device-plugin=false",
            "dcgm=",
            "nvsm=",
            "client=true",
            "dcgm-exporter=paused-for-mig-change",
        ];
        assert_eq!(
            pass(&before, Era::V24_9, &OFF),
            gpu(
                &CONTAINER,
                &[
                    "device-plugin=false",
                    "dcgm=",
                    "nvsm=",
                    "client=true",
                    "dcgm-exporter=paused-for-mig-change"
                ]
            )
        );
        assert_eq!(
            pass(&before, Era::V26_7, &OFF),
            gpu(
                &CONTAINER,
                &[
                    "device-plugin=false",
                    "nvsm=",
                    "client=true",
                    "dcgm-exporter=paused-for-mig-change"
                ]
            )
        );
    }

    #[test]
    fn operands_false_deletes_the_operators_keys_only() {
        let before = [
            NFD,
            "operands=false",
            "device-plugin=false",
            "nvsm=true",
            "client=true",
            "mig-manager=true",
        ];
        assert_eq!(
            pass(&before, Era::V24_9, &OFF),
            labels(&[
                "nvidia.com/gpu.present=true",
                "operands=false",
                "nvsm=true",
                "client=true"
            ])
        );
        assert_eq!(
            pass(&before, Era::V26_7, &OFF),
            labels(&["nvidia.com/gpu.present=true", "operands=false", "nvsm=true"])
        );
        // Any other value counts as enabled.
        assert_eq!(
            pass(&[NFD, "operands=False"], Era::V24_9, &OFF),
            gpu(&CONTAINER, &["operands=False"])
        );
    }

    #[test]
    fn gpu_present_without_nfd_flips_and_sweeps() {
        let before = [
            "nvidia.com/gpu.present=true",
            "device-plugin=true",
            "nvsm=true",
        ];
        assert_eq!(
            pass(&before, Era::V24_9, &OFF),
            labels(&["nvidia.com/gpu.present=false", "nvsm=true"])
        );
    }

    #[test]
    fn non_gpu_nodes_are_swept_from_v26_7_only() {
        let before = ["device-plugin=true", "nvsm=true"];
        assert_eq!(pass(&before, Era::V26_3, &OFF), labels(&before));
        assert_eq!(pass(&before, Era::V26_7, &OFF), labels(&["nvsm=true"]));
    }

    #[test]
    fn workloads_replace_the_set() {
        let s = on(None, SandboxMode::KubeVirt);
        let pt = [
            NFD,
            "nvidia.com/gpu.workload.config=vm-passthrough",
            "device-plugin=false",
            "dcgm=true",
        ];
        assert_eq!(pass(&pt, Era::V24_9, &s), gpu(&PASSTHROUGH, &[]));
        assert_eq!(
            pass(&pt, Era::V24_9, &OFF),
            gpu(&CONTAINER, &["device-plugin=false"])
        );
        let vg = [NFD, "nvidia.com/gpu.workload.config=vm-vgpu"];
        assert_eq!(pass(&vg, Era::V24_9, &s), gpu(&VGPU, &[]));
        // Invalid or missing: the default workload.
        let bogus = [NFD, "nvidia.com/gpu.workload.config=bogus"];
        assert_eq!(pass(&bogus, Era::V24_9, &s), gpu(&CONTAINER, &[]));
        let d = on(Some(Workload::VmVgpu), SandboxMode::KubeVirt);
        assert_eq!(pass(&bogus, Era::V24_9, &d), gpu(&VGPU, &[]));
        assert_eq!(pass(&[NFD], Era::V24_9, &d), gpu(&VGPU, &[]));
    }

    #[test]
    fn kata_mode_swaps_the_passthrough_device_plugin_from_v26_3() {
        let k = on(None, SandboxMode::Kata);
        let pt = [
            NFD,
            "nvidia.com/gpu.workload.config=vm-passthrough",
            "sandbox-device-plugin=true",
        ];
        let mut want = gpu(&PASSTHROUGH, &["kata-sandbox-device-plugin=true"]);
        want.remove(&key("sandbox-device-plugin"));
        assert_eq!(pass(&pt, Era::V26_3, &k), want);
        assert_eq!(pass(&pt, Era::V24_9, &k), gpu(&PASSTHROUGH, &[]));
        // vm-vgpu keeps the kubevirt plugin's label in kata mode.
        let vg = [NFD, "nvidia.com/gpu.workload.config=vm-vgpu"];
        assert_eq!(pass(&vg, Era::V26_3, &k), gpu(&VGPU, &[]));
        // The kata key is swept from container nodes from v26.3 only.
        let c = [NFD, "kata-sandbox-device-plugin=true"];
        assert_eq!(pass(&c, Era::V26_3, &OFF), gpu(&CONTAINER, &[]));
        assert_eq!(
            pass(&c, Era::V24_9, &OFF),
            gpu(&CONTAINER, &["kata-sandbox-device-plugin=true"])
        );
    }

    #[test]
    fn dra_keys_are_swept_from_v26_7() {
        let before = [NFD, "dra-driver=true", "dcgm-dra=true"];
        assert_eq!(
            pass(&before, Era::V26_3, &OFF),
            gpu(&CONTAINER, &["dra-driver=true", "dcgm-dra=true"])
        );
        assert_eq!(
            pass(&before, Era::V26_7, &OFF),
            gpu(&CONTAINER, &["client=true"])
        );
    }

    #[test]
    fn actions_name_what_happens_to_each_label() {
        let s = on(None, SandboxMode::KubeVirt);
        let before = labels(&[
            NFD,
            "nvidia.com/gpu.workload.config=vm-passthrough",
            "device-plugin=false",
            "vfio-manager=false",
            "sandbox-validator=paused-for-driver-upgrade",
            "nvsm=",
        ]);
        let p = labelling_pass(&before, Era::V24_9, &s);
        assert_eq!(p.workload, Some(Workload::VmPassthrough));
        assert_eq!(p.actions[&key("device-plugin")], LabelAction::Sweep);
        assert_eq!(p.actions[&key("vfio-manager")], LabelAction::Keep);
        assert_eq!(p.actions[&key("cc-manager")], LabelAction::Add);
        assert_eq!(
            p.actions[&key("sandbox-validator")],
            LabelAction::RestoreFromPaused { to: "true".into() }
        );
        assert_eq!(p.actions[&key("nvsm")], LabelAction::Untouched);
        // v26.7 resets an empty value: an add.
        let e = labelling_pass(&labels(&[NFD, "dcgm="]), Era::V26_7, &OFF);
        assert_eq!(e.actions[&key("dcgm")], LabelAction::Add);
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
        let l = after_pauses(&labels(&[
            "device-plugin=paused-for-mig-change",
            "dcgm=false",
        ]));
        assert_eq!(l[&key("device-plugin")], "true");
        assert_eq!(l[&key("dcgm")], "false");
    }
}
