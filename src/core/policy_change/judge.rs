//! The fleet rules: each judges the outcomes of one GPU-policy change over the groups of nodes
//! it reaches and names the nodes (the rows of `RULES` with `Check::Fleet`).

use super::*;

/// "a, b, c, d, e and 7 more"
pub fn name_nodes<'a>(nodes: impl IntoIterator<Item = &'a str>) -> (usize, String) {
    let mut all: Vec<&str> = nodes.into_iter().collect();
    all.sort_unstable();
    let shown: Vec<String> = all
        .iter()
        .take(NAMED_NODES)
        .map(|n| crate::core::echo::echo(n).into_owned())
        .collect();
    let text = match all.len().saturating_sub(NAMED_NODES) {
        0 => shown.join(", "),
        more => format!("{} and {more} more", shown.join(", ")),
    };
    (all.len(), text)
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "node" } else { "nodes" }
}

/// "loses" for one node, "lose" for several.
fn lose(n: usize) -> &'static str {
    if n == 1 { "loses" } else { "lose" }
}

fn finding(rule: Rule, message: String, warning: String) -> Found {
    Found {
        rule,
        change: Change::New,
        message,
        warning,
    }
}

/// A ClusterPolicy and a GPUCluster at once (v26.7+): the GPUCluster controller sets itself
/// `NotReady` (`validatePrerequisites`), the ClusterPolicy controller and the node-labelling
/// reconcile return an error (gpu-operator@v26.7.0 `controllers/gpucluster_controller.go`,
/// `controllers/clusterpolicy_controller.go`, `controllers/nodelabeling_controller.go`):
/// nothing is reconciled or labelled until one is deleted (`docs/gpu-operator.md` §12). The
/// request that makes both exist is new; one that changes either while both exist finds the
/// conflict there already.
pub(super) fn stacks_conflict(review: &PolicyReview<'_>) -> Option<Found> {
    use crate::core::operands::{GPU_CLUSTER_NAME, Stack};
    let echo = crate::core::echo::echo;
    let object = format!("{} {}", review.kind.as_str(), echo(review.name));
    let (facts, other, creates) = match review.change {
        PolicyChange::ClusterPolicy { after, .. } => {
            // Whether a GPUCluster exists is not known: this ClusterPolicy could make both.
            if review.operation == Operation::Create
                && after.operator.era() >= Era::V26_7
                && after.stack == Stack::ClusterPolicy
                && let Some(why) = &after.gpu_clusters_unknown
            {
                let version = &after.operator.version.text;
                return Some(Found {
                    rule: Rule::GpuClusterConflict,
                    change: Change::New,
                    message: format!(
                        "{object}: whether a GPUCluster exists is not known ({why}), and the GPU Operator \
                         ({version}) reconciles neither while both exist: retry once the guard can read the GPUClusters."
                    ),
                    warning: format!("{object}: whether a GPUCluster exists is not known"),
                });
            }
            if after.stack.in_era(after.operator.era()) != Stack::Both
                || review.operation == Operation::Delete
            {
                return None;
            }
            (
                after,
                format!("GPUCluster {GPU_CLUSTER_NAME}"),
                review.operation == Operation::Create,
            )
        }
        PolicyChange::GpuCluster {
            facts,
            cluster_policy: Some(cp),
            ..
        } if facts.operator.era() >= Era::V26_7
            && matches!(review.operation, Operation::Create | Operation::Update) =>
        {
            (
                facts,
                format!("ClusterPolicy {}", echo(cp)),
                review.operation == Operation::Create,
            )
        }
        PolicyChange::GpuCluster {
            facts,
            cluster_policy: None,
            ..
        } if facts.operator.era() >= Era::V26_7
            && review.operation == Operation::Create
            && matches!(
                facts.source,
                crate::core::facts::PolicySource::Forbidden(_)
                    | crate::core::facts::PolicySource::Failed(_)
                    | crate::core::facts::PolicySource::NoAccess(_)
            ) =>
        {
            // Whether a ClusterPolicy exists is not known: the GPUCluster could make both.
            let version = &facts.operator.version.text;
            let why = facts.source.describe();
            return Some(Found {
                rule: Rule::GpuClusterConflict,
                change: Change::New,
                message: format!(
                    "{object}: whether a ClusterPolicy exists is not known ({why}), and the GPU Operator ({version}) \
                     reconciles neither while both exist: retry once the guard can read the ClusterPolicies."
                ),
                warning: format!("{object}: whether a ClusterPolicy exists is not known"),
            });
        }
        _ => return None,
    };
    let version = &facts.operator.version.text;
    let (message, warning, change) = if creates {
        (
            format!(
                "{object}: {other} exists, and the GPU Operator ({version}) reconciles neither while both \
                 exist: it labels no node and deploys nothing until one is deleted; delete {other} first, \
                 or do not create {object}."
            ),
            format!("{object}: {other} exists; the GPU Operator would reconcile neither"),
            Change::New,
        )
    } else {
        (
            format!(
                "{object}: {other} exists too, so the GPU Operator ({version}) reconciles neither and this \
                 change takes effect only once one of them is deleted."
            ),
            format!("{object}: {other} exists too; the GPU Operator reconciles neither"),
            Change::Existing,
        )
    };
    Some(Found {
        rule: Rule::GpuClusterConflict,
        change,
        message,
        warning,
    })
}

