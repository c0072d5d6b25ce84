//! The YAML configuration file: rule actions, mode, exemptions, where the GPU Operator runs and
//! (optionally) its version.
//!
//! Every key is checked: an unknown key, an unknown rule id or a bad action is
//! an error naming it, so a typo never silently leaves a rule at its default.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::core::era::OperatorVersion;
use crate::core::lasting::StuckAfter;
use crate::core::policy::{DEFAULT_OPERATOR_NAMESPACE, Exemptions, Mode, Policy};
use crate::core::rules::{Action, RULES, Rule};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config file {path}: unknown rule {id:?} under `rules` (known rules: {known})")]
    UnknownRule {
        path: PathBuf,
        id: String,
        known: String,
    },
}

/// The file as written. Field names follow Kubernetes' camelCase.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct File {
    #[serde(default)]
    mode: Mode,
    operator_namespace: Option<String>,
    operator_version: Option<String>,
    #[serde(default)]
    enforce_on_create: bool,
    #[serde(default)]
    rules: BTreeMap<String, Action>,
    #[serde(default)]
    exemptions: ExemptionsFile,
    #[serde(default)]
    stuck_after: StuckAfterFile,
}

/// `stuckAfter`: how long a pause or a driver upgrade state may last before the audit reports
/// it (`pause-stuck`, `driver-upgrade-stuck`), as `90m`, `1h`, `2d`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct StuckAfterFile {
    pause: Option<String>,
    driver_upgrade: Option<String>,
}

impl StuckAfterFile {
    fn parse(self) -> Result<StuckAfter, String> {
        let read = |name: &str, text: Option<String>, default| -> Result<_, String> {
            let Some(text) = text else {
                return Ok(default);
            };
            match humantime::parse_duration(text.trim()) {
                Ok(d) if d.is_zero() => Err(format!("stuckAfter.{name}: must be longer than 0")),
                Ok(d) => Ok(d),
                Err(e) => Err(format!(
                    "stuckAfter.{name}: {text:?} is not a duration like 90m, 1h or 2d ({e})"
                )),
            }
        };
        let default = StuckAfter::default();
        Ok(StuckAfter {
            pause: read("pause", self.pause, default.pause)?,
            driver_upgrade: read("driverUpgrade", self.driver_upgrade, default.driver_upgrade)?,
        })
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ExemptionsFile {
    #[serde(default)]
    usernames: Vec<String>,
    #[serde(default)]
    groups: Vec<String>,
    /// Defaults to the operator namespace when not given.
    service_account_namespaces: Option<Vec<String>>,
}

/// The loaded configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub policy: Policy,
    /// Where the GPU Operator runs: its Deployment, DaemonSets, pods and service accounts live
    /// there.
    pub operator_namespace: String,
    /// The GPU Operator version to follow (`operatorVersion`), over what the cluster says.
    pub operator_version: Option<OperatorVersion>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            policy: Policy::default(),
            operator_namespace: DEFAULT_OPERATOR_NAMESPACE.to_owned(),
            operator_version: None,
        }
    }
}

impl Config {
    /// Parses YAML (or JSON, a subset); `path` only names the source in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        check_shape(text).map_err(|message| ConfigError::Parse {
            path: path.to_owned(),
            message,
        })?;
        let file: File = if text.trim().is_empty() {
            File::default()
        } else {
            serde_norway::from_str(text).map_err(|e| ConfigError::Parse {
                path: path.to_owned(),
                message: e.to_string(),
            })?
        };
        let stuck_after = file
            .stuck_after
            .parse()
            .map_err(|message| ConfigError::Parse {
                path: path.to_owned(),
                message,
            })?;
        let mut policy = Policy {
            mode: file.mode,
            enforce_on_create: file.enforce_on_create,
            stuck_after,
            ..Policy::default()
        };
        for (id, action) in file.rules {
            let rule = Rule::from_id(&id).ok_or_else(|| ConfigError::UnknownRule {
                path: path.to_owned(),
                id: id.clone(),
                known: RULES.iter().map(|s| s.id).collect::<Vec<_>>().join(", "),
            })?;
            policy.actions[rule as usize] = action;
        }
        let operator_version = file
            .operator_version
            .map(|text| OperatorVersion::parse(&text))
            .transpose()
            .map_err(|e| ConfigError::Parse {
                path: path.to_owned(),
                message: format!("operatorVersion: {e}"),
            })?;
        let operator_namespace = file
            .operator_namespace
            .unwrap_or_else(|| DEFAULT_OPERATOR_NAMESPACE.to_owned());
        policy.exemptions = Exemptions {
            usernames: file.exemptions.usernames,
            groups: file.exemptions.groups,
            service_account_namespaces: file
                .exemptions
                .service_account_namespaces
                .unwrap_or_else(|| vec![operator_namespace.clone()]),
        };
        Ok(Config {
            policy,
            operator_namespace,
            operator_version,
        })
    }
}

/// How deep a configuration file may nest: its deepest value (`exemptions.groups[0]`) is at
/// depth 3.
const MAX_DEPTH: usize = 8;

