//! NVMe queue entries as an NVMe 1.4 controller reads and writes them (64-byte submission
//! entries, 16-byte completion entries with a phase tag), and a model of the SSD behind the
//! FPGA's NVMe controller: it consumes real SQEs from a submission queue in the window, moves
//! data through PRPs, executes on a `netdam-nvme` [`BlockDevice`] and posts CQEs. FPGA.md §9.
//!
//! The SSD starts with only its admin queue pair (placed at construction, as `AQA`/`ASQ`/`ACQ`
//! would place it) and serves IDENTIFY and I/O queue creation on it; its I/O queue exists only
//! once the host has created it, as on a real controller. FPGA.md §9.1 and §9.6.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use netdam_isa::Status;
use netdam_nvme::{BlockDevice, BlockError, BlockRequest, BufferIndex};

use crate::window::Window;

/// Bytes of a submission queue entry.
pub const SUBMISSION_ENTRY_BYTES: usize = 64;
/// Bytes of a completion queue entry.
pub const COMPLETION_ENTRY_BYTES: usize = 16;
/// Memory page size the controller is configured with (`CC.MPS = 0`).
pub const PAGE_BYTES: u64 = 4096;
/// Bytes of one DATASET MANAGEMENT range.
pub const DSM_RANGE_BYTES: usize = 16;
/// Bytes of an IDENTIFY data structure (one page, written through PRP1/PRP2).
pub const IDENTIFY_BYTES: usize = 4096;
/// The one namespace the SSD has (`NN = 1`).
pub const NAMESPACE_ID: u32 = 1;
/// The one I/O queue id the SSD lets the host create.
pub const IO_QUEUE_ID: u16 = 1;
/// Largest I/O queue the SSD accepts, in entries (`CAP.MQES + 1`): the model keeps a command
/// slot per entry, allocated at construction, so this bounds that pool.
pub const IO_QUEUE_ENTRIES_MAX: u32 = 256;
/// Largest admin queue (`AQA.ASQS`/`ACQS` are 12-bit 0-based sizes).
pub const ADMIN_QUEUE_ENTRIES_MAX: u32 = 4096;
/// PCI vendor id the SSD reports in IDENTIFY controller (`VID`, `SSVID`): Xilinx's, as the
/// FPGA's functions carry (FPGA.md §1), since the model is part of that card.
pub const VENDOR_ID: u16 = 0x10EE;

/// The SSD's controller registers (NVMe 1.4 §3.1.1), by offset from its register block, and
/// the bits the FPGA's controller uses (FPGA.md §9.1).
pub mod register {
    /// u64: Controller Capabilities.
    pub const CAP: u64 = 0x00;
    /// u32: Version.
    pub const VS: u64 = 0x08;
    /// u32: Controller Configuration.
    pub const CC: u64 = 0x14;
    /// u32: Controller Status.
    pub const CSTS: u64 = 0x1C;
    /// u32: Admin Queue Attributes (`ACQS << 16 | ASQS`, 0-based).
    pub const AQA: u64 = 0x24;
    /// u64: Admin Submission Queue base address.
    pub const ASQ: u64 = 0x28;
    /// u64: Admin Completion Queue base address.
    pub const ACQ: u64 = 0x30;
    /// Bytes of the register block the model keeps.
    pub const BYTES: u64 = 0x38;
    /// `CC.EN`.
    pub const CC_EN: u32 = 1;
    /// `CC` as the FPGA enables the SSD: `EN`, `CSS = 0` (NVM), `MPS = 0` (4 KiB pages),
    /// `IOSQES = 6` (64-byte SQEs), `IOCQES = 4` (16-byte CQEs).
    pub const CC_ENABLE: u32 = CC_EN | 6 << 16 | 4 << 20;
    /// `CSTS.RDY`.
    pub const CSTS_RDY: u32 = 1;
    /// `CSTS.CFS`: Controller Fatal Status.
    pub const CSTS_CFS: u32 = 1 << 1;
    /// `CAP.CQR`: queues must be physically contiguous.
    pub const CAP_CQR: u64 = 1 << 16;
    /// `CAP.TO` shift: worst-case ready time, in 500 ms units.
    pub const CAP_TO_SHIFT: u32 = 24;
    /// `CAP.CSS` bit 37: the NVM command set.
    pub const CAP_CSS_NVM: u64 = 1 << 37;
}

/// Admin command set opcodes the SSD serves.
pub mod admin_opcode {
    /// DELETE I/O SUBMISSION QUEUE.
    pub const DELETE_IO_SUBMISSION_QUEUE: u8 = 0x00;
    /// CREATE I/O SUBMISSION QUEUE.
    pub const CREATE_IO_SUBMISSION_QUEUE: u8 = 0x01;
    /// DELETE I/O COMPLETION QUEUE.
    pub const DELETE_IO_COMPLETION_QUEUE: u8 = 0x04;
    /// CREATE I/O COMPLETION QUEUE.
    pub const CREATE_IO_COMPLETION_QUEUE: u8 = 0x05;
    /// IDENTIFY.
    pub const IDENTIFY: u8 = 0x06;
}

/// IDENTIFY `CDW10.CNS` values the SSD serves.
pub mod cns {
    /// The namespace named by `NSID`.
    pub const NAMESPACE: u8 = 0x00;
    /// The controller.
    pub const CONTROLLER: u8 = 0x01;
}

/// NVM command set opcodes used by the FPGA.
pub mod opcode {
    /// FLUSH.
    pub const FLUSH: u8 = 0x00;
    /// WRITE.
    pub const WRITE: u8 = 0x01;
    /// READ.
    pub const READ: u8 = 0x02;
    /// WRITE ZEROES.
    pub const WRITE_ZEROES: u8 = 0x08;
    /// DATASET MANAGEMENT.
    pub const DATASET_MANAGEMENT: u8 = 0x09;
}

