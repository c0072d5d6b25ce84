//! Which labels a node record keeps ([`LabelFilter`]).

use std::collections::BTreeSet;

use crate::core::facts::ClusterFacts;
use crate::core::{advertised, lasting, policy};

/// Which labels a node record keeps: those the decision reads under any facts, the keys of the
/// cluster's custom operand nodeSelectors, and the states the audit times
/// ([`lasting::STATE_KEYS`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelFilter {
    selector_keys: BTreeSet<String>,
}

impl LabelFilter {
    pub fn new(facts: &ClusterFacts) -> LabelFilter {
        LabelFilter {
            selector_keys: policy::selector_keys(facts),
        }
    }

    pub fn keeps(&self, key: &str) -> bool {
        policy::reads_label_whatever_the_facts(key)
            || lasting::STATE_KEYS.contains(&key)
            || key == advertised::GFD_COUNT_KEY
            || self.selector_keys.contains(key)
    }

    /// Whether records kept under `self` hold every label `other` would keep: when they do
    /// not, the nodes must be read again.
    pub fn covers(&self, other: &LabelFilter) -> bool {
        other.selector_keys.is_subset(&self.selector_keys)
    }

    /// The selector keys `other` keeps and `self` does not.
    pub fn missing_from(&self, other: &LabelFilter) -> Vec<String> {
        other
            .selector_keys
            .difference(&self.selector_keys)
            .cloned()
            .collect()
    }

    /// This filter, keeping `keys` too.
    pub fn with_keys<'a>(&self, keys: impl IntoIterator<Item = &'a String>) -> LabelFilter {
        let mut wider = self.clone();
        wider.selector_keys.extend(keys.into_iter().cloned());
        wider
    }

    /// What both keep.
    pub fn union(&self, other: &LabelFilter) -> LabelFilter {
        LabelFilter {
            selector_keys: self
                .selector_keys
                .union(&other.selector_keys)
                .cloned()
                .collect(),
        }
    }
}
