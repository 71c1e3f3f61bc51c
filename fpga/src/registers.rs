//! Byte offsets of the device's registers in the window (BAR0 in hardware), their bits, and the
//! region table. FPGA.md "Register map" gives each register's owner and access rules.

/// Bytes of the register block; the region table lies inside it.
pub const REGISTER_BLOCK_BYTES: u64 = 0x1000;

/// u32, RO: [`crate::DEVICE_ID`].
pub const DEVICE_ID: u64 = 0x000;
/// u32, RO: [`crate::INTERFACE_VERSION`].
pub const INTERFACE_VERSION: u64 = 0x004;
/// u64, RO: feature bits ([`CAPABILITY_MEMORY`] ...) and limits.
pub const CAPABILITIES: u64 = 0x008;
/// u32, RO: incremented by every reset; 0 until the device has powered on.
pub const GENERATION: u64 = 0x010;
/// u32, RO: [`STATUS_READY`], [`STATUS_FATAL`], [`STATUS_RESETTING`].
pub const STATUS: u64 = 0x014;
/// u32, RO: why FATAL is set ([`ERROR_NONE`] ...).
pub const ERROR_CODE: u64 = 0x018;
/// u32, RW host: [`CONTROL_ENABLE`].
pub const CONTROL: u64 = 0x01C;
/// u32, WO host: writing [`RESET_MAGIC`] resets the device.
pub const RESET: u64 = 0x020;
/// u32, RO: incremented by the device on every pass of its fetch loop (liveness, informative).
pub const HEARTBEAT: u64 = 0x024;
/// u32, RW host: bit 0 enables the completion interrupt, bit 1 the error interrupt.
pub const INTERRUPT_MASK: u64 = 0x028;
/// u32, RW1C: bit 0 a completion was posted, bit 1 FATAL was raised.
pub const INTERRUPT_STATUS: u64 = 0x02C;
/// u64, RO: window offset of the on-board memory aperture (BAR2 in hardware).
pub const DEVICE_MEMORY_OFFSET: u64 = 0x030;
/// u64, RO: bytes of on-board memory.
pub const DEVICE_MEMORY_BYTES: u64 = 0x038;
/// u64, RO: window offset of the host-memory area (file window only; 0 bytes under VFIO).
pub const HOST_AREA_OFFSET: u64 = 0x040;
/// u64, RO: bytes of the host-memory area.
pub const HOST_AREA_BYTES: u64 = 0x048;
/// u64, RW host while disabled: bus address of the submission ring.
pub const SUBMISSION_RING_BASE: u64 = 0x050;
/// u64, RW host while disabled: bus address of the completion ring.
pub const COMPLETION_RING_BASE: u64 = 0x058;
/// u64, RW host while disabled: bus address of the data slots.
pub const DATA_BASE: u64 = 0x060;
/// u32, RW host while disabled: entries per ring (a power of two).
pub const RING_ENTRIES: u64 = 0x068;
/// u32, RW host while disabled: bytes of each operand area and each answer area.
pub const SLOT_BYTES: u64 = 0x06C;
/// u32, doorbell written by the host: descriptors submitted (free-running).
pub const SUBMISSION_TAIL: u64 = 0x070;
/// u32, RO: descriptors the device has fetched (free-running).
pub const SUBMISSION_HEAD: u64 = 0x074;
/// u32, doorbell written by the host: completions consumed (free-running).
pub const COMPLETION_HEAD: u64 = 0x078;
/// u32, RO: completions the device has posted (free-running; informative, the phase tag rules).
pub const COMPLETION_TAIL: u64 = 0x07C;
/// Start of the NVMe controller registers (FPGA.md "NVMe controller"; not modelled yet).
pub const NVME_BLOCK: u64 = 0x100;
/// Start of the region table.
pub const REGION_TABLE: u64 = 0x200;
/// Entries of the region table.
pub const REGION_TABLE_ENTRIES: usize = 16;
/// Bytes of one region-table entry.
pub const REGION_ENTRY_BYTES: u64 = 32;

const _: () = assert!(REGION_TABLE + REGION_TABLE_ENTRIES as u64 * REGION_ENTRY_BYTES <= REGISTER_BLOCK_BYTES);

/// CAPABILITIES bit: executes memory opcodes (READ, WRITE, CAS, FETCH_ADD, MEMCPY, FILL, CRC32).
pub const CAPABILITY_MEMORY: u64 = 1 << 0;
/// CAPABILITIES bit: executes VADD.
pub const CAPABILITY_VADD: u64 = 1 << 1;
/// CAPABILITIES bit: has the NVMe controller.
pub const CAPABILITY_NVME: u64 = 1 << 2;
/// CAPABILITIES bit: raises MSI-X interrupts (eventfd through VFIO).
pub const CAPABILITY_INTERRUPTS: u64 = 1 << 3;
/// CAPABILITIES bits 16..24: log2 of the largest ring.
pub const CAPABILITY_RING_ENTRIES_LOG2_SHIFT: u32 = 16;
/// CAPABILITIES bits 24..32: log2 of the largest slot.
pub const CAPABILITY_SLOT_BYTES_LOG2_SHIFT: u32 = 24;

