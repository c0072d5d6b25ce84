//! `kubectl gpu-deploy-guard`: the same binary, installed as `kubectl-gpu_deploy_guard` (a
//! symlink or a copy; the name it is called by selects this command line).
//!
//! `kubectl gpu-deploy-guard label nodes (NAME... | -l SELECTOR | --all) KEY=VALUE|KEY- ...`
//! reads the nodes, the ClusterPolicy, the operand DaemonSets and the operator's version through
//! the kubeconfig (the audit's snapshot), and prints for each node the operands before and after
//! the change and what the webhook would decide ([`policy::decide`], with the same facts). The
//! operator version is `--operator-version`, else the config file's, else the Deployment's, else
//! the newest one, assumed, which a note then says. It labels the nodes only with `--apply`, and
//! only when every node is allowed. Exit 0: all allowed; 1: any denied; 2: bad input or the
//! cluster could not be read.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Map, Value};

use crate::cli::check::apply_changes;
use crate::core::config::Config;
use crate::core::labels::{Change, ChangeError};
use crate::core::operands::OperandSet;
use crate::core::policy::{self, Decision, Verdict};
use crate::core::review::{Operation, Review};
use crate::core::rules::Action;
use crate::core::version;
use crate::flags::OperatorVersionArg;
use crate::k8s::api::{self, ClusterError, FIELD_MANAGER, brief, list_pages_with};
use crate::k8s::node::NodeView;
use crate::k8s::read;

/// The binary's file name that selects this command line (kubectl finds plugins by it).
pub const PLUGIN_BINARY: &str = "kubectl-gpu_deploy_guard";

/// What the webhook would decide about a node label change, before it is sent.
#[derive(Parser)]
#[command(name = "kubectl gpu-deploy-guard", version = crate::VERSION, about)]
pub struct PluginCli {
    #[command(subcommand)]
    command: PluginCommand,
}

#[derive(Subcommand)]
enum PluginCommand {
    /// Show what gpu-deploy-guard would decide for a `kubectl label nodes` change; --apply makes it.
    Label(LabelArgs),
    /// Show what gpu-deploy-guard would decide for a ClusterPolicy or NVIDIADriver change
    /// (-f FILE, or KIND NAME --patch JSON | --delete), over the live cluster's nodes.
    Policy(crate::cli::kubectl_policy::PolicyArgs),
}

#[derive(Args)]
pub struct LabelArgs {
    /// The resource: `nodes` (or `node`, `no`).
    #[arg(value_name = "RESOURCE")]
    resource: String,
    /// Node names, then label changes in kubectl syntax: KEY=VALUE sets, KEY- removes.
    #[arg(value_name = "NAME|CHANGE", required = true)]
    words: Vec<String>,
    /// Label selector for the nodes, as `kubectl label -l`.
    #[arg(short = 'l', long)]
    selector: Option<String>,
    /// Every node.
    #[arg(long)]
    all: bool,
    /// Label the nodes, if every one is allowed.
    #[arg(long)]
    apply: bool,
    /// The webhook's YAML configuration (rules, mode, exemptions); default: the built-in one.
    #[arg(long, env = "GDG_CONFIG")]
    config: Option<PathBuf>,
    #[command(flatten)]
    operator_version: OperatorVersionArg,
}

