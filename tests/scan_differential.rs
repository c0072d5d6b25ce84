//! The body scanner (`webhook::read::scan`) against serde, the webhook's reference reading of
//! an AdmissionReview into the same view (`webhook::read::ReviewBody`): on every review fixture,
//! on generated reviews and on mutations of both, serde refuses a body exactly when the scanner
//! does, and otherwise both read the same fields. The scanner may leave a body to serde (`Unusual`) only for the forms its
//! documentation names, and then the body is not one the API server sends.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use gpu_deploy_guard::core::facts::ClusterFacts;
use gpu_deploy_guard::core::labels;
use gpu_deploy_guard::core::operands::{Labels, Operand};
use gpu_deploy_guard::webhook::read::reference::parse_with_serde;
use gpu_deploy_guard::webhook::read::{NodeLabels, ReviewBody};
use gpu_deploy_guard::webhook::read::{parse_review, scan};

/// What the webhook reads from a review, in a form both readings can be compared in.
#[derive(Debug, PartialEq, Eq)]
struct Read {
    api_version: String,
    kind: String,
    request: Option<ReadRequest>,
}

#[derive(Debug, PartialEq, Eq)]
struct ReadRequest {
    uid: String,
    gvk: (String, String, String),
    name: String,
    operation: &'static str,
    username: Option<String>,
    /// Absent, `null` and `[]` alike: the decision reads the groups only as a list.
    groups: Vec<String>,
    object: Option<ReadNode>,
    old_object: Option<ReadNode>,
    dry_run: bool,
}

/// A node's name ("" when absent, as the webhook reads it) and its labels, the last value of a
/// repeated key winning.
#[derive(Debug, PartialEq, Eq)]
struct ReadNode {
    name: String,
    labels: Labels,
}

/// The scanner's reading: every label, as given.
fn from_scan(r: &ReviewBody<'_>) -> Read {
    read(r, |n| {
        n.pairs()
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect()
    })
}

/// serde's reading. `NodeLabels` hands out only the labels the policy reads under the cluster
/// facts, so the facts name every key either reading found as a DaemonSet selector key.
fn from_serde(r: &ReviewBody<'_>, keys: &BTreeSet<String>) -> Read {
    let facts = ClusterFacts {
        selectors: BTreeMap::from([(
            Operand::DevicePlugin,
            keys.iter().map(|k| (k.clone(), String::new())).collect(),
        )]),
        ..ClusterFacts::default()
    };
    read(r, |n| n.labels(&facts))
}

/// A view of a review in the comparable form, its labels as `labels` reads them.
fn read(r: &ReviewBody<'_>, labels: impl Fn(&NodeLabels<'_>) -> Labels) -> Read {
    let node = |n: &NodeLabels<'_>| ReadNode {
        name: n.name().to_owned(),
        labels: labels(n),
    };
    Read {
        api_version: r.api_version.as_str().to_owned(),
        kind: r.kind.as_str().to_owned(),
        request: r.request.as_ref().map(|q| ReadRequest {
            uid: q.uid.clone(),
            gvk: (
                q.kind.group.clone(),
                q.kind.version.clone(),
                q.kind.kind.clone(),
            ),
            name: q.name.clone(),
            operation: q.operation.as_str(),
            username: q.user_info.username.clone(),
            groups: q.user_info.groups().map(|g| g.into_owned()).collect(),
            object: q.object.as_ref().map(node),
            old_object: q.old_object.as_ref().map(node),
            dry_run: q.dry_run,
        }),
    }
}

/// Every label key of object and oldObject, as a generic JSON reading finds them (when it can:
/// it also refuses what serde's view skips unchecked, such as bytes that are not UTF-8).
fn label_keys(body: &[u8]) -> BTreeSet<String> {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
        return BTreeSet::new();
    };
    ["object", "oldObject"]
        .iter()
        .filter_map(|o| v["request"][o]["metadata"]["labels"].as_object())
        .flat_map(|m| m.keys().cloned())
        .collect()
}

#[derive(Default, Debug)]
struct Tally {
    read: usize,
    refused: usize,
    unusual: usize,
}

