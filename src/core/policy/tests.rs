//! One test per behaviour; the lab of docs/gpu-operator.md step by step first.

use std::collections::BTreeMap;

use crate::core::operands::{GPU_PRESENT_KEY, NFD_NVIDIA_PCI_KEYS};
use crate::core::review::UNTAINTED;

use super::*;
use crate::core::era::Era;
use crate::core::era::OperatorVersion;
use crate::core::facts::PolicySource;
use crate::core::operands::OPERANDS_KEY;
use crate::core::operator::labelling_pass;
use crate::core::version::VersionSource;

const P: &str = "nvidia.com/gpu.deploy.";

/// Labels from `(key, value)` pairs; a key without a `/` is a deploy label's operand name
/// (`device-plugin` is `nvidia.com/gpu.deploy.device-plugin`). The tests of other modules use
/// it too.
pub(crate) fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| {
            let key = if k.contains('/') {
                (*k).to_owned()
            } else {
                format!("{P}{k}")
            };
            (key, (*v).to_owned())
        })
        .collect()
}

/// `lab-node-0`: GPU (NFD's PCI label, the operator's `gpu.present`), no host driver, the five
/// lab operands on.
pub(crate) fn lab_node_0() -> Labels {
    labels(&[
        ("nvidia.com/gpu.present", "true"),
        ("feature.node.kubernetes.io/pci-10de.present", "true"),
        ("driver", "true"),
        ("container-toolkit", "true"),
        ("device-plugin", "true"),
        ("gpu-feature-discovery", "true"),
        ("dcgm-exporter", "true"),
    ])
}

/// `lab-node-1`: GPU with a host driver.
fn lab_node_1() -> Labels {
    let mut l = lab_node_0();
    l.insert(format!("{P}driver"), "false".into());
    l
}

/// `lab-node-2`: no GPU, no deploy labels.
fn lab_node_2() -> Labels {
    labels(&[("kubernetes.io/hostname", "lab-node-2")])
}

/// Applies kubectl-style changes: `("key", Some(v))` sets, `("key", None)` removes.
pub(crate) fn with(base: &Labels, changes: &[(&str, Option<&str>)]) -> Labels {
    let mut out = base.clone();
    for (k, v) in changes {
        let key = if k.contains('/') {
            (*k).to_owned()
        } else {
            format!("{P}{k}")
        };
        match v {
            Some(v) => out.insert(key, (*v).to_owned()),
            None => out.remove(&key),
        };
    }
    out
}

const PERSON: &str = "alice@example.com";

fn update(node: &str, old: &Labels, new: &Labels) -> Verdict {
    update_with(node, old, new, &ClusterFacts::default(), &Policy::default())
}

fn update_with(
    node: &str,
    old: &Labels,
    new: &Labels,
    facts: &ClusterFacts,
    policy: &Policy,
) -> Verdict {
    let review = Review {
        node,
        operation: Operation::Update,
        old_labels: Some(old),
        labels: new,
        username: PERSON,
        groups: &[],
        dry_run: false,
        unknown_not_copied: 0,
        old_placement: None,
        placement: &crate::core::review::UNTAINTED,
    };
    decide(&review, facts, policy)
}

fn create(node: &str, new: &Labels, policy: &Policy) -> Verdict {
    let review = Review {
        node,
        operation: Operation::Create,
        old_labels: None,
        labels: new,
        username: "system:node:x",
        groups: &[],
        dry_run: false,
        unknown_not_copied: 0,
        old_placement: None,
        placement: &crate::core::review::UNTAINTED,
    };
    decide(&review, &ClusterFacts::default(), policy)
}

fn rules(v: &Verdict) -> Vec<(Rule, Action, Change)> {
    v.findings
        .iter()
        .map(|f| (f.rule, f.action, f.change))
        .collect()
}

fn ops(list: &[Operand]) -> OperandSet {
    list.iter().copied().collect()
}

// ---- the lab -------------------------------------------------------------------------------

#[test]
fn lab_nodes_simulate_like_the_daemonset_controller() {
    let facts = ClusterFacts::default();
    use Operand::*;
    assert_eq!(
        simulate(&lab_node_0(), &facts),
        ops(&[
            Driver,
            ContainerToolkit,
            DevicePlugin,
            GpuFeatureDiscovery,
            DcgmExporter
        ])
    );
    assert_eq!(
        simulate(&lab_node_1(), &facts),
        ops(&[
            ContainerToolkit,
            DevicePlugin,
            GpuFeatureDiscovery,
            DcgmExporter
        ])
    );
    assert!(simulate(&lab_node_2(), &facts).is_empty());
}

#[test]
fn labelling_lab_node_2_with_only_device_plugin_is_denied() {
    let old = lab_node_2();
    let new = with(&old, &[("device-plugin", Some("true"))]);
    let v = update("lab-node-2", &old, &new);
    assert_eq!(v.decision, Decision::Denied);
    assert!(!v.allowed());
    assert_eq!(
        v.message.as_deref(),
        Some(
            "node lab-node-2: nvidia.com/gpu.deploy.device-plugin=true would run the NVIDIA device plugin \
             without the container toolkit (nvidia.com/gpu.deploy.container-toolkit is not set), so GPU pods \
             would be scheduled there and fail to start; set nvidia.com/gpu.deploy.container-toolkit=true in \
             the same command, or leave the device plugin off (nvidia.com/gpu.deploy.device-plugin=false)."
        )
    );
    assert_eq!(
        rules(&v),
        [
            (Rule::DevicePluginWithoutToolkit, Action::Deny, Change::New),
            (Rule::DevicePluginOnNonGpuNode, Action::Warn, Change::New),
        ]
    );
    assert_eq!(
        v.warnings,
        ["lab-node-2: device-plugin runs on a node with no NVIDIA GPU label"]
    );
    assert_eq!(v.before, OperandSet::EMPTY);
    assert_eq!(v.after, ops(&[Operand::DevicePlugin]));
}

#[test]
fn lab_node_1_dcgm_exporter_off_is_allowed_without_findings() {
    let old = lab_node_1();
    let new = with(&old, &[("dcgm-exporter", Some("false"))]);
    let v = update("lab-node-1", &old, &new);
    assert_eq!(v.decision, Decision::Allowed);
    assert!(v.findings.is_empty(), "{:?}", v.findings);
    assert!(v.warnings.is_empty());
    assert!(v.before.contains(Operand::DcgmExporter));
    assert!(!v.after.contains(Operand::DcgmExporter));
}

#[test]
fn removing_the_toolkit_label_of_lab_node_0_is_denied() {
    let old = lab_node_0();
    let new = with(&old, &[("container-toolkit", None)]);
    let v = update("lab-node-0", &old, &new);
    assert_eq!(v.decision, Decision::Denied);
    let msg = v.message.clone().unwrap();
    assert!(
        msg.contains("(this request removes nvidia.com/gpu.deploy.container-toolkit)"),
        "{msg}"
    );
    assert!(
        msg.contains(
            "keep nvidia.com/gpu.deploy.container-toolkit=true, or turn the device plugin off"
        ),
        "{msg}"
    );
    assert_eq!(
        rules(&v),
        [
            (Rule::DevicePluginWithoutToolkit, Action::Deny, Change::New),
            (Rule::OperandWithoutToolkit, Action::Warn, Change::New),
            (Rule::OperatorWillRestore, Action::Warn, Change::New),
        ]
    );
    assert_eq!(
        v.warnings,
        [
            "lab-node-0: gpu-feature-discovery, dcgm-exporter would hang without container-toolkit",
            "nvidia.com/gpu.deploy.container-toolkit removed: the GPU Operator will add it back as true; keep it off only with device-plugin=false too",
        ]
    );
}

#[test]
fn setting_the_toolkit_false_under_a_running_device_plugin_is_denied() {
    let old = lab_node_1();
    let new = with(&old, &[("container-toolkit", Some("false"))]);
    let v = update("lab-node-1", &old, &new);
    assert_eq!(v.decision, Decision::Denied);
    assert!(
        v.message
            .unwrap()
            .contains("(this request sets nvidia.com/gpu.deploy.container-toolkit=\"false\")")
    );
}

#[test]
fn turning_device_plugin_and_toolkit_off_together_is_allowed() {
    let old = lab_node_0();
    let new = with(
        &old,
        &[
            ("device-plugin", Some("false")),
            ("container-toolkit", Some("false")),
        ],
    );
    let v = update("lab-node-0", &old, &new);
    assert_eq!(v.decision, Decision::Allowed);
    // GFD and the exporter still wait for the toolkit: worth a warning, not a refusal.
    assert_eq!(
        rules(&v),
        [(Rule::OperandWithoutToolkit, Action::Warn, Change::New)]
    );
}

#[test]
fn turning_everything_off_is_allowed_silently() {
    let old = lab_node_0();
    let new = with(
        &old,
        &[
            ("driver", Some("false")),
            ("container-toolkit", Some("false")),
            ("device-plugin", Some("false")),
            ("gpu-feature-discovery", Some("false")),
            ("dcgm-exporter", Some("false")),
        ],
    );
    let v = update("lab-node-0", &old, &new);
    assert_eq!(v.decision, Decision::Allowed);
    assert!(v.findings.is_empty(), "{:?}", v.findings);
    assert!(v.after.is_empty());
}

// ---- transitions ---------------------------------------------------------------------------

#[test]
fn already_broken_node_accepts_an_unrelated_edit_with_a_warning() {
    let old = with(&lab_node_2(), &[("device-plugin", Some("true"))]);
    let new = with(&old, &[("example.com/team", Some("ml"))]);
    let v = update("lab-node-2", &old, &new);
    assert_eq!(v.decision, Decision::Allowed);
    assert_eq!(
        rules(&v),
        [
            (
                Rule::DevicePluginWithoutToolkit,
                Action::Warn,
                Change::Existing
            ),
            (
                Rule::DevicePluginOnNonGpuNode,
                Action::Warn,
                Change::Existing
            ),
        ]
    );
    assert_eq!(
        v.warnings[0],
        "lab-node-2 is already broken: device-plugin runs without container-toolkit"
    );
}

#[test]
fn a_request_that_fixes_the_violation_is_allowed() {
    let old = with(&lab_node_2(), &[("device-plugin", Some("true"))]);
    let new = with(&old, &[("device-plugin", Some("false"))]);
    let v = update("lab-node-2", &old, &new);
    assert_eq!(v.decision, Decision::Allowed);
    assert!(v.findings.is_empty(), "{:?}", v.findings);
}

#[test]
fn a_request_that_adds_the_toolkit_fixes_it_too() {
    let old = with(&lab_node_1(), &[("container-toolkit", Some("false"))]);
    let new = with(&old, &[("container-toolkit", Some("true"))]);
    let v = update("lab-node-1", &old, &new);
    assert_eq!(v.decision, Decision::Allowed);
    assert!(v.findings.is_empty(), "{:?}", v.findings);
}

