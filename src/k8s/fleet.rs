//! The fleet in compact form: one small record per node holding only the labels the decision
//! reads, and one per operator pod holding only what the audit reads.
//!
//! A GPU node carries ~100 labels and kilobytes of status; the decision reads 10–20 of its
//! labels ([`policy::reads_label`]). Each record keeps those, with every key and value interned
//! (a fleet shares its keys and nearly all its values), so a node costs a few hundred bytes
//! whatever its size on the wire. Pure data: the watches in `serve` feed it.
//!
//! Both indexes say which nodes a change touched, so that the audit re-runs over those nodes
//! only; a node status heartbeat, which changes no label read, touches none.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, btree_map};
use std::sync::Arc;

use crate::core::facts::ClusterFacts;
use crate::core::operands::{Labels, Operand, OperandSet};
use crate::core::policy;
use crate::k8s::daemonset::{is_daemonset_pod, operand_of_pod};
use crate::k8s::node::NodeView;
use crate::k8s::pod::{PodOnNode, PodPhase, PodView};

/// An interned string.
pub type Sym = Arc<str>;

/// Interned strings, shared by the records. Strings no record uses any more are dropped when
/// the table has doubled since the last sweep, so it stays in proportion to what is in use.
#[derive(Debug, Default)]
struct Interner {
    set: HashSet<Sym>,
    swept_at: usize,
}

impl Interner {
    /// Below this many strings the table is never swept.
    const FLOOR: usize = 1024;

    fn get(&mut self, s: &str) -> Sym {
        if let Some(sym) = self.set.get(s) {
            return sym.clone();
        }
        let sym: Sym = Arc::from(s);
        self.set.insert(sym.clone());
        sym
    }

    fn sweep_if_grown(&mut self) {
        if self.set.len() > 2 * self.swept_at.max(Self::FLOOR) {
            self.set.retain(|s| Arc::strong_count(s) > 1);
            self.swept_at = self.set.len();
        }
    }

    fn len(&self) -> usize {
        self.set.len()
    }
}

/// Which labels a node record keeps: those the decision reads under any facts, and the keys of
/// the cluster's custom operand nodeSelectors.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelFilter {
    selector_keys: BTreeSet<String>,
}

impl LabelFilter {
    pub fn new(facts: &ClusterFacts) -> LabelFilter {
        LabelFilter {
            selector_keys: policy::selector_keys(facts),
        }
    }

    pub fn keeps(&self, key: &str) -> bool {
        policy::reads_label_whatever_the_facts(key) || self.selector_keys.contains(key)
    }

    /// Whether records kept under `self` hold every label `other` would keep: when they do
    /// not, the nodes must be read again.
    pub fn covers(&self, other: &LabelFilter) -> bool {
        other.selector_keys.is_subset(&self.selector_keys)
    }

    /// The selector keys `other` keeps and `self` does not.
    pub fn missing_from(&self, other: &LabelFilter) -> Vec<String> {
        other
            .selector_keys
            .difference(&self.selector_keys)
            .cloned()
            .collect()
    }

    /// This filter, keeping `keys` too.
    pub fn with_keys<'a>(&self, keys: impl IntoIterator<Item = &'a String>) -> LabelFilter {
        let mut wider = self.clone();
        wider.selector_keys.extend(keys.into_iter().cloned());
        wider
    }

    /// What both keep.
    pub fn union(&self, other: &LabelFilter) -> LabelFilter {
        LabelFilter {
            selector_keys: self
                .selector_keys
                .union(&other.selector_keys)
                .cloned()
                .collect(),
        }
    }
}

/// A node's labels that the decision reads, sorted by key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeRecord {
    labels: Box<[(Sym, Sym)]>,
}

impl NodeRecord {
    /// The kept labels as the decision's label map.
    pub fn labels(&self) -> Labels {
        self.labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }
}

/// A record's identity: the addresses of its interned strings. Records of one index share
/// the strings of equal text, so equal records have equal keys.
#[derive(Debug, PartialEq, Eq, Hash)]
struct RecordKey(Vec<(usize, usize)>);

impl RecordKey {
    fn of(record: &NodeRecord) -> RecordKey {
        RecordKey(
            record
                .labels
                .iter()
                .map(|(k, v)| {
                    (
                        Arc::as_ptr(k).cast::<u8>() as usize,
                        Arc::as_ptr(v).cast::<u8>() as usize,
                    )
                })
                .collect(),
        )
    }
}

