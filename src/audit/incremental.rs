//! The audit kept current by the work a change makes: a label change re-audits its node, a pod
//! change the nodes the pod was and is on, and only a change of what every node's audit shares
//! (the facts, the rules, the operands that have pods) re-audits the fleet.
//!
//! Pure, like [`super::audit`], and held to give the same audit: the tests compare its
//! summaries and each node's audit made again with the batch's after every step.

use super::{Context, FleetAudit, NodeAudit, NodeSummary};
use crate::core::facts::ClusterFacts;
use crate::core::lasting::History;
use crate::core::policy::Policy;
use crate::core::rules::Rule;
pub use crate::k8s::fleet::Dirty;
use crate::k8s::fleet::{NodeIndex, PodIndex};

/// The last pass's audit, kept as summaries, and what its nodes' audits shared.
#[derive(Debug, Default)]
pub struct Incremental {
    audit: Option<FleetAudit>,
    context: Option<Context>,
    /// The last pass's time (Unix seconds), which the history rules judged ages at.
    now: u64,
    /// The findings the passes since the last [`Incremental::take_gained`] found new on a node.
    gained: Gained,
}

/// Findings new on their nodes, at most [`MAX_GAINED`] (the Events' rate limit keeps no more
/// keys either), and how many more there were.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Gained {
    pub list: Vec<(Box<str>, Rule)>,
    pub over: usize,
}

/// Gained findings kept between two [`Incremental::take_gained`]: a fleet broken at once
/// (every node gaining every rule) costs a bounded list, not nodes × rules.
pub const MAX_GAINED: usize = 10_000;

/// What one [`Incremental::update`] did.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Pass {
    /// Nodes audited in this pass.
    pub audited: usize,
    /// Whether the whole fleet was re-audited.
    pub whole: bool,
}

impl Incremental {
    pub fn audit(&self) -> Option<&FleetAudit> {
        self.audit.as_ref()
    }

    /// Each node and rule the passes since the last call found broken on the node where the pass
    /// before had not (a node new to the fleet counts with all its findings), in node order. The
    /// first pass is the baseline and gains nothing.
    pub fn take_gained(&mut self) -> Gained {
        std::mem::take(&mut self.gained)
    }

    /// When the last pass judged the fleet (Unix seconds; 0 before the first).
    pub fn judged_at(&self) -> u64 {
        self.now
    }

    /// One node's whole audit, messages included, made again from the same records and
    /// context as its summary (when `nodes` and `pods` are those of the last
    /// [`Incremental::update`]).
    pub fn detail(
        &self,
        name: &str,
        nodes: &NodeIndex,
        pods: &PodIndex,
        policy: &Policy,
    ) -> Option<NodeAudit> {
        node_audit(self.context.as_ref()?, name, nodes, pods, policy, self.now)
    }

    /// Brings the audit up to date with `nodes` and `pods` at `now` (Unix seconds),
    /// re-auditing the `dirty` nodes, or every node when the shared context changed. A node
    /// whose timed label passed its limit since the last pass ([`NodeIndex::crossed`]) is dirty
    /// too. Each node's whole audit is made and reduced to its summary at once: a pass holds
    /// one node's messages at a time.
    pub fn update(
        &mut self,
        nodes: &NodeIndex,
        pods: &PodIndex,
        facts: &ClusterFacts,
        policy: &Policy,
        mut dirty: Dirty,
        now: u64,
    ) -> Pass {
        let context = Context::new(facts, pods.seen(), policy);
        let whole =
            dirty == Dirty::All || self.audit.is_none() || self.context.as_ref() != Some(&context);
        if !whole {
            for name in nodes.crossed(self.now, now, &policy.stuck_after) {
                dirty.add(&name);
            }
        }
        self.now = now;
        let audit_one = |name: &str| -> Option<NodeSummary> {
            node_audit(&context, name, nodes, pods, policy, now).map(|a| a.summary())
        };
        let mut audited = 0;
        let first = self.audit.is_none();
        let summaries = if whole {
            // The old audit goes before the new one is made: a pass over the whole fleet never
            // holds two, only the old summaries with findings, to see what each node gained.
            let mut all = self.audit.take().map(|r| r.nodes).unwrap_or_default();
            let before: Vec<NodeSummary> =
                all.drain(..).filter(|n| !n.findings.is_empty()).collect();
            all.extend(nodes.names().filter_map(audit_one));
            all.shrink_to_fit();
            audited = all.len();
            if !first {
                for node in &all {
                    let at = before.binary_search_by(|n| n.name.cmp(&node.name));
                    gained_by(at.ok().map(|i| &before[i]), node, &mut self.gained);
                }
            }
            all
        } else {
            let mut current = self.audit.take().map(|r| r.nodes).unwrap_or_default();
            if let Dirty::Nodes(names) = &dirty {
                for name in names {
                    let at = current.binary_search_by(|n| (*n.name).cmp(&**name));
                    match (audit_one(name), at) {
                        (Some(audit), Ok(i)) => {
                            gained_by(Some(&current[i]), &audit, &mut self.gained);
                            current[i] = audit;
                        }
                        (Some(audit), Err(i)) => {
                            gained_by(None, &audit, &mut self.gained);
                            current.insert(i, audit);
                        }
                        (None, Ok(i)) => {
                            current.remove(i);
                        }
                        (None, Err(_)) => continue,
                    }
                    audited += 1;
                }
            }
            current
        };
        self.audit = Some(FleetAudit {
            nodes: summaries,
            columns: context.columns.clone(),
            running_daemonset_pods: pods.running_daemonset_pods(),
            facts: context.facts.clone(),
            rules: context.rules.clone(),
        });
        self.context = Some(context);
        Pass { audited, whole }
    }
}