#[test]
fn a_request_that_reduces_a_violation_keeps_only_the_existing_part() {
    let old = with(
        &lab_node_1(),
        &[
            ("container-toolkit", Some("false")),
            ("device-plugin", Some("false")),
        ],
    );
    let new = with(&old, &[("gpu-feature-discovery", Some("false"))]);
    let v = update("lab-node-1", &old, &new);
    assert_eq!(v.decision, Decision::Allowed);
    assert_eq!(
        rules(&v),
        [(Rule::OperandWithoutToolkit, Action::Warn, Change::Existing)]
    );
    assert!(
        v.findings[0]
            .message
            .contains("already runs dcgm-exporter without")
    );
}

#[test]
fn adding_an_operand_to_an_existing_violation_reports_only_the_new_one_as_new() {
    let old = with(
        &lab_node_1(),
        &[
            ("container-toolkit", Some("false")),
            ("device-plugin", Some("false")),
        ],
    );
    let new = with(&old, &[("dcgm", Some("true"))]);
    let v = update("lab-node-1", &old, &new);
    let f: Vec<_> = v
        .findings
        .iter()
        .map(|f| (f.change, f.warning.as_str()))
        .collect();
    assert_eq!(
        f,
        [
            (
                Change::New,
                "lab-node-1: dcgm would hang without container-toolkit"
            ),
            (
                Change::Existing,
                "lab-node-1: gpu-feature-discovery, dcgm-exporter already wait for container-toolkit"
            ),
        ]
    );
}

#[test]
fn create_is_never_denied_by_default() {
    let new = with(&lab_node_2(), &[("device-plugin", Some("true"))]);
    let v = create("lab-node-2", &new, &Policy::default());
    assert_eq!(v.decision, Decision::Allowed);
    assert_eq!(
        rules(&v)[0],
        (Rule::DevicePluginWithoutToolkit, Action::Warn, Change::New)
    );
    assert_eq!(
        v.warnings[0],
        "lab-node-2: device-plugin would run without container-toolkit; GPU pods would fail to start"
    );
}

#[test]
fn create_is_denied_when_enforce_on_create_is_set() {
    let new = with(&lab_node_2(), &[("device-plugin", Some("true"))]);
    let policy = Policy {
        enforce_on_create: true,
        ..Policy::default()
    };
    let v = create("lab-node-2", &new, &policy);
    assert_eq!(v.decision, Decision::Denied);
}

#[test]
fn warn_mode_turns_a_denial_into_a_warning() {
    let old = lab_node_2();
    let new = with(&old, &[("device-plugin", Some("true"))]);
    let policy = Policy {
        mode: Mode::Warn,
        ..Policy::default()
    };
    let v = update_with("lab-node-2", &old, &new, &ClusterFacts::default(), &policy);
    assert_eq!(v.decision, Decision::Allowed);
    assert_eq!(
        rules(&v)[0],
        (Rule::DevicePluginWithoutToolkit, Action::Warn, Change::New)
    );
}

#[test]
fn audit_mode_denies_and_warns_nothing_and_records_everything() {
    let old = lab_node_2();
    let new = with(&old, &[("device-plugin", Some("true"))]);
    let policy = Policy {
        mode: Mode::Audit,
        ..Policy::default()
    };
    let v = update_with("lab-node-2", &old, &new, &ClusterFacts::default(), &policy);
    assert_eq!(v.decision, Decision::Allowed);
    assert!(v.allowed());
    assert_eq!(v.message, None);
    assert!(
        v.warnings.is_empty(),
        "audit mode shows no warnings: {:?}",
        v.warnings
    );
    assert!(!v.findings.is_empty());
    assert!(v.findings.iter().all(|f| f.action == Action::Audit));
    assert_eq!(rules(&v)[0].0, Rule::DevicePluginWithoutToolkit);
    // The refusal enforce mode would give is recorded, in the audit annotations too.
    let enforced = update_with(
        "lab-node-2",
        &old,
        &new,
        &ClusterFacts::default(),
        &Policy::default(),
    );
    assert_eq!(v.would_deny, enforced.message);
    let annotations = v.audit_annotations();
    assert!(annotations.contains(&("decision", "allowed".to_owned())));
    assert!(
        annotations
            .iter()
            .any(|(k, v)| *k == "would-deny" && v.contains("device-plugin=true"))
    );
    assert!(
        annotations
            .iter()
            .any(|(k, v)| *k == "findings" && v.contains("device-plugin-without-toolkit=audit"))
    );
}

#[test]
fn dry_run_is_decided_like_a_real_request() {
    let old = lab_node_2();
    let new = with(&old, &[("device-plugin", Some("true"))]);
    let review = |dry_run| Review {
        node: "lab-node-2",
        operation: Operation::Update,
        old_labels: Some(&old),
        labels: &new,
        username: PERSON,
        groups: &[],
        dry_run,
        unknown_not_copied: 0,
        old_placement: None,
        placement: &crate::core::review::UNTAINTED,
    };
    let facts = ClusterFacts::default();
    let policy = Policy::default();
    assert_eq!(
        decide(&review(true), &facts, &policy),
        decide(&review(false), &facts, &policy)
    );
    assert_eq!(
        decide(&review(true), &facts, &policy).decision,
        Decision::Denied
    );
}

#[test]
fn delete_is_allowed_without_judgement() {
    let old = with(&lab_node_2(), &[("device-plugin", Some("true"))]);
    let review = Review {
        node: "lab-node-2",
        operation: Operation::Delete,
        old_labels: Some(&old),
        labels: &old,
        username: PERSON,
        groups: &[],
        dry_run: false,
        unknown_not_copied: 0,
        old_placement: None,
        placement: &crate::core::review::UNTAINTED,
    };
    let v = decide(&review, &ClusterFacts::default(), &Policy::default());
    assert_eq!(v.decision, Decision::Allowed);
    assert!(v.findings.is_empty());
}

// ---- exemptions ----------------------------------------------------------------------------

fn exempt_check(username: &str, groups: &[String], policy: &Policy) -> Verdict {
    let old = lab_node_2();
    let new = with(&old, &[("device-plugin", Some("true"))]);
    let review = Review {
        node: "lab-node-2",
        operation: Operation::Update,
        old_labels: Some(&old),
        labels: &new,
        username,
        groups,
        dry_run: false,
        unknown_not_copied: 0,
        old_placement: None,
        placement: &crate::core::review::UNTAINTED,
    };
    decide(&review, &ClusterFacts::default(), policy)
}

#[test]
fn operator_service_accounts_are_exempt_and_recorded() {
    let v = exempt_check(
        "system:serviceaccount:gpu-operator:gpu-operator",
        &[],
        &Policy::default(),
    );
    assert_eq!(v.decision, Decision::Exempt);
    assert!(v.allowed());
    assert!(v.warnings.is_empty());
    assert!(v.findings.iter().all(|f| f.action == Action::Audit));
    assert!(
        v.would_deny
            .as_deref()
            .unwrap()
            .starts_with("node lab-node-2: nvidia.com/gpu.deploy.device-plugin=true")
    );
    let ann = v.audit_annotations();
    assert!(ann.contains(&("decision", "exempt".to_owned())));
    assert!(ann.contains(&(
        "exempt",
        "service account system:serviceaccount:gpu-operator:gpu-operator of namespace gpu-operator is exempt".to_owned()
    )));
    assert!(ann.iter().any(|(k, _)| *k == "would-deny"));
}

#[test]
fn service_accounts_of_other_namespaces_are_not_exempt() {
    let v = exempt_check(
        "system:serviceaccount:default:builder",
        &[],
        &Policy::default(),
    );
    assert_eq!(v.decision, Decision::Denied);
    // A namespace whose name merely starts like the operator's is not the operator's.
    let v = exempt_check(
        "system:serviceaccount:gpu-operator-evil:x",
        &[],
        &Policy::default(),
    );
    assert_eq!(v.decision, Decision::Denied);
}

#[test]
fn configured_users_and_groups_are_exempt() {
    let policy = Policy {
        exemptions: Exemptions {
            usernames: vec!["break-glass".into()],
            groups: vec!["gpu-admins".into()],
            service_account_namespaces: vec![],
        },
        ..Policy::default()
    };
    assert_eq!(
        exempt_check("break-glass", &[], &policy).decision,
        Decision::Exempt
    );
    let v = exempt_check(
        "bob",
        &["system:authenticated".into(), "gpu-admins".into()],
        &policy,
    );
    assert_eq!(v.decision, Decision::Exempt);
    assert_eq!(v.exempt.as_deref(), Some("group gpu-admins is exempt"));
    assert_eq!(exempt_check("bob", &[], &policy).decision, Decision::Denied);
    // With the namespace list emptied, the operator is judged like anyone else.
    assert_eq!(
        exempt_check(
            "system:serviceaccount:gpu-operator:gpu-operator",
            &[],
            &policy
        )
        .decision,
        Decision::Denied
    );
}

// ---- cluster facts -------------------------------------------------------------------------

#[test]
fn host_provided_toolkit_allows_device_plugin_alone() {
    let facts = ClusterFacts {
        toolkit_managed: false,
        ..ClusterFacts::default()
    };
    let old = labels(&[
        ("nvidia.com/gpu.present", "true"),
        ("feature.node.kubernetes.io/pci-10de.present", "true"),
    ]);
    let new = with(
        &old,
        &[
            ("device-plugin", Some("true")),
            ("dcgm-exporter", Some("true")),
        ],
    );
    let v = update_with("gpu-1", &old, &new, &facts, &Policy::default());
    assert_eq!(v.decision, Decision::Allowed);
    assert!(v.findings.is_empty(), "{:?}", v.findings);
}

#[test]
fn operands_disabled_in_the_cluster_policy_run_nowhere() {
    let facts = ClusterFacts {
        disabled: ops(&[Operand::DevicePlugin]),
        ..ClusterFacts::default()
    };
    let old = lab_node_2();
    let new = with(&old, &[("device-plugin", Some("true"))]);
    let v = update_with("lab-node-2", &old, &new, &facts, &Policy::default());
    assert_eq!(v.decision, Decision::Allowed);
    assert!(!v.after.contains(Operand::DevicePlugin));
}

#[test]
fn a_custom_daemonset_selector_replaces_the_default_one() {
    let mut selectors = BTreeMap::new();
    selectors.insert(
        Operand::DevicePlugin,
        labels(&[("device-plugin", "true"), ("example.com/pool", "gpu")]),
    );
    let facts = ClusterFacts {
        selectors,
        ..ClusterFacts::default()
    };
    let old = lab_node_2();
    let new = with(&old, &[("device-plugin", Some("true"))]);
    let v = update_with("lab-node-2", &old, &new, &facts, &Policy::default());
    assert_eq!(
        v.decision,
        Decision::Allowed,
        "the selector does not match yet"
    );
    let new = with(&new, &[("example.com/pool", Some("gpu"))]);
    let v = update_with("lab-node-2", &old, &new, &facts, &Policy::default());
    assert_eq!(v.decision, Decision::Denied);
    assert!(v.message.unwrap().contains(
        "the device-plugin DaemonSet's nodeSelector example.com/pool=gpu,nvidia.com/gpu.deploy.device-plugin=true"
    ));
}

