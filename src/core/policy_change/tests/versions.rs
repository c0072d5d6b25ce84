//! GPU-policy changes the operator carries out differently per version
//! (`docs/gpu-operator.md` §11.3, §11.6, §11.8): NVIDIADrivers under `useNvidiaDriverCRD`, and
//! CDI's default.

use super::*;
use crate::core::facts::PolicySource;
use crate::core::operands::NFD_OS_KEYS;
use std::collections::BTreeMap;

/// Every release the model was read at; the behaviours below change between them.
const RELEASES: [&str; 5] = ["v24.9.2", "v25.3.4", "v25.10.1", "v26.3.3", "v26.7.0"];

/// A cluster with ClusterPolicy `cluster-policy` at `version`, `useNvidiaDriverCRD` as given,
/// and the NVIDIADrivers listed.
fn policy_at(version: &str, driver_crd: bool) -> ClusterFacts {
    switched(|f| {
        at(version)(f);
        f.source = PolicySource::Found("cluster-policy".into());
        f.driver_crd = driver_crd;
        f.nvidia_drivers = Some(Vec::new());
    })
}

/// Two GPU nodes in pool a, one in pool b.
fn pools() -> Vec<NodeGroup<'static>> {
    vec![
        group(gpu_labels_with("pool", "a"), &["a-0", "a-1"]),
        group(gpu_labels_with("pool", "b"), &["b-0"]),
    ]
}

fn driver_shift(review: &PolicyReview<'_>, groups: &[NodeGroup<'_>]) -> (Vec<String>, Vec<String>) {
    shifts(review, groups)
        .into_iter()
        .find(|s| s.operand == Operand::Driver)
        .map(|s| (s.starts, s.stops))
        .unwrap_or_default()
}

fn ids(v: &Verdict) -> Vec<&'static str> {
    v.findings.iter().map(|f| f.rule.id()).collect()
}

#[test]
fn an_nvidiadriver_created_with_the_flag_off_runs_beside_the_policy_driver_until_v26_3() {
    let pool_a = driver("pool-a", &[("pool", "a")]);
    for version in RELEASES {
        let facts = policy_at(version, false);
        let review = nd_review(&facts, Operation::Create, None, Some(&pool_a), &[]);
        let v = over(&review, &pools());
        assert_eq!(v.decision, Decision::Allowed, "{version}: {:?}", v.findings);
        // The ClusterPolicy's driver serves every node before and after: nothing moves.
        assert_eq!(
            driver_shift(&review, &pools()),
            Default::default(),
            "{version}"
        );
        if facts.operator.era().disables_nvidia_drivers_when_crd_off() {
            assert_eq!(ids(&v), ["nvidia-driver-not-reconciled"], "{version}");
            let m = &v.findings[0].message;
            assert!(
                m.contains("ClusterPolicy cluster-policy has spec.driver.useNvidiaDriverCRD off")
                    && m.contains(&format!(
                        "GPU Operator {version} sets this NVIDIADriver's status disabled"
                    )),
                "{m}"
            );
        } else {
            assert_eq!(ids(&v), ["driver-selected-twice"], "{version}");
            let m = &v.findings[0].message;
            assert!(
                m.contains(&format!(
                    "GPU Operator {version} reconciles NVIDIADrivers whatever the flag"
                )) && m.contains("starts on 2 nodes (a-0, a-1) where nvidia-driver-daemonset runs")
                    && m.contains("Pending"),
                "{m}"
            );
        }
        // With the flag on, it is the driver of pool a, and nothing else is said.
        let on = policy_at(version, true);
        let review = nd_review(&on, Operation::Create, None, Some(&pool_a), &[]);
        let v = over(&review, &pools());
        assert!(v.findings.is_empty(), "{version}: {:?}", v.findings);
        assert_eq!(
            driver_shift(&review, &pools()),
            (vec!["a-0".to_owned(), "a-1".to_owned()], Vec::new()),
            "{version}"
        );
    }
}

