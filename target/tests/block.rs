//! Block namespaces end to end: the client, the target's worker loop and each backend.
//!
//! The data-verification test is written once and run against a file-backed and a pmem-backed
//! namespace. The crash test runs the target on the crash-test device, which keeps written and
//! durable bytes apart, and checks the durability promises at the moment each answer arrives.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{seed, Rng, TestTarget};
use netdam_initiator::{Client, ClientError, Op};
use netdam_isa::block::{Extent, EXTENT_FLAG_HOLE, EXTENT_FLAG_ZERO};
use netdam_isa::control::NamespaceInfo;
use netdam_isa::Status;
use netdam_nvme::{
    BlockDevice, BlockError, BlockRequest, BufferIndex, Completion, CrashImage, CrashTestDevice, Geometry,
};
use netdam_target::config::{ByteSize, Config, NamespaceBackend, NamespaceConfig, PollMode};
use netdam_target::namespaces::Namespace;
use netdam_target::Target;

const BLOCK: u32 = 4096;

fn start(namespaces: Vec<NamespaceConfig>, extra: Vec<Namespace>) -> TestTarget {
    start_submitting(namespaces, extra, 0)
}

/// As `start`, with `block_sqpoll_idle_ms` set (0: inline submission).
fn start_submitting(namespaces: Vec<NamespaceConfig>, extra: Vec<Namespace>, sqpoll_idle_ms: u32) -> TestTarget {
    start_adjusted(namespaces, extra, |config| config.block_sqpoll_idle_ms = sqpoll_idle_ms)
}

/// As `start`, with the settings changed by `adjust`.
fn start_adjusted(
    namespaces: Vec<NamespaceConfig>,
    extra: Vec<Namespace>,
    adjust: impl FnOnce(&mut Config),
) -> TestTarget {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        // Metrics on, on any free port: tests and benchmarks run many targets at once.
        metrics_listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: Some(dir.path().to_path_buf()),
        poll: PollMode::Blocking,
        regions: vec![common::region("mem", 1 << 20, false)],
        namespaces,
        // As in common::start: no BUSY answers because a loaded test machine was slow.
        busy_threshold_us: 60_000,
        pin_workers: false,
        // Many targets share one test process: leave its memory alone.
        lock_memory: false,
        auth: netdam_target::AuthMode::None,
        ..Config::default()
    };
    adjust(&mut config);
    let target = Target::start_with(&config, extra).expect("target starts");
    TestTarget { target, dir }
}

fn namespace(backend: NamespaceBackend, path: &str, bytes: u64) -> NamespaceConfig {
    NamespaceConfig { name: "disk".into(), backend, path: path.into(), size: Some(ByteSize(bytes)), block_size: BLOCK }
}

