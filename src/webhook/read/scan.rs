//! A scanner for the AdmissionReview body: it reads the fields the webhook needs (the review's
//! apiVersion and kind; the request's uid, kind, name, operation, userInfo, dryRun; name and
//! labels of object and oldObject) into the webhook's view of a review ([`ReviewBody`]) and
//! skips every other value without building it (`skip`).
//!
//! It accepts exactly what `serde_json::from_slice` accepts into that view (serde's reading,
//! `reference`), and extracts the same fields:
//!
//! - every value it skips is still checked to be JSON (structure, numbers, literals, string
//!   escapes and control characters) with no depth limit, as serde_json's `IgnoredAny` does; like
//!   serde_json it does not check that the bytes of a skipped string are UTF-8;
//! - every string it reads (the keys of the objects it walks, the labels, the request's strings)
//!   is checked to be UTF-8, its escapes decoded, its `\u` surrogates paired;
//! - a key given twice in one of the objects it walks is an error (serde's `duplicate field`),
//!   and a required field that is missing is an error; a label given twice is kept twice, in the
//!   body's order, so that the last value wins when the labels are collected;
//! - a label value that is not a string is an error even for a label the policy never reads.
//!
//! serde also accepts a few forms the API server never sends: an array in place of an object it
//! reads as a struct (`"kind": ["", "v1", "Node"]`) and an object in place of the operation
//! (`{"UPDATE": null}`). The scanner answers those with [`ScanError::Unusual`]; the caller then
//! reads the body with serde, which decides. Every other error is final, and the caller reads the
//! body with serde again only to say where and why.
//!
//! Labels and groups are not collected: the view keeps where they are in the body and how many
//! there are ([`ScannedLabels`], [`ScannedStrings`]), and reads them again, in order, each time
//! they are walked. A view therefore costs the same few words whatever a body holds; collected,
//! the 3.5 MiB body's worth of one-byte labels was 24 MiB of pairs, and of empty groups 48 MiB.
//! Each label's lengths (`core::labels::check_lengths`) are checked as it is first read.

use std::borrow::Cow;

use super::scanner::{Result, Scanner, Seen, Stop};
pub use super::scanner::{ScanError, ScannedLabels, ScannedStrings, Str};
use super::view::{
    GroupVersionKind, Groups, LabelPairs, MAX_TAINTS, Metadata, NodeLabels, NodeSpec, RequestView,
    ReviewBody, TaintView, Text, UserInfo,
};
use crate::core::labels;
use crate::core::review::Operation;

/// Reads an AdmissionReview body.
pub fn scan(body: &[u8]) -> std::result::Result<ReviewBody<'_>, ScanError> {
    // One check of the whole body (a few instructions per 16 bytes of ASCII) spares one per
    // string read. A body that is not UTF-8 throughout may still be a review (serde does not check
    // a skipped string's bytes): its strings are then checked one by one.
    let text = std::str::from_utf8(body).ok();
    // The API server sends compact JSON: no byte below 0x20 but maybe a newline at the end (which
    // cannot be inside a string that ends), so finding a string's end is a search for two bytes.
    let compact = body
        .trim_ascii()
        .iter()
        .copied()
        .min()
        .is_none_or(|least| least >= 0x20);
    let mut s = Scanner {
        b: body,
        text,
        compact,
        i: 0,
        error: None,
    };
    let review = s.review().and_then(|review| match s.ws() {
        Some(_) => s.fail("trailing characters"),
        None => Ok(review),
    });
    review.map_err(|Stop| {
        s.error.take().unwrap_or(ScanError::Invalid {
            offset: s.i,
            what: "invalid",
        })
    })
}

/// What the scanner says when a value has the wrong type (or, for the operation, the wrong
/// word): serde's message for such a string repeats it.
const TYPE_ERRORS: [&str; 6] = [
    "expected a boolean",
    "expected a string",
    "expected an array",
    "expected an object",
    "expected a map of label keys to string values",
    "unknown operation",
];

