//! The FPGA engine: executes instructions on regions placed in the device's on-board memory
//! through the host driver (`netdam_fpga::driver`), the rest on the CPU, and fails over to the
//! CPU for good when the device fails (docs/FPGA.md §10).
//!
//! Placement: at attach, every volatile (`mem`) region that fits is given a range of on-board
//! memory, in region order, up to the device's 16 region-table entries; its host copy is
//! written into that range first, so both engines start from the same bytes. Persistent regions
//! stay on the host (on-board memory is DRAM). A `file` namespace named by `fpga_namespace` is
//! placed on the device's NVMe SSD, which serves the same file (the model's `--namespace`): its
//! block instructions go to the device's controller (FPGA.md §9.5), each submitted and reaped
//! like a memory instruction, and to the target's own file after a failover.
//!
//! One instruction at a time: `execute` submits the instruction, then polls its completion (the
//! device answers in microseconds) and returns, so the worker loop is held for that instruction
//! only, and a device that makes no progress for `fpga_progress_deadline_ms` is declared wedged. The
//! device has one ring pair; the workers of a target share it under a mutex, uncontended with
//! one worker. A full ring (possible only if a device keeps slots past their completion) is
//! answered `busy`.
//!
//! Failover: a wedged device, a reset (GENERATION changed or READY cleared), FATAL or a protocol
//! violation makes the engine log one line, reset the device (so that nothing still queued on it
//! executes later), copy every placed region's bytes from on-board memory back to its host copy,
//! and execute everything on the CPU from then on. Every instruction the device completed is in
//! those bytes. The one instruction in flight at the failure (whose completion was never seen) is
//! answered as FPGA.md §7.2 says: executed again on the CPU when it is idempotent (READ, WRITE,
//! FILL, CRC32, a MEMCPY whose ranges do not overlap), else answered `io_error`, which an
//! initiator must treat as an unknown outcome (the session's replay window then answers its
//! retransmissions with the same `io_error`, never a second execution).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use netdam_fpga::driver::{Driver, DriverConfig, DriverError, SubmitError};
use netdam_fpga::interrupt::InterruptLink;
use netdam_fpga::registers::{self as reg, NamespaceEntry, RegionEntry};
use netdam_fpga::window::Window;
use netdam_fpga::SLOT_BYTES_MAX;
use netdam_isa::engine::Engine;
use netdam_isa::limits::{MAX_NAMESPACES, MAX_REGIONS};
use netdam_isa::memory::SharedMemory;
use netdam_isa::semantics::AddressSpaces;
use netdam_isa::time::MonotonicClock;
use netdam_isa::wire::Instruction;
use netdam_isa::{Duration, Opcode, Status};
use netdam_pmem::{Backing, Durability};

use crate::engine::SoftwareEngine;
use crate::regions::RegionTable;

// A placed region, or namespace, is one bit of a u64.
const _: () = assert!(MAX_REGIONS <= 64 && MAX_NAMESPACES <= 64);

/// Which engine executes instructions now, shared by the engine, the dispatchers (STAT, HELLO)
/// and `/metrics`.
#[derive(Debug, Default)]
pub struct EngineState {
    /// The engine selected at start-up is the FPGA engine.
    selected_fpga: bool,
    /// Regions whose instructions the device executes now (bit = region id); 0 after failover.
    on_device: AtomicU64,
    /// Namespaces whose block instructions the device's NVMe serves now (bit = namespace id).
    namespaces_on_device: AtomicU64,
    /// Namespaces answered `io_error` until a restart: the device failed without quiescing and
    /// still runs, so it may yet write their file (bit = namespace id).
    namespaces_fenced: AtomicU64,
    /// Block instructions the device has answered.
    device_block_instructions: AtomicU64,
    /// The device is in use (cleared by failover, for good).
    fpga: AtomicBool,
    /// Failovers to software since start-up (0 or 1).
    failovers: AtomicU64,
    /// Workers sleep on the device's completion interrupt through slow answers.
    sleeps_on_interrupt: bool,
}

impl EngineState {
    /// The state of a target that executes on the CPU only.
    pub fn software() -> EngineState {
        EngineState::default()
    }

    /// Whether the FPGA engine was selected at start-up (it may have failed over since).
    pub fn selected_fpga(&self) -> bool {
        self.selected_fpga
    }

