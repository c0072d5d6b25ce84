//! Which GPU Operator version a decision follows, decided in one place: a version given by the
//! user (`--operator-version`, then the config file's `operatorVersion`) wins over the one the
//! cluster shows (the image tag of the operator's Deployment); where no cluster is read, or it
//! shows none, the newest modelled version is assumed, with the reason
//! ([`assumed_version`](crate::core::facts::assumed_version)).

use crate::core::facts::VersionSource;
use crate::core::operator::OperatorVersion;

/// A version and where it came from.
pub type Sourced = (OperatorVersion, VersionSource);

/// The version the user gave, if any: the flag wins over the config file.
pub fn given(flag: Option<&OperatorVersion>, config: Option<&OperatorVersion>) -> Option<Sourced> {
    match (flag, config) {
        (Some(v), _) => Some((
            v.clone(),
            VersionSource::Given("--operator-version".to_owned()),
        )),
        (None, Some(v)) => Some((
            v.clone(),
            VersionSource::Given("the config file's operatorVersion".to_owned()),
        )),
        (None, None) => None,
    }
}

/// The version to follow: the given one, else what the cluster shows (or the assumption made
/// for want of a cluster).
pub fn resolve(given: Option<Sourced>, cluster: Sourced) -> Sourced {
    given.unwrap_or(cluster)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::facts::assumed_version;
    use crate::core::operands::Era;

    fn v(text: &str) -> OperatorVersion {
        OperatorVersion::parse(text).unwrap()
    }

    #[test]
    fn the_flag_wins_over_the_config_file_which_wins_over_the_cluster() {
        let deployment = (
            v("v25.3.4"),
            VersionSource::Deployment("gpu-operator/gpu-operator".into()),
        );
        let flag = given(Some(&v("v24.9.2")), Some(&v("v26.3.0")));
        let (version, source) = resolve(flag, deployment.clone());
        assert_eq!(version.era, Era::V24_9);
        assert_eq!(source.describe(), "given by --operator-version");
        let config = given(None, Some(&v("v26.3.0")));
        let (version, source) = resolve(config, deployment.clone());
        assert_eq!(version.era, Era::V26_3);
        assert_eq!(
            source.describe(),
            "given by the config file's operatorVersion"
        );
        assert_eq!(resolve(given(None, None), deployment.clone()), deployment);
        let assumed = assumed_version("not watched");
        assert_eq!(resolve(None, assumed.clone()), assumed);
    }
}
