//! The rules: [`RULES`] is the one table of everything about each rule (id, kind, default
//! action, severity and pass text for the report, and the functions that find it). The
//! functions live in [`state`] (rules on what a node's labels make it run), [`change`] (rules on
//! what a request writes), [`fleet`] (rules on a GPU-policy change over the fleet), [`pods`]
//! (rules on what a node's pods show) and `history` (rules on how long a node's pauses and
//! upgrade states have lasted); each reads its context ([`Ctx`], [`FleetCtx`],
//! [`PodCtx`]) and pushes [`Found`]s. Every caller runs the rows' functions of one kind in
//! table order, so a new rule is a row, a variant of [`Rule`] and a function.

mod change;
mod dra;
pub mod fleet;
mod foreign;
mod history;
mod placement;
pub mod pods;
mod state;
mod table;

pub use fleet::FleetCtx;
pub use pods::PodCtx;
pub use table::RULES;

/// How many unknown deploy keys one finding names; it counts the others.
pub const UNKNOWN_KEYS_SHOWN: usize = 5;

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::core::facts::ClusterFacts;
use crate::core::operands::{LabelChange, Operand, OperandSet};
use crate::core::placement::Runs;
use crate::core::review::Review;

/// A rule's id is part of the interface: config keys, JSON output, metrics and annotations use it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rule {
    DevicePluginWithoutToolkit,
    OperandWithoutToolkit,
    OperandWithoutValidator,
    OperandWithoutSandboxValidator,
    OperandWithoutDraDriver,
    DcgmExporterWithoutDcgm,
    DevicePluginOnNonGpuNode,
    DevicePluginBesideDraDriver,
    ForeignDevicePlugin,
    NfdLabelsLost,
    UnknownDeployLabel,
    ValueNotTrue,
    OperatorWillRestore,
    GpuClusterConflict,
    ClusterPolicyIgnored,
    ToolkitSwitchedOff,
    ToolkitRolloutNotRecreated,
    DriverRemoved,
    SandboxRelabel,
    NvidiaDriverOverlap,
    DevicePluginSwitchedOff,
    DriverSelectedTwice,
    NvidiaDriverNotReconciled,
    RuntimeClassesRemoved,
    OperandNotRunning,
    ToolkitNotRecreated,
    OperandsNotRecreated,
    PauseStuck,
    DriverUpgradeStuck,
    GpusNotAdvertised,
}

/// What happens when a rule finds something.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Refuse the request (HTTP 200, `allowed: false`, a message naming the fix).
    Deny,
    /// Allow, and return a warning that kubectl prints.
    Warn,
    /// Allow silently; record the finding in the audit annotations only.
    Audit,
    /// Drop the rule's findings: no warning, no annotation, no metric.
    Off,
}

/// Whether a rule judges a node's state or a request's change.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Looks at what the DaemonSet controller will run on the node (the simulated operand set).
    /// A request is judged by the transition: only a violation it creates is acted on; one the
    /// node already had becomes a warning; one it removes is simply gone. [`assess`] and so the
    /// audit evaluate these.
    ///
    /// [`assess`]: crate::core::policy::assess
    State,
    /// Looks at the labels the request itself writes.
    Change,
    /// Looks at a change of the cluster's GPU policy (a ClusterPolicy or an NVIDIADriver) over
    /// every node: [`decide_policy`](crate::core::policy_change::decide_policy) evaluates these.
    Policy,
}