    /// Whether instructions execute on the FPGA now.
    pub fn on_fpga(&self) -> bool {
        self.fpga.load(Ordering::Acquire)
    }

    /// Whether region `space` lives in the device's memory now.
    pub fn region_on_device(&self, space: u16) -> bool {
        usize::from(space) < MAX_REGIONS && self.on_device.load(Ordering::Acquire) & (1 << space) != 0
    }

    /// Whether namespace `space` is served by the device's NVMe now.
    pub fn namespace_on_device(&self, space: u16) -> bool {
        usize::from(space) < MAX_NAMESPACES && self.namespaces_on_device.load(Ordering::Acquire) & (1 << space) != 0
    }

    /// Whether workers sleep on the device's completion interrupt through slow answers (the
    /// device raises one, and the workers do not busy-poll).
    pub fn sleeps_on_interrupt(&self) -> bool {
        self.sleeps_on_interrupt
    }

    /// Whether namespace `space` is fenced: answered `io_error`, since a device that failed
    /// without quiescing may still write its file.
    pub fn namespace_fenced(&self, space: u16) -> bool {
        usize::from(space) < MAX_NAMESPACES && self.namespaces_fenced.load(Ordering::Acquire) & (1 << space) != 0
    }

    /// Block instructions the device has answered since start-up.
    pub fn device_block_instructions(&self) -> u64 {
        self.device_block_instructions.load(Ordering::Relaxed)
    }

    /// Failovers to software since start-up.
    pub fn failovers(&self) -> u64 {
        self.failovers.load(Ordering::Relaxed)
    }

    /// Name of the engine executing now, for logs and metrics.
    pub fn name(&self) -> &'static str {
        if self.on_fpga() {
            "fpga"
        } else {
            "software"
        }
    }
}

/// How the engine drives the device.
#[derive(Debug, Clone, Copy)]
pub struct FpgaSettings {
    /// Entries of each ring.
    pub ring_entries: u32,
    /// Instructions in flight and no progress for this long: the device is wedged.
    pub progress_deadline: Duration,
    /// Bound on the start-up wait for the device to become ready.
    pub attach_timeout: std::time::Duration,
    /// Bound on the wait for the reset that quiesces a failed device before its memory is
    /// copied back (a dead device never answers it).
    pub reset_timeout: std::time::Duration,
    /// With a completion interrupt, how long a worker spins for an answer before it arms the
    /// interrupt and sleeps on it (`None`: it always spins, as a busy-polling worker does).
    pub sleep_after: Option<std::time::Duration>,
}

impl Default for FpgaSettings {
    fn default() -> FpgaSettings {
        FpgaSettings {
            // One instruction in flight per worker; the rest of the ring is headroom.
            ring_entries: 16,
            // Far above a healthy device's microseconds, far below an initiator's give-up time;
            // a worker is held this long once, when its device dies (`fpga_progress_deadline_ms`).
            progress_deadline: Duration::from_millis(1_000),
            attach_timeout: std::time::Duration::from_secs(10),
            reset_timeout: std::time::Duration::from_millis(100),
            sleep_after: None,
        }
    }
}

/// A namespace of the target that the device's NVMe SSD holds, as the target numbers and
/// shapes it (the device checks the shape against its SSD at attach).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceNamespace {
    /// The target's namespace id (the `space` of its block instructions).
    pub space: u16,
    /// Its block size, a power of two.
    pub block_bytes: u32,
    /// Its capacity in blocks.
    pub blocks: u64,
}

/// The longest one sleep on the completion interrupt lasts before the driver checks its
/// progress deadline again.
const INTERRUPT_WAIT_SLICE: std::time::Duration = std::time::Duration::from_millis(1);

