//! The `/validate` endpoint: AdmissionReview in, the policy's verdict out.
//!
//! Every decision is HTTP 200 with an AdmissionReview. A request that cannot be
//! read as a Node AdmissionReview gets a 4xx whose body names the problem; the
//! API server then applies the webhook's failurePolicy.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use axum::Extension;
use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Version, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http_body_util::BodyExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tower_http::timeout::TimeoutLayer;

mod bad_request;
mod many_labels;
pub mod policy_review;
mod pruned;
pub mod read;
pub mod response;
mod shares;

pub use bad_request::BadRequest;
use bad_request::MAX_ERROR_BYTES;
pub use read::{
    MAX_NAME_CHARS, MAX_UID_CHARS, RequestView, Scanned, explain, label_syntax, parse_review,
    parse_with_serde, scan, scan_review,
};
use response::{json_response, respond};
pub use shares::{BODY_WINDOW, MAX_WAITING_BYTES, WAITING_ROOM};
use shares::{InFlight, Shares};

use crate::core::echo::{bounded_display, echo};
use crate::core::facts::ClusterFacts;
use crate::core::operands::Labels;
use crate::core::policy::{self, Decision, Exemptions, Operation, Policy, Review, Verdict};
use crate::k8s::fleet::Fleet;
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

/// Labels in a review (object and old object) beyond which it is decided in its turn.
const MANY_LABELS: usize = 2_000;

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

/// What the handler shares across requests.
pub struct Webhook {
    pub policy: Policy,
    /// Updated by the cluster watch; the defaults when there is none.
    pub facts: watch::Receiver<Arc<ClusterFacts>>,
    pub metrics: Arc<Metrics>,
    pub limits: Limits,
    /// Every node's decision-relevant labels, kept by the cluster watch: GPU-policy changes are
    /// decided over them. `None` without a cluster watch.
    pub fleet: Option<Arc<Fleet>>,
    /// Room for request bodies, in bytes: [`Limits::max_inflight_body_bytes`].
    body_budget: Arc<Semaphore>,
    /// The last [`Limits::max_body_bytes`] of the budget, for one body at a time (the holder
    /// of `overdraft_turn`). Bodies take room as their bytes arrive, so two half-read bodies
    /// could each wait for the room the other holds; the one whose turn it is always gets
    /// all it needs here, finishes and frees the rest.
    body_overdraft: Arc<Semaphore>,
    overdraft_turn: Arc<Semaphore>,
    /// Each source's share of the requests in flight and of `body_budget`.
    shares: Arc<Shares>,
    /// One slow reading at a time: a body the scanner refused or cannot read, read again with
    /// serde to say why (serde's message for a wrongly typed string repeats it, escaped: up to
    /// six times its size before it is cut to [`MAX_ERROR_BYTES`]), and a GPU-policy review,
    /// whose objects are read into trees. The API server sends neither often; a client that
    /// sends many waits its turn, and the memory they take stays that of one body.
    slow_read: Arc<Semaphore>,
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
        let max_body = limits.max_body_bytes.min(Semaphore::MAX_PERMITS);
        let budget = limits
            .max_inflight_body_bytes
            .max(limits.max_body_bytes)
            .saturating_sub(max_body)
            .min(Semaphore::MAX_PERMITS);
        Webhook {
            policy,
            facts,
            metrics,
            limits,
            fleet: None,
            shares: Arc::new(Shares::new(&limits, budget)),
            body_budget: Arc::new(Semaphore::new(budget)),
            body_overdraft: Arc::new(Semaphore::new(max_body)),
            overdraft_turn: Arc::new(Semaphore::new(1)),
            slow_read: Arc::new(Semaphore::new(1)),
        }
    }
}

impl Webhook {
    /// Waits for the one slow reading at a time ([`slow_read`](Self::slow_read)).
    async fn slow_turn(&self) -> tokio::sync::SemaphorePermit<'_> {
        self.slow_read.acquire().await.expect("never closed")
    }
}

