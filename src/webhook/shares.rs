//! Each client source's share of the webhook's requests in flight and of its body budget, so
//! that one source cannot hold what the API server needs.
//!
//! The connection pool (`serve/pool.rs`) shares connections between sources, but it never
//! closes a connection with a request in progress, and HTTP/2 lets one connection carry many
//! requests. So a source (an IP address) also has, across all its connections:
//!
//! - At most [`Limits::max_requests_per_source`] requests in flight (HTTP/2 streams and
//!   HTTP/1.1 requests whose answer is not made yet); beyond it a request is answered 503 at
//!   once, before its body is read. `serve` sets it below `--max-connections`, so a source at
//!   its share always leaves connections of its own without a request in progress, which the
//!   pool may close for a newcomer: the API server can always connect.
//! - At most half of the shared body budget (the budget less its overdraft, see
//!   [`super::Room`]): the other half is always there for the other sources, whatever one
//!   source sends. A body of a source at its share waits for its own other bodies to finish,
//!   or for the overdraft's turn, up to the body timeout (then 503).
//! - A part of the room for bodies waiting for room. A body waiting for room holds bytes the
//!   budget does not count: the frame it could not place, and what the client may send
//!   ahead of it meanwhile (up to the stream's window, [`BODY_WINDOW`], or what is left of
//!   its declared length); it counts that much. Small bodies (at most [`SMALL_WAIT`], every
//!   real Node's review) and large ones wait in separate room, so large bodies cannot take
//!   the places of small ones: [`WAITING_ROOM`] says each one's size and a source's part of
//!   it. Four stalled streams of 3.5 MiB fill the large room, while hundreds of the API
//!   server's reviews can wait in the small one. A body with no room left to wait is
//!   answered 503 at once.
//!
//! The API server is one source per replica of it. Its concurrency towards one webhook is
//! bounded by its own in-flight limits, and the default share (64 requests, 3.5 MiB of
//! bodies, each a request of a real Node under 100 KiB) is far above what it sends at once.
//! A source's entry lives while it has a request in flight.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Semaphore;

use super::Limits;

/// The most body bytes a client may send ahead of the handler for one request: `serve`'s
/// HTTP/2 stream window (HTTP/1.1 reads less ahead).
pub const BODY_WINDOW: usize = 256 * 1024;

/// The most HTTP/2 frame a client sends at once (the protocol's default, which `serve` keeps).
const FRAME_BYTES: usize = 16 * 1024;

/// The most a body may hold while it waits and still wait among the small ones: a Node review
/// of the API server's (object and old object) is well under it.
pub const SMALL_WAIT: usize = 128 * 1024;

/// Room for waiting bodies: what they may hold together, and one source's bodies of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitingRoom {
    pub bytes: usize,
    pub per_source: usize,
}

/// The waiting rooms, small bodies first. Large: four bodies with a full frame in hand and a
/// full window each, two of one source. Small: 1 MiB, three quarters of it for one source,
/// so a source sending many small bodies at once (the API server) rarely finds it full.
pub const WAITING_ROOM: [WaitingRoom; 2] = [
    WaitingRoom {
        bytes: 1024 * 1024,
        per_source: 768 * 1024,
    },
    WaitingRoom {
        bytes: 4 * (BODY_WINDOW + FRAME_BYTES),
        per_source: 2 * (BODY_WINDOW + FRAME_BYTES),
    },
];

/// What the bodies waiting for room may hold at once beyond the budget.
pub const MAX_WAITING_BYTES: usize = WAITING_ROOM[0].bytes + WAITING_ROOM[1].bytes;

/// Every source's requests in flight and room in the body budget.
pub(super) struct Shares {
    max_requests: usize,
    body_share: usize,
    sources: Mutex<Sources>,
}

#[derive(Default)]
struct Sources {
    by_address: HashMap<IpAddr, Source>,
    /// What the bodies waiting in each room may hold, of every source.
    waiting: [usize; 2],
}

struct Source {
    requests: usize,
    /// This source's part of the body budget: taken together with the budget itself.
    body: Arc<Semaphore>,
    /// What its bodies waiting in each room may hold.
    waiting: [usize; 2],
}

