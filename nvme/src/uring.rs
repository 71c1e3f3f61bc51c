//! The io_uring backend: O_DIRECT reads and writes from registered buffers, FUA as `RWF_DSYNC`,
//! FLUSH as `fdatasync`, WRITE_ZEROES as a zeroed range (`fallocate`, which a block device turns
//! into write-zeroes commands), TRIM as a punched hole on a file and as a discard on a block
//! device (`BLOCK_URING_CMD_DISCARD`, Linux 6.12 and later). On a file, BLOCK_STATUS reads the
//! holes TRIM punched with `lseek(SEEK_DATA/SEEK_HOLE)`; a block device cannot tell.
//!
//! Each worker owns one ring per namespace. `submit` fills a submission entry, and hands a read
//! that does not continue the request before it to the kernel at once; `reap` makes one
//! `io_uring_enter` for everything else queued since the last pass and then reads the
//! completion ring, which needs no system call.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use io_uring::{opcode, types, IoUring};

use crate::allocation::{self, FileSeek};
use crate::buffers::AlignedBuffers;
use crate::{
    check_status_range, failure, BlockDevice, BlockError, BlockRequest, BufferIndex, Completion, Extent, Geometry,
};

/// What a namespace's path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackingKind {
    /// A regular file: its length is the capacity.
    File,
    /// A block device: its size is the capacity.
    BlockDevice,
}

/// A namespace on a file or block device, driven through io_uring.
pub struct UringDevice {
    path: PathBuf,
    // Registered as the ring's file slot 0; BLOCK_STATUS seeks on it.
    file: File,
    direct: bool,
    kind: BackingKind,
    ring: IoUring,
    buffers: AlignedBuffers,
    geometry: Geometry,
    /// Requests in flight by slot (the completion's user data); bounded by the queue depth.
    slots: Vec<Option<(u64, BlockRequest)>>,
    free_slots: Vec<u32>,
    unsubmitted: usize,
    /// The block after the last request handed to `submit`: a read starting there continues it.
    queued_end: u64,
    /// Completions that matched no request in flight: none, unless a bug let one through.
    stray_completions: u64,
    /// Whether BLOCK_STATUS asks FIEMAP for allocated blocks without data; false from the file
    /// system's first refusal (tmpfs has no FIEMAP).
    fiemap: bool,
    /// Whether WRITE_ZEROES zeroes in place (`FALLOC_FL_ZERO_RANGE`); false from the file
    /// system's first refusal (tmpfs has none), after which it punches a hole, which reads as
    /// zeroes too.
    zero_in_place: bool,
    /// By slot: the request's entry zeroes in place (so a refusal of it may be retried by a
    /// punch, once).
    zeroing_in_place: Vec<bool>,
    /// Requests refused `EOPNOTSUPP` for zeroing in place during one `reap`, sent again as
    /// punches after it; as long as the queue, so `reap` never allocates.
    rezero: Vec<(u32, u64, BlockRequest)>,
}

impl std::fmt::Debug for UringDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringDevice")
            .field("path", &self.path)
            .field("direct", &self.direct)
            .field("geometry", &self.geometry)
            .field("in_flight", &self.in_flight())
            .finish_non_exhaustive()
    }
}

const FIXED_FILE: types::Fixed = types::Fixed(0);

/// The user data of the NOP that starts a thread's io-wq: no slot has it.
const NOP_USER_DATA: u64 = u64::MAX;

/// `_IO(0x12, 0)`: discard a byte range of a block device (include/uapi/linux/fs.h).
const BLOCK_URING_CMD_DISCARD: u32 = 0x12 << 8;

/// Who hands queued requests to the kernel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Submission {
    /// The caller, in `submit` (a read that starts a new run) or `reap`'s `io_uring_enter`: an
    /// O_DIRECT request costs the calling worker the kernel's submission path (5-7 µs each on
    /// the machines measured; docs/DECISIONS.md).
    #[default]
    Inline,
    /// A kernel thread of the ring's own (`IORING_SETUP_SQPOLL`) that polls the submission
    /// queue and sleeps after `idle_ms` without work: `reap` then makes no system call while the
    /// thread is awake. The thread needs a core: where it shares one with the worker or the
    /// clients, I/O waits for it to be scheduled.
    KernelThread {
        /// Milliseconds without submissions before the thread sleeps.
        idle_ms: u32,
    },
}

