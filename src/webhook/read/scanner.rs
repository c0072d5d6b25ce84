//! The scanner's reading core: a cursor over a JSON body that reads strings (checked as serde
//! checks them), objects, options and booleans, and skips every other value (`skip`). The
//! review scanner (`scan`) walks an AdmissionReview with it; the views of labels and groups
//! (`reread`) read them again with it.

use std::borrow::Cow;
use std::fmt;

use super::skip::{Skip, find_special, skip_literal, skip_value};

mod reread;
pub use reread::{ScannedLabels, ScannedStrings};

/// A JSON string: borrowed from the body unless it contains escapes.
pub type Str<'a> = Cow<'a, str>;

/// Why the scanner did not read a body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanError {
    /// Not a Node AdmissionReview as serde would read it: `what` went wrong at byte `offset`.
    Invalid { offset: usize, what: &'static str },
    /// A form serde accepts but the scanner does not read (see the module's documentation); the
    /// body must be read with serde instead.
    Unusual { offset: usize },
}

impl fmt::Display for ScanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScanError::Invalid { offset, what } => write!(f, "{what} at byte {offset}"),
            ScanError::Unusual { offset } => {
                write!(f, "a form the scanner does not read at byte {offset}")
            }
        }
    }
}

impl std::error::Error for ScanError {}

/// The scanner stopped; why is in `Scanner::error`. A unit error keeps every `Result` the hot
/// paths return in registers.
pub(super) struct Stop;

pub(super) type Result<T> = std::result::Result<T, Stop>;

pub(super) struct Scanner<'a> {
    pub(super) b: &'a [u8],
    /// The body as text, when all of it is UTF-8.
    pub(super) text: Option<&'a str>,
    /// No byte of the body is below 0x20.
    pub(super) compact: bool,
    pub(super) i: usize,
    pub(super) error: Option<ScanError>,
}

#[inline(always)]
fn hex(c: u8) -> Option<u16> {
    match c {
        b'0'..=b'9' => Some(u16::from(c - b'0')),
        b'a'..=b'f' => Some(u16::from(c - b'a' + 10)),
        b'A'..=b'F' => Some(u16::from(c - b'A' + 10)),
        _ => None,
    }
}

/// The fields of one object, each of which may be given once.
pub(super) struct Seen(pub(super) u16);

impl Seen {
    pub(super) fn first(&mut self, field: u16) -> bool {
        let bit = 1 << field;
        let first = self.0 & bit == 0;
        self.0 |= bit;
        first
    }
}

impl<'a> Scanner<'a> {
    #[cold]
    pub(super) fn fail<T>(&mut self, what: &'static str) -> Result<T> {
        self.error = Some(ScanError::Invalid {
            offset: self.i,
            what,
        });
        Err(Stop)
    }

    #[cold]
    pub(super) fn unusual<T>(&mut self) -> Result<T> {
        self.error = Some(ScanError::Unusual { offset: self.i });
        Err(Stop)
    }

    /// Skips JSON whitespace; the next byte, if any.
    #[inline(always)]
    pub(super) fn ws(&mut self) -> Option<u8> {
        while let Some(&c) = self.b.get(self.i) {
            if c > b' ' || !matches!(c, b' ' | b'\n' | b'\t' | b'\r') {
                return Some(c);
            }
            self.i += 1;
        }
        None
    }

    /// The next non-whitespace byte, which must be there.
    #[inline(always)]
    pub(super) fn peek(&mut self) -> Result<u8> {
        match self.ws() {
            Some(c) => Ok(c),
            None => self.fail("unexpected end of input"),
        }
    }

    #[inline(always)]
    pub(super) fn expect(&mut self, c: u8, what: &'static str) -> Result<()> {
        if self.peek()? == c {
            self.i += 1;
            Ok(())
        } else {
            self.fail(what)
        }
    }

    /// Runs a skipping function from the current index; moves past what it skipped or fails
    /// where it stopped.
    #[inline(always)]
    pub(super) fn skipped(&mut self, r: Skip) -> Result<()> {
        match r {
            Ok(i) => {
                self.i = i;
                Ok(())
            }
            Err((at, what)) => {
                self.i = at;
                self.fail(what)
            }
        }
    }

    pub(super) fn skip_value(&mut self) -> Result<()> {
        let r = skip_value(self.b, self.i, self.compact);
        self.skipped(r)
    }

    pub(super) fn literal(&mut self, word: &'static [u8]) -> Result<()> {
        let r = skip_literal(self.b, self.i, word);
        self.skipped(r)
    }

    pub(super) fn hex4(&mut self) -> Result<u16> {
        match self.b.get(self.i..self.i + 4) {
            Some(&[a, b, c, d]) => {
                self.i += 4;
                match (hex(a), hex(b), hex(c), hex(d)) {
                    (Some(a), Some(b), Some(c), Some(d)) => Ok(a << 12 | b << 8 | c << 4 | d),
                    _ => self.fail("invalid escape"),
                }
            }
            _ => {
                self.i = self.b.len();
                self.fail("unexpected end of input in a string")
            }
        }
    }

