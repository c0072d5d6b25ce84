//! Stand-in command line of the `audit` branch: dispatches `check` (with
//! `--cluster-policy`) and `audit` only, so that both can be tested as a user
//! runs them. The real `main.rs` (with `serve` and `certs`) replaces it.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use gpu_deploy_guard::audit::cli::{AuditArgs, run};
use gpu_deploy_guard::check::{self, CheckInput};
use gpu_deploy_guard::cluster_policy::facts_from_cluster_policy_file;

#[derive(Parser)]
#[command(name = "gpu-deploy-guard", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Judge a label change on a Node file, as the webhook would.
    Check(CheckArgs),
    /// Check that every operand a node's labels call for runs there.
    Audit(AuditArgs),
}

#[derive(Copy, Clone, ValueEnum)]
enum OperationArg {
    Update,
    Create,
}

#[derive(Copy, Clone, ValueEnum)]
enum CheckFormat {
    Text,
    Json,
}

#[derive(clap::Args)]
struct CheckArgs {
    /// The Node (YAML or JSON; `-` for standard input).
    #[arg(long, env = "GDG_CHECK_NODE")]
    node: PathBuf,
    /// The Node before the change.
    #[arg(long, env = "GDG_CHECK_OLD_NODE")]
    old_node: Option<PathBuf>,
    /// Label changes in kubectl syntax: `key=value` or `key-`.
    changes: Vec<String>,
    #[arg(
        long,
        value_enum,
        default_value = "update",
        env = "GDG_CHECK_OPERATION"
    )]
    operation: OperationArg,
    #[arg(long, env = "GDG_CHECK_USER")]
    user: Option<String>,
    #[arg(long = "group", env = "GDG_CHECK_GROUPS", value_delimiter = ',')]
    groups: Vec<String>,
    #[arg(long, env = "GDG_CONFIG")]
    config: Option<PathBuf>,
    /// The ClusterPolicy (`kubectl get clusterpolicy -o yaml`): its operand switches apply.
    #[arg(long, env = "GDG_CLUSTER_POLICY", value_name = "FILE")]
    cluster_policy: Option<PathBuf>,
    #[arg(
        short,
        long,
        value_enum,
        default_value = "text",
        env = "GDG_CHECK_OUTPUT"
    )]
    output: CheckFormat,
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Audit(args) => run(args),
        Command::Check(args) => check_command(args),
    }
}

fn check_command(args: CheckArgs) -> ExitCode {
    let facts = match &args.cluster_policy {
        Some(path) => match facts_from_cluster_policy_file(path) {
            Ok(facts) => facts,
            Err(e) => return fail(&e),
        },
        None => Default::default(),
    };
    let input = CheckInput {
        node: args.node,
        old_node: args.old_node,
        changes: args.changes,
        create: matches!(args.operation, OperationArg::Create),
        user: args.user,
        groups: args.groups,
        config: args.config,
        facts,
    };
    match check::run(&input) {
        Ok(outcome) => {
            let text = match args.output {
                CheckFormat::Text => outcome.to_text(),
                CheckFormat::Json => outcome.to_json(),
            };
            print!("{text}");
            ExitCode::from(u8::try_from(outcome.exit_code()).unwrap_or(2))
        }
        Err(e) => fail(&e),
    }
}

fn fail(e: &dyn std::error::Error) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::from(2)
}
