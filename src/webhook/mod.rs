//! The `/validate` endpoint: AdmissionReview in, the policy's verdict out.
//!
//! Every decision is HTTP 200 with an AdmissionReview. A request that cannot be
//! read as a Node AdmissionReview gets a 4xx whose body names the problem; the
//! API server then applies the webhook's failurePolicy.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use tokio::sync::watch;
use tower_http::timeout::TimeoutLayer;

pub mod response;
pub mod review;
pub mod scan;

use response::respond;
use review::{RequestView, ReviewBody};

use crate::core::facts::ClusterFacts;
use crate::core::operands::Labels;
use crate::core::policy::{self, Decision, Operation, Policy, Review, Verdict};
use crate::metrics::Metrics;

/// Limits that protect the server from slow or oversized clients.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// The API server sends the object and the old object: a large Node is ~100 KiB, and no
    /// stored object exceeds etcd's 1.5 MiB, so 8 MiB leaves room and still bounds memory.
    pub max_body_bytes: usize,
    /// Time allowed for the whole body to arrive once headers are read.
    pub body_timeout: Duration,
    /// Time allowed for the whole request, body included.
    pub request_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 8 * 1024 * 1024,
            body_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
        }
    }
}

/// What the handler shares across requests.
pub struct Webhook {
    pub policy: Policy,
    /// Updated by the cluster watch; the defaults when there is none.
    pub facts: watch::Receiver<Arc<ClusterFacts>>,
    pub metrics: Arc<Metrics>,
    pub limits: Limits,
}

impl Webhook {
    /// A webhook with fixed cluster facts (offline use and tests).
    pub fn new(policy: Policy, facts: ClusterFacts, metrics: Arc<Metrics>, limits: Limits) -> Self {
        let (_tx, rx) = watch::channel(Arc::new(facts));
        Webhook {
            policy,
            facts: rx,
            metrics,
            limits,
        }
    }
}

/// The webhook's HTTP routes, without any socket: tests drive it with `oneshot`.
pub fn router(webhook: Arc<Webhook>) -> Router {
    let request_timeout = webhook.limits.request_timeout;
    Router::new()
        .route("/validate", post(validate))
        .fallback(not_found)
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            request_timeout,
        ))
        .with_state(webhook)
}

async fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        "not found: the webhook answers POST /validate\n",
    )
        .into_response()
}

/// Why a request could not be reviewed. Each variant maps to one HTTP status.
#[derive(Debug, thiserror::Error)]
pub enum BadRequest {
    #[error("Content-Type must be application/json, got {0:?}")]
    ContentType(String),
    #[error("request body is larger than the limit of {limit} bytes")]
    TooLarge { limit: usize },
    #[error("request body not received within {0:?}")]
    BodyTimeout(Duration),
    #[error("request body could not be read: {0}")]
    BodyRead(String),
    #[error("request body is empty: expected an AdmissionReview")]
    Empty,
    #[error("request body is not JSON: {0}")]
    NotJson(String),
    #[error("request body is truncated JSON: {0}")]
    Truncated(String),
    #[error("request body is not a valid AdmissionReview: {path}: {message}")]
    Invalid { path: String, message: String },
    #[error(
        "AdmissionReview {0} is not supported: only admission.k8s.io/v1 (set admissionReviewVersions: [\"v1\"])"
    )]
    Version(String),
    #[error("expected kind AdmissionReview, got {0:?}")]
    Kind(String),
    #[error("AdmissionReview has no `request`")]
    NoRequest,
    #[error("only Nodes (core/v1) are reviewed, got {0}: check the webhook's rules")]
    NotANode(String),
    #[error("{operation} request has no `{field}`")]
    MissingObject {
        operation: &'static str,
        field: &'static str,
    },
}

impl BadRequest {
    fn status(&self) -> StatusCode {
        match self {
            BadRequest::ContentType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            BadRequest::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            BadRequest::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            _ => StatusCode::BAD_REQUEST,
        }
    }

