//! gpu-deploy-guard: keeps the NVIDIA GPU Operator's `nvidia.com/gpu.deploy.*`
//! node labels from breaking a node's GPU stack.
//!
//! The decision lives in [`policy`] and is pure; every other module is a shell
//! around it (HTTP in [`admission`] and [`server`], TLS in [`tls`], the offline
//! command in [`check`], the cluster audit in [`audit`] and the cluster watch
//! of `serve` in [`cluster_watch`]).
#![forbid(unsafe_code)]

pub mod admission;
pub mod audit;
pub mod certs;
pub mod check;
pub mod cluster_policy;
pub mod cluster_watch;
pub mod config;
pub mod daemonset;
pub mod metrics;
pub mod node;
pub mod operands;
pub mod pod;
pub mod policy;
pub mod server;
pub mod tls;
