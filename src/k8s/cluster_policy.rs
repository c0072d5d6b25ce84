//! What the GPU Operator's `ClusterPolicy` (`nvidia.com/v1`) switches on and off.
//!
//! Read as plain JSON: only the `enabled` switches matter here, and a typed
//! copy of the operator's CRD would break with every operator release. Which
//! switch belongs to which operand, and its default when absent, are columns of
//! the operand table ([`crate::core::operands::OPERANDS`]).

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::document;
use super::placement::tolerations_of;
use super::policy_object::{EVERY_TEMPLATE_FIELDS, TOOLKIT_TEMPLATE_FIELDS};
use crate::core::facts::{ClusterFacts, switched_off};
use crate::core::operands::Operand;
use crate::core::operands::{SandboxMode, Workload};
use crate::core::operator::Sandbox;
use crate::core::placement::{TemplateInputs, Templates, Toleration};
use crate::core::policy_change::HOST_TOOLKIT_ANNOTATION;

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
    // What the webhook keeps of the object is all any reader reads.
    let kept = super::policy_object::kept(object);
    let object = &kept;
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
    let disabled = switched_off(enabled)?;
    let text = |field: &str| -> Result<Option<&str>, ClusterPolicyError> {
        match object.pointer(&format!("/spec/sandboxWorkloads/{field}")) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(other) => Err(ClusterPolicyError::Field {
                name: name.clone(),
                field: format!("spec.sandboxWorkloads.{field}"),
                problem: format!("expected a string, found {other}"),
            }),
        }
    };
    // An invalid default workload counts as none (`isValidWorkloadConfig`); the CRD defaults
    // the mode to kubevirt.
    let sandbox = Sandbox {
        enabled: !disabled.contains(Operand::SandboxValidator),
        default_workload: text("defaultWorkload")?.and_then(Workload::parse),
        mode: match text("mode")? {
            Some("kata") => SandboxMode::Kata,
            _ => SandboxMode::KubeVirt,
        },
    };
    let given = |field: &str| -> Result<Option<bool>, ClusterPolicyError> {
        match object.pointer(&format!("/spec/{}", field.replace('.', "/"))) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(ClusterPolicyError::Field {
                name: name.clone(),
                field: format!("spec.{field}"),
                problem: format!("expected true or false, found {other}"),
            }),
        }
    };
    let flag = |field: &str| Ok::<_, ClusterPolicyError>(given(field)?.unwrap_or(false));
    let driver_crd = flag("driver.useNvidiaDriverCRD")?;
    let nri_plugin = flag("cdi.nriPluginEnabled")?;
    // Its default is the operator version's (`ClusterFacts::cdi_enabled`).
    let cdi = given("cdi.enabled")?;
    let policy_tolerations =
        daemonset_tolerations(object).map_err(|problem| ClusterPolicyError::Field {
            name: name.clone(),
            field: TOLERATIONS_FIELD.to_owned(),
            problem,
        })?;
    Ok(ClusterPolicy {
        name,
        facts: ClusterFacts {
            sandbox,
            driver_crd,
            nri_plugin,
            cdi,
            templates: Templates {
                policy_tolerations,
                inputs: template_inputs(object),
                ..Templates::default()
            },
            ..ClusterFacts::from_switches(disabled)
        },
    })
}

/// The template fields `object` sets, each as canonical JSON.
fn template_inputs(object: &Value) -> TemplateInputs {
    let read = |fields: &[&str]| -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = fields
            .iter()
            .filter_map(|field| {
                let value = object.pointer(&format!("/spec/{}", field.replace('.', "/")))?;
                (!value.is_null()).then(|| (format!("spec.{field}"), canonical(value)))
            })
            .collect();
        out.sort();
        out
    };
    TemplateInputs {
        toolkit: read(&TOOLKIT_TEMPLATE_FIELDS),
        every: read(&EVERY_TEMPLATE_FIELDS),
    }
}

/// `value` as JSON with every object's keys sorted, so that two objects differing only in the
/// order of their keys give the same text.
fn canonical(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let fields: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{}:{}", Value::String(k.clone()), canonical(&map[k])))
                .collect();
            format!("{{{}}}", fields.join(","))
        }
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(canonical).collect();
            format!("[{}]", items.join(","))
        }
        other => other.to_string(),
    }
}