/// Status fields (bits 15:1 of CQE bytes 14..16, shifted down: `SC | SCT << 8 | ...`).
pub mod status {
    /// Generic: successful completion.
    pub const SUCCESS: u16 = 0x000;
    /// Generic: invalid command opcode.
    pub const INVALID_OPCODE: u16 = 0x001;
    /// Generic: invalid field in command.
    pub const INVALID_FIELD: u16 = 0x002;
    /// Generic: data transfer error.
    pub const DATA_TRANSFER_ERROR: u16 = 0x004;
    /// Generic: internal error.
    pub const INTERNAL_ERROR: u16 = 0x006;
    /// Generic: invalid namespace or format.
    pub const INVALID_NAMESPACE: u16 = 0x00B;
    /// Generic: PRP offset invalid.
    pub const PRP_OFFSET_INVALID: u16 = 0x013;
    /// Generic (command specific range): LBA out of range.
    pub const LBA_OUT_OF_RANGE: u16 = 0x080;
    /// Command specific (SCT 1): completion queue invalid (an SQ naming a CQ that does not exist).
    pub const COMPLETION_QUEUE_INVALID: u16 = 0x100;
    /// Command specific (SCT 1): invalid queue identifier.
    pub const INVALID_QUEUE_IDENTIFIER: u16 = 0x101;
    /// Command specific (SCT 1): invalid queue size.
    pub const INVALID_QUEUE_SIZE: u16 = 0x102;
    /// Command specific (SCT 1): invalid queue deletion (a CQ some SQ still uses).
    pub const INVALID_QUEUE_DELETION: u16 = 0x10C;
    /// Media error: write fault.
    pub const WRITE_FAULT: u16 = 0x280;
    /// Media error: unrecovered read error.
    pub const UNRECOVERED_READ_ERROR: u16 = 0x281;
    /// Do Not Retry bit, in this shifted form.
    pub const DO_NOT_RETRY: u16 = 1 << 14;
}

/// The wire status for an NVMe status field (FPGA.md §9.4).
pub fn wire_status(status_field: u16) -> Status {
    let code = status_field & 0x7FF; // SC and SCT; CRD, M and DNR do not change the meaning
    match code {
        status::SUCCESS => Status::Ok,
        status::LBA_OUT_OF_RANGE | 0x081 => Status::OutOfRange,
        status::INVALID_FIELD => Status::Malformed,
        _ => Status::IoError,
    }
}

/// One submission queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SubmissionEntry {
    /// CDW0 bits 7:0.
    pub opcode: u8,
    /// CDW0 bits 31:16.
    pub command_id: u16,
    /// Namespace.
    pub nsid: u32,
    /// First data pointer.
    pub prp1: u64,
    /// Second data pointer or PRP list.
    pub prp2: u64,
    /// CDW10 to CDW15.
    pub cdw: [u32; 6],
}

impl SubmissionEntry {
    /// IDENTIFY (`CDW10.CNS = cns`) of namespace `nsid` (0 for the controller), into the page at
    /// `prp1`.
    pub fn identify(command_id: u16, nsid: u32, cns: u8, prp1: u64) -> SubmissionEntry {
        SubmissionEntry {
            opcode: admin_opcode::IDENTIFY,
            command_id,
            nsid,
            prp1,
            cdw: [u32::from(cns), 0, 0, 0, 0, 0],
            ..SubmissionEntry::default()
        }
    }

    /// CREATE I/O COMPLETION QUEUE or CREATE I/O SUBMISSION QUEUE (`opcode`) of queue `qid`
    /// with `entries` (≥ 1) at `base`: `CDW10 = QSIZE << 16 | QID` (QSIZE 0-based), `CDW11` as
    /// given (for a CQ `IV << 16 | IEN << 1 | PC`, for an SQ `CQID << 16 | QPRIO << 1 | PC`).
    pub fn create_io_queue(
        opcode: u8,
        command_id: u16,
        qid: u16,
        entries: u32,
        base: u64,
        cdw11: u32,
    ) -> SubmissionEntry {
        SubmissionEntry {
            opcode,
            command_id,
            prp1: base,
            cdw: [entries.wrapping_sub(1) << 16 | u32::from(qid), cdw11, 0, 0, 0, 0],
            ..SubmissionEntry::default()
        }
    }

    /// READ or WRITE of `blocks` (≥ 1) from `slba`.
    pub fn read_write(
        opcode: u8,
        command_id: u16,
        nsid: u32,
        slba: u64,
        blocks: u32,
        fua: bool,
        prps: (u64, u64),
    ) -> SubmissionEntry {
        debug_assert!((1..=65536).contains(&blocks), "NLB is a 16-bit 0-based count");
        let cdw12 = (blocks - 1) | if fua { 1 << 30 } else { 0 };
        SubmissionEntry {
            opcode,
            command_id,
            nsid,
            prp1: prps.0,
            prp2: prps.1,
            cdw: [slba as u32, (slba >> 32) as u32, cdw12, 0, 0, 0],
        }
    }

    /// The 64 bytes in the queue (FPGA.md §9.3); bytes 8..24 (CDW2, CDW3, MPTR) are zero.
    pub fn encode(&self) -> [u8; SUBMISSION_ENTRY_BYTES] {
        let mut bytes = [0u8; SUBMISSION_ENTRY_BYTES];
        let cdw0 = u32::from(self.opcode) | (u32::from(self.command_id) << 16);
        bytes[0..4].copy_from_slice(&cdw0.to_le_bytes());
        bytes[4..8].copy_from_slice(&self.nsid.to_le_bytes());
        bytes[24..32].copy_from_slice(&self.prp1.to_le_bytes());
        bytes[32..40].copy_from_slice(&self.prp2.to_le_bytes());
        for (index, dword) in self.cdw.iter().enumerate() {
            bytes[40 + 4 * index..44 + 4 * index].copy_from_slice(&dword.to_le_bytes());
        }
        bytes
    }

    /// Parses an entry; `None` for what this controller does not support (fused commands,
    /// SGLs, metadata pointers).
    pub fn decode(bytes: &[u8; SUBMISSION_ENTRY_BYTES]) -> Option<SubmissionEntry> {
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let cdw0 = u32_at(0);
        let fuse_or_psdt = (cdw0 >> 8) & 0xFF;
        if fuse_or_psdt != 0 || u64_at(16) != 0 {
            return None;
        }
        let mut cdw = [0u32; 6];
        for (index, dword) in cdw.iter_mut().enumerate() {
            *dword = u32_at(40 + 4 * index);
        }
        Some(SubmissionEntry {
            opcode: cdw0 as u8,
            command_id: (cdw0 >> 16) as u16,
            nsid: u32_at(4),
            prp1: u64_at(24),
            prp2: u64_at(32),
            cdw,
        })
    }

    /// The command id, readable even from an entry [`SubmissionEntry::decode`] refuses.
    pub fn command_id_of(bytes: &[u8; SUBMISSION_ENTRY_BYTES]) -> u16 {
        u16::from_le_bytes([bytes[2], bytes[3]])
    }
}

/// One completion queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CompletionEntry {
    /// DW0, command specific.
    pub dw0: u32,
    /// Submission queue head when posted.
    pub sq_head: u16,
    /// Submission queue id.
    pub sq_id: u16,
    /// The command's id.
    pub command_id: u16,
    /// Phase tag.
    pub phase: bool,
    /// Status field (`SC | SCT << 8 | CRD << 11 | M << 13 | DNR << 14`).
    pub status: u16,
}

