//! One auditor per fleet: the replicas elect it with a `coordination.k8s.io` Lease
//! (kube-lease-manager, server-side apply on the Lease object).
//!
//! Every replica answers reviews and keeps the facts and the compact node records; only the
//! holder of the Lease watches the operator's pods, runs the continuous audit, exports its
//! per-node gauges and writes the ClusterPolicyReport. The holder renews the Lease a third of
//! its duration before it ends; when the holder dies, another replica takes it over once it has
//! expired (at most the duration later), and a holder that stops cleanly releases it at once.
//!
//! Where the Lease cannot be used at all (the API has no Leases, or RBAC forbids them: an
//! older install), the replica audits without an election, as every replica did before, and
//! says so once.

use std::time::Duration;

use kube::Client;
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder, LeaseManagerError};
use tokio::sync::{oneshot, watch};

use super::conn::AbortOnDrop;
use super::parse::parse_duration;
use crate::k8s::api::missing_or_forbidden;

/// Field manager of the Lease's fields.
const FIELD_MANAGER: &str = "gpu-deploy-guard";

/// The flags of the audit's Lease.
#[derive(clap::Args, Clone, Debug)]
pub struct LeaseArgs {
    /// Name of the coordination.k8s.io Lease that elects the one replica running the continuous
    /// audit (pod watch, gauges, report); every replica answers reviews.
    #[arg(
        long,
        env = "GDG_AUDIT_LEASE",
        default_value = "gpu-deploy-guard-audit",
        display_order = 26
    )]
    pub audit_lease: String,
    /// Namespace of the audit's Lease: the pod's own (the chart passes it), else the
    /// kubeconfig's namespace.
    #[arg(long, env = "POD_NAMESPACE", display_order = 27)]
    pub audit_lease_namespace: Option<String>,
    /// This replica's name in the Lease: the pod's name (the chart passes it), else the host
    /// name and process id.
    #[arg(long, env = "POD_NAME", display_order = 28)]
    pub audit_lease_identity: Option<String>,
    /// How long the Lease holds without renewal: the longest a dead auditor's work waits
    /// for another replica to take over (a replica that stops cleanly hands over at once).
    #[arg(long, env = "GDG_AUDIT_LEASE_DURATION", default_value = "15s", value_parser = parse_duration,
          display_order = 29)]
    pub audit_lease_duration: Duration,
    /// Run the continuous audit in this replica without an election (one replica only).
    #[arg(long, env = "GDG_NO_AUDIT_LEASE", display_order = 30)]
    pub no_audit_lease: bool,
}

impl LeaseArgs {
    /// The Lease to elect the auditor with; `None` with `--no-audit-lease`.
    pub fn config(&self, client: &Client) -> Option<LeaseConfig> {
        (!self.no_audit_lease).then(|| LeaseConfig {
            name: self.audit_lease.clone(),
            namespace: self
                .audit_lease_namespace
                .clone()
                .unwrap_or_else(|| client.default_namespace().to_owned()),
            identity: self
                .audit_lease_identity
                .clone()
                .unwrap_or_else(default_identity),
            duration: self.audit_lease_duration,
        })
    }
}

/// The host name and process id: unique among replicas outside a pod too.
fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default();
    let host = if host.is_empty() {
        "gpu-deploy-guard".to_owned()
    } else {
        host
    };
    format!("{host}-{}", std::process::id())
}

/// How the audit's Lease is named and held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    pub name: String,
    pub namespace: String,
    /// This replica's name in the Lease's `holderIdentity` (the pod name in a cluster).
    pub identity: String,
    /// How long the Lease holds without renewal; the longest failover after a holder dies.
    pub duration: Duration,
}

impl LeaseConfig {
    /// Whole seconds, as the Lease API counts them; at least 3, so that renewal (a third of the
    /// duration before its end) has room.
    fn seconds(&self) -> (u64, u64) {
        let duration = self.duration.as_secs().max(3);
        (duration, (duration / 3).max(1))
    }
}

/// A running election. `leader` says whether this replica audits now.
pub struct Election {
    pub leader: watch::Receiver<bool>,
    how: How,
}

enum How {
    /// No election: the sender stays, so `leader` stays `true`.
    Alone { _sender: watch::Sender<bool> },
    Elected {
        stop: oneshot::Sender<()>,
        task: AbortOnDrop<()>,
    },
}

impl Election {
    /// No election: this replica always audits.
    pub fn alone() -> Election {
        let (tx, leader) = watch::channel(true);
        Election {
            leader,
            how: How::Alone { _sender: tx },
        }
    }

    /// Starts taking part in the election for `config`'s Lease.
    pub fn start(client: Client, config: LeaseConfig) -> Election {
        let (tx, leader) = watch::channel(false);
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(run(client, config, tx, stopped));
        Election {
            leader,
            how: How::Elected {
                stop,
                task: AbortOnDrop(task),
            },
        }
    }

