//! The decision alone: `policy::decide` on reviews already parsed, so no JSON and no I/O is
//! measured. Lab nodes carry a handful of labels; the large node about 100.

mod common;

use std::hint::black_box;

use common::Case;
use gpu_deploy_guard::admission::parse_review;
use gpu_deploy_guard::node::NodeView;
use gpu_deploy_guard::policy::{self, ClusterFacts, Decision, Operation, Policy, Review};
use kube::core::admission::{AdmissionRequest, Operation as KubeOperation};

fn request(name: &str) -> AdmissionRequest<NodeView> {
    parse_review(&common::review_body(name)).unwrap_or_else(|(e, _)| panic!("{name}: {e}"))
}

/// The same mapping as the webhook's, kept out of the measured loop.
fn review(req: &AdmissionRequest<NodeView>) -> Review<'_> {
    Review {
        node: &req.name,
        operation: match req.operation {
            KubeOperation::Create => Operation::Create,
            KubeOperation::Update => Operation::Update,
            KubeOperation::Delete => Operation::Delete,
            KubeOperation::Connect => Operation::Connect,
        },
        old_labels: req.old_object.as_ref().map(NodeView::labels),
        labels: req
            .object
            .as_ref()
            .or(req.old_object.as_ref())
            .map(NodeView::labels)
            .expect("an object"),
        username: req.user_info.username.as_deref().unwrap_or_default(),
        groups: req.user_info.groups.as_deref().unwrap_or_default(),
        dry_run: req.dry_run,
    }
}

fn case(name: &'static str) -> Case {
    let facts = ClusterFacts::default();
    let policy = Policy::default();
    let req = request(name);
    // A fixture that stopped meaning what its name says would measure the wrong path.
    let decision = policy::decide(&review(&req), &facts, &policy).decision;
    let denied = ["denied", "remove-toolkit", "device-plugin-only"];
    assert_eq!(
        decision == Decision::Denied,
        denied.iter().any(|d| name.ends_with(d)),
        "{name}: {decision:?}"
    );
    Case::new(name, move || {
        black_box(policy::decide(black_box(&review(&req)), &facts, &policy));
    })
}

fn main() {
    let names = common::LAB_REVIEWS.iter().chain(&common::LARGE_REVIEWS);
    common::main("decision", names.map(|name| case(name)).collect());
}
