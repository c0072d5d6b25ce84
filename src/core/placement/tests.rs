use super::*;
use crate::core::operands::Labels;

fn node(taints: &[Taint]) -> NodePlacement {
    NodePlacement {
        taints: taints.to_vec(),
        unschedulable: false,
    }
}

/// The GPU Operator chart's default `spec.daemonsets.tolerations`.
fn gpu_operator_default() -> PodPlacement {
    PodPlacement::tolerating(vec![Toleration::exists(
        "nvidia.com/gpu",
        Some(Effect::NoSchedule),
    )])
}

fn place(pod: &PodPlacement, node: &NodePlacement) -> Placement {
    pod.place("gpu-0", &Labels::new(), true, node)
}

#[test]
fn an_untolerated_no_schedule_taint_keeps_a_running_pod_but_creates_none() {
    let xid = Taint::new("nvidia.com/gpu-xid-error", "79", Effect::NoSchedule);
    let p = place(&gpu_operator_default(), &node(std::slice::from_ref(&xid)));
    assert_eq!(p, Placement::Kept(xid));
    assert!(!p.creates());
    assert!(p.keeps_running());
    assert_eq!(p.state(true), PlacementState::StaysNotRecreated);
    assert_eq!(p.state(false), PlacementState::NotPlaced);
}

#[test]
fn an_untolerated_no_execute_taint_evicts() {
    let t = Taint::new("maintenance", "", Effect::NoExecute);
    let both = [Taint::new("a", "", Effect::NoSchedule), t.clone()];
    let p = place(&gpu_operator_default(), &node(&both));
    assert_eq!(
        p,
        Placement::Evicted(t),
        "NoExecute decides before NoSchedule"
    );
    assert!(!p.creates() && !p.keeps_running());
    assert_eq!(p.state(true), PlacementState::Evicted);
}

#[test]
fn prefer_no_schedule_and_tolerated_taints_place_the_pod() {
    let n = node(&[
        Taint::new("soft", "", Effect::PreferNoSchedule),
        Taint::new("nvidia.com/gpu", "present", Effect::NoSchedule),
    ]);
    assert_eq!(place(&gpu_operator_default(), &n), Placement::Placed);
    assert_eq!(
        place(&PodPlacement::default(), &node(&[])),
        Placement::Placed
    );
}

#[test]
fn the_operator_default_toleration_does_not_cover_no_execute_of_the_same_key() {
    let t = Taint::new("nvidia.com/gpu", "", Effect::NoExecute);
    assert_eq!(
        place(&gpu_operator_default(), &node(std::slice::from_ref(&t))),
        Placement::Evicted(t)
    );
}

#[test]
fn the_controller_tolerates_cordons_pressure_and_a_node_that_stops_reporting() {
    let cordoned = NodePlacement {
        taints: vec![],
        unschedulable: true,
    };
    assert_eq!(
        place(&PodPlacement::default(), &cordoned),
        Placement::Placed
    );
    for (key, effect) in [
        ("node.kubernetes.io/unschedulable", Effect::NoSchedule),
        ("node.kubernetes.io/not-ready", Effect::NoExecute),
        ("node.kubernetes.io/unreachable", Effect::NoExecute),
        ("node.kubernetes.io/disk-pressure", Effect::NoSchedule),
        ("node.kubernetes.io/memory-pressure", Effect::NoSchedule),
        ("node.kubernetes.io/pid-pressure", Effect::NoSchedule),
    ] {
        let n = node(&[Taint::new(key, "", effect)]);
        assert_eq!(
            place(&PodPlacement::default(), &n),
            Placement::Placed,
            "{key}"
        );
    }
    // The lifecycle controller also taints a NotReady node NoSchedule: that one is not added.
    let not_ready = Taint::new("node.kubernetes.io/not-ready", "", Effect::NoSchedule);
    assert_eq!(
        place(
            &PodPlacement::default(),
            &node(std::slice::from_ref(&not_ready))
        ),
        Placement::Kept(not_ready)
    );
}

#[test]
fn network_unavailable_is_tolerated_only_on_the_host_network() {
    let t = Taint::new(
        "node.kubernetes.io/network-unavailable",
        "",
        Effect::NoSchedule,
    );
    let n = node(std::slice::from_ref(&t));
    assert_eq!(place(&PodPlacement::default(), &n), Placement::Kept(t));
    let host = PodPlacement {
        host_network: true,
        ..PodPlacement::default()
    };
    assert_eq!(place(&host, &n), Placement::Placed);
}

