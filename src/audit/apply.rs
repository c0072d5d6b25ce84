//! Writing the audit to the cluster as ClusterPolicyReport `gpu-deploy-guard`.

use kube::Client;
use kube::api::ApiResource;

use super::report::{self, PolicyReport};
use crate::k8s::api::{self, ClusterError, Fence};

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

fn what() -> String {
    format!("ClusterPolicyReport {}", report::NAME)
}

/// Writes the report with server-side apply: the report's fields belong to gpu-deploy-guard.
/// With a `fence` other than [`Fence::Any`], only if the report is still as the writer last
/// knew it (see [`api::fence_broken`]). Returns the resourceVersion written.
pub async fn apply_report(
    client: &Client,
    report: &mut PolicyReport,
    fence: &Fence,
) -> Result<Option<String>, ClusterError> {
    report.metadata.resource_version = fence.version().map(str::to_owned);
    api::apply(client, &report_resource(), report::NAME, &*report, &what()).await
}

/// Where the report stands now, as the fence of the next write.
pub async fn read_fence(client: &Client) -> Result<Fence, ClusterError> {
    Fence::read(client, &report_resource(), report::NAME, &what()).await
}
