//! What a node advertises of its NVIDIA GPUs: the number that matters. Every operand's pod can
//! be Running while the node offers no GPU to the scheduler (NVIDIA/k8s-device-plugin#1698; the
//! MIG wedge of NVIDIA/gpu-operator#2833), and no label says so: only the node's
//! `status.capacity` and `status.allocatable` do.
//!
//! The NVIDIA device plugin advertises `nvidia.com/gpu`; renamed when shared by time-slicing or
//! MPS, `nvidia.com/gpu.shared`; under the MIG `mixed` strategy one resource per profile,
//! `nvidia.com/mig-<profile>` (and `….shared`). The kubelet keeps a resource in `capacity` once a
//! plugin has registered it, and sets it to 0 when the plugin's devices turn unhealthy or its
//! socket goes away.

/// The sums, over every NVIDIA GPU resource ([`is_gpu_resource`]), of a node's
/// `status.capacity` and `status.allocatable`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Advertised {
    /// Some GPU resource is listed in `capacity` (its plugin registered it at some point),
    /// whatever its number.
    pub listed: bool,
    pub capacity: u32,
    pub allocatable: u32,
}

/// The GFD label that counts a node's GPUs: evidence that a node with no GPU resource listed
/// should have one.
pub const GFD_COUNT_KEY: &str = "nvidia.com/gpu.count";

/// Whether `name` is an extended resource the NVIDIA device plugin advertises GPUs (whole,
/// shared or MIG) under.
pub fn is_gpu_resource(name: &str) -> bool {
    name == "nvidia.com/gpu"
        || name == "nvidia.com/gpu.shared"
        || name.starts_with("nvidia.com/mig-")
}

/// The count of an extended resource's quantity. The API accepts only whole numbers for
/// extended resources, but in any quantity form (`8`, `1k`, `2e1`); the kubelet writes plain
/// digits. A form other than plain digits counts as at least one (`0` alone is none).
pub fn gpu_count(quantity: &str) -> u32 {
    let q = quantity.trim();
    match q.parse::<u64>() {
        Ok(n) => u32::try_from(n).unwrap_or(u32::MAX),
        Err(_) if q.chars().all(|c| c == '0' || c == '.') && !q.is_empty() => 0,
        Err(_) => 1,
    }
}

impl Advertised {
    /// The node offers no GPU to the scheduler.
    pub fn none_allocatable(&self) -> bool {
        self.allocatable == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_the_device_plugin_advertises_is_a_gpu_resource() {
        for name in [
            "nvidia.com/gpu",
            "nvidia.com/gpu.shared",
            "nvidia.com/mig-1g.10gb",
            "nvidia.com/mig-3g.40gb.shared",
        ] {
            assert!(is_gpu_resource(name), "{name}");
        }
        for name in ["nvidia.com/mlnxnics", "cpu", "nvidia.com/gpu-memory", "gpu"] {
            assert!(!is_gpu_resource(name), "{name}");
        }
    }

    #[test]
    fn quantities_in_other_forms_count_as_some_and_never_panic() {
        assert_eq!(gpu_count("0"), 0);
        assert_eq!(gpu_count("000"), 0);
        assert_eq!(gpu_count("8"), 8);
        assert_eq!(gpu_count("1k"), 1);
        assert_eq!(gpu_count("2e1"), 1);
        assert_eq!(gpu_count("99999999999999"), u32::MAX);
        assert_eq!(gpu_count(""), 1);
    }
}