impl CompletionEntry {
    /// The 16 bytes in the queue (FPGA.md §9.4).
    pub fn encode(&self) -> [u8; COMPLETION_ENTRY_BYTES] {
        let mut bytes = [0u8; COMPLETION_ENTRY_BYTES];
        bytes[0..4].copy_from_slice(&self.dw0.to_le_bytes());
        bytes[8..10].copy_from_slice(&self.sq_head.to_le_bytes());
        bytes[10..12].copy_from_slice(&self.sq_id.to_le_bytes());
        bytes[12..14].copy_from_slice(&self.command_id.to_le_bytes());
        let phase_and_status = u16::from(self.phase) | (self.status << 1);
        bytes[14..16].copy_from_slice(&phase_and_status.to_le_bytes());
        bytes
    }

    /// Parses an entry.
    pub fn decode(bytes: &[u8; COMPLETION_ENTRY_BYTES]) -> CompletionEntry {
        let phase_and_status = u16::from_le_bytes([bytes[14], bytes[15]]);
        CompletionEntry {
            dw0: u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes")),
            sq_head: u16::from_le_bytes([bytes[8], bytes[9]]),
            sq_id: u16::from_le_bytes([bytes[10], bytes[11]]),
            command_id: u16::from_le_bytes([bytes[12], bytes[13]]),
            phase: phase_and_status & 1 != 0,
            status: phase_and_status >> 1,
        }
    }
}

/// Where a queue pair and its doorbells live in the window: the admin pair given to
/// [`SsdModel::new`], or an I/O pair as the host side sees the one it created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueuePair {
    /// Queue id: 0 for the admin pair, [`IO_QUEUE_ID`] for the I/O pair.
    pub sq_id: u16,
    /// Entries of each queue (2..=65536, as `QSIZE + 1`).
    pub entries: u32,
    /// Bus address of the submission queue (page aligned).
    pub sq_base: u64,
    /// Bus address of the completion queue (page aligned).
    pub cq_base: u64,
    /// Bus address of this pair's doorbells: SQ tail at +0, CQ head at +4 (`DSTRD = 0`). For
    /// the admin pair this is the start of the SSD's doorbell registers: queue `y`'s are at
    /// `doorbells + 8 × y`, as at BAR0 `0x1000 + 8 × y` on a real SSD.
    pub doorbells: u64,
}

/// A submission queue the SSD fetches from.
#[derive(Debug, Clone, Copy)]
struct SubmissionQueue {
    id: u16,
    base: u64,
    entries: u32,
    head: u32,
    tail_doorbell: u64,
}

/// A completion queue the SSD posts to.
#[derive(Debug, Clone, Copy)]
struct CompletionQueue {
    base: u64,
    entries: u32,
    tail: u32,
    phase: bool,
    head_doorbell: u64,
}

impl CompletionQueue {
    /// Entries posted and not yet consumed, by the host's head doorbell (a head out of range
    /// counts as the last valid one, so a bad doorbell cannot make room that is not there).
    fn posted(&self, window: &dyn Window) -> u32 {
        let head = window.u32_at(self.head_doorbell).load(Ordering::Acquire).min(self.entries - 1);
        (self.tail + self.entries - head) % self.entries
    }
}

/// A command taken from the submission queue and not yet completed.
#[derive(Debug, Clone, Copy, Default)]
struct Command {
    entry: SubmissionEntry,
    /// Device requests still out.
    outstanding: u32,
    /// The first failure among them.
    status: u16,
    /// The device buffer of a READ or WRITE.
    buffer: Option<u16>,
    in_use: bool,
}

/// The SSD: an admin queue pair and at most one I/O queue pair over a [`BlockDevice`]. The
/// queues, PRP lists and data live in the window (the FPGA's on-board memory); doorbells are
/// NVMe indices, not counters.
pub struct SsdModel {
    window: Arc<dyn Window>,
    device: Box<dyn BlockDevice>,
    /// Start of the doorbell registers (the admin pair's).
    doorbells: u64,
    admin_sq: SubmissionQueue,
    admin_cq: CompletionQueue,
    /// The I/O queues, once created.
    io_sq: Option<SubmissionQueue>,
    io_cq: Option<CompletionQueue>,
    /// Commands by slot (the tag given to the device); fixed size, no allocation per command.
    commands: Vec<Command>,
    free_buffers: Vec<u16>,
    /// Device completions of one reap, (slot, status); capacity = the device's queue depth, so
    /// it never grows.
    finished: Vec<(u64, u16)>,
    /// Commands taken from the submission queue so far.
    taken: u64,
    /// Fail this command (numbered by `taken`, from 0) with a media error instead of running it.
    media_error_at: Option<u64>,
    /// Where its controller registers are (`None`: built enabled, with fixed admin queues).
    registers: Option<u64>,
    /// `CC.EN` has been taken: the admin queues of `AQA`/`ASQ`/`ACQ` are in use.
    enabled: bool,
}

impl std::fmt::Debug for SsdModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SsdModel").field("io_sq", &self.io_sq).field("io_cq", &self.io_cq).finish_non_exhaustive()
    }
}

fn block_status(error: &BlockError) -> u16 {
    match error {
        BlockError::OutOfRange { .. } => status::LBA_OUT_OF_RANGE,
        BlockError::TooLarge { .. } | BlockError::NoSuchBuffer { .. } => status::INVALID_FIELD,
        BlockError::ReadFailed { .. } => status::UNRECOVERED_READ_ERROR,
        BlockError::WriteFailed { .. } | BlockError::FlushFailed { .. } => status::WRITE_FAULT,
        _ => status::INTERNAL_ERROR,
    }
}

impl SsdModel {
    /// An SSD with its admin queue pair at `admin` (as a controller's `AQA`, `ASQ` and `ACQ`
    /// registers would place it; both queues have `admin.entries`) serving namespace
    /// [`NAMESPACE_ID`] from `device`. It has no I/O queue until the host creates one. Panics
    /// if the admin pair or the doorbells do not fit the window, or the device cannot move a
    /// page per command: that is the model's own configuration, not input.
    pub fn new(window: Arc<dyn Window>, admin: QueuePair, device: Box<dyn BlockDevice>) -> SsdModel {
        assert_eq!(admin.sq_id, 0, "the admin queue pair is queue 0");
        assert!((2..=ADMIN_QUEUE_ENTRIES_MAX).contains(&admin.entries), "admin queues hold 2 to 4096 entries");
        let sq_bytes = admin.entries as usize * SUBMISSION_ENTRY_BYTES;
        let cq_bytes = admin.entries as usize * COMPLETION_ENTRY_BYTES;
        assert!(window.pointer(admin.sq_base, sq_bytes).is_some(), "admin submission queue within the window");
        assert!(window.pointer(admin.cq_base, cq_bytes).is_some(), "admin completion queue within the window");
        // Admin pair and I/O pair 1: four doorbells.
        assert!(window.pointer(admin.doorbells, 16).is_some(), "doorbells within the window");
        let geometry = device.geometry();
        assert!(
            u64::from(geometry.max_transfer_blocks) * u64::from(geometry.block_bytes) >= PAGE_BYTES,
            "MDTS counts pages: the device must move at least one per command"
        );
        // Doorbells are registers a controller reset clears; in the window they may hold what
        // an earlier run left.
        clear_doorbells(&*window, admin.doorbells);
        let depth = geometry.queue_depth;
        SsdModel {
            window,
            device,
            doorbells: admin.doorbells,
            admin_sq: SubmissionQueue {
                id: 0,
                base: admin.sq_base,
                entries: admin.entries,
                head: 0,
                tail_doorbell: admin.doorbells,
            },
            admin_cq: CompletionQueue {
                base: admin.cq_base,
                entries: admin.entries,
                tail: 0,
                phase: true,
                head_doorbell: admin.doorbells + 4,
            },
            io_sq: None,
            io_cq: None,
            commands: vec![Command::default(); IO_QUEUE_ENTRIES_MAX as usize],
            free_buffers: (0..depth as u16).rev().collect(),
            finished: Vec::with_capacity(depth as usize),
            taken: 0,
            media_error_at: None,
            registers: None,
            enabled: true,
        }
    }

