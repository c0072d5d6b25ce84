//! `gpu-deploy-guard check-policy`: exit codes, text and JSON, bad input named.

use std::process::Command;

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-deploy-guard"))
        .arg("check-policy")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const OLD: &str = "tests/fixtures/policy/cluster-policy.yaml";
const NODES: &str = "tests/fixtures/audit/lab/nodes.json";

#[test]
fn turning_the_toolkit_off_over_the_lab_is_denied_with_exit_1() {
    let (code, out, err) = run(&[
        "--old",
        OLD,
        "--new",
        "tests/fixtures/policy/cluster-policy-toolkit-off.yaml",
        "--nodes",
        NODES,
    ]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.starts_with("ClusterPolicy/cluster-policy UPDATE: denied (decided over 3 nodes)\n  deny  toolkit-switched-off: ClusterPolicy cluster-policy: spec.toolkit.enabled true -> false deletes the container toolkit DaemonSet while the NVIDIA device plugin keeps running on 2 nodes (lab-node-0, lab-node-1)"),
        "{out}"
    );
}

#[test]
fn the_driver_off_is_allowed_with_a_warning_in_json() {
    let (code, out, err) = run(&[
        "--old",
        OLD,
        "--new",
        "tests/fixtures/policy/cluster-policy-driver-off.yaml",
        "--nodes",
        NODES,
        "-o",
        "json",
        "--operator-version",
        "v25.3.4",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["decision"], "allowed");
    assert_eq!(v["nodes"], 3);
    assert_eq!(
        v["warnings"],
        serde_json::json!([
            "ClusterPolicy cluster-policy: 1 node loses the driver DaemonSet (lab-node-0)"
        ])
    );
    assert_eq!(v["findings"][0]["rule"], "driver-removed");
}

#[test]
fn an_unchanged_policy_has_no_finding() {
    let (code, out, _) = run(&["--old", OLD, "--new", OLD, "--nodes", NODES]);
    assert_eq!(code, 0);
    assert!(out.contains("  no finding\n"), "{out}");
}

#[test]
fn bad_input_is_named_with_exit_2() {
    let (code, _, err) = run(&["--nodes", NODES]);
    assert_eq!(code, 2);
    assert_eq!(
        err,
        "error: give --new (the object after the change), --old (before it), or both\n"
    );
    let (code, _, err) = run(&["--new", NODES, "--nodes", NODES]);
    assert_eq!(code, 2);
    assert!(
        err.starts_with("error: tests/fixtures/audit/lab/nodes.json: expected a nvidia.com/v1 ClusterPolicy, a nvidia.com NVIDIADriver or a nvidia.com/v1alpha1 GPUCluster"),
        "{err}"
    );
    let (code, _, err) = run(&["--new", "/nonexistent.yaml", "--nodes", NODES]);
    assert_eq!(code, 2);
    assert!(
        err.starts_with("error: cannot read /nonexistent.yaml"),
        "{err}"
    );
}

/// The `operands` of `check-policy -o json`, by operand: (before, after, starts, stops).
fn shifts(out: &str) -> std::collections::BTreeMap<String, (u64, u64, Vec<String>, Vec<String>)> {
    let v: serde_json::Value = serde_json::from_str(out).unwrap();
    let names = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap().to_owned())
            .collect()
    };
    v["operands"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["operand"].as_str().unwrap().to_owned(),
                (
                    s["before"].as_u64().unwrap(),
                    s["after"].as_u64().unwrap(),
                    names(&s["starts"]),
                    names(&s["stops"]),
                ),
            )
        })
        .collect()
}

