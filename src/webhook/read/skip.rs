//! Skipping JSON without building it: the index after a value, checked to be JSON as
//! serde_json's `IgnoredAny` checks it (structure, numbers, literals, string escapes and control
//! characters, with no depth limit), and the search for a string's end the scanner reads strings
//! with. Byte indexes in, byte indexes out: the scanner ([`super::scan`]) keeps the place.

const ONES: u64 = u64::MAX / 255;
const HIGH: u64 = ONES << 7;

/// The high bit of each byte of `w` equal to `c` is set in the result, for the lowest such byte at
/// least (bytes above the first match may show false positives, which do not matter: only the
/// lowest is used).
#[inline(always)]
fn byte_mask(w: u64, c: u8) -> u64 {
    let x = w ^ (ONES * u64::from(c));
    x.wrapping_sub(ONES) & !x & HIGH
}

/// As [`byte_mask`], for the bytes below 0x20.
#[inline(always)]
fn control_mask(w: u64) -> u64 {
    w.wrapping_sub(ONES * 0x20) & !w & HIGH
}

#[inline(always)]
fn word_at(b: &[u8], i: usize) -> Option<u64> {
    let chunk: [u8; 8] = b.get(i..i + 8)?.try_into().ok()?;
    Some(u64::from_le_bytes(chunk))
}

/// The index of the first `"` or `\` at or after `i` (or, unless the body is `compact`, the first
/// byte below 0x20), or the end. Most strings of a Node end within 32 bytes, which four words
/// answer; longer ones (image names, digests) are searched with memchr2, vectorized. When control
/// bytes must be found too, eight bytes at a time.
const WORDS_BEFORE_MEMCHR: usize = 1;