pub(super) fn judge(
    review: &PolicyReview<'_>,
    outcomes: &[Outcome<'_, '_>],
    policy: &Policy,
    out: &mut Vec<Found>,
) {
    let object = format!(
        "{} {}",
        review.kind.as_str(),
        crate::core::echo::echo(review.name)
    );
    if let PolicyChange::ClusterPolicy {
        before,
        after,
        others,
        ..
    } = review.change
    {
        // A DELETE is judged as the hand-over to the ClusterPolicy followed next (of a
        // ClusterPolicy: the next one; of a GPUCluster beside a ClusterPolicy: that one).
        let object = match (review.operation, others.first()) {
            (Operation::Delete, Some(next)) => format!(
                "{object} (deleted: the GPU Operator then follows ClusterPolicy {})",
                crate::core::echo::echo(next)
            ),
            _ => object.clone(),
        };
        if review.operation == Operation::Create
            && let Some(first) = others.first()
        {
            let msg = format!(
                "{object}: ClusterPolicy {} already exists; the GPU Operator follows one ClusterPolicy and marks the others ignored.",
                crate::core::echo::echo(first)
            );
            out.push(finding(Rule::ClusterPolicyIgnored, msg.clone(), msg));
            return;
        }
        toolkit_switched_off(&object, before, after, outcomes, out);
        device_plugin_switched_off(&object, before, after, outcomes, out);
        if before.sandbox != after.sandbox {
            sandbox_relabel(&object, before, after, outcomes, out);
        }
        if let PolicyChange::ClusterPolicy { drivers, .. } = review.change {
            driver_selected_twice(&object, before, after, drivers, outcomes, out);
        }
        runtime_classes_removed(&object, before, after, outcomes, out);
    }
    driver_removed(review, &object, outcomes, out);
    if let PolicyChange::NvidiaDriver {
        after: Some(this),
        others,
        facts,
        ..
    } = review.change
    {
        if facts.nvidia_drivers.is_none() {
            overlap_unknown(&object, out);
        } else {
            overlap(&object, facts, this, others, outcomes, out);
        }
    }
    state_transitions(review, &object, outcomes, policy, out);
}

