//! The items of a kubectl List, one at a time, from a stream.
//!
//! `kubectl get pods -o json` of a large cluster is hundreds of megabytes.
//! Reading it whole costs its size in memory (and, on a fresh allocation,
//! nearly as much time in page faults as the parse), while serde_json's own
//! reader parses three times slower than its slice parser. So the source is
//! read in chunks into one reused buffer; the top-level object is skimmed
//! byte by byte (it is small), and each element of its `items` array is
//! parsed straight from the buffer with the slice parser, which also finds
//! where the element ends. An element cut by the end of the buffer is parsed
//! again once more bytes are in. Memory stays at one chunk (or the largest
//! item) besides the parsed items.

use std::io::Read;

use serde::de::DeserializeOwned;

/// Bytes read at a time.
const CHUNK: usize = 1 << 20;

/// A place in the source (1-based, like serde_json's).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Position {
    pub line: usize,
    pub column: usize,
}

impl std::fmt::Display for Position {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {} column {}", self.line, self.column)
    }
}

#[derive(Debug)]
pub enum SplitError {
    Io(std::io::Error),
    /// The structure is broken, or an item is not JSON.
    Syntax {
        message: String,
        at: Position,
    },
    /// An item is JSON but not of the expected shape: which item and field.
    Item {
        index: usize,
        field: String,
        message: String,
        at: Position,
    },
}

/// What the top level held besides the items.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Outline {
    /// The top-level `kind`, when it is a plain string.
    pub kind: Option<String>,
    /// An `items` array was found (it may be empty).
    pub has_items: bool,
}

/// Parses every element of the top-level `items` array as a `T` and hands it to `each`
/// with its index; stops at the first error of `each`.
pub fn read_items<T: DeserializeOwned, E>(
    source: impl Read,
    each: impl FnMut(usize, T) -> Result<(), E>,
) -> Result<Result<Outline, SplitError>, E> {
    read_items_with(source, CHUNK, each)
}

fn read_items_with<T: DeserializeOwned, E>(
    source: impl Read,
    capacity: usize,
    mut each: impl FnMut(usize, T) -> Result<(), E>,
) -> Result<Result<Outline, SplitError>, E> {
    let mut r = ListReader::new(source, capacity);
    let mut index = 0;
    loop {
        match r.next_item::<T>(index) {
            Ok(Some(item)) => {
                each(index, item)?;
                index += 1;
            }
            Ok(None) => return Ok(Ok(r.outline)),
            Err(e) => return Ok(Err(e)),
        }
    }
}

struct ListReader<R> {
    source: R,
    buf: Vec<u8>,
    /// Unconsumed bytes are `buf[start..end]`.
    start: usize,
    end: usize,
    /// The source is exhausted.
    done: bool,
    /// Stream offset of `buf[0]`.
    base: usize,
    line: usize,
    /// Stream offset where the current line starts.
    line_start: usize,
    // The skim of the top level.
    started: bool,
    /// Open objects and arrays.
    depth: usize,
    in_string: bool,
    escaped: bool,
    /// At depth 1: the next string is a key.
    expect_key: bool,
    /// Bytes of the top-level string being read (a key, or the value of `kind`).
    text: Option<Vec<u8>>,
    /// The top-level key whose value is being read.
    key: Vec<u8>,
    /// Inside the top-level `items` array.
    in_items: bool,
    outline: Outline,
}

fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

impl<R: Read> ListReader<R> {
    fn new(source: R, capacity: usize) -> Self {
        ListReader {
            source,
            buf: vec![0; capacity.max(1)],
            start: 0,
            end: 0,
            done: false,
            base: 0,
            line: 1,
            line_start: 0,
            started: false,
            depth: 0,
            in_string: false,
            escaped: false,
            expect_key: false,
            text: None,
            key: Vec::new(),
            in_items: false,
            outline: Outline::default(),
        }
    }

