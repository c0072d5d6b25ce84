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
//! - At most [`MAX_WAITING_PER_SOURCE`] of the [`MAX_WAITING`] bodies that may wait for room
//!   at once. A body waiting for room holds bytes the budget does not count: the frame it
//!   could not place, and what HTTP/2 accepts for its stream meanwhile (up to the stream's
//!   window). Few may wait, so that stays small (`MAX_WAITING` × 272 KiB, about 2 MiB); a body
//!   that would be one too many is answered 503 at once.
//!
//! The API server is one source per replica of it. Its concurrency towards one webhook is
//! bounded by its own in-flight limits, and the default share (64 requests, 3.5 MiB of
//! bodies, each a request of a real Node under 100 KiB) is far above what it sends at once.
//! A source's entry lives while it has a request in flight.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;

use super::Limits;

/// Bodies that may wait for room in the body budget at once, and of them from one source.
pub const MAX_WAITING: usize = 8;
pub const MAX_WAITING_PER_SOURCE: usize = MAX_WAITING / 2;

/// Every source's requests in flight and room in the body budget.
pub(super) struct Shares {
    max_requests: usize,
    body_share: usize,
    sources: Mutex<Sources>,
}

#[derive(Default)]
struct Sources {
    by_address: HashMap<IpAddr, Source>,
    /// Bodies waiting for room, of every source.
    waiting: usize,
}

struct Source {
    requests: usize,
    /// This source's part of the body budget: taken together with the budget itself.
    body: Arc<Semaphore>,
    /// Its bodies waiting for room.
    waiting: usize,
}

/// A body's place among those waiting for room: held while it waits.
pub(super) struct Waiting {
    shares: Arc<Shares>,
    source: IpAddr,
}

/// No place to wait: `waiting` bodies wait already, `of_source` of them from this source.
#[derive(Debug)]
pub(super) struct NoPlace {
    pub(super) waiting: usize,
    pub(super) of_source: usize,
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
        let mut sources = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        let entry = sources.by_address.entry(source).or_insert_with(|| Source {
            requests: 0,
            body: Arc::new(Semaphore::new(self.body_share)),
            waiting: 0,
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

    /// A place among the bodies waiting for room, for a body of `in_flight`'s source.
    pub(super) fn wait(&self, in_flight: &InFlight) -> Result<Waiting, NoPlace> {
        let mut sources = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        let waiting = sources.waiting;
        let of_source = sources
            .by_address
            .get(&in_flight.source)
            .map_or(0, |s| s.waiting);
        if waiting >= MAX_WAITING || of_source >= MAX_WAITING_PER_SOURCE {
            return Err(NoPlace { waiting, of_source });
        }
        sources.waiting += 1;
        if let Some(entry) = sources.by_address.get_mut(&in_flight.source) {
            entry.waiting += 1;
        }
        Ok(Waiting {
            shares: in_flight.shares.clone(),
            source: in_flight.source,
        })
    }

    /// Sources with a request in flight (for tests).
    #[cfg(test)]
    fn sources(&self) -> usize {
        self.sources.lock().unwrap().by_address.len()
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut sources = self
            .shares
            .sources
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        sources.waiting -= 1;
        // The source's entry outlives this: the waiting body's request is in flight.
        if let Some(entry) = sources.by_address.get_mut(&self.source) {
            entry.waiting -= 1;
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut sources = self
            .shares
            .sources
            .lock()
            .unwrap_or_else(|e| e.into_inner());
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
    fn few_bodies_wait_and_few_of_them_from_one_source() {
        let s = shares(100);
        let a: Vec<InFlight> = (0..MAX_WAITING).map(|_| s.enter(ip(9)).unwrap()).collect();
        let mut waits: Vec<Waiting> = a
            .iter()
            .take(MAX_WAITING_PER_SOURCE)
            .map(|r| s.wait(r).unwrap())
            .collect();
        let refused = s.wait(&a[MAX_WAITING_PER_SOURCE]).err().unwrap();
        assert_eq!(refused.of_source, MAX_WAITING_PER_SOURCE);
        let b: Vec<InFlight> = (0..MAX_WAITING).map(|_| s.enter(ip(1)).unwrap()).collect();
        waits.extend(
            b.iter()
                .take(MAX_WAITING - MAX_WAITING_PER_SOURCE)
                .map(|r| s.wait(r).unwrap()),
        );
        let c = s.enter(ip(2)).unwrap();
        let refused = s.wait(&c).err().unwrap();
        assert_eq!((refused.waiting, refused.of_source), (MAX_WAITING, 0));
        waits.pop();
        let _c = s.wait(&c).expect("a body done waiting frees its place");
        drop(waits);
        assert_eq!(s.sources.lock().unwrap().waiting, 1);
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
