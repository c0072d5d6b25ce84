//! The body scanner against serde, on any bytes: the webhook reads a review with the scanner
//! (`webhook::read::scan`) and falls back to serde only where the scanner refuses. Whatever the body,
//! the answer the webhook gives must be the answer serde's reading (`parse_with_serde`) gives:
//! the same refusal, or the same AdmissionReview response, byte for byte, under every policy
//! and set of cluster facts below. tests/scan_differential.rs holds the same property on the
//! fixtures and generated reviews; this target lets coverage guidance look for the exception.
//!
//! The fallback would hide a scanner that wrongly refuses a valid body (serde then reads it and
//! the answers agree), so the scanner's own verdict is checked first: what it calls invalid,
//! serde must refuse too.
//!
//! Seeded like the `review` target, with the fixtures.
#![no_main]

mod cases;

use cases::cases;
use gpu_deploy_guard::webhook::response::respond;
use gpu_deploy_guard::webhook::read::RequestView;
use gpu_deploy_guard::webhook::node_review::review_request;
use gpu_deploy_guard::webhook::read::scan::ScanError;
use gpu_deploy_guard::webhook::read::{Scanned, parse_review, scan_review};
use gpu_deploy_guard::webhook::read::reference::parse_with_serde;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let reference = parse_with_serde(data);
    if let Scanned::ToSerde(Some(why @ ScanError::Invalid { .. })) = scan_review(data) {
        assert!(
            reference.is_err(),
            "the scanner refuses a body serde accepts: {why}"
        );
    }
    let scanned = parse_review(data);
    match (&scanned, &reference) {
        (Ok(scanned), Ok(reference)) => same_answers(scanned, reference),
        (Err((a, uid_a)), Err((b, uid_b))) => {
            assert_eq!(a.to_string(), b.to_string(), "the same refusal");
            assert_eq!(uid_a, uid_b, "the same uid in the refusal");
        }
        (Ok(_), Err((bad, _))) => panic!("the scanner accepts a body serde refuses: {bad}"),
        (Err((bad, _)), Ok(_)) => panic!("the scanner refuses a body serde accepts: {bad}"),
    }
});

fn same_answers(scanned: &RequestView<'_>, reference: &RequestView<'_>) {
    let cases = cases();
    for facts in &cases.facts {
        for policy in &cases.policies {
            let answer = |request: &RequestView<'_>| match review_request(request, facts, policy) {
                Ok(verdict) => Ok(serde_json::to_vec(&respond(request, &verdict))
                    .expect("the answer serializes")),
                Err(bad) => Err(bad.to_string()),
            };
            let (a, b) = (answer(scanned), answer(reference));
            assert!(
                a == b,
                "scanner and serde answer differently:\n{}\n{}",
                show(&a),
                show(&b)
            );
        }
    }
}

fn show(answer: &Result<Vec<u8>, String>) -> String {
    match answer {
        Ok(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Err(bad) => format!("refused: {bad}"),
    }
}