/// Where a ClusterPolicy (and a GPUCluster) lists what every operand DaemonSet tolerates.
pub const TOLERATIONS_FIELD: &str = "spec.daemonsets.tolerations";

/// `spec.daemonsets.tolerations` of a ClusterPolicy or GPUCluster object, checked as the API
/// server checks a toleration; empty when unset.
pub fn daemonset_tolerations(object: &Value) -> Result<Vec<Toleration>, String> {
    tolerations_of(
        object.pointer("/spec/daemonsets/tolerations"),
        TOLERATIONS_FIELD,
    )
    .map_err(|e| {
        e.trim_start_matches(TOLERATIONS_FIELD)
            .trim_start_matches(": ")
            .to_owned()
    })
}

/// The facts of `cluster` with the switches `object` (a ClusterPolicy) gives, in its name:
/// the cluster as it is once the object is applied.
pub fn applied(cluster: &ClusterFacts, object: &Value) -> Result<ClusterFacts, ClusterPolicyError> {
    let p = from_object(object)?;
    Ok(cluster.with_cluster_policy(&p.name, &p.facts))
}

/// The reason a ClusterPolicy object gives for bringing the container toolkit with the hosts
/// ([`HOST_TOOLKIT_ANNOTATION`]), as given.
pub fn host_toolkit(object: Option<&Value>) -> Option<&str> {
    object?
        .pointer("/metadata/annotations")?
        .get(HOST_TOOLKIT_ANNOTATION)?
        .as_str()
}

/// The one the operator acts on when there are several: it marks the others `ignored`.
pub fn choose(objects: &[Value]) -> Option<&Value> {
    in_turn(objects).into_iter().next()
}

