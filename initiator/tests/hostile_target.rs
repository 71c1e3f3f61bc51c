//! The client against a target that answers what no honest target sends: a fake target on a
//! real UDP socket answers the HELLO with generated values (datagram sizes, instruction
//! limits, regions and namespaces with sizes and block sizes in and out of range) and every
//! later request with an answer that is then mutated (bytes flipped, cut, appended, fields
//! overwritten with extreme values, the sequence changed, answered twice or not at all), its
//! CRC recomputed most of the time so that the mutation reaches the decoder and the session
//! rather than stopping at the checksum. Anyone who can send to the client's port can send
//! such datagrams to a session without authentication, and a buggy target can too: every
//! client call must return, in bounded time, an answer or an error, never panic or hang, and
//! a read must never report success with data of another length than asked. The blocking
//! client, the asynchronous one and a `Volume` over two sessions (what `netdam nbd` drives)
//! each take their cases.
//!
//! The test prints `SEED=`; `NETDAM_SEED=<seed>` repeats its cases.

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Once};
use std::thread::JoinHandle;
use std::time::{Duration as StdDuration, Instant as StdInstant};

use netdam_initiator::async_client::AsyncClient;
use netdam_initiator::client::{Client, ClientOptions};
use netdam_initiator::session::SessionConfig;
use netdam_initiator::volume::{Volume, VolumeOptions};
use netdam_isa::block::{encode_extents, Extent, EXTENT_FLAG_HOLE, EXTENT_FLAG_ZERO};
use netdam_isa::control::{decode_hello_operand, encode_hello_answer, NamespaceEntry, StatWriter, NO_COOKIE};
use netdam_isa::wire::{datagram_crc, Request, ResponseWriter};
use netdam_isa::{Duration, Opcode, Status};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};

/// Where the CRC lies in every datagram (PROTOCOL.md, "Header").
const CRC_FIELD: std::ops::Range<usize> = 28..32;
/// The cookie the fake target hands out.
const COOKIE: [u8; 24] = [0x5a; 24];
/// How long one case's client calls may take together: each call's attempts are bounded by the
/// short timeouts below, so anything near this is a hang.
const CASE_WITHIN: StdDuration = StdDuration::from_secs(20);

/// What the fake target says in its HELLO answer.
#[derive(Debug, Clone)]
struct HelloPlan {
    session: u32,
    max_datagram_bytes: u32,
    max_instructions: u16,
    regions: Vec<(u16, String, u64)>,
    namespaces: Vec<(u16, String, u32, u64)>,
    /// Applied to the encoded answer's datagram.
    mutation: Mutation,
}

/// What is done to one answer datagram before it is sent.
#[derive(Debug, Clone)]
enum Mutation {
    None,
    FlipByte {
        at: usize,
        mask: u8,
    },
    Truncate {
        at: usize,
    },
    Append(Vec<u8>),
    /// Four bytes overwritten with an extreme value (a length, a count, a time).
    Overwrite {
        at: usize,
        value: u32,
    },
    /// The answer names another sequence.
    Sequence(u64),
    /// The datagram's status byte.
    DatagramStatus(u8),
    /// Sent twice.
    Twice,
    /// Not sent.
    Drop,
}

#[derive(Debug, Clone)]
struct Plan {
    hello: HelloPlan,
    /// Mutations of the answers after the HELLO's, taken in turn.
    answers: Vec<Mutation>,
    /// Whether a mutated datagram gets its CRC recomputed (the checksum then passes).
    fix_crc: bool,
    /// When set, a BWRITE at block 0 fails (`io_error`) at once and the answer of any other
    /// BWRITE is held this long: a request whose first piece fails while another is in flight.
    held_block_writes: Option<StdDuration>,
}

fn extreme_u32() -> impl Strategy<Value = u32> {
    prop_oneof![
        Just(0u32),
        Just(1),
        Just(511),
        Just(512),
        Just(4095),
        Just(4096),
        Just(8192),
        Just(9000),
        Just(65_507),
        Just(65_536),
        Just(u32::MAX / 2),
        Just(u32::MAX),
        any::<u32>(),
    ]
}

fn extreme_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(4096),
        Just(1 << 20),
        Just(1 << 40),
        Just(u64::MAX / 512),
        Just(u64::MAX),
        any::<u64>()
    ]
}

