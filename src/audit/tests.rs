//! The audit on the lab of docs/gpu-operator.md (fixtures made by
//! `tests/fixtures/audit/make-audit.py`), then one case per behaviour.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::*;
use crate::audit::output;
use crate::audit::report::{self, Outcome, Timestamp};
use crate::core::facts::{PolicySource, operator_defaults};
use crate::core::operator::OperatorVersion;
use crate::core::rules::Severity;
use crate::core::version::VersionSource;
use crate::k8s::daemonset::{custom_selectors, operands_present};
use crate::k8s::list as files;
use crate::k8s::read;

fn fixture(case: &str, file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/audit")
        .join(case)
        .join(file)
}

fn lab(case: &str) -> (Vec<NodeView>, Vec<PodView>) {
    let nodes = files::read_nodes(&fixture(case, "nodes.json")).unwrap();
    let pods = files::read_pods(&fixture(case, "pods.json")).unwrap();
    (nodes, pods)
}

fn run(case: &str) -> AuditReport {
    let (nodes, pods) = lab(case);
    audit(&nodes, &pods, &operator_defaults(), &Policy::default())
}

pub(super) fn node(name: &str, labels: &[(&str, &str)]) -> NodeView {
    let mut n = NodeView::default();
    n.metadata.name = Some(name.to_owned());
    n.metadata.labels = Some(crate::core::policy::tests::labels(labels));
    n
}

fn pod(name: &str, ds: &str, node: &str, phase: PodPhase) -> PodView {
    let mut p = PodView {
        node: Some(node.to_owned()),
        phase,
        daemonset: Some(ds.to_owned()),
        app: Some(ds.to_owned()),
        owned: true,
        ..PodView::default()
    };
    p.metadata.name = Some(name.to_owned());
    p
}

const RUNNING: PodPhase = PodPhase::Running;

// ---- the lab -------------------------------------------------------------------------------

#[test]
fn the_lab_as_set_up_is_clean() {
    let r = run("lab");
    assert_eq!(
        output::lines(&r),
        "lab-node-0 OK\nlab-node-1 OK\nlab-node-2 OK\n"
    );
    assert_eq!(r.exit_code(), 0);
    assert_eq!(
        output::matrix(&r),
        "lab-node-0 driver=yes toolkit=yes device-plugin=yes gfd=yes dcgm=yes\n\
         lab-node-1 driver=no toolkit=yes device-plugin=yes gfd=yes dcgm=yes\n\
         lab-node-2 driver=no toolkit=no device-plugin=no gfd=no dcgm=no\n\
         TOTAL_PODS=9\n"
    );
    assert!(r.nodes.iter().all(|n| n.findings.is_empty()));
}

#[test]
fn operands_a_taint_holds_are_named_in_lines_and_matrix() {
    use crate::core::placement::{Effect, Taint};
    let (mut nodes, pods) = lab("lab");
    // lab-node-0 quarantined (NoSchedule): its pods stay, none is re-created; lab-node-1
    // under NoExecute: its operand pods are evicted (the pods in the file are not gone yet).
    nodes[0].placement.taints = vec![Taint::new(
        "nvidia.com/gpu-xid-error",
        "79",
        Effect::NoSchedule,
    )];
    nodes[1].placement.taints = vec![Taint::new("example.com/drain", "", Effect::NoExecute)];
    let r = audit(&nodes, &pods, &operator_defaults(), &Policy::default());
    let lines = output::lines(&r);
    for want in [
        "lab-node-0 PLACEMENT container-toolkit stays-not-recreated\n",
        "lab-node-0 PLACEMENT device-plugin stays-not-recreated\n",
        "lab-node-1 PLACEMENT container-toolkit evicted\n",
    ] {
        assert!(lines.contains(want), "{want:?} not in\n{lines}");
    }
    assert!(!lines.contains("lab-node-2 PLACEMENT"), "{lines}");
    let matrix = output::matrix(&r);
    let row0 = matrix.lines().next().unwrap();
    assert!(
        row0.starts_with(
            "lab-node-0 driver=yes toolkit=yes device-plugin=yes gfd=yes dcgm=yes PLACEMENT="
        ) && row0.contains("toolkit:stays-not-recreated"),
        "{matrix}"
    );
    assert!(
        matrix.contains("\nlab-node-2 driver=no toolkit=no device-plugin=no gfd=no dcgm=no\n"),
        "{matrix}"
    );
    // The toolkit that would not come back under the device plugin is a finding.
    assert!(
        r.node("lab-node-0")
            .unwrap()
            .findings
            .iter()
            .any(|f| f.rule == Rule::ToolkitNotRecreated)
    );
}

