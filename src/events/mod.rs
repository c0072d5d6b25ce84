//! Kubernetes Events on the Nodes: why, in `kubectl describe node`.
//!
//! Two sources, one [`Events`] per `serve` replica:
//! - the continuous audit, in the replica holding the audit's Lease only: when a node gains a
//!   finding of a rule (a transition between two passes of one term; the first pass of a term
//!   is the baseline and says nothing, so a rollout does not repeat every standing finding);
//! - the webhook, in the replica that refused a change: one Event per rule that refused it,
//!   naming the user (never for a dry run).
//!
//! Both go through one rate limit per node, rule and source ([`limit`]) and one bounded queue
//! to one sending task ([`recorder`]). Offering an Event never waits: a full queue drops it,
//! counts it and says so in the log once per burst; the audit makes a finding's message only
//! for an Event that will be queued. Memory is bounded by the queue ([`QUEUE`] Events of at
//! most 1 kB of note each) and the limiter ([`MAX_KEYS`] entries).

pub mod event;
pub mod limit;
pub mod recorder;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

pub use event::NodeEvent;
pub use limit::Source;
use limit::{Key, RateLimiter, Verdict};
pub use recorder::EventMetrics;

use crate::core::rules::Rule;

/// Events waiting for the sending task at most; more are dropped and counted.
pub const QUEUE: usize = 256;

/// Node, rule and source keys the rate limit holds at most: at most this many Events leave a
/// replica per window.
pub const MAX_KEYS: usize = 10_000;

/// The default window of the rate limit.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(600);

/// What was done with an offered Event.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Offered {
    Queued,
    /// Another went out for the same node, rule and source within the window.
    Limited,
    /// The rate limit's map is full.
    LimiterFull,
    /// The queue is full (or the sending task has ended).
    QueueFull,
    /// There was nothing to say (no message for the rule).
    Nothing,
}

/// One replica's Events: the rate limit, the queue's sending end, the counters.
pub struct Events {
    tx: mpsc::Sender<NodeEvent>,
    limiter: Mutex<RateLimiter>,
    pub metrics: EventMetrics,
    /// Set by the first drop of a burst (logged), cleared by the sender once the queue drains.
    dropping: AtomicBool,
    dropped_in_burst: AtomicU64,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events").finish_non_exhaustive()
    }
}

impl Events {
    /// The Events of a replica with a rate limit of `window`, and the queue's receiving end for
    /// [`recorder::run`].
    pub fn new(
        window: Duration,
        metrics: EventMetrics,
    ) -> (Arc<Events>, mpsc::Receiver<NodeEvent>) {
        Self::with_bounds(window, MAX_KEYS, QUEUE, metrics)
    }

    pub(crate) fn with_bounds(
        window: Duration,
        max_keys: usize,
        queue: usize,
        metrics: EventMetrics,
    ) -> (Arc<Events>, mpsc::Receiver<NodeEvent>) {
        let (tx, rx) = mpsc::channel(queue.max(1));
        let events = Events {
            tx,
            limiter: Mutex::new(RateLimiter::new(window, max_keys)),
            metrics,
            dropping: AtomicBool::new(false),
            dropped_in_burst: AtomicU64::new(0),
        };
        (Arc::new(events), rx)
    }

    /// Offers an Event on `node` for `rule`, its note made by `note` only if it will be
    /// queued (`None`: nothing to say). Never waits.
    pub fn offer(
        &self,
        node: &str,
        rule: Rule,
        source: Source,
        note: impl FnOnce() -> Option<String>,
    ) -> Offered {
        let key = Key {
            node: node.into(),
            rule,
            source,
        };
        let offered = self.try_offer(key, note);
        match offered {
            Offered::Limited => self.metrics.dropped(source, "rate-limited"),
            Offered::LimiterFull => {
                self.metrics.dropped(source, "limiter-full");
                self.note_drop(
                    "the rate limit holds 10,000 node and rule keys of this window: new ones \
                     wait for the oldest to expire",
                );
            }
            Offered::QueueFull => {
                self.metrics.dropped(source, "queue-full");
                self.note_drop("the queue to the API server is full");
            }
            Offered::Queued | Offered::Nothing => {}
        }
        offered
    }

    fn try_offer(&self, key: Key, note: impl FnOnce() -> Option<String>) -> Offered {
        // The queue first: a flood whose Events would be dropped makes no messages.
        if self.tx.capacity() == 0 {
            return Offered::QueueFull;
        }
        match self.limiter().check(&key, Instant::now()) {
            Verdict::Send => {}
            Verdict::Limited => return Offered::Limited,
            Verdict::Full => return Offered::LimiterFull,
        }
        let Some(note) = note() else {
            return Offered::Nothing;
        };
        let event = NodeEvent::new(&key.node, key.rule, key.source, &note);
        if self.tx.try_send(event).is_err() {
            return Offered::QueueFull;
        }
        let mut limiter = self.limiter();
        limiter.record(key, Instant::now());
        self.metrics.set_keys(limiter.len());
        Offered::Queued
    }

