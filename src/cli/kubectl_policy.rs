//! `kubectl gpu-deploy-guard policy`: what the webhook would decide about a ClusterPolicy or
//! NVIDIADriver change, previewed against the live cluster before it is sent.
//!
//! `policy -f FILE` previews applying FILE over the live object of the same kind and name
//! (creating it when there is none); `policy clusterpolicy|nvidiadriver NAME --patch JSON`
//! previews a merge patch (as `kubectl patch --type merge`); `--delete` previews deleting an
//! NVIDIADriver. The cluster is read as the audit reads it (the nodes as metadata, in pages),
//! and the decision is the webhook's (`check-policy`'s [`report`]). Exit 0: allowed; 1: denied; 2: bad
//! input or the cluster could not be read. Nothing is written.

use std::path::PathBuf;

use clap::Args;
use kube::api::{Api, DynamicObject};
use serde_json::Value;

use crate::cli::check_policy::{Format, fleet_of, node_selector_keys, report};
use crate::core::config::Config;
use crate::core::policy_change::PolicyKind;
use crate::core::review::Operation;
use crate::core::version;
use crate::flags::OperatorVersionArg;
use crate::k8s::api::{self, ClusterError, brief, cluster_policy_resource};
use crate::k8s::{document, nvidia_driver, read};
use crate::policy_decision::ObjectChange;

#[derive(Args)]
pub struct PolicyArgs {
    /// `clusterpolicy`, `nvidiadriver` or `gpucluster` (with NAME), unless -f names the object.
    #[arg(value_name = "KIND")]
    kind: Option<String>,
    /// The object's name.
    #[arg(value_name = "NAME")]
    name: Option<String>,
    /// The object as it would be applied (YAML or JSON).
    #[arg(short = 'f', long = "filename", value_name = "FILE", conflicts_with_all = ["patch", "delete"])]
    file: Option<PathBuf>,
    /// A JSON merge patch of the live object (`kubectl patch --type merge -p`).
    #[arg(short = 'p', long, value_name = "JSON", conflicts_with = "delete")]
    patch: Option<String>,
    /// Preview deleting the object (NVIDIADriver, GPUCluster).
    #[arg(long)]
    delete: bool,
    /// The webhook's YAML configuration (rules, mode, exemptions); default: the built-in one.
    #[arg(long, env = "GDG_CONFIG")]
    config: Option<PathBuf>,
    #[command(flatten)]
    operator_version: OperatorVersionArg,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Text)]
    output: Format,
}

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("{0}")]
    BadInput(String),
    #[error(transparent)]
    Config(#[from] crate::core::config::ConfigError),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
}

fn kind_of(word: &str) -> Option<PolicyKind> {
    match word.to_ascii_lowercase().as_str() {
        "clusterpolicy" | "clusterpolicies" | "clusterpolicies.nvidia.com" => {
            Some(PolicyKind::ClusterPolicy)
        }
        "nvidiadriver" | "nvidiadrivers" | "nvidiadrivers.nvidia.com" => {
            Some(PolicyKind::NvidiaDriver)
        }
        "gpucluster" | "gpuclusters" | "gpuclusters.nvidia.com" => Some(PolicyKind::GpuCluster),
        _ => None,
    }
}

/// The preview's report and exit code.
pub async fn preview(args: &PolicyArgs) -> Result<(String, u8), PolicyError> {
    let file = file_object(args)?;
    let (kind, name) = kind_and_name(args, file.as_ref())?;
    let config = match &args.config {
        Some(path) => read::config_file(path)?,
        None => Config::default(),
    };
    let client = api::connect().await?;
    let live = live_object(&client, kind, &name).await?;
    let new = changed_object(args, file, live.as_ref(), kind, &name)?;
    let operation = match (&live, &new) {
        (Some(_), Some(_)) => Operation::Update,
        (None, Some(_)) => Operation::Create,
        (Some(_), None) => Operation::Delete,
        (None, None) => return Err(bad(format!("{} {name} does not exist", kind.as_str()))),
    };
    // The nodes keep the labels the object selects on, before and after, too.
    let extra: Vec<String> = [&new, &live]
        .into_iter()
        .flatten()
        .flat_map(node_selector_keys)
        .collect();
    let mut snapshot = api::snapshot_keeping(&client, &config.operator_namespace, &extra).await?;
    snapshot.facts.operator = version::resolve(
        args.operator_version.given(&config),
        snapshot.facts.operator,
    );
    let fleet = fleet_of(&snapshot.nodes, &snapshot.facts, &extra);
    let change = ObjectChange {
        kind,
        operation,
        name: &name,
        object: new.as_ref(),
        old: live.as_ref(),
        username: "",
        groups: &[],
        dry_run: true,
    };
    report(
        args.output,
        &change,
        &snapshot.facts,
        &fleet,
        &config.policy,
    )
    .map_err(bad)
}