/// Why the FPGA engine could not start.
#[derive(Debug, thiserror::Error)]
pub enum FpgaError {
    /// The driver refused the device or its configuration.
    #[error("{0}")]
    Driver(#[from] DriverError),
}

/// Where each placed region lives in on-board memory: `(offset, bytes)` by region id.
type Placement = [Option<(u64, u64)>; MAX_REGIONS];

/// The device and what is placed on it, shared by every worker's engine.
struct Device {
    state: Arc<EngineState>,
    window: Arc<dyn Window>,
    /// Window offset of on-board memory.
    memory_offset: u64,
    placement: Placement,
    slot_bytes: u32,
    reset_timeout: std::time::Duration,
    /// `None` once failed over.
    driver: Mutex<Option<Driver>>,
    /// The completion interrupt, when the device raises one.
    interrupt: Option<InterruptLink>,
    sleep_after: Option<std::time::Duration>,
    /// Times a worker slept on the interrupt waiting for an answer, and times the interrupt
    /// woke it (rather than the slice ending).
    interrupt_waits: AtomicU64,
    interrupt_wakeups: AtomicU64,
}

impl Device {
    /// The driver, under the device lock; `None` once failed over. A worker that panicked with
    /// the lock held left the driver as it was; it is still consistent (its state changes are
    /// single assignments).
    fn lock_driver(&self) -> std::sync::MutexGuard<'_, Option<Driver>> {
        self.driver.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Host regions and the device's placed ones, as instruction semantics see them: what a
/// MEMCPY between a host region and a device region is executed over (by the CPU, through the
/// window, under the device lock).
struct MixedSpaces<'a> {
    regions: &'a RegionTable,
    device: &'a Device,
}

impl AddressSpaces for MixedSpaces<'_> {
    fn memory(&self, space: u16) -> Option<SharedMemory<'_>> {
        match self.device.placement.get(usize::from(space)).copied().flatten() {
            Some((offset, bytes)) => self.device.window.memory(self.device.memory_offset + offset, bytes as usize),
            None => self.regions.get(space).map(netdam_pmem::Region::memory),
        }
    }
}

/// Executes on the FPGA what is placed there, and everything on the CPU after a failover.
#[derive(Clone)]
pub struct FpgaEngine {
    software: SoftwareEngine,
    device: Arc<Device>,
    clock: MonotonicClock,
}

impl std::fmt::Debug for FpgaEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FpgaEngine").field("state", &self.device.state).finish_non_exhaustive()
    }
}

fn align_up(value: u64, to: u64) -> u64 {
    value.div_ceil(to) * to
}

