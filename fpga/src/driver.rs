//! The host side of the interface: programs the rings, submits descriptors, reaps completions.
//!
//! Submit and reap never wait: a full ring is [`SubmitError::Full`], an empty completion ring is
//! `Ok(None)`. The driver reads no clock; the caller passes `now` (the worker reads its clock
//! once per loop pass). Everything the device writes is checked: a completion that names no
//! instruction in flight, repeats one, or breaks a field's rules fails the device with
//! [`DriverError::Protocol`] instead of panicking. Once failed, the driver stays failed and
//! [`Driver::abandoned`] lists the instructions whose outcome is unknown; every instruction
//! submitted is therefore either reaped exactly once or reported abandoned exactly once.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use netdam_isa::wire::Instruction;
use netdam_isa::{Duration, Instant, Status};

use crate::registers::{self as reg, NamespaceEntry, RegionEntry};
use crate::window::Window;
use crate::{
    CompletionEntry, Descriptor, COMPLETION_BYTES, COMPLETION_FLAG_PHASE, DESCRIPTOR_BYTES, RING_ENTRIES_MAX,
    RING_ENTRIES_MIN, SLOT_BYTES_MAX, SLOT_BYTES_MIN,
};

/// How the host sets the device up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverConfig {
    /// Entries per ring (a power of two): the most instructions in flight.
    pub ring_entries: u32,
    /// Bytes of each operand area and each answer area (a power of two).
    pub slot_bytes: u32,
    /// Instructions in flight and no progress (no completion, no descriptor fetched) for this
    /// long: the device is wedged.
    pub progress_deadline: Duration,
    /// Regions placed in on-board memory (at most [`reg::REGION_TABLE_ENTRIES`]).
    pub regions: Vec<RegionEntry>,
    /// Namespaces served by the device's NVMe controller (at most
    /// [`reg::NAMESPACE_TABLE_ENTRIES`]).
    pub namespaces: Vec<NamespaceEntry>,
}

/// Why the device cannot be used (any more).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DriverError {
    /// The window does not hold a netdam device.
    #[error("no netdam device in the window (DEVICE_ID {found:#010x}, expected {:#010x})", crate::DEVICE_ID)]
    NotADevice {
        /// What DEVICE_ID held.
        found: u32,
    },
    /// The device speaks another major version.
    #[error("device interface version {found:#010x} is not {:#010x}", crate::INTERFACE_VERSION)]
    UnsupportedVersion {
        /// What INTERFACE_VERSION held.
        found: u32,
    },
    /// The configuration does not fit the device or its window.
    #[error("invalid configuration: {reason}")]
    BadConfig {
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// The device did not become ready (or finish a reset) in time.
    #[error(
        "device not ready after the attach timeout (STATUS {status:#x}): is the device, or netdam-fpga-model \
         for a model's window, running and serving this window?"
    )]
    NotReady {
        /// STATUS when we gave up.
        status: u32,
    },
    /// The device raised FATAL.
    #[error("device failed: FATAL with ERROR_CODE {error_code}")]
    Fatal {
        /// ERROR_CODE.
        error_code: u32,
    },
    /// GENERATION changed, or READY was cleared: the device reset (or is resetting) under us.
    #[error("device reset: GENERATION {attached} at attach, {now} now (equal while the reset is under way)")]
    Reset {
        /// Generation at attach.
        attached: u32,
        /// Generation seen now.
        now: u32,
    },
    /// Instructions in flight and no progress for longer than the deadline.
    #[error("device wedged: {in_flight} instructions in flight, no progress for {waited_ns} ns")]
    Wedged {
        /// Instructions in flight.
        in_flight: u32,
        /// How long nothing moved.
        waited_ns: u64,
    },
    /// The device wrote something the interface forbids.
    #[error("device broke the protocol: {reason}")]
    Protocol {
        /// What it did.
        reason: &'static str,
    },
}

/// Why a descriptor was not submitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// No free entry: back-pressure; reap and try again.
    #[error("submission ring full")]
    Full,
    /// The operand or answer does not fit a data slot.
    #[error("operand or answer larger than a data slot")]
    TooLarge,
    /// The device has failed.
    #[error(transparent)]
    Device(#[from] DriverError),
}

/// One reaped instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The tag [`Driver::submit`] returned.
    pub tag: u64,
    /// Answer bytes copied to the caller's buffer, or the status the device gave.
    pub result: Result<usize, Status>,
}

