//! The continuous audit, in the replica that holds the audit's Lease ([`super::lease`]).
//!
//! While it holds the Lease it watches the operator's pods (kept as compact records, listed in
//! pages), and after each burst of changes (debounced) brings the audit up to date through
//! [`Incremental`]: the nodes whose records or pods changed are audited again, the fleet only
//! when what every node shares changed. Then the gauges, and, when asked, the
//! ClusterPolicyReport (written only when its results changed), and an Event on each node for
//! each finding it gained ([`crate::events`]). Losing the Lease drops the pod records and the
//! per-node series.
//!
//! A report is written only under a term this replica still holds ([`Term::holds`], asked
//! right before the write) and only over the report as this term last saw it (a resourceVersion
//! precondition): a holder back from a pause longer than its Lease never overwrites the new
//! holder's report, not even with a write it had started before the pause.

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use futures::StreamExt;
use kube::runtime::watcher::{self};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};

use super::follow::{Index, Over, Watch, health, set_health, watcher};
use super::health::{Health, Kind, Status};
use super::lease::{Leadership, Term};
use super::watch_config::WatchConfig;
use crate::audit::NodeAudit;
use crate::audit::apply::{apply_report, read_fence};
use crate::audit::incremental::{Dirty, Incremental};
use crate::audit::metrics::AuditMetrics;
use crate::audit::report::{self, PolicyReport};
use crate::core::facts::ClusterFacts;
use crate::core::rules::Rule;
use crate::events::{Events, Source};
use crate::k8s::api::{Fence, fence_broken};
use crate::k8s::fleet::{PodIndex, SharedFleet};
use crate::k8s::pod::PodView;

/// What the auditor reads and writes.
pub(super) struct Auditor<'a> {
    pub(super) client: &'a Client,
    pub(super) config: &'a WatchConfig,
    /// List and watch settings of the pods (pages).
    pub(super) list: watcher::Config,
    pub(super) fleet: &'a SharedFleet,
    pub(super) status: &'a Mutex<Status>,
    pub(super) facts: watch::Receiver<Arc<ClusterFacts>>,
    pub(super) metrics: &'a AuditMetrics,
    /// Whether this replica holds the audit's Lease.
    pub(super) leadership: Leadership,
}

/// Audits whenever this replica holds the Lease, until the watch ends.
pub(super) async fn run(mut auditor: Auditor<'_>) {
    auditor.metrics.set_leader(false);
    loop {
        while !*auditor.leadership.leader.borrow_and_update() {
            if auditor.leadership.leader.changed().await.is_err() {
                return;
            }
        }
        auditor.metrics.set_leader(true);
        let ended = lead(&mut auditor).await;
        auditor.metrics.set_leader(false);
        if ended {
            return;
        }
    }
}

/// One term as the auditor. Returns true when the watch is ending, false when the Lease was
/// lost.
async fn lead(auditor: &mut Auditor<'_>) -> bool {
    let namespace = auditor.config.namespace.as_str();
    let stream = watcher(
        Api::<PodView>::namespaced(auditor.client.clone(), namespace),
        auditor.list.clone(),
    );
    futures::pin_mut!(stream);
    let mut watch = Watch::new(Kind::Pods, namespace, auditor.status);
    let mut pods = PodsIndex {
        pods: PodIndex::default(),
        // A new term audits the whole fleet first.
        dirty: Dirty::All,
        changed: false,
    };
    set_health(auditor.status, Kind::Pods, Health::Starting);
    let mut passes = Passes::default();
    let mut due: Option<Instant> = None;
    // Time alone changes an audit: a pause or an upgrade state passes its limit. Set after
    // each pass to the next limit's end; a node change that starts a clock brings a pass.
    let mut limit_ends: Option<Instant> = None;
    loop {
        let mut schedule = false;
        tokio::select! {
            changed = auditor.leadership.leader.changed() => {
                if changed.is_err() {
                    return true;
                }
                if !*auditor.leadership.leader.borrow_and_update() {
                    return false;
                }
            }
            item = stream.next() => {
                let Some(item) = item else { return true };
                // The pod records have no bounds.
                let _ = watch.step(item, &mut pods);
                schedule = std::mem::take(&mut pods.changed);
            }
            () = auditor.fleet.changed.notified() => schedule = true,
            changed = auditor.facts.changed() => {
                if changed.is_err() {
                    return true;
                }
                schedule = true;
            }
            () = sleep_until(limit_ends.unwrap_or_else(Instant::now)), if limit_ends.is_some() => {
                limit_ends = None;
                schedule = true;
            }
            () = sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {
                due = None;
                schedule = pass(auditor, &mut pods, &mut passes).await;
                limit_ends = next_limit_end(auditor, &passes.incremental);
            }
        }
        if schedule && due.is_none() {
            due = Some(Instant::now() + auditor.config.debounce);
        }
    }
}

/// The operator's pods as an index, for one term: the nodes whose pods changed are audited
/// again on the next pass.
struct PodsIndex {
    pods: PodIndex,
    /// The nodes to audit again; after a list, the whole fleet.
    dirty: Dirty,
    /// Something changed since the loop last looked: a pass is due.
    changed: bool,
}