#[test]
fn device_plugin_alone_on_lab_node_2_is_a_broken_pairing() {
    let r = run("lab-device-plugin-only");
    assert_eq!(
        output::lines(&r),
        "lab-node-0 OK\nlab-node-1 OK\nlab-node-2 OK\nlab-node-2 device-plugin-without-toolkit\n"
    );
    assert_eq!(r.exit_code(), 1);
    assert_eq!(
        output::matrix(&r),
        "lab-node-0 driver=yes toolkit=yes device-plugin=yes gfd=yes dcgm=yes\n\
         lab-node-1 driver=no toolkit=yes device-plugin=yes gfd=yes dcgm=yes\n\
         lab-node-2 driver=no toolkit=no device-plugin=yes gfd=no dcgm=no\n\
         TOTAL_PODS=10\n"
    );
    assert_eq!(
        output::order_check(r.node("lab-node-2").unwrap()),
        ("device-plugin-without-toolkit\n".to_owned(), 1)
    );
    assert_eq!(
        output::order_check(r.node("lab-node-0").unwrap()),
        ("ok\n".to_owned(), 0)
    );
    let n2 = r.node("lab-node-2").unwrap();
    let rules: Vec<(&str, Level, Basis)> = n2
        .findings
        .iter()
        .map(|f| (f.rule.id(), f.level, f.basis))
        .collect();
    assert_eq!(
        rules,
        [
            ("device-plugin-without-toolkit", Level::Fail, Basis::Pods),
            ("device-plugin-on-non-gpu-node", Level::Warn, Basis::Labels),
        ]
    );
    assert_eq!(
        n2.findings[0].message,
        "node lab-node-2 runs the NVIDIA device plugin (pod nvidia-device-plugin-daemonset-efc45) but no \
         container toolkit pod runs there, so GPU pods scheduled there fail to start; set \
         nvidia.com/gpu.deploy.container-toolkit=true or nvidia.com/gpu.deploy.device-plugin=false."
    );
}

/// operand-not-running is a row of RULES like the others: its configured action sets the level
/// of its findings, and `off` leaves it out of the audit.
#[test]
fn operand_not_running_follows_its_configured_action() {
    let (nodes, pods) = lab("lab-gaps");
    let with = |action: Action| {
        let mut policy = Policy::default();
        policy.actions[Rule::OperandNotRunning as usize] = action;
        audit(&nodes, &pods, &operator_defaults(), &policy)
    };
    let levels = |r: &AuditReport| -> Vec<Level> {
        r.nodes
            .iter()
            .flat_map(|n| &n.findings)
            .filter(|f| f.rule == Rule::OperandNotRunning)
            .map(|f| f.level)
            .collect()
    };
    assert_eq!(levels(&with(Action::Deny)), [Level::Fail, Level::Fail]);
    assert_eq!(levels(&with(Action::Warn)), [Level::Warn, Level::Warn]);
    let off = with(Action::Off);
    assert!(levels(&off).is_empty());
    assert!(!off.rules.contains(&Rule::OperandNotRunning));
}