#[test]
fn with_the_flag_off_a_selector_change_or_a_delete_leaves_the_policy_driver() {
    let pool_a = driver("pool", &[("pool", "a")]);
    let pool_b = driver("pool", &[("pool", "b")]);
    for version in RELEASES {
        let facts = policy_at(version, false);
        let moved = nd_review(&facts, Operation::Update, Some(&pool_a), Some(&pool_b), &[]);
        let v = over(&moved, &pools());
        assert_eq!(
            driver_shift(&moved, &pools()),
            Default::default(),
            "{version}"
        );
        let want: &[&str] = if facts.operator.era().disables_nvidia_drivers_when_crd_off() {
            &["nvidia-driver-not-reconciled"]
        } else {
            // Pool b newly gets a second driver DaemonSet; pool a already had one.
            &["driver-selected-twice"]
        };
        assert_eq!(ids(&v), want, "{version}: {:?}", v.findings);
        if want == ["driver-selected-twice"] {
            assert!(v.findings[0].message.contains("starts on 1 node (b-0)"));
        }
        // Deleted: its DaemonSets go (garbage collection), the ClusterPolicy's stays.
        let deleted = nd_review(&facts, Operation::Delete, Some(&pool_a), None, &[]);
        let v = over(&deleted, &pools());
        assert!(v.findings.is_empty(), "{version}: {:?}", v.findings);
        // With the flag on, the same delete leaves pool a without a driver.
        let on = policy_at(version, true);
        let deleted = nd_review(&on, Operation::Delete, Some(&pool_a), None, &[]);
        let v = over(&deleted, &pools());
        assert_eq!(ids(&v), ["driver-removed"], "{version}");
        assert_eq!(
            driver_shift(&deleted, &pools()),
            (Vec::new(), vec!["a-0".to_owned(), "a-1".to_owned()]),
            "{version}"
        );
    }
}

#[test]
fn without_a_cluster_policy_nvidiadrivers_deploy_nothing_before_v26_7() {
    let pool_a = driver("pool-a", &[("pool", "a")]);
    for version in RELEASES {
        let facts = switched(|f| {
            at(version)(f);
            f.source = PolicySource::Missing("no ClusterPolicy exists".into());
            f.nvidia_drivers = Some(Vec::new());
        });
        let review = nd_review(&facts, Operation::Create, None, Some(&pool_a), &[]);
        let v = over(&review, &pools());
        if facts.operator.era().nvidia_drivers_need_cluster_policy() {
            assert_eq!(ids(&v), ["nvidia-driver-not-reconciled"], "{version}");
            assert!(
                v.findings[0]
                    .message
                    .contains("no ClusterPolicy object found")
            );
            assert_eq!(driver_shift(&review, &pools()), Default::default());
        } else {
            assert!(v.findings.is_empty(), "{version}: {:?}", v.findings);
        }
    }
    // Offline, with no ClusterPolicy given, the flag is not known: the change is judged by
    // what it does when carried out, and nothing says it is not.
    let unknown = switched(|f| f.nvidia_drivers = Some(Vec::new()));
    let review = nd_review(&unknown, Operation::Create, None, Some(&pool_a), &[]);
    assert!(!ids(&over(&review, &pools())).contains(&"nvidia-driver-not-reconciled"));
}

