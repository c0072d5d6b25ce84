//! Writing the audit to the cluster as ClusterPolicyReport `gpu-deploy-guard`.

use kube::Client;
use kube::api::ApiResource;

use super::report::{self, PolicyReport};
use crate::k8s::api::{self, ClusterError};

/// `wgpolicyk8s.io/v1alpha2` ClusterPolicyReport, cluster-scoped.
pub fn report_resource() -> ApiResource {
    ApiResource {
        group: "wgpolicyk8s.io".into(),
        version: "v1alpha2".into(),
        api_version: report::API_VERSION.into(),
        kind: report::KIND.into(),
        plural: "clusterpolicyreports".into(),
    }
}

/// Writes the report with server-side apply: the report's fields belong to gpu-deploy-guard.
pub async fn apply_report(client: &Client, report: &PolicyReport) -> Result<(), ClusterError> {
    let body = serde_json::to_value(report).unwrap_or_default();
    let what = format!("ClusterPolicyReport {}", report::NAME);
    api::apply(client, &report_resource(), report::NAME, body, &what).await
}