/// Every node of the cluster as a [`NodeRecord`], by name.
#[derive(Debug, Default)]
pub struct NodeIndex {
    filter: LabelFilter,
    records: BTreeMap<Box<str>, NodeRecord>,
    /// Filled while a re-list runs; replaces `records` when it completes.
    relist: Option<BTreeMap<Box<str>, NodeRecord>>,
    strings: Interner,
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
        NodeRecord {
            labels: labels.into_boxed_slice(),
        }
    }

    /// A node was added or changed: true when its record changed (a heartbeat gives false).
    pub fn apply(&mut self, node: &NodeView) -> bool {
        let record = self.record(node);
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
        self.strings.sweep_if_grown();
        known
    }

    /// A re-list starts; the records stay in use until [`Self::finish_relist`].
    pub fn start_relist(&mut self) {
        self.relist = Some(BTreeMap::new());
    }

    /// One node of the re-list.
    pub fn relist_apply(&mut self, node: &NodeView) {
        let record = self.record(node);
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
        self.strings.sweep_if_grown();
        changed
    }
}

/// Which nodes changed since the last pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dirty {
    /// Every node (a re-list, a new holder, a change too large to track by name).
    All,
    Nodes(BTreeSet<Box<str>>),
}

impl Default for Dirty {
    fn default() -> Self {
        Dirty::Nodes(BTreeSet::new())
    }
}

impl Dirty {
    /// Past this many names a change is tracked as [`Dirty::All`]: re-auditing every node then
    /// costs about what the names would, and memory stays bounded.
    pub const MAX_NAMES: usize = 4096;

    pub fn add(&mut self, name: &str) {
        if let Dirty::Nodes(names) = self {
            if names.len() >= Self::MAX_NAMES {
                *self = Dirty::All;
            } else if !names.contains(name) {
                names.insert(name.into());
            }
        }
    }

    pub fn merge(&mut self, other: Dirty) {
        match other {
            Dirty::All => *self = Dirty::All,
            Dirty::Nodes(names) => {
                for name in &names {
                    self.add(name);
                }
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        matches!(self, Dirty::Nodes(names) if names.is_empty())
    }
}

/// The node records every replica keeps, shared by the node follower (which writes them), the
/// auditor and the webhook's policy decisions (which read them).
#[derive(Debug)]
pub struct Fleet {
    state: std::sync::Mutex<FleetState>,
    /// Woken when a node's record changed.
    pub changed: tokio::sync::Notify,
    /// Woken when a decision asked for label keys the records do not keep
    /// ([`Fleet::request_keys`]).
    pub keys_wanted: tokio::sync::Notify,
}

#[derive(Debug)]
pub struct FleetState {
    pub nodes: NodeIndex,
    /// Nodes changed since the auditor last looked.
    pub dirty: Dirty,
    /// The nodes have been listed: the records are the whole fleet.
    pub synced: bool,
    /// Why the records may no longer be the fleet: the trouble, when it began and when it was
    /// last seen; `None` while the watch follows.
    pub trouble: Option<(Trouble, std::time::Instant, std::time::Instant)>,
    /// Label keys decisions asked the records to keep besides what the facts' selectors read:
    /// an NVIDIADriver refused because its nodeSelector reads a label not kept yet is judged on
    /// that label when it is sent again. At most [`MAX_REQUESTED_KEYS`].
    pub requested_keys: BTreeSet<String>,
}

/// How many label keys decisions may add to what the node records keep ([`Fleet::request_keys`]).
pub const MAX_REQUESTED_KEYS: usize = 64;

/// How the node watch is failing.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Trouble {
    /// 403: RBAC no longer lets this replica read the nodes. Until a list succeeds again the
    /// records are as blind as before the first one.
    Forbidden,
    /// The watch is interrupted (the API server restarts, the network drops); the watcher
    /// resumes where it was, so the records are stale only for as long as this lasts.
    Interrupted,
}

/// How long an interrupted node watch leaves the records usable for a decision: beyond that
/// a decision that needs the fleet takes it as unknown.
pub const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(30);

/// How long after its last error an interrupted watch counts as resumed even though no event
/// came: the watch retries at least every 5.25 s while it fails (`serve::watch`'s `Retry`), and
/// a resumed watch of a quiet fleet may bring no event for minutes.
pub const RESUMED_AFTER: std::time::Duration = std::time::Duration::from_secs(15);

impl FleetState {
    /// Why the records cannot be taken as the fleet now; `None` when they can.
    pub fn blind(&self, now: std::time::Instant) -> Option<String> {
        if !self.synced {
            return Some("the nodes are not listed yet".to_owned());
        }
        match self.trouble {
            Some((Trouble::Forbidden, ..)) => {
                Some("RBAC forbids this replica to list the nodes".to_owned())
            }
            Some((Trouble::Interrupted, since, last))
                if last.duration_since(since) >= STALE_AFTER
                    && now.duration_since(last) < RESUMED_AFTER =>
            {
                Some(format!(
                    "the node watch has been failing for {}s",
                    now.duration_since(since).as_secs()
                ))
            }
            _ => None,
        }
    }

