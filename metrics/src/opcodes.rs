//! Per-opcode slots: a dense index for every opcode byte, so per-opcode cells are arrays.

use netdam_isa::Opcode;

/// Per-opcode slots: one per [`Opcode::ALL`] entry, then one for every other opcode byte.
pub const OPCODE_SLOTS: usize = Opcode::ALL.len() + 1;

/// The slot of the last, catch-all opcode entry.
pub const OTHER_OPCODE_SLOT: usize = Opcode::ALL.len();

/// Slot of each opcode byte, built once at compile time so the lookup is one load.
const OPCODE_SLOT_OF: [u8; 256] = {
    let mut table = [OTHER_OPCODE_SLOT as u8; 256];
    let mut index = 0;
    while index < Opcode::ALL.len() {
        table[Opcode::ALL[index] as usize] = index as u8;
        index += 1;
    }
    table
};

const _: () = assert!(OPCODE_SLOTS <= u8::MAX as usize, "a slot fits the table's bytes");

/// The per-opcode slot of an opcode byte.
#[inline]
pub fn opcode_slot(opcode: u8) -> usize {
    usize::from(OPCODE_SLOT_OF[usize::from(opcode)])
}

/// The label of a per-opcode slot: the opcode's name, or `other`.
pub fn opcode_slot_name(slot: usize) -> &'static str {
    Opcode::ALL.get(slot).map(|opcode| opcode.name()).unwrap_or("other")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_opcode_has_its_own_slot_and_the_rest_share_one() {
        for (index, opcode) in Opcode::ALL.iter().enumerate() {
            assert_eq!(opcode_slot(*opcode as u8), index);
            assert_eq!(opcode_slot_name(index), opcode.name());
        }
        assert_eq!(opcode_slot(0x00), OTHER_OPCODE_SLOT);
        assert_eq!(opcode_slot(0xFF), OTHER_OPCODE_SLOT);
        assert_eq!(opcode_slot_name(OTHER_OPCODE_SLOT), "other");
    }
}
