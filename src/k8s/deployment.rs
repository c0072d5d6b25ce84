//! The GPU Operator's own Deployment, and the operator version its image tag names.
//!
//! The operator's Helm chart (`deployments/gpu-operator/templates/operator.yaml`) and its OLM
//! bundle both run it as Deployment `gpu-operator` whose pod template is labelled
//! `app.kubernetes.io/component: gpu-operator` and `app: gpu-operator`, with a container
//! `gpu-operator` running `<repository>/gpu-operator:<version>` (the chart's `operator.version`,
//! by default its appVersion). The ClusterPolicy's `status` has no version (`state`,
//! `namespace`, `conditions` only), so the image tag is the one place a cluster states it.
//!
//! [`DeploymentView`] reads only the names, those two pod-template labels and each container's
//! name and image; everything else in a Deployment is skipped unparsed.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

use super::meta::{PartialMeta, WorkloadSpec};
use crate::core::operator::OperatorVersion;
use crate::core::version::{Followed, VersionSource};

/// The operator's name: its Deployment's, its container's and its image's.
pub const OPERATOR: &str = "gpu-operator";
const COMPONENT_LABEL: &str = "app.kubernetes.io/component";

/// A Deployment reduced to its name, the pod template's `app.kubernetes.io/component` and `app`
/// labels, and its containers' names and images.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(from = "RawDeployment")]
pub struct DeploymentView {
    pub metadata: ObjectMeta,
    /// The pod template's `app.kubernetes.io/component` label.
    pub component: Option<String>,
    /// The pod template's `app` label.
    pub app: Option<String>,
    pub containers: Vec<Container>,
}

/// One container of the pod template: its name and image.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Container {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub image: String,
}

impl DeploymentView {
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    /// `<namespace>/<name>`, as messages name it.
    pub fn qualified_name(&self) -> String {
        match self.metadata.namespace.as_deref() {
            Some(ns) => format!("{ns}/{}", self.name()),
            None => self.name().to_owned(),
        }
    }

    /// The GPU Operator's Deployment: named `gpu-operator`, or with a pod template labelled
    /// `app.kubernetes.io/component=gpu-operator` or `app=gpu-operator`.
    pub fn is_operator(&self) -> bool {
        self.name() == OPERATOR
            || self.component.as_deref() == Some(OPERATOR)
            || self.app.as_deref() == Some(OPERATOR)
    }

    /// The operator's container: the one named `gpu-operator`, else the only one, else the
    /// first whose image is a `gpu-operator` repository.
    pub fn operator_container(&self) -> Option<&Container> {
        self.containers
            .iter()
            .find(|c| c.name == OPERATOR)
            .or(match self.containers.as_slice() {
                [only] => Some(only),
                _ => None,
            })
            .or_else(|| {
                self.containers
                    .iter()
                    .find(|c| ImageRef::parse(&c.image).repository_name() == OPERATOR)
            })
    }
}

#[derive(Deserialize)]
struct RawDeployment {
    #[serde(default)]
    metadata: PartialMeta,
    #[serde(default)]
    spec: WorkloadSpec<PartialMeta<RawLabels>, RawPodSpec>,
}

#[derive(Default, Deserialize)]
struct RawLabels {
    #[serde(default, rename = "app.kubernetes.io/component")]
    component: Option<String>,
    #[serde(default)]
    app: Option<String>,
}

#[derive(Default, Deserialize)]
struct RawPodSpec {
    #[serde(default)]
    containers: Vec<Container>,
}

impl From<RawDeployment> for DeploymentView {
    fn from(raw: RawDeployment) -> Self {
        let (_, labels, _) = raw.spec.template.metadata.into_parts();
        DeploymentView {
            metadata: raw.metadata.into_parts().0,
            component: labels.component,
            app: labels.app,
            containers: raw.spec.template.spec.containers,
        }
    }
}

partial_resource!(DeploymentView, k8s_openapi::NamespaceResourceScope, kind: "Deployment", group: "apps", version: "v1", plural: "deployments");

/// A container image reference, `[registry[:port]/]path[:tag][@digest]`, cut into its parts.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ImageRef<'a> {
    /// Registry and path, without tag or digest.
    pub repository: &'a str,
    pub tag: Option<&'a str>,
    pub digest: Option<&'a str>,
}

