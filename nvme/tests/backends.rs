//! One suite of block-device behaviour, written once and run against every backend: a file
//! through io_uring, a persistent memory region, and the crash-test device.

use std::sync::Arc;

use netdam_isa::block::{EXTENT_FLAG_HOLE, EXTENT_FLAG_ZERO};
use netdam_isa::rng::Rng;
use netdam_nvme::{
    BlockDevice, BlockError, BlockRequest, BufferIndex, Completion, CrashImage, Extent, RegionDevice, Submission,
    UringDevice,
};
use netdam_pmem::{Backing, Region};

const BLOCK: u32 = 4096;
const BLOCKS: u64 = 256;
const DEPTH: u32 = 32;
const MAX_TRANSFER: usize = 8 * BLOCK as usize;

/// Submits `request` and reaps until it completes; other completions are not expected.
fn run(device: &mut dyn BlockDevice, request: BlockRequest) -> Result<(), BlockError> {
    device.submit(7, request)?;
    let mut outcome = None;
    for _ in 0..10_000_000 {
        device.reap(&mut |completion: Completion| {
            assert_eq!(completion.tag, 7);
            outcome = Some(completion.result);
        });
        if let Some(outcome) = outcome.take() {
            return outcome;
        }
        std::hint::spin_loop();
    }
    panic!("request {request:?} never completed");
}

fn write(device: &mut dyn BlockDevice, offset_blocks: u64, data: &[u8], fua: bool) {
    device.buffer(BufferIndex(0))[..data.len()].copy_from_slice(data);
    let num_blocks = (data.len() / BLOCK as usize) as u32;
    run(device, BlockRequest::Write { offset_blocks, num_blocks, buffer: BufferIndex(0), fua }).unwrap();
}

fn read(device: &mut dyn BlockDevice, offset_blocks: u64, num_blocks: u32) -> Vec<u8> {
    run(device, BlockRequest::Read { offset_blocks, num_blocks, buffer: BufferIndex(1) }).unwrap();
    device.buffer(BufferIndex(1))[..num_blocks as usize * BLOCK as usize].to_vec()
}

