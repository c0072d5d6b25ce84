//! The change rules: what a request writes.

use super::{Change, Ctx, Found, Rule, UNKNOWN_KEYS_SHOWN};
use crate::core::echo::echo;
use crate::core::operands::{
    DEPLOY_PREFIX, GPU_PRESENT_KEY, LabelChange, OPERANDS_KEY, Operand, Stack, Value,
    closest_known, deploy_labels, is_gpu_node, is_unknown_deploy_key,
};
use crate::core::operator::Plan;
use crate::core::pauses::{Build, Pauser, resumes};

impl Ctx<'_, '_> {
    /// Every unknown key the request writes, as one finding: a request with many of them costs
    /// one message and one warning, naming the first few.
    pub(super) fn unknown_deploy_label(&self, out: &mut Vec<Found>) {
        self.deploy_label_of_a_later_version(out);
        let mut unknown = self
            .written_deploy_labels()
            .filter(|(key, _)| is_unknown_deploy_key(key));
        let Some(first) = unknown.next() else {
            return;
        };
        let shown: Vec<(&str, &str)> = std::iter::once(first)
            .chain(unknown.by_ref().take(UNKNOWN_KEYS_SHOWN - 1))
            .collect();
        // Written keys a caller left out of the labels it gave (a review of thousands).
        let more = unknown.count() + self.review.unknown_not_copied;
        // "key=value; hint" for the message, "key; hint" for the warning.
        let described = |(key, value): (&str, &str)| {
            let suggestion = closest_known(&key[DEPLOY_PREFIX.len()..]);
            let hint = suggestion
                .map(|s| format!("; did you mean {DEPLOY_PREFIX}{s}?"))
                .unwrap_or_else(|| "; no GPU Operator component reads it".to_owned());
            let short_hint = suggestion
                .map(|s| format!("; did you mean {s}?"))
                .unwrap_or_else(|| "; no GPU Operator component reads it".to_owned());
            (
                echo(key).into_owned(),
                format!("{:?}", echo(value)),
                hint,
                short_hint,
            )
        };
        let node = self.node();
        let (message, warning) = if let [one] = shown[..] {
            let (key, value, hint, short_hint) = described(one);
            (
                format!(
                    "node {node}: {key}={value} is not a deploy label of any GPU Operator operand{hint}"
                ),
                format!("{key} is not a known deploy label{short_hint}"),
            )
        } else {
            let total = shown.len() + more;
            let and_more = if more > 0 {
                format!(" (and {more} more)")
            } else {
                String::new()
            };
            let (long, short): (Vec<String>, Vec<String>) = shown
                .into_iter()
                .map(|pair| {
                    let (key, value, hint, short_hint) = described(pair);
                    (format!("{key}={value}{hint}"), format!("{key}{short_hint}"))
                })
                .unzip();
            (
                format!(
                    "node {node}: {total} labels are not deploy labels of any GPU Operator operand: {}{and_more}",
                    long.join(", ")
                ),
                format!(
                    "{total} labels are not known deploy labels: {}{and_more}",
                    short.join(", ")
                ),
            )
        };
        out.push(Found {
            rule: Rule::UnknownDeployLabel,
            change: Change::New,
            message,
            warning,
        });
    }

