//! `toolkit-rollout-not-recreated`: a ClusterPolicy change that rolls the toolkit on tainted
//! nodes.

use super::*;
use crate::core::placement::{Effect, Taint, TemplateInputs, Toleration};

/// The operator's defaults with these toolkit and every-operand template fields.
fn inputs(toolkit: &[(&str, &str)], every: &[(&str, &str)]) -> ClusterFacts {
    let pairs = |p: &[(&str, &str)]| -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    switched(|f| {
        f.templates.inputs = TemplateInputs {
            toolkit: pairs(toolkit),
            every: pairs(every),
        };
    })
}

fn tainted(labels: Labels, taint: Taint, nodes: &[&'static str]) -> NodeGroup<'static> {
    let mut g = group(labels, nodes);
    g.placement = NodePlacement {
        taints: vec![taint],
        unschedulable: false,
    };
    g
}

fn maintenance(effect: Effect) -> Taint {
    Taint::new("example.com/maintenance", "", effect)
}

const V1: (&str, &str) = ("spec.toolkit.version", "\"v1.17.0\"");
const V2: (&str, &str) = ("spec.toolkit.version", "\"v1.17.5\"");

#[test]
fn a_toolkit_upgrade_on_nodes_whose_taint_keeps_the_new_pod_off_is_denied() {
    let (before, after) = (inputs(&[V1], &[]), inputs(&[V2], &[]));
    let groups = [
        tainted(
            gpu_labels(),
            maintenance(Effect::NoSchedule),
            &["gpu-1", "gpu-2"],
        ),
        group(gpu_labels(), &["gpu-3"]),
        // The operands tolerate nvidia.com/gpu:NoSchedule by default.
        tainted(
            gpu_labels(),
            Taint::new("nvidia.com/gpu", "", Effect::NoSchedule),
            &["gpu-4"],
        ),
        // PreferNoSchedule places pods.
        tainted(
            gpu_labels(),
            maintenance(Effect::PreferNoSchedule),
            &["gpu-5"],
        ),
    ];
    let v = over(&cp_review(&before, &after, None), &groups);
    assert_eq!(v.decision, Decision::Denied);
    let msg = v.message.clone().unwrap();
    for want in [
        "ClusterPolicy cluster-policy: this change rolls the container toolkit DaemonSet (spec.toolkit.version: \"v1.17.0\" -> \"v1.17.5\")",
        "on 2 nodes (gpu-1, gpu-2)",
        "(example.com/maintenance:NoSchedule)",
        HOST_TOOLKIT_ANNOTATION,
    ] {
        assert!(msg.contains(want), "{want:?} not in {msg}");
    }
    for not in ["gpu-3", "gpu-4", "gpu-5"] {
        assert!(!msg.contains(not), "{not} in {msg}");
    }
    assert_eq!(v.findings[0].rule, Rule::ToolkitRolloutNotRecreated);

    // The hosts bring their own toolkit: a record, not a refusal.
    let v = over(&cp_review(&before, &after, Some("baked in")), &groups);
    assert_eq!(v.decision, Decision::Allowed);
    assert!(
        v.audit_annotations()
            .iter()
            .any(|(k, v)| *k == "findings" && v.contains("toolkit-rollout-not-recreated=audit")),
        "{:?}",
        v.audit_annotations()
    );
}

#[test]
fn no_rollout_or_no_device_plugin_left_is_not_this_rule() {
    let groups = [tainted(
        gpu_labels(),
        maintenance(Effect::NoSchedule),
        &["gpu-1"],
    )];
    let rule_found = |before: &ClusterFacts, after: &ClusterFacts| {
        over(&cp_review(before, after, None), &groups)
            .findings
            .iter()
            .any(|f| f.rule == Rule::ToolkitRolloutNotRecreated)
    };
    // The same fields, in the same canonical text: nothing rolls.
    assert!(!rule_found(&inputs(&[V1], &[]), &inputs(&[V1], &[])));
    // A field that does not reach the toolkit's template.
    assert!(!rule_found(
        &inputs(&[V1], &[]),
        &switched(|f| {
            f.templates.inputs.toolkit = vec![(V1.0.to_owned(), V1.1.to_owned())];
            f.disabled.insert(Operand::Dcgm);
        })
    ));
    // Every operand rolls (the validator's image): the device plugin is not re-created
    // either, so no device plugin runs without its toolkit there.
    let validator = |v: &str| inputs(&[], &[("spec.validator.version", v)]);
    assert!(!rule_found(&validator("\"v1\""), &validator("\"v2\"")));
    // A node without the device plugin's label.
    let mut no_plugin = gpu_labels();
    no_plugin.insert("nvidia.com/gpu.deploy.device-plugin".into(), "false".into());
    let groups = [tainted(
        no_plugin,
        maintenance(Effect::NoSchedule),
        &["gpu-1"],
    )];
    let v = over(
        &cp_review(&inputs(&[V1], &[]), &inputs(&[V2], &[]), None),
        &groups,
    );
    assert!(
        v.findings
            .iter()
            .all(|f| f.rule != Rule::ToolkitRolloutNotRecreated)
    );
    // A CREATE is not a rollout of what runs.
    let (before, after) = (inputs(&[V1], &[]), inputs(&[V2], &[]));
    let create = PolicyReview {
        operation: Operation::Create,
        ..cp_review(&before, &after, None)
    };
    let groups = [tainted(
        gpu_labels(),
        maintenance(Effect::NoSchedule),
        &["gpu-1"],
    )];
    assert!(
        over(&create, &groups)
            .findings
            .iter()
            .all(|f| f.rule != Rule::ToolkitRolloutNotRecreated)
    );
}

#[test]
fn a_toleration_removed_from_the_policy_is_judged_the_same_way() {
    let tolerating = |keys: &[&str]| {
        switched(|f| {
            f.templates.policy_tolerations = keys
                .iter()
                .map(|k| Toleration::exists(k, Some(Effect::NoSchedule)))
                .collect();
        })
    };
    let before = tolerating(&["nvidia.com/gpu", "example.com/maintenance"]);
    let after = tolerating(&["nvidia.com/gpu"]);
    let groups = [
        tainted(gpu_labels(), maintenance(Effect::NoSchedule), &["gpu-1"]),
        group(gpu_labels(), &["gpu-2"]),
    ];
    let v = over(&cp_review(&before, &after, None), &groups);
    // Every operand rolls and none is re-created on gpu-1: no device plugin stays there...
    assert!(
        v.findings
            .iter()
            .all(|f| f.rule != Rule::ToolkitRolloutNotRecreated)
    );
    // ...unless the device plugin's DaemonSet carries its own toleration (a live template).
    let with_live_plugin = |f: &ClusterFacts| {
        let mut f = f.clone();
        f.templates.daemonsets.insert(
            Operand::DevicePlugin,
            crate::core::placement::PodPlacement::tolerating(vec![Toleration::exists(
                "example.com/maintenance",
                None,
            )]),
        );
        f
    };
    let (before, after) = (with_live_plugin(&before), with_live_plugin(&after));
    let v = over(&cp_review(&before, &after, None), &groups);
    let found: Vec<&Finding> = v
        .findings
        .iter()
        .filter(|f| f.rule == Rule::ToolkitRolloutNotRecreated)
        .collect();
    assert_eq!(found.len(), 1, "{:?}", v.findings);
    assert!(
        found[0].message.contains("(spec.daemonsets.tolerations)"),
        "{}",
        found[0].message
    );
    assert!(
        found[0].message.contains("on 1 node (gpu-1)"),
        "{}",
        found[0].message
    );
}

#[test]
fn a_noexecute_taint_the_new_tolerations_drop_is_the_device_plugin_rule() {
    // NoExecute evicts at once: not a rollout matter, the state rules see the toolkit gone.
    let tolerating = |effect: Option<Effect>, also: bool| {
        switched(|f| {
            f.templates.policy_tolerations = vec![Toleration::exists("nvidia.com/gpu", effect)];
            if also {
                f.templates
                    .policy_tolerations
                    .push(Toleration::exists("example.com/maintenance", None));
            }
        })
    };
    let before = tolerating(Some(Effect::NoSchedule), true);
    let after = tolerating(Some(Effect::NoSchedule), false);
    let groups = [tainted(
        gpu_labels(),
        maintenance(Effect::NoExecute),
        &["gpu-1"],
    )];
    let v = over(&cp_review(&before, &after, None), &groups);
    assert!(
        v.findings
            .iter()
            .all(|f| f.rule != Rule::ToolkitRolloutNotRecreated)
    );
}

#[test]
fn a_new_policy_toleration_list_re_renders_the_live_templates_it_reaches() {
    let gpu = Toleration::exists("nvidia.com/gpu", Some(Effect::NoSchedule));
    let maint = Toleration::exists("example.com/maintenance", None);
    let mut cluster = operator_defaults();
    cluster.templates.policy_tolerations = vec![gpu.clone(), maint.clone()];
    for op in [Operand::ContainerToolkit, Operand::DevicePlugin] {
        cluster.templates.daemonsets.insert(
            op,
            crate::core::placement::PodPlacement::tolerating(vec![gpu.clone(), maint.clone()]),
        );
    }
    let same = cluster.with_cluster_policy("cp", &cluster);
    assert_eq!(
        same.template(Operand::ContainerToolkit).tolerations,
        vec![gpu.clone(), maint.clone()]
    );
    let mut new = operator_defaults();
    new.templates.policy_tolerations = vec![gpu.clone()];
    let after = cluster.with_cluster_policy("cp", &new);
    for op in [Operand::ContainerToolkit, Operand::DevicePlugin] {
        assert_eq!(after.template(op).tolerations, vec![gpu.clone()], "{op:?}");
    }
    // Unset: the assets' own nvidia.com/gpu toleration.
    let unset = cluster.with_cluster_policy("cp", &operator_defaults());
    assert_eq!(
        unset.template(Operand::ContainerToolkit).tolerations,
        vec![gpu]
    );
}

/// A GPUCluster alone (v26.7, no ClusterPolicy) is judged over the fleet: the state rules its
/// stack newly breaks are reported, naming the nodes.
#[test]
fn a_gpu_cluster_alone_is_judged_over_the_fleet() {
    use crate::core::facts::PolicySource;
    let before = switched(|f| {
        at("v26.7.0")(f);
        f.source = PolicySource::Missing("no ClusterPolicy object exists".into());
    });
    let after =
        before
            .clone()
            .with_gpu_cluster("gpu-cluster", OperandSet::EMPTY, Vec::new(), false);
    // gpu-1's DRA kubelet plugin was labelled off by a person: the pass leaves the label, so
    // the DRA stack's validator and DCGM wait there for ever.
    let mut dra_off = gpu_labels();
    dra_off.insert("nvidia.com/gpu.deploy.dra-driver".into(), "false".into());
    let groups = [group(dra_off, &["gpu-1"]), group(gpu_labels(), &["gpu-2"])];
    let review = PolicyReview {
        kind: PolicyKind::GpuCluster,
        name: "gpu-cluster",
        operation: Operation::Create,
        change: PolicyChange::GpuCluster {
            facts: &before,
            after: &after,
            cluster_policy: None,
        },
        ..cp_review(&before, &after, None)
    };
    let v = over(&review, &groups);
    let found: Vec<&Finding> = v
        .findings
        .iter()
        .filter(|f| f.rule == Rule::OperandWithoutDraDriver)
        .collect();
    assert_eq!(found.len(), 1, "{:?}", v.findings);
    assert!(
        found[0]
            .message
            .starts_with("GPUCluster gpu-cluster: after this change, 1 node fail operand-without-dra-driver (gpu-1)"),
        "{}",
        found[0].message
    );
    // What starts where: the DRA stack's operands on both nodes, its plugin on gpu-2 only.
    let shifts = shifts(&review, &groups);
    let dra = shifts
        .iter()
        .find(|s| s.operand == Operand::DraDriver)
        .unwrap();
    assert_eq!(dra.starts, vec!["gpu-2".to_owned()]);
}
