//! Value parsers shared by the `serve` flags of every area.

use std::net::SocketAddr;
use std::time::Duration;

/// Parses a listen address: `IP:PORT`, `[IPv6]:PORT`, or a bare IPv6 address and a port
/// (`fd00::12:8080`, the last colon separating the port), which is what `$(POD_IP):PORT`
/// gives in an IPv6 pod.
pub fn parse_listen(text: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let bad =
        || format!("{text:?} is not an address like 0.0.0.0:8080, 10.0.0.7:8080 or [fd00::7]:8080");
    let (ip, port) = text.rsplit_once(':').ok_or_else(bad)?;
    let ip: std::net::Ipv6Addr = ip.parse().map_err(|_| bad())?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    Ok(SocketAddr::from((ip, port)))
}

/// Parses a duration: `500ms`, `5s`, `2m`, `1h`, `1m30s` (humantime), a bare number of seconds,
/// or a decimal number of `ms`, `s` or `m` (`1.5s`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let invalid = |e: &dyn std::fmt::Display| format!("{text:?}: {e}");
    if let Ok(seconds) = text.parse::<f64>() {
        return Duration::try_from_secs_f64(seconds).map_err(|e| invalid(&e));
    }
    if let Some(at) = text.find(|c: char| c.is_ascii_alphabetic())
        && text[..at].contains('.')
    {
        let (number, unit) = text.split_at(at);
        let scale = match unit {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            _ => return Err(format!("{text:?}: a fraction takes the unit ms, s or m")),
        };
        let value: f64 = number.parse().map_err(|e| invalid(&e))?;
        return Duration::try_from_secs_f64(value * scale).map_err(|e| invalid(&e));
    }
    humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration like 500ms, 5s, 2m or 1m30s: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_parse_with_a_bare_ipv6_pod_ip() {
        let ok = |t: &str| parse_listen(t).unwrap().to_string();
        assert_eq!(ok("0.0.0.0:8080"), "0.0.0.0:8080");
        assert_eq!(ok("10.244.1.7:8080"), "10.244.1.7:8080");
        assert_eq!(ok("[fd00::7]:8080"), "[fd00::7]:8080");
        // `$(POD_IP):8080` in an IPv6 pod.
        assert_eq!(ok("fd00:10:244::7:8080"), "[fd00:10:244::7]:8080");
        assert_eq!(ok("::1:8080"), "[::1]:8080");
        for bad in [
            "",
            "8080",
            "10.244.1.7",
            "10.244.1.7:http",
            "$(POD_IP):8080",
            "fd00::7:99999",
        ] {
            let e = parse_listen(bad).unwrap_err();
            assert!(e.contains("is not an address like"), "{bad}: {e}");
        }
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert!(
            parse_duration("5x")
                .unwrap_err()
                .contains("unknown time unit")
        );
        assert!(parse_duration("1.5h").unwrap_err().contains("ms, s or m"));
        assert!(parse_duration("fast").is_err());
    }
}