#[test]
fn gaps_are_listed_per_node_and_operand() {
    let r = run("lab-gaps");
    assert_eq!(
        output::lines(&r),
        "lab-node-0 MISSING dcgm-exporter\nlab-node-1 MISSING gpu-feature-discovery\nlab-node-2 OK\n"
    );
    assert_eq!(r.exit_code(), 1);
    let gfd = r
        .node("lab-node-1")
        .unwrap()
        .operand(Operand::GpuFeatureDiscovery)
        .unwrap();
    assert_eq!(
        gfd,
        &OperandState {
            placement: None,
            operand: Operand::GpuFeatureDiscovery,
            expected: true,
            running: false,
            pod: Some("gpu-feature-discovery-fbcda".to_owned()),
            phase: Some(PodPhase::Pending),
        }
    );
    let n1 = r.node("lab-node-1").unwrap();
    assert_eq!(n1.findings.len(), 1);
    assert_eq!(
        n1.findings[0].message,
        "node lab-node-1: expected operands are not running: gpu-feature-discovery \
         (nvidia.com/gpu.deploy.gpu-feature-discovery=true; pod gpu-feature-discovery-fbcda is Pending)."
    );
    assert_eq!(
        r.node("lab-node-0").unwrap().findings[0].message,
        "node lab-node-0: expected operands are not running: dcgm-exporter \
         (nvidia.com/gpu.deploy.dcgm-exporter=true; no pod)."
    );
    assert_eq!(r.count(Rule::OperandNotRunning), 2);
}

#[test]
fn real_daemonsets_narrow_what_is_expected_and_add_columns() {
    let (nodes, pods) = lab("lab-gaps");
    let ds = files::read_daemonsets(&fixture("lab-gaps", "daemonsets.json")).unwrap();
    let cluster = ClusterFacts {
        selectors: custom_selectors(&ds),
        source: PolicySource::NotGiven,
        daemonsets: Some(operands_present(&ds)),
        ..operator_defaults()
    };
    let r = audit(&nodes, &pods, &cluster, &Policy::default());
    // GFD's DaemonSet selects a pool no lab node is in: its Pending pod is no gap.
    assert_eq!(
        output::lines(&r),
        "lab-node-0 MISSING dcgm-exporter\nlab-node-1 OK\nlab-node-2 OK\n"
    );
    assert_eq!(
        output::matrix(&r),
        "lab-node-0 driver=yes toolkit=yes device-plugin=yes gfd=yes dcgm=no dcgm-hostengine=no\n\
         lab-node-1 driver=no toolkit=yes device-plugin=yes gfd=no dcgm=yes dcgm-hostengine=no\n\
         lab-node-2 driver=no toolkit=no device-plugin=no gfd=no dcgm=no dcgm-hostengine=no\n\
         TOTAL_PODS=7\n"
    );
    assert_eq!(
        r.node("lab-node-0").unwrap().findings[0].message,
        "node lab-node-0: expected operands are not running: dcgm-exporter \
         (nvidia.com/gpu.deploy.dcgm-exporter=true; no pod)."
    );
}

#[test]
fn a_host_provided_toolkit_makes_the_lone_device_plugin_normal() {
    let (nodes, mut pods) = lab("lab-device-plugin-only");
    pods.retain(|p| p.daemonset.as_deref() != Some("nvidia-container-toolkit-daemonset"));
    let cp = read::cluster_policy_file(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/audit/cluster-policy-host-toolkit.yaml"),
    )
    .unwrap();
    let cluster = ClusterFacts {
        source: PolicySource::Found(cp.name),
        daemonsets: None,
        ..cp.facts
    };
    let r = audit(&nodes, &pods, &cluster, &Policy::default());
    assert_eq!(
        output::lines(&r),
        "lab-node-0 OK\nlab-node-1 OK\nlab-node-2 OK\n"
    );
    assert_eq!(r.exit_code(), 0);
    let toolkit = r
        .node("lab-node-0")
        .unwrap()
        .operand(Operand::ContainerToolkit)
        .unwrap();
    assert!(!toolkit.expected, "switched off in the ClusterPolicy");
}

// ---- one behaviour each ----------------------------------------------------------------------

#[test]
fn a_running_pod_wins_over_a_terminated_one_on_the_same_node() {
    let nodes = [node(
        "n",
        &[("device-plugin", "true"), ("container-toolkit", "true")],
    )];
    let pods = [
        pod(
            "tk-old",
            "nvidia-container-toolkit-daemonset",
            "n",
            PodPhase::Failed,
        ),
        pod("tk-new", "nvidia-container-toolkit-daemonset", "n", RUNNING),
        pod("dp", "nvidia-device-plugin-daemonset", "n", RUNNING),
    ];
    let r = audit(&nodes, &pods, &operator_defaults(), &Policy::default());
    let tk = r.nodes[0].operand(Operand::ContainerToolkit).unwrap();
    assert_eq!(tk.pod.as_deref(), Some("tk-new"));
    assert!(tk.running);
    assert_eq!(r.exit_code(), 0);
    assert_eq!(r.running_daemonset_pods, 2);
}

