//! Block namespaces: the interface the target's worker loop drives for BREAD, BWRITE, FLUSH,
//! TRIM, WRITE_ZEROES and BLOCK_STATUS, and its backends.
//!
//! A device is submitted to and reaped from by the same worker loop that serves memory
//! instructions, so a block request never blocks that loop: `submit` queues (a device may hand
//! a request to the kernel at once, as the io_uring backend does a read that starts a new run),
//! `reap` pushes the queued requests to the device and collects what finished, without waiting. Each worker opens
//! its own device on a namespace (its own ring, its own buffers): nothing is shared between
//! workers but the backing store. BLOCK_STATUS is the exception to submit-and-reap: it asks
//! the file system where data lies ([`BlockDevice::block_status`]), a bounded number of
//! system calls made at once, like the FLUSH of a memory region. A device whose requests all
//! complete inside the call (a memory region, [`BlockDevice::completes_at_once`]) also serves
//! them at once from the caller's memory ([`BlockDevice::execute_now`]), so the worker answers
//! a datagram whose block instructions all name such devices like memory instructions, with no
//! queue or transfer buffer in between.
//!
//! Backends:
//! - [`UringDevice`]: io_uring on an O_DIRECT file or block device, with registered buffers.
//! - [`RegionDevice`]: a persistent memory region (`netdam-pmem`), executed by copying.
//! - [`CrashTestDevice`]: keeps written and durable bytes apart, for crash tests.

mod allocation;
mod buffers;
mod crash;
mod region;
mod uring;

use std::io;

pub use buffers::AlignedBuffers;
pub use crash::{CrashImage, CrashTestDevice};
pub use netdam_isa::block::Extent;
pub use region::RegionDevice;
pub use uring::{wait_for_submission_thread, BackingKind, Submission, UringDevice};

/// Shape of a namespace as one worker's device sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Bytes per logical block.
    pub block_bytes: u32,
    /// Logical blocks in the namespace.
    pub capacity_blocks: u64,
    /// Requests the device accepts before `submit` answers `QueueFull`; also its buffer count.
    pub queue_depth: u32,
    /// Largest read or write, in blocks: one buffer.
    pub max_transfer_blocks: u32,
}

impl Geometry {
    /// Checks that `num_blocks` from `offset_blocks` lie inside the namespace.
    pub fn check_range(&self, offset_blocks: u64, num_blocks: u32) -> Result<(), BlockError> {
        match offset_blocks.checked_add(u64::from(num_blocks)) {
            Some(end) if end <= self.capacity_blocks => Ok(()),
            _ => Err(BlockError::OutOfRange { offset_blocks, num_blocks, capacity_blocks: self.capacity_blocks }),
        }
    }

    /// Byte offset and length of a block range (which `check_range` accepted).
    pub fn byte_range(&self, offset_blocks: u64, num_blocks: u32) -> (u64, usize) {
        (offset_blocks * u64::from(self.block_bytes), num_blocks as usize * self.block_bytes as usize)
    }
}

/// Index of a buffer in the pool the device registered at start-up: `0..queue_depth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferIndex(pub u16);

/// One block request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockRequest {
    /// Read `num_blocks` from `offset_blocks` into a registered buffer.
    Read { offset_blocks: u64, num_blocks: u32, buffer: BufferIndex },
    /// Write `num_blocks` at `offset_blocks` from a registered buffer; with `fua` the data is
    /// durable before completion.
    Write { offset_blocks: u64, num_blocks: u32, buffer: BufferIndex, fua: bool },
    /// Make every write completed before this was submitted durable.
    Flush,
    /// Deallocate blocks; later reads return zeroes.
    Trim { offset_blocks: u64, num_blocks: u32 },
    /// Set blocks to zero.
    WriteZeroes { offset_blocks: u64, num_blocks: u32 },
}

