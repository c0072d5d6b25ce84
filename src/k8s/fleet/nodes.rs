//! Every node as a small record of the labels the decision reads and of its taints
//! ([`NodeIndex`]).

use std::collections::{BTreeMap, HashMap, btree_map};
use std::sync::Arc;
use std::time::SystemTime;

use super::filter::LabelFilter;
use super::interner::{Interner, Sym};
use crate::core::advertised::Advertised;
use crate::core::lasting::{self, Lasting, StuckAfter};
use crate::core::operands::Labels;
use crate::core::placement::{Effect, MAX_TAINTS, NodePlacement, Taint};
use crate::k8s::node::NodeView;

/// A node's labels that the decision reads, sorted by key, and what placement reads of it:
/// its taints and its cordon. All taints are kept, those of a passing condition too: the audit
/// says what the controller does now, and a decision reads what lasts
/// ([`NodePlacement::lasting`]). And the NVIDIA GPUs its status advertises, which change when a
/// device plugin registers or its devices' health changes, never with a status heartbeat.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeRecord {
    labels: Box<[(Sym, Sym)]>,
    taints: Box<[(Sym, Sym, Effect)]>,
    unschedulable: bool,
    advertised: Option<Advertised>,
}

impl NodeRecord {
    /// The kept labels as the decision's label map.
    pub fn labels(&self) -> Labels {
        self.labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// The kept taints and cordon as placement reads them.
    pub fn placement(&self) -> NodePlacement {
        NodePlacement {
            taints: self
                .taints
                .iter()
                .map(|(k, v, e)| Taint::new(k, v, *e))
                .collect(),
            unschedulable: self.unschedulable,
        }
    }

    /// What the node's status advertises of NVIDIA GPUs (`None`: no status read).
    pub fn advertised(&self) -> Option<Advertised> {
        self.advertised
    }
}

/// A record's identity: the addresses of its interned strings (labels, then taints), the
/// taints' effects, its cordon and its advertised GPUs. Records of one index share the strings of equal text, so
/// equal records have equal keys.
#[derive(Debug, PartialEq, Eq, Hash)]
struct RecordKey {
    labels: Vec<(usize, usize)>,
    taints: Vec<(usize, usize, Effect)>,
    unschedulable: bool,
    advertised: Option<Advertised>,
}

impl RecordKey {
    fn of(record: &NodeRecord) -> RecordKey {
        let addr = |s: &Sym| Arc::as_ptr(s).cast::<u8>() as usize;
        RecordKey {
            labels: record
                .labels
                .iter()
                .map(|(k, v)| (addr(k), addr(v)))
                .collect(),
            taints: record
                .taints
                .iter()
                .map(|(k, v, e)| (addr(k), addr(v), *e))
                .collect(),
            unschedulable: record.unschedulable,
            advertised: record.advertised,
        }
    }
}

/// Every node of the cluster as a [`NodeRecord`], by name, and when each of its timed labels
/// ([`lasting::timed`]) was first seen with its value.
#[derive(Debug, Default)]
pub struct NodeIndex {
    filter: LabelFilter,
    records: BTreeMap<Box<str>, NodeRecord>,
    /// Filled while a re-list runs; replaces `records` when it completes.
    relist: Option<BTreeMap<Box<str>, NodeRecord>>,
    /// Only nodes with a timed label have an entry: key, value, Unix seconds first seen. A
    /// node holds at most one per kept deploy label and [`lasting::STATE_KEYS`].
    clocks: HashMap<Box<str>, Clock>,
    relist_clocks: Option<HashMap<Box<str>, Clock>>,
    strings: Interner,
}

type Clock = Box<[(Sym, Sym, u64)]>;

/// The record's timed labels, each with when it was first seen: kept from `before` when the
/// value is the same, `now` when it is new. `None` when nothing is timed.
fn clock(record: &NodeRecord, before: Option<&Clock>, now: u64) -> Option<Clock> {
    let timed: Vec<(Sym, Sym, u64)> = record
        .labels
        .iter()
        .filter(|(k, v)| lasting::timed(k, v))
        .map(|(k, v)| {
            let since = before
                .and_then(|c| c.iter().find(|(bk, bv, _)| bk == k && bv == v))
                .map_or(now, |(_, _, since)| *since);
            (k.clone(), v.clone(), since)
        })
        .collect();
    (!timed.is_empty()).then(|| timed.into_boxed_slice())
}

impl NodeIndex {
    pub fn new(filter: LabelFilter) -> NodeIndex {
        NodeIndex {
            filter,
            ..NodeIndex::default()
        }
    }