fn name() -> impl Strategy<Value = String> {
    prop_oneof![Just("disk".to_string()), Just("r".to_string()), Just(String::new()), "[a-z]{1,32}"]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => Just(Mutation::None),
        2 => (0usize..200, 1u8..=255).prop_map(|(at, mask)| Mutation::FlipByte { at, mask }),
        1 => (0usize..200).prop_map(|at| Mutation::Truncate { at }),
        1 => prop::collection::vec(any::<u8>(), 1..64).prop_map(Mutation::Append),
        3 => (0usize..120, extreme_u32()).prop_map(|(at, value)| Mutation::Overwrite { at, value }),
        1 => prop_oneof![Just(0u64), Just(1), Just(u64::MAX), any::<u64>()].prop_map(Mutation::Sequence),
        1 => any::<u8>().prop_map(Mutation::DatagramStatus),
        1 => Just(Mutation::Twice),
        1 => Just(Mutation::Drop),
    ]
}

fn hello_plan() -> impl Strategy<Value = HelloPlan> {
    // Mostly what a target may answer, so that most cases get past the HELLO; the rest out of range.
    let datagram = prop_oneof![6 => Just(9000u32), 1 => Just(4096), 1 => Just(65_507), 1 => extreme_u32()];
    let instructions = prop_oneof![6 => Just(64u16), 1 => Just(1), 1 => Just(0), 1 => any::<u16>()];
    let region = (prop_oneof![Just(0u16), any::<u16>()], name(), extreme_u64());
    let block = prop_oneof![6 => Just(4096u32), 2 => Just(512), 1 => extreme_u32()];
    let capacity = prop_oneof![4 => Just(1u64 << 18), 1 => extreme_u64()];
    let namespace = (prop_oneof![Just(0u16), any::<u16>()], name(), block, capacity);
    (
        any::<u32>(),
        datagram,
        instructions,
        prop::collection::vec(region, 0..3),
        prop::collection::vec(namespace, 0..3),
        prop_oneof![4 => Just(Mutation::None), 1 => mutation()],
    )
        .prop_map(|(session, max_datagram_bytes, max_instructions, regions, namespaces, mutation)| HelloPlan {
            session,
            max_datagram_bytes,
            max_instructions,
            regions,
            namespaces,
            mutation,
        })
}

fn plan() -> impl Strategy<Value = Plan> {
    (hello_plan(), prop::collection::vec(mutation(), 1..24), prop::bool::weighted(0.9))
        .prop_map(|(hello, answers, fix_crc)| Plan { hello, answers, fix_crc, held_block_writes: None })
}

/// The data a read of `len` bytes at `offset` gets from the fake target.
fn pattern(offset: u64, len: usize) -> Vec<u8> {
    (0..len).map(|index| (offset.wrapping_add(index as u64).wrapping_mul(131) >> 3) as u8).collect()
}

/// A fake target on 127.0.0.1 answering by `plan` until stopped.
struct FakeTarget {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    /// Held answers sent so far ([`Plan::held_block_writes`]).
    released: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

impl FakeTarget {
    fn start(plan: Plan) -> FakeTarget {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        socket.set_read_timeout(Some(StdDuration::from_millis(20))).unwrap();
        let addr = socket.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let released = Arc::new(AtomicUsize::new(0));
        let (stopped, counted) = (stop.clone(), released.clone());
        let thread = std::thread::Builder::new()
            .name("fake-target".into())
            .spawn(move || serve(&socket, &plan, &stopped, &counted))
            .unwrap();
        FakeTarget { addr, stop, released, thread: Some(thread) }
    }
}

impl Drop for FakeTarget {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            // The fake target's own panic is the harness's bug, not the client's: say so.
            thread.join().expect("the fake target itself panicked");
        }
    }
}

