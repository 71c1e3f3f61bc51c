//! The engine through its C ABI, as the fio shim drives it, against a target in this process:
//! writes, reads, trims and syncs on a namespace and a region, with both poll modes and two
//! sessions, and the errors a user meets. (ops/fio-tests.sh runs the same paths under fio.)

use std::ffi::{c_void, CString};
use std::ptr;

use netdam_fio::{
    netdam_fio_close, netdam_fio_commit, netdam_fio_open, netdam_fio_probe, netdam_fio_reap, netdam_fio_submit,
    FioCompletion, FioEngine, FioSettings, FioSpace,
};
use netdam_target::config::{
    ByteSize, Config, NamespaceBackend, NamespaceConfig, PollMode, RegionBackend, RegionConfig,
};
use netdam_target::Target;

const BLOCK: usize = 4096;
const NAMESPACE_BYTES: u64 = 4 << 20;
const REGION_BYTES: u64 = 1 << 20;
/// A namespace of 512-byte blocks: small I/Os pack 16 to a datagram.
const SMALL_BLOCK: usize = 512;
const SMALL_NAMESPACE_BYTES: u64 = 1 << 20;
const IODEPTH: usize = 8;

const READ: u32 = 0;
const WRITE: u32 = 1;
const SYNC: u32 = 2;
const TRIM: u32 = 3;

struct TestTarget {
    target: Target,
    _dir: tempfile::TempDir,
}

fn start() -> TestTarget {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: Some(dir.path().to_path_buf()),
        poll: PollMode::Blocking,
        regions: vec![RegionConfig {
            name: "scratch".into(),
            backend: RegionBackend::Mem,
            path: None,
            size: ByteSize(REGION_BYTES),
        }],
        namespaces: vec![
            NamespaceConfig {
                name: "disk".into(),
                backend: NamespaceBackend::File,
                path: "disk.img".into(),
                size: Some(ByteSize(NAMESPACE_BYTES)),
                block_size: BLOCK as u32,
            },
            NamespaceConfig {
                name: "d512".into(),
                backend: NamespaceBackend::File,
                path: "d512.img".into(),
                size: Some(ByteSize(SMALL_NAMESPACE_BYTES)),
                block_size: SMALL_BLOCK as u32,
            },
        ],
        // Tests share few cores: no BUSY answers because a worker waited for a CPU, no pinning
        // of every test's worker to the same core, and the test process's memory left alone.
        busy_threshold_us: 60_000,
        // Any free port: tests run at once, and a target may already serve the default one.
        metrics_listen: "127.0.0.1:0".parse().unwrap(),
        pin_workers: false,
        lock_memory: false,
        auth: netdam_target::AuthMode::None,
        ..Config::default()
    };
    TestTarget { target: Target::start(&config).expect("target starts"), _dir: dir }
}

/// The C strings a `FioSettings` points into.
struct Settings {
    target: CString,
    namespace: Option<CString>,
    region: Option<CString>,
    poll: CString,
    sessions: u32,
    coalesce: bool,
    /// fio's `sync=1`.
    fua: bool,
}

impl Settings {
    fn new(target: &Target, space: &str, poll: &str, sessions: u32) -> Settings {
        let (kind, name) = space.split_once('=').expect("namespace=NAME or region=NAME");
        let name = Some(CString::new(name).unwrap());
        Settings {
            target: CString::new(target.local_addr().to_string()).unwrap(),
            namespace: if kind == "namespace" { name.clone() } else { None },
            region: if kind == "region" { name } else { None },
            poll: CString::new(poll).unwrap(),
            sessions,
            coalesce: true,
            fua: false,
        }
    }

    fn abi(&self) -> FioSettings {
        let text = |text: &Option<CString>| text.as_ref().map_or(ptr::null(), |text| text.as_ptr());
        FioSettings {
            job: c"test".as_ptr(),
            target: self.target.as_ptr(),
            namespace_name: text(&self.namespace),
            region: text(&self.region),
            sessions: self.sessions,
            poll: self.poll.as_ptr(),
            key: std::ptr::null(),
            encrypt: 0,
            coalesce: u32::from(self.coalesce),
            fua: u32::from(self.fua),
        }
    }
}

fn probe(settings: &Settings) -> Result<FioSpace, i32> {
    let mut space = FioSpace::default();
    // SAFETY: the settings' strings live as long as `settings`; `space` is writable.
    match unsafe { netdam_fio_probe(&settings.abi(), &mut space) } {
        0 => Ok(space),
        errno => Err(errno),
    }
}

