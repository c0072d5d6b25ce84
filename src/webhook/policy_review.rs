//! `POST /validate/gpu-policy`: AdmissionReviews of ClusterPolicy, NVIDIADriver and GPUCluster changes,
//! decided over every node the guard knows ([`decide_policy`]).
//!
//! Not the hot path of node labels: a policy object is read with serde, whole. The answer is
//! the same AdmissionReview the node webhook gives.

use axum::Extension;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::Value;

use super::bad_request::BadRequest;
use super::body::Started;
use super::read::MAX_UID_CHARS;
use super::read::UserInfo;
use super::response::json_response;
use super::{Webhook, refuse};
use crate::core::echo::{bounded_display, echo};
use crate::core::facts::{ClusterFacts, PolicySource};
use crate::core::labels::MAX_NAME_CHARS;
use crate::core::nvidia_driver::NvidiaDriver;
use crate::core::operands::{Operand, Stack};
use crate::core::policy::{self, Decision, Policy, Verdict};
use crate::core::policy_change::{
    Fleet, HOST_TOOLKIT_ANNOTATION, NodeGroup, PolicyChange, PolicyKind, PolicyReview, Shift,
    decide_policy, shifts,
};
use crate::core::review::Operation;
use crate::k8s::{cluster_policy, gpu_cluster, nvidia_driver, policy_object};
use std::sync::Arc;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PolicyReviewBody {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    request: Option<PolicyRequest>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PolicyRequest {
    uid: String,
    kind: Gvk,
    #[serde(default)]
    name: String,
    operation: Operation,
    #[serde(default)]
    sub_resource: Option<String>,
    #[serde(default)]
    user_info: UserInfo<'static>,
    #[serde(default, deserialize_with = "policy_fields")]
    object: Option<Value>,
    #[serde(default, deserialize_with = "policy_fields")]
    old_object: Option<Value>,
    #[serde(default)]
    dry_run: bool,
}

/// A GPU-policy object with only the fields the decision reads ([`policy_object::keeps`]).
fn policy_fields<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    policy_object::read(d)
}

#[derive(Deserialize)]
struct Gvk {
    #[serde(default)]
    group: String,
    #[serde(default)]
    kind: String,
}

/// `POST /validate/gpu-policy`: the body, read by the transport's layer
/// ([`body`](super::body)), as a ClusterPolicy or NVIDIADriver AdmissionReview.
pub(super) async fn validate_policy(
    State(hook): State<Arc<Webhook>>,
    Extension(Started(started)): Extension<Started>,
    bytes: Bytes,
) -> Response {
    // Its objects become trees, and a refused field's message repeats it: one at a time.
    let _turn = hook.slow_turn().await;
    let request = match parse(&bytes) {
        Ok(r) => r,
        Err((bad, uid)) => return refuse(&hook, bad, uid),
    };
    let kind = match (request.kind.group.as_str(), request.kind.kind.as_str()) {
        ("nvidia.com", "ClusterPolicy") => PolicyKind::ClusterPolicy,
        ("nvidia.com", "NVIDIADriver") => PolicyKind::NvidiaDriver,
        ("nvidia.com", "GPUCluster") => PolicyKind::GpuCluster,
        (group, kind) => {
            return refuse(
                &hook,
                BadRequest::NotAPolicy(format!("{group}/{kind}")),
                Some(request.uid.clone()),
            );
        }
    };
    // The watch's facts, with the creations this replica allowed that it does not show yet.
    // Reviews are decided one at a time (the turn above), so each one sees every earlier one.
    let facts = {
        let watched = hook.facts.borrow().clone();
        hook.admitted_lock()
            .overlay(&watched, std::time::Instant::now())
    };
    let verdict = match review(&hook, &request, kind, &facts) {
        Ok(v) => v,
        Err(bad) => return refuse(&hook, bad, Some(request.uid.clone())),
    };
    if request.operation == Operation::Create
        && !request.dry_run
        && request.sub_resource.is_none()
        && verdict.decision != Decision::Denied
        && let Some(object) = &request.object
    {
        hook.admitted_lock()
            .record(kind, object, std::time::Instant::now());
    }
    let response = super::response::respond_to(request.uid.clone(), &verdict);
    hook.metrics.policy_reviews.observe(
        kind,
        verdict.decision,
        request.operation,
        verdict.findings.iter().map(|f| (f.rule, f.action)),
        started.elapsed().as_secs_f64(),
    );
    log(&request, kind, &verdict);
    json_response(StatusCode::OK, &response)
}