impl<'a> ImageRef<'a> {
    pub fn parse(image: &'a str) -> ImageRef<'a> {
        let image = image.trim();
        let (name, digest) = match image.split_once('@') {
            Some((name, digest)) => (name, Some(digest)),
            None => (image, None),
        };
        // A colon after the last slash starts the tag; one before it is a registry's port.
        let path_start = name.rfind('/').map_or(0, |i| i + 1);
        let (repository, tag) = match name[path_start..].find(':') {
            Some(i) => (&name[..path_start + i], Some(&name[path_start + i + 1..])),
            None => (name, None),
        };
        ImageRef {
            repository,
            tag: tag.filter(|t| !t.is_empty()),
            digest: digest.filter(|d| !d.is_empty()),
        }
    }

    /// The last part of the repository path: `gpu-operator` for `nvcr.io/nvidia/gpu-operator`.
    pub fn repository_name(&self) -> &'a str {
        self.repository.rsplit('/').next().unwrap_or_default()
    }
}

/// The operator version an image's tag names, or why it names none.
pub fn version_of_image(image: &str) -> Result<OperatorVersion, String> {
    let r = ImageRef::parse(image);
    match (r.tag, r.digest) {
        (Some(tag), _) => OperatorVersion::parse(tag)
            .map_err(|_| format!("its image {image} has the tag {tag:?}, not a version")),
        (None, Some(_)) => Err(format!(
            "its image {image} is pinned by digest, with no version tag"
        )),
        (None, None) if image.trim().is_empty() => Err("its container has no image".to_owned()),
        (None, None) => Err(format!("its image {image} has no tag")),
    }
}

/// Why the Deployments could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unread {
    /// Not listed yet (`serve`'s watch has not synced).
    NotYet,
    /// 403: RBAC forbids listing Deployments in the namespace.
    Forbidden,
    /// 404.
    NotFound,
    /// Any other failure, in the API server's words.
    Failed(String),
}