fn serve(socket: &UdpSocket, plan: &Plan, stop: &AtomicBool, released: &AtomicUsize) {
    let mut request_buffer = vec![0u8; 70_000];
    let mut answer_buffer = vec![0u8; 70_000];
    let mut next_mutation = 0;
    let mut held: Vec<(StdInstant, Vec<u8>, SocketAddr)> = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        let now = StdInstant::now();
        for (_, answer, to) in held.extract_if(.., |(due, _, _)| *due <= now) {
            // Counted before it leaves, so a client that has it has seen the count move.
            released.fetch_add(1, Ordering::SeqCst);
            let _ = socket.send_to(&answer, to);
        }
        let Ok((len, from)) = socket.recv_from(&mut request_buffer) else { continue };
        let Ok(request) = Request::parse(&request_buffer[..len]) else { continue };
        let header = request.header;
        let mut writer = ResponseWriter::new(&mut answer_buffer, header.session, header.sequence);
        let mut is_hello = false;
        let mut hold = None;
        for instruction in request.instructions() {
            let opcode = Opcode::from_u8(instruction.opcode);
            let capacity = writer.data_capacity();
            let (status, data_len) = match opcode {
                Some(Opcode::Hello) => {
                    is_hello = true;
                    let Ok(hello) = decode_hello_operand(instruction.operand) else { break };
                    if hello.cookie == NO_COOKIE {
                        writer.data_area()[..COOKIE.len()].copy_from_slice(&COOKIE);
                        (Status::Retry, COOKIE.len())
                    } else {
                        let plan = &plan.hello;
                        let regions = plan.regions.iter().map(|(id, name, size)| (*id, name.as_str(), *size, false));
                        let namespaces =
                            plan.namespaces.iter().map(|(id, name, block_bytes, capacity_blocks)| NamespaceEntry {
                                id: *id,
                                name,
                                block_bytes: *block_bytes,
                                capacity_blocks: *capacity_blocks,
                                reports_allocation: true,
                            });
                        match encode_hello_answer(
                            writer.data_area(),
                            plan.session,
                            plan.max_datagram_bytes,
                            plan.max_instructions,
                            0,
                            regions,
                            namespaces,
                        ) {
                            Ok(len) => (Status::Ok, len),
                            Err(status) => (status, 0),
                        }
                    }
                }
                Some(Opcode::Read) | Some(Opcode::BlockRead) => {
                    let block = match opcode {
                        Some(Opcode::BlockRead) => plan.hello.namespaces.first().map_or(1, |ns| ns.2 as usize),
                        _ => 1,
                    };
                    let len = (instruction.length as usize).saturating_mul(block).min(capacity);
                    writer.data_area()[..len].copy_from_slice(&pattern(instruction.offset, len));
                    (Status::Ok, len)
                }
                Some(Opcode::Cas) | Some(Opcode::FetchAdd) => {
                    writer.data_area()[..8].copy_from_slice(&0x0123_4567_89ab_cdefu64.to_le_bytes());
                    (Status::Ok, 8)
                }
                Some(Opcode::Crc32) => {
                    writer.data_area()[..4].copy_from_slice(&0xdead_beefu32.to_le_bytes());
                    (Status::Ok, 4)
                }
                Some(Opcode::BlockStatus) => {
                    let half = (instruction.length / 2).max(1);
                    let extents = [
                        Extent { num_blocks: half, flags: 0 },
                        Extent {
                            num_blocks: instruction.length.saturating_sub(half).max(1),
                            flags: EXTENT_FLAG_HOLE | EXTENT_FLAG_ZERO,
                        },
                    ];
                    (Status::Ok, encode_extents(&extents, writer.data_area()))
                }
                Some(Opcode::BlockWrite) if plan.held_block_writes.is_some() => {
                    if instruction.offset == 0 {
                        (Status::IoError, 0)
                    } else {
                        hold = plan.held_block_writes;
                        (Status::Ok, 0)
                    }
                }
                Some(Opcode::Stat) => {
                    let Ok(mut stat) = StatWriter::new(writer.data_area()) else { break };
                    let _ = stat.push("requests", 7);
                    (Status::Ok, stat.finish())
                }
                _ => (Status::Ok, 0),
            };
            writer.commit(instruction.opcode, status, data_len);
        }
        let mut len = writer.finish(64, 1_500, 1);
        let mutation = if is_hello {
            plan.hello.mutation.clone()
        } else {
            next_mutation += 1;
            plan.answers[(next_mutation - 1) % plan.answers.len()].clone()
        };
        let mut times = 1;
        match mutation {
            Mutation::None => {}
            Mutation::FlipByte { at, mask } => {
                if at < len {
                    answer_buffer[at] ^= mask;
                }
            }
            Mutation::Truncate { at } => len = len.min(at),
            Mutation::Append(bytes) => {
                answer_buffer[len..len + bytes.len()].copy_from_slice(&bytes);
                len += bytes.len();
            }
            Mutation::Overwrite { at, value } => {
                let end = (at + 4).min(len);
                if at < end {
                    answer_buffer[at..end].copy_from_slice(&value.to_le_bytes()[..end - at]);
                }
            }
            // The header's sequence is bytes 8..16 (PROTOCOL.md, "Header").
            Mutation::Sequence(sequence) => answer_buffer[8..16].copy_from_slice(&sequence.to_le_bytes()),
            // The datagram status is byte 2 of a response header.
            Mutation::DatagramStatus(status) => answer_buffer[2] = status,
            Mutation::Twice => times = 2,
            Mutation::Drop => times = 0,
        }
        if plan.fix_crc && len >= CRC_FIELD.end {
            let crc = datagram_crc(&answer_buffer[..len]);
            answer_buffer[CRC_FIELD].copy_from_slice(&crc.to_le_bytes());
        }
        if let Some(delay) = hold {
            held.push((StdInstant::now() + delay, answer_buffer[..len].to_vec(), from));
            continue;
        }
        for _ in 0..times {
            let _ = socket.send_to(&answer_buffer[..len], from);
        }
    }
}

