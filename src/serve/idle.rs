//! HTTP/1.1 timeouts that tell an idle keep-alive connection from a slow request.
//!
//! hyper has one timer for both: its header read timeout starts as soon as it waits for the
//! next request head, so an idle connection is closed after the header timeout. The API server
//! keeps an idle connection to a webhook for 90 s and reuses it for the next review. Closing it
//! sooner makes every review after a pause pay a new TCP and TLS handshake (about 1.5 ms through
//! the API server), and a review sent just as the server closes the connection fails; with
//! `failurePolicy: Fail` the label change is then refused. So, per connection:
//!
//! - a new connection, and a request whose first bytes have arrived, must deliver the whole
//!   request head within the header timeout;
//! - while a request is being handled, the router's body and request timeouts apply;
//! - between requests, the connection may stay idle for the idle timeout.
//!
//! [`Clock`] follows these phases: [`Watched`] sees the bytes arrive, the service wrapper in
//! `serve_http` sees requests start and finish, and [`Clock::expired`] resolves when a phase
//! outlives its limit.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for (the rest of) a request head.
    Head,
    /// A request is being handled.
    Busy,
    /// Between requests.
    Idle,
}

/// Which limit a connection outlived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Expired {
    Header,
    Idle,
}

impl Expired {
    /// The `reason` label of `gpu_deploy_guard_webhook_connection_timeouts_total`.
    pub(super) fn reason(self) -> &'static str {
        match self {
            Expired::Header => "header",
            Expired::Idle => "idle",
        }
    }

    pub(super) fn describe(self) -> &'static str {
        match self {
            Expired::Header => "request head not received within the header timeout",
            Expired::Idle => "idle for the idle timeout",
        }
    }
}

/// The phase of one HTTP/1.1 connection and since when it is in it.
pub(super) struct Clock {
    state: Mutex<(Phase, Instant)>,
    changed: Notify,
    header_timeout: Duration,
    idle_timeout: Duration,
}

impl Clock {
    /// A new connection: its first request head is due within the header timeout.
    pub(super) fn new(header_timeout: Duration, idle_timeout: Duration) -> Arc<Self> {
        Arc::new(Clock {
            state: Mutex::new((Phase::Head, Instant::now())),
            changed: Notify::new(),
            header_timeout,
            idle_timeout,
        })
    }

    fn lock(&self) -> MutexGuard<'_, (Phase, Instant)> {
        // Two plain values, valid whatever a panicking holder was doing.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn phase(&self) -> (Phase, Instant) {
        *self.lock()
    }

    fn set(&self, phase: Phase) {
        *self.lock() = (phase, Instant::now());
        self.changed.notify_one();
    }

    pub(super) fn request_started(&self) {
        self.set(Phase::Busy);
    }

    pub(super) fn request_finished(&self) {
        self.set(Phase::Idle);
    }

    /// Bytes arrived: on an idle connection, that is the start of the next request head.
    fn bytes_arrived(&self) {
        let mut state = self.lock();
        if state.0 == Phase::Idle {
            *state = (Phase::Head, Instant::now());
            drop(state);
            self.changed.notify_one();
        }
    }

    /// Resolves with the limit the current phase outlived; never while a request is handled.
    pub(super) async fn expired(&self) -> Expired {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            // Registered before the phase is read, so no change is missed in between.
            changed.as_mut().enable();
            let (phase, since) = self.phase();
            let (limit, expired) = match phase {
                Phase::Head => (self.header_timeout, Expired::Header),
                Phase::Idle => (self.idle_timeout, Expired::Idle),
                Phase::Busy => {
                    changed.await;
                    continue;
                }
            };
            tokio::select! {
                () = &mut changed => {}
                () = tokio::time::sleep_until(since + limit) => {
                    // A change may have raced the timer; only the current phase counts.
                    if self.phase() == (phase, since) {
                        return expired;
                    }
                }
            }
        }
    }
}

/// A connection's byte stream, reporting to its [`Clock`] when bytes arrive.
pub(super) struct Watched<IO> {
    io: IO,
    clock: Arc<Clock>,
}

impl<IO> Watched<IO> {
    pub(super) fn new(io: IO, clock: Arc<Clock>) -> Self {
        Watched { io, clock }
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
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: Duration = Duration::from_secs(5);
    const IDLE: Duration = Duration::from_secs(120);

    /// How long `expired` takes to resolve from now, in paused time; `None` if not within 1 h.
    async fn time_to_expiry(clock: &Clock) -> Option<(Expired, Duration)> {
        let start = Instant::now();
        tokio::time::timeout(Duration::from_secs(3600), clock.expired())
            .await
            .ok()
            .map(|phase| (phase, start.elapsed()))
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_connection_has_the_header_timeout() {
        let clock = Clock::new(HEADER, IDLE);
        assert_eq!(
            time_to_expiry(&clock).await,
            Some((Expired::Header, HEADER))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_has_the_idle_timeout_until_bytes_arrive() {
        let clock = Clock::new(HEADER, IDLE);
        clock.request_started();
        clock.request_finished();
        assert_eq!(time_to_expiry(&clock).await, Some((Expired::Idle, IDLE)));

        clock.request_finished();
        tokio::time::advance(Duration::from_secs(60)).await;
        clock.bytes_arrived();
        assert_eq!(
            time_to_expiry(&clock).await,
            Some((Expired::Header, HEADER))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_in_progress_never_expires_here() {
        let clock = Clock::new(HEADER, IDLE);
        clock.request_started();
        // Body bytes of the request in progress do not restart a head.
        clock.bytes_arrived();
        assert_eq!(time_to_expiry(&clock).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_phase_change_restarts_the_wait() {
        let clock = Clock::new(HEADER, IDLE);
        let start = Instant::now();
        let waiter = {
            let clock = clock.clone();
            tokio::spawn(async move { (clock.expired().await, Instant::now()) })
        };
        tokio::task::yield_now().await;
        tokio::time::advance(Duration::from_secs(4)).await;
        clock.request_started();
        tokio::time::advance(Duration::from_secs(30)).await;
        clock.request_finished();
        let (phase, at) = waiter.await.unwrap();
        assert_eq!(phase, Expired::Idle);
        assert_eq!(at - start, Duration::from_secs(34) + IDLE);
    }
}