// ---- the other rules -----------------------------------------------------------------------

#[test]
fn validator_labelled_off_under_waiting_operands_warns() {
    let old = lab_node_0();
    let new = with(&old, &[("operator-validator", Some("false"))]);
    let v = update("lab-node-0", &old, &new);
    assert_eq!(v.decision, Decision::Allowed);
    assert_eq!(
        rules(&v),
        [(Rule::OperandWithoutValidator, Action::Warn, Change::New)]
    );
    assert_eq!(
        v.warnings[0],
        "lab-node-0: device-plugin, gpu-feature-discovery, dcgm-exporter hang: operator-validator=\"false\""
    );
}

#[test]
fn a_missing_validator_label_is_not_a_finding() {
    // The operator adds it as `true` on its next pass.
    let old = lab_node_1();
    let new = with(&old, &[("dcgm", Some("true"))]);
    let v = update("lab-node-1", &old, &new);
    assert!(v.findings.is_empty(), "{:?}", v.findings);
}

#[test]
fn device_plugin_on_a_node_known_to_nfd_is_fine() {
    let old = labels(&[("feature.node.kubernetes.io/pci-10de.present", "true")]);
    let new = with(
        &old,
        &[
            ("container-toolkit", Some("true")),
            ("device-plugin", Some("true")),
        ],
    );
    let v = update("gpu-2", &old, &new);
    assert!(v.findings.is_empty(), "{:?}", v.findings);
}

#[test]
fn unknown_deploy_label_gets_a_did_you_mean() {
    let old = lab_node_0();
    let new = with(&old, &[("container-tookit", Some("true"))]);
    let v = update("lab-node-0", &old, &new);
    assert_eq!(
        v.warnings,
        [
            "nvidia.com/gpu.deploy.container-tookit is not a known deploy label; did you mean container-toolkit?"
        ]
    );
    let new = with(&old, &[("frobnicator", Some("true"))]);
    let v = update("lab-node-0", &old, &new);
    assert_eq!(
        v.warnings,
        [
            "nvidia.com/gpu.deploy.frobnicator is not a known deploy label; no GPU Operator component reads it"
        ]
    );
}

#[test]
fn many_unknown_keys_are_one_finding_naming_the_first_five() {
    let old = lab_node_0();
    let keys: Vec<String> = (0..12).map(|i| format!("unknown-{i:02}")).collect();
    let mut changes: Vec<(&str, Option<&str>)> =
        keys.iter().map(|k| (k.as_str(), Some("true"))).collect();
    changes.push(("container-tookit", Some("true")));
    let new = with(&old, &changes);
    let v = update("lab-node-0", &old, &new);
    let unknown: Vec<&Finding> = v
        .findings
        .iter()
        .filter(|f| f.rule == Rule::UnknownDeployLabel)
        .collect();
    assert_eq!(unknown.len(), 1, "{:?}", v.findings);
    let none = "no GPU Operator component reads it";
    assert_eq!(
        v.warnings,
        [format!(
            "13 labels are not known deploy labels: nvidia.com/gpu.deploy.container-tookit; did \
             you mean container-toolkit?, nvidia.com/gpu.deploy.unknown-00; {none}, \
             nvidia.com/gpu.deploy.unknown-01; {none}, nvidia.com/gpu.deploy.unknown-02; {none}, \
             nvidia.com/gpu.deploy.unknown-03; {none} (and 8 more)"
        )]
    );
    assert!(
        unknown[0].message.starts_with(
            "node lab-node-0: 13 labels are not deploy labels of any GPU Operator operand: \
             nvidia.com/gpu.deploy.container-tookit=\"true\"; did you mean \
             nvidia.com/gpu.deploy.container-toolkit?, "
        ),
        "{}",
        unknown[0].message
    );
}

#[test]
fn a_long_node_name_or_key_is_echoed_bounded() {
    let old = lab_node_0();
    let long_key = "k".repeat(5000);
    let new = with(&old, &[(long_key.as_str(), Some("true"))]);
    let name = "n".repeat(5000);
    let v = update(&name, &old, &new);
    let finding = &v.findings[0];
    assert!(finding.message.len() < 400, "{}", finding.message);
    assert!(
        finding.message.contains("…(5000 bytes)"),
        "{}",
        finding.message
    );
    assert!(v.warnings[0].len() < 300, "{}", v.warnings[0]);
}

#[test]
fn legitimate_keys_outside_the_operand_daemonsets_are_not_unknown() {
    let old = lab_node_0();
    for key in [
        "nvsm",
        "client",
        "dra-driver",
        "dcgm-exporter-dra",
        "sandbox-validator",
        "operands",
    ] {
        let new = with(&old, &[(key, Some("true"))]);
        let v = update("lab-node-0", &old, &new);
        assert!(
            !v.findings
                .iter()
                .any(|f| f.rule == Rule::UnknownDeployLabel),
            "{key}: {:?}",
            v.findings
        );
    }
}

#[test]
fn an_unknown_label_the_request_does_not_touch_is_not_reported() {
    let old = with(&lab_node_0(), &[("container-tookit", Some("true"))]);
    let new = with(&old, &[("dcgm-exporter", Some("false"))]);
    let v = update("lab-node-0", &old, &new);
    assert!(v.findings.is_empty(), "{:?}", v.findings);
}

#[test]
fn values_a_person_meant_as_on_are_flagged() {
    let old = lab_node_0();
    for value in ["True", "TRUE", "yes", "1", "enabled", " true", "on"] {
        let new = with(&old, &[("dcgm", Some(value))]);
        let v = update("lab-node-0", &old, &new);
        assert_eq!(
            rules(&v),
            [(Rule::ValueNotTrue, Action::Warn, Change::New)],
            "{value:?}"
        );
        assert_eq!(
            v.warnings[0],
            format!(
                "nvidia.com/gpu.deploy.dcgm={value:?} schedules nothing: only the exact value true does"
            )
        );
        assert!(!v.after.contains(Operand::Dcgm));
    }
}

#[test]
fn values_the_operator_components_write_are_not_findings() {
    let old = lab_node_0();
    for value in [
        "false",
        "",
        "pre-installed",
        "paused-for-driver-upgrade",
        "paused-for-mig-change",
        "pre-installed_paused-for-driver-upgrade",
        "False",
        "off",
    ] {
        let new = with(&old, &[("driver", Some(value))]);
        let v = update("lab-node-0", &old, &new);
        assert!(
            !v.findings.iter().any(|f| f.rule == Rule::ValueNotTrue),
            "{value:?}: {:?}",
            v.findings
        );
    }
}

#[test]
fn a_value_that_is_neither_true_nor_false_is_flagged() {
    let old = lab_node_0();
    let new = with(&old, &[("dcgm", Some("maybe"))]);
    let v = update("lab-node-0", &old, &new);
    assert_eq!(
        v.warnings,
        ["nvidia.com/gpu.deploy.dcgm=\"maybe\" is neither true nor false: dcgm will not run here"]
    );
}

#[test]
fn operands_switch_only_reacts_to_exact_false() {
    let old = lab_node_0();
    let new = with(&old, &[("operands", Some("False"))]);
    let v = update("lab-node-0", &old, &new);
    assert_eq!(
        v.warnings,
        [
            "nvidia.com/gpu.deploy.operands=\"False\" does not disable operands: only the exact value false does"
        ]
    );
    // Exactly false: the operator sweeps every label it manages, and the warning says that
    // removing it later brings them back as true (the =false choices are lost).
    let new = with(&old, &[("operands", Some("false"))]);
    let v = update("lab-node-0", &old, &new);
    assert_eq!(v.decision, Decision::Allowed);
    assert_eq!(
        v.warnings,
        [
            "nvidia.com/gpu.deploy.operands=false: the GPU Operator sweeps 5 deploy labels; removing it later adds them back as true, =false choices lost"
        ]
    );
}

/// Setting or removing `operands=false` starts the operator's pass on that same update: the
/// node is judged on what the pass leaves, in every era's label set.
#[test]
fn a_request_flipping_operands_false_is_judged_on_the_pass_it_starts() {
    let gpu = with(
        &lab_node_0(),
        &[("feature.node.kubernetes.io/pci-10de.present", Some("true"))],
    );
    let off = with(&gpu, &[("operands", Some("false"))]);
    let swept = labelling_pass(&off, Era::V24_9, &Default::default(), Default::default()).labels;
    for version in ["v24.9.2", "v25.3.4", "v26.3.0", "v26.7.0"] {
        let facts = facts_for(version, Default::default());
        let policy = Policy::default();
        // Toolkit off together with operands=false: the pass deletes the device plugin's label
        // too, so nothing runs without the toolkit.
        let new = with(
            &gpu,
            &[
                ("operands", Some("false")),
                ("container-toolkit", Some("false")),
            ],
        );
        let v = update_with("n", &gpu, &new, &facts, &policy);
        assert_eq!(v.decision, Decision::Allowed, "{version}: {:?}", v.findings);
        assert_eq!(v.after, OperandSet::EMPTY, "{version}");
        assert!(
            v.findings
                .iter()
                .all(|f| f.rule == Rule::OperatorWillRestore),
            "{version}: {:?}",
            v.findings
        );
        // The same labels with operands=false already on the node start no pass: the device
        // plugin runs without the toolkit until one comes.
        let v = update_with(
            "n",
            &with(&gpu, &[("operands", Some("true"))]),
            &with(&new, &[("operands", Some("true"))]),
            &facts,
            &policy,
        );
        assert_eq!(v.decision, Decision::Denied, "{version}");
        // Removing operands=false with the toolkit set off: the pass adds the device plugin
        // back as true, without the toolkit. Refused, saying why.
        let new = with(
            &swept,
            &[("operands", None), ("container-toolkit", Some("false"))],
        );
        let v = update_with("n", &swept, &new, &facts, &policy);
        assert_eq!(v.decision, Decision::Denied, "{version}: {:?}", v.findings);
        let deny = v
            .findings
            .iter()
            .find(|f| f.rule == Rule::DevicePluginWithoutToolkit)
            .expect("the device plugin the pass adds");
        assert!(
            deny.message.contains(&format!(
                "this request removes {OPERANDS_KEY}=false, which starts its labelling pass on this same update ("
            )) && deny.message.contains("device-plugin add"),
            "{version}: {}",
            deny.message
        );
        assert!(v.after.contains(Operand::DevicePlugin), "{version}");
        // Removing it alone: the pass adds the toolkit too; allowed.
        let new = with(&swept, &[("operands", None)]);
        let v = update_with("n", &swept, &new, &facts, &policy);
        assert_eq!(v.decision, Decision::Allowed, "{version}: {:?}", v.findings);
        assert!(
            v.after.contains(Operand::DevicePlugin) && v.after.contains(Operand::ContainerToolkit),
            "{version}: {:?}",
            v.after
        );
    }
}

