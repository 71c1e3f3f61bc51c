//! A test backend that keeps written and durable bytes apart, to check that whoever drives it
//! keeps the NVMe promises: a write completed with FUA is durable; FLUSH makes durable every
//! write that completed before the FLUSH was submitted; nothing else is.
//!
//! A request takes effect when it completes, one `reap` pass after it was submitted, so a caller
//! that answers before reaping is caught: its "acknowledged" write is not even written yet.
//! [`CrashImage::crash`] returns the durable bytes only; [`CrashImage::power_cut`] returns one
//! of the images a power cut may leave: per atomic unit (a sector) of every block, the durable
//! bytes or those of any write to it completed since, each unit chosen on its own. That covers
//! the lost, reordered and torn writes a volatile device cache allows, and no more: a FUA write
//! and a completed FLUSH are never undone.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::buffers::AlignedBuffers;
use crate::{BlockDevice, BlockError, BlockRequest, BufferIndex, Completion, Geometry};

#[derive(Debug)]
struct Images {
    written: Vec<u8>,
    durable: Vec<u8>,
    /// Per block, the number of the last completed write (trim and write-zeroes count).
    written_version: Vec<u64>,
    /// Per block, the number of the write whose bytes are durable.
    durable_version: Vec<u64>,
    /// Per block, the writes completed since its durable one, oldest first: a power cut may
    /// leave any of them.
    volatile: Vec<Vec<(u64, Box<[u8]>)>>,
    writes: u64,
}

/// The written image at a FLUSH's submission: what the FLUSH makes durable.
type Snapshot = (Vec<u8>, Vec<u64>);

impl Images {
    fn complete_write(&mut self, block_bytes: usize, offset: usize, data: &[u8], fua: bool) {
        let len = data.len();
        self.written[offset..offset + len].copy_from_slice(data);
        self.writes += 1;
        let blocks = offset / block_bytes..(offset + len) / block_bytes;
        for block in blocks {
            self.written_version[block] = self.writes;
            let range = block * block_bytes..(block + 1) * block_bytes;
            if fua {
                self.durable_version[block] = self.writes;
                self.durable[range.clone()].copy_from_slice(&self.written[range]);
                // Older cached writes of the block are overwritten: none can reach the medium after.
                self.volatile[block].clear();
            } else {
                self.volatile[block].push((self.writes, self.written[range].into()));
            }
        }
    }

    fn complete_flush(&mut self, block_bytes: usize, (bytes, versions): Snapshot) {
        for (block, &version) in versions.iter().enumerate() {
            // A FUA write that completed after the FLUSH was submitted is newer: keep it.
            if version > self.durable_version[block] {
                let range = block * block_bytes..(block + 1) * block_bytes;
                self.durable[range.clone()].copy_from_slice(&bytes[range]);
                self.durable_version[block] = version;
                self.volatile[block].retain(|&(written, _)| written > version);
            }
        }
    }
}

/// The bytes of one crash-test namespace, shared by every worker's device on it.
#[derive(Debug, Clone)]
pub struct CrashImage {
    images: Arc<Mutex<Images>>,
    block_bytes: u32,
}

