//! The device side in software: fetches descriptors, executes memory instructions with the ISA's
//! reference semantics over the on-board memory in the window, posts completions with phase
//! tags. Runs as a thread ([`spawn`]) or as the `netdam-fpga-model` binary over a shared file.
//!
//! Each descriptor passes three stages (fetch, execute, complete), each delayed by
//! [`ModelConfig::stage_latency`]. [`Faults`] inject a device error, a stall or a reset at a
//! chosen descriptor, counted from power-on. Anything the host writes is checked: a bad
//! descriptor gets a status, a bad configuration or doorbell raises FATAL, nothing panics.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use netdam_isa::memory::SharedMemory;
use netdam_isa::semantics::{self, AddressSpaces};
use netdam_isa::wire::Instruction;
use netdam_isa::Status;

use crate::interrupt::InterruptLine;
use crate::nvme::{self, admin_opcode, opcode as nvme_opcode, QueuePair, SsdModel, SubmissionEntry};
use crate::registers::{self as reg, NamespaceEntry, RegionEntry};
use crate::window::Window;
use crate::{
    CompletionEntry, Descriptor, COMPLETION_BYTES, DESCRIPTOR_BYTES, RING_ENTRIES_MAX, RING_ENTRIES_MIN,
    SLOT_BYTES_MAX, SLOT_BYTES_MIN,
};
use netdam_isa::block::{self, BlockOp, NamespaceShape};
use netdam_isa::Opcode;

/// Faults to inject, each at the descriptor with this number (0 = the first fetched since
/// power-on), each once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    /// Complete this descriptor with `io_error` without executing it.
    pub error_at: Option<u64>,
    /// Stop fetching and completing before this descriptor, until a reset.
    pub stall_at: Option<u64>,
    /// Reset the device (GENERATION + 1) before fetching this descriptor.
    pub reset_at: Option<u64>,
    /// The SSD fails this NVMe command (0 = the first it takes) with a media error.
    pub media_error_at: Option<u64>,
    /// Ignore RESET: a device that keeps running (and stalled) whatever the host does.
    pub deaf_to_reset: bool,
}

/// The model's shape and behaviour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelConfig {
    /// Bytes of the host-memory area (rings and data slots).
    pub host_area_bytes: u64,
    /// Bytes of on-board memory.
    pub device_memory_bytes: u64,
    /// Delay of each pipeline stage (fetch, execute, complete).
    pub stage_latency: std::time::Duration,
    /// Faults to inject.
    pub faults: Faults,
    /// The SSD behind the NVMe controller, if any: a file served as NVMe namespace 1.
    pub namespace: Option<NamespaceBacking>,
    /// Keep polling the rings when idle, as a card's logic does, instead of napping after a
    /// short spin: the device then answers within its own polling pass, and takes a core.
    pub spin: bool,
}

/// A file the model's SSD serves as namespace [`SSD_NSID`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceBacking {
    /// The backing file (its length gives the capacity).
    pub path: std::path::PathBuf,
    /// Bytes per logical block (a power of two, 512 to 65536).
    pub block_bytes: u32,
}

/// Where the SSD's controller registers sit in its doorbell page.
const SSD_REGISTERS_IN_DOORBELL_PAGE: u64 = 0x800;

/// The namespace id of the model's SSD.
pub const SSD_NSID: u32 = 1;
/// Entries of the model's NVMe I/O queues.
const SSD_QUEUE_ENTRIES: u32 = 16;
/// Entries of the model's NVMe admin queues: bring-up runs one command at a time.
const SSD_ADMIN_QUEUE_ENTRIES: u32 = 4;
/// Bytes at the top of on-board memory the NVMe path keeps when an SSD is configured: I/O
/// submission queue, I/O completion queue, doorbells, PRP list, admin submission queue and admin
/// completion queue (a page each), then one transfer buffer (which also takes IDENTIFY data).
pub const NVME_AREA_BYTES: u64 = 6 * 4096 + SLOT_BYTES_MAX as u64;
const _: () = assert!(SSD_QUEUE_ENTRIES as usize * nvme::SUBMISSION_ENTRY_BYTES <= 4096, "I/O SQ in its page");
const _: () = assert!(SSD_ADMIN_QUEUE_ENTRIES as usize * nvme::SUBMISSION_ENTRY_BYTES <= 4096, "admin SQ in its page");
const _: () = assert!(SSD_QUEUE_ENTRIES <= nvme::IO_QUEUE_ENTRIES_MAX, "the SSD accepts the I/O queues");
const _: () = assert!(SLOT_BYTES_MAX as usize >= nvme::IDENTIFY_BYTES, "IDENTIFY data fits the transfer buffer");

impl Default for ModelConfig {
    fn default() -> ModelConfig {
        ModelConfig {
            host_area_bytes: 1 << 20,
            device_memory_bytes: 1 << 20,
            stage_latency: std::time::Duration::ZERO,
            faults: Faults::default(),
            namespace: None,
            spin: false,
        }
    }
}

impl ModelConfig {
    /// Window offset of the host area: right after the register block.
    pub fn host_area_offset(&self) -> u64 {
        reg::REGISTER_BLOCK_BYTES
    }

    /// Window offset of on-board memory: after the host area, page aligned.
    pub fn device_memory_offset(&self) -> u64 {
        (self.host_area_offset() + self.host_area_bytes).div_ceil(4096) * 4096
    }

    /// Bytes of on-board memory regions may use (below the NVMe area, if any).
    pub fn region_memory_bytes(&self) -> u64 {
        if self.namespace.is_some() {
            self.device_memory_bytes.saturating_sub(NVME_AREA_BYTES)
        } else {
            self.device_memory_bytes
        }
    }