/// Waits up to `timeout` for a ring's kernel submission thread (`iou-sqp-*`) among this
/// process's tasks, so a test can see that `Submission::KernelThread` took effect. The kernel
/// names the thread when it first runs, which a loaded machine can delay. `Err`: the tasks'
/// names at the deadline.
#[doc(hidden)]
pub fn wait_for_submission_thread(timeout: std::time::Duration) -> Result<(), Vec<String>> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let threads: Vec<String> = std::fs::read_dir("/proc/self/task")
            .map_err(|error| vec![format!("/proc/self/task: {error}")])?
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
            .map(|name| name.trim_end().to_string())
            .collect();
        if threads.iter().any(|name| name.starts_with("iou-sqp")) {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            return Err(threads);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

impl UringDevice {
    /// Opens `path` with O_DIRECT (falling back to the page cache, with a warning, where the file
    /// system refuses O_DIRECT), registers `queue_depth` buffers of `max_transfer_bytes`;
    /// requests are submitted inline.
    pub fn open(path: &Path, block_bytes: u32, queue_depth: u32, max_transfer_bytes: usize) -> io::Result<UringDevice> {
        UringDevice::open_with(path, block_bytes, queue_depth, max_transfer_bytes, Submission::Inline)
    }

    /// As [`UringDevice::open`], with requests submitted as `submission` says.
    pub fn open_with(
        path: &Path,
        block_bytes: u32,
        queue_depth: u32,
        max_transfer_bytes: usize,
        submission: Submission,
    ) -> io::Result<UringDevice> {
        if !block_bytes.is_power_of_two() || !(512..=65536).contains(&block_bytes) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("block size {block_bytes}: must be a power of two from 512 to 65536"),
            ));
        }
        let open = |direct: bool| {
            let mut options = OpenOptions::new();
            options.read(true).write(true);
            if direct {
                options.custom_flags(libc::O_DIRECT);
            }
            options.open(path)
        };
        let (file, direct) = match open(true) {
            Ok(file) => (file, true),
            Err(error) if error.raw_os_error() == Some(libc::EINVAL) => {
                tracing::warn!(path = %path.display(), "O_DIRECT refused by the file system: using the page cache");
                (open(false)?, false)
            }
            Err(error) => return Err(error),
        };
        let kind = backing_kind(&file)?;
        let bytes = match kind {
            BackingKind::File => file.metadata()?.len(),
            BackingKind::BlockDevice => block_device_bytes(&file)?,
        };
        let queue_depth = queue_depth.clamp(1, 4096);
        let buffers = AlignedBuffers::new(queue_depth as usize, max_transfer_bytes.max(block_bytes as usize))?;
        let mut builder = IoUring::builder();
        if let Submission::KernelThread { idle_ms } = submission {
            builder.setup_sqpoll(idle_ms);
        }
        let ring = builder.build(queue_depth.next_power_of_two())?;
        ring.submitter().register_files(&[file.as_raw_fd()])?;
        // SAFETY: the buffers live as long as the ring: both are fields of this device, and the
        // ring (declared first among them after the file) is dropped before the buffers.
        unsafe { ring.submitter().register_buffers(&buffers.iovecs())? };
        let geometry = Geometry {
            block_bytes,
            capacity_blocks: bytes / u64::from(block_bytes),
            queue_depth,
            max_transfer_blocks: (buffers.buffer_bytes() / block_bytes as usize) as u32,
        };
        Ok(UringDevice {
            path: path.to_path_buf(),
            file,
            direct,
            kind,
            ring,
            buffers,
            geometry,
            slots: (0..queue_depth).map(|_| None).collect(),
            free_slots: (0..queue_depth).rev().collect(),
            stray_completions: 0,
            fiemap: true,
            zero_in_place: true,
            zeroing_in_place: vec![false; queue_depth as usize],
            rezero: Vec::with_capacity(queue_depth as usize),
            unsubmitted: 0,
            queued_end: u64::MAX,
        })
    }

    /// Whether transfers bypass the page cache.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// The file or device served.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn entry(&mut self, slot: u32, request: &BlockRequest) -> io_uring::squeue::Entry {
        let geometry = self.geometry;
        let entry = match *request {
            BlockRequest::Read { offset_blocks, num_blocks, buffer } => {
                let (offset, len) = geometry.byte_range(offset_blocks, num_blocks);
                let ptr = self.buffers.ptr(usize::from(buffer.0));
                opcode::ReadFixed::new(FIXED_FILE, ptr, len as u32, buffer.0).offset(offset).build()
            }
            BlockRequest::Write { offset_blocks, num_blocks, buffer, fua } => {
                let (offset, len) = geometry.byte_range(offset_blocks, num_blocks);
                let ptr = self.buffers.ptr(usize::from(buffer.0));
                let flags = if fua { libc::RWF_DSYNC } else { 0 };
                opcode::WriteFixed::new(FIXED_FILE, ptr, len as u32, buffer.0).offset(offset).rw_flags(flags).build()
            }
            BlockRequest::Flush => opcode::Fsync::new(FIXED_FILE).flags(types::FsyncFlags::DATASYNC).build(),
            BlockRequest::Trim { offset_blocks, num_blocks } if self.kind == BackingKind::BlockDevice => {
                let (offset, len) = geometry.byte_range(offset_blocks, num_blocks);
                // The kernel reads the range from the entry's addr (start) and addr3 (length),
                // which is where the command bytes begin.
                let mut command = [0u8; 16];
                command[..8].copy_from_slice(&(len as u64).to_le_bytes());
                opcode::UringCmd16::new(FIXED_FILE, BLOCK_URING_CMD_DISCARD).addr(Some(offset)).cmd(command).build()
            }
            BlockRequest::Trim { offset_blocks, num_blocks } => {
                let (offset, len) = geometry.byte_range(offset_blocks, num_blocks);
                opcode::Fallocate::new(FIXED_FILE, len as u64)
                    .offset(offset)
                    .mode(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE)
                    .build()
            }
            BlockRequest::WriteZeroes { offset_blocks, num_blocks } => {
                let (offset, len) = geometry.byte_range(offset_blocks, num_blocks);
                let mode = if self.zero_in_place { libc::FALLOC_FL_ZERO_RANGE } else { libc::FALLOC_FL_PUNCH_HOLE };
                opcode::Fallocate::new(FIXED_FILE, len as u64)
                    .offset(offset)
                    .mode(mode | libc::FALLOC_FL_KEEP_SIZE)
                    .build()
            }
        };
        self.zeroing_in_place[slot as usize] =
            self.zero_in_place && matches!(request, BlockRequest::WriteZeroes { .. });
        entry.user_data(u64::from(slot))
    }
}

