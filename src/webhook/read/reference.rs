//! serde's reading of a review into the view ([`ReviewBody`]): the reference the scanner is
//! held to (tests/scan_differential.rs), and the reading that says where and why a body the
//! scanner refused is refused.

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};

use super::view::{Groups, LabelPairs, RequestView, ReviewBody, Table, Text};
use super::{MAX_ERROR_BYTES, MAX_UID_CHARS, check_bounds, check_review};
use crate::core::echo::bounded_display;
use crate::core::labels;
use crate::webhook::bad_request::BadRequest;

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct TextVisitor;
        impl<'de> Visitor<'de> for TextVisitor {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v)))
            }
        }
        d.deserialize_str(TextVisitor)
    }
}

impl<'de> Deserialize<'de> for Groups<'_> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct GroupsVisitor;
        impl<'de> Visitor<'de> for GroupsVisitor {
            type Value = Table;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a sequence of strings")
            }
            fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<Table, S::Error> {
                let mut table = Table::default();
                while let Some(group) = seq.next_element::<Text<'de>>()? {
                    table.push(group.as_str())?;
                }
                Ok(table)
            }
        }
        d.deserialize_seq(GroupsVisitor).map(Groups::Read)
    }
}

impl<'de> Deserialize<'de> for LabelPairs<'_> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct PairsVisitor;
        impl<'de> Visitor<'de> for PairsVisitor {
            type Value = Table;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of label keys to string values")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Table, M::Error> {
                let mut table = Table::default();
                while let Some((key, value)) = map.next_entry::<Text<'de>, Text<'de>>()? {
                    // Refused here, before any work per label: see `labels::check_lengths`.
                    labels::check_lengths(key.as_str(), value.as_str())
                        .map_err(serde::de::Error::custom)?;
                    table.push(key.as_str())?;
                    table.push(value.as_str())?;
                }
                Ok(table)
            }
        }
        d.deserialize_map(PairsVisitor).map(LabelPairs::Read)
    }
}

/// [`parse_review`](super::parse_review) with serde alone: the reference reading of a review.
pub fn parse_with_serde(bytes: &[u8]) -> Result<RequestView<'_>, (BadRequest, Option<String>)> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err((BadRequest::Empty, None));
    }
    // Read without tracking the path: serde_path_to_error copies every map key it passes, a
    // large Node's ~200 labels included. Only a body that fails is read again, to say where.
    let review: ReviewBody<'_> = match serde_json::from_slice(bytes) {
        Ok(review) => review,
        // Its message, cut short, before the next reading builds another: one at a time.
        Err(error) => return Err(unreadable(bytes, bounded_display(&error, MAX_ERROR_BYTES))),
    };
    check_review(review.kind.as_str(), review.api_version.as_str())?;
    let request = review.request.ok_or((BadRequest::NoRequest, None))?;
    check_bounds(&request)?;
    Ok(request)
}

/// Why serde_json refused a body (`first`: its message), with the path to the field at fault
/// and the uid when it can still be found.
fn unreadable(bytes: &[u8], first: String) -> (BadRequest, Option<String>) {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let e = match serde_path_to_error::deserialize::<_, ReviewBody<'_>>(&mut de) {
        Err(e) => e,
        // The document itself was fine; what follows it is not.
        Ok(_) => return (BadRequest::NotJson(first), None),
    };
    // Messages repeat what they refuse (an unknown variant, a string of the wrong type): bounded.
    let path = bounded_display(e.path(), MAX_ERROR_BYTES);
    let inner = e.into_inner();
    let message = bounded_display(&inner, MAX_ERROR_BYTES);
    let bad = match inner.classify() {
        serde_json::error::Category::Eof => BadRequest::Truncated(message),
        serde_json::error::Category::Syntax => BadRequest::NotJson(message),
        _ => BadRequest::Invalid {
            path: if path == "." {
                "(top level)".to_owned()
            } else {
                path
            },
            message,
        },
    };
    (bad, uid_of(bytes))
}

/// The uid of a review whose body failed to parse as a whole, when it can still be found.
fn uid_of(bytes: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Outer {
        request: Option<Inner>,
    }
    #[derive(serde::Deserialize)]
    struct Inner {
        uid: Option<String>,
    }
    let uid = serde_json::from_slice::<Outer>(bytes).ok()?.request?.uid?;
    (uid.chars().count() <= MAX_UID_CHARS).then_some(uid)
}
