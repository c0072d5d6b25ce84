//! What an NVIDIADriver resource (`nvidia.com/v1alpha1`) says about where its driver
//! DaemonSets run. Read as plain JSON, like the ClusterPolicy: only the node selection matters
//! here (`docs/gpu-operator.md` §11).

use kube::api::ApiResource;
use serde_json::Value;

use super::placement::tolerations_of;
use crate::core::nvidia_driver::NvidiaDriver;
use crate::core::operands::Labels;

/// `nvidia.com/v1alpha1` NVIDIADriver, cluster-scoped.
pub fn resource() -> ApiResource {
    ApiResource {
        group: "nvidia.com".into(),
        version: "v1alpha1".into(),
        api_version: "nvidia.com/v1alpha1".into(),
        kind: "NVIDIADriver".into(),
        plural: "nvidiadrivers".into(),
    }
}

/// The NVIDIADriver one object gives: its name and `spec.nodeSelector`, type-checked.
pub fn from_object(object: &Value) -> Result<NvidiaDriver, String> {
    // What the webhook keeps of the object is all any reader reads.
    let kept = super::policy_object::kept(object);
    let object = &kept;
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let node_selector = match object.pointer("/spec/nodeSelector") {
        None | Some(Value::Null) => None,
        Some(Value::Object(map)) => {
            let mut node_selector = Labels::new();
            for (k, v) in map {
                let Some(v) = v.as_str() else {
                    return Err(format!(
                        "NVIDIADriver {name}: spec.nodeSelector.{k}: expected a string, found {v}"
                    ));
                };
                node_selector.insert(k.clone(), v.to_owned());
            }
            Some(node_selector)
        }
        Some(other) => {
            return Err(format!(
                "NVIDIADriver {name}: spec.nodeSelector: expected a map of strings, found {other}"
            ));
        }
    };
    let vgpu_host_manager = match object.pointer("/spec/driverType") {
        None | Some(Value::Null) => false,
        Some(Value::String(t)) => t == "vgpu-host-manager",
        Some(other) => {
            return Err(format!(
                "NVIDIADriver {name}: spec.driverType: expected a string, found {other}"
            ));
        }
    };
    let flag = |field: &str| match object.pointer(&format!("/spec/{field}")) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(format!(
            "NVIDIADriver {name}: spec.{field}: expected true or false, found {other}"
        )),
    };
    let tolerations = tolerations_of(object.pointer("/spec/tolerations"), "spec.tolerations")
        .map_err(|e| format!("NVIDIADriver {name}: {e}"))?;
    Ok(NvidiaDriver {
        tolerations,
        precompiled: flag("usePrecompiled")?,
        default: flag("default")?,
        name,
        node_selector,
        vgpu_host_manager,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_selector_is_read_and_checked() {
        let d = from_object(&serde_json::json!({
            "metadata": {"name": "a100"},
            "spec": {"driverType": "gpu", "nodeSelector": {"nvidia.com/gpu.product": "A100"}}
        }))
        .unwrap();
        assert_eq!(d.name, "a100");
        assert_eq!(d.node_selector.map(|s| s.len()), Some(1));
        assert!(!d.vgpu_host_manager && !d.precompiled && !d.default);
        let flags = from_object(&serde_json::json!({"metadata": {"name": "f"},
            "spec": {"usePrecompiled": true, "default": true}}))
        .unwrap();
        assert!(flags.precompiled && flags.default);
        assert_eq!(
            from_object(
                &serde_json::json!({"metadata": {"name": "f"}, "spec": {"default": "yes"}})
            )
            .unwrap_err(),
            "NVIDIADriver f: spec.default: expected true or false, found \"yes\""
        );
        let none =
            from_object(&serde_json::json!({"metadata": {"name": "all"}, "spec": {}})).unwrap();
        assert_eq!(
            none.node_selector, None,
            "absent: the operator's default, gpu.present"
        );
        let empty = from_object(&serde_json::json!({"metadata": {"name": "e"},
            "spec": {"nodeSelector": {}, "driverType": "vgpu-host-manager"}}))
        .unwrap();
        assert_eq!(
            empty.node_selector,
            Some(Labels::new()),
            "empty: every node"
        );
        assert!(empty.vgpu_host_manager);
        let tolerating = from_object(&serde_json::json!({"metadata": {"name": "t"},
            "spec": {"tolerations": [{"key": "example.com/maint", "operator": "Exists"}]}}))
        .unwrap();
        assert_eq!(
            tolerating
                .template()
                .tolerations
                .iter()
                .map(|t| t.key.as_str())
                .collect::<Vec<_>>(),
            ["nvidia.com/gpu", "example.com/maint"]
        );
        let bad_toleration = from_object(&serde_json::json!({"metadata": {"name": "t"},
            "spec": {"tolerations": [{"key": "k", "operator": "Lt", "value": "3"}]}}));
        assert_eq!(
            bad_toleration.unwrap_err(),
            "NVIDIADriver t: spec.tolerations: unknown toleration operator \"Lt\": the API server accepts Exists and Equal (or none, which is Equal)"
        );
        let bad = from_object(
            &serde_json::json!({"metadata": {"name": "x"}, "spec": {"nodeSelector": {"a": 1}}}),
        );
        assert_eq!(
            bad.unwrap_err(),
            "NVIDIADriver x: spec.nodeSelector.a: expected a string, found 1"
        );
    }
}