impl FpgaEngine {
    /// Places the volatile regions of `regions` that fit in the device's memory, attaches the
    /// driver to the device in `window`, copies those regions' bytes to the device, and returns
    /// the engine with the state it reports through.
    pub fn attach(
        window: Arc<dyn Window>,
        regions: Arc<RegionTable>,
        namespaces: &[DeviceNamespace],
        interrupt: Option<InterruptLink>,
        settings: FpgaSettings,
    ) -> Result<(FpgaEngine, Arc<EngineState>), FpgaError> {
        let found = window.u32_at(reg::DEVICE_ID).load(Ordering::Acquire);
        if found != netdam_fpga::DEVICE_ID {
            return Err(DriverError::NotADevice { found }.into());
        }
        let memory_offset = window.u64_at(reg::DEVICE_MEMORY_OFFSET).load(Ordering::Relaxed);
        let memory_bytes = window.u64_at(reg::DEVICE_MEMORY_BYTES).load(Ordering::Relaxed);
        let capabilities = window.u64_at(reg::CAPABILITIES).load(Ordering::Relaxed);
        // Regions stay below the NVMe area (FPGA.md §9.2).
        let usable = if capabilities & reg::CAPABILITY_NVME != 0 {
            window.u64_at(reg::NVME_BOUNCE_OFFSET).load(Ordering::Relaxed).min(memory_bytes)
        } else {
            memory_bytes
        };
        let usable = usable.min((window.len() as u64).saturating_sub(memory_offset));
        let mut placement: Placement = [None; MAX_REGIONS];
        let mut entries = Vec::new();
        let mut next = 0u64;
        for (id, region) in regions.iter() {
            let bytes = region.len() as u64;
            let volatile =
                region.durability() == Durability::Volatile && matches!(region.backing(), Backing::Anonymous);
            if !volatile || entries.len() == reg::REGION_TABLE_ENTRIES || next + bytes > usable {
                let reason = if !volatile {
                    "persistent: on-board memory is volatile"
                } else if entries.len() == reg::REGION_TABLE_ENTRIES {
                    "the device's region table is full"
                } else {
                    "it does not fit in the rest of on-board memory"
                };
                tracing::info!(region = region.name(), reason, "region stays in host memory");
                continue;
            }
            placement[usize::from(id)] = Some((next, bytes));
            entries.push(RegionEntry { space: id, offset: next, bytes });
            next = align_up(next + bytes, 4096);
        }
        let mut namespace_entries = Vec::new();
        for namespace in namespaces {
            if capabilities & reg::CAPABILITY_NVME == 0 {
                tracing::warn!(
                    namespace = namespace.space,
                    "fpga_namespace: the device has no NVMe controller; the namespace is served from the target's file"
                );
                continue;
            }
            namespace_entries.push(NamespaceEntry {
                space: namespace.space,
                lba_shift: namespace.block_bytes.trailing_zeros() as u8,
                nsid: netdam_fpga::model::SSD_NSID,
                blocks: namespace.blocks,
            });
        }
        let slot_bytes = SLOT_BYTES_MAX;
        let config = DriverConfig {
            ring_entries: settings.ring_entries,
            slot_bytes,
            progress_deadline: settings.progress_deadline,
            regions: entries.clone(),
            namespaces: namespace_entries.clone(),
        };
        let driver = Driver::attach(Arc::clone(&window), &config, settings.attach_timeout)?;
        let interrupt = interrupt.filter(|_| capabilities & reg::CAPABILITY_INTERRUPTS != 0);
        let mut on_device = 0u64;
        for entry in &entries {
            let region = regions.get(entry.space).expect("placed regions exist");
            let device_memory = window
                .memory(memory_offset + entry.offset, entry.bytes as usize)
                .expect("placed within on-board memory, in the window (checked above)");
            device_memory.copy_from(0, &region.memory(), 0, region.len());
            on_device |= 1 << entry.space;
            tracing::info!(
                region = region.name(),
                offset = entry.offset,
                bytes = entry.bytes,
                "region placed on the FPGA"
            );
        }
        let mut namespaces_on_device = 0u64;
        for entry in &namespace_entries {
            namespaces_on_device |= 1 << entry.space;
            tracing::info!(namespace = entry.space, blocks = entry.blocks, "namespace served by the FPGA's NVMe");
        }
        if entries.is_empty() && namespace_entries.is_empty() {
            tracing::warn!(
                "no region is placed on the FPGA (only volatile `mem` regions that fit in its memory are): \
                 every instruction executes on the CPU"
            );
        }
        let state = Arc::new(EngineState {
            selected_fpga: true,
            on_device: AtomicU64::new(on_device),
            namespaces_on_device: AtomicU64::new(namespaces_on_device),
            namespaces_fenced: AtomicU64::new(0),
            device_block_instructions: AtomicU64::new(0),
            fpga: AtomicBool::new(true),
            failovers: AtomicU64::new(0),
            sleeps_on_interrupt: interrupt.is_some() && settings.sleep_after.is_some(),
        });
        let device = Device {
            state: Arc::clone(&state),
            window,
            memory_offset,
            placement,
            slot_bytes,
            reset_timeout: settings.reset_timeout,
            driver: Mutex::new(Some(driver)),
            interrupt,
            sleep_after: settings.sleep_after,
            interrupt_waits: AtomicU64::new(0),
            interrupt_wakeups: AtomicU64::new(0),
        };
        let engine = FpgaEngine {
            software: SoftwareEngine::new(regions),
            device: Arc::new(device),
            clock: MonotonicClock::new(),
        };
        Ok((engine, state))
    }

    /// The state this engine reports through.
    pub fn state(&self) -> &Arc<EngineState> {
        &self.device.state
    }

    /// Times a worker slept on the completion interrupt, and times the interrupt woke it.
    pub fn interrupt_waits(&self) -> (u64, u64) {
        (self.device.interrupt_waits.load(Ordering::Relaxed), self.device.interrupt_wakeups.load(Ordering::Relaxed))
    }

    /// Enables (or disables) the completion interrupt (FPGA.md §6).
    fn arm_interrupt(&self, on: bool) {
        let mask = self.device.window.u32_at(reg::INTERRUPT_MASK);
        if on {
            mask.fetch_or(1, Ordering::SeqCst);
        } else {
            mask.fetch_and(!1, Ordering::SeqCst);
        }
    }

