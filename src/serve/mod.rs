//! `serve`: the process around the webhook. The listeners and connections ([`server`]), TLS
//! and certificate rotation ([`tls`]), readiness and the admin port ([`readiness`]), and the
//! cluster watch ([`watch`]), which keeps the webhook's facts and the continuous audit current.

mod auditor;
pub mod cmd;
mod conn;
mod follow;
mod health;
mod idle;
mod kept;
pub mod lease;
pub mod limits;
pub mod logs;
pub mod metrics;
mod nodes;
mod parse;
mod plugins;
mod pool;
pub mod readiness;
pub mod server;
mod slices;
mod stores;
pub mod tls;
pub mod watch;
pub mod watch_config;