#[test]
fn a_label_written_while_operands_false_stays_is_said_to_be_deleted() {
    let old = with(&lab_node_0(), &[("operands", Some("false"))]);
    let new = with(
        &old,
        &[
            ("dcgm", Some("true")),
            ("gpu-feature-discovery", Some("false")),
            ("example", Some("true")),
        ],
    );
    let v = update("lab-node-0", &old, &new);
    let finding = v
        .findings
        .iter()
        .find(|f| f.rule == Rule::OperatorWillRestore)
        .expect("the lost labels are named");
    assert!(
        finding.message.contains(
            "deletes the deploy labels this request writes (dcgm, gpu-feature-discovery)"
        ),
        "{}",
        finding.message
    );
    assert!(v.warnings.contains(
        &"nvidia.com/gpu.deploy.operands=false stays: the GPU Operator will delete the 2 deploy labels this request writes"
            .to_owned()
    ));
    // Removing a label while it stays loses nothing, and says nothing of it.
    let new = with(&old, &[("dcgm-exporter", None)]);
    let v = update("lab-node-0", &old, &new);
    assert!(
        v.findings
            .iter()
            .all(|f| f.rule != Rule::OperatorWillRestore),
        "{:?}",
        v.findings
    );
}

#[test]
fn removing_a_label_on_a_gpu_node_warns_that_the_operator_restores_it() {
    let old = lab_node_1();
    let new = with(&old, &[("dcgm-exporter", None)]);
    let v = update("lab-node-1", &old, &new);
    assert_eq!(v.decision, Decision::Allowed);
    assert_eq!(
        v.warnings,
        [
            "nvidia.com/gpu.deploy.dcgm-exporter removed: the GPU Operator will add it back as true; use =false to keep it off"
        ]
    );
}

#[test]
fn emptying_a_label_on_a_gpu_node_warns_too() {
    let old = lab_node_1();
    let new = with(&old, &[("dcgm-exporter", Some(""))]);
    let v = update("lab-node-1", &old, &new);
    assert_eq!(
        rules(&v),
        [(Rule::OperatorWillRestore, Action::Warn, Change::New)]
    );
    assert!(v.findings[0].message.contains("empties"));
}

#[test]
fn no_restore_warning_off_gpu_nodes_under_operands_false_or_for_unmanaged_keys() {
    let old = with(&lab_node_2(), &[("dcgm-exporter", Some("false"))]);
    let new = with(&old, &[("dcgm-exporter", None)]);
    assert!(update("lab-node-2", &old, &new).findings.is_empty());

    let old = with(&lab_node_1(), &[("operands", Some("false"))]);
    let new = with(&old, &[("dcgm-exporter", None)]);
    assert!(update("lab-node-1", &old, &new).findings.is_empty());

    let old = with(&lab_node_1(), &[("nvsm", Some(""))]);
    let new = with(&old, &[("nvsm", None)]);
    assert!(update("lab-node-1", &old, &new).findings.is_empty());
}

// ---- actions -------------------------------------------------------------------------------

#[test]
fn rule_set_to_off_is_not_reported() {
    let mut policy = Policy::default();
    policy.actions[Rule::DevicePluginWithoutToolkit as usize] = Action::Off;
    policy.actions[Rule::DevicePluginOnNonGpuNode as usize] = Action::Off;
    let old = lab_node_2();
    let new = with(&old, &[("device-plugin", Some("true"))]);
    let v = update_with("lab-node-2", &old, &new, &ClusterFacts::default(), &policy);
    assert_eq!(v.decision, Decision::Allowed);
    assert!(v.findings.is_empty());
}

#[test]
fn rule_set_to_audit_is_recorded_without_a_warning() {
    let mut policy = Policy::default();
    policy.actions[Rule::DevicePluginWithoutToolkit as usize] = Action::Audit;
    let old = lab_node_2();
    let new = with(&old, &[("device-plugin", Some("true"))]);
    let v = update_with("lab-node-2", &old, &new, &ClusterFacts::default(), &policy);
    assert_eq!(v.decision, Decision::Allowed);
    assert_eq!(
        rules(&v)[0],
        (Rule::DevicePluginWithoutToolkit, Action::Audit, Change::New)
    );
    assert_eq!(
        v.warnings.len(),
        1,
        "only the non-GPU-node warning: {:?}",
        v.warnings
    );
    let ann = v.audit_annotations();
    assert!(ann.contains(&(
        "findings",
        "device-plugin-without-toolkit=audit,device-plugin-on-non-gpu-node=warn".to_owned()
    )));
}

#[test]
fn a_warn_rule_raised_to_deny_refuses() {
    let mut policy = Policy::default();
    policy.actions[Rule::UnknownDeployLabel as usize] = Action::Deny;
    let old = lab_node_0();
    let new = with(&old, &[("device-plugins", Some("true"))]);
    let v = update_with("lab-node-0", &old, &new, &ClusterFacts::default(), &policy);
    assert_eq!(v.decision, Decision::Denied);
    assert!(
        v.message
            .unwrap()
            .contains("did you mean nvidia.com/gpu.deploy.device-plugin?")
    );
}

#[test]
fn audit_annotations_name_the_decision_and_the_operand_changes() {
    let old = lab_node_1();
    let new = with(
        &old,
        &[("dcgm-exporter", Some("false")), ("dcgm", Some("true"))],
    );
    let v = update("lab-node-1", &old, &new);
    assert_eq!(
        v.audit_annotations(),
        [
            ("decision", "allowed".to_owned()),
            ("operands", "+dcgm,-dcgm-exporter".to_owned()),
            (
                "cluster-facts",
                "GPU Operator v26.7 assumed (no GPU Operator version given or found)".to_owned()
            )
        ]
    );
    // A known version (and ClusterPolicy) leaves nothing assumed: the annotation says only
    // where the version came from.
    let facts = ClusterFacts {
        operator: crate::core::version::Followed {
            version: OperatorVersion::parse("v25.3.4").unwrap(),
            source: VersionSource::Deployment("gpu-operator/gpu-operator".into()),
        },
        source: PolicySource::Found("cluster-policy".into()),
        ..ClusterFacts::default()
    };
    let v = update_with("lab-node-1", &old, &new, &facts, &Policy::default());
    assert_eq!(
        v.audit_annotations(),
        [
            ("decision", "allowed".to_owned()),
            ("operands", "+dcgm,-dcgm-exporter".to_owned()),
            (
                "cluster-facts",
                "GPU Operator v25.3.4 read from Deployment gpu-operator/gpu-operator".to_owned()
            )
        ]
    );
}

#[test]
fn every_warning_fits_a_kubectl_line() {
    // The worst cases of each rule, on a node name of a realistic length.
    let node = "gpu-a100-pool-7f9c6d-x2kq9";
    let old = labels(&[("operator-validator", "true")]);
    let new = with(
        &old,
        &[
            ("device-plugin", Some("true")),
            ("gpu-feature-discovery", Some("true")),
            ("dcgm", Some("true")),
            ("dcgm-exporter", Some("true")),
            ("mig-manager", Some("true")),
            ("operator-validator", Some("false")),
            ("kata-sandbox-device-plugn", Some("true")),
            ("node-status-exporter", Some("enabled")),
        ],
    );
    let v = create(node, &new, &Policy::default());
    assert_eq!(v.findings.len(), 6, "{:?}", v.findings);
    for w in &v.warnings {
        assert!(w.chars().count() <= 122, "{} chars: {w}", w.chars().count());
    }
}

// ---- real nodes ----------------------------------------------------------------------------

