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
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use gpu_deploy_guard::admission::{Limits, Webhook, parse_review, respond, review_request};
use gpu_deploy_guard::metrics::Metrics;
use gpu_deploy_guard::policy::{ClusterFacts, Policy};
use http_body_util::BodyExt;
use tower::ServiceExt;

/// Parse, decide, build and serialize the answer: one review without transport.
fn full(body: &[u8], facts: &ClusterFacts, policy: &Policy) -> Vec<u8> {
    let req = parse_review(body).unwrap_or_else(|(e, _)| panic!("{e}"));
    let (verdict, _) = review_request(&req, facts, policy).unwrap();
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

fn reviews(c: &mut Criterion) {
    let facts = ClusterFacts::default();
    let policy = Policy::default();
    let names = common::LARGE_REVIEWS
        .iter()
        .chain(&common::LAB_REVIEWS[..1]);
    let mut group = c.benchmark_group("review");
    for name in names {
        let body = common::review_body(name);
        let answer: serde_json::Value =
            serde_json::from_slice(&full(&body, &facts, &policy)).unwrap();
        assert_eq!(
            answer["response"]["allowed"],
            !name.ends_with("denied"),
            "{name}: {answer}"
        );
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_function(format!("full/{name}"), |b| {
            b.iter(|| full(black_box(&body), &facts, &policy))
        });
        if *name != common::LARGE_REVIEWS[0] {
            continue;
        }
        // The parts of the common case, to see where the time of `full` goes.
        group.bench_function(format!("parse/{name}"), |b| {
            b.iter(|| parse_review(black_box(&body)).ok())
        });
        let req = parse_review(&body).ok().unwrap();
        let (verdict, _) = review_request(&req, &facts, &policy).unwrap();
        group.bench_function(format!("respond/{name}"), |b| {
            b.iter(|| serde_json::to_vec(&respond(black_box(&req), &verdict)).unwrap())
        });
        group.bench_function(format!("floor/{name}"), |b| {
            b.iter(|| floor(black_box(&body)))
        });
        router(&mut group, name, body);
    }
    group.finish();
}

/// The whole `/validate` handler through the router, on a current-thread runtime.
fn router(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    body: Vec<u8>,
) {
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
    let app = gpu_deploy_guard::admission::router(Arc::new(hook));
    let body = bytes::Bytes::from(body);
    let call = || async {
        let req = Request::post("/validate")
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::CONTENT_LENGTH, body.len())
            .body(Body::from(body.clone()))
            .unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        resp.into_body().collect().await.unwrap().to_bytes()
    };
    group.bench_function(format!("router/{name}"), |b| {
        b.iter(|| runtime.block_on(call()))
    });
}

criterion_group!(benches, reviews);
criterion_main!(benches);