impl UringDevice {
    /// Completions `reap` found for no request in flight (and skipped): 0 unless a bug let
    /// one through, such as the NOP of `place_helpers`.
    pub fn stray_completions(&self) -> u64 {
        self.stray_completions
    }

    /// Makes the calling thread's first submission, a NOP, and takes its completion, so that
    /// the kernel has set up this thread's io-wq (see `place_helpers`). Only before any request:
    /// nothing else is in flight then.
    fn start_helpers(&mut self) -> io::Result<()> {
        if self.in_flight() > 0 || self.unsubmitted > 0 {
            return Err(io::Error::other("io_uring helpers are placed before the first request"));
        }
        let nop = opcode::Nop::new().build().user_data(NOP_USER_DATA);
        // SAFETY: a NOP refers to no memory.
        if unsafe { self.ring.submission().push(&nop) }.is_err() {
            return Err(io::Error::other("the submission ring is full"));
        }
        self.ring.submit_and_wait(1)?;
        let mut queue = self.ring.completion();
        queue.sync();
        match queue.next() {
            Some(cqe) if cqe.user_data() == NOP_USER_DATA => Ok(()),
            _ => Err(io::Error::other("the NOP that starts the helpers did not complete")),
        }
    }
}

impl BlockDevice for UringDevice {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn submit(&mut self, tag: u64, request: BlockRequest) -> Result<(), BlockError> {
        request.validate(&self.geometry)?;
        let Some(slot) = self.free_slots.pop() else {
            return Err(BlockError::QueueFull { queue_depth: self.geometry.queue_depth });
        };
        let entry = self.entry(slot, &request);
        // SAFETY: the entry's buffer is a registered buffer owned by this device, which the
        // caller leaves alone until the completion is reaped.
        let pushed = unsafe { self.ring.submission().push(&entry) };
        if pushed.is_err() {
            // The ring has as many entries as there are slots, so this means entries are still
            // waiting for `reap` to submit them: push them now and retry once.
            self.ring.submit().map_err(|source| failure(&request, source))?;
            self.unsubmitted = 0;
            // SAFETY: as above.
            if unsafe { self.ring.submission().push(&entry) }.is_err() {
                self.free_slots.push(slot);
                return Err(BlockError::QueueFull { queue_depth: self.geometry.queue_depth });
            }
        }
        // A read that does not continue the request before it goes to the kernel at once. Left
        // for the pass's one submission, it reached the disk only once the whole batch had been
        // submitted (the kernel plugs a batch of more than two and issues it at the end), and
        // this VM's disk then finished the batch together: 379 against 286 µs from submission
        // to completion for random reads at depth 32 (docs/DECISIONS.md, "Depth 32 on a file,
        // traced"). A read that continues the one before it waits for the pass's submission,
        // where the plug merges the run into larger requests (sequential reads submitted one
        // by one ran at half the rate). Writes measured no better alone, and wait too. A
        // refused submission is retried by `reap`.
        let continues = request.range().is_some_and(|(offset, _)| offset == self.queued_end);
        let submit_now = matches!(request, BlockRequest::Read { .. }) && !continues;
        if let Some((offset, blocks)) = request.range() {
            self.queued_end = offset + u64::from(blocks);
        }
        self.slots[slot as usize] = Some((tag, request));
        self.unsubmitted += 1;
        if submit_now && self.ring.submit().is_ok() {
            self.unsubmitted = 0;
        }
        Ok(())
    }

