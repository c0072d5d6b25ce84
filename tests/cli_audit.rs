//! `gpu-deploy-guard audit` from files, and `check --cluster-policy`, run as a user would:
//! exact output and exit codes on the lab of docs/gpu-operator.md.

use std::process::{Command, Output};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_gpu-deploy-guard");

fn fixture(path: &str) -> String {
    format!("{}/tests/fixtures/audit/{path}", env!("CARGO_MANIFEST_DIR"))
}

fn audit_case(case: &str, extra: &[&str]) -> Output {
    let nodes = fixture(&format!("{case}/nodes.json"));
    let pods = fixture(&format!("{case}/pods.json"));
    let mut args = vec!["audit", "--nodes", &nodes, "--pods", &pods];
    args.extend_from_slice(extra);
    run(&args)
}

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn the_lab_audits_clean_with_exit_0() {
    let o = audit_case("lab", &[]);
    assert_eq!(stdout(&o), "lab-node-0 OK\nlab-node-1 OK\nlab-node-2 OK\n");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stderr(&o), "");
}

#[test]
fn the_lone_device_plugin_is_reported_with_exit_1() {
    let o = audit_case("lab-device-plugin-only", &[]);
    assert_eq!(
        stdout(&o),
        "lab-node-0 OK\nlab-node-1 OK\nlab-node-2 OK\nlab-node-2 device-plugin-without-toolkit\n"
    );
    assert_eq!(o.status.code(), Some(1));
}

#[test]
fn gaps_are_reported_with_exit_1() {
    let o = audit_case("lab-gaps", &["-o", "lines"]);
    assert_eq!(
        stdout(&o),
        "lab-node-0 MISSING dcgm-exporter\nlab-node-1 MISSING gpu-feature-discovery\nlab-node-2 OK\n"
    );
    assert_eq!(o.status.code(), Some(1));
}

#[test]
fn the_matrix_is_the_labs() {
    let o = audit_case("lab-device-plugin-only", &["-o", "matrix"]);
    assert_eq!(
        stdout(&o),
        "lab-node-0 driver=yes toolkit=yes device-plugin=yes gfd=yes dcgm=yes\n\
         lab-node-1 driver=no toolkit=yes device-plugin=yes gfd=yes dcgm=yes\n\
         lab-node-2 driver=no toolkit=no device-plugin=yes gfd=no dcgm=no\n\
         TOTAL_PODS=10\n"
    );
    assert_eq!(o.status.code(), Some(1));
    let o = audit_case("lab", &["-o", "matrix", "--node", "lab-node-1"]);
    assert_eq!(
        stdout(&o),
        "lab-node-1 driver=no toolkit=yes device-plugin=yes gfd=yes dcgm=yes\nTOTAL_PODS=9\n"
    );
    assert_eq!(o.status.code(), Some(0));
}

#[test]
fn the_order_check_answers_for_one_node() {
    let o = audit_case(
        "lab-device-plugin-only",
        &["--node", "lab-node-2", "--order-check"],
    );
    assert_eq!(stdout(&o), "device-plugin-without-toolkit\n");
    assert_eq!(o.status.code(), Some(1));
    let o = audit_case(
        "lab-device-plugin-only",
        &["--node", "lab-node-0", "--order-check"],
    );
    assert_eq!(stdout(&o), "ok\n");
    assert_eq!(o.status.code(), Some(0));
    // A gap elsewhere on the node is not the order check's business.
    let o = audit_case("lab-gaps", &["--node", "lab-node-1", "--order-check"]);
    assert_eq!(stdout(&o), "ok\n");
    assert_eq!(o.status.code(), Some(0));
}

#[test]
fn json_has_the_facts_per_node_and_operand() {
    let o = audit_case("lab-gaps", &["-o", "json"]);
    assert_eq!(o.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["clusterPolicy"]["state"], "not-given");
    assert_eq!(v["summary"]["nodes"], 3);
    assert_eq!(v["summary"]["nodesOk"], 1);
    assert_eq!(v["summary"]["runningDaemonSetPods"], 7);
    assert_eq!(v["summary"]["findings"]["operand-not-running"], 2);
    let n1 = &v["nodes"][1];
    assert_eq!(n1["name"], "lab-node-1");
    assert_eq!(n1["ok"], false);
    assert_eq!(
        n1["operands"][3],
        serde_json::json!({"operand": "gpu-feature-discovery", "expected": true, "running": false,
            "pod": "gpu-feature-discovery-fbcda", "phase": "Pending"})
    );
    assert_eq!(n1["findings"][0]["rule"], "operand-not-running");
    assert_eq!(n1["findings"][0]["level"], "fail");
}

