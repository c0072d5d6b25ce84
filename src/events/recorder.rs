//! The task that sends the queued Events, one at a time, and the Events' counters.
//!
//! An error of the API (forbidden, the namespace missing, a timeout) is counted and logged,
//! the first at once and then at most once a minute with the count since; the Event is not
//! retried (the next transition or refusal brings another). Each create is bounded by
//! [`SEND_TIMEOUT`], so a hung API server fills the queue, whose overflow is dropped and
//! counted, and never reaches the webhook's answers.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::event::{self, NodeEvent};
use super::{Events, Source};

/// The longest one Event's create may take.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// How often a persisting failure is logged again.
const LOG_EVERY: Duration = Duration::from_secs(60);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    source: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceReasonLabels {
    source: &'static str,
    reason: &'static str,
}

/// The Events sent, failed and dropped, and the rate limit's size.
pub struct EventMetrics {
    sent: Family<SourceLabels, Counter>,
    failed: Family<SourceReasonLabels, Counter>,
    dropped: Family<SourceReasonLabels, Counter>,
    keys: Gauge,
}

impl EventMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let sent = Family::<SourceLabels, Counter>::default();
        registry.register(
            "events_sent",
            "Kubernetes Events written on Nodes, by source (audit: a node gained a finding; \
             refusal: this replica refused a change)",
            sent.clone(),
        );
        let failed = Family::<SourceReasonLabels, Counter>::default();
        registry.register(
            "events_failed",
            "Kubernetes Events the API server did not take, by source and reason (forbidden, \
             not-found, invalid, timeout, unavailable, other)",
            failed.clone(),
        );
        let dropped = Family::<SourceReasonLabels, Counter>::default();
        registry.register(
            "events_dropped",
            "Kubernetes Events not sent, by source and reason: rate-limited (one per node, rule \
             and source within --event-window), limiter-full (the rate limit holds 10,000 keys), \
             queue-full (256 Events wait for the API server)",
            dropped.clone(),
        );
        let keys = Gauge::default();
        registry.register(
            "events_rate_limit_keys",
            "Node, rule and source keys the Events' rate limit holds now (at most 10,000)",
            keys.clone(),
        );
        for source in [Source::Audit, Source::Refusal] {
            let source = source.label();
            let _ = sent.get_or_create(&SourceLabels { source });
            for reason in ["rate-limited", "limiter-full", "queue-full"] {
                let _ = dropped.get_or_create(&SourceReasonLabels { source, reason });
            }
        }
        EventMetrics {
            sent,
            failed,
            dropped,
            keys,
        }
    }

    pub(super) fn dropped(&self, source: Source, reason: &'static str) {
        let source = source.label();
        self.dropped
            .get_or_create(&SourceReasonLabels { source, reason })
            .inc();
    }

    pub(super) fn set_keys(&self, keys: usize) {
        self.keys.set(i64::try_from(keys).unwrap_or(i64::MAX));
    }

    fn sent(&self, source: Source) {
        let source = source.label();
        self.sent.get_or_create(&SourceLabels { source }).inc();
    }

    fn failed(&self, source: Source, reason: &'static str) {
        let source = source.label();
        self.failed
            .get_or_create(&SourceReasonLabels { source, reason })
            .inc();
    }
}

/// `reportingInstance`: the pod's name (`POD_NAME`, which the chart sets), else the host name.
pub fn instance(pod_name: Option<&str>) -> String {
    if let Some(name) = pod_name.filter(|n| !n.is_empty()) {
        return name.to_owned();
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "gpu-deploy-guard".to_owned())
}

