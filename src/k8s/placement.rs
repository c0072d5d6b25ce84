//! The fields placement reads, as the API writes them: a Node's `spec.taints` and
//! `spec.unschedulable`, a pod template's `tolerations`, `hostNetwork` and required node
//! affinity. Each is checked as the API server would check it; a value it would refuse is an
//! error naming the field ([`crate::core::placement`] holds the meaning).

use serde::Deserialize;
use serde_json::Value;

use crate::core::placement::{
    NodeAffinity, NodePlacement, PodPlacement, Requirement, SelectorOperator, Taint, Term,
    Toleration,
};

/// One `spec.taints[]` entry.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawTaint {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    effect: String,
}

/// A Node's `spec`, reduced to what placement reads.
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RawNodeSpec {
    #[serde(default)]
    taints: Option<Vec<TaintField>>,
    #[serde(default)]
    unschedulable: Option<bool>,
}

/// A taint, checked as it is read (so the error carries its path).
#[derive(Deserialize)]
#[serde(try_from = "RawTaint")]
struct TaintField(Taint);

impl TryFrom<RawTaint> for TaintField {
    type Error = String;
    fn try_from(raw: RawTaint) -> Result<TaintField, String> {
        let value = raw.value.unwrap_or_default();
        Taint::parse(&raw.key, &value, &raw.effect).map(TaintField)
    }
}

impl From<RawNodeSpec> for NodePlacement {
    fn from(raw: RawNodeSpec) -> NodePlacement {
        NodePlacement {
            taints: raw
                .taints
                .unwrap_or_default()
                .into_iter()
                .map(|t| t.0)
                .collect(),
            unschedulable: raw.unschedulable.unwrap_or(false),
        }
    }
}

/// One `tolerations[]` entry. `tolerationSeconds` is not read: the DaemonSet controller places
/// a pod by the toleration alone.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawToleration {
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    operator: Option<String>,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    effect: Option<String>,
}

/// A toleration, checked as it is read.
#[derive(Deserialize)]
#[serde(try_from = "RawToleration")]
pub(crate) struct TolerationField(pub(crate) Toleration);

impl TryFrom<RawToleration> for TolerationField {
    type Error = String;
    fn try_from(raw: RawToleration) -> Result<TolerationField, String> {
        let s = |f: &Option<String>| f.clone().unwrap_or_default();
        Toleration::parse(
            &s(&raw.key),
            &s(&raw.operator),
            &s(&raw.value),
            &s(&raw.effect),
        )
        .map(TolerationField)
        .map_err(|e| e.to_string())
    }
}

