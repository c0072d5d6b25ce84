//! TLS's metrics: the serving certificate in use and the reloads of a changed certificate or
//! client CA bundle.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::metrics::labels::{ReasonLabels, ResultLabels};

/// The serving certificate and the client CA: expiry, reloads and why a reload failed.
pub struct TlsMetrics {
    cert_expiry: Gauge<i64>,
    cert_reloads: Family<ResultLabels, Counter>,
    cert_reload_failures: Family<ReasonLabels, Counter>,
    client_ca_reloads: Family<ResultLabels, Counter>,
}

impl TlsMetrics {
    pub(crate) fn register(registry: &mut Registry) -> Self {
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
        TlsMetrics {
            cert_expiry,
            cert_reloads,
            cert_reload_failures,
            client_ca_reloads,
        }
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

    /// Sets the expiry time of the certificate now being served.
    pub fn set_cert_expiry(&self, unix_seconds: i64) {
        self.cert_expiry.set(unix_seconds);
    }
}
