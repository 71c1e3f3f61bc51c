//! The host/device offload interface: how the target hands instructions to an FPGA (or to the
//! software model of one) and collects results.
//!
//! The device is reached through a memory-mapped register window and two rings in host memory:
//! the host writes [`Descriptor`]s into the submission ring and rings a doorbell register; the
//! device writes [`CompletionEntry`]s into the completion ring. The driver, the VFIO window and
//! the software model implement [`OffloadDevice`] and come with the FPGA issue; the engine built
//! on it implements `netdam_isa::engine::Engine` like the software engine does.

/// Byte offsets of the device's registers in its BAR window.
pub mod registers {
    /// Device identity, read-only: [`super::DEVICE_ID`].
    pub const DEVICE_ID: u64 = 0x00;
    /// Interface version, read-only.
    pub const INTERFACE_VERSION: u64 = 0x08;
    /// Bus address of the submission ring.
    pub const SUBMISSION_RING_BASE: u64 = 0x10;
    /// Bus address of the completion ring.
    pub const COMPLETION_RING_BASE: u64 = 0x18;
    /// Entries per ring (a power of two).
    pub const RING_ENTRIES: u64 = 0x20;
    /// Doorbell: the host writes the submission tail here.
    pub const SUBMISSION_DOORBELL: u64 = 0x28;
    /// The host writes the completion head here after consuming entries.
    pub const COMPLETION_DOORBELL: u64 = 0x30;
}

/// Value of the DEVICE_ID register: "NDAM".
pub const DEVICE_ID: u32 = 0x4E44_414D;

/// One instruction handed to the device: the fields of a wire instruction, with the operand and
/// answer placed in host buffers the device reaches by bus address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct Descriptor {
    /// Host tag, echoed in the completion.
    pub tag: u64,
    /// Opcode number.
    pub opcode: u8,
    /// Instruction flags.
    pub flags: u8,
    /// Region or namespace id.
    pub space: u16,
    /// Operand length in bytes.
    pub operand_len: u32,
    /// Offset within the space.
    pub offset: u64,
    /// Bytes (or blocks) addressed.
    pub length: u32,
    /// Per-opcode extra operand.
    pub aux: u32,
    /// Bus address of the operand.
    pub operand_address: u64,
    /// Bus address where the answer data goes.
    pub answer_address: u64,
    /// Room at `answer_address`.
    pub answer_capacity: u32,
    /// Zero.
    pub reserved: u32,
}

/// One finished instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct CompletionEntry {
    /// The descriptor's tag.
    pub tag: u64,
    /// Status code (the wire's).
    pub status: u8,
    /// Zero.
    pub reserved: [u8; 3],
    /// Answer bytes written.
    pub answer_len: u32,
}

const _: () = assert!(core::mem::size_of::<Descriptor>() == 56);
const _: () = assert!(core::mem::size_of::<CompletionEntry>() == 16);

/// The submission ring has no free entry: back-pressure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingFull;

/// A device (or model) that executes descriptors.
pub trait OffloadDevice: Send {
    /// Queues a descriptor and rings the doorbell; never waits.
    fn submit(&mut self, descriptor: &Descriptor) -> Result<(), RingFull>;

    /// Takes the next completion, if one is ready.
    fn poll_completion(&mut self) -> Option<CompletionEntry>;
}
