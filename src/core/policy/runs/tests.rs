//! Decisions on tainted nodes: what the DaemonSet controller will place decides.

use std::collections::BTreeMap;

use super::*;
use crate::core::operands::Operand;
use crate::core::placement::{Effect, PodPlacement, Taint, Toleration};
use crate::core::policy::tests::{lab_node_0, with};
use crate::core::policy::{Decision, Policy, Verdict, assess, decide};
use crate::core::review::{Operation, Review};
use crate::core::rules::{Action, Change, Rule};

fn node(taints: &[Taint]) -> NodePlacement {
    NodePlacement {
        taints: taints.to_vec(),
        unschedulable: false,
    }
}

fn decide_on(
    old: &Labels,
    new: &Labels,
    old_node: Option<&NodePlacement>,
    new_node: &NodePlacement,
    facts: &ClusterFacts,
) -> Verdict {
    let review = Review {
        node: "gpu-0",
        operation: Operation::Update,
        old_labels: Some(old),
        labels: new,
        username: "alice@example.com",
        groups: &[],
        dry_run: false,
        unknown_not_copied: 0,
        old_placement: old_node,
        placement: new_node,
    };
    decide(&review, facts, &Policy::default())
}

fn found(v: &Verdict) -> Vec<(Rule, Action, Change)> {
    v.findings
        .iter()
        .map(|f| (f.rule, f.action, f.change))
        .collect()
}

/// Live DaemonSets whose tolerations differ: the device plugin tolerates everything, the
/// toolkit only the operator's default.
fn plugin_tolerates_all() -> ClusterFacts {
    let mut facts = ClusterFacts::default();
    facts.templates.daemonsets = BTreeMap::from([
        (
            Operand::DevicePlugin,
            PodPlacement::tolerating(vec![Toleration::exists("", None)]),
        ),
        (
            Operand::ContainerToolkit,
            PodPlacement::tolerating(vec![Toleration::exists(
                "nvidia.com/gpu",
                Some(Effect::NoSchedule),
            )]),
        ),
    ]);
    facts
}

#[test]
fn a_no_execute_taint_that_evicts_the_toolkit_but_not_the_device_plugin_is_refused() {
    let labels = lab_node_0();
    let maintenance = Taint::new("example.com/maintenance", "", Effect::NoExecute);
    let v = decide_on(
        &labels,
        &labels,
        Some(&node(&[])),
        &node(std::slice::from_ref(&maintenance)),
        &plugin_tolerates_all(),
    );
    assert_eq!(v.decision, Decision::Denied, "{v:?}");
    assert_eq!(
        found(&v)[0],
        (Rule::DevicePluginWithoutToolkit, Action::Deny, Change::New)
    );
    let msg = v.message.unwrap();
    assert!(
        msg.contains("does not tolerate the node's taint example.com/maintenance:NoExecute, which evicts its pod"),
        "{msg}"
    );
    assert!(
        v.after.contains(Operand::DevicePlugin) && !v.after.contains(Operand::ContainerToolkit)
    );
}

#[test]
fn turning_the_device_plugin_on_where_the_toolkit_cannot_be_placed_is_refused() {
    let off = with(&lab_node_0(), &[("device-plugin", Some("false"))]);
    let on = with(&off, &[("device-plugin", Some("true"))]);
    let xid = Taint::new("nvidia.com/gpu-xid-error", "79", Effect::NoExecute);
    let tainted = node(&[xid]);
    let v = decide_on(&off, &on, None, &tainted, &plugin_tolerates_all());
    assert_eq!(v.decision, Decision::Denied, "{v:?}");
    // With the operator's own tolerations the same taint keeps both off: nothing breaks.
    let v = decide_on(&off, &on, None, &tainted, &ClusterFacts::default());
    assert_eq!(v.decision, Decision::Allowed, "{v:?}");
    assert!(!v.after.contains(Operand::DevicePlugin));
}

#[test]
fn a_no_schedule_taint_keeps_what_runs_and_creates_nothing_new() {
    let off = with(&lab_node_0(), &[("device-plugin", Some("false"))]);
    let on = with(&off, &[("device-plugin", Some("true"))]);
    let xid = node(&[Taint::new(
        "nvidia.com/gpu-xid-error",
        "",
        Effect::NoSchedule,
    )]);
    let v = decide_on(&off, &on, None, &xid, &ClusterFacts::default());
    assert_eq!(v.decision, Decision::Allowed, "{v:?}");
    assert!(
        !v.after.contains(Operand::DevicePlugin),
        "not created under the taint"
    );
    assert!(v.after.contains(Operand::ContainerToolkit), "kept: it ran");
}

