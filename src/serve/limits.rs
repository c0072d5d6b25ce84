//! The webhook's request limits (its flags), and defaults derived from the process's limits.

use std::time::Duration;

use super::parse::parse_duration;
use crate::webhook::Limits;

/// The flags that bound what requests may hold and how long they may take: the webhook's
/// [`Limits`], made in [`RequestArgs::limits`].
#[derive(clap::Args, Clone, Debug)]
pub struct RequestArgs {
    /// Largest request body accepted, in bytes (413 above). The API server sends at most about
    /// 3 MiB per review.
    #[arg(long, env = "GDG_MAX_BODY_BYTES", default_value_t = Limits::default().max_body_bytes,
          display_order = 8)]
    pub max_body_bytes: usize,
    /// Request body bytes held at once across all connections; a body waits for room (503
    /// after the body timeout). At least --max-body-bytes.
    #[arg(long, env = "GDG_MAX_INFLIGHT_BODY_BYTES", default_value_t = Limits::default().max_inflight_body_bytes,
          display_order = 9)]
    pub max_inflight_body_bytes: usize,
    /// Requests in flight from one client address across all its connections (HTTP/2
    /// streams and HTTP/1.1 requests); more are answered 503 at once. The default is half of
    /// --max-connections, so that a source at its share leaves connections the pool may close
    /// for another (src/webhook/shares.rs).
    #[arg(long, env = "GDG_MAX_REQUESTS_PER_SOURCE", display_order = 11)]
    pub max_requests_per_source: Option<usize>,
    /// Time for a request's body to arrive.
    #[arg(long, env = "GDG_BODY_TIMEOUT", default_value = "5s", value_parser = parse_duration,
          display_order = 19)]
    pub body_timeout: Duration,
    /// Time for a whole request, body included.
    #[arg(long, env = "GDG_REQUEST_TIMEOUT", default_value = "10s", value_parser = parse_duration,
          display_order = 20)]
    pub request_timeout: Duration,
}

impl RequestArgs {
    /// The webhook's limits, with `--max-requests-per-source` defaulting to half of
    /// `max_connections`; an error names the flags that disagree.
    pub fn limits(&self, max_connections: usize) -> anyhow::Result<Limits> {
        if self.max_inflight_body_bytes < self.max_body_bytes {
            anyhow::bail!(
                "--max-inflight-body-bytes ({}) must be at least --max-body-bytes ({})",
                self.max_inflight_body_bytes,
                self.max_body_bytes
            );
        }
        if self.max_requests_per_source == Some(0) {
            anyhow::bail!("--max-requests-per-source must be at least 1");
        }
        Ok(Limits {
            max_body_bytes: self.max_body_bytes,
            max_inflight_body_bytes: self.max_inflight_body_bytes,
            body_timeout: self.body_timeout,
            request_timeout: self.request_timeout,
            max_requests_per_source: self
                .max_requests_per_source
                .unwrap_or((max_connections / 2).max(1)),
        })
    }
}

/// Connections `serve` accepts at most by default, whatever the descriptor limit: an idle
/// TLS HTTP/2 connection that has been answered once costs about 48 KiB (measured with
/// `make bench-connections`), so this keeps a full pool at about 6 MiB, its part of the
/// memory bound ([`RequestMemory`]). API servers keep a handful of connections each.
pub const MAX_CONNECTIONS_CAP: usize = 128;

/// What an idle TLS HTTP/2 connection that has been answered once costs: the dearest kind
/// (`make bench-connections`).
pub const CONNECTION_BYTES: usize = 48 * 1024;

/// The memory requests can make `serve` hold at most, beyond its idle footprint and its fleet
/// records, part by part. Each part is held down by one limit:
///
/// - `connections`: the pool full of the dearest connections (`--max-connections`).
/// - `bodies`: the bytes of request bodies (`--max-inflight-body-bytes`, the overdraft
///   included). A body's memory is the bytes that came (`webhook::Collected`), and its view
///   holds no copy of its labels or groups (`webhook::read::scan`), a few hundred bytes whatever it
///   carries (`tests/view_memory.rs`).
/// - `waiting`: what the bodies waiting for room hold that the budget does not count, the
///   frames they could not place and their streams' HTTP/2 windows, which they may not
///   exceed together (`webhook::MAX_WAITING_BYTES`).
/// - `slow_reading`: the one reading at a time of a body the scanner leaves to serde, or of
///   thousands of labels (`Webhook::slow_read`): serde keeps the text of labels and groups and
///   4 bytes each (at most 1.4 times the body), the many-label comparison a pair of string
///   handles per unknown deploy key (1.7 times): twice the largest body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestMemory {
    pub connections: usize,
    pub bodies: usize,
    pub waiting: usize,
    pub slow_reading: usize,
}

