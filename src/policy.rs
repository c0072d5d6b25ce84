//! The decision: every rule of gpu-deploy-guard, as one pure function.
//!
//! [`decide`] takes the node's labels before and after a request, who made it
//! and what the cluster is known to run, and returns a [`Verdict`]. No I/O, no
//! clock, no globals: the webhook, `check` and `audit` all call it, so they can
//! never disagree.
//!
//! Two kinds of rules:
//! - *state* rules look at what the DaemonSet controller will run on the node
//!   (the [`simulate`]d operand set). A request is judged by the transition:
//!   only a violation it creates is acted on; one the node already had becomes
//!   a warning; one it removes is simply gone.
//! - *change* rules look at the labels the request itself writes.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::operands::{
    DEPLOY_PREFIX, GPU_PRESENT_KEY, Labels, NFD_NVIDIA_PCI_KEYS, OPERANDS_KEY, Operand, OperandSet,
    Value, closest_known, is_gpu_node,
};

/// A rule's id is part of the interface: config keys, JSON output, metrics and annotations use it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rule {
    DevicePluginWithoutToolkit,
    OperandWithoutToolkit,
    OperandWithoutValidator,
    DevicePluginOnNonGpuNode,
    UnknownDeployLabel,
    ValueNotTrue,
    OperatorWillRestore,
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

pub struct RuleSpec {
    pub rule: Rule,
    pub id: &'static str,
    pub default: Action,
    pub summary: &'static str,
}

/// The rules that judge a node's state rather than a request's change: the ones [`assess`]
/// evaluates, and so the ones the audit reports.
pub const STATE_RULES: [Rule; 4] = [
    Rule::DevicePluginWithoutToolkit,
    Rule::OperandWithoutToolkit,
    Rule::OperandWithoutValidator,
    Rule::DevicePluginOnNonGpuNode,
];

/// The whole rule table.
pub const RULES: [RuleSpec; 7] = [
    RuleSpec {
        rule: Rule::DevicePluginWithoutToolkit,
        id: "device-plugin-without-toolkit",
        default: Action::Deny,
        summary: "the device plugin would run while the operator-managed container toolkit would not",
    },
    RuleSpec {
        rule: Rule::OperandWithoutToolkit,
        id: "operand-without-toolkit",
        default: Action::Warn,
        summary: "GFD, DCGM, DCGM exporter or MIG manager would run without the container toolkit",
    },
    RuleSpec {
        rule: Rule::OperandWithoutValidator,
        id: "operand-without-validator",
        default: Action::Warn,
        summary: "operator-validator is labelled off while operands that wait for toolkit-ready run",
    },
    RuleSpec {
        rule: Rule::DevicePluginOnNonGpuNode,
        id: "device-plugin-on-non-gpu-node",
        default: Action::Warn,
        summary: "the device plugin would run on a node with no sign of an NVIDIA GPU",
    },
    RuleSpec {
        rule: Rule::UnknownDeployLabel,
        id: "unknown-deploy-label",
        default: Action::Warn,
        summary: "a nvidia.com/gpu.deploy.* key that no operand uses",
    },
    RuleSpec {
        rule: Rule::ValueNotTrue,
        id: "value-not-true",
        default: Action::Warn,
        summary: "a deploy label set to a value a person probably meant as on (only `true` schedules)",
    },
    RuleSpec {
        rule: Rule::OperatorWillRestore,
        id: "operator-will-restore",
        default: Action::Warn,
        summary: "a deploy label removed or emptied on a GPU node: the operator sets it back to true",
    },
];

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

/// `warn` turns every deny into a warning: a way to roll the webhook out before enforcing.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Enforce,
    Warn,
}

/// Identities whose requests are always allowed (and still recorded).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Exemptions {
    pub usernames: Vec<String>,
    pub groups: Vec<String>,
    pub service_account_namespaces: Vec<String>,
}

/// The configured behaviour: one action per rule, the mode and the exemptions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    pub mode: Mode,
    pub enforce_on_create: bool,
    pub actions: [Action; RULES.len()],
    pub exemptions: Exemptions,
}

/// The operator's namespace: its service accounts (operator, driver manager, MIG manager) are exempt.
pub const DEFAULT_OPERATOR_NAMESPACE: &str = "gpu-operator";

