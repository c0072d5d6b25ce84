//! The part of an AdmissionReview the webhook reads, borrowed from the request body.
//!
//! The API server sends the whole Node twice (object and oldObject): on a real GPU node that is
//! ~100 labels, images and managedFields each, tens of kilobytes. The decision reads a handful
//! of labels (see [`policy::reads_label`]), so this view skips everything else unparsed and keeps
//! the labels as strings borrowed from the body; [`NodeLabels::labels`] then copies only the
//! ones the policy reads. Every label is still checked to be a string, so a malformed object is
//! refused whatever label is wrong.

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{Deserializer, MapAccess, Visitor};

use super::label_syntax;
use crate::core::facts::ClusterFacts;
use crate::core::operands::Labels;
use crate::core::policy::{self, Operation};

/// A JSON string, borrowed from the body unless it contains escapes.
#[derive(Debug)]
pub struct Text<'a>(pub Cow<'a, str>);

impl Text<'_> {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct TextVisitor;
        impl<'de> Visitor<'de> for TextVisitor {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v)))
            }
        }
        d.deserialize_str(TextVisitor)
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
    #[serde(default, borrow)]
    pub request: Option<RequestView<'a>>,
}

/// The fields of `request` the webhook reads; the others (resource, options, ...) are skipped.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestView<'a> {
    pub uid: String,
    pub kind: GroupVersionKind,
    #[serde(default)]
    pub name: String,
    pub operation: Operation,
    #[serde(default)]
    pub user_info: UserInfo,
    #[serde(default, borrow)]
    pub object: Option<NodeLabels<'a>>,
    #[serde(default, borrow)]
    pub old_object: Option<NodeLabels<'a>>,
    #[serde(default)]
    pub dry_run: bool,
}

#[derive(Debug, Deserialize)]
pub struct GroupVersionKind {
    #[serde(default)]
    pub group: String,
    pub version: String,
    pub kind: String,
}

#[derive(Debug, Default, Deserialize)]
pub struct UserInfo {
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub groups: Option<Vec<String>>,
}

/// A Node reduced to its name and its labels, in the body's order.
#[derive(Debug, Default, Deserialize)]
pub struct NodeLabels<'a> {
    #[serde(default, borrow)]
    metadata: Metadata<'a>,
}

#[derive(Debug, Default, Deserialize)]
struct Metadata<'a> {
    #[serde(default, borrow)]
    name: Option<Text<'a>>,
    #[serde(default, borrow)]
    labels: Option<LabelPairs<'a>>,
}

#[derive(Debug, Default)]
struct LabelPairs<'a>(Vec<(Text<'a>, Text<'a>)>);

impl<'de: 'a, 'a> Deserialize<'de> for LabelPairs<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct PairsVisitor;
        impl<'de> Visitor<'de> for PairsVisitor {
            type Value = LabelPairs<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of label keys to string values")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
                // A GPU node has ~100 labels; JSON does not say how many are coming.
                let mut pairs = Vec::with_capacity(map.size_hint().unwrap_or(128));
                while let Some((key, value)) = map.next_entry::<Text<'de>, Text<'de>>()? {
                    // Refused here, before any work per label: see `label_syntax`.
                    label_syntax::check(key.as_str(), value.as_str())
                        .map_err(serde::de::Error::custom)?;
                    pairs.push((key, value));
                }
                Ok(LabelPairs(pairs))
            }
        }
        d.deserialize_map(PairsVisitor)
    }
}

impl<'a> From<super::scan::Request<'a>> for RequestView<'a> {
    fn from(r: super::scan::Request<'a>) -> Self {
        RequestView {
            uid: r.uid.into_owned(),
            kind: GroupVersionKind {
                group: r.kind.group.into_owned(),
                version: r.kind.version.into_owned(),
                kind: r.kind.kind.into_owned(),
            },
            name: r.name.into_owned(),
            operation: r.operation,
            user_info: UserInfo {
                username: r.user_info.username.map(Cow::into_owned),
                groups: r
                    .user_info
                    .groups
                    .map(|g| g.into_iter().map(Cow::into_owned).collect()),
            },
            object: r.object.map(NodeLabels::from),
            old_object: r.old_object.map(NodeLabels::from),
            dry_run: r.dry_run,
        }
    }
}

impl<'a> From<super::scan::Node<'a>> for NodeLabels<'a> {
    fn from(n: super::scan::Node<'a>) -> Self {
        NodeLabels {
            metadata: Metadata {
                name: n.name.map(Text),
                labels: n.labels.map(|pairs| {
                    LabelPairs(pairs.into_iter().map(|(k, v)| (Text(k), Text(v))).collect())
                }),
            },
        }
    }
}

impl RequestView<'_> {
    /// Labels of the object and the old object together, as given.
    pub fn label_count(&self) -> usize {
        [&self.object, &self.old_object]
            .into_iter()
            .flatten()
            .map(|n| n.metadata.labels.as_ref().map_or(0, |l| l.0.len()))
            .sum()
    }
}

impl NodeLabels<'_> {
    pub fn name(&self) -> &str {
        self.metadata.name.as_ref().map_or("", Text::as_str)
    }

    /// The labels the policy reads under `facts`, copied; a key given twice keeps its last value,
    /// as the API server would.
    pub fn labels(&self, facts: &ClusterFacts) -> Labels {
        self.pairs()
            .filter(|(key, _)| policy::reads_label(key, facts))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    pub(super) fn pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.metadata
            .labels
            .iter()
            .flat_map(|l| l.0.iter())
            .map(|(k, v)| (k.as_str(), v.as_str()))
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
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    #[test]
    fn labels_are_borrowed_from_the_body_unless_escaped() {
        let n = node(
            r#"{"metadata":{"name":"n1","labels":{"a":"b","nvidia.com\/gpu.present":"tr\u0075e"}}}"#,
        );
        let pairs = &n.metadata.labels.as_ref().unwrap().0;
        assert!(matches!(pairs[0].0.0, Cow::Borrowed("a")));
        assert!(matches!(pairs[0].1.0, Cow::Borrowed("b")));
        assert!(matches!(&pairs[1].0.0, Cow::Owned(k) if k == "nvidia.com/gpu.present"));
        assert_eq!(pairs[1].1.as_str(), "true");
        assert_eq!(n.name(), "n1");
        assert_eq!(n.pairs().count(), 2);
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