impl BlockRequest {
    /// The block range it addresses, if any (FLUSH addresses none).
    pub fn range(&self) -> Option<(u64, u32)> {
        match *self {
            BlockRequest::Read { offset_blocks, num_blocks, .. }
            | BlockRequest::Write { offset_blocks, num_blocks, .. }
            | BlockRequest::Trim { offset_blocks, num_blocks }
            | BlockRequest::WriteZeroes { offset_blocks, num_blocks } => Some((offset_blocks, num_blocks)),
            BlockRequest::Flush => None,
        }
    }

    /// The buffer it reads into or writes from, if any.
    pub fn buffer(&self) -> Option<BufferIndex> {
        match *self {
            BlockRequest::Read { buffer, .. } | BlockRequest::Write { buffer, .. } => Some(buffer),
            _ => None,
        }
    }

    /// Checks the request against the device's geometry before it is queued.
    pub fn validate(&self, geometry: &Geometry) -> Result<(), BlockError> {
        if let Some((offset_blocks, num_blocks)) = self.range() {
            geometry.check_range(offset_blocks, num_blocks)?;
            let transfers = matches!(self, BlockRequest::Read { .. } | BlockRequest::Write { .. });
            if transfers && (num_blocks == 0 || num_blocks > geometry.max_transfer_blocks) {
                return Err(BlockError::TooLarge { num_blocks, max_transfer_blocks: geometry.max_transfer_blocks });
            }
        }
        if let Some(BufferIndex(index)) = self.buffer() {
            if u32::from(index) >= geometry.queue_depth {
                return Err(BlockError::NoSuchBuffer { index, buffers: geometry.queue_depth });
            }
        }
        Ok(())
    }
}

/// A block request served at once, from and into the caller's memory, by a device whose every
/// request completes inside the call that starts it ([`BlockDevice::completes_at_once`]).
/// The caller skips the queue and the transfer buffers: a read lands where its answer goes.
#[derive(Debug)]
pub enum ImmediateRequest<'a> {
    /// Read `out.len()` bytes (whole blocks) from `offset_blocks` into `out`.
    Read { offset_blocks: u64, out: &'a mut [u8] },
    /// Write `data` (whole blocks) at `offset_blocks`; with `fua` it is durable on return.
    Write { offset_blocks: u64, data: &'a [u8], fua: bool },
    /// Make every write before it durable.
    Flush,
    /// Deallocate blocks; later reads return zeroes.
    Trim { offset_blocks: u64, num_blocks: u32 },
    /// Set blocks to zero.
    WriteZeroes { offset_blocks: u64, num_blocks: u32 },
}

impl ImmediateRequest<'_> {
    /// The block range it addresses (FLUSH addresses none), as counted in blocks of
    /// `block_bytes`; `None` too for a transfer that is not whole blocks.
    fn range(&self, block_bytes: u32) -> Option<(u64, u32)> {
        let blocks = |len: usize| {
            let block_bytes = block_bytes as usize;
            len.is_multiple_of(block_bytes).then(|| u32::try_from(len / block_bytes).unwrap_or(u32::MAX))
        };
        match self {
            ImmediateRequest::Read { offset_blocks, out } => Some((*offset_blocks, blocks(out.len())?)),
            ImmediateRequest::Write { offset_blocks, data, .. } => Some((*offset_blocks, blocks(data.len())?)),
            ImmediateRequest::Trim { offset_blocks, num_blocks }
            | ImmediateRequest::WriteZeroes { offset_blocks, num_blocks } => Some((*offset_blocks, *num_blocks)),
            ImmediateRequest::Flush => None,
        }
    }

    /// Checks the request against the device's geometry, as [`BlockRequest::validate`] does.
    pub fn validate(&self, geometry: &Geometry) -> Result<(), BlockError> {
        if let Some((offset_blocks, num_blocks)) = self.range(geometry.block_bytes) {
            geometry.check_range(offset_blocks, num_blocks)?;
        }
        let transfer = match self {
            ImmediateRequest::Read { out, .. } => Some(out.len()),
            ImmediateRequest::Write { data, .. } => Some(data.len()),
            _ => None,
        };
        // A transfer that is not whole blocks is of a size no transfer may have.
        if let Some(len) = transfer {
            let num_blocks = u32::try_from(len / geometry.block_bytes as usize).unwrap_or(u32::MAX);
            if !len.is_multiple_of(geometry.block_bytes as usize)
                || num_blocks == 0
                || num_blocks > geometry.max_transfer_blocks
            {
                return Err(BlockError::TooLarge { num_blocks, max_transfer_blocks: geometry.max_transfer_blocks });
            }
        }
        Ok(())
    }

    /// Error for a failed request, from an `errno`-style error.
    pub(crate) fn failure(&self, block_bytes: u32, source: io::Error) -> BlockError {
        let (offset_blocks, num_blocks) = self.range(block_bytes).unwrap_or((0, 0));
        match self {
            ImmediateRequest::Read { .. } => BlockError::ReadFailed { offset_blocks, num_blocks, source },
            ImmediateRequest::Write { .. } | ImmediateRequest::Trim { .. } | ImmediateRequest::WriteZeroes { .. } => {
                BlockError::WriteFailed { offset_blocks, num_blocks, source }
            }
            ImmediateRequest::Flush => BlockError::FlushFailed { source },
        }
    }
}