impl PodsIndex {
    /// Marks the nodes `changed` names to be audited again; true when there were any.
    fn mark(&mut self, changed: Vec<Arc<str>>) -> bool {
        let mut any = false;
        for node in changed {
            self.dirty.add(&node);
            any = true;
        }
        any
    }
}

impl Index<PodView> for PodsIndex {
    fn init(&mut self) {
        self.pods.start_relist();
    }

    fn init_apply(&mut self, pod: PodView) {
        self.pods.relist_apply(&pod);
    }

    fn init_done(&mut self) -> Result<(), Over> {
        self.pods.finish_relist();
        self.dirty = Dirty::All;
        Ok(())
    }

    fn apply(&mut self, pod: PodView) -> Result<bool, Over> {
        let changed = self.pods.apply(&pod);
        Ok(self.mark(changed))
    }

    fn delete(&mut self, pod: PodView) -> bool {
        let changed = self.pods.delete(&pod);
        self.mark(changed)
    }

    fn changed(&mut self) {
        self.changed = true;
    }
}

/// When the next timed label passes its limit after the last pass
/// ([`NodeIndex::next_limit_end`](crate::k8s::fleet::NodeIndex::next_limit_end)): a pass then
/// finds it (`pause-stuck`, `driver-upgrade-stuck`) with no change of the node.
fn next_limit_end(auditor: &Auditor<'_>, incremental: &Incremental) -> Option<Instant> {
    // From now, not from the last pass: a pass that could not run (the nodes not listed) must
    // not make this fire again at once. A limit passed meanwhile is found by the next pass
    // that runs ([`Incremental::update`] looks from its last pass).
    let now = unix_now();
    let after = incremental.judged_at().max(now);
    let end = auditor
        .fleet
        .lock()
        .nodes
        .next_limit_end(after, &auditor.config.policy.stuck_after)?;
    // Whole seconds: a second more, so the pass's clock reads at least `end`.
    let wait = end.saturating_sub(now).saturating_add(1);
    Some(Instant::now() + std::time::Duration::from_secs(wait))
}

fn unix_now() -> u64 {
    crate::core::lasting::unix_seconds(SystemTime::now())
}

/// What one term keeps from pass to pass.
#[derive(Default)]
struct Passes {
    incremental: Incremental,
    /// The log said the audit is paused (said again only after it ran).
    paused_logged: bool,
    last_report: Option<PolicyReport>,
    report_failing: bool,
    /// The report as this term last saw it; `None`: to be read before the next write.
    fence: Option<Fence>,
}

/// One pass: once the pods and the nodes are listed, the audit brought up to date (the nodes
/// that changed, or the fleet), the gauges, and the report when asked. True when another pass
/// is due (the report changed under this term).
async fn pass(auditor: &mut Auditor<'_>, pods: &mut PodsIndex, passes: &mut Passes) -> bool {
    let Auditor {
        client,
        config,
        fleet,
        status,
        facts,
        metrics,
        leadership: Leadership { term, .. },
        ..
    } = auditor;
    let pods_health = health(status, Kind::Pods);
    let nodes_health = health(status, Kind::Nodes);
    if pods_health != Health::Synced || nodes_health != Health::Synced {
        let unavailable = matches!(pods_health, Health::Unavailable(_))
            || matches!(nodes_health, Health::Unavailable(_));
        if unavailable && !passes.paused_logged {
            tracing::warn!("continuous audit paused: nodes or operator pods cannot be listed");
            passes.paused_logged = true;
        }
        return false;
    }
    passes.paused_logged = false;
    let current = facts.borrow_and_update().clone();
    let now = unix_now();
    let seconds = i64::try_from(now).unwrap_or(i64::MAX);
    let incremental = &mut passes.incremental;
    // A pass over a broken fleet is CPU for a while: the runtime moves the other tasks (the
    // reviews) off this worker thread meanwhile. The report's messages are made from the same
    // records as the pass, under the same lock.
    let built = cpu_bound(|| {
        let mut state = fleet.lock();
        let mut todo = std::mem::take(&mut state.dirty);
        todo.merge(std::mem::take(&mut pods.dirty));
        let pass = incremental.update(
            &state.nodes,
            &pods.pods,
            &current,
            &config.policy,
            todo,
            now,
        );
        let gained = incremental.take_gained();
        if gained.over > 0 && config.events.is_some() {
            tracing::warn!(
                sent_at_most = crate::audit::incremental::MAX_GAINED,
                left = gained.over,
                "more findings new on their nodes in one pass than Events are made for; the report and the gauges have them all"
            );
        }
        if let Some(events) = &config.events {
            offer_gained(events, gained.list, |name| {
                incremental.detail(name, &state.nodes, &pods.pods, &config.policy)
            });
        }
        let audit = incremental.audit()?;
        metrics.record(audit, seconds);
        tracing::debug!(
            nodes = audit.nodes.len(),
            audited = pass.audited,
            whole = pass.whole,
            ok = audit.nodes.iter().filter(|n| n.is_ok()).count(),
            "audit"
        );
        config.report.then(|| {
            report::build_from(
                audit,
                |name| incremental.detail(name, &state.nodes, &pods.pods, &config.policy),
                report::Timestamp { seconds, nanos: 0 },
            )
            .in_format(config.report_format)
        })
    });
    match built {
        Some(built) => report_pass(client, term, passes, built).await,
        None => false,
    }
}

