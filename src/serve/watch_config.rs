//! What the cluster watch is told: its flags ([`ClusterArgs`]) and its configuration
//! ([`WatchConfig`]).

use std::time::Duration;

use super::lease::{LeaseArgs, LeaseConfig};
use super::parse::parse_duration;
use crate::audit::metrics::DEFAULT_MAX_NODE_SERIES;
use crate::core::policy::Policy;
use crate::core::version::Followed;
use crate::k8s::node::NODE_PAGE_SIZE;

/// Objects per list page by default: a whole Node is 20–30 KB and a Pod 5–10 KB, so a page
/// stays within a few megabytes ([`NODE_PAGE_SIZE`]).
pub const DEFAULT_PAGE_SIZE: u32 = NODE_PAGE_SIZE;

/// The flags of the cluster watch and of the continuous audit.
#[derive(clap::Args, Clone, Debug)]
pub struct ClusterArgs {
    /// Do not read the cluster: decide with the GPU Operator's default operand switches and
    /// run no continuous audit. Without this, the ClusterPolicy, the operand DaemonSets, their
    /// pods, the operator's Deployment (for its version) and the nodes are watched (in-cluster
    /// config or KUBECONFIG).
    #[arg(long, env = "GDG_NO_CLUSTER_WATCH", display_order = 24)]
    pub no_cluster_watch: bool,
    /// Write the continuous audit as report `gpu-deploy-guard`: a ClusterPolicyReport
    /// (wgpolicyk8s.io/v1alpha2), or a ClusterReport (openreports.io/v1alpha1) with
    /// `--report-format openreports`.
    #[arg(
        long,
        env = "GDG_REPORT",
        conflicts_with = "no_cluster_watch",
        display_order = 25
    )]
    pub report: bool,
    /// The report's API: wgpolicyk8s (ClusterPolicyReport) or openreports (ClusterReport).
    #[arg(
        long,
        env = "GDG_REPORT_FORMAT",
        value_enum,
        default_value = "wgpolicyk8s",
        display_order = 25
    )]
    pub report_format: crate::audit::report::Format,
    #[command(flatten)]
    pub lease: LeaseArgs,
    /// Nodes with per-node audit series (operand_expected, operand_running) at most: failures
    /// first, then by name; the others are counted in audit_nodes_not_itemized. Bounds the
    /// auditor's series when every node has a finding.
    #[arg(long, env = "GDG_MAX_NODE_SERIES", default_value_t = DEFAULT_MAX_NODE_SERIES,
          display_order = 32)]
    pub max_node_series: usize,
    #[command(flatten)]
    pub events: EventArgs,
    /// Objects per page when listing the nodes and the operator's pods; one page is held in
    /// memory at a time.
    #[arg(long, env = "GDG_LIST_PAGE_SIZE", default_value_t = DEFAULT_PAGE_SIZE,
          value_parser = clap::value_parser!(u32).range(1..=500), display_order = 31)]
    pub list_page_size: u32,
}

/// The flags of the Kubernetes Events on the Nodes.
#[derive(clap::Args, Clone, Debug)]
pub struct EventArgs {
    /// Write no Kubernetes Events. Without this, each replica writes events.k8s.io/v1 Events
    /// (namespace default, shown by `kubectl describe node`) for the findings a node gains in
    /// the continuous audit (the auditor only) and for the changes it refuses; needs the
    /// cluster watch.
    #[arg(long, env = "GDG_NO_EVENTS", display_order = 33)]
    pub no_events: bool,
    /// One Event per node, rule and source (audit, refusal) within this window, per replica.
    #[arg(long, env = "GDG_EVENT_WINDOW", default_value = "10m", value_parser = parse_duration,
          display_order = 34)]
    pub event_window: Duration,
}

/// What the watch needs to know.
#[derive(Clone, Debug)]
pub struct WatchConfig {
    /// The GPU Operator's namespace: its DaemonSets and pods are watched there.
    pub namespace: String,
    /// Rule actions, for the audit's findings.
    pub policy: Policy,
    /// Quiet time after a change before facts and audit are re-computed.
    pub debounce: Duration,
    /// Longest wait for the first sync of the ClusterPolicy and DaemonSets before the
    /// readiness gate opens anyway (with the facts known by then, and a warning).
    pub sync_timeout: Duration,
    /// Write the audit as report `gpu-deploy-guard` whenever its findings change.
    pub report: bool,
    /// In which API.
    pub report_format: crate::audit::report::Format,
    /// The operator version given (flag or config file), and how; `None`: read it from the
    /// operator's Deployment.
    pub operator_version: Option<Followed>,
    /// Objects per page of the nodes' and pods' lists: one page is held whole in memory while
    /// it is read, so this bounds the lists' cost whatever the size of the fleet.
    pub page_size: u32,
    /// The Lease that elects the one auditor; `None`: this replica audits, unelected.
    pub lease: Option<LeaseConfig>,
    /// Nodes with per-node audit series at most.
    pub max_node_series: usize,
    /// Where the audit offers an Event for each finding a node gains; `None`: no Events.
    pub events: Option<std::sync::Arc<crate::events::Events>>,
}

impl WatchConfig {
    pub fn new(namespace: impl Into<String>, policy: Policy) -> Self {
        WatchConfig {
            namespace: namespace.into(),
            policy,
            debounce: Duration::from_secs(1),
            sync_timeout: Duration::from_secs(30),
            report: false,
            report_format: crate::audit::report::Format::PolicyReport,
            operator_version: None,
            page_size: DEFAULT_PAGE_SIZE,
            lease: None,
            max_node_series: DEFAULT_MAX_NODE_SERIES,
            events: None,
        }
    }
}