    /// An SSD with its controller registers at `registers` ([`register::BYTES`] of the window)
    /// and its doorbells at `doorbells` (queue `y`'s at `doorbells + 8 × y`), disabled: the
    /// host places the admin queues with `AQA`, `ASQ` and `ACQ` and sets `CC.EN` (FPGA.md
    /// §9.1); `CSTS.RDY` says when it may submit. Panics if the registers or doorbells are not
    /// in the window (the model's own layout, not input).
    pub fn powered(window: Arc<dyn Window>, registers: u64, doorbells: u64, device: Box<dyn BlockDevice>) -> SsdModel {
        assert!(window.pointer(registers, register::BYTES as usize).is_some(), "registers within the window");
        // Placeholder admin queues, replaced at enable.
        let placeholder = QueuePair { sq_id: 0, entries: 2, sq_base: 0, cq_base: 0, doorbells };
        let mut ssd = SsdModel::new(Arc::clone(&window), placeholder, device);
        ssd.registers = Some(registers);
        ssd.enabled = false;
        let cap = u64::from(IO_QUEUE_ENTRIES_MAX - 1) // MQES, 0-based
            | register::CAP_CQR
            | 1 << register::CAP_TO_SHIFT // ready within 500 ms
            | register::CAP_CSS_NVM; // DSTRD 0, MPSMIN 0 (4 KiB), MPSMAX 0
        window.u64_at(registers + register::CAP).store(cap, Ordering::Relaxed);
        window.u32_at(registers + register::VS).store(0x0001_0400, Ordering::Relaxed);
        for offset in [register::CC, register::CSTS, register::AQA] {
            window.u32_at(registers + offset).store(0, Ordering::Relaxed);
        }
        window.u64_at(registers + register::ASQ).store(0, Ordering::Relaxed);
        window.u64_at(registers + register::ACQ).store(0, Ordering::Release);
        ssd
    }

    /// Follows `CC.EN`: on 0 → 1, takes the admin queues from `AQA`/`ASQ`/`ACQ` and sets
    /// `CSTS.RDY`, or sets `CSTS.CFS` if they or `CC` cannot be served; on 1 → 0, a controller
    /// reset, once the commands on its device have finished (the model cannot abort them): the
    /// I/O queues are gone and `CSTS` is 0.
    fn follow_enable(&mut self) -> bool {
        let Some(registers) = self.registers else { return false };
        let window = Arc::clone(&self.window);
        let cc = window.u32_at(registers + register::CC).load(Ordering::Acquire);
        let csts = window.u32_at(registers + register::CSTS);
        let wants = cc & register::CC_EN != 0;
        let fatal = csts.load(Ordering::Relaxed) & register::CSTS_CFS != 0;
        if !wants && fatal {
            // A reset clears the fatal status of a refused enable.
            csts.store(0, Ordering::Release);
            return true;
        }
        if wants == self.enabled || fatal {
            return false;
        }
        if !wants {
            if self.commands_in_flight() > 0 {
                return false;
            }
            self.enabled = false;
            self.io_sq = None;
            self.io_cq = None;
            csts.store(0, Ordering::Release);
            return true;
        }
        let aqa = window.u32_at(registers + register::AQA).load(Ordering::Relaxed);
        let sq_entries = (aqa & 0xFFF) + 1;
        let cq_entries = ((aqa >> 16) & 0xFFF) + 1;
        let sq_base = window.u64_at(registers + register::ASQ).load(Ordering::Relaxed);
        let cq_base = window.u64_at(registers + register::ACQ).load(Ordering::Relaxed);
        let page_aligned = |base: u64| base.is_multiple_of(PAGE_BYTES);
        let fits = |base: u64, bytes: usize| page_aligned(base) && window.pointer(base, bytes).is_some();
        let served = cc == register::CC_ENABLE
            && (2..=ADMIN_QUEUE_ENTRIES_MAX).contains(&sq_entries)
            && (2..=ADMIN_QUEUE_ENTRIES_MAX).contains(&cq_entries)
            && fits(sq_base, sq_entries as usize * SUBMISSION_ENTRY_BYTES)
            && fits(cq_base, cq_entries as usize * COMPLETION_ENTRY_BYTES);
        if !served {
            csts.store(register::CSTS_CFS, Ordering::Release);
            return true;
        }
        self.admin_sq =
            SubmissionQueue { id: 0, base: sq_base, entries: sq_entries, head: 0, tail_doorbell: self.doorbells };
        self.admin_cq = CompletionQueue {
            base: cq_base,
            entries: cq_entries,
            tail: 0,
            phase: true,
            head_doorbell: self.doorbells + 4,
        };
        clear_doorbells(&*window, self.doorbells);
        self.io_sq = None;
        self.io_cq = None;
        self.enabled = true;
        csts.store(register::CSTS_RDY, Ordering::Release);
        true
    }

    /// Completes command number `number` (0 = the first taken from the queue) with a media error
    /// (unrecovered read error for a READ, write fault otherwise) without touching the device.
    pub fn inject_media_error_at(&mut self, number: u64) {
        self.media_error_at = Some(number);
    }

    fn commands_in_flight(&self) -> u32 {
        self.commands.iter().filter(|command| command.in_use).count() as u32
    }

    /// The largest transfer, in bytes, a READ or WRITE may move: what the device takes per
    /// request, rounded down to the power of two of pages IDENTIFY reports as `MDTS`.
    pub fn max_transfer_bytes(&self) -> u64 {
        PAGE_BYTES << self.mdts()
    }

