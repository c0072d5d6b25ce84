//! The part of a Node object the decision reads: its name, labels, taints and cordon, and the
//! NVIDIA GPUs its status advertises.
//!
//! A real Node carries kilobytes of status (images, conditions) and
//! managedFields. Deserializing into [`NodeView`] skips all of it without
//! building it, and fails with a path when a label value is not a string.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Deserializer, Serialize};

use super::document;
use super::meta::PartialMeta;
use super::placement::RawNodeSpec;
use crate::core::advertised::{Advertised, gpu_count, is_gpu_resource};
use crate::core::operands::Labels;
use crate::core::placement::NodePlacement;

/// A Node reduced to what gpu-deploy-guard needs.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct NodeView {
    #[serde(default, deserialize_with = "partial_meta")]
    pub metadata: ObjectMeta,
    /// `spec.taints` and `spec.unschedulable`.
    #[serde(
        default,
        rename = "spec",
        deserialize_with = "node_spec",
        skip_serializing
    )]
    pub placement: NodePlacement,
    /// What `status.capacity` and `status.allocatable` advertise of NVIDIA GPUs; `None` when
    /// the object carries no `status.allocatable` (a file without status).
    #[serde(
        default,
        rename = "status",
        deserialize_with = "node_status",
        skip_serializing
    )]
    pub advertised: Option<Advertised>,
}

/// A Node's `status`, reduced to its NVIDIA GPU resources; the rest (images, conditions) is
/// skipped without being built.
#[derive(Default, Deserialize)]
struct RawNodeStatus {
    #[serde(default)]
    capacity: Option<GpuResources>,
    #[serde(default)]
    allocatable: Option<GpuResources>,
}

/// A resource list's NVIDIA GPU resources: whether there were any, and their summed count.
#[derive(Default)]
struct GpuResources {
    listed: bool,
    count: u32,
}

impl<'de> Deserialize<'de> for GpuResources {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<GpuResources, D::Error> {
        struct Resources;
        impl<'de> serde::de::Visitor<'de> for Resources {
            type Value = GpuResources;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map of resource names to quantities")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<GpuResources, A::Error> {
                let mut out = GpuResources::default();
                while let Some(gpu) = map.next_key::<IsGpu>()? {
                    if gpu.0 {
                        let quantity: String = map.next_value()?;
                        out.listed = true;
                        out.count = out.count.saturating_add(gpu_count(&quantity));
                    } else {
                        map.next_value::<serde::de::IgnoredAny>()?;
                    }
                }
                Ok(out)
            }
        }
        d.deserialize_map(Resources)
    }
}

/// A resource name, read only for whether it is an NVIDIA GPU resource (no copy of the others).
struct IsGpu(bool);

impl<'de> Deserialize<'de> for IsGpu {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<IsGpu, D::Error> {
        struct Name;
        impl serde::de::Visitor<'_> for Name {
            type Value = IsGpu;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a resource name")
            }
            fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<IsGpu, E> {
                Ok(IsGpu(is_gpu_resource(name)))
            }
        }
        d.deserialize_str(Name)
    }
}

fn node_status<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Advertised>, D::Error> {
    let raw = Option::<RawNodeStatus>::deserialize(d)?.unwrap_or_default();
    // What is allocatable decides; a status without it (a hand-written file) says nothing.
    let Some(allocatable) = raw.allocatable else {
        return Ok(None);
    };
    let capacity = raw.capacity.unwrap_or_default();
    Ok(Some(Advertised {
        listed: capacity.listed || allocatable.listed,
        capacity: capacity.count,
        allocatable: allocatable.count,
    }))
}

fn node_spec<'de, D: Deserializer<'de>>(d: D) -> Result<NodePlacement, D::Error> {
    Ok(Option::<RawNodeSpec>::deserialize(d)?
        .unwrap_or_default()
        .into())
}

/// The metadata of a Node: [`PartialMeta`] with every label.
pub(crate) fn partial_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let (mut meta, labels, _) = PartialMeta::<Option<Labels>>::deserialize(d)?.into_parts();
    meta.labels = labels;
    Ok(meta)
}

/// Nodes per list page: a whole Node is 20–30 KB (up to ~180 KB with many images; FLEET.md),
/// and kube's client holds a page twice while it reads it, so 50 keep a page near 2–3 MB.
pub const NODE_PAGE_SIZE: u32 = 50;