#[test]
fn cdi_switched_off_deletes_its_runtime_classes_with_the_version_s_default() {
    let groups = [group(gpu_labels(), &["gpu-0"])];
    let cdi = |version: &str, cdi: Option<bool>| {
        let mut f = policy_at(version, false);
        f.cdi = cdi;
        f
    };
    for version in RELEASES {
        let on_by_default = !matches!(version, "v24.9.2" | "v25.3.4");
        assert_eq!(cdi(version, None).cdi_enabled(), on_by_default, "{version}");
        for (before, after, warns) in [
            (Some(true), Some(false), true),
            (None, Some(false), on_by_default),
            (Some(true), None, !on_by_default),
            (Some(false), Some(true), false),
            (None, None, false),
        ] {
            let (b, a) = (cdi(version, before), cdi(version, after));
            let v = over(&cp_review(&b, &a, None), &groups);
            let found = of_rule(&v, Rule::RuntimeClassesRemoved);
            assert_eq!(
                found.len(),
                usize::from(warns),
                "{version} {before:?} -> {after:?}: {:?}",
                v.findings
            );
            if let Some(f) = found.first() {
                assert!(
                    f.message
                        .contains("deletes the RuntimeClasses nvidia-cdi and nvidia-legacy")
                        && f.message.contains("on 1 node"),
                    "{}",
                    f.message
                );
                assert_eq!(
                    f.message.contains("unset (on by default"),
                    before.is_none(),
                    "{}",
                    f.message
                );
            }
        }
    }
    // A first ClusterPolicy with CDI off deletes nothing: no RuntimeClass existed.
    let none = switched(at("v26.7.0"));
    let first = cdi("v26.7.0", Some(false));
    let mut review = cp_review(&none, &first, None);
    review.operation = Operation::Create;
    assert!(of_rule(&over(&review, &groups), Rule::RuntimeClassesRemoved).is_empty());
    // Under the NRI plugin (v26.3+) the RuntimeClasses are gone already.
    let mut nri = cdi("v26.3.3", Some(true));
    nri.nri_plugin = true;
    let mut off = nri.clone();
    off.cdi = Some(false);
    assert!(
        of_rule(
            &over(&cp_review(&nri, &off, None), &groups),
            Rule::RuntimeClassesRemoved
        )
        .is_empty()
    );
}

#[test]
fn a_selector_that_picks_no_node_applies_nothing_before_v26_3_and_deletes_everything_after() {
    let pool_a = driver("pool", &[("pool", "a")]);
    let pool_c = driver("pool", &[("pool", "c")]);
    for version in RELEASES {
        let facts = policy_at(version, true);
        let review = nd_review(&facts, Operation::Update, Some(&pool_a), Some(&pool_c), &[]);
        let v = over(&review, &pools());
        if facts.operator.era().keeps_dropped_driver_pools() {
            assert_eq!(ids(&v), ["nvidia-driver-not-reconciled"], "{version}");
            assert!(
                v.findings[0]
                    .message
                    .contains("no nodes matching the given node selector")
            );
            assert_eq!(
                driver_shift(&review, &pools()),
                Default::default(),
                "{version}"
            );
        } else {
            assert_eq!(ids(&v), ["driver-removed"], "{version}: {:?}", v.findings);
            assert_eq!(
                driver_shift(&review, &pools()),
                (Vec::new(), vec!["a-0".to_owned(), "a-1".to_owned()]),
                "{version}"
            );
        }
    }
}

/// The labels of a GPU node in `pool` on this OS.
fn on_os(pool: &str, id: &str, version: &str) -> Labels {
    let mut l = gpu_labels_with("pool", pool);
    l.insert(NFD_OS_KEYS[0].into(), id.into());
    l.insert(NFD_OS_KEYS[1].into(), version.into());
    l
}

/// A driver DaemonSet's nodeSelector for one OS pool of a `pool=<pool>` NVIDIADriver (v25.3).
fn pool_selector(pool: &str, id: &str, version: &str) -> Labels {
    let mut l = labels(&[
        ("driver", "true"),
        ("nvidia.com/gpu.present", "true"),
        (NFD_OS_KEYS[0], id),
        (NFD_OS_KEYS[1], version),
    ]);
    l.insert("pool".into(), pool.into());
    l
}

