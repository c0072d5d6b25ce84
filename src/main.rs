//! The `gpu-deploy-guard` command: the clap root. Each subcommand's flags and code live in
//! its area (`serve`, `cli::check`, `cli::certs`, `cli::audit`).
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use gpu_deploy_guard::cli::kubectl_plugin::{self, PluginCli};
use gpu_deploy_guard::cli::{audit, certs, check, check_policy, completion, operands};
use gpu_deploy_guard::serve;

/// Keeps NVIDIA GPU Operator deploy labels (nvidia.com/gpu.deploy.*) from breaking a node's GPU stack.
#[derive(Parser)]
#[command(name = "gpu-deploy-guard", version = gpu_deploy_guard::VERSION, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the validating admission webhook (HTTPS) and the admin port (probes, metrics).
    Serve(Box<serve::cmd::ServeArgs>),
    /// Decide offline what the webhook would answer for a change to a Node.
    Check(check::CheckArgs),
    /// Decide offline what the webhook would answer for a ClusterPolicy or NVIDIADriver change,
    /// over a node list.
    CheckPolicy(check_policy::CheckPolicyArgs),
    /// Write a CA and a serving certificate for the webhook, and print the caBundle.
    Certs(certs::CertsArgs),
    /// Check that every operand a node's labels call for runs there (a cluster or files).
    Audit(audit::AuditArgs),
    /// Print the model of the GPU Operator's operands for a version: deploy labels, DaemonSets,
    /// ClusterPolicy switches, what each waits for and which workloads label it.
    Operands(operands::OperandsArgs),
    /// Print a shell completion script (bash, zsh or fish) on standard output.
    Completion(completion::CompletionArgs),
}

fn main() -> ExitCode {
    // Installed as kubectl-gpu_deploy_guard, the same binary is `kubectl gpu-deploy-guard`.
    if kubectl_plugin::invoked_as_plugin(std::env::args_os().next().as_deref()) {
        return kubectl_plugin::run(PluginCli::parse());
    }
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => report(serve::cmd::run(*args)),
        Command::Check(args) => check::run(args),
        Command::CheckPolicy(args) => check_policy::run(args),
        Command::Certs(args) => report(certs::run(args)),
        Command::Audit(args) => audit::run(args),
        Command::Operands(args) => operands::run(&args),
        Command::Completion(args) => {
            use clap::CommandFactory;
            completion::write(
                args.shell,
                &mut Cli::command(),
                "gpu-deploy-guard",
                &mut std::io::stdout(),
            );
            ExitCode::SUCCESS
        }
    }
}

/// Exit 0 on success; on failure, the error chain on stderr and exit 2.
fn report(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
        PluginCli::command().debug_assert();
    }
}
