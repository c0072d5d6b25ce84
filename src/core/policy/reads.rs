//! Which labels the decision reads: the webhook copies only these from a reviewed Node, and the
//! fleet's compact node records keep only these.

use crate::core::facts::ClusterFacts;
use crate::core::operands::{
    DEPLOY_PREFIX, GPU_PRESENT_KEY, NFD_KERNEL_KEY, NFD_NVIDIA_PCI_KEYS, NFD_OS_KEYS, OPERANDS,
};
use crate::core::operator::PASS_READS;

/// Whether [`decide`](super::decide) may read the label `key` under these facts: the deploy labels, the labels
/// that mark a GPU node, those the operator's labelling pass reads (workload, MIG, vGPU host),
/// NFD's OS and kernel labels (which put a node in an NVIDIADriver's pool), and the keys of non-default operand nodeSelectors and of the live DaemonSets' required node affinity. The webhook copies only these from a
/// reviewed Node (a GPU node has ~100 labels; these are 10–20); the tests check that dropping
/// the others never changes a verdict.
pub fn reads_label(key: &str, facts: &ClusterFacts) -> bool {
    reads_label_whatever_the_facts(key)
        || facts.selectors.values().any(|sel| sel.contains_key(key))
        || affinity_keys(facts).any(|k| k == key)
        || foreign_plugin_keys(facts).any(|k| k == key)
}

/// The label keys the placement of device-plugin DaemonSets outside the operator reads.
fn foreign_plugin_keys(facts: &ClusterFacts) -> impl Iterator<Item = &str> {
    facts
        .foreign_plugins
        .known()
        .into_iter()
        .flatten()
        .flat_map(|p| p.label_keys())
}

/// The label keys the live operand DaemonSets' required node affinity reads.
fn affinity_keys(facts: &ClusterFacts) -> impl Iterator<Item = &str> {
    facts
        .templates
        .daemonsets
        .values()
        .filter_map(|p| p.affinity.as_ref())
        .flat_map(|a| a.label_keys())
}

/// The part of [`reads_label`] that holds under any facts: everything but the keys of custom
/// operand nodeSelectors ([`selector_keys`]).
pub fn reads_label_whatever_the_facts(key: &str) -> bool {
    key.starts_with(DEPLOY_PREFIX)
        || key == GPU_PRESENT_KEY
        || NFD_NVIDIA_PCI_KEYS.contains(&key)
        || PASS_READS.contains(&key)
        || NFD_OS_KEYS.contains(&key)
        || key == NFD_KERNEL_KEY
        || OPERANDS
            .iter()
            .any(|info| info.also_selects.is_some_and(|also| also.key == key))
}

/// The label keys of the facts' custom operand nodeSelectors that [`reads_label`] reads beyond
/// [`reads_label_whatever_the_facts`]: a keeper of compact node records must keep these too.
///
/// The NVIDIADriver resources' nodeSelectors count too: GPU-policy changes are decided with
/// them over the records.
pub fn selector_keys(facts: &ClusterFacts) -> std::collections::BTreeSet<String> {
    let drivers = facts.nvidia_drivers.iter().flatten();
    facts
        .selectors
        .values()
        .flat_map(|sel| sel.keys())
        .chain(drivers.flat_map(|d| d.node_selector.iter().flat_map(|s| s.keys())))
        .map(String::as_str)
        .chain(affinity_keys(facts))
        .chain(foreign_plugin_keys(facts))
        .filter(|k| !reads_label_whatever_the_facts(k))
        .map(str::to_owned)
        .collect()
}