    /// On-board memory offset of the NVMe area.
    pub fn nvme_area_offset(&self) -> u64 {
        self.region_memory_bytes()
    }

    /// Bytes the window file must have.
    pub fn window_bytes(&self) -> u64 {
        self.device_memory_offset() + self.device_memory_bytes.div_ceil(4096) * 4096
    }
}

/// Writes the read-only registers a device has at power-on. GENERATION goes last, with a release
/// store: a host that sees it non-zero sees the rest.
pub fn power_on(window: &dyn Window, config: &ModelConfig) {
    window.u32_at(reg::DEVICE_ID).store(crate::DEVICE_ID, Ordering::Relaxed);
    window.u32_at(reg::INTERFACE_VERSION).store(crate::INTERFACE_VERSION, Ordering::Relaxed);
    let capabilities = reg::CAPABILITY_MEMORY
        | reg::CAPABILITY_VADD
        | u64::from(RING_ENTRIES_MAX.trailing_zeros()) << reg::CAPABILITY_RING_ENTRIES_LOG2_SHIFT
        | u64::from(SLOT_BYTES_MAX.trailing_zeros()) << reg::CAPABILITY_SLOT_BYTES_LOG2_SHIFT;
    window.u64_at(reg::CAPABILITIES).store(capabilities, Ordering::Relaxed);
    window.u64_at(reg::HOST_AREA_OFFSET).store(config.host_area_offset(), Ordering::Relaxed);
    window.u64_at(reg::HOST_AREA_BYTES).store(config.host_area_bytes, Ordering::Relaxed);
    window.u64_at(reg::DEVICE_MEMORY_OFFSET).store(config.device_memory_offset(), Ordering::Relaxed);
    window.u64_at(reg::DEVICE_MEMORY_BYTES).store(config.device_memory_bytes, Ordering::Relaxed);
    if config.namespace.is_some() {
        window.u64_at(reg::CAPABILITIES).fetch_or(reg::CAPABILITY_NVME, Ordering::Relaxed);
        window.u32_at(reg::NVME_QUEUE_ENTRIES).store(SSD_QUEUE_ENTRIES, Ordering::Relaxed);
        window.u32_at(reg::NVME_MAX_TRANSFER_BYTES).store(SLOT_BYTES_MAX, Ordering::Relaxed);
        window.u64_at(reg::NVME_BOUNCE_OFFSET).store(config.nvme_area_offset(), Ordering::Relaxed);
        window.u64_at(reg::NVME_BOUNCE_BYTES).store(NVME_AREA_BYTES, Ordering::Relaxed);
        window.u32_at(reg::NVME_STATUS).store(reg::NVME_STATUS_UP, Ordering::Relaxed);
    }
    window.u32_at(reg::STATUS).store(0, Ordering::Relaxed);
    window.u32_at(reg::GENERATION).store(1, Ordering::Release);
}

/// What the device runs with between ENABLE and the next reset.
#[derive(Debug, Clone, Copy)]
struct Running {
    entries: u32,
    slot_bytes: u32,
    submission_base: u64,
    completion_base: u64,
    submission_head: u32,
    completion_tail: u32,
    regions: [Option<RegionEntry>; reg::REGION_TABLE_ENTRIES],
    namespaces: [Option<NamespaceEntry>; reg::NAMESPACE_TABLE_ENTRIES],
}

/// One queue pair as the FPGA's controller drives it: its SQ tail, CQ head and expected phase.
#[derive(Debug, Clone, Copy)]
struct HostQueue {
    pair: QueuePair,
    sq_tail: u32,
    cq_head: u32,
    phase: bool,
}

impl HostQueue {
    fn new(pair: QueuePair) -> HostQueue {
        HostQueue { pair, sq_tail: 0, cq_head: 0, phase: true }
    }
}

/// The FPGA's NVMe controller side: brings the SSD up through its admin queue, then drives one
/// I/O queue pair synchronously (one block instruction at a time; the pipeline waits for its
/// CQEs).
struct Controller {
    ssd: SsdModel,
    /// The SSD's controller registers (`CAP`, `CC`, `CSTS`, `AQA`, `ASQ`, `ACQ`).
    registers: u64,
    admin: HostQueue,
    io: HostQueue,
    next_command_id: u16,
    /// Bus address of the PRP-list page and of the transfer buffer.
    prp_list: u64,
    buffer: u64,
    block_bytes: u32,
    capacity_blocks: u64,
}

/// The device model over one window.
pub struct Model {
    window: Arc<dyn Window>,
    config: ModelConfig,
    running: Option<Running>,
    stalled: bool,
    /// Descriptors fetched since power-on (fault injection counts these).
    fetched: u64,
    operand: Vec<u8>,
    answer: Vec<u8>,
    controller: Option<Controller>,
    /// The completion interrupt, once a host or test has connected it.
    interrupts: Option<Arc<InterruptLine>>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model").field("running", &self.running).field("fetched", &self.fetched).finish_non_exhaustive()
    }
}

/// The on-board regions, as instruction semantics see them.
struct DeviceSpaces<'a> {
    window: &'a dyn Window,
    memory_offset: u64,
    regions: &'a [Option<RegionEntry>; reg::REGION_TABLE_ENTRIES],
}

impl AddressSpaces for DeviceSpaces<'_> {
    fn memory(&self, space: u16) -> Option<SharedMemory<'_>> {
        let region = self.regions.iter().flatten().find(|region| region.space == space)?;
        self.window.memory(self.memory_offset + region.offset, usize::try_from(region.bytes).ok()?)
    }
}

