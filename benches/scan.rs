//! Reading an AdmissionReview body with the scanner (`webhook::read::scan`): the fields the webhook needs,
//! every other value skipped unbuilt but checked. Compare with `review/parse` (serde into the
//! webhook's view) and `review/floor` (serde skimming the body for the uid) on the same body.

mod common;

use std::hint::black_box;

use common::Case;
use gpu_deploy_guard::webhook::read::scan;

fn case(name: &str) -> Case {
    let body = common::review_body(name);
    // A fixture the scanner refuses would measure its error path.
    let review = scan::scan(&body).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(review.request.is_some_and(|r| r.object.is_some()), "{name}");
    let size = body.len();
    Case::new(format!("scan/{name}"), move || {
        black_box(scan::scan(black_box(&body)).ok());
    })
    .bytes(size)
}

fn main() {
    let [allowed, denied] = common::LARGE_REVIEWS;
    common::main(
        "scan",
        vec![case(allowed), case(denied), case(common::LAB_REVIEWS[0])],
    );
}
