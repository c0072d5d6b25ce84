//! `POST /validate`: a Node AdmissionReview, read ([`read`](super::read)) and decided by the
//! policy over the labels it reads ([`RequestLabels`]).
//!
//! Every decision is HTTP 200 with an AdmissionReview. A request that cannot be read as a Node
//! AdmissionReview gets a 4xx whose body names the problem; the API server then applies the
//! webhook's failurePolicy.

use std::sync::Arc;

use axum::Extension;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use bytes::Bytes;

use super::bad_request::BadRequest;
use super::body::Started;
use super::read::{NodeLabels, RequestView, Scanned, explain, scan_review};
use super::response::{json_response, respond};
use super::{Webhook, refuse};
use crate::core::echo::echo;
use crate::core::facts::ClusterFacts;
use crate::core::operands::Labels;
use crate::core::placement::NodePlacement;
use crate::core::policy::{self, Decision, Exemptions, Policy, Verdict};
use crate::core::review::{Operation, Review};
use crate::core::rules::Action;
use crate::events::Events;

mod many_labels;

/// Labels in a review (object and old object) beyond which it is decided in its turn.
pub(super) const MANY_LABELS: usize = 2_000;

/// `POST /validate`: the body, read by the transport's layer ([`body`](super::body)), as a
/// Node AdmissionReview; the policy's verdict as its answer.
pub(super) async fn validate(
    State(hook): State<Arc<Webhook>>,
    Extension(Started(started)): Extension<Started>,
    bytes: Bytes,
) -> Response {
    let request = match scan_review(&bytes) {
        Scanned::Read(request) => request,
        Scanned::Refused(bad, uid) => return refuse(&hook, bad, uid),
        Scanned::ToSerde(why) => {
            let _turn = hook.slow_turn().await;
            match explain(&bytes, why.as_ref()) {
                Ok(request) => request,
                Err((bad, uid)) => return refuse(&hook, bad, uid),
            }
        }
    };
    // The decision copies the labels it reads: a review of thousands of labels (a real GPU
    // node has 100 to 300) is decided in its turn, one at a time.
    let _turn = if request.label_count() > MANY_LABELS {
        Some(hook.slow_turn().await)
    } else {
        None
    };
    let facts = hook.facts.borrow().clone();
    let verdict = match review_request(&request, &facts, &hook.policy) {
        Ok(v) => v,
        Err(bad) => return refuse(&hook, bad, Some(request.uid.clone())),
    };
    let response = respond(&request, &verdict);
    let seconds = started.elapsed().as_secs_f64();
    hook.metrics.reviews.observe(
        verdict.decision,
        request.operation,
        verdict.findings.iter().map(|f| (f.rule, f.action)),
        seconds,
    );
    log_verdict(&request, &verdict);
    if let Some(events) = &hook.events {
        offer_refusal(events, &request, &verdict);
    }
    json_response(StatusCode::OK, &response)
}

/// A refused change, not a dry run, as an Event on the Node per refusing rule: handed to the
/// replica's queue, never waited on.
fn offer_refusal(events: &Events, req: &RequestView<'_>, verdict: &Verdict) {
    if verdict.decision != Decision::Denied || req.dry_run {
        return;
    }
    let node = match (&req.object, req.name.is_empty()) {
        (Some(object), true) => object.name(),
        _ => req.name.as_str(),
    };
    if node.is_empty() {
        return;
    }
    let user = echo(req.user_info.username.as_deref().unwrap_or_default());
    let denied = verdict
        .findings
        .iter()
        .filter(|f| f.action == Action::Deny)
        .map(|f| (f.rule, f.message.as_str()));
    events.refused(node, &user, denied);
}

/// Checks what the request is about and runs the policy on it.
pub fn review_request(
    req: &RequestView<'_>,
    facts: &ClusterFacts,
    policy: &Policy,
) -> Result<Verdict, BadRequest> {
    let kind = &req.kind;
    if !(kind.group.is_empty() && kind.version == "v1" && kind.kind == "Node") {
        let group = if kind.group.is_empty() {
            "core"
        } else {
            &kind.group
        };
        return Err(BadRequest::NotANode(format!(
            "{}/{} {}",
            echo(group),
            echo(&kind.version),
            echo(&kind.kind)
        )));
    }
    let labels = RequestLabels::of(req, facts, &policy.exemptions)?;
    Ok(policy::decide(&labels.review(req), facts, policy))
}

/// A request's labels as the policy reads them: before (`None` for CREATE) and after; and the
/// user's groups it reads.
pub struct RequestLabels {
    old: Option<Labels>,
    new: Labels,
    /// The old object's taints and cordon, and the new one's.
    old_placement: Option<NodePlacement>,
    placement: NodePlacement,
    /// Written unknown deploy keys left out of `new` ([`many_labels`]).
    not_copied: usize,
    /// The user's group `exemptions` name first, if any ([`policy::exempt_groups`]).
    groups: Vec<String>,
}