#[test]
fn a_toolkit_pod_that_is_not_running_still_breaks_the_pairing() {
    let nodes = [node(
        "n",
        &[("device-plugin", "true"), ("container-toolkit", "true")],
    )];
    let pods = [
        pod(
            "tk",
            "nvidia-container-toolkit-daemonset",
            "n",
            PodPhase::Pending,
        ),
        pod("dp", "nvidia-device-plugin-daemonset", "n", RUNNING),
    ];
    let r = audit(&nodes, &pods, &operator_defaults(), &Policy::default());
    assert_eq!(
        output::lines(&r),
        "n MISSING container-toolkit\nn device-plugin-without-toolkit\n"
    );
    assert!(
        r.nodes[0].findings[0]
            .message
            .contains("but its container toolkit pod tk is Pending")
    );
}

#[test]
fn pods_without_owner_references_are_matched_by_their_app_label() {
    let nodes = [node("n", &[("dcgm-exporter", "true")])];
    let mut p = pod("exp", "nvidia-dcgm-exporter", "n", RUNNING);
    p.daemonset = None;
    p.owned = false;
    let r = audit(&nodes, &[p], &operator_defaults(), &Policy::default());
    assert!(r.nodes[0].running(Operand::DcgmExporter));
    assert_eq!(r.running_daemonset_pods, 1);
}

#[test]
fn unscheduled_pods_and_pods_of_other_nodes_count_only_in_the_total() {
    let nodes = [node("n", &[])];
    let mut unscheduled = pod("u", "nvidia-dcgm-exporter", "x", PodPhase::Pending);
    unscheduled.node = None;
    let elsewhere = pod("e", "nvidia-dcgm-exporter", "gone-node", RUNNING);
    let r = audit(
        &nodes,
        &[unscheduled, elsewhere],
        &operator_defaults(),
        &Policy::default(),
    );
    assert!(!r.nodes[0].running(Operand::DcgmExporter));
    assert_eq!(r.running_daemonset_pods, 1);
    assert_eq!(r.exit_code(), 0);
}

#[test]
fn only_the_exact_value_true_makes_an_operand_expected() {
    let nodes = [node(
        "n",
        &[
            ("driver", "pre-installed"),
            ("container-toolkit", "True"),
            ("device-plugin", "paused-for-mig-change"),
            ("nvsm", "true"),
        ],
    )];
    let r = audit(
        &nodes,
        &[] as &[PodView],
        &operator_defaults(),
        &Policy::default(),
    );
    assert_eq!(
        r.nodes[0].missing().count(),
        0,
        "nvsm has no operator DaemonSet"
    );
    assert_eq!(output::lines(&r), "n OK\n");
}

#[test]
fn an_operand_switched_off_or_without_a_daemonset_is_expected_nowhere() {
    let nodes = [node("n", &[("dcgm", "true"), ("mig-manager", "true")])];
    let mut cluster = operator_defaults();
    cluster.disabled.insert(Operand::Dcgm);
    cluster.daemonsets = Some(OperandSet::EMPTY);
    let r = audit(&nodes, &[] as &[PodView], &cluster, &Policy::default());
    assert_eq!(output::lines(&r), "n OK\n");
    cluster.daemonsets = Some([Operand::MigManager].into_iter().collect());
    let r = audit(&nodes, &[] as &[PodView], &cluster, &Policy::default());
    assert_eq!(output::lines(&r), "n MISSING mig-manager\n");
}

#[test]
fn without_a_cluster_policy_the_operators_default_switches_apply() {
    // The operator labels every GPU node node-status-exporter=true, yet runs it only when
    // spec.nodeStatusExporter.enabled is set: not a gap.
    let nodes = [node("n", &[("node-status-exporter", "true")])];
    let r = audit(
        &nodes,
        &[] as &[PodView],
        &operator_defaults(),
        &Policy::default(),
    );
    assert_eq!(output::lines(&r), "n OK\n");
}