    /// A refusal of a change of `node` by `user`: one Event per refusing rule (`deny`
    /// findings, with their messages).
    pub fn refused<'a>(
        &self,
        node: &str,
        user: &str,
        denied: impl IntoIterator<Item = (Rule, &'a str)>,
    ) {
        for (rule, message) in denied {
            self.offer(node, rule, Source::Refusal, || {
                Some(format!("refused a change by {user}: {message}"))
            });
        }
    }

    fn limiter(&self) -> std::sync::MutexGuard<'_, RateLimiter> {
        self.limiter.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Logs the first drop of a burst; the rest are counted until the queue drains.
    fn note_drop(&self, why: &str) {
        self.dropped_in_burst.fetch_add(1, Ordering::Relaxed);
        if !self.dropping.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                why,
                "dropping Kubernetes Events (counted in gpu_deploy_guard_events_dropped_total; \
                 the report, the metrics and the webhook's answers still say everything)"
            );
        }
    }

    /// Called by the sender when the queue is empty: ends a burst of drops with their count.
    pub(crate) fn drained(&self) {
        if self.dropping.swap(false, Ordering::Relaxed) {
            let dropped = self.dropped_in_burst.swap(0, Ordering::Relaxed);
            tracing::info!(
                dropped,
                "Kubernetes Events flow again after a burst of drops"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;

    fn events(max_keys: usize, queue: usize) -> (Arc<Events>, mpsc::Receiver<NodeEvent>, Registry) {
        let mut registry = Registry::default();
        let metrics = EventMetrics::register(&mut registry);
        let (e, rx) = Events::with_bounds(Duration::from_secs(600), max_keys, queue, metrics);
        (e, rx, registry)
    }

    fn exposition(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        out
    }

    #[test]
    fn a_flood_of_refusals_is_dropped_and_counted_with_the_queue_bounded() {
        let (e, mut rx, registry) = events(MAX_KEYS, 8);
        let mut made = 0;
        for i in 0..5_000 {
            let node = format!("node-{i}");
            e.offer(
                &node,
                Rule::DevicePluginWithoutToolkit,
                Source::Refusal,
                || {
                    made += 1;
                    Some("x".repeat(5_000))
                },
            );
        }
        // Eight queued; the other 4,992 made no message at all.
        assert_eq!(made, 8);
        assert_eq!(rx.len(), 8);
        let text = exposition(&registry);
        assert!(
            text.contains(r#"events_dropped_total{source="refusal",reason="queue-full"} 4992"#),
            "{text}"
        );
        // Each queued note is bounded.
        while let Ok(ev) = rx.try_recv() {
            assert!(ev.note.len() <= event::NOTE_LIMIT);
        }
        // Drained: the limiter let eight through and remembers them.
        e.drained();
        assert_eq!(
            e.offer(
                "node-0",
                Rule::DevicePluginWithoutToolkit,
                Source::Refusal,
                || Some("again".into())
            ),
            Offered::Limited
        );
        assert_eq!(
            e.offer(
                "node-9",
                Rule::DevicePluginWithoutToolkit,
                Source::Refusal,
                || Some("new".into())
            ),
            Offered::Queued
        );
    }

    #[test]
    fn a_full_limiter_refuses_new_keys_and_counts_them() {
        let (e, _rx, registry) = events(2, QUEUE);
        let offer = |node: &str| {
            e.offer(node, Rule::NfdLabelsLost, Source::Audit, || {
                Some("x".into())
            })
        };
        assert_eq!(offer("a"), Offered::Queued);
        assert_eq!(offer("b"), Offered::Queued);
        assert_eq!(offer("c"), Offered::LimiterFull);
        assert_eq!(offer("a"), Offered::Limited);
        let text = exposition(&registry);
        assert!(
            text.contains(r#"events_dropped_total{source="audit",reason="limiter-full"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"events_dropped_total{source="audit",reason="rate-limited"} 1"#),
            "{text}"
        );
        assert!(text.contains("events_rate_limit_keys 2"), "{text}");
    }

    #[test]
    fn a_refusal_names_the_user_and_each_refusing_rule() {
        let (e, mut rx, _registry) = events(MAX_KEYS, QUEUE);
        e.refused(
            "lab-node-2",
            "alice",
            [
                (
                    Rule::DevicePluginWithoutToolkit,
                    "node lab-node-2: no toolkit",
                ),
                (Rule::ToolkitNotRecreated, "node lab-node-2: a taint"),
            ],
        );
        let first = rx.try_recv().unwrap();
        assert_eq!(
            first,
            NodeEvent::new(
                "lab-node-2",
                Rule::DevicePluginWithoutToolkit,
                Source::Refusal,
                "refused a change by alice: node lab-node-2: no toolkit"
            )
        );
        assert_eq!(rx.try_recv().unwrap().rule, Rule::ToolkitNotRecreated);
        // The same refusal again within the window: nothing new.
        e.refused(
            "lab-node-2",
            "bob",
            [(
                Rule::DevicePluginWithoutToolkit,
                "node lab-node-2: no toolkit",
            )],
        );
        assert!(rx.try_recv().is_err());
    }
}
