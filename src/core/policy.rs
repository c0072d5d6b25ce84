//! The decision: every rule of gpu-deploy-guard, as one pure function.
//!
//! [`decide`] takes the node's labels before and after a request, who made it
//! and what the cluster is known to run, and returns a [`Verdict`]. No I/O, no
//! clock, no globals: the webhook, `check` and `audit` all call it, so they can
//! never disagree.
//!
//! The rules themselves, one table of them, are in [`crate::core::rules`].

use serde::{Deserialize, Serialize};

use crate::core::facts::ClusterFacts;
use crate::core::lasting::StuckAfter;
use crate::core::operands::{
    DEPLOY_PREFIX, Labels, OPERANDS_KEY, Operand, OperandSet, changed_deploy_labels,
    selector_matches,
};
use crate::core::operator::{LabelAction, labelling_pass};
use crate::core::pauses::{Build, after_pauses, resumes};
use crate::core::placement::NodePlacement;
use crate::core::review::{Operation, Review};
use crate::core::rules::Ctx;
use crate::core::rules::{Action, Change, Finding, Found, Kind, RULES, Rule};

/// How findings reach the requester. The staged rollout goes `audit`, `warn`, `enforce`.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Denials are denials, warnings warnings.
    #[default]
    Enforce,
    /// Every deny becomes a warning.
    Warn,
    /// Nothing is denied or shown: every finding is recorded (audit annotations, metrics,
    /// report) with action `audit`, and a denial that was not given is kept as `would_deny`.
    Audit,
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
    /// How long a pause or a driver upgrade state may last before the audit reports it.
    pub stuck_after: StuckAfter,
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
            stuck_after: StuckAfter::default(),
        }
    }
}

impl Policy {
    pub fn action(&self, rule: Rule) -> Action {
        self.actions[rule as usize]
    }
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

/// What the audit annotations say of a policy review.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyNote {
    /// `ClusterPolicy/<name>` or `NVIDIADriver/<name>`.
    pub object: String,
    /// Nodes the decision was made over; None when they were not known.
    pub nodes: Option<usize>,
    /// The host-toolkit statement that let a toolkit switch-off through.
    pub host_toolkit: Option<String>,
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
    /// The `cluster-facts` annotation ([`ClusterFacts::annotation`]): the ClusterPolicy's
    /// switches when they were assumed, and the GPU Operator version, assumed, given or read
    /// from the operator's Deployment.
    pub cluster_facts: String,
    /// For a GPU-policy review: the object and the fleet it was decided over.
    pub policy_change: Option<PolicyNote>,
}

impl Verdict {
    pub fn allowed(&self) -> bool {
        self.decision != Decision::Denied
    }

    /// Each finding's rule and action, `rule=action`, comma-separated: the `findings` audit
    /// annotation and the log field.
    pub fn findings_in_words(&self) -> String {
        let list: Vec<String> = self
            .findings
            .iter()
            .map(|f| format!("{}={}", f.rule, f.action.as_str()))
            .collect();
        list.join(",")
    }

