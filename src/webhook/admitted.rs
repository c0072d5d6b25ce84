//! GPU-policy objects this replica let be created, which its watch has not shown yet.
//!
//! A `kubectl apply` of a ClusterPolicy and a GPUCluster, or of two NVIDIADrivers with the same
//! selector, sends the creations one after the other, a few milliseconds apart; the watch shows
//! the first object about a second later (its debounce). Decided on the watch alone, the second
//! creation would not meet the first. So every creation this replica allows is added to the
//! facts of the next decisions, until the watch shows an object of that kind and name, or
//! [`KEPT_FOR`] passes (the API server may still have refused the object after this webhook:
//! another webhook, a quota; for that long the guard is stricter than it needs to be, never
//! laxer).
//!
//! Within one replica the policy reviews are decided one at a time, so the overlay is exact.
//! Across replicas it is not: a creation answered by another replica reaches this one through
//! the watch only (README, "Two creations at once").

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::core::facts::{ClusterFacts, PolicySource};
use crate::core::nvidia_driver::NvidiaDriver;
use crate::core::operands::Stack;
use crate::core::policy_change::PolicyKind;
use crate::k8s::{cluster_policy, gpu_cluster, nvidia_driver};

/// How long an allowed creation counts when the watch does not show it.
pub const KEPT_FOR: Duration = Duration::from_secs(10);

/// Creations kept at most: policy reviews come one at a time, so many more than this within
/// [`KEPT_FOR`] is a flood; beyond it the oldest is forgotten (and the watch, a second later,
/// knows it anyway).
pub const MAX_KEPT: usize = 32;

/// One allowed creation, as the decision reads it.
#[derive(Clone, Debug)]
enum Created {
    ClusterPolicy(Box<cluster_policy::ClusterPolicy>),
    GpuCluster(gpu_cluster::GpuCluster),
    NvidiaDriver(NvidiaDriver),
}

impl Created {
    fn name(&self) -> &str {
        match self {
            Created::ClusterPolicy(p) => &p.name,
            Created::GpuCluster(g) => &g.name,
            Created::NvidiaDriver(d) => &d.name,
        }
    }

    /// Whether the watch's facts show this object already.
    fn seen_in(&self, facts: &ClusterFacts) -> bool {
        match self {
            Created::ClusterPolicy(p) => {
                matches!(&facts.source, PolicySource::Found(n) if *n == p.name)
                    || facts.next_policy.as_ref().is_some_and(|n| n.0 == p.name)
            }
            // The watch keeps one GPUCluster (the operator reconciles one).
            Created::GpuCluster(_) => facts.stack != Stack::ClusterPolicy,
            Created::NvidiaDriver(d) => facts
                .nvidia_drivers
                .as_ref()
                .is_some_and(|all| all.iter().any(|o| o.name == d.name)),
        }
    }

    /// `facts` with this object in them.
    fn add_to(&self, facts: ClusterFacts) -> ClusterFacts {
        match self {
            Created::ClusterPolicy(p) => {
                if matches!(facts.source, PolicySource::Found(_)) {
                    // A second ClusterPolicy: the operator keeps following the first.
                    return facts;
                }
                facts.with_cluster_policy(&p.name, &p.facts)
            }
            Created::GpuCluster(g) => {
                let policy = matches!(facts.source, PolicySource::Found(_));
                facts.with_gpu_cluster(&g.name, g.disabled, g.tolerations.clone(), policy)
            }
            Created::NvidiaDriver(d) => {
                let mut facts = facts;
                // Unknown stays unknown: one object does not make the list known.
                if let Some(all) = facts.nvidia_drivers.as_mut() {
                    all.push(d.clone());
                    all.sort_by(|a, b| a.name.cmp(&b.name));
                }
                facts
            }
        }
    }
}

/// The creations this replica allowed that its watch does not show yet.
#[derive(Debug, Default)]
pub struct Admitted {
    kept: Vec<(Instant, Created)>,
}

impl Admitted {
    /// Forgets what the watch shows now and what is older than [`KEPT_FOR`], and returns the
    /// watch's facts with the rest added, oldest first.
    pub fn overlay(&mut self, watched: &Arc<ClusterFacts>, now: Instant) -> Arc<ClusterFacts> {
        self.kept.retain(|(at, created)| {
            now.duration_since(*at) < KEPT_FOR && !created.seen_in(watched)
        });
        if self.kept.is_empty() {
            return Arc::clone(watched);
        }
        Arc::new(
            self.kept
                .iter()
                .fold((**watched).clone(), |facts, (_, created)| {
                    created.add_to(facts)
                }),
        )
    }