impl Model {
    /// A model over a window; opens the SSD's backing file if one is configured and brings the
    /// SSD up through its admin queue (IDENTIFY controller and namespace, CREATE I/O CQ and SQ),
    /// failing with a message naming the file if that does not succeed. [`spawn`] and the
    /// binary call [`power_on`] after it, so a host sees the NVMe path up only once it is.
    pub fn new(window: Arc<dyn Window>, config: ModelConfig) -> std::io::Result<Model> {
        let controller = match &config.namespace {
            None => None,
            Some(backing) => {
                let device =
                    netdam_nvme::UringDevice::open(&backing.path, backing.block_bytes, 4, SLOT_BYTES_MAX as usize)?;
                let geometry = netdam_nvme::BlockDevice::geometry(&device);
                let area = config.device_memory_offset() + config.nvme_area_offset();
                let doorbells = area + 2 * 4096;
                let admin = QueuePair {
                    sq_id: 0,
                    entries: SSD_ADMIN_QUEUE_ENTRIES,
                    sq_base: area + 4 * 4096,
                    cq_base: area + 5 * 4096,
                    doorbells,
                };
                let io = QueuePair {
                    sq_id: nvme::IO_QUEUE_ID,
                    entries: SSD_QUEUE_ENTRIES,
                    sq_base: area,
                    cq_base: area + 4096,
                    doorbells: doorbells + 8 * u64::from(nvme::IO_QUEUE_ID),
                };
                // The host zeroes a completion queue before handing it over, so that no stale
                // entry (from an earlier run over the same window file) carries the phase it
                // waits for. The SSD zeroes I/O queues it creates itself.
                let zeroes = [0u8; 4096];
                window.write_bytes(admin.cq_base, &zeroes).expect("NVMe area within the window");
                // The SSD's controller registers share the doorbells' page (a real SSD has them
                // at BAR0 0x0 and the doorbells at 0x1000).
                let registers = doorbells + SSD_REGISTERS_IN_DOORBELL_PAGE;
                let mut ssd = SsdModel::powered(Arc::clone(&window), registers, doorbells, Box::new(device));
                if let Some(number) = config.faults.media_error_at {
                    ssd.inject_media_error_at(number);
                }
                let mut controller = Controller {
                    ssd,
                    registers,
                    admin: HostQueue::new(admin),
                    io: HostQueue::new(io),
                    next_command_id: 0,
                    prp_list: area + 3 * 4096,
                    buffer: area + 6 * 4096,
                    block_bytes: 0,
                    capacity_blocks: 0,
                };
                controller.bring_up(&*window, &backing.path)?;
                // IDENTIFY must describe the file the SSD serves: a mismatch is a bug in the
                // SSD model, reported rather than served.
                if (controller.block_bytes, controller.capacity_blocks)
                    != (geometry.block_bytes, geometry.capacity_blocks)
                {
                    return Err(std::io::Error::other(format!(
                        "{}: IDENTIFY namespace reports {} blocks of {} bytes, the file holds {} of {}",
                        backing.path.display(),
                        controller.capacity_blocks,
                        controller.block_bytes,
                        geometry.capacity_blocks,
                        geometry.block_bytes
                    )));
                }
                Some(controller)
            }
        };
        Ok(Model {
            window,
            config,
            running: None,
            stalled: false,
            fetched: 0,
            operand: vec![0; SLOT_BYTES_MAX as usize],
            answer: vec![0; SLOT_BYTES_MAX as usize],
            controller,
            interrupts: None,
        })
    }

    /// Raises `line` for every completion posted while the host enables the completion
    /// interrupt (`INTERRUPT_MASK` bit 0), and says so in CAPABILITIES; call after
    /// [`power_on`] (which writes CAPABILITIES afresh).
    pub fn with_interrupts(mut self, line: Arc<InterruptLine>) -> Model {
        self.window.u64_at(reg::CAPABILITIES).fetch_or(reg::CAPABILITY_INTERRUPTS, Ordering::Release);
        self.interrupts = Some(line);
        self
    }

    fn register(&self, offset: u64) -> &std::sync::atomic::AtomicU32 {
        self.window.u32_at(offset)
    }

    fn fatal(&mut self, error_code: u32) {
        self.running = None;
        self.register(reg::ERROR_CODE).store(error_code, Ordering::Relaxed);
        self.register(reg::INTERRUPT_STATUS).fetch_or(0b10, Ordering::Relaxed);
        self.register(reg::STATUS).store(reg::STATUS_FATAL, Ordering::Release);
    }

    /// Drops everything in flight, disables, and bumps GENERATION. On-board memory is kept.
    fn reset(&mut self) {
        self.register(reg::STATUS).store(reg::STATUS_RESETTING, Ordering::Release);
        self.running = None;
        self.stalled = false;
        self.register(reg::CONTROL).store(0, Ordering::Relaxed);
        self.register(reg::RESET).store(0, Ordering::Relaxed);
        self.register(reg::ERROR_CODE).store(reg::ERROR_NONE, Ordering::Relaxed);
        self.register(reg::SUBMISSION_HEAD).store(0, Ordering::Relaxed);
        self.register(reg::COMPLETION_TAIL).store(0, Ordering::Relaxed);
        self.register(reg::GENERATION).fetch_add(1, Ordering::Release);
        self.register(reg::STATUS).store(0, Ordering::Release);
    }

