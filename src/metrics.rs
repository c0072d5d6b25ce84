//! Prometheus metrics of the webhook, served on the admin port.
//!
//! Each component registers its own families beside the code that updates them: the reviews
//! and the source shares ([`crate::webhook::metrics`]), TLS ([`crate::serve::tls::metrics`]),
//! the connections, pools and operator version ([`crate::serve::metrics`]), the continuous
//! audit ([`crate::audit::metrics`], through [`Metrics::with_registry`]). [`Metrics`] holds
//! them; the exposition lists the families in the order they were registered.

use std::sync::Mutex;

use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;

use crate::serve::metrics::{ConnectionMetrics, PoolMetrics, VersionMetrics};
use crate::serve::tls::metrics::TlsMetrics;
use crate::webhook::metrics::{PolicyReviewMetrics, ReviewMetrics, ShareMetrics};

pub(crate) mod labels;
pub(crate) mod series;

/// All metrics of one process, by component. Cheap to share behind an `Arc`.
pub struct Metrics {
    registry: Mutex<Registry>,
    /// The Node reviews.
    pub reviews: ReviewMetrics,
    /// The reviews of GPU-policy changes.
    pub policy_reviews: PolicyReviewMetrics,
    /// The serving certificate and the client CA.
    pub tls: TlsMetrics,
    /// The webhook port's connections.
    pub connections: ConnectionMetrics,
    /// The connection pools.
    pub pools: PoolMetrics,
    /// The requests refused for their source's share.
    pub shares: ShareMetrics,
    /// The operator version decisions follow.
    pub version: VersionMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Every component's metrics, registered in the order the exposition lists them.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("gpu_deploy_guard");
        let reviews = ReviewMetrics::register(&mut registry);
        let policy_reviews = PolicyReviewMetrics::register(&mut registry);
        let tls = TlsMetrics::register(&mut registry);
        let connections = ConnectionMetrics::register(&mut registry);
        let pools = PoolMetrics::register(&mut registry);
        let shares = ShareMetrics::register(&mut registry);
        let version = VersionMetrics::register(&mut registry);
        Self {
            registry: Mutex::new(registry),
            reviews,
            policy_reviews,
            tls,
            connections,
            pools,
            shares,
            version,
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
        m.version.set("v26.7", "v26.7", "assumed");
        m.version.set("v24.9.2", "v24.9", "deployment");
        assert_eq!(
            version_series(&m),
            [
                r#"gpu_deploy_guard_operator_version_info{version="v24.9.2",era="v24.9",source="deployment"} 1"#
            ]
        );
        // The same again changes nothing; a long tag is cut as any echoed text.
        m.version.set("v24.9.2", "v24.9", "deployment");
        assert_eq!(version_series(&m).len(), 1);
        m.version.set(
            &format!("v26.7.0-{}", "x".repeat(500)),
            "v26.7",
            "deployment",
        );
        let series = version_series(&m);
        assert_eq!(series.len(), 1, "{series:?}");
        assert!(series[0].contains("(508 bytes)"), "{series:?}");
    }
}
