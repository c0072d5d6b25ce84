//! One auditor per fleet: the replicas elect it with a `coordination.k8s.io` Lease, the way
//! client-go's leader election does (optimistic writes on the Lease's resourceVersion, expiry
//! judged by each replica's own clock).
//!
//! Every replica answers reviews and keeps the facts and the compact node records; only the
//! holder of the Lease watches the operator's pods, runs the continuous audit, exports its
//! per-node gauges and writes the ClusterPolicyReport.
//!
//! The rules that keep it to one auditor at every moment:
//! - A replica takes a Lease held by another only once the record has not changed for the
//!   Lease's duration by its own monotonic clock (since it first saw that record): a replica
//!   whose wall clock is off neither steals early nor waits longer.
//! - The holder's term ends a renew deadline (two thirds of the duration) after the start of
//!   its last successful renewal, by its own monotonic clock, which runs on while the process
//!   is stopped. A holder that cannot renew stops auditing before anyone else may take over, and
//!   a holder back from a pause finds its term over before it writes anything ([`Term::holds`]).
//! - Every error is retried (a restarted API server, an RBAC gap, a conflict); the election
//!   never ends while the replica runs, and the replica never audits without holding the Lease.
//! - A holder that stops cleanly releases the Lease, so another takes over at once.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

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

/// The election's clock, derived from the Lease's duration.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
struct Timing {
    /// The Lease's duration in whole seconds, as the API counts it (at least 3).
    duration: Duration,
    /// How long a term lasts after the start of its last successful renewal: two thirds of the
    /// duration, so the holder stops before another replica may take over.
    renew_deadline: Duration,
    /// Pause between two attempts to take or renew: a sixth of the duration.
    retry: Duration,
}

impl LeaseConfig {
    fn timing(&self) -> Timing {
        let duration = Duration::from_secs(self.duration.as_secs().max(3));
        Timing {
            duration,
            renew_deadline: duration * 2 / 3,
            retry: duration / 6,
        }
    }
}

/// Whether this replica holds the audit's Lease at this moment, by its own monotonic clock.
/// Shared by the election (which extends it on each renewal) and the auditor (which asks before
/// every write).
#[derive(Clone, Debug)]
pub struct Term(Arc<TermState>);

#[derive(Debug)]
enum TermState {
    /// No election: always held.
    Always,
    /// Held until this instant; `None`: not held.
    Until(Mutex<Option<Instant>>),
}

impl Term {
    fn always() -> Term {
        Term(Arc::new(TermState::Always))
    }

    fn elected() -> Term {
        Term(Arc::new(TermState::Until(Mutex::new(None))))
    }

    /// True while this replica's term lasts: false once the renew deadline has passed, even if
    /// the election has not run since (a process back from a pause).
    pub fn holds(&self) -> bool {
        match &*self.0 {
            TermState::Always => true,
            TermState::Until(_) => self.until().is_some_and(|until| Instant::now() < until),
        }
    }

    /// When an elected term ends; `None` when it is not held (and for no election).
    fn until(&self) -> Option<Instant> {
        match &*self.0 {
            TermState::Always => None,
            TermState::Until(until) => *until.lock().unwrap_or_else(|e| e.into_inner()),
        }
    }

    fn set(&self, value: Option<Instant>) {
        if let TermState::Until(until) = &*self.0 {
            *until.lock().unwrap_or_else(|e| e.into_inner()) = value;
        }
    }
}

/// What the auditor follows: whether this replica audits now (`leader`, for waiting on
/// changes) and its term (to ask right before a write).
#[derive(Clone, Debug)]
pub struct Leadership {
    pub leader: watch::Receiver<bool>,
    pub term: Term,
}

impl Leadership {
    /// Always the auditor (tests, and `--no-audit-lease`); the sender keeps `leader` open.
    pub fn always() -> (watch::Sender<bool>, Leadership) {
        let (tx, leader) = watch::channel(true);
        (
            tx,
            Leadership {
                leader,
                term: Term::always(),
            },
        )
    }
}

