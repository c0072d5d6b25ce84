//! Fixtures shared by the criterion benches: the lab reviews the tests use and the large node
//! written by `bench/make-large-node.py`.

use std::path::Path;

/// The lab-node reviews of `tests/fixtures/reviews/`: small nodes (a few labels), one per kind
/// of verdict.
pub const LAB_REVIEWS: [&str; 4] = [
    "lab-node-1-dcgm-exporter-off",
    "lab-node-2-device-plugin-only",
    "lab-node-0-remove-toolkit",
    "lab-node-0-plugin-and-toolkit-off",
];

/// The large node's reviews (object and oldObject, about 40 KB): a flip that is allowed
/// without findings, the common case, and one that is denied.
pub const LARGE_REVIEWS: [&str; 2] = ["large-node-review-allowed", "large-node-review-denied"];

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The body of a review fixture, by name, from either list above.
pub fn review_body(name: &str) -> Vec<u8> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    if name.starts_with("large-node") {
        read(&root.join(format!("benches/fixtures/{name}.json")))
    } else {
        read(&root.join(format!("tests/fixtures/reviews/{name}.json")))
    }
}
