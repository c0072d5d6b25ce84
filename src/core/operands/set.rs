//! [`OperandSet`]: a set of operands, one bit each.

use std::collections::BTreeMap;

use super::Operand;

/// The set of operands the DaemonSet controller will run on a node.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct OperandSet(u32);

impl OperandSet {
    pub const EMPTY: OperandSet = OperandSet(0);

    pub fn contains(self, op: Operand) -> bool {
        self.0 & (1 << op as u32) != 0
    }

    pub fn insert(&mut self, op: Operand) {
        self.0 |= 1 << op as u32;
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn iter(self) -> impl Iterator<Item = Operand> {
        Operand::all().filter(move |op| self.contains(*op))
    }

    /// Every known operand mapped to whether it runs: the JSON form used by `check`.
    pub fn to_map(self) -> BTreeMap<&'static str, bool> {
        Operand::all()
            .map(|op| (op.name(), self.contains(op)))
            .collect()
    }

    /// The set of these operands, for constants.
    pub const fn of(ops: &[Operand]) -> OperandSet {
        let mut bits = 0;
        let mut i = 0;
        while i < ops.len() {
            bits |= 1 << ops[i] as u32;
            i += 1;
        }
        OperandSet(bits)
    }

    pub const fn union(self, other: OperandSet) -> OperandSet {
        OperandSet(self.0 | other.0)
    }

    /// The operands in both sets.
    pub const fn intersection(self, other: OperandSet) -> OperandSet {
        OperandSet(self.0 & other.0)
    }

    /// The operands of this set that are not in `other`.
    pub const fn without(self, other: OperandSet) -> OperandSet {
        OperandSet(self.0 & !other.0)
    }

    pub fn remove(&mut self, op: Operand) {
        self.0 &= !(1 << op as u32);
    }
}

impl FromIterator<Operand> for OperandSet {
    fn from_iter<I: IntoIterator<Item = Operand>>(iter: I) -> Self {
        let mut set = OperandSet::EMPTY;
        for op in iter {
            set.insert(op);
        }
        set
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::operands::OPERANDS;

    #[test]
    fn operand_set_holds_every_operand() {
        let all: OperandSet = Operand::all().collect();
        assert_eq!(all.iter().count(), OPERANDS.len());
        let one: OperandSet = [Operand::DcgmExporterDra].into_iter().collect();
        assert!(one.contains(Operand::DcgmExporterDra));
        assert!(!one.contains(Operand::Driver));
    }

    #[test]
    fn operand_set_constants_and_differences() {
        let a = OperandSet::of(&[Operand::Driver, Operand::Dcgm]);
        let b = OperandSet::of(&[Operand::Dcgm, Operand::Nvsm]);
        assert_eq!(a.union(b).iter().count(), 3);
        assert_eq!(a.without(b).iter().collect::<Vec<_>>(), [Operand::Driver]);
        let mut c = a;
        c.remove(Operand::Driver);
        assert_eq!(c.iter().collect::<Vec<_>>(), [Operand::Dcgm]);
    }
}