/// A body's place among those waiting for room: held while it waits.
pub(super) struct Waiting {
    shares: Arc<Shares>,
    source: IpAddr,
    room: usize,
    bytes: usize,
}

/// No room to wait: the bodies waiting already in the room of its size may hold `waiting`
/// bytes, `of_source` of them this source's, of the room's `room`.
#[derive(Debug)]
pub(super) struct NoPlace {
    pub(super) waiting: usize,
    pub(super) of_source: usize,
    pub(super) room: WaitingRoom,
    /// Whether the source's part of the room was what is full.
    pub(super) source_full: bool,
}

/// A request in flight from one source: holds its place in the source's share until dropped.
pub(super) struct InFlight {
    shares: Arc<Shares>,
    pub(super) source: IpAddr,
    /// The source's room in the body budget.
    pub(super) body: Arc<Semaphore>,
}

/// A source already has its share of requests in flight.
#[derive(Debug)]
pub(super) struct AtShare {
    pub(super) source: IpAddr,
    pub(super) held: usize,
}

impl Shares {
    /// Shares of `limits.max_requests_per_source` requests and half of `budget` body bytes.
    pub(super) fn new(limits: &Limits, budget: usize) -> Self {
        Shares {
            max_requests: limits.max_requests_per_source.max(1),
            body_share: (budget / 2).min(Semaphore::MAX_PERMITS),
            sources: Mutex::new(Sources::default()),
        }
    }

    /// The body bytes one source may hold in the shared budget.
    pub(super) fn body_share(&self) -> usize {
        self.body_share
    }

    /// Admits one more request from `source` (`None`: a request that came over no socket, as
    /// in tests, counts as one unnamed source), or says it holds its share already.
    pub(super) fn enter(self: &Arc<Self>, source: Option<IpAddr>) -> Result<InFlight, AtShare> {
        let source = source.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        let mut sources = self.lock();
        let entry = sources.by_address.entry(source).or_insert_with(|| Source {
            requests: 0,
            body: Arc::new(Semaphore::new(self.body_share)),
            waiting: [0; 2],
        });
        if entry.requests >= self.max_requests {
            return Err(AtShare {
                source,
                held: entry.requests,
            });
        }
        entry.requests += 1;
        Ok(InFlight {
            shares: self.clone(),
            source,
            body: entry.body.clone(),
        })
    }

    /// A place among the bodies waiting for room, for a body of `in_flight`'s source that may
    /// hold `bytes` the budget does not count while it waits, in the room of its size (at
    /// most a source's part of the room: a body can always wait when nothing else does).
    pub(super) fn wait(&self, in_flight: &InFlight, bytes: usize) -> Result<Waiting, NoPlace> {
        let which = usize::from(bytes > SMALL_WAIT);
        let room = WAITING_ROOM[which];
        let bytes = bytes.min(room.per_source);
        let mut sources = self.lock();
        let waiting = sources.waiting[which];
        let of_source = sources
            .by_address
            .get(&in_flight.source)
            .map_or(0, |s| s.waiting[which]);
        let source_full = of_source + bytes > room.per_source;
        if source_full || waiting + bytes > room.bytes {
            return Err(NoPlace {
                waiting,
                of_source,
                room,
                source_full,
            });
        }
        sources.waiting[which] += bytes;
        if let Some(entry) = sources.by_address.get_mut(&in_flight.source) {
            entry.waiting[which] += bytes;
        }
        Ok(Waiting {
            shares: in_flight.shares.clone(),
            source: in_flight.source,
            room: which,
            bytes,
        })
    }