/// The suite: geometry, read after write with random patterns, trim and write-zeroes read as
/// zeroes, flush and FUA complete, refusals name the problem, and a full queue pushes back.
fn conformance(device: &mut dyn BlockDevice) {
    let geometry = device.geometry();
    assert_eq!((geometry.block_bytes, geometry.capacity_blocks, geometry.queue_depth), (BLOCK, BLOCKS, DEPTH));
    assert_eq!(geometry.max_transfer_blocks, 8);
    assert_eq!(device.in_flight(), 0);

    let mut rng = Rng::new(0x5eed);
    let mut model = vec![0u8; (BLOCKS * u64::from(BLOCK)) as usize];
    for round in 0..200 {
        let blocks = 1 + rng.below(8) as u32;
        let offset = rng.below(BLOCKS - u64::from(blocks) + 1);
        let data = rng.bytes(blocks as usize * BLOCK as usize);
        write(device, offset, &data, round % 3 == 0);
        let start = (offset * u64::from(BLOCK)) as usize;
        model[start..start + data.len()].copy_from_slice(&data);
        let check_blocks = 1 + rng.below(8) as u32;
        let check = rng.below(BLOCKS - u64::from(check_blocks) + 1);
        let start = (check * u64::from(BLOCK)) as usize;
        let same = read(device, check, check_blocks) == model[start..start + check_blocks as usize * BLOCK as usize];
        assert!(same, "round {round}: blocks {check}+{check_blocks} read other bytes than written");
    }
    run(device, BlockRequest::Flush).unwrap();

    run(device, BlockRequest::Trim { offset_blocks: 10, num_blocks: 3 }).unwrap();
    assert!(read(device, 10, 3).iter().all(|&byte| byte == 0), "trimmed blocks read as zeroes");
    run(device, BlockRequest::WriteZeroes { offset_blocks: 20, num_blocks: 5 }).unwrap();
    assert!(read(device, 20, 5).iter().all(|&byte| byte == 0), "zeroed blocks read as zeroes");
    model[10 * BLOCK as usize..13 * BLOCK as usize].fill(0);
    model[20 * BLOCK as usize..25 * BLOCK as usize].fill(0);
    let neighbour = (25 * BLOCK) as usize;
    assert_eq!(read(device, 25, 1), &model[neighbour..neighbour + BLOCK as usize], "the next block is untouched");

    let beyond = BlockRequest::Read { offset_blocks: BLOCKS - 1, num_blocks: 2, buffer: BufferIndex(0) };
    let error = device.submit(1, beyond).unwrap_err();
    assert!(matches!(error, BlockError::OutOfRange { capacity_blocks: BLOCKS, .. }), "{error}");
    let huge = BlockRequest::Write { offset_blocks: 0, num_blocks: 9, buffer: BufferIndex(0), fua: false };
    assert!(matches!(device.submit(1, huge).unwrap_err(), BlockError::TooLarge { .. }));
    let no_buffer = BlockRequest::Read { offset_blocks: 0, num_blocks: 1, buffer: BufferIndex(DEPTH as u16) };
    assert!(matches!(device.submit(1, no_buffer).unwrap_err(), BlockError::NoSuchBuffer { .. }));
    assert_eq!(device.in_flight(), 0, "refused requests take no slot");

    // A full queue: DEPTH reads in flight at once, then one more is refused; all complete.
    for index in 0..DEPTH {
        let request =
            BlockRequest::Read { offset_blocks: u64::from(index), num_blocks: 1, buffer: BufferIndex(index as u16) };
        device.submit(u64::from(index), request).unwrap();
    }
    let extra = BlockRequest::Flush;
    assert!(matches!(device.submit(99, extra).unwrap_err(), BlockError::QueueFull { queue_depth: DEPTH }));
    let mut seen = vec![false; DEPTH as usize];
    let mut passes = 0;
    while seen.iter().any(|done| !done) {
        device.reap(&mut |completion: Completion| {
            completion.result.unwrap();
            assert!(!std::mem::replace(&mut seen[completion.tag as usize], true), "one completion per tag");
        });
        passes += 1;
        assert!(passes < 10_000_000, "queued reads never completed");
    }
    for index in 0..DEPTH as usize {
        let start = index * BLOCK as usize;
        let same = device.buffer(BufferIndex(index as u16))[..BLOCK as usize] == model[start..start + BLOCK as usize];
        assert!(same, "queued read {index} returned other bytes");
    }
    assert_eq!(device.in_flight(), 0);
}

#[test]
fn uring_file_backend() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ns.img");
    std::fs::File::create(&path).unwrap().set_len(BLOCKS * u64::from(BLOCK)).unwrap();
    let mut device = UringDevice::open(&path, BLOCK, DEPTH, MAX_TRANSFER).unwrap();
    conformance(&mut device);
    // Written through the ring, read back through the file system: the bytes are on the file.
    let bytes = std::fs::read(&path).unwrap();
    let mut device = UringDevice::open(&path, BLOCK, DEPTH, MAX_TRANSFER).unwrap();
    assert_eq!(read(&mut device, 30, 4), &bytes[30 * BLOCK as usize..34 * BLOCK as usize]);
}

#[test]
fn uring_file_backend_with_a_submission_thread() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ns.img");
    std::fs::File::create(&path).unwrap().set_len(BLOCKS * u64::from(BLOCK)).unwrap();
    let submission = Submission::KernelThread { idle_ms: 1 };
    let mut device = UringDevice::open_with(&path, BLOCK, DEPTH, MAX_TRANSFER, submission).unwrap();
    // The kernel made the ring's submission thread.
    let waited = netdam_nvme::wait_for_submission_thread(std::time::Duration::from_secs(5));
    assert!(waited.is_ok(), "no iou-sqp thread among {waited:?}");
    // Its helpers are placed as a worker's are (their NOP goes through the submission thread).
    // SAFETY: sched_getcpu takes no arguments.
    let cpu = usize::try_from(unsafe { libc::sched_getcpu() }).unwrap();
    device.place_helpers(&[cpu]).expect("helpers of a ring with a submission thread placed");
    conformance(&mut device);
    assert_eq!(device.stray_completions(), 0);
    let bytes = std::fs::read(&path).unwrap();
    // After the thread has gone idle, a submission wakes it.
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert_eq!(read(&mut device, 30, 4), &bytes[30 * BLOCK as usize..34 * BLOCK as usize]);
}

