//! Certificate rotation: polling the serving certificate's files and the client CA's, and
//! swapping in what changed without a restart. A broken renewal leaves the old ones in use.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::{
    CertResolver, ClientVerifier, Tls, TlsError, load_client_ca, load_pem, read_pem_file, unix_now,
};
use crate::metrics::Metrics;
use crate::serve::readiness::Gate;

impl Tls {
    /// Starts polling the certificate files every `interval`, if the
    /// certificate came from files, and the client CA file if there is one.
    /// `valid` is held open while the certificate in use is valid: closed, `/readyz` fails,
    /// since every handshake would. The task runs until aborted.
    pub fn spawn_reloader(
        &self,
        interval: Duration,
        metrics: Arc<Metrics>,
        valid: Gate,
    ) -> Option<JoinHandle<()>> {
        valid.open();
        let reloader = self.watched.clone().map(|(cert, key, seen)| Reloader {
            cert,
            key,
            seen,
            retry: false,
            validity: self.validity,
            valid,
            resolver: self.resolver.clone(),
            metrics: metrics.clone(),
        });
        let client_ca = self
            .client_ca
            .clone()
            .map(|(path, seen, verifier)| CaReloader {
                path,
                seen: Snapshot::Read(seen, Vec::new()),
                verifier,
                metrics,
            });
        if reloader.is_none() && client_ca.is_none() {
            return None;
        }
        // tokio's interval panics on zero; Server::bind already refuses it,
        // this only keeps a direct caller from crashing the process.
        let interval = interval.max(Duration::from_millis(10));
        Some(tokio::spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // The first tick fires at once; the files were just loaded.
            ticker.tick().await;
            let (mut reloader, mut client_ca) = (reloader, client_ca);
            loop {
                ticker.tick().await;
                if let Some(r) = &mut reloader {
                    r.poll().await;
                }
                if let Some(r) = &mut client_ca {
                    r.poll().await;
                }
            }
        }))
    }
}

/// What the certificate files held at the last poll. Contents are compared
/// rather than modification times: the kubelet replaces a Secret by
/// re-pointing a symlink, which leaves the visible paths' times unreliable.
#[derive(Clone, PartialEq, Eq)]
pub(super) enum Snapshot {
    Read(Vec<u8>, Vec<u8>),
    Unreadable(String),
}

struct Reloader {
    cert: PathBuf,
    key: PathBuf,
    seen: Snapshot,
    /// The files last seen held a certificate refused for its dates only (not yet valid):
    /// tried again at every poll, since time alone can make it valid.
    retry: bool,
    /// Validity of the certificate in use, in Unix seconds.
    validity: (i64, i64),
    /// Open while the certificate in use is valid.
    valid: Gate,
    resolver: Arc<CertResolver>,
    metrics: Arc<Metrics>,
}

/// Polls the client CA file; a changed, valid bundle replaces the CA for new
/// handshakes, a broken one is reported once and the previous CA stays.
struct CaReloader {
    path: PathBuf,
    seen: Snapshot,
    verifier: Arc<ClientVerifier>,
    metrics: Arc<Metrics>,
}

/// Reads a PEM file off the runtime's workers (a slow volume must not stall them).
async fn read_pem_async(path: &Path) -> Result<Vec<u8>, String> {
    let owned = path.to_path_buf();
    match tokio::task::spawn_blocking(move || read_pem_file(&owned)).await {
        Ok(read) => read.map_err(|e| e.to_string()),
        Err(e) => Err(format!("{}: cannot read: {e}", path.display())),
    }
}

impl CaReloader {
    async fn poll(&mut self) {
        let now = match read_pem_async(&self.path).await {
            Ok(pem) => Snapshot::Read(pem, Vec::new()),
            Err(e) => Snapshot::Unreadable(e),
        };
        if now == self.seen {
            return;
        }
        let result = match &now {
            Snapshot::Read(pem, _) => load_client_ca(pem, &self.path).map_err(|e| e.to_string()),
            Snapshot::Unreadable(e) => Err(e.clone()),
        };
        match result {
            Ok(verifier) => {
                self.verifier.replace(verifier);
                self.metrics.tls.observe_client_ca_reload(true);
                info!(client_ca = %self.path.display(), "using a rotated client CA");
            }
            Err(error) => {
                self.metrics.tls.observe_client_ca_reload(false);
                warn!(%error, "rotated client CA is unusable; still using the previous one");
            }
        }
        self.seen = now;
    }
}

impl Reloader {
    async fn read(&self) -> Snapshot {
        match (
            read_pem_async(&self.cert).await,
            read_pem_async(&self.key).await,
        ) {
            (Ok(cert), Ok(key)) => Snapshot::Read(cert, key),
            (Err(e), _) | (_, Err(e)) => Snapshot::Unreadable(e),
        }
    }

    /// Loads the files if they changed since the last poll. Each distinct
    /// broken state is reported once, not on every poll. Then checks that the certificate in
    /// use is still valid, and says so to readiness.
    async fn poll(&mut self) {
        self.reload().await;
        let (not_before, not_after) = self.validity;
        let now = unix_now();
        let valid = not_before <= now && now < not_after;
        if valid != self.valid.is_open() {
            if valid {
                self.valid.open();
            } else {
                warn!(cert = %self.cert.display(), not_before, not_after,
                      "the certificate in use is not valid now and no valid one is available: \
                       not ready");
                self.valid.close();
            }
        }
    }

    async fn reload(&mut self) {
        let now = self.read().await;
        if now == self.seen && !self.retry {
            return;
        }
        let retrying = now == self.seen;
        let result = match &now {
            Snapshot::Read(cert, key) => load_pem(cert, key, &self.cert, &self.key).map_err(|e| {
                (
                    matches!(e, TlsError::NotYetValid { .. }),
                    e.reason(),
                    e.to_string(),
                )
            }),
            Snapshot::Unreadable(e) => Err((false, "unreadable", e.clone())),
        };
        self.retry = false;
        match result {
            Ok(loaded) => {
                self.resolver.replace(loaded.key);
                self.validity = (loaded.not_before, loaded.not_after);
                self.metrics.tls.set_cert_expiry(loaded.not_after);
                self.metrics.tls.observe_cert_reload(true);
                info!(cert = %self.cert.display(), not_after = loaded.not_after,
                      "serving a rotated certificate");
            }
            Err((not_yet, reason, error)) => {
                self.retry = not_yet;
                if retrying {
                    // Counted and logged when first seen.
                    return;
                }
                // The two files are read one after the other; one that was
                // caught between the cert and the key of a non-atomic update
                // is not a failure yet. Look again at the next poll.
                if self.read().await != now {
                    self.retry = false;
                    return;
                }
                warn!(%error, reason, "rotated certificate is unusable; still serving the previous one");
                self.metrics.tls.observe_cert_reload(false);
                self.metrics.tls.observe_cert_reload_failure(reason);
            }
        }
        self.seen = now;
    }
}
