//! A GPU-policy object (ClusterPolicy, NVIDIADriver, GPUCluster) with only the fields the
//! decisions read ([`keeps`]), wherever it comes from: an admission review's request, or the
//! watch, which keeps every such object this way. So a 1 MB NVIDIADriver costs its name, its
//! nodeSelector and three flags in every replica, not its whole tree, and a field the decision
//! starts to read is read the same way by the webhook and by the watch.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::ApiResource;
use kube::core::DynamicResourceScope;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::pruned::{self, Keep};
use crate::core::facts::SANDBOX_WORKLOADS;
use crate::core::operands::OPERANDS;
use crate::core::policy_change::HOST_TOOLKIT_ANNOTATION;

/// The fields under `spec` that reach the container toolkit's pod template alone
/// (`TransformToolkit`: `docs/gpu-operator.md` §13).
pub const TOOLKIT_TEMPLATE_FIELDS: [&str; 9] = [
    "toolkit.repository",
    "toolkit.image",
    "toolkit.version",
    "toolkit.imagePullPolicy",
    "toolkit.imagePullSecrets",
    "toolkit.env",
    "toolkit.resources",
    "toolkit.installDir",
    "cdi",
];

/// The fields under `spec` that reach every ClusterPolicy operand's pod template
/// (`applyCommonDaemonsetConfig`; the validator's image runs in every operand's validation
/// init container). `spec.daemonsets.updateStrategy` changes how a rollout goes, not the
/// template.
pub const EVERY_TEMPLATE_FIELDS: [&str; 9] = [
    "daemonsets.tolerations",
    "daemonsets.priorityClassName",
    "daemonsets.labels",
    "daemonsets.annotations",
    "validator.repository",
    "validator.image",
    "validator.version",
    "validator.imagePullPolicy",
    "validator.imagePullSecrets",
];

/// Whether `path` (under `spec`) is one of the template fields, which [`keeps`] keeps whole.
fn is_template_field(path: &[String]) -> bool {
    TOOLKIT_TEMPLATE_FIELDS
        .iter()
        .chain(&EVERY_TEMPLATE_FIELDS)
        .any(|field| field.split('.').eq(path.iter().map(String::as_str)))
}

/// The fields of a GPU-policy object that any decision reads: `cluster_policy::from_object`
/// and `choose` (`status.state`), `nvidia_driver::from_object`, `gpu_cluster::from_object`, the
/// host-toolkit annotation, and the resourceVersion the watch resumes from.
pub fn keeps(path: &[String]) -> Keep {
    let switch = |field: &str| {
        field == SANDBOX_WORKLOADS
            || OPERANDS
                .iter()
                .any(|i| i.switch.is_some_and(|s| s.field == field))
    };
    match path {
        [top] if top == "apiVersion" || top == "kind" => Keep::Value,
        [top] if top == "metadata" || top == "spec" || top == "status" => Keep::Fields,
        [m, f] if m == "metadata" && matches!(f.as_str(), "name" | "resourceVersion") => {
            Keep::Value
        }
        [m, a] if m == "metadata" && a == "annotations" => Keep::Fields,
        [m, a, key] if m == "metadata" && a == "annotations" && key == HOST_TOOLKIT_ANNOTATION => {
            Keep::Value
        }
        // Which ClusterPolicy the operator follows: it marks the others `ignored`.
        [s, f] if s == "status" && f == "state" => Keep::Value,
        // NVIDIADriver.
        [s, f]
            if s == "spec" && matches!(f.as_str(), "driverType" | "usePrecompiled" | "default") =>
        {
            Keep::Value
        }
        [s, f] if s == "spec" && f == "nodeSelector" => Keep::Fields,
        // NVIDIADriver: what its driver DaemonSets tolerate.
        [s, f] if s == "spec" && f == "tolerations" => Keep::Whole,
        [s, f, _] if s == "spec" && f == "nodeSelector" => Keep::Value,
        // ClusterPolicy: the fields that reach operand pod templates, whose change rolls them.
        [s, rest @ ..] if s == "spec" && is_template_field(rest) => Keep::Whole,
        // ClusterPolicy (and GPUCluster): the operand switches and the flags beside them.
        [s, f] if s == "spec" && (switch(f) || f == "validator") => Keep::Fields,
        [s, f, e] if s == "spec" && switch(f) && e == "enabled" => Keep::Value,
        [s, f, e] if s == "spec" && f == "driver" && e == "useNvidiaDriverCRD" => Keep::Value,
        // ClusterPolicy and GPUCluster: what every operand DaemonSet tolerates.
        [s, f] if s == "spec" && f == "daemonsets" => Keep::Fields,
        [s, f, t] if s == "spec" && f == "daemonsets" && t == "tolerations" => Keep::Whole,
        [s, f, e]
            if s == "spec" && f == SANDBOX_WORKLOADS && (e == "defaultWorkload" || e == "mode") =>
        {
            Keep::Value
        }
        _ => Keep::No,
    }
}