/// A worker places the ring's helper threads (io-wq) from its own thread before its first
/// request, on a ring the target opened on another thread. The kernel creates them at a
/// thread's first submission and refused the placement before it (EINVAL on Linux 6.18), which
/// left them on the busy worker's core; the device now submits a NOP first, whose completion
/// must not reach `reap`.
#[test]
fn uring_helpers_are_placed_from_a_fresh_thread_before_any_request() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ns.img");
    std::fs::File::create(&path).unwrap().set_len(BLOCKS * u64::from(BLOCK)).unwrap();
    let mut device = UringDevice::open(&path, BLOCK, DEPTH, MAX_TRANSFER).unwrap();
    std::thread::spawn(move || {
        // SAFETY: sched_getcpu takes no arguments.
        let cpu = usize::try_from(unsafe { libc::sched_getcpu() }).unwrap();
        device.place_helpers(&[cpu]).expect("helpers placed before the first request");
        assert_eq!(device.in_flight(), 0);
        conformance(&mut device);
        assert_eq!(device.stray_completions(), 0, "the NOP's completion reached reap");
        // Not while a request waits: its completion could be taken for the NOP's.
        device.submit(8, BlockRequest::Read { offset_blocks: 0, num_blocks: 1, buffer: BufferIndex(1) }).unwrap();
        let busy = device.place_helpers(&[cpu]).unwrap_err();
        assert!(busy.to_string().contains("before the first request"), "{busy}");
        let mut tags = Vec::new();
        while tags.is_empty() {
            device.reap(&mut |completion: Completion| tags.push((completion.tag, completion.result.is_ok())));
        }
        assert_eq!(tags, [(8, true)]);
    })
    .join()
    .unwrap();
}

/// The allocation of `num_blocks` from `offset_blocks` as (blocks, flags).
fn status(device: &mut dyn BlockDevice, offset_blocks: u64, num_blocks: u32) -> Vec<(u32, u32)> {
    let mut extents = [Extent::default(); 64];
    let count = device.block_status(offset_blocks, num_blocks, &mut extents).unwrap();
    extents[..count].iter().map(|extent| (extent.num_blocks, extent.flags)).collect()
}

#[test]
fn uring_file_backend_reports_written_blocks_and_trimmed_holes() {
    const HOLE: u32 = EXTENT_FLAG_HOLE | EXTENT_FLAG_ZERO;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sparse.img");
    std::fs::File::create(&path).unwrap().set_len(BLOCKS * u64::from(BLOCK)).unwrap();
    let mut device = UringDevice::open(&path, BLOCK, DEPTH, MAX_TRANSFER).unwrap();
    assert!(device.reports_allocation());
    assert_eq!(status(&mut device, 0, BLOCKS as u32), [(BLOCKS as u32, HOLE)], "a new sparse file is one hole");
    // 64 KiB at a time, so file systems that track holes coarsely (xfs, btrfs) agree.
    write(&mut device, 32, &vec![0xA5; 8 * BLOCK as usize], false);
    write(&mut device, 48, &vec![0x5A; 8 * BLOCK as usize], true);
    assert_eq!(status(&mut device, 0, BLOCKS as u32), [(32, HOLE), (8, 0), (8, HOLE), (8, 0), (200, HOLE)]);
    assert_eq!(status(&mut device, 36, 14), [(4, 0), (8, HOLE), (2, 0)], "clipped to the range asked about");
    run(&mut device, BlockRequest::Trim { offset_blocks: 48, num_blocks: 8 }).unwrap();
    assert_eq!(status(&mut device, 0, BLOCKS as u32), [(32, HOLE), (8, 0), (216, HOLE)], "the trim punched a hole");
    let mut one = [Extent::default(); 1];
    assert_eq!(device.block_status(0, BLOCKS as u32, &mut one).unwrap(), 1, "a short answer when room is short");
    assert_eq!(one[0], Extent { num_blocks: 32, flags: HOLE });
    let beyond = device.block_status(BLOCKS - 1, 2, &mut one).unwrap_err();
    assert!(matches!(beyond, BlockError::OutOfRange { .. }), "{beyond}");
}