    /// Stops taking part; a holder releases the Lease (waiting at most `timeout`), so that
    /// another replica takes over without waiting for it to expire.
    pub async fn stop(self, timeout: Duration) {
        if let How::Elected { stop, mut task } = self.how {
            let _ = stop.send(());
            // Past the timeout the task is dropped, and so aborted.
            let _ = tokio::time::timeout(timeout, &mut task.0).await;
        }
    }
}

/// Whether an error of the Lease manager says Leases cannot be used at all (404 or 403).
fn unusable(error: &LeaseManagerError) -> Option<u16> {
    match error {
        LeaseManagerError::KubeError(kube::Error::Api(status)) => missing_or_forbidden(status),
        _ => None,
    }
}

async fn run(
    client: Client,
    config: LeaseConfig,
    tx: watch::Sender<bool>,
    mut stopped: oneshot::Receiver<()>,
) {
    let (duration, grace) = config.seconds();
    let lease = format!("{}/{}", config.namespace, config.name);
    let mut retry = Duration::from_secs(1);
    let mut warned = false;
    let manager: LeaseManager = loop {
        let built = LeaseManagerBuilder::new(client.clone(), &config.name)
            .with_namespace(&config.namespace)
            .with_identity(&config.identity)
            .with_duration(duration)
            .with_grace(grace)
            .with_field_manager(FIELD_MANAGER)
            .build();
        let outcome = tokio::select! {
            built = built => built,
            _ = &mut stopped => return,
        };
        match outcome {
            Ok(manager) => break manager,
            Err(error) => {
                if let Some(code) = unusable(&error) {
                    let why = if code == 403 {
                        "forbidden by RBAC"
                    } else {
                        "not found"
                    };
                    tracing::warn!(%lease, %error, "the audit's Lease is {why}: this replica audits without an election (give the service account get/create/update/patch on leases in its namespace)");
                    let _ = tx.send(true);
                    let _ = stopped.await;
                    return;
                }
                if !warned {
                    tracing::warn!(%lease, %error, "cannot set up the audit's Lease; retrying");
                    warned = true;
                }
                tokio::select! {
                    () = tokio::time::sleep(retry) => {}
                    _ = &mut stopped => return,
                }
                retry = (retry * 2).min(Duration::from_secs(30));
            }
        }
    };
    tracing::info!(%lease, identity = %config.identity, duration_seconds = duration, "taking part in the audit's election");
    let mut retry = Duration::from_secs(1);
    loop {
        let outcome = tokio::select! {
            outcome = manager.changed() => outcome,
            _ = &mut stopped => break,
        };
        match outcome {
            Ok(leader) => {
                retry = Duration::from_secs(1);
                if leader {
                    tracing::info!(%lease, "holding the audit's Lease: this replica audits");
                } else {
                    tracing::info!(%lease, "the audit's Lease is held elsewhere: this replica does not audit");
                }
                let _ = tx.send(leader);
            }
            Err(error) => {
                // The Lease's state is unknown: stop auditing until it is known again, so that
                // two replicas never both believe they hold it.
                tracing::warn!(%lease, %error, "cannot renew or read the audit's Lease; not auditing until it can");
                let _ = tx.send(false);
                tokio::select! {
                    () = tokio::time::sleep(retry) => {}
                    _ = &mut stopped => break,
                }
                retry = (retry * 2).min(Duration::from_secs(30));
            }
        }
    }
    if *tx.borrow() {
        let _ = tx.send(false);
        match manager.release().await {
            Ok(()) => tracing::info!(%lease, "released the audit's Lease"),
            Err(error) => {
                tracing::warn!(%lease, %error, "cannot release the audit's Lease; it expires by itself")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_duration_leaves_room_for_renewal() {
        let config = |secs| LeaseConfig {
            name: "l".into(),
            namespace: "n".into(),
            identity: "i".into(),
            duration: Duration::from_secs(secs),
        };
        assert_eq!(config(15).seconds(), (15, 5));
        assert_eq!(config(1).seconds(), (3, 1));
        assert_eq!(config(60).seconds(), (60, 20));
    }

    #[test]
    fn missing_or_forbidden_leases_are_unusable_other_errors_pass() {
        let api = |code: u16, reason: &str| {
            LeaseManagerError::KubeError(kube::Error::Api(Box::new(kube::core::Status {
                code,
                reason: reason.to_owned(),
                ..kube::core::Status::default()
            })))
        };
        assert_eq!(unusable(&api(403, "Forbidden")), Some(403));
        assert_eq!(unusable(&api(404, "NotFound")), Some(404));
        assert_eq!(unusable(&api(500, "InternalError")), None);
        assert_eq!(
            unusable(&LeaseManagerError::NonexistentLease("x".into())),
            None
        );
    }

    #[tokio::test]
    async fn alone_always_audits_and_stops() {
        let election = Election::alone();
        assert!(*election.leader.borrow());
        election.stop(Duration::from_secs(1)).await;
    }
}