    /// Whether `instruction` touches a region the device holds: its own space, or a MEMCPY's
    /// source.
    fn placement_of(&self, instruction: &Instruction<'_>) -> (bool, bool) {
        let placed = |space: u16| self.device.placement.get(usize::from(space)).is_some_and(Option::is_some);
        let destination = placed(instruction.space);
        let source = instruction.opcode == Opcode::Memcpy as u8
            && instruction.operand.len() >= 2
            && placed(u16::from_le_bytes([instruction.operand[0], instruction.operand[1]]));
        (destination, source)
    }

    /// Runs one instruction on the device, under its lock; `Err(Some(error))` when the device
    /// failed before answering (the instruction was then submitted and abandoned, or never
    /// submitted: `submitted` says which).
    fn on_device(
        &self,
        driver: &mut Driver,
        instruction: &Instruction<'_>,
        out: &mut [u8],
    ) -> Result<Result<usize, Status>, (DriverError, bool)> {
        let capacity = out.len().min(self.device.slot_bytes as usize);
        let tag = match driver.submit(self.clock.now(), instruction, capacity as u32) {
            Ok(tag) => tag,
            Err(SubmitError::Full) => return Ok(Err(Status::Busy)),
            // An operand or answer over a data slot (16 KiB): only with max_datagram_bytes above it.
            Err(SubmitError::TooLarge) => return Ok(Err(Status::TooLarge)),
            Err(SubmitError::Device(error)) => return Err((error, false)),
        };
        // Spin; with an interrupt and a worker that may sleep, arm it once the answer is slow
        // (a block instruction on the SSD), poll once more (a completion posted before the arm
        // raised nothing), then sleep on it in slices, so the driver's deadline check still runs.
        let sleep_after = self.device.interrupt.as_ref().and(self.device.sleep_after);
        let started = sleep_after.map(|_| std::time::Instant::now());
        let mut armed = false;
        let result = loop {
            match driver.poll_completion(self.clock.now(), &mut out[..capacity]) {
                Ok(Some(completion)) => {
                    // One instruction in flight: a completion for another tag would have failed
                    // the driver's checks (FPGA.md §5.3).
                    debug_assert_eq!(completion.tag, tag, "one instruction in flight under the lock");
                    break Ok(completion.result);
                }
                Ok(None) => {}
                Err(error) => break Err((error, true)),
            }
            match (sleep_after, started, &self.device.interrupt) {
                (Some(after), Some(started), Some(link)) if started.elapsed() >= after => {
                    if !armed {
                        self.arm_interrupt(true);
                        armed = true;
                        continue;
                    }
                    self.device.interrupt_waits.fetch_add(1, Ordering::Relaxed);
                    if netdam_fpga::interrupt::wait(&link.eventfd, INTERRUPT_WAIT_SLICE) {
                        self.device.interrupt_wakeups.fetch_add(1, Ordering::Relaxed);
                    }
                }
                _ => std::hint::spin_loop(),
            }
        };
        if armed {
            self.arm_interrupt(false);
        }
        result
    }