fn parse(bytes: &[u8]) -> Result<PolicyRequest, (BadRequest, Option<String>)> {
    if bytes.is_empty() {
        return Err((BadRequest::Empty, None));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let body: PolicyReviewBody = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let bad = if inner.is_eof() {
            BadRequest::Truncated(bounded_display(&inner, super::MAX_ERROR_BYTES))
        } else if inner.is_syntax() {
            BadRequest::NotJson(bounded_display(&inner, super::MAX_ERROR_BYTES))
        } else {
            BadRequest::Invalid {
                path,
                message: bounded_display(&inner, super::MAX_ERROR_BYTES),
            }
        };
        (bad, None)
    })?;
    if body.kind != "AdmissionReview" {
        return Err((
            BadRequest::Kind(bounded_display(&body.kind, super::MAX_ERROR_BYTES)),
            None,
        ));
    }
    if body.api_version != "admission.k8s.io/v1" {
        return Err((
            BadRequest::Version(bounded_display(&body.api_version, super::MAX_ERROR_BYTES)),
            None,
        ));
    }
    let request = body.request.ok_or((BadRequest::NoRequest, None))?;
    if request.uid.chars().count() > MAX_UID_CHARS {
        return Err((BadRequest::UidTooLong(request.uid.chars().count()), None));
    }
    let chars = request.name.chars().count();
    if chars > MAX_NAME_CHARS {
        return Err((
            BadRequest::NameTooLong {
                field: "request.name",
                chars,
            },
            Some(request.uid.clone()),
        ));
    }
    Ok(request)
}

/// The facts of the cluster with the switches `object` (a ClusterPolicy) gives.
fn with_policy(cluster: &ClusterFacts, object: &Value) -> Result<ClusterFacts, BadRequest> {
    let p = cluster_policy::from_object(object).map_err(|e| BadRequest::Invalid {
        path: "request.object".to_owned(),
        message: bounded_display(&e, super::MAX_ERROR_BYTES),
    })?;
    Ok(cluster.with_cluster_policy(&p.name, &p.facts))
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

fn annotation<'v>(object: Option<&'v Value>, key: &str) -> Option<&'v str> {
    object?.pointer("/metadata/annotations")?.get(key)?.as_str()
}

fn missing(operation: Operation, field: &'static str) -> BadRequest {
    BadRequest::MissingObject {
        operation: operation.as_str(),
        field,
    }
}

fn review(
    hook: &Webhook,
    request: &PolicyRequest,
    kind: PolicyKind,
    facts: &ClusterFacts,
) -> Result<Verdict, BadRequest> {
    if request.sub_resource.as_deref() == Some("status") {
        // The operator writes its status; nothing a person changes there reaches a node.
        return Ok(status_verdict(facts, &hook.policy));
    }
    let groups = policy::exempt_groups(request.user_info.groups(), &hook.policy.exemptions);
    let change = ObjectChange {
        kind,
        operation: request.operation,
        name: &request.name,
        object: request.object.as_ref(),
        old: request.old_object.as_ref(),
        username: request.user_info.username.as_deref().unwrap_or_default(),
        groups: &groups,
        dry_run: request.dry_run,
    };
    decide_objects(&change, facts, hook.fleet.as_deref(), &hook.policy)
}

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

