//! The AdmissionReview the webhook answers with: a small type of its own, holding exactly the
//! fields a validating webhook sends (`admission.k8s.io/v1`).

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};

use super::bad_request::BadRequest;
use super::read::RequestView;
use crate::core::policy::Verdict;

pub const API_VERSION: &str = "admission.k8s.io/v1";
pub const KIND: &str = "AdmissionReview";

/// `{"apiVersion", "kind", "response"}`: the whole body of an answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReviewResponse {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub response: AdmissionResponse,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionResponse {
    /// The request's uid, copied.
    pub uid: String,
    pub allowed: bool,
    /// Empty (`{}`) when allowed.
    pub status: Status,
    /// In the verdict's order; the API server prefixes each key with the webhook's name.
    #[serde(skip_serializing_if = "Vec::is_empty", serialize_with = "as_map")]
    pub audit_annotations: Vec<(&'static str, String)>,
    /// What kubectl prints as `Warning:` lines.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warnings: Option<Vec<String>>,
}

/// The part of a `meta/v1` Status a denial or a refused request carries.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Status {
    /// `Failure` for a request that could not be read; absent on a decision.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<&'static str>,
    #[serde(skip_serializing_if = "is_zero")]
    pub code: u16,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

fn is_zero(code: &u16) -> bool {
    *code == 0
}

fn as_map<S: Serializer>(pairs: &[(&'static str, String)], s: S) -> Result<S::Ok, S::Error> {
    let mut map = s.serialize_map(Some(pairs.len()))?;
    for (k, v) in pairs {
        map.serialize_entry(k, v)?;
    }
    map.end()
}

/// The AdmissionReview answering `req` with `verdict`.
pub fn respond(req: &RequestView<'_>, verdict: &Verdict) -> ReviewResponse {
    respond_to(req.uid.clone(), verdict)
}

/// The AdmissionReview answering the request `uid` with `verdict`.
pub fn respond_to(uid: String, verdict: &Verdict) -> ReviewResponse {
    let status = match &verdict.message {
        Some(message) => Status {
            status: None,
            code: 403,
            message: cut(message, MAX_MESSAGE_BYTES),
            reason: "Forbidden".to_owned(),
        },
        None => Status::default(),
    };
    ReviewResponse {
        api_version: API_VERSION,
        kind: KIND,
        response: AdmissionResponse {
            uid,
            allowed: verdict.message.is_none(),
            status,
            audit_annotations: verdict
                .audit_annotations()
                .into_iter()
                .map(|(k, v)| (k, cut(&v, MAX_MESSAGE_BYTES)))
                .collect(),
            warnings: (!verdict.warnings.is_empty()).then(|| warnings(&verdict.warnings)),
        },
    }
}

/// The most warnings one answer carries; the API server keeps only the first few anyway.
pub const MAX_WARNINGS: usize = 10;

/// The most bytes of one warning, and of the denial message or an audit annotation.
pub const MAX_WARNING_BYTES: usize = 512;
pub const MAX_MESSAGE_BYTES: usize = 4096;

/// At most [`MAX_WARNINGS`], each cut to [`MAX_WARNING_BYTES`]; the last place says how many
/// were left out, when some were.
fn warnings(all: &[String]) -> Vec<String> {
    let kept = if all.len() > MAX_WARNINGS {
        MAX_WARNINGS - 1
    } else {
        all.len()
    };
    let mut out: Vec<String> = all[..kept]
        .iter()
        .map(|w| cut(w, MAX_WARNING_BYTES))
        .collect();
    if kept < all.len() {
        out.push(format!("... and {} more warnings", all.len() - kept));
    }
    out
}

/// `text` cut to at most `max` bytes on a character boundary, marked when cut.
fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max - '…'.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// The answer to a request that could not be read as a Node AdmissionReview: not allowed,
/// with the HTTP status `code` and `message` (the API server logs it and applies the
/// webhook's failurePolicy). `uid` is the request's when it was readable.
pub fn invalid(message: String, code: u16, uid: Option<String>) -> ReviewResponse {
    ReviewResponse {
        api_version: API_VERSION,
        kind: KIND,
        response: AdmissionResponse {
            uid: uid.unwrap_or_default(),
            allowed: false,
            status: Status {
                status: Some("Failure"),
                code,
                message,
                reason: "InvalidRequest".to_owned(),
            },
            audit_annotations: Vec::new(),
            warnings: None,
        },
    }
}

/// `body` as a JSON answer with `status`.
pub(super) fn json_response<T: serde::Serialize>(status: StatusCode, body: &T) -> Response {
    match serde_json::to_vec(body) {
        Ok(bytes) => (status, [(header::CONTENT_TYPE, "application/json")], bytes).into_response(),
        // Serializing our own response types cannot fail; answer anyway rather than panic.
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot encode response: {e}\n"),
        )
            .into_response(),
    }
}

impl BadRequest {
    /// The answer to a request that cannot be reviewed: its status, and an AdmissionReview
    /// that says why when the uid is known.
    pub(super) fn into_response(self, uid: Option<String>) -> Response {
        let body = invalid(self.to_string(), self.status().as_u16(), uid);
        json_response(self.status(), &body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::facts::ClusterFacts;
    use crate::core::policy::Policy;
    use crate::webhook::node_review::review_request;
    use crate::webhook::read::parse_review;

    #[test]
    fn a_refusal_is_the_v1_review_the_api_server_reads() {
        let body = serde_json::to_string(&invalid(
            "AdmissionReview has no `request`".to_owned(),
            400,
            None,
        ))
        .unwrap();
        assert_eq!(
            body,
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"","allowed":false,"status":{"status":"Failure","code":400,"message":"AdmissionReview has no `request`","reason":"InvalidRequest"}}}"#
        );
    }

    #[test]
    fn a_denial_carries_status_annotations_and_warnings_in_order() {
        let bytes =
            include_bytes!("../../tests/fixtures/reviews/lab-node-2-device-plugin-only.json");
        let req = parse_review(bytes).unwrap();
        let verdict = review_request(&req, &ClusterFacts::default(), &Policy::default()).unwrap();
        let body = serde_json::to_string(&respond(&req, &verdict)).unwrap();
        let message = verdict.message.clone().unwrap();
        let head = format!(
            r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{{"uid":"{}","allowed":false,"status":{{"code":403,"message":{},"reason":"Forbidden"}},"auditAnnotations":{{"decision":"denied","findings":"#,
            req.uid,
            serde_json::to_string(&message).unwrap()
        );
        assert!(body.starts_with(&head), "{body}");
        assert!(body.contains(r#"},"warnings":["#), "{body}");

        // Allowed: an empty status object, no warnings key when there are none.
        let allowed = Verdict {
            message: None,
            warnings: Vec::new(),
            ..verdict
        };
        let body = serde_json::to_string(&respond(&req, &allowed)).unwrap();
        assert!(
            body.contains(r#""allowed":true,"status":{},"auditAnnotations":"#),
            "{body}"
        );
        assert!(!body.contains("warnings"), "{body}");
    }
}
