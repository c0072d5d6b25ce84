//! What the scanner's view keeps of a Node's labels and a user's groups: not the strings, but
//! where they are in the body and how many there are, enough to read them again, in order, the
//! same way, each time they are walked ([`ScannedLabels`], [`ScannedStrings`]).

use std::fmt;

use super::super::skip::skip_str;
use super::{Result, Scanner, Str};

/// Where a map or an array the scanner has read is in the body, and how many items it has:
/// enough to read them again, the same way, without keeping them.
#[derive(Clone, Copy)]
pub(in crate::webhook::read) struct Reread<'a> {
    b: &'a [u8],
    text: Option<&'a str>,
    compact: bool,
    /// Just after the opening `{` or `[`.
    start: usize,
    len: usize,
}

impl<'a> Reread<'a> {
    /// A scanner at the first item.
    fn scanner(self) -> Scanner<'a> {
        Scanner {
            b: self.b,
            text: self.text,
            compact: self.compact,
            i: self.start,
            error: None,
        }
    }

    /// Each item in turn, as `item` reads it from just before it (its comma, if any).
    #[inline]
    fn items<T: 'a>(
        self,
        mut item: impl FnMut(&mut Scanner<'a>) -> Result<T> + 'a,
    ) -> impl Iterator<Item = T> + 'a {
        let mut s = self.scanner();
        let mut left = self.len;
        std::iter::from_fn(move || {
            // Read once already without error, so it reads the same again.
            left = left.checked_sub(1)?;
            item(&mut s).ok()
        })
    }
}

/// A Node's labels: a map of label keys to strings, read again each time they are walked.
#[derive(Clone, Copy)]
pub struct ScannedLabels<'a> {
    pub(in crate::webhook::read) at: Reread<'a>,
    /// Every pair is within `core::labels::check_lengths`.
    pub(in crate::webhook::read) syntax_ok: bool,
}

impl<'a> ScannedLabels<'a> {
    /// The pairs in the body's order, repeated keys included.
    pub fn iter(&self) -> impl Iterator<Item = (Str<'a>, Str<'a>)> + use<'a> {
        self.at.items(Scanner::next_pair)
    }

    /// The pairs whose key `wanted` accepts, in the body's order: the others' values are
    /// skipped, not read.
    pub fn read<F: FnMut(&str) -> bool>(
        &self,
        mut wanted: F,
    ) -> impl Iterator<Item = (Str<'a>, Str<'a>)> + use<'a, F> {
        let at = self.at;
        let mut s = at.scanner();
        let mut left = at.len;
        std::iter::from_fn(move || {
            loop {
                left = left.checked_sub(1)?;
                let key = s.next_key().ok()?;
                if wanted(&key) {
                    return Some((key, s.string().ok()?));
                }
                s.expect(b'"', "expected a string").ok()?;
                let skipped = skip_str(s.b, s.i, s.compact);
                s.skipped(skipped).ok()?;
            }
        })
    }

    /// Pairs given, repeated keys counted each time.
    pub fn len(&self) -> usize {
        self.at.len
    }

    pub fn is_empty(&self) -> bool {
        self.at.len == 0
    }

    /// Whether every label is within Kubernetes label syntax (`core::labels::check_lengths`).
    pub fn syntax_ok(&self) -> bool {
        self.syntax_ok
    }
}

/// An array of strings (a user's groups), read again each time it is walked.
#[derive(Clone, Copy)]
pub struct ScannedStrings<'a> {
    pub(in crate::webhook::read) at: Reread<'a>,
}

impl<'a> ScannedStrings<'a> {
    pub fn iter(&self) -> impl Iterator<Item = Str<'a>> + use<'a> {
        self.at.items(Scanner::next_string)
    }

    pub fn len(&self) -> usize {
        self.at.len
    }

    pub fn is_empty(&self) -> bool {
        self.at.len == 0
    }
}

impl PartialEq for ScannedLabels<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.syntax_ok == other.syntax_ok && self.iter().eq(other.iter())
    }
}

impl Eq for ScannedLabels<'_> {}

impl PartialEq for ScannedStrings<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for ScannedStrings<'_> {}

impl fmt::Debug for ScannedLabels<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl fmt::Debug for ScannedStrings<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<'a> Scanner<'a> {
    /// Where a map or an array that starts at `start` (just after its bracket) is, once `len`
    /// items of it have been read.
    pub(in crate::webhook::read) fn reread(&self, start: usize, len: usize) -> Reread<'a> {
        Reread {
            b: self.b,
            text: self.text,
            compact: self.compact,
            start,
            len,
        }
    }

    /// The next string of an array read before: its comma, if any, then the string.
    fn next_string(&mut self) -> Result<Str<'a>> {
        if self.peek()? == b',' {
            self.i += 1;
        }
        self.string()
    }

    /// The next pair of a map of labels read before: its comma, if any, key, colon, value.
    fn next_pair(&mut self) -> Result<(Str<'a>, Str<'a>)> {
        let key = self.next_key()?;
        Ok((key, self.string()?))
    }

    /// The next key of a map read before, and its colon: the value is next.
    fn next_key(&mut self) -> Result<Str<'a>> {
        if self.peek()? == b',' {
            self.i += 1;
        }
        let key = self.string()?;
        self.expect(b':', "expected a colon")?;
        Ok(key)
    }
}