/// The other NVIDIADrivers are not known (not listed yet, RBAC forbids it, or not given
/// offline): whether this one selects their nodes cannot be checked, so it is refused, since
/// the operator reports an overlap only when it reconciles.
fn overlap_unknown(object: &str, out: &mut Vec<Found>) {
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

fn toolkit_switched_off(
    object: &str,
    before: &ClusterFacts,
    after: &ClusterFacts,
    outcomes: &[Outcome<'_, '_>],
    out: &mut Vec<Found>,
) {
    if !before.toolkit_managed || after.toolkit_managed {
        return;
    }
    let hit = outcomes.iter().filter(|o| {
        o.before.contains(Operand::ContainerToolkit)
            && o.after.contains(Operand::DevicePlugin)
            && !o.after.contains(Operand::ContainerToolkit)
    });
    let (count, names) = name_nodes(hit.flat_map(|o| o.group.nodes.iter().copied()));
    if count == 0 {
        return;
    }
    out.push(finding(
        Rule::ToolkitSwitchedOff,
        toolkit_message(object, &format!("on {count} {} ({names})", plural(count))),
        format!(
            "{object}: toolkit off while the device plugin runs on {count} {}",
            plural(count)
        ),
    ));
}

/// §11.6: `devicePlugin.enabled` true -> false. Consistent (nothing runs without the toolkit),
/// but every node it ran on stops advertising its GPUs.
fn device_plugin_switched_off(
    object: &str,
    before: &ClusterFacts,
    after: &ClusterFacts,
    outcomes: &[Outcome<'_, '_>],
    out: &mut Vec<Found>,
) {
    if before.off().contains(Operand::DevicePlugin) || !after.off().contains(Operand::DevicePlugin)
    {
        return;
    }
    let hit = outcomes.iter().filter(|o| {
        o.before.contains(Operand::DevicePlugin) && !o.after.contains(Operand::DevicePlugin)
    });
    let (count, names) = name_nodes(hit.flat_map(|o| o.group.nodes.iter().copied()));
    if count == 0 {
        return;
    }
    out.push(finding(
        Rule::DevicePluginSwitchedOff,
        format!(
            "{object}: spec.devicePlugin.enabled true -> false deletes the device plugin DaemonSets (the MPS control daemon's too) on {count} {} ({names}): \
             their GPUs are no longer advertised, so new GPU pods stay Pending there (running ones keep their GPUs), \
             and the operator validator rolls without its plugin check.",
            plural(count)
        ),
        format!(
            "{object}: the device plugin stops on {count} {} ({names}); their GPUs are no longer advertised",
            plural(count)
        ),
    ));
}

/// §11.3: `driver.useNvidiaDriverCRD` true -> false. The ClusterPolicy's driver DaemonSet comes
/// back while the NVIDIADriver DaemonSets stay (v26.3+ set the resources `disabled` and leave
/// them; v25.3/v25.10 go on reconciling them).
fn driver_selected_twice(
    object: &str,
    before: &ClusterFacts,
    after: &ClusterFacts,
    drivers: &[NvidiaDriver],
    outcomes: &[Outcome<'_, '_>],
    out: &mut Vec<Found>,
) {
    if !before.driver_crd || after.driver_crd {
        return;
    }
    // The nodes the ClusterPolicy's driver comes back on that an NVIDIADriver serves, and which
    // NVIDIADrivers those are.
    let mut serving = std::collections::BTreeSet::new();
    let mut nodes = Vec::new();
    for o in outcomes
        .iter()
        .filter(|o| o.after.contains(Operand::Driver))
    {
        if let Some(d) = drivers
            .iter()
            .find(|d| d.selects(&o.after_labels, &after.operator.version))
        {
            serving.insert(d.name.as_str());
            nodes.extend(o.group.nodes.iter().copied());
        }
    }
    let (count, names) = name_nodes(nodes);
    if count == 0 {
        return;
    }
    let resources =
        crate::core::echo::echo(&serving.into_iter().collect::<Vec<_>>().join(", ")).into_owned();
    let kept = if after.operator.era() >= Era::V26_3 {
        "the operator sets them disabled and leaves their DaemonSets"
    } else {
        "this operator version goes on reconciling them"
    };
    out.push(finding(
        Rule::DriverSelectedTwice,
        format!(
            "{object}: driver.useNvidiaDriverCRD true -> false brings nvidia-driver-daemonset back on {count} {} ({names}) that the DaemonSets of NVIDIADriver {resources} still serve ({kept}): \
             one driver pod runs per node (pod anti-affinity), so its pods stay Pending there, and deleting those NVIDIADriver resources later restarts the driver under the nodes' GPU workloads; \
             delete them first, node by node during a drain, or keep the flag on.",
            plural(count)
        ),
        format!(
            "{object}: {count} {} served by NVIDIADriver {resources} get nvidia-driver-daemonset too ({names})",
            plural(count)
        ),
    ));
}

/// §11.6: `cdi.nriPluginEnabled` false -> true from v26.3: the operator deletes the `nvidia`
/// RuntimeClasses, and the API server refuses pods that name one.
fn runtime_classes_removed(
    object: &str,
    before: &ClusterFacts,
    after: &ClusterFacts,
    outcomes: &[Outcome<'_, '_>],
    out: &mut Vec<Found>,
) {
    if after.operator.era() < Era::V26_3 || before.nri_plugin || !after.nri_plugin {
        return;
    }
    let toolkit = outcomes
        .iter()
        .filter(|o| o.after.contains(Operand::ContainerToolkit))
        .map(|o| o.group.nodes.len())
        .sum::<usize>();
    out.push(finding(
        Rule::RuntimeClassesRemoved,
        format!(
            "{object}: cdi.nriPluginEnabled false -> true makes the GPU Operator delete the RuntimeClasses nvidia, nvidia-cdi and nvidia-legacy \
             (the toolkit on {toolkit} {} becomes an NRI plugin): from then on the API server refuses every pod that names runtimeClassName: nvidia \
             (running ones keep running); remove runtimeClassName from GPU workloads and their templates first.",
            plural(toolkit)
        ),
        format!(
            "{object}: the nvidia RuntimeClasses are deleted; pods naming runtimeClassName: nvidia are refused from then on"
        ),
    ));
}

fn toolkit_message(object: &str, where_: &str) -> String {
    format!(
        "{object}: spec.toolkit.enabled true -> false deletes the container toolkit DaemonSet while the NVIDIA device plugin keeps running {where_}: \
         on containerd nodes the toolkit's exit removes the nvidia runtime (and with CDI on, the device plugin's rollout stalls on it), \
         the running device plugins keep advertising GPUs, and GPU pods scheduled there fail to start; turn spec.devicePlugin.enabled off in the same change, or, if every host brings its own \
         container toolkit, say so in the same request with the annotation {HOST_TOOLKIT_ANNOTATION}=<why> (recorded in the audit log)."
    )
}

fn sandbox_relabel(
    object: &str,
    before: &ClusterFacts,
    after: &ClusterFacts,
    outcomes: &[Outcome<'_, '_>],
    out: &mut Vec<Found>,
) {
    // Nodes grouped by what changes on them.
    let mut by_change: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for o in outcomes {
        let mut changes = Vec::new();
        for op in Operand::all() {
            match (o.relabel_before.contains(op), o.relabel_after.contains(op)) {
                (false, true) => changes.push(format!("+{op}")),
                (true, false) => changes.push(format!("-{op}")),
                _ => {}
            }
        }
        if !changes.is_empty() {
            by_change
                .entry(changes.join(" "))
                .or_default()
                .extend(o.group.nodes.iter().copied());
        }
    }
    let what = sandbox_words(before, after);
    for (changes, nodes) in by_change {
        let (count, names) = name_nodes(nodes);
        out.push(finding(
            Rule::SandboxRelabel,
            format!(
                "{object}: {what} makes the GPU Operator relabel {count} {} on its next pass ({names}): {changes}.",
                plural(count)
            ),
            format!(
                "{object}: {what}: {changes} on {count} {}",
                plural(count)
            ),
        ));
    }
}

fn sandbox_words(before: &ClusterFacts, after: &ClusterFacts) -> String {
    let (b, a) = (&before.sandbox, &after.sandbox);
    let mut parts = Vec::new();
    if b.enabled != a.enabled {
        parts.push(format!(
            "sandboxWorkloads.enabled {} -> {}",
            b.enabled, a.enabled
        ));
    }
    if b.default_workload != a.default_workload {
        let w = |w: Option<crate::core::operands::Workload>| {
            w.map_or("none".to_owned(), |w| w.name().to_owned())
        };
        parts.push(format!(
            "sandboxWorkloads.defaultWorkload {} -> {}",
            w(b.default_workload),
            w(a.default_workload)
        ));
    }
    if b.mode != a.mode {
        parts.push(format!(
            "sandboxWorkloads.mode {} -> {}",
            b.mode.name(),
            a.mode.name()
        ));
    }
    parts.join(", ")
}

fn driver_removed(
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
            if !before.driver_crd && after.driver_crd {
                "driver.useNvidiaDriverCRD hands the driver to NVIDIADriver resources, and none selects them"
            } else {
                "spec.driver.enabled true -> false deletes nvidia-driver-daemonset"
            }
        }
        PolicyChange::NvidiaDriver { after: None, .. } => {
            "deleting it removes its driver DaemonSets, and no other NVIDIADriver selects them"
        }
        PolicyChange::NvidiaDriver { .. } => {
            "its nodeSelector no longer selects them, and no other NVIDIADriver does"
        }
        // Never judged over the fleet.
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

fn overlap(
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
        if facts.operator.era() >= Era::V26_7 && this.default != other.default {
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
                crate::core::echo::echo(&other.name)
            ),
            format!(
                "{object} and NVIDIADriver {} both select {names}",
                crate::core::echo::echo(&other.name)
            ),
        ));
    }
}