/// `object` with only the fields [`keeps`] names: what every reader of a GPU-policy object
/// reads (`cluster_policy::from_object`, `nvidia_driver::from_object`,
/// `gpu_cluster::from_object` start here), whether the object came whole (a file, a list) or
/// already pruned (the webhook, the watch). So a field a reader starts to read that [`keeps`]
/// does not name is missing everywhere, and the reader's own tests fail: the webhook cannot
/// drop what `check-policy` reads.
pub fn kept(object: &Value) -> Value {
    // A Value's fields are read as they are; only a duplicate key could fail, and a Value has
    // none.
    read(object).ok().flatten().unwrap_or(Value::Null)
}

/// Reads a GPU-policy object with only the fields [`keeps`] names; `null` is None.
pub fn read<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    pruned::read(d, keeps)
}

/// A watched GPU-policy object: its metadata (name and resourceVersion only) and the fields
/// [`keeps`] names, as JSON for the readers of each kind.
#[derive(Clone, Debug, Default)]
pub struct PolicyObject {
    pub metadata: ObjectMeta,
    pub fields: Value,
}

impl PolicyObject {
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    /// Roughly what it holds, in bytes: its fields as JSON.
    pub fn size(&self) -> usize {
        serde_json::to_vec(&self.fields).map_or(0, |v| v.len())
    }
}

impl<'de> Deserialize<'de> for PolicyObject {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let fields = read(d)?.unwrap_or(Value::Null);
        let text = |key: &str| {
            fields
                .pointer(&format!("/metadata/{key}"))
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        let metadata = ObjectMeta {
            name: text("name"),
            resource_version: text("resourceVersion"),
            ..ObjectMeta::default()
        };
        Ok(PolicyObject { metadata, fields })
    }
}

