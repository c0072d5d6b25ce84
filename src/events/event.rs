//! One Event as the API takes it: an events.k8s.io/v1 `Event` regarding a Node.
//!
//! Made so that `kubectl describe node X` lists it: kubectl looks for a Node's Events in every
//! namespace by `involvedObject` kind, name and an empty namespace, once with the Node's uid
//! and once with its name as the uid (what the kubelet writes). So `regarding` names the Node
//! with its name as uid (no lookup of the real uid), and the Event lives in `default`, where
//! the API wants an Event about a cluster-scoped object (`default` or `kube-system`).
//!
//! The API's limits (events.k8s.io/v1 validation): `reportingController` a qualified name,
//! `reportingInstance`, `action` and `reason` at most 128 characters, `note` at most 1 kB.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;

use super::limit::Source;
use crate::core::rules::Rule;

/// Where the Events about Nodes are written.
pub const NAMESPACE: &str = "default";

/// `reportingController` (a qualified name, as the API requires; `kubectl describe` shows it
/// as `From`).
pub const CONTROLLER: &str = "nvidia.com/gpu-deploy-guard";

/// The API's limit on `note`, in bytes.
pub const NOTE_LIMIT: usize = 1024;

/// The API's limit on `reportingInstance`, `action` and `reason`.
pub const SHORT_LIMIT: usize = 128;

/// Object names the API takes; the server adds 5 characters to a `generateName` cut to 58.
const GENERATE_NAME_LIMIT: usize = 58;

/// What the recorder sends: everything but the time, which it takes when it sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeEvent {
    pub node: Box<str>,
    pub rule: Rule,
    pub source: Source,
    /// Already within [`NOTE_LIMIT`].
    pub note: String,
}

impl NodeEvent {
    pub fn new(node: &str, rule: Rule, source: Source, note: &str) -> Self {
        NodeEvent {
            node: node.into(),
            rule,
            source,
            note: bounded_note(note),
        }
    }

    /// The events.k8s.io/v1 Event, written by `instance` at `now`.
    pub fn to_k8s(&self, instance: &str, now: Timestamp) -> Event {
        Event {
            metadata: ObjectMeta {
                namespace: Some(NAMESPACE.to_owned()),
                generate_name: Some(generate_name(&self.node)),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(now)),
            type_: Some("Warning".to_owned()),
            reason: Some(reason(self.rule)),
            action: Some(self.source.action().to_owned()),
            note: Some(self.note.clone()),
            regarding: Some(ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Node".to_owned()),
                name: Some(self.node.to_string()),
                // kubectl's describe of a Node finds its Events by this uid (module doc).
                uid: Some(self.node.to_string()),
                ..ObjectReference::default()
            }),
            reporting_controller: Some(CONTROLLER.to_owned()),
            reporting_instance: Some(cut(instance, SHORT_LIMIT).to_owned()),
            ..Event::default()
        }
    }
}

/// The rule's id in CamelCase, as `kubectl get events` shows reasons
/// (`device-plugin-without-toolkit` → `DevicePluginWithoutToolkit`).
pub fn reason(rule: Rule) -> String {
    rule.id()
        .split('-')
        .map(|word| {
            let mut chars = word.chars();
            match chars.next() {
                Some(first) => first.to_ascii_uppercase().to_string() + chars.as_str(),
                None => String::new(),
            }
        })
        .collect()
}

/// `note` within [`NOTE_LIMIT`] bytes, cut on a character boundary with a mark.
pub fn bounded_note(note: &str) -> String {
    if note.len() <= NOTE_LIMIT {
        return note.to_owned();
    }
    const MARK: &str = "…";
    let mut out = cut(note, NOTE_LIMIT - MARK.len()).to_owned();
    out.push_str(MARK);
    out
}

