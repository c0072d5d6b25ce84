//! The workloads a label set names, as the operator's `gpuStateLabels` does: what `operands`
//! prints.

use super::Sets;

impl Sets {
    /// The workloads (and vm-passthrough's sandbox modes) whose label set holds the key, as
    /// `gpuStateLabels` names them.
    pub fn workloads(self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.intersects(Sets::CONTAINER) {
            out.push("container");
        }
        match (
            self.intersects(Sets::PASSTHROUGH_KUBEVIRT),
            self.intersects(Sets::PASSTHROUGH_KATA),
        ) {
            (true, true) => out.push("vm-passthrough"),
            (true, false) => out.push("vm-passthrough (kubevirt)"),
            (false, true) => out.push("vm-passthrough (kata)"),
            (false, false) => {}
        }
        if self.intersects(Sets::VGPU) {
            out.push("vm-vgpu");
        }
        out
    }
}