/// One way a rule is evaluated; a rule may have several (`device-plugin-without-toolkit` is
/// judged on a node's labels and, by the audit, on its pods).
#[derive(Copy, Clone)]
pub enum Check {
    /// On one node's labels, by the label decision and the audit (`core/policy.rs`).
    Node(fn(&Ctx<'_, '_>, &mut Vec<Found>)),
    /// Over the fleet, by the policy-change decision (`core/policy_change.rs`).
    Fleet(fn(&FleetCtx<'_>, &mut Vec<Found>)),
    /// On what the audit alone sees of one node ([`PodCtx`]): the pods running there, and how
    /// long its timed labels have lasted (`audit/mod.rs`), before the label rules: what runs
    /// says more than what the labels imply.
    Pods(fn(&PodCtx<'_>, &mut Vec<Found>)),
}

/// How much a failure hurts, in the words of a PolicyReport result.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    High,
    Medium,
    Low,
    /// Not a rule's failure: something the report says about itself.
    Info,
}

/// One row of [`RULES`]: everything about one rule.
pub struct RuleSpec {
    pub rule: Rule,
    /// Part of the interface: config keys, JSON output, metrics and annotations use it.
    pub id: &'static str,
    pub kind: Kind,
    pub default: Action,
    /// How much a failure hurts, in the words of a PolicyReport result.
    pub severity: Severity,
    /// What a pass means, in the PolicyReport (only state rules are reported).
    pub pass: &'static str,
    /// What the rule finds.
    pub summary: &'static str,
    /// How it is evaluated, in this order.
    pub checks: &'static [Check],
}

impl Rule {
    pub fn spec(self) -> &'static RuleSpec {
        &RULES[self as usize]
    }

    pub fn id(self) -> &'static str {
        self.spec().id
    }

    pub fn from_id(id: &str) -> Option<Rule> {
        RULES.iter().find(|s| s.id == id).map(|s| s.rule)
    }

    pub fn all() -> impl Iterator<Item = Rule> {
        RULES.iter().map(|s| s.rule)
    }

    /// The rules that judge a node's state: the ones [`assess`] evaluates, and so the ones the
    /// audit reports.
    ///
    /// [`assess`]: crate::core::policy::assess
    /// Judged on how long a node's timed labels have lasted ([`History`]): only an audit that
    /// has watched the nodes evaluates it.
    ///
    /// [`History`]: crate::core::lasting::History
    pub fn reads_history(self) -> bool {
        matches!(self, Rule::PauseStuck | Rule::DriverUpgradeStuck)
    }

    /// Judged on what the node's status advertises ([`Advertised`]).
    ///
    /// [`Advertised`]: crate::core::advertised::Advertised
    pub fn reads_status(self) -> bool {
        matches!(self, Rule::GpusNotAdvertised)
    }

    /// Judged on the ResourceSlices of NVIDIA's DRA driver ([`DraNodes`]): evaluated only
    /// where they were read.
    ///
    /// [`DraNodes`]: crate::core::dra::DraNodes
    pub fn reads_slices(self) -> bool {
        matches!(self, Rule::DevicePluginBesideDraDriver)
    }

    /// Judged on the device-plugin DaemonSets outside the operator's namespace
    /// ([`ForeignPlugins`]): evaluated only where they were read.
    ///
    /// [`ForeignPlugins`]: crate::core::foreign::ForeignPlugins
    pub fn reads_foreign_plugins(self) -> bool {
        matches!(self, Rule::ForeignDevicePlugin)
    }

    pub fn state_rules() -> impl Iterator<Item = Rule> {
        RULES
            .iter()
            .filter(|s| s.kind == Kind::State)
            .map(|s| s.rule)
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.id())
    }
}

impl Serialize for Rule {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.id())
    }
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::High => "high",
            Severity::Medium => "medium",
            Severity::Low => "low",
            Severity::Info => "info",
        }
    }
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Deny => "deny",
            Action::Warn => "warn",
            Action::Audit => "audit",
            Action::Off => "off",
        }
    }
}

/// Whether the request creates a finding or the node already had it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Change {
    New,
    Existing,
}

/// What a rule function finds: a [`Finding`] before the decision gives it its action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub rule: Rule,
    pub change: Change,
    /// A whole sentence: names the node, the labels and the fix.
    pub message: String,
    /// The same, short enough for a kubectl `Warning:` line.
    pub warning: String,
}

impl Found {
    /// The finding, with the action the decision takes on it.
    pub fn acted(self, action: Action) -> Finding {
        Finding {
            rule: self.rule,
            action,
            change: self.change,
            message: self.message,
            warning: self.warning,
        }
    }
}

/// A finding with the action taken on it, as a verdict carries it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub rule: Rule,
    /// The action taken: the configured one, lowered for existing findings, CREATE, warn mode
    /// or an exempt requester.
    pub action: Action,
    pub change: Change,
    /// A whole sentence: names the node, the labels and the fix.
    pub message: String,
    /// The same, short enough for a kubectl `Warning:` line.
    #[serde(skip)]
    pub warning: String,
}

/// Everything one evaluation needs, so rule functions stay short.
pub struct Ctx<'r, 'a> {
    pub(crate) review: &'r Review<'a>,
    pub(crate) facts: &'r ClusterFacts,
    /// What the node runs before the request ([`Runs`]): its `set` is what the state rules
    /// judge, the rest where taints stop the DaemonSet controller.
    pub(crate) before: &'r Runs,
    pub(crate) after: &'r Runs,
    /// No request: the node's current state is judged ([`assess`](crate::core::policy::assess)), so texts do not speak of one.
    pub(crate) assessing: bool,
    /// The deploy labels the request changes ([`changed_deploy_labels`]): read by the change
    /// rules, empty for the state rules.
    ///
    /// [`changed_deploy_labels`]: crate::core::operands::changed_deploy_labels
    pub(crate) changes: &'r [LabelChange<'r>],
}

impl Ctx<'_, '_> {
    /// Runs every rule of `kind`, in table order.
    pub(crate) fn run(&self, kind: Kind, out: &mut Vec<Found>) {
        for spec in RULES.iter().filter(|s| s.kind == kind) {
            for check in spec.checks {
                if let Check::Node(check) = check {
                    check(self, out);
                }
            }
        }
    }