#[test]
fn a_rule_switched_off_in_the_config_is_not_reported() {
    let (nodes, pods) = lab("lab-device-plugin-only");
    let mut policy = Policy::default();
    policy.actions[Rule::DevicePluginWithoutToolkit as usize] = Action::Off;
    let r = audit(&nodes, &pods, &operator_defaults(), &policy);
    assert_eq!(r.exit_code(), 0);
    assert!(!r.rules.contains(&Rule::DevicePluginWithoutToolkit));
    assert!(
        !r.node("lab-node-2")
            .unwrap()
            .has(Rule::DevicePluginWithoutToolkit)
    );
}

#[test]
fn nodes_come_out_sorted_by_name() {
    let nodes = [node("b", &[]), node("a", &[]), node("c", &[])];
    let r = audit(
        &nodes,
        &[] as &[PodView],
        &operator_defaults(),
        &Policy::default(),
    );
    assert_eq!(output::lines(&r), "a OK\nb OK\nc OK\n");
    assert!(r.node("b").is_some() && r.node("d").is_none());
}

#[test]
fn the_dcgm_column_is_the_exporter_and_the_host_engine_gets_its_own() {
    assert_eq!(Operand::DcgmExporter.column(), "dcgm");
    assert_eq!(Operand::Dcgm.column(), "dcgm-hostengine");
    assert_eq!(Operand::MigManager.column(), "mig-manager");
    // Without a DaemonSet list, a DaemonSet exists when one of its pods does.
    let nodes = [node("n", &[("dcgm", "true")])];
    let pods = [pod("d", "nvidia-dcgm", "n", RUNNING)];
    let r = audit(&nodes, &pods, &operator_defaults(), &Policy::default());
    assert_eq!(
        output::matrix(&r),
        "n driver=no toolkit=no device-plugin=no gfd=no dcgm=no dcgm-hostengine=yes\nTOTAL_PODS=1\n"
    );
}

#[test]
fn the_operator_version_decides_what_is_expected() {
    // kata-manager runs on one node; another is labelled for it and has no pod. Before v26.7 the
    // operator deploys kata-manager: a gap. From v26.7 it never does: nothing is expected.
    let nodes = [
        node("a", &[("kata-manager", "true")]),
        node("b", &[("kata-manager", "true")]),
    ];
    let pods = [pod("km", "nvidia-kata-manager", "a", RUNNING)];
    let given = ClusterFacts {
        operator: crate::core::version::Followed {
            version: OperatorVersion::parse("v24.9.2").unwrap(),
            source: VersionSource::Given("--operator-version".into()),
        },
        ..operator_defaults()
    };
    let r = audit(&nodes, &pods, &given, &Policy::default());
    assert_eq!(output::lines(&r), "a OK\nb MISSING kata-manager\n");
    let json: serde_json::Value = serde_json::from_str(&output::json(&r)).unwrap();
    assert_eq!(
        json["operatorVersion"],
        serde_json::json!({"version": "v24.9.2", "era": "v24.9", "source": "given",
            "message": "GPU Operator v24.9.2 given by --operator-version"})
    );
    assert_eq!(
        report::build(&r, at()).metadata.annotations[report::OPERATOR_VERSION_ANNOTATION],
        "GPU Operator v24.9.2 given by --operator-version"
    );
    let newest = audit(&nodes, &pods, &operator_defaults(), &Policy::default());
    assert_eq!(output::lines(&newest), "a OK\nb OK\n");
    let json: serde_json::Value = serde_json::from_str(&output::json(&newest)).unwrap();
    assert_eq!(json["operatorVersion"]["source"], "assumed");
}

// ---- JSON and the ClusterPolicyReport ----------------------------------------------------------

#[test]
fn json_output_has_every_fact_per_node_and_operand() {
    let mut r = run("lab-device-plugin-only");
    r.nodes.retain(|n| n.name == "lab-node-2");
    let expected =
        include_str!("../../tests/fixtures/audit/lab-device-plugin-only/lab-node-2.audit.json");
    assert_eq!(output::json(&r), expected);
}

fn at() -> Timestamp {
    Timestamp {
        seconds: 1_796_032_800,
        nanos: 0,
    }
}

