//! `serve`'s metrics: the webhook's connections ([`ConnectionMetrics`], updated by
//! `conn.rs` and `server.rs`), its connection pools ([`PoolMetrics`],
//! `pool.rs`) and the operator version decisions follow ([`VersionMetrics`],
//! `cmd.rs`).

use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::metrics::labels::{ReasonLabels, ResultLabels};

use crate::metrics::series::replace_series;

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
struct VersionLabels {
    version: String,
    era: &'static str,
    source: &'static str,
}

/// The webhook port's connections: handshakes, timeouts, how many are open and the limit.
pub struct ConnectionMetrics {
    handshakes: Family<ResultLabels, Counter>,
    timeouts: Family<ReasonLabels, Counter>,
    open: Gauge<i64>,
    limit: Gauge<i64>,
}

impl ConnectionMetrics {
    pub(crate) fn register(registry: &mut Registry) -> Self {
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
        let open = Gauge::<i64>::default();
        registry.register(
            "webhook_open_connections",
            "Webhook connections open now, TLS handshakes included",
            open.clone(),
        );
        let limit = Gauge::<i64>::default();
        registry.register(
            "webhook_max_connections",
            "The most webhook connections served at once (--max-connections); more wait",
            limit.clone(),
        );
        ConnectionMetrics {
            handshakes,
            timeouts,
            open,
            limit,
        }
    }

    /// Records the end of a TLS handshake on the webhook port: `success`, `failure` or `timeout`.
    pub fn observe_handshake(&self, result: &'static str) {
        self.handshakes
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// Records a webhook connection closed by a timeout: `header` or `idle`.
    pub fn observe_timeout(&self, reason: &'static str) {
        self.timeouts.get_or_create(&ReasonLabels { reason }).inc();
    }

    /// Counts webhook connections opening (`1`) and closing (`-1`).
    pub fn add_open(&self, delta: i64) {
        self.open.inc_by(delta);
    }

    /// Records the connection limit in force.
    pub fn set_limit(&self, limit: usize) {
        self.limit.set(i64::try_from(limit).unwrap_or(i64::MAX));
    }
}

/// The connection pools (webhook, its handshakes, admin): full or not, evictions, refusals and
/// the source holding the most.
pub struct PoolMetrics {
    full: Family<PoolLabels, Gauge>,
    evictions: Family<PoolReasonLabels, Counter>,
    refusals: Family<PoolReasonLabels, Counter>,
    top_source: Family<TopSourceLabels, Gauge>,
    /// The labels of each pool's one `connection_pool_top_source_connections` series.
    top_current: Mutex<Vec<TopSourceLabels>>,
}

impl PoolMetrics {
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let full = Family::<PoolLabels, Gauge>::default();
        registry.register(
            "connection_pool_full",
            "1 while a connection pool is full: webhook (--max-connections), \
             webhook-handshakes (TLS handshakes in progress) or admin; new connections then \
             close an idle one of the source holding the most, or wait",
            full.clone(),
        );
        for pool in ["webhook", "webhook-handshakes", "admin"] {
            let _ = full.get_or_create(&PoolLabels { pool });
        }
        let evictions = Family::<PoolReasonLabels, Counter>::default();
        registry.register(
            "connection_pool_evictions",
            "Idle or handshaking connections closed to admit another, by pool and reason \
             (full, handshakes-full, source-limit)",
            evictions.clone(),
        );
        let refusals = Family::<PoolReasonLabels, Counter>::default();
        registry.register(
            "connection_pool_refusals",
            "Connections closed at once because their pool had no place for them, by pool and \
             reason (full, source-limit)",
            refusals.clone(),
        );
        let top_source = Family::<TopSourceLabels, Gauge>::default();
        registry.register(
            "connection_pool_top_source_connections",
            "Connections held by the source (IP address) holding the most of a pool: one \
             series per pool",
            top_source.clone(),
        );
        PoolMetrics {
            full,
            evictions,
            refusals,
            top_source,
            top_current: Mutex::new(Vec::new()),
        }
    }

    /// Records a connection closed by `pool` to admit another.
    pub fn observe_eviction(&self, pool: &'static str, reason: &'static str) {
        self.evictions
            .get_or_create(&PoolReasonLabels { pool, reason })
            .inc();
    }

    /// Records a connection `pool` had no place for.
    pub fn observe_refusal(&self, pool: &'static str, reason: &'static str) {
        self.refusals
            .get_or_create(&PoolReasonLabels { pool, reason })
            .inc();
    }

    /// Publishes a pool's state: whether it (and, for the webhook, its handshakes) is full,
    /// and the source holding the most connections with their number.
    pub fn set_state(
        &self,
        pool: &'static str,
        full: bool,
        handshakes_full: bool,
        top: Option<(String, usize)>,
    ) {
        self.full
            .get_or_create(&PoolLabels { pool })
            .set(i64::from(full));
        if pool == "webhook" {
            self.full
                .get_or_create(&PoolLabels {
                    pool: "webhook-handshakes",
                })
                .set(i64::from(handshakes_full));
        }
        replace_series(
            &self.top_source,
            &self.top_current,
            |l| l.pool == pool,
            top.map(|(source, n)| (TopSourceLabels { pool, source }, n)),
        );
    }
}

/// The GPU Operator version decisions follow: one series, replaced when it changes.
pub struct VersionMetrics {
    info: Family<VersionLabels, Gauge>,
    /// The labels of the one `operator_version_info` series.
    current: Mutex<Option<VersionLabels>>,
}

impl VersionMetrics {
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let info = Family::<VersionLabels, Gauge>::default();
        registry.register(
            "operator_version_info",
            "The GPU Operator version decisions follow (1 on the one series): version, its era in \
             the model, and source (given: --operator-version or the config file; deployment: the \
             operator Deployment's image tag; assumed: none known, the newest era)",
            info.clone(),
        );
        VersionMetrics {
            info,
            current: Mutex::new(None),
        }
    }

    /// Replaces the `operator_version_info` series with this one: the new series is there
    /// before the old one goes, so no scrape finds none.
    pub fn set(&self, version: &str, era: &'static str, source: &'static str) {
        let labels = VersionLabels {
            version: crate::core::echo::echo(version).into_owned(),
            era,
            source,
        };
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        self.info.get_or_create(&labels).set(1);
        if let Some(old) = current.replace(labels.clone())
            && old != labels
        {
            self.info.remove(&old);
        }
    }
}