    pub(super) fn value_not_true(&self, out: &mut Vec<Found>) {
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
                out.push(Found {
                    rule: Rule::ValueNotTrue,
                    change: Change::New,
                    message,
                    warning,
                });
            }
        }
    }

    /// What the operator's next labelling pass does to the labels this request writes
    /// ([`Plan`], `docs/gpu-operator.md`): adds a removed (from v26.7 also an emptied) label
    /// back as `true`, sweeps a label outside the node's set, and for `operands=false` deletes
    /// every label it manages. Only the labels the request changes are asked about.
    pub(super) fn operator_will_restore(&self, out: &mut Vec<Found>) {
        let Some(old) = self.review.old_labels else {
            return;
        };
        let labels = self.review.labels;
        let facts = self.facts;
        // Judged as the operator sees a node NFD has labelled: a node with gpu.present=true
        // and no NFD label is flipped and swept by the operator (`check` shows that pass as
        // it is), but that is NFD's absence, not this request's doing. Nodes without any GPU
        // label are left to `device-plugin-on-non-gpu-node`.
        if !is_gpu_node(labels) {
            return;
        }
        // Every finding below is about a deploy label the request adds, changes or removes.
        if self.changes.is_empty() {
            return;
        }
        self.pause_overwrites(old, out);
        let plan = Plan::new(
            labels,
            true,
            facts.operator.era(),
            &facts.sandbox,
            facts.stack,
        );
        let was_off = old.get(OPERANDS_KEY).is_some_and(|v| v == "false");
        if plan.operands_disabled {
            self.operands_stay_off(&plan, was_off, out);
            return;
        }
        if was_off && self.operands_back_on(&plan, out) {
            return;
        }
        for change in self.changes {
            self.change_undone(&plan, change, out);
        }
    }

    /// `operands=false` on the node after the request: newly set, the pass sweeps every label
    /// it manages; already there, it deletes what the request writes.
    fn operands_stay_off(&self, plan: &Plan, was_off: bool, out: &mut Vec<Found>) {
        let labels = self.review.labels;
        let version = &self.facts.operator.version.text;
        let node = self.node();
        if !was_off {
            let gone: Vec<&str> = deploy_labels(labels)
                .filter(|(k, _)| Operand::from_key(k).is_some_and(|op| plan.sweep.contains(op)))
                .map(|(k, _)| &k[DEPLOY_PREFIX.len()..])
                .collect();
            if !gone.is_empty() {
                out.push(Found {
                    rule: Rule::OperatorWillRestore,
                    change: Change::New,
                    message: format!(
                        "node {node}: with {OPERANDS_KEY}=false the GPU Operator ({version}) sweeps every deploy \
                         label it manages ({}), the =false ones too; removing {OPERANDS_KEY} later adds them all \
                         back as \"true\", so those choices are lost.",
                        gone.join(", ")
                    ),
                    warning: format!(
                        "{OPERANDS_KEY}=false: the GPU Operator sweeps {} deploy labels; removing it later adds them back as true, =false choices lost",
                        gone.len()
                    ),
                });
            }
        } else {
            // operands=false stays: every pass deletes the labels it manages, so what the
            // request writes there is lost.
            let mut lost: Vec<&str> = self
                .changes
                .iter()
                .filter(|c| c.new.is_some())
                .filter_map(|c| Operand::from_key(c.key))
                .filter(|op| plan.sweep.contains(*op))
                .map(Operand::name)
                .collect();
            if !lost.is_empty() {
                lost.sort_unstable();
                out.push(Found {
                    rule: Rule::OperatorWillRestore,
                    change: Change::New,
                    message: format!(
                        "node {node}: {OPERANDS_KEY}=false stays on this node, so the GPU Operator ({version}) \
                         deletes the deploy labels this request writes ({}) on its next labelling pass, and on \
                         every pass while it stays; remove {OPERANDS_KEY} first (the operator then adds its \
                         labels back as \"true\"), then set the ones to keep off to false.",
                        lost.join(", ")
                    ),
                    warning: format!(
                        "{OPERANDS_KEY}=false stays: the GPU Operator will delete the {} deploy labels this request writes",
                        lost.len()
                    ),
                });
            }
        }
    }

    /// `operands=false` removed: the pass adds the node's labels back as `true`. Whether it
    /// found any (then the labels the request changes need no finding of their own).
    fn operands_back_on(&self, plan: &Plan, out: &mut Vec<Found>) -> bool {
        let version = &self.facts.operator.version.text;
        let node = self.node();
        let mut names: Vec<&str> = plan.added(self.review.labels).map(Operand::name).collect();
        if names.is_empty() {
            return false;
        }
        names.sort_unstable();
        out.push(Found {
            rule: Rule::OperatorWillRestore,
            change: Change::New,
            message: format!(
                "node {node}: without {OPERANDS_KEY}=false the GPU Operator ({version}) adds {} back as \"true\" \
                 on its next labelling pass; set the ones to keep off to false afterwards.",
                names.join(", ")
            ),
            warning: format!(
                "{OPERANDS_KEY} no longer false: the GPU Operator will add {} deploy labels back as true",
                names.len()
            ),
        });
        true
    }

    /// One label the request changes that the pass undoes: sweeps a value it sets, or adds a
    /// label it removes or empties back as `true`.
    fn change_undone(&self, plan: &Plan, change: &LabelChange<'_>, out: &mut Vec<Found>) {
        let &LabelChange {
            key,
            old: old_value,
            new: new_value,
        } = change;
        let facts = self.facts;
        let version = &facts.operator.version.text;
        let node = self.node();
        let Some(op) = Operand::from_key(key) else {
            return;
        };
        let after = plan.value_after(op, new_value);
        if let (Some(value), None) = (new_value, after) {
            let where_ = match (plan.applied, plan.workload) {
                (Some(Stack::GpuCluster), _) => {
                    "the GPUCluster (DRA) stack's deploy labels".to_owned()
                }
                (_, Some(w)) => format!("a {} node's deploy labels", w.name()),
                (_, None) => format!("the deploy labels of a node with {GPU_PRESENT_KEY}=true"),
            };
            out.push(Found {
                rule: Rule::OperatorWillRestore,
                change: Change::New,
                message: format!(
                    "node {node}: this request sets {key}={value:?}, but the GPU Operator ({version}) sweeps \
                     it on its next labelling pass: it is not one of {where_}."
                ),
                warning: format!(
                    "{key}={value:?}: the GPU Operator will sweep it (not one of {where_})"
                ),
            });
            return;
        }
        let what = match (old_value, new_value) {
            (Some(_), None) if after == Some("true") => "removes",
            (Some(o), Some("")) if !o.is_empty() && after == Some("true") => "empties",
            _ => return,
        };
        let done = if what == "removes" {
            "removed"
        } else {
            "emptied"
        };
        // `container-toolkit=false` under a running device plugin is itself refused:
        // the advice must name the device plugin too.
        let plugin = Operand::DevicePlugin.key();
        let strands_plugin = op == Operand::ContainerToolkit
            && self.after.set.contains(Operand::DevicePlugin)
            && facts.toolkit_managed;
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
        out.push(Found {
            rule: Rule::OperatorWillRestore,
            change: Change::New,
            message: format!(
                "node {node}: this request {what} {key}, but the GPU Operator ({version}) adds it back \
                 as \"true\" on its next labelling pass; {fix}."
            ),
            warning: format!("{key} {done}: the GPU Operator will add it back as true; {short_fix}"),
        });
    }
}