/// The objects of a scanned review.
fn nodes<'r>(review: &'r ReviewBody<'_>) -> Vec<&'r NodeLabels<'r>> {
    review
        .request
        .iter()
        .flat_map(|r| r.object.iter().chain(r.old_object.iter()))
        .collect()
}

/// Compares both readings of one body; panics with the body when they differ.
fn compare(body: &[u8], tally: &mut Tally) {
    let by_serde = serde_json::from_slice::<ReviewBody<'_>>(body);
    let by_scan = scan::scan(body);
    // The webhook refuses a label outside Kubernetes syntax on either path (`parse_review` checks
    // the scanned pairs; serde's reader checks while it reads): count that as the scanner refusing.
    let bad_label = by_scan.as_ref().is_ok_and(|review| {
        let bad = nodes(review)
            .iter()
            .flat_map(|n| n.pairs())
            .any(|(k, v)| labels::check_lengths(&k, &v).is_err());
        // What the scanner noted while reading says the same.
        let noted = nodes(review).iter().any(|n| !n.syntax_ok());
        assert_eq!(bad, noted, "{}", String::from_utf8_lossy(body));
        bad
    });
    let show = || String::from_utf8_lossy(body).into_owned();
    match (&by_serde, &by_scan) {
        (Err(_), Ok(_)) if bad_label => tally.refused += 1,
        (Ok(_), Ok(_)) if bad_label => {
            panic!("serde reads a label the syntax check refuses: {}", show())
        }
        (Ok(serde), Ok(scanned)) => {
            let mut keys = label_keys(body);
            let scanned = from_scan(scanned);
            for n in scanned
                .request
                .iter()
                .flat_map(|r| r.object.iter().chain(r.old_object.iter()))
            {
                keys.extend(n.labels.keys().cloned());
            }
            assert_eq!(from_serde(serde, &keys), scanned, "{}", show());
            tally.read += 1;
        }
        (Err(_), Err(scan::ScanError::Invalid { .. })) => tally.refused += 1,
        (_, Err(scan::ScanError::Unusual { .. })) => tally.unusual += 1,
        (Ok(_), Err(e)) => panic!("serde reads it, the scanner refuses it ({e}): {}", show()),
        (Err(e), Ok(_)) => panic!("serde refuses it ({e}), the scanner reads it: {}", show()),
    }
}

/// A small deterministic generator (xorshift), so that a failure can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

fn fixtures() -> Vec<(String, Vec<u8>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    for dir in ["tests/fixtures/reviews", "benches/fixtures"] {
        let mut entries: Vec<_> = std::fs::read_dir(root.join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
        entries.sort();
        for path in entries {
            let body = std::fs::read(&path).unwrap();
            out.push((path.display().to_string(), body));
        }
    }
    assert!(
        out.len() >= 15,
        "expected the review fixtures, found {}",
        out.len()
    );
    out
}

/// Bytes that change the meaning of JSON where they land.
const INTERESTING: &[&[u8]] = &[
    b"\"",
    b"\\",
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b" ",
    b"\n",
    b"0",
    b"-",
    b"1e",
    b".5",
    b"null",
    b"true",
    b"fals",
    b"\x00",
    b"\x1f",
    b"\xff",
    b"\xc3\xa9",
    b"\xc3",
    b"\\u0041",
    b"\\ud83d\\ude00",
    b"\\ud800",
    b"\\udc00",
    b"\\x",
    b"\"\"",
    b"{}",
    b"[]",
    b"[1,]",
    b"01",
];

/// One random edit of `body`.
fn mutate(body: &[u8], rng: &mut Rng) -> Vec<u8> {
    if body.is_empty() {
        return rng.pick(INTERESTING).to_vec();
    }
    let mut out = body.to_vec();
    let at = rng.below(out.len() + 1);
    match rng.below(6) {
        0 => {
            let len = 1 + rng.below(4);
            out.drain(at..(at + len).min(out.len()));
        }
        1 => {
            out.splice(at..at, rng.pick(INTERESTING).iter().copied());
        }
        2 if at < out.len() => {
            out.splice(at..at + 1, rng.pick(INTERESTING).iter().copied());
        }
        3 => out.truncate(at),
        4 => {
            // A piece of the body again elsewhere: repeats keys, labels and whole objects.
            let from = rng.below(out.len());
            let len = 1 + rng.below(80.min(out.len() - from));
            let piece = out[from..from + len].to_vec();
            out.splice(at..at, piece);
        }
        _ => {
            // Somewhere in a string: a byte that is not UTF-8, or an escape.
            if let Some(q) = out[at..].iter().position(|&c| c == b'"') {
                let p = at + q + 1;
                out.splice(
                    p..p,
                    rng.pick(&[&b"\xfe"[..], b"\\n", b"\\u00e9", b"\\/"])
                        .iter()
                        .copied(),
                );
            }
        }
    }
    out
}

/// A JSON string literal for `s`, sometimes with an escape standing for one of its characters.
fn quoted(s: &str, rng: &mut Rng) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        if rng.chance(12) {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                c => out.push(c),
            }
        }
    }
    out.push('"');
    out
}

