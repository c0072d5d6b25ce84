//! What the GPU Operator's `ClusterPolicy` (`nvidia.com/v1`) switches on and off.
//!
//! Read as plain JSON: only the `enabled` switches matter here, and a typed
//! copy of the operator's CRD would break with every operator release. A
//! switch that is absent takes the operator's own default
//! (`api/nvidia/v1/clusterpolicy_types.go`, the `IsEnabled` methods).

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::operands::{Operand, OperandSet};
use crate::policy::ClusterFacts;

/// Where each operand's switch lives, and its default when absent.
struct Switch {
    operand: Operand,
    field: &'static str,
    default: bool,
    /// Only deployed when `spec.sandboxWorkloads.enabled` is true as well.
    sandbox: bool,
}

const fn switch(operand: Operand, field: &'static str, default: bool, sandbox: bool) -> Switch {
    Switch {
        operand,
        field,
        default,
        sandbox,
    }
}

const SWITCHES: [Switch; 14] = [
    switch(Operand::Driver, "driver", true, false),
    switch(Operand::ContainerToolkit, "toolkit", true, false),
    switch(Operand::DevicePlugin, "devicePlugin", true, false),
    switch(Operand::GpuFeatureDiscovery, "gfd", true, false),
    switch(Operand::Dcgm, "dcgm", true, false),
    switch(Operand::DcgmExporter, "dcgmExporter", true, false),
    switch(
        Operand::NodeStatusExporter,
        "nodeStatusExporter",
        false,
        false,
    ),
    switch(Operand::MigManager, "migManager", true, false),
    switch(
        Operand::SandboxDevicePlugin,
        "sandboxDevicePlugin",
        false,
        true,
    ),
    switch(Operand::VfioManager, "vfioManager", false, true),
    switch(Operand::VgpuManager, "vgpuManager", false, true),
    switch(Operand::VgpuDeviceManager, "vgpuDeviceManager", false, true),
    switch(Operand::CcManager, "ccManager", false, true),
    switch(Operand::KataManager, "kataManager", false, true),
];

#[derive(Debug, thiserror::Error)]
pub enum ClusterPolicyError {
    #[error("cannot read ClusterPolicy file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("ClusterPolicy file {path} is neither JSON nor YAML: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error(
        "ClusterPolicy file {path}: expected a nvidia.com/v1 ClusterPolicy or a List of them, found {found}"
    )]
    NotAClusterPolicy { path: PathBuf, found: String },
    #[error("ClusterPolicy file {path}: the list has no items")]
    EmptyList { path: PathBuf },
    #[error("ClusterPolicy {name}: {field}: {problem}")]
    Field {
        name: String,
        field: String,
        problem: String,
    },
}

/// A ClusterPolicy, read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterPolicy {
    pub name: String,
    pub facts: ClusterFacts,
}

/// The facts one ClusterPolicy object gives, with every switch type-checked.
pub fn from_object(object: &Value) -> Result<ClusterPolicy, ClusterPolicyError> {
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("(unnamed)")
        .to_owned();
    let enabled = |field: &str, default: bool| -> Result<bool, ClusterPolicyError> {
        match object.pointer(&format!("/spec/{field}/enabled")) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(other) => Err(ClusterPolicyError::Field {
                name: name.clone(),
                field: format!("spec.{field}.enabled"),
                problem: format!("expected true or false, found {other}"),
            }),
        }
    };
    let sandbox = enabled("sandboxWorkloads", false)?;
    let mut disabled = OperandSet::EMPTY;
    for s in &SWITCHES {
        if !enabled(s.field, s.default)? || (s.sandbox && !sandbox) {
            disabled.insert(s.operand);
        }
    }
    // Both come with sandbox workloads; neither has a switch of its own.
    if !sandbox {
        disabled.insert(Operand::SandboxValidator);
        disabled.insert(Operand::KataSandboxDevicePlugin);
    }
    Ok(ClusterPolicy {
        name,
        facts: ClusterFacts {
            toolkit_managed: !disabled.contains(Operand::ContainerToolkit),
            disabled,
            ..ClusterFacts::default()
        },
    })
}