impl RequestLabels {
    /// Checks that the request carries the objects its operation needs, and copies the labels
    /// the policy reads under `facts` (`policy::reads_label`) and the groups `exemptions` name.
    pub fn of(
        req: &RequestView<'_>,
        facts: &ClusterFacts,
        exemptions: &Exemptions,
    ) -> Result<Self, BadRequest> {
        let groups = policy::exempt_groups(req.user_info.groups(), exemptions);
        let operation = req.operation;
        if req.object.is_none() && matches!(operation, Operation::Create | Operation::Update) {
            return Err(BadRequest::MissingObject {
                operation: operation.as_str(),
                field: "object",
            });
        }
        if operation == Operation::Update && req.old_object.is_none() {
            return Err(BadRequest::MissingObject {
                operation: "UPDATE",
                field: "oldObject",
            });
        }
        let placement_of = |node: &NodeLabels<'_>, object: &str| {
            node.placement()
                .map_err(|(path, message)| BadRequest::Invalid {
                    path: format!("request.{object}.{path}"),
                    message,
                })
        };
        let old_placement = req
            .old_object
            .as_ref()
            .map(|o| placement_of(o, "oldObject"))
            .transpose()?;
        let placement = match &req.object {
            Some(object) => placement_of(object, "object")?,
            None => old_placement.clone().unwrap_or_default(),
        };
        if req.label_count() > MANY_LABELS {
            let (old, new, not_copied) =
                many_labels::copy(req.old_object.as_ref(), req.object.as_ref(), facts);
            return Ok(RequestLabels {
                old,
                new,
                old_placement,
                placement,
                not_copied,
                groups,
            });
        }
        let old = req.old_object.as_ref().map(|o| o.labels(facts));
        let new = match &req.object {
            Some(object) => object.labels(facts),
            // DELETE and CONNECT carry only the old object.
            None => old.clone().unwrap_or_default(),
        };
        Ok(RequestLabels {
            old,
            new,
            old_placement,
            placement,
            not_copied: 0,
            groups,
        })
    }

    /// What the policy judges: `req` with these labels.
    pub fn review<'a>(&'a self, req: &'a RequestView<'_>) -> Review<'a> {
        let node = match (&req.object, req.name.is_empty()) {
            (Some(object), true) => object.name(),
            _ => req.name.as_str(),
        };
        Review {
            node,
            operation: req.operation,
            old_labels: self.old.as_ref(),
            labels: &self.new,
            username: req.user_info.username.as_deref().unwrap_or_default(),
            groups: &self.groups,
            dry_run: req.dry_run,
            unknown_not_copied: self.not_copied,
            old_placement: self.old_placement.as_ref(),
            placement: &self.placement,
        }
    }
}

fn log_verdict(req: &RequestView<'_>, verdict: &Verdict) {
    // Bounded: names were checked, but a username is not.
    let user = &*echo(req.user_info.username.as_deref().unwrap_or_default());
    let findings = verdict.findings_in_words();
    match verdict.decision {
        Decision::Denied => tracing::info!(
            uid = %req.uid, node = %req.name, user, dry_run = req.dry_run, decision = "denied",
            findings, reason = verdict.message.as_deref().unwrap_or_default(), "admission review"
        ),
        Decision::Exempt if verdict.would_deny.is_some() => tracing::info!(
            uid = %req.uid, node = %req.name, user, dry_run = req.dry_run, decision = "exempt",
            findings, would_deny = verdict.would_deny.as_deref().unwrap_or_default(), "admission review"
        ),
        _ if !verdict.findings.is_empty() => tracing::info!(
            uid = %req.uid, node = %req.name, user, dry_run = req.dry_run,
            decision = verdict.decision.as_str(), findings, "admission review"
        ),
        _ => tracing::debug!(
            uid = %req.uid, node = %req.name, user, dry_run = req.dry_run,
            decision = verdict.decision.as_str(), "admission review"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::facts::operator_defaults;
    use crate::core::rules::Rule;
    use crate::events::{EventMetrics, NodeEvent, Source};
    use crate::metrics::Metrics;
    use crate::webhook::{Limits, router};
    use axum::body::Body;
    use axum::http::header;
    use std::time::Duration;
    use tower::ServiceExt;

    const REFUSED: &[u8] =
        include_bytes!("../../tests/fixtures/reviews/lab-node-2-device-plugin-only.json");

    fn with(dry_run: bool, user: &str) -> Vec<u8> {
        let mut review: serde_json::Value = serde_json::from_slice(REFUSED).unwrap();
        review["request"]["dryRun"] = dry_run.into();
        review["request"]["userInfo"]["username"] = user.into();
        serde_json::to_vec(&review).unwrap()
    }

    async fn post(app: &axum::Router, body: Vec<u8>) {
        let request = axum::http::Request::post("/validate")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body))
            .unwrap();
        let answer = app.clone().oneshot(request).await.unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn a_refusal_is_offered_as_an_event_on_the_node_and_a_dry_run_is_not() {
        let metrics = Arc::new(Metrics::new());
        let event_metrics = metrics.with_registry(EventMetrics::register);
        let (events, mut queue) = Events::new(Duration::from_secs(600), event_metrics);
        let mut hook = Webhook::new(
            Policy::default(),
            operator_defaults(),
            metrics,
            Limits::default(),
        );
        hook.events = Some(events);
        let app = router(Arc::new(hook));

        post(&app, with(true, "alice")).await;
        assert!(queue.try_recv().is_err(), "a dry run made an Event");

        post(&app, with(false, "alice")).await;
        let event = queue.try_recv().expect("the refusal's Event");
        assert_eq!(
            (&*event.node, event.rule, event.source),
            (
                "lab-node-2",
                Rule::DevicePluginWithoutToolkit,
                Source::Refusal
            )
        );
        assert!(
            event.note.starts_with(
                "refused a change by alice: node lab-node-2: nvidia.com/gpu.deploy.device-plugin=true \
                 would run the NVIDIA device plugin without the container toolkit"
            ),
            "{}",
            event.note
        );
        // Only the refusing rule: the warnings of the same review make no Event.
        assert!(queue.try_recv().is_err());

        // The same refusal within the window, by anyone: no new Event.
        post(&app, with(false, "bob")).await;
        assert_eq!(queue.try_recv().ok(), None::<NodeEvent>);
    }
}