/// A value of any shape, for fields whose type is being tested and for skipped parts.
fn any_value(rng: &mut Rng, depth: usize) -> String {
    let pick = if depth > 3 {
        rng.below(6)
    } else {
        rng.below(9)
    };
    match pick {
        0 => "null".to_owned(),
        1 => rng.pick(&["true", "false"]).to_string(),
        2 => rng
            .pick(&[
                "0",
                "-1",
                "2.5",
                "1e9",
                "-0.0E-3",
                "12345678901234567890123",
            ])
            .to_string(),
        3 | 4 => {
            let s = *rng.pick(&["", "x", "UPDATE", "v1", "Node", "é", "a\"b", "\u{1F600}"]);
            quoted(s, rng)
        }
        5 => quoted("CREATE", rng),
        6 => {
            let items: Vec<String> = (0..rng.below(4))
                .map(|_| any_value(rng, depth + 1))
                .collect();
            format!("[{}]", items.join(","))
        }
        _ => {
            let items: Vec<String> = (0..rng.below(4))
                .map(|_| {
                    let key = rng
                        .pick(&["a", "metadata", "labels", "name", "kind", "f:x"])
                        .to_string();
                    format!("{}:{}", quoted(&key, rng), any_value(rng, depth + 1))
                })
                .collect();
            format!("{{{}}}", items.join(","))
        }
    }
}

/// An object from `fields`, each field given (usually right), left out, repeated, or replaced by
/// a value of another shape; unknown fields mixed in; random whitespace.
fn object(fields: Vec<(&str, String)>, rng: &mut Rng) -> String {
    let mut parts = Vec::new();
    for (key, good) in fields {
        if rng.chance(40) {
            continue;
        }
        let value = if rng.chance(25) {
            any_value(rng, 1)
        } else {
            good
        };
        parts.push(format!("{}:{}", quoted(key, rng), value));
        if rng.chance(60) {
            parts.push(format!("{}:{}", quoted(key, rng), any_value(rng, 1)));
        }
        if rng.chance(6) {
            parts.push(format!("{}:{}", quoted("extra", rng), any_value(rng, 0)));
        }
    }
    let len = parts.len();
    for i in 0..len {
        let j = rng.below(len);
        parts.swap(i, j);
    }
    let sep = if rng.chance(5) { " ,\n " } else { "," };
    format!("{{{}}}", parts.join(sep))
}

fn labels(rng: &mut Rng) -> String {
    let keys = [
        "nvidia.com/gpu.deploy.device-plugin",
        "nvidia.com/gpu.deploy.container-toolkit",
        "nvidia.com/gpu.present",
        "kubernetes.io/hostname",
        "example.com/é",
    ];
    let values = ["true", "false", "", "paused-for-mig-change"];
    let pairs: Vec<String> = (0..rng.below(7))
        .map(|_| {
            let value = if rng.chance(15) {
                any_value(rng, 2)
            } else {
                let v = *rng.pick(&values);
                quoted(v, rng)
            };
            let k = *rng.pick(&keys);
            format!("{}:{}", quoted(k, rng), value)
        })
        .collect();
    format!("{{{}}}", pairs.join(","))
}

