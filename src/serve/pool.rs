//! Connection slots, shared between client sources so that no one source can take what the
//! API server needs.
//!
//! One pool per listener holds every open connection, and the webhook's also bounds the TLS
//! handshakes in progress. The design:
//!
//! - A source (an IP address) may use the whole pool while no one else needs it: the API
//!   server may keep as many connections as it likes. Its share shrinks only when others
//!   come: a full pool admits a new connection by closing an *evictable* one (still in its
//!   TLS handshake, waiting for its first request or HTTP/2 preface, or idle between
//!   requests; never one with a request in progress) of the source holding the most
//!   connections, the one idle the longest first. A source never loses a connection to a
//!   source holding as many or more: idle connections held by a flood are closed for the
//!   API server, never the other way round, and a flood reconnecting only replaces its own.
//! - When nothing is evictable (every connection is serving a request, each bounded by the
//!   header, body and request timeouts) new connections wait in the kernel's backlog, as
//!   before, costing no descriptor.
//! - An optional per-source cap (the admin port's) refuses a source's connection beyond it,
//!   unless the source has an idle one of its own to close.
//! - Handshakes have their own small pool, with the same rule: at its limit, the oldest
//!   handshake of the source with the most handshakes in progress is dropped. A handshake is
//!   also bounded by `--handshake-timeout`.
//!
//! The pool reports when it is full, what it closed and refused, and which source holds the
//! most of it (`gpu_deploy_guard_connection_pool_*`).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::idle::Clock;
use crate::metrics::Metrics;

pub(super) struct Pool {
    /// The `pool` label of its metrics: `webhook` or `admin`.
    name: &'static str,
    max: usize,
    per_source: usize,
    max_handshakes: usize,
    inner: Mutex<Inner>,
    metrics: Option<Arc<Metrics>>,
}

#[derive(Default)]
struct Inner {
    next: u64,
    conns: HashMap<u64, Entry>,
    sources: HashMap<IpAddr, usize>,
    handshakes: HashMap<IpAddr, usize>,
}

struct Entry {
    source: IpAddr,
    admitted: Instant,
    handshaking: bool,
    /// Set once the connection speaks HTTP: its phase (idle or not) and since when.
    clock: Option<Arc<Clock>>,
    evict: Arc<Notify>,
}

impl Entry {
    /// Since when the connection could be closed without cutting a request, if it can be.
    fn evictable_since(&self) -> Option<Instant> {
        match &self.clock {
            _ if self.handshaking => Some(self.admitted),
            None => Some(self.admitted),
            Some(clock) => clock.idle_since(),
        }
    }
}

/// Why a connection was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Refused {
    /// Its source holds its cap and none of its connections is idle.
    SourceLimit,
    /// The pool is full and nothing in it may be closed for this source.
    Full,
}

impl Refused {
    pub(super) fn reason(self) -> &'static str {
        match self {
            Refused::SourceLimit => "source-limit",
            Refused::Full => "full",
        }
    }
}

fn bump(map: &mut HashMap<IpAddr, usize>, source: IpAddr, up: bool) {
    if up {
        *map.entry(source).or_default() += 1;
    } else if let Some(n) = map.get_mut(&source) {
        *n -= 1;
        if *n == 0 {
            map.remove(&source);
        }
    }
}

impl Inner {
    /// The connection to close for a newcomer from `source`: among the sources holding more
    /// than `source` does (in `counts`), or `source` itself, the heaviest with a connection
    /// `can_go`, and its connection evictable the longest.
    fn victim(
        &self,
        source: IpAddr,
        counts: &HashMap<IpAddr, usize>,
        can_go: impl Fn(&Entry) -> Option<Instant>,
    ) -> Option<u64> {
        let own = counts.get(&source).copied().unwrap_or(0);
        self.conns
            .iter()
            .filter_map(|(id, e)| {
                let held = counts.get(&e.source).copied().unwrap_or(0);
                (e.source == source || held > own + 1)
                    .then(|| {
                        can_go(e)
                            .map(|since| (held, std::cmp::Reverse(since), std::cmp::Reverse(*id)))
                    })
                    .flatten()
            })
            .max()
            .map(|(_, _, std::cmp::Reverse(id))| id)
    }