    fn reap(&mut self, on_completion: &mut dyn FnMut(Completion)) -> usize {
        if self.unsubmitted > 0 {
            match self.ring.submit() {
                Ok(_) => self.unsubmitted = 0,
                // EBUSY/EAGAIN: the completion ring is full; drain it below and retry next pass.
                Err(error) => tracing::debug!(%error, "io_uring submit deferred"),
            }
        }
        let mut finished = 0;
        let mut queue = self.ring.completion();
        queue.sync();
        for cqe in &mut queue {
            let slot = cqe.user_data() as usize;
            let Some((tag, request)) = self.slots.get_mut(slot).and_then(Option::take) else {
                tracing::error!(slot, "io_uring completion for an unknown slot");
                self.stray_completions += 1;
                continue;
            };
            let result = cqe.result();
            if result == -libc::EOPNOTSUPP && self.zeroing_in_place[slot] {
                // The file system cannot zero a range in place (tmpfs): from now on WRITE_ZEROES
                // punches a hole instead, and this one is sent again as a punch after the loop.
                self.zero_in_place = false;
                self.rezero.push((slot as u32, tag, request));
                continue;
            }
            self.free_slots.push(slot as u32);
            let outcome = if result < 0 {
                Err(failure(&request, io::Error::from_raw_os_error(-result)))
            } else {
                let expected = match request {
                    BlockRequest::Read { num_blocks, .. } | BlockRequest::Write { num_blocks, .. } => {
                        Some(num_blocks as usize * self.geometry.block_bytes as usize)
                    }
                    _ => None,
                };
                match expected {
                    // A write to a file within its length comes back short only when the file
                    // system ran out of blocks (or quota) part way: report it as full, like the
                    // ENOSPC the rest of the write would have got.
                    Some(expected)
                        if result as usize != expected
                            && self.kind == BackingKind::File
                            && matches!(request, BlockRequest::Write { .. }) =>
                    {
                        Err(failure(
                            &request,
                            io::Error::new(
                                io::ErrorKind::StorageFull,
                                format!("wrote {result} of {expected} bytes: the file system is full"),
                            ),
                        ))
                    }
                    Some(expected) if result as usize != expected => Err(failure(
                        &request,
                        io::Error::new(io::ErrorKind::UnexpectedEof, format!("moved {result} of {expected} bytes")),
                    )),
                    _ => Ok(()),
                }
            };
            finished += 1;
            on_completion(Completion { tag, result: outcome });
        }
        drop(queue);
        while let Some((slot, tag, request)) = self.rezero.pop() {
            let entry = self.entry(slot, &request);
            // SAFETY: a fallocate entry refers to no buffer.
            let pushed = unsafe { self.ring.submission().push(&entry) }.is_ok()
                || (self.ring.submit().is_ok() && unsafe { self.ring.submission().push(&entry) }.is_ok());
            if pushed {
                self.slots[slot as usize] = Some((tag, request));
                self.unsubmitted += 1;
            } else {
                self.free_slots.push(slot);
                finished += 1;
                let refused = io::Error::other("WRITE_ZEROES could not be sent again as a punched hole");
                on_completion(Completion { tag, result: Err(failure(&request, refused)) });
            }
        }
        finished
    }