    /// The sources' state. A panic while it was held cannot leave it half-updated (each
    /// update is a few counters), so a poisoned lock is taken as it is.
    fn lock(&self) -> MutexGuard<'_, Sources> {
        self.sources.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sources with a request in flight (for tests).
    #[cfg(test)]
    fn sources(&self) -> usize {
        self.sources.lock().unwrap().by_address.len()
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut sources = self.shares.lock();
        sources.waiting[self.room] -= self.bytes;
        // The source's entry outlives this: the waiting body's request is in flight.
        if let Some(entry) = sources.by_address.get_mut(&self.source) {
            entry.waiting[self.room] -= self.bytes;
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut sources = self.shares.lock();
        if let Some(entry) = sources.by_address.get_mut(&self.source) {
            entry.requests -= 1;
            if entry.requests == 0 {
                sources.by_address.remove(&self.source);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shares(max: usize) -> Arc<Shares> {
        let limits = Limits {
            max_requests_per_source: max,
            ..Limits::default()
        };
        Arc::new(Shares::new(&limits, 1000))
    }

    fn ip(last: u8) -> Option<IpAddr> {
        Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, last)))
    }

    #[test]
    fn a_source_at_its_share_is_refused_and_others_are_not() {
        let s = shares(2);
        let a1 = s.enter(ip(9)).unwrap();
        let _a2 = s.enter(ip(9)).unwrap();
        assert!(matches!(s.enter(ip(9)), Err(AtShare { held: 2, .. })));
        let _b = s.enter(ip(1)).expect("another source has its own share");
        drop(a1);
        let _a3 = s.enter(ip(9)).expect("a finished request frees its place");
    }

    #[test]
    fn bodies_wait_for_what_they_may_hold_large_ones_apart_and_one_source_for_part_of_it() {
        let s = shares(1000);
        let large = WAITING_ROOM[1];
        // A stalled body with a 1,000-byte frame in hand and a full window to come.
        let stalled = BODY_WINDOW + 1_000;
        let per_source = large.per_source / stalled;
        let a: Vec<InFlight> = (0..8).map(|_| s.enter(ip(9)).unwrap()).collect();
        let mut waits: Vec<Waiting> = a
            .iter()
            .take(per_source)
            .map(|r| s.wait(r, stalled).unwrap())
            .collect();
        let refused = s.wait(&a[per_source], stalled).err().unwrap();
        assert_eq!(refused.of_source, per_source * stalled);
        assert_eq!(refused.room, large);
        assert!(refused.source_full);
        // Small bodies of the same source wait in a room of their own: as many as fill its
        // part of it.
        let small = 4_000;
        let many: Vec<InFlight> = (0..WAITING_ROOM[0].per_source / small)
            .map(|_| s.enter(ip(9)).unwrap())
            .collect();
        let smalls: Vec<Waiting> = many.iter().map(|r| s.wait(r, small).unwrap()).collect();
        let refused = s.wait(&a[0], small).err().unwrap();
        assert_eq!(refused.room, WAITING_ROOM[0]);
        drop(smalls);
        let b: Vec<InFlight> = (0..8).map(|_| s.enter(ip(1)).unwrap()).collect();
        let others = large.bytes / stalled - per_source;
        waits.extend(b.iter().take(others).map(|r| s.wait(r, stalled).unwrap()));
        let c = s.enter(ip(2)).unwrap();
        let refused = s.wait(&c, stalled).err().unwrap();
        assert_eq!(
            (refused.waiting, refused.of_source),
            ((per_source + others) * stalled, 0)
        );
        assert!(
            !refused.source_full,
            "the room is full, not the source's part"
        );
        let _small = s
            .wait(&c, small)
            .expect("the small room has its own places");
        waits.pop();
        let _c = s
            .wait(&c, stalled)
            .expect("a body done waiting frees its place");
        drop(waits);
        assert_eq!(s.sources.lock().unwrap().waiting, [small, stalled]);
        // However much a body says it may hold, it can wait when nothing else does.
        let d = s.enter(ip(3)).unwrap();
        drop((_small, _c));
        let _d = s.wait(&d, usize::MAX).expect("a lone body always waits");
    }

    #[test]
    fn one_source_shares_one_body_room_and_an_idle_source_is_forgotten() {
        let s = shares(4);
        let a1 = s.enter(ip(9)).unwrap();
        let a2 = s.enter(ip(9)).unwrap();
        assert!(Arc::ptr_eq(&a1.body, &a2.body));
        assert_eq!(a1.body.available_permits(), 500, "half the budget");
        let b = s.enter(ip(1)).unwrap();
        assert!(!Arc::ptr_eq(&a1.body, &b.body));
        assert_eq!(s.sources(), 2);
        drop((a1, a2));
        assert_eq!(s.sources(), 1);
        drop(b);
        assert_eq!(s.sources(), 0);
    }
}
