//! The node records as a policy decision reads them, copied out of the fleet's lock
//! ([`NodeGroups`]), so that the decision runs while the watch goes on writing.

use super::filter::LabelFilter;
use super::nodes::{NodeIndex, NodeRecord};
use crate::core::policy_change::NodeGroup;

/// The nodes grouped by identical records, and which labels the records keep: a copy that
/// holds no lock.
///
/// What is copied, under the lock: one [`NodeRecord`] per group (a reference count taken on
/// each of its interned labels, no text copied), every node name once, back to back in one
/// buffer (about 150 KB for 5,000 nodes), and the label filter (the selector keys, a few dozen
/// at most). The label maps the decision reads are made from the records after the lock is
/// released ([`NodeGroups::groups`]).
#[derive(Debug)]
pub struct NodeGroups {
    /// Every node's name, group after group, each group's sorted.
    names: String,
    /// Each group's record and where its names end in `names`.
    groups: Vec<(NodeRecord, Vec<usize>)>,
    filter: LabelFilter,
}

impl NodeGroups {
    /// Copies what a decision reads of `index` ([`NodeIndex::groups`]).
    pub fn copy(index: &NodeIndex) -> NodeGroups {
        let mut names = String::new();
        let groups = index
            .groups()
            .into_iter()
            .map(|(record, nodes)| {
                let ends = nodes
                    .into_iter()
                    .map(|name| {
                        names.push_str(name);
                        names.len()
                    })
                    .collect();
                (record.clone(), ends)
            })
            .collect();
        NodeGroups {
            names,
            groups,
            filter: index.filter().clone(),
        }
    }

    /// The groups as the decision takes them, in the order of [`NodeIndex::groups`].
    pub fn groups(&self) -> Vec<NodeGroup<'_>> {
        let mut start = 0;
        self.groups
            .iter()
            .map(|(record, ends)| NodeGroup {
                labels: record.labels(),
                placement: record.placement(),
                nodes: ends
                    .iter()
                    .map(|&end| {
                        // Each end was the buffer's length just after a whole name was pushed.
                        let name = self.names.get(start..end).unwrap_or_default();
                        start = end;
                        name
                    })
                    .collect(),
            })
            .collect()
    }

    /// Whether the records keep the label `key` ([`LabelFilter::keeps`]).
    pub fn keeps(&self, key: &str) -> bool {
        self.filter.keeps(key)
    }
}
