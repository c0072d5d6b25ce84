use super::*;
use crate::core::facts::operator_defaults;
use crate::core::nvidia_driver::{DRIVER_DEPLOY_KEY, VGPU_MANAGER_DEPLOY_KEY};
use crate::core::operands::{SandboxMode, Workload};
use crate::core::operator::Sandbox;
use crate::core::placement::NodePlacement;
use crate::core::policy::Decision;
use crate::core::policy::tests::labels;
use crate::core::rules::Finding;

const NFD: (&str, &str) = ("feature.node.kubernetes.io/pci-10de.present", "true");
const NFD_OS_ID: &str = "feature.node.kubernetes.io/system-os_release.ID";

/// A GPU node as the operator leaves it in the container workload.
fn gpu_labels() -> Labels {
    labels(&[
        NFD,
        ("nvidia.com/gpu.present", "true"),
        ("driver", "true"),
        ("container-toolkit", "true"),
        ("device-plugin", "true"),
        ("gpu-feature-discovery", "true"),
        ("dcgm", "true"),
        ("dcgm-exporter", "true"),
        ("operator-validator", "true"),
        ("node-status-exporter", "true"),
        ("feature.node.kubernetes.io/system-os_release.ID", "ubuntu"),
        (
            "feature.node.kubernetes.io/system-os_release.VERSION_ID",
            "22.04",
        ),
    ])
}

/// The decision over these groups, every label kept, with the built-in policy.
fn over(review: &PolicyReview<'_>, groups: &[NodeGroup<'_>]) -> Verdict {
    decide_policy(
        review,
        Fleet::Known {
            groups,
            keeps: &|_| true,
        },
        &Policy::default(),
    )
}

fn group<'a>(labels: Labels, nodes: &[&'a str]) -> NodeGroup<'a> {
    NodeGroup {
        labels,
        placement: NodePlacement::default(),
        nodes: nodes.to_vec(),
    }
}

/// A GPU node's labels with one more.
fn gpu_labels_with(key: &str, value: &str) -> Labels {
    let mut l = gpu_labels();
    l.insert(key.into(), value.into());
    l
}

/// Sets the facts' operator version.
fn at(version: &str) -> impl Fn(&mut ClusterFacts) + Copy + '_ {
    move |f| f.operator.version = crate::core::era::OperatorVersion::parse(version).unwrap()
}

fn switched(f: impl FnOnce(&mut ClusterFacts)) -> ClusterFacts {
    let mut facts = operator_defaults();
    f(&mut facts);
    facts
}

fn cp_review<'a>(
    before: &'a ClusterFacts,
    after: &'a ClusterFacts,
    host_toolkit: Option<&'a str>,
) -> PolicyReview<'a> {
    PolicyReview {
        kind: PolicyKind::ClusterPolicy,
        name: "cluster-policy",
        operation: Operation::Update,
        username: "alice",
        groups: &[],
        dry_run: false,
        change: PolicyChange::ClusterPolicy {
            before,
            after,
            host_toolkit,
            others: &[],
            drivers: &[],
        },
    }
}

/// The operator's defaults with the toolkit and the device plugin switched off together.
fn both_off() -> ClusterFacts {
    switched(|f| {
        toolkit_off(f);
        f.disabled.insert(Operand::DevicePlugin);
    })
}

/// A ClusterPolicy UPDATE from `before` to `after` with these NVIDIADriver resources.
fn cp_review_with_drivers<'a>(
    before: &'a ClusterFacts,
    after: &'a ClusterFacts,
    drivers: &'a [NvidiaDriver],
) -> PolicyReview<'a> {
    PolicyReview {
        change: PolicyChange::ClusterPolicy {
            before,
            after,
            host_toolkit: None,
            others: &[],
            drivers,
        },
        ..cp_review(before, after, None)
    }
}

fn toolkit_off(f: &mut ClusterFacts) {
    f.toolkit_managed = false;
    f.disabled.insert(Operand::ContainerToolkit);
}

fn fleet_of(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("gpu-{i:03}")).collect()
}

#[test]
fn the_toolkit_switched_off_under_running_device_plugins_is_denied_naming_the_nodes() {
    let before = operator_defaults();
    let after = switched(toolkit_off);
    let names = fleet_of(12);
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let groups = [group(gpu_labels(), &refs), group(labels(&[]), &["cpu-0"])];
    let v = over(&cp_review(&before, &after, None), &groups);
    assert_eq!(v.decision, Decision::Denied);
    let msg = v.message.clone().unwrap();
    assert!(
        msg.starts_with(
            "ClusterPolicy cluster-policy: spec.toolkit.enabled true -> false deletes the container toolkit DaemonSet while the NVIDIA device plugin keeps running on 12 nodes (gpu-000, gpu-001, gpu-002, gpu-003, gpu-004 and 7 more)"
        ),
        "{msg}"
    );
    assert!(
        msg.contains(HOST_TOOLKIT_ANNOTATION),
        "the refusal says how: {msg}"
    );
    assert!(!msg.contains("cpu-0"));
    let notes = v.audit_annotations();
    assert!(notes.contains(&("policy-change", "ClusterPolicy/cluster-policy".to_owned())));
    assert!(notes.contains(&("nodes", "13".to_owned())));
}