#[test]
fn the_report_has_one_result_per_relevant_node_and_rule() {
    let r = run("lab-device-plugin-only");
    let rep = report::build(&r, at());
    // Three nodes take part (two GPUs, one with the plugin), twelve rules each.
    assert_eq!(rep.results.len(), 36);
    assert_eq!(
        (rep.summary.pass, rep.summary.fail, rep.summary.warn),
        (34, 1, 1)
    );
    let fail = rep
        .results
        .iter()
        .find(|x| x.result == Outcome::Fail)
        .unwrap();
    assert_eq!(fail.rule, "device-plugin-without-toolkit");
    assert_eq!(fail.severity, Severity::High);
    assert_eq!(fail.resources[0].name, "lab-node-2");
    // Only the operator version it followed: no result was left out.
    assert_eq!(
        rep.metadata.annotations,
        BTreeMap::from([(
            report::OPERATOR_VERSION_ANNOTATION,
            "GPU Operator v26.7 assumed (no GPU Operator version given or found)".to_owned()
        )])
    );
}

#[test]
fn the_report_yaml_follows_the_wgpolicyk8s_schema() {
    let nodes = [node(
        "n",
        &[
            ("device-plugin", "true"),
            ("nvidia.com/gpu.present", "true"),
            ("feature.node.kubernetes.io/pci-10de.present", "true"),
        ],
    )];
    let pods = [pod("dp", "nvidia-device-plugin-daemonset", "n", RUNNING)];
    let mut policy = Policy::default();
    for rule in [
        Rule::OperandWithoutToolkit,
        Rule::OperandWithoutValidator,
        Rule::OperandWithoutSandboxValidator,
        Rule::OperandWithoutDraDriver,
        Rule::DcgmExporterWithoutDcgm,
        Rule::DevicePluginOnNonGpuNode,
    ] {
        policy.actions[rule as usize] = Action::Off;
    }
    let cluster = ClusterFacts {
        source: PolicySource::Forbidden("RBAC forbids listing clusterpolicies.nvidia.com".into()),
        ..operator_defaults()
    };
    let r = audit(&nodes, &pods, &cluster, &policy);
    let expected = include_str!("../../tests/fixtures/audit/report-one-node.yaml");
    assert_eq!(report::build(&r, at()).to_yaml(), expected);
    // The same report as an openreports.io ClusterReport: only the API and kind differ
    // (tests/helm validates both files against their projects' CRDs).
    let open = report::build(&r, at())
        .in_format(report::Format::OpenReports)
        .to_yaml();
    let expected = include_str!("../../tests/fixtures/audit/report-one-node.openreports.yaml");
    assert_eq!(open, expected);
    let built = report::build(&r, at());
    assert_eq!(built.format(), report::Format::PolicyReport);
    let built = built.in_format(report::Format::OpenReports);
    assert_eq!(built.format(), report::Format::OpenReports);
    assert_eq!(
        open.replacen(
            "apiVersion: openreports.io/v1alpha1\nkind: ClusterReport\n",
            "apiVersion: wgpolicyk8s.io/v1alpha2\nkind: ClusterPolicyReport\n",
            1
        ),
        report::build(&r, at()).to_yaml()
    );
}

#[test]
fn a_huge_report_keeps_failures_and_counts_what_it_leaves_out() {
    let nodes: Vec<NodeView> = (0..1000)
        .map(|i| {
            node(
                &format!("gpu-{i:04}"),
                &[
                    ("nvidia.com/gpu.present", "true"),
                    ("feature.node.kubernetes.io/pci-10de.present", "true"),
                    ("driver", "true"),
                ],
            )
        })
        .collect();
    let r = audit(
        &nodes,
        &[] as &[PodView],
        &operator_defaults(),
        &Policy::default(),
    );
    let rep = report::build(&r, at());
    assert_eq!(rep.results.len(), report::MAX_RESULTS);
    assert_eq!(rep.summary.fail, 1000);
    assert_eq!(rep.summary.pass, 11_000);
    assert_eq!(
        rep.metadata
            .annotations
            .get(report::OMITTED_ANNOTATION)
            .map(String::as_str),
        Some("10000")
    );
    assert!(
        rep.results[..1000]
            .iter()
            .all(|x| x.result == Outcome::Fail)
    );

    // Kept as summaries, the same report: each listed node's audit is made again only for its
    // results (the 1,000 failures, then the passes of the first 91 nodes, 11 rules each), never
    // for the nodes left out.
    let summary = r.summary();
    let mut made = Vec::new();
    let again = report::build_from(
        &summary,
        |name| {
            made.push(name.to_owned());
            r.node(name).cloned()
        },
        at(),
    );
    assert_eq!(again, rep);
    assert_eq!(made.len(), 1000 + 91);
    assert_eq!(made[1000], "gpu-0000");
    assert_eq!(made.last().map(String::as_str), Some("gpu-0090"));

    // A node whose audit cannot be made again keeps its outcome, and says so.
    let blind = report::build_from(&summary, |_| None, at());
    assert_eq!(blind.summary, rep.summary);
    assert_eq!(blind.results[0].result, Outcome::Fail);
    assert!(
        blind.results[0]
            .message
            .contains("details were not available"),
        "{}",
        blind.results[0].message
    );
}

