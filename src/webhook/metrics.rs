//! The webhook's metrics: the reviews of nodes ([`ReviewMetrics`]) and of GPU-policy changes
//! ([`PolicyReviewMetrics`]), and the requests refused because their source held its share
//! ([`ShareMetrics`]). Each registers its families into the process's registry
//! ([`crate::metrics::Metrics`]).

use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::metrics::labels::ReasonLabels;

use crate::core::policy::Decision;
use crate::core::policy_change::PolicyKind;
use crate::core::review::Operation;
use crate::core::rules::{Action, Rule};
use crate::metrics::series::replace_series;

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
struct ShareLabels {
    share: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShareSourceLabels {
    share: &'static str,
    source: String,
}

/// The Node reviews (`/validate`): answers, findings, requests refused before any decision,
/// and how long each took.
pub struct ReviewMetrics {
    reviews: Family<ReviewLabels, Counter>,
    findings: Family<FindingLabels, Counter>,
    bad_requests: Family<ReasonLabels, Counter>,
    latency: Histogram,
}

impl ReviewMetrics {
    pub(crate) fn register(registry: &mut Registry) -> Self {
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
        let latency = Histogram::new(exponential_buckets(0.000_05, 2.0, 15));
        registry.register(
            "admission_review_duration_seconds",
            "Time to read, decide and answer one admission review",
            latency.clone(),
        );
        ReviewMetrics {
            reviews,
            findings,
            bad_requests,
            latency,
        }
    }

    /// Records one answered review: its decision, its operation, each finding's rule and
    /// action, and how long it took.
    pub fn observe(
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

    /// Records a request that was refused before any decision (HTTP 4xx).
    pub fn observe_bad_request(&self, reason: &'static str) {
        self.bad_requests
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }
}

/// The reviews of GPU-policy changes (`/validate/gpu-policy`).
pub struct PolicyReviewMetrics {
    reviews: Family<PolicyReviewLabels, Counter>,
    findings: Family<PolicyFindingLabels, Counter>,
    latency: Histogram,
}

impl PolicyReviewMetrics {
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let reviews = Family::<PolicyReviewLabels, Counter>::default();
        registry.register(
            "policy_reviews",
            "Reviews of GPU-policy changes (ClusterPolicy, NVIDIADriver) answered, by kind, decision and operation",
            reviews.clone(),
        );
        let findings = Family::<PolicyFindingLabels, Counter>::default();
        registry.register(
            "policy_findings",
            "Rule findings in reviews of GPU-policy changes, by kind, rule and action taken",
            findings.clone(),
        );
        // 50 µs .. ~0.8 s: decided over every node, in groups of identical labels.
        let latency = Histogram::new(exponential_buckets(0.000_05, 2.0, 15));
        registry.register(
            "policy_review_duration_seconds",
            "Time to read, decide over the fleet and answer one GPU-policy review",
            latency.clone(),
        );
        PolicyReviewMetrics {
            reviews,
            findings,
            latency,
        }
    }

    /// Records one answered GPU-policy review (`kind`: ClusterPolicy or NVIDIADriver).
    pub fn observe(
        &self,
        kind: PolicyKind,
        decision: Decision,
        operation: Operation,
        findings: impl IntoIterator<Item = (Rule, Action)>,
        seconds: f64,
    ) {
        let (kind, decision, operation) = (kind.as_str(), decision.as_str(), operation.as_str());
        self.reviews
            .get_or_create(&PolicyReviewLabels {
                kind,
                decision,
                operation,
            })
            .inc();
        for (rule, action) in findings {
            self.findings
                .get_or_create(&PolicyFindingLabels {
                    kind,
                    rule: rule.id(),
                    action: action.as_str(),
                })
                .inc();
        }
        self.latency.observe(seconds);
    }
}

/// The requests refused because their client source held its share (`shares.rs`).
pub struct ShareMetrics {
    refusals: Family<ShareLabels, Counter>,
    last_refused: Family<ShareSourceLabels, Gauge>,
    /// The labels of each share's one `source_share_last_refused` series.
    last_current: Mutex<Vec<ShareSourceLabels>>,
}

impl ShareMetrics {
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let refusals = Family::<ShareLabels, Counter>::default();
        registry.register(
            "source_share_refusals",
            "Webhook requests answered 503 because their client source (IP address) held its \
             share: requests (--max-requests-per-source in flight) or body-bytes (half the \
             in-flight body budget, for the whole body timeout)",
            refusals.clone(),
        );
        for share in ["requests", "body-bytes"] {
            let _ = refusals.get_or_create(&ShareLabels { share });
        }
        let last_refused = Family::<ShareSourceLabels, Gauge>::default();
        registry.register(
            "source_share_last_refused",
            "The source refused last for holding its share, with what it held then (requests \
             or bytes): one series per share",
            last_refused.clone(),
        );
        ShareMetrics {
            refusals,
            last_refused,
            last_current: Mutex::new(Vec::new()),
        }
    }

    /// Records a request refused because its source held its `share` (`requests` or
    /// `body-bytes`), and names the source with what it held.
    pub fn observe_refusal(&self, share: &'static str, source: String, held: usize) {
        self.refusals.get_or_create(&ShareLabels { share }).inc();
        replace_series(
            &self.last_refused,
            &self.last_current,
            |l| l.share == share,
            Some((ShareSourceLabels { share, source }, held)),
        );
    }
}
