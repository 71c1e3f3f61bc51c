//! One worker's block path: its devices on every namespace, their transfer buffers, and the
//! datagrams waiting for block I/O.
//!
//! A datagram with block instructions on a device that must be waited for (a file, a block
//! device) is copied into a pending slot and executed in order, like any other; when execution
//! reaches block instructions, it submits the whole run of consecutive
//! ones (a FLUSH runs alone, after everything before it has completed, so that it covers them)
//! and the datagram waits while the worker goes on serving other datagrams. When the run's last
//! completion is reaped, its results are written in order and execution continues. Everything
//! here is allocated when the worker starts: slots, buffers and lists are bounded. A datagram
//! whose block instructions all name namespaces that complete at once (memory regions) needs
//! none of this: the dispatcher executes it in the receive pass (`Dispatcher::block_now`).

use std::net::SocketAddr;

use netdam_isa::block::NamespaceShape;
use netdam_isa::limits::{MAX_INSTRUCTIONS_PER_DATAGRAM, PENDING_BLOCK_DATAGRAMS};
use netdam_isa::wire::ResponseProgress;
use netdam_isa::{Duration, Instant, Status};
use netdam_metrics::Cell;
use netdam_nvme::{BlockDevice, BlockError, Completion};

use crate::sessions::RecordTicket;

/// Where a deferred answer goes: set by the driver that received the datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyTo {
    /// The sender.
    pub peer: SocketAddr,
    /// The IP TTL the datagram arrived with, echoed in the answer.
    pub ttl: u8,
}

/// One block instruction of the run in flight.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunEntry {
    pub opcode: u8,
    pub namespace: u16,
    pub status: Status,
    /// Submitted and not yet completed.
    pub in_flight: bool,
    /// The transfer buffer it holds, until its result is written.
    pub buffer: Option<u16>,
    /// Bytes a BREAD or BLOCK_STATUS returns (held in `buffer` until the result is written).
    pub data_len: usize,
    /// Operand bytes of the instruction (a BWRITE's data), for `/metrics`.
    pub request_bytes: usize,
}

impl Default for RunEntry {
    fn default() -> RunEntry {
        RunEntry {
            opcode: 0,
            namespace: 0,
            status: Status::Ok,
            in_flight: false,
            buffer: None,
            data_len: 0,
            request_bytes: 0,
        }
    }
}

/// A datagram waiting for block I/O.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    pub request: Box<[u8]>,
    pub request_len: usize,
    pub response: Box<[u8]>,
    pub progress: Option<ResponseProgress>,
    /// Index of the first instruction not yet executed or submitted.
    pub next_instruction: usize,
    pub run: Box<[RunEntry]>,
    pub run_len: usize,
    /// Entries of the run still waiting for their completion.
    pub outstanding: usize,
    pub record: Option<(RecordTicket, bool)>,
    pub reply_to: Option<ReplyTo>,
    /// How long it waited before `started`, all of it: part of its service time.
    pub waited: Duration,
    pub started: Instant,
    /// While it waits for block I/O: when its initiator is due an in-progress notice (the
    /// first `IN_PROGRESS_NOTICE_INTERVAL` after it started, then as often again). `None` once
    /// its answer is built, and in a free slot.
    pub notice_due: Option<Instant>,
    /// Opcode of its first instruction: its label in the service-time histogram.
    pub opcode: u8,
    /// The session whose keys seal its answer (an authenticated session's).
    pub seal: Option<crate::dispatch::SealFor>,
    /// Tenant of its session, whose grants its instructions are checked against.
    pub tenant: Option<u32>,
    /// Bytes of `response` the answer may use: the rest is room for the trailer.
    pub room: usize,
}

impl Pending {
    /// How long the target has held the datagram at `now`: its wait before it started, then
    /// its execution so far (the service time its answer, or a notice, reports).
    pub fn held_for(&self, now: Instant) -> Duration {
        self.waited + now.saturating_since(self.started)
    }
}

/// The block side of one worker.
pub struct BlockPath {
    pub(crate) devices: Vec<Box<dyn BlockDevice>>,
    pub(crate) shapes: Vec<NamespaceShape>,
    /// Per namespace, whether its device completes every request at once (a memory region):
    /// its block instructions run in the pass that received them, without a slot.
    at_once: Vec<bool>,
    /// Free transfer buffers per namespace.
    pub(crate) free_buffers: Vec<Vec<u16>>,
    pub(crate) slots: Vec<Pending>,
    pub(crate) free_slots: Vec<u16>,
    /// Slots whose run has completed: their execution continues.
    pub(crate) ready: Vec<u16>,
    /// Slots whose answer is complete: to be sent.
    pub(crate) finished: Vec<u16>,
}