    pub fn filter(&self) -> &LabelFilter {
        &self.filter
    }

    /// Records made from now on keep what `filter` keeps; those made before stay as they are
    /// until the nodes are listed again.
    pub fn set_filter(&mut self, filter: LabelFilter) {
        self.filter = filter;
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    pub fn get(&self, name: &str) -> Option<&NodeRecord> {
        self.records.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.records.keys().map(|k| &**k)
    }

    /// The nodes grouped by identical records: a fleet has few distinct label sets, so a decision
    /// over every node is made once per group. Groups and their names come sorted.
    pub fn groups(&self) -> Vec<(&NodeRecord, Vec<&str>)> {
        let mut by_record: HashMap<RecordKey, (&NodeRecord, Vec<&str>)> = HashMap::new();
        for (name, record) in &self.records {
            by_record
                .entry(RecordKey::of(record))
                .or_insert_with(|| (record, Vec::new()))
                .1
                .push(name);
        }
        let mut groups: Vec<(&NodeRecord, Vec<&str>)> = by_record.into_values().collect();
        groups.sort_by(|a, b| a.1[0].cmp(b.1[0]));
        groups
    }

    /// Interned strings held (for the tests and the benchmark's accounting).
    pub fn interned(&self) -> usize {
        self.strings.len()
    }

    fn record(&mut self, node: &NodeView) -> NodeRecord {
        let filter = &self.filter;
        let strings = &mut self.strings;
        let labels: Vec<(Sym, Sym)> = node
            .labels()
            .iter()
            .filter(|(k, _)| filter.keeps(k))
            .map(|(k, v)| (strings.get(k), strings.get(v)))
            .collect();
        let placement = &node.placement;
        // The webhook's bound ([`MAX_TAINTS`]): a node past it (none is known) keeps the first.
        if placement.taints.len() > MAX_TAINTS {
            tracing::warn!(
                node = node.name(),
                taints = placement.taints.len(),
                kept = MAX_TAINTS,
                "a node has more taints than its record keeps: placement reads the first ones"
            );
        }
        let taints: Vec<(Sym, Sym, Effect)> = placement
            .taints
            .iter()
            .take(MAX_TAINTS)
            .map(|t| (strings.get(&t.key), strings.get(&t.value), t.effect))
            .collect();
        NodeRecord {
            labels: labels.into_boxed_slice(),
            taints: taints.into_boxed_slice(),
            unschedulable: placement.unschedulable,
            advertised: node.advertised,
        }
    }

    /// A node was added or changed: true when its record changed (a heartbeat gives false).
    pub fn apply(&mut self, node: &NodeView) -> bool {
        self.apply_at(node, lasting::unix_seconds(SystemTime::now()))
    }

    /// [`Self::apply`] at `now` (Unix seconds): a timed label with a new value is first seen
    /// then.
    pub fn apply_at(&mut self, node: &NodeView, now: u64) -> bool {
        let record = self.record(node);
        match clock(&record, self.clocks.get(node.name()), now) {
            Some(c) => {
                self.clocks.insert(node.name().into(), c);
            }
            None => {
                self.clocks.remove(node.name());
            }
        }
        let changed = match self.records.entry(node.name().into()) {
            btree_map::Entry::Occupied(mut e) => {
                if *e.get() == record {
                    false
                } else {
                    e.insert(record);
                    true
                }
            }
            btree_map::Entry::Vacant(e) => {
                e.insert(record);
                true
            }
        };
        self.strings.sweep_if_grown();
        changed
    }

    /// A node was deleted: true when it was known.
    pub fn delete(&mut self, name: &str) -> bool {
        let known = self.records.remove(name).is_some();
        self.clocks.remove(name);
        self.strings.sweep_if_grown();
        known
    }

    /// A re-list starts; the records stay in use until [`Self::finish_relist`].
    pub fn start_relist(&mut self) {
        self.relist = Some(BTreeMap::new());
        self.relist_clocks = Some(HashMap::new());
    }

    /// One node of the re-list.
    pub fn relist_apply(&mut self, node: &NodeView) {
        self.relist_apply_at(node, lasting::unix_seconds(SystemTime::now()));
    }

    /// [`Self::relist_apply`] at `now` (Unix seconds): a timed label whose value the records
    /// already had keeps when it was first seen.
    pub fn relist_apply_at(&mut self, node: &NodeView, now: u64) {
        let record = self.record(node);
        if let Some(c) = clock(&record, self.clocks.get(node.name()), now) {
            self.relist_clocks
                .get_or_insert_with(HashMap::new)
                .insert(node.name().into(), c);
        }
        self.relist
            .get_or_insert_with(BTreeMap::new)
            .insert(node.name().into(), record);
    }

    /// The re-list is complete: it replaces the records. Returns the names of the nodes added,
    /// changed or gone.
    pub fn finish_relist(&mut self) -> Vec<Box<str>> {
        let new = self.relist.take().unwrap_or_default();
        let mut changed: Vec<Box<str>> = self
            .records
            .iter()
            .filter(|(name, old)| new.get(*name) != Some(*old))
            .map(|(name, _)| name.clone())
            .collect();
        changed.extend(
            new.keys()
                .filter(|name| !self.records.contains_key(*name))
                .cloned(),
        );
        self.records = new;
        self.clocks = self.relist_clocks.take().unwrap_or_default();
        self.strings.sweep_if_grown();
        changed
    }

    /// `name`'s timed labels and when each was first seen.
    pub fn lasting(&self, name: &str) -> Vec<Lasting<'_>> {
        self.clocks.get(name).map_or_else(Vec::new, |c| {
            c.iter()
                .map(|(k, v, since)| Lasting {
                    key: k,
                    value: v,
                    since: *since,
                })
                .collect()
        })
    }

