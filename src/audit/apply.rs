//! Writing the audit to the cluster as report `gpu-deploy-guard`: a `wgpolicyk8s.io`
//! ClusterPolicyReport, or an `openreports.io` ClusterReport ([`Format`]).

use kube::Client;
use kube::api::ApiResource;

use super::report::{self, Format, PolicyReport};
use crate::k8s::api::{self, ClusterError, Fence};

/// The report's resource in `format`, cluster-scoped.
pub fn report_resource(format: Format) -> ApiResource {
    ApiResource {
        group: format.group().into(),
        version: format.version().into(),
        api_version: format.api_version().into(),
        kind: format.kind().into(),
        plural: format.plural().into(),
    }
}

fn what(format: Format) -> String {
    format!("{} {}", format.kind(), report::NAME)
}

/// Writes the report, in the API it was built in ([`PolicyReport::in_format`]), with
/// server-side apply: the report's fields belong to gpu-deploy-guard. With a `fence` other than
/// [`Fence::Any`], only if the report is still as the writer last knew it (see
/// [`api::fence_broken`]). Returns the resourceVersion written.
pub async fn apply_report(
    client: &Client,
    report: &mut PolicyReport,
    fence: &Fence,
) -> Result<Option<String>, ClusterError> {
    let format = report.format();
    report.metadata.resource_version = fence.version().map(str::to_owned);
    api::apply(
        client,
        &report_resource(format),
        report::NAME,
        &*report,
        &what(format),
    )
    .await
}

/// Where the report stands now, as the fence of the next write.
pub async fn read_fence(client: &Client, format: Format) -> Result<Fence, ClusterError> {
    Fence::read(
        client,
        &report_resource(format),
        report::NAME,
        &what(format),
    )
    .await
}
