//! The text log format: one event per line, whatever a request put in its fields.
//!
//! A uid, a node name, an apiVersion or a username comes from the request. Written as it
//! came, a `\n` in one forges a log line of its own and an ESC sequence rewrites a terminal;
//! so every field value, and the message, has its control characters (C0, DEL, C1 such as
//! U+0085) and the Unicode line and paragraph separators written as escapes. The JSON format
//! escapes them already.

use std::fmt;

use tracing_subscriber::field::MakeExt;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::Writer;

/// `text` with every character that could end a line or drive a terminal escaped
/// (`\n`, `\u{1b}`), the rest as it is.
pub fn escape_controls(text: &str, out: &mut impl fmt::Write) -> fmt::Result {
    for c in text.chars() {
        match c {
            '\n' => out.write_str("\\n")?,
            '\r' => out.write_str("\\r")?,
            '\t' => out.write_str("\\t")?,
            c if c.is_control() || c == '\u{2028}' || c == '\u{2029}' => {
                write!(out, "\\u{{{:x}}}", c as u32)?
            }
            c => out.write_char(c)?,
        }
    }
    Ok(())
}

/// The fields formatter of the text format: `name=value` pairs after the message, as
/// tracing-subscriber writes them, with [`escape_controls`] applied to every value.
pub fn text_fields() -> impl for<'w> FormatFields<'w> + Send + Sync + 'static {
    tracing_subscriber::fmt::format::debug_fn(
        |w: &mut Writer<'_>, field: &tracing::field::Field, value: &dyn fmt::Debug| {
            let text = format!("{value:?}");
            if field.name() != "message" {
                write!(w, "{field}=")?;
            }
            escape_controls(&text, w)
        },
    )
    .delimited(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn escaped(text: &str) -> String {
        let mut out = String::new();
        escape_controls(text, &mut out).unwrap();
        out
    }

    #[test]
    fn line_breaks_and_escape_sequences_are_written_as_escapes() {
        assert_eq!(escaped("node-1"), "node-1");
        assert_eq!(escaped("a\nb\rc\td"), "a\\nb\\rc\\td");
        assert_eq!(escaped("\u{1b}[31mred"), "\\u{1b}[31mred");
        assert_eq!(
            escaped("x\u{85}y\u{2028}z\u{7f}"),
            "x\\u{85}y\\u{2028}z\\u{7f}"
        );
        assert_eq!(escaped("é ü 名"), "é ü 名");
    }
}