#[test]
fn the_host_toolkit_annotation_lets_it_through_and_is_recorded() {
    let before = operator_defaults();
    let after = switched(toolkit_off);
    let groups = [group(gpu_labels(), &["gpu-0"])];
    let v = over(
        &cp_review(&before, &after, Some("toolkit baked into the node image")),
        &groups,
    );
    assert_eq!(v.decision, Decision::Allowed);
    let notes = v.audit_annotations();
    assert!(
        notes.contains(&(
            "override",
            format!("{HOST_TOOLKIT_ANNOTATION}=toolkit baked into the node image")
        )),
        "{notes:?}"
    );
    assert!(
        notes
            .iter()
            .any(|(k, v)| *k == "findings" && v.contains("toolkit-switched-off=audit")),
        "{notes:?}"
    );
}

#[test]
fn toolkit_and_device_plugin_off_together_or_nowhere_running_is_allowed() {
    let before = operator_defaults();
    let both = both_off();
    let groups = [group(gpu_labels(), &["gpu-0"])];
    let v = over(&cp_review(&before, &both, None), &groups);
    assert_eq!(v.decision, Decision::Allowed, "{:?}", v.message);
    // Only CPU nodes: nothing runs the device plugin, nothing to refuse.
    let after = switched(toolkit_off);
    let cpu = [group(labels(&[]), &["cpu-0"])];
    let v = over(&cp_review(&before, &after, None), &cpu);
    assert_eq!(v.decision, Decision::Allowed, "{:?}", v.message);
    // Already off: an unrelated edit of a policy that has the toolkit off passes.
    let v = over(&cp_review(&after, &after, None), &groups);
    assert_eq!(v.decision, Decision::Allowed);
    assert!(v.findings.is_empty(), "{:?}", v.findings);
}

#[test]
fn without_the_nodes_the_policy_alone_decides_and_says_so() {
    let before = operator_defaults();
    let after = switched(toolkit_off);
    let v = decide_policy(
        &cp_review(&before, &after, None),
        Fleet::Unknown("the nodes are not listed yet"),
        &Policy::default(),
    );
    assert_eq!(v.decision, Decision::Denied);
    assert!(
        v.message
            .clone()
            .unwrap()
            .contains("the nodes are not known: the nodes are not listed yet")
    );
    assert!(
        v.audit_annotations()
            .contains(&("nodes", "unknown".to_owned()))
    );
}

#[test]
fn the_driver_switched_off_warns_with_the_nodes() {
    let before = operator_defaults();
    let after = switched(|f| {
        f.disabled.insert(Operand::Driver);
    });
    let groups = [group(gpu_labels(), &["gpu-1", "gpu-0"])];
    let v = over(&cp_review(&before, &after, None), &groups);
    assert_eq!(v.decision, Decision::Allowed);
    assert_eq!(
        v.warnings,
        ["ClusterPolicy cluster-policy: 2 nodes lose the driver DaemonSet (gpu-0, gpu-1)"]
    );
    assert!(
        v.findings[0]
            .message
            .contains("spec.driver.enabled true -> false")
    );
}

#[test]
fn handing_the_driver_to_nvidiadrivers_warns_for_the_nodes_none_selects() {
    // v25.3 to v26.3 delete the ClusterPolicy's driver pods at once (v26.7 orphans them).
    let era = at("v25.3.4");
    let before = switched(era);
    let after = switched(|f| {
        era(f);
        f.driver_crd = true;
    });
    let a100 = gpu_labels_with("nvidia.com/gpu.product", "A100");
    let drivers = [NvidiaDriver {
        name: "a100".into(),
        node_selector: Some([("nvidia.com/gpu.product".to_owned(), "A100".to_owned())].into()),
        vgpu_host_manager: false,
        precompiled: false,
        default: false,
        tolerations: Vec::new(),
    }];
    let groups = [group(a100, &["a-0"]), group(gpu_labels(), &["h-0"])];
    let review = cp_review_with_drivers(&before, &after, &drivers);
    let v = over(&review, &groups);
    assert_eq!(v.findings.len(), 1, "{:?}", v.findings);
    assert_eq!(v.findings[0].rule, Rule::DriverRemoved);
    assert!(
        v.findings[0].message.contains("driver.useNvidiaDriverCRD")
            && v.findings[0].message.contains("(h-0)"),
        "{}",
        v.findings[0].message
    );
}

#[test]
fn sandbox_workloads_on_warns_what_each_kind_of_node_gets() {
    let before = operator_defaults();
    let after = sandbox_on();
    let mut vm = gpu_labels();
    vm.insert(
        "nvidia.com/gpu.workload.config".into(),
        Workload::VmPassthrough.name().into(),
    );
    let groups = [group(gpu_labels(), &["c-0"]), group(vm, &["vm-0", "vm-1"])];
    let v = over(&cp_review(&before, &after, None), &groups);
    let relabel: Vec<&Finding> = v
        .findings
        .iter()
        .filter(|f| f.rule == Rule::SandboxRelabel)
        .collect();
    assert_eq!(relabel.len(), 1, "{:?}", v.findings);
    let m = &relabel[0].message;
    assert!(m.contains("sandboxWorkloads.enabled false -> true"), "{m}");
    assert!(m.contains("2 nodes") && m.contains("(vm-0, vm-1)"), "{m}");
    assert!(
        m.contains("-device-plugin") && m.contains("+sandbox-validator"),
        "{m}"
    );
    assert!(
        !m.contains("c-0"),
        "container nodes keep their operands: {m}"
    );
    assert_eq!(v.decision, Decision::Allowed);
    // The vm nodes lose the driver: said as what the change does, not as a driver switch.
    let lost: Vec<&Finding> = v
        .findings
        .iter()
        .filter(|f| f.rule == Rule::DriverRemoved)
        .collect();
    assert_eq!(lost.len(), 1, "{:?}", v.findings);
    let m = &lost[0].message;
    assert!(
        m.contains(
            "the sandboxWorkloads change gives them a workload whose label set has no driver"
        ) && !m.contains("spec.driver.enabled"),
        "{m}"
    );
}