/// Sends the queued Events as `instance` until the queue's senders are gone.
pub async fn run(
    client: Client,
    mut queue: mpsc::Receiver<NodeEvent>,
    events: Arc<Events>,
    instance: String,
) {
    let api: Api<Event> = Api::namespaced(client, event::NAMESPACE);
    let params = PostParams::default();
    let mut log = FailureLog::default();
    while let Some(node_event) = queue.recv().await {
        let body = node_event.to_k8s(&instance, Timestamp::now());
        let sent = tokio::time::timeout(SEND_TIMEOUT, api.create(&params, &body));
        match sent.await {
            Ok(Ok(_)) => {
                events.metrics.sent(node_event.source);
                log.succeeded();
            }
            Ok(Err(error)) => {
                let reason = failure_reason(&error);
                events.metrics.failed(node_event.source, reason);
                log.failed(reason, &error.to_string(), Instant::now());
            }
            Err(_) => {
                events.metrics.failed(node_event.source, "timeout");
                log.failed("timeout", "no answer within 10s", Instant::now());
            }
        }
        if queue.is_empty() {
            events.drained();
        }
    }
}

/// The metrics' reason for an error of the API.
fn failure_reason(error: &kube::Error) -> &'static str {
    match error {
        kube::Error::Api(status) => match status.code {
            403 => "forbidden",
            404 => "not-found",
            400 | 422 => "invalid",
            429 | 500..=599 => "unavailable",
            _ => "other",
        },
        kube::Error::HyperError(_) | kube::Error::Service(_) => "unavailable",
        _ => "other",
    }
}

/// Logs the first failure at once, then at most once per [`LOG_EVERY`] with the count since.
#[derive(Default)]
struct FailureLog {
    failing: bool,
    last: Option<Instant>,
    since_last: u64,
}

impl FailureLog {
    /// Whether this failure is logged.
    fn failed(&mut self, reason: &'static str, error: &str, now: Instant) -> bool {
        self.failing = true;
        self.since_last += 1;
        if self
            .last
            .is_some_and(|last| now.duration_since(last) < LOG_EVERY)
        {
            return false;
        }
        let hint = if reason == "forbidden" {
            "; grant create on events.events.k8s.io in namespace default (the chart's \
             events.enabled), or run serve with --no-events"
        } else {
            ""
        };
        tracing::warn!(
            reason,
            error = %crate::core::echo::bounded_display(&error, 1024),
            failures = self.since_last,
            "cannot write Kubernetes Events{hint}"
        );
        self.last = Some(now);
        self.since_last = 0;
        true
    }

    fn succeeded(&mut self) {
        if std::mem::take(&mut self.failing) {
            tracing::info!("Kubernetes Events are written again");
            self.last = None;
            self.since_last = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_persisting_failure_is_logged_once_a_minute() {
        let t0 = Instant::now();
        let mut log = FailureLog::default();
        assert!(log.failed("forbidden", "403", t0));
        for s in 1..60 {
            assert!(!log.failed("forbidden", "403", t0 + Duration::from_secs(s)));
        }
        assert!(log.failed("forbidden", "403", t0 + LOG_EVERY));
        log.succeeded();
        // A new failure after a success is logged at once.
        assert!(log.failed("timeout", "slow", t0 + LOG_EVERY + Duration::from_secs(1)));
    }

    #[test]
    fn api_errors_are_counted_by_what_a_platform_engineer_fixes() {
        let status = |code: u16| {
            kube::Error::Api(
                kube::core::Status::failure("x", "Forbidden")
                    .with_code(code)
                    .boxed(),
            )
        };
        assert_eq!(failure_reason(&status(403)), "forbidden");
        assert_eq!(failure_reason(&status(404)), "not-found");
        assert_eq!(failure_reason(&status(422)), "invalid");
        assert_eq!(failure_reason(&status(503)), "unavailable");
        assert_eq!(failure_reason(&status(409)), "other");
    }

    #[test]
    fn the_instance_is_the_pod_name_else_the_host_name() {
        assert_eq!(instance(Some("gdg-abc")), "gdg-abc");
        assert!(!instance(None).is_empty());
        assert!(!instance(Some("")).is_empty());
    }
}
