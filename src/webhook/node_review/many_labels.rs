//! The labels of a review of thousands of labels, copied at the cost of the ones that matter.
//!
//! A real GPU node has 100 to 300 labels. A review of tens of thousands is almost all unknown
//! deploy keys (`nvidia.com/gpu.deploy.<anything>`): no DaemonSet selects them and the
//! operator's pass leaves them alone, so the decision reads them only to name the ones the
//! request writes (the first few, in key order) and count the rest. Copying every one of them
//! into the decision's maps cost about 80 bytes a label, 12.5 MiB for 80,000 in each object.
//! Here the unknown keys are compared in place (borrowed from the body), and only those the
//! decision can tell apart are copied:
//!
//! - the first [`KEPT`] the request writes (adds or gives a new value), in key order, with the
//!   old value when there is one; the others written are counted
//!   ([`crate::core::review::Review::unknown_not_copied`]) and named by that count;
//! - the first [`KEPT`] the request removes, so that the request still changes a deploy
//!   label;
//! - every one whose value is paused (`…paused-for-…`): the operator model resumes it.
//!
//! Everything else the decision reads is copied as for any review, so the verdict is the same
//! as with every label copied (`tests::the_verdict_is_the_one_of_every_label_copied`).

use std::borrow::Cow;
use std::cmp::Ordering;

use crate::core::facts::ClusterFacts;
use crate::core::operands::{Labels, is_unknown_deploy_key};
use crate::core::operator::restored_value;
use crate::core::policy;
use crate::webhook::read::NodeLabels;

/// How many written (and how many removed) unknown deploy keys are copied: as many as the
/// unknown-deploy-label finding names.
const KEPT: usize = crate::core::rules::UNKNOWN_KEYS_SHOWN;

/// A label as the view gives it.
type Pair<'n> = (Cow<'n, str>, Cow<'n, str>);

/// A key of the deploy prefix that no operand, the operands switch or a custom selector reads.
fn unknown_deploy_key(key: &str, facts: &ClusterFacts) -> bool {
    is_unknown_deploy_key(key) && !facts.selectors.values().any(|sel| sel.contains_key(key))
}

/// `node`'s unknown deploy keys, sorted, each with its last value (a key given twice keeps
/// its last value, as the API server would).
fn unknown_pairs<'n>(node: Option<&'n NodeLabels<'_>>, facts: &ClusterFacts) -> Vec<Pair<'n>> {
    let Some(node) = node else {
        return Vec::new();
    };
    let mut pairs: Vec<Pair<'n>> = node
        .pairs()
        .filter(|(k, _)| unknown_deploy_key(k, facts))
        .collect();
    // Stable: a key's values stay in the order given, and the last one wins below.
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    let mut last: Vec<Pair<'n>> = Vec::with_capacity(pairs.len());
    for pair in pairs {
        match last.last_mut() {
            Some(prev) if prev.0 == pair.0 => *prev = pair,
            _ => last.push(pair),
        }
    }
    last
}

