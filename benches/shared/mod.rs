//! What the fleet-scale benches (`audit`, `auditor`) share: the operator's DaemonSets of their
//! synthetic fleet.

/// Operator pods on each node of the synthetic fleet.
#[allow(dead_code)]
pub const PODS_PER_NODE: usize = 10;

/// The operator DaemonSets of the synthetic fleet: (DaemonSet, the deploy label it selects on,
/// or none).
pub const DAEMONSETS: [(&str, Option<&str>); PODS_PER_NODE] = [
    ("nvidia-driver-daemonset", Some("driver")),
    (
        "nvidia-container-toolkit-daemonset",
        Some("container-toolkit"),
    ),
    ("nvidia-operator-validator", Some("operator-validator")),
    ("nvidia-device-plugin-daemonset", Some("device-plugin")),
    ("gpu-feature-discovery", Some("gpu-feature-discovery")),
    ("nvidia-dcgm", Some("dcgm")),
    ("nvidia-dcgm-exporter", Some("dcgm-exporter")),
    ("nvidia-mig-manager", Some("mig-manager")),
    ("nvidia-device-plugin-mps-control-daemon", None),
    ("gpu-operator-node-feature-discovery-worker", None),
];