#[derive(Debug, Clone, Copy)]
struct InFlight {
    tag: u64,
    answer_capacity: u32,
}

/// The host driver over one device window.
pub struct Driver {
    window: Arc<dyn Window>,
    generation: u32,
    entries: u32,
    slot_bytes: u32,
    submission_base: u64,
    completion_base: u64,
    data_base: u64,
    progress_deadline: Duration,
    /// Tag of the next submission; its low bits are the ring index and data slot.
    next_tag: u64,
    /// Completions consumed (free-running, as COMPLETION_HEAD).
    completion_head: u32,
    /// Per data slot, the instruction using it (sized once at attach: no allocation later).
    in_flight: Vec<Option<InFlight>>,
    in_flight_count: u32,
    last_progress: Instant,
    last_submission_head: u32,
    failed: Option<DriverError>,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("generation", &self.generation)
            .field("entries", &self.entries)
            .field("in_flight", &self.in_flight_count)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

fn align_up(value: u64, to: u64) -> u64 {
    value.div_ceil(to) * to
}

impl Driver {
    /// Checks the device's identity, resets it if a previous host left it enabled, places the
    /// rings and data slots at the start of the host area, writes the region table, enables the
    /// device and waits (at most `timeout`; start-up only) until it is READY.
    pub fn attach(
        window: Arc<dyn Window>,
        config: &DriverConfig,
        timeout: std::time::Duration,
    ) -> Result<Driver, DriverError> {
        let started = std::time::Instant::now();
        let wait = |what: &dyn Fn() -> bool| -> bool {
            while !what() {
                if started.elapsed() > timeout {
                    return false;
                }
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
            true
        };
        let found = window.u32_at(reg::DEVICE_ID).load(Ordering::Acquire);
        if found != crate::DEVICE_ID {
            return Err(DriverError::NotADevice { found });
        }
        let version = window.u32_at(reg::INTERFACE_VERSION).load(Ordering::Relaxed);
        if version >> 16 != crate::INTERFACE_VERSION >> 16 {
            return Err(DriverError::UnsupportedVersion { found: version });
        }
        let entries = config.ring_entries;
        let slot_bytes = config.slot_bytes;
        if !entries.is_power_of_two() || !(RING_ENTRIES_MIN..=RING_ENTRIES_MAX).contains(&entries) {
            return Err(DriverError::BadConfig { reason: "ring entries must be a power of two within 2..=32768" });
        }
        if !slot_bytes.is_power_of_two() || !(SLOT_BYTES_MIN..=SLOT_BYTES_MAX).contains(&slot_bytes) {
            return Err(DriverError::BadConfig { reason: "slot bytes must be a power of two within 64..=16384" });
        }
        if config.regions.len() > reg::REGION_TABLE_ENTRIES {
            return Err(DriverError::BadConfig { reason: "more regions than the region table holds" });
        }
        if config.namespaces.len() > reg::NAMESPACE_TABLE_ENTRIES {
            return Err(DriverError::BadConfig { reason: "more namespaces than the namespace table holds" });
        }
        let capabilities = window.u64_at(reg::CAPABILITIES).load(Ordering::Relaxed);
        let entries_log2_max = (capabilities >> reg::CAPABILITY_RING_ENTRIES_LOG2_SHIFT) & 0xFF;
        let slot_log2_max = (capabilities >> reg::CAPABILITY_SLOT_BYTES_LOG2_SHIFT) & 0xFF;
        if u64::from(entries.trailing_zeros()) > entries_log2_max
            || u64::from(slot_bytes.trailing_zeros()) > slot_log2_max
        {
            return Err(DriverError::BadConfig {
                reason: "rings or slots larger than the device's CAPABILITIES allow",
            });
        }
        let host_area = window.u64_at(reg::HOST_AREA_OFFSET).load(Ordering::Relaxed);
        let host_area_bytes = window.u64_at(reg::HOST_AREA_BYTES).load(Ordering::Relaxed);
        let submission_base = align_up(host_area, 4096);
        let completion_base = align_up(submission_base + u64::from(entries) * DESCRIPTOR_BYTES as u64, 64);
        let data_base = align_up(completion_base + u64::from(entries) * COMPLETION_BYTES as u64, 4096);
        let end = data_base + u64::from(entries) * 2 * u64::from(slot_bytes);
        if end > host_area.saturating_add(host_area_bytes) || end > window.len() as u64 {
            return Err(DriverError::BadConfig { reason: "rings and data slots do not fit in the device's host area" });
        }

        // A device left enabled or failed by a previous host is reset first.
        let status = window.u32_at(reg::STATUS).load(Ordering::Acquire);
        if status != 0 || window.u32_at(reg::CONTROL).load(Ordering::Acquire) != 0 {
            let before = window.u32_at(reg::GENERATION).load(Ordering::Acquire);
            window.u32_at(reg::RESET).store(reg::RESET_MAGIC, Ordering::Release);
            let done = || {
                window.u32_at(reg::GENERATION).load(Ordering::Acquire) != before
                    && window.u32_at(reg::STATUS).load(Ordering::Acquire) & reg::STATUS_RESETTING == 0
            };
            if !wait(&done) {
                return Err(DriverError::NotReady { status: window.u32_at(reg::STATUS).load(Ordering::Acquire) });
            }
        }
        let generation = window.u32_at(reg::GENERATION).load(Ordering::Acquire);

        // Program while disabled; ENABLE's release store publishes all of it.
        let zeroes = [0u8; 64];
        let mut at = completion_base;
        while at < completion_base + u64::from(entries) * COMPLETION_BYTES as u64 {
            let chunk = (completion_base + u64::from(entries) * COMPLETION_BYTES as u64 - at).min(64);
            window
                .write_bytes(at, &zeroes[..chunk as usize])
                .expect("completion ring within the window (checked above)");
            at += chunk;
        }
        for index in 0..reg::REGION_TABLE_ENTRIES {
            let mut entry = [0u8; reg::REGION_ENTRY_BYTES as usize];
            if let Some(region) = config.regions.get(index) {
                entry[0..2].copy_from_slice(&region.space.to_le_bytes());
                entry[2] = reg::REGION_VALID;
                entry[8..16].copy_from_slice(&region.offset.to_le_bytes());
                entry[16..24].copy_from_slice(&region.bytes.to_le_bytes());
            }
            let offset = reg::REGION_TABLE + index as u64 * reg::REGION_ENTRY_BYTES;
            window.write_bytes(offset, &entry).expect("region table within the register block");
        }
        for index in 0..reg::NAMESPACE_TABLE_ENTRIES {
            let mut entry = [0u8; reg::NAMESPACE_ENTRY_BYTES as usize];
            if let Some(namespace) = config.namespaces.get(index) {
                entry[0..2].copy_from_slice(&namespace.space.to_le_bytes());
                entry[2] = reg::NAMESPACE_VALID;
                entry[3] = namespace.lba_shift;
                entry[4..8].copy_from_slice(&namespace.nsid.to_le_bytes());
                entry[8..16].copy_from_slice(&namespace.blocks.to_le_bytes());
            }
            let offset = reg::NAMESPACE_TABLE + index as u64 * reg::NAMESPACE_ENTRY_BYTES;
            window.write_bytes(offset, &entry).expect("namespace table within the register block");
        }
        window.u64_at(reg::SUBMISSION_RING_BASE).store(submission_base, Ordering::Relaxed);
        window.u64_at(reg::COMPLETION_RING_BASE).store(completion_base, Ordering::Relaxed);
        window.u64_at(reg::DATA_BASE).store(data_base, Ordering::Relaxed);
        window.u32_at(reg::RING_ENTRIES).store(entries, Ordering::Relaxed);
        window.u32_at(reg::SLOT_BYTES).store(slot_bytes, Ordering::Relaxed);
        window.u32_at(reg::SUBMISSION_TAIL).store(0, Ordering::Relaxed);
        window.u32_at(reg::COMPLETION_HEAD).store(0, Ordering::Relaxed);
        window.u32_at(reg::CONTROL).store(reg::CONTROL_ENABLE, Ordering::Release);
        let settled =
            || window.u32_at(reg::STATUS).load(Ordering::Acquire) & (reg::STATUS_READY | reg::STATUS_FATAL) != 0;
        if !wait(&settled) {
            return Err(DriverError::NotReady { status: window.u32_at(reg::STATUS).load(Ordering::Acquire) });
        }
        let status = window.u32_at(reg::STATUS).load(Ordering::Acquire);
        if status & reg::STATUS_FATAL != 0 {
            return Err(DriverError::Fatal { error_code: window.u32_at(reg::ERROR_CODE).load(Ordering::Acquire) });
        }
        let now_generation = window.u32_at(reg::GENERATION).load(Ordering::Acquire);
        if now_generation != generation {
            return Err(DriverError::Reset { attached: generation, now: now_generation });
        }
        Ok(Driver {
            window,
            generation,
            entries,
            slot_bytes,
            submission_base,
            completion_base,
            data_base,
            progress_deadline: config.progress_deadline,
            next_tag: 0,
            completion_head: 0,
            in_flight: vec![None; entries as usize],
            in_flight_count: 0,
            last_progress: Instant::ZERO,
            last_submission_head: 0,
            failed: None,
        })
    }

    /// Instructions submitted and not yet reaped.
    pub fn in_flight(&self) -> u32 {
        self.in_flight_count
    }

    /// Bytes of each data slot: the largest operand and answer.
    pub fn slot_bytes(&self) -> u32 {
        self.slot_bytes
    }

    /// Why the device failed, if it did.
    pub fn failure(&self) -> Option<DriverError> {
        self.failed
    }

    /// Tags of the instructions in flight when the device failed: their outcome is unknown (a
    /// non-idempotent one may or may not have executed). Empty while the device works.
    pub fn abandoned(&self) -> impl Iterator<Item = u64> + '_ {
        let failed = self.failed.is_some();
        self.in_flight.iter().filter(move |_| failed).filter_map(|slot| slot.map(|in_flight| in_flight.tag))
    }

