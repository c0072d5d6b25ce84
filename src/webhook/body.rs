//! The transport's part of a review, as a layer in front of the handlers ([`read_within_budget`]):
//! the body read within the size limit, the body timeout and the in-flight budget, each client
//! source within its share ([`shares`](super::shares)), and handed on as one buffer of bytes,
//! or the request refused. A refused HTTP/1.1 body is read to its end while the refusal is
//! written ([`linger`]) when the client may still be sending it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Instant;

use axum::Extension;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, Version, header};
use axum::middleware::Next;
use axum::response::Response;
use http_body_util::BodyExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::bad_request::{BadRequest, MAX_ERROR_BYTES};
use super::shares::{BODY_WINDOW, InFlight, Shares};
use super::{Limits, Webhook};
use crate::core::echo::{bounded_display, echo};

/// Room for request bodies: the in-flight budget, its overdraft and each source's share.
pub(super) struct Budget {
    /// Room for request bodies, in bytes: [`Limits::max_inflight_body_bytes`].
    bytes: Arc<Semaphore>,
    /// The last [`Limits::max_body_bytes`] of the budget, for one body at a time (the holder
    /// of `overdraft_turn`). Bodies take room as their bytes arrive, so two half-read bodies
    /// could each wait for the room the other holds; the one whose turn it is always gets
    /// all it needs here, finishes and frees the rest.
    overdraft: Arc<Semaphore>,
    overdraft_turn: Arc<Semaphore>,
    /// Each source's share of the requests in flight and of `bytes`.
    shares: Arc<Shares>,
}

impl Budget {
    pub(super) fn new(limits: &Limits) -> Self {
        let max_body = limits.max_body_bytes.min(Semaphore::MAX_PERMITS);
        let budget = limits
            .max_inflight_body_bytes
            .max(limits.max_body_bytes)
            .saturating_sub(max_body)
            .min(Semaphore::MAX_PERMITS);
        Budget {
            shares: Arc::new(Shares::new(limits, budget)),
            bytes: Arc::new(Semaphore::new(budget)),
            overdraft: Arc::new(Semaphore::new(max_body)),
            overdraft_turn: Arc::new(Semaphore::new(1)),
        }
    }
}

/// When the request's headers were read: a review's time counts its body's reading.
#[derive(Clone, Copy)]
pub(super) struct Started(pub(super) Instant);

/// The layer: reads the body ([`read_body_or_refuse`]) and hands the request on with the body
/// as one buffer and [`Started`]; holds the body's room until the answer is made.
pub(super) async fn read_within_budget(
    State(hook): State<Arc<Webhook>>,
    peer: Peer,
    request: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    let (mut parts, body) = request.into_parts();
    let (bytes, room) =
        match read_body_or_refuse(&hook, peer, parts.version, &parts.headers, body).await {
            Ok(read) => read,
            Err(response) => return response,
        };
    parts.extensions.insert(Started(started));
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    // Held until the answer is made: the request's place in its source's share, the body's
    // room in the budget.
    drop(room);
    response
}

/// The client's address, which every request that came over a socket has.
type Peer = Option<Extension<ConnectInfo<SocketAddr>>>;

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
    let read = match hook.budget.shares.enter(source) {
        Ok(in_flight) => read_body(hook, in_flight, headers, &mut body).await,
        Err(at_share) => {
            hook.metrics.shares.observe_refusal(
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
        let mut response = super::refuse(hook, bad, None);
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
            let permit = hook.budget.overdraft.clone().acquire_many_owned(n).await;
            Self::add(&mut self.overdraft, permit.expect("never closed"));
            return Ok(());
        }
        let source = self.in_flight.body.clone();
        if let Ok(own) = source.clone().try_acquire_many_owned(n)
            && let Ok(permit) = hook.budget.bytes.clone().try_acquire_many_owned(n)
        {
            Self::add(&mut self.source, own);
            Self::add(&mut self.budget, permit);
            return Ok(());
        }
        let may_hold = n as usize + ahead.min(BODY_WINDOW);
        let _place = hook
            .budget
            .shares
            .wait(&self.in_flight, may_hold)
            .map_err(|none| {
                if none.source_full {
                    hook.metrics.shares.observe_refusal(
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
            let permit = hook.budget.bytes.clone().acquire_many_owned(n).await;
            (own.expect("never closed"), permit.expect("never closed"))
        };
        tokio::select! {
            (own, permit) = both => {
                Self::add(&mut self.source, own);
                Self::add(&mut self.budget, permit);
            }
            turn = hook.budget.overdraft_turn.clone().acquire_owned() => {
                self.turn = Some(turn.expect("never closed"));
                let permit = hook.budget.overdraft.clone().acquire_many_owned(n).await;
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
                hook.metrics.shares.observe_refusal(
                    "body-bytes",
                    held.in_flight.source.to_string(),
                    hook.budget.shares.body_share() - held.in_flight.body.available_permits(),
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
