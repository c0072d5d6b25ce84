//! gpu-deploy-guard: keeps the NVIDIA GPU Operator's `nvidia.com/gpu.deploy.*`
//! node labels from breaking a node's GPU stack.
//!
//! The decision lives in [`policy`] and is pure; every other module is a shell
//! around it (HTTP in [`admission`] and [`server`], TLS in [`tls`], the offline
//! command in [`check`]).
#![forbid(unsafe_code)]

pub mod admission;
pub mod certs;
pub mod check;
pub mod config;
pub mod metrics;
pub mod node;
pub mod operands;
pub mod policy;
pub mod server;
pub mod tls;
