//! A whole review in-process, and its parts: the AdmissionReview body in, the response body out,
//! with no socket and no TLS. `full` is what the handler does per request between reading the
//! body and writing the answer; `router` adds axum, the limits and the metrics. `floor` is the
//! floor server's work on the same body (read the uid, answer allowed), the baseline the load
//! test compares with.

mod common;

use std::hint::black_box;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use common::Case;
use gpu_deploy_guard::core::facts::ClusterFacts;
use gpu_deploy_guard::core::policy::Policy;
use gpu_deploy_guard::metrics::Metrics;
use gpu_deploy_guard::webhook::node_review::review_request;
use gpu_deploy_guard::webhook::read::parse_review;
use gpu_deploy_guard::webhook::read::reference::parse_with_serde;
use gpu_deploy_guard::webhook::response::respond;
use gpu_deploy_guard::webhook::{Limits, Webhook};
use http_body_util::BodyExt;
use tower::ServiceExt;

/// Parse, decide, build and serialize the answer: one review without transport.
fn full(body: &[u8], facts: &ClusterFacts, policy: &Policy) -> Vec<u8> {
    let req = parse_review(body).unwrap_or_else(|(e, _)| panic!("{e}"));
    let verdict = review_request(&req, facts, policy).unwrap();
    serde_json::to_vec(&respond(&req, &verdict)).unwrap()
}

/// What the floor server does with a body.
fn floor(body: &[u8]) -> Vec<u8> {
    #[derive(serde::Deserialize)]
    struct Review {
        request: Request,
    }
    #[derive(serde::Deserialize)]
    struct Request {
        uid: String,
    }
    let review: Review = serde_json::from_slice(body).unwrap();
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": review.request.uid, "allowed": true},
    }))
    .unwrap()
}

fn full_case(name: &str) -> Case {
    let body = common::review_body(name);
    let (facts, policy) = (ClusterFacts::default(), Policy::default());
    let answer: serde_json::Value = serde_json::from_slice(&full(&body, &facts, &policy)).unwrap();
    // A fixture that stopped meaning what its name says would measure the wrong path.
    assert_eq!(
        answer["response"]["allowed"],
        !name.ends_with("denied"),
        "{name}: {answer}"
    );
    let size = body.len();
    Case::new(format!("full/{name}"), move || {
        black_box(full(black_box(&body), &facts, &policy));
    })
    .bytes(size)
}

/// The parts of `full` for one body, the floor's work on it, and the whole handler.
fn part_cases(name: &str) -> Vec<Case> {
    let body = common::review_body(name);
    let size = body.len();
    let parse = {
        let body = body.clone();
        Case::new(format!("parse/{name}"), move || {
            black_box(parse_review(black_box(&body)).ok());
        })
        .bytes(size)
    };
    // The same with serde alone, as parse did before the scanner.
    let parse_serde = {
        let body = body.clone();
        Case::new(format!("parse-serde/{name}"), move || {
            black_box(parse_with_serde(black_box(&body)).ok());
        })
        .bytes(size)
    };
    let respond = {
        let body: &'static [u8] = Vec::leak(body.clone());
        let req = parse_review(body).ok().unwrap();
        let verdict = review_request(&req, &ClusterFacts::default(), &Policy::default()).unwrap();
        Case::new(format!("respond/{name}"), move || {
            black_box(serde_json::to_vec(&respond(black_box(&req), &verdict)).unwrap());
        })
    };
    let floor = {
        let body = body.clone();
        Case::new(format!("floor/{name}"), move || {
            black_box(floor(black_box(&body)));
        })
        .bytes(size)
    };
    vec![parse, parse_serde, respond, floor, router_case(name, body)]
}

/// The whole `/validate` handler through the router, on a current-thread runtime.
fn router_case(name: &str, body: Vec<u8>) -> Case {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let hook = Webhook::new(
        Policy::default(),
        ClusterFacts::default(),
        Arc::new(Metrics::new()),
        Limits::default(),
    );
    let app = gpu_deploy_guard::webhook::router(Arc::new(hook));
    let size = body.len();
    let body = bytes::Bytes::from(body);
    Case::new(format!("router/{name}"), move || {
        let req = Request::post("/validate")
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::CONTENT_LENGTH, body.len())
            .body(Body::from(body.clone()))
            .unwrap();
        let answer = runtime.block_on(async {
            let resp = app.clone().oneshot(req).await.unwrap();
            assert_eq!(resp.status(), StatusCode::OK);
            resp.into_body().collect().await.unwrap().to_bytes()
        });
        black_box(answer);
    })
    .bytes(size)
}

fn main() {
    let [allowed, denied] = common::LARGE_REVIEWS;
    let mut cases = vec![
        full_case(allowed),
        full_case(denied),
        full_case(common::LAB_REVIEWS[0]),
    ];
    cases.extend(part_cases(allowed));
    common::main("review", cases);
}
