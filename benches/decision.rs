//! The decision alone: `policy::decide` on reviews already parsed, so no JSON and no I/O is
//! measured. Lab nodes carry a handful of labels; the large node about 100, of which the webhook
//! hands the policy the ones it reads (`policy::reads_label`).

mod common;

use std::hint::black_box;

use common::Case;
use gpu_deploy_guard::core::facts::ClusterFacts;
use gpu_deploy_guard::core::policy::{self, Decision, Policy};
use gpu_deploy_guard::webhook::node_review::RequestLabels;
use gpu_deploy_guard::webhook::read::parse_review;

fn case(name: &'static str) -> Case {
    let facts = ClusterFacts::default();
    let policy = Policy::default();
    let body: &'static [u8] = Vec::leak(common::review_body(name));
    let req = parse_review(body).unwrap_or_else(|(e, _)| panic!("{name}: {e}"));
    // Copying the labels is the webhook's work before the decision; kept out of the loop.
    let labels = RequestLabels::of(&req, &facts, &policy.exemptions)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    // A fixture that stopped meaning what its name says would measure the wrong path.
    let decision = policy::decide(&labels.review(&req), &facts, &policy).decision;
    let denied = ["denied", "remove-toolkit", "device-plugin-only"];
    assert_eq!(
        decision == Decision::Denied,
        denied.iter().any(|d| name.ends_with(d)),
        "{name}: {decision:?}"
    );
    Case::new(name, move || {
        black_box(policy::decide(
            black_box(&labels.review(&req)),
            &facts,
            &policy,
        ));
    })
}

fn main() {
    let names = common::LAB_REVIEWS.iter().chain(&common::LARGE_REVIEWS);
    common::main("decision", names.map(|name| case(name)).collect());
}