/// Random-pattern writes of 1 to 40 blocks (so several datagrams each), some with FUA, each
/// followed by a read of a random range checked against a model; then flush, trim and
/// write-zeroes, and the refusals a user can run into.
/// `sqpoll_idle_ms`: the target's `block_sqpoll_idle_ms` (0: inline submission).
fn verify_data_through_the_client(backend: NamespaceBackend, path: &str, sqpoll_idle_ms: u32) {
    const BLOCKS: u64 = 1024;
    let test = start_submitting(vec![namespace(backend, path, BLOCKS * u64::from(BLOCK))], Vec::new(), sqpoll_idle_ms);
    if sqpoll_idle_ms > 0 && backend != NamespaceBackend::Pmem {
        // The setting reached the rings: the kernel made their submission threads.
        let waited = netdam_nvme::wait_for_submission_thread(std::time::Duration::from_secs(5));
        assert!(waited.is_ok(), "no iou-sqp thread among {waited:?}");
    }
    let mut client = Client::connect(test.target.local_addr()).unwrap();
    let disk = client.namespace("disk").unwrap().clone();
    assert_eq!((disk.id, disk.block_bytes, disk.capacity_blocks), (0, BLOCK, BLOCKS));
    let mut rng = Rng::new(seed());
    let mut model = vec![0u8; (BLOCKS * u64::from(BLOCK)) as usize];
    let block = BLOCK as usize;
    for round in 0..150 {
        let blocks = 1 + rng.below(40);
        let first = rng.below(BLOCKS - blocks + 1);
        let data = rng.bytes(blocks as usize * block);
        client.block_write(&disk, first, &data, rng.chance(0.3)).unwrap();
        model[first as usize * block..][..data.len()].copy_from_slice(&data);
        let blocks = 1 + rng.below(40);
        let first = rng.below(BLOCKS - blocks + 1);
        let mut read = vec![0u8; blocks as usize * block];
        client.block_read(&disk, first, &mut read).unwrap();
        assert!(read == model[first as usize * block..][..read.len()], "round {round}: blocks {first}+{blocks} differ");
    }
    client.block_flush(&disk).unwrap();
    client.trim(&disk, 10, 20).unwrap();
    client.write_zeroes(&disk, 100, 3).unwrap();
    model[10 * block..30 * block].fill(0);
    model[100 * block..103 * block].fill(0);
    let mut all = vec![0u8; model.len()];
    client.block_read(&disk, 0, &mut all).unwrap();
    assert!(all == model, "the whole namespace matches the model after trim and write-zeroes");

    // Refusals name the problem; none of them changes a byte.
    let refused = |result: Result<(), ClientError>| match result {
        Err(ClientError::Refused { status, .. }) => status,
        other => panic!("expected a refusal, got {other:?}"),
    };
    let mut one = vec![0u8; block];
    assert_eq!(refused(client.block_read(&disk, BLOCKS, &mut one)), Status::OutOfRange);
    assert_eq!(refused(client.trim(&disk, BLOCKS - 1, 2)), Status::OutOfRange);
    let missing = NamespaceInfo { id: 7, ..disk.clone() };
    assert_eq!(refused(client.block_flush(&missing)), Status::NoSuchSpace);
    assert!(matches!(client.block_write(&disk, 0, &[1, 2, 3], false), Err(ClientError::PartialBlock { .. })));
    let wrong_length = Op { length: 2, ..Op::block_write(disk.id, 0, BLOCK, &one, false) };
    let reply = client.call(&[wrong_length]).unwrap();
    assert_eq!(reply.results().unwrap()[0].status, Status::Malformed, "operand must be exactly the blocks named");
    let nope = client.namespace("nope").unwrap_err();
    assert!(matches!(nope, ClientError::NoSuchNamespace { .. }));
    // By name or id: the refusal lists both, so a wrong id shows the ones there are.
    let listed = format!("{} ({})", disk.name, disk.id);
    assert!(nope.to_string().contains(&format!("(it has, by name and id: {listed}")), "{nope}");
    client.block_read(&disk, 0, &mut all).unwrap();
    assert!(all == model, "refused requests changed nothing");

    // Memory and block instructions in one datagram execute in order and each get a result.
    let reply =
        client.call(&[Op::write(0, 0, b"memory!!"), Op::block_read(0, 0, 1), Op::flush(0), Op::read(0, 0, 8)]).unwrap();
    let results = reply.results().unwrap();
    let statuses: Vec<Status> = results.iter().map(|result| result.status).collect();
    assert_eq!(statuses, [Status::Ok; 4]);
    assert_eq!(results[1].data, &model[..block]);
    assert_eq!(results[3].data, b"memory!!");

    // A restart serves the same bytes.
    let addr = test.target.local_addr();
    drop(client);
    let TestTarget { target, dir } = test;
    target.stop();
    let config = Config {
        listen: addr,
        // Metrics on, on any free port: tests and benchmarks run many targets at once.
        metrics_listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: Some(dir.path().to_path_buf()),
        poll: PollMode::Blocking,
        namespaces: vec![namespace(backend, path, BLOCKS * u64::from(BLOCK))],
        auth: netdam_target::AuthMode::None,
        block_sqpoll_idle_ms: sqpoll_idle_ms,
        ..Config::default()
    };
    let target = Target::start(&config).expect("target restarts");
    let mut client = Client::connect(target.local_addr()).unwrap();
    client.block_read(&disk, 0, &mut all).unwrap();
    assert!(all == model, "the namespace kept its bytes across a restart");
}

#[test]
fn random_data_round_trips_on_a_file_namespace() {
    verify_data_through_the_client(NamespaceBackend::File, "disk.img", 0);
}

#[test]
fn random_data_round_trips_on_a_file_namespace_whose_rings_a_kernel_thread_submits() {
    // Idle after 1 ms: the thread sleeps between the test's requests, so its wake-up is used too.
    verify_data_through_the_client(NamespaceBackend::File, "disk.img", 1);
}