#[test]
fn the_live_daemonsets_say_what_runs_and_a_pool_still_rendered_is_updated_in_place() {
    // The e2e oracle's sequence on GPU Operator v25.3.4 (`tests/e2e/oracle/nvidiadriver_test.go`).
    let groups = vec![
        group(on_os("a", "ubuntu", "22.04"), &["a1"]),
        group(on_os("a", "rhel", "9.4"), &["a2"]),
        group(on_os("b", "ubuntu", "22.04"), &["b1"]),
        group(on_os("b", "ubuntu", "24.04"), &["b2"]),
    ];
    let with_live = |live: Vec<Labels>| {
        let mut f = policy_at("v25.3.4", true);
        f.nvidia_driver_daemonsets = Some(BTreeMap::from([("pool".to_owned(), live)]));
        f
    };
    let (a, b, c) = (
        driver("pool", &[("pool", "a")]),
        driver("pool", &[("pool", "b")]),
        driver("pool", &[("pool", "c")]),
    );
    // pool=a -> pool=b: the ubuntu 22.04 pool is rendered again (b1), so its DaemonSet moves
    // from a1 to b1; the rhel pool is not, and keeps running on a2 with pool=a.
    let facts = with_live(vec![
        pool_selector("a", "ubuntu", "22.04"),
        pool_selector("a", "rhel", "9.4"),
    ]);
    let review = nd_review(&facts, Operation::Update, Some(&a), Some(&b), &[]);
    assert_eq!(
        driver_shift(&review, &groups),
        (
            vec!["b1".to_owned(), "b2".to_owned()],
            vec!["a1".to_owned()]
        )
    );
    let v = over(&review, &groups);
    assert_eq!(ids(&v), ["driver-removed"]);
    assert!(
        v.warnings[0].contains("1 node loses the driver DaemonSet (a1)"),
        "{:?}",
        v.warnings
    );
    // What the operator leaves: pool=b DaemonSets for both ubuntu pools, the rhel one kept.
    let facts = with_live(vec![
        pool_selector("a", "rhel", "9.4"),
        pool_selector("b", "ubuntu", "22.04"),
        pool_selector("b", "ubuntu", "24.04"),
    ]);
    // pool=b -> pool=c, which no node has: nothing applied; a2, b1, b2 keep their drivers.
    let review = nd_review(&facts, Operation::Update, Some(&b), Some(&c), &[]);
    let shift = shifts(&review, &groups)
        .into_iter()
        .find(|s| s.operand == Operand::Driver)
        .unwrap();
    assert_eq!((shift.before, shift.after), (3, 3));
    assert_eq!(
        ids(&over(&review, &groups)),
        ["nvidia-driver-not-reconciled"]
    );
    // Deleted: garbage collection takes every DaemonSet, the kept rhel one too.
    let review = nd_review(&facts, Operation::Delete, Some(&b), None, &[]);
    let v = over(&review, &groups);
    assert!(
        v.warnings[0].contains("3 nodes lose the driver DaemonSet (a2, b1, b2)"),
        "{:?}",
        v.warnings
    );
}

#[test]
fn switching_the_standalone_dcgm_on_warns_for_exporters_on_nodes_labelled_without_it() {
    let mut before = policy_at("v25.3.4", false);
    before.disabled.insert(Operand::Dcgm);
    let after = policy_at("v25.3.4", false);
    let groups = [
        group(
            gpu_labels_with("nvidia.com/gpu.deploy.dcgm", "false"),
            &["no-dcgm"],
        ),
        group(gpu_labels(), &["gpu-0"]),
    ];
    let v = over(&cp_review(&before, &after, None), &groups);
    let found = of_rule(&v, Rule::DcgmExporterWithoutDcgm);
    assert_eq!(found.len(), 1, "{:?}", v.findings);
    assert!(
        found[0]
            .message
            .contains("1 node fail dcgm-exporter-without-dcgm (no-dcgm)"),
        "{}",
        found[0].message
    );
    // Switched off again: the exporter runs on its own host engine, nothing to say.
    assert!(
        of_rule(
            &over(&cp_review(&after, &before, None), &groups),
            Rule::DcgmExporterWithoutDcgm
        )
        .is_empty()
    );
}
