//! gpu-deploy-guard: keeps the NVIDIA GPU Operator's `nvidia.com/gpu.deploy.*`
//! node labels from breaking a node's GPU stack.
//!
//! Layers, each importing only from those before it:
//! `core` <- `k8s` <- {`webhook`, `audit`} <- {`serve`, `cli`} <- `main`.
//!
//! - [`core`]: pure decision logic, no I/O: the operand table, the rule table,
//!   the policy (`decide`, `assess`), the cluster facts, the configuration.
//! - [`k8s`]: the partial Kubernetes objects and how to read them (files,
//!   standard input, List streams, the API).
//! - [`webhook`]: AdmissionReview bytes in, the verdict's response out.
//! - [`audit`]: the pure audit of nodes and pods, and its outputs.
//! - [`serve`]: the process: listeners, TLS, readiness, drain, the cluster watch.
//! - [`cli`]: the offline commands `check`, `audit` and `certs`.
//!
//! [`metrics`] (the Prometheus registry) and [`certs`] (CA generation) are
//! leaves that any layer above `core` may use.
#![forbid(unsafe_code)]

pub mod audit;
pub mod certs;
pub mod cli;
pub mod core;
pub mod k8s;
pub mod metrics;
pub mod serve;
pub mod webhook;