    /// Stops using the device: one log line, a reset so that nothing queued on it runs later,
    /// its memory copied back to the host regions, then software for good. Called with the
    /// device lock held (`driver` is its content).
    fn fail_over(&self, driver: &mut Option<Driver>, error: DriverError) {
        let Some(failed) = driver.take() else { return };
        let abandoned = failed.abandoned().count();
        drop(failed);
        let device = &*self.device;
        let window = &*device.window;
        // Quiesce: a wedged device may still hold descriptors; a reset drops them (FPGA.md §7.3).
        // A dead one never answers: the wait is bounded, and its memory is copied as it is.
        let before = window.u32_at(reg::GENERATION).load(Ordering::Acquire);
        let heartbeat = window.u32_at(reg::HEARTBEAT).load(Ordering::Acquire);
        window.u32_at(reg::RESET).store(reg::RESET_MAGIC, Ordering::Release);
        let started = std::time::Instant::now();
        let mut quiesced = false;
        while started.elapsed() < device.reset_timeout {
            if window.u32_at(reg::GENERATION).load(Ordering::Acquire) != before {
                quiesced = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
        let regions = self.software.regions();
        for (id, placed) in device.placement.iter().enumerate() {
            let Some((offset, bytes)) = *placed else { continue };
            let region = regions.get(id as u16).expect("placed regions exist");
            let on_board = window.memory(device.memory_offset + offset, bytes as usize).expect("placed in the window");
            region.memory().copy_from(0, &on_board, 0, bytes as usize);
        }
        device.state.on_device.store(0, Ordering::Release);
        let namespaces = device.state.namespaces_on_device.swap(0, Ordering::AcqRel);
        // A device that did not take the reset but whose fetch loop still runs may yet write a
        // namespace's file (a late BWRITE or TRIM over newer host writes): its namespaces are
        // refused until a restart. One whose loop has stopped (a dead process, HEARTBEAT
        // frozen through the wait) writes nothing more, and the target's file serves them.
        let still_running = window.u32_at(reg::HEARTBEAT).load(Ordering::Acquire) != heartbeat;
        let fenced = if !quiesced && still_running { namespaces } else { 0 };
        device.state.namespaces_fenced.store(fenced, Ordering::Release);
        device.state.fpga.store(false, Ordering::Release);
        device.state.failovers.fetch_add(1, Ordering::Relaxed);
        tracing::error!(
            %error,
            abandoned,
            device_quiesced = quiesced,
            namespaces_fenced = fenced.count_ones(),
            "FPGA engine failed over to software: the device's regions were copied back to host memory and every \
             instruction executes on the CPU from now on, block instructions on the target's own files (an \
             abandoned non-idempotent instruction is answered io_error); restart the target to use the device again"
        );
    }
}

impl Engine for FpgaEngine {
    fn name(&self) -> &'static str {
        self.device.state.name()
    }

    fn execute(&mut self, instruction: &Instruction<'_>, out: &mut [u8]) -> Result<usize, Status> {
        let (destination, source) = self.placement_of(instruction);
        if !(destination || source) || !self.device.state.on_fpga() {
            return self.software.execute(instruction, out);
        }
        let device = Arc::clone(&self.device);
        let mut driver = device.lock_driver();
        let Some(live) = driver.as_mut() else {
            // Failed over while this worker waited for the lock.
            drop(driver);
            return self.software.execute(instruction, out);
        };
        if destination != source && instruction.opcode == Opcode::Memcpy as u8 {
            // Between a host region and a device region: the CPU copies through the window,
            // under the lock so that the device executes nothing on those bytes meanwhile.
            let regions = Arc::clone(self.software.regions());
            let spaces = MixedSpaces { regions: &regions, device: &device };
            return self.software.execute_over(&spaces, instruction, out);
        }
        match self.on_device(live, instruction, out) {
            Ok(result) => result,
            Err((error, submitted)) => {
                self.fail_over(&mut driver, error);
                drop(driver);
                if !submitted || instruction.is_idempotent() {
                    self.software.execute(instruction, out)
                } else {
                    Err(Status::IoError)
                }
            }
        }
    }

    fn execute_block(&mut self, instruction: &Instruction<'_>, out: &mut [u8]) -> Option<Result<usize, Status>> {
        let state = &self.device.state;
        if state.namespace_fenced(instruction.space) {
            return Some(Err(Status::IoError));
        }
        if !state.namespace_on_device(instruction.space) {
            return None;
        }
        let device = Arc::clone(&self.device);
        let mut driver = device.lock_driver();
        let Some(live) = driver.as_mut() else {
            // Failed over while this worker waited for the lock: the target's file serves it,
            // unless that failover fenced the namespace.
            return state.namespace_fenced(instruction.space).then_some(Err(Status::IoError));
        };
        match self.on_device(live, instruction, out) {
            Ok(result) => {
                state.device_block_instructions.fetch_add(1, Ordering::Relaxed);
                Some(result)
            }
            Err((error, _)) => {
                // Every block instruction is idempotent: the target's file serves it again,
                // unless the device may still write that file.
                self.fail_over(&mut driver, error);
                state.namespace_fenced(instruction.space).then_some(Err(Status::IoError))
            }
        }
    }

    fn set_group_commit(&mut self, on: bool) {
        self.software.set_group_commit(on);
    }

    fn persist_is_pending(&self) -> bool {
        self.software.persist_is_pending()
    }

    fn persist_pending(&mut self) -> Result<(), Status> {
        self.software.persist_pending()
    }
}