/// Decides `change` with the cluster's `facts` over `fleet`'s node records (None: the policy
/// alone decides, and says the nodes are unknown).
pub fn decide_objects(
    change: &ObjectChange<'_>,
    facts: &ClusterFacts,
    fleet: Option<&crate::k8s::fleet::Fleet>,
    policy: &Policy,
) -> Result<Verdict, BadRequest> {
    let verdict = on_review(change, facts, |review| {
        let verdict = over_groups(fleet, |groups| decide_policy(review, groups, policy));
        if let Some(fleet) = fleet {
            // A nodeSelector reading a label the records do not keep could not be judged: the
            // records keep it from now on, so the same request sent again is.
            let refused = fleet.request_keys(selector_keys(review));
            if !refused.is_empty() {
                tracing::warn!(
                    keys = %refused.join(","),
                    max = crate::k8s::fleet::MAX_REQUESTED_KEYS,
                    "NVIDIADriver nodeSelector labels not read from the nodes: the node records keep no more requested labels; such NVIDIADrivers stay refused until one of the labels is in use"
                );
            }
        }
        verdict
    })?;
    Ok(verdict.unwrap_or_else(|| status_verdict(facts, policy)))
}

/// The label keys an NVIDIADriver's nodeSelector reads (none for the other kinds).
fn selector_keys<'a>(review: &'a PolicyReview<'_>) -> impl Iterator<Item = &'a str> {
    let selector = match review.change {
        PolicyChange::NvidiaDriver {
            after: Some(this), ..
        } => this.node_selector.as_ref(),
        _ => None,
    };
    selector
        .into_iter()
        .flat_map(|s| s.keys())
        .map(String::as_str)
}

