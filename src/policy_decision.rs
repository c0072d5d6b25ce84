//! A change of one GPU-policy object (ClusterPolicy, NVIDIADriver, GPUCluster) decided from
//! its objects ([`ObjectChange`]): what `POST /validate/gpu-policy`, `check-policy` and the
//! kubectl plugin's preview share.
//!
//! The objects are read by `k8s` into core's types, the change they make is put as core's
//! [`PolicyReview`], the fleet's node records are copied out of their lock
//! ([`SharedFleet::node_groups`]), and core's [`decide_policy`] decides, with no lock held.

use serde_json::Value;

use crate::core::echo::bounded_display;
use crate::core::facts::{ClusterFacts, PolicySource};
use crate::core::nvidia_driver::NvidiaDriver;
use crate::core::operands::{Operand, Stack};
use crate::core::policy::{self, Policy, Verdict};
use crate::core::policy_change::{
    Fleet, PolicyChange, PolicyKind, PolicyReview, Shift, decide_policy, shifts,
};
use crate::core::review::Operation;
use crate::k8s::fleet::{MAX_REQUESTED_KEYS, SharedFleet};
use crate::k8s::{cluster_policy, gpu_cluster, nvidia_driver};

/// The most bytes of an object's refusal a message repeats: the webhook's bound on what its
/// answers repeat of a parser's message (`webhook::bad_request::MAX_ERROR_BYTES`).
pub const MAX_MESSAGE_BYTES: usize = 300;

/// A change of one GPU-policy object, as objects: what the webhook, `check-policy` and the
/// kubectl plugin decide.
#[derive(Clone, Copy, Debug)]
pub struct ObjectChange<'a> {
    pub kind: PolicyKind,
    pub operation: Operation,
    pub name: &'a str,
    /// The object after the change (CREATE, UPDATE) and before it (UPDATE, DELETE).
    pub object: Option<&'a Value>,
    pub old: Option<&'a Value>,
    pub username: &'a str,
    pub groups: &'a [String],
    pub dry_run: bool,
}

/// Why the objects of a change cannot be decided. The words are those of the webhook's answer
/// (its `BadRequest`, which these become), so that every caller says the same.
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    /// An object is not a valid object of its kind: why, cut to [`MAX_MESSAGE_BYTES`].
    #[error("request body is not a valid AdmissionReview: request.object: {0}")]
    Invalid(String),
    /// The change needs an object it does not have (`field`: `object` or `oldObject`).
    #[error("{operation} request has no `{field}`")]
    Missing {
        operation: &'static str,
        field: &'static str,
    },
}

impl ObjectError {
    fn invalid(why: &dyn std::fmt::Display) -> ObjectError {
        ObjectError::Invalid(bounded_display(why, MAX_MESSAGE_BYTES))
    }

    fn missing(operation: Operation, field: &'static str) -> ObjectError {
        ObjectError::Missing {
            operation: operation.as_str(),
            field,
        }
    }
}

/// Decides `change` with the cluster's `facts` over `fleet`'s node records (None: the policy
/// alone decides, and says the nodes are unknown).
pub fn decide_objects(
    change: &ObjectChange<'_>,
    facts: &ClusterFacts,
    fleet: Option<&SharedFleet>,
    policy: &Policy,
) -> Result<Verdict, ObjectError> {
    let verdict = on_review(change, facts, |review| {
        let verdict = over_groups(fleet, |groups| decide_policy(review, groups, policy));
        if let Some(fleet) = fleet {
            // A nodeSelector reading a label the records do not keep could not be judged: the
            // records keep it from now on, so the same request sent again is.
            let refused = fleet.request_keys(selector_keys(review));
            if !refused.is_empty() {
                tracing::warn!(
                    keys = %refused.join(","),
                    max = MAX_REQUESTED_KEYS,
                    "NVIDIADriver nodeSelector labels not read from the nodes: the node records keep no more requested labels; such NVIDIADrivers stay refused until one of the labels is in use"
                );
            }
        }
        verdict
    })?;
    Ok(verdict.unwrap_or_else(|| status_verdict(facts, policy)))
}

/// [`decide_objects`] over `fleet`'s node records, and where each operand runs before and after
/// the change: what `check-policy` and the plugin's preview print. The shifts are empty for a
/// change that decides nothing (a ClusterPolicy's DELETE) and before the nodes are listed.
pub fn decide_and_predict(
    change: &ObjectChange<'_>,
    facts: &ClusterFacts,
    fleet: &SharedFleet,
    policy: &Policy,
) -> Result<(Verdict, Vec<Shift>), ObjectError> {
    let both = on_review(change, facts, |review| {
        over_groups(Some(fleet), |groups| {
            let moved = match groups {
                Fleet::Known { groups, .. } => shifts(review, groups),
                Fleet::Unknown(_) => Vec::new(),
            };
            (decide_policy(review, groups, policy), moved)
        })
    })?;
    Ok(both.unwrap_or_else(|| (status_verdict(facts, policy), Vec::new())))
}