#[test]
fn toleration_matching_follows_the_api() {
    let t = Taint::new("k", "v", Effect::NoSchedule);
    assert!(
        Toleration::exists("", None).tolerates(&t),
        "empty key, Exists: every taint"
    );
    assert!(
        Toleration::exists("k", None).tolerates(&t),
        "no effect: every effect"
    );
    assert!(Toleration::equal("k", "v", Some(Effect::NoSchedule)).tolerates(&t));
    assert!(!Toleration::equal("k", "w", Some(Effect::NoSchedule)).tolerates(&t));
    assert!(!Toleration::exists("k", Some(Effect::NoExecute)).tolerates(&t));
    assert!(!Toleration::exists("other", None).tolerates(&t));
    let no_value = Taint::new("k", "", Effect::NoSchedule);
    assert!(Toleration::equal("k", "", None).tolerates(&no_value));
}

#[test]
fn tolerations_the_api_server_refuses_are_named() {
    assert_eq!(
        Toleration::parse("k", "", "v", "NoSchedule"),
        Ok(Toleration::equal("k", "v", Some(Effect::NoSchedule))),
        "an empty operator is Equal"
    );
    assert_eq!(
        Toleration::parse("k", "Lt", "3", ""),
        Err(TolerationError::Operator("Lt".into()))
    );
    assert_eq!(
        Toleration::parse("k", "Exists", "", "NoRun"),
        Err(TolerationError::Effect("NoRun".into()))
    );
    assert_eq!(
        Toleration::parse("k", "Exists", "v", ""),
        Err(TolerationError::ValueWithExists("v".into()))
    );
    assert_eq!(
        Toleration::parse("", "Equal", "v", ""),
        Err(TolerationError::EqualWithoutKey)
    );
    let message = TolerationError::Operator("Lt".into()).to_string();
    assert!(message.contains("Exists and Equal"), "{message}");
    assert!(
        Effect::parse("NoRun")
            .unwrap_err()
            .contains("NoSchedule, PreferNoSchedule and NoExecute")
    );
    assert_eq!(Effect::parse("NoExecute"), Ok(Effect::NoExecute));
}

#[test]
fn taints_and_tolerations_print_as_kubectl_writes_them() {
    assert_eq!(
        Taint::new("nvidia.com/gpu-xid-error", "79", Effect::NoSchedule).to_string(),
        "nvidia.com/gpu-xid-error=79:NoSchedule"
    );
    assert_eq!(
        Taint::new("m", "", Effect::NoExecute).to_string(),
        "m:NoExecute"
    );
    assert_eq!(
        Toleration::exists("nvidia.com/gpu", Some(Effect::NoSchedule)).to_string(),
        "nvidia.com/gpu Exists:NoSchedule"
    );
    assert_eq!(Toleration::exists("", None).to_string(), "* Exists");
}

