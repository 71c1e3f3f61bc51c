//! A block namespace on a device that holds every completion for a set time after submission,
//! as a slow (or stalling) disk would: over a crash-test device, so the data is real.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use netdam_nvme::{
    BlockDevice, BlockError, BlockRequest, BufferIndex, Completion, CrashImage, CrashTestDevice, Geometry,
};
use netdam_target::namespaces::Namespace;

/// A crash-test device whose completions are handed over `device_time` (ns, which a test may
/// change while it runs: a disk that stalls) after submission.
pub struct SlowDevice {
    inner: CrashTestDevice,
    device_time: Arc<AtomicU64>,
    submitted_at: HashMap<u64, Instant>,
    held: Vec<(Instant, Completion)>,
}

impl BlockDevice for SlowDevice {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    fn submit(&mut self, tag: u64, request: BlockRequest) -> Result<(), BlockError> {
        self.inner.submit(tag, request)?;
        self.submitted_at.insert(tag, Instant::now());
        Ok(())
    }
    fn reap(&mut self, on_completion: &mut dyn FnMut(Completion)) -> usize {
        let device_time = Duration::from_nanos(self.device_time.load(Ordering::Relaxed));
        let (submitted_at, held) = (&mut self.submitted_at, &mut self.held);
        self.inner.reap(&mut |completion: Completion| {
            let at = submitted_at.remove(&completion.tag).expect("a completion for a submitted request");
            held.push((at + device_time, completion));
        });
        let now = Instant::now();
        let mut handed = 0;
        let mut index = 0;
        while index < self.held.len() {
            if self.held[index].0 <= now {
                on_completion(self.held.swap_remove(index).1);
                handed += 1;
            } else {
                index += 1;
            }
        }
        handed
    }
    fn in_flight(&self) -> usize {
        self.inner.in_flight() + self.held.len()
    }
    fn buffer(&mut self, index: BufferIndex) -> &mut [u8] {
        self.inner.buffer(index)
    }
}

/// A namespace `name` of `blocks` blocks of `block_bytes` on a [`SlowDevice`] taking
/// `device_time` per request.
pub fn namespace(name: &str, block_bytes: u32, blocks: u64, device_time: Duration) -> Namespace {
    let nanos = u64::try_from(device_time.as_nanos()).expect("a device time in u64 ns");
    namespace_with(name, block_bytes, blocks, Arc::new(AtomicU64::new(nanos)))
}

/// As [`namespace`], with the device time (ns) read from `device_time` as each request
/// completes.
pub fn namespace_with(name: &str, block_bytes: u32, blocks: u64, device_time: Arc<AtomicU64>) -> Namespace {
    let image = CrashImage::new(block_bytes, blocks);
    let factory = Arc::new(move |max_transfer: usize, _: netdam_nvme::Submission| {
        let device = SlowDevice {
            inner: image.device(64, max_transfer)?,
            device_time: device_time.clone(),
            submitted_at: HashMap::new(),
            held: Vec::new(),
        };
        Ok(Box::new(device) as Box<dyn BlockDevice>)
    });
    Namespace::new(name, "slow test device", block_bytes, blocks, factory)
}
