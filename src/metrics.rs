//! Prometheus metrics of the webhook, served on the admin port.

use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::core::policy::Decision;
use crate::core::policy_change::PolicyKind;
use crate::core::review::Operation;
use crate::core::rules::{Action, Rule};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReviewLabels {
    decision: &'static str,
    operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FindingLabels {
    rule: &'static str,
    action: &'static str,
    operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyReviewLabels {
    kind: &'static str,
    decision: &'static str,
    operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyFindingLabels {
    kind: &'static str,
    rule: &'static str,
    action: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabels {
    version: String,
    era: &'static str,
    source: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    pool: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolReasonLabels {
    pool: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TopSourceLabels {
    pool: &'static str,
    source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShareLabels {
    share: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShareSourceLabels {
    share: &'static str,
    source: String,
}

/// All metrics of one process. Cheap to share behind an `Arc`.
pub struct Metrics {
    registry: Mutex<Registry>,
    reviews: Family<ReviewLabels, Counter>,
    findings: Family<FindingLabels, Counter>,
    bad_requests: Family<ReasonLabels, Counter>,
    latency: Histogram,
    policy_reviews: Family<PolicyReviewLabels, Counter>,
    policy_findings: Family<PolicyFindingLabels, Counter>,
    policy_latency: Histogram,
    cert_expiry: Gauge<i64>,
    cert_reloads: Family<ResultLabels, Counter>,
    cert_reload_failures: Family<ReasonLabels, Counter>,
    client_ca_reloads: Family<ResultLabels, Counter>,
    handshakes: Family<ResultLabels, Counter>,
    timeouts: Family<ReasonLabels, Counter>,
    open_connections: Gauge<i64>,
    connection_limit: Gauge<i64>,
    pool_full: Family<PoolLabels, Gauge>,
    pool_evictions: Family<PoolReasonLabels, Counter>,
    pool_refusals: Family<PoolReasonLabels, Counter>,
    pool_top_source: Family<TopSourceLabels, Gauge>,
    /// The labels of each pool's one `connection_pool_top_source_connections` series.
    pool_top_current: Mutex<Vec<TopSourceLabels>>,
    share_refusals: Family<ShareLabels, Counter>,
    share_last_refused: Family<ShareSourceLabels, Gauge>,
    /// The labels of each share's one `source_share_last_refused` series.
    share_last_current: Mutex<Vec<ShareSourceLabels>>,
    operator_version: Family<VersionLabels, Gauge>,
    /// The labels of the one `operator_version_info` series.
    operator_version_current: Mutex<Option<VersionLabels>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("gpu_deploy_guard");
        let reviews = Family::<ReviewLabels, Counter>::default();
        registry.register(
            "admission_reviews",
            "Admission reviews answered, by decision (allowed, denied, exempt) and operation",
            reviews.clone(),
        );
        let findings = Family::<FindingLabels, Counter>::default();
        registry.register(
            "admission_findings",
            "Rule findings in admission reviews, by rule, action taken and operation",
            findings.clone(),
        );
        let bad_requests = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "admission_bad_requests",
            "Requests to the webhook that could not be read as a Node AdmissionReview, by reason",
            bad_requests.clone(),
        );
        // 50 µs .. ~0.8 s: a review should cost well under a millisecond.
        let latency = Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
            0.000_05, 2.0, 15,
        ));
        registry.register(
            "admission_review_duration_seconds",
            "Time to read, decide and answer one admission review",
            latency.clone(),
        );
        let policy_reviews = Family::<PolicyReviewLabels, Counter>::default();
        registry.register(
            "policy_reviews",
            "Reviews of GPU-policy changes (ClusterPolicy, NVIDIADriver) answered, by kind, decision and operation",
            policy_reviews.clone(),
        );
        let policy_findings = Family::<PolicyFindingLabels, Counter>::default();
        registry.register(
            "policy_findings",
            "Rule findings in reviews of GPU-policy changes, by kind, rule and action taken",
            policy_findings.clone(),
        );
        // 50 µs .. ~0.8 s: decided over every node, in groups of identical labels.
        let policy_latency = Histogram::new(
            prometheus_client::metrics::histogram::exponential_buckets(0.000_05, 2.0, 15),
        );
        registry.register(
            "policy_review_duration_seconds",
            "Time to read, decide over the fleet and answer one GPU-policy review",
            policy_latency.clone(),
        );
        let cert_expiry = Gauge::<i64>::default();
        registry.register(
            "tls_certificate_expiry_timestamp_seconds",
            "Unix time at which the serving certificate in use expires",
            cert_expiry.clone(),
        );
        let cert_reloads = Family::<ResultLabels, Counter>::default();
        registry.register(
            "tls_certificate_reloads",
            "Attempts to load a changed serving certificate, by result (success, failure)",
            cert_reloads.clone(),
        );
        // Both results exist from the start, so `increase()` sees the first failure.
        for result in ["success", "failure"] {
            let _ = cert_reloads.get_or_create(&ResultLabels { result });
        }
        let cert_reload_failures = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "tls_certificate_reload_failures",
            "Changed serving certificates not loaded (the previous one kept), by reason: \
             expired, not-yet-valid, unreadable (missing, not a regular file, too large) or \
             invalid",
            cert_reload_failures.clone(),
        );
        for reason in ["expired", "not-yet-valid", "unreadable", "invalid"] {
            let _ = cert_reload_failures.get_or_create(&ReasonLabels { reason });
        }
        let client_ca_reloads = Family::<ResultLabels, Counter>::default();
        registry.register(
            "tls_client_ca_reloads",
            "Attempts to load a changed --client-ca bundle, by result (success, failure: the \
             previous CA kept)",
            client_ca_reloads.clone(),
        );
        for result in ["success", "failure"] {
            let _ = client_ca_reloads.get_or_create(&ResultLabels { result });
        }
        let handshakes = Family::<ResultLabels, Counter>::default();
        registry.register(
            "webhook_tls_handshakes",
            "TLS handshakes on the webhook port, by result (success, failure, timeout); with the \
             API server keeping its connections, far fewer than reviews",
            handshakes.clone(),
        );
        let timeouts = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "webhook_connection_timeouts",
            "Webhook connections closed by a timeout, by reason: header (a request head, or an \
             HTTP/2 preface, not received in time), idle (no request for the idle timeout) or \
             write (an answer not taken by the client within the write timeout)",
            timeouts.clone(),
        );
        for result in ["success", "failure", "timeout"] {
            let _ = handshakes.get_or_create(&ResultLabels { result });
        }
        for reason in ["header", "idle", "write"] {
            let _ = timeouts.get_or_create(&ReasonLabels { reason });
        }
        let open_connections = Gauge::<i64>::default();
        registry.register(
            "webhook_open_connections",
            "Webhook connections open now, TLS handshakes included",
            open_connections.clone(),
        );
        let connection_limit = Gauge::<i64>::default();
        registry.register(
            "webhook_max_connections",
            "The most webhook connections served at once (--max-connections); more wait",
            connection_limit.clone(),
        );
        let pool_full = Family::<PoolLabels, Gauge>::default();
        registry.register(
            "connection_pool_full",
            "1 while a connection pool is full: webhook (--max-connections), \
             webhook-handshakes (TLS handshakes in progress) or admin; new connections then \
             close an idle one of the source holding the most, or wait",
            pool_full.clone(),
        );
        for pool in ["webhook", "webhook-handshakes", "admin"] {
            let _ = pool_full.get_or_create(&PoolLabels { pool });
        }
        let pool_evictions = Family::<PoolReasonLabels, Counter>::default();
        registry.register(
            "connection_pool_evictions",
            "Idle or handshaking connections closed to admit another, by pool and reason \
             (full, handshakes-full, source-limit)",
            pool_evictions.clone(),
        );
        let pool_refusals = Family::<PoolReasonLabels, Counter>::default();
        registry.register(
            "connection_pool_refusals",
            "Connections closed at once because their pool had no place for them, by pool and \
             reason (full, source-limit)",
            pool_refusals.clone(),
        );
        let pool_top_source = Family::<TopSourceLabels, Gauge>::default();
        registry.register(
            "connection_pool_top_source_connections",
            "Connections held by the source (IP address) holding the most of a pool: one \
             series per pool",
            pool_top_source.clone(),
        );
        let share_refusals = Family::<ShareLabels, Counter>::default();
        registry.register(
            "source_share_refusals",
            "Webhook requests answered 503 because their client source (IP address) held its \
             share: requests (--max-requests-per-source in flight) or body-bytes (half the \
             in-flight body budget, for the whole body timeout)",
            share_refusals.clone(),
        );
        for share in ["requests", "body-bytes"] {
            let _ = share_refusals.get_or_create(&ShareLabels { share });
        }
        let share_last_refused = Family::<ShareSourceLabels, Gauge>::default();
        registry.register(
            "source_share_last_refused",
            "The source refused last for holding its share, with what it held then (requests \
             or bytes): one series per share",
            share_last_refused.clone(),
        );
        let operator_version = Family::<VersionLabels, Gauge>::default();
        registry.register(
            "operator_version_info",
            "The GPU Operator version decisions follow (1 on the one series): version, its era in \
             the model, and source (given: --operator-version or the config file; deployment: the \
             operator Deployment's image tag; assumed: none known, the newest era)",
            operator_version.clone(),
        );
        Self {
            registry: Mutex::new(registry),
            reviews,
            findings,
            bad_requests,
            latency,
            policy_reviews,
            policy_findings,
            policy_latency,
            cert_expiry,
            cert_reloads,
            cert_reload_failures,
            client_ca_reloads,
            handshakes,
            timeouts,
            open_connections,
            connection_limit,
            pool_full,
            pool_evictions,
            pool_refusals,
            pool_top_source,
            pool_top_current: Mutex::new(Vec::new()),
            share_refusals,
            share_last_refused,
            share_last_current: Mutex::new(Vec::new()),
            operator_version,
            operator_version_current: Mutex::new(None),
        }
    }

    /// Records one answered review: its decision, its operation, each finding's rule and
    /// action, and how long it took.
    pub fn observe_review(
        &self,
        decision: Decision,
        operation: Operation,
        findings: impl IntoIterator<Item = (Rule, Action)>,
        seconds: f64,
    ) {
        let (decision, operation) = (decision.as_str(), operation.as_str());
        self.reviews
            .get_or_create(&ReviewLabels {
                decision,
                operation,
            })
            .inc();
        for (rule, action) in findings {
            self.findings
                .get_or_create(&FindingLabels {
                    rule: rule.id(),
                    action: action.as_str(),
                    operation,
                })
                .inc();
        }
        self.latency.observe(seconds);
    }

    /// Records one answered GPU-policy review (`kind`: ClusterPolicy or NVIDIADriver).
    pub fn observe_policy_review(
        &self,
        kind: PolicyKind,
        decision: Decision,
        operation: Operation,
        findings: impl IntoIterator<Item = (Rule, Action)>,
        seconds: f64,
    ) {
        let (kind, decision, operation) = (kind.as_str(), decision.as_str(), operation.as_str());
        self.policy_reviews
            .get_or_create(&PolicyReviewLabels {
                kind,
                decision,
                operation,
            })
            .inc();
        for (rule, action) in findings {
            self.policy_findings
                .get_or_create(&PolicyFindingLabels {
                    kind,
                    rule: rule.id(),
                    action: action.as_str(),
                })
                .inc();
        }
        self.policy_latency.observe(seconds);
    }

    /// Records a request that was refused before any decision (HTTP 4xx).
    pub fn observe_bad_request(&self, reason: &'static str) {
        self.bad_requests
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// Records an attempt to load a rotated certificate.
    pub fn observe_cert_reload(&self, ok: bool) {
        let result = if ok { "success" } else { "failure" };
        self.cert_reloads
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// Records why a changed serving certificate was not loaded.
    pub fn observe_cert_reload_failure(&self, reason: &'static str) {
        self.cert_reload_failures
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// Records an attempt to load a changed client CA bundle.
    pub fn observe_client_ca_reload(&self, ok: bool) {
        let result = if ok { "success" } else { "failure" };
        self.client_ca_reloads
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// Records the end of a TLS handshake on the webhook port: `success`, `failure` or `timeout`.
    pub fn observe_handshake(&self, result: &'static str) {
        self.handshakes
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// Records a webhook connection closed by a timeout: `header` or `idle`.
    pub fn observe_connection_timeout(&self, reason: &'static str) {
        self.timeouts.get_or_create(&ReasonLabels { reason }).inc();
    }

    /// Counts webhook connections opening (`1`) and closing (`-1`).
    pub fn add_open_connections(&self, delta: i64) {
        self.open_connections.inc_by(delta);
    }

    /// Records the connection limit in force.
    pub fn set_connection_limit(&self, limit: usize) {
        self.connection_limit
            .set(i64::try_from(limit).unwrap_or(i64::MAX));
    }

    /// Records a connection closed by `pool` to admit another.
    pub fn observe_pool_eviction(&self, pool: &'static str, reason: &'static str) {
        self.pool_evictions
            .get_or_create(&PoolReasonLabels { pool, reason })
            .inc();
    }

    /// Records a connection `pool` had no place for.
    pub fn observe_pool_refusal(&self, pool: &'static str, reason: &'static str) {
        self.pool_refusals
            .get_or_create(&PoolReasonLabels { pool, reason })
            .inc();
    }

    /// Publishes a pool's state: whether it (and, for the webhook, its handshakes) is full,
    /// and the source holding the most connections with their number.
    pub fn set_pool_state(
        &self,
        pool: &'static str,
        full: bool,
        handshakes_full: bool,
        top: Option<(String, usize)>,
    ) {
        self.pool_full
            .get_or_create(&PoolLabels { pool })
            .set(i64::from(full));
        if pool == "webhook" {
            self.pool_full
                .get_or_create(&PoolLabels {
                    pool: "webhook-handshakes",
                })
                .set(i64::from(handshakes_full));
        }
        replace_series(
            &self.pool_top_source,
            &self.pool_top_current,
            |l| l.pool == pool,
            top.map(|(source, n)| (TopSourceLabels { pool, source }, n)),
        );
    }

    /// Records a request refused because its source held its `share` (`requests` or
    /// `body-bytes`), and names the source with what it held.
    pub fn observe_source_share_refusal(&self, share: &'static str, source: String, held: usize) {
        self.share_refusals
            .get_or_create(&ShareLabels { share })
            .inc();
        replace_series(
            &self.share_last_refused,
            &self.share_last_current,
            |l| l.share == share,
            Some((ShareSourceLabels { share, source }, held)),
        );
    }

    /// Sets the expiry time of the certificate now being served.
    pub fn set_cert_expiry(&self, unix_seconds: i64) {
        self.cert_expiry.set(unix_seconds);
    }

    /// Replaces the `operator_version_info` series with this one: the new series is there
    /// before the old one goes, so no scrape finds none.
    pub fn set_operator_version(&self, version: &str, era: &'static str, source: &'static str) {
        let labels = VersionLabels {
            version: crate::core::echo::echo(version).into_owned(),
            era,
            source,
        };
        let mut current = self
            .operator_version_current
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        self.operator_version.get_or_create(&labels).set(1);
        if let Some(old) = current.replace(labels.clone())
            && old != labels
        {
            self.operator_version.remove(&old);
        }
    }

    /// Lets other parts of the process (the cluster audit) register metrics.
    pub fn with_registry<R>(&self, f: impl FnOnce(&mut Registry) -> R) -> R {
        let mut registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut registry)
    }

    /// The OpenMetrics text exposition of every registered metric.
    pub fn encode(&self) -> String {
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = String::new();
        // Encoding into a String cannot fail: fmt::Write for String is infallible.
        let _ = encode(&mut out, &registry);
        out
    }
}

/// Replaces the one series of `family` that `current` records for a group (`same`) with `new`:
/// the new one is set before the old one goes, so no scrape finds none.
fn replace_series<L>(
    family: &Family<L, Gauge>,
    current: &Mutex<Vec<L>>,
    same: impl Fn(&L) -> bool,
    new: Option<(L, usize)>,
) where
    L: Clone + std::hash::Hash + Eq + EncodeLabelSet + std::fmt::Debug + Send + Sync + 'static,
{
    let mut current = current.lock().unwrap_or_else(|e| e.into_inner());
    let old = current.iter().position(&same).map(|i| current.remove(i));
    let new = new.map(|(labels, n)| {
        family
            .get_or_create(&labels)
            .set(i64::try_from(n).unwrap_or(i64::MAX));
        labels
    });
    if let Some(old) = old
        && Some(&old) != new.as_ref()
    {
        family.remove(&old);
    }
    current.extend(new);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version_series(m: &Metrics) -> Vec<String> {
        m.encode()
            .lines()
            .filter(|l| l.starts_with("gpu_deploy_guard_operator_version_info{"))
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn the_operator_version_has_one_series_that_follows_the_last_one_set() {
        let m = Metrics::new();
        assert_eq!(version_series(&m), Vec::<String>::new());
        m.set_operator_version("v26.7", "v26.7", "assumed");
        m.set_operator_version("v24.9.2", "v24.9", "deployment");
        assert_eq!(
            version_series(&m),
            [
                r#"gpu_deploy_guard_operator_version_info{version="v24.9.2",era="v24.9",source="deployment"} 1"#
            ]
        );
        // The same again changes nothing; a long tag is cut as any echoed text.
        m.set_operator_version("v24.9.2", "v24.9", "deployment");
        assert_eq!(version_series(&m).len(), 1);
        m.set_operator_version(
            &format!("v26.7.0-{}", "x".repeat(500)),
            "v26.7",
            "deployment",
        );
        let series = version_series(&m);
        assert_eq!(series.len(), 1, "{series:?}");
        assert!(series[0].contains("(508 bytes)"), "{series:?}");
    }
}
