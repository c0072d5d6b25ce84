//! The webhook: its routes (`/validate` for Nodes, [`node_review`]; `/validate/gpu-policy`,
//! [`policy_review`]), what they share ([`Webhook`]) and the limits that protect them
//! ([`Limits`]).
//!
//! A request's body is read by a layer of the transport ([`body`]), within the size limit,
//! the body timeout and the in-flight budget; the handlers take its bytes. Reading those bytes
//! as a review is [`read`]'s; why a request is refused, and the answer that says so,
//! [`bad_request`]'s.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use tokio::sync::{Semaphore, watch};
use tower_http::timeout::TimeoutLayer;

pub mod admitted;
pub mod bad_request;
mod body;
pub mod metrics;
pub mod node_review;
pub mod policy_review;
pub mod read;
pub mod response;
mod shares;

use bad_request::BadRequest;
pub use shares::{BODY_WINDOW, MAX_WAITING_BYTES, WAITING_ROOM};

use crate::core::echo::echo;
use crate::core::facts::ClusterFacts;
use crate::core::policy::Policy;
use crate::events::Events;
use crate::k8s::fleet::SharedFleet;
use crate::metrics::Metrics;

/// Limits that protect the server from slow or oversized clients.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// The API server sends at most about 3 MiB per review (it refuses larger requests, and no
    /// stored object exceeds etcd's 1.5 MiB, twice for an UPDATE); a large Node is ~100 KiB.
    pub max_body_bytes: usize,
    /// Request body bytes held at once across all connections. A body waits for room (up to
    /// the body timeout, then 503) instead of growing memory; at least `max_body_bytes`.
    pub max_inflight_body_bytes: usize,
    /// Time allowed for the whole body to arrive once headers are read.
    pub body_timeout: Duration,
    /// Time allowed for the whole request, body included.
    pub request_timeout: Duration,
    /// Requests in flight from one client address, across its connections ([`shares`]).
    pub max_requests_per_source: usize,
}

/// 3.5 MiB: the API server's ~3 MiB per review, and room for its envelope.
pub const DEFAULT_MAX_BODY_BYTES: usize = 3 * 1024 * 1024 + 512 * 1024;

/// Half of the default `--max-connections` (128): see [`shares`].
pub const DEFAULT_MAX_REQUESTS_PER_SOURCE: usize = 64;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_inflight_body_bytes: 3 * DEFAULT_MAX_BODY_BYTES,
            body_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            max_requests_per_source: DEFAULT_MAX_REQUESTS_PER_SOURCE,
        }
    }
}

/// What the handlers share across requests.
pub struct Webhook {
    pub policy: Policy,
    /// Updated by the cluster watch; the defaults when there is none.
    pub facts: watch::Receiver<Arc<ClusterFacts>>,
    pub metrics: Arc<Metrics>,
    pub limits: Limits,
    /// Every node's decision-relevant labels, kept by the cluster watch: GPU-policy changes are
    /// decided over them. `None` without a cluster watch.
    pub fleet: Option<Arc<SharedFleet>>,
    /// Where a refusal of a Node change is offered as an Event on the Node (never waited on);
    /// `None`: no Events.
    pub events: Option<Arc<Events>>,
    /// Room for request bodies, taken by the transport's layer ([`body`]).
    budget: body::Budget,
    /// One slow reading at a time: a body the scanner refused or cannot read, read again with
    /// serde to say why (serde's message for a wrongly typed string repeats it, escaped: up to
    /// six times its size before it is cut to
    /// [`MAX_ERROR_BYTES`](bad_request::MAX_ERROR_BYTES)), and a GPU-policy review,
    /// whose objects are read into trees. The API server sends neither often; a client that
    /// sends many waits its turn, and the memory they take stays that of one body.
    slow_read: Arc<Semaphore>,
    /// GPU-policy objects this replica let be created that the watch does not show yet: part
    /// of the next policy decisions ([`admitted`]).
    admitted: std::sync::Mutex<admitted::Admitted>,
}

impl Webhook {
    /// A webhook with fixed cluster facts (offline use and tests).
    pub fn new(policy: Policy, facts: ClusterFacts, metrics: Arc<Metrics>, limits: Limits) -> Self {
        let (_tx, rx) = watch::channel(Arc::new(facts));
        Self::watching(policy, rx, metrics, limits)
    }