    /// A short, fixed reason for the metrics label.
    fn reason(&self) -> &'static str {
        match self {
            BadRequest::ContentType(_) => "content-type",
            BadRequest::TooLarge { .. } => "too-large",
            BadRequest::BodyTimeout(_) => "body-timeout",
            BadRequest::BodyRead(_) => "body-read",
            BadRequest::Empty => "empty",
            BadRequest::NotJson(_) => "not-json",
            BadRequest::Truncated(_) => "truncated",
            BadRequest::Invalid { .. } => "invalid",
            BadRequest::Version(_) => "version",
            BadRequest::Kind(_) => "kind",
            BadRequest::NoRequest => "no-request",
            BadRequest::NotANode(_) => "not-a-node",
            BadRequest::MissingObject { .. } => "missing-object",
        }
    }

    fn into_response(self, uid: Option<String>) -> Response {
        let body = response::invalid(self.to_string(), self.status().as_u16(), uid);
        json_response(self.status(), &body)
    }
}

async fn validate(State(hook): State<Arc<Webhook>>, headers: HeaderMap, body: Body) -> Response {
    let started = Instant::now();
    let bytes = match read_body(&hook.limits, &headers, body).await {
        Ok(bytes) => bytes,
        Err(bad) => return refuse(&hook, bad, None),
    };
    let request = match parse_review(&bytes) {
        Ok(request) => request,
        Err((bad, uid)) => return refuse(&hook, bad, uid),
    };
    let facts = hook.facts.borrow().clone();
    let verdict = match review_request(&request, &facts, &hook.policy) {
        Ok(v) => v,
        Err(bad) => return refuse(&hook, bad, Some(request.uid.clone())),
    };
    let response = respond(&request, &verdict);
    let seconds = started.elapsed().as_secs_f64();
    hook.metrics.observe_review(
        verdict.decision.as_str(),
        request.operation.as_str(),
        verdict
            .findings
            .iter()
            .map(|f| (f.rule.id(), f.action.as_str())),
        seconds,
    );
    log_verdict(&request, &verdict);
    json_response(StatusCode::OK, &response)
}

fn refuse(hook: &Webhook, bad: BadRequest, uid: Option<String>) -> Response {
    tracing::warn!(uid = uid.as_deref().unwrap_or(""), reason = bad.reason(), error = %bad, "unreadable admission request");
    hook.metrics.observe_bad_request(bad.reason());
    bad.into_response(uid)
}

async fn read_body(
    limits: &Limits,
    headers: &HeaderMap,
    body: Body,
) -> Result<bytes::Bytes, BadRequest> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    let media = content_type.split(';').next().unwrap_or_default().trim();
    if !media.eq_ignore_ascii_case("application/json") {
        return Err(BadRequest::ContentType(content_type));
    }
    let limit = limits.max_body_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(BadRequest::TooLarge { limit });
    }
    let read = axum::body::to_bytes(body, limit);
    match tokio::time::timeout(limits.body_timeout, read).await {
        Err(_) => Err(BadRequest::BodyTimeout(limits.body_timeout)),
        Ok(Err(e)) if is_length_limit(&e) => Err(BadRequest::TooLarge { limit }),
        Ok(Err(e)) => Err(BadRequest::BodyRead(e.to_string())),
        Ok(Ok(bytes)) => Ok(bytes),
    }
}

fn is_length_limit(error: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        if e.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = e.source();
    }
    false
}

/// Reads the body as a v1 Node AdmissionReview. On failure, returns the uid when it was readable,
/// so the API server can match even an error answer.
pub fn parse_review(bytes: &[u8]) -> Result<RequestView<'_>, (BadRequest, Option<String>)> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err((BadRequest::Empty, None));
    }
    // The scanner reads what the webhook needs and skips the rest unbuilt (`scan`). It refuses
    // exactly what serde refuses (tests/scan_differential.rs), so a body it refuses is read again
    // with serde, to say where and why, or to read one of the rare forms it leaves to serde.
    let review = match scan::scan(bytes) {
        Ok(review) => review,
        Err(_) => return parse_with_serde(bytes),
    };
    check_review(&review.kind, &review.api_version)?;
    review
        .request
        .map(RequestView::from)
        .ok_or((BadRequest::NoRequest, None))
}