/// Short timeouts, so that a case whose answers are all ignored fails in milliseconds.
fn options() -> ClientOptions {
    let session = SessionConfig {
        initial_rto: Duration::from_millis(5),
        min_rto: Duration::from_millis(2),
        min_block_rto: Duration::from_millis(5),
        min_hello_rto: Duration::from_millis(5),
        max_rto: Duration::from_millis(20),
        max_attempts: 3,
        min_patience: Duration::ZERO,
        max_in_progress_wait: Duration::from_millis(50),
        max_busy_retries: 3,
        reconnect_patience: Duration::ZERO,
        ..SessionConfig::default()
    };
    ClientOptions { session, ..ClientOptions::default() }
}

/// Runs every kind of client call against a fake target answering by `plan`; fails on a
/// read that succeeded with data of another length than asked, or on a case that takes too long.
/// A panic anywhere in the client fails the case (proptest reports it).
fn run_case(plan: Plan) -> Result<(), TestCaseError> {
    let target = FakeTarget::start(plan);
    let started = StdInstant::now();
    let Ok(mut client) = Client::connect_with(target.addr, options()) else { return Ok(()) };
    ESTABLISHED.fetch_add(1, Ordering::Relaxed);
    let region = client.info().hello.regions.first().map(|region| region.id);
    let namespace = client.info().hello.namespaces.first().cloned();
    let _ = client.ping();
    let _ = client.stat();
    if let Some(space) = region {
        for len in [1usize, 64, 5000, 20_000] {
            let mut out = vec![0u8; len];
            // A read that succeeds has every piece's data checked for length by the client; with
            // answers left as they were it is the target's pattern, which some must be.
            if client.read(space, 8, &mut out).is_ok() && out == pattern(8, len) {
                READS_ANSWERED.fetch_add(1, Ordering::Relaxed);
            }
        }
        let _ = client.write(space, 0, &[1u8; 3000]);
        let _ = client.cas(space, 8, 1, 2);
        let _ = client.fetch_add(space, 16, 5);
        let _ = client.crc32(space, 0, 100);
        let _ = client.fill(space, 0, 100, 7);
        let _ = client.memcpy(space, 0, space, 4096, 100);
    }
    if let Some(namespace) = namespace {
        for len in [0usize, 512, 4096, 3 * 4096, 20_000] {
            let mut out = vec![0u8; len];
            let _ = client.block_read(&namespace, 0, &mut out);
            let _ = client.block_write(&namespace, 1, &out, false);
        }
        if let Ok(extents) = client.block_status(&namespace, 0, 16) {
            let covered: u64 = extents.iter().map(|extent| u64::from(extent.num_blocks)).sum();
            prop_assert!((1..=16).contains(&covered), "extents cover {covered} of 16 blocks: {extents:?}");
        }
        let _ = client.block_flush(&namespace);
        let _ = client.trim(&namespace, 0, 8);
        let _ = client.write_zeroes(&namespace, 0, 8);
    }
    let _ = client.close();
    prop_assert!(started.elapsed() < CASE_WITHIN, "the case took {:?}", started.elapsed());
    Ok(())
}