    /// A webhook deciding with the facts `facts` holds at each request.
    pub fn watching(
        policy: Policy,
        facts: watch::Receiver<Arc<ClusterFacts>>,
        metrics: Arc<Metrics>,
        limits: Limits,
    ) -> Self {
        Webhook {
            policy,
            facts,
            metrics,
            limits,
            fleet: None,
            events: None,
            budget: body::Budget::new(&limits),
            slow_read: Arc::new(Semaphore::new(1)),
            admitted: std::sync::Mutex::default(),
        }
    }

    fn admitted_lock(&self) -> std::sync::MutexGuard<'_, admitted::Admitted> {
        self.admitted.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for the one slow reading at a time ([`slow_read`](Self::slow_read)).
    async fn slow_turn(&self) -> tokio::sync::SemaphorePermit<'_> {
        self.slow_read.acquire().await.expect("never closed")
    }
}

/// The webhook's HTTP routes, without any socket: tests drive it with `oneshot`.
pub fn router(webhook: Arc<Webhook>) -> Router {
    let request_timeout = webhook.limits.request_timeout;
    // On the reviews only: an unknown path or method is answered without reading its body.
    let read = middleware::from_fn_with_state(webhook.clone(), body::read_within_budget);
    Router::new()
        .route(
            "/validate",
            post(node_review::validate).route_layer(read.clone()),
        )
        .route(
            "/validate/gpu-policy",
            post(policy_review::validate_policy).route_layer(read),
        )
        .fallback(not_found)
        // The layer has read the body within `Limits::max_body_bytes`; axum's default limit
        // (2 MiB) would refuse the largest the API server sends.
        .layer(DefaultBodyLimit::disable())
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            request_timeout,
        ))
        .with_state(webhook)
}

async fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        "not found: the webhook answers POST /validate (Nodes) and POST /validate/gpu-policy (ClusterPolicy, NVIDIADriver)\n",
    )
        .into_response()
}

/// Answers a request that could not be reviewed, logged and counted.
fn refuse(hook: &Webhook, bad: BadRequest, uid: Option<String>) -> Response {
    tracing::warn!(uid = %echo(uid.as_deref().unwrap_or("")), reason = bad.reason(), error = %bad, "unreadable admission request");
    hook.metrics.reviews.observe_bad_request(bad.reason());
    bad.into_response(uid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::header;
    use node_review::MANY_LABELS;
    use tower::ServiceExt;

    fn review(labels: usize) -> Vec<u8> {
        let labels: serde_json::Map<String, serde_json::Value> = (0..labels)
            .map(|i| (format!("nvidia.com/gpu.deploy.u{i}"), "true".into()))
            .collect();
        serde_json::to_vec(&serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u", "kind": {"group": "", "version": "v1", "kind": "Node"},
                        "name": "n", "operation": "UPDATE",
                        "object": {"metadata": {"name": "n", "labels": labels}},
                        "oldObject": {"metadata": {"name": "n"}}}
        }))
        .unwrap()
    }

    fn post(app: &Router, body: Vec<u8>) -> tokio::task::JoinHandle<StatusCode> {
        let request = axum::http::Request::post("/validate")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body))
            .unwrap();
        let app = app.clone();
        tokio::spawn(async move { app.oneshot(request).await.unwrap().status() })
    }

    #[tokio::test]
    async fn a_review_of_thousands_of_labels_waits_for_the_slow_turn_and_a_real_one_does_not() {
        let hook = Arc::new(Webhook::new(
            Policy::default(),
            ClusterFacts::default(),
            Arc::new(Metrics::new()),
            Limits::default(),
        ));
        let app = router(hook.clone());
        let held = hook.slow_turn().await;
        // A node's worth of labels is decided while the turn is held elsewhere.
        assert_eq!(post(&app, review(200)).await.unwrap(), StatusCode::OK);
        let many = post(&app, review(MANY_LABELS + 1));
        // It has read its body and waits: the only permit is held here.
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert!(!many.is_finished(), "decided while the slow turn was held");
        drop(held);
        assert_eq!(many.await.unwrap(), StatusCode::OK);
    }
}