#[derive(Debug, thiserror::Error)]
enum PluginError {
    #[error("{0}")]
    BadInput(String),
    #[error(transparent)]
    Change(#[from] ChangeError),
    #[error(transparent)]
    Config(#[from] crate::core::config::ConfigError),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
}

/// Whether the process was started under the plugin's name.
pub fn invoked_as_plugin(argv0: Option<&std::ffi::OsStr>) -> bool {
    argv0
        .and_then(|a| std::path::Path::new(a).file_stem())
        .is_some_and(|stem| stem == PLUGIN_BINARY)
}

pub fn run(cli: PluginCli) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(PluginError::Runtime);
    let result = match cli.command {
        PluginCommand::Label(args) => runtime.and_then(|rt| rt.block_on(label(&args))),
        PluginCommand::Policy(args) => runtime.and_then(|rt| {
            rt.block_on(crate::cli::kubectl_policy::preview(&args))
                .map_err(|e| PluginError::BadInput(e.to_string()))
        }),
    };
    match result {
        Ok((text, code)) => {
            print!("{text}");
            ExitCode::from(code)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// Which nodes the command names.
enum Selection {
    Names(Vec<String>),
    Selector(String),
    All,
}

/// Splits the positional words into node names and changes (a change has `=` or ends in `-`,
/// which a node name never does), and checks that exactly one way of choosing nodes is used.
fn parse(args: &LabelArgs) -> Result<(Selection, Vec<Change>), PluginError> {
    if !matches!(args.resource.as_str(), "nodes" | "node" | "no") {
        return Err(PluginError::BadInput(format!(
            "resource {:?}: only nodes can be labelled with this command",
            args.resource
        )));
    }
    let (changes, names): (Vec<&String>, Vec<&String>) = args
        .words
        .iter()
        .partition(|w| w.contains('=') || w.ends_with('-'));
    let changes = changes
        .into_iter()
        .map(|c| Change::parse(c))
        .collect::<Result<Vec<_>, _>>()?;
    if changes.is_empty() {
        return Err(PluginError::BadInput(
            "no label change given (KEY=VALUE to set, KEY- to remove)".to_owned(),
        ));
    }
    let names: Vec<String> = names.into_iter().cloned().collect();
    let selection = match (names.is_empty(), &args.selector, args.all) {
        (false, None, false) => Selection::Names(names),
        (true, Some(s), false) => Selection::Selector(s.clone()),
        (true, None, true) => Selection::All,
        (true, None, false) => {
            return Err(PluginError::BadInput(
                "name the nodes, or use -l SELECTOR or --all".to_owned(),
            ));
        }
        _ => {
            return Err(PluginError::BadInput(
                "use exactly one of: node names, -l SELECTOR, --all".to_owned(),
            ));
        }
    };
    Ok((selection, changes))
}

/// One node's outcome.
struct Row {
    node: String,
    verdict: Verdict,
}

async fn label(args: &LabelArgs) -> Result<(String, u8), PluginError> {
    let (selection, changes) = parse(args)?;
    let config = match &args.config {
        Some(path) => read::config_file(path)?,
        None => Config::default(),
    };
    let client = api::connect().await?;
    let mut snapshot = api::snapshot(&client, &config.operator_namespace).await?;
    // --operator-version, then the config file's, win over the Deployment's, as in `serve`.
    snapshot.facts.operator = version::resolve(
        args.operator_version.given(&config),
        snapshot.facts.operator,
    );
    let chosen = chosen_nodes(&client, &snapshot.nodes, &selection).await?;
    if chosen.is_empty() {
        return Err(PluginError::BadInput("no node matches".to_owned()));
    }
    let (username, groups, identity_note) = whoami(&client).await;

    let mut rows = Vec::new();
    for node in chosen {
        let before = node.labels().clone();
        let mut after = before.clone();
        apply_changes(&mut after, &changes);
        let review = Review {
            node: node.name(),
            operation: Operation::Update,
            old_labels: Some(&before),
            labels: &after,
            username: &username,
            groups: &groups,
            dry_run: false,
            unknown_not_copied: 0,
            old_placement: None,
            // Empty while nodes are listed as metadata only (docs/gpu-operator.md §13).
            placement: &node.placement,
        };
        let verdict = policy::decide(&review, &snapshot.facts, &config.policy);
        rows.push(Row {
            node: node.name().to_owned(),
            verdict,
        });
    }

    let mut out = String::new();
    if snapshot.facts.source.is_unavailable() {
        let _ = writeln!(out, "note: {}", snapshot.facts.source.describe());
    }
    if snapshot.facts.operator.source.assumed().is_some() {
        let _ = writeln!(out, "note: {}", snapshot.facts.operator.describe());
    }
    for note in &snapshot.notes {
        let _ = writeln!(out, "note: {note}");
    }
    if let Some(note) = identity_note {
        let _ = writeln!(out, "note: {note}");
    }
    out.push_str(&table(&rows));
    let denied = rows.iter().any(|r| !r.verdict.allowed());
    if denied {
        if args.apply {
            out.push_str("nothing applied: a change is denied\n");
        }
        return Ok((out, 1));
    }
    if args.apply {
        apply(&client, &rows, &changes, &mut out).await?;
    }
    Ok((out, 0))
}

/// The nodes of `nodes` the selection names (a selector is matched by the API server).
async fn chosen_nodes<'n>(
    client: &Client,
    nodes: &'n [NodeView],
    selection: &Selection,
) -> Result<Vec<&'n NodeView>, PluginError> {
    let chosen: Vec<&NodeView> = match selection {
        Selection::All => nodes.iter().collect(),
        Selection::Names(names) => {
            let mut out = Vec::new();
            for name in names {
                match nodes.iter().find(|n| n.name() == name) {
                    Some(n) => out.push(n),
                    None => {
                        return Err(PluginError::BadInput(format!("node {name:?} not found")));
                    }
                }
            }
            out
        }
        Selection::Selector(selector) => {
            // The API server parses the selector, as for kubectl.
            let mut names: Vec<String> = Vec::new();
            let params = ListParams::default()
                .labels(selector)
                .limit(crate::k8s::node::NODE_PAGE_SIZE);
            list_pages_with(&Api::<NodeView>::all(client.clone()), params, |n| {
                names.push(n.name().to_owned());
            })
            .await
            .map_err(|e| PluginError::BadInput(format!("selector {selector:?}: {}", brief(&e))))?;
            nodes
                .iter()
                .filter(|n| names.iter().any(|m| m == n.name()))
                .collect()
        }
    };
    Ok(chosen)
}

/// Writes the changes to every node of `rows`, saying so in `out`.
async fn apply(
    client: &Client,
    rows: &[Row],
    changes: &[Change],
    out: &mut String,
) -> Result<(), PluginError> {
    let api = Api::<NodeView>::all(client.clone());
    for row in rows {
        let mut labels = Map::new();
        for change in changes {
            match change {
                Change::Set(k, v) => labels.insert(k.clone(), Value::String(v.clone())),
                Change::Remove(k) => labels.insert(k.clone(), Value::Null),
            };
        }
        let patch = serde_json::json!({ "metadata": { "labels": labels } });
        api.patch(
            &row.node,
            &PatchParams::apply(FIELD_MANAGER).validation_strict(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(|source| ClusterError::Write {
            what: format!("node {}", row.node),
            source,
        })?;
        let _ = writeln!(out, "node/{} labeled", row.node);
    }
    Ok(())
}

/// Who the kubeconfig authenticates as (matters for exemptions), from a SelfSubjectReview.
async fn whoami(client: &Client) -> (String, Vec<String>, Option<String>) {
    let review = SelfSubjectReview::default();
    match Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
    {
        Ok(r) => {
            let user = r.status.and_then(|s| s.user_info).unwrap_or_default();
            (
                user.username.unwrap_or_default(),
                user.groups.unwrap_or_default(),
                None,
            )
        }
        Err(e) => (
            String::new(),
            Vec::new(),
            Some(format!(
                "cannot tell who you are ({}): decided as for a user with no exemption",
                brief(&e)
            )),
        ),
    }
}

fn operands(set: OperandSet) -> String {
    let names: Vec<String> = set.iter().map(|o| o.to_string()).collect();
    if names.is_empty() {
        "-".to_owned()
    } else {
        names.join(",")
    }
}

/// NODE, operands before and after, the verdict, then each finding on its own line.
fn table(rows: &[Row]) -> String {
    let cells: Vec<[String; 4]> = rows
        .iter()
        .map(|r| {
            let verdict = match r.verdict.decision {
                Decision::Denied => "DENIED",
                Decision::Exempt => "ALLOWED (exempt)",
                Decision::Allowed if r.verdict.warnings.is_empty() => "ALLOWED",
                Decision::Allowed => "ALLOWED with warnings",
            };
            [
                r.node.clone(),
                operands(r.verdict.before),
                operands(r.verdict.after),
                verdict.to_owned(),
            ]
        })
        .collect();
    let header = ["NODE", "OPERANDS BEFORE", "OPERANDS AFTER", "VERDICT"];
    let width = |i: usize| {
        cells
            .iter()
            .map(|c| c[i].len())
            .chain([header[i].len()])
            .max()
            .unwrap_or(0)
    };
    let (w0, w1, w2) = (width(0), width(1), width(2));
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:w0$}  {:w1$}  {:w2$}  {}",
        header[0], header[1], header[2], header[3]
    );
    for (row, c) in rows.iter().zip(&cells) {
        let _ = writeln!(out, "{:w0$}  {:w1$}  {:w2$}  {}", c[0], c[1], c[2], c[3]);
        for f in &row.verdict.findings {
            let what = match f.action {
                Action::Deny => "deny",
                Action::Warn => "warn",
                Action::Audit => "audit",
                Action::Off => continue,
            };
            let _ = writeln!(out, "  {what} {}: {}", f.rule, f.message);
        }
    }
    out
}
