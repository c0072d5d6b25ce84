//! The fleet rules on a ClusterPolicy's switches: what turning the toolkit, the device plugin,
//! the NVIDIADriver hand-over, NRI or the sandbox workloads on or off does on the nodes.

use std::collections::{BTreeMap, BTreeSet};

use super::{finding, name_nodes, plural};
use crate::core::echo::echo;
use crate::core::facts::{ClusterFacts, PolicySource};
use crate::core::nvidia_driver::NvidiaDriver;
use crate::core::operands::Operand;
use crate::core::policy_change::model::{HOST_TOOLKIT_ANNOTATION, Outcome};
use crate::core::rules::{Found, Rule};

pub(super) fn toolkit_on_nodes(
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

/// Without the nodes, what the policy alone says: the toolkit switched off while the device
/// plugin stays enabled is refused (it runs wherever its label is).
pub(super) fn toolkit_blind(
    object: &str,
    before: &ClusterFacts,
    after: &ClusterFacts,
    why: &str,
    out: &mut Vec<Found>,
) {
    if before.toolkit_managed
        && !after.toolkit_managed
        && !after.off().contains(Operand::DevicePlugin)
    {
        out.push(finding(
            Rule::ToolkitSwitchedOff,
            toolkit_message(
                object,
                &format!("wherever its deploy label is (the nodes are not known: {why})"),
            ),
            format!("{object}: toolkit off while the device plugin stays enabled"),
        ));
    }
}

/// §11.6: `devicePlugin.enabled` true -> false. Consistent (nothing runs without the toolkit),
/// but every node it ran on stops advertising its GPUs.
pub(super) fn device_plugin_stops(
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
pub(super) fn driver_back_where_served(
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
    let mut serving = BTreeSet::new();
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
    let resources = echo(&serving.into_iter().collect::<Vec<_>>().join(", ")).into_owned();
    let kept = if after.operator.era().disables_nvidia_drivers_when_crd_off() {
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
pub(super) fn runtime_classes_deleted(
    object: &str,
    before: &ClusterFacts,
    after: &ClusterFacts,
    outcomes: &[Outcome<'_, '_>],
    out: &mut Vec<Found>,
) {
    let nri_era = after.operator.era().nri_plugin_deletes_runtime_classes();
    let toolkit = outcomes
        .iter()
        .filter(|o| o.after.contains(Operand::ContainerToolkit))
        .map(|o| o.group.nodes.len())
        .sum::<usize>();
    if !nri_era || before.nri_plugin || !after.nri_plugin {
        // Without NRI, CDI on -> off deletes the two CDI RuntimeClasses at every version
        // (`RuntimeClasses`, `docs/gpu-operator.md` §11.6); they exist only under a
        // ClusterPolicy that had CDI on.
        let existed =
            matches!(before.source, PolicySource::Found(_)) && !(nri_era && before.nri_plugin);
        if existed && before.cdi_enabled() && !after.cdi_enabled() {
            cdi_classes_deleted(object, before, toolkit, out);
        }
        return;
    }
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

/// `spec.cdi.enabled` true -> false (or absent -> false where the version's default is on).
fn cdi_classes_deleted(object: &str, before: &ClusterFacts, toolkit: usize, out: &mut Vec<Found>) {
    let was = match before.cdi {
        Some(_) => "true".to_owned(),
        None => format!(
            "unset (on by default in GPU Operator {}, as from v25.10)",
            before.operator.version
        ),
    };
    out.push(finding(
        Rule::RuntimeClassesRemoved,
        format!(
            "{object}: spec.cdi.enabled {was} -> false switches CDI off: the GPU Operator deletes the RuntimeClasses nvidia-cdi and \
             nvidia-legacy, and from then on the API server refuses every pod that names one of them (running ones keep running); \
             the container toolkit, device plugin and MIG manager DaemonSets roll on {toolkit} {} as their CDI settings change. Move \
             workloads off runtimeClassName nvidia-cdi and nvidia-legacy first.",
            plural(toolkit)
        ),
        format!(
            "{object}: CDI off deletes the nvidia-cdi and nvidia-legacy RuntimeClasses; pods naming them are refused from then on"
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

pub(super) fn sandbox_swaps(
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