#[test]
fn an_unchanged_audit_gives_an_equal_report_apart_from_time() {
    let r = run("lab");
    let later = Timestamp {
        seconds: at().seconds + 60,
        nanos: 0,
    };
    let a = report::build(&r, at());
    let mut b = report::build(&r, later);
    assert_ne!(a, b);
    assert!(a.says_the_same(&b));
    b.metadata.resource_version = Some("12".into());
    assert!(
        a.says_the_same(&b),
        "written over a resourceVersion, still the same"
    );
    // Any other difference counts: one message, one annotation.
    let mut c = b.clone();
    c.results[0].message.push('.');
    assert!(!a.says_the_same(&c));
    let mut d = b.clone();
    d.metadata
        .annotations
        .insert(report::OMITTED_ANNOTATION, "1".into());
    assert!(!a.says_the_same(&d));
}

/// A ClusterPolicy and a GPUCluster at once (v26.7+): the report fails the cluster once, and
/// the JSON names the stack; before v26.7 a GPUCluster means nothing to the operator.
#[test]
fn both_custom_resources_fail_the_report_once() {
    use crate::core::operands::Stack;
    let nodes = [node(
        "n",
        &[
            ("nvidia.com/gpu.present", "true"),
            ("feature.node.kubernetes.io/pci-10de.present", "true"),
        ],
    )];
    let both = ClusterFacts {
        stack: Stack::Both,
        source: PolicySource::Found("cluster-policy".into()),
        ..operator_defaults()
    };
    let r = audit(&nodes, &[] as &[PodView], &both, &Policy::default());
    let rep = report::build(&r, at());
    let conflict: Vec<_> = rep
        .results
        .iter()
        .filter(|x| x.rule == "gpu-cluster-conflict")
        .collect();
    assert_eq!(conflict.len(), 1);
    assert_eq!(conflict[0].result, Outcome::Fail);
    assert_eq!(conflict[0].severity, Severity::High);
    assert!(conflict[0].resources.is_empty());
    assert_eq!(
        conflict[0].message,
        "a ClusterPolicy and GPUCluster gpu-cluster both exist: the GPU Operator (v26.7) \
         reconciles neither and labels no node until one is deleted"
    );
    let json: serde_json::Value = serde_json::from_str(&output::json(&r)).unwrap();
    assert_eq!(json["stack"], "both");
    // v25.3 knows no GPUCluster.
    let old = ClusterFacts {
        operator: crate::core::version::Followed {
            version: OperatorVersion::parse("v25.3.4").unwrap(),
            source: VersionSource::Given("--operator-version".into()),
        },
        ..both
    };
    let r = audit(&nodes, &[] as &[PodView], &old, &Policy::default());
    assert!(
        !report::build(&r, at())
            .results
            .iter()
            .any(|x| x.rule == "gpu-cluster-conflict")
    );
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&output::json(&r)).unwrap()["stack"],
        "cluster-policy"
    );
}

