//! Defaults derived from the process's limits.

/// Connections `serve` accepts at most by default, whatever the descriptor limit: an idle
/// TLS HTTP/2 connection that has been answered once costs about 48 KiB (measured with
/// `make bench-connections`), so this keeps a full pool at about 12 MiB, leaving the
/// Deployment's 64 Mi room for the body budget and the fleet. API servers keep a handful of
/// connections each.
pub const MAX_CONNECTIONS_CAP: usize = 256;

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

    #[test]
    fn the_default_stays_below_the_descriptor_limit() {
        assert_eq!(max_connections_for(Some(1_048_576)), MAX_CONNECTIONS_CAP);
        assert_eq!(max_connections_for(Some(u64::MAX)), MAX_CONNECTIONS_CAP);
        assert_eq!(max_connections_for(Some(1024)), MAX_CONNECTIONS_CAP);
        assert_eq!(max_connections_for(Some(256)), 160);
        assert_eq!(max_connections_for(Some(128)), 64);
        assert_eq!(max_connections_for(Some(1)), 1);
        assert_eq!(max_connections_for(None), MAX_CONNECTIONS_CAP);
    }
}