/// Offers an Event for each finding a node gained in the pass, its message made again from the
/// records the pass read ([`Incremental::detail`]), once per node, and only for an Event that
/// will be queued: a fleet-wide change whose Events the queue drops makes no messages.
fn offer_gained(
    events: &Events,
    gained: Vec<(Box<str>, Rule)>,
    detail: impl Fn(&str) -> Option<NodeAudit>,
) {
    let mut made: Option<NodeAudit> = None;
    for (node, rule) in gained {
        events.offer(&node, rule, Source::Audit, || {
            if made.as_ref().is_none_or(|a| *a.name != *node) {
                made = detail(&node);
            }
            let finding = made.as_ref()?.findings.iter().find(|f| f.rule == rule)?;
            Some(finding.message.clone())
        });
    }
}

/// Writes the pass's report unless it says what the last one written says. True when another
/// pass is due: the report changed since this term last wrote it.
async fn report_pass(
    client: &Client,
    term: &Term,
    passes: &mut Passes,
    mut built: PolicyReport,
) -> bool {
    if passes
        .last_report
        .as_ref()
        .is_some_and(|last| last.says_the_same(&built))
    {
        return false;
    }
    match write_report(client, term, &mut passes.fence, &mut built).await {
        Ok(true) => {
            if passes.report_failing {
                tracing::info!(kind = built.kind, "the report is written again");
            }
            passes.report_failing = false;
            passes.last_report = Some(built);
            false
        }
        // The term is over: the Lease's change ends this one.
        Ok(false) => false,
        Err(e) => {
            let again = fence_broken(&e);
            if again {
                tracing::warn!(error = %e, "the report changed since this auditor last wrote it: reading it again before the next write");
            } else if !passes.report_failing {
                tracing::warn!(error = %e, "cannot write the report; retrying on the next change");
            }
            passes.report_failing = true;
            again
        }
    }
}

/// Writes the report if this replica still holds its term, over the report as the term last
/// saw it (read first when unknown). `Ok(false)`: the term is over, nothing written. A write
/// refused on its fence forgets the fence, so the next one reads the report again.
async fn write_report(
    client: &Client,
    term: &Term,
    fence: &mut Option<Fence>,
    report: &mut PolicyReport,
) -> Result<bool, crate::k8s::api::ClusterError> {
    if !term.holds() {
        return Ok(false);
    }
    let current = match fence.take() {
        Some(known) => known,
        None => read_fence(client, report.format()).await?,
    };
    // Reading took time: the term may have ended meanwhile.
    if !term.holds() {
        return Ok(false);
    }
    let written = apply_report(client, report, &current).await?;
    *fence = written.map(Fence::At);
    Ok(true)
}

/// Runs `work` where it does not hold up the runtime's other tasks: in place, with the runtime
/// told to move them off this worker thread (on a multi-threaded runtime, as `serve`'s is).
fn cpu_bound<R>(work: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(work),
        _ => work(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::{AuditFinding, Basis, Level};
    use crate::events::EventMetrics;
    use std::cell::Cell;
    use std::time::Duration;

    fn audit_of(name: &str, rules: &[Rule]) -> NodeAudit {
        NodeAudit {
            name: name.to_owned(),
            gpu: true,
            operands: Vec::new(),
            findings: rules
                .iter()
                .map(|&rule| AuditFinding {
                    rule,
                    level: Level::Warn,
                    basis: Basis::Labels,
                    message: format!("node {name}: {rule}"),
                })
                .collect(),
        }
    }

    #[test]
    fn each_gained_finding_is_offered_with_its_message_made_once_per_node() {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = EventMetrics::register(&mut registry);
        let (events, mut queue) = Events::with_bounds(Duration::from_secs(600), 100, 2, metrics);
        let (a, b) = (
            Rule::DevicePluginWithoutToolkit,
            Rule::DevicePluginOnNonGpuNode,
        );
        let made = Cell::new(0);
        let detail = |name: &str| {
            made.set(made.get() + 1);
            Some(audit_of(name, &[a, b]))
        };
        let gained = vec![("n1".into(), a), ("n1".into(), b), ("n2".into(), a)];
        offer_gained(&events, gained, detail);
        // n1's audit made once for its two Events; n2's never: the queue (2) was full.
        assert_eq!(made.get(), 1);
        let first = queue.try_recv().unwrap();
        assert_eq!(
            (&*first.node, first.rule, first.source, first.note.as_str()),
            (
                "n1",
                a,
                Source::Audit,
                "node n1: device-plugin-without-toolkit"
            )
        );
        assert_eq!(queue.try_recv().unwrap().rule, b);
        assert!(queue.try_recv().is_err());
    }
}
