//! The pure core: what the operands are, the rules, the decision, the cluster facts and the
//! configuration. Nothing here does I/O: no I/O crate (kube, axum, tokio, hyper, rustls,
//! tracing) and no file or network access. The webhook, `check` and `audit` all call the same
//! functions, so they can never disagree.

pub mod advertised;
pub mod config;
pub mod dra;
pub mod echo;
pub mod era;
pub mod facts;
pub mod foreign;
pub mod labels;
pub mod lasting;
pub mod nvidia_driver;
pub mod operands;
pub mod operator;
pub mod pauses;
pub mod placement;
pub mod pods;
pub mod policy;
pub mod policy_change;
pub mod review;
pub mod rules;
pub mod seen;
pub mod version;