    /// Reads a string whose opening quote has been consumed, as serde_json reads a `&str`.
    #[inline]
    pub(super) fn read_str(&mut self) -> Result<Str<'a>> {
        let start = self.i;
        let end = find_special(self.b, start, self.compact);
        if self.b.get(end) == Some(&b'"') {
            self.i = end + 1;
            // Both ends are next to a quote, so they are character boundaries of the text.
            let checked = match self.text {
                Some(text) => text.get(start..end),
                None => std::str::from_utf8(&self.b[start..end]).ok(),
            };
            return match checked {
                Some(s) => Ok(Cow::Borrowed(s)),
                None => self.fail("invalid UTF-8 in a string"),
            };
        }
        self.i = end;
        self.read_escaped(start)
    }

    #[cold]
    pub(super) fn read_escaped(&mut self, start: usize) -> Result<Str<'a>> {
        let mut out = self.b[start..self.i].to_vec();
        loop {
            match self.b.get(self.i) {
                Some(b'"') => {
                    self.i += 1;
                    return match String::from_utf8(out) {
                        Ok(s) => Ok(Cow::Owned(s)),
                        Err(_) => self.fail("invalid UTF-8 in a string"),
                    };
                }
                Some(b'\\') => {
                    self.i += 1;
                    self.unescape(&mut out)?;
                }
                Some(_) => return self.fail("control character in a string"),
                None => return self.fail("unexpected end of input in a string"),
            }
            let from = self.i;
            self.i = find_special(self.b, from, self.compact);
            out.extend_from_slice(&self.b[from..self.i]);
        }
    }

    /// Decodes one escape (after its backslash) as serde_json does for a `&str`: `\u` surrogates
    /// must come in pairs.
    pub(super) fn unescape(&mut self, out: &mut Vec<u8>) -> Result<()> {
        let Some(&c) = self.b.get(self.i) else {
            return self.fail("unexpected end of input in a string");
        };
        self.i += 1;
        let byte = match c {
            b'"' => b'"',
            b'\\' => b'\\',
            b'/' => b'/',
            b'b' => 0x08,
            b'f' => 0x0c,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'u' => {
                let n = self.hex4()?;
                let code = match n {
                    0xDC00..=0xDFFF => return self.fail("lone surrogate in a \\u escape"),
                    0xD800..=0xDBFF => {
                        if self.b.get(self.i..self.i + 2) != Some(b"\\u") {
                            if self.i + 1 >= self.b.len() {
                                return self.fail("unexpected end of input in a string");
                            }
                            return self.fail("lone surrogate in a \\u escape");
                        }
                        self.i += 2;
                        let low = self.hex4()?;
                        if !(0xDC00..=0xDFFF).contains(&low) {
                            return self.fail("lone surrogate in a \\u escape");
                        }
                        0x1_0000 + ((u32::from(n) - 0xD800) << 10 | (u32::from(low) - 0xDC00))
                    }
                    n => u32::from(n),
                };
                // Surrogates were excluded above, so this is a char.
                let ch = char::from_u32(code).unwrap_or(char::REPLACEMENT_CHARACTER);
                out.extend_from_slice(ch.encode_utf8(&mut [0; 4]).as_bytes());
                return Ok(());
            }
            _ => return self.fail("invalid escape"),
        };
        out.push(byte);
        Ok(())
    }

    /// Walks an object serde reads as a struct (or a map): `field` is called with each key, the
    /// value next, and must consume it. An array here is the seq form of a struct: unusual.
    pub(super) fn object(
        &mut self,
        mut field: impl FnMut(&mut Self, Str<'a>) -> Result<()>,
    ) -> Result<()> {
        match self.peek()? {
            b'{' => self.i += 1,
            b'[' => return self.unusual(),
            _ => return self.fail("expected an object"),
        }
        if self.peek()? == b'}' {
            self.i += 1;
            return Ok(());
        }
        loop {
            self.expect(b'"', "expected a string key")?;
            let key = self.read_str()?;
            self.expect(b':', "expected a colon")?;
            field(self, key)?;
            match self.peek()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Ok(());
                }
                _ => return self.fail("expected a comma or the end of an object"),
            }
        }
    }

    /// A string value.
    pub(super) fn string(&mut self) -> Result<Str<'a>> {
        self.expect(b'"', "expected a string")?;
        self.read_str()
    }

    /// `null` or what `some` reads.
    pub(super) fn option<T>(
        &mut self,
        some: impl FnOnce(&mut Self) -> Result<T>,
    ) -> Result<Option<T>> {
        if self.peek()? == b'n' {
            self.literal(b"null")?;
            Ok(None)
        } else {
            some(self).map(Some)
        }
    }

    pub(super) fn boolean(&mut self) -> Result<bool> {
        match self.peek()? {
            b't' => self.literal(b"true").map(|()| true),
            b'f' => self.literal(b"false").map(|()| false),
            _ => self.fail("expected a boolean"),
        }
    }

    pub(super) fn duplicate<T>(&mut self) -> Result<T> {
        self.fail("duplicate field")
    }

    pub(super) fn missing<T>(&mut self) -> Result<T> {
        self.fail("missing field")
    }
}
