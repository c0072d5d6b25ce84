//! Kubernetes label and name syntax, and label changes in kubectl syntax (`KEY=VALUE` sets,
//! `KEY-` removes).
//!
//! A key is `[prefix/]name` with a prefix that is a DNS subdomain of at most 253 characters
//! and a name of 1-63; a value has at most 63. Two checks read it:
//!
//! - [`validate_key`] and [`validate_value`], the whole syntax, as the API server validates it:
//!   `check` and the kubectl plugin refuse a change the API server would refuse.
//! - [`check_lengths`], lengths only, on the webhook's review path. The API server validated
//!   every label before any admission webhook sees an object, so a review carrying anything
//!   longer did not come from one. The webhook refuses it while reading, before any work per
//!   label, so a megabyte key costs no more than reading it. Lengths are what bounds the work,
//!   and checking them costs a few instructions per label.

use std::fmt;

use crate::core::echo::echo;

/// The longest DNS subdomain: a label key's prefix, a node's name.
pub const MAX_SUBDOMAIN: usize = 253;
/// The longest label key prefix (a DNS subdomain), name and value.
pub const MAX_PREFIX: usize = MAX_SUBDOMAIN;
pub const MAX_NAME: usize = 63;
pub const MAX_VALUE: usize = 63;

/// The longest node name Kubernetes accepts (a DNS subdomain).
pub const MAX_NAME_CHARS: usize = MAX_SUBDOMAIN;

/// One label change in kubectl syntax.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Set(String, String),
    Remove(String),
}

/// A label change that could not be parsed: the change as given, and why.
#[derive(Debug, PartialEq, Eq)]
pub struct ChangeError {
    pub change: String,
    pub problem: String,
}

impl fmt::Display for ChangeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "change {:?}: {}", self.change, self.problem)
    }
}

impl std::error::Error for ChangeError {}

impl Change {
    /// Parses `key=value` or `key-`, checking the key and value like the API server does.
    pub fn parse(text: &str) -> Result<Change, ChangeError> {
        let bad = |problem: String| ChangeError {
            change: text.to_owned(),
            problem,
        };
        if let Some((key, value)) = text.split_once('=') {
            validate_key(key).map_err(bad)?;
            validate_value(value).map_err(bad)?;
            Ok(Change::Set(key.to_owned(), value.to_owned()))
        } else if let Some(key) = text.strip_suffix('-') {
            validate_key(key).map_err(bad)?;
            Ok(Change::Remove(key.to_owned()))
        } else {
            Err(bad(
                "expected key=value to set a label or key- to remove it".to_owned(),
            ))
        }
    }
}

fn is_name(s: &str) -> bool {
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= MAX_NAME
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= MAX_SUBDOMAIN
        && s.split('.').all(|part| {
            let b = part.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

/// A label key: `[prefix/]name`, prefix a DNS subdomain, name at most 63 characters.
pub fn validate_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && !is_dns_subdomain(prefix)
    {
        return Err(format!(
            "label key prefix {prefix:?} is not a DNS subdomain"
        ));
    }
    if !is_name(name) {
        return Err(format!(
            "label name {name:?} must be 1-{MAX_NAME} characters of letters, digits, '-', '_' or '.', \
             starting and ending with a letter or digit"
        ));
    }
    Ok(())
}

/// A label value: empty, or at most 63 characters like a name.
pub fn validate_value(value: &str) -> Result<(), String> {
    if value.is_empty() || is_name(value) {
        Ok(())
    } else {
        Err(format!(
            "label value {value:?} must be empty or 1-{MAX_VALUE} characters of letters, digits, '-', '_' or '.', \
             starting and ending with a letter or digit"
        ))
    }
}

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
pub fn check_lengths(key: &str, value: &str) -> Result<(), LabelError> {
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
            assert_eq!(check_lengths(k, v), Ok(()), "{k}={v}");
        }
    }

    #[test]
    fn each_part_is_named() {
        let part = |k: &str, v: &str| check_lengths(k, v).unwrap_err().part;
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
        assert_eq!(check_lengths(&longest, &"v".repeat(63)), Ok(()));
        assert_eq!(
            check_lengths(&format!("{longest}n"), "v").unwrap_err().part,
            Part::Name
        );
    }

    #[test]
    fn the_error_echoes_a_bounded_copy() {
        let key = format!("nvidia.com/gpu.deploy.{}", "x".repeat(8 << 20));
        let error = check_lengths(&key, "true").unwrap_err();
        let text = error.to_string();
        assert!(text.len() < 400, "{} bytes", text.len());
        assert!(text.contains("the name (after any '/')"), "{text}");
    }
}