/// Reads the file's YAML events before serde builds anything, and refuses what a
/// configuration never needs but an attacker with write access to the ConfigMap could use:
/// anchors and aliases (a few KiB of aliases expand to gigabytes), deep nesting (the parser's
/// work grows with it), and a key given twice in one mapping (YAML says keys are unique; a
/// rule listed as `deny` and again as `off` must not silently end up off). Stops at the first
/// problem, so a hostile file costs no more than reading up to it.
fn check_shape(text: &str) -> Result<(), String> {
    use yaml_rust2::parser::{Event, Parser};

    enum Frame {
        /// The keys seen so far, the key whose value comes next (`None`: a key comes next),
        /// and where the mapping is (`rules.`), for messages.
        Map {
            keys: std::collections::HashSet<String>,
            key: Option<String>,
            path: String,
        },
        Seq,
    }
    let mut stack: Vec<Frame> = Vec::new();
    let mut parser = Parser::new_from_str(text);
    loop {
        let (event, mark) = parser.next_token().map_err(|e| e.to_string())?;
        let at = |what: &str| format!("line {}: {what}", mark.line());
        let anchor = match &event {
            Event::Scalar(_, _, anchor, _)
            | Event::SequenceStart(anchor, _)
            | Event::MappingStart(anchor, _) => *anchor,
            _ => 0,
        };
        if anchor != 0 {
            return Err(at("YAML anchors (&name) are not accepted"));
        }
        // Where a value that starts here sits, when it is a mapping's value.
        let here = match stack.last() {
            Some(Frame::Map {
                key: Some(key),
                path,
                ..
            }) => format!("{path}{key}."),
            _ => String::new(),
        };
        match event {
            Event::StreamEnd => return Ok(()),
            Event::Alias(_) => return Err(at("YAML aliases (*name) are not accepted")),
            Event::Scalar(value, ..) => {
                if let Some(Frame::Map { keys, key, path }) = stack.last_mut() {
                    // A scalar where a key is due is a key; else it was the key's value.
                    if key.take().is_none() {
                        if !keys.insert(value.clone()) {
                            return Err(at(&format!("`{path}{value}` is given twice")));
                        }
                        *key = Some(value);
                    }
                }
            }
            Event::MappingStart(..) | Event::SequenceStart(..) => {
                if let Some(Frame::Map { key: None, .. }) = stack.last() {
                    return Err(at("keys must be plain strings"));
                }
                if stack.len() >= MAX_DEPTH {
                    return Err(at(&format!("nested deeper than {MAX_DEPTH} levels")));
                }
                stack.push(if matches!(event, Event::MappingStart(..)) {
                    Frame::Map {
                        keys: Default::default(),
                        key: None,
                        path: here,
                    }
                } else {
                    Frame::Seq
                });
            }
            Event::MappingEnd | Event::SequenceEnd => {
                stack.pop();
                // The collection was its parent's value: a key comes next.
                if let Some(Frame::Map { key, .. }) = stack.last_mut() {
                    *key = None;
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::era::Era;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("test.yaml"))
    }

    #[test]
    fn the_three_modes_are_read_and_another_is_refused() {
        for (text, mode) in [
            ("enforce", Mode::Enforce),
            ("warn", Mode::Warn),
            ("audit", Mode::Audit),
        ] {
            assert_eq!(parse(&format!("mode: {text}\n")).unwrap().policy.mode, mode);
        }
        let err = parse("mode: block\n").unwrap_err().to_string();
        assert!(err.contains("block"), "{err}");
    }

    #[test]
    fn empty_file_gives_the_defaults() {
        assert_eq!(parse("").unwrap(), Config::default());
        assert_eq!(parse("{}").unwrap(), Config::default());
    }

    #[test]
    fn rule_actions_mode_and_exemptions_are_read() {
        let cfg = parse(
            "mode: warn\noperatorNamespace: nvidia\nenforceOnCreate: true\n\
             rules:\n  operand-without-toolkit: deny\n  value-not-true: off\n\
             exemptions:\n  usernames: [alice]\n  groups: [gpu-admins]\n",
        )
        .unwrap();
        assert_eq!(cfg.policy.mode, Mode::Warn);
        assert!(cfg.policy.enforce_on_create);
        assert_eq!(cfg.policy.action(Rule::OperandWithoutToolkit), Action::Deny);
        assert_eq!(cfg.policy.action(Rule::ValueNotTrue), Action::Off);
        assert_eq!(
            cfg.policy.action(Rule::DevicePluginWithoutToolkit),
            Action::Deny
        );
        assert_eq!(cfg.operator_namespace, "nvidia");
        assert_eq!(cfg.policy.exemptions.usernames, ["alice"]);
        assert_eq!(cfg.policy.exemptions.groups, ["gpu-admins"]);
        // The operator's own service accounts follow the operator namespace.
        assert_eq!(cfg.policy.exemptions.service_account_namespaces, ["nvidia"]);
    }

    #[test]
    fn the_operator_version_is_read_and_a_bad_one_named() {
        let cfg = parse("operatorVersion: v25.3.4\n").unwrap();
        let v = cfg.operator_version.unwrap();
        assert_eq!((v.text.as_str(), v.era), ("v25.3.4", Era::V24_9));
        assert_eq!(parse("{}").unwrap().operator_version, None);
        let msg = parse("operatorVersion: latest\n").unwrap_err().to_string();
        assert_eq!(
            msg,
            "config file test.yaml: operatorVersion: \"latest\" is not a GPU Operator version like v25.3.4"
        );
    }

    #[test]
    fn service_account_namespaces_can_be_emptied() {
        let cfg = parse("exemptions:\n  serviceAccountNamespaces: []\n").unwrap();
        assert!(cfg.policy.exemptions.service_account_namespaces.is_empty());
    }

    #[test]
    fn stuck_after_is_read_and_a_bad_duration_named() {
        use std::time::Duration;
        let cfg = parse("stuckAfter:\n  pause: 90m\n  driverUpgrade: 2d\n").unwrap();
        assert_eq!(cfg.policy.stuck_after.pause, Duration::from_secs(90 * 60));
        assert_eq!(
            cfg.policy.stuck_after.driver_upgrade,
            Duration::from_secs(2 * 86_400)
        );
        // One given, the other at its default.
        let cfg = parse("stuckAfter:\n  pause: 10m\n").unwrap();
        assert_eq!(
            cfg.policy.stuck_after.driver_upgrade,
            StuckAfter::default().driver_upgrade
        );
        for (text, named) in [
            ("stuckAfter:\n  pause: soon\n", "stuckAfter.pause: \"soon\""),
            (
                "stuckAfter:\n  driverUpgrade: 0s\n",
                "stuckAfter.driverUpgrade: must be longer than 0",
            ),
            ("stuckAfter:\n  paws: 1h\n", "paws"),
        ] {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.contains(named), "{text}: {err}");
        }
    }

    #[test]
    fn unknown_rule_is_an_error_naming_it() {
        let err = parse("rules:\n  device-plugin-without-tookit: warn\n").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("test.yaml"), "{msg}");
        assert!(msg.contains("\"device-plugin-without-tookit\""), "{msg}");
        assert!(msg.contains("device-plugin-without-toolkit"), "{msg}");
    }

    #[test]
    fn a_rule_listed_twice_is_an_error_naming_it() {
        let msg = parse("rules:\n  value-not-true: deny\n  value-not-true: off\n")
            .unwrap_err()
            .to_string();
        assert_eq!(
            msg,
            "config file test.yaml: line 3: `rules.value-not-true` is given twice"
        );
        let msg = parse("mode: warn\nmode: enforce\n")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("`mode` is given twice"), "{msg}");
        // The same key in different mappings is fine.
        let cfg = parse("exemptions:\n  usernames: [a]\n  groups: [a]\n").unwrap();
        assert_eq!(cfg.policy.exemptions.groups, ["a"]);
    }

    #[test]
    fn anchors_aliases_and_deep_nesting_are_refused_at_once() {
        let msg = parse("exemptions:\n  usernames: &u [a]\n  groups: *u\n")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("anchors (&name) are not accepted"), "{msg}");
        // An alias of no anchor: the parser itself refuses it.
        let msg = parse("exemptions:\n  groups: *u\n")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("anchor"), "{msg}");
        let msg = parse("a: {b: {c: {d: {e: {f: {g: {h: {i: 1}}}}}}}}\n")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("nested deeper than 8 levels"), "{msg}");
        // 200 KB of brackets: refused near the start (the scanner's own limit looks ahead of
        // the events), not parsed to the end.
        let deep = "[".repeat(200_000);
        let started = std::time::Instant::now();
        let msg = parse(&deep).unwrap_err().to_string();
        assert!(
            msg.contains("recursion limit") || msg.contains("nested deeper"),
            "{msg}"
        );
        // Generous for a loaded machine: the old reading took 37 s.
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        // A billion-laughs file is refused at its first anchor, before any expansion.
        let mut laughs = "a: &a [x, x, x, x, x, x, x, x, x, x]\n".to_owned();
        for i in 0..20 {
            laughs.push_str(&format!("b{i}: &b{i} [*a, *a, *a, *a, *a, *a, *a, *a]\n"));
        }
        assert!(parse(&laughs).unwrap_err().to_string().contains("anchors"));
    }

    #[test]
    fn bad_action_unknown_key_and_bad_mode_are_errors() {
        for (text, needle) in [
            ("rules:\n  value-not-true: block\n", "block"),
            ("exemptions:\n  user: [x]\n", "user"),
            ("mode: strict\n", "strict"),
            ("opratorNamespace: x\n", "opratorNamespace"),
        ] {
            let msg = parse(text).unwrap_err().to_string();
            assert!(msg.contains(needle), "{text:?} gave {msg}");
            assert!(msg.starts_with("config file test.yaml"), "{msg}");
        }
    }
}