    /// Reads and checks what the host programmed; FATAL if it is wrong.
    fn enable(&mut self) {
        let window = &*self.window;
        let entries = window.u32_at(reg::RING_ENTRIES).load(Ordering::Relaxed);
        let slot_bytes = window.u32_at(reg::SLOT_BYTES).load(Ordering::Relaxed);
        let submission_base = window.u64_at(reg::SUBMISSION_RING_BASE).load(Ordering::Relaxed);
        let completion_base = window.u64_at(reg::COMPLETION_RING_BASE).load(Ordering::Relaxed);
        let data_base = window.u64_at(reg::DATA_BASE).load(Ordering::Relaxed);
        let fits = |base: u64, bytes: u64, align: u64| {
            base.is_multiple_of(align) && base.checked_add(bytes).is_some_and(|end| end <= window.len() as u64)
        };
        let config_ok = entries.is_power_of_two()
            && (RING_ENTRIES_MIN..=RING_ENTRIES_MAX).contains(&entries)
            && slot_bytes.is_power_of_two()
            && (SLOT_BYTES_MIN..=SLOT_BYTES_MAX).contains(&slot_bytes)
            && fits(submission_base, u64::from(entries) * DESCRIPTOR_BYTES as u64, 64)
            && fits(completion_base, u64::from(entries) * COMPLETION_BYTES as u64, 16)
            && fits(data_base, u64::from(entries) * 2 * u64::from(slot_bytes), 64);
        if !config_ok {
            return self.fatal(reg::ERROR_BAD_CONFIG);
        }
        let mut regions = [None; reg::REGION_TABLE_ENTRIES];
        for (index, slot) in regions.iter_mut().enumerate() {
            let mut bytes = [0u8; reg::REGION_ENTRY_BYTES as usize];
            window
                .read_bytes(reg::REGION_TABLE + index as u64 * reg::REGION_ENTRY_BYTES, &mut bytes)
                .expect("region table in the register block");
            let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
            let reserved_zero = bytes[3..8].iter().chain(&bytes[24..32]).all(|&byte| byte == 0);
            match bytes[2] {
                0 if bytes.iter().all(|&byte| byte == 0) => {}
                reg::REGION_VALID if reserved_zero => {
                    let region = RegionEntry {
                        space: u16::from_le_bytes([bytes[0], bytes[1]]),
                        offset: u64_at(8),
                        bytes: u64_at(16),
                    };
                    let within = region
                        .offset
                        .checked_add(region.bytes)
                        .is_some_and(|end| end <= self.config.region_memory_bytes());
                    *slot = Some(region);
                    if !within || !region.offset.is_multiple_of(8) {
                        return self.fatal(reg::ERROR_BAD_REGION_TABLE);
                    }
                }
                _ => return self.fatal(reg::ERROR_BAD_REGION_TABLE),
            }
        }
        for (index, region) in regions.iter().enumerate() {
            let Some(region) = region else { continue };
            if regions[index + 1..].iter().flatten().any(|other| other.space == region.space) {
                return self.fatal(reg::ERROR_BAD_REGION_TABLE);
            }
        }
        let mut namespaces = [None; reg::NAMESPACE_TABLE_ENTRIES];
        for (index, slot) in namespaces.iter_mut().enumerate() {
            let mut bytes = [0u8; reg::NAMESPACE_ENTRY_BYTES as usize];
            let offset = reg::NAMESPACE_TABLE + index as u64 * reg::NAMESPACE_ENTRY_BYTES;
            window.read_bytes(offset, &mut bytes).expect("namespace table in the register block");
            if bytes.iter().all(|&byte| byte == 0) {
                continue;
            }
            let entry = NamespaceEntry {
                space: u16::from_le_bytes([bytes[0], bytes[1]]),
                lba_shift: bytes[3],
                nsid: u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes")),
                blocks: u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes")),
            };
            // Checked against what the SSD reports (IDENTIFY NAMESPACE in hardware).
            let matches_ssd = self.controller.as_ref().is_some_and(|controller| {
                entry.nsid == SSD_NSID
                    && u32::from(entry.lba_shift) == controller.block_bytes.trailing_zeros()
                    && entry.blocks <= controller.capacity_blocks
            });
            if bytes[2] != reg::NAMESPACE_VALID || !matches_ssd {
                return self.fatal(reg::ERROR_BAD_NAMESPACE_TABLE);
            }
            *slot = Some(entry);
        }
        for (index, namespace) in namespaces.iter().enumerate() {
            let Some(namespace) = namespace else { continue };
            if namespaces[index + 1..].iter().flatten().any(|other| other.space == namespace.space) {
                return self.fatal(reg::ERROR_BAD_NAMESPACE_TABLE);
            }
        }
        self.register(reg::SUBMISSION_HEAD).store(0, Ordering::Relaxed);
        self.register(reg::COMPLETION_TAIL).store(0, Ordering::Relaxed);
        self.running = Some(Running {
            entries,
            slot_bytes,
            submission_base,
            completion_base,
            submission_head: 0,
            completion_tail: 0,
            regions,
            namespaces,
        });
        self.register(reg::STATUS).store(reg::STATUS_READY, Ordering::Release);
    }

    fn delay(&self) {
        if !self.config.stage_latency.is_zero() {
            std::thread::sleep(self.config.stage_latency);
        }
    }

