//! The exact output of `check` and `audit` on every fixture, compared with files recorded from
//! the binary: any change to a decision, a message, a table or a report shows up as a diff.
//!
//! After an intended change of output, record again and review the diff:
//! `GDG_GOLDEN_RECORD=1 cargo test --test golden`. `GDG_GOLDEN_BIN` runs another binary
//! instead of this build's (to record from an older one, or to compare two).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

fn bin() -> String {
    std::env::var("GDG_GOLDEN_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_gpu-deploy-guard").to_owned())
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs the binary from the crate root and returns one section: the command, exit code,
/// stdout and stderr. Report timestamps (the clock) are zeroed.
fn section(args: &[String]) -> String {
    let out = Command::new(bin())
        .args(args)
        .current_dir(root())
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBECONFIG")
        .env_remove("GDG_CONFIG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stdout: String = stdout
        .lines()
        .map(|l| match l.split_once("seconds: ") {
            Some((head, _)) if l.trim_start().starts_with("seconds: ") => {
                format!("{head}seconds: 0\n")
            }
            _ => format!("{l}\n"),
        })
        .collect();
    let mut s = String::new();
    let _ = writeln!(s, "### {}", args.join(" "));
    let _ = writeln!(s, "exit {:?}", out.status.code());
    s.push_str(&stdout);
    for l in String::from_utf8_lossy(&out.stderr).lines() {
        let _ = writeln!(s, "stderr: {l}");
    }
    s
}

fn compare(name: &str, got: &str) {
    let path = root().join("tests/golden").join(name);
    if std::env::var_os("GDG_GOLDEN_RECORD").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; record with GDG_GOLDEN_RECORD=1", path.display()));
    if got != want {
        let (g, w): (Vec<&str>, Vec<&str>) = (got.lines().collect(), want.lines().collect());
        let first = g
            .iter()
            .zip(&w)
            .position(|(a, b)| a != b)
            .unwrap_or(g.len().min(w.len()));
        let context = |lines: &[&str]| {
            lines[first.saturating_sub(3)..(first + 3).min(lines.len())].join("\n")
        };
        panic!(
            "{name} differs from the recording at line {}:\n--- recorded\n{}\n--- now\n{}",
            first + 1,
            context(&w),
            context(&g)
        );
    }
}

fn files(dir: &str, ext: &str) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(root().join(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .map(|p| {
            p.strip_prefix(root())
                .unwrap_or(Path::new(""))
                .display()
                .to_string()
        })
        .collect();
    out.sort();
    out
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn check_output_is_unchanged() {
    let mut nodes = files("tests/fixtures/nodes", "yaml");
    nodes.extend(files("tests/fixtures/real-nodes", "json"));
    const D: &str = "nvidia.com/gpu.deploy.";
    let variants: Vec<Vec<String>> = vec![
        vec![],
        vec![format!("{D}container-toolkit=false")],
        vec![
            format!("{D}device-plugin=true"),
            format!("{D}container-toolkit-"),
        ],
        vec![
            format!("{D}device-plugin=true"),
            format!("{D}container-toolkit=false"),
        ],
        vec![format!("{D}operator-validator=false")],
        vec![format!("{D}dcgm-exportr=true"), format!("{D}zzzz=1")],
        vec![
            format!("{D}gpu-feature-discovery=True"),
            format!("{D}dcgm=maybe"),
            format!("{D}operands=False"),
        ],
        vec![format!("{D}driver-"), format!("{D}mig-manager=")],
        vec![
            format!("{D}sandbox-validator=true"),
            format!("{D}nvsm=true"),
        ],
        vec![
            "--operation".into(),
            "create".into(),
            format!("{D}device-plugin=true"),
        ],
        vec![
            "--cluster-policy".into(),
            "tests/fixtures/audit/cluster-policy-host-toolkit.yaml".into(),
            format!("{D}container-toolkit=false"),
        ],
        vec![
            "--user".into(),
            "system:serviceaccount:gpu-operator:gpu-operator".into(),
            format!("{D}container-toolkit=false"),
        ],
        vec![
            "--user".into(),
            "alice".into(),
            "--group".into(),
            "admins".into(),
            format!("{D}device-plugin=false"),
        ],
    ];
    let mut got = String::new();
    for node in &nodes {
        for variant in &variants {
            for output in ["text", "json"] {
                let mut args = strings(&["check", "--node", node, "-o", output]);
                args.extend(variant.iter().cloned());
                got.push_str(&section(&args));
            }
        }
    }
    // Errors are output too.
    for args in [
        &[
            "check",
            "--node",
            "tests/fixtures/nodes/lab-node-0.yaml",
            "bad",
        ][..],
        &["check", "--node", "/nonexistent.json"],
        &["check", "--node", "tests/fixtures/audit/lab/nodes.json"],
        &[
            "check",
            "--node",
            "tests/fixtures/nodes/lab-node-0.yaml",
            "--old-node",
            "tests/fixtures/nodes/lab-node-2.yaml",
        ],
        &[
            "check",
            "--node",
            "tests/fixtures/nodes/lab-node-0.yaml",
            "--operator-version",
            "latest",
        ],
    ] {
        got.push_str(&section(&strings(args)));
    }
    compare("check.txt", &got);
}

#[test]
fn audit_output_is_unchanged() {
    let mut got = String::new();
    let base = "tests/fixtures/audit";
    for case in ["lab", "lab-device-plugin-only", "lab-gaps"] {
        let nodes = format!("{base}/{case}/nodes.json");
        let pods = format!("{base}/{case}/pods.json");
        let daemonsets = format!("{base}/{case}/daemonsets.json");
        let policy = format!("{base}/cluster-policy-host-toolkit.yaml");
        let mut extras: Vec<Vec<String>> = vec![
            vec![],
            strings(&["--cluster-policy", &policy]),
            strings(&["--node", "lab-node-2"]),
            strings(&["--node", "lab-node-2", "--order-check"]),
            strings(&["--node", "no-such-node"]),
            strings(&["--operator-version", "v24.9.2"]),
        ];
        if Path::new(&root().join(&daemonsets)).exists() {
            extras.push(strings(&["--daemonsets", &daemonsets]));
            extras.push(strings(&[
                "--daemonsets",
                &daemonsets,
                "--cluster-policy",
                &policy,
            ]));
        }
        for extra in &extras {
            for output in ["lines", "matrix", "json", "report"] {
                let mut args =
                    strings(&["audit", "--nodes", &nodes, "--pods", &pods, "-o", output]);
                args.extend(extra.iter().cloned());
                got.push_str(&section(&args));
            }
        }
    }
    compare("audit.txt", &got);
}

/// `operands`: the model of every era, as text, and one era as JSON.
#[test]
fn operands_output_is_unchanged() {
    let mut got = String::new();
    // One release of each era of the model (`core::era`).
    for version in ["v23.3.2", "v24.9.2", "v26.3.3", "v26.7.0"] {
        got.push_str(&section(&strings(&[
            "operands",
            "--operator-version",
            version,
        ])));
    }
    got.push_str(&section(&strings(&[
        "operands",
        "--operator-version",
        "v26.7.0",
        "-o",
        "json",
    ])));
    compare("operands.txt", &got);
}