    /// Records an allowed creation of `object` (one the decision could read; another is not
    /// created by the API server either, or is judged on its own when it is).
    pub fn record(&mut self, kind: PolicyKind, object: &Value, now: Instant) {
        let created = match kind {
            PolicyKind::ClusterPolicy => cluster_policy::from_object(object)
                .ok()
                .map(|p| Created::ClusterPolicy(Box::new(p))),
            PolicyKind::GpuCluster => gpu_cluster::from_object(object)
                .ok()
                .map(Created::GpuCluster),
            PolicyKind::NvidiaDriver => nvidia_driver::from_object(object)
                .ok()
                .map(Created::NvidiaDriver),
        };
        let Some(created) = created else { return };
        self.kept.retain(|(_, c)| {
            std::mem::discriminant(c) != std::mem::discriminant(&created)
                || c.name() != created.name()
        });
        if self.kept.len() >= MAX_KEPT {
            self.kept.remove(0);
        }
        self.kept.push((now, created));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.kept.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn policy(name: &str) -> Value {
        json!({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": name},
               "spec": {"toolkit": {"enabled": false}}})
    }

    fn driver(name: &str) -> Value {
        json!({"apiVersion": "nvidia.com/v1alpha1", "kind": "NVIDIADriver", "metadata": {"name": name},
               "spec": {"nodeSelector": {"pool": "a"}}})
    }

    fn gpu_cluster(name: &str) -> Value {
        json!({"apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster", "metadata": {"name": name}, "spec": {}})
    }

    fn no_policy() -> Arc<ClusterFacts> {
        Arc::new(ClusterFacts {
            source: PolicySource::Missing("none".into()),
            nvidia_drivers: Some(Vec::new()),
            ..ClusterFacts::default()
        })
    }

    #[test]
    fn a_created_cluster_policy_counts_until_the_watch_shows_it() {
        let mut a = Admitted::default();
        let t0 = Instant::now();
        a.record(PolicyKind::ClusterPolicy, &policy("cp"), t0);
        let facts = a.overlay(&no_policy(), t0);
        assert_eq!(facts.source, PolicySource::Found("cp".into()));
        assert!(!facts.toolkit_managed, "its switches count");
        // A GPUCluster created next meets it: both stacks.
        a.record(PolicyKind::GpuCluster, &gpu_cluster("gc"), t0);
        assert_eq!(a.overlay(&no_policy(), t0).stack, Stack::Both);
        // The watch shows the ClusterPolicy: only the GPUCluster is still added.
        let watched = Arc::new(ClusterFacts {
            source: PolicySource::Found("cp".into()),
            ..(*no_policy()).clone()
        });
        let facts = a.overlay(&watched, t0 + Duration::from_secs(1));
        assert_eq!(a.len(), 1);
        assert_eq!(facts.stack, Stack::Both);
        // Not shown within the bound: forgotten.
        let facts = a.overlay(&no_policy(), t0 + KEPT_FOR);
        assert_eq!(a.len(), 0);
        assert_eq!(facts, no_policy());
    }

    #[test]
    fn created_nvidia_drivers_are_added_once_each_and_a_second_cluster_policy_changes_nothing() {
        let mut a = Admitted::default();
        let t0 = Instant::now();
        a.record(PolicyKind::NvidiaDriver, &driver("one"), t0);
        a.record(PolicyKind::NvidiaDriver, &driver("one"), t0);
        a.record(PolicyKind::NvidiaDriver, &driver("two"), t0);
        let names: Vec<String> = a
            .overlay(&no_policy(), t0)
            .nvidia_drivers
            .clone()
            .unwrap()
            .into_iter()
            .map(|d| d.name)
            .collect();
        assert_eq!(names, ["one", "two"]);
        // Not listed: one creation does not make the list known.
        let unknown = Arc::new(ClusterFacts {
            nvidia_drivers: None,
            ..(*no_policy()).clone()
        });
        assert_eq!(a.overlay(&unknown, t0).nvidia_drivers, None);
        let followed = Arc::new(ClusterFacts {
            source: PolicySource::Found("first".into()),
            ..(*no_policy()).clone()
        });
        a.record(PolicyKind::ClusterPolicy, &policy("second"), t0);
        let facts = a.overlay(&followed, t0);
        assert_eq!(facts.source, PolicySource::Found("first".into()));
        assert!(facts.toolkit_managed);
    }

    #[test]
    fn the_kept_creations_are_bounded() {
        let mut a = Admitted::default();
        let t0 = Instant::now();
        for i in 0..(MAX_KEPT + 5) {
            a.record(PolicyKind::NvidiaDriver, &driver(&format!("d{i}")), t0);
        }
        assert_eq!(a.len(), MAX_KEPT);
        let facts = a.overlay(&no_policy(), t0);
        assert_eq!(facts.nvidia_drivers.as_ref().unwrap()[0].name, "d10");
    }
}
