//! The part of an AdmissionReview the webhook reads, borrowed from the request body: one view,
//! which both readers make (the scanner, [`scan`](super::scan), and serde's reference reading,
//! `reference`).
//!
//! The API server sends the whole Node twice (object and oldObject): on a real GPU node that is
//! ~100 labels, images and managedFields each, tens of kilobytes. The decision reads a handful
//! of labels (see [`policy::reads_label`]), so this view skips everything else unparsed;
//! [`NodeLabels::labels`] then copies only the labels the policy reads. Every label is still
//! checked to be a string, so a malformed object is refused whatever label is wrong.
//!
//! What the view holds of labels and groups is bounded by the body whatever their number: the
//! scanner's view reads them again from the body when they are walked ([`ScannedLabels`]), and
//! serde's keeps their text in one buffer ([`Table`]), a few bytes more per string than the
//! body gave.

use std::borrow::Cow;

use serde::Deserialize;

use super::scanner::{ScannedLabels, ScannedStrings};
use crate::core::facts::ClusterFacts;
use crate::core::operands::Labels;
use crate::core::placement::{NodePlacement, Taint};
use crate::core::policy;
use crate::core::review::Operation;

/// A JSON string, borrowed from the body unless it contains escapes.
#[derive(Debug)]
pub struct Text<'a>(pub Cow<'a, str>);

impl Text<'_> {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// `apiVersion`, `kind` and the request of an AdmissionReview.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReviewBody<'a> {
    #[serde(borrow)]
    pub api_version: Text<'a>,
    #[serde(borrow)]
    pub kind: Text<'a>,
    /// `None` when absent or `null`.
    #[serde(default, borrow)]
    pub request: Option<RequestView<'a>>,
}

/// The fields of `request` the webhook reads; the others (resource, options, ...) are skipped.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestView<'a> {
    pub uid: String,
    pub kind: GroupVersionKind,
    /// Empty when absent.
    #[serde(default)]
    pub name: String,
    pub operation: Operation,
    #[serde(default)]
    pub user_info: UserInfo<'a>,
    #[serde(default, borrow)]
    pub object: Option<NodeLabels<'a>>,
    #[serde(default, borrow)]
    pub old_object: Option<NodeLabels<'a>>,
    #[serde(default)]
    pub dry_run: bool,
}

#[derive(Debug, Deserialize)]
pub struct GroupVersionKind {
    /// Empty when absent (the core group).
    #[serde(default)]
    pub group: String,
    pub version: String,
    pub kind: String,
}

#[derive(Debug, Default, Deserialize)]
pub struct UserInfo<'a> {
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub(super) groups: Option<Groups<'a>>,
}

impl UserInfo<'_> {
    /// The user's groups, in the order given.
    pub fn groups(&self) -> impl Iterator<Item = Cow<'_, str>> {
        let (read, scanned) = match &self.groups {
            Some(Groups::Read(table)) => (Some(table.iter().map(Cow::Borrowed)), None),
            Some(Groups::Scanned(strings)) => (None, Some(strings.iter())),
            None => (None, None),
        };
        read.into_iter()
            .flatten()
            .chain(scanned.into_iter().flatten())
    }
}

/// Strings read by serde, in order, kept in one buffer: each costs its text and four bytes,
/// where a `Vec` of `String`s would cost 24 more (a body of empty groups, three bytes each,
/// was 16 times its size as `Vec<String>`).
#[derive(Debug, Default)]
pub struct Table {
    text: String,
    ends: Vec<u32>,
}

impl Table {
    pub(super) fn push<E: serde::de::Error>(&mut self, s: &str) -> Result<(), E> {
        self.text.push_str(s);
        let end = u32::try_from(self.text.len())
            .map_err(|_| E::custom("more than 4 GiB of strings in one field"))?;
        self.ends.push(end);
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> {
        let mut start = 0;
        self.ends.iter().map(move |&end| {
            let end = end as usize;
            // Each end was the text's length just after a whole string was pushed.
            let s = self.text.get(start..end).unwrap_or_default();
            start = end;
            s
        })
    }
}

/// A user's groups: serde's [`Table`], or the scanner's place in the body.
#[derive(Debug)]
pub(super) enum Groups<'a> {
    Read(Table),
    Scanned(ScannedStrings<'a>),
}

/// A Node reduced to its name, its labels (in the body's order), and its taints and cordon.
#[derive(Debug, Default, Deserialize)]
pub struct NodeLabels<'a> {
    #[serde(default, borrow)]
    pub(super) metadata: Metadata<'a>,
    /// `None` when absent or `null`.
    #[serde(default, borrow)]
    pub(super) spec: Option<NodeSpec<'a>>,
}

