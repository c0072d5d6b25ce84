//! Bounds on what a reply or a log line repeats from a request.
//!
//! A request is untrusted: a name, key or `kind` may be megabytes long. Whatever the webhook
//! echoes back (in a message, a warning or a log line) is cut to [`ECHO_MAX_CHARS`], and says
//! how long the original was, so one request cannot make a reply or a log line larger than
//! itself.

use std::borrow::Cow;
use std::fmt::{self, Write as _};

/// The most characters of one request string a reply or log line repeats.
pub const ECHO_MAX_CHARS: usize = 100;

/// `text` as a reply may repeat it: whole when short, else its first [`ECHO_MAX_CHARS`]
/// characters and its length.
pub fn echo(text: &str) -> Cow<'_, str> {
    match text.char_indices().nth(ECHO_MAX_CHARS) {
        None => Cow::Borrowed(text),
        Some((end, _)) => Cow::Owned(format!("{}…({} bytes)", &text[..end], text.len())),
    }
}

/// The Display of `value`, cut after `max` bytes (on a character boundary) with a mark.
/// Formats into a bounded buffer: a huge value is never copied whole.
pub fn bounded_display(value: &dyn fmt::Display, max: usize) -> String {
    let mut out = Bounded {
        text: String::new(),
        max,
        cut: false,
    };
    let _ = write!(out, "{value}");
    if out.cut {
        out.text.push('…');
    }
    out.text
}

struct Bounded {
    text: String,
    max: usize,
    cut: bool,
}

impl fmt::Write for Bounded {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if self.cut {
            // Stop the formatting: nothing more is kept.
            return Err(fmt::Error);
        }
        let room = self.max - self.text.len();
        if s.len() <= room {
            self.text.push_str(s);
            return Ok(());
        }
        let mut end = room;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.text.push_str(&s[..end]);
        self.cut = true;
        Err(fmt::Error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_echoed_whole_and_long_text_is_cut_with_its_length() {
        assert_eq!(echo("node-1"), "node-1");
        let long = "é".repeat(300);
        let shown = echo(&long);
        assert!(shown.starts_with(&"é".repeat(100)));
        assert!(shown.ends_with("…(600 bytes)"), "{shown}");
        assert_eq!(shown.chars().count(), 100 + "…(600 bytes)".chars().count());
    }

    #[test]
    fn bounded_display_stops_formatting_at_the_bound() {
        let huge = "x".repeat(1_000_000);
        let shown = bounded_display(&format_args!("bad {huge:?} here"), 50);
        assert_eq!(shown, format!("bad \"{}…", "x".repeat(45)));
        assert_eq!(bounded_display(&"short", 50), "short");
        let shown = bounded_display(&"ééé", 3);
        assert_eq!(shown, "é…");
    }
}
