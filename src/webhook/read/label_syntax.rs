//! The lengths of Kubernetes label syntax, as the API server validates them before any
//! admission webhook sees an object: a key is `[prefix/]name` with a prefix of at most 253
//! characters and a name of 1-63; a value has at most 63.
//!
//! A review carrying anything longer did not come from an API server. The webhook refuses it
//! while reading, before any work per label, so a megabyte key costs no more than reading it.
//! Only lengths are checked: they are what bounds the work, and checking them costs a few
//! instructions per label on the review path (the characters were checked by the API server).

use std::fmt;

use crate::core::echo::echo;

/// The longest label key prefix (a DNS subdomain), name and value.
pub const MAX_PREFIX: usize = 253;
pub const MAX_NAME: usize = 63;
pub const MAX_VALUE: usize = 63;

/// The part of a label that is too long (or empty).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Prefix,
    Name,
    Value,
}

/// A label outside Kubernetes syntax; its Display names the part and echoes it bounded.
#[derive(Debug, PartialEq, Eq)]
pub struct LabelError {
    pub part: Part,
    pub key: String,
    pub value: Option<String>,
}

impl fmt::Display for LabelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = echo(&self.key);
        match self.part {
            Part::Prefix => write!(
                f,
                "label key {key:?}: the prefix (before '/') must have 1-{MAX_PREFIX} characters"
            ),
            Part::Name => write!(
                f,
                "label key {key:?}: the name (after any '/') must have 1-{MAX_NAME} characters"
            ),
            Part::Value => write!(
                f,
                "label {key:?}: the value {:?} must have at most {MAX_VALUE} characters",
                echo(self.value.as_deref().unwrap_or_default())
            ),
        }
    }
}

impl std::error::Error for LabelError {}

/// Checks one label's lengths; the error keeps at most a bounded copy of it.
pub fn check(key: &str, value: &str) -> Result<(), LabelError> {
    // Byte lengths: the syntax is ASCII only, so any other label was refused by the API
    // server anyway, and bytes never undercount.
    let part = if key.len() > MAX_PREFIX + 1 + MAX_NAME {
        // Too long whatever its split; look for the '/' only where a prefix may end.
        Some(if key.as_bytes()[..=MAX_PREFIX].contains(&b'/') {
            Part::Name
        } else {
            Part::Prefix
        })
    } else {
        match memchr::memchr(b'/', key.as_bytes()) {
            Some(slash) if slash == 0 || slash > MAX_PREFIX => Some(Part::Prefix),
            Some(slash) if !(1..=MAX_NAME).contains(&(key.len() - slash - 1)) => Some(Part::Name),
            Some(_) => None,
            None if !(1..=MAX_NAME).contains(&key.len()) => Some(Part::Name),
            None => None,
        }
    };
    let part = part.or((value.len() > MAX_VALUE).then_some(Part::Value));
    match part {
        None => Ok(()),
        Some(part) => Err(LabelError {
            part,
            key: echo(key).into_owned(),
            value: (part == Part::Value).then(|| echo(value).into_owned()),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_labels_pass() {
        for (k, v) in [
            ("nvidia.com/gpu.deploy.container-toolkit", "true"),
            ("kubernetes.io/hostname", "ip-10-0-0-1.ec2.internal"),
            ("feature.node.kubernetes.io/pci-10de.present", "true"),
            ("node-role.kubernetes.io/control-plane", ""),
            ("beta.kubernetes.io/instance-type", "p4d.24xlarge"),
            ("app", "x_y.z-1"),
        ] {
            assert_eq!(check(k, v), Ok(()), "{k}={v}");
        }
    }

    #[test]
    fn each_part_is_named() {
        let part = |k: &str, v: &str| check(k, v).unwrap_err().part;
        assert_eq!(
            part(&format!("{}.com/x", "p".repeat(250)), "v"),
            Part::Prefix
        );
        assert_eq!(part("/x", "v"), Part::Prefix);
        assert_eq!(part(&"p".repeat(400), "v"), Part::Prefix);
        assert_eq!(part(&format!("a.com/{}", "n".repeat(64)), "v"), Part::Name);
        assert_eq!(part(&format!("a.com/{}", "n".repeat(400)), "v"), Part::Name);
        assert_eq!(part(&"n".repeat(64), "v"), Part::Name);
        assert_eq!(part("a.com/", "v"), Part::Name);
        assert_eq!(part("", "v"), Part::Name);
        assert_eq!(part("a.com/x", &"v".repeat(64)), Part::Value);
        let longest = format!("{}/{}", "p".repeat(253), "n".repeat(63));
        assert_eq!(check(&longest, &"v".repeat(63)), Ok(()));
        assert_eq!(
            check(&format!("{longest}n"), "v").unwrap_err().part,
            Part::Name
        );
    }

    #[test]
    fn the_error_echoes_a_bounded_copy() {
        let key = format!("nvidia.com/gpu.deploy.{}", "x".repeat(8 << 20));
        let error = check(&key, "true").unwrap_err();
        let text = error.to_string();
        assert!(text.len() < 400, "{} bytes", text.len());
        assert!(text.contains("the name (after any '/')"), "{text}");
    }
}
