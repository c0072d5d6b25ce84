//! `POST /validate/gpu-policy`: AdmissionReviews of ClusterPolicy, NVIDIADriver and GPUCluster changes,
//! decided over every node the guard knows ([`decide_objects`]).
//!
//! The body is read by [`read::policy`](super::read::policy), the decision is
//! [`policy_decision`](crate::policy_decision)'s; this route answers, with the same
//! AdmissionReview the node webhook gives.

use axum::Extension;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use bytes::Bytes;

use super::bad_request::BadRequest;
use super::body::Started;
use super::read::policy::{PolicyRequest, parse_policy_review};
use super::response::json_response;
use super::{Webhook, refuse};
use crate::core::echo::echo;
use crate::core::facts::ClusterFacts;
use crate::core::policy::{self, Decision, Verdict};
use crate::core::policy_change::PolicyKind;
use crate::core::review::Operation;
use crate::policy_decision::{ObjectChange, decide_objects, status_verdict};
use std::sync::Arc;

/// `POST /validate/gpu-policy`: the body, read by the transport's layer
/// ([`body`](super::body)), as a ClusterPolicy or NVIDIADriver AdmissionReview.
pub(super) async fn validate_policy(
    State(hook): State<Arc<Webhook>>,
    Extension(Started(started)): Extension<Started>,
    bytes: Bytes,
) -> Response {
    // Its objects become trees, and a refused field's message repeats it: one at a time.
    let _turn = hook.slow_turn().await;
    let request = match parse_policy_review(&bytes) {
        Ok(r) => r,
        Err((bad, uid)) => return refuse(&hook, bad, uid),
    };
    let kind = match request.policy_kind() {
        Ok(kind) => kind,
        Err(bad) => return refuse(&hook, bad, Some(request.uid.clone())),
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

/// The verdict on `request`: its status subresource decides nothing; anything else is
/// decided by [`decide_objects`] over the fleet this replica keeps.
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
