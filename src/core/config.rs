//! The YAML configuration file: rule actions, mode, exemptions, where the GPU Operator runs and
//! (optionally) its version.
//!
//! Every key is checked: an unknown key, an unknown rule id or a bad action is
//! an error naming it, so a typo never silently leaves a rule at its default.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::core::operator::OperatorVersion;
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
        let file: File = if text.trim().is_empty() {
            File::default()
        } else {
            serde_norway::from_str(text).map_err(|e| ConfigError::Parse {
                path: path.to_owned(),
                message: e.to_string(),
            })?
        };
        let mut policy = Policy {
            mode: file.mode,
            enforce_on_create: file.enforce_on_create,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::operator::Era;

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
    fn unknown_rule_is_an_error_naming_it() {
        let err = parse("rules:\n  device-plugin-without-tookit: warn\n").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("test.yaml"), "{msg}");
        assert!(msg.contains("\"device-plugin-without-tookit\""), "{msg}");
        assert!(msg.contains("device-plugin-without-toolkit"), "{msg}");
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
