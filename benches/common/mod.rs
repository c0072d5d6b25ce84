//! What the criterion benches share: the fixtures (the lab reviews the tests use and the large
//! node written by `bench/make-large-node.py`) and a `main` that either runs criterion or counts
//! instructions of one case under callgrind.
//!
//! Timings on a shared 2-core machine move with whatever else runs; instruction counts do not.
//! With `GDG_BENCH_COUNT=N` and `GDG_BENCH_CASE=name` set, the bench runs that case N times
//! inside `counted` and nothing else, so that
//!
//! ```text
//! GDG_BENCH_COUNT=200 GDG_BENCH_CASE=full/large-node-review-allowed \
//!   valgrind --tool=callgrind --toggle-collect='*counted*' target/release/deps/review-HASH
//! ```
//!
//! reports 200 times the instructions of one review. `GDG_BENCH_LIST=1` prints the case names.

use std::path::Path;

use criterion::{Criterion, Throughput};

/// The lab-node reviews of `tests/fixtures/reviews/`: small nodes (a few labels), one per kind
/// of verdict.
#[allow(dead_code)] // the policy bench reads no review fixture
pub const LAB_REVIEWS: [&str; 4] = [
    "lab-node-1-dcgm-exporter-off",
    "lab-node-2-device-plugin-only",
    "lab-node-0-remove-toolkit",
    "lab-node-0-plugin-and-toolkit-off",
];

/// The large node's reviews (object and oldObject, about 40 KB): a flip that is allowed
/// without findings, the common case, and one that is denied.
#[allow(dead_code)] // the policy bench reads no review fixture
pub const LARGE_REVIEWS: [&str; 2] = ["large-node-review-allowed", "large-node-review-denied"];

#[allow(dead_code)] // the policy bench reads no review fixture
fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The body of a review fixture, by name, from either list above.
#[allow(dead_code)] // the policy bench reads no review fixture
pub fn review_body(name: &str) -> Vec<u8> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    if name.starts_with("large-node") {
        read(&root.join(format!("benches/fixtures/{name}.json")))
    } else {
        read(&root.join(format!("tests/fixtures/reviews/{name}.json")))
    }
}

/// One thing to measure. `run` does one iteration and keeps its result from being optimized
/// away (`black_box`).
pub struct Case {
    pub name: String,
    /// Bytes of input per iteration, for a MB/s figure.
    pub bytes: Option<u64>,
    pub run: Box<dyn FnMut()>,
}

impl Case {
    pub fn new(name: impl Into<String>, run: impl FnMut() + 'static) -> Self {
        Case {
            name: name.into(),
            bytes: None,
            run: Box::new(run),
        }
    }

    #[allow(dead_code)] // not every bench has a byte count
    pub fn bytes(mut self, n: usize) -> Self {
        self.bytes = Some(n as u64);
        self
    }
}

/// The bench's `main`: criterion over every case, or one case under callgrind (see the top).
pub fn main(group: &str, mut cases: Vec<Case>) {
    if std::env::var_os("GDG_BENCH_LIST").is_some() {
        for case in &cases {
            println!("{}", case.name);
        }
        return;
    }
    if let Ok(count) = std::env::var("GDG_BENCH_COUNT") {
        let count: u64 = count.parse().expect("GDG_BENCH_COUNT: a number");
        let name = std::env::var("GDG_BENCH_CASE").expect("GDG_BENCH_CASE: a case name");
        let case = cases
            .iter_mut()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no case {name}"));
        counted(count, &mut case.run);
        return;
    }
    let mut criterion = Criterion::default().configure_from_args();
    let mut benchmarks = criterion.benchmark_group(group);
    for case in &mut cases {
        if let Some(bytes) = case.bytes {
            benchmarks.throughput(Throughput::Bytes(bytes));
        }
        benchmarks.bench_function(&case.name, |b| b.iter(&mut case.run));
    }
    benchmarks.finish();
    criterion.final_summary();
}

/// Callgrind counts what runs under this function (`--toggle-collect='*counted*'`).
#[inline(never)]
fn counted(count: u64, run: &mut dyn FnMut()) {
    for _ in 0..count {
        run();
    }
}