fn node(rng: &mut Rng) -> String {
    if rng.chance(8) {
        return "null".to_owned();
    }
    let metadata = object(
        vec![
            ("name", quoted("node-1", rng)),
            (
                "labels",
                if rng.chance(10) {
                    "null".to_owned()
                } else {
                    labels(rng)
                },
            ),
            ("managedFields", any_value(rng, 0)),
        ],
        rng,
    );
    object(
        vec![
            ("apiVersion", quoted("v1", rng)),
            ("metadata", metadata),
            ("status", any_value(rng, 0)),
        ],
        rng,
    )
}

/// A review built field by field, most of them well-formed.
fn generated(rng: &mut Rng) -> String {
    let gvk = object(
        vec![
            ("group", quoted("", rng)),
            ("version", quoted("v1", rng)),
            ("kind", quoted("Node", rng)),
        ],
        rng,
    );
    let user = object(
        vec![
            ("username", quoted("kubernetes-admin", rng)),
            ("groups", format!("[{}]", quoted("system:masters", rng))),
            ("extra", any_value(rng, 0)),
        ],
        rng,
    );
    let operation = *rng.pick(&["UPDATE", "CREATE", "DELETE", "CONNECT"]);
    let request = object(
        vec![
            ("uid", quoted("6a0d8e2f", rng)),
            ("kind", gvk),
            ("name", quoted("node-1", rng)),
            ("operation", quoted(operation, rng)),
            ("userInfo", user),
            ("object", node(rng)),
            ("oldObject", node(rng)),
            ("dryRun", rng.pick(&["true", "false"]).to_string()),
            ("resource", any_value(rng, 0)),
        ],
        rng,
    );
    object(
        vec![
            ("apiVersion", quoted("admission.k8s.io/v1", rng)),
            ("kind", quoted("AdmissionReview", rng)),
            ("request", request),
        ],
        rng,
    )
}

#[test]
fn every_fixture_reads_the_same() {
    let mut tally = Tally::default();
    for (name, body) in fixtures() {
        let before = tally.read;
        compare(&body, &mut tally);
        // The fixtures are meant to be read (the bad-* ones fail later, in the handler), except
        // the one whose label is not a string.
        assert_eq!(
            tally.read,
            before + usize::from(!name.contains("not-string")),
            "{name}"
        );
    }
}

#[test]
fn mutated_fixtures_read_the_same() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut tally = Tally::default();
    for (_, body) in fixtures() {
        // The large bodies cost more per run; the small ones get more edits.
        let runs = if body.len() > 20_000 { 300 } else { 1_500 };
        for _ in 0..runs {
            let mut m = mutate(&body, &mut rng);
            if rng.chance(3) {
                m = mutate(&m, &mut rng);
            }
            compare(&m, &mut tally);
        }
    }
    // Both outcomes must be common, or the mutations test nothing.
    assert!(tally.read > 2_000 && tally.refused > 10_000, "{tally:?}");
}

#[test]
fn generated_reviews_read_the_same() {
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    let mut tally = Tally::default();
    for _ in 0..30_000 {
        let body = generated(&mut rng);
        compare(body.as_bytes(), &mut tally);
        let m = mutate(body.as_bytes(), &mut rng);
        compare(&m, &mut tally);
    }
    assert!(
        tally.read > 5_000 && tally.refused > 10_000 && tally.unusual > 50,
        "{tally:?}"
    );
}

#[test]
fn a_form_the_scanner_leaves_to_serde_is_read_by_the_webhook_all_the_same() {
    let body = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","kind":["","v1","Node"],"operation":{"UPDATE":null},"object":{"metadata":{"labels":{"a":"b"}}},"oldObject":{"metadata":{}}}}"#;
    assert!(matches!(
        scan::scan(body),
        Err(scan::ScanError::Unusual { .. })
    ));
    let request = parse_review(body).unwrap_or_else(|(e, _)| panic!("{e}"));
    assert_eq!(
        (request.uid.as_str(), request.kind.kind.as_str()),
        ("u", "Node")
    );
    assert_eq!(request.operation.as_str(), "UPDATE");
}