    /// An event came: an interrupted watch follows again (access lost waits for a full list).
    pub fn resumed(&mut self) {
        if matches!(self.trouble, Some((Trouble::Interrupted, ..))) {
            self.trouble = None;
        }
    }

    /// Records the watch's trouble (`None`: it follows again), keeping when it began.
    pub fn set_trouble(&mut self, trouble: Option<Trouble>, now: std::time::Instant) {
        self.trouble = match (trouble, self.trouble) {
            (None, _) => None,
            (Some(t), Some((was, since, _))) if t == was => Some((was, since, now)),
            (Some(t), _) => Some((t, now, now)),
        };
    }
}

impl Default for Fleet {
    fn default() -> Self {
        Fleet {
            state: std::sync::Mutex::new(FleetState {
                nodes: NodeIndex::default(),
                dirty: Dirty::All,
                synced: false,
                trouble: None,
                requested_keys: BTreeSet::new(),
            }),
            changed: tokio::sync::Notify::new(),
            keys_wanted: tokio::sync::Notify::new(),
        }
    }
}

impl Fleet {
    pub fn lock(&self) -> std::sync::MutexGuard<'_, FleetState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Asks the node follower to keep `keys` in the records too (read at once from the nodes
    /// that carry them). Returns the keys it will not read: past [`MAX_REQUESTED_KEYS`].
    pub fn request_keys<'a>(&self, keys: impl IntoIterator<Item = &'a str>) -> Vec<String> {
        let mut state = self.lock();
        let mut added = false;
        let mut refused = Vec::new();
        for key in keys {
            if state.nodes.filter().keeps(key) || state.requested_keys.contains(key) {
                continue;
            }
            if state.requested_keys.len() >= MAX_REQUESTED_KEYS {
                refused.push(key.to_owned());
                continue;
            }
            state.requested_keys.insert(key.to_owned());
            added = true;
        }
        drop(state);
        if added {
            self.keys_wanted.notify_one();
        }
        refused
    }
}

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
    use crate::audit::audit;
    use crate::core::facts::operator_defaults;
    use crate::k8s::read;

    #[test]
    fn requested_keys_are_bounded_and_kept_ones_not_requested() {
        let fleet = Fleet::default();
        assert!(fleet.request_keys(["nvidia.com/gpu.present"]).is_empty());
        assert!(fleet.lock().requested_keys.is_empty(), "kept already");
        let keys: Vec<String> = (0..MAX_REQUESTED_KEYS + 2)
            .map(|i| format!("example.com/k{i}"))
            .collect();
        let refused = fleet.request_keys(keys.iter().map(String::as_str));
        assert_eq!(refused, ["example.com/k64", "example.com/k65"]);
        assert_eq!(fleet.lock().requested_keys.len(), MAX_REQUESTED_KEYS);
        // Asked again: nothing new, nothing refused that was taken.
        assert_eq!(fleet.request_keys(["example.com/k0"]), Vec::<String>::new());
    }

    #[test]
    fn records_are_blind_before_a_list_under_a_403_and_after_a_long_failure() {
        use std::time::{Duration, Instant};
        let fleet = Fleet::default();
        let mut state = fleet.lock();
        let t0 = Instant::now();
        assert_eq!(
            state.blind(t0).as_deref(),
            Some("the nodes are not listed yet")
        );
        state.synced = true;
        assert_eq!(state.blind(t0), None);
        // Access lost: as blind as before the first list, until a list succeeds.
        state.set_trouble(Some(Trouble::Forbidden), t0);
        state.resumed();
        assert_eq!(
            state.blind(t0 + Duration::from_secs(600)).as_deref(),
            Some("RBAC forbids this replica to list the nodes")
        );
        state.set_trouble(None, t0);
        // Interrupted: usable for STALE_AFTER, then blind while the errors go on.
        state.set_trouble(Some(Trouble::Interrupted), t0);
        let later = t0 + STALE_AFTER + Duration::from_secs(1);
        assert_eq!(state.blind(later), None, "one error is not a broken watch");
        state.set_trouble(Some(Trouble::Interrupted), later);
        assert_eq!(
            state.blind(later).as_deref(),
            Some("the node watch has been failing for 31s")
        );
        // No error for RESUMED_AFTER: the watch resumed, though no event came.
        assert_eq!(state.blind(later + RESUMED_AFTER), None);
        // An event: followed again.
        state.set_trouble(Some(Trouble::Interrupted), later);
        state.resumed();
        assert_eq!(state.trouble, None);
    }

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