/// Adds each rule `now` finds on its node that `before` (the node's last summary, if any) did not.
fn gained_by(before: Option<&NodeSummary>, now: &NodeSummary, gained: &mut Gained) {
    let start = gained.list.len();
    for &(rule, ..) in now.findings.iter() {
        let known = before.is_some_and(|b| b.has(rule));
        if known || gained.list[start..].iter().any(|(_, r)| *r == rule) {
            continue;
        }
        if gained.list.len() >= MAX_GAINED {
            gained.over += 1;
        } else {
            gained.list.push((now.name.clone(), rule));
        }
    }
}

/// `name`'s whole audit from its record and pods; `None` when there is no such node.
fn node_audit(
    context: &Context,
    name: &str,
    nodes: &NodeIndex,
    pods: &PodIndex,
    policy: &Policy,
    now: u64,
) -> Option<NodeAudit> {
    let record = nodes.get(name)?;
    let lasting = nodes.lasting(name);
    let node = super::NodeIn {
        name,
        labels: &record.labels(),
        placement: &record.placement(),
        history: History {
            lasting: &lasting,
            now,
            stuck_after: policy.stuck_after,
        },
        advertised: record.advertised(),
    };
    Some(context.node(node, &pods.on_node(name), policy))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::audit;
    use crate::audit::tests::node;
    use crate::core::facts::operator_defaults;
    use crate::core::rules::Rule;
    use crate::k8s::fleet::LabelFilter;
    use crate::k8s::node::NodeView;
    use crate::k8s::pod::{PodPhase, PodView};

    fn pod(name: &str, node: &str, ds: &str, phase: PodPhase) -> PodView {
        let mut p = PodView {
            node: Some(node.to_owned()),
            phase,
            daemonset: Some(ds.to_owned()),
            owned: true,
            ..PodView::default()
        };
        p.metadata.name = Some(name.to_owned());
        p
    }

    /// The incremental audit equals the batch audit of the same nodes and pods, and each
    /// node's audit made again equals the batch's, messages included.
    fn same_as_batch(
        inc: &Incremental,
        (index, pod_index): (&NodeIndex, &PodIndex),
        nodes: &[NodeView],
        pods: &[PodView],
    ) {
        let facts = operator_defaults();
        let policy = Policy::default();
        let batch = audit(nodes, pods, &facts, &policy);
        // The batch has watched nothing, so it leaves out the rules on how long a state
        // lasted; the incremental audit evaluates them too. Neither read ResourceSlices.
        let mut want = batch.summary();
        want.rules = Rule::state_rules()
            .filter(|r| !r.reads_slices() && !r.reads_foreign_plugins())
            .collect();
        assert!(want.rules.contains(&Rule::PauseStuck));
        assert_eq!(inc.audit(), Some(&want));
        for node in &batch.nodes {
            let made = inc.detail(&node.name, index, pod_index, &policy);
            assert_eq!(made.as_ref(), Some(node));
        }
        assert_eq!(inc.detail("no-such-node", index, pod_index, &policy), None);
    }

    /// Nodes a, b and c with a device plugin on a and b and a toolkit pending on a, listed
    /// into their indexes.
    fn three_nodes(facts: &ClusterFacts) -> (Vec<NodeView>, Vec<PodView>, NodeIndex, PodIndex) {
        let nodes = vec![
            node(
                "a",
                &[("device-plugin", "true"), ("container-toolkit", "true")],
            ),
            node("b", &[("device-plugin", "true")]),
            node("c", &[]),
        ];
        let pods = vec![
            pod(
                "dp-a",
                "a",
                "nvidia-device-plugin-daemonset",
                PodPhase::Running,
            ),
            pod(
                "dp-b",
                "b",
                "nvidia-device-plugin-daemonset",
                PodPhase::Running,
            ),
            pod(
                "tk-a",
                "a",
                "nvidia-container-toolkit-daemonset",
                PodPhase::Pending,
            ),
        ];
        let mut index = NodeIndex::new(LabelFilter::new(facts));
        let mut pod_index = PodIndex::default();
        index.start_relist();
        for n in &nodes {
            index.relist_apply(n);
        }
        index.finish_relist();
        pod_index.start_relist();
        for p in &pods {
            pod_index.relist_apply(p);
        }
        pod_index.finish_relist();
        (nodes, pods, index, pod_index)
    }

    #[test]
    fn label_and_pod_changes_re_audit_only_their_nodes_and_match_the_batch_audit() {
        let facts = operator_defaults();
        let policy = Policy::default();
        let (mut nodes, mut pods, mut index, mut pod_index) = three_nodes(&facts);
        let mut inc = Incremental::default();
        let pass = inc.update(&index, &pod_index, &facts, &policy, Dirty::All, 0);
        assert_eq!(
            pass,
            Pass {
                audited: 3,
                whole: true
            }
        );
        same_as_batch(&inc, (&index, &pod_index), &nodes, &pods);

        // A heartbeat: the same labels plus one no rule reads. Nothing is dirty.
        let mut beat = nodes[2].clone();
        beat.metadata
            .labels
            .get_or_insert_default()
            .insert("kubernetes.io/hostname".into(), "c".into());
        assert!(!index.apply(&beat));

        // The toolkit pod on a starts running: only a is audited again.
        pods[2].phase = PodPhase::Running;
        let mut dirty = Dirty::default();
        for n in pod_index.apply(&pods[2]) {
            dirty.add(&n);
        }
        let pass = inc.update(&index, &pod_index, &facts, &policy, dirty, 0);
        assert_eq!(
            pass,
            Pass {
                audited: 1,
                whole: false
            }
        );
        same_as_batch(&inc, (&index, &pod_index), &nodes, &pods);

        // b gets the toolkit label; c is deleted; d is added.
        nodes[1] = node(
            "b",
            &[("device-plugin", "true"), ("container-toolkit", "true")],
        );
        let mut dirty = Dirty::default();
        assert!(index.apply(&nodes[1]));
        dirty.add("b");
        assert!(index.delete("c"));
        dirty.add("c");
        nodes.remove(2);
        let d = node("d", &[("driver", "true")]);
        assert!(index.apply(&d));
        dirty.add("d");
        nodes.push(d);
        let pass = inc.update(&index, &pod_index, &facts, &policy, dirty, 0);
        assert_eq!(
            pass,
            Pass {
                audited: 3,
                whole: false
            }
        );
        same_as_batch(&inc, (&index, &pod_index), &nodes, &pods);

        // The first pod of an operand the defaults switch off (the node status exporter)
        // enables it and adds a column: the whole fleet again.
        let gfd = pod(
            "nse-d",
            "d",
            "nvidia-node-status-exporter",
            PodPhase::Running,
        );
        let mut dirty = Dirty::default();
        for n in pod_index.apply(&gfd) {
            dirty.add(&n);
        }
        pods.push(gfd);
        let pass = inc.update(&index, &pod_index, &facts, &policy, dirty, 0);
        assert!(pass.whole);
        same_as_batch(&inc, (&index, &pod_index), &nodes, &pods);

        // A pod deleted.
        let mut dirty = Dirty::default();
        let gone = pods.iter().find(|p| p.name() == "dp-b").cloned();
        for n in pod_index.delete(&gone.expect("dp-b is there")) {
            dirty.add(&n);
        }
        pods.retain(|p| p.name() != "dp-b");
        inc.update(&index, &pod_index, &facts, &policy, dirty, 0);
        same_as_batch(&inc, (&index, &pod_index), &nodes, &pods);
    }

    /// A pause past `stuckAfter.pause` is found by a pass that comes after its limit, with no
    /// change of the node's record: time alone makes the node dirty.
    #[test]
    fn a_pause_becomes_stuck_with_time_alone() {
        use crate::audit::Basis;
        let facts = operator_defaults();
        let policy = Policy::default();
        let mut index = NodeIndex::new(LabelFilter::new(&facts));
        let stuck = node(
            "m",
            &[
                ("device-plugin", "paused-for-mig-change"),
                ("gpu-feature-discovery", "paused-for-mig-change"),
                ("container-toolkit", "true"),
                ("nvidia.com/mig.config.state", "failed"),
            ],
        );
        index.apply_at(&stuck, 1_000);
        index.apply_at(
            &node("n", &[("device-plugin", "paused-for-mig-change")]),
            4_000,
        );
        let pods = PodIndex::default();
        let mut inc = Incremental::default();
        inc.update(&index, &pods, &facts, &policy, Dirty::All, 1_000);
        let found = |inc: &Incremental, name: &str| {
            let audit = inc.audit().unwrap();
            let n = audit.nodes.iter().find(|n| &*n.name == name).unwrap();
            (n.has(Rule::PauseStuck), n.is_ok())
        };
        // m's toolkit is expected and has no pod: not OK from the start.
        assert_eq!(found(&inc, "m"), (false, false));
        // 59 minutes later nothing changed; at one hour m's pause is stuck, n's is not yet.
        let pass = inc.update(&index, &pods, &facts, &policy, Dirty::default(), 4_599);
        assert_eq!(pass.audited, 0);
        let pass = inc.update(&index, &pods, &facts, &policy, Dirty::default(), 4_600);
        assert_eq!((pass.audited, pass.whole), (1, false));
        assert!(found(&inc, "m").0);
        assert_eq!(found(&inc, "n"), (false, true));
        let detail = inc.detail("m", &index, &pods, &policy).unwrap();
        let f = detail
            .findings
            .iter()
            .find(|f| f.rule == Rule::PauseStuck)
            .unwrap();
        assert_eq!(f.basis, Basis::History);
        assert!(
            f.message.starts_with(
                "node m: mig-manager has held nvidia.com/gpu.deploy.device-plugin, \
                 nvidia.com/gpu.deploy.gpu-feature-discovery at paused-for-mig-change since \
                 1970-01-01T00:16:40Z"
            ),
            "{}",
            f.message
        );
        assert!(
            f.message.contains(
                "longer than stuckAfter.pause (1h); nvidia.com/mig.config.state is failed"
            ),
            "{}",
            f.message
        );
        assert!(!f.message.contains("=true"), "{}", f.message);
        // The pause ends: the node's record changes and the finding goes.
        let done = node(
            "m",
            &[
                ("device-plugin", "true"),
                ("gpu-feature-discovery", "true"),
                ("container-toolkit", "true"),
                ("nvidia.com/mig.config.state", "success"),
            ],
        );
        index.apply_at(&done, 5_000);
        let mut dirty = Dirty::default();
        dirty.add("m");
        inc.update(&index, &pods, &facts, &policy, dirty, 5_000);
        assert!(!found(&inc, "m").0);
        assert_eq!(found(&inc, "n"), (false, true));
        // n's limit passes: found without a change of n.
        let pass = inc.update(&index, &pods, &facts, &policy, Dirty::default(), 7_600);
        assert_eq!(pass.audited, 1);
        assert_eq!(found(&inc, "n"), (true, false));
    }

    fn rules_on(inc: &Incremental, name: &str) -> Vec<(Box<str>, Rule)> {
        let audit = inc.audit().unwrap();
        let n = audit.nodes.iter().find(|n| &*n.name == name).unwrap();
        n.findings.iter().map(|f| (name.into(), f.0)).collect()
    }

    #[test]
    fn a_node_gains_only_the_findings_it_did_not_have_and_the_first_pass_is_the_baseline() {
        let facts = operator_defaults();
        let policy = Policy::default();
        let (_, _, mut index, pod_index) = three_nodes(&facts);
        let mut inc = Incremental::default();
        inc.update(&index, &pod_index, &facts, &policy, Dirty::All, 0);
        // b runs the device plugin without the toolkit from the start: the baseline.
        assert!(rules_on(&inc, "b").contains(&("b".into(), Rule::DevicePluginWithoutToolkit)));
        assert_eq!(inc.take_gained().list, []);
        // The same findings again, by node and over the whole fleet: nothing gained.
        let mut dirty = Dirty::default();
        dirty.add("b");
        inc.update(&index, &pod_index, &facts, &policy, dirty, 0);
        inc.update(&index, &pod_index, &facts, &policy, Dirty::All, 0);
        assert_eq!(inc.take_gained().list, []);

        // c gets the device plugin alone: c gains every finding it now has, once.
        assert!(index.apply(&node("c", &[("device-plugin", "true")])));
        let mut dirty = Dirty::default();
        dirty.add("c");
        inc.update(&index, &pod_index, &facts, &policy, dirty, 0);
        let gained = inc.take_gained().list;
        assert!(gained.contains(&("c".into(), Rule::DevicePluginWithoutToolkit)));
        assert_eq!(gained, rules_on(&inc, "c"));
        assert_eq!(inc.take_gained().list, []);

        // A new node with findings, found by a pass over the whole fleet: only it gains.
        assert!(index.apply(&node("d", &[("device-plugin", "true")])));
        inc.update(&index, &pod_index, &facts, &policy, Dirty::All, 0);
        assert_eq!(inc.take_gained().list, rules_on(&inc, "d"));

        // c loses its findings and gets them back: gained again.
        assert!(index.apply(&node("c", &[])));
        let mut dirty = Dirty::default();
        dirty.add("c");
        inc.update(&index, &pod_index, &facts, &policy, dirty.clone(), 0);
        assert_eq!(inc.take_gained().list, []);
        assert!(index.apply(&node("c", &[("device-plugin", "true")])));
        inc.update(&index, &pod_index, &facts, &policy, dirty, 0);
        assert_eq!(inc.take_gained().list, rules_on(&inc, "c"));
    }

    #[test]
    fn a_rule_whose_action_is_off_is_never_gained() {
        let facts = operator_defaults();
        let mut policy = Policy::default();
        policy.actions[Rule::DevicePluginWithoutToolkit as usize] = crate::core::rules::Action::Off;
        let (_, _, mut index, pod_index) = three_nodes(&facts);
        let mut inc = Incremental::default();
        inc.update(&index, &pod_index, &facts, &policy, Dirty::All, 0);
        assert!(index.apply(&node("c", &[("device-plugin", "true")])));
        let mut dirty = Dirty::default();
        dirty.add("c");
        inc.update(&index, &pod_index, &facts, &policy, dirty, 0);
        let gained = inc.take_gained().list;
        assert!(!gained.is_empty(), "c has other findings");
        assert!(
            gained
                .iter()
                .all(|(_, r)| *r != Rule::DevicePluginWithoutToolkit),
            "{gained:?}"
        );
    }

    #[test]
    fn too_many_names_become_all() {
        let mut dirty = Dirty::default();
        for i in 0..=Dirty::MAX_NAMES {
            dirty.add(&format!("n{i}"));
        }
        assert_eq!(dirty, Dirty::All);
        let mut d = Dirty::default();
        assert!(d.is_empty());
        d.merge(Dirty::All);
        assert_eq!(d, Dirty::All);
    }

    #[test]
    fn gained_findings_past_the_bound_are_counted_not_kept() {
        use crate::audit::{Basis, Level, NodeSummary};
        use crate::core::operands::OperandSet;
        let summary = |name: &str| NodeSummary {
            name: name.into(),
            gpu: true,
            expected: OperandSet::EMPTY,
            running: OperandSet::EMPTY,
            with_pod: OperandSet::EMPTY,
            not_recreated: OperandSet::EMPTY,
            held_off: OperandSet::EMPTY,
            findings: [
                (Rule::DevicePluginWithoutToolkit, Level::Fail, Basis::Pods),
                (Rule::OperandNotRunning, Level::Fail, Basis::Pods),
            ]
            .into(),
        };
        let mut gained = Gained::default();
        for i in 0..MAX_GAINED / 2 + 10 {
            gained_by(None, &summary(&format!("n{i}")), &mut gained);
        }
        assert_eq!(gained.list.len(), MAX_GAINED);
        assert_eq!(gained.over, 20);
        // What a node already had is not gained.
        let mut again = Gained::default();
        gained_by(Some(&summary("a")), &summary("a"), &mut again);
        assert_eq!(again, Gained::default());
    }
}