/// The webhook's HTTP routes, without any socket: tests drive it with `oneshot`.
pub fn router(webhook: Arc<Webhook>) -> Router {
    let request_timeout = webhook.limits.request_timeout;
    Router::new()
        .route("/validate", post(validate))
        .route("/validate/gpu-policy", post(policy_review::validate_policy))
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
        "not found: the webhook answers POST /validate (Nodes) and POST /validate/gpu-policy (ClusterPolicy, NVIDIADriver)\n",
    )
        .into_response()
}

/// The client's address, which every request that came over a socket has.
pub(super) type Peer = Option<Extension<ConnectInfo<SocketAddr>>>;

/// [`read_body`] within the client source's share, or the refusal to answer with. The body
/// was then not read to its end, so the connection cannot carry another request: an HTTP/1.1
/// client is told so, and does not send its next request on a connection about to close
/// (HTTP/2 resets just the stream).
async fn read_body_or_refuse(
    hook: &Webhook,
    peer: Peer,
    version: Version,
    headers: &HeaderMap,
    mut body: Body,
) -> Result<(bytes::Bytes, Room), Response> {
    let source = peer.map(|Extension(ConnectInfo(addr))| addr.ip());
    let read = match hook.shares.enter(source) {
        Ok(in_flight) => read_body(hook, in_flight, headers, &mut body).await,
        Err(at_share) => {
            hook.metrics.observe_source_share_refusal(
                "requests",
                at_share.source.to_string(),
                at_share.held,
            );
            Err(BadRequest::SourceRequests(at_share.held))
        }
    };
    read.map_err(|bad| {
        let http1 = version < Version::HTTP_2;
        if http1 && bad.lingers() {
            linger(body, hook.limits);
        }
        let mut response = refuse(hook, bad, None);
        if http1 {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    })
}

/// Reads and drops what is left of a refused HTTP/1.1 body, for at most the body timeout and
/// the body limit, while the refusal is written. A connection closed with bytes unread is
/// reset, and a client still sending its body then loses the answer with it: it would see a
/// broken connection where a retryable 503 was sent. Nothing read is kept (each frame is
/// freed as it comes), and an HTTP/1.1 connection carries one request at a time, so this
/// costs no more than the connection it runs on.
fn linger(mut body: Body, limits: Limits) {
    tokio::spawn(async move {
        let drain = async {
            let mut read = 0usize;
            while let Some(Ok(frame)) = body.frame().await {
                read += frame.data_ref().map_or(0, |d| d.len());
                if read > limits.max_body_bytes {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(limits.body_timeout, drain).await;
    });
}

async fn validate(
    State(hook): State<Arc<Webhook>>,
    peer: Peer,
    version: Version,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    // Held until the answer is made: the request's place in its source's share, the body's
    // room in the budget.
    let (bytes, _room) = match read_body_or_refuse(&hook, peer, version, &headers, body).await {
        Ok(read) => read,
        Err(response) => return response,
    };
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
    tracing::warn!(uid = %echo(uid.as_deref().unwrap_or("")), reason = bad.reason(), error = %bad, "unreadable admission request");
    hook.metrics.observe_bad_request(bad.reason());
    bad.into_response(uid)
}

/// A request's room: its place in its source's share, its body's bytes in the budget and in
/// its source's part of it, and in the overdraft once it is its turn there.
struct Room {
    budget: Option<OwnedSemaphorePermit>,
    source: Option<OwnedSemaphorePermit>,
    overdraft: Option<OwnedSemaphorePermit>,
    turn: Option<OwnedSemaphorePermit>,
    /// Dropped last: the source's entry goes with its last request.
    in_flight: InFlight,
}

/// What a body waits for, if anything, as [`Room::take`] sets it.
const NOT_WAITING: u8 = 0;
const WAITING_FOR_BUDGET: u8 = 1;
const WAITING_FOR_SOURCE: u8 = 2;

impl Room {
    fn new(in_flight: InFlight) -> Self {
        Room {
            budget: None,
            source: None,
            overdraft: None,
            turn: None,
            in_flight,
        }
    }

    fn add(held: &mut Option<OwnedSemaphorePermit>, permit: OwnedSemaphorePermit) {
        match held {
            Some(h) => h.merge(permit),
            None => *held = Some(permit),
        }
    }

    /// Takes room for `n` more bytes, after which at most `ahead` more may come: from the
    /// budget and the source's part of it when both have some now; else, in a place among the
    /// bodies waiting ([`Shares::wait`], as large as what it may hold meanwhile), from
    /// whichever comes first, both of those or the overdraft's turn. The body whose turn it
    /// is takes the rest of its room from the overdraft, which always has it (a body is at
    /// most its size). `waiting` says what it waits for. With no place to wait, the body is
    /// refused.
    async fn take(
        &mut self,
        hook: &Webhook,
        n: usize,
        ahead: usize,
        waiting: &AtomicU8,
    ) -> Result<(), BadRequest> {
        // Every semaphore here is never closed.
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        if self.turn.is_some() {
            let permit = hook.body_overdraft.clone().acquire_many_owned(n).await;
            Self::add(&mut self.overdraft, permit.expect("never closed"));
            return Ok(());
        }
        let source = self.in_flight.body.clone();
        if let Ok(own) = source.clone().try_acquire_many_owned(n)
            && let Ok(permit) = hook.body_budget.clone().try_acquire_many_owned(n)
        {
            Self::add(&mut self.source, own);
            Self::add(&mut self.budget, permit);
            return Ok(());
        }
        let may_hold = n as usize + ahead.min(BODY_WINDOW);
        let _place = hook
            .shares
            .wait(&self.in_flight, may_hold)
            .map_err(|none| {
                if none.source_full {
                    hook.metrics.observe_source_share_refusal(
                        "body-waits",
                        self.in_flight.source.to_string(),
                        none.of_source,
                    );
                }
                BadRequest::TooManyWaiting {
                    waiting: none.waiting,
                    of_source: none.of_source,
                    room: none.room.bytes,
                    per_source: none.room.per_source,
                }
            })?;
        let short_of_source = source.available_permits() < n as usize;
        waiting.store(
            if short_of_source {
                WAITING_FOR_SOURCE
            } else {
                WAITING_FOR_BUDGET
            },
            Ordering::Relaxed,
        );
        let both = async {
            let own = source.acquire_many_owned(n).await;
            waiting.store(WAITING_FOR_BUDGET, Ordering::Relaxed);
            let permit = hook.body_budget.clone().acquire_many_owned(n).await;
            (own.expect("never closed"), permit.expect("never closed"))
        };
        tokio::select! {
            (own, permit) = both => {
                Self::add(&mut self.source, own);
                Self::add(&mut self.budget, permit);
            }
            turn = hook.overdraft_turn.clone().acquire_owned() => {
                self.turn = Some(turn.expect("never closed"));
                let permit = hook.body_overdraft.clone().acquire_many_owned(n).await;
                Self::add(&mut self.overdraft, permit.expect("never closed"));
            }
        }
        waiting.store(NOT_WAITING, Ordering::Relaxed);
        Ok(())
    }
}

/// Reads the body, within the size limit, the body timeout and the in-flight budget; returns
/// it with its room in the budget, to hold until the answer is made.
async fn read_body(
    hook: &Webhook,
    in_flight: InFlight,
    headers: &HeaderMap,
    body: &mut Body,
) -> Result<(bytes::Bytes, Room), BadRequest> {
    let limits = &hook.limits;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    let media = content_type.split(';').next().unwrap_or_default().trim();
    if !media.eq_ignore_ascii_case("application/json") {
        return Err(BadRequest::ContentType(echo(&content_type).into_owned()));
    }
    let limit = limits.max_body_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(BadRequest::TooLarge { limit });
    }
    // Whether the time ran out waiting for room rather than for bytes, and for which.
    let waiting = AtomicU8::new(NOT_WAITING);
    let mut held = Room::new(in_flight);
    let declared = declared.and_then(|n| usize::try_from(n).ok());
    let mut collected = Collected::new(declared);
    let mut len = 0;
    let read = async {
        // Room is taken for the bytes that arrived, as they arrive: a declared length alone
        // holds nothing, so streams that announce 3.5 MiB and send none cannot fill the
        // budget and make every other body wait. Nor is memory allocated ahead of bytes.
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                if is_length_limit(&e) {
                    BadRequest::TooLarge { limit }
                } else {
                    BadRequest::BodyRead(bounded_display(&e, MAX_ERROR_BYTES))
                }
            })?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            if len + data.len() > limit {
                return Err(BadRequest::TooLarge { limit });
            }
            if data.is_empty() {
                continue;
            }
            let ahead = declared.map_or(BODY_WINDOW, |d| d.saturating_sub(len + data.len()));
            held.take(hook, data.len(), ahead, &waiting).await?;
            len += data.len();
            collected.push(data);
        }
        Ok(())
    };
    match tokio::time::timeout(limits.body_timeout, read).await {
        Err(_) => match waiting.load(Ordering::Relaxed) {
            WAITING_FOR_SOURCE => {
                hook.metrics.observe_source_share_refusal(
                    "body-bytes",
                    held.in_flight.source.to_string(),
                    hook.shares.body_share() - held.in_flight.body.available_permits(),
                );
                Err(BadRequest::SourceBytes(limits.body_timeout))
            }
            WAITING_FOR_BUDGET => Err(BadRequest::Busy(limits.body_timeout)),
            _ => Err(BadRequest::BodyTimeout(limits.body_timeout)),
        },
        Ok(Err(bad)) => Err(bad),
        Ok(Ok(())) => Ok((collected.finish(len), held)),
    }
}

