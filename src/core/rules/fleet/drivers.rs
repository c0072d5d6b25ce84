//! The fleet rules on driver DaemonSets: nodes that lose theirs, and NVIDIADrivers that select
//! the same node.

use super::{finding, lose, name_nodes, plural};
use crate::core::echo::echo;
use crate::core::facts::{ClusterFacts, DriversReconciled, PolicySource};
use crate::core::nvidia_driver::NvidiaDriver;
use crate::core::operands::Operand;
use crate::core::policy_change::model::{Outcome, PolicyChange, PolicyReview};
use crate::core::rules::{Found, Rule};

pub(super) fn driver_lost(
    review: &PolicyReview<'_>,
    object: &str,
    outcomes: &[Outcome<'_, '_>],
    out: &mut Vec<Found>,
) {
    let lost = outcomes
        .iter()
        .filter(|o| o.driver_before && !o.driver_after)
        .flat_map(|o| o.group.nodes.iter().copied());
    let (count, names) = name_nodes(lost);
    if count == 0 {
        return;
    }
    let how = match review.change {
        PolicyChange::ClusterPolicy { before, after, .. } => {
            let switched_off = |f: &ClusterFacts| f.off().contains(Operand::Driver);
            if !before.driver_crd && after.driver_crd {
                "driver.useNvidiaDriverCRD hands the driver to NVIDIADriver resources, and none selects them"
            } else if !switched_off(before) && switched_off(after) {
                "spec.driver.enabled true -> false deletes nvidia-driver-daemonset"
            } else if before.sandbox != after.sandbox {
                "the sandboxWorkloads change gives them a workload whose label set has no driver: the \
                 operator's next pass removes nvidia.com/gpu.deploy.driver, and the DaemonSet controller \
                 their driver pod"
            } else {
                "the change stops the driver DaemonSet there"
            }
        }
        PolicyChange::NvidiaDriver { after: None, .. } => {
            "deleting it removes its driver DaemonSets, and no other NVIDIADriver selects them"
        }
        PolicyChange::NvidiaDriver { .. } => {
            "its nodeSelector no longer selects them, and no other NVIDIADriver does"
        }
        // The GPUCluster stack's drivers are NVIDIADriver resources', which its changes leave.
        PolicyChange::GpuCluster { .. } => return,
    };
    out.push(finding(
        Rule::DriverRemoved,
        format!(
            "{object}: {how}: {count} {} {} the driver DaemonSet ({names}); the driver container unloads the kernel modules as it exits, \
             so nodes without a driver installed on the host lose their GPUs.",
            plural(count),
            lose(count)
        ),
        format!(
            "{object}: {count} {} {} the driver DaemonSet ({names})",
            plural(count),
            lose(count)
        ),
    ));
}

/// Before v26.3 the operator reconciles NVIDIADrivers while `useNvidiaDriverCRD` is off: one
/// created or widened then starts a driver DaemonSet where the ClusterPolicy's
/// `nvidia-driver-daemonset` runs (`docs/gpu-operator.md` §11.3).
pub(super) fn beside_policy_driver(
    object: &str,
    facts: &ClusterFacts,
    before: Option<&NvidiaDriver>,
    this: &NvidiaDriver,
    outcomes: &[Outcome<'_, '_>],
    out: &mut Vec<Found>,
) {
    if !facts.policy_driver_beside_nvidia_drivers() {
        return;
    }
    let version = &facts.operator.version;
    let both = outcomes
        .iter()
        .filter(|o| {
            o.after.contains(Operand::Driver)
                && this.selects(&o.after_labels, version)
                && !before.is_some_and(|d| d.selects(&o.before_labels, version))
        })
        .flat_map(|o| o.group.nodes.iter().copied());
    let (count, names) = name_nodes(both);
    if count == 0 {
        return;
    }
    out.push(finding(
        Rule::DriverSelectedTwice,
        format!(
            "{object}: spec.driver.useNvidiaDriverCRD is off, and GPU Operator {version} reconciles NVIDIADrivers whatever the flag \
             says: its driver DaemonSet starts on {count} {} ({names}) where nvidia-driver-daemonset runs; one driver pod runs per \
             node (required pod anti-affinity), so the second stays Pending and both DaemonSets report not ready. Set \
             spec.driver.useNvidiaDriverCRD true to hand the drivers to NVIDIADrivers, or select nodes the ClusterPolicy's driver \
             does not run on.",
            plural(count)
        ),
        format!(
            "{object}: {count} {} running nvidia-driver-daemonset get its driver DaemonSet too ({names})",
            plural(count)
        ),
    ));
}