/// The operator's defaults with `sandboxWorkloads.enabled` (KubeVirt mode).
fn sandbox_on() -> ClusterFacts {
    switched(|f| {
        f.sandbox = Sandbox {
            enabled: true,
            default_workload: None,
            mode: SandboxMode::KubeVirt,
        };
        f.disabled = crate::core::facts::switched_off(|field, default| {
            Ok::<_, std::convert::Infallible>(if field == crate::core::facts::SANDBOX_WORKLOADS {
                true
            } else {
                default
            })
        })
        .unwrap();
    })
}

fn driver(name: &str, selector: &[(&str, &str)]) -> NvidiaDriver {
    NvidiaDriver {
        name: name.into(),
        node_selector: Some(
            selector
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        ),
        vgpu_host_manager: false,
        precompiled: false,
        default: false,
        tolerations: Vec::new(),
    }
}

fn nd_review<'a>(
    facts: &'a ClusterFacts,
    operation: Operation,
    before: Option<&'a NvidiaDriver>,
    after: Option<&'a NvidiaDriver>,
    others: &'a [NvidiaDriver],
) -> PolicyReview<'a> {
    PolicyReview {
        kind: PolicyKind::NvidiaDriver,
        name: after.or(before).map_or("", |d| d.name.as_str()),
        operation,
        username: "alice",
        groups: &[],
        dry_run: false,
        change: PolicyChange::NvidiaDriver {
            facts,
            before,
            after,
            others,
        },
    }
}

/// NVIDIADriver resources in charge and listed (the other NVIDIADrivers are known).
fn listed_drivers(f: &mut ClusterFacts) {
    f.driver_crd = true;
    f.nvidia_drivers = Some(Vec::new());
}

#[test]
fn overlapping_nvidiadrivers_are_denied_naming_both_and_a_node() {
    let facts = switched(listed_drivers);
    let pool = |p: &str| gpu_labels_with("example.com/pool", p);
    let groups = [
        group(pool("a"), &["a-0", "a-1"]),
        group(pool("b"), &["b-0"]),
    ];
    let existing = [driver("pool-a", &[("example.com/pool", "a")])];
    let everything = driver("everything", &[]);
    let v = decide_policy(
        &nd_review(
            &facts,
            Operation::Create,
            None,
            Some(&everything),
            &existing,
        ),
        Fleet::Known {
            groups: &groups,
            keeps: &|_| true,
        },
        &Policy::default(),
    );
    assert_eq!(v.decision, Decision::Denied);
    let m = v.message.unwrap();
    assert!(
        m.starts_with("NVIDIADriver everything: its nodeSelector selects 2 nodes that NVIDIADriver pool-a selects too (a-0, a-1)"),
        "{m}"
    );
    // An NVIDIADriver without a nodeSelector claims every GPU node: it overlaps pool-a too.
    let default = NvidiaDriver {
        name: "default".into(),
        node_selector: None,
        vgpu_host_manager: false,
        precompiled: false,
        default: false,
        tolerations: Vec::new(),
    };
    let v = over(
        &nd_review(&facts, Operation::Create, None, Some(&default), &existing),
        &groups,
    );
    assert_eq!(v.decision, Decision::Denied);
    // Disjoint selectors pass.
    let b = driver("pool-b", &[("example.com/pool", "b")]);
    let v = over(
        &nd_review(&facts, Operation::Create, None, Some(&b), &existing),
        &groups,
    );
    assert_eq!(v.decision, Decision::Allowed, "{:?}", v.message);
    assert!(v.findings.is_empty(), "{:?}", v.findings);
}

#[test]
fn a_selector_on_a_label_the_records_lack_is_refused_until_they_hold_it() {
    let facts = switched(listed_drivers);
    // The records without the label (they do not keep it), and with it.
    let lacking = [group(gpu_labels(), &["a-0"])];
    let holding = [group(
        gpu_labels_with("kubernetes.io/hostname", "a-0"),
        &["a-0"],
    )];
    let existing = [driver("all", &[])];
    let by_host = driver("one", &[("kubernetes.io/hostname", "a-0")]);
    let decide =
        |groups: &[NodeGroup<'_>], keeps: &dyn Fn(&str) -> bool, others: &[NvidiaDriver]| {
            decide_policy(
                &nd_review(&facts, Operation::Create, None, Some(&by_host), others),
                Fleet::Known { groups, keeps },
                &Policy::default(),
            )
        };
    let not_kept = |k: &str| k != "kubernetes.io/hostname";
    let v = decide(&lacking, &not_kept, &existing);
    assert_eq!(v.decision, Decision::Denied);
    let m = v.message.unwrap();
    assert_eq!(
        m,
        "NVIDIADriver one: its nodeSelector reads kubernetes.io/hostname, which the guard had not \
         read from the nodes: which nodes it selects, and so its overlap with the other NVIDIADrivers, \
         cannot be checked yet; the guard reads that label from the nodes now: retry in a few seconds."
    );
    // Once the records hold the label, the overlap itself is judged: "all" selects a-0 too.
    let v = decide(&holding, &|_| true, &existing);
    assert_eq!(v.decision, Decision::Denied);
    assert!(
        v.message.as_deref().is_some_and(|m| m.starts_with(
            "NVIDIADriver one: its nodeSelector selects 1 node that NVIDIADriver all selects too (a-0)"
        )),
        "{:?}",
        v.message
    );
    // Alone, it can overlap nothing: nothing went unchecked.
    let v = decide(&lacking, &not_kept, &[]);
    assert_eq!(v.decision, Decision::Allowed, "{:?}", v.message);
}

