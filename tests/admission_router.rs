//! The `/validate` router, driven with AdmissionReview fixtures through `oneshot`: every decision
//! and every bad input, without a socket.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, Request, StatusCode, header};
use gpu_deploy_guard::core::facts::ClusterFacts;
use gpu_deploy_guard::core::policy::Policy;
use gpu_deploy_guard::metrics::Metrics;
use gpu_deploy_guard::webhook::{Limits, Webhook, router};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

fn fixture(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/tests/fixtures/reviews/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

struct Harness {
    metrics: Arc<Metrics>,
    app: axum::Router,
}

fn harness_with(limits: Limits) -> Harness {
    let metrics = Arc::new(Metrics::new());
    let hook = Webhook::new(
        Policy::default(),
        ClusterFacts::default(),
        metrics.clone(),
        limits,
    );
    Harness {
        metrics,
        app: router(Arc::new(hook)),
    }
}

fn harness() -> Harness {
    harness_with(Limits::default())
}

async fn post(h: &Harness, body: impl Into<Body>) -> (StatusCode, Value) {
    let req = Request::post("/validate")
        .header(header::CONTENT_TYPE, "application/json")
        .body(body.into())
        .unwrap();
    send(h, req).await
}

async fn send(h: &Harness, req: Request<Body>) -> (StatusCode, Value) {
    answer(h.app.clone(), req).await
}

/// `req`'s answer from `app`: its status and body (JSON, else the text as a string).
async fn answer(app: axum::Router, req: Request<Body>) -> (StatusCode, Value) {
    let resp = app.oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, value)
}