    fn fail(&mut self, error: DriverError) -> DriverError {
        self.failed.get_or_insert(error);
        self.failed.expect("just set")
    }

    /// Reads GENERATION and STATUS: a reset or a FATAL fails the driver.
    fn check_device(&mut self) -> Result<(), DriverError> {
        let generation = self.window.u32_at(reg::GENERATION).load(Ordering::Acquire);
        if generation != self.generation {
            return Err(self.fail(DriverError::Reset { attached: self.generation, now: generation }));
        }
        let status = self.window.u32_at(reg::STATUS).load(Ordering::Acquire);
        if status & reg::STATUS_FATAL != 0 {
            let error_code = self.window.u32_at(reg::ERROR_CODE).load(Ordering::Acquire);
            return Err(self.fail(DriverError::Fatal { error_code }));
        }
        if status & reg::STATUS_READY == 0 {
            return Err(self.fail(DriverError::Reset { attached: self.generation, now: generation }));
        }
        Ok(())
    }

    /// Queues `instruction` and rings the doorbell; never waits. `answer_capacity` is the room
    /// the answer may take (at most [`Driver::slot_bytes`]); the returned tag comes back in a
    /// [`Completion`].
    pub fn submit(
        &mut self,
        now: Instant,
        instruction: &Instruction<'_>,
        answer_capacity: u32,
    ) -> Result<u64, SubmitError> {
        if let Some(error) = self.failed {
            return Err(SubmitError::Device(error));
        }
        if instruction.operand.len() > self.slot_bytes as usize || answer_capacity > self.slot_bytes {
            return Err(SubmitError::TooLarge);
        }
        let index = (self.next_tag & u64::from(self.entries - 1)) as usize;
        if self.in_flight[index].is_some() {
            return Err(SubmitError::Full);
        }
        let generation = self.window.u32_at(reg::GENERATION).load(Ordering::Acquire);
        if generation != self.generation {
            return Err(SubmitError::Device(
                self.fail(DriverError::Reset { attached: self.generation, now: generation }),
            ));
        }
        let operand_address = self.data_base + index as u64 * 2 * u64::from(self.slot_bytes);
        let answer_address = operand_address + u64::from(self.slot_bytes);
        let descriptor = Descriptor {
            tag: self.next_tag,
            opcode: instruction.opcode,
            flags: instruction.flags,
            space: instruction.space,
            operand_len: instruction.operand.len() as u32,
            offset: instruction.offset,
            length: instruction.length,
            aux: instruction.aux,
            operand_address,
            answer_address,
            answer_capacity,
        };
        // The slot and the ring entry are the host's (nothing in flight uses them): plain
        // writes, published by the doorbell's release store.
        self.window
            .write_bytes(operand_address, instruction.operand)
            .expect("data slots within the window (checked at attach)");
        let entry = self.submission_base + index as u64 * DESCRIPTOR_BYTES as u64;
        self.window
            .write_bytes(entry, &descriptor.encode())
            .expect("submission ring within the window (checked at attach)");
        if self.in_flight_count == 0 {
            // The deadline runs from the moment there is something to wait for.
            self.last_progress = now;
        }
        self.in_flight[index] = Some(InFlight { tag: self.next_tag, answer_capacity });
        self.in_flight_count += 1;
        self.next_tag += 1;
        self.window.u32_at(reg::SUBMISSION_TAIL).store(self.next_tag as u32, Ordering::Release);
        Ok(descriptor.tag)
    }