/// `tolerations` as a JSON value (a ClusterPolicy's `spec.daemonsets.tolerations`), with the
/// field's path in the error.
pub fn tolerations_of(value: Option<&Value>, field: &str) -> Result<Vec<Toleration>, String> {
    match value {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(v) => Vec::<TolerationField>::deserialize(v)
            .map(|list| list.into_iter().map(|t| t.0).collect())
            .map_err(|e| format!("{field}: {e}")),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawRequirement {
    key: String,
    operator: String,
    #[serde(default)]
    values: Vec<String>,
}

#[derive(Deserialize)]
#[serde(try_from = "RawRequirement")]
struct RequirementField(Requirement);

impl TryFrom<RawRequirement> for RequirementField {
    type Error = String;
    fn try_from(raw: RawRequirement) -> Result<RequirementField, String> {
        Ok(RequirementField(Requirement {
            operator: SelectorOperator::parse(&raw.operator)?,
            key: raw.key,
            values: raw.values,
        }))
    }
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawTerm {
    #[serde(default)]
    match_expressions: Vec<RequirementField>,
    #[serde(default)]
    match_fields: Vec<RequirementField>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawNodeSelector {
    #[serde(default)]
    node_selector_terms: Vec<RawTerm>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawNodeAffinity {
    #[serde(default)]
    required_during_scheduling_ignored_during_execution: Option<RawNodeSelector>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawAffinity {
    #[serde(default)]
    node_affinity: Option<RawNodeAffinity>,
}

/// The part of a pod template's `spec` placement reads.
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RawPodPlacement {
    #[serde(default)]
    tolerations: Option<Vec<TolerationField>>,
    #[serde(default)]
    host_network: Option<bool>,
    #[serde(default)]
    affinity: Option<RawAffinity>,
}

impl From<RawPodPlacement> for PodPlacement {
    fn from(raw: RawPodPlacement) -> PodPlacement {
        let required = raw
            .affinity
            .and_then(|a| a.node_affinity)
            .and_then(|n| n.required_during_scheduling_ignored_during_execution);
        PodPlacement {
            tolerations: raw
                .tolerations
                .unwrap_or_default()
                .into_iter()
                .map(|t| t.0)
                .collect(),
            host_network: raw.host_network.unwrap_or(false),
            affinity: required.map(|sel| NodeAffinity {
                terms: sel
                    .node_selector_terms
                    .into_iter()
                    .map(|t| Term {
                        match_expressions: t.match_expressions.into_iter().map(|r| r.0).collect(),
                        match_fields: t.match_fields.into_iter().map(|r| r.0).collect(),
                    })
                    .collect(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::placement::{Effect, TolerationOperator};

    #[test]
    fn a_node_spec_gives_taints_and_the_cordon() {
        let spec: RawNodeSpec = serde_json::from_str(
            r#"{"unschedulable":true,"taints":[{"key":"nvidia.com/gpu-xid-error","value":"79","effect":"NoSchedule"},
                {"key":"m","effect":"NoExecute","timeAdded":"2026-12-04T00:00:00Z"}],"podCIDR":"10.0.0.0/24"}"#,
        )
        .unwrap();
        let node = NodePlacement::from(spec);
        assert!(node.unschedulable);
        assert_eq!(
            node.taints,
            [
                Taint::new("nvidia.com/gpu-xid-error", "79", Effect::NoSchedule),
                Taint::new("m", "", Effect::NoExecute)
            ]
        );
    }

    #[test]
    fn a_bad_taint_or_toleration_is_an_error_with_its_path() {
        let bad = r#"{"taints":[{"key":"a","effect":"NoSchedule"},{"key":"b","effect":"NoRun"}]}"#;
        let mut de = serde_json::Deserializer::from_str(bad);
        let err = serde_path_to_error::deserialize::<_, RawNodeSpec>(&mut de)
            .err()
            .unwrap();
        assert_eq!(err.path().to_string(), "taints[1]");
        assert!(
            err.to_string().contains("unknown taint effect \"NoRun\""),
            "{err}"
        );
        let tol = serde_json::json!([{"key": "k", "operator": "Gt", "value": "1"}]);
        let err = tolerations_of(Some(&tol), "spec.daemonsets.tolerations").unwrap_err();
        assert!(
            err.starts_with("spec.daemonsets.tolerations: unknown toleration operator \"Gt\""),
            "{err}"
        );
    }

    #[test]
    fn a_pod_template_gives_tolerations_host_network_and_required_affinity() {
        let spec: RawPodPlacement = serde_json::from_str(
            r#"{"hostNetwork":true,"tolerations":[{"key":"nvidia.com/gpu","operator":"Exists","effect":"NoSchedule"},
                {"operator":"Exists"}],
              "affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[
                {"matchExpressions":[{"key":"pool","operator":"In","values":["a100"]}]}]},
                "preferredDuringSchedulingIgnoredDuringExecution":[]}},"containers":[]}"#,
        )
        .unwrap();
        let pod = PodPlacement::from(spec);
        assert!(pod.host_network);
        assert_eq!(pod.tolerations.len(), 2);
        assert_eq!(pod.tolerations[1].operator, TolerationOperator::Exists);
        assert_eq!(pod.tolerations[1].key, "");
        let affinity = pod.affinity.unwrap();
        assert_eq!(affinity.terms[0].match_expressions[0].key, "pool");
        assert!(
            PodPlacement::from(RawPodPlacement::default())
                .tolerations
                .is_empty()
        );
    }
}
