//! A pod template's required node affinity
//! (`affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution`), matched as
//! kubernetes v1.34 does (`k8s.io/component-helpers/scheduling/corev1/nodeaffinity`): the terms
//! are ORed, a term's requirements ANDed, a term with none matches no node.

use serde::Serialize;

use crate::core::operands::Labels;

/// `nodeSelectorTerms[].matchExpressions[].operator`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum SelectorOperator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
    Gt,
    Lt,
}

impl SelectorOperator {
    /// The operator named `text`, as the API spells it; the API server refuses any other.
    pub fn parse(text: &str) -> Result<SelectorOperator, String> {
        Ok(match text {
            "In" => SelectorOperator::In,
            "NotIn" => SelectorOperator::NotIn,
            "Exists" => SelectorOperator::Exists,
            "DoesNotExist" => SelectorOperator::DoesNotExist,
            "Gt" => SelectorOperator::Gt,
            "Lt" => SelectorOperator::Lt,
            other => {
                return Err(format!(
                    "unknown node selector operator {other:?}: the API server accepts In, NotIn, Exists, DoesNotExist, Gt and Lt"
                ));
            }
        })
    }
}

/// One requirement of a term: a label (`matchExpressions`) or a field (`matchFields`, only
/// `metadata.name`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Requirement {
    pub key: String,
    pub operator: SelectorOperator,
    pub values: Vec<String>,
}

impl Requirement {
    /// Whether `value` (the label's, or the field's; `None` when the node has no such label)
    /// meets the requirement. `Gt` and `Lt` compare integers; a value that is not one matches
    /// nothing.
    fn matches(&self, value: Option<&str>) -> bool {
        let number = |s: &str| s.parse::<i64>().ok();
        match self.operator {
            SelectorOperator::In => value.is_some_and(|v| self.values.iter().any(|w| w == v)),
            SelectorOperator::NotIn => value.is_none_or(|v| self.values.iter().all(|w| w != v)),
            SelectorOperator::Exists => value.is_some(),
            SelectorOperator::DoesNotExist => value.is_none(),
            SelectorOperator::Gt | SelectorOperator::Lt => {
                let (Some(have), [bound]) = (value.and_then(number), self.values.as_slice()) else {
                    return false;
                };
                let Some(bound) = number(bound) else {
                    return false;
                };
                if self.operator == SelectorOperator::Gt {
                    have > bound
                } else {
                    have < bound
                }
            }
        }
    }
}

/// One `nodeSelectorTerms[]` entry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct Term {
    pub match_expressions: Vec<Requirement>,
    pub match_fields: Vec<Requirement>,
}

impl Term {
    fn matches(&self, name: &str, labels: &Labels) -> bool {
        if self.match_expressions.is_empty() && self.match_fields.is_empty() {
            return false;
        }
        self.match_expressions
            .iter()
            .all(|r| r.matches(labels.get(&r.key).map(String::as_str)))
            && self
                .match_fields
                .iter()
                .all(|r| r.matches((r.key == "metadata.name").then_some(name)))
    }
}

/// The required node affinity of a pod template.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct NodeAffinity {
    pub terms: Vec<Term>,
}

impl NodeAffinity {
    /// Whether the node named `name` with `labels` meets it: any term does.
    pub fn matches(&self, name: &str, labels: &Labels) -> bool {
        self.terms.iter().any(|t| t.matches(name, labels))
    }

    /// Label keys its requirements read: a keeper of compact node records must keep these.
    pub fn label_keys(&self) -> impl Iterator<Item = &str> {
        self.terms
            .iter()
            .flat_map(|t| t.match_expressions.iter().map(|r| r.key.as_str()))
    }
}