impl std::fmt::Debug for BlockPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockPath")
            .field("namespaces", &self.shapes)
            .field("pending", &(self.slots.len() - self.free_slots.len()))
            .finish_non_exhaustive()
    }
}

/// Tag of a block request: its slot and its entry in the slot's run.
pub(crate) fn tag(slot: u16, entry: usize) -> u64 {
    (u64::from(slot) << 8) | entry as u64
}

fn untag(tag: u64) -> (usize, usize) {
    ((tag >> 8) as usize, (tag & 0xFF) as usize)
}

const _: () = assert!(MAX_INSTRUCTIONS_PER_DATAGRAM <= 256, "a run entry index fits a tag's low byte");

impl BlockPath {
    /// A block path over one worker's `devices` (by namespace id), for datagrams of up to
    /// `max_datagram_bytes`. With no devices it holds no slots and allocates nothing.
    pub fn new(devices: Vec<Box<dyn BlockDevice>>, max_datagram_bytes: usize) -> BlockPath {
        let shapes = devices
            .iter()
            .map(|device| {
                let geometry = device.geometry();
                NamespaceShape {
                    block_bytes: geometry.block_bytes,
                    capacity_blocks: geometry.capacity_blocks,
                    max_transfer_blocks: geometry.max_transfer_blocks,
                }
            })
            .collect();
        let at_once = devices.iter().map(|device| device.completes_at_once()).collect();
        let free_buffers =
            devices.iter().map(|device| (0..device.geometry().queue_depth as u16).rev().collect()).collect();
        let slot_count = if devices.is_empty() { 0 } else { PENDING_BLOCK_DATAGRAMS };
        let slots = (0..slot_count)
            .map(|_| Pending {
                request: vec![0u8; max_datagram_bytes].into_boxed_slice(),
                response: vec![0u8; max_datagram_bytes].into_boxed_slice(),
                run: vec![RunEntry::default(); MAX_INSTRUCTIONS_PER_DATAGRAM].into_boxed_slice(),
                ..Pending::default()
            })
            .collect();
        BlockPath {
            devices,
            shapes,
            at_once,
            free_buffers,
            slots,
            free_slots: (0..slot_count as u16).rev().collect(),
            ready: Vec::with_capacity(slot_count),
            finished: Vec::with_capacity(slot_count),
        }
    }

    /// Whether block instructions on namespace `space` complete at once. An unknown namespace
    /// does too: its instructions are answered `no_such_space` without waiting for anything.
    pub(crate) fn completes_at_once(&self, space: u16) -> bool {
        self.at_once.get(usize::from(space)).copied().unwrap_or(true)
    }

    /// Datagrams waiting for block I/O or to be sent.
    pub fn pending(&self) -> usize {
        self.slots.len() - self.free_slots.len()
    }

    /// Reaps every device; slots whose run completed move to `ready`. Completions are counted
    /// in `completed`, by namespace id (this worker's cells).
    pub(crate) fn reap(&mut self, completed: &[Cell]) {
        let BlockPath { devices, slots, ready, .. } = self;
        for (namespace, device) in devices.iter_mut().enumerate() {
            if device.in_flight() == 0 {
                continue;
            }
            let mut reaped = 0u64;
            device.reap(&mut |completion: Completion| {
                reaped += 1;
                let (slot, entry) = untag(completion.tag);
                let pending = &mut slots[slot];
                pending.run[entry].in_flight = false;
                pending.run[entry].status = match completion.result {
                    Ok(()) => Status::Ok,
                    Err(error) => failure_status(&error),
                };
                pending.outstanding -= 1;
                if pending.outstanding == 0 {
                    ready.push(slot as u16);
                }
            });
            if let Some(cell) = completed.get(namespace) {
                cell.add(reaped);
            }
        }
    }
}

/// The status a failed block request answers with.
pub(crate) fn failure_status(error: &BlockError) -> Status {
    match error {
        BlockError::QueueFull { .. } => Status::Busy,
        BlockError::OutOfRange { .. } => Status::OutOfRange,
        BlockError::TooLarge { .. } => Status::TooLarge,
        BlockError::NoSuchBuffer { .. } => Status::IoError,
        BlockError::NotSupported { .. } => Status::NotSupported,
        BlockError::WriteFailed { source, .. } | BlockError::FlushFailed { source }
            if matches!(source.kind(), std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded) =>
        {
            // A full file system is the operator's to fix, and the initiator's to report as
            // such (NBD ENOSPC), not a failing device.
            tracing::warn!(%error, "block request failed: the backing file system is full");
            Status::NoSpace
        }
        BlockError::ReadFailed { .. }
        | BlockError::WriteFailed { .. }
        | BlockError::FlushFailed { .. }
        | BlockError::StatusFailed { .. } => {
            tracing::warn!(%error, "block request failed");
            Status::IoError
        }
    }
}
