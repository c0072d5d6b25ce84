//! The fleet in compact form: one small record per node holding only the labels the decision
//! reads ([`NodeIndex`]), and one per operator pod holding only what the audit reads
//! ([`PodIndex`]), kept together with what the watch knows of them ([`SharedFleet`]).
//!
//! A GPU node carries ~100 labels and kilobytes of status; the decision reads 10–20 of its
//! labels ([`policy::reads_label`](crate::core::policy::reads_label)). Each record keeps those
//! ([`LabelFilter`]), with every key and value interned (a fleet shares its keys and nearly all
//! its values), so a node costs a few hundred bytes whatever its size on the wire. Pure data:
//! the watches in `serve` feed it.
//!
//! Both indexes say which nodes a change touched ([`Dirty`]), so that the audit re-runs over
//! those nodes only; a node status heartbeat, which changes no label read, touches none.

use std::collections::BTreeSet;

mod dirty;
mod filter;
mod groups;
mod interner;
mod nodes;
mod pods;

pub use dirty::Dirty;
pub use filter::LabelFilter;
pub use groups::NodeGroups;
pub use interner::Sym;
pub use nodes::{NodeIndex, NodeRecord};
pub use pods::PodIndex;

/// The node records every replica keeps, shared by the node follower (which writes them), the
/// auditor and the policy decisions (which read them). A decision copies what it reads out of
/// the lock ([`SharedFleet::node_groups`]) and decides without holding it.
#[derive(Debug)]
pub struct SharedFleet {
    state: std::sync::Mutex<FleetState>,
    /// Woken when a node's record changed.
    pub changed: tokio::sync::Notify,
    /// Woken when a decision asked for label keys the records do not keep
    /// ([`SharedFleet::request_keys`]).
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

/// How many label keys decisions may add to what the node records keep ([`SharedFleet::request_keys`]).
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

impl Default for SharedFleet {
    fn default() -> Self {
        SharedFleet {
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

impl SharedFleet {
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

    /// What a policy decision reads of the records, copied out under the lock, which is
    /// released before anything is decided ([`NodeGroups`] says what is copied); or why the
    /// records cannot be taken as the fleet now ([`FleetState::blind`]).
    pub fn node_groups(&self, now: std::time::Instant) -> Result<NodeGroups, String> {
        let state = self.lock();
        match state.blind(now) {
            Some(why) => Err(why),
            None => Ok(NodeGroups::copy(&state.nodes)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requested_keys_are_bounded_and_kept_ones_not_requested() {
        let fleet = SharedFleet::default();
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
        let fleet = SharedFleet::default();
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
}