#[test]
fn a_running_device_plugin_on_a_node_advertising_no_gpu_is_found_from_its_status() {
    use crate::core::advertised::Advertised;
    let labels = [
        ("device-plugin", "true"),
        ("container-toolkit", "true"),
        ("nvidia.com/gpu.present", "true"),
        ("feature.node.kubernetes.io/pci-10de.present", "true"),
    ];
    let pods = |plugin: PodPhase| {
        [
            pod("tk", "nvidia-container-toolkit-daemonset", "n", RUNNING),
            pod("dp", "nvidia-device-plugin-daemonset", "n", plugin),
        ]
    };
    let judge = |advertised: Option<Advertised>, count: Option<&str>, plugin: PodPhase| {
        let mut n = node("n", &labels);
        if let Some(c) = count {
            n.metadata
                .labels
                .as_mut()
                .unwrap()
                .insert("nvidia.com/gpu.count".into(), c.into());
        }
        n.advertised = advertised;
        audit(
            &[n],
            &pods(plugin),
            &operator_defaults(),
            &Policy::default(),
        )
    };
    let zero = |listed, capacity| {
        Some(Advertised {
            listed,
            capacity,
            allocatable: 0,
        })
    };
    // The kubelet lists 8 GPUs, none allocatable: the plugin's devices turned unhealthy.
    let r = judge(zero(true, 8), None, RUNNING);
    let n = &r.nodes[0];
    let f = n
        .findings
        .iter()
        .find(|f| f.rule == Rule::GpusNotAdvertised)
        .unwrap();
    assert_eq!((f.level, f.basis), (Level::Warn, Basis::Status));
    assert!(
        f.message.starts_with(
            "node n runs the NVIDIA device plugin (pod dp) but its status advertises 0 \
             allocatable NVIDIA GPUs (capacity 8), so the scheduler places no GPU pod there"
        ),
        "{}",
        f.message
    );
    assert!(!n.is_ok(), "an observed failure");
    assert_eq!(r.exit_code(), 1);
    // Never registered, GFD counts 8: found, in its own words.
    let r = judge(zero(false, 0), Some("8"), RUNNING);
    assert_eq!(r.nodes[0].findings.len(), 1, "{:?}", r.nodes[0].findings);
    let f = &r.nodes[0].findings[0];
    assert_eq!(f.rule, Rule::GpusNotAdvertised);
    assert!(
        f.message.contains(
            "GPU feature discovery counts 8 GPU(s) (nvidia.com/gpu.count=8) and its status \
             lists no NVIDIA GPU resource"
        ),
        "{}",
        f.message
    );
    // Not judged: nothing says there is a GPU, no status read, GPUs allocatable, the plugin
    // not running (operand-not-running says that), a count of 0 or garbage.
    for (advertised, count, plugin) in [
        (zero(false, 0), None, RUNNING),
        (None, Some("8"), RUNNING),
        (
            Some(Advertised {
                listed: true,
                capacity: 8,
                allocatable: 7,
            }),
            Some("8"),
            RUNNING,
        ),
        (zero(true, 8), Some("8"), PodPhase::Pending),
        (zero(false, 0), Some("0"), RUNNING),
        (zero(false, 0), Some("eight"), RUNNING),
    ] {
        let r = judge(advertised, count, plugin);
        assert!(
            !r.nodes[0].has(Rule::GpusNotAdvertised),
            "{advertised:?} {count:?} {plugin:?}"
        );
    }
}

#[test]
fn gpus_not_advertised_switched_off_is_not_evaluated() {
    use crate::core::advertised::Advertised;
    let labels = [
        ("device-plugin", "true"),
        ("container-toolkit", "true"),
        ("nvidia.com/gpu.present", "true"),
        ("feature.node.kubernetes.io/pci-10de.present", "true"),
    ];
    let pods = [
        pod("tk", "nvidia-container-toolkit-daemonset", "n", RUNNING),
        pod("dp", "nvidia-device-plugin-daemonset", "n", RUNNING),
    ];
    let mut policy = Policy::default();
    policy.actions[Rule::GpusNotAdvertised as usize] = crate::core::rules::Action::Off;
    let mut n = node("n", &labels);
    n.advertised = Some(Advertised {
        listed: true,
        capacity: 8,
        allocatable: 0,
    });
    let r = audit(&[n], &pods, &operator_defaults(), &policy);
    assert!(!r.nodes[0].has(Rule::GpusNotAdvertised));
    assert!(!r.rules.contains(&Rule::GpusNotAdvertised));
}
