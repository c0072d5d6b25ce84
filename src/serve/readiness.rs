//! Readiness (`/readyz`) and the admin endpoints.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::routing::get;

use crate::metrics::Metrics;

const STARTING: u8 = 0;
const SERVING: u8 = 1;
const DRAINING: u8 = 2;

/// Whether the webhook should get traffic, as `/readyz` reports it. Not
/// ready until the server is serving and every registered [`Gate`] is open;
/// not ready again once shutdown starts, so the endpoint is taken out of
/// the Service before the listener closes.
#[derive(Clone, Default)]
pub struct Readiness {
    inner: Arc<ReadinessInner>,
}

#[derive(Default)]
struct ReadinessInner {
    phase: AtomicU8,
    gates: Mutex<Vec<Gate>>,
}

/// A named condition that holds readiness back until opened, e.g. a cluster
/// cache that has to sync before decisions can be made.
#[derive(Clone, Debug)]
pub struct Gate {
    name: &'static str,
    open: Arc<AtomicBool>,
}

impl Gate {
    pub fn name(&self) -> &'static str {
        self.name
    }
    pub fn open(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
    /// Holds readiness back again, e.g. when the certificate in use stops being valid.
    pub fn close(&self) {
        self.open.store(false, Ordering::SeqCst);
    }
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::SeqCst)
    }
}

/// Why the webhook is not ready.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotReady {
    Starting,
    Draining,
    /// Names of the gates not yet open.
    Waiting(Vec<&'static str>),
}

impl fmt::Display for NotReady {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotReady::Starting => f.write_str("starting"),
            NotReady::Draining => f.write_str("draining"),
            NotReady::Waiting(names) => write!(f, "waiting for: {}", names.join(", ")),
        }
    }
}

impl Readiness {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a gate that must be opened before the webhook is ready.
    /// Asking twice for the same name returns the same gate.
    pub fn gate(&self, name: &'static str) -> Gate {
        let mut gates = self.inner.gates.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(gate) = gates.iter().find(|g| g.name == name) {
            return gate.clone();
        }
        let gate = Gate {
            name,
            open: Arc::new(AtomicBool::new(false)),
        };
        gates.push(gate.clone());
        gate
    }

    /// `true` once the listener accepts connections; `false` when it stops
    /// (which reads as draining, unless it never served at all).
    pub fn set_serving(&self, serving: bool) {
        let phase = &self.inner.phase;
        if serving {
            phase.store(SERVING, Ordering::SeqCst);
        } else {
            let _ = phase.compare_exchange(SERVING, DRAINING, Ordering::SeqCst, Ordering::SeqCst);
        }
    }

    pub fn status(&self) -> Result<(), NotReady> {
        match self.inner.phase.load(Ordering::SeqCst) {
            STARTING => return Err(NotReady::Starting),
            DRAINING => return Err(NotReady::Draining),
            _ => {}
        }
        let gates = self.inner.gates.lock().unwrap_or_else(|e| e.into_inner());
        let closed: Vec<_> = gates
            .iter()
            .filter(|g| !g.is_open())
            .map(|g| g.name)
            .collect();
        if closed.is_empty() {
            Ok(())
        } else {
            Err(NotReady::Waiting(closed))
        }
    }

    pub fn is_ready(&self) -> bool {
        self.status().is_ok()
    }
}

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// `/livez` (always 200 while the process answers), `/readyz` (200 or 503
/// with the reason) and `/metrics` (OpenMetrics text).
pub fn admin_router(metrics: Arc<Metrics>, readiness: Readiness) -> Router {
    Router::new()
        .route("/livez", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(readiness): State<Readiness>| async move {
                match readiness.status() {
                    Ok(()) => (StatusCode::OK, "ready".to_string()),
                    Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, reason.to_string()),
                }
            }),
        )
        .with_state(readiness)
        .route(
            "/metrics",
            get(move || async move { ([(header::CONTENT_TYPE, OPENMETRICS)], metrics.encode()) }),
        )
}