#[test]
fn adding_an_untolerated_no_schedule_taint_warns_that_the_toolkit_would_not_be_re_created() {
    let labels = lab_node_0();
    let xid = node(&[Taint::new(
        "nvidia.com/gpu-xid-error",
        "79",
        Effect::NoSchedule,
    )]);
    let v = decide_on(
        &labels,
        &labels,
        Some(&node(&[])),
        &xid,
        &ClusterFacts::default(),
    );
    assert_eq!(v.decision, Decision::Allowed, "{v:?}");
    assert_eq!(
        found(&v),
        [
            (Rule::ToolkitNotRecreated, Action::Warn, Change::New),
            (Rule::OperandsNotRecreated, Action::Warn, Change::New),
        ]
    );
    let toolkit = &v.findings[0].message;
    assert!(
        toolkit.contains("taint nvidia.com/gpu-xid-error=79:NoSchedule"),
        "{toolkit}"
    );
    assert!(toolkit.contains("spec.daemonsets.tolerations"), "{toolkit}");
    let others = &v.findings[1].message;
    assert!(
        others.starts_with(
            "node gpu-0: driver, device-plugin, gpu-feature-discovery, dcgm-exporter would run"
        ),
        "{others}"
    );
    // Tolerated by the ClusterPolicy's tolerations: nothing to say.
    let mut facts = ClusterFacts::default();
    facts.templates.policy_tolerations = vec![Toleration::exists("nvidia.com/gpu-xid-error", None)];
    let v = decide_on(&labels, &labels, Some(&node(&[])), &xid, &facts);
    assert!(v.findings.is_empty(), "{v:?}");
}

#[test]
fn a_node_that_is_not_ready_is_judged_as_it_will_be_once_it_is() {
    let off = with(&lab_node_0(), &[("container-toolkit", Some("false"))]);
    let not_ready = node(&[Taint::new(
        "node.kubernetes.io/not-ready",
        "",
        Effect::NoSchedule,
    )]);
    let v = decide_on(
        &lab_node_0(),
        &off,
        None,
        &not_ready,
        &ClusterFacts::default(),
    );
    assert_eq!(v.decision, Decision::Denied, "{v:?}");
}

#[test]
fn a_cordoned_node_gets_its_daemon_pods() {
    let off = with(&lab_node_0(), &[("container-toolkit", Some("false"))]);
    let cordoned = NodePlacement {
        taints: vec![Taint::new(
            "node.kubernetes.io/unschedulable",
            "",
            Effect::NoSchedule,
        )],
        unschedulable: true,
    };
    let v = decide_on(
        &lab_node_0(),
        &off,
        None,
        &cordoned,
        &ClusterFacts::default(),
    );
    assert_eq!(v.decision, Decision::Denied, "{v:?}");
    assert!(
        assess(
            "gpu-0",
            &lab_node_0(),
            &cordoned,
            &ClusterFacts::default(),
            &Policy::default()
        )
        .is_empty()
    );
}

#[test]
fn the_audit_of_a_tainted_node_names_what_is_not_re_created() {
    let xid = node(&[Taint::new(
        "nvidia.com/gpu-xid-error",
        "",
        Effect::NoSchedule,
    )]);
    let found = assess(
        "gpu-0",
        &lab_node_0(),
        &xid,
        &ClusterFacts::default(),
        &Policy::default(),
    );
    let rules: Vec<Rule> = found.iter().map(|f| f.rule).collect();
    assert_eq!(
        rules,
        [Rule::ToolkitNotRecreated, Rule::OperandsNotRecreated]
    );
    assert!(
        found[0]
            .message
            .starts_with("node gpu-0 already runs the container toolkit under"),
        "{}",
        found[0].message
    );
    let evicting = plugin_tolerates_all();
    let ne = node(&[Taint::new("m", "", Effect::NoExecute)]);
    let found = assess("gpu-0", &lab_node_0(), &ne, &evicting, &Policy::default());
    assert_eq!(found[0].rule, Rule::DevicePluginWithoutToolkit);
}

#[test]
fn runs_lists_the_stopped_operands_with_the_controllers_answer() {
    let facts = plugin_tolerates_all();
    let ne = Taint::new("m", "", Effect::NoExecute);
    let r = runs(
        "gpu-0",
        &lab_node_0(),
        &node(std::slice::from_ref(&ne)),
        None,
        &facts,
    );
    assert_eq!(
        r.blocked.get(&Operand::ContainerToolkit),
        Some(&Placement::Evicted(ne))
    );
    assert!(!r.blocked.contains_key(&Operand::DevicePlugin));
    assert!(r.set.contains(Operand::DevicePlugin) && !r.set.contains(Operand::Driver));
    assert!(r.not_recreated.is_empty());
}

#[test]
fn the_label_keys_a_live_required_node_affinity_reads_are_kept() {
    use crate::core::placement::{NodeAffinity, Requirement, SelectorOperator, Term};
    use crate::core::policy::{reads_label, selector_keys};
    let mut facts = ClusterFacts::default();
    assert!(!reads_label("example.com/pool", &facts));
    facts.templates.daemonsets.insert(
        Operand::DevicePlugin,
        PodPlacement {
            affinity: Some(NodeAffinity {
                terms: vec![Term {
                    match_expressions: vec![Requirement {
                        key: "example.com/pool".into(),
                        operator: SelectorOperator::In,
                        values: vec!["a100".into()],
                    }],
                    match_fields: vec![],
                }],
            }),
            ..PodPlacement::default()
        },
    );
    // The webhook copies only the labels reads_label keeps, the fleet records selector_keys':
    // without the key, the affinity would never pick the node.
    assert!(reads_label("example.com/pool", &facts));
    assert!(selector_keys(&facts).contains("example.com/pool"));
    let on = with(&lab_node_0(), &[("example.com/pool", Some("a100"))]);
    let r = runs("gpu-0", &on, &node(&[]), None, &facts);
    assert!(r.set.contains(Operand::DevicePlugin));
    let r = runs("gpu-0", &lab_node_0(), &node(&[]), None, &facts);
    assert_eq!(
        r.blocked.get(&Operand::DevicePlugin),
        Some(&Placement::NotSelected)
    );
}
