//! Reading a request body as a GPU-policy AdmissionReview (ClusterPolicy, NVIDIADriver,
//! GPUCluster): bytes in, the request ([`PolicyRequest`]) out, or why not ([`BadRequest`]).
//!
//! Not the hot path of node labels: read with serde, whole, its objects pruned to the fields
//! the decision reads ([`policy_object::keeps`]). The envelope is checked as a Node review's
//! is (`check_envelope`, `check_uid`, `check_name`); what this reading keeps of its own
//! is how it has always answered: `apiVersion` and `kind` may be absent (and are then refused
//! as wrong) and are repeated cut at `MAX_ERROR_BYTES`, a refused field's path is given as
//! serde gives it, no uid is looked for in a body that is not read whole, and what follows a
//! whole review in the body is not read.

use serde::Deserialize;
use serde_json::Value;

use super::view::UserInfo;
use super::{MAX_ERROR_BYTES, check_envelope, check_name, check_uid};
use crate::core::echo::bounded_display;
use crate::core::policy_change::PolicyKind;
use crate::core::review::Operation;
use crate::k8s::policy_object;
use crate::webhook::bad_request::BadRequest;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PolicyReviewBody {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    request: Option<PolicyRequest>,
}

/// The fields of a GPU-policy review's `request` the webhook reads.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyRequest {
    pub uid: String,
    pub kind: PolicyGvk,
    #[serde(default)]
    pub name: String,
    pub operation: Operation,
    #[serde(default)]
    pub sub_resource: Option<String>,
    #[serde(default)]
    pub user_info: UserInfo<'static>,
    /// The objects with only the fields the decision reads ([`policy_object::keeps`]).
    #[serde(default, deserialize_with = "policy_fields")]
    pub object: Option<Value>,
    #[serde(default, deserialize_with = "policy_fields")]
    pub old_object: Option<Value>,
    #[serde(default)]
    pub dry_run: bool,
}

/// `request.kind`: its group and kind, empty when absent.
#[derive(Deserialize)]
pub struct PolicyGvk {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub kind: String,
}

fn policy_fields<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    policy_object::read(d)
}

impl PolicyRequest {
    /// The kind of GPU-policy object reviewed; refused when the webhook's rules sent another.
    pub fn policy_kind(&self) -> Result<PolicyKind, BadRequest> {
        match (self.kind.group.as_str(), self.kind.kind.as_str()) {
            ("nvidia.com", "ClusterPolicy") => Ok(PolicyKind::ClusterPolicy),
            ("nvidia.com", "NVIDIADriver") => Ok(PolicyKind::NvidiaDriver),
            ("nvidia.com", "GPUCluster") => Ok(PolicyKind::GpuCluster),
            (group, kind) => Err(BadRequest::NotAPolicy(format!("{group}/{kind}"))),
        }
    }
}

/// Reads the body as a v1 GPU-policy AdmissionReview. On failure, returns the uid when the
/// request was read, so the API server can match even an error answer.
pub fn parse_policy_review(bytes: &[u8]) -> Result<PolicyRequest, (BadRequest, Option<String>)> {
    if bytes.is_empty() {
        return Err((BadRequest::Empty, None));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let body: PolicyReviewBody =
        serde_path_to_error::deserialize(&mut de).map_err(|e| (unreadable(e), None))?;
    check_envelope(&body.kind, &body.api_version, |text| {
        bounded_display(&text, MAX_ERROR_BYTES)
    })?;
    let request = body.request.ok_or((BadRequest::NoRequest, None))?;
    check_uid(&request.uid)?;
    check_name("request.name", &request.name, &request.uid)?;
    Ok(request)
}

/// Why serde_json refused a body, with the path to the field at fault.
fn unreadable(e: serde_path_to_error::Error<serde_json::Error>) -> BadRequest {
    let path = e.path().to_string();
    let inner = e.into_inner();
    if inner.is_eof() {
        BadRequest::Truncated(bounded_display(&inner, MAX_ERROR_BYTES))
    } else if inner.is_syntax() {
        BadRequest::NotJson(bounded_display(&inner, MAX_ERROR_BYTES))
    } else {
        BadRequest::Invalid {
            path,
            message: bounded_display(&inner, MAX_ERROR_BYTES),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(body: &str) -> (String, Option<String>) {
        match parse_policy_review(body.as_bytes()) {
            Ok(_) => panic!("read: {body}"),
            Err((bad, uid)) => (bad.to_string(), uid),
        }
    }

    const REQUEST: &str =
        r#"{"uid":"u","kind":{"group":"nvidia.com","kind":"ClusterPolicy"},"operation":"UPDATE"}"#;

    #[test]
    fn the_envelope_is_refused_as_this_route_always_refused_it() {
        assert_eq!(
            refused("").0,
            "request body is empty: expected an AdmissionReview"
        );
        assert!(refused(" ").0.starts_with("request body is truncated JSON"));
        // Absent: refused as wrong, with nothing to repeat.
        assert_eq!(
            refused(&format!(
                r#"{{"apiVersion":"admission.k8s.io/v1","request":{REQUEST}}}"#
            ))
            .0,
            r#"expected kind AdmissionReview, got """#
        );
        let long = "x".repeat(400);
        let (said, uid) = refused(&format!(
            r#"{{"apiVersion":"{long}","kind":"AdmissionReview","request":{REQUEST}}}"#
        ));
        assert!(said.contains(&format!("{}…", "x".repeat(300))), "{said}");
        assert_eq!(uid, None);
        let (said, uid) = refused(
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","operation":"PATCH"}}"#,
        );
        assert!(said.starts_with("request body is not a valid AdmissionReview: request.operation: unknown variant `PATCH`"), "{said}");
        assert_eq!(uid, None, "no uid is looked for in a body not read whole");
        let long_name = REQUEST.replace(
            r#""operation""#,
            &format!(r#""name":"{}","operation""#, "n".repeat(300)),
        );
        let (said, uid) = refused(&format!(
            r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{long_name}}}"#
        ));
        assert!(
            said.starts_with("request.name is 300 characters long"),
            "{said}"
        );
        assert_eq!(uid.as_deref(), Some("u"));
    }

    #[test]
    fn a_whole_review_is_read_and_what_follows_it_is_not() {
        let body = format!(
            r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{REQUEST}}} trailing"#
        );
        let request = parse_policy_review(body.as_bytes()).unwrap_or_else(|_| panic!("refused"));
        assert_eq!(request.policy_kind().ok(), Some(PolicyKind::ClusterPolicy));
        assert_eq!(request.operation, Operation::Update);
    }
}