    /// `MDTS`: log2 of the largest transfer in pages (checked ≥ 1 page at [`SsdModel::new`]).
    fn mdts(&self) -> u8 {
        let geometry = self.device.geometry();
        let pages = u64::from(geometry.max_transfer_blocks) * u64::from(geometry.block_bytes) / PAGE_BYTES;
        // One PRP list page: PRP1's page and 512 more, so no more than 512 pages either way.
        pages.clamp(1, PAGE_BYTES / 8).ilog2() as u8
    }

    /// One pass: run the admin commands submitted, fetch the I/O commands that fit, push them
    /// to the device, post what finished. Returns whether anything happened.
    pub fn step(&mut self) -> bool {
        let mut progressed = self.follow_enable();
        if self.enabled {
            progressed |= self.fetch_admin();
            progressed |= self.fetch();
        }
        let mut finished = std::mem::take(&mut self.finished);
        finished.clear();
        self.device.reap(&mut |completion| {
            let status = completion.result.as_ref().map_or_else(block_status, |()| status::SUCCESS);
            finished.push((completion.tag, status));
        });
        for &(tag, status) in &finished {
            progressed = true;
            self.request_done(tag as usize, status);
        }
        self.finished = finished;
        progressed
    }

    /// Fetches and runs admin commands; each completes at once (none touches the device).
    fn fetch_admin(&mut self) -> bool {
        let mut progressed = false;
        loop {
            let sq = self.admin_sq;
            let tail = self.window.u32_at(sq.tail_doorbell).load(Ordering::Acquire);
            if tail >= sq.entries || tail == sq.head {
                return progressed; // an invalid doorbell value is ignored (a real SSD logs an async event)
            }
            if self.admin_cq.posted(&*self.window) + 1 >= self.admin_cq.entries {
                return progressed; // the admin CQ is full until the host consumes an entry
            }
            let mut bytes = [0u8; SUBMISSION_ENTRY_BYTES];
            let at = sq.base + u64::from(sq.head) * SUBMISSION_ENTRY_BYTES as u64;
            self.window.read_bytes(at, &mut bytes).expect("admin queue within the window (checked at new)");
            let status = match SubmissionEntry::decode(&bytes) {
                None => status::INVALID_FIELD | status::DO_NOT_RETRY,
                Some(entry) => match self.admin(&entry) {
                    Some(status) => status,
                    None => return progressed, // waits for the I/O queue to drain
                },
            };
            self.admin_sq.head = (sq.head + 1) % sq.entries;
            let command_id = SubmissionEntry::command_id_of(&bytes);
            let mut cq = self.admin_cq;
            post(&*self.window, &mut cq, 0, self.admin_sq.head, command_id, status);
            self.admin_cq = cq;
            progressed = true;
        }
    }

    /// Runs one admin command: its status, or `None` when it must wait (deleting the I/O
    /// submission queue while commands from it are on the device).
    fn admin(&mut self, entry: &SubmissionEntry) -> Option<u16> {
        let refused = |status: u16| Some(status | status::DO_NOT_RETRY);
        let queue_id = (entry.cdw[0] & 0xFFFF) as u16;
        let queue_entries = (entry.cdw[0] >> 16) + 1;
        let contiguous = entry.cdw[1] & 1 != 0;
        match entry.opcode {
            admin_opcode::IDENTIFY => {
                let mut data = [0u8; IDENTIFY_BYTES];
                match (entry.cdw[0] & 0xFF) as u8 {
                    cns::CONTROLLER => self.identify_controller(&mut data),
                    cns::NAMESPACE if entry.nsid == NAMESPACE_ID => self.identify_namespace(&mut data),
                    // NVMe 1.4 §5.15.1: an NSID that is not a valid one (NN = 1).
                    cns::NAMESPACE => return refused(status::INVALID_NAMESPACE),
                    _ => return refused(status::INVALID_FIELD),
                }
                let done = transfer(&*self.window, entry.prp1, entry.prp2, &mut data, Direction::ToMemory);
                Some(done.err().unwrap_or(status::SUCCESS))
            }
            admin_opcode::CREATE_IO_COMPLETION_QUEUE => {
                if queue_id != IO_QUEUE_ID || self.io_cq.is_some() {
                    return refused(status::INVALID_QUEUE_IDENTIFIER);
                }
                if !(2..=IO_QUEUE_ENTRIES_MAX).contains(&queue_entries) {
                    return refused(status::INVALID_QUEUE_SIZE);
                }
                let interrupts = entry.cdw[1] & (1 << 1) != 0;
                let bytes = queue_entries as usize * COMPLETION_ENTRY_BYTES;
                if !contiguous || interrupts || !self.queue_fits(entry.prp1, bytes) {
                    return refused(status::INVALID_FIELD);
                }
                // Zeroed so that no stale entry carries the phase the host will wait for.
                for offset in (0..bytes as u64).step_by(8) {
                    self.window.u64_at(entry.prp1 + offset).store(0, Ordering::Relaxed);
                }
                let head_doorbell = self.doorbells + 8 * u64::from(IO_QUEUE_ID) + 4;
                self.window.u32_at(head_doorbell).store(0, Ordering::Release);
                self.io_cq = Some(CompletionQueue {
                    base: entry.prp1,
                    entries: queue_entries,
                    tail: 0,
                    phase: true,
                    head_doorbell,
                });
                Some(status::SUCCESS)
            }
            admin_opcode::CREATE_IO_SUBMISSION_QUEUE => {
                if queue_id != IO_QUEUE_ID || self.io_sq.is_some() {
                    return refused(status::INVALID_QUEUE_IDENTIFIER);
                }
                if !(2..=IO_QUEUE_ENTRIES_MAX).contains(&queue_entries) {
                    return refused(status::INVALID_QUEUE_SIZE);
                }
                let completion_queue_id = (entry.cdw[1] >> 16) as u16;
                if completion_queue_id != IO_QUEUE_ID || self.io_cq.is_none() {
                    return refused(status::COMPLETION_QUEUE_INVALID);
                }
                if !contiguous || !self.queue_fits(entry.prp1, queue_entries as usize * SUBMISSION_ENTRY_BYTES) {
                    return refused(status::INVALID_FIELD);
                }
                let tail_doorbell = self.doorbells + 8 * u64::from(IO_QUEUE_ID);
                // The tail starts at 0: whatever the doorbell held before creation is no command.
                self.window.u32_at(tail_doorbell).store(0, Ordering::Release);
                self.io_sq = Some(SubmissionQueue {
                    id: IO_QUEUE_ID,
                    base: entry.prp1,
                    entries: queue_entries,
                    head: 0,
                    tail_doorbell,
                });
                Some(status::SUCCESS)
            }
            admin_opcode::DELETE_IO_SUBMISSION_QUEUE => {
                if queue_id != IO_QUEUE_ID || self.io_sq.is_none() {
                    return refused(status::INVALID_QUEUE_IDENTIFIER);
                }
                if self.commands_in_flight() > 0 {
                    // NVMe aborts them; the model lets them finish first, which a host cannot
                    // tell apart from their completing just before the delete.
                    return None;
                }
                self.io_sq = None;
                Some(status::SUCCESS)
            }
            admin_opcode::DELETE_IO_COMPLETION_QUEUE => {
                if queue_id != IO_QUEUE_ID || self.io_cq.is_none() {
                    return refused(status::INVALID_QUEUE_IDENTIFIER);
                }
                if self.io_sq.is_some() {
                    return refused(status::INVALID_QUEUE_DELETION);
                }
                self.io_cq = None;
                Some(status::SUCCESS)
            }
            _ => refused(status::INVALID_OPCODE),
        }
    }