#[test]
fn pmem_region_backend() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ns.region");
    let region = Arc::new(Region::open("ns", Backing::File(path.clone()), BLOCKS * u64::from(BLOCK)).unwrap());
    let mut device = RegionDevice::new(region.clone(), BLOCK, DEPTH, MAX_TRANSFER).unwrap();
    conformance(&mut device);
    drop(device);
    drop(region);
    let region = Arc::new(Region::open("ns", Backing::File(path), BLOCKS * u64::from(BLOCK)).unwrap());
    let mut reopened = RegionDevice::new(region, BLOCK, DEPTH, MAX_TRANSFER).unwrap();
    assert!(read(&mut reopened, 20, 5).iter().all(|&byte| byte == 0), "the region kept the zeroed range");
    // A memory region has no holes to report.
    assert!(!reopened.reports_allocation());
    let refused = reopened.block_status(0, 1, &mut [Extent::default(); 4]).unwrap_err();
    assert!(matches!(refused, BlockError::NotSupported { .. }), "{refused}");
}

/// A region device serves requests at once from and into the caller's memory, sees what its
/// queued requests wrote and the other way round, and refuses what `submit` refuses; a device
/// that queues (io_uring) refuses to serve at once.
#[test]
fn region_backend_executes_at_once_and_queued_devices_refuse() {
    use netdam_nvme::ImmediateRequest;
    let dir = tempfile::tempdir().unwrap();
    let region =
        Arc::new(Region::open("ns", Backing::File(dir.path().join("ns.region")), BLOCKS * u64::from(BLOCK)).unwrap());
    let mut device = RegionDevice::new(region, BLOCK, DEPTH, MAX_TRANSFER).unwrap();
    assert!(device.completes_at_once());
    let data = Rng::new(7).bytes(2 * BLOCK as usize);
    device.execute_now(ImmediateRequest::Write { offset_blocks: 10, data: &data, fua: true }).unwrap();
    assert_eq!(read(&mut device, 10, 2), data, "a queued read sees the immediate write");
    write(&mut device, 12, &data[..BLOCK as usize], false);
    let mut out = vec![0u8; 3 * BLOCK as usize];
    device.execute_now(ImmediateRequest::Read { offset_blocks: 10, out: &mut out }).unwrap();
    assert_eq!(&out[..2 * BLOCK as usize], &data[..], "an immediate read sees the immediate write");
    assert_eq!(&out[2 * BLOCK as usize..], &data[..BLOCK as usize], "and the queued one");
    device.execute_now(ImmediateRequest::WriteZeroes { offset_blocks: 10, num_blocks: 1 }).unwrap();
    device.execute_now(ImmediateRequest::Trim { offset_blocks: 11, num_blocks: 1 }).unwrap();
    device.execute_now(ImmediateRequest::Flush).unwrap();
    assert!(read(&mut device, 10, 2).iter().all(|&byte| byte == 0));
    assert_eq!(device.in_flight(), 0, "nothing immediate waits for reap");

    // Refusals: blocks 0 and the last hold a pattern that nothing refused may change.
    let pattern = Rng::new(8).bytes(BLOCK as usize);
    write(&mut device, 0, &pattern, false);
    write(&mut device, BLOCKS - 1, &pattern, false);
    let mut out = vec![0u8; BLOCK as usize];
    let beyond = device.execute_now(ImmediateRequest::Read { offset_blocks: BLOCKS, out: &mut out }).unwrap_err();
    assert!(matches!(beyond, BlockError::OutOfRange { .. }), "{beyond}");
    let mut part = vec![0u8; 100];
    let partial = device.execute_now(ImmediateRequest::Read { offset_blocks: 0, out: &mut part }).unwrap_err();
    assert!(matches!(partial, BlockError::TooLarge { .. }), "not whole blocks: {partial}");
    let huge = vec![0xEE; MAX_TRANSFER + BLOCK as usize];
    let too_large =
        device.execute_now(ImmediateRequest::Write { offset_blocks: 0, data: &huge, fua: false }).unwrap_err();
    assert!(matches!(too_large, BlockError::TooLarge { .. }), "{too_large}");
    let zeroes = device.execute_now(ImmediateRequest::WriteZeroes { offset_blocks: BLOCKS - 1, num_blocks: 2 });
    assert!(matches!(zeroes, Err(BlockError::OutOfRange { .. })), "{zeroes:?}");
    let unaligned = device.execute_now(ImmediateRequest::Write { offset_blocks: 0, data: &huge[..100], fua: false });
    assert!(matches!(unaligned, Err(BlockError::TooLarge { .. })), "{unaligned:?}");
    assert_eq!(read(&mut device, 0, 1), pattern, "nothing refused was written");
    assert_eq!(read(&mut device, BLOCKS - 1, 1), pattern, "nothing refused was written");

    let path = dir.path().join("ns.img");
    std::fs::File::create(&path).unwrap().set_len(BLOCKS * u64::from(BLOCK)).unwrap();
    let mut queued = UringDevice::open(&path, BLOCK, DEPTH, MAX_TRANSFER).unwrap();
    assert!(!queued.completes_at_once());
    let refused = queued.execute_now(ImmediateRequest::Flush).unwrap_err();
    assert!(matches!(refused, BlockError::NotSupported { .. }), "{refused}");
}

