//! The continuous audit on `/metrics`.
//!
//! Cardinality stays bounded: per-node series exist only for (node, operand)
//! pairs where the operand is expected or running, never with pod names, and
//! a pair's series are removed as soon as it is neither (a deleted node, an
//! operand switched off).

use std::collections::HashSet;
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use super::{AuditReport, AuditRule};
use crate::metrics::Metrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeOperand {
    node: String,
    operand: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabel {
    rule: &'static str,
}

/// Metric names, without the registry's `gpu_deploy_guard_` prefix.
pub const OPERAND_EXPECTED: &str = "operand_expected";
pub const OPERAND_RUNNING: &str = "operand_running";
pub const AUDIT_FINDINGS: &str = "audit_findings";
pub const AUDIT_LAST_RUN: &str = "audit_last_run_timestamp_seconds";
pub const AUDIT_NODES: &str = "audit_nodes";
pub const CLUSTER_POLICY_AVAILABLE: &str = "cluster_policy_available";

pub struct AuditMetrics {
    expected: Family<NodeOperand, Gauge>,
    running: Family<NodeOperand, Gauge>,
    findings: Family<RuleLabel, Gauge>,
    last_run: Gauge,
    nodes: Gauge,
    cluster_policy_available: Gauge,
    /// The (node, operand) pairs that have series now.
    series: Mutex<HashSet<NodeOperand>>,
}

impl AuditMetrics {
    /// Registers the audit's metrics in the process registry.
    pub fn register(metrics: &Metrics) -> Self {
        let m = AuditMetrics {
            expected: Family::default(),
            running: Family::default(),
            findings: Family::default(),
            last_run: Gauge::default(),
            nodes: Gauge::default(),
            cluster_policy_available: Gauge::default(),
            series: Mutex::new(HashSet::new()),
        };
        // Until the ClusterPolicy has been read, the defaults are in use.
        m.cluster_policy_available.set(0);
        for rule in AuditRule::all() {
            m.findings
                .get_or_create(&RuleLabel { rule: rule.id() })
                .set(0);
        }
        metrics.with_registry(|r| {
            r.register(
                OPERAND_EXPECTED,
                "1 when the operand should run on the node (deploy label, ClusterPolicy, DaemonSet selector)",
                m.expected.clone(),
            );
            r.register(
                OPERAND_RUNNING,
                "1 when a pod of the operand's DaemonSet is Running on the node",
                m.running.clone(),
            );
            r.register(
                AUDIT_FINDINGS,
                "Nodes with a finding of the rule at the last audit",
                m.findings.clone(),
            );
            r.register(
                AUDIT_LAST_RUN,
                "Unix time of the last completed audit",
                m.last_run.clone(),
            );
            r.register(AUDIT_NODES, "Nodes seen by the last audit", m.nodes.clone());
            r.register(
                CLUSTER_POLICY_AVAILABLE,
                "1 when the GPU Operator's ClusterPolicy could be read; 0 when its defaults are assumed",
                m.cluster_policy_available.clone(),
            );
        });
        m
    }

    pub fn set_cluster_policy_available(&self, available: bool) {
        self.cluster_policy_available.set(i64::from(available));
    }

    /// Publishes one audit, done at `unix_seconds`.
    pub fn record(&self, report: &AuditReport, unix_seconds: i64) {
        let mut now = HashSet::new();
        for node in &report.nodes {
            for s in node.operands.iter().filter(|s| s.expected || s.running) {
                let labels = NodeOperand {
                    node: node.name.clone(),
                    operand: s.operand.name(),
                };
                self.expected
                    .get_or_create(&labels)
                    .set(i64::from(s.expected));
                self.running
                    .get_or_create(&labels)
                    .set(i64::from(s.running));
                now.insert(labels);
            }
        }
        let mut series = self.series.lock().unwrap_or_else(|e| e.into_inner());
        for gone in series.difference(&now) {
            self.expected.remove(gone);
            self.running.remove(gone);
        }
        *series = now;
        drop(series);
        for rule in AuditRule::all() {
            let count = if report.rules.contains(&rule) {
                report.count(rule)
            } else {
                0
            };
            self.findings
                .get_or_create(&RuleLabel { rule: rule.id() })
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
        self.nodes
            .set(i64::try_from(report.nodes.len()).unwrap_or(i64::MAX));
        self.last_run.set(unix_seconds);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::audit;
    use crate::audit::tests::node;
    use crate::core::facts::operator_defaults;
    use crate::core::policy::Policy;
    use crate::k8s::pod::{PodPhase, PodView};

    fn plugin_pod(node: &str) -> PodView {
        let mut p = PodView {
            node: Some(node.to_owned()),
            phase: PodPhase::Running,
            daemonset: Some("nvidia-device-plugin-daemonset".to_owned()),
            owned: true,
            ..PodView::default()
        };
        p.metadata.name = Some(format!("dp-{node}"));
        p
    }

    /// The audit's lines of the exposition, without HELP and TYPE.
    fn samples(metrics: &Metrics) -> Vec<String> {
        metrics
            .encode()
            .lines()
            .filter(|l| {
                [
                    OPERAND_EXPECTED,
                    OPERAND_RUNNING,
                    AUDIT_FINDINGS,
                    AUDIT_LAST_RUN,
                    AUDIT_NODES,
                    CLUSTER_POLICY_AVAILABLE,
                ]
                .iter()
                .any(|m| l.starts_with(&format!("gpu_deploy_guard_{m}")))
            })
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn gauges_follow_the_audit_and_deleted_nodes_lose_their_series() {
        let metrics = Metrics::new();
        let am = AuditMetrics::register(&metrics);
        let nodes = [
            node(
                "a",
                &[("device-plugin", "true"), ("container-toolkit", "true")],
            ),
            node("b", &[("device-plugin", "true")]),
            node("cpu", &[]),
        ];
        let pods = [plugin_pod("a"), plugin_pod("b")];
        let report = audit(&nodes, &pods, &operator_defaults(), &Policy::default());
        am.record(&report, 1_796_032_800);
        am.set_cluster_policy_available(true);
        let mut got = samples(&metrics);
        got.sort();
        let mut want = [
            "gpu_deploy_guard_operand_expected{node=\"a\",operand=\"container-toolkit\"} 1",
            "gpu_deploy_guard_operand_expected{node=\"a\",operand=\"device-plugin\"} 1",
            "gpu_deploy_guard_operand_expected{node=\"b\",operand=\"device-plugin\"} 1",
            "gpu_deploy_guard_operand_running{node=\"a\",operand=\"container-toolkit\"} 0",
            "gpu_deploy_guard_operand_running{node=\"a\",operand=\"device-plugin\"} 1",
            "gpu_deploy_guard_operand_running{node=\"b\",operand=\"device-plugin\"} 1",
            "gpu_deploy_guard_audit_findings{rule=\"device-plugin-without-toolkit\"} 2",
            "gpu_deploy_guard_audit_findings{rule=\"operand-without-toolkit\"} 0",
            "gpu_deploy_guard_audit_findings{rule=\"operand-without-validator\"} 0",
            "gpu_deploy_guard_audit_findings{rule=\"device-plugin-on-non-gpu-node\"} 2",
            "gpu_deploy_guard_audit_findings{rule=\"operand-not-running\"} 1",
            "gpu_deploy_guard_audit_last_run_timestamp_seconds 1796032800",
            "gpu_deploy_guard_audit_nodes 3",
            "gpu_deploy_guard_cluster_policy_available 1",
        ]
        .map(str::to_owned);
        want.sort();
        assert_eq!(got, want);

        // Node b is deleted: its series go, the others stay.
        let report = audit(
            &nodes[..1],
            &pods[..1],
            &operator_defaults(),
            &Policy::default(),
        );
        am.record(&report, 1_796_032_860);
        let text = samples(&metrics).join("\n");
        assert!(!text.contains("node=\"b\""), "{text}");
        assert!(
            text.contains(
                "gpu_deploy_guard_operand_running{node=\"a\",operand=\"device-plugin\"} 1"
            )
        );
        assert!(
            text.contains(
                "gpu_deploy_guard_audit_findings{rule=\"device-plugin-without-toolkit\"} 1"
            )
        );
        assert!(text.contains("gpu_deploy_guard_audit_nodes 1"));
    }

    #[test]
    fn the_cluster_policy_is_unavailable_until_read() {
        let metrics = Metrics::new();
        let _am = AuditMetrics::register(&metrics);
        assert!(
            samples(&metrics).contains(&"gpu_deploy_guard_cluster_policy_available 0".to_owned())
        );
    }
}