#[test]
fn the_report_says_where_each_operand_starts_and_stops() {
    let driver_off = "tests/fixtures/policy/cluster-policy-driver-off.yaml";
    let (code, out, err) = run(&[
        "--old", OLD, "--new", driver_off, "--nodes", NODES, "-o", "json",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let s = shifts(&out);
    assert_eq!(
        s["driver"],
        (1, 0, vec![], vec!["lab-node-0".to_owned()]),
        "{out}"
    );
    assert_eq!(s["container-toolkit"], (2, 2, vec![], vec![]), "{out}");
    assert!(
        !s.contains_key("dcgm"),
        "disabled and running nowhere: {out}"
    );
    // Backwards, the driver starts where it stopped.
    let (_, out, _) = run(&[
        "--old", driver_off, "--new", OLD, "--nodes", NODES, "-o", "json",
    ]);
    assert_eq!(
        shifts(&out)["driver"],
        (0, 1, vec!["lab-node-0".to_owned()], vec![]),
        "{out}"
    );

    let (_, text, _) = run(&[
        "--old",
        OLD,
        "--new",
        "tests/fixtures/policy/cluster-policy-toolkit-off.yaml",
        "--nodes",
        NODES,
    ]);
    assert!(
        text.contains(
            "operands, on how many nodes now -> after the change:\n  container-toolkit            2 -> 0; stops on lab-node-0, lab-node-1\n  unchanged: driver (1), device-plugin (2)"
        ),
        "{text}"
    );
}

#[test]
fn the_real_daemonset_selectors_decide_where_operands_run() {
    // lab-gaps' gpu-feature-discovery DaemonSet also selects example.com/pool=a, which no lab
    // node has: with the DaemonSets given it runs nowhere, without them on both GPU nodes.
    let args = ["--old", OLD, "--new", OLD, "--nodes", NODES, "-o", "json"];
    let (_, out, _) = run(&args);
    assert_eq!(shifts(&out)["gpu-feature-discovery"].0, 2, "{out}");
    let mut with = args.to_vec();
    with.extend([
        "--daemonsets",
        "tests/fixtures/audit/lab-gaps/daemonsets.json",
    ]);
    let (code, out, err) = run(&with);
    assert_eq!(code, 0, "{out}{err}");
    let s = shifts(&out);
    assert!(!s.contains_key("gpu-feature-discovery"), "{out}");
    assert_eq!(s["device-plugin"].0, 2, "{out}");
    let (code, _, err) = run(&[
        "--old",
        OLD,
        "--new",
        OLD,
        "--nodes",
        NODES,
        "--daemonsets",
        OLD,
    ]);
    assert_eq!(code, 2);
    assert!(err.starts_with("error: "), "{err}");
}

/// A GPUCluster beside a ClusterPolicy, or a ClusterPolicy beside a GPUCluster, stops the
/// v26.7 operator: refused with exit 1. A GPUCluster alone is allowed, and the report says
/// the DRA stack replaces the device-plugin stack's operands. Before v26.7 there is no conflict.
#[test]
fn a_cluster_policy_and_a_gpu_cluster_at_once_are_refused() {
    const GC: &str = "tests/fixtures/policy/gpu-cluster.yaml";
    let (code, out, err) = run(&["--new", GC, "--cluster-policy", OLD, "--nodes", NODES]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.starts_with(
            "GPUCluster/gpu-cluster CREATE: denied (decided over 3 nodes)\n  deny  gpu-cluster-conflict: \
             GPUCluster gpu-cluster: ClusterPolicy cluster-policy exists"
        ),
        "{out}"
    );
    let (code, out, err) = run(&["--new", OLD, "--gpu-cluster", GC, "--nodes", NODES]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("deny  gpu-cluster-conflict: ClusterPolicy cluster-policy: GPUCluster gpu-cluster exists"),
        "{out}"
    );
    let (code, _, err) = run(&[
        "--new",
        OLD,
        "--gpu-cluster",
        GC,
        "--nodes",
        NODES,
        "--operator-version",
        "v25.3.4",
    ]);
    assert_eq!(code, 0, "{err}");

    let (code, out, err) = run(&["--new", GC, "--nodes", NODES, "-o", "json"]);
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["decision"], "allowed");
    let after = |name: &str| {
        v["operands"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["operand"] == name)
            .map(|o| (o["before"].as_u64().unwrap(), o["after"].as_u64().unwrap()))
    };
    assert_eq!(after("device-plugin"), Some((2, 0)), "{out}");
    assert_eq!(after("dra-driver"), Some((0, 2)), "{out}");
    assert_eq!(after("dcgm-dra"), None, "off unless spec.dcgm.enabled");
}

/// An NVIDIADriver whose nodeSelector reads a label no other selector reads (the hostname):
/// offline the nodes file has every label, so its overlap is judged in full, where the webhook
/// first reads that label from the nodes.
#[test]
fn an_nvidiadriver_on_a_label_no_other_selector_reads_is_judged_on_it() {
    let dir = tempfile::tempdir().unwrap();
    let drivers = dir.path().join("drivers.json");
    std::fs::write(
        &drivers,
        r#"{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"nvidia.com/v1alpha1","kind":"NVIDIADriver","metadata":{"name":"all"},"spec":{"driverType":"gpu"}}]}"#,
    )
    .unwrap();
    let by_host = dir.path().join("by-host.yaml");
    std::fs::write(
        &by_host,
        "apiVersion: nvidia.com/v1alpha1\nkind: NVIDIADriver\nmetadata:\n  name: by-host\nspec:\n  driverType: gpu\n  nodeSelector:\n    kubernetes.io/hostname: lab-node-0\n",
    )
    .unwrap();
    let (code, out, err) = run(&[
        "--new",
        by_host.to_str().unwrap(),
        "--nvidia-drivers",
        drivers.to_str().unwrap(),
        "--nodes",
        NODES,
    ]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.starts_with(
            "NVIDIADriver/by-host CREATE: denied (decided over 3 nodes)\n  deny  nvidia-driver-overlap: \
             NVIDIADriver by-host: its nodeSelector selects 1 node that NVIDIADriver all selects too (lab-node-0)"
        ),
        "{out}"
    );
}