#[test]
fn an_nvidiadriver_deleted_or_narrowed_warns_for_the_nodes_left_without_a_driver() {
    let facts = switched(|f| f.driver_crd = true);
    let pool = |p: &str| gpu_labels_with("example.com/pool", p);
    let groups = [group(pool("a"), &["a-0"]), group(pool("b"), &["b-0"])];
    let all = driver("all", &[]);
    let v = over(
        &nd_review(&facts, Operation::Delete, Some(&all), None, &[]),
        &groups,
    );
    assert_eq!(v.decision, Decision::Allowed);
    assert_eq!(
        v.warnings,
        ["NVIDIADriver all: 2 nodes lose the driver DaemonSet (a-0, b-0)"]
    );
    let narrowed = driver("all", &[("example.com/pool", "a")]);
    let v = over(
        &nd_review(&facts, Operation::Update, Some(&all), Some(&narrowed), &[]),
        &groups,
    );
    assert_eq!(
        v.warnings,
        ["NVIDIADriver all: 1 node loses the driver DaemonSet (b-0)"]
    );
    assert!(v.findings[0].message.contains("no longer selects them"));
    // Before v26.3 a pool the new selector still renders (a-0 and b-0 run the same OS) keeps
    // its DaemonSet, updated in place: b-0 loses it all the same.
    let old = switched(|f| {
        f.driver_crd = true;
        at("v25.10.1")(f);
    });
    let v = over(
        &nd_review(&old, Operation::Update, Some(&all), Some(&narrowed), &[]),
        &groups,
    );
    assert_eq!(
        v.warnings,
        ["NVIDIADriver all: 1 node loses the driver DaemonSet (b-0)"]
    );
    // A pool it no longer renders (b-0 on another OS) keeps its DaemonSet, with the old
    // selector, before v26.3: nothing is lost; from v26.3 it is deleted.
    let mut rhel = pool("b");
    rhel.insert(NFD_OS_ID.into(), "rhel".into());
    let split = [group(pool("a"), &["a-0"]), group(rhel, &["b-0"])];
    let v = over(
        &nd_review(&old, Operation::Update, Some(&all), Some(&narrowed), &[]),
        &split,
    );
    assert!(v.warnings.is_empty(), "{:?}", v.warnings);
    let v = over(
        &nd_review(&facts, Operation::Update, Some(&all), Some(&narrowed), &[]),
        &split,
    );
    assert_eq!(
        v.warnings,
        ["NVIDIADriver all: 1 node loses the driver DaemonSet (b-0)"]
    );
    // Another NVIDIADriver still selects pool b: nothing is lost.
    let others = [driver("b", &[("example.com/pool", "b")])];
    let v = decide_policy(
        &nd_review(
            &facts,
            Operation::Update,
            Some(&all),
            Some(&narrowed),
            &others,
        ),
        Fleet::Known {
            groups: &groups,
            keeps: &|_| true,
        },
        &Policy::default(),
    );
    assert!(v.warnings.is_empty(), "{:?}", v.warnings);
}

#[test]
fn the_operator_s_service_accounts_are_exempt_and_warn_mode_lowers() {
    let before = operator_defaults();
    let after = switched(toolkit_off);
    let groups = [group(gpu_labels(), &["gpu-0"])];
    let mut review = cp_review(&before, &after, None);
    review.username = "system:serviceaccount:gpu-operator:gpu-operator";
    let v = over(&review, &groups);
    assert_eq!(v.decision, Decision::Exempt);
    assert!(v.would_deny.is_some());
    let policy = Policy {
        mode: policy::Mode::Warn,
        ..Policy::default()
    };
    let v = decide_policy(
        &cp_review(&before, &after, None),
        Fleet::Known {
            groups: &groups,
            keeps: &|_| true,
        },
        &policy,
    );
    assert_eq!(v.decision, Decision::Allowed);
    // toolkit-switched-off lowered to a warning, which says what the toolkit's exit does.
    assert_eq!(v.warnings.len(), 1, "{:?}", v.warnings);
}

#[test]
fn a_second_cluster_policy_warns_that_the_operator_ignores_it() {
    let facts = operator_defaults();
    let others = ["cluster-policy".to_owned()];
    let review = PolicyReview {
        name: "another",
        operation: Operation::Create,
        change: PolicyChange::ClusterPolicy {
            before: &facts,
            after: &facts,
            host_toolkit: None,
            others: &others,
            drivers: &[],
        },
        ..cp_review(&facts, &facts, None)
    };
    let v = over(&review, &[]);
    assert_eq!(v.decision, Decision::Allowed);
    assert_eq!(v.findings[0].rule, Rule::ClusterPolicyIgnored);
}

