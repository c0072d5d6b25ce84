//! The NVIDIA DRA driver beside the device plugin. A standalone NVIDIA DRA driver for GPUs
//! (driver name `gpu.nvidia.com`) publishes `resource.k8s.io` ResourceSlices of a node's GPUs;
//! the device plugin advertises the same GPUs as `nvidia.com/gpu`. With both on one node the
//! scheduler can hand one GPU to a pod of each: it over-admits. The DRA driver's chart refuses
//! to install beside the device plugin without an override; with the DRAExtendedResource
//! feature (KEP-5004) the DRA driver serves `nvidia.com/gpu` requests itself, and the device
//! plugin is not needed there either.
//!
//! What the decision knows of the slices: the nodes with at least one slice of that driver
//! ([`DraNodes`]). Only the node names are kept, each slice's name with its node while it
//! exists, so memory grows with slices (bounded by whoever reads them), not with their devices.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::seen::Seen;

/// The driver name of NVIDIA's DRA driver for GPUs (k8s-dra-driver-gpu).
pub const NVIDIA_GPU_DRIVER: &str = "gpu.nvidia.com";

/// The nodes an NVIDIA GPU DRA driver publishes ResourceSlices for (`Known`: at least one
/// slice of [`NVIDIA_GPU_DRIVER`]; empty when the cluster serves no `resource.k8s.io` group).
pub type DraNodes = Seen<BTreeSet<Box<str>>>;

impl DraNodes {
    /// Whether the DRA driver publishes slices for `node`: `None` when that is not known.
    pub fn has(&self, node: &str) -> Option<bool> {
        self.known().map(|nodes| nodes.contains(node))
    }
}

/// One ResourceSlice as the decision reads it.
#[derive(Clone, Copy, Debug)]
pub struct SliceRef<'a> {
    pub name: &'a str,
    pub driver: &'a str,
    /// `spec.nodeName`; `None` for a slice of devices reachable from several nodes
    /// (`allNodes`, `nodeSelector`, `perDeviceNodeSelection`).
    pub node: Option<&'a str>,
}

/// The slices of [`NVIDIA_GPU_DRIVER`] by name, each with its node: a node keeps its place
/// while one of its slices remains.
#[derive(Clone, Debug, Default)]
pub struct SliceIndex {
    nodes: BTreeMap<Box<str>, Box<str>>,
}

/// What reading a slice did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Read {
    /// Kept: a node-local slice of the NVIDIA GPU driver.
    Kept,
    /// Not kept: a slice of another driver (its name).
    OtherDriver(String),
    /// Not kept: a slice of the NVIDIA driver that is not local to one node.
    NotNodeLocal,
}

impl SliceIndex {
    /// Reads one slice (added or changed).
    pub fn apply(&mut self, slice: SliceRef<'_>) -> Read {
        if slice.driver != NVIDIA_GPU_DRIVER {
            self.nodes.remove(slice.name);
            return Read::OtherDriver(slice.driver.to_owned());
        }
        match slice.node.filter(|n| !n.is_empty()) {
            Some(node) => {
                self.nodes.insert(slice.name.into(), node.into());
                Read::Kept
            }
            None => {
                self.nodes.remove(slice.name);
                Read::NotNodeLocal
            }
        }
    }

    pub fn contains(&self, name: &str) -> bool {
        self.nodes.contains_key(name)
    }

    /// A slice was deleted.
    pub fn delete(&mut self, name: &str) -> bool {
        self.nodes.remove(name).is_some()
    }

    pub fn clear(&mut self) {
        self.nodes.clear();
    }

    /// Slices kept.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The nodes with a kept slice.
    pub fn nodes(&self) -> DraNodes {
        DraNodes::Known(Arc::new(self.node_set()))
    }

    pub fn node_set(&self) -> BTreeSet<Box<str>> {
        self.nodes.values().cloned().collect()
    }
}