/// On a region, an immediate write with FUA is durable when it returns; one without is durable
/// after the FLUSH that follows it, and not before.
#[test]
fn region_backend_immediate_writes_are_durable_after_fua_or_flush() {
    use netdam_nvme::ImmediateRequest;
    let region = Arc::new(Region::crash_test("ns", BLOCKS * u64::from(BLOCK)).unwrap());
    let mut device = RegionDevice::new(region.clone(), BLOCK, DEPTH, MAX_TRANSFER).unwrap();
    let block = |index: u64| index as usize * BLOCK as usize..(index as usize + 1) * BLOCK as usize;
    let fua = vec![0xF1; BLOCK as usize];
    let plain = vec![0x7A; BLOCK as usize];
    device.execute_now(ImmediateRequest::Write { offset_blocks: 3, data: &fua, fua: true }).unwrap();
    device.execute_now(ImmediateRequest::Write { offset_blocks: 5, data: &plain, fua: false }).unwrap();
    // A power cut keeps each word stored since the last persist or not, at random (seeded).
    for seed in 0..8 {
        let image = region.power_cut(seed).unwrap();
        assert_eq!(&image[block(3)], &fua[..], "a FUA write is durable when it returns");
    }
    let image = region.power_cut(1).unwrap();
    assert_ne!(&image[block(5)], &plain[..], "a plain write may be lost before a FLUSH");
    device.execute_now(ImmediateRequest::Flush).unwrap();
    for seed in 0..8 {
        let image = region.power_cut(seed).unwrap();
        assert_eq!(&image[block(5)], &plain[..], "the FLUSH made it durable");
    }
}

#[test]
fn crash_test_backend() {
    let image = CrashImage::new(BLOCK, BLOCKS);
    let mut device = image.device(DEPTH, MAX_TRANSFER).unwrap();
    conformance(&mut device);
}

#[test]
fn crash_test_backend_keeps_only_fua_and_flushed_writes() {
    let image = CrashImage::new(BLOCK, 8);
    let mut device = image.device(4, MAX_TRANSFER).unwrap();
    let block = |byte: u8| vec![byte; BLOCK as usize];
    write(&mut device, 0, &block(1), false);
    write(&mut device, 1, &block(2), true);
    let crashed = image.crash();
    assert_eq!(&crashed[..BLOCK as usize], &block(0)[..], "a plain write is not durable yet");
    assert_eq!(&crashed[BLOCK as usize..2 * BLOCK as usize], &block(2)[..], "a FUA write is");
    run(&mut device, BlockRequest::Flush).unwrap();
    assert_eq!(&image.crash()[..BLOCK as usize], &block(1)[..], "FLUSH made the completed write durable");

    // A FLUSH covers only writes completed before it was submitted.
    device.buffer(BufferIndex(0)).fill(3);
    device.submit(1, BlockRequest::Flush).unwrap();
    device
        .submit(2, BlockRequest::Write { offset_blocks: 2, num_blocks: 1, buffer: BufferIndex(0), fua: false })
        .unwrap();
    let mut done = 0;
    while done < 2 {
        done += device.reap(&mut |completion: Completion| completion.result.unwrap());
    }
    assert_eq!(&image.written()[2 * BLOCK as usize..3 * BLOCK as usize], &block(3)[..]);
    assert_eq!(&image.crash()[2 * BLOCK as usize..3 * BLOCK as usize], &block(0)[..], "written after the FLUSH began");

    // A FUA write that completes while an earlier FLUSH is in flight stays durable.
    device.buffer(BufferIndex(1)).fill(4);
    device.submit(3, BlockRequest::Flush).unwrap();
    device.reap(&mut |_| {});
    device
        .submit(4, BlockRequest::Write { offset_blocks: 2, num_blocks: 1, buffer: BufferIndex(1), fua: true })
        .unwrap();
    let mut done = 0;
    while done < 2 {
        done += device.reap(&mut |completion: Completion| completion.result.unwrap());
    }
    assert_eq!(&image.crash()[2 * BLOCK as usize..3 * BLOCK as usize], &block(4)[..]);
}