#[test]
fn a_switch_off_that_leaves_operands_waiting_is_a_new_state_finding() {
    // The validator switched off: operands that wait for toolkit-ready hang (operand-without-validator).
    let before = operator_defaults();
    let after = switched(|f| {
        f.disabled.insert(Operand::OperatorValidator);
    });
    let groups = [group(gpu_labels(), &["gpu-0"])];
    let v = over(&cp_review(&before, &after, None), &groups);
    let ids: Vec<&str> = v.findings.iter().map(|f| f.rule.id()).collect();
    // Whatever the state rules conclude, a finding present before is never repeated.
    let same = over(&cp_review(&after, &after, None), &groups);
    assert!(same.findings.is_empty(), "{:?}", same.findings);
    assert!(ids.iter().all(|id| Rule::from_id(id).is_some()), "{ids:?}");
}

#[test]
fn fifteen_thousand_nodes_in_few_groups_are_named_and_counted() {
    let before = operator_defaults();
    let after = switched(toolkit_off);
    let names = fleet_of(15_000);
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let groups = [group(gpu_labels(), &refs)];
    let v = over(&cp_review(&before, &after, None), &groups);
    let m = v.message.unwrap();
    assert!(
        m.contains("on 15000 nodes (gpu-000, gpu-001, gpu-002, gpu-003, gpu-004 and 14995 more)"),
        "{m}"
    );
    assert!(m.len() < 1000, "{} bytes", m.len());
}

#[test]
fn what_runs_now_counts_not_what_a_pass_would_sweep_anyway() {
    // A node the operator's pass would strip (gpu.present without an NFD label) still runs
    // what its labels say until then: switching the toolkit off under it is refused.
    let mut labels = gpu_labels();
    labels.remove(NFD.0);
    let before = operator_defaults();
    let after = switched(toolkit_off);
    let groups = [group(labels, &["lab-node-0"])];
    let v = over(&cp_review(&before, &after, None), &groups);
    assert_eq!(v.decision, Decision::Denied, "{:?}", v.findings);
}

#[test]
fn shifts_say_where_each_operand_starts_and_stops() {
    let before = operator_defaults();
    let both = both_off();
    let groups = [
        group(gpu_labels(), &["gpu-1", "gpu-0"]),
        group(labels(&[]), &["cpu-0"]),
    ];
    let s = shifts(&cp_review(&before, &both, None), &groups);
    let of = |op: Operand| s.iter().find(|s| s.operand == op).cloned();
    let toolkit = of(Operand::ContainerToolkit).expect("the toolkit ran before");
    assert_eq!((toolkit.before, toolkit.after), (2, 0));
    assert_eq!(toolkit.stops, ["gpu-0", "gpu-1"], "sorted");
    assert!(toolkit.starts.is_empty());
    assert_eq!(of(Operand::DevicePlugin).map(|s| s.after), Some(0));
    // Unchanged operands are there with equal counts and no node lists.
    let dcgm = of(Operand::DcgmExporter).expect("dcgm-exporter runs");
    assert_eq!((dcgm.before, dcgm.after), (2, 2));
    assert!(dcgm.starts.is_empty() && dcgm.stops.is_empty());
    // A node without deploy labels runs nothing, before or after.
    assert!(
        s.iter()
            .all(|s| !s.starts.iter().chain(&s.stops).any(|n| n == "cpu-0"))
    );

    // Switching the driver off stops it where it ran; switching it on starts it there.
    let driver_on = switched(|f| {
        f.disabled.remove(Operand::Driver);
    });
    let driver_off = switched(|f| {
        f.disabled.insert(Operand::Driver);
    });
    let off = shifts(&cp_review(&driver_on, &driver_off, None), &groups);
    let d = off.iter().find(|s| s.operand == Operand::Driver).unwrap();
    assert_eq!((d.before, d.after, d.stops.len()), (2, 0, 2));
    let on = shifts(&cp_review(&driver_off, &driver_on, None), &groups);
    let d = on.iter().find(|s| s.operand == Operand::Driver).unwrap();
    assert_eq!((d.before, d.after, d.starts.len()), (0, 2, 2));

    // Nothing runs anywhere: no shift at all.
    assert!(
        shifts(
            &cp_review(&both, &both, None),
            &[group(labels(&[]), &["cpu-0"])]
        )
        .is_empty()
    );
}

#[test]
fn shifts_follow_the_relabelling_a_sandbox_change_makes() {
    let before = operator_defaults();
    let after = sandbox_on();
    let mut vm = gpu_labels();
    vm.insert(
        "nvidia.com/gpu.workload.config".into(),
        Workload::VmPassthrough.name().into(),
    );
    let groups = [group(gpu_labels(), &["c-0"]), group(vm, &["vm-0"])];
    let s = shifts(&cp_review(&before, &after, None), &groups);
    let of = |op: Operand| s.iter().find(|s| s.operand == op).cloned().unwrap();
    assert_eq!(of(Operand::DevicePlugin).stops, ["vm-0"]);
    assert_eq!(of(Operand::DevicePlugin).after, 1, "c-0 keeps it");
    assert_eq!(of(Operand::SandboxValidator).starts, ["vm-0"]);
}

