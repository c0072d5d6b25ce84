//! The change rules: what a request writes.

use super::{Action, Change, Ctx, Finding, Rule};
use crate::core::operands::{
    DEPLOY_PREFIX, OPERANDS_KEY, Operand, Value, Writer, closest_known, is_gpu_node,
};

impl Ctx<'_, '_> {
    pub(super) fn unknown_deploy_label(&self, out: &mut Vec<Finding>) {
        for (key, value) in self.written_deploy_labels() {
            if key == OPERANDS_KEY || Operand::from_key(key).is_some() {
                continue;
            }
            let suffix = &key[DEPLOY_PREFIX.len()..];
            let suggestion = closest_known(suffix);
            let hint = suggestion
                .map(|s| format!("; did you mean {DEPLOY_PREFIX}{s}?"))
                .unwrap_or_else(|| "; no GPU Operator component reads it".to_owned());
            let short_hint = suggestion
                .map(|s| format!("; did you mean {s}?"))
                .unwrap_or_else(|| "; no GPU Operator component reads it".to_owned());
            let node = self.node();
            out.push(Finding {
                rule: Rule::UnknownDeployLabel,
                action: Action::Off,
                change: Change::New,
                message: format!(
                    "node {node}: {key}={value:?} is not a deploy label of any GPU Operator operand{hint}"
                ),
                warning: format!("{key} is not a known deploy label{short_hint}"),
            });
        }
    }

    pub(super) fn value_not_true(&self, out: &mut Vec<Finding>) {
        let node = self.node();
        for (key, value) in self.written_deploy_labels() {
            let kind = Value::of(value);
            let text = if key == OPERANDS_KEY {
                // The operator removes every deploy label only for the exact string `false`.
                (kind == Value::LooksOff).then(|| {
                    (
                        format!(
                            "node {node}: {key}={value:?} does not switch the operands off: the GPU Operator \
                             only reacts to exactly \"false\"."
                        ),
                        format!("{key}={value:?} does not disable operands: only the exact value false does"),
                    )
                })
            } else if let Some(op) = Operand::from_key(key) {
                match kind {
                    Value::LooksOn => Some((
                        format!(
                            "node {node}: {key}={value:?} does not schedule {op}: DaemonSets select exactly \
                             \"true\"; write {key}=true."
                        ),
                        format!(
                            "{key}={value:?} schedules nothing: only the exact value true does"
                        ),
                    )),
                    Value::Other => Some((
                        format!(
                            "node {node}: {key}={value:?} is neither \"true\" nor \"false\", so {op} will not run here."
                        ),
                        format!(
                            "{key}={value:?} is neither true nor false: {op} will not run here"
                        ),
                    )),
                    _ => None,
                }
            } else {
                None
            };
            if let Some((message, warning)) = text {
                out.push(Finding {
                    rule: Rule::ValueNotTrue,
                    action: Action::Off,
                    change: Change::New,
                    message,
                    warning,
                });
            }
        }
    }

    pub(super) fn operator_will_restore(&self, out: &mut Vec<Finding>) {
        let Some(old) = self.review.old_labels else {
            return;
        };
        let labels = self.review.labels;
        let operands_off = labels.get(OPERANDS_KEY).is_some_and(|v| v == "false");
        if operands_off || !is_gpu_node(labels) {
            return;
        }
        let node = self.node();
        for (key, old_value) in old.iter().filter(|(k, _)| k.starts_with(DEPLOY_PREFIX)) {
            let Some(op) = Operand::from_key(key) else {
                continue;
            };
            if op.info().writer != Writer::Operator {
                continue;
            }
            let (what, when) = match labels.get(key) {
                None => ("removes", "on its next labelling pass"),
                Some(v) if v.is_empty() && !old_value.is_empty() => (
                    "empties",
                    "(v26.7 and later; older versions leave it empty and run nothing)",
                ),
                _ => continue,
            };
            let done = if what == "removes" {
                "removed"
            } else {
                "emptied"
            };
            // `container-toolkit=false` under a running device plugin is itself refused: the
            // advice must name the device plugin too.
            let plugin = Operand::DevicePlugin.key();
            let strands_plugin = op == Operand::ContainerToolkit
                && self.after.contains(Operand::DevicePlugin)
                && self.facts.toolkit_managed;
            let (fix, short_fix) = if strands_plugin {
                (
                    format!("set {key}=false together with {plugin}=false to keep the toolkit off"),
                    "keep it off only with device-plugin=false too",
                )
            } else {
                (
                    format!("set {key}=false to keep {op} off"),
                    "use =false to keep it off",
                )
            };
            out.push(Finding {
                rule: Rule::OperatorWillRestore,
                action: Action::Off,
                change: Change::New,
                message: format!(
                    "node {node}: this request {what} {key}, but the GPU Operator sets it back to \"true\" {when}; {fix}."
                ),
                warning: format!("{key} {done}: the GPU Operator will set it back to true; {short_fix}"),
            });
        }
    }
}