fn bad(m: String) -> PolicyError {
    PolicyError::BadInput(m)
}

/// The object -f gives, read.
fn file_object(args: &PolicyArgs) -> Result<Option<Value>, PolicyError> {
    let Some(path) = &args.file else {
        return Ok(None);
    };
    let text =
        read::text(path).map_err(|e| bad(format!("cannot read {}: {e}", read::display(path))))?;
    let value = document::json_or_yaml(&text).map_err(|m| {
        bad(format!(
            "{} is neither JSON nor YAML: {m}",
            read::display(path)
        ))
    })?;
    Ok(Some(value))
}

/// The kind and name of the object previewed (-f's, or KIND NAME), and whether the arguments
/// say what to do with it.
fn kind_and_name(
    args: &PolicyArgs,
    file: Option<&Value>,
) -> Result<(PolicyKind, String), PolicyError> {
    let (kind, name) = match (file, &args.kind, &args.name) {
        (Some(v), _, _) => {
            let kind = v
                .get("kind")
                .and_then(Value::as_str)
                .and_then(kind_of)
                .ok_or_else(|| {
                    bad("-f: expected a ClusterPolicy, an NVIDIADriver or a GPUCluster".into())
                })?;
            let name = v
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("-f: the object has no metadata.name".into()))?;
            (kind, name.to_owned())
        }
        (None, Some(k), Some(n)) => (
            kind_of(k).ok_or_else(|| {
                bad(format!(
                    "{k:?}: expected clusterpolicy, nvidiadriver or gpucluster"
                ))
            })?,
            n.clone(),
        ),
        _ => {
            return Err(bad(
                "give -f FILE, or KIND NAME with --patch JSON or --delete".into(),
            ));
        }
    };
    if file.is_none() && args.patch.is_none() && !args.delete {
        return Err(bad(format!(
            "{} {name}: give --patch JSON or --delete",
            kind.as_str()
        )));
    }
    if args.delete && kind == PolicyKind::ClusterPolicy {
        return Err(bad(
            "deleting the ClusterPolicy removes every operand; it is not reviewed".into(),
        ));
    }
    Ok((kind, name))
}

/// The live object of `kind` named `name`, when there is one.
async fn live_object(
    client: &kube::Client,
    kind: PolicyKind,
    name: &str,
) -> Result<Option<Value>, PolicyError> {
    let resource = match kind {
        PolicyKind::ClusterPolicy => cluster_policy_resource(),
        PolicyKind::NvidiaDriver => nvidia_driver::resource(),
        PolicyKind::GpuCluster => crate::k8s::gpu_cluster::resource(),
    };
    match Api::<DynamicObject>::all_with(client.clone(), &resource)
        .get_opt(name)
        .await
    {
        Ok(o) => Ok(o.map(|o| serde_json::to_value(o).unwrap_or_default())),
        Err(e) => Err(bad(format!(
            "cannot read {} {name}: {}",
            kind.as_str(),
            brief(&e)
        ))),
    }
}

/// The object after the change: -f's, or the live one with --patch merged; none for --delete.
fn changed_object(
    args: &PolicyArgs,
    file: Option<Value>,
    live: Option<&Value>,
    kind: PolicyKind,
    name: &str,
) -> Result<Option<Value>, PolicyError> {
    match (file, &args.patch) {
        (Some(v), _) => Ok(Some(v)),
        (None, Some(patch)) => {
            let patch: Value = serde_json::from_str(patch)
                .map_err(|e| bad(format!("--patch is not JSON: {e}")))?;
            let mut doc = live
                .cloned()
                .ok_or_else(|| bad(format!("{} {name} does not exist", kind.as_str())))?;
            json_patch::merge(&mut doc, &patch);
            Ok(Some(doc))
        }
        (None, None) => Ok(None),
    }
}