fn real_node(file: &str) -> Labels {
    let path = format!(
        "{}/tests/fixtures/real-nodes/{file}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap();
    let node: serde_json::Value = serde_json::from_str(&text).unwrap();
    serde_json::from_value(node["metadata"]["labels"].clone()).unwrap_or_default()
}

#[test]
fn real_nodes_register_and_accept_unrelated_edits_without_findings() {
    for file in [
        "aks-ndmv4-a100x8-nvsm-empty.json",
        "deepnotes-dgx-station-a100-before-operator.json",
        "deepnotes-dgx-station-a100-driver-disabled.json",
        "lambda-k3s-h100x8-driver-preinstalled.json",
        "lambda-k3s-v100x8-driver-preinstalled.json",
    ] {
        let l = real_node(file);
        let v = create("n", &l, &Policy::default());
        assert!(v.findings.is_empty(), "{file}: {:?}", v.findings);
        let edited = with(&l, &[("example.com/owner", Some("ml"))]);
        let v = update("n", &l, &edited);
        assert_eq!(v.decision, Decision::Allowed);
        assert!(v.findings.is_empty(), "{file}: {:?}", v.findings);
    }
}

#[test]
fn a_preinstalled_driver_is_not_run_by_the_operator() {
    let l = real_node("lambda-k3s-h100x8-driver-preinstalled.json");
    let set = simulate(&l, &ClusterFacts::default());
    assert!(!set.contains(Operand::Driver));
    assert!(set.contains(Operand::DevicePlugin) && set.contains(Operand::MigManager));
}

#[test]
fn removing_the_toolkit_on_a_real_aks_node_is_denied() {
    let l = real_node("aks-ndmv4-a100x8-nvsm-empty.json");
    let new = with(&l, &[("container-toolkit", Some("false"))]);
    let v = update("aks-jzndmv4-29195301-vmss000000", &l, &new);
    assert_eq!(v.decision, Decision::Denied);
    // dcgm, dcgm-exporter, GFD and the MIG manager all lose the toolkit too.
    assert!(v.warnings[0].contains("gpu-feature-discovery, dcgm, dcgm-exporter, mig-manager"));
}

// ---- assessing a node's current state (the audit) ------------------------------------------

#[test]
fn assessing_a_healthy_lab_node_finds_nothing() {
    let policy = Policy::default();
    assert!(
        assess(
            "lab-node-0",
            &lab_node_0(),
            &UNTAINTED,
            &ClusterFacts::default(),
            &policy
        )
        .is_empty()
    );
    assert!(
        assess(
            "lab-node-1",
            &lab_node_1(),
            &UNTAINTED,
            &ClusterFacts::default(),
            &policy
        )
        .is_empty()
    );
    assert!(
        assess(
            "lab-node-2",
            &lab_node_2(),
            &UNTAINTED,
            &ClusterFacts::default(),
            &policy
        )
        .is_empty()
    );
}

#[test]
fn assessing_lab_node_2_with_only_the_device_plugin_finds_the_webhook_rules() {
    let l = with(&lab_node_2(), &[("device-plugin", Some("true"))]);
    let found = assess(
        "lab-node-2",
        &l,
        &UNTAINTED,
        &ClusterFacts::default(),
        &Policy::default(),
    );
    let got: Vec<(Rule, Action, Change)> =
        found.iter().map(|f| (f.rule, f.action, f.change)).collect();
    assert_eq!(
        got,
        [
            (
                Rule::DevicePluginWithoutToolkit,
                Action::Deny,
                Change::Existing
            ),
            (
                Rule::DevicePluginOnNonGpuNode,
                Action::Warn,
                Change::Existing
            ),
        ]
    );
    // No request is being judged, so the text speaks of none.
    assert_eq!(
        found[0].message,
        "node lab-node-2 already runs the NVIDIA device plugin without the container toolkit \
         (nvidia.com/gpu.deploy.container-toolkit is not set): set \
         nvidia.com/gpu.deploy.container-toolkit=true or nvidia.com/gpu.deploy.device-plugin=false \
         to repair the node."
    );
}

#[test]
fn assessing_leaves_out_rules_that_are_off_and_follows_the_cluster_facts() {
    let l = with(&lab_node_0(), &[("container-toolkit", Some("false"))]);
    let mut policy = Policy::default();
    policy.actions[Rule::OperandWithoutToolkit as usize] = Action::Off;
    let found = assess(
        "lab-node-0",
        &l,
        &UNTAINTED,
        &ClusterFacts::default(),
        &policy,
    );
    let got: Vec<Rule> = found.iter().map(|f| f.rule).collect();
    assert_eq!(got, [Rule::DevicePluginWithoutToolkit]);
    let host_toolkit = ClusterFacts {
        toolkit_managed: false,
        ..ClusterFacts::default()
    };
    assert!(
        assess(
            "lab-node-0",
            &l,
            &UNTAINTED,
            &host_toolkit,
            &Policy::default()
        )
        .is_empty()
    );
}

/// A small deterministic generator (xorshift): the same states on every run.
struct Xorshift(u64);

impl Xorshift {
    fn next(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

const CUSTOM_POOL: &str = "example.com/gpu-pool";
const KERNEL: &str = "feature.node.kubernetes.io/kernel-version.full";

/// The keys the generated label states draw from: every deploy label and the labels a rule or
/// the operator's pass may read, and some nobody reads.
fn keys_to_vary() -> Vec<String> {
    let mut keys: Vec<String> = Operand::all().map(|op| op.key().to_owned()).collect();
    keys.extend(
        [
            OPERANDS_KEY,
            "nvidia.com/gpu.deploy.device-plugn",
            "nvidia.com/gpu.deploy.",
            GPU_PRESENT_KEY,
            NFD_NVIDIA_PCI_KEYS[0],
            NFD_NVIDIA_PCI_KEYS[2],
            CUSTOM_POOL,
            KERNEL,
            "kubernetes.io/hostname",
            "nvidia.com/gpu.product",
            "nvidia.com/gpu.workload.config",
            "nvidia.com/mig.capable",
            "nvidia.com/vgpu.host-driver-version",
            "nvidia.com/mig.config",
            "nvidia.com/gpu.deploy",
            "node-role.kubernetes.io/gpu",
        ]
        .map(str::to_owned),
    );
    keys
}

/// The values the generated label states draw from.
const VALUES_TO_VARY: [&str; 10] = [
    "true",
    "false",
    "",
    "pre-installed",
    "paused-for-mig-change",
    "a",
    "yes",
    "vm-passthrough",
    "vm-vgpu",
    "NVIDIA-A100-SXM4-80GB",
];

/// The cluster facts each generated state is decided under.
fn facts_to_vary() -> [ClusterFacts; 5] {
    [
        ClusterFacts::default(),
        ClusterFacts {
            toolkit_managed: false,
            ..ClusterFacts::default()
        },
        ClusterFacts {
            disabled: [Operand::ContainerToolkit, Operand::DcgmExporter]
                .into_iter()
                .collect(),
            source: PolicySource::Missing("no ClusterPolicy".to_owned()),
            ..ClusterFacts::default()
        },
        ClusterFacts {
            selectors: [
                (
                    Operand::DevicePlugin,
                    labels(&[(CUSTOM_POOL, "a"), ("device-plugin", "true")]),
                ),
                (Operand::ContainerToolkit, labels(&[(KERNEL, "true")])),
                (Operand::OperatorValidator, labels(&[(CUSTOM_POOL, "a")])),
            ]
            .into_iter()
            .collect(),
            ..ClusterFacts::default()
        },
        // Sandbox workloads: the operator's pass reads the node's workload label.
        facts_for(
            "v26.3.1",
            crate::core::operator::Sandbox {
                enabled: true,
                default_workload: Some(crate::core::operands::Workload::VmVgpu),
                mode: crate::core::operands::SandboxMode::Kata,
            },
        ),
    ]
}

/// The policies each generated state is decided under.
fn policies_to_vary() -> [Policy; 3] {
    let strict = Policy {
        actions: [Action::Deny; RULES.len()],
        enforce_on_create: true,
        ..Policy::default()
    };
    let mut warn_only = Policy {
        mode: Mode::Warn,
        ..Policy::default()
    };
    warn_only.exemptions.usernames.push("admin".to_owned());
    [Policy::default(), strict, warn_only]
}

fn random_labels(rng: &mut Xorshift, keys: &[String]) -> Labels {
    let count = rng.next(keys.len());
    (0..count)
        .map(|_| {
            (
                keys[rng.next(keys.len())].clone(),
                VALUES_TO_VARY[rng.next(VALUES_TO_VARY.len())].to_owned(),
            )
        })
        .collect()
}

/// A small edit of `old`, like a real `kubectl label`.
fn edited_labels(rng: &mut Xorshift, keys: &[String], old: &Labels) -> Labels {
    let mut new = old.clone();
    for _ in 0..=rng.next(3) {
        let key = keys[rng.next(keys.len())].clone();
        match rng.next(3) {
            0 => new.remove(&key),
            _ => new.insert(
                key,
                VALUES_TO_VARY[rng.next(VALUES_TO_VARY.len())].to_owned(),
            ),
        };
    }
    new
}

/// How often the generated states reached each side of the question.
#[derive(Default)]
struct Reached {
    dropped_some: usize,
    denied: usize,
    restored: usize,
}

/// The verdict on the labels `reads_label` keeps is the verdict on all of them, under every
/// policy.
fn same_verdict_on_kept_labels(
    (old, new): (&Labels, &Labels),
    (operation, username): (Operation, &str),
    facts: &ClusterFacts,
    policies: &[Policy],
    reached: &mut Reached,
) {
    let kept = |l: &Labels| -> Labels {
        l.iter()
            .filter(|(k, _)| reads_label(k, facts))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let (old_kept, new_kept) = (kept(old), kept(new));
    reached.dropped_some += usize::from(new_kept.len() < new.len());
    for policy in policies {
        let review = |old: &Labels, new: &Labels| {
            let old = (operation != Operation::Create).then_some(old);
            let review = Review {
                node: "n",
                operation,
                old_labels: old,
                labels: new,
                username,
                groups: &[],
                dry_run: false,
                unknown_not_copied: 0,
                old_placement: None,
                placement: &crate::core::review::UNTAINTED,
            };
            decide(&review, facts, policy)
        };
        let full = review(old, new);
        reached.denied += usize::from(!full.allowed());
        reached.restored += usize::from(
            full.findings
                .iter()
                .any(|f| f.rule == Rule::OperatorWillRestore),
        );
        assert_eq!(
            review(&old_kept, &new_kept),
            full,
            "{operation:?} by {username}, facts {facts:?}, policy {policy:?}\nold {old:?}\nnew {new:?}"
        );
    }
}

/// The webhook hands `decide` only the labels `reads_label` keeps. Over many label states,
/// transitions, cluster facts and policies, the verdict on the kept labels must be the verdict on
/// all of them; a rule that starts reading another label fails here until `reads_label` says so.
#[test]
fn deciding_on_the_labels_reads_label_keeps_gives_the_same_verdicts() {
    let mut rng = Xorshift(0x9e37_79b9_7f4a_7c15);
    let keys = keys_to_vary();
    let facts = facts_to_vary();
    let policies = policies_to_vary();
    let mut reached = Reached::default();
    for i in 0..3000 {
        let old = random_labels(&mut rng, &keys);
        // Half the new states are small edits of the old one.
        let new = if i % 2 == 0 {
            edited_labels(&mut rng, &keys, &old)
        } else {
            random_labels(&mut rng, &keys)
        };
        let operation = [Operation::Update, Operation::Create, Operation::Delete][rng.next(3)];
        let username = ["admin", "system:serviceaccount:gpu-operator:gpu-operator"][rng.next(2)];
        for facts in &facts {
            same_verdict_on_kept_labels(
                (&old, &new),
                (operation, username),
                facts,
                &policies,
                &mut reached,
            );
        }
    }
    // The generator must reach both sides of the question, or the test proves nothing.
    let Reached {
        dropped_some,
        denied,
        restored,
    } = reached;
    assert!(
        dropped_some > 1000,
        "labels dropped in {dropped_some} states"
    );
    assert!(denied > 100, "{denied} denials");
    assert!(
        restored > 100,
        "{restored} verdicts with the operator's pass"
    );
}

// ---- The operator's model: versions, sandbox workloads, pauses ---------------------------------

fn facts_for(version: &str, sandbox: crate::core::operator::Sandbox) -> ClusterFacts {
    let mut facts = ClusterFacts {
        operator: crate::core::version::Followed {
            version: OperatorVersion::parse(version).unwrap(),
            source: VersionSource::Given("--operator-version".into()),
        },
        sandbox,
        source: PolicySource::Found("cluster-policy".into()),
        ..ClusterFacts::default()
    };
    if !facts.sandbox.enabled {
        return facts;
    }
    // Sandbox workloads on, every sandbox operand switched on.
    facts.disabled = OperandSet::EMPTY;
    facts
}

fn sandbox_on(mode: crate::core::operands::SandboxMode) -> crate::core::operator::Sandbox {
    crate::core::operator::Sandbox {
        enabled: true,
        default_workload: None,
        mode,
    }
}

#[test]
fn turning_the_toolkit_off_under_a_paused_device_plugin_is_denied() {
    // mig-manager paused the plugin; it comes back as true, and then runs without the toolkit.
    let old = with(
        &lab_node_0(),
        &[("device-plugin", Some("paused-for-mig-change"))],
    );
    let new = with(&old, &[("container-toolkit", Some("false"))]);
    let v = update("lab-node-0", &old, &new);
    assert_eq!(v.decision, Decision::Denied, "{:?}", v.findings);
    assert!(
        v.message.as_deref().unwrap().contains(
            "once the pause ends: mig-manager writes back the labels it read before pausing"
        ),
        "{:?}",
        v.message
    );
    // During a driver upgrade both are paused: nothing to say.
    let both = with(
        &lab_node_0(),
        &[
            ("device-plugin", Some("paused-for-driver-upgrade")),
            ("container-toolkit", Some("paused-for-driver-upgrade")),
        ],
    );
    let v = update("lab-node-0", &lab_node_0(), &both);
    assert!(
        !v.findings
            .iter()
            .any(|f| f.rule == Rule::DevicePluginWithoutToolkit),
        "{:?}",
        v.findings
    );
}

#[test]
fn sandbox_operands_without_the_sandbox_validator_warn() {
    let facts = facts_for(
        "v25.3.4",
        sandbox_on(crate::core::operands::SandboxMode::KubeVirt),
    );
    let old = labels(&[
        ("feature.node.kubernetes.io/pci-10de.present", "true"),
        ("nvidia.com/gpu.present", "true"),
        ("nvidia.com/gpu.workload.config", "vm-vgpu"),
        ("nvidia.com/gpu.deploy.sandbox-device-plugin", "true"),
        ("nvidia.com/gpu.deploy.vgpu-device-manager", "true"),
        ("nvidia.com/gpu.deploy.sandbox-validator", "true"),
    ]);
    let new = with(&old, &[("sandbox-validator", Some("false"))]);
    let v = update_with("n", &old, &new, &facts, &Policy::default());
    assert_eq!(v.decision, Decision::Allowed);
    let f = v
        .findings
        .iter()
        .find(|f| f.rule == Rule::OperandWithoutSandboxValidator)
        .expect("operand-without-sandbox-validator");
    assert_eq!(f.action, Action::Warn);
    assert!(
        f.message
            .contains("sandbox-device-plugin, vgpu-device-manager")
    );
    assert!(f.message.contains("vfio-pci-ready"));
}

#[test]
fn a_label_outside_the_nodes_workload_set_is_swept() {
    let facts = facts_for(
        "v25.3.4",
        sandbox_on(crate::core::operands::SandboxMode::KubeVirt),
    );
    let old = labels(&[
        ("feature.node.kubernetes.io/pci-10de.present", "true"),
        ("nvidia.com/gpu.present", "true"),
        ("nvidia.com/gpu.workload.config", "vm-passthrough"),
        ("nvidia.com/gpu.deploy.sandbox-validator", "true"),
    ]);
    let new = with(&old, &[("dcgm", Some("false"))]);
    let v = update_with("n", &old, &new, &facts, &Policy::default());
    assert_eq!(
        v.warnings,
        [
            "nvidia.com/gpu.deploy.dcgm=\"false\": the GPU Operator will sweep it (not one of a vm-passthrough node's deploy labels)"
        ]
    );
}

#[test]
fn an_emptied_label_is_added_back_from_v26_7_only() {
    let old = with(
        &lab_node_1(),
        &[("feature.node.kubernetes.io/pci-10de.present", Some("true"))],
    );
    let new = with(&old, &[("dcgm-exporter", Some(""))]);
    let sandbox = crate::core::operator::Sandbox::default();
    let v = update_with(
        "n",
        &old,
        &new,
        &facts_for("v26.7.0", sandbox.clone()),
        &Policy::default(),
    );
    assert_eq!(v.findings.len(), 1, "{:?}", v.findings);
    assert!(v.warnings[0].contains("emptied: the GPU Operator will add it back as true"));
    let v = update_with(
        "n",
        &old,
        &new,
        &facts_for("v25.3.4", sandbox),
        &Policy::default(),
    );
    assert!(v.findings.is_empty(), "{:?}", v.findings);
}

#[test]
fn mode_and_version_decide_which_sandbox_operands_exist() {
    use crate::core::operands::SandboxMode::{Kata, KubeVirt};
    let off = |version: &str, mode| facts_for(version, sandbox_on(mode)).off();
    // Before v26.3: no mode; no kata sandbox device plugin.
    assert!(!off("v25.10.1", Kata).contains(Operand::SandboxDevicePlugin));
    assert!(off("v25.10.1", Kata).contains(Operand::KataSandboxDevicePlugin));
    assert!(!off("v25.10.1", KubeVirt).contains(Operand::CcManager));
    // v26.3: kubevirt mode runs the sandbox device plugin, kata mode the kata one and cc-manager.
    assert!(!off("v26.3.3", KubeVirt).contains(Operand::SandboxDevicePlugin));
    assert!(off("v26.3.3", KubeVirt).contains(Operand::KataSandboxDevicePlugin));
    assert!(off("v26.3.3", KubeVirt).contains(Operand::CcManager));
    assert!(off("v26.3.3", Kata).contains(Operand::SandboxDevicePlugin));
    assert!(!off("v26.3.3", Kata).contains(Operand::KataSandboxDevicePlugin));
    assert!(!off("v26.3.3", Kata).contains(Operand::CcManager));
    // kata-manager: never from v26.7.
    assert!(!off("v26.3.3", Kata).contains(Operand::KataManager));
    assert!(off("v26.7.0", Kata).contains(Operand::KataManager));
}

/// Without the real DaemonSets, an operand runs where its shipped DaemonSet of the era selects:
/// v24.9 – v25.10's cc-manager also needs `nvidia.com/cc.capable=true`, v26.3's does not.
#[test]
fn the_shipped_selector_of_the_era_decides_where_cc_manager_runs() {
    let sandbox = crate::core::operator::Sandbox {
        enabled: true,
        ..Default::default()
    };
    let node = labels(&[("nvidia.com/gpu.present", "true"), ("cc-manager", "true")]);
    let capable = with(&node, &[("nvidia.com/cc.capable", Some("true"))]);
    let on = |version: &str| {
        let mut facts = facts_for(version, sandbox.clone());
        facts.disabled = OperandSet::EMPTY;
        facts
    };
    for version in ["v24.9.2", "v25.3.4", "v25.10.1"] {
        let facts = on(version);
        assert!(
            !simulate(&node, &facts).contains(Operand::CcManager),
            "{version}"
        );
        assert!(
            simulate(&capable, &facts).contains(Operand::CcManager),
            "{version}"
        );
        assert!(reads_label("nvidia.com/cc.capable", &facts), "{version}");
    }
    let mut kata = sandbox.clone();
    kata.mode = crate::core::operands::SandboxMode::Kata;
    for version in ["v26.3.0", "v26.7.0"] {
        let mut facts = facts_for(version, kata.clone());
        facts.disabled = OperandSet::EMPTY;
        assert!(
            simulate(&node, &facts).contains(Operand::CcManager),
            "{version}"
        );
    }
    // Real DaemonSets, when read, win over the shipped selector.
    let mut facts = on("v25.3.4");
    facts
        .selectors
        .insert(Operand::CcManager, labels(&[("cc-manager", "true")]));
    assert!(simulate(&node, &facts).contains(Operand::CcManager));
}

/// A toolkit switched off during a driver upgrade comes back `true` when k8s-driver-manager
/// writes back what it read: not refused, and the warning names who overwrites the edit.
#[test]
fn an_edit_during_a_driver_upgrade_is_judged_on_what_the_driver_manager_writes_back() {
    let old = with(
        &lab_node_0(),
        &[
            ("device-plugin", Some("paused-for-driver-upgrade")),
            ("container-toolkit", Some("paused-for-driver-upgrade")),
        ],
    );
    let new = with(&old, &[("container-toolkit", Some("false"))]);
    let v = update("lab-node-0", &old, &new);
    assert_eq!(v.decision, Decision::Allowed, "{:?}", v.findings);
    let lost = v
        .findings
        .iter()
        .find(|f| f.rule == Rule::OperatorWillRestore)
        .expect("the overwritten edit is named");
    assert!(
        lost.message.contains(
            "k8s-driver-manager paused this node's GPU components and, when the driver upgrade ends, \
             writes back the labels it read before pausing, so this request's edit is lost then: \
             nvidia.com/gpu.deploy.container-toolkit=false goes back to \"true\""
        ),
        "{}",
        lost.message
    );
    assert!(v.warnings.contains(
        &"lab-node-0: k8s-driver-manager will overwrite 1 label(s) this request writes when the driver upgrade ends"
            .to_owned()
    ));
}

/// A device plugin switched off during a MIG change comes back `true` while the toolkit,
/// which mig-manager never pauses, stays off: turning both off then is refused.
#[test]
fn turning_both_off_during_a_mig_change_is_refused_as_the_plugin_comes_back() {
    let old = with(
        &lab_node_0(),
        &[("device-plugin", Some("paused-for-mig-change"))],
    );
    let new = with(
        &old,
        &[
            ("device-plugin", Some("false")),
            ("container-toolkit", Some("false")),
        ],
    );
    let v = update("lab-node-0", &old, &new);
    assert_eq!(v.decision, Decision::Denied, "{:?}", v.findings);
    assert!(
        v.message.as_deref().unwrap().contains(
            "once the pause ends: mig-manager writes back the labels it read before pausing"
        ),
        "{:?}",
        v.message
    );
    assert!(v.findings.iter().any(|f| {
        f.rule == Rule::OperatorWillRestore
            && f.message
                .contains("nvidia.com/gpu.deploy.device-plugin=false goes back to \"true\"")
    }));
    // Once the change is over (nothing paused), the same edit is allowed.
    let done = with(&old, &[("device-plugin", Some("true"))]);
    let v = update("lab-node-0", &done, &with(&new, &[]));
    assert_eq!(v.decision, Decision::Allowed, "{:?}", v.findings);
}

/// A key of an operand a later version brings is unknown to the version followed.
#[test]
fn a_deploy_key_of_a_later_version_is_unknown_to_the_version_followed() {
    let old = lab_node_0();
    let new = with(
        &old,
        &[
            ("client", Some("true")),
            ("kata-sandbox-device-plugin", Some("false")),
        ],
    );
    let policy = Policy::default();
    let found = |version: &str| {
        let v = update_with(
            "n",
            &old,
            &new,
            &facts_for(version, Default::default()),
            &policy,
        );
        v.findings
            .into_iter()
            .filter(|f| f.rule == Rule::UnknownDeployLabel)
            .map(|f| f.message)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        found("v25.3.4"),
        [
            "node n: no component of GPU Operator v25.3.4 reads nvidia.com/gpu.deploy.client (read from \
          v26.7), nvidia.com/gpu.deploy.kata-sandbox-device-plugin (read from v26.3): the label does \
          nothing on this version."
        ]
    );
    assert_eq!(
        found("v26.3.0"),
        [
            "node n: no component of GPU Operator v26.3.0 reads nvidia.com/gpu.deploy.client (read from \
          v26.7): the label does nothing on this version."
        ]
    );
    assert!(found("v26.7.0").is_empty());
}

/// On a cc-capable node, the sandbox validator's first step waits for a cc-manager the
/// ClusterPolicy switches on: labelled off, or not deployed in v26.3's kubevirt mode, the
/// sandbox operands behind the validator hang.
#[test]
fn a_cc_capable_node_without_its_cc_manager_hangs_the_sandbox_operands() {
    let node = labels(&[
        ("feature.node.kubernetes.io/pci-10de.present", "true"),
        ("nvidia.com/gpu.present", "true"),
        ("nvidia.com/gpu.workload.config", "vm-passthrough"),
        ("nvidia.com/cc.capable", "true"),
        ("sandbox-validator", "true"),
        ("sandbox-device-plugin", "true"),
        ("vfio-manager", "true"),
        ("cc-manager", "true"),
    ]);
    let kubevirt = sandbox_on(crate::core::operands::SandboxMode::KubeVirt);
    let hang = |version: &str, old: &Labels, new: &Labels| {
        let v = update_with(
            "n",
            old,
            new,
            &facts_for(version, kubevirt.clone()),
            &Policy::default(),
        );
        v.findings
            .into_iter()
            .filter(|f| {
                f.rule == Rule::OperandWithoutSandboxValidator
                    && f.message.contains("cc-manager step")
            })
            .map(|f| (f.change, f.message))
            .collect::<Vec<_>>()
    };
    // v25.3: cc-manager labelled off under a running sandbox device plugin.
    let off = with(&node, &[("cc-manager", Some("false"))]);
    let found = hang("v25.3.4", &node, &off);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, Change::New);
    assert!(
        found[0].1.contains("sandbox-device-plugin"),
        "{}",
        found[0].1
    );
    // Labelled on, it runs: nothing.
    assert!(hang("v25.3.4", &node, &node).is_empty());
    // Not cc-capable: the step is skipped.
    let plain = with(&off, &[("nvidia.com/cc.capable", None)]);
    assert!(hang("v25.3.4", &node, &plain).is_empty());
    // v26.3 in kubevirt mode never deploys the cc-manager: the node already hangs.
    let found = hang("v26.3.0", &node, &node);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, Change::Existing);
    // The cc-manager switched off in the ClusterPolicy drops the step.
    let mut facts = facts_for("v26.3.0", kubevirt.clone());
    facts.disabled.insert(Operand::CcManager);
    let v = update_with("n", &node, &node, &facts, &Policy::default());
    assert!(
        !v.findings
            .iter()
            .any(|f| f.message.contains("cc-manager step"))
    );
}

/// A vm-passthrough and a vm-vgpu node with every component of their workload labelled on.
fn sandbox_nodes() -> (Labels, Labels) {
    let gpu = [
        ("feature.node.kubernetes.io/pci-10de.present", "true"),
        ("nvidia.com/gpu.present", "true"),
    ];
    let passthrough = with(
        &labels(&gpu),
        &[
            ("nvidia.com/gpu.workload.config", Some("vm-passthrough")),
            ("sandbox-validator", Some("true")),
            ("sandbox-device-plugin", Some("true")),
            ("vfio-manager", Some("true")),
            ("kata-manager", Some("true")),
            ("cc-manager", Some("true")),
        ],
    );
    let vgpu = with(
        &labels(&gpu),
        &[
            ("nvidia.com/gpu.workload.config", Some("vm-vgpu")),
            ("sandbox-validator", Some("true")),
            ("sandbox-device-plugin", Some("true")),
            ("vgpu-manager", Some("true")),
            ("vgpu-device-manager", Some("true")),
            ("cc-manager", Some("true")),
        ],
    );
    (passthrough, vgpu)
}

/// Sandbox workloads on in kubevirt mode, under this version.
fn kubevirt_facts(version: &str) -> ClusterFacts {
    facts_for(
        version,
        sandbox_on(crate::core::operands::SandboxMode::KubeVirt),
    )
}

/// The `operand-without-sandbox-validator` findings of an update: whether new, and the message.
fn sandbox_stuck(facts: &ClusterFacts, old: &Labels, new: &Labels) -> Vec<(Change, String)> {
    update_with("n", old, new, facts, &Policy::default())
        .findings
        .into_iter()
        .filter(|f| f.rule == Rule::OperandWithoutSandboxValidator)
        .map(|f| (f.change, f.message))
        .collect::<Vec<_>>()
}

/// The sandbox validator's later steps stop on a missing component as the cc-manager step
/// does: vfio-pci on vm-passthrough nodes (here), vgpu-manager and vgpu-devices on vm-vgpu
/// nodes, and, before v26.7, a vGPU device manager that waits for the operator's vGPU manager
/// only (the tests below).
#[test]
fn a_sandbox_validator_step_whose_component_does_not_run_hangs_the_sandbox_operands() {
    let (passthrough, vgpu) = sandbox_nodes();
    let stuck = sandbox_stuck;
    let v25 = kubevirt_facts("v25.3.4");
    let v26_7 = kubevirt_facts("v26.7.0");

    // Every component running: nothing, on either workload and version.
    for facts in [&v25, &v26_7] {
        assert!(stuck(facts, &passthrough, &passthrough).is_empty());
        assert!(stuck(facts, &vgpu, &vgpu).is_empty());
    }

    // vfio-manager labelled off: the vfio-pci step fails for ever, the sandbox device plugin hangs.
    let no_vfio = with(&passthrough, &[("vfio-manager", Some("false"))]);
    let found = stuck(&v25, &passthrough, &no_vfio);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, Change::New);
    assert!(
        found[0].1.contains("vfio-pci step") && found[0].1.contains("sandbox-device-plugin"),
        "{}",
        found[0].1
    );
    // Switched off in the ClusterPolicy, the GPUs are bound by other means: nothing.
    let mut own_vfio = v25.clone();
    own_vfio.disabled.insert(Operand::VfioManager);
    assert!(stuck(&own_vfio, &passthrough, &no_vfio).is_empty());
}

#[test]
fn a_vgpu_step_whose_component_does_not_run_hangs_the_sandbox_operands() {
    let (_, vgpu) = sandbox_nodes();
    let stuck = sandbox_stuck;
    let v25 = kubevirt_facts("v25.3.4");
    let v26_7 = kubevirt_facts("v26.7.0");

    // vgpu-manager labelled off: the vgpu-manager step waits; both the sandbox device plugin
    // and the vGPU device manager hang behind it.
    let no_manager = with(&vgpu, &[("vgpu-manager", Some("false"))]);
    for facts in [&v25, &v26_7] {
        let found = stuck(facts, &vgpu, &no_manager);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].1.contains("vgpu-manager step")
                && found[0]
                    .1
                    .contains("sandbox-device-plugin, vgpu-device-manager"),
            "{}",
            found[0].1
        );
    }

    // vgpu-device-manager labelled off: the vgpu-devices step waits; the sandbox device plugin hangs.
    let no_devices = with(&vgpu, &[("vgpu-device-manager", Some("false"))]);
    let found = stuck(&v25, &vgpu, &no_devices);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].1.contains("vgpu-devices step") && found[0].1.contains("sandbox-device-plugin"),
        "{}",
        found[0].1
    );
}