impl Default for Policy {
    fn default() -> Self {
        Policy {
            mode: Mode::Enforce,
            enforce_on_create: false,
            actions: RULES.map(|s| s.default),
            exemptions: Exemptions {
                service_account_namespaces: vec![DEFAULT_OPERATOR_NAMESPACE.to_owned()],
                ..Exemptions::default()
            },
        }
    }
}

impl Policy {
    pub fn action(&self, rule: Rule) -> Action {
        self.actions[rule as usize]
    }
}

/// What is known about the cluster beyond the node itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterFacts {
    /// The ClusterPolicy deploys the container toolkit (`spec.toolkit.enabled`, true when unknown).
    /// When false, every host brings its own toolkit and the device plugin needs no DaemonSet.
    pub toolkit_managed: bool,
    /// Operands switched off in the ClusterPolicy: they run nowhere, whatever the labels say.
    pub disabled: OperandSet,
    /// Operand DaemonSets whose nodeSelector is not the default `<deploy key>: "true"`.
    pub selectors: BTreeMap<Operand, Labels>,
    /// Why these facts are assumed instead of read from the cluster (the ClusterPolicy CRD is
    /// missing, RBAC forbids reading it, ...); `None` when they were read or given.
    pub assumed: Option<String>,
}

impl Default for ClusterFacts {
    fn default() -> Self {
        ClusterFacts {
            toolkit_managed: true,
            disabled: OperandSet::EMPTY,
            selectors: BTreeMap::new(),
            assumed: None,
        }
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Operation {
    Create,
    Update,
    Delete,
    Connect,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
        }
    }
}

/// One request to judge.
#[derive(Clone, Copy, Debug)]
pub struct Review<'a> {
    pub node: &'a str,
    pub operation: Operation,
    /// The labels before the request; `None` for CREATE.
    pub old_labels: Option<&'a Labels>,
    pub labels: &'a Labels,
    pub username: &'a str,
    pub groups: &'a [String],
    /// Decided exactly like a real request; carried for the record only.
    pub dry_run: bool,
}

/// Whether the request creates a finding or the node already had it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Change {
    New,
    Existing,
}

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

#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    Allowed,
    Denied,
    Exempt,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Allowed => "allowed",
            Decision::Denied => "denied",
            Decision::Exempt => "exempt",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub decision: Decision,
    /// Set when denied: every deny finding's message.
    pub message: Option<String>,
    pub findings: Vec<Finding>,
    /// What kubectl prints as `Warning:` lines.
    pub warnings: Vec<String>,
    /// Operands the DaemonSet controller runs before (empty for CREATE) and after the request.
    pub before: OperandSet,
    pub after: OperandSet,
    /// Why the requester is exempt, when it is.
    pub exempt: Option<String>,
    /// For an exempt request: what would have been refused.
    pub would_deny: Option<String>,
    /// Set when the cluster facts behind the decision were assumed, not read.
    pub assumed_facts: Option<String>,
}

impl Verdict {
    pub fn allowed(&self) -> bool {
        self.decision != Decision::Denied
    }

    /// Key/value pairs for the AdmissionResponse's `auditAnnotations`; the API server prefixes
    /// each key with the webhook's name.
    pub fn audit_annotations(&self) -> Vec<(&'static str, String)> {
        let mut out = vec![("decision", self.decision.as_str().to_owned())];
        if !self.findings.is_empty() {
            let list: Vec<String> = self
                .findings
                .iter()
                .map(|f| format!("{}={}", f.rule, f.action.as_str()))
                .collect();
            out.push(("findings", list.join(",")));
        }
        if self.before != self.after {
            let mut changes = Vec::new();
            for op in Operand::all() {
                match (self.before.contains(op), self.after.contains(op)) {
                    (false, true) => changes.push(format!("+{op}")),
                    (true, false) => changes.push(format!("-{op}")),
                    _ => {}
                }
            }
            out.push(("operands", changes.join(",")));
        }
        if let Some(why) = &self.exempt {
            out.push(("exempt", why.clone()));
        }
        if let Some(msg) = &self.would_deny {
            out.push(("would-deny", msg.clone()));
        }
        if let Some(why) = &self.assumed_facts {
            out.push(("cluster-facts", why.clone()));
        }
        out
    }
}