/// A running election.
pub struct Election {
    leadership: Leadership,
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
        let (sender, leadership) = Leadership::always();
        Election {
            leadership,
            how: How::Alone { _sender: sender },
        }
    }

    /// Starts taking part in the election for `config`'s Lease.
    pub fn start(client: Client, config: LeaseConfig) -> Election {
        let (tx, leader) = watch::channel(false);
        let term = Term::elected();
        let (stop, stopped) = oneshot::channel();
        let api = Api::<Lease>::namespaced(client, &config.namespace);
        let task = tokio::spawn(run(api, config, tx, term.clone(), stopped));
        Election {
            leadership: Leadership { leader, term },
            how: How::Elected {
                stop,
                task: AbortOnDrop(task),
            },
        }
    }

    pub fn leadership(&self) -> Leadership {
        self.leadership.clone()
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

/// The pure part of the election: what to write, given the Lease as read.
#[derive(Debug)]
struct Elector {
    identity: String,
    timing: Timing,
    /// The record last read, and when (by this replica's clock) it was first seen: the Lease
    /// expires for this replica a duration after that, whatever its timestamps say.
    observed: Option<(LeaseSpec, Instant)>,
}

/// What the elector decided.
#[derive(Debug, PartialEq)]
enum Step {
    /// Another replica holds the Lease until (at the earliest) this instant.
    HeldElsewhere { holder: String, until: Instant },
    /// Write this record: take the Lease, or renew it.
    Take(LeaseSpec),
}

impl Elector {
    fn new(identity: String, timing: Timing) -> Elector {
        Elector {
            identity,
            timing,
            observed: None,
        }
    }

    /// Decides on the Lease's record as just read (`None`: there is no Lease).
    fn step(&mut self, current: Option<&LeaseSpec>, now: Instant, wall: Timestamp) -> Step {
        let Some(spec) = current else {
            self.observed = None;
            return Step::Take(self.record(None, wall));
        };
        let seen_at = match &self.observed {
            Some((seen, at)) if seen == spec => *at,
            _ => {
                self.observed = Some((spec.clone(), now));
                now
            }
        };
        if let Some(holder) = spec.holder_identity.as_deref().filter(|h| !h.is_empty())
            && holder != self.identity
        {
            let seconds = spec
                .lease_duration_seconds
                .filter(|s| *s > 0)
                .map_or(self.timing.duration, |s| {
                    Duration::from_secs(s.unsigned_abs().into())
                });
            let until = seen_at + seconds;
            if now < until {
                return Step::HeldElsewhere {
                    holder: holder.to_owned(),
                    until,
                };
            }
        }
        Step::Take(self.record(Some(spec), wall))
    }

    /// The record that makes this replica the holder, renewed now.
    fn record(&self, current: Option<&LeaseSpec>, wall: Timestamp) -> LeaseSpec {
        let mine = current.and_then(|c| c.holder_identity.as_deref()) == Some(&self.identity);
        let now = MicroTime(wall);
        let (acquire_time, transitions) = match current {
            Some(c) if mine => (c.acquire_time.clone(), c.lease_transitions),
            Some(c) => (
                Some(now.clone()),
                Some(c.lease_transitions.unwrap_or(0) + 1),
            ),
            None => (Some(now.clone()), Some(0)),
        };
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: i32::try_from(self.timing.duration.as_secs()).ok(),
            acquire_time,
            renew_time: Some(now),
            lease_transitions: transitions,
            ..LeaseSpec::default()
        }
    }
}

/// The outcome of one attempt.
enum Attempt {
    Held,
    HeldElsewhere(String),
}

/// Reads the Lease and takes or renews it when the elector says so; a write races on the
/// resourceVersion just read, so of two replicas writing at once one gets a conflict.
async fn attempt(
    api: &Api<Lease>,
    name: &str,
    elector: &mut Elector,
) -> Result<Attempt, kube::Error> {
    let current = api.get_opt(name).await?;
    let spec = current.as_ref().and_then(|l| l.spec.as_ref());
    match elector.step(spec, Instant::now(), Timestamp::now()) {
        Step::HeldElsewhere { holder, .. } => Ok(Attempt::HeldElsewhere(holder)),
        Step::Take(spec) => {
            let params = PostParams {
                field_manager: Some(FIELD_MANAGER.to_owned()),
                ..PostParams::default()
            };
            match current {
                None => {
                    let lease = Lease {
                        metadata: ObjectMeta {
                            name: Some(name.to_owned()),
                            ..ObjectMeta::default()
                        },
                        spec: Some(spec),
                    };
                    api.create(&params, &lease).await?;
                }
                Some(mut lease) => {
                    lease.spec = Some(spec);
                    api.replace(name, &params, &lease).await?;
                }
            }
            Ok(Attempt::Held)
        }
    }
}

/// Why an attempt failed, in the words the log uses.
fn describe(error: &kube::Error) -> &'static str {
    match error {
        kube::Error::Api(status) if status.code == 409 => "another replica wrote the Lease first",
        kube::Error::Api(status) => match missing_or_forbidden(status) {
            Some(403) => {
                "forbidden by RBAC (the service account needs get, create and update on leases in its namespace)"
            }
            Some(_) => "not found (does the namespace exist?)",
            None => "refused by the API server",
        },
        _ => "the API server cannot be reached",
    }
}