/// An NVIDIADriver change the operator does not carry out (`docs/gpu-operator.md` §11.3).
pub(super) fn not_reconciled(
    object: &str,
    facts: &ClusterFacts,
    this: &NvidiaDriver,
    outcomes: Option<&[Outcome<'_, '_>]>,
    out: &mut Vec<Found>,
) {
    let version = &facts.operator.version;
    let (message, warning) = match facts.nvidia_drivers_reconciled() {
        // Before v26.3 a selector that picks no node with NFD's OS labels fails the reconcile
        // (`getManifestObjects`, `internal/state/driver.go`); from v26.3 its DaemonSets are all
        // deleted, which `driver-removed` says.
        DriversReconciled::Yes
            if facts.operator.era().keeps_dropped_driver_pools()
                && outcomes.is_some_and(|o| {
                    !o.iter().any(|o| this.renders(&o.after_labels).is_some())
                }) =>
        {
            (
                format!(
                    "{object}: its nodeSelector picks no GPU node with NFD's OS labels, so GPU Operator {version} fails \
                     its reconcile (\"no nodes matching the given node selector\") and applies nothing: its DaemonSets \
                     stay as they are, with the selector they had."
                ),
                format!(
                    "{object}: not reconciled: its nodeSelector picks no GPU node with NFD's OS labels"
                ),
            )
        }
        DriversReconciled::Yes => return,
        DriversReconciled::FlagOff => {
            let policy = match &facts.source {
                PolicySource::Found(name) => format!("ClusterPolicy {}", echo(name)),
                _ => "the ClusterPolicy".to_owned(),
            };
            (
                format!(
                    "{object}: {policy} has spec.driver.useNvidiaDriverCRD off, so GPU Operator {version} sets this \
                     NVIDIADriver's status disabled and deploys nothing (DaemonSets it already has stay as they are); \
                     nvidia-driver-daemonset keeps serving the nodes. Set spec.driver.useNvidiaDriverCRD true to hand \
                     the drivers to NVIDIADrivers."
                ),
                format!(
                    "{object}: not reconciled: {policy} has spec.driver.useNvidiaDriverCRD off"
                ),
            )
        }
        DriversReconciled::NoClusterPolicy => (
            format!(
                "{object}: no ClusterPolicy exists, so GPU Operator {version} fails this NVIDIADriver's reconcile \
                 (\"no ClusterPolicy object found in the cluster\") and deploys nothing until one exists."
            ),
            format!("{object}: not reconciled: no ClusterPolicy exists"),
        ),
    };
    out.push(finding(Rule::NvidiaDriverNotReconciled, message, warning));
}

/// The other NVIDIADrivers are not known (not listed yet, RBAC forbids it, or not given
/// offline): whether this one selects their nodes cannot be checked, so it is refused, since
/// the operator reports an overlap only when it reconciles.
pub(super) fn overlap_unknown(object: &str, out: &mut Vec<Found>) {
    out.push(finding(
        Rule::NvidiaDriverOverlap,
        format!(
            "{object}: overlap not checked: the other NVIDIADrivers are not known (not listed yet, or RBAC forbids \
             listing nvidiadrivers.nvidia.com); the GPU Operator runs one driver per node and reports a conflict only \
             when it reconciles: retry once the guard has listed them (its log says why it has not), or, offline, give \
             them with --nvidia-drivers."
        ),
        format!("{object}: overlap with the other NVIDIADrivers not checked: they are not known"),
    ));
}

pub(super) fn overlap(
    object: &str,
    facts: &ClusterFacts,
    this: &NvidiaDriver,
    others: &[NvidiaDriver],
    outcomes: &[Outcome<'_, '_>],
    out: &mut Vec<Found>,
) {
    for other in others {
        // From v26.7 a default NVIDIADriver takes the nodes no other one claims: sharing a node
        // with a non-default one is the design, not a conflict (`AssignOwners`). Two defaults
        // conflict, as two non-defaults do.
        if facts.operator.era().default_nvidia_driver_takes_the_rest()
            && this.default != other.default
        {
            continue;
        }
        let shared = outcomes
            .iter()
            .filter(|o| this.claims(&o.after_labels) && other.claims(&o.after_labels))
            .flat_map(|o| o.group.nodes.iter().copied());
        let (count, names) = name_nodes(shared);
        if count == 0 {
            continue;
        }
        out.push(finding(
            Rule::NvidiaDriverOverlap,
            format!(
                "{object}: {} {count} {} that NVIDIADriver {} selects too ({names}); the GPU Operator runs one driver per node \
                 and reports the conflict only when it reconciles: make the two nodeSelectors select different nodes.",
                if this.node_selector.is_some() {
                    "its nodeSelector selects"
                } else {
                    "with no nodeSelector it claims every GPU node, among them"
                },
                plural(count),
                echo(&other.name)
            ),
            format!(
                "{object} and NVIDIADriver {} both select {names}",
                echo(&other.name)
            ),
        ));
    }
}

/// An NVIDIADriver whose nodeSelector names a label the node records do not hold yet (they
/// keep what decisions read, the keys of the NVIDIADrivers that exist, and the keys earlier
/// requests asked for): its nodes cannot be told, so the change is refused for its overlap,
/// unchecked, until the records hold the label.
pub(super) fn unkept_selector_keys(
    review: &PolicyReview<'_>,
    keeps: &dyn Fn(&str) -> bool,
    out: &mut Vec<Found>,
) {
    let PolicyChange::NvidiaDriver {
        after: Some(this),
        before,
        others,
        ..
    } = review.change
    else {
        return;
    };
    // Alone and new, it can overlap nothing and take no driver away: nothing went unchecked.
    if others.is_empty() && before.is_none() {
        return;
    }
    let unkept: Vec<&str> = this
        .node_selector
        .iter()
        .flat_map(|s| s.keys())
        .map(String::as_str)
        .filter(|k| !keeps(k))
        .collect();
    if unkept.is_empty() {
        return;
    }
    let object = format!("NVIDIADriver {}", echo(review.name));
    let keys = echo(&unkept.join(", ")).into_owned();
    // Which nodes it selects cannot be told, so neither can its overlap with the others: refused,
    // as when the others are not known. The guard reads the label from now on (the webhook asks
    // its node records to keep it), so the same request is judged in full seconds later.
    out.push(finding(
        Rule::NvidiaDriverOverlap,
        format!(
            "{object}: its nodeSelector reads {keys}, which the guard had not read from the nodes: which nodes \
             it selects, and so its overlap with the other NVIDIADrivers, cannot be checked yet; the guard reads \
             that label from the nodes now: retry in a few seconds."
        ),
        format!("{object}: overlap not checked: the guard had not read {keys} from the nodes"),
    ));
}