/// The labels of the old object (`None` for CREATE) and of the object as the decision reads
/// them, and how many written unknown deploy keys were left out.
pub fn copy(
    old: Option<&NodeLabels<'_>>,
    new: Option<&NodeLabels<'_>>,
    facts: &ClusterFacts,
) -> (Option<Labels>, Labels, usize) {
    let known = |node: &NodeLabels<'_>| -> Labels {
        node.pairs()
            .filter(|(k, _)| policy::reads_label(k, facts) && !unknown_deploy_key(k, facts))
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect()
    };
    let mut old_labels = old.map(known);
    let mut new_labels = new.map(known).unwrap_or_default();
    let (olds, news) = (unknown_pairs(old, facts), unknown_pairs(new, facts));
    let (mut written, mut removed, mut not_copied) = (0, 0, 0);
    let (mut o, mut n) = (olds.into_iter().peekable(), news.into_iter().peekable());
    loop {
        // A merge of the two sorted lists: each key once, with its value before and after.
        let step = match (o.peek(), n.peek()) {
            (None, None) => break,
            (Some(b), Some(a)) => b.0.cmp(&a.0),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
        };
        let (before, after) = match step {
            Ordering::Equal => (o.next(), n.next()),
            Ordering::Less => (o.next(), None),
            Ordering::Greater => (None, n.next()),
        };
        let paused = |pair: &Option<Pair<'_>>| {
            pair.as_ref()
                .is_some_and(|(_, v)| restored_value(v).is_some())
        };
        let keep = match (&before, &after) {
            (Some(b), Some(a)) if b.1 == a.1 => paused(&before),
            (_, Some(_)) => {
                written += 1;
                let keep = written <= KEPT || paused(&before) || paused(&after);
                if !keep {
                    not_copied += 1;
                }
                keep
            }
            _ => {
                removed += 1;
                removed <= KEPT || paused(&before)
            }
        };
        if keep {
            if let (Some(labels), Some((k, v))) = (old_labels.as_mut(), before) {
                labels.insert(k.into_owned(), v.into_owned());
            }
            if let Some((k, v)) = after {
                new_labels.insert(k.into_owned(), v.into_owned());
            }
        }
    }
    if new.is_none() {
        // DELETE and CONNECT carry only the old object, which the decision reads as both.
        new_labels = old_labels.clone().unwrap_or_default();
    }
    (old_labels, new_labels, not_copied)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::operands::{DEPLOY_PREFIX, Operand};
    use crate::core::policy::{Policy, Verdict, decide};
    use crate::webhook::node_review::RequestLabels;
    use crate::webhook::read::parse_review;

    /// A Node review whose objects carry these labels, as JSON text (so that a key may be given
    /// twice).
    fn review(
        operation: &str,
        old: Option<&[(String, String)]>,
        new: Option<&[(String, String)]>,
    ) -> String {
        let object = |labels: &[(String, String)]| {
            let pairs: Vec<String> = labels
                .iter()
                .map(|(k, v)| format!("{}:{}", serde_json::json!(k), serde_json::json!(v)))
                .collect();
            format!(
                r#"{{"metadata":{{"name":"n1","labels":{{{}}}}}}}"#,
                pairs.join(",")
            )
        };
        let mut request = format!(
            r#""uid":"u1","kind":{{"group":"","version":"v1","kind":"Node"}},"operation":"{operation}","name":"n1","userInfo":{{"username":"alice"}}"#
        );
        if let Some(new) = new {
            request.push_str(&format!(r#","object":{}"#, object(new)));
        }
        if let Some(old) = old {
            request.push_str(&format!(r#","oldObject":{}"#, object(old)));
        }
        format!(
            r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{{request}}}}}"#
        )
    }

    fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// `n` unknown deploy keys from `from`, each `value`.
    fn unknown(from: usize, n: usize, value: &str) -> Vec<(String, String)> {
        (from..from + n)
            .map(|i| (format!("{DEPLOY_PREFIX}extra-{i:05}"), value.to_owned()))
            .collect()
    }

    const GPU: &[(&str, &str)] = &[
        ("nvidia.com/gpu.present", "true"),
        ("feature.node.kubernetes.io/pci-10de.present", "true"),
        ("nvidia.com/gpu.deploy.driver", "true"),
        ("nvidia.com/gpu.deploy.container-toolkit", "true"),
        ("nvidia.com/gpu.deploy.device-plugin", "true"),
        ("kubernetes.io/hostname", "n1"),
    ];

    fn with(base: &[(&str, &str)], changes: &[(&str, Option<&str>)]) -> Vec<(String, String)> {
        let mut out = labels(base);
        for (k, v) in changes {
            out.retain(|(key, _)| key != k);
            if let Some(v) = v {
                out.push((k.to_string(), v.to_string()));
            }
        }
        out
    }

    fn compare(body: &str, facts: &ClusterFacts) -> (Verdict, usize) {
        let req = parse_review(body.as_bytes())
            .map_err(|e| e.0.to_string())
            .unwrap();
        assert!(
            req.label_count() > super::super::MANY_LABELS,
            "the case must take the path"
        );
        let policy = Policy::default();
        let cheap = RequestLabels::of(&req, facts, &policy.exemptions).unwrap();
        let full = RequestLabels {
            old: req.old_object.as_ref().map(|o| o.labels(facts)),
            new: match &req.object {
                Some(o) => o.labels(facts),
                None => req
                    .old_object
                    .as_ref()
                    .map(|o| o.labels(facts))
                    .unwrap_or_default(),
            },
            old_placement: cheap.old_placement.clone(),
            placement: cheap.placement.clone(),
            not_copied: 0,
            groups: Vec::new(),
        };
        let a = decide(&cheap.review(&req), facts, &policy);
        let b = decide(&full.review(&req), facts, &policy);
        assert_eq!(a.decision, b.decision, "{body:.300}");
        assert_eq!(a.message, b.message);
        assert_eq!(a.warnings, b.warnings);
        let findings = |v: &Verdict| -> Vec<(String, String)> {
            v.findings
                .iter()
                .map(|f| (f.rule.id().to_owned(), f.message.clone()))
                .collect()
        };
        assert_eq!(findings(&a), findings(&b));
        assert_eq!((a.before, a.after), (b.before, b.after));
        let copied = cheap.new.len() + cheap.old.as_ref().map_or(0, Labels::len);
        (a, copied)
    }

    #[test]
    fn the_verdict_is_the_one_of_every_label_copied() {
        let facts = ClusterFacts::default();
        let base = labels(GPU);
        let cat = |a: &[(String, String)], b: &[(String, String)]| [a, b].concat();
        let filler = unknown(0, 2_500, "true");
        // Unknown keys unchanged; the request turns the toolkit off under the device plugin.
        let old = cat(&base, &filler);
        let new = cat(
            &with(
                GPU,
                &[("nvidia.com/gpu.deploy.container-toolkit", Some("false"))],
            ),
            &filler,
        );
        let (v, copied) = compare(&review("UPDATE", Some(&old), Some(&new)), &facts);
        assert!(
            v.findings
                .iter()
                .any(|f| f.rule.id() == "device-plugin-without-toolkit")
        );
        assert!(copied < 20, "{copied} labels copied");
        // 3,000 unknown keys added, some with other values, one given twice.
        let mut new = cat(&new, &unknown(2_500, 3_000, "true"));
        new.push((format!("{DEPLOY_PREFIX}extra-00007"), "false".into()));
        new.push((format!("{DEPLOY_PREFIX}extra-00007"), "maybe".into()));
        let (v, copied) = compare(&review("UPDATE", Some(&old), Some(&new)), &facts);
        let unknown_finding = v
            .findings
            .iter()
            .find(|f| f.rule.id() == "unknown-deploy-label")
            .expect("the written keys are named");
        assert!(
            unknown_finding.message.contains("(and 2996 more)"),
            "{}",
            unknown_finding.message
        );
        assert!(copied < 30, "{copied} labels copied");
        // Removed: 2,100 unknown keys go and nothing else changes.
        let (_, copied) = compare(
            &review(
                "UPDATE",
                Some(&old),
                Some(&cat(&base, &unknown(0, 400, "true"))),
            ),
            &facts,
        );
        assert!(copied < 30, "{copied} labels copied");
        // Paused unknown keys, unchanged, and the operands switch turned on.
        let paused = unknown(9_000, 2_100, "paused-for-driver-upgrade");
        let old = cat(
            &with(GPU, &[("nvidia.com/gpu.deploy.operands", Some("false"))]),
            &paused,
        );
        let new = cat(&base, &paused);
        compare(&review("UPDATE", Some(&old), Some(&new)), &facts);
        // CREATE, and DELETE.
        let created = cat(
            &with(GPU, &[("nvidia.com/gpu.deploy.container-toolkit", None)]),
            &unknown(0, 2_100, "x"),
        );
        compare(&review("CREATE", None, Some(&created)), &facts);
        compare(&review("DELETE", Some(&created), None), &facts);
    }

    #[test]
    fn a_custom_selector_key_of_the_deploy_prefix_is_always_copied() {
        let mut facts = ClusterFacts::default();
        let key = format!("{DEPLOY_PREFIX}extra-00003");
        facts.selectors.insert(
            Operand::DevicePlugin,
            [(key.clone(), "true".to_owned())].into(),
        );
        let old = [labels(GPU), unknown(0, 2_100, "true")].concat();
        let new = [labels(GPU), unknown(0, 2_100, "true")]
            .concat()
            .into_iter()
            .map(|(k, v)| {
                if k == key {
                    (k, "false".to_owned())
                } else {
                    (k, v)
                }
            })
            .collect::<Vec<_>>();
        let (v, _) = compare(&review("UPDATE", Some(&old), Some(&new)), &facts);
        assert!(!v.after.contains(Operand::DevicePlugin), "{:?}", v.after);
    }
}