async fn run(
    api: Api<Lease>,
    config: LeaseConfig,
    tx: watch::Sender<bool>,
    term: Term,
    mut stopped: oneshot::Receiver<()>,
) {
    let timing = config.timing();
    let lease = format!("{}/{}", config.namespace, config.name);
    let mut elector = Elector::new(config.identity.clone(), timing);
    tracing::info!(%lease, identity = %config.identity, duration_seconds = timing.duration.as_secs(), "taking part in the audit's election");
    let mut failing = false;
    let mut last_holder: Option<String> = None;
    loop {
        let started = Instant::now();
        // An attempt never outlives the term it would renew, nor the renew deadline.
        let deadline = started + timing.renew_deadline;
        let limit = term.until().map_or(deadline, |until| until.min(deadline));
        let outcome = tokio::select! {
            outcome = tokio::time::timeout_at(limit, attempt(&api, &config.name, &mut elector)) => outcome,
            _ = &mut stopped => break,
        };
        match outcome {
            Ok(Ok(Attempt::Held)) => {
                term.set(Some(started + timing.renew_deadline));
                if failing {
                    tracing::info!(%lease, "the audit's Lease can be renewed again");
                    failing = false;
                }
                if last_holder.as_deref() != Some(&config.identity) {
                    tracing::info!(%lease, "holding the audit's Lease: this replica audits");
                    last_holder = Some(config.identity.clone());
                }
            }
            Ok(Ok(Attempt::HeldElsewhere(holder))) => {
                term.set(None);
                failing = false;
                if last_holder.as_deref() != Some(&holder) {
                    tracing::info!(%lease, %holder, "the audit's Lease is held elsewhere: this replica does not audit");
                    last_holder = Some(holder);
                }
            }
            Ok(Err(error)) => {
                if !failing {
                    let why = describe(&error);
                    tracing::warn!(%lease, %error, "cannot take or renew the audit's Lease: {why}; retrying (a holder audits until its renew deadline, then stops)");
                    failing = true;
                }
            }
            Err(_) => {
                if !failing {
                    tracing::warn!(%lease, "taking or renewing the audit's Lease timed out; retrying (a holder audits until its renew deadline, then stops)");
                    failing = true;
                }
            }
        }
        let holds = term.holds();
        if !holds {
            term.set(None);
        }
        tx.send_if_modified(|leader| std::mem::replace(leader, holds) != holds);
        // Wait for the next attempt, but end the term on time if it runs out before that.
        let next = started + timing.retry;
        let expiry = term.until().filter(|until| *until < next);
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            () = tokio::time::sleep_until(expiry.unwrap_or(next)), if expiry.is_some() => {
                term.set(None);
                tx.send_if_modified(|leader| std::mem::replace(leader, false));
                tracing::warn!(%lease, "the audit's Lease was not renewed in time: this replica stops auditing");
                last_holder = None;
                tokio::select! {
                    () = tokio::time::sleep_until(next) => {}
                    _ = &mut stopped => break,
                }
            }
            _ = &mut stopped => break,
        }
    }
    let held = term.holds();
    term.set(None);
    tx.send_if_modified(|leader| std::mem::replace(leader, false));
    if held {
        match release(&api, &config.name, &config.identity).await {
            Ok(()) => tracing::info!(%lease, "released the audit's Lease"),
            Err(error) => {
                tracing::warn!(%lease, %error, "cannot release the audit's Lease; it expires by itself")
            }
        }
    }
}