impl RequestMemory {
    pub fn of(max_connections: usize, limits: &Limits) -> Self {
        RequestMemory {
            connections: max_connections.saturating_mul(CONNECTION_BYTES),
            bodies: limits.max_inflight_body_bytes.max(limits.max_body_bytes),
            waiting: crate::webhook::MAX_WAITING_BYTES,
            slow_reading: limits.max_body_bytes.saturating_mul(2),
        }
    }

    pub fn total(&self) -> usize {
        self.connections
            .saturating_add(self.bodies)
            .saturating_add(self.waiting)
            .saturating_add(self.slow_reading)
    }
}

impl std::fmt::Display for RequestMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |n: usize| n as f64 / (1024.0 * 1024.0);
        write!(
            f,
            "requests can hold at most {:.1} MiB: connections {:.1}, bodies {:.1}, bodies waiting {:.1}, slow reading {:.1}",
            mib(self.total()),
            mib(self.connections),
            mib(self.bodies),
            mib(self.waiting),
            mib(self.slow_reading)
        )
    }
}

/// Descriptors kept for everything but webhook connections: the admin port and its
/// connections, the cluster watch, certificate reads, the runtime itself.
pub const RESERVED_DESCRIPTORS: usize = 96;

/// The default `--max-connections`: [`MAX_CONNECTIONS_CAP`], or less when the open-file
/// limit leaves less room; then at least half the limit.
pub fn default_max_connections() -> usize {
    max_connections_for(open_file_limit())
}

fn max_connections_for(nofile: Option<u64>) -> usize {
    let Some(nofile) = nofile.and_then(|n| usize::try_from(n).ok()) else {
        return MAX_CONNECTIONS_CAP;
    };
    nofile
        .saturating_sub(RESERVED_DESCRIPTORS)
        .max(nofile / 2)
        .clamp(1, MAX_CONNECTIONS_CAP)
}

/// The soft open-file limit of this process, from `/proc/self/limits`.
pub fn open_file_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    parse_open_files(&limits)
}

fn parse_open_files(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line["Max open files".len()..].split_whitespace().next()?;
    match soft {
        "unlimited" => Some(u64::MAX),
        n => n.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_open_file_limit_is_read() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max cpu time              unlimited            unlimited            seconds   \n\
                      Max open files            1024                 524288               files     \n";
        assert_eq!(parse_open_files(limits), Some(1024));
        assert_eq!(
            parse_open_files(
                "Max open files            unlimited            unlimited            files"
            ),
            Some(u64::MAX)
        );
        assert_eq!(parse_open_files("nothing"), None);
        assert!(open_file_limit().is_some());
    }

    /// The chart's memory limit, and what `serve` holds apart from requests at 5,000 nodes:
    /// the auditor's peak RSS there (BENCHMARKS.md, "Fleet scale"), its idle footprint
    /// included.
    const CHART_LIMIT: usize = 64 << 20;
    const FLEET_OF_5000: usize = 30 << 20;

    #[test]
    fn at_the_defaults_the_worst_requests_and_a_fleet_of_5000_fit_the_chart_with_room() {
        let bound = RequestMemory::of(MAX_CONNECTIONS_CAP, &crate::webhook::Limits::default());
        let worst = bound.total() + FLEET_OF_5000;
        assert!(
            worst <= CHART_LIMIT * 7 / 8,
            "{bound}; with the fleet {} MiB of the chart's 64",
            worst >> 20
        );
        assert_eq!(
            bound.to_string(),
            "requests can hold at most 25.6 MiB: connections 6.0, bodies 10.5, bodies waiting 2.1, slow reading 7.0"
        );
    }

    #[test]
    fn the_default_stays_below_the_descriptor_limit() {
        assert_eq!(max_connections_for(Some(1_048_576)), MAX_CONNECTIONS_CAP);
        assert_eq!(max_connections_for(Some(u64::MAX)), MAX_CONNECTIONS_CAP);
        assert_eq!(max_connections_for(Some(1024)), MAX_CONNECTIONS_CAP);
        assert_eq!(max_connections_for(Some(256)), MAX_CONNECTIONS_CAP);
        assert_eq!(max_connections_for(Some(160)), 80);
        assert_eq!(max_connections_for(Some(128)), 64);
        assert_eq!(max_connections_for(Some(1)), 1);
        assert_eq!(max_connections_for(None), MAX_CONNECTIONS_CAP);
    }
}