fn open(settings: &Settings) -> Result<*mut FioEngine, i32> {
    open_with_depth(settings, IODEPTH)
}

fn open_with_depth(settings: &Settings, iodepth: usize) -> Result<*mut FioEngine, i32> {
    let mut engine = ptr::null_mut();
    // SAFETY: as in `probe`; `engine` is writable.
    match unsafe { netdam_fio_open(&settings.abi(), iodepth as u32, &mut engine) } {
        0 => Ok(engine),
        errno => {
            assert!(engine.is_null(), "a failed open hands out no engine");
            Err(errno)
        }
    }
}

/// Submits `(kind, offset, buffer)` I/Os, cookie = index, and reaps them all: (cookie, errno)
/// sorted by cookie.
fn run(engine: *mut FioEngine, ios: &mut [(u32, u64, Vec<u8>)]) -> Vec<(usize, i32)> {
    assert!(ios.len() <= IODEPTH);
    for (index, (kind, offset, buffer)) in ios.iter_mut().enumerate() {
        let len = if *kind == TRIM { BLOCK as u64 } else { buffer.len() as u64 };
        // SAFETY: a live engine; `buffer` stays alive and untouched until reaped below.
        let errno =
            unsafe { netdam_fio_submit(engine, *kind, *offset, buffer.as_mut_ptr().cast(), len, index as *mut c_void) };
        assert_eq!(errno, 0, "submit {index}");
    }
    let mut out: Vec<FioCompletion> =
        (0..IODEPTH).map(|_| FioCompletion { cookie: ptr::null_mut(), error: 0 }).collect();
    let mut done = Vec::new();
    while done.len() < ios.len() {
        // SAFETY: a live engine; `out` has room for IODEPTH completions.
        let reaped = unsafe { netdam_fio_reap(engine, 1, IODEPTH as u32, 5_000_000_000, out.as_mut_ptr()) };
        assert!(reaped > 0, "completions within 5 s");
        done.extend(out[..reaped as usize].iter().map(|completion| (completion.cookie as usize, completion.error)));
    }
    done.sort();
    done
}

fn pattern(seed: usize) -> Vec<u8> {
    (0..BLOCK).map(|at| (at * 31 + seed * 7 + 1) as u8).collect()
}

fn all_ok(count: usize) -> Vec<(usize, i32)> {
    (0..count).map(|index| (index, 0)).collect()
}

/// Writes, reads back, trims (reads as zeroes after) and syncs through the ABI.
fn round_trip(space: &str, poll: &str, size_bytes: u64, block_bytes: u32) {
    let test = start();
    let settings = Settings::new(&test.target, space, poll, 2);
    let probed = probe(&settings).expect("probe");
    assert_eq!((probed.size_bytes, probed.block_bytes), (size_bytes, block_bytes));
    let engine = open(&settings).expect("open");
    let offset = |index: usize| (index * 3 * BLOCK) as u64;

    let mut writes: Vec<_> = (0..IODEPTH).map(|index| (WRITE, offset(index), pattern(index))).collect();
    assert_eq!(run(engine, &mut writes), all_ok(IODEPTH), "{space} {poll}: writes");
    let mut reads: Vec<_> = (0..IODEPTH).map(|index| (READ, offset(index), vec![0u8; BLOCK])).collect();
    assert_eq!(run(engine, &mut reads), all_ok(IODEPTH), "{space} {poll}: reads");
    for (index, (_, _, data)) in reads.iter().enumerate() {
        assert!(*data == pattern(index), "{space} {poll}: block {index} reads back as written");
    }

    let mut trim_and_sync = vec![(TRIM, offset(1), Vec::new()), (TRIM, offset(2), Vec::new()), (SYNC, 0, Vec::new())];
    assert_eq!(run(engine, &mut trim_and_sync), all_ok(3), "{space} {poll}: trims and sync");
    let mut reads: Vec<_> = (0..3).map(|index| (READ, offset(index), vec![0xAAu8; BLOCK])).collect();
    assert_eq!(run(engine, &mut reads), all_ok(3));
    assert!(reads[0].2 == pattern(0), "{space} {poll}: an untrimmed block keeps its bytes");
    assert!(
        reads[1].2.iter().chain(&reads[2].2).all(|&byte| byte == 0),
        "{space} {poll}: trimmed blocks read as zeroes"
    );

    // SAFETY: the engine came from `open` and is not used again.
    unsafe { netdam_fio_close(engine) };
}