/// As [`run_case`], through the asynchronous client and a [`Volume`] (what `netdam nbd` drives),
/// on a runtime of the case's own.
fn run_async_case(plan: Plan) -> Result<(), TestCaseError> {
    let target = FakeTarget::start(plan.clone());
    let started = StdInstant::now();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let outcome: Result<(), TestCaseError> = runtime.block_on(async {
        if let Ok(client) = AsyncClient::connect_with(target.addr, options()).await {
            ESTABLISHED_ASYNC.fetch_add(1, Ordering::Relaxed);
            if let Some(space) = client.info().hello.regions.first().map(|region| region.id) {
                for len in [1usize, 5000, 20_000] {
                    if let Ok(data) = client.read(space, 8, len).await {
                        prop_assert_eq!(data.len(), len);
                    }
                }
                let _ = client.write(space, 0, &[1u8; 3000]).await;
                let _ = client.cas(space, 8, 1, 2).await;
                let _ = client.fetch_add(space, 16, 5).await;
                let _ = client.crc32(space, 0, 100).await;
            }
            client.close().await;
        }
        let Some(name) = plan.hello.namespaces.first().map(|namespace| namespace.1.clone()) else { return Ok(()) };
        let options = VolumeOptions { sessions: 2, client: options() };
        let Ok(volume) = Volume::open(target.addr, &name, options).await else { return Ok(()) };
        VOLUMES_OPENED.fetch_add(1, Ordering::Relaxed);
        for len in [0usize, 4096, 3 * 4096, 40_960] {
            let mut out = vec![0u8; len];
            let _ = volume.read(0, &mut out).await;
            let _ = volume.write(4096, &out, len == 4096).await;
        }
        if let Ok(extents) = volume.block_status(0, 16 * u64::from(volume.block_bytes())).await {
            let covered: u64 = extents.iter().map(|(bytes, _)| bytes).sum();
            prop_assert!(covered <= 16 * u64::from(volume.block_bytes()), "extents cover {covered} bytes: {extents:?}");
        }
        let _ = volume.flush().await;
        let _ = volume.trim(0, 8192).await;
        let _ = volume.write_zeroes(0, 8192).await;
        volume.close().await;
        Ok(())
    });
    outcome?;
    prop_assert!(started.elapsed() < CASE_WITHIN, "the case took {:?}", started.elapsed());
    Ok(())
}

/// Runs `run` on `cases` generated plans, seeded as [`seed`] says; a failure shrinks and panics
/// with the smallest failing plan.
fn run_cases(cases: u32, run: fn(Plan) -> Result<(), TestCaseError>) {
    let config = Config { cases, failure_persistence: None, max_shrink_iters: 200, ..Config::default() };
    let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed()));
    if let Err(error) = runner.run(&plan(), run) {
        panic!("{error}");
    }
}

fn seed() -> [u8; 32] {
    let seed: u64 = match std::env::var("NETDAM_SEED") {
        Ok(text) => text.parse().expect("NETDAM_SEED is a number"),
        Err(_) => std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64,
    };
    println!("SEED={seed}");
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    bytes
}

/// Cases whose HELLO opened a session, and reads that succeeded with the target's bytes: the
/// generated cases must reach past the HELLO, and the client must still read right, or the
/// test would check the HELLO alone.
static ESTABLISHED: AtomicUsize = AtomicUsize::new(0);
static READS_ANSWERED: AtomicUsize = AtomicUsize::new(0);

#[test]
fn the_client_survives_a_hostile_target() {
    const CASES: u32 = 150;
    run_cases(CASES, run_case);
    let (established, reads) = (ESTABLISHED.load(Ordering::Relaxed), READS_ANSWERED.load(Ordering::Relaxed));
    println!("{established} of {CASES} cases opened a session; {reads} reads returned the target's bytes");
    assert!(established >= CASES as usize / 4, "only {established} of {CASES} cases got past the HELLO");
    assert!(reads >= CASES as usize / 4, "only {reads} reads returned the target's bytes in {CASES} cases");
}

/// Panics anywhere in this test binary: tokio catches a panic of a spawned task (a client's
/// I/O task), which would otherwise pass unnoticed.
static PANICS: AtomicUsize = AtomicUsize::new(0);

fn count_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            previous(info);
        }));
    });
}