/// Reads a list of slices at once (`check`, `audit`): the nodes, and one sentence per kind of
/// slice not read (other drivers, slices not local to a node), so nothing given is silently
/// dropped.
pub fn read_all<'a>(slices: impl IntoIterator<Item = SliceRef<'a>>) -> (DraNodes, Vec<String>) {
    let mut index = SliceIndex::default();
    let mut others: BTreeMap<String, usize> = BTreeMap::new();
    let mut not_local = 0usize;
    for slice in slices {
        match index.apply(slice) {
            Read::Kept => {}
            Read::OtherDriver(driver) => *others.entry(driver).or_default() += 1,
            Read::NotNodeLocal => not_local += 1,
        }
    }
    let mut notes = Vec::new();
    if !others.is_empty() {
        let list: Vec<String> = others
            .iter()
            .map(|(d, n)| format!("{n} of driver {}", crate::core::echo::echo(d)))
            .collect();
        notes.push(format!(
            "ResourceSlices of other drivers are not read (only {NVIDIA_GPU_DRIVER} advertises the GPUs the device plugin does): {}",
            list.join(", ")
        ));
    }
    if not_local > 0 {
        notes.push(format!(
            "{not_local} ResourceSlice(s) of {NVIDIA_GPU_DRIVER} name no node (spec.nodeName): devices reachable from several nodes are not a node's GPUs, and are not read"
        ));
    }
    (index.nodes(), notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice<'a>(name: &'a str, driver: &'a str, node: Option<&'a str>) -> SliceRef<'a> {
        SliceRef { name, driver, node }
    }

    #[test]
    fn a_node_keeps_its_place_while_one_of_its_slices_remains() {
        let mut index = SliceIndex::default();
        assert_eq!(
            index.apply(slice("a-1", NVIDIA_GPU_DRIVER, Some("a"))),
            Read::Kept
        );
        assert_eq!(
            index.apply(slice("a-2", NVIDIA_GPU_DRIVER, Some("a"))),
            Read::Kept
        );
        assert_eq!(
            index.apply(slice("b-1", NVIDIA_GPU_DRIVER, Some("b"))),
            Read::Kept
        );
        assert_eq!(index.nodes().has("a"), Some(true));
        assert!(index.delete("a-1"));
        assert_eq!(index.nodes().has("a"), Some(true));
        assert!(index.delete("a-2"));
        assert_eq!(index.nodes().has("a"), Some(false));
        assert!(!index.delete("a-2"));
        // A slice that changes driver or loses its node leaves.
        assert_eq!(
            index.apply(slice("b-1", "dra.example.com", Some("b"))),
            Read::OtherDriver("dra.example.com".into())
        );
        assert_eq!(index.nodes().has("b"), Some(false));
        assert_eq!(index.len(), 0);
        assert!(index.is_empty());
    }

    #[test]
    fn slices_not_read_are_said() {
        let (nodes, notes) = read_all([
            slice("a", NVIDIA_GPU_DRIVER, Some("gpu-1")),
            slice("b", "compute-domain.nvidia.com", Some("gpu-1")),
            slice("c", "compute-domain.nvidia.com", Some("gpu-2")),
            slice("d", "gpu.example.com", Some("gpu-3")),
            slice("e", NVIDIA_GPU_DRIVER, None),
            slice("f", NVIDIA_GPU_DRIVER, Some("")),
        ]);
        assert_eq!(nodes.has("gpu-1"), Some(true));
        assert_eq!(nodes.has("gpu-2"), Some(false));
        assert_eq!(nodes.has("gpu-3"), Some(false));
        assert_eq!(
            notes,
            [
                "ResourceSlices of other drivers are not read (only gpu.nvidia.com advertises the GPUs the device plugin does): 2 of driver compute-domain.nvidia.com, 1 of driver gpu.example.com",
                "2 ResourceSlice(s) of gpu.nvidia.com name no node (spec.nodeName): devices reachable from several nodes are not a node's GPUs, and are not read"
            ]
        );
        assert_eq!(DraNodes::NotRead.has("gpu-1"), None);
        assert_eq!(DraNodes::Unknown("x".into()).has("gpu-1"), None);
    }
}
