//! What the Events of one replica hold at their bounds, counted by this binary's allocator: a
//! flood of 100,000 refusals on distinct nodes of the longest names the API allows, with notes
//! far over the API's 1 kB, against the rate limit's 10,000 keys and the queue's 256 Events.
//!
//! One test function: the counter is process-wide, so nothing else may run beside it.

use std::time::Duration;

use gpu_deploy_guard::core::rules::Rule;
use gpu_deploy_guard::events::{EventMetrics, Events, MAX_KEYS, Offered, QUEUE, Source};
use prometheus_client::registry::Registry;

mod counting_alloc;

use counting_alloc::{Counting, held, mark, peak_since};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const MIB: usize = 1 << 20;

/// A node name of the longest length the API allows (253), distinct per `i`.
fn node(i: usize) -> String {
    format!("{i:0>253}")
}

#[test]
fn a_flood_of_events_stays_within_the_rate_limit_and_the_queue_bounds() {
    let mut registry = Registry::default();
    let metrics = EventMetrics::register(&mut registry);
    let before = mark();
    let (events, mut queue) = Events::new(Duration::from_secs(600), metrics);
    let note = "n".repeat(5_000);

    // A sender that keeps up: every queued Event is taken at once, so the rate limit fills.
    let mut counts = [0usize; 3];
    for i in 0..100_000 {
        let offered = events.offer(
            &node(i),
            Rule::DevicePluginWithoutToolkit,
            Source::Refusal,
            || Some(note.clone()),
        );
        match offered {
            Offered::Queued => counts[0] += 1,
            Offered::LimiterFull => counts[1] += 1,
            _ => counts[2] += 1,
        }
        while queue.try_recv().is_ok() {}
    }
    assert_eq!(counts, [MAX_KEYS, 100_000 - MAX_KEYS, 0]);
    let limiter = held() - before;

    // A sender that is stuck: the queue fills with the longest notes and the rest is dropped.
    let (stuck, _queue) = Events::new(Duration::from_secs(600), {
        let mut r = Registry::default();
        EventMetrics::register(&mut r)
    });
    let at = held();
    let mut queued = 0;
    for i in 0..100_000 {
        let offered = stuck.offer(
            &node(i),
            Rule::DevicePluginWithoutToolkit,
            Source::Refusal,
            || Some(note.clone()),
        );
        queued += usize::from(offered == Offered::Queued);
    }
    assert_eq!(queued, QUEUE);
    let full_queue = held() - at;
    let peak = peak_since(before);
    eprintln!(
        "rate limit at {MAX_KEYS} keys of 253-byte names: {} KiB; queue of {QUEUE} Events of 1 kB \
         notes: {} KiB (with its limiter); peak {} KiB",
        limiter / 1024,
        full_queue / 1024,
        peak / 1024
    );
    assert!(limiter < 8 * MIB, "{limiter}");
    assert!(full_queue < 2 * MIB, "{full_queue}");
    assert!(peak < 12 * MIB, "{peak}");
    drop((events, stuck));
}