/// Why a block request failed, with the blocks it concerned.
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    /// The submission queue is full: back-pressure, try after reaping.
    #[error("block queue full ({queue_depth} requests in flight)")]
    QueueFull {
        /// The device's queue depth.
        queue_depth: u32,
    },
    /// The request addresses blocks beyond the namespace.
    #[error("blocks {offset_blocks}+{num_blocks} beyond the namespace of {capacity_blocks} blocks")]
    OutOfRange {
        /// First block.
        offset_blocks: u64,
        /// Block count.
        num_blocks: u32,
        /// Namespace size.
        capacity_blocks: u64,
    },
    /// A transfer of no blocks, or of more than one buffer holds.
    #[error("a transfer of {num_blocks} blocks: must be 1 to {max_transfer_blocks}")]
    TooLarge {
        /// Block count asked for.
        num_blocks: u32,
        /// The most one request moves.
        max_transfer_blocks: u32,
    },
    /// The buffer index is not one of the device's.
    #[error("buffer {index} does not exist (the device has {buffers})")]
    NoSuchBuffer {
        /// The index given.
        index: u16,
        /// Buffers the device has.
        buffers: u32,
    },
    /// A read failed.
    #[error("read of blocks {offset_blocks}+{num_blocks} failed: {source}")]
    ReadFailed { offset_blocks: u64, num_blocks: u32, source: io::Error },
    /// A write (or trim, or write-zeroes) failed.
    #[error("write of blocks {offset_blocks}+{num_blocks} failed: {source}")]
    WriteFailed { offset_blocks: u64, num_blocks: u32, source: io::Error },
    /// A flush failed: earlier writes may not be durable.
    #[error("flush failed: {source}")]
    FlushFailed { source: io::Error },
    /// The device cannot do this (BLOCK_STATUS on a device that cannot tell holes from data).
    #[error("{operation} is not supported by this {device}")]
    NotSupported {
        /// What was asked for.
        operation: &'static str,
        /// What kind of device refused.
        device: &'static str,
    },
    /// Finding where data lies failed.
    #[error("block status of blocks {offset_blocks}+{num_blocks} failed: {source}")]
    StatusFailed { offset_blocks: u64, num_blocks: u32, source: io::Error },
}

/// A finished request, named by the tag given at submission.
#[derive(Debug)]
pub struct Completion {
    /// The submitter's tag.
    pub tag: u64,
    /// The outcome.
    pub result: Result<(), BlockError>,
}

/// A block namespace driven by one worker loop.
pub trait BlockDevice: Send {
    /// Block size, capacity, queue depth and largest transfer.
    fn geometry(&self) -> Geometry;

