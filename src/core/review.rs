//! One request to judge: a Node's labels before and after, and who asks.

use serde::{Deserialize, Serialize};

use crate::core::operands::Labels;
use crate::core::placement::NodePlacement;

/// A node with no taint and no cordon.
pub static UNTAINTED: NodePlacement = NodePlacement {
    taints: Vec::new(),
    unschedulable: false,
};

#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Operation {
    Create,
    Update,
    Delete,
    Connect,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
        }
    }
}

/// One request to judge.
#[derive(Clone, Copy, Debug)]
pub struct Review<'a> {
    pub node: &'a str,
    pub operation: Operation,
    /// The labels before the request; `None` for CREATE.
    pub old_labels: Option<&'a Labels>,
    pub labels: &'a Labels,
    /// The node's taints and cordon before the request; `None` when the request does not
    /// change them (or for CREATE).
    pub old_placement: Option<&'a NodePlacement>,
    /// The node's taints and cordon after the request.
    pub placement: &'a NodePlacement,
    pub username: &'a str,
    pub groups: &'a [String],
    /// Decided exactly like a real request; carried for the record only.
    pub dry_run: bool,
    /// Unknown deploy keys the request writes that the caller left out of `labels` (beyond
    /// the first ones in key order, which it kept): counted in the unknown-deploy-label
    /// finding. 0 when every label the policy reads was given.
    pub unknown_not_copied: usize,
}

impl Review<'_> {
    /// The taints and cordon before the request.
    pub fn before_placement(&self) -> &NodePlacement {
        self.old_placement.unwrap_or(self.placement)
    }
}
