//! The decision alone: `policy::decide` on reviews already parsed, so no JSON and no I/O is
//! measured. Lab nodes carry a handful of labels; the large node about 100, of which the webhook
//! hands the policy the ones it reads (`policy::reads_label`).

mod common;

use std::hint::black_box;

use common::Case;
use gpu_deploy_guard::admission::parse_review;
use gpu_deploy_guard::operands::Labels;
use gpu_deploy_guard::policy::{self, ClusterFacts, Decision, Policy, Review};
use gpu_deploy_guard::request::RequestView;

/// A parsed request and the labels the webhook copies out of it for the policy.
struct Parsed {
    body: &'static [u8],
    old_labels: Option<Labels>,
    labels: Labels,
}

fn request(body: &[u8]) -> RequestView<'_> {
    parse_review(body).unwrap_or_else(|(e, _)| panic!("{e}"))
}

fn parsed(name: &str, facts: &ClusterFacts) -> Parsed {
    let body: &'static [u8] = Vec::leak(common::review_body(name));
    let req = request(body);
    let old_labels = req.old_object.as_ref().map(|o| o.labels(facts));
    let labels = req
        .object
        .as_ref()
        .or(req.old_object.as_ref())
        .map(|o| o.labels(facts))
        .expect("an object");
    Parsed {
        body,
        old_labels,
        labels,
    }
}

/// The same mapping as the webhook's, kept out of the measured loop.
fn review<'a>(req: &'a RequestView<'_>, p: &'a Parsed) -> Review<'a> {
    Review {
        node: &req.name,
        operation: req.operation,
        old_labels: p.old_labels.as_ref(),
        labels: &p.labels,
        username: req.user_info.username.as_deref().unwrap_or_default(),
        groups: req.user_info.groups.as_deref().unwrap_or_default(),
        dry_run: req.dry_run,
    }
}

fn case(name: &'static str) -> Case {
    let facts = ClusterFacts::default();
    let policy = Policy::default();
    let p = parsed(name, &facts);
    let req = request(p.body);
    // A fixture that stopped meaning what its name says would measure the wrong path.
    let decision = policy::decide(&review(&req, &p), &facts, &policy).decision;
    let denied = ["denied", "remove-toolkit", "device-plugin-only"];
    assert_eq!(
        decision == Decision::Denied,
        denied.iter().any(|d| name.ends_with(d)),
        "{name}: {decision:?}"
    );
    Case::new(name, move || {
        black_box(policy::decide(
            black_box(&review(&req, &p)),
            &facts,
            &policy,
        ));
    })
}

fn main() {
    let names = common::LAB_REVIEWS.iter().chain(&common::LARGE_REVIEWS);
    common::main("decision", names.map(|name| case(name)).collect());
}