/// A file namespace on tmpfs, which has neither O_DIRECT nor `FALLOC_FL_ZERO_RANGE`: buffered
/// I/O, and WRITE_ZEROES by a punched hole (it was answered `io_error` there).
#[test]
fn random_data_round_trips_on_a_file_namespace_on_tmpfs() {
    let shm = std::path::Path::new("/dev/shm");
    if !shm.is_dir() || !on_tmpfs(shm) {
        eprintln!("skipped: /dev/shm is not a tmpfs here");
        return;
    }
    let path = shm.join(format!("netdam-block-test-{}.img", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let outcome =
        std::panic::catch_unwind(|| verify_data_through_the_client(NamespaceBackend::File, path.to_str().unwrap(), 0));
    let _ = std::fs::remove_file(&path);
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

#[test]
fn random_data_round_trips_on_a_pmem_namespace() {
    verify_data_through_the_client(NamespaceBackend::Pmem, "disk.region", 0);
}

/// BLOCK_STATUS extents as (blocks, flags).
fn extents(extents: Vec<Extent>) -> Vec<(u32, u32)> {
    extents.into_iter().map(|extent| (extent.num_blocks, extent.flags)).collect()
}

const HOLE: u32 = EXTENT_FLAG_HOLE | EXTENT_FLAG_ZERO;

/// Whether `path` is on tmpfs (`statfs`'s TMPFS_MAGIC), whose files answer `lseek` but not FIEMAP.
fn on_tmpfs(path: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let name = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: statfs writes into `stat`, which lives across the call; `name` is a C string.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    unsafe { libc::statfs(name.as_ptr(), &mut stat) == 0 && stat.f_type == libc::TMPFS_MAGIC }
}

/// A file namespace reports what was written as data and what was trimmed as holes, through
/// the client and the worker's block path, alone and inside a run of other block instructions.
#[test]
fn block_status_on_a_file_namespace_shows_writes_and_trims() {
    const BLOCKS: u32 = 1024;
    let test =
        start(vec![namespace(NamespaceBackend::File, "disk.img", u64::from(BLOCKS) * u64::from(BLOCK))], Vec::new());
    let mut client = Client::connect(test.target.local_addr()).unwrap();
    let disk = client.namespace("disk").unwrap().clone();
    assert!(disk.reports_allocation, "HELLO says a file namespace reports allocation");
    assert_eq!(extents(client.block_status(&disk, 0, BLOCKS).unwrap()), [(BLOCKS, HOLE)], "a new namespace is sparse");

    // 64 KiB pieces, so that file systems tracking holes coarsely (xfs, btrfs) agree too.
    let data = vec![0xC3; 16 * BLOCK as usize];
    client.block_write(&disk, 64, &data, false).unwrap();
    client.block_write(&disk, 128, &data, true).unwrap();
    let all = extents(client.block_status(&disk, 0, BLOCKS).unwrap());
    assert_eq!(all, [(64, HOLE), (16, 0), (48, HOLE), (16, 0), (880, HOLE)]);
    assert_eq!(extents(client.block_status(&disk, 70, 1).unwrap()), [(1, 0)], "one block of data");
    assert_eq!(extents(client.block_status(&disk, 72, 64).unwrap()), [(8, 0), (48, HOLE), (8, 0)], "clipped");

    client.trim(&disk, 128, 16).unwrap();
    let trimmed = extents(client.block_status(&disk, 0, BLOCKS).unwrap());
    assert_eq!(trimmed, [(64, HOLE), (16, 0), (944, HOLE)], "the trimmed blocks are a hole again");

    // In one datagram with a read: results in order, each with its own data.
    let reply = client
        .call(&[Op::block_status(disk.id, 60, 8), Op::block_read(disk.id, 64, 1), Op::block_status(disk.id, 128, 4)])
        .unwrap();
    let results = reply.results().unwrap();
    assert_eq!(results.iter().map(|result| result.status).collect::<Vec<_>>(), [Status::Ok; 3]);
    assert_eq!(netdam_isa::block::decode_extents(results[0].data, 8).unwrap().len(), 2);
    assert_eq!(results[1].data, &data[..BLOCK as usize]);
    let hole = netdam_isa::block::decode_extents(results[2].data, 4).unwrap();
    assert_eq!(extents(hole), [(4, HOLE)]);

    // After a TRIM in the same datagram: it runs first, as PROTOCOL.md orders instructions.
    let reply = client.call(&[Op::trim(disk.id, 64, 16), Op::block_status(disk.id, 64, 16)]).unwrap();
    let results = reply.results().unwrap();
    assert_eq!(results[0].status, Status::Ok);
    let after_trim = netdam_isa::block::decode_extents(results[1].data, 16).unwrap();
    assert_eq!(extents(after_trim), [(16, HOLE)], "BLOCK_STATUS sees the TRIM before it");

    // WRITE_ZEROES allocates (FALLOC_FL_ZERO_RANGE): zero, not a hole, where the file system
    // answers FIEMAP; lseek alone calls it a hole. Blocks 512-527, after a hole and before one.
    client.write_zeroes(&disk, 512, 16).unwrap();
    let zeroed = extents(client.block_status(&disk, 496, 48).unwrap());
    if zeroed == [(48, HOLE)] && on_tmpfs(test.dir.path()) {
        eprintln!("skipped: the data directory is on tmpfs, which has no FIEMAP: zeroed blocks show as a hole");
    } else {
        assert_eq!(zeroed, [(16, HOLE), (16, EXTENT_FLAG_ZERO), (16, HOLE)], "write-zeroes leaves allocated zeroes");
    }
    // A TRIM over them makes them a hole again.
    client.trim(&disk, 512, 16).unwrap();
    assert_eq!(extents(client.block_status(&disk, 496, 48).unwrap()), [(48, HOLE)]);

    let refused = |result: Result<Vec<Extent>, ClientError>| match result {
        Err(ClientError::Refused { status, .. }) => status,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert_eq!(refused(client.block_status(&disk, u64::from(BLOCKS) - 1, 2)), Status::OutOfRange);
    assert_eq!(refused(client.block_status(&disk, 0, 0)), Status::Malformed);
    // Far past the end, and past it so far that the range's end overflows: out of range too,
    // never an answer with no extents.
    assert_eq!(refused(client.block_status(&disk, 20_000, 1)), Status::OutOfRange);
    assert_eq!(refused(client.block_status(&disk, u64::MAX, 2)), Status::OutOfRange);
    assert_eq!(refused(client.block_status(&disk, u64::MAX, 1)), Status::OutOfRange);
}

/// Under tenants, a block range past the namespace's end is `out_of_range` for a tenant whose
/// grant reaches the end, however far past it lies, even when its end in blocks or in bytes
/// overflows `u64`; a tenant without a grant over the range is `permission_denied`, in range
/// or not, so it learns nothing about the namespace beyond its grant.
#[test]
fn block_ranges_past_the_end_are_out_of_range_under_a_grant_to_the_end_and_denied_outside_one() {
    use common::{publish_tenants, tenant_client, tenant_record as tenant};
    use netdam_target::tenants::{GrantRecord, GrantSpace};

    const BLOCKS: u64 = 16384;
    let bytes = BLOCKS * u64::from(BLOCK);
    let test = start_adjusted(vec![namespace(NamespaceBackend::File, "disk.img", bytes)], Vec::new(), |config| {
        config.auth = netdam_target::AuthMode::Tenants
    });
    let grant = |space: GrantSpace, range: Option<(u64, u64)>| GrantRecord {
        space,
        permissions: ["block", "read", "write"].iter().map(|name| name.to_string()).collect(),
        range,
    };
    let disk = || GrantSpace::Namespace("disk".into());
    let records = [
        // As the default tenant: everything, everywhere.
        tenant("everything", 1, vec![grant(GrantSpace::All, None)]),
        tenant("upper half", 2, vec![grant(disk(), Some((bytes / 2, bytes / 2)))]),
        tenant("lower half", 3, vec![grant(disk(), Some((0, bytes / 2)))]),
        tenant("memory only", 4, vec![grant(GrantSpace::Region("mem".into()), None)]),
    ];
    let target = &test.target;
    publish_tenants(target, &records);
    let connect = |id: u32| tenant_client(target, id);
    let one_block = vec![0xAB; BLOCK as usize];
    let half = BLOCKS / 2;
    // (what, instruction) past the namespace's end, each also past the lower half's grant.
    let past_the_end = [
        ("BREAD at 2^62: x 4096 overflows", Op::block_read(0, 1 << 62, 1)),
        ("BREAD at the last block number", Op::block_read(0, u64::MAX, 1)),
        ("BREAD just past the end", Op::block_read(0, BLOCKS, 1)),
        ("BREAD straddling the end", Op::block_read(0, BLOCKS - 1, 2)),
        ("BWRITE at the last block number", Op::block_write(0, u64::MAX, BLOCK, &one_block, false)),
        ("BWRITE far past the end", Op::block_write(0, 1 << 40, BLOCK, &one_block, true)),
        ("TRIM whose end overflows", Op::trim(0, u64::MAX, 2)),
        ("WRITE_ZEROES whose end overflows", Op::write_zeroes(0, u64::MAX - 1, 3)),
        ("WRITE_ZEROES whose bytes overflow", Op::write_zeroes(0, (1 << 52) - 1, 1)),
        ("BLOCK_STATUS whose bytes end at 2^64", Op::block_status(0, (1 << 52) - 1, 1)),
        ("BLOCK_STATUS whose end overflows", Op::block_status(0, u64::MAX, 2)),
        ("BLOCK_STATUS far past the end", Op::block_status(0, 20_000, 1)),
    ];
    // One instruction per datagram: each gets its own answer, whatever the others carry.
    let statuses = |client: &mut Client, ops: &[Op]| -> Vec<Status> {
        let status = |op: &Op| client.call(std::slice::from_ref(op)).unwrap().results().unwrap()[0].status;
        ops.iter().map(status).collect()
    };
    let ops: Vec<Op> = past_the_end.iter().map(|(_, op)| op.clone()).collect();
    for (id, name) in [(1, "everything"), (2, "upper half")] {
        let got = statuses(&mut connect(id), &ops);
        for ((what, _), status) in past_the_end.iter().zip(got) {
            assert_eq!(status, Status::OutOfRange, "{name}: {what}");
        }
    }
    for (id, name) in [(3, "lower half"), (4, "memory only")] {
        let got = statuses(&mut connect(id), &ops);
        for ((what, _), status) in past_the_end.iter().zip(got) {
            assert_eq!(status, Status::PermissionDenied, "{name}: {what}");
        }
    }

    // In range, each gets what its grant says.
    let in_the_upper_half = [Op::block_read(0, half, 1), Op::block_write(0, BLOCKS - 1, BLOCK, &one_block, false)];
    let in_the_lower_half = [Op::block_read(0, 0, 1), Op::trim(0, half - 2, 2), Op::block_status(0, 0, 1)];
    let both = [in_the_upper_half.as_slice(), in_the_lower_half.as_slice()].concat();
    assert_eq!(statuses(&mut connect(1), &both), [Status::Ok; 5]);
    let upper = [[Status::Ok; 2].as_slice(), [Status::PermissionDenied; 3].as_slice()].concat();
    assert_eq!(statuses(&mut connect(2), &both), upper, "upper half");
    let lower = [[Status::PermissionDenied; 2].as_slice(), [Status::Ok; 3].as_slice()].concat();
    assert_eq!(statuses(&mut connect(3), &both), lower, "lower half");
    assert_eq!(statuses(&mut connect(4), &both), [Status::PermissionDenied; 5], "memory only");
    // Straddling the line between the halves, within the namespace: refused to both.
    assert_eq!(statuses(&mut connect(3), &[Op::block_read(0, half - 1, 2)]), [Status::PermissionDenied]);
    assert_eq!(statuses(&mut connect(2), &[Op::block_read(0, half - 1, 2)]), [Status::PermissionDenied]);
}

#[test]
fn block_status_on_a_pmem_namespace_is_not_supported() {
    let test = start(vec![namespace(NamespaceBackend::Pmem, "disk.region", 64 * u64::from(BLOCK))], Vec::new());
    let mut client = Client::connect(test.target.local_addr()).unwrap();
    let disk = client.namespace("disk").unwrap().clone();
    assert!(!disk.reports_allocation, "HELLO says a pmem namespace cannot tell");
    match client.block_status(&disk, 0, 64) {
        Err(ClientError::Refused { status: Status::NotSupported, .. }) => {}
        other => panic!("expected not_supported, got {other:?}"),
    }
    // Nothing else is disturbed: the namespace still reads.
    let mut block = vec![1u8; BLOCK as usize];
    client.block_read(&disk, 0, &mut block).unwrap();
    assert!(block.iter().all(|&byte| byte == 0));
}

fn crash_namespace(image: &CrashImage, blocks: u64) -> Namespace {
    let image = image.clone();
    let factory = Arc::new(move |max_transfer: usize, _: netdam_nvme::Submission| {
        let device = image.device(64, max_transfer)?;
        Ok(Box::new(device) as Box<dyn BlockDevice>)
    });
    Namespace::new("crash", "crash-test device", BLOCK, blocks, factory)
}

/// After every answer, a simulated power cut must keep: each block written with FUA, and each
/// block whose write was answered before a FLUSH that has been answered. Writes are pipelined
/// 8 deep so that FLUSH and writes are in flight together.
#[test]
fn acknowledged_fua_and_flushed_writes_survive_a_crash() {
    const BLOCKS: u64 = 64;
    let image = CrashImage::new(BLOCK, BLOCKS);
    let test = start(Vec::new(), vec![crash_namespace(&image, BLOCKS)]);
    let mut client = Client::connect(test.target.local_addr()).unwrap();
    let disk = client.namespace("crash").unwrap().clone();
    let mut rng = Rng::new(seed());
    let block = BLOCK as usize;
    // Per block: the content that must survive (FUA-acknowledged or flushed), and the content
    // of the newest acknowledged write.
    let mut must_survive = vec![vec![0u8; block]; BLOCKS as usize];
    let mut acknowledged = must_survive.clone();
    let mut plain_writes_lost = 0;
    for round in 0..300 {
        if rng.chance(0.15) {
            let answered_before = acknowledged.clone();
            client.block_flush(&disk).unwrap();
            must_survive = answered_before;
            let crashed = image.crash();
            for (index, expected) in must_survive.iter().enumerate() {
                let survived = &crashed[index * block..(index + 1) * block];
                assert!(survived == &expected[..], "round {round}: block {index} lost a write answered before a FLUSH");
            }
            continue;
        }
        // A pipelined batch of writes to distinct blocks, some with FUA.
        let mut targets: Vec<u64> = (0..BLOCKS).collect();
        let batch: Vec<(u64, Vec<u8>, bool)> = (0..8)
            .map(|_| {
                let pick = rng.below(targets.len() as u64) as usize;
                (targets.swap_remove(pick), rng.bytes(block), rng.chance(0.4))
            })
            .collect();
        let ops = batch.iter().map(|(first, data, fua)| Op::block_write(disk.id, *first, BLOCK, data, *fua));
        client.pipeline(ops, |_, reply| reply.data(0).map(|_| ())).unwrap();
        let crashed = image.crash();
        for (first, data, fua) in &batch {
            acknowledged[*first as usize] = data.clone();
            let survived = &crashed[*first as usize * block..(*first as usize + 1) * block];
            if *fua {
                assert!(
                    survived == &data[..],
                    "round {round}: a FUA write to block {first} was answered before it was durable"
                );
                must_survive[*first as usize] = data.clone();
            } else if survived != &data[..] {
                plain_writes_lost += 1;
            }
        }
    }
    // The device really keeps written and durable apart: unflushed plain writes were not durable.
    assert!(plain_writes_lost > 0, "no plain write was ever lost: the crash image is not separate");
    let written = image.written();
    for (index, expected) in acknowledged.iter().enumerate() {
        assert!(written[index * block..(index + 1) * block] == expected[..], "block {index}: reads see the last write");
    }
}

/// A device that completes nothing while its gate is shut: block I/O that takes as long as the
/// test wants.
struct GatedDevice {
    inner: CrashTestDevice,
    open: Arc<AtomicBool>,
}

impl BlockDevice for GatedDevice {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    fn submit(&mut self, tag: u64, request: BlockRequest) -> Result<(), BlockError> {
        self.inner.submit(tag, request)
    }
    fn reap(&mut self, on_completion: &mut dyn FnMut(Completion)) -> usize {
        if self.open.load(Ordering::Acquire) {
            self.inner.reap(on_completion)
        } else {
            0
        }
    }
    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }
    fn buffer(&mut self, index: BufferIndex) -> &mut [u8] {
        self.inner.buffer(index)
    }
}

/// Sends one request datagram of `ops` on a raw socket.
fn send_raw(socket: &std::net::UdpSocket, session: u32, sequence: u64, ops: &[Op]) {
    let mut buffer = vec![0u8; 9000];
    let mut builder = netdam_isa::wire::RequestBuilder::new(&mut buffer, session, sequence).unwrap();
    for op in ops {
        builder.push(&op.as_instruction()).unwrap();
    }
    let len = builder.finish();
    socket.send(&buffer[..len]).unwrap();
}

/// Receives answers until one for `sequence` arrives; returns its datagram status and results.
/// In-progress notices (a request that waits on the device for 5 ms or more earns them) are not
/// answers: skipped, as an initiator does.
fn receive_raw(socket: &std::net::UdpSocket, sequence: u64) -> (Status, Vec<Status>) {
    let mut answer = vec![0u8; 65_536];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        assert!(std::time::Instant::now() < deadline, "no answer to sequence {sequence}");
        let Ok(len) = socket.recv(&mut answer) else { continue };
        let response = netdam_isa::wire::Response::parse(&answer[..len]).expect("answers decode");
        if response.header.sequence == sequence && response.status() != Status::InProgress {
            return (response.status(), response.results().map(|result| result.status).collect());
        }
    }
}

/// While block writes wait on a stalled device, memory READs from another initiator are still
/// answered at once; when every slot for waiting datagrams is taken, a further block datagram is
/// answered BUSY without executing; and once the device moves, every waiting write completes.
#[test]
fn memory_reads_do_not_wait_behind_block_io() {
    let image = CrashImage::new(BLOCK, 128);
    let open = Arc::new(AtomicBool::new(false));
    let gate = open.clone();
    let device_image = image.clone();
    let factory = Arc::new(move |max_transfer: usize, _: netdam_nvme::Submission| {
        let device = GatedDevice { inner: device_image.device(256, max_transfer)?, open: gate.clone() };
        Ok(Box::new(device) as Box<dyn BlockDevice>)
    });
    let test = start(Vec::new(), vec![Namespace::new("slow", "gated test device", BLOCK, 128, factory)]);
    let writer = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    writer.connect(test.target.local_addr()).unwrap();
    writer.set_read_timeout(Some(std::time::Duration::from_millis(100))).unwrap();
    let session = common::hello(&writer);
    let data = vec![0xAB; BLOCK as usize];
    let slots = netdam_isa::limits::PENDING_BLOCK_DATAGRAMS as u64;
    for sequence in 1..=slots {
        send_raw(&writer, session, sequence, &[Op::block_write(0, sequence, BLOCK, &data, false)]);
    }
    // One more block datagram finds no slot: BUSY, nothing executed.
    send_raw(&writer, session, slots + 1, &[Op::block_write(0, 0, BLOCK, &data, false)]);
    let (status, results) = receive_raw(&writer, slots + 1);
    assert_eq!((status, results.len()), (Status::Busy, 0));
    assert_eq!(test.target.stats().get("block_datagrams_deferred"), Some(slots));
    assert_eq!(test.target.stats().get("busy_block_slots_full"), Some(1));

    // Every slot is taken by a write that cannot complete; memory is still served.
    let mut reader = Client::connect(test.target.local_addr()).unwrap();
    // The device completes nothing until the gate opens, so a READ that queued behind the
    // writes would never be answered: each answer (the client gives up after its attempts)
    // proves it did not, with no clock involved.
    for _ in 0..100 {
        let reply = reader.call(&[Op::read(0, 0, 64)]).unwrap();
        assert_eq!(reply.results().unwrap()[0].status, Status::Ok);
    }
    assert!(image.written().iter().all(|&byte| byte == 0), "nothing completed while the device was stalled");

    open.store(true, Ordering::Release);
    for sequence in 1..=slots {
        assert_eq!(receive_raw(&writer, sequence), (Status::Ok, vec![Status::Ok]));
    }
    // One reap completed them all: their answers left in trains (`netdam_udp::Train`), each
    // received above as the datagram it is. A train is counted once it has been sent, so the
    // count may follow the answers by a moment.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while test.target.stats().get("answer_trains") == Some(0) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(test.target.stats().get("answer_trains").unwrap() >= 1, "the answers left in trains");
    let written = image.written();
    let block = BLOCK as usize;
    for index in 0..128 {
        let expected = (1..=slots).contains(&(index as u64));
        let is_written = written[index * block..(index + 1) * block].iter().all(|&byte| byte == 0xAB);
        assert_eq!(is_written, expected, "block {index}: only the answered writes happened");
    }
}