/// The findings of this rule.
fn of_rule(v: &Verdict, rule: Rule) -> Vec<&Finding> {
    v.findings.iter().filter(|f| f.rule == rule).collect()
}

#[test]
fn the_device_plugin_switched_off_warns_that_gpus_are_no_longer_advertised() {
    let before = operator_defaults();
    let both = both_off();
    let groups = [
        group(gpu_labels(), &["gpu-0", "gpu-1"]),
        group(labels(&[]), &["cpu-0"]),
    ];
    // The consistent change the toolkit refusal points to: allowed, and said.
    let v = over(&cp_review(&before, &both, None), &groups);
    assert_eq!(v.decision, Decision::Allowed, "{:?}", v.message);
    let found = of_rule(&v, Rule::DevicePluginSwitchedOff);
    assert_eq!(found.len(), 1, "{:?}", v.findings);
    let m = &found[0].message;
    assert!(
        m.contains("spec.devicePlugin.enabled true -> false")
            && m.contains("on 2 nodes (gpu-0, gpu-1)")
            && m.contains("no longer advertised"),
        "{m}"
    );
    assert!(!m.contains("cpu-0"), "{m}");
    // The toolkit that leaves with it removes the runtime the other operands' pods use.
    assert_eq!(
        v.warnings,
        [
            "ClusterPolicy cluster-policy: the device plugin stops on 2 nodes (gpu-0, gpu-1); their GPUs are no longer advertised",
            "ClusterPolicy cluster-policy: operand-without-toolkit on 2 nodes (gpu-0, gpu-1)"
        ]
    );
    // Switched back on, or already off, or only CPU nodes: nothing to say.
    let on = over(&cp_review(&both, &before, None), &groups);
    assert!(of_rule(&on, Rule::DevicePluginSwitchedOff).is_empty());
    let cpu = [group(labels(&[]), &["cpu-0"])];
    assert!(
        of_rule(
            &over(&cp_review(&before, &both, None), &cpu),
            Rule::DevicePluginSwitchedOff
        )
        .is_empty()
    );
}

#[test]
fn handing_the_driver_back_to_the_cluster_policy_warns_for_nodes_nvidiadrivers_still_serve() {
    for (version, kept) in [
        ("v25.3.4", "goes on reconciling them"),
        ("v26.3.3", "sets them disabled and leaves their DaemonSets"),
    ] {
        let era = at(version);
        let before = switched(|f| {
            era(f);
            f.driver_crd = true;
        });
        let after = switched(era);
        let a100 = gpu_labels_with("nvidia.com/gpu.product", "A100");
        let drivers = [driver("a100", &[("nvidia.com/gpu.product", "A100")])];
        let groups = [group(a100, &["a-0", "a-1"]), group(gpu_labels(), &["h-0"])];
        let review = cp_review_with_drivers(&before, &after, &drivers);
        let v = over(&review, &groups);
        assert_eq!(v.decision, Decision::Allowed);
        let found = of_rule(&v, Rule::DriverSelectedTwice);
        assert_eq!(found.len(), 1, "{version}: {:?}", v.findings);
        let m = &found[0].message;
        assert!(
            m.contains("driver.useNvidiaDriverCRD true -> false")
                && m.contains("on 2 nodes (a-0, a-1)")
                && m.contains("NVIDIADriver a100")
                && m.contains(kept),
            "{version}: {m}"
        );
        assert!(!m.contains("h-0"), "no NVIDIADriver serves h-0: {m}");
        // With the ClusterPolicy's driver switched off, nothing comes back.
        let off = switched(|f| {
            era(f);
            f.disabled.insert(Operand::Driver);
        });
        let review = cp_review_with_drivers(&before, &off, &drivers);
        assert!(of_rule(&over(&review, &groups), Rule::DriverSelectedTwice).is_empty());
    }
}

#[test]
fn the_nri_plugin_switched_on_warns_that_the_runtime_classes_go_from_v26_3() {
    for (version, warns) in [("v25.10.1", false), ("v26.3.3", true), ("v26.7.0", true)] {
        let era = at(version);
        let before = switched(era);
        let after = switched(|f| {
            era(f);
            f.nri_plugin = true;
        });
        let groups = [group(gpu_labels(), &["gpu-0"])];
        let v = over(&cp_review(&before, &after, None), &groups);
        assert_eq!(v.decision, Decision::Allowed);
        let found = of_rule(&v, Rule::RuntimeClassesRemoved);
        assert_eq!(
            found.len(),
            usize::from(warns),
            "{version}: {:?}",
            v.findings
        );
        if warns {
            let m = &found[0].message;
            assert!(
                m.contains("nvidia, nvidia-cdi and nvidia-legacy")
                    && m.contains("runtimeClassName: nvidia")
                    && m.contains("on 1 node"),
                "{m}"
            );
        }
        // Turned off again, or left on: nothing is deleted.
        assert!(
            of_rule(
                &over(&cp_review(&after, &before, None), &groups),
                Rule::RuntimeClassesRemoved
            )
            .is_empty()
        );
        assert!(
            of_rule(
                &over(&cp_review(&after, &after, None), &groups),
                Rule::RuntimeClassesRemoved
            )
            .is_empty()
        );
    }
}

