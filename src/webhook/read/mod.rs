//! Reading a request body as a Node AdmissionReview: bytes in, the webhook's view of the
//! request ([`RequestView`]) out, or why not ([`BadRequest`]). A GPU-policy AdmissionReview is
//! read by [`policy`], with the same checks of its envelope.
//!
//! Two readers make the same view: the scanner ([`scan`]), fast, which reads what the webhook
//! needs and skips the rest unbuilt, and serde (`reference`), the reference it is held to,
//! which also says where and why a body is refused. Labels outside Kubernetes syntax
//! ([`check_lengths`](crate::core::labels::check_lengths)) are refused by both while reading.

pub mod policy;
pub mod reference;
pub mod scan;
mod scanner;
mod skip;
pub mod view;

pub use view::{GroupVersionKind, NodeLabels, RequestView, ReviewBody, UserInfo};

pub use super::bad_request::MAX_UID_CHARS;
use super::bad_request::{BadRequest, MAX_ERROR_BYTES};
use crate::core::echo::echo;
use crate::core::labels::MAX_NAME_CHARS;
use reference::parse_with_serde;

/// Reads the body as a v1 Node AdmissionReview. On failure, returns the uid when it was readable,
/// so the API server can match even an error answer.
pub fn parse_review(bytes: &[u8]) -> Result<RequestView<'_>, (BadRequest, Option<String>)> {
    match scan_review(bytes) {
        Scanned::Read(request) => Ok(request),
        Scanned::Refused(bad, uid) => Err((bad, uid)),
        Scanned::ToSerde(why) => explain(bytes, why.as_ref()),
    }
}

/// [`parse_with_serde`] of a body the scanner did not read (`why`, when it refused it). A long
/// string it refused by its type is cut first ([`scan::with_short_string`]): the answer is the
/// same, without a message that repeats the string whole.
pub fn explain<'a>(
    bytes: &'a [u8],
    why: Option<&scan::ScanError>,
) -> Result<RequestView<'a>, (BadRequest, Option<String>)> {
    if let Some(short) = why.and_then(|w| scan::with_short_string(bytes, w, MAX_ERROR_BYTES)) {
        // Refused, as the scanner found: that is the answer. Read (never seen), the whole body
        // is read below.
        parse_with_serde(&short)?;
    }
    parse_with_serde(bytes)
}

/// What the scanner makes of a body.
// Made once per request and matched at once: boxing the view would allocate per review.
#[allow(clippy::large_enum_variant)]
pub enum Scanned<'a> {
    Read(RequestView<'a>),
    Refused(BadRequest, Option<String>),
    /// Refused (why, when the scanner said), or in a form the scanner leaves to serde:
    /// [`explain`] says why, or reads it.
    ToSerde(Option<scan::ScanError>),
}

/// [`parse_review`]'s fast part: the scanner reads what the webhook needs and skips the rest
/// unbuilt ([`scan`]). It refuses exactly what serde refuses (tests/scan_differential.rs), so a
/// body it refuses is read again with serde, to say where and why, or to read one of the rare
/// forms it leaves to serde.
pub fn scan_review(bytes: &[u8]) -> Scanned<'_> {
    let review = match scan::scan(bytes) {
        Ok(review) => review,
        Err(why) => return Scanned::ToSerde(Some(why)),
    };
    // A label outside Kubernetes syntax is refused before any work per label. serde's reader
    // refuses it too, and names the field, while it reads, so before it checks the review's
    // kind and version: let it say so, so both paths give the same answer.
    if let Some(request) = &review.request {
        let nodes = [&request.object, &request.old_object];
        if nodes.into_iter().flatten().any(|node| !node.syntax_ok()) {
            return Scanned::ToSerde(None);
        }
    }
    if let Err((bad, uid)) = check_review(review.kind.as_str(), review.api_version.as_str()) {
        return Scanned::Refused(bad, uid);
    }
    let Some(request) = review.request else {
        return Scanned::Refused(BadRequest::NoRequest, None);
    };
    match check_bounds(&request) {
        Ok(()) => Scanned::Read(request),
        Err((bad, uid)) => Scanned::Refused(bad, uid),
    }
}

/// Refuses what no API server sends and the answer or the log would have to repeat: a uid
/// that is not short, a name longer than Kubernetes allows.
fn check_bounds(request: &RequestView<'_>) -> Result<(), (BadRequest, Option<String>)> {
    check_uid(&request.uid)?;
    let names = [
        ("request.name", Some(request.name.as_str())),
        (
            "request.object.metadata.name",
            request.object.as_ref().map(|o| o.name()),
        ),
        (
            "request.oldObject.metadata.name",
            request.old_object.as_ref().map(|o| o.name()),
        ),
    ];
    for (field, name) in names {
        check_name(field, name.unwrap_or_default(), &request.uid)?;
    }
    Ok(())
}

/// Refuses a uid longer than an answer repeats ([`MAX_UID_CHARS`]); the answer then has none.
fn check_uid(uid: &str) -> Result<(), (BadRequest, Option<String>)> {
    let uid_chars = uid.chars().count();
    if uid_chars > MAX_UID_CHARS {
        return Err((BadRequest::UidTooLong(uid_chars), None));
    }
    Ok(())
}

/// Refuses a name (at `field`) longer than Kubernetes allows; the answer repeats `uid`.
fn check_name(
    field: &'static str,
    name: &str,
    uid: &str,
) -> Result<(), (BadRequest, Option<String>)> {
    let chars = name.chars().count();
    if chars > MAX_NAME_CHARS {
        return Err((
            BadRequest::NameTooLong { field, chars },
            Some(uid.to_owned()),
        ));
    }
    Ok(())
}

fn check_review(kind: &str, api_version: &str) -> Result<(), (BadRequest, Option<String>)> {
    check_envelope(kind, api_version, |text| echo(text).into_owned())
}

/// Refuses an envelope that is not a v1 AdmissionReview, repeating what it is as `shown` cuts
/// it.
fn check_envelope(
    kind: &str,
    api_version: &str,
    shown: impl Fn(&str) -> String,
) -> Result<(), (BadRequest, Option<String>)> {
    if kind != "AdmissionReview" {
        return Err((BadRequest::Kind(shown(kind)), None));
    }
    if api_version != "admission.k8s.io/v1" {
        return Err((BadRequest::Version(shown(api_version)), None));
    }
    Ok(())
}