impl kube::Resource for PolicyObject {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn group(dt: &ApiResource) -> Cow<'_, str> {
        dt.group.as_str().into()
    }

    fn version(dt: &ApiResource) -> Cow<'_, str> {
        dt.version.as_str().into()
    }

    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        dt.kind.as_str().into()
    }

    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        dt.api_version.as_str().into()
    }

    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        dt.plural.as_str().into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::k8s::{cluster_policy, gpu_cluster, nvidia_driver};

    /// `object` read as the webhook and the watch read it.
    fn pruned(object: &Value) -> Value {
        let text = serde_json::to_string(object).unwrap();
        read(&mut serde_json::Deserializer::from_str(&text))
            .unwrap()
            .unwrap()
    }

    #[test]
    fn the_kept_fields_are_every_field_the_decision_reads() {
        // Every switch away from its default, and every other field the readers look at.
        let mut spec = serde_json::Map::new();
        for s in OPERANDS.iter().filter_map(|i| i.switch) {
            spec.insert(
                s.field.to_owned(),
                json!({"enabled": !s.default, "image": "x"}),
            );
        }
        spec.insert(
            SANDBOX_WORKLOADS.to_owned(),
            json!({"enabled": true, "defaultWorkload": "vm-vgpu", "mode": "kata", "other": 1}),
        );
        spec["driver"]["useNvidiaDriverCRD"] = json!(true);
        spec.insert(
            "cdi".into(),
            json!({"enabled": true, "nriPluginEnabled": true}),
        );
        // Every field that reaches an operand's pod template, whole.
        for field in TOOLKIT_TEMPLATE_FIELDS.iter().chain(&EVERY_TEMPLATE_FIELDS) {
            if let Some((parent, leaf)) = field.split_once('.') {
                let parent = spec.entry(parent).or_insert_with(|| json!({}));
                parent[leaf] = if *field == "daemonsets.tolerations" {
                    json!([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
                } else {
                    json!([{"set": field, "nested": {"b": 1, "a": [2]}}])
                };
            }
        }
        let policy = json!({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
            "metadata": {"name": "cp", "labels": {"a": "b"}, "resourceVersion": "7",
                         "annotations": {HOST_TOOLKIT_ANNOTATION: "why", "other": "x"}},
            "spec": spec, "status": {"state": "ignored", "conditions": [1, 2]}});
        let kept = pruned(&policy);
        assert_eq!(
            cluster_policy::from_object(&kept).unwrap(),
            cluster_policy::from_object(&policy).unwrap()
        );
        let inputs = cluster_policy::from_object(&kept)
            .unwrap()
            .facts
            .templates
            .inputs;
        assert_eq!(
            (inputs.toolkit.len(), inputs.every.len()),
            (TOOLKIT_TEMPLATE_FIELDS.len(), EVERY_TEMPLATE_FIELDS.len()),
            "{inputs:?}"
        );
        assert_eq!(
            kept.pointer("/metadata/annotations"),
            Some(&json!({HOST_TOOLKIT_ANNOTATION: "why"}))
        );
        assert_eq!(kept.pointer("/status"), Some(&json!({"state": "ignored"})));
        assert!(kept.pointer("/metadata/labels").is_none());
        // `choose` reads the state: an ignored one is followed last.
        let followed = json!({"metadata": {"name": "z"}});
        let objects = [kept.clone(), followed];
        assert_eq!(
            cluster_policy::choose(&objects).and_then(|o| o.pointer("/metadata/name")),
            Some(&json!("z"))
        );

        let driver = json!({"apiVersion": "nvidia.com/v1alpha1", "kind": "NVIDIADriver",
            "metadata": {"name": "d"},
            "spec": {"driverType": "vgpu-host-manager", "usePrecompiled": true, "default": true,
                     "nodeSelector": {"pool": "a"}, "image": "driver", "env": [{"name": "x"}]}});
        assert_eq!(
            nvidia_driver::from_object(&pruned(&driver)).unwrap(),
            nvidia_driver::from_object(&driver).unwrap()
        );

        let gc = json!({"apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster",
            "metadata": {"name": "g"},
            "spec": {"dcgm": {"enabled": true, "image": "x"}, "dcgmExporter": {"image": "y"}}});
        assert_eq!(
            gpu_cluster::from_object(&pruned(&gc)).unwrap(),
            gpu_cluster::from_object(&gc).unwrap()
        );
    }

    #[test]
    fn a_watched_object_keeps_its_name_and_resource_version_and_nothing_large() {
        let big = "x".repeat(1 << 20);
        let text = serde_json::to_string(
            &json!({"apiVersion": "nvidia.com/v1alpha1", "kind": "NVIDIADriver",
            "metadata": {"name": "d", "resourceVersion": "42", "annotations": {"big": big}},
            "spec": {"nodeSelector": {"pool": "a"}, "licensingConfig": {"secretName": big}}}),
        )
        .unwrap();
        let object: PolicyObject = serde_json::from_str(&text).unwrap();
        assert_eq!(object.name(), "d");
        assert_eq!(object.metadata.resource_version.as_deref(), Some("42"));
        assert!(object.size() < 200, "{} bytes kept", object.size());
    }
}
