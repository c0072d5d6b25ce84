//! gpu-deploy-guard: keeps the NVIDIA GPU Operator's `nvidia.com/gpu.deploy.*`
//! node labels from breaking a node's GPU stack.
//!
//! Layers, each importing only from those before it:
//! `core` <- `k8s` <- [`policy_decision`] <- {`webhook`, `audit`} <- [`flags`] <- {`serve`,
//! `cli`} <- `main`; [`flags`] holds the one flag `serve` shares with the offline commands,
//! `--operator-version`.
//!
//! - [`core`]: pure decision logic, no I/O: the operand table, the rule table,
//!   the policy (`decide`, `assess`), the cluster facts, the configuration.
//! - [`k8s`]: the partial Kubernetes objects and how to read them (files,
//!   standard input, List streams, the API).
//! - [`policy_decision`]: a GPU-policy change decided from its objects over the node records,
//!   what the webhook's policy route and the offline `check-policy` and plugin share.
//! - [`webhook`]: AdmissionReview bytes in, the verdict's response out.
//! - [`audit`]: the audit of nodes and pods (pure) and its outputs; writing the report
//!   (`audit::apply`) and its gauges are its only I/O.
//! - [`serve`]: the process: listeners, TLS, readiness, drain, the cluster watch.
//! - [`flags`]: `--operator-version`, the flag `serve` and the offline commands share.
//! - [`cli`]: the offline commands `check`, `audit`, `certs`, `completion`, and the
//!   kubectl plugin.
//!
//! [`events`] (Kubernetes Events on the Nodes, offered by the webhook and the audit) sits with
//! them, below [`webhook`] and [`audit`].
//!
//! [`metrics`] (the Prometheus registry) and [`certs`] (CA generation) are
//! leaves that any layer above `core` may use.
#![forbid(unsafe_code)]

/// `--version`: the package version and the git commit it was built from (`build.rs`).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("GDG_GIT_COMMIT"),
    ")"
);

pub mod audit;
pub mod certs;
pub mod cli;
pub mod core;
pub mod events;
pub mod flags;
pub mod k8s;
pub mod metrics;
pub mod policy_decision;
pub mod serve;
pub mod webhook;