/// `parse_review` with serde alone: the reference reading of a review.
pub fn parse_with_serde(bytes: &[u8]) -> Result<RequestView<'_>, (BadRequest, Option<String>)> {
    // Read without tracking the path: serde_path_to_error copies every map key it passes, a
    // large Node's ~200 labels included. Only a body that fails is read again, to say where.
    let review: ReviewBody<'_> = match serde_json::from_slice(bytes) {
        Ok(review) => review,
        Err(error) => return Err(unreadable(bytes, error)),
    };
    check_review(review.kind.as_str(), review.api_version.as_str())?;
    review.request.ok_or((BadRequest::NoRequest, None))
}

fn check_review(kind: &str, api_version: &str) -> Result<(), (BadRequest, Option<String>)> {
    if kind != "AdmissionReview" {
        return Err((BadRequest::Kind(kind.to_owned()), None));
    }
    if api_version != "admission.k8s.io/v1" {
        return Err((BadRequest::Version(api_version.to_owned()), None));
    }
    Ok(())
}

/// Why serde_json refused a body, with the path to the field at fault and the uid when it can
/// still be found.
fn unreadable(bytes: &[u8], error: serde_json::Error) -> (BadRequest, Option<String>) {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let e = match serde_path_to_error::deserialize::<_, ReviewBody<'_>>(&mut de) {
        Err(e) => e,
        // The document itself was fine; what follows it is not.
        Ok(_) => return (BadRequest::NotJson(error.to_string()), None),
    };
    let path = e.path().to_string();
    let inner = e.into_inner();
    let bad = match inner.classify() {
        serde_json::error::Category::Eof => BadRequest::Truncated(inner.to_string()),
        serde_json::error::Category::Syntax => BadRequest::NotJson(inner.to_string()),
        _ => BadRequest::Invalid {
            path: if path == "." {
                "(top level)".to_owned()
            } else {
                path
            },
            message: inner.to_string(),
        },
    };
    (bad, uid_of(bytes))
}

/// The uid of a review whose body failed to parse as a whole, when it can still be found.
fn uid_of(bytes: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Outer {
        request: Option<Inner>,
    }
    #[derive(serde::Deserialize)]
    struct Inner {
        uid: Option<String>,
    }
    serde_json::from_slice::<Outer>(bytes).ok()?.request?.uid
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
            "{group}/{} {}",
            kind.version, kind.kind
        )));
    }
    let labels = RequestLabels::of(req, facts)?;
    Ok(policy::decide(&labels.review(req), facts, policy))
}

/// A request's labels as the policy reads them: before (`None` for CREATE) and after.
pub struct RequestLabels {
    old: Option<Labels>,
    new: Labels,
}

impl RequestLabels {
    /// Checks that the request carries the objects its operation needs, and copies the labels
    /// the policy reads under `facts` (`policy::reads_label`).
    pub fn of(req: &RequestView<'_>, facts: &ClusterFacts) -> Result<Self, BadRequest> {
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
        let old = req.old_object.as_ref().map(|o| o.labels(facts));
        let new = match &req.object {
            Some(object) => object.labels(facts),
            // DELETE and CONNECT carry only the old object.
            None => old.clone().unwrap_or_default(),
        };
        Ok(RequestLabels { old, new })
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
            groups: req.user_info.groups.as_deref().unwrap_or_default(),
            dry_run: req.dry_run,
        }
    }
}

fn log_verdict(req: &RequestView<'_>, verdict: &Verdict) {
    let user = req.user_info.username.as_deref().unwrap_or_default();
    let findings: Vec<String> = verdict
        .findings
        .iter()
        .map(|f| format!("{}={}", f.rule, f.action.as_str()))
        .collect();
    let findings = findings.join(",");
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

fn json_response<T: serde::Serialize>(status: StatusCode, body: &T) -> Response {
    match serde_json::to_vec(body) {
        Ok(bytes) => (status, [(header::CONTENT_TYPE, "application/json")], bytes).into_response(),
        // Serializing our own response types cannot fail; answer anyway rather than panic.
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot encode response: {e}\n"),
        )
            .into_response(),
    }
}
