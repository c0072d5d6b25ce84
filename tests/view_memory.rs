//! What a review's view costs beyond its body, whatever the body holds: the heap bytes one
//! request allocates through `/validate` at its peak, counted by this binary's allocator.
//!
//! A body's labels and groups are not collected: the scanner reads them again from the body
//! when they are walked, and serde's reader (one at a time, see `Webhook::slow_read`) keeps
//! their text in one buffer. Collected as pairs, the 3.3 MiB bodies below were 24 MiB (labels
//! of one byte) and 48 MiB (empty groups) each.
//!
//! One test function: the counter is process-wide, so nothing else may run beside it.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use gpu_deploy_guard::core::facts::ClusterFacts;
use gpu_deploy_guard::core::policy::Policy;
use gpu_deploy_guard::metrics::Metrics;
use gpu_deploy_guard::webhook::{Limits, Webhook, router};
use http_body_util::BodyExt;
use tower::ServiceExt;

mod counting_alloc;

use counting_alloc::{Counting, mark, peak_since};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const MIB: usize = 1 << 20;

fn node_review(kind: &str, groups: &str, labels: &str) -> String {
    format!(
        r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"u","kind":{kind},"resource":{{"group":"","version":"v1","resource":"nodes"}},"name":"n","operation":"UPDATE","userInfo":{{"username":"x","groups":[{groups}]}},"object":{{"metadata":{{"name":"n","labels":{{{labels}}}}}}},"oldObject":{{"metadata":{{"name":"n","labels":{{"a":"b"}}}}}}}}}}"#
    )
}

const NODE: &str = r#"{"group":"","version":"v1","kind":"Node"}"#;
/// A form the API server never sends and serde accepts: the scanner leaves it to serde.
const NODE_AS_ARRAY: &str = r#"["","v1","Node"]"#;

/// About `bytes` of labels of one character and empty values (keys repeat: the last wins).
fn tiny_labels(bytes: usize) -> String {
    let one = r#""a":"","#;
    let mut labels = one.repeat(bytes / one.len());
    labels.pop();
    labels
}

/// The heap bytes held at the peak of one request, beyond those held before it, and its status.
async fn peak_of(body: String) -> (StatusCode, usize) {
    let hook = Webhook::new(
        Policy::default(),
        ClusterFacts::default(),
        Arc::new(Metrics::new()),
        Limits::default(),
    );
    let app = router(Arc::new(hook));
    let req = Request::post("/validate")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .unwrap();
    let before = mark();
    let resp = app.oneshot(req).await.unwrap();
    let status = resp.status();
    drop(resp.into_body().collect().await.unwrap());
    (status, peak_since(before))
}

#[tokio::test(flavor = "current_thread")]
async fn a_view_costs_no_more_than_its_body_whatever_the_body_holds() {
    let labels = tiny_labels(33 * MIB / 10);
    let groups = vec![r#""""#; 1_100_000].join(",");
    let too_long = format!("{labels},\"{}\":\"\"", "x".repeat(64));
    let cases = [
        // The scanner's view: a few words, whatever the count.
        (
            "labels, scanned",
            node_review(NODE, "", &labels),
            200,
            64 * 1024,
        ),
        (
            "groups, scanned",
            node_review(NODE, &groups, r#""a":"b""#),
            200,
            64 * 1024,
        ),
        // serde's reading, one at a time: the labels' and groups' text and 4 bytes each.
        (
            "labels, read by serde",
            node_review(NODE_AS_ARRAY, "", &labels),
            200,
            2 * 33 * MIB / 10,
        ),
        (
            "groups, read by serde",
            node_review(NODE_AS_ARRAY, &groups, ""),
            200,
            3 * 33 * MIB / 10,
        ),
        // A label over its length: serde reads it again to say where.
        (
            "a label refused",
            node_review(NODE, "", &too_long),
            400,
            2 * 33 * MIB / 10,
        ),
    ];
    for (name, body, status, most) in cases {
        let size = body.len();
        let (got, peak) = peak_of(body).await;
        println!("{name}: body {size} bytes, {got}, peak {peak} bytes beyond it");
        assert_eq!(got.as_u16(), status, "{name}");
        assert!(
            peak <= most,
            "{name}: a {size}-byte body held {peak} bytes more at its peak (at most {most})"
        );
    }
}
