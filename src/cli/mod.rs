//! The offline commands: `check` (the webhook's decision on Node files), `audit` (files or a
//! live cluster), `certs`, `completion`, and the kubectl plugin (`kubectl gpu-deploy-guard`).
//! Their `--operator-version` is [`crate::flags`]'s, which `serve` shares.

pub mod audit;
pub mod certs;
pub mod check;
pub mod check_policy;
pub mod completion;
pub mod kubectl_plugin;
pub mod kubectl_policy;
pub mod operands;
