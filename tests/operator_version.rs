//! Which GPU Operator version `audit` and `serve` follow, run as processes against a fake API
//! server: the operator Deployment's image tag, a version given by `--operator-version` or the
//! config file (which wins), or the newest one, assumed, when the Deployments cannot be read.
//! The eras decide differently: from v26.7 the operator never deploys kata-manager and adds an
//! emptied deploy label back; before, it deploys kata-manager and leaves an emptied label alone.

mod process_support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{StatusCode, Uri, header};
use axum::response::Response;
use process_support::{KillOnDrop, free_port, wait_ready};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_gpu-deploy-guard");
const NS: &str = "gpu-operator";

/// What the fake API server answers for the Deployments in the operator namespace.
#[derive(Clone)]
enum Deployments {
    /// One operator Deployment running this image.
    Image(&'static str),
    /// 403, as when RBAC does not grant them.
    Forbidden,
}

fn list(kind: &str, items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": "1"}, "items": items})
}

fn status(code: u16, reason: &str, message: &str) -> (StatusCode, Value) {
    (
        StatusCode::from_u16(code).unwrap(),
        json!({"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
               "reason": reason, "code": code, "message": message}),
    )
}

fn node(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
           "metadata": {"name": name, "resourceVersion": "1", "labels": labels}})
}

/// Two GPU nodes labelled for kata-manager; its pod runs on `a` only.
fn nodes() -> Vec<Value> {
    let labels = json!({"nvidia.com/gpu.present": "true",
                        "feature.node.kubernetes.io/pci-10de.present": "true",
                        "nvidia.com/gpu.deploy.kata-manager": "true"});
    vec![node("a", labels.clone()), node("b", labels)]
}

fn answer(path: &str, deployments: &Deployments) -> (StatusCode, Value) {
    let ok = |v: Value| (StatusCode::OK, v);
    match path {
        "/api/v1/nodes" => ok(list("NodeList", nodes())),
        "/api/v1/namespaces/gpu-operator/pods" => ok(list(
            "PodList",
            vec![
                json!({"metadata": {"name": "nvidia-kata-manager-x", "namespace": NS,
                "resourceVersion": "1",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                    "name": "nvidia-kata-manager", "uid": "u", "controller": true}]},
                "spec": {"nodeName": "a"}, "status": {"phase": "Running"}}),
            ],
        )),
        "/apis/apps/v1/namespaces/gpu-operator/daemonsets" => ok(list(
            "DaemonSetList",
            vec![
                json!({"metadata": {"name": "nvidia-kata-manager", "namespace": NS,
                "resourceVersion": "1"},
                "spec": {"template": {"spec": {"nodeSelector":
                    {"nvidia.com/gpu.deploy.kata-manager": "true"}}}}}),
            ],
        )),
        "/apis/apps/v1/namespaces/gpu-operator/deployments" => match deployments {
            Deployments::Image(image) => ok(list(
                "DeploymentList",
                vec![json!({"metadata": {"name": "gpu-operator", "namespace": NS,
                    "resourceVersion": "1",
                    "labels": {"app.kubernetes.io/component": "gpu-operator"}},
                    "spec": {"template": {
                        "metadata": {"labels": {"app.kubernetes.io/component": "gpu-operator",
                            "app": "gpu-operator"}},
                        "spec": {"containers": [{"name": "gpu-operator", "image": image}]}}}})],
            )),
            Deployments::Forbidden => status(
                403,
                "Forbidden",
                "deployments.apps is forbidden: User \"x\" cannot list resource \"deployments\"",
            ),
        },
        _ => status(
            404,
            "NotFound",
            "the server could not find the requested resource",
        ),
    }
}

/// A plain-HTTP API server on 127.0.0.1 answering the lists above; a watch that succeeds
/// stays open and silent.
async fn fake_api(deployments: Deployments) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().fallback(move |uri: Uri| {
        let deployments = deployments.clone();
        async move {
            let query = uri.query().unwrap_or_default();
            let watch = query
                .split('&')
                .any(|p| p == "watch=true" || p == "watch=1");
            let (code, body) = answer(uri.path(), &deployments);
            let builder = Response::builder()
                .status(code)
                .header(header::CONTENT_TYPE, "application/json");
            if watch && code == StatusCode::OK {
                let silent =
                    futures::stream::pending::<Result<bytes::Bytes, std::convert::Infallible>>();
                builder.body(Body::from_stream(silent)).unwrap()
            } else {
                builder.body(Body::from(body.to_string())).unwrap()
            }
        }
    });
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