    /// One pass of the device loop: handles a reset or enable, then at most one descriptor.
    /// Returns whether it did anything.
    pub fn step(&mut self) -> bool {
        self.register(reg::HEARTBEAT).fetch_add(1, Ordering::Relaxed);
        if self.register(reg::RESET).load(Ordering::Acquire) == reg::RESET_MAGIC && !self.config.faults.deaf_to_reset {
            self.reset();
            return true;
        }
        let status = self.register(reg::STATUS).load(Ordering::Relaxed);
        if status & reg::STATUS_FATAL != 0 {
            return false;
        }
        let enabled = self.register(reg::CONTROL).load(Ordering::Acquire) & reg::CONTROL_ENABLE != 0;
        if !enabled {
            if self.running.take().is_some() {
                self.register(reg::STATUS).store(0, Ordering::Release);
            }
            return false;
        }
        let Some(mut running) = self.running else {
            self.enable();
            return true;
        };
        if self.stalled {
            return false;
        }
        let tail = self.register(reg::SUBMISSION_TAIL).load(Ordering::Acquire);
        let pending = tail.wrapping_sub(running.submission_head);
        if pending == 0 {
            return false;
        }
        if pending > running.entries {
            self.fatal(reg::ERROR_DOORBELL_OVERRUN);
            return true;
        }
        let completion_head = self.register(reg::COMPLETION_HEAD).load(Ordering::Acquire);
        if running.completion_tail.wrapping_sub(completion_head) >= running.entries {
            return false; // the host has not consumed: no room to post
        }
        let number = self.fetched;
        if self.config.faults.stall_at == Some(number) {
            self.config.faults.stall_at = None;
            self.stalled = true;
            return false;
        }
        if self.config.faults.reset_at == Some(number) {
            self.config.faults.reset_at = None;
            self.reset();
            return true;
        }

        // Fetch.
        let mask = running.entries - 1;
        let mut bytes = [0u8; DESCRIPTOR_BYTES];
        let entry = running.submission_base + u64::from(running.submission_head & mask) * DESCRIPTOR_BYTES as u64;
        self.window.read_bytes(entry, &mut bytes).expect("submission ring within the window (checked at enable)");
        self.fetched += 1;
        running.submission_head = running.submission_head.wrapping_add(1);
        self.register(reg::SUBMISSION_HEAD).store(running.submission_head, Ordering::Release);
        self.delay();

        // Execute.
        let descriptor = Descriptor::decode(&bytes);
        let tag = descriptor.map_or_else(|| u64::from_le_bytes(bytes[0..8].try_into().expect("8 bytes")), |d| d.tag);
        let (status, answer_len) = match descriptor {
            None => (Status::Malformed, 0),
            Some(_) if self.config.faults.error_at == Some(number) => {
                self.config.faults.error_at = None;
                (Status::IoError, 0)
            }
            Some(descriptor) => self.execute(&running, &descriptor),
        };
        self.delay();

        // Complete: answer bytes and tag first, then the status word with its phase tag.
        let completion = CompletionEntry {
            tag,
            answer_len: answer_len as u32,
            status: status as u8,
            flags: if crate::phase_for(running.completion_tail, running.entries) {
                crate::COMPLETION_FLAG_PHASE
            } else {
                0
            },
            submission_head: running.submission_head as u16,
        };
        let entry = running.completion_base + u64::from(running.completion_tail & mask) * COMPLETION_BYTES as u64;
        self.window.u64_at(entry).store(tag, Ordering::Relaxed);
        self.window.u64_at(entry + 8).store(completion.status_word(), Ordering::Release);
        running.completion_tail = running.completion_tail.wrapping_add(1);
        self.register(reg::COMPLETION_TAIL).store(running.completion_tail, Ordering::Release);
        self.register(reg::INTERRUPT_STATUS).fetch_or(0b01, Ordering::Release);
        if let Some(line) = &self.interrupts {
            // The completion's store, then the mask's load; the host arms the mask, then polls
            // the ring (FPGA.md §6). Sequentially consistent on both sides, so that either the
            // host sees the completion or this sees the mask: never neither.
            std::sync::atomic::fence(Ordering::SeqCst);
            if self.register(reg::INTERRUPT_MASK).load(Ordering::SeqCst) & 1 != 0 {
                line.raise();
            }
        }
        self.running = Some(running);
        self.delay();
        true
    }

    /// Executes one descriptor; the answer is in the window when this returns `ok`.
    fn execute(&mut self, running: &Running, descriptor: &Descriptor) -> (Status, usize) {
        let operand_len = descriptor.operand_len as usize;
        let capacity = descriptor.answer_capacity as usize;
        if operand_len > running.slot_bytes as usize || capacity > running.slot_bytes as usize {
            return (Status::TooLarge, 0);
        }
        if self.window.read_bytes(descriptor.operand_address, &mut self.operand[..operand_len]).is_none()
            || self.window.pointer(descriptor.answer_address, capacity).is_none()
        {
            return (Status::Malformed, 0);
        }
        let instruction = Instruction {
            opcode: descriptor.opcode,
            flags: descriptor.flags,
            space: descriptor.space,
            offset: descriptor.offset,
            length: descriptor.length,
            aux: descriptor.aux,
            operand: &self.operand[..operand_len],
        };
        if Opcode::from_u8(instruction.opcode).is_some_and(Opcode::is_block) {
            let Some(namespace) =
                running.namespaces.iter().flatten().find(|namespace| namespace.space == instruction.space)
            else {
                return (Status::NoSuchSpace, 0);
            };
            let Some(controller) = self.controller.as_mut() else {
                return (Status::NoSuchSpace, 0); // unreachable: enable refuses namespaces without an SSD
            };
            return controller.execute(&*self.window, &instruction, namespace, descriptor, &mut self.answer);
        }
        let spaces = DeviceSpaces {
            window: &*self.window,
            memory_offset: self.config.device_memory_offset(),
            regions: &running.regions,
        };
        match semantics::execute(&instruction, &spaces, &mut self.answer[..capacity]) {
            Ok(outcome) => {
                let answer = &self.answer[..outcome.data_len];
                self.window.write_bytes(descriptor.answer_address, answer).expect("answer area checked above");
                (Status::Ok, outcome.data_len)
            }
            Err(status) => (status, 0),
        }
    }

