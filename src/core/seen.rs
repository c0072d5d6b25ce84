//! What a decision knows of something only a watch (or a file) can show it: not read at all,
//! unknown (and why), or known ([`Seen`]).

use std::sync::Arc;

/// What was read of a kind of object the decision reads beyond the node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Seen<T> {
    /// Nothing was read (`check` without the file): the rules on it are not evaluated.
    #[default]
    NotRead,
    /// It could not be read (not listed yet, RBAC, past the guard's bound): why.
    Unknown(String),
    /// Read.
    Known(Arc<T>),
}

impl<T> Seen<T> {
    pub fn known(&self) -> Option<&T> {
        match self {
            Seen::Known(t) => Some(t),
            Seen::NotRead | Seen::Unknown(_) => None,
        }
    }
}
