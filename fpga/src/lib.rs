//! The host/device offload interface: how the target hands instructions to an FPGA (or to the
//! software model of one) and collects results. `docs/FPGA.md` is the specification; this crate
//! must match it byte for byte.
//!
//! - [`registers`]: the register map at the start of the window, and the region table.
//! - [`Descriptor`] (64 bytes) and [`CompletionEntry`] (16 bytes): the ring entries.
//! - [`window`]: the memory the two sides share (a model's file or a sysfs `resource0`), and
//!   the probe `auto` runs.
//! - [`driver`]: the host side: submit and reap without blocking, wedge and reset detection.
//! - [`conformance`]: seeded instruction streams that every engine must answer alike.
//! - [`model`]: the device side in software, as a thread or as the `netdam-fpga-model` binary.
//! - [`nvme`]: real NVMe SQE/CQE layouts and a model of the SSD behind the device's NVMe
//!   controller (the controller logic that builds SQEs from block descriptors comes later).
//!
//! The seam for the target: its `FpgaEngine` (crate `netdam-target`) implements
//! `netdam_isa::engine::Engine` over a [`driver::Driver`], submitting each memory instruction
//! and reaping its completion (FPGA.md, "Seam").

pub mod conformance;
pub mod driver;
pub mod interrupt;
pub mod model;
pub mod nvme;
pub mod registers;
pub mod window;

/// Value of the DEVICE_ID register: "NDAM" in ASCII.
pub const DEVICE_ID: u32 = 0x4E44_414D;

/// Interface version this crate speaks: major in the high 16 bits, minor in the low 16.
pub const INTERFACE_VERSION: u32 = 0x0001_0000;

/// Bytes of one submission-ring entry.
pub const DESCRIPTOR_BYTES: usize = 64;
/// Bytes of one completion-ring entry.
pub const COMPLETION_BYTES: usize = 16;
/// Fewest entries a ring may have.
pub const RING_ENTRIES_MIN: u32 = 2;
/// Most entries a ring may have: ring counters are free-running `u32`s and the completion
/// carries the submission head in 16 bits.
pub const RING_ENTRIES_MAX: u32 = 1 << 15;
/// Smallest data slot (bytes of operand area, and again of answer area, per ring entry).
pub const SLOT_BYTES_MIN: u32 = 64;
/// Largest data slot: one 9000-byte jumbo frame's payload rounded up to a power of two.
pub const SLOT_BYTES_MAX: u32 = 16 * 1024;

// Phase bits stay consistent across the wrap of the free-running u32 counters only if the ring
// size divides 2^32 an even number of times.
const _: () = assert!(RING_ENTRIES_MAX.is_power_of_two() && RING_ENTRIES_MAX < (1 << 31));

/// One instruction handed to the device (64 bytes, little endian; FPGA.md "Descriptor").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Descriptor {
    /// Host tag, echoed in the completion.
    pub tag: u64,
    /// Opcode number (the wire's).
    pub opcode: u8,
    /// Instruction flags (the wire's).
    pub flags: u8,
    /// Region or namespace id.
    pub space: u16,
    /// Operand length in bytes.
    pub operand_len: u32,
    /// Offset within the space (bytes, or blocks for block opcodes).
    pub offset: u64,
    /// Bytes (or blocks) addressed.
    pub length: u32,
    /// Per-opcode extra operand.
    pub aux: u32,
    /// Bus address of the operand (a window offset in the file window).
    pub operand_address: u64,
    /// Bus address where the answer data goes.
    pub answer_address: u64,
    /// Room at `answer_address`.
    pub answer_capacity: u32,
}

impl Descriptor {
    /// The 64 bytes the ring holds; reserved bytes 52..64 are zero.
    pub fn encode(&self) -> [u8; DESCRIPTOR_BYTES] {
        let mut bytes = [0u8; DESCRIPTOR_BYTES];
        bytes[0..8].copy_from_slice(&self.tag.to_le_bytes());
        bytes[8] = self.opcode;
        bytes[9] = self.flags;
        bytes[10..12].copy_from_slice(&self.space.to_le_bytes());
        bytes[12..16].copy_from_slice(&self.operand_len.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.offset.to_le_bytes());
        bytes[24..28].copy_from_slice(&self.length.to_le_bytes());
        bytes[28..32].copy_from_slice(&self.aux.to_le_bytes());
        bytes[32..40].copy_from_slice(&self.operand_address.to_le_bytes());
        bytes[40..48].copy_from_slice(&self.answer_address.to_le_bytes());
        bytes[48..52].copy_from_slice(&self.answer_capacity.to_le_bytes());
        bytes
    }

