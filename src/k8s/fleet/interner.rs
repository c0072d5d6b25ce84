//! Interned strings: the keys and values of the node records and the pod names' prefixes, one
//! copy per distinct text however many records share it.

use std::collections::HashSet;
use std::sync::Arc;

/// An interned string.
pub type Sym = Arc<str>;

/// Interned strings, shared by the records. Strings no record uses any more are dropped when
/// the table has doubled since the last sweep, so it stays in proportion to what is in use.
#[derive(Debug, Default)]
pub(super) struct Interner {
    set: HashSet<Sym>,
    swept_at: usize,
}

impl Interner {
    /// Below this many strings the table is never swept.
    pub(super) const FLOOR: usize = 1024;

    pub(super) fn get(&mut self, s: &str) -> Sym {
        if let Some(sym) = self.set.get(s) {
            return sym.clone();
        }
        let sym: Sym = Arc::from(s);
        self.set.insert(sym.clone());
        sym
    }

    pub(super) fn sweep_if_grown(&mut self) {
        if self.set.len() > 2 * self.swept_at.max(Self::FLOOR) {
            self.set.retain(|s| Arc::strong_count(s) > 1);
            self.swept_at = self.set.len();
        }
    }

    pub(super) fn len(&self) -> usize {
        self.set.len()
    }
}