    /// Reads more: keeps the unconsumed bytes, grows the buffer when they fill it.
    /// False at the end of the source.
    fn fill(&mut self) -> Result<bool, SplitError> {
        if self.done {
            return Ok(false);
        }
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.base += self.start;
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.buf.len() {
            self.buf.resize(self.buf.len() * 2, 0);
        }
        loop {
            match self.source.read(&mut self.buf[self.end..]) {
                Ok(0) => {
                    self.done = true;
                    return Ok(false);
                }
                Ok(n) => {
                    self.end += n;
                    return Ok(true);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(SplitError::Io(e)),
            }
        }
    }

    fn peek(&mut self) -> Result<Option<u8>, SplitError> {
        while self.start == self.end {
            if !self.fill()? {
                return Ok(None);
            }
        }
        Ok(Some(self.buf[self.start]))
    }

    /// Consumes `n` bytes, counting the lines they end.
    fn advance(&mut self, n: usize) {
        let bytes = &self.buf[self.start..self.start + n];
        let lines = memchr::memchr_iter(b'\n', bytes).count();
        if lines > 0 {
            self.line += lines;
            let last = memchr::memrchr(b'\n', bytes).unwrap_or_default();
            self.line_start = self.base + self.start + last + 1;
        }
        self.start += n;
    }

    fn here(&self) -> Position {
        Position {
            line: self.line,
            column: self.base + self.start - self.line_start + 1,
        }
    }

    fn syntax<T>(&self, message: &str) -> Result<T, SplitError> {
        Err(SplitError::Syntax {
            message: message.to_owned(),
            at: self.here(),
        })
    }

    /// Skims the top level up to the next item and parses it; `None` at the end.
    fn next_item<T: DeserializeOwned>(&mut self, index: usize) -> Result<Option<T>, SplitError> {
        loop {
            let Some(b) = self.peek()? else {
                return self.finish().map(|()| None);
            };
            if self.in_string {
                self.string_part();
                continue;
            }
            if !self.started {
                if b != b'{' && !is_space(b) {
                    return self.syntax("expected a JSON object");
                }
                self.started = b == b'{';
                if self.started {
                    self.depth = 1;
                    self.expect_key = true;
                }
                self.advance(1);
                continue;
            }
            if self.depth == 0 {
                if !is_space(b) {
                    return self.syntax("trailing characters after the JSON object");
                }
                self.advance(1);
                continue;
            }
            if self.in_items && self.depth == 2 {
                match b {
                    b'{' => return self.item(index).map(Some),
                    b']' => {
                        self.in_items = false;
                        self.depth = 1;
                    }
                    b',' => {}
                    _ if is_space(b) => {}
                    _ => return self.syntax("expected an object in `items`"),
                }
                self.advance(1);
                continue;
            }
            self.advance(1);
            match b {
                b'"' => {
                    self.in_string = true;
                    if self.depth == 1 && (self.expect_key || self.key == b"kind") {
                        self.text = Some(Vec::new());
                    }
                }
                b'{' | b'[' => {
                    self.depth += 1;
                    if self.depth == 2 && b == b'[' && self.key == b"items" {
                        self.in_items = true;
                        self.outline.has_items = true;
                    }
                }
                b'}' | b']' => self.depth -= 1,
                b':' if self.depth == 1 => self.expect_key = false,
                b',' if self.depth == 1 => {
                    self.expect_key = true;
                    self.key.clear();
                }
                _ => {}
            }
        }
    }

    /// Consumes string bytes up to and including the closing quote, if buffered.
    fn string_part(&mut self) {
        let avail = &self.buf[self.start..self.end];
        if self.escaped {
            self.escaped = false;
            if let Some(t) = &mut self.text {
                t.push(avail[0]);
            }
            self.start += 1;
            return;
        }
        // Strings are most of the bytes outside items too: jump to a quote or backslash.
        let Some(k) = memchr::memchr2(b'"', b'\\', avail) else {
            if let Some(t) = &mut self.text {
                t.extend_from_slice(avail);
            }
            self.start = self.end;
            return;
        };
        if let Some(t) = &mut self.text {
            t.extend_from_slice(&avail[..k]);
        }
        if avail[k] == b'\\' {
            self.escaped = true;
            if let Some(t) = &mut self.text {
                t.push(b'\\');
            }
        } else {
            self.in_string = false;
            self.string_ended();
        }
        self.start += k + 1;
    }

    fn string_ended(&mut self) {
        let Some(text) = self.text.take() else {
            return;
        };
        if self.expect_key {
            self.key = text;
        } else if self.key == b"kind" {
            self.outline.kind = String::from_utf8(text).ok();
        }
    }

    /// Parses the item that starts here, reading more until it is whole.
    fn item<T: DeserializeOwned>(&mut self, index: usize) -> Result<T, SplitError> {
        let at = self.here();
        loop {
            let parsed = {
                let mut stream =
                    serde_json::Deserializer::from_slice(&self.buf[self.start..self.end])
                        .into_iter::<T>();
                match stream.next() {
                    Some(Ok(item)) => Ok((item, stream.byte_offset())),
                    Some(Err(e)) => Err(e),
                    None => {
                        return Err(SplitError::Syntax {
                            message: "unexpected end of file".to_owned(),
                            at,
                        });
                    }
                }
            };
            match parsed {
                Ok((item, n)) => {
                    self.advance(n);
                    return Ok(item);
                }
                Err(e) if e.is_eof() && !self.done => {
                    self.fill()?;
                }
                Err(e) => return Err(self.item_error::<T>(index, at, &e)),
            }
        }
    }

    fn item_error<T: DeserializeOwned>(
        &self,
        index: usize,
        item_at: Position,
        e: &serde_json::Error,
    ) -> SplitError {
        if e.is_syntax() || e.is_eof() {
            return SplitError::Syntax {
                message: without_position(e),
                at: relocate(e, item_at),
            };
        }
        // A type error: parse the item again, tracking the path, to name the field.
        let mut de = serde_json::Deserializer::from_slice(&self.buf[self.start..self.end]);
        match serde_path_to_error::deserialize::<_, T>(&mut de) {
            Err(tracked) => {
                let field = tracked.path().to_string();
                let inner = tracked.into_inner();
                SplitError::Item {
                    index,
                    field: if field == "." { String::new() } else { field },
                    message: without_position(&inner),
                    at: relocate(&inner, item_at),
                }
            }
            Ok(_) => SplitError::Item {
                index,
                field: String::new(),
                message: without_position(e),
                at: relocate(e, item_at),
            },
        }
    }

    fn finish(&self) -> Result<(), SplitError> {
        if !self.started {
            return self.syntax("expected a JSON object, found nothing");
        }
        if self.depth != 0 || self.in_string {
            return self.syntax("unexpected end of file");
        }
        Ok(())
    }
}

/// serde_json's message without its " at line L column C".
fn without_position(e: &serde_json::Error) -> String {
    let text = e.to_string();
    match text.rfind(" at line ") {
        Some(k) if e.line() > 0 => text[..k].to_owned(),
        _ => text,
    }
}

/// serde_json's position in an item, made a position in the source.
fn relocate(e: &serde_json::Error, item_at: Position) -> Position {
    if e.line() <= 1 {
        Position {
            line: item_at.line,
            column: item_at.column + e.column().saturating_sub(1),
        }
    } else {
        Position {
            line: item_at.line + e.line() - 1,
            column: e.column(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// A source that gives at most `step` bytes per read, like a slow pipe.
    struct Trickle<'a> {
        bytes: &'a [u8],
        step: usize,
    }

    impl Read for Trickle<'_> {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            let n = self.step.min(out.len()).min(self.bytes.len());
            out[..n].copy_from_slice(&self.bytes[..n]);
            self.bytes = &self.bytes[n..];
            Ok(n)
        }
    }

    fn split(
        text: &str,
        step: usize,
        capacity: usize,
    ) -> (Vec<String>, Result<Outline, SplitError>) {
        let mut items = Vec::new();
        let source = Trickle {
            bytes: text.as_bytes(),
            step,
        };
        let outline = read_items_with(source, capacity, |_, v: Value| -> Result<(), ()> {
            items.push(v.to_string());
            Ok(())
        })
        .unwrap();
        (items, outline)
    }

    const LIST: &str = "{\"apiVersion\": \"v1\", \"items\": [\n  {\"metadata\": {\"name\": \"a}\\\"[\"}, \"x\": [1, {\"y\": 2}]},\n  {\"kind\": \"Pod\"}\n], \"kind\": \"List\", \"metadata\": {\"kind\": \"no\"}}\n";

    #[test]
    fn items_come_out_whole_however_the_stream_is_cut() {
        for (step, capacity) in [(1, 1), (2, 3), (3, 7), (7, 16), (64, 64), (4096, 4096)] {
            let (items, outline) = split(LIST, step, capacity);
            assert_eq!(
                items,
                [
                    r#"{"metadata":{"name":"a}\"["},"x":[1,{"y":2}]}"#,
                    r#"{"kind":"Pod"}"#
                ],
                "step {step}, capacity {capacity}"
            );
            assert_eq!(
                outline.unwrap(),
                Outline {
                    kind: Some("List".into()),
                    has_items: true
                }
            );
        }
    }

    #[test]
    fn an_object_without_items_has_an_outline_only() {
        let (items, outline) = split(r#"{"kind":"Pod","spec":{"items":[{"a":1}]}}"#, 5, 8);
        assert!(items.is_empty());
        assert_eq!(
            outline.unwrap(),
            Outline {
                kind: Some("Pod".into()),
                has_items: false
            }
        );
    }

    fn error(text: &str) -> String {
        match split(text, 3, 4).1.unwrap_err() {
            SplitError::Syntax { message, at } => format!("{message} at {at}"),
            SplitError::Item {
                index,
                field,
                message,
                at,
            } => format!("items[{index}] {field}: {message} at {at}"),
            SplitError::Io(e) => e.to_string(),
        }
    }

    #[test]
    fn broken_input_is_an_error_with_the_position_in_the_source() {
        assert_eq!(
            error("items: []"),
            "expected a JSON object at line 1 column 1"
        );
        assert_eq!(
            error(""),
            "expected a JSON object, found nothing at line 1 column 1"
        );
        assert_eq!(
            error(r#"{"items":[1]}"#),
            "expected an object in `items` at line 1 column 11"
        );
        assert_eq!(
            error("{} x"),
            "trailing characters after the JSON object at line 1 column 4"
        );
        assert_eq!(
            error(r#"{"a":{"b":1}"#),
            "unexpected end of file at line 1 column 13"
        );
        assert_eq!(
            error("{\"items\": [\n {\"a\": 1},\n {\"a\": }]}"),
            "expected value at line 3 column 8"
        );
        assert_eq!(
            error(r#"{"items":[{"a":"#),
            "EOF while parsing a value at line 1 column 15"
        );
    }
}