impl Ctx<'_, '_> {
    /// A label the request writes while a component has it paused, or owns it during its
    /// pause, is written back by that component when its work ends ([`resumes`]): the edit is
    /// lost then. One finding per component, naming each label and the value it gets back.
    fn pause_overwrites(&self, old: &crate::core::operands::Labels, out: &mut Vec<Found>) {
        let written = resumes(old, Build::of(&self.facts.operator.version));
        if written.is_empty() {
            return;
        }
        let node = self.node();
        let mut by: Vec<(Pauser, Vec<String>)> = Vec::new();
        for change in self.changes {
            let Some((_, resume)) = written.iter().find(|(k, _)| k == change.key) else {
                continue;
            };
            if change.new == Some(resume.value.as_str()) {
                continue;
            }
            let shown = match change.new {
                Some(v) => format!("{}={}", change.key, echo(v)),
                None => format!("{}-", change.key),
            };
            let item = format!("{shown} goes back to {:?}", resume.value);
            match by.iter_mut().find(|(p, _)| *p == resume.by) {
                Some((_, items)) => items.push(item),
                None => by.push((resume.by, vec![item])),
            }
        }
        for (pauser, items) in by {
            out.push(Found {
                rule: Rule::OperatorWillRestore,
                change: Change::New,
                message: format!(
                    "node {node}: {} paused this node's GPU components and, {}, writes back the labels \
                     it read before pausing, so this request's edit is lost then: {}; make the change \
                     after it has finished.",
                    pauser.name(),
                    pauser.when(),
                    items.join(", ")
                ),
                warning: format!(
                    "{node}: {} will overwrite {} label(s) this request writes {}",
                    pauser.name(),
                    items.len(),
                    pauser.when()
                ),
            });
        }
    }
}

impl Ctx<'_, '_> {
    /// Keys of operands the version followed does not have yet (`client` and the DRA keys
    /// before v26.7, `kata-sandbox-device-plugin` before v26.3): no component of that version
    /// reads them, so they are as unknown there as a typo, whatever a later version does.
    fn deploy_label_of_a_later_version(&self, out: &mut Vec<Found>) {
        let era = self.facts.operator.era();
        let mut later: Vec<(&str, crate::core::era::Era)> = self
            .written_deploy_labels()
            .filter_map(|(key, _)| Operand::from_key(key).map(|op| (key, op.info().since)))
            .filter(|(_, since)| *since > era)
            .collect();
        if later.is_empty() {
            return;
        }
        later.truncate(UNKNOWN_KEYS_SHOWN);
        let node = self.node();
        let version = &self.facts.operator.version.text;
        let keys: Vec<String> = later
            .iter()
            .map(|(key, since)| format!("{key} (read from {})", since.name()))
            .collect();
        out.push(Found {
            rule: Rule::UnknownDeployLabel,
            change: Change::New,
            message: format!(
                "node {node}: no component of GPU Operator {version} reads {}: the label does nothing \
                 on this version.",
                keys.join(", ")
            ),
            warning: format!(
                "{} not read by GPU Operator {version}: {}",
                if later.len() == 1 { "a label" } else { "labels" },
                later
                    .iter()
                    .map(|(key, _)| &key[DEPLOY_PREFIX.len()..])
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        });
    }
}