/// What placement reads of a Node's `spec`; everything else (podCIDR, providerID, ...) is
/// skipped.
#[derive(Debug, Default, Deserialize)]
pub(super) struct NodeSpec<'a> {
    /// `None` when absent or `null`.
    #[serde(default, borrow)]
    pub(super) taints: Option<Vec<TaintView<'a>>>,
    #[serde(default)]
    pub(super) unschedulable: Option<bool>,
}

/// One `spec.taints[]` entry as given; `timeAdded` is skipped.
#[derive(Debug, Default, Deserialize)]
pub(super) struct TaintView<'a> {
    #[serde(default, borrow)]
    pub(super) key: Option<Text<'a>>,
    #[serde(default, borrow)]
    pub(super) value: Option<Text<'a>>,
    #[serde(default, borrow)]
    pub(super) effect: Option<Text<'a>>,
}

pub use crate::core::placement::MAX_TAINTS;

#[derive(Debug, Default, Deserialize)]
pub(super) struct Metadata<'a> {
    /// `None` when absent or `null`.
    #[serde(default, borrow)]
    pub(super) name: Option<Text<'a>>,
    /// Repeated keys included; `None` when absent or `null`.
    #[serde(default, borrow)]
    pub(super) labels: Option<LabelPairs<'a>>,
}

/// A Node's labels: serde's [`Table`] of keys and values in turn, or the scanner's place in
/// the body.
#[derive(Debug)]
pub(super) enum LabelPairs<'a> {
    Read(Table),
    Scanned(ScannedLabels<'a>),
}

impl LabelPairs<'_> {
    fn len(&self) -> usize {
        match self {
            LabelPairs::Read(table) => table.len() / 2,
            LabelPairs::Scanned(labels) => labels.len(),
        }
    }
}

impl RequestView<'_> {
    /// Labels of the object and the old object together, as given.
    pub fn label_count(&self) -> usize {
        [&self.object, &self.old_object]
            .into_iter()
            .flatten()
            .map(|n| n.metadata.labels.as_ref().map_or(0, LabelPairs::len))
            .sum()
    }
}

