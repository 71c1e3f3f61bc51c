//! A namespace on a persistent memory region: blocks are copied in and out of the mapping, FUA
//! persists the written range, FLUSH persists the whole region (`msync` writes back only dirty
//! pages; on DAX it flushes cache lines). Everything completes at once, so `reap` hands back
//! what the last passes submitted.

use std::sync::Arc;

use netdam_pmem::Region;

use crate::buffers::AlignedBuffers;
use crate::{failure, BlockDevice, BlockError, BlockRequest, BufferIndex, Completion, Geometry};

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

    fn execute(&mut self, request: &BlockRequest) -> std::io::Result<()> {
        let memory = self.region.memory();
        match *request {
            BlockRequest::Read { offset_blocks, num_blocks, buffer } => {
                let (offset, len) = self.geometry.byte_range(offset_blocks, num_blocks);
                memory.read(offset as usize, &mut self.buffers.get(usize::from(buffer.0))[..len]);
                Ok(())
            }
            BlockRequest::Write { offset_blocks, num_blocks, buffer, fua } => {
                let (offset, len) = self.geometry.byte_range(offset_blocks, num_blocks);
                memory.write(offset as usize, &self.buffers.get(usize::from(buffer.0))[..len]);
                if fua {
                    self.region.persist(offset as usize, len)?;
                }
                Ok(())
            }
            BlockRequest::Flush => self.region.persist(0, self.region.len()),
            BlockRequest::Trim { offset_blocks, num_blocks }
            | BlockRequest::WriteZeroes { offset_blocks, num_blocks } => {
                let (offset, len) = self.geometry.byte_range(offset_blocks, num_blocks);
                memory.fill(offset as usize, len, 0);
                Ok(())
            }
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
        let result = self.execute(&request).map_err(|source| failure(&request, source));
        self.done.push(Completion { tag, result });
        Ok(())
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