    /// Parses a ring entry; `None` when a reserved byte is not zero.
    pub fn decode(bytes: &[u8; DESCRIPTOR_BYTES]) -> Option<Descriptor> {
        if bytes[52..64].iter().any(|&byte| byte != 0) {
            return None;
        }
        let u32_at = |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
        let u64_at = |at: usize| {
            let mut word = [0u8; 8];
            word.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(word)
        };
        Some(Descriptor {
            tag: u64_at(0),
            opcode: bytes[8],
            flags: bytes[9],
            space: u16::from_le_bytes([bytes[10], bytes[11]]),
            operand_len: u32_at(12),
            offset: u64_at(16),
            length: u32_at(24),
            aux: u32_at(28),
            operand_address: u64_at(32),
            answer_address: u64_at(40),
            answer_capacity: u32_at(48),
        })
    }
}

/// Bit 0 of a completion's flags byte: the phase tag.
pub const COMPLETION_FLAG_PHASE: u8 = 0x01;

/// One finished instruction (16 bytes; FPGA.md "Completion entry"). Bytes 8..16 form the
/// *status word*, which the device stores last, in one 8-byte release store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CompletionEntry {
    /// The descriptor's tag.
    pub tag: u64,
    /// Answer bytes written at the descriptor's `answer_address`.
    pub answer_len: u32,
    /// Status code (the wire's).
    pub status: u8,
    /// Bit 0: phase tag; other bits zero.
    pub flags: u8,
    /// Low 16 bits of SQ_HEAD when the entry was written.
    pub submission_head: u16,
}

impl CompletionEntry {
    /// Bytes 8..16 as the little-endian `u64` the device stores atomically.
    pub fn status_word(&self) -> u64 {
        u64::from(self.answer_len)
            | (u64::from(self.status) << 32)
            | (u64::from(self.flags) << 40)
            | (u64::from(self.submission_head) << 48)
    }

    /// The entry with this tag and status word.
    pub fn from_words(tag: u64, status_word: u64) -> CompletionEntry {
        CompletionEntry {
            tag,
            answer_len: status_word as u32,
            status: (status_word >> 32) as u8,
            flags: (status_word >> 40) as u8,
            submission_head: (status_word >> 48) as u16,
        }
    }

    /// The phase tag.
    pub fn phase(&self) -> bool {
        self.flags & COMPLETION_FLAG_PHASE != 0
    }
}

/// The phase tag the device writes into the completion numbered `count` (free-running): 1 on
/// the first pass over the ring, 0 on the second, and so on, so a zeroed ring reads as empty.
pub fn phase_for(count: u32, entries: u32) -> bool {
    debug_assert!(entries.is_power_of_two(), "ring entries are a power of two (checked at enable)");
    (count / entries) & 1 == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_round_trips_and_rejects_reserved_bytes() {
        let descriptor = Descriptor {
            tag: 0x0102_0304_0506_0708,
            opcode: 0x12,
            flags: 0,
            space: 3,
            operand_len: 16,
            offset: 0x40,
            length: 8,
            aux: 0,
            operand_address: 0x1_0000,
            answer_address: 0x1_0040,
            answer_capacity: 64,
        };
        let bytes = descriptor.encode();
        assert_eq!(&bytes[0..8], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(bytes[8], 0x12);
        assert_eq!(Descriptor::decode(&bytes), Some(descriptor));
        let mut dirty = bytes;
        dirty[60] = 1;
        assert_eq!(Descriptor::decode(&dirty), None);
    }

    #[test]
    fn completion_status_word_round_trips() {
        let entry = CompletionEntry { tag: 9, answer_len: 8, status: 0x09, flags: 1, submission_head: 0xBEEF };
        assert_eq!(entry.status_word().to_le_bytes(), [8, 0, 0, 0, 0x09, 1, 0xEF, 0xBE]);
        assert_eq!(CompletionEntry::from_words(9, entry.status_word()), entry);
    }

    #[test]
    fn phase_flips_every_pass_and_survives_counter_wrap() {
        assert!(phase_for(0, 4) && phase_for(3, 4));
        assert!(!phase_for(4, 4) && !phase_for(7, 4));
        assert!(phase_for(8, 4));
        assert!(!phase_for(u32::MAX, 4), "last pass before the wrap");
        assert!(phase_for(u32::MAX.wrapping_add(1), 4), "first pass after it");
    }
}