#[test]
fn a_host_installed_vgpu_manager_hangs_the_vgpu_device_manager_before_v26_7() {
    let (_, vgpu) = sandbox_nodes();
    let stuck = sandbox_stuck;
    let v25 = kubevirt_facts("v25.3.4");
    let v26_7 = kubevirt_facts("v26.7.0");

    // A host-installed vGPU manager (switched off in the ClusterPolicy): before v26.7 the
    // device manager waits for the operator's one for ever; v26.7 accepts the host's.
    let mut host = v25.clone();
    host.disabled.insert(Operand::VgpuManager);
    let found = stuck(&host, &vgpu, &vgpu);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, Change::Existing);
    assert!(
        found[0].1.contains("host-vgpu-manager-ready")
            && found[0].1.contains("GPU Operator v25.3.4"),
        "{}",
        found[0].1
    );
    let mut host = v26_7.clone();
    host.disabled.insert(Operand::VgpuManager);
    assert!(stuck(&host, &vgpu, &vgpu).is_empty());
}

#[test]
fn the_validator_has_no_cc_manager_step_before_v23_6() {
    let (passthrough, _) = sandbox_nodes();
    let stuck = sandbox_stuck;
    let v25 = kubevirt_facts("v25.3.4");

    // Before v23.6 the validator has no cc-manager step: a cc-capable node without one is fine.
    let cc = with(
        &passthrough,
        &[
            ("nvidia.com/cc.capable", Some("true")),
            ("cc-manager", Some("false")),
        ],
    );
    assert!(stuck(&kubevirt_facts("v23.3.0"), &passthrough, &cc).is_empty());
    assert_eq!(stuck(&v25, &passthrough, &cc).len(), 1);
}