    /// Takes the next completion, if one is ready, copying its answer into `answer_out` (which
    /// must hold the `answer_capacity` given at submit). Never waits. With nothing ready, checks
    /// the device: a reset, a FATAL or no progress past the deadline fails the driver.
    pub fn poll_completion(&mut self, now: Instant, answer_out: &mut [u8]) -> Result<Option<Completion>, DriverError> {
        if let Some(error) = self.failed {
            return Err(error);
        }
        let index = u64::from(self.completion_head & (self.entries - 1));
        let entry = self.completion_base + index * COMPLETION_BYTES as u64;
        let status_word = self.window.u64_at(entry + 8).load(Ordering::Acquire);
        let expected_phase = crate::phase_for(self.completion_head, self.entries);
        let completion = CompletionEntry::from_words(0, status_word);
        if completion.phase() != expected_phase {
            return self.check_idle(now).map(|()| None);
        }
        // Completions posted before a reset are still results: reap them first, and notice the
        // reset once the ring is empty.
        let tag = self.window.u64_at(entry).load(Ordering::Relaxed);
        let slot = (tag & u64::from(self.entries - 1)) as usize;
        let in_flight = match self.in_flight[slot] {
            Some(in_flight) if in_flight.tag == tag => in_flight,
            _ => return Err(self.fail(DriverError::Protocol { reason: "completion for a tag not in flight" })),
        };
        if completion.flags & !COMPLETION_FLAG_PHASE != 0 {
            return Err(self.fail(DriverError::Protocol { reason: "reserved completion flag set" }));
        }
        let Some(status) = Status::from_u8(completion.status) else {
            return Err(self.fail(DriverError::Protocol { reason: "unknown status code in a completion" }));
        };
        if completion.answer_len > in_flight.answer_capacity || (status != Status::Ok && completion.answer_len != 0) {
            return Err(self.fail(DriverError::Protocol { reason: "answer length beyond the capacity given" }));
        }
        let answer_len = completion.answer_len as usize;
        assert!(
            answer_out.len() >= answer_len,
            "caller's answer buffer ({} bytes) smaller than the answer capacity it submitted with",
            answer_out.len()
        );
        let answer_address = self.data_base + slot as u64 * 2 * u64::from(self.slot_bytes) + u64::from(self.slot_bytes);
        self.window
            .read_bytes(answer_address, &mut answer_out[..answer_len])
            .expect("data slots within the window (checked at attach)");
        self.in_flight[slot] = None;
        self.in_flight_count -= 1;
        self.completion_head = self.completion_head.wrapping_add(1);
        self.window.u32_at(reg::COMPLETION_HEAD).store(self.completion_head, Ordering::Release);
        self.last_progress = now;
        let result = if status == Status::Ok { Ok(answer_len) } else { Err(status) };
        Ok(Some(Completion { tag, result }))
    }

    /// Nothing to reap: was there a reset or a FATAL, or has nothing moved for too long?
    fn check_idle(&mut self, now: Instant) -> Result<(), DriverError> {
        self.check_device()?;
        if self.in_flight_count == 0 {
            return Ok(());
        }
        let submission_head = self.window.u32_at(reg::SUBMISSION_HEAD).load(Ordering::Acquire);
        if submission_head != self.last_submission_head {
            self.last_submission_head = submission_head;
            self.last_progress = now;
            return Ok(());
        }
        let waited = now.saturating_since(self.last_progress);
        if waited.as_nanos() > self.progress_deadline.as_nanos() {
            let in_flight = self.in_flight_count;
            return Err(self.fail(DriverError::Wedged { in_flight, waited_ns: waited.as_nanos() }));
        }
        Ok(())
    }
}