/// STATUS bit: enabled and fetching.
pub const STATUS_READY: u32 = 1 << 0;
/// STATUS bit: stopped on an error; ERROR_CODE says which. Cleared only by a reset.
pub const STATUS_FATAL: u32 = 1 << 1;
/// STATUS bit: a reset is under way.
pub const STATUS_RESETTING: u32 = 1 << 2;

/// CONTROL bit: enable.
pub const CONTROL_ENABLE: u32 = 1 << 0;

/// The value to write to RESET ("RSET").
pub const RESET_MAGIC: u32 = 0x5253_4554;

/// ERROR_CODE: none.
pub const ERROR_NONE: u32 = 0;
/// ERROR_CODE: ring or slot configuration invalid at enable.
pub const ERROR_BAD_CONFIG: u32 = 1;
/// ERROR_CODE: region table invalid at enable.
pub const ERROR_BAD_REGION_TABLE: u32 = 2;
/// ERROR_CODE: the host moved SUBMISSION_TAIL more than a ring ahead of SUBMISSION_HEAD.
pub const ERROR_DOORBELL_OVERRUN: u32 = 3;
/// ERROR_CODE: an internal error of the device (injected by the model).
pub const ERROR_INTERNAL: u32 = 4;

/// Region-table entry flag: the entry is in use.
pub const REGION_VALID: u8 = 0x01;

/// One region placed in on-board memory (32 bytes at REGION_TABLE + 32 * index):
/// space `u16` at 0, flags `u8` at 2, 5 reserved bytes, offset in on-board memory `u64` at 8,
/// bytes `u64` at 16, 8 reserved bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RegionEntry {
    /// The space id instructions name.
    pub space: u16,
    /// Offset of the region's first byte in on-board memory (8-byte aligned).
    pub offset: u64,
    /// Bytes in the region.
    pub bytes: u64,
}

/// u32, RO: bit 0 the NVMe controller is up, bit 1 it failed.
pub const NVME_STATUS: u64 = 0x100;
/// u32, RO: the last non-zero NVMe status field.
pub const NVME_LAST_STATUS: u64 = 0x104;
/// u32, RO: entries of each NVMe I/O queue.
pub const NVME_QUEUE_ENTRIES: u64 = 0x108;
/// u32, RO: the largest transfer of one block instruction, in bytes.
pub const NVME_MAX_TRANSFER_BYTES: u64 = 0x10C;
/// u64, RO: on-board memory offset of the NVMe area (queues, PRP lists, transfer buffers).
pub const NVME_BOUNCE_OFFSET: u64 = 0x110;
/// u64, RO: bytes of the NVMe area; regions must lie below it.
pub const NVME_BOUNCE_BYTES: u64 = 0x118;
/// Start of the namespace table.
pub const NAMESPACE_TABLE: u64 = 0x120;
/// Entries of the namespace table.
pub const NAMESPACE_TABLE_ENTRIES: usize = 8;
/// Bytes of one namespace-table entry.
pub const NAMESPACE_ENTRY_BYTES: u64 = 16;

const _: () = assert!(NAMESPACE_TABLE + NAMESPACE_TABLE_ENTRIES as u64 * NAMESPACE_ENTRY_BYTES <= REGION_TABLE);

/// NVME_STATUS bit: the controller is up.
pub const NVME_STATUS_UP: u32 = 1 << 0;

/// ERROR_CODE: namespace table invalid at enable.
pub const ERROR_BAD_NAMESPACE_TABLE: u32 = 5;

/// Namespace-table entry flag: the entry is in use.
pub const NAMESPACE_VALID: u8 = 0x01;

/// One namespace served by the device's NVMe controller (16 bytes at NAMESPACE_TABLE + 16 *
/// index): space `u16` at 0, flags `u8` at 2, `lba_shift` `u8` at 3, `nsid` `u32` at 4,
/// `blocks` `u64` at 8.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NamespaceEntry {
    /// The space id block instructions name.
    pub space: u16,
    /// log2 of the block size; must match the SSD namespace's LBA size.
    pub lba_shift: u8,
    /// The SSD's namespace id.
    pub nsid: u32,
    /// Blocks served (at most the SSD namespace's size).
    pub blocks: u64,
}
