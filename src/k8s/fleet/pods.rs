//! The operator namespace's pods as the audit reads them ([`PodIndex`]).

use std::collections::{BTreeMap, HashMap, btree_map};

use super::interner::{Interner, Sym};
use crate::core::operands::{Operand, OperandSet};
use crate::k8s::daemonset::{is_daemonset_pod, operand_of_pod};
use crate::k8s::pod::{PodOnNode, PodPhase, PodView};

/// A pod's name as its generateName prefix, interned (every pod of a DaemonSet shares it), and
/// its short random suffix, inline: a DaemonSet pod's name costs no allocation of its own. A
/// name without such a suffix is all prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
struct PodName {
    prefix: Sym,
    suffix_len: u8,
    suffix: [u8; PodName::SUFFIX],
}

impl PodName {
    /// The longest suffix kept inline, its dash included (a DaemonSet pod's is 6 bytes): 12
    /// keeps a record at 32 bytes.
    const SUFFIX: usize = 12;

    fn new(name: &str, strings: &mut Interner) -> PodName {
        let mut suffix = [0; Self::SUFFIX];
        match name.rfind('-') {
            Some(at) if name.len() - at <= Self::SUFFIX => {
                let tail = &name.as_bytes()[at..];
                suffix[..tail.len()].copy_from_slice(tail);
                PodName {
                    prefix: strings.get(&name[..at]),
                    // At most SUFFIX: fits.
                    suffix_len: tail.len() as u8,
                    suffix,
                }
            }
            _ => PodName {
                prefix: strings.get(name),
                suffix_len: 0,
                suffix,
            },
        }
    }

    fn suffix(&self) -> &str {
        // Cut from a `str` at a `-` (ASCII), so always whole characters.
        std::str::from_utf8(&self.suffix[..usize::from(self.suffix_len)]).unwrap_or_default()
    }

    fn is(&self, name: &str) -> bool {
        name.strip_prefix(&*self.prefix) == Some(self.suffix())
    }

    fn text(&self) -> String {
        format!("{}{}", self.prefix, self.suffix())
    }
}

/// What the audit keeps of one operator pod.
#[derive(Clone, Debug, PartialEq, Eq)]
struct PodRecord {
    name: PodName,
    operand: Option<Operand>,
    phase: PodPhase,
    /// Owned by a DaemonSet, or labelled like an operand's (the matrix's `TOTAL_PODS`).
    daemonset_pod: bool,
}

/// The operator namespace's pods as the audit reads them, indexed by node: about 40 bytes a
/// pod. A pod is found by its node (`spec.nodeName`, set once and never changed, and carried by
/// every event of the pod, its deletion included) and then by name among that node's few pods.
#[derive(Debug, Default)]
pub struct PodIndex {
    /// Scheduled pods, by node.
    by_node: HashMap<Sym, Vec<PodRecord>>,
    /// Pods not scheduled yet.
    unscheduled: Vec<PodRecord>,
    /// Pods per operand (any node, scheduled or not).
    per_operand: BTreeMap<Operand, usize>,
    running_daemonset_pods: usize,
    /// Filled while a re-list runs; replaces the rest when it completes.
    relist: Option<Box<PodIndex>>,
    strings: Interner,
}

impl PodIndex {
    pub fn is_empty(&self) -> bool {
        self.by_node.is_empty() && self.unscheduled.is_empty()
    }

    /// The operands that have at least one pod.
    pub fn seen(&self) -> OperandSet {
        self.per_operand.keys().copied().collect()
    }

    /// Running DaemonSet pods in the namespace.
    pub fn running_daemonset_pods(&self) -> usize {
        self.running_daemonset_pods
    }