#[inline(always)]
pub(super) fn find_special(b: &[u8], i: usize, compact: bool) -> usize {
    if !compact {
        return find_special_words(b, i);
    }
    let mut at = i;
    for _ in 0..WORDS_BEFORE_MEMCHR {
        let Some(w) = word_at(b, at) else {
            return find_special_words(b, at);
        };
        let m = byte_mask(w, b'"') | byte_mask(w, b'\\');
        if m != 0 {
            return at + (m.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    find_quote_or_backslash(&b[at..]).map_or(b.len(), |found| at + found)
}

/// memchr2 for `"` and `\`. On x86-64, SSE2's searcher (always there) directly: most strings
/// left by then end within its first vector, where the run-time choice of the widest searcher
/// costs more than it saves.
#[inline(always)]
fn find_quote_or_backslash(haystack: &[u8]) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    if let Some(two) = memchr::arch::x86_64::sse2::memchr::Two::new(b'"', b'\\') {
        return two.find(haystack);
    }
    memchr::memchr2(b'"', b'\\', haystack)
}

#[inline(never)]
fn find_special_words(b: &[u8], mut i: usize) -> usize {
    while let Some(w) = word_at(b, i) {
        let m = byte_mask(w, b'"') | byte_mask(w, b'\\') | control_mask(w);
        if m != 0 {
            return i + (m.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while i < b.len() && !matches!(b[i], b'"' | b'\\' | 0..0x20) {
        i += 1;
    }
    i
}

/// Where skipping stopped, and why.
pub(super) type Skip<T = usize> = std::result::Result<T, (usize, &'static str)>;

/// The index after JSON whitespace from `i`.
#[inline(always)]
fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while let Some(&c) = b.get(i) {
        if c > b' ' || !matches!(c, b' ' | b'\n' | b'\t' | b'\r') {
            break;
        }
        i += 1;
    }
    i
}

/// The index after a string whose opening quote is before `i`: escapes and control characters
/// are checked, the bytes are not (serde_json does not check a skipped string's UTF-8 either).
#[inline(always)]
pub(super) fn skip_str(b: &[u8], mut i: usize, compact: bool) -> Skip {
    loop {
        i = find_special(b, i, compact);
        match b.get(i) {
            Some(b'"') => return Ok(i + 1),
            Some(b'\\') => i = skip_escape(b, i + 1)?,
            Some(_) => return Err((i, "control character in a string")),
            None => return Err((i, "unexpected end of input in a string")),
        }
    }
}

/// The index after an escape whose backslash is before `i`; a `\u` takes any four hex digits.
fn skip_escape(b: &[u8], i: usize) -> Skip {
    match b.get(i) {
        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Ok(i + 1),
        Some(b'u') => match b.get(i + 1..i + 5) {
            Some(digits) if digits.iter().all(u8::is_ascii_hexdigit) => Ok(i + 5),
            Some(_) => Err((i + 5, "invalid escape")),
            None => Err((b.len(), "unexpected end of input in a string")),
        },
        Some(_) => Err((i + 1, "invalid escape")),
        None => Err((i, "unexpected end of input in a string")),
    }
}

/// The index after `"key":` in an object being skipped, from `i`.
#[inline(always)]
fn skip_key(b: &[u8], i: usize, compact: bool) -> Skip {
    let i = skip_ws(b, i);
    match b.get(i) {
        Some(b'"') => {}
        Some(_) => return Err((i, "expected a string key")),
        None => return Err((i, "unexpected end of input")),
    }
    let i = skip_ws(b, skip_str(b, i + 1, compact)?);
    match b.get(i) {
        Some(b':') => Ok(i + 1),
        Some(_) => Err((i, "expected a colon")),
        None => Err((i, "unexpected end of input")),
    }
}

/// The index after the number that starts at `i` (with `-` or a digit), in JSON's grammar.
fn skip_number(b: &[u8], mut i: usize) -> Skip {
    let digits = |mut i: usize| {
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        i
    };
    if b[i] == b'-' {
        i += 1;
    }
    match b.get(i) {
        Some(b'0') => {
            i += 1;
            if b.get(i).is_some_and(u8::is_ascii_digit) {
                return Err((i, "invalid number"));
            }
        }
        Some(b'1'..=b'9') => i = digits(i + 1),
        _ => return Err((i, "invalid number")),
    }
    if b.get(i) == Some(&b'.') {
        let end = digits(i + 1);
        if end == i + 1 {
            return Err((end, "invalid number"));
        }
        i = end;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        let end = digits(i);
        if end == i {
            return Err((end, "invalid number"));
        }
        i = end;
    }
    Ok(i)
}

/// The index after `word` at `i`.
#[inline(always)]
pub(super) fn skip_literal(b: &[u8], i: usize, word: &'static [u8]) -> Skip {
    if b[i..].starts_with(word) {
        Ok(i + word.len())
    } else {
        Err((i, "invalid literal"))
    }
}

/// The index after the value at `i`, of any shape and depth, checked to be JSON. Iterative: the
/// nesting is kept as bits (1 for an object, 0 for an array), so depth costs memory, not stack.
pub(super) fn skip_value(b: &[u8], mut i: usize, compact: bool) -> Skip {
    let mut stack = BitStack::default();
    'value: loop {
        i = skip_ws(b, i);
        match b.get(i) {
            Some(b'"') => i = skip_str(b, i + 1, compact)?,
            Some(b'{') => {
                i = skip_ws(b, i + 1);
                if b.get(i) == Some(&b'}') {
                    i += 1;
                } else {
                    stack.push(true);
                    i = skip_key(b, i, compact)?;
                    continue 'value;
                }
            }
            Some(b'[') => {
                i = skip_ws(b, i + 1);
                if b.get(i) == Some(&b']') {
                    i += 1;
                } else {
                    stack.push(false);
                    continue 'value;
                }
            }
            Some(b't') => i = skip_literal(b, i, b"true")?,
            Some(b'f') => i = skip_literal(b, i, b"false")?,
            Some(b'n') => i = skip_literal(b, i, b"null")?,
            Some(b'-' | b'0'..=b'9') => i = skip_number(b, i)?,
            Some(_) => return Err((i, "expected a value")),
            None => return Err((i, "unexpected end of input")),
        }
        // After a value: a comma, or the end of the containers it closes.
        loop {
            let Some(in_object) = stack.top() else {
                return Ok(i);
            };
            i = skip_ws(b, i);
            match b.get(i) {
                Some(b',') if in_object => {
                    i = skip_key(b, i + 1, compact)?;
                    continue 'value;
                }
                Some(b',') => {
                    i += 1;
                    continue 'value;
                }
                Some(b'}') if in_object => {
                    i += 1;
                    stack.pop();
                }
                Some(b']') if !in_object => {
                    i += 1;
                    stack.pop();
                }
                Some(_) => return Err((i, "expected a comma or the end of a container")),
                None => return Err((i, "unexpected end of input")),
            }
        }
    }
}

/// A stack of bits (object or array) of any depth: the top 64 levels in a word, deeper ones on
/// the heap.
#[derive(Default)]
struct BitStack {
    depth: usize,
    bits: u64,
    spilled: Vec<bool>,
}

impl BitStack {
    #[inline(always)]
    fn push(&mut self, object: bool) {
        if self.depth >= 64 {
            self.spilled.push(self.bits >> 63 == 1);
        }
        self.bits = self.bits << 1 | u64::from(object);
        self.depth += 1;
    }

    #[inline(always)]
    fn pop(&mut self) {
        self.depth -= 1;
        self.bits >>= 1;
        if self.depth >= 64 {
            self.bits |= u64::from(self.spilled.pop().unwrap_or(false)) << 63;
        }
    }

    #[inline(always)]
    fn top(&self) -> Option<bool> {
        (self.depth > 0).then_some(self.bits & 1 == 1)
    }
}