impl NodeLabels<'_> {
    /// `metadata.name`, empty when absent.
    pub fn name(&self) -> &str {
        self.metadata.name.as_ref().map_or("", Text::as_str)
    }

    /// Whether every label is within Kubernetes label syntax ([`check_lengths`](crate::core::labels::check_lengths)).
    /// serde's reading refuses a label outside it; the scanner notes it while reading, and the
    /// caller has serde say why.
    pub fn syntax_ok(&self) -> bool {
        match &self.metadata.labels {
            Some(LabelPairs::Scanned(labels)) => labels.syntax_ok(),
            _ => true,
        }
    }

    /// The labels the policy reads under `facts`, copied; a key given twice keeps its last value,
    /// as the API server would.
    pub fn labels(&self, facts: &ClusterFacts) -> Labels {
        let wanted = |key: &str| policy::reads_label(key, facts);
        let owned = |(k, v): (Cow<'_, str>, Cow<'_, str>)| (k.into_owned(), v.into_owned());
        match &self.metadata.labels {
            // The values of the labels it does not read are skipped.
            Some(LabelPairs::Scanned(labels)) => labels.read(wanted).map(owned).collect(),
            _ => self
                .pairs()
                .filter(|(key, _)| wanted(key))
                .map(owned)
                .collect(),
        }
    }

    /// Its taints and cordon, each taint checked as the API server checks one; the error says
    /// which (`spec.taints[i]`) and why.
    pub fn placement(&self) -> Result<NodePlacement, (String, String)> {
        let Some(spec) = &self.spec else {
            return Ok(NodePlacement::default());
        };
        let taints = spec.taints.as_deref().unwrap_or_default();
        if taints.len() > MAX_TAINTS {
            return Err((
                "spec.taints".to_owned(),
                format!(
                    "{} taints, more than the {MAX_TAINTS} this webhook reads",
                    taints.len()
                ),
            ));
        }
        fn text<'t>(t: &'t Option<Text<'_>>) -> &'t str {
            t.as_ref().map_or("", Text::as_str)
        }
        let taints = taints
            .iter()
            .enumerate()
            .map(|(i, t)| {
                Taint::parse(text(&t.key), text(&t.value), text(&t.effect))
                    .map_err(|e| (format!("spec.taints[{i}]"), e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(NodePlacement {
            taints,
            unschedulable: spec.unschedulable.unwrap_or(false),
        })
    }

    /// The labels in the body's order (none when there are none); a key given twice appears
    /// twice, and the later value is the one that counts.
    pub fn pairs(&self) -> impl Iterator<Item = (Cow<'_, str>, Cow<'_, str>)> {
        let (read, scanned) = match &self.metadata.labels {
            Some(LabelPairs::Read(table)) => {
                let mut texts = table.iter();
                let pairs = std::iter::from_fn(move || Some((texts.next()?, texts.next()?)));
                (
                    Some(pairs.map(|(k, v)| (Cow::Borrowed(k), Cow::Borrowed(v)))),
                    None,
                )
            }
            Some(LabelPairs::Scanned(labels)) => (None, Some(labels.iter())),
            None => (None, None),
        };
        read.into_iter()
            .flatten()
            .chain(scanned.into_iter().flatten())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::core::operands::Operand;

    fn node(json: &str) -> NodeLabels<'_> {
        serde_json::from_str(json).unwrap()
    }

    /// Every label, copied: what `labels` would give if the policy read them all.
    fn all_labels(n: &NodeLabels<'_>) -> Labels {
        n.pairs()
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect()
    }

    #[test]
    fn labels_are_read_in_order_with_escapes_decoded() {
        let n = node(
            r#"{"metadata":{"name":"n1","labels":{"a":"b","nvidia.com\/gpu.present":"tr\u0075e","e":""}}}"#,
        );
        let pairs: Vec<(Cow<'_, str>, Cow<'_, str>)> = n.pairs().collect();
        assert_eq!(pairs[0], ("a".into(), "b".into()));
        assert_eq!(pairs[1], ("nvidia.com/gpu.present".into(), "true".into()));
        assert_eq!(pairs[2], ("e".into(), "".into()));
        assert_eq!(n.name(), "n1");
        assert_eq!(n.pairs().count(), 3);
    }

    #[test]
    fn groups_are_read_in_order_and_empty_ones_kept() {
        let user: UserInfo<'_> =
            serde_json::from_str(r#"{"username":"u","groups":["b","","a\u00e9"]}"#).unwrap();
        assert_eq!(user.groups().collect::<Vec<_>>(), ["b", "", "aé"]);
        let none: UserInfo<'_> = serde_json::from_str(r#"{"groups":null}"#).unwrap();
        assert_eq!(none.groups().count(), 0);
        let err = serde_json::from_str::<UserInfo<'_>>(r#"{"groups":"admins"}"#).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("invalid type: string \"admins\", expected a sequence"),
            "{err}"
        );
    }

    #[test]
    fn only_the_labels_the_policy_reads_are_copied() {
        let n = node(
            r#"{"metadata":{"labels":{
                "kubernetes.io/hostname":"n","nvidia.com/gpu.product":"A100",
                "nvidia.com/gpu.present":"true","nvidia.com/gpu.deploy.driver":"false",
                "feature.node.kubernetes.io/pci-10de.present":"true",
                "example.com/pool":"gpu"}},"status":{"images":[{"names":["x"]}]}}"#,
        );
        let kept: Vec<String> = n.labels(&ClusterFacts::default()).into_keys().collect();
        assert_eq!(
            kept,
            [
                "feature.node.kubernetes.io/pci-10de.present",
                "nvidia.com/gpu.deploy.driver",
                "nvidia.com/gpu.present",
                // The operator's pass reads the product name for MIG capability.
                "nvidia.com/gpu.product"
            ]
        );
        // A DaemonSet selecting on another label makes that label matter too.
        let facts = ClusterFacts {
            selectors: BTreeMap::from([(
                Operand::DevicePlugin,
                Labels::from([("example.com/pool".to_owned(), "gpu".to_owned())]),
            )]),
            ..ClusterFacts::default()
        };
        assert_eq!(n.labels(&facts).get("example.com/pool").unwrap(), "gpu");
        assert_eq!(all_labels(&n).len(), 6);
    }

    #[test]
    fn a_repeated_label_keeps_its_last_value() {
        let n = node(
            r#"{"metadata":{"labels":{"nvidia.com/gpu.deploy.driver":"true","nvidia.com/gpu.deploy.driver":"false"}}}"#,
        );
        let labels = n.labels(&ClusterFacts::default());
        assert_eq!(labels["nvidia.com/gpu.deploy.driver"], "false");
        assert_eq!(all_labels(&n), labels);
    }

    #[test]
    fn a_label_that_is_not_a_string_is_an_error_even_when_unread() {
        let err = serde_json::from_str::<NodeLabels<'_>>(
            r#"{"metadata":{"labels":{"kubernetes.io/hostname":7}}}"#,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid type: integer `7`, expected a string at line 1 column 49"
        );
        let err =
            serde_json::from_str::<NodeLabels<'_>>(r#"{"metadata":{"labels":["a"]}}"#).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("invalid type: sequence, expected a map of label keys"),
            "{err}"
        );
    }

    #[test]
    fn null_and_missing_parts_are_empty() {
        for json in [
            r#"{}"#,
            r#"{"metadata":{}}"#,
            r#"{"metadata":{"labels":null}}"#,
        ] {
            let n = node(json);
            assert_eq!(n.pairs().count(), 0, "{json}");
            assert_eq!(n.name(), "");
        }
    }
}
