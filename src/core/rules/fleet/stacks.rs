//! A ClusterPolicy and a GPUCluster at once: judged on the request itself, before anything
//! about the fleet.

use crate::core::echo::echo;
use crate::core::policy_change::model::{PolicyChange, PolicyReview};
use crate::core::review::Operation;
use crate::core::rules::{Change, Found, Rule};

/// A ClusterPolicy and a GPUCluster at once (v26.7+): the GPUCluster controller sets itself
/// `NotReady` (`validatePrerequisites`), the ClusterPolicy controller and the node-labelling
/// reconcile return an error (gpu-operator@v26.7.0 `controllers/gpucluster_controller.go`,
/// `controllers/clusterpolicy_controller.go`, `controllers/nodelabeling_controller.go`):
/// nothing is reconciled or labelled until one is deleted (`docs/gpu-operator.md` §12). The
/// request that makes both exist is new; one that changes either while both exist finds the
/// conflict there already.
pub(crate) fn stacks_conflict(review: &PolicyReview<'_>) -> Option<Found> {
    use crate::core::operands::{GPU_CLUSTER_NAME, Stack};
    let object = format!("{} {}", review.kind.as_str(), echo(review.name));
    let (facts, other, creates) = match review.change {
        PolicyChange::ClusterPolicy { after, .. } => {
            // Whether a GPUCluster exists is not known: this ClusterPolicy could make both.
            if review.operation == Operation::Create
                && after.operator.era().has_gpu_cluster()
                && after.stack == Stack::ClusterPolicy
                && let Some(why) = &after.gpu_clusters_unknown
            {
                let version = &after.operator.version.text;
                return Some(not_known(
                    &object,
                    "GPUCluster",
                    "GPUClusters",
                    why,
                    version,
                ));
            }
            if after.stack.in_era(after.operator.era()) != Stack::Both
                || review.operation == Operation::Delete
            {
                return None;
            }
            (
                after,
                format!("GPUCluster {GPU_CLUSTER_NAME}"),
                review.operation == Operation::Create,
            )
        }
        PolicyChange::GpuCluster {
            facts,
            cluster_policy: Some(cp),
            ..
        } if facts.operator.era().has_gpu_cluster()
            && matches!(review.operation, Operation::Create | Operation::Update) =>
        {
            (
                facts,
                format!("ClusterPolicy {}", echo(cp)),
                review.operation == Operation::Create,
            )
        }
        PolicyChange::GpuCluster {
            facts,
            cluster_policy: None,
            ..
        } if facts.operator.era().has_gpu_cluster()
            && review.operation == Operation::Create
            && matches!(
                facts.source,
                crate::core::facts::PolicySource::Forbidden(_)
                    | crate::core::facts::PolicySource::Failed(_)
                    | crate::core::facts::PolicySource::NoAccess(_)
            ) =>
        {
            // Whether a ClusterPolicy exists is not known: the GPUCluster could make both.
            let version = &facts.operator.version.text;
            let why = facts.source.describe();
            return Some(not_known(
                &object,
                "ClusterPolicy",
                "ClusterPolicies",
                &why,
                version,
            ));
        }
        _ => return None,
    };
    Some(both_exist(
        &object,
        &other,
        &facts.operator.version.text,
        creates,
    ))
}

/// Whether the other custom resource exists is not known (`kind`, read as `kinds`): the request
/// could make both exist.
fn not_known(object: &str, kind: &str, kinds: &str, why: &str, version: &str) -> Found {
    Found {
        rule: Rule::GpuClusterConflict,
        change: Change::New,
        message: format!(
            "{object}: whether a {kind} exists is not known ({why}), and the GPU Operator ({version}) \
             reconciles neither while both exist: retry once the guard can read the {kinds}."
        ),
        warning: format!("{object}: whether a {kind} exists is not known"),
    }
}

/// `other` exists besides `object`: a request that `creates` it makes the conflict, any other
/// finds it there already.
fn both_exist(object: &str, other: &str, version: &str, creates: bool) -> Found {
    let (message, warning, change) = if creates {
        (
            format!(
                "{object}: {other} exists, and the GPU Operator ({version}) reconciles neither while both \
                 exist: it labels no node and deploys nothing until one is deleted; delete {other} first, \
                 or do not create {object}."
            ),
            format!("{object}: {other} exists; the GPU Operator would reconcile neither"),
            Change::New,
        )
    } else {
        (
            format!(
                "{object}: {other} exists too, so the GPU Operator ({version}) reconciles neither and this \
                 change takes effect only once one of them is deleted."
            ),
            format!("{object}: {other} exists too; the GPU Operator reconciles neither"),
            Change::Existing,
        )
    };
    Found {
        rule: Rule::GpuClusterConflict,
        change,
        message,
        warning,
    }
}