    /// A queue base is page aligned (`PC = 1`, `CC.MPS = 0`) and the queue lies in the window.
    fn queue_fits(&self, base: u64, bytes: usize) -> bool {
        base.is_multiple_of(PAGE_BYTES) && self.window.pointer(base, bytes).is_some()
    }

    /// IDENTIFY controller (NVMe 1.4 Figure 247): only the fields a host needs to bring the
    /// SSD up and size its commands; the rest stays zero ("not reported").
    fn identify_controller(&self, data: &mut [u8; IDENTIFY_BYTES]) {
        data[0..2].copy_from_slice(&VENDOR_ID.to_le_bytes()); // VID
        data[2..4].copy_from_slice(&VENDOR_ID.to_le_bytes()); // SSVID
        let ascii = |field: &mut [u8], text: &str| {
            field.fill(b' '); // ASCII fields are space padded, not NUL terminated
            field[..text.len()].copy_from_slice(text.as_bytes());
        };
        ascii(&mut data[4..24], "NETDAM-MODEL-0001"); // SN
        ascii(&mut data[24..64], "netdam FPGA model SSD"); // MN
        ascii(&mut data[64..72], env!("CARGO_PKG_VERSION")); // FR
        data[77] = self.mdts(); // MDTS
        data[80..84].copy_from_slice(&0x0001_0400u32.to_le_bytes()); // VER: 1.4.0
        data[512] = 0x66; // SQES: 64-byte entries, required and largest
        data[513] = 0x44; // CQES: 16-byte entries
        data[516..520].copy_from_slice(&1u32.to_le_bytes()); // NN
        data[520..522].copy_from_slice(&0x000Cu16.to_le_bytes()); // ONCS: DSM, WRITE ZEROES
        data[525] = 0x01; // VWC: a volatile write cache, so FLUSH matters
    }

    /// IDENTIFY namespace (NVMe 1.4 Figure 245): size, capacity and utilisation all the whole
    /// namespace (no thin provisioning), one LBA format without metadata.
    fn identify_namespace(&self, data: &mut [u8; IDENTIFY_BYTES]) {
        let geometry = self.device.geometry();
        for at in [0, 8, 16] {
            data[at..at + 8].copy_from_slice(&geometry.capacity_blocks.to_le_bytes());
            // NSZE, NCAP, NUSE
        }
        data[25] = 0; // NLBAF: one format (0-based)
        data[26] = 0; // FLBAS: format 0, no metadata
        let lba_format = u32::from(geometry.block_bytes.trailing_zeros() as u8) << 16; // LBADS, MS = 0, RP = 0
        data[128..132].copy_from_slice(&lba_format.to_le_bytes());
    }

    fn fetch(&mut self) -> bool {
        let mut progressed = false;
        // An uncreated queue's doorbell is not a queue: nothing is fetched.
        let (Some(sq), Some(cq)) = (self.io_sq, self.io_cq) else { return false };
        // Neither queue is deleted during a fetch: these copies give their places and sizes;
        // the head and the tail move in `self`.
        let entries = sq.entries;
        loop {
            let sq_head = self.io_sq.map_or(sq.head, |current| current.head);
            let tail = self.window.u32_at(sq.tail_doorbell).load(Ordering::Acquire);
            if tail >= entries || tail == sq_head {
                return progressed; // an invalid doorbell value is ignored (a real SSD logs an async event)
            }
            // A completion slot must stay free for every command taken (CQ holds entries - 1).
            let posted = self.io_cq.map_or(0, |cq| cq.posted(&*self.window));
            if posted + self.commands_in_flight() + 1 >= cq.entries {
                return progressed;
            }
            let mut bytes = [0u8; SUBMISSION_ENTRY_BYTES];
            let at = sq.base + u64::from(sq_head) * SUBMISSION_ENTRY_BYTES as u64;
            self.window.read_bytes(at, &mut bytes).expect("queue within the window (checked at creation)");
            let Some(slot) = self.commands.iter().position(|command| !command.in_use) else { return progressed };
            let Some(entry) = SubmissionEntry::decode(&bytes) else {
                self.advance_io_head();
                let id = SubmissionEntry::command_id_of(&bytes);
                self.post(id, status::INVALID_FIELD | status::DO_NOT_RETRY);
                progressed = true;
                continue;
            };
            let number = self.taken;
            if self.media_error_at == Some(number) {
                self.media_error_at = None;
                let error =
                    if entry.opcode == opcode::READ { status::UNRECOVERED_READ_ERROR } else { status::WRITE_FAULT };
                self.post(entry.command_id, error);
            } else if !self.start(slot, entry) {
                return progressed; // the device is full: fetch it again next pass
            }
            self.taken += 1;
            self.advance_io_head();
            progressed = true;
        }
    }

    fn advance_io_head(&mut self) {
        if let Some(sq) = self.io_sq.as_mut() {
            sq.head = (sq.head + 1) % sq.entries;
        }
    }