/// A body as its frames arrive, held so that its memory is the bytes that came.
///
/// With a declared length, a buffer of that capacity is made at the first byte, and each
/// frame is copied in and freed as it comes: the buffer's pages become resident only as they
/// are written, so a length declared and not sent costs address space, not memory, and no
/// frame (nor the codec buffer it is a slice of) outlives its copy. Without one, the frames
/// are kept as they came and copied once at the end into a buffer of the body's size (grown
/// frame by frame, it would hold up to twice the bytes its room counts). A body of one frame
/// is never copied.
struct Collected {
    declared: Option<usize>,
    buf: Vec<u8>,
    frames: Vec<bytes::Bytes>,
}

impl Collected {
    fn new(declared: Option<usize>) -> Self {
        Collected {
            declared,
            buf: Vec::new(),
            frames: Vec::new(),
        }
    }

    fn push(&mut self, data: bytes::Bytes) {
        match self.declared {
            Some(n) if !(self.buf.is_empty() && data.len() == n) => {
                if self.buf.capacity() == 0 {
                    self.buf.reserve_exact(n);
                }
                self.buf.extend_from_slice(&data);
            }
            _ => self.frames.push(data),
        }
    }

    /// The body, `len` bytes, as one buffer.
    fn finish(mut self, len: usize) -> bytes::Bytes {
        if !self.buf.is_empty() {
            return bytes::Bytes::from(self.buf);
        }
        if self.frames.len() <= 1 {
            return self.frames.pop().unwrap_or_default();
        }
        let mut body = Vec::with_capacity(len);
        for frame in self.frames {
            body.extend_from_slice(&frame);
        }
        bytes::Bytes::from(body)
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
        if req.label_count() > MANY_LABELS {
            let (old, new, not_copied) =
                many_labels::copy(req.old_object.as_ref(), req.object.as_ref(), facts);
            return Ok(RequestLabels {
                old,
                new,
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
        }
    }
}

fn log_verdict(req: &RequestView<'_>, verdict: &Verdict) {
    // Bounded: names were checked, but a username is not.
    let user = &*echo(req.user_info.username.as_deref().unwrap_or_default());
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

#[cfg(test)]
mod tests {
    use super::*;
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