/// Whether [`decide`] may read the label `key` under these facts: the deploy labels, the labels
/// that mark a GPU node, and the keys of non-default operand nodeSelectors. The webhook copies
/// only these from a reviewed Node (a GPU node has ~100 labels; these are 10–20); the tests
/// check that dropping the others never changes a verdict.
pub fn reads_label(key: &str, facts: &ClusterFacts) -> bool {
    key.starts_with(DEPLOY_PREFIX)
        || key == GPU_PRESENT_KEY
        || NFD_NVIDIA_PCI_KEYS.contains(&key)
        || facts.selectors.values().any(|sel| sel.contains_key(key))
}

/// The operands the DaemonSet controller runs on a node with these labels.
pub fn simulate(labels: &Labels, facts: &ClusterFacts) -> OperandSet {
    Operand::all()
        .filter(|op| !facts.disabled.contains(*op) && selects(labels, *op, facts))
        .collect()
}

fn selects(labels: &Labels, op: Operand, facts: &ClusterFacts) -> bool {
    match facts.selectors.get(&op) {
        Some(selector) => selector
            .iter()
            .all(|(k, v)| labels.get(k).is_some_and(|have| have == v)),
        None => labels.get(op.key()).is_some_and(|v| v == "true"),
    }
}

/// Decide one request.
pub fn decide(review: &Review<'_>, facts: &ClusterFacts, policy: &Policy) -> Verdict {
    let after = simulate(review.labels, facts);
    let before = review
        .old_labels
        .map_or(OperandSet::EMPTY, |old| simulate(old, facts));

    let mut findings = Vec::new();
    if matches!(review.operation, Operation::Create | Operation::Update) {
        let ctx = Ctx {
            review,
            facts,
            before,
            after,
            assessing: false,
        };
        ctx.state_rules(&mut findings);
        ctx.change_rules(&mut findings);
        findings.retain(|f| policy.action(f.rule) != Action::Off);
        for f in &mut findings {
            f.action = effective_action(policy, review.operation, f);
        }
    }

    let deny_messages: Vec<&str> = findings
        .iter()
        .filter(|f| f.action == Action::Deny)
        .map(|f| f.message.as_str())
        .collect();
    let deny_message = (!deny_messages.is_empty()).then(|| deny_messages.join(" Also: "));

    let exempt = exemption(review, &policy.exemptions);
    let (decision, message, would_deny) = match (&exempt, deny_message) {
        (Some(_), would) => {
            for f in &mut findings {
                f.action = Action::Audit;
            }
            (Decision::Exempt, None, would)
        }
        (None, Some(msg)) => (Decision::Denied, Some(msg), None),
        (None, None) => (Decision::Allowed, None, None),
    };
    let warnings = findings
        .iter()
        .filter(|f| f.action == Action::Warn)
        .map(|f| f.warning.clone())
        .collect();

    Verdict {
        decision,
        message,
        findings,
        warnings,
        before,
        after,
        exempt,
        would_deny,
        assumed_facts: facts.assumed.clone(),
    }
}

/// The state rules alone, on a node's current labels: what `audit` reports for a node that no
/// request is changing. Every finding is [`Change::Existing`] and carries the configured action
/// (rules set to `off` are left out); the change rules need a request and are not evaluated.
pub fn assess(node: &str, labels: &Labels, facts: &ClusterFacts, policy: &Policy) -> Vec<Finding> {
    let review = Review {
        node,
        operation: Operation::Update,
        old_labels: Some(labels),
        labels,
        username: "",
        groups: &[],
        dry_run: false,
    };
    let running = simulate(labels, facts);
    let ctx = Ctx {
        review: &review,
        facts,
        before: running,
        after: running,
        assessing: true,
    };
    let mut findings = Vec::new();
    ctx.state_rules(&mut findings);
    findings.retain(|f| policy.action(f.rule) != Action::Off);
    for f in &mut findings {
        f.action = policy.action(f.rule);
    }
    findings
}