/// What the operator does without a word from a ClusterPolicy: every switch at its default
/// (node status exporter and sandbox operands off). The audit and the webhook fall back to
/// these facts when the ClusterPolicy is unknown.
pub fn operator_defaults() -> ClusterFacts {
    from_object(&Value::Object(serde_json::Map::new()))
        .map(|p| p.facts)
        .unwrap_or_default()
}

/// The one the operator acts on when there are several: it marks the others `ignored`.
pub fn choose(objects: &[Value]) -> Option<&Value> {
    let ignored = |o: &Value| o.pointer("/status/state").and_then(Value::as_str) == Some("ignored");
    let name = |o: &Value| {
        o.pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    objects.iter().min_by_key(|o| (ignored(o), name(o)))
}

/// Reads `kubectl get clusterpolicy -o yaml|json`: one object, or a List of them.
pub fn parse(text: &str, path: &Path) -> Result<ClusterPolicy, ClusterPolicyError> {
    let syntax = |message: String| ClusterPolicyError::Syntax {
        path: path.to_owned(),
        message,
    };
    let value: Value = if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|e| syntax(e.to_string()))?
    } else {
        serde_norway::from_str(text).map_err(|e| syntax(e.to_string()))?
    };
    let kind = value
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let api_version = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let not_one = |found: String| ClusterPolicyError::NotAClusterPolicy {
        path: path.to_owned(),
        found,
    };
    match kind {
        "ClusterPolicy" if api_version == "nvidia.com/v1" => from_object(&value),
        "List" | "ClusterPolicyList" => {
            let items = value
                .get("items")
                .and_then(Value::as_array)
                .ok_or_else(|| not_one(format!("a {kind} without items")))?;
            for item in items {
                let k = item.get("kind").and_then(Value::as_str);
                if !matches!(k, None | Some("ClusterPolicy")) {
                    return Err(not_one(format!(
                        "a {kind} holding a {}",
                        k.unwrap_or_default()
                    )));
                }
            }
            let chosen = choose(items).ok_or_else(|| ClusterPolicyError::EmptyList {
                path: path.to_owned(),
            })?;
            from_object(chosen)
        }
        "" => Err(not_one("an object without `kind`".to_owned())),
        other => Err(not_one(format!("{api_version} {other}"))),
    }
}

/// The facts a ClusterPolicy file gives, for `check --cluster-policy FILE`.
pub fn facts_from_cluster_policy_file(path: &Path) -> Result<ClusterFacts, ClusterPolicyError> {
    read_file(path).map(|p| p.facts)
}