/// The GPUCluster (DRA) stack: no device plugin or toolkit runs, a device-plugin label is
/// swept, and the DRA validator, DCGM and DCGM exporter stay Pending without the DRA kubelet
/// plugin.
#[test]
fn on_the_gpu_cluster_stack_the_dra_operands_need_the_kubelet_plugin() {
    let dra = labels(&[
        ("feature.node.kubernetes.io/pci-10de.present", "true"),
        ("nvidia.com/gpu.present", "true"),
        ("driver", "true"),
        ("dra-driver", "true"),
        ("dra-validator", "true"),
        ("dcgm-dra", "true"),
        ("dcgm-exporter-dra", "true"),
    ]);
    let mut facts = facts_for("v26.7.0", Default::default());
    facts.stack = crate::core::operands::Stack::GpuCluster;
    // The GPUCluster's defaults: no standalone DCGM host engine.
    facts.disabled = OperandSet::of(&[Operand::DcgmDra]);
    let runs = simulate(&dra, &facts);
    assert_eq!(
        runs.iter().map(Operand::name).collect::<Vec<_>>(),
        ["driver", "dra-driver", "dra-validator", "dcgm-exporter-dra"]
    );
    let v = update_with("n", &dra, &dra, &facts, &Policy::default());
    assert!(v.findings.is_empty(), "{:?}", v.findings);

    // The kubelet plugin labelled off: the validator and the exporter stay Pending.
    let off = with(&dra, &[("dra-driver", Some("false"))]);
    let v = update_with("n", &dra, &off, &facts, &Policy::default());
    let found: Vec<_> = v
        .findings
        .iter()
        .filter(|f| f.rule == Rule::OperandWithoutDraDriver)
        .collect();
    assert_eq!(found.len(), 1, "{:?}", v.findings);
    assert_eq!(found[0].change, Change::New);
    assert_eq!(found[0].action, Action::Warn);
    assert!(
        found[0]
            .message
            .contains("dra-validator, dcgm-exporter-dra run without the DRA kubelet plugin")
            && found[0]
                .message
                .contains("this request sets nvidia.com/gpu.deploy.dra-driver=\"false\""),
        "{}",
        found[0].message
    );
    assert!(v.allowed());

    // A device plugin without a toolkit selects no DaemonSet here: no refusal, and the
    // operator's pass sweeps the label.
    let plugin = with(&dra, &[("device-plugin", Some("true"))]);
    let v = update_with("n", &dra, &plugin, &facts, &Policy::default());
    assert!(v.allowed());
    assert!(
        !v.findings
            .iter()
            .any(|f| f.rule == Rule::DevicePluginWithoutToolkit)
    );
    let sweep = v
        .findings
        .iter()
        .find(|f| f.rule == Rule::OperatorWillRestore)
        .expect("the sweep is said");
    assert!(
        sweep
            .message
            .contains("sweeps it on its next labelling pass")
            && sweep
                .message
                .contains("GPUCluster (DRA) stack's deploy labels"),
        "{}",
        sweep.message
    );
    // The same request under a ClusterPolicy is refused.
    let policy = facts_for("v26.7.0", Default::default());
    let v = update_with("n", &dra, &plugin, &policy, &Policy::default());
    assert!(!v.allowed());
    // And on the ClusterPolicy stack the DRA operands run nowhere: no DRA finding.
    let v = update_with("n", &dra, &off, &policy, &Policy::default());
    assert!(
        !v.findings
            .iter()
            .any(|f| f.rule == Rule::OperandWithoutDraDriver)
    );
}