impl CrashImage {
    /// A zeroed namespace of `capacity_blocks` blocks of `block_bytes`.
    pub fn new(block_bytes: u32, capacity_blocks: u64) -> CrashImage {
        let len = block_bytes as usize * capacity_blocks as usize;
        CrashImage {
            images: Arc::new(Mutex::new(Images {
                written: vec![0; len],
                durable: vec![0; len],
                written_version: vec![0; capacity_blocks as usize],
                durable_version: vec![0; capacity_blocks as usize],
                volatile: vec![Vec::new(); capacity_blocks as usize],
                writes: 0,
            })),
            block_bytes,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Images> {
        // A panic in a test thread must not hide the image from the checks that follow.
        self.images.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// What survives a power cut now: the durable bytes. Written-but-not-durable bytes are lost.
    pub fn crash(&self) -> Vec<u8> {
        self.lock().durable.clone()
    }

    /// One image a power cut now may leave, drawn with `seed`: per `atomic_bytes` of every
    /// block (a power of two from 512 to the block size: the medium's atomic write unit), the
    /// durable bytes or those of any write completed since, each unit drawn on its own.
    pub fn power_cut(&self, seed: u64, atomic_bytes: usize) -> Vec<u8> {
        let block_bytes = self.block_bytes as usize;
        assert!(
            atomic_bytes.is_power_of_two() && (512..=block_bytes).contains(&atomic_bytes),
            "atomic unit of {atomic_bytes} bytes: a power of two from 512 to the {block_bytes}-byte block"
        );
        let images = self.lock();
        let mut rng = netdam_isa::rng::Rng::new(seed);
        let mut image = images.durable.clone();
        for (block, versions) in images.volatile.iter().enumerate() {
            for unit in (0..block_bytes).step_by(atomic_bytes) {
                // 0 keeps the durable bytes; k > 0 takes the k-th write since.
                let chosen = rng.below(versions.len() as u64 + 1) as usize;
                if let Some((_, bytes)) = chosen.checked_sub(1).map(|index| &versions[index]) {
                    let at = block * block_bytes + unit;
                    image[at..at + atomic_bytes].copy_from_slice(&bytes[unit..unit + atomic_bytes]);
                }
            }
        }
        image
    }

    /// What a read sees now.
    pub fn written(&self) -> Vec<u8> {
        self.lock().written.clone()
    }

    /// A device on this image for one worker.
    pub fn device(&self, queue_depth: u32, max_transfer_bytes: usize) -> std::io::Result<CrashTestDevice> {
        let queue_depth = queue_depth.clamp(1, 4096);
        let buffers = AlignedBuffers::new(queue_depth as usize, max_transfer_bytes.max(self.block_bytes as usize))?;
        let capacity_blocks = (self.lock().written.len() / self.block_bytes as usize) as u64;
        let geometry = Geometry {
            block_bytes: self.block_bytes,
            capacity_blocks,
            queue_depth,
            max_transfer_blocks: (buffers.buffer_bytes() / self.block_bytes as usize) as u32,
        };
        Ok(CrashTestDevice {
            image: self.clone(),
            buffers,
            geometry,
            submitted: Vec::with_capacity(queue_depth as usize),
            completing: Vec::with_capacity(queue_depth as usize),
        })
    }
}

/// One worker's device on a [`CrashImage`].
#[derive(Debug)]
pub struct CrashTestDevice {
    image: CrashImage,
    buffers: AlignedBuffers,
    geometry: Geometry,
    /// Submitted in the current pass; a FLUSH carries the written image at its submission.
    submitted: Vec<(u64, BlockRequest, Option<Snapshot>)>,
    /// Submitted in an earlier pass: they complete on the next `reap`.
    completing: Vec<(u64, BlockRequest, Option<Snapshot>)>,
}

impl BlockDevice for CrashTestDevice {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn submit(&mut self, tag: u64, request: BlockRequest) -> Result<(), BlockError> {
        request.validate(&self.geometry)?;
        if self.in_flight() >= self.geometry.queue_depth as usize {
            return Err(BlockError::QueueFull { queue_depth: self.geometry.queue_depth });
        }
        // FLUSH covers the writes completed before it was submitted: remember exactly those.
        let snapshot = matches!(request, BlockRequest::Flush).then(|| {
            let images = self.image.lock();
            (images.written.clone(), images.written_version.clone())
        });
        self.submitted.push((tag, request, snapshot));
        Ok(())
    }

    fn reap(&mut self, on_completion: &mut dyn FnMut(Completion)) -> usize {
        let completing = std::mem::take(&mut self.completing);
        let finished = completing.len();
        for (tag, request, snapshot) in completing {
            let mut images = self.image.lock();
            let geometry = self.geometry;
            match request {
                BlockRequest::Read { offset_blocks, num_blocks, buffer } => {
                    let (offset, len) = geometry.byte_range(offset_blocks, num_blocks);
                    let offset = offset as usize;
                    self.buffers.get(usize::from(buffer.0))[..len]
                        .copy_from_slice(&images.written[offset..offset + len]);
                }
                BlockRequest::Write { offset_blocks, num_blocks, buffer, fua } => {
                    let (offset, len) = geometry.byte_range(offset_blocks, num_blocks);
                    let offset = offset as usize;
                    let data = &self.buffers.get(usize::from(buffer.0))[..len];
                    images.complete_write(geometry.block_bytes as usize, offset, data, fua);
                }
                BlockRequest::Flush => {
                    let snapshot = snapshot.expect("a FLUSH carries its snapshot");
                    images.complete_flush(geometry.block_bytes as usize, snapshot);
                }
                BlockRequest::Trim { offset_blocks, num_blocks }
                | BlockRequest::WriteZeroes { offset_blocks, num_blocks } => {
                    let (offset, len) = geometry.byte_range(offset_blocks, num_blocks);
                    let zeroes = vec![0u8; len];
                    images.complete_write(geometry.block_bytes as usize, offset as usize, &zeroes, false);
                }
            }
            drop(images);
            on_completion(Completion { tag, result: Ok(()) });
        }
        self.completing = std::mem::take(&mut self.submitted);
        finished
    }

    fn in_flight(&self) -> usize {
        self.submitted.len() + self.completing.len()
    }

    fn buffer(&mut self, index: BufferIndex) -> &mut [u8] {
        self.buffers.get(usize::from(index.0))
    }
}
