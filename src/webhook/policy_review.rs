//! `POST /validate/gpu-policy`: AdmissionReviews of ClusterPolicy, NVIDIADriver and GPUCluster changes,
//! decided over every node the guard knows ([`decide_objects`]).
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
use crate::core::facts::ClusterFacts;
use crate::core::labels::MAX_NAME_CHARS;
use crate::core::policy::{self, Decision, Verdict};
use crate::core::policy_change::PolicyKind;
use crate::core::review::Operation;
use crate::k8s::policy_object;
use crate::policy_decision::{ObjectChange, decide_objects, status_verdict};
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
    Ok(decide_objects(
        &change,
        facts,
        hook.fleet.as_deref(),
        &hook.policy,
    )?)
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