static ESTABLISHED_ASYNC: AtomicUsize = AtomicUsize::new(0);
static VOLUMES_OPENED: AtomicUsize = AtomicUsize::new(0);

#[test]
fn the_async_client_and_a_volume_survive_a_hostile_target() {
    const CASES: u32 = 80;
    count_panics();
    run_cases(CASES, run_async_case);
    let (established, volumes) = (ESTABLISHED_ASYNC.load(Ordering::Relaxed), VOLUMES_OPENED.load(Ordering::Relaxed));
    println!("{established} of {CASES} cases opened a session, {volumes} a volume");
    assert!(established >= CASES as usize / 4, "only {established} of {CASES} cases got past the HELLO");
    assert!(volumes >= CASES as usize / 10, "only {volumes} of {CASES} cases opened a volume");
    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "a task panicked (printed above)");
}

/// The fake target answers honestly when nothing is mutated: the client's reads get its
/// pattern, so the hostile cases above exercise the paths an honest answer takes too.
#[test]
fn an_honest_fake_target_is_read_as_it_answers() {
    let plan = Plan {
        hello: HelloPlan {
            session: 77,
            max_datagram_bytes: 9000,
            max_instructions: 64,
            regions: vec![(0, "mem".into(), 1 << 20)],
            namespaces: vec![(0, "disk".into(), 4096, 256)],
            mutation: Mutation::None,
        },
        answers: vec![Mutation::None],
        fix_crc: true,
        held_block_writes: None,
    };
    let target = FakeTarget::start(plan);
    let mut client = Client::connect_with(target.addr, options()).unwrap();
    let mut out = vec![0u8; 20_000];
    client.read(0, 100, &mut out).unwrap();
    // Each piece is read at its own offset, so the whole matches the pattern at 100.
    assert!(out == pattern(100, out.len()), "a read through the client returns the target's bytes");
    assert_eq!(client.fetch_add(0, 8, 1).unwrap(), 0x0123_4567_89ab_cdef);
    let namespace = client.namespace("disk").unwrap().clone();
    let mut blocks = vec![0u8; 2 * 4096];
    client.block_read(&namespace, 3, &mut blocks).unwrap();
    assert!(blocks == pattern(3, blocks.len()), "a block read returns the target's bytes");
    let extents = client.block_status(&namespace, 0, 16).unwrap();
    assert_eq!(extents.iter().map(|extent| extent.num_blocks).sum::<u32>(), 16);
    client.close().unwrap();
}

/// A volume request whose first piece fails returns only once every other piece it sent has
/// been answered: the export makes a failed request again after a spaces change, and a piece
/// of the first attempt still in flight could then land after the new one. The fake target
/// fails the piece at block 0 at once and holds the other piece's answer 200 ms; timeouts far
/// longer than that, so the held piece ends by its answer, not by giving up.
#[test]
fn a_volume_request_returns_only_once_every_piece_is_answered() {
    let plan = Plan {
        hello: HelloPlan {
            session: 78,
            max_datagram_bytes: 9000,
            max_instructions: 64,
            regions: Vec::new(),
            namespaces: vec![(0, "disk".into(), 4096, 256)],
            mutation: Mutation::None,
        },
        answers: vec![Mutation::None],
        fix_crc: true,
        held_block_writes: Some(StdDuration::from_millis(200)),
    };
    let target = FakeTarget::start(plan);
    let session = SessionConfig {
        initial_rto: Duration::from_millis(2_000),
        min_rto: Duration::from_millis(2_000),
        min_block_rto: Duration::from_millis(2_000),
        max_rto: Duration::from_millis(4_000),
        ..SessionConfig::default()
    };
    let options = VolumeOptions { sessions: 2, client: ClientOptions { session, ..ClientOptions::default() } };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let volume = Volume::open(target.addr, "disk", options).await.unwrap();
        let transfer = volume.transfer_bytes() as usize;
        assert!(transfer < 64 * 4096, "the write below needs at least two pieces");
        // Two pieces at least: the first (block 0) fails, the rest are held.
        let data = vec![7u8; 2 * transfer];
        let error = volume.write(0, &data, false).await.unwrap_err();
        assert!(error.to_string().contains("io_error"), "the first piece's failure is what returns: {error}");
        assert!(
            target.released.load(Ordering::SeqCst) >= 1,
            "the write returned before the answer of its held piece was even sent"
        );
        volume.close().await;
    });
}
