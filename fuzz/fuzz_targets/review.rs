//! Any bytes as the body of POST /validate: parsing, the decision and the answer must never
//! panic, and what they produce must hold together.
//!
//! The seeds are the fixtures: AdmissionReviews (tests/fixtures/reviews) and Nodes
//! (tests/fixtures/nodes as YAML, tests/fixtures/real-nodes as JSON). An input that is a Node
//! rather than a review is wrapped in an UPDATE review that switches the container toolkit off,
//! so mutations of real nodes reach the decision too.
#![no_main]

mod cases;

use cases::cases;
use gpu_deploy_guard::core::policy::Decision;
use gpu_deploy_guard::webhook::response::{MAX_MESSAGE_BYTES, MAX_WARNING_BYTES, MAX_WARNINGS, respond};
use gpu_deploy_guard::webhook::node_review::review_request;
use gpu_deploy_guard::webhook::read::parse_review;
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};

fuzz_target!(|data: &[u8]| {
    check_review(data);
    if let Some(wrapped) = node_as_review(data) {
        check_review(&wrapped);
    }
});

fn check_review(body: &[u8]) {
    let request = match parse_review(body) {
        Ok(request) => request,
        Err((bad, _uid)) => {
            // A refusal repeats at most a bounded part of what it refuses.
            assert!(bad.to_string().len() <= 2048, "refusal of {} bytes", bad.to_string().len());
            return;
        }
    };
    let cases = cases();
    for facts in &cases.facts {
        for policy in &cases.policies {
            let verdict = match review_request(&request, facts, policy) {
                Ok(verdict) => verdict,
                Err(bad) => {
                    assert!(bad.to_string().len() <= 2048);
                    continue;
                }
            };
            assert_eq!(
                verdict.decision == Decision::Denied,
                verdict.message.is_some(),
                "a denial carries a message, and only a denial does"
            );
            let review = respond(&request, &verdict);
            let response = &review.response;
            assert_eq!(response.allowed, verdict.allowed());
            assert_eq!(response.uid, request.uid);
            // The answer is bounded whatever the request holds.
            let warnings = response.warnings.as_deref().unwrap_or_default();
            assert!(warnings.len() <= MAX_WARNINGS);
            assert!(warnings.iter().all(|w| w.len() <= MAX_WARNING_BYTES));
            assert!(response.status.message.len() <= MAX_MESSAGE_BYTES);
            let bytes = serde_json::to_vec(&review).expect("the answer serializes");
            let back: Value = serde_json::from_slice(&bytes).expect("the answer is JSON");
            assert_eq!(back["kind"], "AdmissionReview");
        }
    }
}

/// A Node (JSON or YAML) as the new object of an UPDATE whose old object is the Node itself
/// with the container toolkit's deploy label `true`.
fn node_as_review(data: &[u8]) -> Option<Vec<u8>> {
    if data.len() > 256 * 1024 {
        return None;
    }
    let node: Value = serde_norway::from_slice(data).ok()?;
    if node.get("kind")?.as_str()? != "Node" {
        return None;
    }
    let name = node.pointer("/metadata/name")?.as_str()?.to_owned();
    let mut old = node.clone();
    let mut new = node;
    let key = "nvidia.com/gpu.deploy.container-toolkit";
    if let Some(labels) = old.pointer_mut("/metadata/labels")?.as_object_mut() {
        labels.insert(key.to_owned(), json!("true"));
    }
    if let Some(labels) = new.pointer_mut("/metadata/labels")?.as_object_mut() {
        labels.insert(key.to_owned(), json!("false"));
    }
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "fuzz",
            "kind": {"group": "", "version": "v1", "kind": "Node"},
            "resource": {"group": "", "version": "v1", "resource": "nodes"},
            "name": name,
            "operation": "UPDATE",
            "userInfo": {"username": "fuzz"},
            "object": new,
            "oldObject": old,
        }
    }))
    .ok()
}
