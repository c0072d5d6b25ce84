//! `check`'s text output: the verdict as kubectl would print it, the findings, the operator's
//! next labelling pass, placement, and the operand table.

use std::fmt::Write as _;

use super::CheckOutcome;
use crate::core::operands::{DEPLOY_PREFIX, Labels, Operand, OperandSet, Stack};
use crate::core::operator::LabelAction;
use crate::core::policy::{self, Decision};
use crate::core::rules;

impl CheckOutcome {
    pub fn to_text(&self) -> String {
        let v = &self.verdict;
        let mut out = String::new();
        let decision = match v.decision {
            Decision::Denied => "DENIED",
            Decision::Exempt => "ALLOWED (exempt)",
            Decision::Allowed if v.warnings.is_empty() => "ALLOWED",
            Decision::Allowed => "ALLOWED with warnings",
        };
        let _ = writeln!(
            out,
            "node {} ({}): {decision}",
            self.node,
            self.operation.as_str()
        );
        for note in &self.notes {
            let _ = writeln!(out, "note: {note}");
        }
        if let Some(msg) = &v.message {
            let _ = writeln!(out, "\nError from server (Forbidden): {msg}");
        }
        if !v.warnings.is_empty() {
            out.push('\n');
            for w in &v.warnings {
                let _ = writeln!(out, "Warning: {w}");
            }
        }
        if let Some(msg) = &v.would_deny {
            let _ = writeln!(
                out,
                "\n{}; it would otherwise be denied: {msg}",
                v.exempt.as_deref().unwrap_or("exempt")
            );
        }
        if !v.findings.is_empty() {
            let _ = writeln!(out, "\nfindings:");
            for f in &v.findings {
                let change = match f.change {
                    rules::Change::New => "new",
                    rules::Change::Existing => "existing",
                };
                let _ = writeln!(
                    out,
                    "  {:<5} {:<30} {change:<8} {}",
                    f.action.as_str(),
                    f.rule.id(),
                    f.message
                );
            }
        }
        out.push_str(&self.pass_line());
        out.push_str(&self.placement_lines());
        out.push('\n');
        let passed = policy::starts_pass(self.before_labels.as_ref(), &self.after_labels)
            .then_some(&self.operator.labels);
        out.push_str(&operand_table(
            v.before,
            v.after,
            self.before_labels.as_ref(),
            &self.after_labels,
            passed,
        ));
        out
    }

    /// The operator's next labelling pass, in one line.
    fn pass_line(&self) -> String {
        let mut out = String::new();
        let changes: Vec<String> = self
            .operator
            .actions
            .iter()
            .filter(|(_, a)| !matches!(a, LabelAction::Keep | LabelAction::Untouched))
            .map(|(k, a)| match a {
                LabelAction::RestoreFromPaused { to } => {
                    format!(
                        "{} restore-from-paused (as {to:?})",
                        &k[DEPLOY_PREFIX.len()..]
                    )
                }
                _ => format!("{} {}", &k[DEPLOY_PREFIX.len()..], a.as_str()),
            })
            .collect();
        let _ = writeln!(
            out,
            "\nGPU Operator {}{}{}: its next labelling pass: {}",
            self.version.version,
            match (
                self.version.source.assumed(),
                self.version.version.outside_model()
            ) {
                (Some(why), _) => format!(" (assumed: {why})"),
                (None, Some(outside)) => format!(" ({outside})"),
                (None, None) => String::new(),
            },
            match self.stack {
                Stack::ClusterPolicy => String::new(),
                other => format!(", {}", other.describe()),
            },
            if changes.is_empty() {
                "no change".to_owned()
            } else {
                changes.join(", ")
            }
        );
        out
    }

    /// Where a taint or the required node affinity stops an operand the labels select.
    fn placement_lines(&self) -> String {
        let mut out = String::new();
        for (op, p) in &self.placement {
            let state = p.state(self.kept.contains(*op)).as_str();
            let _ = match p.taint() {
                Some(t) => writeln!(out, "placement: {op} {state} (taint {t})"),
                None => writeln!(out, "placement: {op} {state} (required node affinity)"),
            };
        }
        out
    }
}

/// The operands the DaemonSet controller runs before and after, for every operand that runs in
/// either state or whose label is on the node, plus those always shown (the operand table's
/// `always shown` column). `passed`: the labels the operator's pass leaves when the request
/// starts one on the same update (what `after` was judged on); a label it changes is shown with
/// the value it gets.
fn operand_table(
    before: OperandSet,
    after: OperandSet,
    old: Option<&Labels>,
    new: &Labels,
    passed: Option<&Labels>,
) -> String {
    let has_label = |op: Operand| {
        new.contains_key(op.key())
            || old.is_some_and(|o| o.contains_key(op.key()))
            || passed.is_some_and(|p| p.contains_key(op.key()))
    };
    let shown = |labels: &Labels, op: Operand| {
        labels
            .get(op.key())
            .map_or_else(|| "(none)".to_owned(), |v| format!("{v:?}"))
    };
    let mut out = format!(
        "{:<28} {:<8} {:<8} {}\n",
        "operand", "before", "after", "label after"
    );
    for op in Operand::all() {
        if !(op.info().always_shown || before.contains(op) || after.contains(op) || has_label(op)) {
            continue;
        }
        let runs = |set: OperandSet| if set.contains(op) { "runs" } else { "-" };
        let mut label = shown(new, op);
        if let Some(p) = passed.filter(|p| p.get(op.key()) != new.get(op.key())) {
            label = format!("{label}, then {} by the operator's pass", shown(p, op));
        }
        let marker = if before.contains(op) != after.contains(op) {
            "  <- changes"
        } else {
            ""
        };
        let before_text = if old.is_some() { runs(before) } else { "(new)" };
        let _ = writeln!(
            out,
            "{:<28} {:<8} {:<8} {label}{marker}",
            op.name(),
            before_text,
            runs(after)
        );
    }
    out
}