/// The operator version the Deployments in `namespace` show, and where it came from; assumed
/// (the newest era) with the reason when they cannot be read, no operator Deployment is among
/// them, or its image tag names no version.
pub fn operator_version(
    namespace: &str,
    deployments: Result<&[&DeploymentView], &Unread>,
) -> Followed {
    let assumed = Followed::assumed;
    let list = match deployments {
        Ok(list) => list,
        Err(Unread::NotYet) => {
            return assumed(format!("deployments in namespace {namespace} not read yet"));
        }
        Err(Unread::Forbidden) => {
            return assumed(format!(
                "deployments in namespace {namespace} are forbidden"
            ));
        }
        Err(Unread::NotFound) => {
            return assumed(format!(
                "deployments in namespace {namespace} cannot be listed (not found)"
            ));
        }
        Err(Unread::Failed(why)) => {
            return assumed(format!(
                "cannot list deployments in namespace {namespace}: {why}"
            ));
        }
    };
    // The one named gpu-operator first, then by name: the same choice every time.
    let Some(deployment) = list
        .iter()
        .filter(|d| d.is_operator())
        .min_by_key(|d| (d.name() != OPERATOR, d.name()))
    else {
        return assumed(format!(
            "no GPU Operator Deployment in namespace {namespace} (named {OPERATOR} or labelled \
             {COMPONENT_LABEL}={OPERATOR})"
        ));
    };
    let name = deployment.qualified_name();
    let image = match deployment.operator_container() {
        Some(c) => version_of_image(&c.image),
        None => Err(format!("it has no {OPERATOR} container")),
    };
    match image {
        Ok(version) => Followed {
            version,
            source: VersionSource::Deployment(name),
        },
        Err(why) => assumed(format!("Deployment {name}: {why}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::operands::Era;

    fn image(s: &str) -> (&str, Option<&str>, Option<&str>) {
        let r = ImageRef::parse(s);
        (r.repository, r.tag, r.digest)
    }

    #[test]
    fn image_references_are_cut_into_repository_tag_and_digest() {
        assert_eq!(
            image("nvcr.io/nvidia/gpu-operator:v25.3.4"),
            ("nvcr.io/nvidia/gpu-operator", Some("v25.3.4"), None)
        );
        assert_eq!(
            image("host:5000/gpu-operator:v26.3.1"),
            ("host:5000/gpu-operator", Some("v26.3.1"), None)
        );
        assert_eq!(
            image("host:5000/gpu-operator"),
            ("host:5000/gpu-operator", None, None)
        );
        assert_eq!(
            image("nvcr.io/nvidia/gpu-operator@sha256:abc"),
            ("nvcr.io/nvidia/gpu-operator", None, Some("sha256:abc"))
        );
        assert_eq!(
            image("nvcr.io/nvidia/gpu-operator:v24.9.2@sha256:abc"),
            (
                "nvcr.io/nvidia/gpu-operator",
                Some("v24.9.2"),
                Some("sha256:abc")
            )
        );
        assert_eq!(image("gpu-operator"), ("gpu-operator", None, None));
        assert_eq!(image("gpu-operator:"), ("gpu-operator", None, None));
        assert_eq!(
            ImageRef::parse("host:5000/nvidia/gpu-operator:x").repository_name(),
            "gpu-operator"
        );
    }

    #[test]
    fn the_image_tag_is_the_version() {
        for (img, text, era) in [
            ("nvcr.io/nvidia/gpu-operator:v25.3.4", "v25.3.4", Era::V24_9),
            ("nvcr.io/nvidia/gpu-operator:v24.9.2", "v24.9.2", Era::V24_9),
            ("host:5000/gpu-operator:v26.3.1", "v26.3.1", Era::V26_3),
            ("gpu-operator:26.7.0", "v26.7.0", Era::V26_7),
            (
                "nvcr.io/nvidia/gpu-operator:v24.9.2@sha256:0123abcd",
                "v24.9.2",
                Era::V24_9,
            ),
        ] {
            let v = version_of_image(img).unwrap();
            assert_eq!((v.text.as_str(), v.era), (text, era), "{img}");
        }
    }

    #[test]
    fn images_without_a_version_say_why() {
        for (img, why) in [
            (
                "nvcr.io/nvidia/gpu-operator:latest",
                "its image nvcr.io/nvidia/gpu-operator:latest has the tag \"latest\", not a version",
            ),
            (
                "ghcr.io/nvidia/gpu-operator:main-latest",
                "its image ghcr.io/nvidia/gpu-operator:main-latest has the tag \"main-latest\", not a version",
            ),
            (
                "nvcr.io/nvidia/gpu-operator@sha256:0123abcd",
                "its image nvcr.io/nvidia/gpu-operator@sha256:0123abcd is pinned by digest, with no version tag",
            ),
            (
                "nvcr.io/nvidia/gpu-operator",
                "its image nvcr.io/nvidia/gpu-operator has no tag",
            ),
            (
                "host:5000/gpu-operator",
                "its image host:5000/gpu-operator has no tag",
            ),
            ("", "its container has no image"),
        ] {
            assert_eq!(version_of_image(img).unwrap_err(), why, "{img:?}");
        }
    }

    fn deployment(json: serde_json::Value) -> DeploymentView {
        serde_json::from_value(json).unwrap()
    }

    /// As the operator's Helm chart renders it (`templates/operator.yaml`), trimmed.
    fn chart_deployment(image: &str) -> DeploymentView {
        deployment(serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "gpu-operator", "namespace": "gpu-operator", "resourceVersion": "7",
                "labels": {"app.kubernetes.io/component": "gpu-operator", "app.kubernetes.io/version": "v25.3.4"}},
            "spec": {"replicas": 1,
                "selector": {"matchLabels": {"app.kubernetes.io/component": "gpu-operator", "app": "gpu-operator"}},
                "template": {
                    "metadata": {"labels": {"app.kubernetes.io/component": "gpu-operator", "app": "gpu-operator",
                        "nvidia.com/gpu-driver-upgrade-drain.skip": "true"}},
                    "spec": {"serviceAccountName": "gpu-operator", "containers": [
                        {"name": "gpu-operator", "image": image, "command": ["gpu-operator"],
                         "args": ["--leader-elect"], "env": [{"name": "WATCH_NAMESPACE", "value": ""}]}]}}}
        }))
    }

    #[test]
    fn a_deployment_gives_its_name_labels_and_containers_only() {
        let d = chart_deployment("nvcr.io/nvidia/gpu-operator:v25.3.4");
        assert_eq!(d.qualified_name(), "gpu-operator/gpu-operator");
        assert_eq!(d.component.as_deref(), Some("gpu-operator"));
        assert_eq!(d.app.as_deref(), Some("gpu-operator"));
        assert_eq!(
            d.containers,
            [Container {
                name: "gpu-operator".into(),
                image: "nvcr.io/nvidia/gpu-operator:v25.3.4".into()
            }]
        );
        assert!(d.is_operator());
        // Kept for kube's watcher, which re-lists on events without it.
        assert_eq!(d.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(
            d.metadata.labels, None,
            "the Deployment's own labels are not kept"
        );
    }

    #[test]
    fn the_version_comes_from_the_operator_deployment() {
        let d = chart_deployment("nvcr.io/nvidia/gpu-operator:v24.9.2");
        let nfd = deployment(serde_json::json!({
            "metadata": {"name": "gpu-operator-node-feature-discovery-master", "namespace": "gpu-operator"},
            "spec": {"template": {"metadata": {"labels": {"app.kubernetes.io/name": "node-feature-discovery"}},
                "spec": {"containers": [{"name": "master", "image": "registry.k8s.io/nfd/node-feature-discovery:v0.17.2"}]}}}
        }));
        let Followed { version: v, source } = operator_version("gpu-operator", Ok(&[&nfd, &d]));
        assert_eq!((v.text.as_str(), v.era), ("v24.9.2", Era::V24_9));
        assert_eq!(
            source,
            VersionSource::Deployment("gpu-operator/gpu-operator".into())
        );
        // Renamed, but labelled like the chart's and the OLM bundle's pod template; the
        // operator's container found among others by name.
        let olm = deployment(serde_json::json!({
            "metadata": {"name": "gpu-operator-x", "namespace": "nvidia-gpu-operator"},
            "spec": {"template": {"metadata": {"labels": {"app": "gpu-operator"}},
                "spec": {"containers": [
                    {"name": "proxy", "image": "quay.io/proxy:v1.2.3"},
                    {"name": "gpu-operator", "image": "nvcr.io/nvidia/gpu-operator:v26.3.1"}]}}}
        }));
        let Followed { version: v, source } = operator_version("nvidia-gpu-operator", Ok(&[&olm]));
        assert_eq!((v.text.as_str(), v.era), ("v26.3.1", Era::V26_3));
        assert_eq!(
            source.describe(),
            "read from Deployment nvidia-gpu-operator/gpu-operator-x"
        );
    }

    #[test]
    fn without_a_readable_version_the_newest_is_assumed_and_the_reason_given() {
        let why = |r: Result<&[&DeploymentView], &Unread>| {
            let Followed { version: v, source } = operator_version("gpu-operator", r);
            assert_eq!(v.era, Era::NEWEST);
            source.assumed().unwrap().to_owned()
        };
        assert_eq!(
            why(Err(&Unread::Forbidden)),
            "deployments in namespace gpu-operator are forbidden"
        );
        assert_eq!(
            why(Err(&Unread::NotYet)),
            "deployments in namespace gpu-operator not read yet"
        );
        assert_eq!(
            why(Err(&Unread::Failed("connection refused".into()))),
            "cannot list deployments in namespace gpu-operator: connection refused"
        );
        assert_eq!(
            why(Ok(&[])),
            "no GPU Operator Deployment in namespace gpu-operator (named gpu-operator or \
             labelled app.kubernetes.io/component=gpu-operator)"
        );
        let digest = chart_deployment("nvcr.io/nvidia/gpu-operator@sha256:0123abcd");
        assert_eq!(
            why(Ok(&[&digest])),
            "Deployment gpu-operator/gpu-operator: its image nvcr.io/nvidia/gpu-operator@sha256:0123abcd \
             is pinned by digest, with no version tag"
        );
        let latest = chart_deployment("nvcr.io/nvidia/gpu-operator:latest");
        assert_eq!(
            why(Ok(&[&latest])),
            "Deployment gpu-operator/gpu-operator: its image nvcr.io/nvidia/gpu-operator:latest \
             has the tag \"latest\", not a version"
        );
        let empty = deployment(serde_json::json!({
            "metadata": {"name": "gpu-operator", "namespace": "gpu-operator"},
            "spec": {"template": {"spec": {"containers": []}}}
        }));
        assert_eq!(
            why(Ok(&[&empty])),
            "Deployment gpu-operator/gpu-operator: it has no gpu-operator container"
        );
    }
}