#[test]
fn a_node_without_nfd_os_labels_is_in_no_pool_and_gets_no_nvidiadriver_pod() {
    let facts = switched(|f| f.driver_crd = true);
    let mut bare = gpu_labels();
    for k in crate::core::operands::NFD_OS_KEYS {
        bare.remove(k);
    }
    let groups = [
        group(gpu_labels(), &["os-0"]),
        group(bare.clone(), &["bare-0"]),
    ];
    // Deleting the NVIDIADriver takes the driver from the pooled node only: the other had none.
    let all = driver("all", &[]);
    let v = over(
        &nd_review(&facts, Operation::Delete, Some(&all), None, &[]),
        &groups,
    );
    assert_eq!(
        v.warnings,
        ["NVIDIADriver all: 1 node loses the driver DaemonSet (os-0)"]
    );
    // Its overlap check still counts the node (the operator's validator lists nodes by the
    // nodeSelector alone).
    let other = [driver("other", &[])];
    let v = over(
        &nd_review(&facts, Operation::Create, None, Some(&all), &other),
        &[group(bare, &["bare-0"])],
    );
    assert_eq!(v.decision, Decision::Denied, "{:?}", v.findings);
    // usePrecompiled pools need NFD's kernel label as well.
    let mut precompiled = driver("pre", &[]);
    precompiled.precompiled = true;
    let mut kernel = gpu_labels();
    kernel.insert(
        crate::core::operands::NFD_KERNEL_KEY.into(),
        "5.15.0-1026-nvidia".into(),
    );
    let newest = crate::core::era::OperatorVersion::newest();
    assert!(!precompiled.selects(&gpu_labels(), &newest));
    assert!(precompiled.selects(&kernel, &newest));
}

/// A `vgpu-host-manager` NVIDIADriver's DaemonSets select the vGPU manager's deploy label from
/// v24.3; in v23.9 they select the driver's, like every other type.
#[test]
fn a_vgpu_host_manager_driver_selects_the_driver_label_in_v23_9() {
    use crate::core::era::OperatorVersion;
    let mut host = driver("host", &[]);
    host.vgpu_host_manager = true;
    let driver_only = gpu_labels();
    let mut vgpu_only = gpu_labels();
    vgpu_only.remove(DRIVER_DEPLOY_KEY);
    vgpu_only.insert(VGPU_MANAGER_DEPLOY_KEY.into(), "true".into());
    let v = |t: &str| OperatorVersion::parse(t).unwrap();
    assert!(host.selects(&driver_only, &v("v23.9.2")));
    assert!(!host.selects(&vgpu_only, &v("v23.9.2")));
    assert!(!host.selects(&driver_only, &v("v24.3.0")));
    assert!(host.selects(&vgpu_only, &v("v24.3.0")));
}

#[test]
fn from_v26_7_a_default_nvidiadriver_shares_nodes_without_conflict_but_two_defaults_do_not() {
    let v26_7 = switched(listed_drivers);
    let v26_3 = switched(|f| {
        listed_drivers(f);
        at("v26.3.3")(f);
    });
    let pool_a = gpu_labels_with("example.com/pool", "a");
    let groups = [group(pool_a, &["a-0"]), group(gpu_labels(), &["h-0"])];
    let mut fallback = driver("fallback", &[]);
    fallback.default = true;
    let pinned = [driver("pool-a", &[("example.com/pool", "a")])];
    let v = over(
        &nd_review(&v26_7, Operation::Create, None, Some(&fallback), &pinned),
        &groups,
    );
    assert_eq!(v.decision, Decision::Allowed, "{:?}", v.findings);
    assert!(of_rule(&v, Rule::NvidiaDriverOverlap).is_empty());
    // Before v26.7 there is no default: the same two claim a-0 both.
    let v = over(
        &nd_review(&v26_3, Operation::Create, None, Some(&fallback), &pinned),
        &groups,
    );
    assert_eq!(v.decision, Decision::Denied);
    // Two defaults conflict.
    let mut second = driver("second", &[]);
    second.default = true;
    let v = over(
        &nd_review(
            &v26_7,
            Operation::Create,
            None,
            Some(&second),
            &[fallback.clone()],
        ),
        &groups,
    );
    assert_eq!(v.decision, Decision::Denied, "{:?}", v.findings);
}