    /// Runs the device loop until `stop` is set, spinning briefly when idle, then napping so an
    /// idle model does not take a core from the host it serves (unless `spin` is configured:
    /// a nap of 50 µs is what a request arriving at an idle model waits, which hides the cost
    /// of the ring crossing itself).
    pub fn run(&mut self, stop: &AtomicBool) {
        let mut idle_passes = 0u32;
        while !stop.load(Ordering::Relaxed) {
            if self.step() {
                idle_passes = 0;
            } else {
                idle_passes = idle_passes.saturating_add(1);
                if idle_passes > 64 && !self.config.spin {
                    std::thread::sleep(std::time::Duration::from_micros(50));
                } else {
                    std::hint::spin_loop();
                }
            }
        }
    }
}

/// A model running on its own thread; stops (and joins) when dropped.
#[derive(Debug)]
pub struct ModelThread {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

/// Powers the window on and runs a model over it on a new thread; fails if the SSD's backing
/// file cannot be opened.
pub fn spawn(window: Arc<dyn Window>, config: ModelConfig) -> std::io::Result<ModelThread> {
    spawn_with(window, config, None)
}

/// [`spawn`], raising `interrupts` (if given) for completions while the host enables them.
pub fn spawn_with(
    window: Arc<dyn Window>,
    config: ModelConfig,
    interrupts: Option<Arc<InterruptLine>>,
) -> std::io::Result<ModelThread> {
    let mut model = Model::new(Arc::clone(&window), config.clone())?;
    power_on(&*window, &config);
    if let Some(line) = interrupts {
        model = model.with_interrupts(line);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let thread_stop = Arc::clone(&stop);
    let handle = std::thread::Builder::new().name("netdam-fpga-model".into()).spawn(move || model.run(&thread_stop))?;
    Ok(ModelThread { stop, handle: Some(handle) })
}

impl Drop for ModelThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

impl Controller {
    /// Executes one block instruction through the SSD: the checks of the software path
    /// (`netdam_isa::block::decode`), then SQEs whose data pointers name the transfer buffer in
    /// on-board memory, then the CQEs. A BREAD's blocks go from the buffer to the answer address.
    fn execute(
        &mut self,
        window: &dyn Window,
        instruction: &Instruction<'_>,
        namespace: &NamespaceEntry,
        descriptor: &Descriptor,
        scratch: &mut [u8],
    ) -> (Status, usize) {
        let block_bytes = 1u32 << namespace.lba_shift;
        let shape = NamespaceShape {
            block_bytes,
            capacity_blocks: namespace.blocks,
            max_transfer_blocks: SLOT_BYTES_MAX / block_bytes,
        };
        let op = match block::decode(instruction, &shape, descriptor.answer_capacity as usize) {
            Ok(op) => op,
            Err(status) => return (status, 0),
        };
        let nsid = namespace.nsid;
        let status = match op {
            BlockOp::Read { offset_blocks, num_blocks } => {
                let prps = self.prps(window, num_blocks as usize * block_bytes as usize);
                let entry = self.entry(nvme_opcode::READ, nsid, offset_blocks, num_blocks, false, prps);
                let status = self.run(window, &entry);
                if status == Status::Ok {
                    let bytes = num_blocks as usize * block_bytes as usize;
                    let data = &mut scratch[..bytes];
                    window.read_bytes(self.buffer, data).expect("transfer buffer in the window");
                    if window.write_bytes(descriptor.answer_address, data).is_none() {
                        return (Status::Malformed, 0);
                    }
                    return (Status::Ok, bytes);
                }
                status
            }
            BlockOp::Write { offset_blocks, data, fua } => {
                window.write_bytes(self.buffer, data).expect("transfer buffer in the window");
                let prps = self.prps(window, data.len());
                let blocks = (data.len() / block_bytes as usize) as u32;
                let entry = self.entry(nvme_opcode::WRITE, nsid, offset_blocks, blocks, fua, prps);
                self.run(window, &entry)
            }
            BlockOp::Flush => {
                let entry = SubmissionEntry { opcode: nvme_opcode::FLUSH, nsid, ..SubmissionEntry::default() };
                self.run(window, &entry)
            }
            BlockOp::Trim { offset_blocks, num_blocks } => {
                let mut range = [0u8; nvme::DSM_RANGE_BYTES];
                range[4..8].copy_from_slice(&num_blocks.to_le_bytes());
                range[8..16].copy_from_slice(&offset_blocks.to_le_bytes());
                window.write_bytes(self.prp_list, &range).expect("PRP page in the window");
                let entry = SubmissionEntry {
                    opcode: nvme_opcode::DATASET_MANAGEMENT,
                    nsid,
                    prp1: self.prp_list,
                    cdw: [0, 1 << 2, 0, 0, 0, 0],
                    ..SubmissionEntry::default()
                };
                self.run(window, &entry)
            }
            BlockOp::WriteZeroes { offset_blocks, num_blocks } => {
                // NLB is 16 bits: one command per 65536 blocks.
                let mut done = 0u32;
                let mut status = Status::Ok;
                while done < num_blocks && status == Status::Ok {
                    let blocks = (num_blocks - done).min(65536);
                    let entry = self.entry(
                        nvme_opcode::WRITE_ZEROES,
                        nsid,
                        offset_blocks + u64::from(done),
                        blocks,
                        false,
                        (0, 0),
                    );
                    status = self.run(window, &entry);
                    done += blocks;
                }
                status
            }
            BlockOp::Status { .. } => Status::NotSupported,
        };
        (status, 0)
    }

    /// The NVMe 1.4 bring-up (FPGA.md §9.1): the controller registers (steps 1 to 4), then
    /// IDENTIFY controller (the transfer limit must cover one transfer buffer), IDENTIFY
    /// namespace 1 (block size and capacity), then the I/O completion and submission queues.
    fn bring_up(&mut self, window: &dyn Window, path: &std::path::Path) -> std::io::Result<()> {
        let failed = |what: &str, detail: String| {
            std::io::Error::other(format!("{}: NVMe bring-up of the model's SSD: {what} {detail}", path.display()))
        };
        let identify = |model: &mut Controller, nsid: u32, cns: u8| {
            let entry = SubmissionEntry::identify(model.next_id(), nsid, cns, model.buffer);
            model.admin_command(window, &entry)
        };
        let admin_status = |status: u16| format!("failed with NVMe status {status:#05x}");

        // §9.1 steps 1 to 4: CAP, disable, the admin queues, enable.
        let registers = self.registers;
        let register = |offset: u64| registers + offset;
        let cap = window.u64_at(register(nvme::register::CAP)).load(Ordering::Acquire);
        let max_queue_entries = (cap & 0xFFFF) as u32 + 1;
        let ready_within =
            std::time::Duration::from_millis(500 * ((cap >> nvme::register::CAP_TO_SHIFT) & 0xFF).max(1));
        if cap & nvme::register::CAP_CSS_NVM == 0 || (cap >> 48) & 0xF != 0 || (cap >> 32) & 0xF != 0 {
            return Err(failed(
                "CAP",
                format!("{cap:#x}: no NVM command set, or no 4 KiB pages, or a doorbell stride"),
            ));
        }
        if self.admin.pair.entries > max_queue_entries || self.io.pair.entries > max_queue_entries {
            return Err(failed("CAP", format!("MQES allows {max_queue_entries} entries per queue")));
        }
        window.u32_at(register(nvme::register::CC)).store(0, Ordering::Release);
        self.wait_ready(window, false, ready_within).map_err(|why| failed("disable", why))?;
        let entries = self.admin.pair.entries - 1;
        window.u32_at(register(nvme::register::AQA)).store(entries << 16 | entries, Ordering::Relaxed);
        window.u64_at(register(nvme::register::ASQ)).store(self.admin.pair.sq_base, Ordering::Relaxed);
        window.u64_at(register(nvme::register::ACQ)).store(self.admin.pair.cq_base, Ordering::Relaxed);
        window.u32_at(register(nvme::register::CC)).store(nvme::register::CC_ENABLE, Ordering::Release);
        self.wait_ready(window, true, ready_within).map_err(|why| failed("enable", why))?;

        let status = identify(self, 0, nvme::cns::CONTROLLER);
        if status != nvme::status::SUCCESS {
            return Err(failed("IDENTIFY controller", admin_status(status)));
        }
        let mut data = [0u8; nvme::IDENTIFY_BYTES];
        window.read_bytes(self.buffer, &mut data).expect("transfer buffer in the window");
        let mdts = data[77];
        // MDTS 0 is "no limit"; otherwise 2^MDTS pages of CAP.MPSMIN (4 KiB, CC.MPS = 0).
        let max_transfer_bytes =
            if mdts == 0 { u64::MAX } else { nvme::PAGE_BYTES.checked_shl(mdts.into()).unwrap_or(u64::MAX) };
        if max_transfer_bytes < u64::from(SLOT_BYTES_MAX) {
            return Err(failed(
                "IDENTIFY controller",
                format!("reports MDTS {mdts}, below one {SLOT_BYTES_MAX}-byte transfer"),
            ));
        }

        let status = identify(self, SSD_NSID, nvme::cns::NAMESPACE);
        if status != nvme::status::SUCCESS {
            return Err(failed("IDENTIFY namespace 1", admin_status(status)));
        }
        window.read_bytes(self.buffer, &mut data).expect("transfer buffer in the window");
        let nsze = u64::from_le_bytes(data[0..8].try_into().expect("8 bytes"));
        let format = usize::from(data[26] & 0x0F); // FLBAS bits 3:0
        let lba_format = u32::from_le_bytes(data[128 + 4 * format..132 + 4 * format].try_into().expect("4 bytes"));
        let lba_data_size_log2 = (lba_format >> 16) & 0xFF;
        if !(9..=16).contains(&lba_data_size_log2) {
            return Err(failed("IDENTIFY namespace 1", format!("reports LBADS {lba_data_size_log2}, not 9 to 16")));
        }
        self.block_bytes = 1 << lba_data_size_log2;
        self.capacity_blocks = nsze;

        let create = |model: &mut Controller, opcode: u8, base: u64, cdw11: u32| {
            let entry = SubmissionEntry::create_io_queue(
                opcode,
                model.next_id(),
                nvme::IO_QUEUE_ID,
                SSD_QUEUE_ENTRIES,
                base,
                cdw11,
            );
            model.admin_command(window, &entry)
        };
        // PC = 1, IEN = 0: contiguous, polled.
        let status = create(self, admin_opcode::CREATE_IO_COMPLETION_QUEUE, self.io.pair.cq_base, 1);
        if status != nvme::status::SUCCESS {
            return Err(failed("CREATE I/O COMPLETION QUEUE", admin_status(status)));
        }
        // CQID << 16 | PC.
        let cdw11 = u32::from(nvme::IO_QUEUE_ID) << 16 | 1;
        let status = create(self, admin_opcode::CREATE_IO_SUBMISSION_QUEUE, self.io.pair.sq_base, cdw11);
        if status != nvme::status::SUCCESS {
            return Err(failed("CREATE I/O SUBMISSION QUEUE", admin_status(status)));
        }
        Ok(())
    }

    fn next_id(&mut self) -> u16 {
        let command_id = self.next_command_id;
        self.next_command_id = self.next_command_id.wrapping_add(1);
        command_id
    }

    /// Runs the SSD until `CSTS.RDY` is `ready`, or `CSTS.CFS` (fatal), or `within` passes.
    fn wait_ready(&mut self, window: &dyn Window, ready: bool, within: std::time::Duration) -> Result<(), String> {
        let csts = window.u32_at(self.registers + nvme::register::CSTS);
        let started = std::time::Instant::now();
        loop {
            let status = csts.load(Ordering::Acquire);
            if status & nvme::register::CSTS_CFS != 0 {
                return Err(format!("CSTS {status:#x}: controller fatal status"));
            }
            if (status & nvme::register::CSTS_RDY != 0) == ready {
                return Ok(());
            }
            if started.elapsed() > within {
                return Err(format!("CSTS.RDY did not become {} within {within:?} (CAP.TO)", u8::from(ready)));
            }
            if !self.ssd.step() {
                std::thread::sleep(std::time::Duration::from_micros(10));
            }
        }
    }

    /// Runs one admin command; its NVMe status field (`INTERNAL_ERROR` if the completion is not
    /// the command's, which with one command at a time would be an SSD bug).
    fn admin_command(&mut self, window: &dyn Window, entry: &SubmissionEntry) -> u16 {
        let mut queue = self.admin;
        let completion = wait_for(&mut self.ssd, window, &mut queue, entry);
        self.admin = queue;
        if completion.command_id != entry.command_id {
            return nvme::status::INTERNAL_ERROR;
        }
        completion.status
    }

    fn entry(&mut self, opcode: u8, nsid: u32, slba: u64, blocks: u32, fua: bool, prps: (u64, u64)) -> SubmissionEntry {
        let command_id = self.next_id();
        SubmissionEntry::read_write(opcode, command_id, nsid, slba, blocks, fua, prps)
    }

    /// PRP1 and PRP2 for `bytes` of the transfer buffer, writing a PRP list when it spans more
    /// than two pages.
    fn prps(&self, window: &dyn Window, bytes: usize) -> (u64, u64) {
        let pages = bytes.div_ceil(nvme::PAGE_BYTES as usize) as u64;
        match pages {
            0 | 1 => (self.buffer, 0),
            2 => (self.buffer, self.buffer + nvme::PAGE_BYTES),
            _ => {
                for page in 1..pages {
                    let address = self.buffer + page * nvme::PAGE_BYTES;
                    window
                        .write_bytes(self.prp_list + 8 * (page - 1), &address.to_le_bytes())
                        .expect("PRP page in the window");
                }
                (self.buffer, self.prp_list)
            }
        }
    }

    /// Submits one I/O SQE, runs the SSD until its CQE arrives, returns its status as the wire's.
    fn run(&mut self, window: &dyn Window, entry: &SubmissionEntry) -> Status {
        let mut queue = self.io;
        let completion = wait_for(&mut self.ssd, window, &mut queue, entry);
        self.io = queue;
        if completion.command_id != entry.command_id {
            return Status::IoError; // one command at a time: anything else is an SSD bug
        }
        if completion.status != nvme::status::SUCCESS {
            window.u32_at(reg::NVME_LAST_STATUS).store(u32::from(completion.status), Ordering::Relaxed);
        }
        nvme::wire_status(completion.status)
    }
}

/// Submits `entry` on `queue`, runs the SSD until a CQE arrives there and consumes it.
fn wait_for(
    ssd: &mut SsdModel,
    window: &dyn Window,
    queue: &mut HostQueue,
    entry: &SubmissionEntry,
) -> nvme::CompletionEntry {
    let pair = queue.pair;
    let at = pair.sq_base + u64::from(queue.sq_tail) * nvme::SUBMISSION_ENTRY_BYTES as u64;
    window.write_bytes(at, &entry.encode()).expect("submission queue in the window");
    queue.sq_tail = (queue.sq_tail + 1) % pair.entries;
    window.u32_at(pair.doorbells).store(queue.sq_tail, Ordering::Release);
    let at = pair.cq_base + u64::from(queue.cq_head) * nvme::COMPLETION_ENTRY_BYTES as u64;
    loop {
        let second_half = window.u64_at(at + 8).load(Ordering::Acquire);
        let phase = (second_half >> 48) & 1 != 0;
        if phase == queue.phase {
            let mut bytes = [0u8; nvme::COMPLETION_ENTRY_BYTES];
            window.read_bytes(at, &mut bytes).expect("completion queue in the window");
            queue.cq_head = (queue.cq_head + 1) % pair.entries;
            if queue.cq_head == 0 {
                queue.phase = !queue.phase;
            }
            window.u32_at(pair.doorbells + 4).store(queue.cq_head, Ordering::Release);
            return nvme::CompletionEntry::decode(&bytes);
        }
        if !ssd.step() {
            std::thread::sleep(std::time::Duration::from_micros(10));
        }
    }
}