fn req(key: &str, op: SelectorOperator, values: &[&str]) -> Requirement {
    Requirement {
        key: key.into(),
        operator: op,
        values: values.iter().map(|v| v.to_string()).collect(),
    }
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn required_node_affinity_ors_terms_and_ands_requirements() {
    use SelectorOperator::*;
    let gpu = labels(&[("pool", "a100"), ("cores", "64")]);
    let term = |reqs: Vec<Requirement>| Term {
        match_expressions: reqs,
        match_fields: vec![],
    };
    let a = |terms: Vec<Term>| NodeAffinity { terms };
    assert!(a(vec![term(vec![req("pool", In, &["a100", "h100"])])]).matches("n", &gpu));
    assert!(!a(vec![term(vec![req("pool", NotIn, &["a100"])])]).matches("n", &gpu));
    assert!(
        a(vec![term(vec![req("zone", NotIn, &["x"])])]).matches("n", &gpu),
        "absent is not in"
    );
    assert!(a(vec![term(vec![req("zone", DoesNotExist, &[])])]).matches("n", &gpu));
    assert!(!a(vec![term(vec![req("zone", Exists, &[])])]).matches("n", &gpu));
    assert!(a(vec![term(vec![req("cores", Gt, &["32"])])]).matches("n", &gpu));
    assert!(!a(vec![term(vec![req("cores", Lt, &["32"])])]).matches("n", &gpu));
    assert!(
        !a(vec![term(vec![req("pool", Gt, &["1"])])]).matches("n", &gpu),
        "not a number"
    );
    assert!(!a(vec![term(vec![req("cores", Gt, &["1", "2"])])]).matches("n", &gpu));
    assert!(
        !a(vec![Term::default()]).matches("n", &gpu),
        "an empty term matches nothing"
    );
    assert!(!a(vec![]).matches("n", &gpu), "no term matches nothing");
    let both = a(vec![
        term(vec![req("pool", In, &["h100"])]),
        term(vec![req("pool", In, &["a100"]), req("cores", Exists, &[])]),
    ]);
    assert!(both.matches("n", &gpu));
    let by_name = a(vec![Term {
        match_expressions: vec![],
        match_fields: vec![req("metadata.name", In, &["gpu-0"])],
    }]);
    assert!(by_name.matches("gpu-0", &gpu) && !by_name.matches("gpu-1", &gpu));
    assert_eq!(
        both.label_keys().collect::<Vec<_>>(),
        ["pool", "pool", "cores"]
    );
    assert!(
        SelectorOperator::parse("Near")
            .unwrap_err()
            .contains("In, NotIn")
    );
}

#[test]
fn an_operand_its_affinity_or_selector_does_not_pick_is_not_selected() {
    let pod = PodPlacement {
        affinity: Some(NodeAffinity {
            terms: vec![Term {
                match_expressions: vec![req("pool", SelectorOperator::In, &["h100"])],
                match_fields: vec![],
            }],
        }),
        ..PodPlacement::default()
    };
    let tainted = node(&[Taint::new("x", "", Effect::NoExecute)]);
    let a100 = labels(&[("pool", "a100")]);
    assert_eq!(
        pod.place("n", &a100, true, &tainted),
        Placement::NotSelected
    );
    assert_eq!(
        PodPlacement::default().place("n", &a100, false, &tainted),
        Placement::NotSelected
    );
    assert_eq!(
        Placement::NotSelected.state(true),
        PlacementState::NotSelected
    );
}

#[test]
fn an_nvidia_drivers_own_tolerations_place_its_driver() {
    use crate::core::facts::operator_defaults;
    use crate::core::nvidia_driver::NvidiaDriver;
    use crate::core::operands::Operand;
    let labels: crate::core::operands::Labels = [
        ("nvidia.com/gpu.present", "true"),
        ("nvidia.com/gpu.deploy.driver", "true"),
        ("feature.node.kubernetes.io/system-os_release.ID", "ubuntu"),
        (
            "feature.node.kubernetes.io/system-os_release.VERSION_ID",
            "22.04",
        ),
        ("pool", "a"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    let node = NodePlacement {
        taints: vec![Taint::new("example.com/maint", "", Effect::NoSchedule)],
        unschedulable: false,
    };
    let pool = |key: &str, tolerations: Vec<Toleration>| NvidiaDriver {
        name: key.to_owned(),
        node_selector: Some([("pool".to_owned(), key.to_owned())].into()),
        vgpu_host_manager: false,
        precompiled: false,
        default: false,
        tolerations,
    };
    let mut facts = operator_defaults();
    facts.driver_crd = true;
    // Pool a's NVIDIADriver tolerates the taint, pool b's does not: the node is in pool a.
    facts.nvidia_drivers = Some(vec![
        pool("b", Vec::new()),
        pool("a", vec![Toleration::exists("example.com/maint", None)]),
    ]);
    assert_eq!(
        facts.place(Operand::Driver, "n", &labels, &node),
        Placement::Placed
    );
    facts.nvidia_drivers = Some(vec![pool("a", Vec::new())]);
    assert!(matches!(
        facts.place(Operand::Driver, "n", &labels, &node),
        Placement::Kept(_)
    ));
    // The ClusterPolicy's tolerations never reach an NVIDIADriver's driver.
    facts.templates.policy_tolerations = vec![Toleration::exists("example.com/maint", None)];
    assert!(matches!(
        facts.place(Operand::Driver, "n", &labels, &node),
        Placement::Kept(_)
    ));
}