/// fio's `sync=1` makes every write to a namespace carry FUA, as an O_SYNC write to a file is
/// durable when it completes; without it none does. The engine once took `sync=1` and sent
/// plain writes.
#[test]
fn writes_carry_fua_under_fios_sync_option() {
    let test = start();
    let fua_writes = || test.target.stats().get("block_fua_writes").unwrap();
    for fua in [false, true] {
        let settings = Settings { fua, ..Settings::new(&test.target, "namespace=disk", "blocking", 1) };
        let engine = open(&settings).expect("open");
        let before = fua_writes();
        let mut writes: Vec<_> = (0..4).map(|index| (WRITE, (index * BLOCK) as u64, pattern(index))).collect();
        assert_eq!(run(engine, &mut writes), all_ok(4));
        assert_eq!(fua_writes() - before, if fua { 4 } else { 0 }, "sync={}", u8::from(fua));
        // SAFETY: the engine came from `open` and is not used again.
        unsafe { netdam_fio_close(engine) };
    }
}

#[test]
fn a_namespace_round_trips_with_blocking_waits() {
    round_trip("namespace=disk", "blocking", NAMESPACE_BYTES, BLOCK as u32);
}

#[test]
fn a_namespace_round_trips_with_busy_waits() {
    round_trip("namespace=disk", "busy", NAMESPACE_BYTES, BLOCK as u32);
}

#[test]
fn a_region_round_trips_with_blocking_waits() {
    round_trip("region=scratch", "blocking", REGION_BYTES, 1);
}

#[test]
fn a_region_round_trips_with_busy_waits() {
    round_trip("region=scratch", "busy", REGION_BYTES, 1);
}

#[test]
fn a_missing_namespace_or_region_fails_to_open() {
    let test = start();
    for space in ["namespace=foo", "region=foo"] {
        let settings = Settings::new(&test.target, space, "blocking", 1);
        assert_eq!(probe(&settings).map(|_| ()), Err(libc::ENOENT), "{space}");
        assert_eq!(open(&settings).map(|_| ()), Err(libc::ENOENT), "{space}");
    }
    let mut settings = Settings::new(&test.target, "namespace=disk", "sometimes", 1);
    assert_eq!(probe(&settings).map(|_| ()), Err(libc::EINVAL), "poll=sometimes");
    settings.poll = CString::new("blocking").unwrap();
    settings.target = CString::new("127.0.0.1:1").unwrap();
    assert_eq!(open(&settings).map(|_| ()), Err(libc::ECONNREFUSED), "nothing listens on port 1");
}

#[test]
fn an_io_past_the_end_completes_with_einval() {
    let test = start();
    for (space, end) in [("namespace=disk", NAMESPACE_BYTES), ("region=scratch", REGION_BYTES)] {
        let engine = open(&Settings::new(&test.target, space, "blocking", 1)).expect("open");
        let mut ios = vec![(READ, end, vec![0u8; BLOCK]), (WRITE, end - BLOCK as u64, pattern(0))];
        assert_eq!(run(engine, &mut ios), vec![(0, libc::EINVAL), (1, 0)], "{space}");
        // With nothing in flight, a reap asking for completions returns at once with none.
        let mut out = FioCompletion { cookie: ptr::null_mut(), error: 0 };
        // SAFETY: a live engine; `out` has room for the one completion asked for.
        assert_eq!(unsafe { netdam_fio_reap(engine, 1, 1, -1, &mut out) }, 0);
        // SAFETY: the engine came from `open` and is not used again.
        unsafe { netdam_fio_close(engine) };
    }
}