#[test]
fn report_format_openreports_prints_the_same_report_as_a_cluster_report() {
    let policy = audit_case("lab-device-plugin-only", &["-o", "report"]);
    let open = audit_case(
        "lab-device-plugin-only",
        &["-o", "report", "--report-format", "openreports"],
    );
    assert_eq!(open.status.code(), Some(1));
    let mut v: Value = serde_norway::from_slice(&open.stdout).unwrap();
    assert_eq!(v["apiVersion"], "openreports.io/v1alpha1");
    assert_eq!(v["kind"], "ClusterReport");
    // Everything else is the ClusterPolicyReport's (their timestamps are the same second or
    // the next: compared without them).
    let mut w: Value = serde_norway::from_slice(&policy.stdout).unwrap();
    for doc in [&mut v, &mut w] {
        let obj = doc.as_object_mut().unwrap();
        obj.remove("apiVersion");
        obj.remove("kind");
        for r in obj["results"].as_array_mut().unwrap() {
            r.as_object_mut().unwrap().remove("timestamp");
        }
    }
    assert_eq!(v, w);
    let bad = audit_case(
        "lab-device-plugin-only",
        &["-o", "report", "--report-format", "osv"],
    );
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("'osv'") && err.contains("openreports"),
        "{err}"
    );
}

#[test]
fn the_report_is_a_cluster_policy_report() {
    let o = audit_case("lab-device-plugin-only", &["-o", "report"]);
    assert_eq!(o.status.code(), Some(1));
    let v: Value = serde_norway::from_slice(&o.stdout).unwrap();
    assert_eq!(v["apiVersion"], "wgpolicyk8s.io/v1alpha2");
    assert_eq!(v["kind"], "ClusterPolicyReport");
    assert_eq!(v["metadata"]["name"], "gpu-deploy-guard");
    assert_eq!(
        v["summary"],
        serde_json::json!({"pass": 34, "fail": 1, "warn": 1, "error": 0, "skip": 0})
    );
    let fail: Vec<&Value> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["result"] == "fail")
        .collect();
    assert_eq!(fail.len(), 1);
    assert_eq!(fail[0]["rule"], "device-plugin-without-toolkit");
    assert_eq!(
        fail[0]["resources"],
        serde_json::json!([{"apiVersion": "v1", "kind": "Node", "name": "lab-node-2"}])
    );
    assert!(fail[0]["timestamp"]["seconds"].as_i64().unwrap() > 1_700_000_000);
}

#[test]
fn a_cluster_policy_and_daemonsets_file_feed_the_same_facts() {
    let cp = fixture("cluster-policy-host-toolkit.yaml");
    let o = audit_case("lab-device-plugin-only", &["--cluster-policy", &cp]);
    assert_eq!(stdout(&o), "lab-node-0 OK\nlab-node-1 OK\nlab-node-2 OK\n");
    assert_eq!(o.status.code(), Some(0), "the hosts bring the toolkit");
    let ds = fixture("lab-gaps/daemonsets.json");
    let o = audit_case("lab-gaps", &["--daemonsets", &ds, "-o", "matrix"]);
    assert_eq!(
        stdout(&o),
        "lab-node-0 driver=yes toolkit=yes device-plugin=yes gfd=yes dcgm=no dcgm-hostengine=no\n\
         lab-node-1 driver=no toolkit=yes device-plugin=yes gfd=no dcgm=yes dcgm-hostengine=no\n\
         lab-node-2 driver=no toolkit=no device-plugin=no gfd=no dcgm=no dcgm-hostengine=no\n\
         TOTAL_PODS=7\n"
    );
    assert_eq!(
        o.status.code(),
        Some(1),
        "lab-node-0's exporter is still missing"
    );
}

#[test]
fn bad_input_exits_2_with_a_message_naming_it() {
    let nodes = fixture("lab/nodes.json");
    let pods = fixture("lab/pods.json");
    let cases: Vec<(Vec<&str>, String)> = vec![
        (
            vec!["--nodes", "/nonexistent/nodes.json", "--pods", &pods],
            "error: cannot read nodes file /nonexistent/nodes.json: No such file or directory (os error 2)\n"
                .to_owned(),
        ),
        (
            vec!["--nodes", &pods, "--pods", &pods],
            format!(
                "error: nodes file {pods}: expected a List of Nodes (the output of `kubectl get nodes -o json`), \
                 found a Pod at items[0]\n"
            ),
        ),
        (
            vec!["--nodes", &nodes, "--pods", &pods, "--node", "lab-node-9"],
            "error: node lab-node-9 is not among the 3 nodes audited\n".to_owned(),
        ),
        (
            vec!["--nodes", &nodes, "--pods", &pods, "--cluster-policy", &nodes],
            format!(
                "error: ClusterPolicy file {nodes}: expected a nvidia.com/v1 ClusterPolicy or a List of them, \
                 found a List holding a Node\n"
            ),
        ),
    ];
    for (args, want) in cases {
        let mut full = vec!["audit"];
        full.extend(args.iter().copied());
        let o = run(&full);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert_eq!(stderr(&o), want, "{args:?}");
        assert_eq!(stdout(&o), "", "{args:?}");
    }
}

