//! The decision alone: `policy::decide` on reviews already parsed, so no JSON and no I/O is
//! timed. Lab nodes carry a handful of labels; the large node about 100.

mod common;

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use gpu_deploy_guard::admission::parse_review;
use gpu_deploy_guard::node::NodeView;
use gpu_deploy_guard::policy::{self, ClusterFacts, Decision, Operation, Policy, Review};
use kube::core::admission::{AdmissionRequest, Operation as KubeOperation};

fn request(name: &str) -> AdmissionRequest<NodeView> {
    parse_review(&common::review_body(name)).unwrap_or_else(|(e, _)| panic!("{name}: {e}"))
}

/// The same mapping as the webhook's, kept out of the timed loop.
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
        labels: req.object.as_ref().map_or_else(
            || req.old_object.as_ref().map(NodeView::labels).unwrap(),
            NodeView::labels,
        ),
        username: req.user_info.username.as_deref().unwrap_or_default(),
        groups: req.user_info.groups.as_deref().unwrap_or_default(),
        dry_run: req.dry_run,
    }
}

fn decide(c: &mut Criterion) {
    let facts = ClusterFacts::default();
    let policy = Policy::default();
    let mut group = c.benchmark_group("decide");
    for name in common::LAB_REVIEWS.iter().chain(&common::LARGE_REVIEWS) {
        let req = request(name);
        let review = review(&req);
        // A fixture that stopped meaning what its name says would measure the wrong path.
        let decision = policy::decide(&review, &facts, &policy).decision;
        assert_eq!(
            decision == Decision::Denied,
            name.ends_with("denied")
                || name.ends_with("remove-toolkit")
                || name.ends_with("device-plugin-only"),
            "{name}: {decision:?}"
        );
        group.bench_function(*name, |b| {
            b.iter(|| policy::decide(black_box(&review), &facts, &policy))
        });
    }
    group.finish();
}

criterion_group!(benches, decide);
criterion_main!(benches);