/// The body with the string the scanner refused by its type (`error`) cut to its first `keep`
/// characters, when it is longer: serde, reading that body to say why it is refused, then builds
/// a message of `keep` characters instead of one that repeats the string whole (escaped, up to
/// three times its size). The message up to its first `keep` bytes is the same. None when the
/// error is of another kind, the string is short, or the string itself is not one serde reads
/// (then that is the answer).
pub fn with_short_string(body: &[u8], error: &ScanError, keep: usize) -> Option<Vec<u8>> {
    let ScanError::Invalid { offset, what } = *error else {
        return None;
    };
    if !TYPE_ERRORS.contains(&what) {
        return None;
    }
    // The operation is refused after its opening quote, every other value at its first byte.
    let start = match (body.get(offset), what) {
        (Some(b'"'), _) => offset,
        (_, "unknown operation") if offset > 0 && body[offset - 1] == b'"' => offset - 1,
        _ => return None,
    };
    // Read as serde reads it (a string broken anywhere is serde's answer, not a type's), then
    // its first `keep` characters written back in its place.
    let mut s = Scanner {
        b: body,
        text: None,
        compact: false,
        i: start + 1,
        error: None,
    };
    let whole = s.read_str().ok()?;
    let end = s.i;
    let cut = whole.char_indices().nth(keep)?.0;
    let short = serde_json::to_vec(&whole[..cut]).ok()?;
    let mut out = Vec::with_capacity(start + short.len() + body.len() - end);
    out.extend_from_slice(&body[..start]);
    out.extend_from_slice(&short);
    out.extend_from_slice(&body[end..]);
    Some(out)
}