fn effective_action(policy: &Policy, operation: Operation, finding: &Finding) -> Action {
    let configured = policy.action(finding.rule);
    if configured != Action::Deny {
        return configured;
    }
    let lowered = finding.change == Change::Existing
        || policy.mode == Mode::Warn
        || (operation == Operation::Create && !policy.enforce_on_create);
    if lowered { Action::Warn } else { Action::Deny }
}

fn exemption(review: &Review<'_>, ex: &Exemptions) -> Option<String> {
    if ex.usernames.iter().any(|u| u == review.username) {
        return Some(format!("user {} is exempt", review.username));
    }
    if let Some(g) = review.groups.iter().find(|g| ex.groups.contains(g)) {
        return Some(format!("group {g} is exempt"));
    }
    let sa_namespace = review
        .username
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'))
        .map(|(ns, _)| ns);
    if let Some(ns) = sa_namespace
        && ex.service_account_namespaces.iter().any(|n| n == ns)
    {
        return Some(format!(
            "service account {} of namespace {ns} is exempt",
            review.username
        ));
    }
    None
}

/// Everything one evaluation needs, so rule functions stay short.
struct Ctx<'r, 'a> {
    review: &'r Review<'a>,
    facts: &'r ClusterFacts,
    before: OperandSet,
    after: OperandSet,
    /// No request: the node's current state is judged ([`assess`]), so texts do not speak of one.
    assessing: bool,
}

/// The operands that wait for the container toolkit (GFD, DCGM, DCGM exporter, MIG manager).
const NEEDS_TOOLKIT: [Operand; 4] = [
    Operand::GpuFeatureDiscovery,
    Operand::Dcgm,
    Operand::DcgmExporter,
    Operand::MigManager,
];