/// The ClusterPolicies in the order the operator would follow them: the one it follows, then
/// the one it follows once that is deleted, and so on (not `ignored` first, then by name).
pub fn in_turn(objects: &[Value]) -> Vec<&Value> {
    let ignored = |o: &Value| o.pointer("/status/state").and_then(Value::as_str) == Some("ignored");
    let name = |o: &Value| {
        o.pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let mut all: Vec<&Value> = objects.iter().collect();
    all.sort_by_cached_key(|o| (ignored(o), name(o)));
    all
}

/// Reads `kubectl get clusterpolicy -o yaml|json`: one object, or a List of them.
pub fn parse(text: &str, path: &Path) -> Result<ClusterPolicy, ClusterPolicyError> {
    let syntax = |message: String| ClusterPolicyError::Syntax {
        path: path.to_owned(),
        message,
    };
    let value = document::json_or_yaml(text).map_err(syntax)?;
    let not_one = |found: String| ClusterPolicyError::NotAClusterPolicy {
        path: path.to_owned(),
        found,
    };
    match document::one_or_list(&value, "ClusterPolicy", "nvidia.com/v1").map_err(not_one)? {
        document::OneOrList::One(object) => from_object(object),
        document::OneOrList::List(items) => {
            let chosen = choose(items).ok_or_else(|| ClusterPolicyError::EmptyList {
                path: path.to_owned(),
            })?;
            from_object(chosen)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_fields_are_read_in_canonical_form_and_a_reordering_rolls_nothing() {
        let cp = |resources: &str| {
            let text = format!(
                r#"{{"apiVersion":"nvidia.com/v1","kind":"ClusterPolicy","metadata":{{"name":"cp"}},
                "spec":{{"toolkit":{{"enabled":true,"version":"v1.17.0","resources":{resources}}},
                "devicePlugin":{{"version":"v0.17.0"}}}}}}"#
            );
            from_object(&serde_json::from_str(&text).unwrap())
                .unwrap()
                .facts
                .templates
                .inputs
        };
        let a = cp(r#"{"limits":{"cpu":"1","memory":"1Gi"}}"#);
        let b = cp(r#"{"limits":{"memory":"1Gi","cpu":"1"}}"#);
        assert_eq!(
            a.toolkit,
            vec![
                (
                    "spec.toolkit.resources".to_owned(),
                    r#"{"limits":{"cpu":"1","memory":"1Gi"}}"#.to_owned()
                ),
                ("spec.toolkit.version".to_owned(), r#""v1.17.0""#.to_owned()),
            ]
        );
        assert!(
            a.every.is_empty(),
            "the device plugin's version is not read"
        );
        assert_eq!(a.rollout(&b).changed, Vec::<String>::new());
        let c = cp(r#"{"limits":{"cpu":"2","memory":"1Gi"}}"#);
        assert_eq!(
            a.rollout(&c).changed,
            vec![
                r#"spec.toolkit.resources: {"limits":{"cpu":"1","memory":"1Gi"}} -> {"limits":{"cpu":"2","memory":"1Gi"}}"#
            ]
        );
    }
    use crate::core::facts::operator_defaults;
    use crate::core::operands::Operand;

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
    fn sandbox_workloads_give_the_default_workload_and_mode() {
        let p = parse_str(
            "apiVersion: nvidia.com/v1\nkind: ClusterPolicy\nmetadata: {name: x}\n\
             spec: {sandboxWorkloads: {enabled: true, defaultWorkload: vm-vgpu, mode: kata}}\n",
        )
        .unwrap();
        assert!(p.facts.sandbox.enabled);
        assert_eq!(p.facts.sandbox.default_workload, Some(Workload::VmVgpu));
        assert_eq!(p.facts.sandbox.mode, SandboxMode::Kata);
        // An invalid default workload counts as none; the mode defaults to kubevirt.
        let p = parse_str(
            "apiVersion: nvidia.com/v1\nkind: ClusterPolicy\nmetadata: {name: x}\n\
             spec: {sandboxWorkloads: {enabled: true, defaultWorkload: bogus}}\n",
        )
        .unwrap();
        assert_eq!(p.facts.sandbox.default_workload, None);
        assert_eq!(p.facts.sandbox.mode, SandboxMode::KubeVirt);
        let bad = parse_str(
            "apiVersion: nvidia.com/v1\nkind: ClusterPolicy\nmetadata: {name: x}\n\
             spec: {sandboxWorkloads: {mode: 3}}\n",
        )
        .unwrap_err();
        assert!(
            bad.to_string().contains("spec.sandboxWorkloads.mode"),
            "{bad}"
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
            (
                "apiVersion: nvidia.com/v1\nkind: ClusterPolicy\nmetadata: {name: cp}\nspec: {cdi: {nriPluginEnabled: 1}}\n",
                "ClusterPolicy cp: spec.cdi.nriPluginEnabled: expected true or false, found 1",
            ),
            (
                "apiVersion: nvidia.com/v1\nkind: ClusterPolicy\nmetadata: {name: cp}\nspec: {cdi: {enabled: \"off\"}}\n",
                "ClusterPolicy cp: spec.cdi.enabled: expected true or false, found \"off\"",
            ),
            (
                "apiVersion: nvidia.com/v1\nkind: ClusterPolicy\nmetadata: {name: cp}\nspec: {driver: {useNvidiaDriverCRD: yes}}\n",
                "ClusterPolicy cp: spec.driver.useNvidiaDriverCRD: expected true or false, found \"yes\"",
            ),
        ];
        let nri = parse_str(
            "apiVersion: nvidia.com/v1\nkind: ClusterPolicy\nmetadata: {name: cp}\nspec: {cdi: {nriPluginEnabled: true}}\n",
        )
        .unwrap();
        assert!(nri.facts.nri_plugin && !nri.facts.driver_crd);
        // `spec.cdi.enabled` as given, unset kept apart: its default is the version's.
        for (spec, cdi) in [
            ("{cdi: {enabled: false}}", Some(false)),
            ("{cdi: {enabled: true, default: true}}", Some(true)),
            ("{cdi: {}}", None),
            ("{}", None),
        ] {
            let p = parse_str(&format!(
                "apiVersion: nvidia.com/v1\nkind: ClusterPolicy\nmetadata: {{name: cp}}\nspec: {spec}\n"
            ))
            .unwrap();
            assert_eq!(p.facts.cdi, cdi, "{spec}");
        }
        for (text, want) in cases {
            let got = parse_str(text).unwrap_err().to_string();
            assert_eq!(got, want, "{text}");
        }
        let syntax = parse_str("{oops").unwrap_err().to_string();
        assert_eq!(
            syntax,
            "ClusterPolicy file cp.yaml is neither JSON nor YAML: key must be a string at line 1 column 2"
        );
    }
}