impl<'a> Scanner<'a> {
    fn review(&mut self) -> Result<ReviewBody<'a>> {
        let (mut api_version, mut kind, mut request) = (None, None, None);
        let mut seen = Seen(0);
        self.object(|s, key| match key.as_ref() {
            "apiVersion" => {
                if !seen.first(0) {
                    return s.duplicate();
                }
                api_version = Some(s.string()?);
                Ok(())
            }
            "kind" => {
                if !seen.first(1) {
                    return s.duplicate();
                }
                kind = Some(s.string()?);
                Ok(())
            }
            "request" => {
                if !seen.first(2) {
                    return s.duplicate();
                }
                request = s.option(Self::request)?;
                Ok(())
            }
            _ => s.skip_value(),
        })?;
        match (api_version, kind) {
            (Some(api_version), Some(kind)) => Ok(ReviewBody {
                api_version: Text(api_version),
                kind: Text(kind),
                request,
            }),
            _ => self.missing(),
        }
    }

    fn request(&mut self) -> Result<RequestView<'a>> {
        let (mut uid, mut kind, mut name, mut operation) = (None, None, None, None);
        let (mut user_info, mut object, mut old_object, mut dry_run) = (None, None, None, None);
        let mut seen = Seen(0);
        self.object(|s, key| {
            let field = match key.as_ref() {
                "uid" => 0,
                "kind" => 1,
                "name" => 2,
                "operation" => 3,
                "userInfo" => 4,
                "object" => 5,
                "oldObject" => 6,
                "dryRun" => 7,
                _ => return s.skip_value(),
            };
            if !seen.first(field) {
                return s.duplicate();
            }
            match field {
                0 => uid = Some(s.string()?),
                1 => kind = Some(s.group_version_kind()?),
                2 => name = Some(s.string()?),
                3 => operation = Some(s.operation()?),
                4 => user_info = Some(s.user_info()?),
                5 => object = s.option(Self::node)?,
                6 => old_object = s.option(Self::node)?,
                _ => dry_run = Some(s.boolean()?),
            }
            Ok(())
        })?;
        let (Some(uid), Some(kind), Some(operation)) = (uid, kind, operation) else {
            return self.missing();
        };
        Ok(RequestView {
            uid: uid.into_owned(),
            kind,
            name: name.map(Cow::into_owned).unwrap_or_default(),
            operation,
            user_info: user_info.unwrap_or_default(),
            object,
            old_object,
            dry_run: dry_run.unwrap_or(false),
        })
    }

    fn group_version_kind(&mut self) -> Result<GroupVersionKind> {
        let mut fields: [Option<Str<'a>>; 3] = [None, None, None];
        let mut seen = Seen(0);
        self.object(|s, key| {
            let field = match key.as_ref() {
                "group" => 0,
                "version" => 1,
                "kind" => 2,
                _ => return s.skip_value(),
            };
            if !seen.first(field as u16) {
                return s.duplicate();
            }
            fields[field] = Some(s.string()?);
            Ok(())
        })?;
        let [group, Some(version), Some(kind)] = fields else {
            return self.missing();
        };
        Ok(GroupVersionKind {
            group: group.map(Cow::into_owned).unwrap_or_default(),
            version: version.into_owned(),
            kind: kind.into_owned(),
        })
    }

    fn operation(&mut self) -> Result<Operation> {
        match self.peek()? {
            b'"' => self.i += 1,
            // serde's map form of an enum, `{"UPDATE": null}`.
            b'{' => return self.unusual(),
            _ => return self.fail("expected a string"),
        }
        let at = self.i;
        let operation = match self.read_str()?.as_ref() {
            "CREATE" => Operation::Create,
            "UPDATE" => Operation::Update,
            "DELETE" => Operation::Delete,
            "CONNECT" => Operation::Connect,
            _ => {
                self.i = at;
                return self.fail("unknown operation");
            }
        };
        Ok(operation)
    }

    fn user_info(&mut self) -> Result<UserInfo<'a>> {
        let (mut username, mut groups) = (None, None);
        let mut seen = Seen(0);
        self.object(|s, key| match key.as_ref() {
            "username" => {
                if !seen.first(0) {
                    return s.duplicate();
                }
                username = s.option(Self::string)?;
                Ok(())
            }
            "groups" => {
                if !seen.first(1) {
                    return s.duplicate();
                }
                groups = s.option(Self::strings)?;
                Ok(())
            }
            _ => s.skip_value(),
        })?;
        Ok(UserInfo {
            username: username.map(Cow::into_owned),
            groups: groups.map(Groups::Scanned),
        })
    }

    /// An array of strings.
    fn strings(&mut self) -> Result<ScannedStrings<'a>> {
        self.expect(b'[', "expected an array")?;
        let start = self.i;
        let mut len = 0;
        if self.peek()? == b']' {
            self.i += 1;
            return Ok(ScannedStrings {
                at: self.reread(start, 0),
            });
        }
        loop {
            self.string()?;
            len += 1;
            match self.peek()? {
                b',' => self.i += 1,
                b']' => {
                    self.i += 1;
                    return Ok(ScannedStrings {
                        at: self.reread(start, len),
                    });
                }
                _ => return self.fail("expected a comma or the end of an array"),
            }
        }
    }

    /// A Node: `metadata` and what placement reads of `spec` read, everything else (the rest
    /// of spec, status) skipped.
    fn node(&mut self) -> Result<NodeLabels<'a>> {
        let mut node = NodeLabels::default();
        let mut seen = Seen(0);
        self.object(|s, key| match key.as_ref() {
            "metadata" => {
                if !seen.first(0) {
                    return s.duplicate();
                }
                node.metadata = s.metadata()?;
                Ok(())
            }
            "spec" => {
                if !seen.first(1) {
                    return s.duplicate();
                }
                node.spec = s.option(Self::node_spec)?;
                Ok(())
            }
            _ => s.skip_value(),
        })?;
        Ok(node)
    }

    /// `spec`: `taints` and `unschedulable` read, everything else skipped.
    fn node_spec(&mut self) -> Result<NodeSpec<'a>> {
        let mut spec = NodeSpec::default();
        let mut seen = Seen(0);
        self.object(|s, key| match key.as_ref() {
            "taints" => {
                if !seen.first(0) {
                    return s.duplicate();
                }
                spec.taints = s.option(Self::taints)?;
                Ok(())
            }
            "unschedulable" => {
                if !seen.first(1) {
                    return s.duplicate();
                }
                spec.unschedulable = s.option(Self::boolean)?;
                Ok(())
            }
            _ => s.skip_value(),
        })?;
        Ok(spec)
    }

    /// An array of taints; past [`MAX_TAINTS`] the rest are checked as JSON and counted, not
    /// kept (the view refuses the node).
    fn taints(&mut self) -> Result<Vec<TaintView<'a>>> {
        self.expect(b'[', "expected an array")?;
        let mut taints = Vec::new();
        if self.peek()? == b']' {
            self.i += 1;
            return Ok(taints);
        }
        loop {
            if taints.len() > MAX_TAINTS {
                self.skip_value()?;
            } else {
                taints.push(self.taint()?);
            }
            match self.peek()? {
                b',' => self.i += 1,
                b']' => {
                    self.i += 1;
                    return Ok(taints);
                }
                _ => return self.fail("expected a comma or the end of an array"),
            }
        }
    }

    /// One taint: `key`, `value` and `effect` read, `timeAdded` and anything else skipped.
    fn taint(&mut self) -> Result<TaintView<'a>> {
        let mut fields: [Option<Str<'a>>; 3] = [None, None, None];
        let mut seen = Seen(0);
        self.object(|s, key| {
            let field = match key.as_ref() {
                "key" => 0,
                "value" => 1,
                "effect" => 2,
                _ => return s.skip_value(),
            };
            if !seen.first(field as u16) {
                return s.duplicate();
            }
            fields[field] = s.option(Self::string)?;
            Ok(())
        })?;
        let [key, value, effect] = fields;
        Ok(TaintView {
            key: key.map(Text),
            value: value.map(Text),
            effect: effect.map(Text),
        })
    }

    /// `metadata`: name and labels read, everything else (managedFields, annotations) skipped.
    fn metadata(&mut self) -> Result<Metadata<'a>> {
        let mut metadata = Metadata::default();
        let mut seen = Seen(0);
        self.object(|s, key| match key.as_ref() {
            "name" => {
                if !seen.first(0) {
                    return s.duplicate();
                }
                metadata.name = s.option(Self::string)?.map(Text);
                Ok(())
            }
            "labels" => {
                if !seen.first(1) {
                    return s.duplicate();
                }
                metadata.labels = s.option(Self::labels)?.map(LabelPairs::Scanned);
                Ok(())
            }
            _ => s.skip_value(),
        })?;
        Ok(metadata)
    }

    /// A map of label keys to string values: each pair read and its syntax checked, none kept.
    fn labels(&mut self) -> Result<ScannedLabels<'a>> {
        if self.peek()? != b'{' {
            return self.fail("expected a map of label keys to string values");
        }
        let start = self.i + 1;
        let (mut len, mut syntax_ok) = (0, true);
        self.object(|s, key| {
            let value = s.string()?;
            syntax_ok &= labels::check_lengths(&key, &value).is_ok();
            len += 1;
            Ok(())
        })?;
        Ok(ScannedLabels {
            at: self.reread(start, len),
            syntax_ok,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn review(request: &str) -> String {
        format!(
            r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{request}}}"#
        )
    }

    const REQUEST: &str = r#"{"uid":"u1","kind":{"group":"","version":"v1","kind":"Node"},"name":"n1","operation":"UPDATE","userInfo":{"username":"alice","groups":["a","b"]},"object":{"metadata":{"name":"n1","labels":{"a":"1","b":"2"}}},"oldObject":{"metadata":{"labels":{"a":"0"}}},"dryRun":true}"#;

    /// A node's labels as `key=value`, in order.
    fn pairs(node: &NodeLabels<'_>) -> Vec<String> {
        node.pairs().map(|(k, v)| format!("{k}={v}")).collect()
    }

    fn invalid(body: &str) -> &'static str {
        match scan(body.as_bytes()) {
            Err(ScanError::Invalid { what, .. }) => what,
            other => panic!("{body}: expected an error, got {other:?}"),
        }
    }

    #[test]
    fn reads_the_fields_the_webhook_needs() {
        let body = review(REQUEST);
        let r = scan(body.as_bytes()).unwrap();
        assert_eq!(r.api_version.as_str(), "admission.k8s.io/v1");
        assert_eq!(r.kind.as_str(), "AdmissionReview");
        let req = r.request.unwrap();
        assert_eq!(req.uid, "u1");
        assert_eq!(
            (
                req.kind.group.as_str(),
                req.kind.version.as_str(),
                req.kind.kind.as_str()
            ),
            ("", "v1", "Node")
        );
        assert_eq!(req.name, "n1");
        assert_eq!(req.operation, Operation::Update);
        assert_eq!(req.user_info.username.as_deref(), Some("alice"));
        let Some(Groups::Scanned(groups)) = &req.user_info.groups else {
            panic!("groups not scanned: {:?}", req.user_info.groups);
        };
        assert_eq!(groups.iter().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(groups.len(), 2);
        let object = req.object.unwrap();
        assert_eq!(object.metadata.name.as_ref().map(Text::as_str), Some("n1"));
        assert_eq!(pairs(&object), ["a=1", "b=2"]);
        assert_eq!(pairs(&req.old_object.unwrap()), ["a=0"]);
        assert!(req.dry_run);
    }

    #[test]
    fn reads_a_nodes_taints_and_cordon_as_serde_does() {
        let request = r#"{"uid":"u","kind":{"version":"v1","kind":"Node"},"operation":"UPDATE",
            "object":{"metadata":{"name":"n"},"spec":{"podCIDR":"10.0.0.0/24","unschedulable":true,
              "taints":[{"key":"nvidia.com/gpu-xid-error","value":"79","effect":"NoSchedule","timeAdded":"2026-12-04T00:00:00Z"},
                        {"effect":"NoExecute","key":"m","value":null}]}},
            "oldObject":{"metadata":{"name":"n"},"spec":null}}"#;
        let body = review(request);
        let scanned = scan(body.as_bytes()).unwrap().request.unwrap();
        let by_serde: ReviewBody<'_> = serde_json::from_str(&body).unwrap();
        let by_serde = by_serde.request.unwrap();
        for req in [&scanned, &by_serde] {
            let node = req.object.as_ref().unwrap().placement().unwrap();
            assert!(node.unschedulable);
            assert_eq!(node.taints.len(), 2);
            assert_eq!(
                node.taints[0].to_string(),
                "nvidia.com/gpu-xid-error=79:NoSchedule"
            );
            assert_eq!(node.taints[1].to_string(), "m:NoExecute");
            let old = req.old_object.as_ref().unwrap().placement().unwrap();
            assert!(old.taints.is_empty() && !old.unschedulable);
        }
        for bad in [
            r#"{"spec":{"taints":[{"key":"k","key":"j"}]}}"#,
            r#"{"spec":{"taints":{}}}"#,
            r#"{"spec":{"taints":[{"key":1}]}}"#,
            r#"{"spec":{"unschedulable":"yes"}}"#,
            r#"{"spec":{},"spec":{}}"#,
        ] {
            let body = review(&format!(
                r#"{{"uid":"u","kind":{{"version":"v1","kind":"Node"}},"operation":"UPDATE","object":{bad}}}"#
            ));
            assert!(scan(body.as_bytes()).is_err(), "{bad}");
            assert!(
                serde_json::from_str::<ReviewBody<'_>>(&body).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn skips_everything_else_whatever_its_shape() {
        let body = review(
            r#"{"resource":{"x":[1,-2.5e+3,0,true,false,null,"s\"\\\/\b\f\n\r\t\u00e9",[],{},[[{"a":[{}]}]]]},
                "uid":"u","kind":{"version":"v1","kind":"Node","extra":{"deep":[[[[]]]]}},"operation":"CREATE",
                "object":{"spec":{"taints":[{"key":"k"}]},"metadata":{"managedFields":[{"f:x":{}}],"labels":{}},"status":{"images":[]}}}"#,
        );
        let req = scan(body.as_bytes()).unwrap().request.unwrap();
        assert_eq!(req.kind.group, "");
        assert_eq!(req.name, "");
        assert_eq!(req.operation, Operation::Create);
        assert!(req.user_info.username.is_none() && req.user_info.groups.is_none());
        let object = req.object.unwrap();
        assert!(matches!(object.metadata.labels, Some(LabelPairs::Scanned(l)) if l.is_empty()));
        assert!(req.old_object.is_none());
        assert!(!req.dry_run);
    }

    #[test]
    fn strings_are_borrowed_unless_escaped_and_escapes_are_decoded() {
        let body = review(
            r#"{"uid":"u","kind":{"version":"v1","kind":"Node"},"operation":"UPD\u0041TE","object":{"metadata":{"labels":{"nvidia.com\/gpu.present":"tr\u0075e","plain":"v","emoji":"\ud83d\ude00","é":"ü"}}}}"#,
        );
        let req = scan(body.as_bytes()).unwrap().request.unwrap();
        assert_eq!(req.operation, Operation::Update);
        let object = req.object.unwrap();
        let labels: Vec<_> = object.pairs().collect();
        assert!(matches!(&labels[0].0, Cow::Owned(k) if k == "nvidia.com/gpu.present"));
        assert!(matches!(&labels[0].1, Cow::Owned(v) if v == "true"));
        assert!(matches!(
            labels[1],
            (Cow::Borrowed("plain"), Cow::Borrowed("v"))
        ));
        assert_eq!(labels[2].1, "\u{1F600}");
        assert_eq!((labels[3].0.as_ref(), labels[3].1.as_ref()), ("é", "ü"));
    }

    #[test]
    fn an_escaped_key_names_the_same_field() {
        let body = review(
            r#"{"u\u0069d":"u","kind":{"version":"v1","kind":"Node"},"operation":"DELETE","oldObject":{"m\u0065tadata":{"labels":{"a":"b"}}}}"#,
        );
        let req = scan(body.as_bytes()).unwrap().request.unwrap();
        assert_eq!(req.uid, "u");
        assert_eq!(req.old_object.unwrap().pairs().count(), 1);
    }

    #[test]
    fn a_repeated_label_is_kept_in_order_so_the_last_wins() {
        let body = review(
            r#"{"uid":"u","kind":{"version":"v1","kind":"Node"},"operation":"UPDATE","object":{"metadata":{"labels":{"k":"true","k":"false"}}}}"#,
        );
        let object = scan(body.as_bytes())
            .unwrap()
            .request
            .unwrap()
            .object
            .unwrap();
        let last: std::collections::BTreeMap<_, _> = object.pairs().collect();
        assert_eq!(last["k"], "false");
    }

    #[test]
    fn a_field_given_twice_is_an_error() {
        for request in [
            r#"{"uid":"u","uid":"v","kind":{"version":"v1","kind":"Node"},"operation":"UPDATE"}"#,
            r#"{"uid":"u","kind":{"version":"v1","kind":"Node","kind":"Pod"},"operation":"UPDATE"}"#,
            r#"{"uid":"u","kind":{"version":"v1","kind":"Node"},"operation":"UPDATE","object":{"metadata":{},"metadata":{}}}"#,
            r#"{"uid":"u","kind":{"version":"v1","kind":"Node"},"operation":"UPDATE","object":{"metadata":{"labels":{},"labels":null}}}"#,
            r#"{"uid":"u","kind":{"version":"v1","kind":"Node"},"operation":"UPDATE","dryRun":true,"dryRun":false}"#,
        ] {
            assert_eq!(invalid(&review(request)), "duplicate field", "{request}");
        }
    }

    #[test]
    fn a_missing_required_field_is_an_error() {
        for request in [
            r#"{"kind":{"version":"v1","kind":"Node"},"operation":"UPDATE"}"#,
            r#"{"uid":"u","operation":"UPDATE"}"#,
            r#"{"uid":"u","kind":{"version":"v1","kind":"Node"}}"#,
            r#"{"uid":"u","kind":{"kind":"Node"},"operation":"UPDATE"}"#,
        ] {
            assert_eq!(invalid(&review(request)), "missing field", "{request}");
        }
        assert_eq!(invalid(r#"{"kind":"AdmissionReview"}"#), "missing field");
    }

    #[test]
    fn a_label_that_is_not_a_string_is_an_error_even_when_unread() {
        for labels in [
            r#"{"kubernetes.io/hostname":7}"#,
            r#"{"a":null}"#,
            r#"["a"]"#,
        ] {
            let request = format!(
                r#"{{"uid":"u","kind":{{"version":"v1","kind":"Node"}},"operation":"UPDATE","object":{{"metadata":{{"labels":{labels}}}}}}}"#
            );
            scan(review(&request).as_bytes()).unwrap_err();
        }
    }

    #[test]
    fn null_is_none_where_serde_reads_an_option_and_an_error_elsewhere() {
        let ok = review(
            r#"{"uid":"u","kind":{"version":"v1","kind":"Node"},"operation":"UPDATE","object":null,"oldObject":{"metadata":{"name":null,"labels":null}},"userInfo":{"username":null,"groups":null}}"#,
        );
        let req = scan(ok.as_bytes()).unwrap().request.unwrap();
        assert!(req.object.is_none());
        let old = req.old_object.unwrap();
        assert!(old.metadata.name.is_none() && old.metadata.labels.is_none());
        assert!(scan(review("null").as_bytes()).unwrap().request.is_none());
        for request in [
            r#"{"uid":null,"kind":{"version":"v1","kind":"Node"},"operation":"UPDATE"}"#,
            r#"{"uid":"u","name":null,"kind":{"version":"v1","kind":"Node"},"operation":"UPDATE"}"#,
            r#"{"uid":"u","userInfo":null,"kind":{"version":"v1","kind":"Node"},"operation":"UPDATE"}"#,
            r#"{"uid":"u","dryRun":null,"kind":{"version":"v1","kind":"Node"},"operation":"UPDATE"}"#,
            r#"{"uid":"u","kind":{"version":"v1","kind":"Node"},"operation":"UPDATE","object":{"metadata":null}}"#,
            r#"{"uid":"u","kind":{"version":"v1","kind":"Node"},"operation":"UPDATE","userInfo":{"groups":[null]}}"#,
        ] {
            scan(review(request).as_bytes()).unwrap_err();
        }
    }

    #[test]
    fn malformed_json_is_an_error_in_skipped_parts_too() {
        for resource in [
            r#"[1,]"#,
            r#"{"a":1,}"#,
            r#"{"a" 1}"#,
            r#"{1:1}"#,
            r#"01"#,
            r#"1."#,
            r#"1e"#,
            r#"-"#,
            r#"tru"#,
            r#"nul"#,
            r#""\x""#,
            r#""\u12g4""#,
            "\"tab\there\"",
            r#"[1 2]"#,
            r#"{"a":1 "b":2}"#,
            r#"]"#,
            r#"[}"#,
        ] {
            let body = review(&format!(
                r#"{{"resource":{resource},"uid":"u","kind":{{"version":"v1","kind":"Node"}},"operation":"UPDATE"}}"#
            ));
            scan(body.as_bytes()).unwrap_err();
        }
        // Every proper prefix of a review is cut short somewhere.
        let body = review(REQUEST);
        for end in 0..body.len() {
            scan(&body.as_bytes()[..end]).unwrap_err();
        }
        scan(format!("{} x", review(REQUEST)).as_bytes()).unwrap_err();
        scan(format!(" \n{}\t\r\n", review(REQUEST)).as_bytes()).unwrap();
    }

    #[test]
    fn strings_read_are_checked_and_strings_skipped_are_not_checked_for_utf8() {
        // A skipped string may hold any bytes but control characters, as serde_json allows.
        let mut body = review(REQUEST).into_bytes();
        let at = body.windows(4).position(|w| w == b"u1\",").unwrap();
        let skipped = b"\"resource\":\"\xff\xfe\",";
        body.splice(at - 7..at - 7, skipped.iter().copied());
        assert!(std::str::from_utf8(&body).is_err());
        scan(&body).unwrap();
        // A label read must be UTF-8, and its surrogates paired.
        for bad in [
            &b"\xff"[..],
            br"\ud800",
            br"\udc00",
            br"\ud800\u0041",
            br"\ud800x",
        ] {
            let mut body = review(REQUEST).into_bytes();
            let at = body.windows(4).position(|w| w == br#""1","#).unwrap() + 1;
            body.splice(at..at + 1, bad.iter().copied());
            scan(&body).unwrap_err();
        }
    }

    #[test]
    fn unusual_forms_are_left_to_serde() {
        for request in [
            r#"["u",{"version":"v1","kind":"Node"}]"#,
            r#"{"uid":"u","kind":["","v1","Node"],"operation":"UPDATE"}"#,
            r#"{"uid":"u","kind":{"version":"v1","kind":"Node"},"operation":{"UPDATE":null}}"#,
        ] {
            assert!(
                matches!(
                    scan(review(request).as_bytes()),
                    Err(ScanError::Unusual { .. })
                ),
                "{request}"
            );
        }
    }

    #[test]
    fn skipped_values_may_nest_deeper_than_any_stack() {
        let depth = 100_000;
        let deep = format!("{}{}", "[{\"a\":".repeat(depth), "}]".repeat(depth));
        let deep = deep.replace(":}", ":1}");
        let body = review(&format!(
            r#"{{"resource":{deep},"uid":"u","kind":{{"version":"v1","kind":"Node"}},"operation":"UPDATE"}}"#
        ));
        scan(body.as_bytes()).unwrap();
        let unbalanced = body.replacen("}]", "]]", 1);
        scan(unbalanced.as_bytes()).unwrap_err();
    }

    #[test]
    fn an_unknown_operation_is_an_error() {
        let request = r#"{"uid":"u","kind":{"version":"v1","kind":"Node"},"operation":"update"}"#;
        assert_eq!(invalid(&review(request)), "unknown operation");
    }
}