    /// Starts `entry` in `slot`; `false` (and nothing changed) when the device has no room.
    fn start(&mut self, slot: usize, entry: SubmissionEntry) -> bool {
        let geometry = self.device.geometry();
        let free_requests = geometry.queue_depth.saturating_sub(self.device.in_flight() as u32);
        let complete_now = |model: &mut SsdModel, status: u16| {
            model.post(entry.command_id, status);
            true
        };
        if entry.nsid != NAMESPACE_ID {
            return complete_now(self, status::INVALID_NAMESPACE | status::DO_NOT_RETRY);
        }
        let slba = u64::from(entry.cdw[0]) | (u64::from(entry.cdw[1]) << 32);
        let blocks = (entry.cdw[2] & 0xFFFF) + 1;
        let fua = entry.cdw[2] & (1 << 30) != 0;
        let request = match entry.opcode {
            opcode::READ | opcode::WRITE => {
                if free_requests == 0 || self.free_buffers.is_empty() {
                    return false;
                }
                // The limit IDENTIFY reports (MDTS), not the device's own, so the two agree.
                if u64::from(blocks) * u64::from(geometry.block_bytes) > self.max_transfer_bytes() {
                    return complete_now(self, status::INVALID_FIELD | status::DO_NOT_RETRY);
                }
                if geometry.check_range(slba, blocks).is_err() {
                    return complete_now(self, status::LBA_OUT_OF_RANGE | status::DO_NOT_RETRY);
                }
                let buffer = *self.free_buffers.last().expect("checked non-empty");
                let bytes = blocks as usize * geometry.block_bytes as usize;
                if entry.opcode == opcode::WRITE {
                    let window = Arc::clone(&self.window);
                    let data = &mut self.device.buffer(BufferIndex(buffer))[..bytes];
                    if let Err(status) = transfer(&*window, entry.prp1, entry.prp2, data, Direction::FromMemory) {
                        return complete_now(self, status);
                    }
                }
                self.free_buffers.pop();
                self.commands[slot].buffer = Some(buffer);
                if entry.opcode == opcode::READ {
                    BlockRequest::Read { offset_blocks: slba, num_blocks: blocks, buffer: BufferIndex(buffer) }
                } else {
                    BlockRequest::Write { offset_blocks: slba, num_blocks: blocks, buffer: BufferIndex(buffer), fua }
                }
            }
            opcode::FLUSH => {
                if free_requests == 0 {
                    return false;
                }
                BlockRequest::Flush
            }
            opcode::WRITE_ZEROES => {
                if free_requests == 0 {
                    return false;
                }
                if geometry.check_range(slba, blocks).is_err() {
                    return complete_now(self, status::LBA_OUT_OF_RANGE | status::DO_NOT_RETRY);
                }
                BlockRequest::WriteZeroes { offset_blocks: slba, num_blocks: blocks }
            }
            opcode::DATASET_MANAGEMENT => return self.start_dataset_management(slot, entry, free_requests),
            _ => return complete_now(self, status::INVALID_OPCODE | status::DO_NOT_RETRY),
        };
        self.commands[slot] = Command {
            entry,
            outstanding: 1,
            status: status::SUCCESS,
            buffer: self.commands[slot].buffer,
            in_use: true,
        };
        self.submit(slot, request);
        true
    }

    /// DATASET MANAGEMENT with `AD`: one TRIM per range. Without `AD` the ranges are hints and
    /// the command succeeds at once. The model takes at most as many ranges as its device queue
    /// holds requests (a real controller queues them internally).
    fn start_dataset_management(&mut self, slot: usize, entry: SubmissionEntry, free_requests: u32) -> bool {
        let ranges = (entry.cdw[0] & 0xFF) + 1;
        let deallocate = entry.cdw[1] & (1 << 2) != 0;
        if !deallocate {
            self.post(entry.command_id, status::SUCCESS);
            return true;
        }
        let geometry = self.device.geometry();
        if ranges > geometry.queue_depth {
            self.post(entry.command_id, status::INVALID_FIELD | status::DO_NOT_RETRY);
            return true;
        }
        if ranges > free_requests {
            return false;
        }
        let mut list = [0u8; 256 * DSM_RANGE_BYTES];
        let list = &mut list[..ranges as usize * DSM_RANGE_BYTES];
        if let Err(status) = transfer(&*self.window, entry.prp1, entry.prp2, list, Direction::FromMemory) {
            self.post(entry.command_id, status);
            return true;
        }
        let range_at = |index: usize| {
            let range = &list[index * DSM_RANGE_BYTES..(index + 1) * DSM_RANGE_BYTES];
            let blocks = u32::from_le_bytes(range[4..8].try_into().expect("4 bytes"));
            let slba = u64::from_le_bytes(range[8..16].try_into().expect("8 bytes"));
            (slba, blocks)
        };
        // Check every range before trimming any: a bad one fails the command untouched.
        for index in 0..ranges as usize {
            let (slba, blocks) = range_at(index);
            if geometry.check_range(slba, blocks).is_err() {
                self.post(entry.command_id, status::LBA_OUT_OF_RANGE | status::DO_NOT_RETRY);
                return true;
            }
        }
        let trims = (0..ranges as usize).map(range_at).filter(|&(_, blocks)| blocks > 0).count() as u32;
        if trims == 0 {
            self.post(entry.command_id, status::SUCCESS);
            return true;
        }
        self.commands[slot] =
            Command { entry, outstanding: trims, status: status::SUCCESS, buffer: None, in_use: true };
        for index in 0..ranges as usize {
            let (slba, blocks) = range_at(index);
            if blocks > 0 {
                self.submit(slot, BlockRequest::Trim { offset_blocks: slba, num_blocks: blocks });
            }
        }
        true
    }

    fn submit(&mut self, slot: usize, request: BlockRequest) {
        if let Err(error) = self.device.submit(slot as u64, request) {
            // Room was checked; a refusal here is the device's own verdict on the request.
            self.request_done(slot, block_status(&error));
        }
    }

    fn request_done(&mut self, slot: usize, status: u16) {
        let Some(command) = self.commands.get_mut(slot).filter(|command| command.in_use) else {
            return; // a device completion for no command: ignored, as a controller would log it
        };
        if command.status == status::SUCCESS {
            command.status = status;
        }
        command.outstanding -= 1;
        if command.outstanding > 0 {
            return;
        }
        let command = std::mem::take(command);
        let mut status = command.status;
        if let Some(buffer) = command.buffer {
            if command.entry.opcode == opcode::READ && status == status::SUCCESS {
                let geometry = self.device.geometry();
                let bytes = ((command.entry.cdw[2] & 0xFFFF) + 1) as usize * geometry.block_bytes as usize;
                let window = Arc::clone(&self.window);
                let data = &mut self.device.buffer(BufferIndex(buffer))[..bytes];
                if let Err(transfer_status) =
                    transfer(&*window, command.entry.prp1, command.entry.prp2, data, Direction::ToMemory)
                {
                    status = transfer_status;
                }
            }
            self.free_buffers.push(buffer);
        }
        self.post(command.entry.command_id, status);
    }

    /// Posts the completion of an I/O command to the I/O completion queue.
    fn post(&mut self, command_id: u16, status: u16) {
        // Commands are only taken while both I/O queues exist, and neither is deleted while
        // one is on the device, so both are there for every completion.
        let (Some(sq), Some(cq)) = (self.io_sq, self.io_cq.as_mut()) else {
            debug_assert!(false, "an I/O completion with no I/O queues");
            return;
        };
        post(&*self.window, cq, sq.id, sq.head, command_id, status);
    }
}

/// Zeroes the four doorbells (the admin pair's and I/O pair 1's) from `doorbells`.
fn clear_doorbells(window: &dyn Window, doorbells: u64) {
    for index in 0..4 {
        window.u32_at(doorbells + 4 * index).store(0, Ordering::Release);
    }
}

