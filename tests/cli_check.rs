//! `gpu-deploy-guard check`, run as a user would: exit codes, text and JSON output.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_gpu-deploy-guard");

fn nodes(name: &str) -> String {
    format!("{}/tests/fixtures/nodes/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn real(name: &str) -> String {
    format!(
        "{}/tests/fixtures/real-nodes/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

fn check(args: &[&str]) -> Output {
    Command::new(BIN).arg("check").args(args).output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
}

#[test]
fn device_plugin_alone_on_lab_node_2_is_denied_with_exit_1() {
    let o = check(&[
        "--node",
        &nodes("lab-node-2.yaml"),
        "nvidia.com/gpu.deploy.device-plugin=true",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.starts_with("node lab-node-2 (UPDATE): DENIED\n"),
        "{out}"
    );
    assert!(out.contains("\nError from server (Forbidden): node lab-node-2: nvidia.com/gpu.deploy.device-plugin=true would run"), "{out}");
    assert!(
        out.contains("Warning: lab-node-2: device-plugin runs on a node with no NVIDIA GPU label"),
        "{out}"
    );
    assert!(
        out.contains("device-plugin                -        runs     \"true\"  <- changes"),
        "{out}"
    );
}

#[test]
fn json_output_has_the_verdict_findings_and_operand_sets() {
    let o = check(&[
        "--node",
        &nodes("lab-node-2.yaml"),
        "nvidia.com/gpu.deploy.device-plugin=true",
        "-o",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let v = json(&o);
    assert_eq!(v["allowed"], false);
    assert_eq!(v["decision"], "denied");
    assert_eq!(v["node"], "lab-node-2");
    assert_eq!(v["findings"][0]["rule"], "device-plugin-without-toolkit");
    assert_eq!(v["findings"][0]["action"], "deny");
    assert_eq!(v["findings"][0]["change"], "new");
    assert!(
        v["findings"][0]["message"]
            .as_str()
            .unwrap()
            .starts_with("node lab-node-2:")
    );
    assert_eq!(v["findings"][1]["rule"], "device-plugin-on-non-gpu-node");
    assert_eq!(v["warnings"].as_array().unwrap().len(), 1);
    assert_eq!(v["operands"]["before"]["device-plugin"], false);
    assert_eq!(v["operands"]["after"]["device-plugin"], true);
    assert_eq!(v["operands"]["after"]["container-toolkit"], false);
    // Every known operand is listed, so a reader never has to guess what a missing key means.
    assert_eq!(v["operands"]["after"].as_object().unwrap().len(), 23);
}

#[test]
fn dcgm_exporter_off_on_lab_node_1_is_allowed_with_exit_0() {
    let o = check(&[
        "--node",
        &nodes("lab-node-1.yaml"),
        "nvidia.com/gpu.deploy.dcgm-exporter=false",
        "-o",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(v["allowed"], true);
    assert_eq!(v["findings"], serde_json::json!([]));
    assert_eq!(v["warnings"], serde_json::json!([]));
    assert_eq!(v["operands"]["before"]["dcgm-exporter"], true);
    assert_eq!(v["operands"]["after"]["dcgm-exporter"], false);
}

#[test]
fn removing_the_toolkit_and_switching_both_off() {
    let o = check(&[
        "--node",
        &nodes("lab-node-0.yaml"),
        "nvidia.com/gpu.deploy.container-toolkit-",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let o = check(&[
        "--node",
        &nodes("lab-node-0.yaml"),
        "nvidia.com/gpu.deploy.container-toolkit=false",
        "nvidia.com/gpu.deploy.device-plugin=false",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(stdout(&o).starts_with("node lab-node-0 (UPDATE): ALLOWED with warnings\n"));
}

#[test]
fn a_before_and_after_pair_of_files_is_judged() {
    let o = check(&[
        "--old-node",
        &nodes("lab-node-1.yaml"),
        "--node",
        &nodes("lab-node-0.yaml"),
        "-o",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(v["operands"]["before"]["driver"], false);
    assert_eq!(v["operands"]["after"]["driver"], true);
    assert_eq!(v["auditAnnotations"]["operands"], "+driver");
}

#[test]
fn creation_is_allowed_with_warnings() {
    let o = check(&[
        "--operation",
        "create",
        "--node",
        &nodes("lab-node-2.yaml"),
        "nvidia.com/gpu.deploy.device-plugin=true",
        "-o",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(v["operation"], "CREATE");
    assert_eq!(v["findings"][0]["action"], "warn");
}

#[test]
fn the_operator_is_exempt_and_a_configured_group_too() {
    let o = check(&[
        "--node",
        &nodes("lab-node-2.yaml"),
        "nvidia.com/gpu.deploy.device-plugin=true",
        "--user",
        "system:serviceaccount:gpu-operator:gpu-operator",
        "-o",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(json(&o)["decision"], "exempt");

    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.yaml");
    std::fs::write(&cfg, "exemptions:\n  groups: [gpu-admins]\n").unwrap();
    let args = |group: &'static str| {
        check(&[
            "--config",
            cfg.to_str().unwrap(),
            "--node",
            &nodes("lab-node-2.yaml"),
            "nvidia.com/gpu.deploy.device-plugin=true",
            "--user",
            "bob",
            "--group",
            "system:authenticated",
            "--group",
            group,
        ])
    };
    assert_eq!(args("gpu-admins").status.code(), Some(0));
    assert_eq!(args("others").status.code(), Some(1));
}

#[test]
fn warn_mode_from_the_config_file_allows() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.yaml");
    std::fs::write(&cfg, "mode: warn\n").unwrap();
    let o = check(&[
        "--config",
        cfg.to_str().unwrap(),
        "--node",
        &nodes("lab-node-2.yaml"),
        "nvidia.com/gpu.deploy.device-plugin=true",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
}

#[test]
fn a_node_from_standard_input_as_json() {
    let mut child = Command::new(BIN)
        .args([
            "check",
            "--node",
            "-",
            "nvidia.com/gpu.deploy.container-toolkit=false",
            "-o",
            "json",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let node = std::fs::read(real("lambda-k3s-h100x8-driver-preinstalled.json")).unwrap();
    child.stdin.take().unwrap().write_all(&node).unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    let v = json(&o);
    assert_eq!(v["node"], "192-222-54-148");
    assert_eq!(
        v["operands"]["before"]["driver"], false,
        "driver=pre-installed runs no driver pod"
    );
}

#[test]
fn bad_input_exits_2_with_a_message_naming_it() {
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--node".into(), "/nonexistent/node.yaml".into()],
            "cannot read /nonexistent/node.yaml",
        ),
        (
            vec![
                "--node".into(),
                nodes("lab-node-2.yaml"),
                "nvidia.com/gpu.deploy.device-plugin".into(),
            ],
            "change \"nvidia.com/gpu.deploy.device-plugin\": expected key=value",
        ),
        (
            vec![
                "--node".into(),
                nodes("lab-node-2.yaml"),
                "nvidia.com/gpu.deploy.device-plugin=yes please".into(),
            ],
            "label value \"yes please\"",
        ),
        (
            vec![
                "--node".into(),
                format!(
                    "{}/tests/fixtures/reviews/bad-no-request.json",
                    env!("CARGO_MANIFEST_DIR")
                ),
            ],
            "expected a Node (kind: Node, apiVersion: v1), found admission.k8s.io/v1 AdmissionReview",
        ),
        (
            vec![
                "--config".into(),
                "/nonexistent/c.yaml".into(),
                "--node".into(),
                nodes("lab-node-2.yaml"),
            ],
            "cannot read config file /nonexistent/c.yaml",
        ),
        (
            vec![
                "--operation".into(),
                "create".into(),
                "--old-node".into(),
                nodes("lab-node-1.yaml"),
                "--node".into(),
                nodes("lab-node-2.yaml"),
            ],
            "takes no --old-node",
        ),
        (
            vec![
                "--node".into(),
                nodes("lab-node-2.yaml"),
                "--operation".into(),
                "delete".into(),
            ],
            "invalid value 'delete'",
        ),
    ];
    for (args, needle) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = check(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
        assert!(stdout(&o).is_empty(), "{args:?}");
    }
}

#[test]
fn removing_a_label_that_is_not_there_is_noted() {
    let o = check(&[
        "--node",
        &nodes("lab-node-2.yaml"),
        "nvidia.com/gpu.deploy.dcgm-",
        "-o",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(
        json(&o)["notes"],
        serde_json::json!([
            "label \"nvidia.com/gpu.deploy.dcgm\" is not on the node; nothing to remove"
        ])
    );
}

/// README's first offline example: the answer that says the operator adds the toolkit back
/// must not also say that its pass sweeps the node's labels.
#[test]
fn the_readme_example_never_adds_a_label_and_sweeps_it_in_one_answer() {
    let o = check(&[
        "--node",
        &nodes("lab-node-0.yaml"),
        "nvidia.com/gpu.deploy.container-toolkit-",
    ]);
    let text = stdout(&o);
    assert!(text.contains("adds it back as \"true\""), "{text}");
    let pass = text
        .lines()
        .find(|l| l.contains("its next labelling pass:"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(pass.contains("container-toolkit add"), "{pass}");
    assert!(!pass.contains("sweep"), "{pass}");
    assert!(!text.contains("note: no NFD label"), "{text}");

    // The same node before NFD labels it: the pass sweeps, and the answer says why.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no-nfd.yaml");
    let yaml = std::fs::read_to_string(nodes("lab-node-0.yaml")).unwrap();
    let without: String = yaml
        .lines()
        .filter(|l| !l.contains("pci-10de"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&path, without).unwrap();
    let o = check(&[
        "--node",
        path.to_str().unwrap(),
        "nvidia.com/gpu.deploy.container-toolkit-",
    ]);
    let text = stdout(&o);
    assert!(
        text.contains("note: no NFD label names an NVIDIA PCI device here"),
        "{text}"
    );
    let pass = text
        .lines()
        .find(|l| l.contains("its next labelling pass:"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(pass.contains("device-plugin sweep"), "{pass}");
}

/// During a driver upgrade, `check -o json` shows per paused label the value it comes back as
/// and the component that writes it; an edit of one is judged on that value, not the edit.
#[test]
fn json_shows_what_a_pause_writes_back_and_who_writes_it() {
    let dir = tempfile::tempdir().unwrap();
    let node = dir.path().join("node.yaml");
    std::fs::write(
        &node,
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: p1\n  labels:\n    \
         feature.node.kubernetes.io/pci-10de.present: \"true\"\n    \
         nvidia.com/gpu.present: \"true\"\n    \
         nvidia.com/gpu.deploy.container-toolkit: paused-for-driver-upgrade\n    \
         nvidia.com/gpu.deploy.device-plugin: paused-for-driver-upgrade\n    \
         nvidia.com/gpu.deploy.dcgm: \"false\"\n",
    )
    .unwrap();
    let o = check(&[
        "--node",
        node.to_str().unwrap(),
        "nvidia.com/gpu.deploy.container-toolkit=false",
        "-o",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    let v = json(&o);
    let labels = &v["operator"]["labels"];
    for (key, back) in [
        ("container-toolkit", "true"),
        ("device-plugin", "true"),
        ("dcgm", "false"),
    ] {
        assert_eq!(labels[key]["resumesAs"], back, "{key}: {labels}");
        assert_eq!(labels[key]["resumedBy"], "k8s-driver-manager", "{key}");
    }
    assert_eq!(labels["driver"].get("resumedBy"), None, "{labels}");
    assert_eq!(
        v["warnings"][0],
        "p1: k8s-driver-manager will overwrite 1 label(s) this request writes when the driver upgrade ends"
    );
}

/// `--gpu-cluster`: on the v26.7 DRA stack a device-plugin label selects nothing (allowed,
/// and the pass sweeps it), the kubelet plugin off leaves the DRA operands Pending, and the
/// JSON names the stack; with `--cluster-policy` too, the operator reconciles neither.
#[test]
fn a_gpu_cluster_puts_the_node_on_the_dra_stack() {
    let gc = format!(
        "{}/tests/fixtures/policy/gpu-cluster.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    let cp = format!(
        "{}/tests/fixtures/policy/cluster-policy.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    let node = nodes("lab-node-0.yaml");
    let dra = [
        "nvidia.com/gpu.deploy.dra-driver=false",
        "nvidia.com/gpu.deploy.dra-validator=true",
        "nvidia.com/gpu.deploy.dcgm-exporter-dra=true",
        "nvidia.com/gpu.deploy.device-plugin=true",
        "nvidia.com/gpu.deploy.container-toolkit=false",
    ];
    let mut args = vec![
        "--node",
        &node,
        "--gpu-cluster",
        &gc,
        "--operator-version",
        "v26.7.0",
        "-o",
        "json",
    ];
    args.extend(dra);
    let o = check(&args);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let v = json(&o);
    assert_eq!(v["operator"]["stack"], "gpu-cluster");
    let rules: Vec<&str> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["rule"].as_str().unwrap())
        .collect();
    assert!(rules.contains(&"operand-without-dra-driver"), "{rules:?}");
    assert!(
        !rules.contains(&"device-plugin-without-toolkit"),
        "{rules:?}"
    );
    assert_eq!(v["operator"]["labels"]["device-plugin"]["action"], "sweep");

    // A ClusterPolicy as well: nothing is labelled, and the toolkit refusal is back.
    args.splice(2..2, ["--cluster-policy", cp.as_str()]);
    let o = check(&args);
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(json(&o)["operator"]["stack"], "both");

    let bad = check(&["--node", &node, "--gpu-cluster", &node]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        stderr(&bad).starts_with("error: GPUCluster file ")
            && stderr(&bad).contains("expected a nvidia.com/v1alpha1 GPUCluster"),
        "{}",
        stderr(&bad)
    );
}

/// A file in a fresh temporary directory, for the inputs a test writes.
fn temp_file(name: &str, text: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    let path = path.to_string_lossy().into_owned();
    (dir, path)
}

#[test]
fn a_tainted_node_is_judged_with_the_daemonsets_tolerations() {
    let lab = std::fs::read_to_string(nodes("lab-node-0.yaml")).unwrap();
    let tainted = format!(
        "{lab}\nspec:\n  taints:\n  - key: example.com/maintenance\n    value: now\n    effect: NoExecute\n"
    );
    let (_n, node) = temp_file("node.yaml", &tainted);
    // The operator's own tolerations: the taint evicts every operand, nothing is left broken.
    let o = check(&["--node", &node, "-o", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(
        v["placement"]["container-toolkit"],
        serde_json::json!({"state": "evicted", "taint": "example.com/maintenance=now:NoExecute"})
    );
    assert_eq!(v["placement"]["device-plugin"]["state"], "evicted");
    // A device plugin DaemonSet that tolerates everything keeps running there: refused.
    let daemonsets = r#"{"kind":"List","apiVersion":"v1","items":[
      {"kind":"DaemonSet","apiVersion":"apps/v1","metadata":{"name":"nvidia-device-plugin-daemonset"},
       "spec":{"template":{"spec":{"nodeSelector":{"nvidia.com/gpu.deploy.device-plugin":"true"},
         "tolerations":[{"operator":"Exists"}]}}}},
      {"kind":"DaemonSet","apiVersion":"apps/v1","metadata":{"name":"nvidia-container-toolkit-daemonset"},
       "spec":{"template":{"spec":{"nodeSelector":{"nvidia.com/gpu.deploy.container-toolkit":"true"},
         "tolerations":[{"key":"nvidia.com/gpu","operator":"Exists","effect":"NoSchedule"}]}}}}]}"#;
    let (_d, ds) = temp_file("ds.json", daemonsets);
    let o = check(&["--node", &node, "--daemonsets", &ds]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "no request changes anything: {}",
        stdout(&o)
    );
    let text = stdout(&o);
    assert!(
        text.contains(
            "placement: container-toolkit evicted (taint example.com/maintenance=now:NoExecute)"
        ),
        "{text}"
    );
    assert!(!text.contains("placement: device-plugin"), "{text}");
    // The taint arriving with the request (--old-node untainted) is the refusal.
    let o = check(&[
        "--old-node",
        &nodes("lab-node-0.yaml"),
        "--node",
        &node,
        "--daemonsets",
        &ds,
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(
        stdout(&o).contains("which evicts its pod"),
        "{}",
        stdout(&o)
    );
    // A toleration the API server would refuse is a named error, exit 2.
    let bad = daemonsets.replace(
        r#"{"operator":"Exists"}"#,
        r#"{"key":"k","operator":"Lt","value":"1"}"#,
    );
    let (_b, bad) = temp_file("bad.json", &bad);
    let o = check(&["--node", &node, "--daemonsets", &bad]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("unknown toleration operator \"Lt\""),
        "{}",
        stderr(&o)
    );
}

fn slices() -> String {
    format!(
        "{}/tests/fixtures/dra/resource-slices.json",
        env!("CARGO_MANIFEST_DIR")
    )
}

#[test]
fn the_device_plugin_beside_nvidias_dra_driver_is_found_from_the_slices() {
    // lab-node-1 runs the device plugin; NVIDIA's GPU DRA driver publishes a slice for it.
    let o = check(&[
        "--node",
        &nodes("lab-node-1.yaml"),
        "--resource-slices",
        &slices(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(
        stdout(&o).contains(
            "warn  device-plugin-beside-dra-driver existing node lab-node-1: the NVIDIA device \
             plugin already runs beside NVIDIA's DRA driver, which publishes ResourceSlices of \
             driver gpu.nvidia.com for this node: both advertise the same GPUs"
        ),
        "{}",
        stdout(&o)
    );
    // What the file holds that is not read is said: another driver's slice, one of no node.
    let err = stderr(&o);
    assert!(
        err.contains("ResourceSlices of other drivers are not read (only gpu.nvidia.com advertises the GPUs the device plugin does): 1 of driver compute-domain.nvidia.com"),
        "{err}"
    );
    assert!(
        err.contains("1 ResourceSlice(s) of gpu.nvidia.com name no node (spec.nodeName)"),
        "{err}"
    );
    // lab-node-0's slice is of another driver: nothing found there.
    let o = check(&[
        "--node",
        &nodes("lab-node-0.yaml"),
        "--resource-slices",
        &slices(),
    ]);
    assert!(
        !stdout(&o).contains("device-plugin-beside-dra-driver"),
        "{}",
        stdout(&o)
    );
    // Without the slices the rule is not evaluated.
    let o = check(&["--node", &nodes("lab-node-1.yaml")]);
    assert!(
        !stdout(&o).contains("device-plugin-beside-dra-driver"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn starting_the_device_plugin_beside_the_dra_driver_is_refused_when_configured() {
    let off = std::fs::read_to_string(nodes("lab-node-1.yaml"))
        .unwrap()
        .replace(
            "nvidia.com/gpu.deploy.device-plugin: \"true\"",
            "nvidia.com/gpu.deploy.device-plugin: \"false\"",
        );
    let (_n, node) = temp_file("lab-node-1.yaml", &off);
    let (_c, cfg) = temp_file(
        "config.yaml",
        "rules:\n  device-plugin-beside-dra-driver: deny\n",
    );
    let o = check(&[
        "--config",
        &cfg,
        "--node",
        &node,
        "--resource-slices",
        &slices(),
        "nvidia.com/gpu.deploy.device-plugin=true",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(
        stdout(&o).contains("Error from server (Forbidden): node lab-node-1: the NVIDIA device plugin runs beside NVIDIA's DRA driver")
            && stdout(&o).contains("deny  device-plugin-beside-dra-driver new"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn a_slices_file_of_something_else_is_refused_naming_it() {
    let pods = r#"{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"}}]}"#;
    let (_d, path) = temp_file("slices.json", pods);
    let o = check(&[
        "--node",
        &nodes("lab-node-1.yaml"),
        "--resource-slices",
        &path,
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    let err = stderr(&o);
    assert!(
        err.contains("a List of ResourceSlices") && err.contains("a Pod at items[0]"),
        "{err}"
    );
}

fn all_daemonsets() -> String {
    format!(
        "{}/tests/fixtures/foreign/daemonsets.json",
        env!("CARGO_MANIFEST_DIR")
    )
}

#[test]
fn a_device_plugin_outside_the_operator_is_judged_where_it_runs() {
    // lab-node-1 runs the operator's device plugin; the standalone chart's runs on every node
    // with NFD's NVIDIA label: two plugins.
    let o = check(&[
        "--node",
        &nodes("lab-node-1.yaml"),
        "--all-daemonsets",
        &all_daemonsets(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(
        stdout(&o).contains(
            "existing node lab-node-1: the device plugin DaemonSet \
             nvdp/nvdp-nvidia-device-plugin, not the GPU Operator's, already runs there beside \
             the operator's device plugin"
        ),
        "{}",
        stdout(&o)
    );
    // The operator's plugin and toolkit off: the foreign one stays, without a toolkit; as
    // configured, refused. The GFD DaemonSet of the same image and the operator's own
    // DaemonSet are never named.
    let (_c, cfg) = temp_file("config.yaml", "rules:\n  foreign-device-plugin: deny\n");
    let o = check(&[
        "--config",
        &cfg,
        "--node",
        &nodes("lab-node-1.yaml"),
        "--all-daemonsets",
        &all_daemonsets(),
        "nvidia.com/gpu.deploy.device-plugin=false",
        "nvidia.com/gpu.deploy.container-toolkit=false",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let out = stdout(&o);
    assert!(
        out.contains("Error from server (Forbidden): node lab-node-1: the device plugin DaemonSet nvdp/nvdp-nvidia-device-plugin, not the GPU Operator's, runs there without the operator's container toolkit"),
        "{out}"
    );
    assert!(
        !out.contains("gpu-feature-discovery, not") && !out.contains("gpu-operator/"),
        "{out}"
    );
    // Not given: not evaluated.
    let o = check(&["--node", &nodes("lab-node-1.yaml")]);
    assert!(
        !stdout(&o).contains("foreign-device-plugin"),
        "{}",
        stdout(&o)
    );
}