/// v26.7: a ClusterPolicy created while a GPUCluster exists (or a GPUCluster while a
/// ClusterPolicy exists, the next test) stops the operator: refused, and nothing else is judged;
/// a change of either while both exist is said, and a ClusterPolicy change is judged too as it
/// will act once the GPUCluster goes; before v26.7 a GPUCluster means nothing.
#[test]
fn a_cluster_policy_and_a_gpu_cluster_at_once_are_refused() {
    use crate::core::operands::Stack;
    let mut both = operator_defaults();
    both.stack = Stack::Both;
    let groups = [group(gpu_labels(), &["gpu-0"])];
    // A ClusterPolicy created next to the GPUCluster.
    let create = PolicyReview {
        operation: Operation::Create,
        ..cp_review(&both, &both, None)
    };
    let v = over(&create, &groups);
    assert_eq!(v.decision, Decision::Denied);
    assert_eq!(v.findings.len(), 1, "{:?}", v.findings);
    assert_eq!(v.findings[0].rule, Rule::GpuClusterConflict);
    assert_eq!(
        v.findings[0].message,
        "ClusterPolicy cluster-policy: GPUCluster gpu-cluster exists, and the GPU Operator (v26.7) \
         reconciles neither while both exist: it labels no node and deploys nothing until one is \
         deleted; delete GPUCluster gpu-cluster first, or do not create ClusterPolicy cluster-policy."
    );
    // Its toolkit switched off while both exist: nothing happens now, but it takes effect as
    // soon as the GPUCluster goes, so it is judged as if the ClusterPolicy were alone.
    let tk_off = switched(|f| {
        toolkit_off(f);
        f.stack = Stack::Both;
    });
    let v = over(&cp_review(&both, &tk_off, None), &groups);
    assert_eq!(v.decision, Decision::Denied);
    assert_eq!(
        v.findings.iter().map(|f| f.rule).collect::<Vec<_>>(),
        [Rule::GpuClusterConflict, Rule::ToolkitSwitchedOff]
    );
    assert_eq!(v.findings[0].action, Action::Warn);
    assert_eq!(v.findings[1].action, Action::Deny);
    // An edit that changes nothing the decision reads is only said.
    let v = over(&cp_review(&both, &both, None), &groups);
    assert_eq!(v.decision, Decision::Allowed);
    assert_eq!(
        v.findings.iter().map(|f| f.rule).collect::<Vec<_>>(),
        [Rule::GpuClusterConflict]
    );
    // Before v26.7 the operator knows no GPUCluster: the ClusterPolicy is judged as ever.
    let old = switched(|f| {
        f.stack = Stack::Both;
        at("v25.3.4")(f);
    });
    let old_off = switched(|f| {
        toolkit_off(f);
        f.stack = Stack::Both;
        at("v25.3.4")(f);
    });
    let v = over(&cp_review(&old, &old_off, None), &groups);
    assert_eq!(v.decision, Decision::Denied);
    assert_eq!(v.findings[0].rule, Rule::ToolkitSwitchedOff);
}

/// v26.7: a GPUCluster created while a ClusterPolicy exists, or while whether one exists is not
/// known, is refused; without a ClusterPolicy, or deleted, nothing is said.
#[test]
fn a_gpu_cluster_next_to_a_cluster_policy_is_refused() {
    use crate::core::facts::PolicySource;
    let groups = [group(gpu_labels(), &["gpu-0"])];
    // A GPUCluster created while ClusterPolicy cluster-policy exists.
    let mut policy = operator_defaults();
    policy.source = PolicySource::Found("cluster-policy".into());
    let gc = |operation, cluster_policy| PolicyReview {
        kind: PolicyKind::GpuCluster,
        name: "gpu-cluster",
        operation,
        change: PolicyChange::GpuCluster {
            facts: &policy,
            after: &policy,
            cluster_policy,
        },
        ..cp_review(&policy, &policy, None)
    };
    let v = over(&gc(Operation::Create, Some("cluster-policy")), &groups);
    assert_eq!(v.decision, Decision::Denied);
    assert!(
        v.findings[0]
            .message
            .starts_with("GPUCluster gpu-cluster: ClusterPolicy cluster-policy exists"),
        "{}",
        v.findings[0].message
    );
    // Without a ClusterPolicy, or deleted: nothing to say.
    assert!(
        over(&gc(Operation::Create, None), &groups)
            .findings
            .is_empty()
    );
    assert!(
        over(&gc(Operation::Delete, Some("cluster-policy")), &groups)
            .findings
            .is_empty()
    );
    // Whether a ClusterPolicy exists is not known: the GPUCluster could make both.
    let mut unknown = operator_defaults();
    unknown.source = PolicySource::Forbidden("RBAC forbids listing clusterpolicies".into());
    let review = PolicyReview {
        kind: PolicyKind::GpuCluster,
        name: "gpu-cluster",
        operation: Operation::Create,
        change: PolicyChange::GpuCluster {
            facts: &unknown,
            after: &unknown,
            cluster_policy: None,
        },
        ..cp_review(&unknown, &unknown, None)
    };
    let v = over(&review, &groups);
    assert_eq!(v.decision, Decision::Denied);
    let m = &v.findings[0].message;
    assert!(
        m.starts_with("GPUCluster gpu-cluster: whether a ClusterPolicy exists is not known"),
        "{m}"
    );
    assert!(
        m.ends_with(
            "reconciles neither while both exist: retry once the guard can read the ClusterPolicies."
        ),
        "{m}"
    );
    assert!(!m.contains("  "), "one space between words: {m}");
}

#[test]
fn an_nvidiadriver_is_refused_while_the_others_are_not_known() {
    let facts = switched(|f| f.driver_crd = true);
    assert_eq!(facts.nvidia_drivers, None);
    let groups = [group(gpu_labels(), &["a-0"])];
    let pool = driver("pool", &[("example.com/pool", "a")]);
    let v = over(
        &nd_review(&facts, Operation::Create, None, Some(&pool), &[]),
        &groups,
    );
    assert_eq!(v.decision, Decision::Denied);
    let m = v.message.unwrap();
    assert!(
        m.starts_with(
            "NVIDIADriver pool: overlap not checked: the other NVIDIADrivers are not known"
        ),
        "{m}"
    );
    assert!(!m.contains("  "), "one space between words: {m}");
    // Deleting one cannot make an overlap.
    let v = over(
        &nd_review(&facts, Operation::Delete, Some(&pool), None, &[]),
        &groups,
    );
    assert_ne!(v.decision, Decision::Denied);
}

mod rollout;
mod versions;