#[test]
fn a_body_the_scanner_refuses_gets_serde_s_answer() {
    for body in [
        &br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u1","kind":{"version":"v1","kind":"Node"},"operation":"UPDATE","object":{"metadata":{"labels":{"a":7}}}}}"#[..],
        br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u1","#,
        br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":null}"#,
        // An old review version and a label key too long: serde refuses the label while it
        // reads, before it looks at the version (found by the fuzz smoke run).
        br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"u1","kind":{"version":"v1","kind":"Node"},"operation":"UPDATE","object":{"metadata":{"labels":{"kubernetes.io/hostnaxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxme":"n"}}}}}"#,
    ] {
        let (by_webhook, uid) = parse_review(body).map(|_| ()).unwrap_err();
        let (by_serde, serde_uid) = parse_with_serde(body).map(|_| ()).unwrap_err();
        assert_eq!(by_webhook.to_string(), by_serde.to_string());
        assert_eq!(uid, serde_uid);
    }
}

#[test]
fn a_long_wrongly_typed_string_broken_after_the_cut_gets_serde_s_answer() {
    // The string is refused by its type, but serde reads it whole first: a lone surrogate or
    // invalid UTF-8 far into it is what serde says, so cutting it must not hide that.
    let head = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u1","kind":{"group":"","version":"v1","kind":"Node"},"operation":"UPDATE","dryRun":""#;
    for tail in [&b"\\ud800 and more"[..], b"\xff\xfe", b"\\udc00"] {
        let mut body = head.to_vec();
        body.extend(std::iter::repeat_n(b'x', 2_000));
        body.extend_from_slice(tail);
        body.extend_from_slice(br#""}}"#);
        let (by_webhook, uid) = parse_review(&body).map(|_| ()).unwrap_err();
        let (by_serde, serde_uid) = parse_with_serde(&body).map(|_| ()).unwrap_err();
        assert_eq!(
            by_webhook.to_string(),
            by_serde.to_string(),
            "{:?}",
            String::from_utf8_lossy(tail)
        );
        assert_eq!(uid, serde_uid);
    }
}

#[test]
fn a_long_string_of_the_wrong_type_gets_serde_s_answer_from_a_shortened_body() {
    // Raw two-byte characters serde's message escapes (U+0085), JSON escapes, a surrogate pair
    // and four-byte characters: cut anywhere, the shortened string must stay one serde reads
    // the same way, and the answer must be the one serde gives for the whole body.
    let fills = [
        "\u{85}".repeat(5_000),
        "\\u0085\\n".repeat(3_000),
        "\\ud83d\\ude00x".repeat(2_000),
        "😀ab".repeat(3_000),
    ];
    let head = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u1","kind":{"group":"","version":"v1","kind":"Node"},"resource":{"group":"","version":"v1","resource":"nodes"},"name":"n","#;
    for fill in &fills {
        for field in [
            format!(r#""operation":"UPDATE","dryRun":"{fill}""#),
            format!(r#""operation":"UPDATE","userInfo":{{"groups":"{fill}"}}"#),
            format!(r#""operation":"UPDATE","object":{{"metadata":{{"labels":"{fill}"}}}}"#),
            format!(r#""operation":"UPDATE","oldObject":"{fill}""#),
            format!(r#""operation":"{fill}""#),
        ] {
            let body = format!("{head}{field}}}}}");
            let body = body.as_bytes();
            let why = scan::scan(body).map(|_| ()).unwrap_err();
            let (by_webhook, uid) = parse_review(body).map(|_| ()).unwrap_err();
            let (by_serde, serde_uid) = parse_with_serde(body).map(|_| ()).unwrap_err();
            assert_eq!(
                by_webhook.to_string(),
                by_serde.to_string(),
                "{why:?} in {}",
                &field[..60.min(field.len())]
            );
            assert_eq!(uid, serde_uid);
            let short = scan::with_short_string(body, &why, 300);
            assert!(
                short.as_ref().is_some_and(|s| s.len() < body.len()),
                "{why:?}: the string was not cut"
            );
        }
    }
}