impl Ctx<'_, '_> {
    fn node(&self) -> &str {
        self.review.node
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
            None => format!("{}=true", op.key()),
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

    fn state_rules(&self, out: &mut Vec<Finding>) {
        self.device_plugin_without_toolkit(out);
        self.operand_without_toolkit(out);
        self.operand_without_validator(out);
        self.device_plugin_on_non_gpu_node(out);
    }

    fn change_rules(&self, out: &mut Vec<Finding>) {
        self.unknown_deploy_label(out);
        self.value_not_true(out);
        self.operator_will_restore(out);
    }

    fn device_plugin_without_toolkit(&self, out: &mut Vec<Finding>) {
        let broken =
            |set: OperandSet| set.contains(Operand::DevicePlugin) && !self.toolkit_provided(set);
        if !broken(self.after) {
            return;
        }
        let node = self.node();
        let toolkit = Operand::ContainerToolkit.key();
        let plugin = Operand::DevicePlugin.key();
        let change = self.change(broken(self.before));
        let (message, warning) = match change {
            Change::Existing => (
                format!(
                    "node {node} already runs the NVIDIA device plugin without the container toolkit ({}){}: \
                     set {toolkit}=true or {plugin}=false to repair the node.",
                    self.label_state(toolkit),
                    self.unchanged()
                ),
                format!("{node} is already broken: device-plugin runs without container-toolkit"),
            ),
            Change::New => {
                let toolkit_was_on = self.old_value(toolkit) == Some("true");
                let fix = if toolkit_was_on {
                    format!(
                        "keep {toolkit}=true, or turn the device plugin off in the same command with {plugin}=false"
                    )
                } else {
                    format!(
                        "set {toolkit}=true in the same command, or leave the device plugin off ({plugin}=false)"
                    )
                };
                (
                    format!(
                        "node {node}: {} would run the NVIDIA device plugin without the container toolkit ({}), \
                         so GPU pods would be scheduled there and fail to start; {fix}.",
                        self.selector_words(Operand::DevicePlugin),
                        self.label_state(toolkit)
                    ),
                    format!(
                        "{node}: device-plugin would run without container-toolkit; GPU pods would fail to start"
                    ),
                )
            }
        };
        out.push(Finding {
            rule: Rule::DevicePluginWithoutToolkit,
            action: Action::Off,
            change,
            message,
            warning,
        });
    }

    fn operand_without_toolkit(&self, out: &mut Vec<Finding>) {
        let stranded = |set: OperandSet| -> OperandSet {
            if self.toolkit_provided(set) {
                return OperandSet::EMPTY;
            }
            NEEDS_TOOLKIT
                .into_iter()
                .filter(|op| set.contains(*op))
                .collect()
        };
        let after = stranded(self.after);
        let before = stranded(self.before);
        self.per_subset(out, Rule::OperandWithoutToolkit, after, before, |names, change| {
            let node = self.node();
            let toolkit = Operand::ContainerToolkit.key();
            match change {
                Change::New => (
                    format!(
                        "node {node}: {names} would run without the container toolkit ({}) and wait for it forever; \
                         set {toolkit}=true or turn them off.",
                        self.label_state(toolkit)
                    ),
                    format!("{node}: {names} would hang without container-toolkit"),
                ),
                Change::Existing => (
                    format!(
                        "node {node} already runs {names} without the container toolkit ({}){}.",
                        self.label_state(toolkit),
                        self.unchanged()
                    ),
                    format!("{node}: {names} already wait for container-toolkit"),
                ),
            }
        });
    }

    fn operand_without_validator(&self, out: &mut Vec<Finding>) {
        let key = Operand::OperatorValidator.key();
        let waiting = |labels: Option<&Labels>, set: OperandSet| -> OperandSet {
            let Some(labels) = labels else {
                return OperandSet::EMPTY;
            };
            // A missing validator label is added by the operator; only an explicit non-true value
            // keeps the validator away for good.
            let validator_off = labels.get(key).is_some_and(|v| v != "true");
            if !validator_off {
                return OperandSet::EMPTY;
            }
            set.iter()
                .filter(|op| op.info().waits_for_toolkit_ready)
                .collect()
        };
        let after = waiting(Some(self.review.labels), self.after);
        let before = waiting(self.review.old_labels, self.before);
        let value = self.new_value(key).unwrap_or_default();
        self.per_subset(out, Rule::OperandWithoutValidator, after, before, |names, change| {
            let node = self.node();
            let already = if change == Change::Existing { "already " } else { "" };
            (
                format!(
                    "node {node}: {key}={value:?} keeps the operator validator off, so {names} {already}wait forever \
                     for its toolkit-ready check; set {key}=true."
                ),
                format!("{node}: {names} {already}hang: operator-validator={value:?}"),
            )
        });
    }

    fn device_plugin_on_non_gpu_node(&self, out: &mut Vec<Finding>) {
        let misplaced = |labels: &Labels, set: OperandSet| {
            set.contains(Operand::DevicePlugin) && !is_gpu_node(labels)
        };
        if !misplaced(self.review.labels, self.after) {
            return;
        }
        let before = self
            .review
            .old_labels
            .is_some_and(|old| misplaced(old, self.before));
        let change = self.change(before);
        let node = self.node();
        let already = if change == Change::Existing {
            "already "
        } else {
            ""
        };
        out.push(Finding {
            rule: Rule::DevicePluginOnNonGpuNode,
            action: Action::Off,
            change,
            message: format!(
                "node {node}: the NVIDIA device plugin {already}runs on a node without {GPU_PRESENT_KEY}=true \
                 or an NFD NVIDIA PCI label; is this the right node?"
            ),
            warning: format!("{node}: device-plugin {already}runs on a node with no NVIDIA GPU label"),
        });
    }

    /// Emits one finding for the operands the request adds to a violating set, and one for those
    /// that were already in it.
    fn per_subset(
        &self,
        out: &mut Vec<Finding>,
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
            out.push(Finding {
                rule,
                action: Action::Off,
                change,
                message,
                warning,
            });
        }
    }

    /// Deploy-label keys the request adds or gives a new value.
    fn written_deploy_labels(&self) -> impl Iterator<Item = (&str, &str)> {
        self.review
            .labels
            .iter()
            .filter(|(k, _)| k.starts_with(DEPLOY_PREFIX))
            .filter(|(k, v)| self.old_value(k) != Some(v.as_str()))
            .map(|(k, v)| (k.as_str(), v.as_str()))
    }

    fn unknown_deploy_label(&self, out: &mut Vec<Finding>) {
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

    fn value_not_true(&self, out: &mut Vec<Finding>) {
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

    fn operator_will_restore(&self, out: &mut Vec<Finding>) {
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
            if !op.info().operator_labels {
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

#[cfg(test)]
mod tests;