/// [`decide_objects`] over `fleet`'s node records, and where each operand runs before and after
/// the change: what `check-policy` and the plugin's preview print. The shifts are empty for a
/// change that decides nothing (a ClusterPolicy's DELETE) and before the nodes are listed.
pub fn decide_and_predict(
    change: &ObjectChange<'_>,
    facts: &ClusterFacts,
    fleet: &crate::k8s::fleet::Fleet,
    policy: &Policy,
) -> Result<(Verdict, Vec<Shift>), BadRequest> {
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

/// Reads the objects of `change` into the review the decision judges, and hands it to `then`;
/// None for a change that decides nothing.
fn on_review<R>(
    change: &ObjectChange<'_>,
    facts: &ClusterFacts,
    then: impl FnOnce(&PolicyReview<'_>) -> R,
) -> Result<Option<R>, BadRequest> {
    let op = change.operation;
    let object = change.object;
    let old = change.old;
    let kind = change.kind;
    let name = change.name;
    let base = PolicyReview {
        kind,
        name,
        operation: op,
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
    let all_drivers = facts.nvidia_drivers.clone().unwrap_or_default();
    match kind {
        PolicyKind::ClusterPolicy => {
            let followed = matches!(&facts.source, PolicySource::Found(n) if n == name);
            let (before, after, others) = match op {
                Operation::Create => {
                    let after = with_policy(facts, object.ok_or_else(|| missing(op, "object"))?)?;
                    match &facts.source {
                        // A second one is ignored by the operator (said by the judge).
                        PolicySource::Found(n) if n != name => {
                            (after.clone(), after, vec![n.clone()])
                        }
                        // A first one takes over what runs now.
                        _ => (running_now(facts), after, Vec::new()),
                    }
                }
                Operation::Update => (
                    with_policy(facts, old.ok_or_else(|| missing(op, "oldObject"))?)?,
                    with_policy(facts, object.ok_or_else(|| missing(op, "object"))?)?,
                    Vec::new(),
                ),
                // Deleting the followed ClusterPolicy hands the operator to the next one, which
                // it then reconciles whether the operand DaemonSets were deleted with it or
                // orphaned. Deleting an ignored one, or the only one, changes no switch: the
                // DaemonSets either stay (orphaned) or all go with it.
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
            let host_toolkit = annotation(object, HOST_TOOLKIT_ANNOTATION)
                // A reason says something: blanks and invisible characters (a zero-width
                // space) alone do not.
                .filter(|v| v.chars().any(char::is_alphanumeric))
                .filter(|v| annotation(old, HOST_TOOLKIT_ANNOTATION) != Some(*v));
            let review = PolicyReview {
                change: PolicyChange::ClusterPolicy {
                    before: &before,
                    after: &after,
                    host_toolkit,
                    others: &others,
                    drivers: &all_drivers,
                },
                ..base
            };
            Ok(Some(then(&review)))
        }
        PolicyKind::GpuCluster => {
            let cluster_policy = match &facts.source {
                PolicySource::Found(name) => Some(name.as_str()),
                _ => None,
            };
            // Deleting the GPUCluster while a ClusterPolicy exists too hands the operator to
            // that ClusterPolicy: judged as a first ClusterPolicy over what runs now.
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
                        drivers: &all_drivers,
                    },
                    ..base
                };
                return Ok(Some(then(&review)));
            }
            let after = match (op, object) {
                (Operation::Create | Operation::Update, Some(object)) => {
                    let gc = gpu_cluster::from_object(object).map_err(|e| BadRequest::Invalid {
                        path: "request.object".to_owned(),
                        message: bounded_display(&e, super::MAX_ERROR_BYTES),
                    })?;
                    facts
                        .clone()
                        .with_gpu_cluster(&gc.name, gc.disabled, cluster_policy.is_some())
                }
                (Operation::Create | Operation::Update, None) => {
                    return Err(missing(op, "object"));
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
        PolicyKind::NvidiaDriver => {
            let read = |v: Option<&Value>| -> Result<Option<NvidiaDriver>, BadRequest> {
                v.map(|v| {
                    nvidia_driver::from_object(v).map_err(|message| BadRequest::Invalid {
                        path: "request.object".to_owned(),
                        message: bounded_display(&message, super::MAX_ERROR_BYTES),
                    })
                })
                .transpose()
            };
            let (before, after) = match op {
                Operation::Create => (
                    None,
                    Some(read(object)?.ok_or_else(|| missing(op, "object"))?),
                ),
                Operation::Update => (
                    Some(read(old)?.ok_or_else(|| missing(op, "oldObject"))?),
                    Some(read(object)?.ok_or_else(|| missing(op, "object"))?),
                ),
                Operation::Delete => (read(old)?, None),
                Operation::Connect => return Ok(None),
            };
            let this = after.as_ref().or(before.as_ref()).map(|d| d.name.clone());
            let others: Vec<NvidiaDriver> = all_drivers
                .into_iter()
                .filter(|d| Some(&d.name) != this.as_ref() && d.name != name)
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
    }
}

/// Hands `then` the fleet's node records, grouped, under its lock; without them, why not.
fn over_groups<R>(
    fleet: Option<&crate::k8s::fleet::Fleet>,
    then: impl FnOnce(Fleet<'_>) -> R,
) -> R {
    let Some(fleet) = fleet else {
        return then(Fleet::Unknown(
            "the nodes are not read (no cluster watch, no node list)",
        ));
    };
    let state = fleet.lock();
    if let Some(why) = state.blind(std::time::Instant::now()) {
        drop(state);
        return then(Fleet::Unknown(&why));
    }
    let groups: Vec<NodeGroup<'_>> = state
        .nodes
        .groups()
        .into_iter()
        .map(|(record, nodes)| NodeGroup {
            labels: record.labels(),
            nodes,
        })
        .collect();
    let filter = state.nodes.filter();
    let keeps = |key: &str| filter.keeps(key);
    then(Fleet::Known {
        groups: &groups,
        keeps: &keeps,
    })
}

/// Allowed, deciding nothing: the status subresource, DELETE of a ClusterPolicy (the
/// operator's uninstall), CONNECT.
fn status_verdict(facts: &ClusterFacts, policy: &Policy) -> Verdict {
    crate::core::policy::conclude(
        Vec::new(),
        None,
        policy,
        Default::default(),
        Default::default(),
        facts.annotation(),
    )
}

fn log(req: &PolicyRequest, kind: PolicyKind, verdict: &Verdict) {
    let user = &*echo(req.user_info.username.as_deref().unwrap_or_default());
    let findings = verdict.findings_in_words();
    let nodes = verdict.policy_change.as_ref().and_then(|n| n.nodes);
    let (uid, name) = (&*echo(&req.uid), &*echo(&req.name));
    match verdict.decision {
        Decision::Denied => {
            tracing::info!(uid, kind = kind.as_str(), name, user, operation = req.operation.as_str(), ?nodes, findings = %findings, decision = "denied", "policy review")
        }
        _ => {
            tracing::debug!(uid, kind = kind.as_str(), name, user, operation = req.operation.as_str(), ?nodes, findings = %findings, decision = verdict.decision.as_str(), "policy review")
        }
    }
}
