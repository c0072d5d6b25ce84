//! The offline commands: `check` (the webhook's decision on Node files), `audit` (files or a
//! live cluster) and `certs`.

pub mod audit;
pub mod certs;
pub mod check;
