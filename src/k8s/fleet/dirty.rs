//! Which nodes changed since the auditor last looked ([`Dirty`]).

use std::collections::BTreeSet;

/// Which nodes changed since the last pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dirty {
    /// Every node (a re-list, a new holder, a change too large to track by name).
    All,
    Nodes(BTreeSet<Box<str>>),
}

impl Default for Dirty {
    fn default() -> Self {
        Dirty::Nodes(BTreeSet::new())
    }
}

impl Dirty {
    /// Past this many names a change is tracked as [`Dirty::All`]: re-auditing every node then
    /// costs about what the names would, and memory stays bounded.
    pub const MAX_NAMES: usize = 4096;

    pub fn add(&mut self, name: &str) {
        if let Dirty::Nodes(names) = self {
            if names.len() >= Self::MAX_NAMES {
                *self = Dirty::All;
            } else if !names.contains(name) {
                names.insert(name.into());
            }
        }
    }

    pub fn merge(&mut self, other: Dirty) {
        match other {
            Dirty::All => *self = Dirty::All,
            Dirty::Nodes(names) => {
                for name in &names {
                    self.add(name);
                }
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        matches!(self, Dirty::Nodes(names) if names.is_empty())
    }
}