/// I/Os queued before a commit share datagrams: eight 4 KiB writes, then eight reads, queued at
/// once, reach the target two to a datagram (two 4 KiB blocks fit a 9000-byte datagram), and
/// every block still reads back as written.
#[test]
fn ios_queued_together_share_datagrams() {
    let test = start();
    let settings = Settings::new(&test.target, "namespace=disk", "blocking", 1);
    let engine = open(&settings).expect("open");
    let offset = |index: usize| (index * BLOCK) as u64;
    let counters = || {
        let stats = test.target.stats();
        (stats.get("datagrams_received").expect("a counter"), stats.get("instructions_executed").expect("a counter"))
    };
    let (datagrams_before, instructions_before) = counters();
    let mut writes: Vec<_> = (0..IODEPTH).map(|index| (WRITE, offset(index), pattern(index + 40))).collect();
    assert_eq!(run(engine, &mut writes), all_ok(IODEPTH));
    let mut reads: Vec<_> = (0..IODEPTH).map(|index| (READ, offset(index), vec![0u8; BLOCK])).collect();
    assert_eq!(run(engine, &mut reads), all_ok(IODEPTH));
    let (datagrams_after, instructions_after) = counters();
    // Unpacked, each datagram would carry one instruction at most (a retransmission dropped
    // while its first copy waits for I/O carries none), so instructions could not outnumber
    // datagrams; packed two to a datagram, they do, even with a few retransmissions on a
    // loaded machine.
    let (datagrams, instructions) = (datagrams_after - datagrams_before, instructions_after - instructions_before);
    assert!(instructions >= 2 * IODEPTH as u64, "every I/O was executed: {instructions}");
    assert!(instructions > datagrams, "I/Os share datagrams: {instructions} instructions in {datagrams} datagrams");
    for (index, (_, _, data)) in reads.iter().enumerate() {
        assert!(*data == pattern(index + 40), "block {index} reads back as written");
    }
    // SAFETY: the engine came from `open` and is not used again.
    unsafe { netdam_fio_close(engine) };
}

/// An engine on namespace `disk` of `test`, one session waiting in `ppoll`, at `depth`, with
/// coalescing on or off.
fn open_disk_blocking(test: &TestTarget, coalesce: bool, depth: usize) -> *mut FioEngine {
    let mut settings = Settings::new(&test.target, "namespace=disk", "blocking", 1);
    settings.coalesce = coalesce;
    open_with_depth(&settings, depth).expect("open")
}

/// Submits a 4 KiB read of block `index` into `buffer` and commits it, as fio does at depth with
/// its default batching.
fn submit_and_commit_read(engine: *mut FioEngine, index: usize, buffer: &mut [u8]) {
    // SAFETY: a live engine; the caller keeps `buffer` alive and untouched until it is reaped.
    let errno = unsafe {
        netdam_fio_submit(
            engine,
            READ,
            (index * BLOCK) as u64,
            buffer.as_mut_ptr().cast(),
            BLOCK as u64,
            ptr::null_mut(),
        )
    };
    assert_eq!(errno, 0);
    // SAFETY: as above.
    unsafe { netdam_fio_commit(engine) };
}

/// fio at depth commits one I/O at a time. With coalescing, once 8 other I/Os are outstanding
/// the engine holds a datagram with room for the next I/O: the 9th and 10th 4 KiB reads share one.
/// A held I/O alone still completes (its hold ends). `coalesce=0` sends each I/O at once.
#[test]
fn at_depth_an_io_waits_for_the_next_to_share_its_datagram_unless_coalescing_is_off() {
    let test = start();
    let counters = || {
        let stats = test.target.stats();
        (stats.get("datagrams_received").expect("a counter"), stats.get("instructions_executed").expect("a counter"))
    };
    for coalesce in [true, false] {
        let depth = 16;
        let engine = open_disk_blocking(&test, coalesce, depth);
        let mut buffers: Vec<Vec<u8>> = (0..11).map(|_| vec![0u8; BLOCK]).collect();
        let (datagrams_before, instructions_before) = counters();
        for (index, buffer) in buffers.iter_mut().take(10).enumerate() {
            submit_and_commit_read(engine, index, buffer);
        }
        let mut out: Vec<FioCompletion> =
            (0..depth).map(|_| FioCompletion { cookie: ptr::null_mut(), error: 0 }).collect();
        let mut reap = |count: usize| {
            let mut done = 0;
            while done < count {
                // SAFETY: a live engine; `out` has room for `depth` completions.
                let reaped = unsafe { netdam_fio_reap(engine, 1, depth as u32, 5_000_000_000, out.as_mut_ptr()) };
                assert!(reaped > 0, "completions within 5 s");
                assert!(out[..reaped as usize].iter().all(|completion| completion.error == 0));
                done += reaped as usize;
            }
        };
        reap(10);
        let (datagrams, instructions) = counters();
        let (datagrams, instructions) = (datagrams - datagrams_before, instructions - instructions_before);
        assert!(instructions >= 10, "every read was executed: {instructions}");
        if coalesce {
            // Retransmissions on a loaded machine could add datagrams, never instructions
            // beyond datagrams: the pair is what makes instructions outnumber datagrams.
            assert!(instructions > datagrams, "two reads shared a datagram: {instructions} in {datagrams}");
        } else {
            assert!(instructions <= datagrams, "coalesce=0: a datagram per read: {instructions} in {datagrams}");
        }
        // Eight reads in flight, and a ninth alone: it is held, and still completes.
        for (index, buffer) in buffers.iter_mut().take(9).enumerate() {
            submit_and_commit_read(engine, index, buffer);
        }
        reap(9);
        // SAFETY: the engine came from `open` and is not used again.
        unsafe { netdam_fio_close(engine) };
    }
}

