//! Block namespaces: the interface the target's worker loop drives for BREAD, BWRITE, FLUSH,
//! TRIM and WRITE_ZEROES.
//!
//! A device is submitted to and reaped from by the same worker loop that serves memory
//! instructions, so a block request never blocks that loop: `submit` queues, `reap` collects
//! what finished. The io_uring backend (O_DIRECT files and block devices) implements this trait.

use std::io;

/// Shape of a namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Bytes per logical block.
    pub block_bytes: u32,
    /// Logical blocks in the namespace.
    pub capacity_blocks: u64,
    /// Requests the device accepts before `submit` answers `QueueFull`.
    pub queue_depth: u32,
}

/// Index of a buffer in the pool the device registered at start-up.
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
    /// Make every previously completed write durable.
    Flush,
    /// Deallocate blocks; later reads return zeroes.
    Trim { offset_blocks: u64, num_blocks: u32 },
    /// Set blocks to zero.
    WriteZeroes { offset_blocks: u64, num_blocks: u32 },
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
    /// A read failed.
    #[error("read of blocks {offset_blocks}+{num_blocks} failed: {source}")]
    ReadFailed { offset_blocks: u64, num_blocks: u32, source: io::Error },
    /// A write failed.
    #[error("write of blocks {offset_blocks}+{num_blocks} failed: {source}")]
    WriteFailed { offset_blocks: u64, num_blocks: u32, source: io::Error },
    /// A flush failed: earlier writes may not be durable.
    #[error("flush failed: {source}")]
    FlushFailed { source: io::Error },
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
    /// Block size, capacity and queue depth.
    fn geometry(&self) -> Geometry;

    /// Queues a request under `tag`; never waits for the device.
    fn submit(&mut self, tag: u64, request: BlockRequest) -> Result<(), BlockError>;

    /// Hands every finished request to `on_completion` without waiting; returns how many.
    fn reap(&mut self, on_completion: &mut dyn FnMut(Completion)) -> usize;

    /// The registered buffer behind `index`, for filling writes and reading reads.
    fn buffer(&mut self, index: BufferIndex) -> &mut [u8];
}