/// Allowed, deciding nothing: the status subresource, DELETE of a ClusterPolicy (the
/// operator's uninstall), CONNECT.
pub fn status_verdict(facts: &ClusterFacts, policy: &Policy) -> Verdict {
    policy::conclude(
        Vec::new(),
        None,
        policy,
        Default::default(),
        Default::default(),
        facts.annotation(),
    )
}

/// The label keys an NVIDIADriver's nodeSelector reads (none for the other kinds).
fn selector_keys<'a>(review: &'a PolicyReview<'_>) -> impl Iterator<Item = &'a str> {
    // The old selector's keys too: a changed selector moves the driver off the nodes only the
    // old one picks, which the records tell only if they keep its labels.
    let (before, after) = match review.change {
        PolicyChange::NvidiaDriver { before, after, .. } => (before, after),
        _ => (None, None),
    };
    [before, after]
        .into_iter()
        .flatten()
        .filter_map(|d| d.node_selector.as_ref())
        .flat_map(|s| s.keys())
        .map(String::as_str)
}

/// Hands `then` the fleet's node records, grouped, copied out of the fleet's lock: the
/// decision holds no lock while the watch writes. Without the records, why not.
fn over_groups<R>(fleet: Option<&SharedFleet>, then: impl FnOnce(Fleet<'_>) -> R) -> R {
    let Some(fleet) = fleet else {
        return then(Fleet::Unknown(
            "the nodes are not read (no cluster watch, no node list)",
        ));
    };
    let copied = match fleet.node_groups(std::time::Instant::now()) {
        Ok(copied) => copied,
        Err(why) => return then(Fleet::Unknown(&why)),
    };
    let groups = copied.groups();
    let keeps = |key: &str| copied.keeps(key);
    then(Fleet::Known {
        groups: &groups,
        keeps: &keeps,
    })
}

/// Reads the objects of `change` into the review the decision judges, and hands it to `then`;
/// None for a change that decides nothing.
fn on_review<R>(
    change: &ObjectChange<'_>,
    facts: &ClusterFacts,
    then: impl FnOnce(&PolicyReview<'_>) -> R,
) -> Result<Option<R>, ObjectError> {
    let base = PolicyReview {
        kind: change.kind,
        name: change.name,
        operation: change.operation,
        username: change.username,
        groups: change.groups,
        dry_run: change.dry_run,
        change: PolicyChange::NvidiaDriver {
            facts,
            before: None,
            after: None,
            others: &[],
        },
    };
    let drivers = facts.nvidia_drivers.clone().unwrap_or_default();
    match change.kind {
        PolicyKind::ClusterPolicy => cluster_policy_review(change, facts, &drivers, base, then),
        PolicyKind::GpuCluster => gpu_cluster_review(change, facts, &drivers, base, then),
        PolicyKind::NvidiaDriver => nvidia_driver_review(change, facts, drivers, base, then),
    }
}

/// The facts of the cluster with the switches `object` (a ClusterPolicy) gives.
fn with_policy(cluster: &ClusterFacts, object: &Value) -> Result<ClusterFacts, ObjectError> {
    cluster_policy::applied(cluster, object).map_err(|e| ObjectError::invalid(&e))
}

/// What runs before a first ClusterPolicy takes effect: the operand DaemonSets that exist
/// (orphaned by a deleted ClusterPolicy, `kubectl delete --cascade=orphan`), which the operator
/// adopts or deletes as the new one says. When the DaemonSets are not listed, the operator's
/// defaults: the guard cannot know, so a first ClusterPolicy is judged as if its defaults ran.
fn running_now(cluster: &ClusterFacts) -> ClusterFacts {
    let Some(present) = cluster.daemonsets else {
        return cluster.clone();
    };
    ClusterFacts {
        toolkit_managed: true,
        disabled: Operand::all().filter(|op| !present.contains(*op)).collect(),
        ..cluster.clone()
    }
}

/// A ClusterPolicy's change: the facts before and after it, and the other ClusterPolicy it
/// concerns (the one followed beside a second one, the next one after a DELETE).
fn cluster_policy_review<R>(
    change: &ObjectChange<'_>,
    facts: &ClusterFacts,
    drivers: &[NvidiaDriver],
    base: PolicyReview<'_>,
    then: impl FnOnce(&PolicyReview<'_>) -> R,
) -> Result<Option<R>, ObjectError> {
    let (op, name, object, old) = (change.operation, change.name, change.object, change.old);
    let followed = matches!(&facts.source, PolicySource::Found(n) if n == name);
    let (before, after, others) = match op {
        Operation::Create => {
            let after = with_policy(
                facts,
                object.ok_or_else(|| ObjectError::missing(op, "object"))?,
            )?;
            match &facts.source {
                // A second one is ignored by the operator (said by the judge).
                PolicySource::Found(n) if n != name => (after.clone(), after, vec![n.clone()]),
                // A first one takes over what runs now.
                _ => (running_now(facts), after, Vec::new()),
            }
        }
        Operation::Update => (
            with_policy(
                facts,
                old.ok_or_else(|| ObjectError::missing(op, "oldObject"))?,
            )?,
            with_policy(
                facts,
                object.ok_or_else(|| ObjectError::missing(op, "object"))?,
            )?,
            Vec::new(),
        ),
        // Deleting the followed ClusterPolicy hands the operator to the next one, which it
        // then reconciles whether the operand DaemonSets were deleted with it or orphaned.
        // Deleting an ignored one, or the only one, changes no switch: the DaemonSets either
        // stay (orphaned) or all go with it.
        Operation::Delete => {
            let next = facts.next_policy.as_deref().filter(|_| followed);
            let Some((next_name, switches)) = next else {
                return Ok(None);
            };
            let before = match old {
                Some(old) => with_policy(facts, old)?,
                None => facts.clone(),
            };
            let after = facts.with_cluster_policy(next_name, switches);
            (before, after, vec![next_name.clone()])
        }
        Operation::Connect => return Ok(None),
    };
    let host_toolkit = cluster_policy::host_toolkit(object)
        // A reason says something: blanks and invisible characters (a zero-width space) alone
        // do not.
        .filter(|v| v.chars().any(char::is_alphanumeric))
        .filter(|v| cluster_policy::host_toolkit(old) != Some(*v));
    let review = PolicyReview {
        change: PolicyChange::ClusterPolicy {
            before: &before,
            after: &after,
            host_toolkit,
            others: &others,
            drivers,
        },
        ..base
    };
    Ok(Some(then(&review)))
}

/// A GPUCluster's change: the facts after it; its DELETE beside a ClusterPolicy, as that
/// ClusterPolicy's taking over.
fn gpu_cluster_review<R>(
    change: &ObjectChange<'_>,
    facts: &ClusterFacts,
    drivers: &[NvidiaDriver],
    base: PolicyReview<'_>,
    then: impl FnOnce(&PolicyReview<'_>) -> R,
) -> Result<Option<R>, ObjectError> {
    let op = change.operation;
    let cluster_policy = match &facts.source {
        PolicySource::Found(name) => Some(name.as_str()),
        _ => None,
    };
    // Deleting the GPUCluster while a ClusterPolicy exists too hands the operator to that
    // ClusterPolicy: judged as a first ClusterPolicy over what runs now.
    if op == Operation::Delete
        && let Some(cp) = cluster_policy
        && facts.stack.in_era(facts.operator.era()) == Stack::Both
    {
        let before = running_now(&facts.clone().without_gpu_cluster());
        let after = facts.clone().without_gpu_cluster();
        let others = vec![cp.to_owned()];
        let review = PolicyReview {
            change: PolicyChange::ClusterPolicy {
                before: &before,
                after: &after,
                host_toolkit: None,
                others: &others,
                drivers,
            },
            ..base
        };
        return Ok(Some(then(&review)));
    }
    let after = match (op, change.object) {
        (Operation::Create | Operation::Update, Some(object)) => {
            let gc = gpu_cluster::from_object(object).map_err(|e| ObjectError::invalid(&e))?;
            facts.clone().with_gpu_cluster(
                &gc.name,
                gc.disabled,
                gc.tolerations,
                cluster_policy.is_some(),
            )
        }
        (Operation::Create | Operation::Update, None) => {
            return Err(ObjectError::missing(op, "object"));
        }
        _ => facts.clone(),
    };
    let review = PolicyReview {
        change: PolicyChange::GpuCluster {
            facts,
            after: &after,
            cluster_policy,
        },
        ..base
    };
    Ok(Some(then(&review)))
}

/// An NVIDIADriver's change: the resource before and after it, and the cluster's others.
fn nvidia_driver_review<R>(
    change: &ObjectChange<'_>,
    facts: &ClusterFacts,
    drivers: Vec<NvidiaDriver>,
    base: PolicyReview<'_>,
    then: impl FnOnce(&PolicyReview<'_>) -> R,
) -> Result<Option<R>, ObjectError> {
    let (op, object, old) = (change.operation, change.object, change.old);
    let read = |v: Option<&Value>| -> Result<Option<NvidiaDriver>, ObjectError> {
        v.map(|v| nvidia_driver::from_object(v).map_err(|e| ObjectError::invalid(&e)))
            .transpose()
    };
    let (before, after) = match op {
        Operation::Create => (
            None,
            Some(read(object)?.ok_or_else(|| ObjectError::missing(op, "object"))?),
        ),
        Operation::Update => (
            Some(read(old)?.ok_or_else(|| ObjectError::missing(op, "oldObject"))?),
            Some(read(object)?.ok_or_else(|| ObjectError::missing(op, "object"))?),
        ),
        Operation::Delete => (read(old)?, None),
        Operation::Connect => return Ok(None),
    };
    let this = after.as_ref().or(before.as_ref()).map(|d| d.name.clone());
    let others: Vec<NvidiaDriver> = drivers
        .into_iter()
        .filter(|d| Some(&d.name) != this.as_ref() && d.name != change.name)
        .collect();
    let review = PolicyReview {
        change: PolicyChange::NvidiaDriver {
            facts,
            before: before.as_ref(),
            after: after.as_ref(),
            others: &others,
        },
        ..base
    };
    Ok(Some(then(&review)))
}