/// Where the target answers faster than fio reaps (fio takes one completion per call at depth),
/// most of the depth is answered and waiting to be reaped, and few datagrams are on the wire.
/// Those I/Os are outstanding too: fio's next I/O follows each reap, so a new I/O is held for it,
/// and the two share a datagram. With `coalesce=0` each goes alone.
#[test]
fn answered_ios_waiting_to_be_reaped_count_toward_the_hold() {
    let test = start();
    let counter = |name: &str| test.target.stats().get(name).expect("a counter");
    for coalesce in [true, false] {
        let depth = 16;
        let engine = open_disk_blocking(&test, coalesce, depth);
        let mut buffers: Vec<Vec<u8>> = (0..12).map(|_| vec![0u8; BLOCK]).collect();
        // A new session's congestion window opens with its first answers: warm it up so that
        // most of the ten reads below go out at once.
        let mut warm_up: Vec<Vec<u8>> = (0..depth).map(|_| vec![0u8; BLOCK]).collect();
        for _ in 0..20 {
            assert!(run_at_depth(engine, READ, &mut warm_up).iter().all(|errno| *errno == 0));
        }
        // Waits until the target has answered every datagram it received, and `at_least` since
        // `since` (datagrams received, answered): then none is between its receipt and its
        // execution, and the counts taken next are consistent. The engine is not called while
        // it waits, so it sends nothing meanwhile (what the session's window holds back is
        // received and executed later, both counted then).
        let settled = |since: (u64, u64), at_least: u64| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            loop {
                let answered = counter("responses_sent") - since.1;
                let received = counter("datagrams_received") - since.0;
                if answered >= at_least && answered == received {
                    return;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "the target answers what it received, {at_least} at least, within 10 s: {answered} of {received}"
                );
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        };
        let before_reads = (counter("datagrams_received"), counter("responses_sent"));
        for (index, buffer) in buffers.iter_mut().take(10).enumerate() {
            submit_and_commit_read(engine, index, buffer);
        }
        // Two answers in the engine's socket (loopback delivers within the send) leave fewer
        // than 8 of the 9 datagrams (one carries a pair) on the wire once they are read: the
        // old rule, which counted datagrams on the wire, would not hold the next I/O. At least
        // one went out: on a loaded machine the warm-up's round trips can leave the congestion
        // window at one datagram, and the rest wait in the session until the reap below (which
        // the second wait allows for).
        settled(before_reads, 1);
        let mut out: Vec<FioCompletion> =
            (0..depth).map(|_| FioCompletion { cookie: ptr::null_mut(), error: 0 }).collect();
        let mut reap = |min: u32, max: u32| {
            // SAFETY: a live engine; `out` has room for `depth` completions.
            let reaped = unsafe { netdam_fio_reap(engine, min, max, 5_000_000_000, out.as_mut_ptr()) };
            assert!(reaped >= min, "completions within 5 s");
            assert!(out[..reaped as usize].iter().all(|completion| completion.error == 0));
            reaped as usize
        };
        // fio takes one completion: the engine reads the answers that have come, and nine I/Os
        // remain outstanding, answered or not.
        assert_eq!(reap(1, 1), 1);
        // That reap may have sent requests the window held back: let the target answer them.
        settled(before_reads, 2);
        let not_executed = || counter("duplicates_in_progress") + counter("duplicates_replayed");
        let (datagrams_before, instructions_before, not_executed_before) =
            (counter("datagrams_received"), counter("instructions_executed"), not_executed());
        for (index, buffer) in buffers.iter_mut().enumerate().skip(10) {
            submit_and_commit_read(engine, index, buffer);
        }
        let mut reaped = 0;
        while reaped < 11 {
            reaped += reap(1, depth as u32);
        }
        // A retransmission answered without executing (its first copy still waiting for the
        // disk) is not counted: it adds a datagram and no instruction.
        let datagrams = counter("datagrams_received") - datagrams_before - (not_executed() - not_executed_before);
        let instructions = counter("instructions_executed") - instructions_before;
        assert!(instructions >= 2, "both reads were executed: {instructions}");
        if coalesce {
            // A retransmission executed again adds a datagram and its instructions.
            assert!(instructions > datagrams, "the two reads shared a datagram: {instructions} in {datagrams}");
        } else {
            assert!(instructions <= datagrams, "coalesce=0: a datagram per read: {instructions} in {datagrams}");
        }
        // SAFETY: the engine came from `open` and is not used again.
        unsafe { netdam_fio_close(engine) };
    }
}