/// Reads and parses a ClusterPolicy file.
pub fn read_file(path: &Path) -> Result<ClusterPolicy, ClusterPolicyError> {
    let text = std::fs::read_to_string(path).map_err(|source| ClusterPolicyError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse(&text, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(text: &str) -> Result<ClusterPolicy, ClusterPolicyError> {
        parse(text, Path::new("cp.yaml"))
    }

    #[test]
    fn an_empty_spec_takes_the_operators_defaults() {
        let p = parse_str(
            "apiVersion: nvidia.com/v1\nkind: ClusterPolicy\nmetadata:\n  name: cluster-policy\nspec: {}\n",
        )
        .unwrap();
        assert_eq!(p.name, "cluster-policy");
        assert!(p.facts.toolkit_managed);
        let off: Vec<&str> = p.facts.disabled.iter().map(Operand::name).collect();
        assert_eq!(
            off,
            [
                "node-status-exporter",
                "sandbox-device-plugin",
                "kata-sandbox-device-plugin",
                "sandbox-validator",
                "vfio-manager",
                "vgpu-manager",
                "vgpu-device-manager",
                "cc-manager",
                "kata-manager"
            ]
        );
    }

    #[test]
    fn the_operator_defaults_are_those_of_an_empty_spec() {
        let empty =
            parse_str("apiVersion: nvidia.com/v1\nkind: ClusterPolicy\nmetadata: {name: x}\n")
                .unwrap();
        assert_eq!(operator_defaults(), empty.facts);
        assert!(
            operator_defaults()
                .disabled
                .contains(Operand::NodeStatusExporter)
        );
        assert!(operator_defaults().toolkit_managed);
    }

    #[test]
    fn a_disabled_toolkit_means_the_host_provides_it() {
        let p = parse_str(
            r#"{"apiVersion":"nvidia.com/v1","kind":"ClusterPolicy","metadata":{"name":"cp"},
               "spec":{"toolkit":{"enabled":false},"dcgm":{"enabled":false},"nodeStatusExporter":{"enabled":true}}}"#,
        )
        .unwrap();
        assert!(!p.facts.toolkit_managed);
        assert!(p.facts.disabled.contains(Operand::ContainerToolkit));
        assert!(p.facts.disabled.contains(Operand::Dcgm));
        assert!(!p.facts.disabled.contains(Operand::NodeStatusExporter));
        assert!(!p.facts.disabled.contains(Operand::DevicePlugin));
    }

    #[test]
    fn sandbox_operands_need_sandbox_workloads_and_their_own_switch() {
        let p = parse_str(
            "apiVersion: nvidia.com/v1\nkind: ClusterPolicy\nmetadata: {name: cp}\nspec:\n  \
             sandboxWorkloads: {enabled: true}\n  vfioManager: {enabled: true}\n  \
             vgpuManager: {enabled: false}\n",
        )
        .unwrap();
        let d = p.facts.disabled;
        assert!(!d.contains(Operand::VfioManager));
        assert!(!d.contains(Operand::SandboxValidator));
        assert!(d.contains(Operand::VgpuManager));
        assert!(
            d.contains(Operand::SandboxDevicePlugin),
            "off unless switched on"
        );
    }

    #[test]
    fn a_list_from_kubectl_get_is_accepted_and_the_active_policy_chosen() {
        let p = parse_str(
            "apiVersion: v1\nkind: List\nitems:\n\
             - apiVersion: nvidia.com/v1\n  kind: ClusterPolicy\n  metadata: {name: a-old}\n  \
               spec: {devicePlugin: {enabled: false}}\n  status: {state: ignored}\n\
             - apiVersion: nvidia.com/v1\n  kind: ClusterPolicy\n  metadata: {name: cluster-policy}\n  \
               spec: {}\n  status: {state: ready}\n",
        )
        .unwrap();
        assert_eq!(p.name, "cluster-policy");
        assert!(!p.facts.disabled.contains(Operand::DevicePlugin));
    }

    #[test]
    fn bad_files_are_errors_naming_the_file_and_the_problem() {
        let cases = [
            (
                "apiVersion: v1\nkind: Node\nmetadata: {name: n}\n",
                "ClusterPolicy file cp.yaml: expected a nvidia.com/v1 ClusterPolicy or a List of them, found v1 Node",
            ),
            (
                "apiVersion: v1\nkind: List\nitems: []\n",
                "ClusterPolicy file cp.yaml: the list has no items",
            ),
            (
                "apiVersion: v1\nkind: List\nitems:\n- kind: Pod\n",
                "ClusterPolicy file cp.yaml: expected a nvidia.com/v1 ClusterPolicy or a List of them, found a List holding a Pod",
            ),
            (
                "apiVersion: nvidia.com/v1\nkind: ClusterPolicy\nmetadata: {name: cp}\nspec: {toolkit: {enabled: \"false\"}}\n",
                "ClusterPolicy cp: spec.toolkit.enabled: expected true or false, found \"false\"",
            ),
        ];
        for (text, want) in cases {
            let got = parse_str(text).unwrap_err().to_string();
            assert_eq!(got, want, "{text}");
        }
        let syntax = parse_str("{oops").unwrap_err().to_string();
        assert_eq!(
            syntax,
            "ClusterPolicy file cp.yaml is neither JSON nor YAML: key must be a string at line 1 column 2"
        );
        let missing = facts_from_cluster_policy_file(Path::new("/nonexistent/cp.yaml"))
            .unwrap_err()
            .to_string();
        assert!(
            missing.starts_with("cannot read ClusterPolicy file /nonexistent/cp.yaml: "),
            "{missing}"
        );
    }
}