    /// The operand pods scheduled on `node`, sorted by name.
    pub fn on_node(&self, node: &str) -> Vec<PodOnNode<'static>> {
        let mut out: Vec<PodOnNode<'static>> = self
            .by_node
            .get(node)
            .into_iter()
            .flatten()
            .filter_map(|pod| {
                Some(PodOnNode {
                    operand: pod.operand?,
                    name: pod.name.text().into(),
                    phase: pod.phase,
                })
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Removes the pod `name` of `node` (or not scheduled, or just scheduled there); returns
    /// its record and the node it was on.
    fn forget(&mut self, name: &str, node: Option<&str>) -> Option<(PodRecord, Option<Sym>)> {
        let mut found = None;
        if let Some(node) = node
            && let Some((key, pods)) = self.by_node.get_key_value(node)
            && let Some(at) = pods.iter().position(|p| p.name.is(name))
        {
            let key = key.clone();
            let pods = self.by_node.get_mut(node)?;
            let old = pods.swap_remove(at);
            if pods.is_empty() {
                self.by_node.remove(node);
            } else if pods.capacity() > 2 * pods.len() {
                pods.shrink_to_fit();
            }
            found = Some((old, Some(key)));
        } else if let Some(at) = self.unscheduled.iter().position(|p| p.name.is(name)) {
            found = Some((self.unscheduled.swap_remove(at), None));
        }
        let (old, _) = found.as_ref()?;
        if let Some(op) = old.operand
            && let btree_map::Entry::Occupied(mut e) = self.per_operand.entry(op)
        {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
        if old.daemonset_pod && old.phase == PodPhase::Running {
            self.running_daemonset_pods -= 1;
        }
        found
    }

    fn insert(&mut self, pod: &PodView) -> (PodRecord, Option<Sym>) {
        let record = PodRecord {
            name: PodName::new(pod.name(), &mut self.strings),
            operand: operand_of_pod(pod),
            phase: pod.phase,
            daemonset_pod: is_daemonset_pod(pod),
        };
        if let Some(op) = record.operand {
            *self.per_operand.entry(op).or_default() += 1;
        }
        if record.daemonset_pod && record.phase == PodPhase::Running {
            self.running_daemonset_pods += 1;
        }
        let node = pod.node.as_deref().map(|n| self.strings.get(n));
        match &node {
            Some(node) => self
                .by_node
                .entry(node.clone())
                .or_default()
                .push(record.clone()),
            None => self.unscheduled.push(record.clone()),
        }
        (record, node)
    }

    /// A pod was added or changed. Returns the nodes whose audit it may change (its node
    /// before and after); none when nothing the audit reads changed.
    pub fn apply(&mut self, pod: &PodView) -> Vec<Sym> {
        let old = self.forget(pod.name(), pod.node.as_deref());
        let new = self.insert(pod);
        self.strings.sweep_if_grown();
        if old.as_ref() == Some(&new) {
            return Vec::new();
        }
        touched(old.as_ref(), Some(&new))
    }

    /// A pod was deleted (its last state, as the watch gives it): the node it was on.
    pub fn delete(&mut self, pod: &PodView) -> Vec<Sym> {
        let old = self.forget(pod.name(), pod.node.as_deref());
        self.strings.sweep_if_grown();
        touched(old.as_ref(), None)
    }

    pub fn start_relist(&mut self) {
        self.relist = Some(Box::default());
    }

    /// One pod of the re-list.
    pub fn relist_apply(&mut self, pod: &PodView) {
        self.relist.get_or_insert_with(Box::default).insert(pod);
    }

    /// The re-list is complete: it replaces every pod.
    pub fn finish_relist(&mut self) {
        let mut next = self.relist.take().unwrap_or_default();
        for pods in next.by_node.values_mut() {
            pods.shrink_to_fit();
        }
        next.unscheduled.shrink_to_fit();
        *self = *next;
    }
}

fn touched(
    old: Option<&(PodRecord, Option<Sym>)>,
    new: Option<&(PodRecord, Option<Sym>)>,
) -> Vec<Sym> {
    let mut nodes: Vec<Sym> = old
        .into_iter()
        .chain(new)
        .filter(|(p, _)| p.operand.is_some())
        .filter_map(|(_, node)| node.clone())
        .collect();
    nodes.dedup();
    nodes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_are_indexed_by_node_and_counted() {
        let mut pods = PodIndex::default();
        let mk = |name: &str, node: Option<&str>, phase: PodPhase| {
            let mut p = PodView {
                node: node.map(str::to_owned),
                phase,
                daemonset: Some("nvidia-device-plugin-daemonset".to_owned()),
                owned: true,
                ..PodView::default()
            };
            p.metadata.name = Some(name.to_owned());
            p
        };
        let names =
            |nodes: Vec<Sym>| -> Vec<String> { nodes.iter().map(|s| s.to_string()).collect() };
        // Created, not scheduled yet: counted, on no node.
        let p1 = "nvidia-device-plugin-daemonset-x7k2q";
        assert!(pods.apply(&mk(p1, None, PodPhase::Pending)).is_empty());
        assert!(pods.seen().contains(Operand::DevicePlugin));
        assert!(!pods.is_empty());
        // Bound to b: b's audit changes, and the pod is no longer unscheduled.
        assert_eq!(
            names(pods.apply(&mk(p1, Some("b"), PodPhase::Pending))),
            ["b"]
        );
        assert_eq!(pods.unscheduled.len(), 0);
        assert_eq!(pods.running_daemonset_pods(), 0);
        assert!(pods.apply(&mk(p1, Some("b"), PodPhase::Pending)).is_empty());
        assert_eq!(
            names(pods.apply(&mk(p1, Some("b"), PodPhase::Running))),
            ["b"]
        );
        assert!(pods.on_node("a").is_empty());
        assert_eq!(pods.on_node("b")[0].name, p1);
        assert_eq!(pods.running_daemonset_pods(), 1);
        // A pod of a name with no short suffix, and one with no dash at all, keep their names.
        let long = "gpu-operator-node-feature-discovery-worker-averyverylongsuffix";
        let plain = "nodashes";
        pods.apply(&mk(long, Some("b"), PodPhase::Running));
        pods.apply(&mk(plain, Some("b"), PodPhase::Running));
        let on_b: Vec<String> = pods
            .on_node("b")
            .iter()
            .map(|p| p.name.to_string())
            .collect();
        assert_eq!(on_b, [long, plain, p1], "sorted by name");
        assert_eq!(
            names(pods.delete(&mk(long, Some("b"), PodPhase::Running))),
            ["b"]
        );
        assert_eq!(
            names(pods.delete(&mk(plain, Some("b"), PodPhase::Running))),
            ["b"]
        );
        // Deleted: the event carries its node.
        assert_eq!(
            names(pods.delete(&mk(p1, Some("b"), PodPhase::Running))),
            ["b"]
        );
        assert!(
            pods.delete(&mk(p1, Some("b"), PodPhase::Running))
                .is_empty()
        );
        assert!(pods.seen().is_empty());
        assert_eq!(pods.running_daemonset_pods(), 0);
        assert!(pods.is_empty());
    }
}
