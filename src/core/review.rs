//! One request to judge: a Node's labels before and after, and who asks.

use serde::{Deserialize, Serialize};

use crate::core::operands::Labels;

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
    pub username: &'a str,
    pub groups: &'a [String],
    /// Decided exactly like a real request; carried for the record only.
    pub dry_run: bool,
    /// Unknown deploy keys the request writes that the caller left out of `labels` (beyond
    /// the first ones in key order, which it kept): counted in the unknown-deploy-label
    /// finding. 0 when every label the policy reads was given.
    pub unknown_not_copied: usize,
}