#[tokio::test]
async fn device_plugin_without_toolkit_is_denied_with_the_uid_echoed() {
    let h = harness();
    let (status, body) = post(&h, fixture("lab-node-2-device-plugin-only.json")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(body["kind"], "AdmissionReview");
    let r = &body["response"];
    assert_eq!(r["uid"], "00000000-0000-4000-8000-000000000001");
    assert_eq!(r["allowed"], false);
    assert_eq!(r["status"]["code"], 403);
    assert_eq!(r["status"]["reason"], "Forbidden");
    let msg = r["status"]["message"].as_str().unwrap();
    assert!(msg.starts_with("node lab-node-2: nvidia.com/gpu.deploy.device-plugin=true would run the NVIDIA device plugin without the container toolkit"), "{msg}");
    assert!(
        msg.contains("set nvidia.com/gpu.deploy.container-toolkit=true in the same command"),
        "{msg}"
    );
    assert_eq!(
        r["warnings"],
        serde_json::json!(["lab-node-2: device-plugin runs on a node with no NVIDIA GPU label"])
    );
    assert_eq!(r["auditAnnotations"]["decision"], "denied");
    assert_eq!(
        r["auditAnnotations"]["findings"],
        "device-plugin-without-toolkit=deny,device-plugin-on-non-gpu-node=warn"
    );
    assert_eq!(r["auditAnnotations"]["operands"], "+device-plugin");
    let metrics = h.metrics.encode();
    assert!(
        metrics.contains(
            r#"gpu_deploy_guard_admission_reviews_total{decision="denied",operation="UPDATE"} 1"#
        ),
        "{metrics}"
    );
    assert!(metrics.contains(r#"gpu_deploy_guard_admission_findings_total{rule="device-plugin-without-toolkit",action="deny",operation="UPDATE"} 1"#), "{metrics}");
    assert!(
        metrics.contains("gpu_deploy_guard_admission_review_duration_seconds_count 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn lab_node_1_dcgm_exporter_off_is_allowed_cleanly() {
    let h = harness();
    let (status, body) = post(&h, fixture("lab-node-1-dcgm-exporter-off.json")).await;
    assert_eq!(status, StatusCode::OK);
    let r = &body["response"];
    assert_eq!(r["allowed"], true);
    assert_eq!(r["uid"], "00000000-0000-4000-8000-000000000002");
    assert!(r.get("warnings").is_none(), "{r}");
    assert_eq!(r["auditAnnotations"]["decision"], "allowed");
    assert_eq!(r["auditAnnotations"]["operands"], "-dcgm-exporter");
}

#[tokio::test]
async fn removing_the_toolkit_is_denied_and_warns_about_the_rest() {
    let h = harness();
    let (_, body) = post(&h, fixture("lab-node-0-remove-toolkit.json")).await;
    let r = &body["response"];
    assert_eq!(r["allowed"], false);
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap()
            .contains("this request removes nvidia.com/gpu.deploy.container-toolkit")
    );
    assert_eq!(r["warnings"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn an_untolerated_no_schedule_taint_is_allowed_with_what_it_stops_re_creating() {
    let h = harness();
    let (status, body) = post(&h, fixture("lab-node-0-taint-xid-noschedule.json")).await;
    assert_eq!(status, StatusCode::OK);
    let r = &body["response"];
    assert_eq!(r["allowed"], true, "{body}");
    let warnings: Vec<&str> = r["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect();
    assert_eq!(
        warnings,
        [
            "lab-node-0: container-toolkit would never be re-created under taint nvidia.com/gpu-xid-error=79:NoSchedule while device-plugin runs",
            "lab-node-0: driver, device-plugin, gpu-feature-discovery, dcgm-exporter would never be re-created under taint nvidia.com/gpu-xid-error=79:NoSchedule",
        ]
    );
    let annotations = &r["auditAnnotations"];
    assert!(
        annotations.to_string().contains("toolkit-not-recreated"),
        "{annotations}"
    );
}

#[tokio::test]
async fn a_taint_with_an_effect_the_api_never_gives_is_a_named_error() {
    let h = harness();
    let (status, body) = post(&h, fixture("bad-taint-effect.json")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let msg = body["response"]["status"]["message"].as_str().unwrap();
    assert!(
        msg.contains("request.object.spec.taints[0]: unknown taint effect \"NoRun\""),
        "{msg}"
    );
    assert_eq!(body["response"]["allowed"], false);
    // And the next review is served.
    let (status, _) = post(&h, fixture("lab-node-1-dcgm-exporter-off.json")).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn switching_plugin_and_toolkit_off_together_is_allowed() {
    let h = harness();
    let (_, body) = post(&h, fixture("lab-node-0-plugin-and-toolkit-off.json")).await;
    let r = &body["response"];
    assert_eq!(r["allowed"], true);
    assert_eq!(
        r["warnings"],
        serde_json::json!([
            "lab-node-0: gpu-feature-discovery, dcgm-exporter would hang without container-toolkit"
        ])
    );
}

#[tokio::test]
async fn dry_run_gets_the_same_refusal() {
    let h = harness();
    let (_, real) = post(&h, fixture("lab-node-2-device-plugin-only.json")).await;
    let (_, dry) = post(&h, fixture("lab-node-2-dry-run.json")).await;
    assert_eq!(dry["response"]["allowed"], false);
    assert_eq!(dry["response"]["status"], real["response"]["status"]);
}

#[tokio::test]
async fn node_registration_is_allowed_with_warnings() {
    let h = harness();
    let (_, body) = post(&h, fixture("create-node-with-device-plugin-only.json")).await;
    let r = &body["response"];
    assert_eq!(r["allowed"], true);
    let warnings: Vec<&str> = r["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect();
    assert_eq!(
        warnings,
        [
            "lab-node-3: device-plugin would run without container-toolkit; GPU pods would fail to start",
            "lab-node-3: device-plugin runs on a node with no NVIDIA GPU label",
        ]
    );
    let metrics = h.metrics.encode();
    assert!(
        metrics.contains(
            r#"gpu_deploy_guard_admission_reviews_total{decision="allowed",operation="CREATE"} 1"#
        ),
        "{metrics}"
    );
}

#[tokio::test]
async fn the_operator_service_account_passes_and_is_recorded() {
    let h = harness();
    let (_, body) = post(&h, fixture("operator-sets-device-plugin.json")).await;
    let r = &body["response"];
    assert_eq!(r["allowed"], true);
    assert!(r.get("warnings").is_none());
    let ann = &r["auditAnnotations"];
    assert_eq!(ann["decision"], "exempt");
    assert!(
        ann["would-deny"]
            .as_str()
            .unwrap()
            .starts_with("node lab-node-2:")
    );
    assert!(
        ann["exempt"]
            .as_str()
            .unwrap()
            .contains("namespace gpu-operator")
    );
}

#[tokio::test]
async fn a_real_node_with_status_and_managed_fields_is_judged() {
    let h = harness();
    let (status, body) = post(&h, fixture("real-aks-node-toolkit-off.json")).await;
    assert_eq!(status, StatusCode::OK);
    let r = &body["response"];
    assert_eq!(r["allowed"], false);
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap()
            .starts_with("node aks-jzndmv4-29195301-vmss000000:")
    );
}

/// One row per bad input: body, expected status, words the message must contain.
#[tokio::test]
async fn bad_input_gets_a_clear_error_and_the_server_keeps_serving() {
    let h = harness();
    let truncated = {
        let full = fixture("lab-node-2-device-plugin-only.json");
        full[..full.len() / 2].to_vec()
    };
    let cases: Vec<(&str, Vec<u8>, StatusCode, &str)> = vec![
        (
            "not JSON",
            b"hello".to_vec(),
            StatusCode::BAD_REQUEST,
            "request body is not JSON",
        ),
        (
            "empty",
            Vec::new(),
            StatusCode::BAD_REQUEST,
            "request body is empty",
        ),
        (
            "truncated",
            truncated,
            StatusCode::BAD_REQUEST,
            "request body is truncated JSON",
        ),
        (
            "trailing garbage",
            b"{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\"} x".to_vec(),
            StatusCode::BAD_REQUEST,
            "request body is not JSON",
        ),
        (
            "v1beta1",
            fixture("bad-v1beta1.json"),
            StatusCode::BAD_REQUEST,
            "AdmissionReview admission.k8s.io/v1beta1 is not supported",
        ),
        (
            "wrong kind",
            fixture("bad-wrong-kind.json"),
            StatusCode::BAD_REQUEST,
            "expected kind AdmissionReview, got \"ConversionReview\"",
        ),
        (
            "no request",
            fixture("bad-no-request.json"),
            StatusCode::BAD_REQUEST,
            "AdmissionReview has no `request`",
        ),
        (
            "not a node",
            fixture("bad-not-a-node.json"),
            StatusCode::BAD_REQUEST,
            "only Nodes (core/v1) are reviewed, got apps/v1 DaemonSet",
        ),
        (
            "label not a string",
            fixture("bad-label-not-string.json"),
            StatusCode::BAD_REQUEST,
            "request.object.metadata.labels.nvidia.com/gpu.deploy.device-plugin: invalid type: boolean `true`, expected a string",
        ),
        (
            "array",
            b"[1,2]".to_vec(),
            StatusCode::BAD_REQUEST,
            "not a valid AdmissionReview",
        ),
        (
            "no apiVersion",
            b"{\"kind\":\"AdmissionReview\",\"request\":null}".to_vec(),
            StatusCode::BAD_REQUEST,
            "missing field `apiVersion`",
        ),
    ];
    for (name, body, want_status, want_message) in cases {
        let (status, value) = post(&h, body).await;
        assert_eq!(status, want_status, "{name}: {value}");
        let msg = value["response"]["status"]["message"]
            .as_str()
            .unwrap_or_default();
        assert!(msg.contains(want_message), "{name}: {msg}");
        assert_eq!(value["response"]["allowed"], false, "{name}");
    }
    // The uid is echoed even when the object is unreadable, so the API server can match it.
    let (_, value) = post(&h, fixture("bad-label-not-string.json")).await;
    assert_eq!(
        value["response"]["uid"],
        "00000000-0000-4000-8000-00000000000b"
    );
    // And the server still answers a good review afterwards.
    let (status, value) = post(&h, fixture("lab-node-1-dcgm-exporter-off.json")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(value["response"]["allowed"], true);
    let metrics = h.metrics.encode();
    assert!(
        metrics.contains(r#"gpu_deploy_guard_admission_bad_requests_total{reason="not-a-node"} 1"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn an_oversized_body_gets_413() {
    let h = harness_with(Limits {
        max_body_bytes: 1024,
        ..Limits::default()
    });
    // Declared too large up front.
    let (status, value) = post(&h, fixture("lab-node-2-device-plugin-only.json")).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(
        value["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .contains("larger than the limit of 1024 bytes")
    );
    // The body is left unread: an HTTP/1.1 client must not reuse the connection.
    let req = Request::post("/validate")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(vec![b' '; 2048]))
        .unwrap();
    let resp = h.app.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(resp.headers()[header::CONNECTION], "close");
    // A review read whole, even one refused as unreadable, leaves the connection open.
    for body in [fixture("lab-node-1-dcgm-exporter-off.json"), b"{}".to_vec()] {
        let req = Request::post("/validate")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body))
            .unwrap();
        let resp = harness().app.oneshot(req).await.unwrap();
        assert!(resp.headers().get(header::CONNECTION).is_none());
    }
    // Streamed without a length, found too large while reading.
    let chunks = vec![
        Ok::<_, std::io::Error>(vec![b' '; 800]),
        Ok(vec![b' '; 800]),
    ];
    let body = Body::from_stream(stream_of(chunks));
    let (status, _) = post(&h, body).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
}

/// A body is read whole however it is cut into frames: one frame (kept as it came), several,
/// empty ones among them, with and without a declared length.
#[tokio::test]
async fn a_body_in_many_frames_gets_the_answer_it_gets_whole() {
    let h = harness();
    for name in [
        "lab-node-2-device-plugin-only.json",
        "lab-node-1-dcgm-exporter-off.json",
    ] {
        let body = fixture(name);
        let (status, whole) = post(&h, body.clone()).await;
        assert_eq!(status, StatusCode::OK, "{name}");
        let third = body.len() / 3;
        let cuts: Vec<Vec<Vec<u8>>> = vec![
            vec![body.clone()],
            vec![Vec::new(), body.clone()],
            vec![body[..third].to_vec(), Vec::new(), body[third..].to_vec()],
            body.chunks(7).map(<[u8]>::to_vec).collect(),
        ];
        for (i, frames) in cuts.into_iter().enumerate() {
            for declared in [false, true] {
                let stream = stream_of(frames.iter().cloned().map(Ok).collect());
                let mut req =
                    Request::post("/validate").header(header::CONTENT_TYPE, "application/json");
                if declared {
                    req = req.header(header::CONTENT_LENGTH, body.len());
                }
                let req = req.body(Body::from_stream(stream)).unwrap();
                let (status, got) = send(&h, req).await;
                assert_eq!(
                    status,
                    StatusCode::OK,
                    "{name}, cut {i}, length declared: {declared}"
                );
                assert_eq!(got, whole, "{name}, cut {i}, length declared: {declared}");
            }
        }
    }
}

fn stream_of(
    chunks: Vec<Result<Vec<u8>, std::io::Error>>,
) -> impl tokio_stream::Stream<Item = Result<Vec<u8>, std::io::Error>> + Send + 'static {
    tokio_stream::iter(chunks)
}

#[tokio::test]
async fn a_body_that_never_finishes_gets_408() {
    let h = harness_with(Limits {
        body_timeout: Duration::from_millis(200),
        ..Limits::default()
    });
    let (tx, body) = channel_body();
    tx.send(Ok(b"{\"apiVersion\":".to_vec())).await.unwrap();
    let started = std::time::Instant::now();
    let (status, value) = post(&h, body).await;
    assert_eq!(status, StatusCode::REQUEST_TIMEOUT);
    assert!(
        value["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .contains("request body not received within 200ms")
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    drop(tx);
}

/// A POST of `body` to /validate as if it came over a socket from `ip`.
fn post_from(ip: [u8; 4], body: Body) -> Request<Body> {
    let mut req = Request::post("/validate")
        .header(header::CONTENT_TYPE, "application/json")
        .body(body)
        .unwrap();
    let addr = std::net::SocketAddr::from((ip, 40000));
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(addr));
    req
}

/// A body made of what is sent on the sender, which ends when the sender is dropped.
fn channel_body() -> (
    tokio::sync::mpsc::Sender<Result<Vec<u8>, std::io::Error>>,
    Body,
) {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(1);
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    (tx, body)
}

#[tokio::test]
async fn a_source_holding_its_share_of_requests_is_refused_at_once_and_another_is_served() {
    let h = harness_with(Limits {
        max_requests_per_source: 2,
        ..Limits::default()
    });
    let mut held = Vec::new();
    for _ in 0..2 {
        let (tx, body) = channel_body();
        tx.try_send(Ok(b"{\"apiVersion\":".to_vec())).unwrap();
        held.push(tx);
        tokio::spawn(answer(h.app.clone(), post_from([127, 0, 0, 9], body)));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = std::time::Instant::now();
    let (status, value) = send(
        &h,
        post_from(
            [127, 0, 0, 9],
            Body::from(fixture("lab-node-2-device-plugin-only.json")),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(
        value["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .contains("this client already has 2 requests in flight"),
        "{value}"
    );
    // Another source is served while the first holds its share.
    let (status, _) = send(
        &h,
        post_from(
            [127, 0, 0, 1],
            Body::from(fixture("lab-node-2-device-plugin-only.json")),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let metrics = h.metrics.encode();
    for line in [
        r#"gpu_deploy_guard_source_share_refusals_total{share="requests"} 1"#,
        r#"gpu_deploy_guard_source_share_last_refused{share="requests",source="127.0.0.9"} 2"#,
        r#"gpu_deploy_guard_admission_bad_requests_total{reason="source-requests"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
    // A finished request frees its place.
    drop(held.pop());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (status, _) = send(
        &h,
        post_from(
            [127, 0, 0, 9],
            Body::from(fixture("lab-node-2-device-plugin-only.json")),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn a_source_holding_half_the_body_budget_leaves_the_other_half_to_others() {
    // A budget of 4,000 bytes: 1,000 of overdraft, 3,000 shared, 1,500 for one source.
    let h = harness_with(Limits {
        max_body_bytes: 1_000,
        max_inflight_body_bytes: 4_000,
        body_timeout: Duration::from_secs(2),
        ..Limits::default()
    });
    // One source sends six bodies of 700 bytes that never end: without a share they would
    // hold the whole budget and the overdraft. With it, two hold the source's share, one
    // waits in the overdraft's turn, and three wait for their source's room. Those start
    // first, so that they run out of time while the others still hold it. Each declares
    // 1,000 bytes, so that all three find a place among the small bodies waiting.
    let mut senders = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let (tx, body) = channel_body();
        senders.push(tx);
        let mut req = post_from([127, 0, 0, 9], body);
        req.headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from_static("1000"));
        tasks.push(tokio::spawn(answer(h.app.clone(), req)));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for i in [4, 5, 3, 2, 1, 0] {
        senders[i].send(Ok(vec![b' '; 700])).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A review of 700 bytes from another source finds room at once.
    let review = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u1","kind":{"group":"","version":"v1","kind":"Node"},"operation":"UPDATE","name":"n","object":{"metadata":{"name":"n","labels":{"nvidia.com/gpu.present":"true"}}},"oldObject":{"metadata":{"name":"n","labels":{"nvidia.com/gpu.present":"true"}}},"userInfo":{"username":"u"}}}"#;
    let started = std::time::Instant::now();
    let (status, value) = send(&h, post_from([127, 0, 0, 1], Body::from(&review[..]))).await;
    assert_eq!(status, StatusCode::OK, "{value}");
    // Without the share it waited for the overdraft's turn, until a body ran out of time.
    assert!(
        started.elapsed() < Duration::from_millis(800),
        "{:?}",
        started.elapsed()
    );
    // The bodies that waited for their source's room are told why.
    let mut messages = Vec::new();
    for task in tasks {
        let (_, value) = task.await.unwrap();
        messages.push(
            value["response"]["status"]["message"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    let at_share = messages
        .iter()
        .filter(|m| m.contains("hold its share of the in-flight body budget"))
        .count();
    assert_eq!(at_share, 3, "{messages:?}");
    let metrics = h.metrics.encode();
    for line in [
        r#"gpu_deploy_guard_source_share_refusals_total{share="body-bytes"} 3"#,
        r#"gpu_deploy_guard_source_share_last_refused{share="body-bytes",source="127.0.0.9"} 1400"#,
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
    drop(senders);
}

/// `count` bodies of 127.0.0.9, each sending 700 bytes then stalling, in a budget of 4,000 bytes
/// (1,000 of overdraft, 3,000 shared, 1,500 for one source): two hold the source's share, one
/// takes the overdraft's turn, and the rest wait for room; `declared` is each one's
/// Content-Length, if any. The answers of those that finished at once, the tasks of the
/// others, and the senders that keep them open.
async fn stalled_bodies(h: &Harness, count: usize, declared: Option<usize>) -> Stalled {
    let mut senders = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..count {
        let (tx, body) = channel_body();
        senders.push(tx);
        let mut req = post_from([127, 0, 0, 9], body);
        if let Some(n) = declared {
            req.headers_mut()
                .insert(header::CONTENT_LENGTH, n.to_string().parse().unwrap());
        }
        tasks.push(tokio::spawn(answer(h.app.clone(), req)));
    }
    for tx in &senders {
        tx.send(Ok(vec![b' '; 700])).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut answered = Vec::new();
    let mut open = Vec::new();
    for t in tasks {
        if t.is_finished() {
            answered.push(t.await.unwrap());
        } else {
            open.push(t);
        }
    }
    Stalled {
        answered,
        open,
        senders,
    }
}

struct Stalled {
    answered: Vec<(StatusCode, Value)>,
    open: Vec<tokio::task::JoinHandle<(StatusCode, Value)>>,
    senders: Vec<tokio::sync::mpsc::Sender<Result<Vec<u8>, std::io::Error>>>,
}

fn stalled_limits() -> Limits {
    Limits {
        max_body_bytes: 1_000,
        max_inflight_body_bytes: 4_000,
        body_timeout: Duration::from_secs(3),
        ..Limits::default()
    }
}

#[tokio::test]
async fn few_bodies_of_one_source_wait_for_room_and_the_next_is_refused_at_once() {
    // No declared length: each waiting body may have a full HTTP/2 window in flight besides the
    // frame in hand, so two fill the source's part of the room for large bodies and the third
    // is refused.
    let h = harness_with(stalled_limits());
    let stalled = stalled_bodies(&h, 6, None).await;
    assert_eq!(
        stalled.open.len(),
        5,
        "two hold the share, one its turn, two wait"
    );
    let [(status, value)] = &stalled.answered[..] else {
        panic!("{:?}", stalled.answered)
    };
    assert_eq!(*status, StatusCode::SERVICE_UNAVAILABLE, "{value}");
    let may_hold = 2 * (700 + gpu_deploy_guard::webhook::BODY_WINDOW);
    let large = gpu_deploy_guard::webhook::WAITING_ROOM[1];
    let message = value["response"]["status"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!(
            "the bodies of its size waiting may hold {may_hold} bytes ({may_hold} of them this client's), of at most {} ({} for one client)",
            large.bytes, large.per_source
        )),
        "{message}"
    );
    let metrics = h.metrics.encode();
    for line in [
        r#"gpu_deploy_guard_source_share_refusals_total{share="body-waits"} 1"#.to_string(),
        format!(
            r#"gpu_deploy_guard_source_share_last_refused{{share="body-waits",source="127.0.0.9"}} {may_hold}"#
        ),
        r#"gpu_deploy_guard_admission_bad_requests_total{reason="too-many-waiting"} 1"#.to_string(),
    ] {
        assert!(metrics.contains(&line), "{line} in\n{metrics}");
    }
    drop(stalled.senders);
    for task in stalled.open {
        task.await.unwrap();
    }
}

#[tokio::test]
async fn small_bodies_of_declared_length_all_find_room_to_wait() {
    // Declared at 900 bytes, a waiting body may hold only its last 200 besides the frame in
    // hand: all five that wait find a place among the small ones, and none is refused.
    let h = harness_with(stalled_limits());
    let stalled = stalled_bodies(&h, 8, Some(900)).await;
    assert!(stalled.answered.is_empty(), "{:?}", stalled.answered);
    assert_eq!(stalled.open.len(), 8);
    drop(stalled.senders);
    for t in stalled.open {
        let (status, value) = t.await.unwrap();
        // Cut short by the dropped sender, not refused for want of a place.
        assert_ne!(status, StatusCode::SERVICE_UNAVAILABLE, "{value}");
    }
    let metrics = h.metrics.encode();
    assert!(!metrics.contains("too-many-waiting"), "{metrics}");
}

#[tokio::test]
async fn wrong_method_path_and_content_type_are_refused() {
    let h = harness();
    let get = Request::get("/validate").body(Body::empty()).unwrap();
    let (status, _) = send(&h, get).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);

    let other = Request::post("/mutate")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from("{}"))
        .unwrap();
    let (status, body) = send(&h, other).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body.as_str().unwrap().contains("POST /validate"));

    let yaml = Request::post("/validate")
        .header(header::CONTENT_TYPE, "application/yaml")
        .body(Body::from(fixture("lab-node-1-dcgm-exporter-off.json")))
        .unwrap();
    let (status, body) = send(&h, yaml).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert!(
        body["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .contains("application/yaml")
    );
}