/// The longest prefix of `text` of at most `max` bytes that ends on a character boundary.
fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// `<node>-`, the node's name cut to what the server keeps of a `generateName`; it appends five
/// random characters, so two Events of one node in one instant never collide. The API checks
/// the prefix as a DNS subdomain whose one trailing dash is allowed (not a dot: `lab-node-2.`
/// is refused), so a cut name first loses its trailing dashes and dots.
fn generate_name(node: &str) -> String {
    let mut name = cut(node, GENERATE_NAME_LIMIT - 1)
        .trim_end_matches(['-', '.'])
        .to_owned();
    name.push('-');
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reason_is_the_rule_id_in_camel_case() {
        assert_eq!(
            reason(Rule::DevicePluginWithoutToolkit),
            "DevicePluginWithoutToolkit"
        );
        assert_eq!(reason(Rule::NfdLabelsLost), "NfdLabelsLost");
        for rule in Rule::all() {
            let r = reason(rule);
            assert!(r.len() <= SHORT_LIMIT && !r.contains('-'), "{r}");
            assert!(r.starts_with(|c: char| c.is_ascii_uppercase()), "{r}");
        }
    }

    #[test]
    fn a_long_note_is_cut_to_one_kilobyte_on_a_character_boundary() {
        // 3-byte characters: 1024 is not a boundary.
        let long = "ü€".repeat(400);
        let note = bounded_note(&long);
        assert!(note.len() <= NOTE_LIMIT, "{}", note.len());
        assert!(note.len() > NOTE_LIMIT - 8, "{}", note.len());
        assert!(note.ends_with('…'));
        assert!(long.starts_with(note.trim_end_matches('…')));
        let short = "node n: fine";
        assert_eq!(bounded_note(short), short);
        let exact = "x".repeat(NOTE_LIMIT);
        assert_eq!(bounded_note(&exact), exact);
    }

    #[test]
    fn the_event_regards_the_node_as_kubectl_describe_looks_for_it() {
        let e = NodeEvent::new(
            "lab-node-2",
            Rule::DevicePluginWithoutToolkit,
            Source::Refusal,
            "refused",
        );
        let now = Timestamp::from_second(1_700_000_000).unwrap();
        let k = e.to_k8s("gdg-7d9f-abcde", now);
        let regarding = k.regarding.clone().unwrap();
        assert_eq!(
            (
                regarding.kind.as_deref(),
                regarding.api_version.as_deref(),
                regarding.name.as_deref(),
                regarding.uid.as_deref(),
                regarding.namespace.as_deref(),
            ),
            (
                Some("Node"),
                Some("v1"),
                Some("lab-node-2"),
                Some("lab-node-2"),
                None
            )
        );
        assert_eq!(k.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(k.metadata.generate_name.as_deref(), Some("lab-node-2-"));
        assert_eq!(k.metadata.name, None);
        assert_eq!(k.type_.as_deref(), Some("Warning"));
        assert_eq!(k.reason.as_deref(), Some("DevicePluginWithoutToolkit"));
        assert_eq!(k.action.as_deref(), Some("Refuse"));
        assert_eq!(k.note.as_deref(), Some("refused"));
        assert_eq!(
            k.reporting_controller.as_deref(),
            Some("nvidia.com/gpu-deploy-guard")
        );
        assert_eq!(k.reporting_instance.as_deref(), Some("gdg-7d9f-abcde"));
        assert_eq!(k.event_time, Some(MicroTime(now)));
        let audit = NodeEvent::new("n", Rule::NfdLabelsLost, Source::Audit, "x");
        assert_eq!(audit.to_k8s("i", now).action.as_deref(), Some("Audit"));
    }

    #[test]
    fn long_names_are_cut_to_what_the_api_takes() {
        let node = "a".repeat(253);
        let k = NodeEvent::new(&node, Rule::NfdLabelsLost, Source::Audit, "x")
            .to_k8s(&"p".repeat(300), Timestamp::UNIX_EPOCH);
        let prefix = k.metadata.generate_name.unwrap();
        assert_eq!(prefix.len(), GENERATE_NAME_LIMIT);
        assert!(prefix.ends_with('-'));
        // Cut after a dash or a dot: one dash, after a letter.
        let dashed = format!("{}-b", "a".repeat(56));
        let e = NodeEvent::new(&dashed, Rule::NfdLabelsLost, Source::Audit, "x");
        let prefix = e.to_k8s("i", Timestamp::UNIX_EPOCH).metadata.generate_name;
        assert_eq!(prefix.unwrap(), format!("{}-", "a".repeat(56)));
        let dotted = format!("{}.b", "a".repeat(56));
        let e = NodeEvent::new(&dotted, Rule::NfdLabelsLost, Source::Audit, "x");
        let prefix = e.to_k8s("i", Timestamp::UNIX_EPOCH).metadata.generate_name;
        assert_eq!(prefix.unwrap(), format!("{}-", "a".repeat(56)));
        assert_eq!(k.reporting_instance.unwrap().len(), SHORT_LIMIT);
        // The reference keeps the whole name: it is how the Node is found.
        assert_eq!(k.regarding.unwrap().name.unwrap(), node);
    }
}
