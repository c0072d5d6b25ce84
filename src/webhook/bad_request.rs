//! Why a request could not be reviewed ([`BadRequest`]), and the answer that says so: a 4xx or
//! 503 whose body is an AdmissionReview naming the problem, on which the API server applies
//! the webhook's failurePolicy.

use std::time::Duration;

use axum::http::StatusCode;

use crate::core::labels::MAX_NAME_CHARS;
use crate::policy_decision::{MAX_MESSAGE_BYTES, ObjectError};

/// Request uids are UUIDs (36 characters); the answer must repeat the uid, so a longer one is
/// refused rather than echoed.
pub const MAX_UID_CHARS: usize = 128;

/// The most bytes of a parser's error message repeated in an answer or a log line: the bound
/// the policy decision puts on an object's refusal too.
pub(super) const MAX_ERROR_BYTES: usize = MAX_MESSAGE_BYTES;

/// Why a request could not be reviewed. Each variant maps to one HTTP status.
#[derive(Debug, thiserror::Error)]
pub enum BadRequest {
    #[error("Content-Type must be application/json, got {0:?}")]
    ContentType(String),
    #[error("request body is larger than the limit of {limit} bytes")]
    TooLarge { limit: usize },
    #[error("too many request bytes in flight: no room for this body within {0:?}; retry")]
    Busy(Duration),
    #[error(
        "this client already has {0} requests in flight, its share of the webhook; retry when one is answered"
    )]
    SourceRequests(usize),
    #[error(
        "this client's request bodies hold its share of the in-flight body budget: no room for this body within {0:?}; retry"
    )]
    SourceBytes(Duration),
    #[error(
        "no room for this body in the in-flight body budget, nor to wait for it: the bodies of its size waiting may hold {waiting} bytes ({of_source} of them this client's), of at most {room} ({per_source} for one client); retry"
    )]
    TooManyWaiting {
        waiting: usize,
        of_source: usize,
        room: usize,
        per_source: usize,
    },
    #[error("request body not received within {0:?}")]
    BodyTimeout(Duration),
    #[error("request body could not be read: {0}")]
    BodyRead(String),
    #[error("request body is empty: expected an AdmissionReview")]
    Empty,
    #[error("request body is not JSON: {0}")]
    NotJson(String),
    #[error("request body is truncated JSON: {0}")]
    Truncated(String),
    #[error("request body is not a valid AdmissionReview: {path}: {message}")]
    Invalid { path: String, message: String },
    #[error(
        "AdmissionReview {0} is not supported: only admission.k8s.io/v1 (set admissionReviewVersions: [\"v1\"])"
    )]
    Version(String),
    #[error("expected kind AdmissionReview, got {0:?}")]
    Kind(String),
    #[error("AdmissionReview has no `request`")]
    NoRequest,
    #[error("only Nodes (core/v1) are reviewed, got {0}: check the webhook's rules")]
    NotANode(String),
    #[error(
        "only ClusterPolicy and NVIDIADriver (nvidia.com) are reviewed at /validate/gpu-policy, got {0}: check the webhook's rules"
    )]
    NotAPolicy(String),
    #[error("{operation} request has no `{field}`")]
    MissingObject {
        operation: &'static str,
        field: &'static str,
    },
    #[error("{field} is {chars} characters long: a Node name has at most {MAX_NAME_CHARS}")]
    NameTooLong { field: &'static str, chars: usize },
    #[error("request.uid is {0} characters long: at most {MAX_UID_CHARS} are accepted")]
    UidTooLong(usize),
}

/// A GPU-policy object that cannot be decided: the same words, counted under the same reason
/// as the refusals of the request it came in.
impl From<ObjectError> for BadRequest {
    fn from(e: ObjectError) -> BadRequest {
        match e {
            ObjectError::Invalid(message) => BadRequest::Invalid {
                path: "request.object".to_owned(),
                message,
            },
            ObjectError::Missing { operation, field } => {
                BadRequest::MissingObject { operation, field }
            }
        }
    }
}

impl BadRequest {
    pub(super) fn status(&self) -> StatusCode {
        match self {
            BadRequest::ContentType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            BadRequest::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            BadRequest::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            BadRequest::Busy(_)
            | BadRequest::SourceRequests(_)
            | BadRequest::SourceBytes(_)
            | BadRequest::TooManyWaiting { .. } => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::BAD_REQUEST,
        }
    }

    /// Whether a refused HTTP/1.1 body is read to its end ([`linger`]) so that the client,
    /// still sending, gets the answer: yes when it was refused for want of room or for its
    /// content type, not when its size, its slowness or its stream was the problem.
    pub(super) fn lingers(&self) -> bool {
        !matches!(
            self,
            BadRequest::TooLarge { .. } | BadRequest::BodyTimeout(_) | BadRequest::BodyRead(_)
        )
    }

    /// A short, fixed reason for the metrics label.
    pub(super) fn reason(&self) -> &'static str {
        match self {
            BadRequest::ContentType(_) => "content-type",
            BadRequest::TooLarge { .. } => "too-large",
            BadRequest::BodyTimeout(_) => "body-timeout",
            BadRequest::BodyRead(_) => "body-read",
            BadRequest::Empty => "empty",
            BadRequest::NotJson(_) => "not-json",
            BadRequest::Truncated(_) => "truncated",
            BadRequest::Invalid { .. } => "invalid",
            BadRequest::Version(_) => "version",
            BadRequest::Kind(_) => "kind",
            BadRequest::NoRequest => "no-request",
            BadRequest::NotANode(_) => "not-a-node",
            BadRequest::NotAPolicy(_) => "not-a-policy",
            BadRequest::MissingObject { .. } => "missing-object",
            BadRequest::Busy(_) => "busy",
            BadRequest::SourceRequests(_) => "source-requests",
            BadRequest::SourceBytes(_) => "source-bytes",
            BadRequest::TooManyWaiting { .. } => "too-many-waiting",
            BadRequest::NameTooLong { .. } => "name-too-long",
            BadRequest::UidTooLong(_) => "uid-too-long",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_refused_by_the_policy_decision_says_the_same_here() {
        for e in [
            ObjectError::Invalid("spec.toolkit.enabled: expected true or false".into()),
            ObjectError::Missing {
                operation: "UPDATE",
                field: "oldObject",
            },
        ] {
            let said = e.to_string();
            assert_eq!(BadRequest::from(e).to_string(), said);
        }
    }
}