    fn in_flight(&self) -> usize {
        self.geometry.queue_depth as usize - self.free_slots.len()
    }

    fn buffer(&mut self, index: BufferIndex) -> &mut [u8] {
        self.buffers.get(usize::from(index.0))
    }

    fn place_helpers(&mut self, cpus: &[usize]) -> io::Result<()> {
        // io_uring's worker threads (io-wq: O_DIRECT writes that cannot be issued without
        // blocking) inherit the submitting thread's affinity; next to a spinning worker pinned
        // to one core they would wait for that core's time slice.
        // The kernel keeps them per submitting thread and creates them at that thread's first
        // submission: before it, IORING_REGISTER_IOWQ_AFF fails with EINVAL (Linux 6.18), and
        // they stayed on the worker's core. So this thread submits a NOP first.
        self.start_helpers()?;
        // SAFETY: cpu_set_t is a plain bit set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        for &cpu in cpus {
            unsafe { libc::CPU_SET(cpu, &mut set) };
        }
        self.ring.submitter().register_iowq_aff(&set)
    }

    fn reports_allocation(&self) -> bool {
        self.kind == BackingKind::File
    }

    fn block_status(
        &mut self,
        offset_blocks: u64,
        num_blocks: u32,
        extents: &mut [Extent],
    ) -> Result<usize, BlockError> {
        if self.kind != BackingKind::File {
            return Err(BlockError::NotSupported { operation: "block status", device: "block device" });
        }
        check_status_range(&self.geometry, offset_blocks, num_blocks, extents)?;
        let mut seek = FileSeek { file: &self.file, fiemap: &mut self.fiemap };
        allocation::walk(&mut seek, self.geometry.block_bytes, offset_blocks, num_blocks, extents)
            .map_err(|source| BlockError::StatusFailed { offset_blocks, num_blocks, source })
    }
}

fn backing_kind(file: &File) -> io::Result<BackingKind> {
    let file_type = file.metadata()?.file_type();
    if file_type.is_file() {
        Ok(BackingKind::File)
    } else if file_type.is_block_device() {
        Ok(BackingKind::BlockDevice)
    } else {
        Err(io::Error::new(io::ErrorKind::InvalidInput, "neither a regular file nor a block device"))
    }
}

fn block_device_bytes(file: &File) -> io::Result<u64> {
    // BLKGETSIZE64 = _IOR(0x12, 114, size_t)
    const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
    let mut bytes: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut bytes as *mut u64) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read that starts elsewhere goes to the kernel as it is queued; a read that continues
    /// the request before it, and a write, wait for `reap`'s one submission, where the kernel's
    /// plug merges a run into larger requests.
    #[test]
    fn a_read_goes_at_once_unless_it_continues_the_request_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ns.img");
        std::fs::File::create(&path).unwrap().set_len(64 * 4096).unwrap();
        let mut device = UringDevice::open(&path, 4096, 8, 8192).unwrap();
        let read =
            |offset_blocks, buffer| BlockRequest::Read { offset_blocks, num_blocks: 1, buffer: BufferIndex(buffer) };
        device.submit(1, read(10, 0)).unwrap();
        assert_eq!(device.unsubmitted, 0, "a read elsewhere is handed over at once");
        device.submit(2, read(11, 1)).unwrap();
        assert_eq!(device.unsubmitted, 1, "the read that continues it waits to be merged");
        device.submit(3, read(40, 2)).unwrap();
        assert_eq!(device.unsubmitted, 0, "a read elsewhere hands over what waited before it");
        let write = BlockRequest::Write { offset_blocks: 50, num_blocks: 1, buffer: BufferIndex(3), fua: false };
        device.submit(4, write).unwrap();
        assert_eq!(device.unsubmitted, 1, "a write waits for reap");
        let mut tags = Vec::new();
        while tags.len() < 4 {
            device.reap(&mut |completion: Completion| {
                completion.result.unwrap();
                tags.push(completion.tag);
            });
        }
        tags.sort_unstable();
        assert_eq!(tags, [1, 2, 3, 4]);
        assert_eq!(device.unsubmitted, 0);
    }
}