/// A power-cut image keeps every FUA and flushed write, and leaves each unit of an unflushed
/// one (a sector, or the whole block when that is the medium's atomic unit) old or new on its
/// own: over many draws both outcomes, and torn blocks, occur.
#[test]
fn power_cut_images_keep_durable_writes_and_lose_or_tear_the_rest() {
    let image = CrashImage::new(BLOCK, 4);
    let mut device = image.device(4, MAX_TRANSFER).unwrap();
    let block = |byte: u8| vec![byte; BLOCK as usize];
    let bytes = BLOCK as usize;
    write(&mut device, 0, &block(1), true);
    write(&mut device, 1, &block(2), false);
    run(&mut device, BlockRequest::Flush).unwrap();
    write(&mut device, 2, &block(3), false);
    write(&mut device, 2, &block(4), false);
    write(&mut device, 3, &block(5), true);
    write(&mut device, 3, &block(6), false);
    let mut seen = std::collections::HashSet::new();
    let mut torn = 0;
    for seed in 0..200 {
        let cut = image.power_cut(seed, 512);
        assert_eq!(&cut[..2 * bytes], &[block(1), block(2)].concat()[..], "FUA and flushed writes survive");
        for (index, allowed) in [(2, [0u8, 3, 4]), (3, [5, 6, 6])] {
            let sectors: Vec<u8> =
                cut[index * bytes..(index + 1) * bytes].chunks(512).map(|sector| sector[0]).collect();
            for (sector, &first) in cut[index * bytes..(index + 1) * bytes].chunks(512).zip(&sectors) {
                assert!(allowed.contains(&first) && sector.iter().all(|&byte| byte == first), "sectors are whole");
                seen.insert((index, first));
            }
            torn += usize::from(sectors.iter().any(|&first| first != sectors[0]));
        }
        let whole = image.power_cut(seed, bytes);
        let versions: std::collections::HashSet<u8> = whole[2 * bytes..3 * bytes].iter().copied().collect();
        assert_eq!(versions.len(), 1, "a block-sized atomic unit is never torn");
    }
    let all = [(2, 0), (2, 3), (2, 4), (3, 5), (3, 6)];
    assert!(all.iter().all(|outcome| seen.contains(outcome)), "every allowed outcome occurs: {seen:?}");
    assert!(torn > 0, "no draw tore a block");
}

/// A loop device over a file stands in for an NVMe drive: the same suite through the block-device
/// path (device size from the kernel, TRIM as a discard command). Needs root and `losetup`, so
/// ops/test.sh runs it when it can and says why when it cannot.
#[test]
#[ignore = "needs root and a loop device; ops/test.sh runs it where it can"]
fn uring_block_device_backend_on_a_loop_device() {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("loop.img");
    std::fs::File::create(&backing).unwrap().set_len(BLOCKS * u64::from(BLOCK)).unwrap();
    let output = std::process::Command::new("losetup")
        .args(["--find", "--show", "--sector-size", "4096"])
        .arg(&backing)
        .output()
        .expect("losetup runs");
    assert!(output.status.success(), "losetup failed: {}", String::from_utf8_lossy(&output.stderr));
    let device = std::path::PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    struct Detach(std::path::PathBuf);
    impl Drop for Detach {
        fn drop(&mut self) {
            let _ = std::process::Command::new("losetup").arg("--detach").arg(&self.0).status();
        }
    }
    let _detach = Detach(device.clone());
    let mut uring = UringDevice::open(&device, BLOCK, DEPTH, MAX_TRANSFER).unwrap();
    assert!(uring.is_direct(), "block devices take O_DIRECT");
    conformance(&mut uring);
    assert!(!uring.reports_allocation(), "a block device cannot tell holes from data");
    let refused = uring.block_status(0, 1, &mut [Extent::default(); 4]).unwrap_err();
    assert!(matches!(refused, BlockError::NotSupported { .. }), "{refused}");
}