    /// Queues a request under `tag` (or hands it to the device at once); never waits for the
    /// device. The request's buffer belongs to the device until its completion is reaped.
    fn submit(&mut self, tag: u64, request: BlockRequest) -> Result<(), BlockError>;

    /// Pushes queued requests to the device and hands every finished one to `on_completion`,
    /// without waiting; returns how many finished.
    fn reap(&mut self, on_completion: &mut dyn FnMut(Completion)) -> usize;

    /// Requests submitted and not yet reaped.
    fn in_flight(&self) -> usize;

    /// The registered buffer behind `index` (`max_transfer_blocks` blocks long), for filling
    /// writes and reading reads.
    fn buffer(&mut self, index: BufferIndex) -> &mut [u8];

    /// Keeps the kernel threads that finish this device's requests for the calling thread (the
    /// worker, once pinned) on `cpus`, away from the worker's own core. Devices without helper
    /// threads ignore it.
    fn place_helpers(&mut self, cpus: &[usize]) -> io::Result<()> {
        let _ = cpus;
        Ok(())
    }

    /// Whether every request completes inside the call that starts it (a memory region): then
    /// [`BlockDevice::execute_now`] serves requests from the caller's memory, and a worker
    /// answers them in the pass that received them instead of waiting for `reap`.
    fn completes_at_once(&self) -> bool {
        false
    }

    /// Executes `request` now, on the calling thread, reading into or writing from the caller's
    /// memory. Only devices that [`complete at once`](BlockDevice::completes_at_once) serve
    /// it; the others (the default) refuse with [`BlockError::NotSupported`], since waiting
    /// for a disk here would stall the worker.
    fn execute_now(&mut self, request: ImmediateRequest<'_>) -> Result<(), BlockError> {
        let _ = request;
        Err(BlockError::NotSupported { operation: "immediate execution", device: "queued device" })
    }

    /// Whether [`BlockDevice::block_status`] tells holes from data here.
    fn reports_allocation(&self) -> bool {
        false
    }

    /// Writes into `extents` where data lies from `offset_blocks` on, and returns how many it
    /// wrote: contiguous extents from `offset_blocks` covering at most `num_blocks` (at least
    /// one block), at least one, at most `extents.len()`. Runs at once on the calling thread,
    /// with work bounded by `extents.len()` and no allocation. Devices that cannot tell (the
    /// default) refuse with [`BlockError::NotSupported`].
    fn block_status(
        &mut self,
        offset_blocks: u64,
        num_blocks: u32,
        extents: &mut [Extent],
    ) -> Result<usize, BlockError> {
        let _ = (offset_blocks, num_blocks, extents);
        Err(BlockError::NotSupported { operation: "block status", device: "device" })
    }
}

/// Checks a BLOCK_STATUS range and the room for its answer against `geometry`.
pub(crate) fn check_status_range(
    geometry: &Geometry,
    offset_blocks: u64,
    num_blocks: u32,
    extents: &[Extent],
) -> Result<(), BlockError> {
    geometry.check_range(offset_blocks, num_blocks)?;
    if num_blocks == 0 || extents.is_empty() {
        // An empty range has no answer of at least one extent; no room is a caller's bug.
        return Err(BlockError::TooLarge { num_blocks, max_transfer_blocks: geometry.max_transfer_blocks });
    }
    Ok(())
}

/// Error for a failed request of `request`, from an `errno`-style error.
pub(crate) fn failure(request: &BlockRequest, source: io::Error) -> BlockError {
    match *request {
        BlockRequest::Read { offset_blocks, num_blocks, .. } => {
            BlockError::ReadFailed { offset_blocks, num_blocks, source }
        }
        BlockRequest::Write { offset_blocks, num_blocks, .. }
        | BlockRequest::Trim { offset_blocks, num_blocks }
        | BlockRequest::WriteZeroes { offset_blocks, num_blocks } => {
            BlockError::WriteFailed { offset_blocks, num_blocks, source }
        }
        BlockRequest::Flush => BlockError::FlushFailed { source },
    }
}