fn kubeconfig(dir: &Path, api: SocketAddr) -> PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\n\
             clusters: [{{name: fake, cluster: {{server: \"http://{api}\"}}}}]\n\
             users: [{{name: nobody, user: {{}}}}]\n\
             contexts: [{{name: fake, context: {{cluster: fake, user: nobody}}}}]\n\
             current-context: fake\n"
        ),
    )
    .unwrap();
    path
}

fn command(kubeconfig: &Path, args: &[&str]) -> Command {
    command_as(Path::new(BIN), kubeconfig, args)
}

/// The binary under another name (the kubectl plugin's), in a clean environment.
fn command_as(program: &Path, kubeconfig: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(program);
    c.args(args)
        .env("KUBECONFIG", kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("GDG_CONFIG")
        .env_remove("GDG_OPERATOR_VERSION");
    c
}

/// Runs the binary off the runtime, so the fake API server keeps answering.
async fn run(kubeconfig: &Path, args: &[&str]) -> Output {
    let mut c = command(kubeconfig, args);
    tokio::task::spawn_blocking(move || c.output().unwrap())
        .await
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `audit -o json` against a fake cluster: exit code, `operatorVersion`, and the lines of node b.
async fn audit(deployments: Deployments, extra: &[&str]) -> (Option<i32>, Value, String) {
    let dir = tempfile::tempdir().unwrap();
    let config = kubeconfig(dir.path(), fake_api(deployments).await);
    let mut args = vec!["audit", "-o", "json"];
    args.extend_from_slice(extra);
    let o = run(&config, &args).await;
    let json: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", text(&o.stdout), text(&o.stderr)));
    let b = json["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "b")
        .unwrap();
    (
        o.status.code(),
        json["operatorVersion"].clone(),
        b["findings"].to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_follows_the_version_of_the_operator_deployment() {
    let (code, version, b) = audit(
        Deployments::Image("nvcr.io/nvidia/gpu-operator:v24.9.2"),
        &[],
    )
    .await;
    assert_eq!(
        version,
        json!({"version": "v24.9.2", "era": "v24.9", "source": "deployment",
               "message": "GPU Operator v24.9.2 read from Deployment gpu-operator/gpu-operator"})
    );
    // v24.9 deploys kata-manager: node b lacks it.
    assert_eq!(code, Some(1));
    assert!(
        b.contains("expected operands are not running: kata-manager"),
        "{b}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_digest_or_forbidden_deployments_leave_the_newest_version_assumed_and_say_why() {
    let (code, version, b) = audit(Deployments::Forbidden, &[]).await;
    assert_eq!(
        version,
        json!({"version": "v26.7", "era": "v26.7", "source": "assumed",
               "message": "GPU Operator v26.7 assumed (deployments in namespace gpu-operator are forbidden)"})
    );
    // v26.7 never deploys kata-manager: nothing is missing.
    assert_eq!(code, Some(0), "{b}");
    assert_eq!(b, "[]");

    let (code, version, _) = audit(
        Deployments::Image("nvcr.io/nvidia/gpu-operator@sha256:0123abcd"),
        &[],
    )
    .await;
    assert_eq!(code, Some(0));
    assert_eq!(
        version["message"],
        "GPU Operator v26.7 assumed (Deployment gpu-operator/gpu-operator: its image \
         nvcr.io/nvidia/gpu-operator@sha256:0123abcd is pinned by digest, with no version tag)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_outside_the_model_is_said_to_be_so_and_decided_as_the_nearest_era() {
    let (code, version, b) = audit(
        Deployments::Image("nvcr.io/nvidia/gpu-operator:v22.6.0"),
        &[],
    )
    .await;
    assert_eq!(
        version,
        json!({"version": "v22.6.0", "era": "v23.3", "source": "deployment",
               "outsideModel": "outside the model: older than v22.9, its oldest version; decided as v23.3",
               "message": "GPU Operator v22.6.0 read from Deployment gpu-operator/gpu-operator \
                           (outside the model: older than v22.9, its oldest version; decided as v23.3)"})
    );
    // Decided as v23.3, which has no kata manager: nothing is missing on b.
    assert_eq!(code, Some(0), "{b}");
    let (_, version, _) = audit(Deployments::Forbidden, &["--operator-version", "v27.1.0"]).await;
    assert_eq!(
        version["outsideModel"],
        "outside the model: newer than v26.7, its newest version; decided as v26.7"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_given_version_wins_over_the_clusters() {
    let (code, version, _) = audit(
        Deployments::Image("nvcr.io/nvidia/gpu-operator:v26.7.0"),
        &["--operator-version", "v24.9.2"],
    )
    .await;
    assert_eq!(code, Some(1));
    assert_eq!(
        version["message"],
        "GPU Operator v24.9.2 given by --operator-version"
    );

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, "operatorVersion: v24.9.2\n").unwrap();
    let (code, version, _) = audit(
        Deployments::Forbidden,
        &["--config", file.to_str().unwrap()],
    )
    .await;
    assert_eq!(code, Some(1));
    assert_eq!(
        version["message"],
        "GPU Operator v24.9.2 given by the config file's operatorVersion"
    );
    // The flag wins over the config file.
    let (_, version, _) = audit(
        Deployments::Forbidden,
        &[
            "--config",
            file.to_str().unwrap(),
            "--operator-version",
            "v26.3.1",
        ],
    )
    .await;
    assert_eq!(version["era"], "v26.3");
}

#[test]
fn a_bad_version_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let unused = dir.path().join("kubeconfig");
    let bad_config = dir.path().join("config.yaml");
    std::fs::write(&bad_config, "operatorVersion: main-latest\n").unwrap();
    let cases: [(&[&str], &str); 4] = [
        (
            &["audit", "--operator-version", "latest"],
            "invalid value 'latest' for '--operator-version <VERSION>': \"latest\" is not a GPU \
             Operator version like v25.3.4",
        ),
        (
            &["serve", "--no-cluster-watch", "--operator-version", "26"],
            "\"26\" is not a GPU Operator version like v25.3.4",
        ),
        (
            &["audit", "--config", bad_config.to_str().unwrap()],
            "operatorVersion: \"main-latest\" is not a GPU Operator version like v25.3.4",
        ),
        (
            &[
                "serve",
                "--no-cluster-watch",
                "--listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
                "--config",
                bad_config.to_str().unwrap(),
            ],
            "operatorVersion: \"main-latest\" is not a GPU Operator version like v25.3.4",
        ),
    ];
    for (args, needle) in cases {
        let o = command(&unused, args).output().unwrap();
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

// ---- serve -------------------------------------------------------------------------------------

/// A ready `serve` process and a client trusting its certificate.
struct Serve {
    _process: KillOnDrop,
    port: u16,
    admin: u16,
    client: reqwest::Client,
}

async fn serve(kubeconfig: &Path, dir: &Path, extra: &[&str]) -> Serve {
    let (port, admin) = (free_port(), free_port());
    let ca = dir.join("ca.crt");
    let (listen, admin_listen) = (format!("127.0.0.1:{port}"), format!("127.0.0.1:{admin}"));
    let mut args = vec![
        "serve",
        "--listen",
        &listen,
        "--admin-listen",
        &admin_listen,
        "--write-ca",
        ca.to_str().unwrap(),
        "--shutdown-delay",
        "0s",
    ];
    args.extend_from_slice(extra);
    let mut process = KillOnDrop(
        command(kubeconfig, &args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_ready(admin, &mut process.0).await;
    let ca = std::fs::read(&ca).unwrap();
    let client = reqwest::Client::builder()
        .use_rustls_tls()
        .no_proxy()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .build()
        .unwrap();
    Serve {
        _process: process,
        port,
        admin,
        client,
    }
}

/// A person empties `dcgm-exporter` on a GPU node that NFD has labelled.
fn emptied_label_review() -> Value {
    let path = format!(
        "{}/tests/fixtures/reviews/lab-node-1-dcgm-exporter-off.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut review: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    for (object, value) in [("oldObject", "true"), ("object", "")] {
        let labels = &mut review["request"][object]["metadata"]["labels"];
        labels["feature.node.kubernetes.io/pci-10de.present"] = json!("true");
        labels["nvidia.com/gpu.deploy.dcgm-exporter"] = json!(value);
    }
    review
}

impl Serve {
    /// The response to the emptied-label review: its warnings and its `cluster-facts` annotation.
    async fn judge(&self) -> (Vec<String>, String) {
        let resp: Value = self
            .client
            .post(format!("https://localhost:{}/validate", self.port))
            .json(&emptied_label_review())
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let r = &resp["response"];
        assert_eq!(r["allowed"], true, "{resp}");
        let warnings = r["warnings"]
            .as_array()
            .map(|w| w.iter().map(|s| s.as_str().unwrap().to_owned()).collect())
            .unwrap_or_default();
        let facts = r["auditAnnotations"]["cluster-facts"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        (warnings, facts)
    }

    /// Waits (up to 10 s) for the admin port's /metrics to have `want` as its only
    /// `operator_version_info` series; it follows the decisions' facts from another task.
    async fn expect_version_metric(&self, want: &str) {
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = client
                .get(format!("http://127.0.0.1:{}/metrics", self.admin))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            let got: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with("gpu_deploy_guard_operator_version_info"))
                .collect();
            if got == [want] {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "operator_version_info: {got:?}, want [{want}]"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_decides_by_the_version_of_the_operator_deployment() {
    let dir = tempfile::tempdir().unwrap();
    let api = fake_api(Deployments::Image("nvcr.io/nvidia/gpu-operator:v24.9.2")).await;
    let s = serve(&kubeconfig(dir.path(), api), dir.path(), &[]).await;
    let (warnings, facts) = s.judge().await;
    // v24.9 leaves an emptied label alone: nothing to warn about.
    assert_eq!(warnings, Vec::<String>::new());
    assert!(
        facts.ends_with("; GPU Operator v24.9.2 read from Deployment gpu-operator/gpu-operator"),
        "{facts}"
    );
    s.expect_version_metric(
        r#"gpu_deploy_guard_operator_version_info{version="v24.9.2",era="v24.9",source="deployment"} 1"#,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_without_the_deployments_assumes_the_newest_version_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let api = fake_api(Deployments::Forbidden).await;
    let started = std::time::Instant::now();
    let s = serve(&kubeconfig(dir.path(), api), dir.path(), &[]).await;
    // RBAC may allow the Deployments a moment later: readiness waits for them, up to the
    // watch's sync timeout (30 s).
    assert!(
        started.elapsed() >= std::time::Duration::from_secs(29),
        "ready {:?} after the start, before the sync timeout, while the Deployments are forbidden",
        started.elapsed()
    );
    let (warnings, facts) = s.judge().await;
    // v26.7 adds an emptied label back as true.
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("emptied: the GPU Operator will add it back as true"),
        "{warnings:?}"
    );
    assert!(
        facts.ends_with(
            "; GPU Operator v26.7 assumed (deployments in namespace gpu-operator are forbidden)"
        ),
        "{facts}"
    );
    s.expect_version_metric(
        r#"gpu_deploy_guard_operator_version_info{version="v26.7",era="v26.7",source="assumed"} 1"#,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_follows_a_given_version() {
    let dir = tempfile::tempdir().unwrap();
    // Given on the command line, without watching any cluster.
    let s = serve(
        &dir.path().join("no-kubeconfig"),
        dir.path(),
        &["--no-cluster-watch", "--operator-version", "v24.9.2"],
    )
    .await;
    let (warnings, facts) = s.judge().await;
    assert_eq!(warnings, Vec::<String>::new());
    assert_eq!(facts, "GPU Operator v24.9.2 given by --operator-version");
    s.expect_version_metric(
        r#"gpu_deploy_guard_operator_version_info{version="v24.9.2",era="v24.9",source="given"} 1"#,
    )
    .await;
    drop(s);

    // Given in the config file, over the Deployment's v26.7.0.
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, "operatorVersion: v24.9.2\n").unwrap();
    let api = fake_api(Deployments::Image("nvcr.io/nvidia/gpu-operator:v26.7.0")).await;
    let s = serve(
        &kubeconfig(dir.path(), api),
        dir.path(),
        &["--config", file.to_str().unwrap()],
    )
    .await;
    let (warnings, facts) = s.judge().await;
    assert_eq!(warnings, Vec::<String>::new());
    assert!(
        facts.ends_with("; GPU Operator v24.9.2 given by the config file's operatorVersion"),
        "{facts}"
    );

    // Nothing given and no cluster watched: the newest version, assumed, and why.
    drop(s);
    let s = serve(
        &dir.path().join("no-kubeconfig"),
        dir.path(),
        &["--no-cluster-watch"],
    )
    .await;
    let (warnings, facts) = s.judge().await;
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(
        facts,
        "GPU Operator v26.7 assumed (no --operator-version given and the cluster is not watched: \
         the newest version the model follows)"
    );
}

// ---- kubectl plugin ----------------------------------------------------------------------------

/// `kubectl gpu-deploy-guard label nodes b nvidia.com/gpu.deploy.kata-manager=false` (and
/// `extra`) against a fake cluster: exit code and standard output.
async fn plugin(deployments: Deployments, extra: &[&str]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let config = kubeconfig(dir.path(), fake_api(deployments).await);
    let plugin = dir.path().join("kubectl-gpu_deploy_guard");
    std::os::unix::fs::symlink(BIN, &plugin).unwrap();
    let mut args = vec![
        "label",
        "nodes",
        "b",
        "nvidia.com/gpu.deploy.kata-manager=false",
    ];
    args.extend_from_slice(extra);
    let mut c = command_as(&plugin, &config, &args);
    let o = tokio::task::spawn_blocking(move || c.output().unwrap())
        .await
        .unwrap();
    assert_eq!(text(&o.stderr), "");
    (o.status.code(), text(&o.stdout))
}

/// The plugin's lines after its notes: the table and the findings.
fn table(out: &str) -> String {
    out.lines()
        .filter(|l| !l.starts_with("note: "))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// v24.9 deploys kata-manager on a container node: switching it off takes it away.
const KATA_OFF_V24_9: &str = "NODE  OPERANDS BEFORE  OPERANDS AFTER  VERDICT\n\
    b     kata-manager     -               ALLOWED with warnings\n  \
    warn operator-will-restore: node b: this request sets nvidia.com/gpu.deploy.kata-manager=\"false\", \
    but the GPU Operator (v24.9.2) sweeps it on its next labelling pass: it is not one of a \
    container node's deploy labels.\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plugin_follows_the_deployment_and_a_given_version_and_notes_an_assumed_one() {
    let (code, out) = plugin(
        Deployments::Image("nvcr.io/nvidia/gpu-operator:v24.9.2"),
        &[],
    )
    .await;
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(table(&out), KATA_OFF_V24_9, "{out}");
    assert!(!out.contains("note: GPU Operator"), "{out}");

    // Nothing readable: v26.7, which never deploys kata-manager, and a note saying why.
    let (code, out) = plugin(Deployments::Forbidden, &[]).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains(
            "note: GPU Operator v26.7 assumed (deployments in namespace gpu-operator are forbidden)\n"
        ),
        "{out}"
    );
    assert!(
        table(&out).starts_with(
            "NODE  OPERANDS BEFORE  OPERANDS AFTER  VERDICT\n\
             b     -                -               ALLOWED with warnings\n"
        ),
        "{out}"
    );

    // --operator-version wins over the Deployment's v26.7.0.
    let (code, out) = plugin(
        Deployments::Image("nvcr.io/nvidia/gpu-operator:v26.7.0"),
        &["--operator-version", "v24.9.2"],
    )
    .await;
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(table(&out), KATA_OFF_V24_9, "{out}");
}