impl NodeView {
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    pub fn labels(&self) -> &Labels {
        static EMPTY: Labels = BTreeMap::new();
        self.metadata.labels.as_ref().unwrap_or(&EMPTY)
    }
}

// Whole Nodes on the wire, not `PartialObjectMetadata`: the taints are in `spec`, and no field
// selector or second narrow watch can give them (the API filters Nodes by `metadata.name` and
// `spec.unschedulable` only). What the view does not read (status, images) is skipped by the
// deserializer without being built, and the lists' pages are smaller for it
// ([`NODE_PAGE_SIZE`](crate::k8s::node::NODE_PAGE_SIZE)).
partial_resource!(NodeView, k8s_openapi::ClusterResourceScope, kind: "Node", group: "", version: "v1", plural: "nodes");

#[derive(Debug, thiserror::Error)]
pub enum NodeFileError {
    #[error("cannot read {source_name}: {error}")]
    Read {
        source_name: String,
        error: std::io::Error,
    },
    #[error("{source_name} is neither JSON nor YAML: {message}")]
    Syntax {
        source_name: String,
        message: String,
    },
    #[error("{source_name}: expected a Node (kind: Node, apiVersion: v1), found {found}")]
    NotANode { source_name: String, found: String },
    #[error("{source_name}: {path}: {message}")]
    Field {
        source_name: String,
        path: String,
        message: String,
    },
}

/// A Node as `kubectl get node X -o json|yaml` writes it, or one item of a NodeList.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct NodeFile {
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    pub(crate) kind: Option<String>,
    #[serde(default, deserialize_with = "partial_meta")]
    pub(crate) metadata: ObjectMeta,
    #[serde(default, deserialize_with = "node_spec")]
    pub(crate) spec: NodePlacement,
    #[serde(default, deserialize_with = "node_status")]
    pub(crate) status: Option<Advertised>,
}

