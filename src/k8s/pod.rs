//! The part of a Pod the audit reads: where it runs, its phase and which
//! DaemonSet owns it.
//!
//! A `kubectl get pods -o json` of a large cluster's operator namespace is
//! hundreds of megabytes, nearly all of it specs and statuses the audit never
//! looks at. [`PodView`] deserializes only the few fields below and lets serde
//! skip the rest without building it; the same type feeds the `serve`
//! reflector, so the watch cache stays small too.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

use super::meta::{PartialMeta, RawOwner};
pub use crate::core::pods::PodPhase;

/// A Pod reduced to what the audit needs.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(from = "RawPod")]
pub struct PodView {
    /// Name and namespace only (the reflector keys its store by them).
    pub metadata: ObjectMeta,
    /// `spec.nodeName`: unset while the pod is not scheduled.
    pub node: Option<String>,
    pub phase: PodPhase,
    /// Name of the DaemonSet in the pod's controller owner reference, if that is a DaemonSet.
    pub daemonset: Option<String>,
    /// The `app` label: operand DaemonSets select their pods by it.
    pub app: Option<String>,
    /// The pod has owner references (of any kind): the `app` label is then not consulted.
    pub owned: bool,
}

impl PodView {
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    pub fn is_running(&self) -> bool {
        self.phase == PodPhase::Running
    }
}

/// A pod of an operand on a node, as the per-node audit reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodOnNode<'a> {
    pub operand: crate::core::operands::Operand,
    pub name: std::borrow::Cow<'a, str>,
    pub phase: PodPhase,
}

/// The wire shape, with every field the audit does not read left out.
#[derive(Deserialize)]
pub(crate) struct RawPod {
    #[serde(default)]
    pub(crate) kind: Option<String>,
    #[serde(default)]
    metadata: PartialMeta<RawLabels, Vec<RawOwner>>,
    #[serde(default)]
    spec: RawSpec,
    #[serde(default)]
    status: RawStatus,
}

#[derive(Default, Deserialize)]
struct RawLabels {
    #[serde(default)]
    app: Option<String>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawSpec {
    #[serde(default)]
    node_name: Option<String>,
}

#[derive(Default, Deserialize)]
struct RawStatus {
    #[serde(default)]
    phase: PodPhase,
}

impl From<RawPod> for PodView {
    fn from(raw: RawPod) -> Self {
        let (metadata, labels, owners) = raw.metadata.into_parts();
        let owned = !owners.is_empty();
        // The controller reference decides; a lone DaemonSet reference without the flag counts too.
        let daemonset = owners
            .into_iter()
            .filter(|o| o.kind == "DaemonSet")
            .max_by_key(|o| o.controller == Some(true))
            .map(|o| o.name);
        PodView {
            metadata,
            node: raw.spec.node_name,
            phase: raw.status.phase,
            daemonset,
            app: labels.app,
            owned,
        }
    }
}

partial_resource!(PodView, k8s_openapi::NamespaceResourceScope, kind: "Pod", group: "", version: "v1", plural: "pods");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_daemonset_pod_gives_its_node_phase_and_owner() {
        let pod: PodView = serde_json::from_str(
            r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"nvidia-device-plugin-daemonset-x7k2p",
              "namespace":"gpu-operator","labels":{"app":"nvidia-device-plugin-daemonset","pod-template-generation":"1"},
              "ownerReferences":[{"apiVersion":"apps/v1","kind":"DaemonSet","name":"nvidia-device-plugin-daemonset",
              "uid":"u","controller":true,"blockOwnerDeletion":true}]},
              "spec":{"nodeName":"lab-node-0","containers":[{"name":"c","image":"i"}]},
              "status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}}"#,
        )
        .unwrap();
        assert_eq!(pod.name(), "nvidia-device-plugin-daemonset-x7k2p");
        assert_eq!(pod.metadata.namespace.as_deref(), Some("gpu-operator"));
        assert_eq!(pod.node.as_deref(), Some("lab-node-0"));
        assert_eq!(pod.phase, PodPhase::Running);
        assert_eq!(
            pod.daemonset.as_deref(),
            Some("nvidia-device-plugin-daemonset")
        );
        assert_eq!(pod.app.as_deref(), Some("nvidia-device-plugin-daemonset"));
        assert!(pod.owned);
    }

    #[test]
    fn the_resource_version_survives_for_the_watcher() {
        let pod: PodView = serde_json::from_str(
            r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"gpu-operator","resourceVersion":"7"}}"#,
        )
        .unwrap();
        assert_eq!(pod.metadata.resource_version.as_deref(), Some("7"));
    }

    #[test]
    fn a_pending_unowned_pod_has_no_daemonset() {
        let pod: PodView = serde_json::from_str(
            r#"{"metadata":{"name":"p","labels":{"app":"gpu-feature-discovery"}},"spec":{},"status":{"phase":"Pending"}}"#,
        )
        .unwrap();
        assert_eq!(pod.node, None);
        assert_eq!(pod.phase, PodPhase::Pending);
        assert_eq!(pod.daemonset, None);
        assert!(!pod.owned);
    }

    #[test]
    fn an_unknown_or_missing_phase_is_unknown() {
        let pod: PodView =
            serde_json::from_str(r#"{"metadata":{"name":"p"},"status":{"phase":"Evicted"}}"#)
                .unwrap();
        assert_eq!(pod.phase, PodPhase::Unknown);
        let pod: PodView = serde_json::from_str(r#"{"metadata":{"name":"p"}}"#).unwrap();
        assert_eq!(pod.phase, PodPhase::Unknown);
    }

    #[test]
    fn a_replicaset_pod_is_owned_but_not_by_a_daemonset() {
        let pod: PodView = serde_json::from_str(
            r#"{"metadata":{"name":"gpu-operator-5d8","labels":{"app":"gpu-operator"},
              "ownerReferences":[{"kind":"ReplicaSet","name":"gpu-operator-5d8","controller":true}]}}"#,
        )
        .unwrap();
        assert_eq!(pod.daemonset, None);
        assert!(pod.owned);
    }
}
