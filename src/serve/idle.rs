//! Per-connection timeouts that tell an idle keep-alive connection from a slow request, and a
//! response the client does not take from one being written.
//!
//! hyper has one timer for HTTP/1.1 heads and idleness: its header read timeout starts as soon
//! as it waits for the next request head, so an idle connection is closed after the header
//! timeout. The API server keeps an idle connection to a webhook for 90 s and reuses it for the
//! next review. Closing it sooner makes every review after a pause pay a new TCP and TLS
//! handshake (about 1.5 ms through the API server), and a review sent just as the server closes
//! the connection fails; with `failurePolicy: Fail` the label change is then refused. HTTP/2 has
//! no idle timeout at all in hyper: its keep-alive PINGs only find peers that vanished, so a
//! client that answers them holds a connection forever. So, per connection:
//!
//! - a new HTTP/1.1 connection, and a request whose first bytes have arrived, must deliver the
//!   whole request head within the header timeout;
//! - while a request is being handled, the router's body and request timeouts apply;
//! - an answer must be taken by the client within the write timeout: its body sent in full
//!   (an HTTP/2 client may grant no flow-control window), and no write to the socket may stay
//!   blocked longer (a client that stops reading);
//! - between requests, the connection may stay idle for the idle timeout, whatever PINGs or
//!   other frames the client sends meanwhile.
//!
//! [`Clock`] follows these phases: [`Watched`] sees bytes arrive and writes block, the service
//! wrapper in `serve_http` sees requests start and handlers return, [`Tracked`] sees answers
//! end, and [`Clock::expired`] resolves when a phase outlives its limit.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

/// Which limit a connection outlived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Expired {
    Header,
    Idle,
    Write,
}

