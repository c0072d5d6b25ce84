//! `gpu-deploy-guard operands`: the operand table ([`OPERANDS`]) as one operator version has
//! it, the roster a GPU platform team otherwise writes by hand: per operand its deploy label,
//! its DaemonSets, its ClusterPolicy switch and default, what its pods wait for and which
//! workload configurations the operator labels it on.

use std::fmt::Write as _;
use std::process::ExitCode;

use serde::Serialize;

use crate::core::config::Config;
use crate::core::era::Era;
use crate::core::operands::{Labelled, OPERANDS, OperandInfo, SandboxMode, Wait};
use crate::core::version::{self, Followed};
use crate::flags::OperatorVersionArg;

#[derive(clap::Args, Debug)]
pub struct OperandsArgs {
    #[command(flatten)]
    pub operator_version: OperatorVersionArg,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Text)]
    pub output: Format,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Text,
    Json,
}

/// One operand as the version has it.
#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
struct Row {
    operand: &'static str,
    deploy_label: &'static str,
    daemon_sets: &'static [&'static str],
    /// `spec.<field>.enabled` and its default; absent for an operand without a switch.
    #[serde(skip_serializing_if = "Option::is_none")]
    switch: Option<Switch>,
    /// Whether this version's operator deploys its DaemonSets at all.
    deployed: bool,
    /// `spec.sandboxWorkloads.mode` it needs, from v26.3.
    #[serde(skip_serializing_if = "Option::is_none")]
    sandbox_mode: Option<&'static str>,
    waits_for: Vec<&'static str>,
    /// How the operator's labelling pass treats its label.
    labelled_on: Vec<&'static str>,
}

#[derive(Serialize, Debug)]
struct Switch {
    field: String,
    default: bool,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Report<'a> {
    operator_version: &'a str,
    era: &'static str,
    version_source: String,
    operands: Vec<Row>,
}

fn wait_name(wait: Wait) -> &'static str {
    match wait {
        Wait::Toolkit => "container-toolkit (the nvidia runtime)",
        Wait::ToolkitReady => "operator-validator (toolkit-ready)",
        Wait::SandboxValidator => "sandbox-validator",
        Wait::DraDriver => "dra-driver (its GPU claim)",
    }
}

fn row(info: &OperandInfo, era: Era) -> Row {
    let labelled_on = match info.labelled {
        Labelled::In(sets) => sets.workloads(),
        Labelled::MigCapable => vec!["container (MIG-capable GPUs)"],
        Labelled::Swept => vec!["none: swept from ClusterPolicy nodes (the GPUCluster stack's)"],
        Labelled::No => vec!["none: written by a person or another tool"],
    };
    Row {
        operand: info.operand.name(),
        deploy_label: info.key,
        daemon_sets: info.daemonsets,
        switch: info.switch.map(|s| Switch {
            field: format!("spec.{}.enabled", s.field),
            default: s.default,
        }),
        deployed: !info.daemonsets.is_empty() && info.until.reaches(era),
        sandbox_mode: info
            .mode
            .filter(|_| era.has_sandbox_mode())
            .map(|m| match m {
                SandboxMode::KubeVirt => "kubevirt",
                SandboxMode::Kata => "kata",
            }),
        waits_for: info.waits.iter().map(|w| wait_name(*w)).collect(),
        labelled_on,
    }
}

/// The operands of the version `followed` names, as text or JSON.
pub fn render(followed: &Followed, format: Format) -> String {
    let era = followed.era();
    let rows: Vec<Row> = OPERANDS
        .iter()
        .filter(|info| era.reaches(info.since))
        .map(|info| row(info, era))
        .collect();
    match format {
        Format::Json => {
            let report = Report {
                operator_version: &followed.version.text,
                era: era.name(),
                version_source: followed.describe(),
                operands: rows,
            };
            // Plain data with string keys: serialization cannot fail.
            serde_json::to_string_pretty(&report).unwrap_or_default() + "\n"
        }
        Format::Text => text(followed, &rows),
    }
}

fn text(followed: &Followed, rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}: the model of the {} era",
        followed.describe(),
        followed.era().name()
    );
    for r in rows {
        let _ = writeln!(out, "\n{} ({})", r.operand, r.deploy_label);
        let daemonsets = if r.daemon_sets.is_empty() {
            "none".to_owned()
        } else if r.deployed {
            r.daemon_sets.join(", ")
        } else {
            format!(
                "{} (not deployed by this version)",
                r.daemon_sets.join(", ")
            )
        };
        let _ = writeln!(out, "  daemonsets:  {daemonsets}");
        let switch = r.switch.as_ref().map_or_else(
            || "none".to_owned(),
            |s| format!("{} (default {})", s.field, s.default),
        );
        let _ = writeln!(out, "  switch:      {switch}");
        if let Some(mode) = r.sandbox_mode {
            let _ = writeln!(out, "  mode:        sandboxWorkloads.mode {mode}");
        }
        let waits = if r.waits_for.is_empty() {
            "nothing".to_owned()
        } else {
            r.waits_for.join(", ")
        };
        let _ = writeln!(out, "  waits for:   {waits}");
        let _ = writeln!(out, "  labelled on: {}", r.labelled_on.join(", "));
    }
    out
}

pub fn run(args: &OperandsArgs) -> ExitCode {
    let followed = version::resolve(
        args.operator_version.given(&Config::default()),
        Followed::assumed("no --operator-version given"),
    );
    print!("{}", render(&followed, args.output));
    ExitCode::SUCCESS
}
