//! A namespace on a persistent memory region: blocks are copied in and out of the mapping, FUA
//! persists the written range, FLUSH persists the whole region (`msync` writes back only dirty
//! pages; on DAX it flushes cache lines). Everything completes at once: a worker executes
//! requests straight from its datagrams (`execute_now`), and queued ones are handed back by
//! the next `reap`.

use std::sync::Arc;

use netdam_pmem::Region;

use crate::buffers::AlignedBuffers;
use crate::{failure, BlockDevice, BlockError, BlockRequest, BufferIndex, Completion, Geometry, ImmediateRequest};

/// A namespace whose blocks are the bytes of a region.
#[derive(Debug)]
pub struct RegionDevice {
    region: Arc<Region>,
    buffers: AlignedBuffers,
    geometry: Geometry,
    /// Finished requests not yet reaped: bounded by the queue depth.
    done: Vec<Completion>,
}

impl RegionDevice {
    /// A device over `region` with `queue_depth` buffers of `max_transfer_bytes`.
    pub fn new(
        region: Arc<Region>,
        block_bytes: u32,
        queue_depth: u32,
        max_transfer_bytes: usize,
    ) -> std::io::Result<RegionDevice> {
        let queue_depth = queue_depth.clamp(1, 4096);
        let buffers = AlignedBuffers::new(queue_depth as usize, max_transfer_bytes.max(block_bytes as usize))?;
        let geometry = Geometry {
            block_bytes,
            capacity_blocks: region.len() as u64 / u64::from(block_bytes),
            queue_depth,
            max_transfer_blocks: (buffers.buffer_bytes() / block_bytes as usize) as u32,
        };
        Ok(RegionDevice { region, buffers, geometry, done: Vec::with_capacity(queue_depth as usize) })
    }
}

/// Executes one request on `region`: every request of a region device ends here, queued
/// (through a transfer buffer) or immediate.
fn execute(region: &Region, geometry: &Geometry, request: &mut ImmediateRequest<'_>) -> std::io::Result<()> {
    let memory = region.memory();
    let offset = |offset_blocks: u64| geometry.byte_range(offset_blocks, 0).0 as usize;
    match request {
        ImmediateRequest::Read { offset_blocks, out } => {
            memory.read(offset(*offset_blocks), out);
            Ok(())
        }
        ImmediateRequest::Write { offset_blocks, data, fua } => {
            memory.write(offset(*offset_blocks), data);
            if *fua {
                region.persist(offset(*offset_blocks), data.len())?;
            }
            Ok(())
        }
        ImmediateRequest::Flush => region.persist(0, region.len()),
        ImmediateRequest::Trim { offset_blocks, num_blocks }
        | ImmediateRequest::WriteZeroes { offset_blocks, num_blocks } => {
            let (offset, len) = geometry.byte_range(*offset_blocks, *num_blocks);
            memory.fill(offset as usize, len, 0);
            Ok(())
        }
    }
}

impl BlockDevice for RegionDevice {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn submit(&mut self, tag: u64, request: BlockRequest) -> Result<(), BlockError> {
        request.validate(&self.geometry)?;
        if self.done.len() >= self.geometry.queue_depth as usize {
            return Err(BlockError::QueueFull { queue_depth: self.geometry.queue_depth });
        }
        let geometry = self.geometry;
        let mut immediate = match request {
            BlockRequest::Read { offset_blocks, num_blocks, buffer } => {
                let (_, len) = geometry.byte_range(offset_blocks, num_blocks);
                ImmediateRequest::Read { offset_blocks, out: &mut self.buffers.get(usize::from(buffer.0))[..len] }
            }
            BlockRequest::Write { offset_blocks, num_blocks, buffer, fua } => {
                let (_, len) = geometry.byte_range(offset_blocks, num_blocks);
                ImmediateRequest::Write { offset_blocks, data: &self.buffers.get(usize::from(buffer.0))[..len], fua }
            }
            BlockRequest::Flush => ImmediateRequest::Flush,
            BlockRequest::Trim { offset_blocks, num_blocks } => ImmediateRequest::Trim { offset_blocks, num_blocks },
            BlockRequest::WriteZeroes { offset_blocks, num_blocks } => {
                ImmediateRequest::WriteZeroes { offset_blocks, num_blocks }
            }
        };
        let result = execute(&self.region, &geometry, &mut immediate).map_err(|source| failure(&request, source));
        self.done.push(Completion { tag, result });
        Ok(())
    }

    fn completes_at_once(&self) -> bool {
        true
    }

    fn execute_now(&mut self, mut request: ImmediateRequest<'_>) -> Result<(), BlockError> {
        request.validate(&self.geometry)?;
        execute(&self.region, &self.geometry, &mut request)
            .map_err(|source| request.failure(self.geometry.block_bytes, source))
    }

    fn reap(&mut self, on_completion: &mut dyn FnMut(Completion)) -> usize {
        let finished = self.done.len();
        for completion in self.done.drain(..) {
            on_completion(completion);
        }
        finished
    }

    fn in_flight(&self) -> usize {
        self.done.len()
    }

    fn buffer(&mut self, index: BufferIndex) -> &mut [u8] {
        self.buffers.get(usize::from(index.0))
    }
}
