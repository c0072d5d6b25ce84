//! The Events' rate limit: one Event per node, rule and kind (an audit finding, a refusal)
//! within a window, in a map of bounded size.
//!
//! Entries are kept in the order they were let through, so the expired ones are at the front
//! and go first, each at most once: a check costs O(1) amortized. When the map is full of
//! entries still inside their window, a new key is refused (counted by the caller): at most
//! `max_keys` Events leave a replica per window, however many nodes a fleet-wide change
//! touches.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::core::rules::Rule;

/// Which of the guard's Event kinds: one window per kind, so a refusal on a node whose finding
/// was just reported is still reported.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// The continuous audit found the rule broken on the node.
    Audit,
    /// The webhook refused a change of the node for the rule.
    Refusal,
}

impl Source {
    /// The Event's `action`.
    pub fn action(self) -> &'static str {
        match self {
            Source::Audit => "Audit",
            Source::Refusal => "Refuse",
        }
    }

    /// The metrics' `source` label.
    pub fn label(self) -> &'static str {
        match self {
            Source::Audit => "audit",
            Source::Refusal => "refusal",
        }
    }
}

/// What the rate limit is keyed on.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    pub node: Arc<str>,
    pub rule: Rule,
    pub source: Source,
}

/// Whether an Event may go out now.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Send,
    /// One went out for the same key within the window.
    Limited,
    /// The map holds `max_keys` entries, none expired.
    Full,
}

/// The keys let through within the window, with when.
#[derive(Debug)]
pub struct RateLimiter {
    window: Duration,
    max_keys: usize,
    at: HashMap<Key, Instant>,
    /// The same entries, oldest first.
    order: VecDeque<(Instant, Key)>,
}

impl RateLimiter {
    pub fn new(window: Duration, max_keys: usize) -> Self {
        RateLimiter {
            window,
            max_keys,
            at: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// Whether an Event for `key` may go out at `now`; nothing is recorded
    /// ([`record`](Self::record) does, once it is queued).
    pub fn check(&mut self, key: &Key, now: Instant) -> Verdict {
        self.expire(now);
        if self.at.contains_key(key) {
            Verdict::Limited
        } else if self.at.len() >= self.max_keys {
            Verdict::Full
        } else {
            Verdict::Send
        }
    }

    /// Records that an Event for `key` went out at `now`. Times must not go backwards
    /// (a monotonic clock).
    pub fn record(&mut self, key: Key, now: Instant) {
        self.expire(now);
        if self.at.len() >= self.max_keys || self.at.contains_key(&key) {
            return;
        }
        self.at.insert(key.clone(), now);
        self.order.push_back((now, key));
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.at.len()
    }

    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }

    fn expire(&mut self, now: Instant) {
        while let Some((at, _)) = self.order.front() {
            if now.saturating_duration_since(*at) < self.window {
                break;
            }
            if let Some((_, key)) = self.order.pop_front() {
                self.at.remove(&key);
            }
        }
        // A map emptied by a flood gives its memory back.
        if self.at.is_empty() && self.order.capacity() > 64 {
            self.at.shrink_to_fit();
            self.order.shrink_to_fit();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(node: &str, rule: Rule, source: Source) -> Key {
        Key {
            node: node.into(),
            rule,
            source,
        }
    }

    /// Checks and, when allowed, records: what [`super::super::Events`] does.
    fn offer(l: &mut RateLimiter, k: Key, now: Instant) -> Verdict {
        let v = l.check(&k, now);
        if v == Verdict::Send {
            l.record(k, now);
        }
        v
    }

    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn a_repeat_within_the_window_is_limited_and_one_after_it_is_sent() {
        let t0 = Instant::now();
        let mut l = RateLimiter::new(10 * MINUTE, 100);
        let k = key("n1", Rule::DevicePluginWithoutToolkit, Source::Refusal);
        assert_eq!(offer(&mut l, k.clone(), t0), Verdict::Send);
        assert_eq!(offer(&mut l, k.clone(), t0 + MINUTE), Verdict::Limited);
        assert_eq!(
            offer(
                &mut l,
                k.clone(),
                t0 + 10 * MINUTE - Duration::from_millis(1)
            ),
            Verdict::Limited
        );
        assert_eq!(offer(&mut l, k.clone(), t0 + 10 * MINUTE), Verdict::Send);
        assert_eq!(l.len(), 1);
    }

    #[test]
    fn the_limit_is_per_node_rule_and_source() {
        let t0 = Instant::now();
        let mut l = RateLimiter::new(10 * MINUTE, 100);
        let rule = Rule::DevicePluginWithoutToolkit;
        assert_eq!(
            offer(&mut l, key("n1", rule, Source::Refusal), t0),
            Verdict::Send
        );
        assert_eq!(
            offer(&mut l, key("n2", rule, Source::Refusal), t0),
            Verdict::Send
        );
        assert_eq!(
            offer(
                &mut l,
                key("n1", Rule::OperandWithoutToolkit, Source::Refusal),
                t0
            ),
            Verdict::Send
        );
        assert_eq!(
            offer(&mut l, key("n1", rule, Source::Audit), t0),
            Verdict::Send
        );
        assert_eq!(
            offer(&mut l, key("n1", rule, Source::Refusal), t0),
            Verdict::Limited
        );
        assert_eq!(l.len(), 4);
    }

    #[test]
    fn a_checked_key_that_was_not_recorded_is_not_limited() {
        let t0 = Instant::now();
        let mut l = RateLimiter::new(MINUTE, 10);
        let k = key("n1", Rule::DevicePluginWithoutToolkit, Source::Audit);
        // Checked, then dropped by a full queue: the next chance is not taken away.
        assert_eq!(l.check(&k, t0), Verdict::Send);
        assert_eq!(l.check(&k, t0), Verdict::Send);
        assert!(l.is_empty());
    }

    #[test]
    fn a_hundred_thousand_distinct_nodes_stay_at_the_cap_and_are_refused_until_entries_expire() {
        let t0 = Instant::now();
        let cap = 10_000;
        let mut l = RateLimiter::new(10 * MINUTE, cap);
        let mut sent = 0;
        let mut full = 0;
        for i in 0..100_000u32 {
            let now = t0 + Duration::from_millis(u64::from(i));
            let k = key(&format!("node-{i}"), Rule::NfdLabelsLost, Source::Audit);
            match offer(&mut l, k, now) {
                Verdict::Send => sent += 1,
                Verdict::Full => full += 1,
                Verdict::Limited => panic!("node-{i} is new"),
            }
            assert!(l.len() <= cap);
        }
        assert_eq!((sent, full), (cap, 100_000 - cap));
        assert_eq!(l.len(), cap);
        assert_eq!(l.order.len(), cap);
        // The first 10,000 went out in the first 10 s; a window later they expire and new
        // nodes are let through again.
        let later = t0 + 10 * MINUTE + Duration::from_secs(10);
        let k = key("node-new", Rule::NfdLabelsLost, Source::Audit);
        assert_eq!(offer(&mut l, k, later), Verdict::Send);
        assert_eq!(l.len(), 1);
    }
}