    /// The node's name as messages repeat it: bounded (see `echo`).
    fn node(&self) -> std::borrow::Cow<'_, str> {
        crate::core::echo::echo(self.review.node)
    }

    fn change(&self, in_before: bool) -> Change {
        if self.review.old_labels.is_some() && in_before {
            Change::Existing
        } else {
            Change::New
        }
    }

    /// Said of an existing violation while judging a request; nothing to say in an assessment.
    fn unchanged(&self) -> &'static str {
        if self.assessing {
            ""
        } else {
            "; this request does not change that"
        }
    }

    fn toolkit_provided(&self, set: OperandSet) -> bool {
        set.contains(Operand::ContainerToolkit) || !self.facts.toolkit_managed
    }

    fn old_value(&self, key: &str) -> Option<&str> {
        self.review
            .old_labels
            .and_then(|old| old.get(key))
            .map(String::as_str)
    }

    fn new_value(&self, key: &str) -> Option<&str> {
        self.review.labels.get(key).map(String::as_str)
    }

    /// How the labels select an operand, in words: `nvidia.com/gpu.deploy.device-plugin=true`.
    fn selector_words(&self, op: Operand) -> String {
        match self.facts.selectors.get(&op) {
            Some(sel) => {
                let pairs: Vec<String> = sel.iter().map(|(k, v)| format!("{k}={v}")).collect();
                format!("the {op} DaemonSet's nodeSelector {}", pairs.join(","))
            }
            None => match op.info().also_selects {
                Some(also) if self.facts.operator.era() <= also.until => {
                    format!("{}=true with {}=true", op.key(), also.key)
                }
                _ => format!("{}=true", op.key()),
            },
        }
    }

    /// The state of a label after the request, in words, saying when the request changed it.
    fn label_state(&self, key: &str) -> String {
        let old = self.old_value(key);
        match (old, self.new_value(key)) {
            (Some(_), None) => format!("this request removes {key}"),
            (None, None) => format!("{key} is not set"),
            (o, Some(v)) if o != Some(v) && self.review.old_labels.is_some() => {
                format!("this request sets {key}={v:?}")
            }
            (_, Some(v)) => format!("{key} is {v:?}"),
        }
    }

    /// Emits one finding for the operands the request adds to a violating set, and one for those
    /// that were already in it.
    fn per_subset(
        &self,
        out: &mut Vec<Found>,
        rule: Rule,
        after: OperandSet,
        before: OperandSet,
        text: impl Fn(&str, Change) -> (String, String),
    ) {
        let names = |pred: &dyn Fn(Operand) -> bool| -> Vec<&'static str> {
            after
                .iter()
                .filter(|op| pred(*op))
                .map(Operand::name)
                .collect()
        };
        let is_existing = |op: Operand| self.review.old_labels.is_some() && before.contains(op);
        let new = names(&|op| !is_existing(op));
        let existing = names(&is_existing);
        for (list, change) in [(new, Change::New), (existing, Change::Existing)] {
            if list.is_empty() {
                continue;
            }
            let (message, warning) = text(&list.join(", "), change);
            out.push(Found {
                rule,
                change,
                message,
                warning,
            });
        }
    }

    /// Deploy-label keys the request adds or gives a new value, with that value, in key order.
    fn written_deploy_labels(&self) -> impl Iterator<Item = (&str, &str)> {
        self.changes
            .iter()
            .filter_map(|c| c.new.map(|new| (c.key, new)))
    }
}

#[cfg(test)]
mod table_tests {
    use super::*;

    /// `Rule::spec` finds a rule's row by the rule's place in the enum: every row must sit at
    /// its rule's place, and ids are unique.
    #[test]
    fn each_row_sits_at_its_rules_place() {
        for (at, spec) in RULES.iter().enumerate() {
            assert_eq!(spec.rule as usize, at, "{} is row {at} of RULES", spec.id);
            assert_eq!(spec.rule.spec().id, spec.id);
            assert_eq!(Rule::from_id(spec.id), Some(spec.rule));
        }
        let mut ids: Vec<&str> = RULES.iter().map(|s| s.id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), RULES.len(), "rule ids are unique");
    }

    /// Every row is evaluated, and only by checks its kind's callers run: the label decision runs
    /// `Node` checks of state and change rules, the policy decision `Fleet` checks of policy
    /// rules, the audit `Pods` checks of state rules.
    #[test]
    fn each_row_has_checks_of_its_kind() {
        for spec in &RULES {
            assert!(!spec.checks.is_empty(), "{} has no check", spec.id);
            for check in spec.checks {
                let fits = matches!(
                    (spec.kind, check),
                    (Kind::State | Kind::Change, Check::Node(_))
                        | (Kind::Policy, Check::Fleet(_))
                        | (Kind::State, Check::Pods(_))
                );
                assert!(fits, "{} has a check its kind's callers never run", spec.id);
            }
        }
    }
}