/// Reads a Node from JSON or YAML text; `source_name` names the file in errors.
pub fn parse_node(text: &str, source_name: &str) -> Result<NodeView, NodeFileError> {
    let value = document::json_or_yaml(text).map_err(|message| NodeFileError::Syntax {
        source_name: source_name.to_owned(),
        message,
    })?;
    let file: NodeFile = serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        NodeFileError::Field {
            source_name: source_name.to_owned(),
            path,
            message: e.into_inner().to_string(),
        }
    })?;
    let kind = file.kind.as_deref().unwrap_or_default();
    let api_version = file.api_version.as_deref().unwrap_or_default();
    if kind != "Node" || api_version != "v1" {
        let found = if kind.is_empty() {
            "an object without `kind`".to_owned()
        } else {
            format!("{api_version} {kind}")
        };
        return Err(NodeFileError::NotANode {
            source_name: source_name.to_owned(),
            found,
        });
    }
    Ok(NodeView {
        metadata: file.metadata,
        placement: file.spec,
        advertised: file.status,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_and_yaml_nodes_give_name_and_labels() {
        let json = r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"n1","labels":{"a":"b"},
            "managedFields":[{"fieldsV1":{"f:metadata":{}}}]},"status":{"images":[{"names":["x"]}]}}"#;
        let node = parse_node(json, "n1.json").unwrap();
        assert_eq!(node.name(), "n1");
        assert_eq!(node.labels().get("a").map(String::as_str), Some("b"));
        let yaml = "apiVersion: v1\nkind: Node\nmetadata:\n  name: n2\n  labels:\n    a: b\n";
        assert_eq!(parse_node(yaml, "n2.yaml").unwrap().name(), "n2");
    }

    #[test]
    fn the_resource_version_survives_for_the_watcher() {
        let json = r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"n","resourceVersion":"42","uid":"u-1"}}"#;
        let node: NodeView = serde_json::from_str(json).unwrap();
        assert_eq!(node.metadata.resource_version.as_deref(), Some("42"));
        assert_eq!(node.metadata.uid.as_deref(), Some("u-1"));
    }

    #[test]
    fn nodes_are_listed_and_watched_whole_for_their_taints() {
        use kube::Resource;
        assert!(!NodeView::metadata_api());
        let json = r#"{"kind":"Node","apiVersion":"v1",
            "metadata":{"name":"n","resourceVersion":"9","labels":{"a":"b"},"annotations":{"x":"y"}},
            "spec":{"taints":[{"key":"nvidia.com/gpu-xid-error","value":"79","effect":"NoExecute"}]},
            "status":{"images":[{"names":["x"],"sizeBytes":1}],"conditions":[{"type":"Ready"}]}}"#;
        let node: NodeView = serde_json::from_str(json).unwrap();
        assert_eq!(node.name(), "n");
        assert_eq!(node.labels().get("a").map(String::as_str), Some("b"));
        assert_eq!(node.metadata.resource_version.as_deref(), Some("9"));
        assert_eq!(
            node.placement.taints[0].to_string(),
            "nvidia.com/gpu-xid-error=79:NoExecute"
        );
    }

    #[test]
    fn the_status_gives_the_nvidia_gpus_advertised_and_nothing_else() {
        let json = r#"{"kind":"Node","apiVersion":"v1","metadata":{"name":"n"},
            "status":{"images":[{"names":["x"],"sizeBytes":1}],
              "capacity":{"cpu":"64","nvidia.com/gpu":"8","nvidia.com/mig-1g.10gb":"7","nvidia.com/mlnxnics":"8"},
              "allocatable":{"cpu":"63","nvidia.com/gpu":"0","nvidia.com/mig-1g.10gb":"0"}}}"#;
        let node: NodeView = serde_json::from_str(json).unwrap();
        assert_eq!(
            node.advertised,
            Some(Advertised {
                listed: true,
                capacity: 15,
                allocatable: 0
            })
        );
        // A status without GPU resources is read (none listed); one without allocatable, or
        // no status, is not.
        let capacity_only =
            r#"{"metadata":{"name":"n"},"status":{"capacity":{"nvidia.com/gpu":"8"}}}"#;
        let node: NodeView = serde_json::from_str(capacity_only).unwrap();
        assert_eq!(node.advertised, None);
        let plain =
            r#"{"kind":"Node","metadata":{"name":"n"},"status":{"allocatable":{"cpu":"1"}}}"#;
        let node: NodeView = serde_json::from_str(plain).unwrap();
        assert_eq!(node.advertised, Some(Advertised::default()));
        let bare: NodeView = serde_json::from_str(r#"{"metadata":{"name":"n"}}"#).unwrap();
        assert_eq!(bare.advertised, None);
        // A file reads it too; a quantity that is not a string is named.
        let file = parse_node(
            json.replace(r#""kind""#, r#""apiVersion":"v1","kind""#)
                .as_str(),
            "n.json",
        );
        assert!(file.is_err() || file.unwrap().advertised.is_some());
        let bad = r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"n"},
            "status":{"allocatable":{"nvidia.com/gpu":8}}}"#;
        let msg = parse_node(bad, "n.json").unwrap_err().to_string();
        assert!(msg.starts_with("n.json: status.allocatable"), "{msg}");
    }

    #[test]
    fn a_node_file_gives_its_taints_and_a_bad_one_is_named() {
        let json = r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"n"},
            "spec":{"unschedulable":true,"taints":[{"key":"nvidia.com/gpu-xid-error","effect":"NoSchedule"}]}}"#;
        let node = parse_node(json, "n.json").unwrap();
        assert!(node.placement.unschedulable);
        assert_eq!(node.placement.taints[0].key, "nvidia.com/gpu-xid-error");
        let bad = r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"n"},
            "spec":{"taints":[{"key":"k","effect":"Sometimes"}]}}"#;
        let msg = parse_node(bad, "n.json").unwrap_err().to_string();
        assert!(
            msg.starts_with("n.json: spec.taints[0]: unknown taint effect \"Sometimes\""),
            "{msg}"
        );
    }

    #[test]
    fn a_node_without_labels_has_none() {
        let node = parse_node(
            r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"x"}}"#,
            "x",
        )
        .unwrap();
        assert!(node.labels().is_empty());
    }

    #[test]
    fn bad_files_are_named_errors() {
        let cases = [
            ("{not json", "f is neither JSON nor YAML"),
            (
                r#"{"apiVersion":"apps/v1","kind":"DaemonSet","metadata":{}}"#,
                "f: expected a Node (kind: Node, apiVersion: v1), found apps/v1 DaemonSet",
            ),
            (
                r#"{"apiVersion":"v1","kind":"Node","metadata":{"labels":{"x":1}}}"#,
                "f: metadata.labels.x: invalid type: integer `1`, expected a string",
            ),
            ("- a\n- b\n", "f: "),
        ];
        for (text, want) in cases {
            let msg = parse_node(text, "f").unwrap_err().to_string();
            assert!(msg.starts_with(want), "{text:?}: {msg}");
        }
    }
}