impl Expired {
    /// The `reason` label of `gpu_deploy_guard_webhook_connection_timeouts_total`.
    pub(super) fn reason(self) -> &'static str {
        match self {
            Expired::Header => "header",
            Expired::Idle => "idle",
            Expired::Write => "write",
        }
    }

    pub(super) fn describe(self) -> &'static str {
        match self {
            Expired::Header => "request head not received within the header timeout",
            Expired::Idle => "idle for the idle timeout",
            Expired::Write => "answer not taken by the client within the write timeout",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct State {
    /// Requests whose handler is running.
    handling: usize,
    /// Answers returned by their handler whose body is not sent yet.
    sending: usize,
    /// HTTP/1.1: (the rest of) a request head is due.
    head: bool,
    /// Since when a write to the socket has been waiting, if one is.
    write_blocked: Option<Instant>,
    /// When `handling`, `sending` or `head` last changed.
    since: Instant,
}

/// The phase of one connection and since when it is in it.
pub(super) struct Clock {
    state: Mutex<State>,
    changed: Notify,
    header_timeout: Duration,
    idle_timeout: Duration,
    write_timeout: Duration,
    /// HTTP/1.1 tracks request heads; HTTP/2 has its own framing and only idles.
    heads: bool,
}

impl Clock {
    /// A new HTTP/1.1 connection: its first request head is due within the header timeout.
    pub(super) fn http1(
        header_timeout: Duration,
        idle_timeout: Duration,
        write_timeout: Duration,
    ) -> Arc<Self> {
        Self::new(header_timeout, idle_timeout, write_timeout, true)
    }

    /// A new HTTP/2 connection (its preface already read): idle until a stream opens.
    pub(super) fn http2(idle_timeout: Duration, write_timeout: Duration) -> Arc<Self> {
        Self::new(Duration::MAX, idle_timeout, write_timeout, false)
    }

    fn new(
        header_timeout: Duration,
        idle_timeout: Duration,
        write_timeout: Duration,
        heads: bool,
    ) -> Arc<Self> {
        Arc::new(Clock {
            state: Mutex::new(State {
                handling: 0,
                sending: 0,
                head: heads,
                write_blocked: None,
                since: Instant::now(),
            }),
            changed: Notify::new(),
            header_timeout,
            idle_timeout,
            write_timeout,
            heads,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Plain values, valid whatever a panicking holder was doing.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn update(&self, f: impl FnOnce(&mut State)) {
        let mut state = self.lock();
        let before = *state;
        f(&mut state);
        if *state != before {
            drop(state);
            self.changed.notify_one();
        }
    }

    pub(super) fn request_started(&self) {
        self.update(|s| {
            s.handling += 1;
            s.head = false;
            s.since = Instant::now();
        });
    }

    /// The handler returned its answer, whose body is still to be sent.
    pub(super) fn handler_done(&self) {
        self.update(|s| {
            s.handling = s.handling.saturating_sub(1);
            s.sending += 1;
            s.since = Instant::now();
        });
    }

    /// An answer's body was sent in full, or dropped (stream reset, connection closed).
    pub(super) fn response_done(&self) {
        self.update(|s| {
            s.sending = s.sending.saturating_sub(1);
            s.since = Instant::now();
        });
    }

    /// Bytes arrived: on an idle HTTP/1.1 connection, that is the start of the next head.
    fn bytes_arrived(&self) {
        if !self.heads {
            return;
        }
        self.update(|s| {
            if s.handling == 0 && s.sending == 0 && !s.head {
                s.head = true;
                s.since = Instant::now();
            }
        });
    }

    /// A write to the socket is waiting for the client to read (`true`), or went through.
    fn write_pending(&self, pending: bool) {
        let mut state = self.lock();
        match (pending, state.write_blocked) {
            (true, None) => state.write_blocked = Some(Instant::now()),
            (false, Some(_)) => state.write_blocked = None,
            _ => return,
        }
        drop(state);
        self.changed.notify_one();
    }

    /// Since when the connection could be closed without cutting a request or an answer:
    /// idle between requests, or waiting for a request head (a client sends a head at once;
    /// a slow one is bounded by the header timeout anyway). `None` while a request is handled
    /// or its answer sent.
    pub(super) fn idle_since(&self) -> Option<Instant> {
        let s = *self.lock();
        (s.handling == 0 && s.sending == 0 && s.write_blocked.is_none()).then_some(s.since)
    }

    /// The limit the connection will outlive next and when, if any.
    fn deadline(&self) -> Option<(Instant, Expired)> {
        let s = *self.lock();
        if let Some(blocked) = s.write_blocked {
            return Some((blocked + self.write_timeout, Expired::Write));
        }
        if s.handling > 0 {
            return None;
        }
        if s.sending > 0 {
            return Some((s.since + self.write_timeout, Expired::Write));
        }
        if s.head {
            return Some((s.since + self.header_timeout, Expired::Header));
        }
        Some((s.since + self.idle_timeout, Expired::Idle))
    }

    /// Resolves with the limit the connection outlived; never while a handler runs and the
    /// client takes what is written.
    pub(super) async fn expired(&self) -> Expired {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            // Registered before the state is read, so no change is missed in between.
            changed.as_mut().enable();
            let Some((at, expired)) = self.deadline() else {
                changed.await;
                continue;
            };
            tokio::select! {
                () = &mut changed => {}
                () = tokio::time::sleep_until(at) => {
                    // A change may have raced the timer; only the current state counts.
                    if self.deadline() == Some((at, expired)) {
                        return expired;
                    }
                }
            }
        }
    }
}

/// A connection's byte stream, reporting to its [`Clock`] when bytes arrive and when writes
/// wait for the client.
pub(super) struct Watched<IO> {
    io: IO,
    clock: Arc<Clock>,
}

impl<IO> Watched<IO> {
    pub(super) fn new(io: IO, clock: Arc<Clock>) -> Self {
        Watched { io, clock }
    }

    fn written<T>(&self, polled: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        self.clock.write_pending(polled.is_pending());
        polled
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Watched<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.clock.bytes_arrived();
        }
        polled
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Watched<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        self.written(polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.written(polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_flush(cx);
        self.written(polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// An answer's body, telling its [`Clock`] when it has been sent in full or dropped.
pub(super) struct Tracked<B> {
    body: B,
    clock: Option<Arc<Clock>>,
}

impl<B> Tracked<B> {
    pub(super) fn new(body: B, clock: Arc<Clock>) -> Self {
        Tracked {
            body,
            clock: Some(clock),
        }
    }

    fn done(&mut self) {
        if let Some(clock) = self.clock.take() {
            clock.response_done();
        }
    }
}

impl<B> Drop for Tracked<B> {
    fn drop(&mut self) {
        self.done();
    }
}

impl<B: Body + Unpin> Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            self.done();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: Duration = Duration::from_secs(5);
    const IDLE: Duration = Duration::from_secs(120);
    const WRITE: Duration = Duration::from_secs(10);

    fn http1() -> Arc<Clock> {
        Clock::http1(HEADER, IDLE, WRITE)
    }

    /// How long `expired` takes to resolve from now, in paused time; `None` if not within 1 h.
    async fn time_to_expiry(clock: &Clock) -> Option<(Expired, Duration)> {
        let start = Instant::now();
        tokio::time::timeout(Duration::from_secs(3600), clock.expired())
            .await
            .ok()
            .map(|phase| (phase, start.elapsed()))
    }

    fn answered(clock: &Clock) {
        clock.request_started();
        clock.handler_done();
        clock.response_done();
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_connection_has_the_header_timeout() {
        let clock = http1();
        assert_eq!(
            time_to_expiry(&clock).await,
            Some((Expired::Header, HEADER))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_has_the_idle_timeout_until_bytes_arrive() {
        let clock = http1();
        answered(&clock);
        assert_eq!(time_to_expiry(&clock).await, Some((Expired::Idle, IDLE)));

        answered(&clock);
        tokio::time::advance(Duration::from_secs(60)).await;
        clock.bytes_arrived();
        assert_eq!(
            time_to_expiry(&clock).await,
            Some((Expired::Header, HEADER))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_in_progress_never_expires_here() {
        let clock = http1();
        clock.request_started();
        // Body bytes of the request in progress do not restart a head.
        clock.bytes_arrived();
        assert_eq!(time_to_expiry(&clock).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_phase_change_restarts_the_wait() {
        let clock = http1();
        let start = Instant::now();
        let waiter = {
            let clock = clock.clone();
            tokio::spawn(async move { (clock.expired().await, Instant::now()) })
        };
        tokio::task::yield_now().await;
        tokio::time::advance(Duration::from_secs(4)).await;
        clock.request_started();
        tokio::time::advance(Duration::from_secs(30)).await;
        clock.handler_done();
        clock.response_done();
        let (phase, at) = waiter.await.unwrap();
        assert_eq!(phase, Expired::Idle);
        assert_eq!(at - start, Duration::from_secs(34) + IDLE);
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_not_taken_has_the_write_timeout() {
        let clock = Clock::http2(IDLE, WRITE);
        clock.request_started();
        clock.handler_done();
        assert_eq!(time_to_expiry(&clock).await, Some((Expired::Write, WRITE)));
        clock.response_done();
        assert_eq!(time_to_expiry(&clock).await, Some((Expired::Idle, IDLE)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_blocked_write_has_the_write_timeout_even_while_handling() {
        let clock = http1();
        clock.request_started();
        clock.write_pending(true);
        tokio::time::advance(Duration::from_secs(3)).await;
        // Still blocked: the wait counts from the first time.
        clock.write_pending(true);
        assert_eq!(
            time_to_expiry(&clock).await,
            Some((Expired::Write, WRITE - Duration::from_secs(3)))
        );
        clock.write_pending(false);
        assert_eq!(time_to_expiry(&clock).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn http2_frames_between_requests_do_not_hold_the_connection() {
        let clock = Clock::http2(IDLE, WRITE);
        answered(&clock);
        tokio::time::advance(Duration::from_secs(60)).await;
        // PINGs and other frames arrive: still idle since the last answer.
        clock.bytes_arrived();
        assert_eq!(
            time_to_expiry(&clock).await,
            Some((Expired::Idle, IDLE - Duration::from_secs(60)))
        );
    }
}
