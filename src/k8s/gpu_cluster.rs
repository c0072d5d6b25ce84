//! What the GPU Operator's `GPUCluster` (`nvidia.com/v1alpha1`, v26.7 and later) says: that
//! the cluster runs the DRA stack, and which of its optional operands it switches off. Read as
//! plain JSON, like the ClusterPolicy (`docs/gpu-operator.md` §12).

use std::path::{Path, PathBuf};

use kube::api::ApiResource;
use serde_json::Value;

use super::document;
use crate::core::facts::gpu_cluster_switched_off;
use crate::core::operands::OperandSet;
use crate::core::placement::Toleration;

/// `nvidia.com/v1alpha1` GPUCluster, cluster-scoped, a singleton named `gpu-cluster`.
pub fn resource() -> ApiResource {
    ApiResource {
        group: "nvidia.com".into(),
        version: "v1alpha1".into(),
        api_version: "nvidia.com/v1alpha1".into(),
        kind: "GPUCluster".into(),
        plural: "gpuclusters".into(),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GpuClusterError {
    #[error("cannot read GPUCluster file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("GPUCluster file {path} is neither JSON nor YAML: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error(
        "GPUCluster file {path}: expected a nvidia.com/v1alpha1 GPUCluster or a List of them, found {found}"
    )]
    NotAGpuCluster { path: PathBuf, found: String },
    #[error("GPUCluster file {path}: the list has no items")]
    EmptyList { path: PathBuf },
    #[error("GPUCluster {name}: {field}: {problem}")]
    Field {
        name: String,
        field: String,
        problem: String,
    },
}

/// A GPUCluster, read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuCluster {
    pub name: String,
    /// The optional operands it switches off.
    pub disabled: OperandSet,
    /// `spec.daemonsets.tolerations`: all its DaemonSets tolerate (they carry no other).
    pub tolerations: Vec<Toleration>,
}

/// The GPUCluster one object gives, its switches type-checked.
pub fn from_object(object: &Value) -> Result<GpuCluster, GpuClusterError> {
    // What the webhook keeps of the object is all any reader reads.
    let kept = super::policy_object::kept(object);
    let object = &kept;
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("(unnamed)")
        .to_owned();
    let field_error = |field: String, problem: String| GpuClusterError::Field {
        name: name.clone(),
        field,
        problem,
    };
    let enabled = |field: &str, default: bool| -> Result<Option<bool>, GpuClusterError> {
        match object.pointer(&format!("/spec/{field}")) {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::Object(_)) => {}
            Some(other) => {
                return Err(field_error(
                    format!("spec.{field}"),
                    format!("expected an object, found {other}"),
                ));
            }
        }
        match object.pointer(&format!("/spec/{field}/enabled")) {
            None | Some(Value::Null) => Ok(Some(default)),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(field_error(
                format!("spec.{field}.enabled"),
                format!("expected true or false, found {other}"),
            )),
        }
    };
    let disabled = gpu_cluster_switched_off(enabled)?;
    let tolerations = super::cluster_policy::daemonset_tolerations(object).map_err(|problem| {
        field_error(super::cluster_policy::TOLERATIONS_FIELD.to_owned(), problem)
    })?;
    Ok(GpuCluster {
        name,
        disabled,
        tolerations,
    })
}

/// The GPUCluster a list gives, read: the operator allows one (its CRD insists on the name
/// `gpu-cluster`), so the first is the one; `None` for an empty list.
pub fn first(objects: &[Value]) -> Option<Result<GpuCluster, GpuClusterError>> {
    objects.first().map(from_object)
}

/// Reads `kubectl get gpucluster -o yaml|json`: one object, or a List of them.
pub fn parse(text: &str, path: &Path) -> Result<GpuCluster, GpuClusterError> {
    let value = document::json_or_yaml(text).map_err(|message| GpuClusterError::Syntax {
        path: path.to_owned(),
        message,
    })?;
    let not_one = |found: String| GpuClusterError::NotAGpuCluster {
        path: path.to_owned(),
        found,
    };
    match document::one_or_list(&value, "GPUCluster", "nvidia.com/v1alpha1").map_err(not_one)? {
        document::OneOrList::One(object) => from_object(object),
        document::OneOrList::List(items) => first(items).unwrap_or_else(|| {
            Err(GpuClusterError::EmptyList {
                path: path.to_owned(),
            })
        }),
    }
}

/// Reads a GPUCluster file (at most the config size, a regular file or standard input).
pub fn file(path: &Path) -> Result<GpuCluster, GpuClusterError> {
    let text = super::read::text(path).map_err(|source| GpuClusterError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse(&text, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::operands::Operand;

    fn read(text: &str) -> Result<GpuCluster, GpuClusterError> {
        parse(text, Path::new("gc.yaml"))
    }

    const HEAD: &str =
        "apiVersion: nvidia.com/v1alpha1\nkind: GPUCluster\nmetadata:\n  name: gpu-cluster\n";

    /// gpu-operator@v26.7.0: the standalone DCGM runs only with `spec.dcgm.enabled: true`;
    /// the exporter needs a `spec.dcgmExporter` object whose `enabled` is not false.
    #[test]
    fn the_switches_follow_the_operators_own_defaults() {
        let off = |spec: &str| -> Vec<&'static str> {
            read(&format!("{HEAD}spec:{spec}"))
                .unwrap()
                .disabled
                .iter()
                .map(Operand::name)
                .collect()
        };
        assert_eq!(off(" {}\n"), ["dcgm-dra", "dcgm-exporter-dra"]);
        assert_eq!(off("\n  dcgm: {}\n  dcgmExporter: {}\n"), ["dcgm-dra"]);
        assert_eq!(
            off("\n  dcgm:\n    enabled: true\n  dcgmExporter:\n    enabled: false\n"),
            ["dcgm-exporter-dra"]
        );
        let gc = read(&format!(
            "{HEAD}spec:\n  dcgmExporter:\n    enabled: true\n"
        ))
        .unwrap();
        assert_eq!(gc.name, "gpu-cluster");
    }

    #[test]
    fn bad_input_names_the_problem() {
        let err = |text: &str| read(text).unwrap_err().to_string();
        assert_eq!(
            err(&format!("{HEAD}spec:\n  dcgm:\n    enabled: \"yes\"\n")),
            "GPUCluster gpu-cluster: spec.dcgm.enabled: expected true or false, found \"yes\""
        );
        assert_eq!(
            err(&format!("{HEAD}spec:\n  dcgmExporter: true\n")),
            "GPUCluster gpu-cluster: spec.dcgmExporter: expected an object, found true"
        );
        assert_eq!(
            err("apiVersion: nvidia.com/v1\nkind: ClusterPolicy\n"),
            "GPUCluster file gc.yaml: expected a nvidia.com/v1alpha1 GPUCluster or a List of them, found nvidia.com/v1 ClusterPolicy"
        );
        assert_eq!(
            err("apiVersion: v1\nkind: List\nitems: []\n"),
            "GPUCluster file gc.yaml: the list has no items"
        );
        assert!(err("{").starts_with("GPUCluster file gc.yaml is neither JSON nor YAML"));
        let list = format!(
            "apiVersion: v1\nkind: List\nitems:\n- {}",
            HEAD.replace('\n', "\n  ").trim_end()
        );
        assert_eq!(read(&list).unwrap().name, "gpu-cluster");
    }
}
