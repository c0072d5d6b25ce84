//! `gpu-deploy-guard completion bash|zsh|fish`: the shell completion script, generated from
//! the clap definition by clap_complete, on standard output.

use clap::ValueEnum;
use clap_complete::Shell;

/// The shells a completion script is written for.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum CompletionShell {
    Bash,
    Zsh,
    Fish,
}

#[derive(clap::Args)]
pub struct CompletionArgs {
    /// The shell: bash, zsh or fish.
    #[arg(value_enum)]
    pub shell: CompletionShell,
}

/// Writes the script for `command` (the root command, named `bin`) to `out`.
pub fn write(
    shell: CompletionShell,
    command: &mut clap::Command,
    bin: &str,
    out: &mut dyn std::io::Write,
) {
    let shell = match shell {
        CompletionShell::Bash => Shell::Bash,
        CompletionShell::Zsh => Shell::Zsh,
        CompletionShell::Fish => Shell::Fish,
    };
    clap_complete::generate(shell, command, bin, out);
}