#[test]
fn flags_that_do_not_go_together_are_refused_by_the_parser() {
    let nodes = fixture("lab/nodes.json");
    let pods = fixture("lab/pods.json");
    for (args, needle) in [
        (vec!["audit", "--nodes", nodes.as_str()], "--pods <FILE>"),
        (
            vec!["audit", "--nodes", &nodes, "--pods", &pods, "--order-check"],
            "--node <NAME>",
        ),
        (
            vec!["audit", "--nodes", &nodes, "--pods", &pods, "--report"],
            "cannot be used with",
        ),
        (
            vec!["audit", "--nodes", &nodes, "--pods", &pods, "-o", "table"],
            "invalid value 'table'",
        ),
    ] {
        let o = run(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn without_files_or_a_cluster_the_audit_says_it_cannot_connect() {
    let o = Command::new(BIN)
        .args(["audit"])
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env("HOME", "/nonexistent")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).starts_with(
            "error: cannot connect to the cluster (kubeconfig or in-cluster service account): "
        ),
        "{}",
        stderr(&o)
    );
}

#[test]
fn check_takes_the_cluster_policy_into_account() {
    let node = format!(
        "{}/tests/fixtures/nodes/lab-node-2.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    let cp = fixture("cluster-policy-host-toolkit.yaml");
    let plugin = "nvidia.com/gpu.deploy.device-plugin=true";
    let o = run(&["check", "--node", &node, plugin, "-o", "json"]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "the operator's toolkit is the default"
    );
    let o = run(&[
        "check",
        "--node",
        &node,
        plugin,
        "--cluster-policy",
        &cp,
        "-o",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["decision"], "allowed");
    let rules: Vec<&str> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["rule"].as_str().unwrap())
        .collect();
    assert_eq!(rules, ["device-plugin-on-non-gpu-node"]);
    let o = run(&[
        "check",
        "--node",
        &node,
        plugin,
        "--cluster-policy",
        "/nonexistent/cp.yaml",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).starts_with("error: cannot read ClusterPolicy file /nonexistent/cp.yaml: "),
        "{}",
        stderr(&o)
    );
}

/// `--gpu-cluster`: the file audit follows the DRA stack (its switches, `stack` in the JSON);
/// with `--cluster-policy` too, the report fails the cluster once for the conflict.
#[test]
fn a_gpu_cluster_file_sets_the_stack() {
    let gc = format!(
        "{}/tests/fixtures/policy/gpu-cluster.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    let cp = format!(
        "{}/tests/fixtures/policy/cluster-policy.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    let o = audit_case("lab", &["--gpu-cluster", &gc, "-o", "json"]);
    let v: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", stdout(&o), stderr(&o)));
    assert_eq!(v["stack"], "gpu-cluster");
    assert_eq!(v["clusterPolicy"]["state"], "gpu-cluster");
    let o = audit_case(
        "lab",
        &[
            "--gpu-cluster",
            &gc,
            "--cluster-policy",
            &cp,
            "-o",
            "report",
        ],
    );
    let v: Value = serde_norway::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", stdout(&o), stderr(&o)));
    let conflict: Vec<&Value> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["rule"] == "gpu-cluster-conflict")
        .collect();
    assert_eq!(conflict.len(), 1, "{}", stdout(&o));
    assert_eq!(conflict[0]["result"], "fail");
}

#[test]
fn the_slices_file_finds_the_device_plugin_beside_the_dra_driver() {
    let slices = format!(
        "{}/tests/fixtures/dra/resource-slices.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let o = audit_case("lab", &["--resource-slices", &slices, "-o", "json"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let findings: Vec<(String, String, String)> = v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|n| {
            let name = n["name"].as_str().unwrap().to_owned();
            n["findings"].as_array().unwrap().iter().map(move |f| {
                (
                    name.clone(),
                    f["rule"].as_str().unwrap().to_owned(),
                    f["basis"].as_str().unwrap().to_owned(),
                )
            })
        })
        .collect();
    assert_eq!(
        findings,
        [(
            "lab-node-1".to_owned(),
            "device-plugin-beside-dra-driver".to_owned(),
            "labels".to_owned()
        )]
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("1 of driver compute-domain.nvidia.com"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