/// Gives the Lease up: no holder, so another replica takes it at its next attempt. Written on
/// the resourceVersion read, and only while this replica is still the holder.
async fn release(api: &Api<Lease>, name: &str, identity: &str) -> Result<(), kube::Error> {
    let Some(mut lease) = api.get_opt(name).await? else {
        return Ok(());
    };
    let Some(spec) = lease.spec.as_mut() else {
        return Ok(());
    };
    if spec.holder_identity.as_deref() != Some(identity) {
        return Ok(());
    }
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(MicroTime(Timestamp::now()));
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    };
    api.replace(name, &params, &lease).await.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(secs: u64) -> Timing {
        LeaseConfig {
            name: "l".into(),
            namespace: "n".into(),
            identity: "i".into(),
            duration: Duration::from_secs(secs),
        }
        .timing()
    }

    #[test]
    fn a_term_ends_before_another_replica_may_take_over() {
        assert_eq!(
            timing(15),
            Timing {
                duration: Duration::from_secs(15),
                renew_deadline: Duration::from_secs(10),
                retry: Duration::from_millis(2500),
            }
        );
        // Below three seconds renewal would have no room.
        assert_eq!(timing(1).duration, Duration::from_secs(3));
        for secs in [3, 6, 15, 60] {
            let t = timing(secs);
            assert!(t.retry < t.renew_deadline && t.renew_deadline < t.duration);
        }
    }

    fn wall() -> Timestamp {
        Timestamp::from_second(1_800_000_000).unwrap()
    }

    fn held_by(holder: &str, renewed: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.to_owned()),
            lease_duration_seconds: Some(6),
            renew_time: Some(MicroTime(Timestamp::from_second(renewed).unwrap())),
            acquire_time: Some(MicroTime(Timestamp::from_second(1).unwrap())),
            lease_transitions: Some(4),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn no_lease_is_taken_with_no_transitions() {
        let mut e = Elector::new("a".into(), timing(6));
        let Step::Take(spec) = e.step(None, Instant::now(), wall()) else {
            panic!("a missing Lease must be taken");
        };
        assert_eq!(spec.holder_identity.as_deref(), Some("a"));
        assert_eq!(spec.lease_duration_seconds, Some(6));
        assert_eq!(spec.lease_transitions, Some(0));
        assert_eq!(spec.renew_time, Some(MicroTime(wall())));
    }

    #[test]
    fn another_holder_is_waited_for_a_duration_from_when_its_record_was_first_seen() {
        let mut e = Elector::new("b".into(), timing(6));
        let t0 = Instant::now();
        let lease = held_by("a", 100);
        // The wall-clock renewTime (long ago) does not matter: only this replica's clock does.
        assert_eq!(
            e.step(Some(&lease), t0, wall()),
            Step::HeldElsewhere {
                holder: "a".into(),
                until: t0 + Duration::from_secs(6)
            }
        );
        // The same record five seconds later: still held.
        assert!(matches!(
            e.step(Some(&lease), t0 + Duration::from_secs(5), wall()),
            Step::HeldElsewhere { .. }
        ));
        // A renewal restarts the wait from when it is seen.
        let renewed = held_by("a", 102);
        let t1 = t0 + Duration::from_secs(5);
        assert_eq!(
            e.step(Some(&renewed), t1, wall()),
            Step::HeldElsewhere {
                holder: "a".into(),
                until: t1 + Duration::from_secs(6)
            }
        );
        // Unchanged for the whole duration: taken over, one more transition.
        let Step::Take(spec) = e.step(Some(&renewed), t1 + Duration::from_secs(6), wall()) else {
            panic!("an expired Lease must be taken");
        };
        assert_eq!(spec.holder_identity.as_deref(), Some("b"));
        assert_eq!(spec.lease_transitions, Some(5));
        assert_eq!(spec.acquire_time, Some(MicroTime(wall())));
    }

    #[test]
    fn the_holder_renews_keeping_its_acquire_time_and_a_released_lease_is_taken_at_once() {
        let mut e = Elector::new("a".into(), timing(6));
        let mine = held_by("a", 100);
        let Step::Take(spec) = e.step(Some(&mine), Instant::now(), wall()) else {
            panic!("the holder must renew");
        };
        assert_eq!(spec.acquire_time, mine.acquire_time);
        assert_eq!(spec.lease_transitions, Some(4));
        assert_eq!(spec.renew_time, Some(MicroTime(wall())));

        let mut b = Elector::new("b".into(), timing(6));
        let released = LeaseSpec {
            holder_identity: None,
            ..held_by("a", 100)
        };
        assert!(matches!(
            b.step(Some(&released), Instant::now(), wall()),
            Step::Take(_)
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_term_is_over_at_its_deadline_without_the_election_running() {
        let term = Term::elected();
        assert!(!term.holds());
        term.set(Some(Instant::now() + Duration::from_secs(4)));
        assert!(term.holds());
        tokio::time::advance(Duration::from_secs(4)).await;
        assert!(!term.holds(), "a term past its deadline must not be held");
        assert!(Term::always().holds());
    }

    #[test]
    fn errors_are_described_for_the_log() {
        let api = |code: u16, reason: &str| {
            kube::Error::Api(Box::new(kube::core::Status {
                code,
                reason: reason.to_owned(),
                ..kube::core::Status::default()
            }))
        };
        assert!(describe(&api(403, "Forbidden")).contains("RBAC"));
        assert!(describe(&api(409, "Conflict")).contains("another replica"));
        assert!(describe(&api(404, "NotFound")).contains("namespace"));
        assert!(describe(&api(500, "InternalError")).contains("refused"));
    }

    #[tokio::test]
    async fn alone_always_audits_and_stops() {
        let election = Election::alone();
        let leadership = election.leadership();
        assert!(*leadership.leader.borrow());
        assert!(leadership.term.holds());
        election.stop(Duration::from_secs(1)).await;
    }
}