    /// Key/value pairs for the AdmissionResponse's `auditAnnotations`; the API server prefixes
    /// each key with the webhook's name.
    pub fn audit_annotations(&self) -> Vec<(&'static str, String)> {
        let mut out = vec![("decision", self.decision.as_str().to_owned())];
        if !self.findings.is_empty() {
            out.push(("findings", self.findings_in_words()));
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
        if let Some(note) = &self.policy_change {
            out.push(("policy-change", note.object.clone()));
            out.push((
                "nodes",
                note.nodes
                    .map_or_else(|| "unknown".to_owned(), |n| n.to_string()),
            ));
            if let Some(said) = &note.host_toolkit {
                out.push(("override", said.clone()));
            }
        }
        if let Some(why) = &self.exempt {
            out.push(("exempt", why.clone()));
        }
        if let Some(msg) = &self.would_deny {
            out.push(("would-deny", msg.clone()));
        }
        out.push(("cluster-facts", self.cluster_facts.clone()));
        out
    }
}

/// The operands the DaemonSet controller runs on a node with these labels.
pub fn simulate(labels: &Labels, facts: &ClusterFacts) -> OperandSet {
    let off = facts.off();
    Operand::all()
        .filter(|op| !off.contains(*op) && selects(labels, *op, facts))
        .collect()
}

fn selects(labels: &Labels, op: Operand, facts: &ClusterFacts) -> bool {
    match facts.selectors.get(&op) {
        Some(selector) => selector_matches(selector, labels),
        None => op
            .info()
            .shipped_selector_matches(labels, facts.operator.era()),
    }
}

/// Decide one request.
pub fn decide(review: &Review<'_>, facts: &ClusterFacts, policy: &Policy) -> Verdict {
    // Judged on the taints that last: a node that is not ready now runs what its labels select
    // once it is.
    let old_taints = review.before_placement().lasting();
    let taints = review.placement.lasting();
    let before = review.old_labels.map_or_else(Runs::default, |old| {
        runs(review.node, old, &old_taints, None, facts)
    });
    let requested = runs(review.node, review.labels, &taints, Some(before.set), facts);
    // The state rules judge what the node will run: after the operator's pass when this very
    // update starts one, else the labels as the request leaves them.
    let passed = pass_on_this_update(review, facts);
    let judged = passed.as_ref().map(|p| Review {
        labels: &p.labels,
        ..*review
    });
    let after = judged.as_ref().map_or_else(
        || requested.clone(),
        |r| runs(r.node, r.labels, &taints, Some(before.set), facts),
    );

    let mut findings = Vec::new();
    if matches!(review.operation, Operation::Create | Operation::Update) {
        let changes = changed_deploy_labels(review.old_labels, review.labels);
        let ctx = Ctx {
            review,
            facts,
            before: &before,
            after: &requested,
            assessing: false,
            changes: &changes,
        };
        let mut found = state_findings(
            judged.as_ref().unwrap_or(review),
            facts,
            &before,
            &after,
            false,
        );
        if let Some(p) = &passed {
            for f in &mut found {
                f.message = format!("{} ({})", f.message, p.why);
                f.warning = format!("{} after the operator's pass", f.warning);
            }
        }
        ctx.run(Kind::Change, &mut found);
        findings = act(found, policy, review.operation);
    }

    conclude(
        findings,
        exemption(review.username, review.groups, &policy.exemptions),
        policy,
        before.set,
        after.set,
        facts.annotation(),
    )
}

/// The labels the GPU Operator's labelling pass leaves when the request itself starts one, and
/// why it does.
struct SameUpdatePass {
    labels: Labels,
    why: String,
}

fn operands_disabled(labels: &Labels) -> bool {
    labels.get(OPERANDS_KEY).is_some_and(|v| v == "false")
}

/// Whether an update from `old` to `new` starts the operator's labelling pass on that same
/// update, so the node is judged on what the pass leaves ([`pass_on_this_update`]).
pub fn starts_pass(old: Option<&Labels>, new: &Labels) -> bool {
    old.is_some_and(|old| operands_disabled(old) != operands_disabled(new))
}

/// Setting or removing `operands=false` (`hasOperandsDisabled` flipping) is a node update the
/// operator answers with a labelling pass at once (`addWatchNewGPUNode` to v26.3,
/// `getNodeLabelUpdateReasons` in v26.7; `docs/gpu-operator.md` §5): what the request writes
/// lasts only until that pass has deleted (set) or added back (removed) the deploy labels, so
/// the node is judged on what the pass leaves. `None` when the request starts no such pass.
fn pass_on_this_update(review: &Review<'_>, facts: &ClusterFacts) -> Option<SameUpdatePass> {
    if !starts_pass(review.old_labels, review.labels) {
        return None;
    }
    let is = operands_disabled(review.labels);
    let pass = labelling_pass(
        review.labels,
        facts.operator.era(),
        &facts.sandbox,
        facts.stack,
    );
    if pass.labels == *review.labels {
        return None;
    }
    let what = if is {
        format!("this request sets {OPERANDS_KEY}=false")
    } else {
        format!("this request removes {OPERANDS_KEY}=false")
    };
    let done: Vec<String> = pass
        .actions
        .iter()
        .filter(|(_, a)| matches!(a, LabelAction::Add | LabelAction::Sweep))
        .map(|(k, a)| format!("{} {}", &k[DEPLOY_PREFIX.len()..], a.as_str()))
        .collect();
    Some(SameUpdatePass {
        why: format!(
            "what the GPU Operator ({}) leaves: {what}, which starts its labelling pass on this same \
             update ({})",
            facts.operator.version.text,
            done.join(", ")
        ),
        labels: pass.labels,
    })
}

/// The verdict on these findings (their actions already set): denied when one denies, unless
/// the requester is exempt or the mode is `audit`, which keep the refusal as a record only.
pub(crate) fn conclude(
    mut findings: Vec<Finding>,
    exempt: Option<String>,
    policy: &Policy,
    before: OperandSet,
    after: OperandSet,
    cluster_facts: String,
) -> Verdict {
    let deny_messages: Vec<&str> = findings
        .iter()
        .filter(|f| f.action == Action::Deny)
        .map(|f| f.message.as_str())
        .collect();
    let deny_message = (!deny_messages.is_empty()).then(|| deny_messages.join(" Also: "));

    let (decision, message, would_deny) = match (&exempt, deny_message) {
        (Some(_), would) => {
            for f in &mut findings {
                f.action = Action::Audit;
            }
            (Decision::Exempt, None, would)
        }
        (None, would) if policy.mode == Mode::Audit => {
            for f in &mut findings {
                f.action = Action::Audit;
            }
            (Decision::Allowed, None, would)
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
        cluster_facts,
        policy_change: None,
    }
}

/// The state rules alone, on a node's current labels: what `audit` reports for a node that no
/// request is changing. Every finding is [`Change::Existing`] and carries the configured action
/// (rules set to `off` are left out); the change rules need a request and are not evaluated.
pub fn assess(
    node: &str,
    labels: &Labels,
    placement: &NodePlacement,
    facts: &ClusterFacts,
    policy: &Policy,
) -> Vec<Finding> {
    let review = Review {
        node,
        operation: Operation::Update,
        old_labels: Some(labels),
        labels,
        username: "",
        groups: &[],
        dry_run: false,
        unknown_not_copied: 0,
        old_placement: None,
        placement,
    };
    let running = runs(node, labels, &placement.lasting(), None, facts);
    state_findings(&review, facts, &running, &running, true)
        .into_iter()
        .filter_map(|f| {
            let action = policy.action(f.rule);
            (action != Action::Off).then(|| f.acted(action))
        })
        .collect()
}

/// The state rules on the labels as they are, then on the labels once every pause has ended:
/// a paused operand (`paused-for-driver-upgrade`, `paused-for-mig-change`, ...) is one that will
/// run again when k8s-driver-manager, mig-manager or vgpu-device-manager restores its label
/// (`docs/gpu-operator.md`). A rule that only the later state breaks is reported once, saying so.
fn state_findings(
    review: &Review<'_>,
    facts: &ClusterFacts,
    before: &Runs,
    after: &Runs,
    assessing: bool,
) -> Vec<Found> {
    let mut findings = Vec::new();
    Ctx {
        review,
        facts,
        before,
        after,
        assessing,
        changes: &[],
    }
    .run(Kind::State, &mut findings);
    let build = Build::of(&facts.operator.version);
    let Some(resumed) = after_pauses(review.old_labels, review.labels, build) else {
        return findings;
    };
    let resumed_old = review
        .old_labels
        .map(|old| after_pauses(None, old, build).unwrap_or_else(|| old.clone()));
    let mut writers: Vec<&str> = resumes(review.old_labels.unwrap_or(review.labels), build)
        .iter()
        .map(|(_, r)| r.by.name())
        .collect();
    writers.dedup();
    let why = if writers.is_empty() {
        "a paused-for-... label comes back as \"true\"".to_owned()
    } else {
        format!(
            "{} writes back the labels it read before pausing",
            writers.join(" and ")
        )
    };
    let later_review = Review {
        labels: &resumed,
        old_labels: resumed_old.as_ref(),
        ..*review
    };
    let mut later = Vec::new();
    let (old_taints, taints) = (
        review.before_placement().lasting(),
        review.placement.lasting(),
    );
    let before = resumed_old.as_ref().map_or_else(Runs::default, |old| {
        runs(review.node, old, &old_taints, None, facts)
    });
    let after = runs(review.node, &resumed, &taints, Some(before.set), facts);
    Ctx {
        review: &later_review,
        facts,
        before: &before,
        after: &after,
        assessing,
        changes: &[],
    }
    .run(Kind::State, &mut later);
    for mut f in later {
        if findings.iter().any(|g| g.rule == f.rule) {
            continue;
        }
        f.message = format!(
            "{} (This is what happens once the pause ends: {why}.)",
            f.message
        );
        f.warning = format!("{} once the paused operands resume", f.warning);
        findings.push(f);
    }
    findings
}

/// The decision's actions on what the rules found: rules set to `off` drop their findings, the
/// others get [`effective_action`].
pub(crate) fn act(found: Vec<Found>, policy: &Policy, operation: Operation) -> Vec<Finding> {
    found
        .into_iter()
        .filter(|f| policy.action(f.rule) != Action::Off)
        .map(|f| {
            let action = effective_action(policy, operation, &f);
            f.acted(action)
        })
        .collect()
}

pub(crate) fn effective_action(policy: &Policy, operation: Operation, finding: &Found) -> Action {
    let configured = policy.action(finding.rule);
    if configured != Action::Deny {
        return configured;
    }
    let lowered = finding.change == Change::Existing
        || policy.mode == Mode::Warn
        || (operation == Operation::Create && !policy.enforce_on_create);
    if lowered { Action::Warn } else { Action::Deny }
}

/// Why a requester is exempt (a listed user or group, a service account of a listed
/// namespace), if it is.
/// Of a user's groups, the first that `ex` names (none, or that one): all [`exemption`] reads
/// of them, so a review need not copy a user's groups, however many, to be decided.
pub fn exempt_groups<G: AsRef<str>>(
    mut groups: impl Iterator<Item = G>,
    ex: &Exemptions,
) -> Vec<String> {
    groups
        .find(|g| ex.groups.iter().any(|e| e == g.as_ref()))
        .map(|g| g.as_ref().to_owned())
        .into_iter()
        .collect()
}

pub(crate) fn exemption(username: &str, groups: &[String], ex: &Exemptions) -> Option<String> {
    if ex.usernames.iter().any(|u| u == username) {
        return Some(format!("user {username} is exempt"));
    }
    if let Some(g) = groups.iter().find(|g| ex.groups.contains(g)) {
        return Some(format!("group {g} is exempt"));
    }
    let sa_namespace = username
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'))
        .map(|(ns, _)| ns);
    if let Some(ns) = sa_namespace
        && ex.service_account_namespaces.iter().any(|n| n == ns)
    {
        return Some(format!(
            "service account {username} of namespace {ns} is exempt"
        ));
    }
    None
}

mod reads;
mod runs;
pub use crate::core::placement::Runs;
pub use reads::{reads_label, reads_label_whatever_the_facts, selector_keys};
pub use runs::runs;

#[cfg(test)]
pub(crate) mod tests;