/// Writes a CQE to `cq` with its current phase and advances its tail.
fn post(window: &dyn Window, cq: &mut CompletionQueue, sq_id: u16, sq_head: u32, command_id: u16, status: u16) {
    let entry = CompletionEntry { dw0: 0, sq_head: sq_head as u16, sq_id, command_id, phase: cq.phase, status };
    let bytes = entry.encode();
    let at = cq.base + u64::from(cq.tail) * COMPLETION_ENTRY_BYTES as u64;
    // Bytes 0..8 first, then 8..16 (with the phase) in one release store: a reader that
    // sees the new phase sees the whole entry.
    window.u64_at(at).store(u64::from_le_bytes(bytes[0..8].try_into().expect("8 bytes")), Ordering::Relaxed);
    window.u64_at(at + 8).store(u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes")), Ordering::Release);
    cq.tail += 1;
    if cq.tail == cq.entries {
        cq.tail = 0;
        cq.phase = !cq.phase;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// Memory → `data` (a WRITE, a DSM range list).
    FromMemory,
    /// `data` → memory (a READ).
    ToMemory,
}

/// Moves `data.len()` bytes between `data` and the memory the PRPs describe (4 KiB pages):
/// PRP1 may start inside a page; the rest is PRP2's page when it fits in one more, else the
/// PRP list PRP2 points to (one list page: up to 512 entries). Every address is checked.
fn transfer(window: &dyn Window, prp1: u64, prp2: u64, data: &mut [u8], direction: Direction) -> Result<(), u16> {
    let copy = |address: u64, chunk: &mut [u8]| -> Result<(), u16> {
        let done = match direction {
            Direction::FromMemory => window.read_bytes(address, chunk),
            Direction::ToMemory => window.write_bytes(address, chunk),
        };
        done.ok_or(status::DATA_TRANSFER_ERROR)
    };
    if !prp1.is_multiple_of(4) {
        return Err(status::PRP_OFFSET_INVALID | status::DO_NOT_RETRY);
    }
    let first = data.len().min((PAGE_BYTES - prp1 % PAGE_BYTES) as usize);
    let (head, mut rest) = data.split_at_mut(first);
    copy(prp1, head)?;
    if rest.is_empty() {
        return Ok(());
    }
    if !prp2.is_multiple_of(PAGE_BYTES) && rest.len() <= PAGE_BYTES as usize {
        return Err(status::PRP_OFFSET_INVALID | status::DO_NOT_RETRY);
    }
    if rest.len() <= PAGE_BYTES as usize {
        return copy(prp2, rest);
    }
    if !prp2.is_multiple_of(8) {
        return Err(status::PRP_OFFSET_INVALID | status::DO_NOT_RETRY);
    }
    let pages = rest.len().div_ceil(PAGE_BYTES as usize);
    if pages > (PAGE_BYTES / 8) as usize {
        return Err(status::INVALID_FIELD | status::DO_NOT_RETRY); // would need a chained list
    }
    for index in 0..pages {
        let mut entry = [0u8; 8];
        window.read_bytes(prp2 + 8 * index as u64, &mut entry).ok_or(status::DATA_TRANSFER_ERROR)?;
        let page = u64::from_le_bytes(entry);
        if !page.is_multiple_of(PAGE_BYTES) {
            return Err(status::PRP_OFFSET_INVALID | status::DO_NOT_RETRY);
        }
        let take = rest.len().min(PAGE_BYTES as usize);
        let (chunk, remaining) = rest.split_at_mut(take);
        copy(page, chunk)?;
        rest = remaining;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_write_sqe_and_success_cqe_match_the_fpga_md_examples() {
        let write = SubmissionEntry::read_write(opcode::WRITE, 5, 1, 0x1000, 8, true, (0x4_0001_0000, 0));
        let expected: [u8; 64] = [
            0x01, 0x00, 0x05, 0x00, 0x01, 0x00, 0x00, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, //
            0, 0, 0, 0, 0, 0, 0, 0, 0x00, 0x00, 0x01, 0x00, 0x04, 0x00, 0x00, 0x00, //
            0, 0, 0, 0, 0, 0, 0, 0, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, //
            0x07, 0x00, 0x00, 0x40, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        assert_eq!(write.encode(), expected);
        assert_eq!(SubmissionEntry::decode(&expected), Some(write));
        let success = CompletionEntry { dw0: 0, sq_head: 6, sq_id: 1, command_id: 5, phase: true, status: 0 };
        assert_eq!(success.encode(), [0, 0, 0, 0, 0, 0, 0, 0, 0x06, 0x00, 0x01, 0x00, 0x05, 0x00, 0x01, 0x00]);
        assert_eq!(CompletionEntry::decode(&success.encode()), success);
    }

    #[test]
    fn status_fields_sit_above_the_phase_tag_and_map_to_wire_statuses() {
        let failed =
            CompletionEntry { status: status::UNRECOVERED_READ_ERROR | status::DO_NOT_RETRY, ..Default::default() };
        let bytes = failed.encode();
        // SCT 2, SC 0x81 and DNR in DW3 bits 31:17.
        let dw3 = u32::from_le_bytes(bytes[12..16].try_into().unwrap());
        assert_eq!((dw3 >> 17) & 0xFF, 0x81);
        assert_eq!((dw3 >> 25) & 0x7, 2);
        assert_eq!(dw3 >> 31, 1);
        assert_eq!(wire_status(failed.status), Status::IoError);
        assert_eq!(wire_status(status::LBA_OUT_OF_RANGE | status::DO_NOT_RETRY), Status::OutOfRange);
        assert_eq!(wire_status(status::SUCCESS), Status::Ok);
        // Queue creation's statuses are command specific: SCT 1 in DW3 bits 27:25.
        for (code, sc) in [
            (status::COMPLETION_QUEUE_INVALID, 0x00),
            (status::INVALID_QUEUE_IDENTIFIER, 0x01),
            (status::INVALID_QUEUE_SIZE, 0x02),
            (status::INVALID_QUEUE_DELETION, 0x0C),
        ] {
            let bytes = CompletionEntry { status: code, ..Default::default() }.encode();
            let dw3 = u32::from_le_bytes(bytes[12..16].try_into().unwrap());
            assert_eq!(((dw3 >> 25) & 0x7, (dw3 >> 17) & 0xFF), (1, sc), "status {code:#05x}");
        }
    }

    #[test]
    fn fused_sgl_or_metadata_commands_are_refused() {
        let mut bytes = SubmissionEntry::read_write(opcode::READ, 1, 1, 0, 1, false, (0, 0)).encode();
        bytes[1] = 0x40; // PSDT = 1: SGL
        assert_eq!(SubmissionEntry::decode(&bytes), None);
        assert_eq!(SubmissionEntry::command_id_of(&bytes), 1);
    }
}