/// Submits one I/O of `kind` per buffer (the k-th at block k), commits once, and reaps them all:
/// the errno of each, by cookie.
fn run_at_depth(engine: *mut FioEngine, kind: u32, buffers: &mut [Vec<u8>]) -> Vec<i32> {
    for (index, buffer) in buffers.iter_mut().enumerate() {
        let offset = (index * buffer.len()) as u64;
        // SAFETY: a live engine; `buffer` stays alive and untouched until reaped below.
        let errno = unsafe {
            netdam_fio_submit(
                engine,
                kind,
                offset,
                buffer.as_mut_ptr().cast(),
                buffer.len() as u64,
                index as *mut c_void,
            )
        };
        assert_eq!(errno, 0, "submit {index}");
    }
    // SAFETY: a live engine.
    unsafe { netdam_fio_commit(engine) };
    let mut out: Vec<FioCompletion> =
        (0..buffers.len()).map(|_| FioCompletion { cookie: ptr::null_mut(), error: 0 }).collect();
    let mut errnos = vec![-1; buffers.len()];
    let mut reaped_all = 0;
    while reaped_all < buffers.len() {
        // SAFETY: a live engine; `out` has room for every I/O.
        let reaped = unsafe { netdam_fio_reap(engine, 1, buffers.len() as u32, 10_000_000_000, out.as_mut_ptr()) };
        assert!(reaped > 0, "completions within 10 s");
        for completion in &out[..reaped as usize] {
            errnos[completion.cookie as usize] = completion.error;
        }
        reaped_all += reaped as usize;
    }
    errnos
}

/// 512-byte I/Os at depth pack 16 to a datagram, and a datagram's instructions each take one of
/// the worker's transfer buffers (`BLOCK_QUEUE_DEPTH`, 128 per namespace). One session keeps
/// within them; four sharing a worker, 1024 I/Os at once run it out, and the instructions it has
/// no buffer for are answered BUSY, not executed. The engine sends those again: every I/O
/// succeeds, and every block reads back as written.
#[test]
fn small_ios_at_depth_that_outrun_the_workers_buffers_are_retried_not_failed() {
    let test = start();
    let depth = 1024;
    for sessions in [1, 4] {
        small_ios_at_depth(&test, depth, sessions);
    }
}

fn small_ios_at_depth(test: &TestTarget, depth: usize, sessions: u32) {
    let settings = Settings::new(&test.target, "namespace=d512", "blocking", sessions);
    let engine = open_with_depth(&settings, depth).expect("open");
    let block = |index: usize, round: usize| -> Vec<u8> {
        (0..SMALL_BLOCK).map(|at| (at * 13 + index * 7 + round * 101) as u8).collect()
    };
    for round in 0..3 {
        let mut writes: Vec<Vec<u8>> = (0..depth).map(|index| block(index, round)).collect();
        let errnos = run_at_depth(engine, WRITE, &mut writes);
        assert!(
            errnos.iter().all(|&errno| errno == 0),
            "{sessions} sessions, round {round}: writes failed: {:?}",
            failed(&errnos)
        );
        let mut reads: Vec<Vec<u8>> = (0..depth).map(|_| vec![0u8; SMALL_BLOCK]).collect();
        let errnos = run_at_depth(engine, READ, &mut reads);
        assert!(
            errnos.iter().all(|&errno| errno == 0),
            "{sessions} sessions, round {round}: reads failed: {:?}",
            failed(&errnos)
        );
        for (index, data) in reads.iter().enumerate() {
            assert!(*data == block(index, round), "{sessions} sessions, round {round}: block {index} reads back");
        }
    }
    // SAFETY: the engine came from `open` and is not used again.
    unsafe { netdam_fio_close(engine) };
}

/// (I/O, errno) of the failed ones.
fn failed(errnos: &[i32]) -> Vec<(usize, i32)> {
    errnos.iter().enumerate().filter(|(_, &errno)| errno != 0).map(|(index, &errno)| (index, errno)).collect()
}