    /// Nodes with a timed label whose limit under `limits` ends in `(from, to]` (Unix seconds):
    /// their audit changes with no change of their record.
    pub fn crossed(&self, from: u64, to: u64, limits: &StuckAfter) -> Vec<Box<str>> {
        let mut out: Vec<Box<str>> = self
            .clocks
            .iter()
            .filter(|(_, c)| {
                c.iter().any(|(k, v, since)| {
                    limits.limit(k, v).is_some_and(|limit| {
                        let ends = since.saturating_add(limit.as_secs());
                        from < ends && ends <= to
                    })
                })
            })
            .map(|(name, _)| name.clone())
            .collect();
        out.sort_unstable();
        out
    }

    /// The first end of a timed label's limit under `limits` after `after` (Unix seconds).
    pub fn next_limit_end(&self, after: u64, limits: &StuckAfter) -> Option<u64> {
        self.clocks
            .values()
            .flat_map(|c| c.iter())
            .filter_map(|(k, v, since)| {
                let limit = limits.limit(k, v)?;
                Some(since.saturating_add(limit.as_secs()))
            })
            .filter(|end| *end > after)
            .min()
    }

    /// Nodes with a timed label (for the tests).
    pub fn timed_nodes(&self) -> usize {
        self.clocks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::audit;
    use crate::core::facts::operator_defaults;
    use crate::core::operands::Operand;
    use crate::k8s::fleet::NodeGroups;
    use crate::k8s::pod::PodView;
    use crate::k8s::read;

    /// Every node fixture: the lab's, the published real ones, the large benchmark node.
    fn fixture_nodes() -> Vec<NodeView> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut paths: Vec<std::path::PathBuf> =
            ["tests/fixtures/nodes", "tests/fixtures/real-nodes"]
                .iter()
                .flat_map(|dir| std::fs::read_dir(root.join(dir)).unwrap())
                .map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|x| x == "json" || x == "yaml"))
                .collect();
        paths.push(root.join("benches/fixtures/large-node.json"));
        paths.sort();
        // Named after their files: two published nodes share a name.
        let nodes: Vec<NodeView> = paths
            .iter()
            .map(|p| {
                let mut node = read::node_file(p).unwrap();
                let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
                node.metadata.name = Some(stem);
                node
            })
            .collect();
        assert!(nodes.len() >= 9, "{} fixtures", nodes.len());
        nodes
    }

    fn recorded(index: &NodeIndex, nodes: &[NodeView]) -> Vec<NodeView> {
        nodes
            .iter()
            .map(|n| {
                let mut v = NodeView::default();
                v.metadata.name = n.metadata.name.clone();
                v.metadata.labels = Some(index.get(n.name()).unwrap().labels());
                v.placement = index.get(n.name()).unwrap().placement();
                v
            })
            .collect()
    }

    #[test]
    fn records_give_the_audit_the_whole_nodes_give() {
        let nodes = fixture_nodes();
        let mut facts = operator_defaults();
        for with_selector in [false, true] {
            if with_selector {
                // A DaemonSet selecting a label outside the decision's own set.
                facts.selectors.insert(
                    Operand::DcgmExporter,
                    [("node-role.kubernetes.io/gpu".to_owned(), String::new())].into(),
                );
            }
            let mut index = NodeIndex::new(LabelFilter::new(&facts));
            for n in &nodes {
                index.apply(n);
            }
            let kept: usize = nodes
                .iter()
                .map(|n| index.get(n.name()).unwrap().labels.len())
                .sum();
            let all: usize = nodes.iter().map(|n| n.labels().len()).sum();
            assert!(kept * 3 < all, "records keep {kept} of {all} labels");
            let pods: &[PodView] = &[];
            let policy = crate::core::policy::Policy::default();
            assert_eq!(
                audit(&recorded(&index, &nodes), pods, &facts, &policy),
                audit(&nodes, pods, &facts, &policy),
                "selector: {with_selector}"
            );
            assert_eq!(
                index.filter().keeps("node-role.kubernetes.io/gpu"),
                with_selector
            );
        }
    }

    #[test]
    fn a_wider_filter_covers_a_narrower_one_only() {
        let plain = LabelFilter::new(&operator_defaults());
        let mut facts = operator_defaults();
        facts.selectors.insert(
            Operand::DevicePlugin,
            [("example.com/pool".to_owned(), "gpu".to_owned())].into(),
        );
        let wide = LabelFilter::new(&facts);
        assert!(wide.covers(&plain));
        assert!(!plain.covers(&wide));
        assert!(plain.covers(&plain));
    }

    #[test]
    fn heartbeats_change_nothing_and_interned_strings_stay_in_proportion() {
        let facts = operator_defaults();
        let mut index = NodeIndex::new(LabelFilter::new(&facts));
        let mk = |name: &str, version: &str| {
            let mut n = NodeView::default();
            n.metadata.name = Some(name.to_owned());
            n.metadata.labels = Some(
                [
                    ("nvidia.com/gpu.deploy.driver".to_owned(), "true".to_owned()),
                    // Read by the decision and different on every change: the worst case.
                    (
                        "nvidia.com/vgpu.host-driver-version".to_owned(),
                        version.to_owned(),
                    ),
                    ("kubernetes.io/hostname".to_owned(), name.to_owned()),
                ]
                .into(),
            );
            n
        };
        assert!(index.apply(&mk("a", "1")));
        assert!(!index.apply(&mk("a", "1")), "the same labels again");
        for i in 0..20_000 {
            index.apply(&mk("a", &i.to_string()));
        }
        assert!(
            index.interned() < 3 * Interner::FLOOR,
            "{} strings interned for one node",
            index.interned()
        );
        assert_eq!(index.len(), 1);
        // A re-list names what it changed.
        index.start_relist();
        index.relist_apply(&mk("a", "19999"));
        index.relist_apply(&mk("b", "1"));
        assert_eq!(index.finish_relist(), vec![Box::from("b")]);
        index.start_relist();
        index.relist_apply(&mk("b", "1"));
        assert_eq!(index.finish_relist(), vec![Box::from("a")]);
        assert!(index.get("a").is_none());
    }

    #[test]
    fn records_keep_the_advertised_gpus_and_the_gfd_count() {
        let mut index = NodeIndex::new(LabelFilter::new(&operator_defaults()));
        let mk = |allocatable: &str| -> NodeView {
            serde_json::from_str(&format!(
                r#"{{"metadata":{{"name":"a","labels":{{"nvidia.com/gpu.count":"8"}}}},
                "status":{{"conditions":[{{"type":"Ready","lastHeartbeatTime":"{allocatable}"}}],
                "capacity":{{"nvidia.com/gpu":"8"}},"allocatable":{{"nvidia.com/gpu":"{allocatable}"}}}}}}"#
            ))
            .unwrap()
        };
        assert!(index.apply(&mk("8")));
        let record = index.get("a").unwrap();
        assert_eq!(record.advertised().map(|a| a.allocatable), Some(8));
        assert_eq!(
            record
                .labels()
                .get("nvidia.com/gpu.count")
                .map(String::as_str),
            Some("8")
        );
        assert!(!index.apply(&mk("8")), "a heartbeat");
        // Devices turned unhealthy: the record changes, and so does its group.
        assert!(index.apply(&mk("0")));
        assert!(
            index
                .get("a")
                .unwrap()
                .advertised()
                .unwrap()
                .none_allocatable()
        );
    }

    #[test]
    fn records_keep_taints_and_cordon_and_group_by_them() {
        let facts = operator_defaults();
        let mut index = NodeIndex::new(LabelFilter::new(&facts));
        let mk = |name: &str, taints: &[&str], cordon: bool| {
            let mut n = NodeView::default();
            n.metadata.name = Some(name.to_owned());
            n.metadata.labels =
                Some([("nvidia.com/gpu.deploy.driver".to_owned(), "true".to_owned())].into());
            n.placement.unschedulable = cordon;
            n.placement.taints = taints
                .iter()
                .map(|t| {
                    let (kv, effect) = t.split_once(':').unwrap();
                    let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                    Taint::parse(k, v, effect).unwrap()
                })
                .collect();
            n
        };
        let xid = ["nvidia.com/gpu-xid-error=79:NoExecute"];
        assert!(index.apply(&mk("a", &[], false)));
        assert!(index.apply(&mk("b", &xid, false)));
        assert!(index.apply(&mk("c", &xid, false)));
        assert!(index.apply(&mk("d", &[], true)));
        assert!(!index.apply(&mk("b", &xid, false)), "a heartbeat");
        let b = index.get("b").unwrap().placement();
        assert_eq!(b.taints[0].to_string(), xid[0]);
        assert!(index.get("d").unwrap().placement().unschedulable);
        // The same labels, three placements: three groups, the tainted nodes together.
        let groups: Vec<Vec<&str>> = index.groups().into_iter().map(|(_, n)| n).collect();
        assert_eq!(groups, vec![vec!["a"], vec!["b", "c"], vec!["d"]]);
        // A taint's effect alone changes the record; a condition taint is kept too.
        assert!(index.apply(&mk("c", &["nvidia.com/gpu-xid-error=79:NoSchedule"], false)));
        assert!(index.apply(&mk("a", &["node.kubernetes.io/not-ready:NoExecute"], false)));
        assert_eq!(index.groups().len(), 4);
        assert!(index.apply(&mk("a", &[], false)));
        let copied = NodeGroups::copy(&index);
        let placements: Vec<usize> = copied
            .groups()
            .iter()
            .map(|g| g.placement.taints.len() + usize::from(g.placement.unschedulable))
            .collect();
        assert_eq!(placements, vec![0, 1, 1, 1]);
    }

    #[test]
    fn groups_copied_out_of_the_lock_are_the_index_groups() {
        let nodes = fixture_nodes();
        let mut index = NodeIndex::new(LabelFilter::new(&operator_defaults()));
        for n in &nodes {
            index.apply(n);
        }
        let copied = NodeGroups::copy(&index);
        let groups = copied.groups();
        let direct = index.groups();
        assert_eq!(groups.len(), direct.len());
        for (copy, (record, names)) in groups.iter().zip(&direct) {
            assert_eq!(copy.labels, record.labels());
            assert_eq!(&copy.nodes, names);
        }
        assert_eq!(
            groups.iter().map(|g| g.nodes.len()).sum::<usize>(),
            nodes.len()
        );
        assert!(copied.keeps("nvidia.com/gpu.deploy.driver"));
        assert!(!copied.keeps("kubernetes.io/hostname"));
    }

    #[test]
    fn timed_labels_keep_when_they_were_first_seen() {
        use crate::core::lasting::{DRIVER_UPGRADE_STATE_KEY, MIG_CONFIG_STATE_KEY};
        let mut index = NodeIndex::new(LabelFilter::new(&operator_defaults()));
        let mk = |pairs: &[(&str, &str)]| {
            let mut n = NodeView::default();
            n.metadata.name = Some("a".to_owned());
            n.metadata.labels = Some(crate::core::policy::tests::labels(pairs));
            n
        };
        let paused = [
            ("device-plugin", "paused-for-mig-change"),
            ("dcgm", "paused-for-mig-change"),
            ("container-toolkit", "true"),
            (MIG_CONFIG_STATE_KEY, "pending"),
        ];
        let since = |index: &NodeIndex| -> Vec<(String, String, u64)> {
            index
                .lasting("a")
                .iter()
                .map(|l| (l.key.to_owned(), l.value.to_owned(), l.since))
                .collect()
        };
        assert!(index.apply_at(&mk(&paused), 100));
        let dp = "nvidia.com/gpu.deploy.device-plugin";
        let dcgm = "nvidia.com/gpu.deploy.dcgm";
        let mig = MIG_CONFIG_STATE_KEY;
        let at = |k: &str, v: &str, t| (k.to_owned(), v.to_owned(), t);
        assert_eq!(
            since(&index),
            [
                at(dcgm, "paused-for-mig-change", 100),
                at(dp, "paused-for-mig-change", 100),
                at(mig, "pending", 100)
            ]
        );
        // The MIG state moves on; the pause stays: only the state's clock starts again. An
        // unchanged record (a heartbeat) changes no clock.
        let mut failed = paused;
        failed[3].1 = "failed";
        assert!(index.apply_at(&mk(&failed), 200));
        assert!(!index.apply_at(&mk(&failed), 300));
        assert_eq!(
            since(&index),
            [
                at(dcgm, "paused-for-mig-change", 100),
                at(dp, "paused-for-mig-change", 100),
                at(mig, "failed", 200)
            ]
        );
        // A re-list keeps the clocks of values it finds again.
        index.start_relist();
        index.relist_apply_at(&mk(&failed), 400);
        index.finish_relist();
        assert_eq!(since(&index)[1], at(dp, "paused-for-mig-change", 100));
        // Limits end: the pause (1h) at 3,700, the MIG state has none of its own.
        let limits = StuckAfter::default();
        assert!(index.crossed(0, 3_699, &limits).is_empty());
        assert_eq!(index.next_limit_end(0, &limits), Some(3_700));
        assert_eq!(index.next_limit_end(3_700, &limits), None);
        assert_eq!(index.crossed(3_699, 3_700, &limits), [Box::from("a")]);
        assert!(index.crossed(3_700, 90_000, &limits).is_empty());
        // An upgrade state: its limit is its own (24h).
        let mut upgrading = failed.to_vec();
        upgrading.push((DRIVER_UPGRADE_STATE_KEY, "upgrade-failed"));
        index.apply_at(&mk(&upgrading), 1_000);
        assert!(index.crossed(3_700, 87_399, &limits).is_empty());
        assert_eq!(index.next_limit_end(3_700, &limits), Some(87_400));
        assert_eq!(index.crossed(87_399, 87_400, &limits), [Box::from("a")]);
        // Settled: nothing timed, no entry.
        index.apply_at(
            &mk(&[
                ("device-plugin", "true"),
                (MIG_CONFIG_STATE_KEY, "success"),
                (DRIVER_UPGRADE_STATE_KEY, "upgrade-done"),
            ]),
            2_000,
        );
        assert!(index.lasting("a").is_empty());
        assert_eq!(index.timed_nodes(), 0);
        index.apply_at(&mk(&paused), 3_000);
        assert!(index.delete("a"));
        assert_eq!(index.timed_nodes(), 0, "a deleted node leaves no clock");
    }
}