/// Every state rule, before and after, on every group: a finding only the new state has is
/// one the request creates.
fn state_transitions(
    review: &PolicyReview<'_>,
    object: &str,
    outcomes: &[Outcome<'_, '_>],
    policy: &Policy,
    out: &mut Vec<Found>,
) {
    let (before_facts, after_facts) = match review.change {
        PolicyChange::ClusterPolicy { before, after, .. } => (before, after),
        PolicyChange::NvidiaDriver { .. } | PolicyChange::GpuCluster { .. } => return,
    };
    let mut by_rule: BTreeMap<Rule, (Vec<&str>, String)> = BTreeMap::new();
    for o in outcomes {
        let sample = o.group.nodes.first().copied().unwrap_or_default();
        let had: Vec<Rule> = policy::assess(sample, &o.before_labels, before_facts, policy)
            .into_iter()
            .map(|f| f.rule)
            .collect();
        for f in policy::assess(sample, &o.after_labels, after_facts, policy) {
            if had.contains(&f.rule) {
                continue;
            }
            let entry = by_rule
                .entry(f.rule)
                .or_insert_with(|| (Vec::new(), f.message.clone()));
            entry.0.extend(o.group.nodes.iter().copied());
        }
    }
    for (rule, (nodes, first)) in by_rule {
        let (count, names) = name_nodes(nodes);
        out.push(finding(
            rule,
            format!(
                "{object}: after this change, {count} {} fail {} ({names}); for example: {first}",
                plural(count),
                rule.id()
            ),
            format!(
                "{object}: {} on {count} {} ({names})",
                rule.id(),
                plural(count)
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
    let object = format!("NVIDIADriver {}", crate::core::echo::echo(review.name));
    let keys = crate::core::echo::echo(&unkept.join(", ")).into_owned();
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

/// Without the nodes, what the policy alone says: the toolkit switched off while the device
/// plugin stays enabled is refused (it runs wherever its label is), the rest is not judged.
pub(super) fn judge_blind(review: &PolicyReview<'_>, why: &str, out: &mut Vec<Found>) {
    if let PolicyChange::ClusterPolicy { before, after, .. } = review.change
        && before.toolkit_managed
        && !after.toolkit_managed
        && !after.off().contains(Operand::DevicePlugin)
    {
        let object = format!(
            "{} {}",
            review.kind.as_str(),
            crate::core::echo::echo(review.name)
        );
        out.push(finding(
            Rule::ToolkitSwitchedOff,
            toolkit_message(
                &object,
                &format!("wherever its deploy label is (the nodes are not known: {why})"),
            ),
            format!("{object}: toolkit off while the device plugin stays enabled"),
        ));
    }
}
