//! Flags shared by `serve` and the offline commands, below both: `--operator-version`, one
//! flag for `check`, `audit`, `serve` and the kubectl plugin. Which version wins is
//! [`core::version::resolve`](crate::core::version::resolve)'s to say.

use crate::core::config::Config;
use crate::core::operator::OperatorVersion;
use crate::core::version::{self, Followed};

/// Why the version is assumed where no cluster is read (`check`, `audit` of files).
pub const NOT_GIVEN: &str = "no --operator-version given: the newest version the model follows";

#[derive(clap::Args, Clone, Debug, Default)]
pub struct OperatorVersionArg {
    /// The GPU Operator version to follow (`v25.3.4`): it wins over the config file's
    /// operatorVersion and over the version read from the cluster (the image tag of the
    /// operator's Deployment). Without any, the newest modelled version is assumed, and the
    /// output says so.
    #[arg(
        long = "operator-version",
        value_name = "VERSION",
        env = "GDG_OPERATOR_VERSION",
        value_parser = OperatorVersion::parse
    )]
    pub operator_version: Option<OperatorVersion>,
}

impl OperatorVersionArg {
    /// The version given by the flag or, without it, by the config file; and how it was given.
    pub fn given(&self, config: &Config) -> Option<Followed> {
        version::given(
            self.operator_version.as_ref(),
            config.operator_version.as_ref(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::facts::ClusterFacts;
    use crate::core::operands::Era;
    use crate::core::version::VersionSource;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        version: OperatorVersionArg,
    }

    #[test]
    fn the_flag_wins_over_the_config_file() {
        let config = Config {
            operator_version: Some(OperatorVersion::parse("v26.3.0").unwrap()),
            ..Config::default()
        };
        let flag = Cli::try_parse_from(["x", "--operator-version", "v24.9.2"]).unwrap();
        let Followed { version: v, source } = flag.version.given(&config).unwrap();
        assert_eq!((v.text.as_str(), v.era), ("v24.9.2", Era::V24_9));
        assert_eq!(source.describe(), "given by --operator-version");
        let none = Cli::try_parse_from(["x"]).unwrap();
        let Followed { version: v, source } = none.version.given(&config).unwrap();
        assert_eq!(v.era, Era::V26_3);
        assert_eq!(
            source.describe(),
            "given by the config file's operatorVersion"
        );
        assert!(none.version.given(&Config::default()).is_none());
    }

    #[test]
    fn a_bad_version_is_a_usage_error_naming_it() {
        let err = Cli::try_parse_from(["x", "--operator-version", "latest"])
            .err()
            .unwrap();
        assert_eq!(err.exit_code(), 2);
        let msg = err.to_string();
        assert!(
            msg.contains("\"latest\" is not a GPU Operator version like v25.3.4"),
            "{msg}"
        );
        assert!(msg.contains("--operator-version"), "{msg}");
    }

    #[test]
    fn a_given_version_replaces_the_assumed_one() {
        let mut facts = ClusterFacts::default();
        let assumed = facts.operator.clone();
        facts.operator = version::resolve(None, assumed.clone());
        assert!(facts.operator.source.assumed().is_some());
        let given = Followed {
            version: OperatorVersion::parse("v24.9.2").unwrap(),
            source: VersionSource::Given("--operator-version".into()),
        };
        facts.operator = version::resolve(Some(given), assumed);
        assert_eq!(
            facts.annotation(),
            "GPU Operator v24.9.2 given by --operator-version"
        );
    }
}
