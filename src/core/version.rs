//! Which GPU Operator version a decision follows, decided in one place: a version given by the
//! user (`--operator-version`, then the config file's `operatorVersion`) wins over the one the
//! cluster shows (the image tag of the operator's Deployment); where no cluster is read, or it
//! shows none, the newest modelled version is assumed, with the reason ([`Followed::assumed`]).

use crate::core::era::Era;
use crate::core::era::OperatorVersion;

/// The GPU Operator version a decision follows, and where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Followed {
    pub version: OperatorVersion,
    pub source: VersionSource,
}

/// Where the GPU Operator version came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VersionSource {
    /// Given by the user: how (`--operator-version`, the config file's `operatorVersion`).
    Given(String),
    /// The image tag of the operator's Deployment, named `<namespace>/<name>`.
    Deployment(String),
    /// Nothing gave or showed one: the newest modelled version, for this reason.
    Assumed(String),
}

/// Why the version is assumed when nothing gave one.
pub const NO_VERSION: &str = "no GPU Operator version given or found";

impl Followed {
    /// The newest modelled version, assumed for this reason.
    pub fn assumed(why: impl Into<String>) -> Followed {
        Followed {
            version: OperatorVersion::newest(),
            source: VersionSource::Assumed(why.into()),
        }
    }

    /// The model's era of the version.
    pub fn era(&self) -> Era {
        self.version.era
    }

    /// The version and where it came from, in one phrase: `GPU Operator v25.3.4 read from
    /// Deployment gpu-operator/gpu-operator`, `GPU Operator v26.7 assumed (why)`.
    pub fn describe(&self) -> String {
        let phrase = format!(
            "GPU Operator {} {}",
            self.version.text,
            self.source.describe()
        );
        match self.version.outside_model() {
            Some(outside) => format!("{phrase} ({outside})"),
            None => phrase,
        }
    }
}

impl Default for Followed {
    fn default() -> Self {
        Followed::assumed(NO_VERSION)
    }
}

impl VersionSource {
    /// In one word: `given`, `deployment` or `assumed`.
    pub fn state(&self) -> &'static str {
        match self {
            VersionSource::Given(_) => "given",
            VersionSource::Deployment(_) => "deployment",
            VersionSource::Assumed(_) => "assumed",
        }
    }

    /// How the version was learnt, after the version: `given by --operator-version`,
    /// `assumed (why)`.
    pub fn describe(&self) -> String {
        match self {
            VersionSource::Given(how) => format!("given by {how}"),
            VersionSource::Deployment(name) => format!("read from Deployment {name}"),
            VersionSource::Assumed(why) => format!("assumed ({why})"),
        }
    }

    /// Why the version is assumed, if it is.
    pub fn assumed(&self) -> Option<&str> {
        match self {
            VersionSource::Assumed(why) => Some(why),
            _ => None,
        }
    }
}

/// The version the user gave, if any: the flag wins over the config file.
pub fn given(flag: Option<&OperatorVersion>, config: Option<&OperatorVersion>) -> Option<Followed> {
    let (version, how) = match (flag, config) {
        (Some(v), _) => (v, "--operator-version"),
        (None, Some(v)) => (v, "the config file's operatorVersion"),
        (None, None) => return None,
    };
    Some(Followed {
        version: version.clone(),
        source: VersionSource::Given(how.to_owned()),
    })
}

/// The version to follow: the given one, else what the cluster shows (or the assumption made
/// for want of a cluster).
pub fn resolve(given: Option<Followed>, cluster: Followed) -> Followed {
    given.unwrap_or(cluster)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::operator::Outside;

    fn v(text: &str) -> OperatorVersion {
        OperatorVersion::parse(text).unwrap()
    }

    #[test]
    fn the_flag_wins_over_the_config_file_which_wins_over_the_cluster() {
        let deployment = Followed {
            version: v("v25.3.4"),
            source: VersionSource::Deployment("gpu-operator/gpu-operator".into()),
        };
        let flag = given(Some(&v("v24.9.2")), Some(&v("v26.3.0")));
        let followed = resolve(flag, deployment.clone());
        assert_eq!(followed.era(), Era::V24_9);
        assert_eq!(followed.source.describe(), "given by --operator-version");
        let config = given(None, Some(&v("v26.3.0")));
        let followed = resolve(config, deployment.clone());
        assert_eq!(followed.era(), Era::V26_3);
        assert_eq!(
            followed.source.describe(),
            "given by the config file's operatorVersion"
        );
        assert_eq!(resolve(given(None, None), deployment.clone()), deployment);
        let assumed = Followed::assumed("not watched");
        assert_eq!(resolve(None, assumed.clone()), assumed);
    }

    #[test]
    fn a_version_outside_the_model_says_so_where_it_is_described() {
        for (text, era, outside) in [
            ("v22.6.0", Era::V23_3, Some(Outside::Older)),
            ("v1.11.1", Era::V23_3, Some(Outside::Older)),
            ("v22.9.0", Era::V23_3, None),
            ("v23.3.2", Era::V23_3, None),
            ("v23.9.2", Era::V24_9, None),
            ("v24.6.0", Era::V24_9, None),
            ("v24.9.0", Era::V24_9, None),
            ("v25.10.1", Era::V24_9, None),
            ("v26.3.3", Era::V26_3, None),
            ("v26.7.9", Era::V26_7, None),
            ("v26.8.0", Era::V26_7, Some(Outside::Newer)),
            ("v27.1.0", Era::V26_7, Some(Outside::Newer)),
        ] {
            let version = v(text);
            assert_eq!((version.era, version.outside), (era, outside), "{text}");
            let followed = Followed {
                version,
                source: VersionSource::Given("--operator-version".into()),
            };
            let described = followed.describe();
            match outside {
                None => assert_eq!(
                    described,
                    format!("GPU Operator {text} given by --operator-version")
                ),
                Some(Outside::Older) => assert_eq!(
                    described,
                    format!(
                        "GPU Operator {text} given by --operator-version (outside the model: older \
                         than v22.9, its oldest version; decided as v23.3)"
                    )
                ),
                Some(Outside::Newer) => assert_eq!(
                    described,
                    format!(
                        "GPU Operator {text} given by --operator-version (outside the model: newer \
                         than v26.7, its newest version; decided as v26.7)"
                    )
                ),
            }
        }
        assert_eq!(Followed::default().version.outside, None);
    }
}