#[test]
fn a_refusal_during_a_pause_says_to_wait_for_it_never_to_set_the_paused_label_true() {
    // A driver upgrade paused the toolkit, the device plugin and the validator; a tool (as
    // NVSentinel's janitor does) writes the device plugin back to `true` in the middle of it.
    let paused = with(
        &lab_node_0(),
        &[
            ("device-plugin", Some("paused-for-driver-upgrade")),
            ("container-toolkit", Some("paused-for-driver-upgrade")),
            ("operator-validator", Some("paused-for-driver-upgrade")),
        ],
    );
    let new = with(&paused, &[("device-plugin", Some("true"))]);
    let v = update("lab-node-0", &paused, &new);
    assert_eq!(v.decision, Decision::Denied, "{:?}", v.findings);
    let m = v.message.as_deref().unwrap();
    assert!(
        m.contains(
            "is k8s-driver-manager's pause, which it writes back when the driver upgrade ends"
        ) && m.contains("instead of setting nvidia.com/gpu.deploy.container-toolkit=true by hand")
            && !m.contains("set nvidia.com/gpu.deploy.container-toolkit=true in the same command"),
        "{m}"
    );
    let validator = v
        .findings
        .iter()
        .find(|f| f.rule == Rule::OperandWithoutValidator)
        .expect("the paused validator is named");
    assert!(
        validator.message.contains("k8s-driver-manager's pause")
            && !validator
                .message
                .contains("; set nvidia.com/gpu.deploy.operator-validator=true"),
        "{}",
        validator.message
    );
    // A pause value the request writes itself is a person's: the usual advice (as the CEL
    // fallback policy gives it); outside a pause the fix is still to set the label.
    for toolkit in ["paused-for-driver-upgrade", "false"] {
        let new = with(&lab_node_0(), &[("container-toolkit", Some(toolkit))]);
        let v = update("lab-node-0", &lab_node_0(), &new);
        assert!(
            v.message
                .as_deref()
                .unwrap()
                .contains("keep nvidia.com/gpu.deploy.container-toolkit=true"),
            "{toolkit}: {:?}",
            v.message
        );
    }
}

#[test]
fn the_dcgm_exporter_without_the_standalone_dcgm_warns_where_the_cluster_runs_it() {
    let found = |dcgm_on: bool| {
        let mut f = facts_for("v25.3.4", crate::core::operator::Sandbox::default());
        if !dcgm_on {
            f.disabled.insert(Operand::Dcgm);
        }
        f
    };
    let with_dcgm = with(&lab_node_0(), &[("dcgm", Some("true"))]);
    let dcgm_off = with(&with_dcgm, &[("dcgm", Some("false"))]);
    let rules = |facts: &ClusterFacts, old: &Labels, new: &Labels| -> Vec<Rule> {
        update_with("lab-node-0", old, new, facts, &Policy::default())
            .findings
            .iter()
            .map(|f| f.rule)
            .collect()
    };
    // A ClusterPolicy that runs DCGM (spec.dcgm.enabled, on when absent): warned, new.
    let v = update_with(
        "lab-node-0",
        &with_dcgm,
        &dcgm_off,
        &found(true),
        &Policy::default(),
    );
    assert_eq!(v.decision, Decision::Allowed);
    let f = v
        .findings
        .iter()
        .find(|f| f.rule == Rule::DcgmExporterWithoutDcgm)
        .expect("dcgm-exporter-without-dcgm");
    assert_eq!((f.action, f.change), (Action::Warn, Change::New));
    assert!(
        f.message
            .contains("nvidia.com/gpu.deploy.dcgm=\"false\" keeps the standalone DCGM off")
            && f.message.contains("internalTrafficPolicy: Local"),
        "{}",
        f.message
    );
    // Turning the exporter off with it, or a ClusterPolicy without the standalone DCGM: nothing.
    let both_off = with(&dcgm_off, &[("dcgm-exporter", Some("false"))]);
    assert!(!rules(&found(true), &with_dcgm, &both_off).contains(&Rule::DcgmExporterWithoutDcgm));
    assert!(!rules(&found(false), &with_dcgm, &dcgm_off).contains(&Rule::DcgmExporterWithoutDcgm));
    // An absent label the operator adds back, a paused one its component writes back: nothing.
    let removed = with(&with_dcgm, &[("dcgm", None)]);
    let paused = with(&with_dcgm, &[("dcgm", Some("paused-for-mig-change"))]);
    for new in [&removed, &paused] {
        assert!(!rules(&found(true), &with_dcgm, new).contains(&Rule::DcgmExporterWithoutDcgm));
    }
    // No ClusterPolicy read: the DaemonSets decide; with neither, nothing is assumed (the Helm
    // chart renders dcgm.enabled: false).
    let mut seen = ClusterFacts::default();
    assert!(!rules(&seen, &with_dcgm, &dcgm_off).contains(&Rule::DcgmExporterWithoutDcgm));
    seen.daemonsets = Some(OperandSet::of(&[Operand::DcgmExporter]));
    assert!(!rules(&seen, &with_dcgm, &dcgm_off).contains(&Rule::DcgmExporterWithoutDcgm));
    seen.daemonsets = Some(OperandSet::of(&[Operand::DcgmExporter, Operand::Dcgm]));
    assert!(rules(&seen, &with_dcgm, &dcgm_off).contains(&Rule::DcgmExporterWithoutDcgm));
    // Already so: said as existing.
    let v = update_with(
        "lab-node-0",
        &dcgm_off,
        &dcgm_off,
        &found(true),
        &Policy::default(),
    );
    assert!(
        v.findings
            .iter()
            .any(|f| f.rule == Rule::DcgmExporterWithoutDcgm && f.change == Change::Existing),
        "{:?}",
        v.findings
    );
}

#[test]
fn nfd_labels_lost_says_what_the_operator_will_do_and_what_it_did() {
    let pci = "feature.node.kubernetes.io/pci-10de.present";
    let lost = with(&lab_node_0(), &[(pci, None)]);
    let rules = |v: &Verdict| -> Vec<(Rule, Change)> {
        v.findings.iter().map(|f| (f.rule, f.change)).collect()
    };
    // NFD's label goes in the request (as `check` judges it): new, a warning.
    let v = update("lab-node-0", &lab_node_0(), &lost);
    assert_eq!(v.decision, Decision::Allowed);
    assert_eq!(rules(&v), [(Rule::NfdLabelsLost, Change::New)]);
    let m = &v.findings[0].message;
    assert!(
        m.contains("while nvidia.com/gpu.present=true: the GPU Operator's next labelling pass sets nvidia.com/gpu.present=false and deletes every nvidia.com/gpu.deploy.* label")
            && m.contains("gpu-operator#1469"),
        "{m}"
    );
    // Any later edit of such a node: existing.
    let edited = with(&lost, &[("dcgm-exporter", Some("false"))]);
    let v = update("lab-node-0", &lost, &edited);
    assert_eq!(rules(&v), [(Rule::NfdLabelsLost, Change::Existing)]);
    // The operator has done it: gpu.present=false, no deploy label; still found, in the past.
    let swept = labels(&[("nvidia.com/gpu.present", "false")]);
    let found = assess(
        "lab-node-0",
        &swept,
        &NodePlacement::default(),
        &crate::core::facts::operator_defaults(),
        &Policy::default(),
    );
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].message.starts_with(
            "node lab-node-0: nvidia.com/gpu.present=false and no NFD NVIDIA PCI label"
        ),
        "{}",
        found[0].message
    );
    // Any of NFD's three PCI labels counts; a node the operator never counted is no loss.
    for key in [
        "feature.node.kubernetes.io/pci-0302_10de.present",
        "feature.node.kubernetes.io/pci-0300_10de.present",
    ] {
        let back = with(&lost, &[(key, Some("true"))]);
        assert!(update("lab-node-0", &lost, &back).findings.is_empty());
    }
    assert!(
        assess(
            "lab-node-2",
            &lab_node_2(),
            &NodePlacement::default(),
            &crate::core::facts::operator_defaults(),
            &Policy::default()
        )
        .is_empty()
    );
}

#[test]
fn a_device_plugin_outside_the_operator_is_judged_and_an_unknown_one_said() {
    use crate::core::foreign::ForeignPlugin;
    use crate::core::seen::Seen;
    let standalone = ForeignPlugin {
        namespace: "nvdp".into(),
        name: "nvdp-nvidia-device-plugin".into(),
        node_selector: [("nvidia.com/gpu.present".to_owned(), "true".to_owned())].into(),
        placement: crate::core::placement::PodPlacement::default(),
    };
    let old = lab_node_0();
    let off = with(
        &old,
        &[
            ("device-plugin", Some("false")),
            ("container-toolkit", Some("false")),
            ("gpu-feature-discovery", Some("false")),
            ("dcgm-exporter", Some("false")),
        ],
    );
    // Known: beside the operator's plugin already; the request leaves it without a toolkit.
    let mut facts = ClusterFacts {
        foreign_plugins: Seen::Known(std::sync::Arc::new(vec![standalone])),
        ..ClusterFacts::default()
    };
    let v = update_with("lab-node-0", &old, &old, &facts, &Policy::default());
    assert_eq!(
        rules(&v),
        [(Rule::ForeignDevicePlugin, Action::Warn, Change::Existing)]
    );
    let v = update_with("lab-node-0", &old, &off, &facts, &Policy::default());
    assert_eq!(
        rules(&v),
        [(Rule::ForeignDevicePlugin, Action::Warn, Change::New)]
    );
    assert!(
        v.findings[0].message.contains(
            "the device plugin DaemonSet nvdp/nvdp-nvidia-device-plugin, not the GPU Operator's, \
             runs there without the operator's container toolkit"
        ),
        "{}",
        v.findings[0].message
    );
    // Unknown: the same request is judged as if one ran there, and says why.
    facts.foreign_plugins = Seen::Unknown("RBAC forbids listing daemonsets.apps".into());
    let v = update_with("lab-node-0", &old, &off, &facts, &Policy::default());
    assert_eq!(
        rules(&v),
        [(Rule::ForeignDevicePlugin, Action::Warn, Change::New)]
    );
    assert!(
        v.findings[0]
            .message
            .contains("cannot be told (RBAC forbids listing daemonsets.apps)"),
        "{}",
        v.findings[0].message
    );
    // An edit that keeps the toolkit says nothing; not read at all, nothing either.
    let v = update_with("lab-node-0", &old, &old, &facts, &Policy::default());
    assert!(rules(&v).is_empty(), "{:?}", rules(&v));
    facts.foreign_plugins = Seen::NotRead;
    let v = update_with("lab-node-0", &old, &off, &facts, &Policy::default());
    assert!(rules(&v).is_empty(), "{:?}", rules(&v));
}
