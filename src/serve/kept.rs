//! The watched GPU-policy objects of one kind (ClusterPolicies, NVIDIADrivers, GPUClusters),
//! kept as [`PolicyObject`]s: what the decisions read of them and nothing else, so their memory
//! follows the decisions, not the objects' size.
//!
//! Bounded per kind: at most [`Bounds::objects`] objects and [`Bounds::bytes`] of kept fields.
//! Past either the kind counts as unreadable (the decisions that need it refuse what could
//! break nodes), everything kept of it is given back, and it is listed again after a pause.

use std::collections::BTreeMap;
use std::sync::Mutex;

use kube::runtime::watcher::Event;
use serde_json::Value;

use crate::k8s::policy_object::PolicyObject;

/// How much of one kind is kept.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) struct Bounds {
    pub objects: usize,
    pub bytes: usize,
}

/// The operator follows one ClusterPolicy (or GPUCluster); a fleet has a few NVIDIADrivers, one
/// per pool of nodes. The byte bound is far above what these take (a few hundred bytes each).
pub(super) const POLICIES: Bounds = Bounds {
    objects: 16,
    bytes: 1 << 20,
};
pub(super) const DRIVERS: Bounds = Bounds {
    objects: 256,
    bytes: 2 << 20,
};
pub(super) const GPU_CLUSTERS: Bounds = Bounds {
    objects: 16,
    bytes: 1 << 20,
};

/// What one event left.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) enum Fit {
    /// Within the bounds.
    Kept,
    /// Past them: nothing is kept; list again later.
    Over,
}

#[derive(Default)]
struct Objects {
    by_name: BTreeMap<String, PolicyObject>,
    bytes: usize,
}

impl Objects {
    fn insert(&mut self, object: &PolicyObject) {
        let size = object.size();
        if let Some(old) = self
            .by_name
            .insert(object.name().to_owned(), object.clone())
        {
            self.bytes -= old.size();
        }
        self.bytes += size;
    }

    fn remove(&mut self, name: &str) {
        if let Some(old) = self.by_name.remove(name) {
            self.bytes -= old.size();
        }
    }

    fn within(&self, bounds: Bounds) -> bool {
        self.by_name.len() <= bounds.objects && self.bytes <= bounds.bytes
    }
}

#[derive(Default)]
struct State {
    current: Objects,
    /// A list in progress: what it gave so far; `None` once it went past the bounds.
    relist: Option<Option<Objects>>,
}

/// One kind's kept objects.
#[derive(Default)]
pub(super) struct Kept {
    state: Mutex<State>,
}

impl Kept {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The kept fields of every object, by name.
    pub(super) fn values(&self) -> Vec<Value> {
        self.lock()
            .current
            .by_name
            .values()
            .map(|o| o.fields.clone())
            .collect()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().current.by_name.len()
    }

    /// Applies one watch event within `bounds`.
    pub(super) fn apply(&self, event: &Event<PolicyObject>, bounds: Bounds) -> Fit {
        let mut state = self.lock();
        match event {
            Event::Init => {
                state.relist = Some(Some(Objects::default()));
                Fit::Kept
            }
            Event::InitApply(object) => {
                if let Some(listing) = &mut state.relist
                    && let Some(objects) = listing
                {
                    objects.insert(object);
                    if !objects.within(bounds) {
                        *listing = None;
                    }
                }
                Fit::Kept
            }
            Event::InitDone => match state.relist.take() {
                Some(Some(objects)) => {
                    state.current = objects;
                    Fit::Kept
                }
                Some(None) => {
                    state.current = Objects::default();
                    Fit::Over
                }
                None => Fit::Kept,
            },
            Event::Apply(object) => {
                state.current.insert(object);
                if state.current.within(bounds) {
                    Fit::Kept
                } else {
                    state.current = Objects::default();
                    Fit::Over
                }
            }
            Event::Delete(object) => {
                state.current.remove(object.name());
                Fit::Kept
            }
        }
    }

    /// Forgets everything (the kind went past its bounds, or is listed again from scratch).
    pub(super) fn clear(&self) {
        let mut state = self.lock();
        state.current = Objects::default();
        state.relist = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(name: &str, pool: &str) -> PolicyObject {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "nvidia.com/v1alpha1", "kind": "NVIDIADriver",
            "metadata": {"name": name, "resourceVersion": "1"},
            "spec": {"nodeSelector": {"pool": pool}}
        }))
        .unwrap()
    }

    const SMALL: Bounds = Bounds {
        objects: 2,
        bytes: 1 << 20,
    };

    #[test]
    fn a_list_replaces_what_was_kept_and_events_follow() {
        let kept = Kept::default();
        assert_eq!(
            kept.apply(&Event::Apply(object("old", "x")), SMALL),
            Fit::Kept
        );
        kept.apply(&Event::Init, SMALL);
        kept.apply(&Event::InitApply(object("a", "1")), SMALL);
        // Until the list is done the old objects serve.
        assert_eq!(kept.len(), 1);
        assert_eq!(kept.apply(&Event::InitDone, SMALL), Fit::Kept);
        assert_eq!(
            kept.values()[0].pointer("/metadata/name"),
            Some(&"a".into())
        );
        kept.apply(&Event::Apply(object("a", "2")), SMALL);
        assert_eq!(kept.len(), 1);
        assert_eq!(
            kept.values()[0].pointer("/spec/nodeSelector/pool"),
            Some(&"2".into())
        );
        kept.apply(&Event::Delete(object("a", "2")), SMALL);
        assert_eq!(kept.len(), 0);
        assert_eq!(kept.lock().current.bytes, 0);
    }

    #[test]
    fn past_the_bounds_nothing_is_kept() {
        let kept = Kept::default();
        kept.apply(&Event::Apply(object("a", "1")), SMALL);
        kept.apply(&Event::Apply(object("b", "1")), SMALL);
        assert_eq!(
            kept.apply(&Event::Apply(object("c", "1")), SMALL),
            Fit::Over
        );
        assert_eq!(kept.len(), 0);
        // A list past the bounds too.
        kept.apply(&Event::Init, SMALL);
        for name in ["a", "b", "c"] {
            kept.apply(&Event::InitApply(object(name, "1")), SMALL);
        }
        assert_eq!(kept.apply(&Event::InitDone, SMALL), Fit::Over);
        assert_eq!(kept.len(), 0);
        // Bytes count as well as objects.
        let tiny = Bounds {
            objects: 10,
            bytes: 100,
        };
        kept.apply(&Event::Apply(object("a", "1")), tiny);
        assert_eq!(
            kept.apply(&Event::Apply(object("b", &"x".repeat(100))), tiny),
            Fit::Over
        );
    }
}