    fn remove(&mut self, id: u64) -> Option<Entry> {
        let entry = self.conns.remove(&id)?;
        bump(&mut self.sources, entry.source, false);
        if entry.handshaking {
            bump(&mut self.handshakes, entry.source, false);
        }
        Some(entry)
    }
}

impl Pool {
    /// A pool of `max` connections, at most `per_source` from one source and `max_handshakes`
    /// in their TLS handshake.
    pub(super) fn new(
        name: &'static str,
        max: usize,
        per_source: usize,
        max_handshakes: usize,
        metrics: Option<Arc<Metrics>>,
    ) -> Arc<Self> {
        Arc::new(Pool {
            name,
            max: max.max(1),
            per_source: per_source.max(1),
            max_handshakes: max_handshakes.max(1),
            inner: Mutex::new(Inner::default()),
            metrics,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a connection may be admitted now, by a free slot or one that may be closed.
    pub(super) fn has_room(&self) -> bool {
        let inner = self.lock();
        inner.conns.len() < self.max || inner.conns.values().any(|e| e.evictable_since().is_some())
    }

    /// Resolves once [`Pool::has_room`]. Connections turn idle without telling the pool, so
    /// it looks again every 50 ms.
    pub(super) async fn room(&self) {
        while !self.has_room() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Admits a connection from `source`, closing another if the pool is full (see the module
    /// documentation), or says why not.
    pub(super) fn admit(self: &Arc<Self>, source: IpAddr, tls: bool) -> Result<Slot, Refused> {
        let mut inner = self.lock();
        let held = inner.sources.get(&source).copied().unwrap_or(0);
        if held >= self.per_source {
            let own = inner
                .conns
                .iter()
                .filter(|(_, e)| e.source == source)
                .filter_map(|(id, e)| e.evictable_since().map(|since| (since, *id)))
                .min()
                .map(|(_, id)| id);
            match own {
                Some(id) => self.evict(&mut inner, id, "source-limit"),
                None => return Err(self.refused(&inner, Refused::SourceLimit)),
            }
        } else if inner.conns.len() >= self.max {
            let sources = inner.sources.clone();
            match inner.victim(source, &sources, Entry::evictable_since) {
                Some(id) => self.evict(&mut inner, id, "full"),
                None => return Err(self.refused(&inner, Refused::Full)),
            }
        }
        let in_handshake: usize = inner.handshakes.values().sum();
        if tls && in_handshake >= self.max_handshakes {
            let handshakes = inner.handshakes.clone();
            let victim = inner.victim(source, &handshakes, |e| e.handshaking.then_some(e.admitted));
            match victim {
                Some(id) => self.evict(&mut inner, id, "handshakes-full"),
                None => return Err(self.refused(&inner, Refused::Full)),
            }
        }
        let id = inner.next;
        inner.next += 1;
        let evict = Arc::new(Notify::new());
        inner.conns.insert(
            id,
            Entry {
                source,
                admitted: Instant::now(),
                handshaking: tls,
                clock: None,
                evict: evict.clone(),
            },
        );
        bump(&mut inner.sources, source, true);
        if tls {
            bump(&mut inner.handshakes, source, true);
        }
        self.report(&inner);
        Ok(Slot {
            pool: self.clone(),
            id,
            evict,
        })
    }

    fn evict(&self, inner: &mut Inner, id: u64, reason: &'static str) {
        if let Some(entry) = inner.remove(id) {
            entry.evict.notify_one();
            if let Some(metrics) = &self.metrics {
                metrics.pools.observe_eviction(self.name, reason);
            }
        }
    }

    fn refused(&self, inner: &Inner, why: Refused) -> Refused {
        if let Some(metrics) = &self.metrics {
            metrics.pools.observe_refusal(self.name, why.reason());
        }
        self.report(inner);
        why
    }

    /// Publishes whether the pool is full and who holds the most of it.
    fn report(&self, inner: &Inner) {
        let Some(metrics) = &self.metrics else {
            return;
        };
        let top = inner.sources.iter().max_by_key(|(_, n)| **n);
        let in_handshake: usize = inner.handshakes.values().sum();
        metrics.pools.set_state(
            self.name,
            inner.conns.len() >= self.max,
            in_handshake >= self.max_handshakes,
            top.map(|(ip, n)| (ip.to_string(), *n)),
        );
    }
}

/// A connection's place in its [`Pool`], given back when dropped.
pub(super) struct Slot {
    pool: Arc<Pool>,
    id: u64,
    evict: Arc<Notify>,
}

impl Slot {
    /// The TLS handshake ended (either way): the connection leaves the handshake pool.
    pub(super) fn handshake_done(&self) {
        let mut inner = self.pool.lock();
        if let Some(entry) = inner.conns.get_mut(&self.id)
            && entry.handshaking
        {
            entry.handshaking = false;
            let source = entry.source;
            bump(&mut inner.handshakes, source, false);
        }
    }

    /// The connection speaks HTTP now, in the phases of `clock`.
    pub(super) fn serving(&self, clock: Arc<Clock>) {
        if let Some(entry) = self.pool.lock().conns.get_mut(&self.id) {
            entry.clock = Some(clock);
        }
    }

    /// Resolves when the pool closes this connection to admit another.
    pub(super) async fn evicted(&self) {
        self.evict.notified().await;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut inner = self.pool.lock();
        if inner.remove(self.id).is_some() {
            self.pool.report(&inner);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_pool_closes_the_oldest_idle_connection_of_the_heaviest_source() {
        let pool = Pool::new("test", 4, 4, 4, None);
        let mut flood = Vec::new();
        for _ in 0..3 {
            flood.push(pool.admit(ip(9), false).unwrap());
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        let good = pool.admit(ip(1), false).unwrap();
        // Full: the good source's next connection closes the flood's oldest.
        let second = pool.admit(ip(1), false).unwrap();
        assert!(is_evicted(&flood[0]).await);
        assert!(!is_evicted(&flood[1]).await);
        // The flood reconnecting replaces its own, never the good source's.
        let again = pool.admit(ip(9), false).unwrap();
        assert!(!is_evicted(&good).await && !is_evicted(&second).await);
        drop((again, flood));
    }

    #[tokio::test]
    async fn a_source_at_its_cap_is_refused_unless_it_has_an_idle_connection() {
        let pool = Pool::new("test", 8, 2, 8, None);
        let first = pool.admit(ip(9), false).unwrap();
        let busy = Clock::http2(Duration::from_secs(60), Duration::from_secs(10));
        busy.request_started();
        first.serving(busy.clone());
        let second = pool.admit(ip(9), false).unwrap();
        second.serving(busy);
        assert_eq!(pool.admit(ip(9), false).err(), Some(Refused::SourceLimit));
        // Another source is not affected.
        assert!(pool.admit(ip(1), false).is_ok());
    }

    #[tokio::test]
    async fn handshakes_have_their_own_limit() {
        let pool = Pool::new("test", 16, 16, 2, None);
        let a = pool.admit(ip(9), true).unwrap();
        let b = pool.admit(ip(9), true).unwrap();
        let good = pool.admit(ip(1), true).unwrap();
        assert!(is_evicted(&a).await && !is_evicted(&b).await);
        good.handshake_done();
        assert!(pool.admit(ip(1), true).is_ok());
    }

    async fn is_evicted(slot: &Slot) -> bool {
        tokio::time::timeout(Duration::from_millis(1), slot.evicted())
            .await
            .is_ok()
    }
}
