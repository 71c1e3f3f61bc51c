//! The NBD export against hostile byte streams: whole client sessions (handshake, options,
//! requests of every command with offsets and lengths in and out of range) generated at random
//! and then mutated (bytes flipped, cut short, inserted, fields overwritten), sent over a real
//! socket to one running export. The export is reachable by anyone who can connect to it, so
//! whatever arrives must never panic it, hang it, make it call its backend outside what it
//! promises (aligned, bounded, inside the disk), or write through a read-only export; and after
//! every such connection a well-behaved client is still served.
//!
//! Each test prints `SEED=`; `NETDAM_SEED=<seed>` repeats its sessions (a failure also prints
//! the smallest failing session proptest could shrink it to).

mod nbd_support;

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use nbd_support::{MemDisk, RawClient, TestServer};
use netdam_initiator::nbd::codec::{
    InfoRequest, OptionHeader, ReplyStyle, RequestHeader, BASE_ALLOCATION, CMD_BLOCK_STATUS, CMD_CACHE, CMD_DISC,
    CMD_FLUSH, CMD_READ, CMD_TRIM, CMD_WRITE, CMD_WRITE_ZEROES, FLAG_C_FIXED_NEWSTYLE, FLAG_C_NO_ZEROES,
    INFO_BLOCK_SIZE, INFO_DESCRIPTION, INFO_NAME, OPT_ABORT, OPT_EXPORT_NAME, OPT_EXTENDED_HEADERS, OPT_GO, OPT_INFO,
    OPT_LIST, OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT, OPT_STARTTLS, OPT_STRUCTURED_REPLY,
};
use netdam_initiator::nbd::{ExportOptions, Listen};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};

const DISK_BYTES: usize = 1 << 20;
const BLOCK: u32 = 512;
/// How long a connection whose client has sent everything and shut down its side may take to
/// be closed by the export (it has nothing left to wait for but its own replies).
const CLOSE_WITHIN: Duration = Duration::from_secs(10);

/// Panics in this test binary outside the tests' own threads (whose failed assertions are
/// panics too): the export's runtime threads and its server thread. A connection task's panic
/// is caught by tokio and would otherwise pass unnoticed.
static PANICS: AtomicU64 = AtomicU64::new(0);

fn count_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let thread = std::thread::current();
            if !thread.name().is_some_and(|name| name.starts_with("hostile_sessions_")) {
                PANICS.fetch_add(1, Ordering::SeqCst);
            }
            previous(info);
        }));
    });
}

/// One option of a generated handshake.
#[derive(Debug, Clone)]
enum ClientOption {
    Structured,
    Extended,
    SetMetaContext(Vec<String>),
    ListMetaContext,
    List,
    Info(Vec<u8>),
    StartTls,
    Unknown(u32, Vec<u8>),
}

/// One request of a generated transmission phase.
#[derive(Debug, Clone)]
struct ClientRequest {
    command: u16,
    flags: u16,
    cookie: u64,
    offset: u64,
    length: u64,
}

/// A whole generated session, before mutation.
#[derive(Debug, Clone)]
struct Session {
    client_flags: u32,
    options: Vec<ClientOption>,
    /// How the handshake ends: GO (true) or EXPORT_NAME; or, with `abort`, OPT_ABORT.
    go: bool,
    abort: bool,
    export_name: Vec<u8>,
    requests: Vec<ClientRequest>,
    /// Whether a well-behaved NBD_CMD_DISC ends it.
    disconnect: bool,
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(Index, u8),
    Cut(Index),
    Insert(Index, Vec<u8>),
    /// Overwrites four bytes with all ones (a length or offset field at its largest).
    Saturate(Index),
}

fn option_strategy() -> impl Strategy<Value = ClientOption> {
    prop_oneof![
        Just(ClientOption::Structured),
        Just(ClientOption::Extended),
        prop::collection::vec(
            prop_oneof![Just(BASE_ALLOCATION.to_string()), Just("base:".to_string()), ".{0,40}".prop_map(String::from)],
            0..4
        )
        .prop_map(ClientOption::SetMetaContext),
        Just(ClientOption::ListMetaContext),
        Just(ClientOption::List),
        prop::collection::vec(any::<u8>(), 0..8).prop_map(ClientOption::Info),
        Just(ClientOption::StartTls),
        (any::<u32>(), prop::collection::vec(any::<u8>(), 0..32))
            .prop_map(|(option, data)| ClientOption::Unknown(option, data)),
    ]
}

/// Offsets and lengths a hostile client would try: in range, at the end, unaligned, huge.
fn offset_strategy() -> impl Strategy<Value = u64> {
    let blocks = (DISK_BYTES / BLOCK as usize) as u64;
    prop_oneof![
        16 => (0..blocks).prop_map(|block| block * u64::from(BLOCK)),
        1 => Just(DISK_BYTES as u64 - u64::from(BLOCK)),
        1 => Just(DISK_BYTES as u64),
        1 => 0..DISK_BYTES as u64,
        1 => u64::MAX - 4096..=u64::MAX,
        1 => any::<u64>(),
    ]
}

fn length_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![
        24 => (1..=16u64).prop_map(|blocks| blocks * u64::from(BLOCK)),
        1 => Just(0u64),
        1 => 1..8192u64,
        1 => Just(u64::from(u32::MAX)),
        1 => Just(64 << 20),
        1 => any::<u64>(),
    ]
}

fn request_strategy() -> impl Strategy<Value = ClientRequest> {
    (
        prop_oneof![
            6 => Just(CMD_READ),
            6 => Just(CMD_WRITE),
            2 => Just(CMD_FLUSH),
            2 => Just(CMD_TRIM),
            2 => Just(CMD_WRITE_ZEROES),
            2 => Just(CMD_BLOCK_STATUS),
            1 => Just(CMD_CACHE),
            1 => any::<u16>(),
        ],
        prop_oneof![12 => Just(0u16), 3 => 0u16..64, 1 => any::<u16>()],
        any::<u64>(),
        offset_strategy(),
        length_strategy(),
    )
        .prop_map(|(command, flags, cookie, offset, length)| ClientRequest {
            command,
            flags,
            cookie,
            offset,
            length,
        })
}

fn session_strategy() -> impl Strategy<Value = Session> {
    (
        prop_oneof![
            12 => Just(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES),
            3 => Just(FLAG_C_FIXED_NEWSTYLE),
            1 => any::<u32>(),
        ],
        prop::collection::vec(option_strategy(), 0..5),
        prop::bool::weighted(0.85),
        prop::bool::weighted(0.03),
        prop_oneof![12 => Just(Vec::new()), 1 => prop::collection::vec(any::<u8>(), 0..12)],
        prop::collection::vec(request_strategy(), 0..12),
        prop::bool::weighted(0.5),
    )
        .prop_map(|(client_flags, options, go, abort, export_name, requests, disconnect)| Session {
            client_flags,
            options,
            go,
            abort,
            export_name,
            requests,
            disconnect,
        })
}

fn mutation_strategy() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        3 => (any::<Index>(), 1..=255u8).prop_map(|(at, bits)| Mutation::Flip(at, bits)),
        1 => any::<Index>().prop_map(Mutation::Cut),
        1 => (any::<Index>(), prop::collection::vec(any::<u8>(), 1..24)).prop_map(|(at, bytes)| Mutation::Insert(at, bytes)),
        1 => any::<Index>().prop_map(Mutation::Saturate),
    ]
}

fn option_bytes(option: u32, data: &[u8], out: &mut Vec<u8>) {
    OptionHeader { option, length: data.len() as u32 }.encode(out);
    out.extend_from_slice(data);
}

fn meta_context_query(queries: &[String]) -> Vec<u8> {
    let mut data = 0u32.to_be_bytes().to_vec();
    data.extend((queries.len() as u32).to_be_bytes());
    for query in queries {
        data.extend((query.len() as u32).to_be_bytes());
        data.extend(query.as_bytes());
    }
    data
}

/// The bytes a client of `session` sends, well formed.
fn encode(session: &Session) -> Vec<u8> {
    let mut out = session.client_flags.to_be_bytes().to_vec();
    let mut style = ReplyStyle::Simple;
    for option in &session.options {
        match option {
            ClientOption::Structured => {
                option_bytes(OPT_STRUCTURED_REPLY, &[], &mut out);
                if style == ReplyStyle::Simple {
                    style = ReplyStyle::Structured;
                }
            }
            ClientOption::Extended => {
                option_bytes(OPT_EXTENDED_HEADERS, &[], &mut out);
                style = ReplyStyle::Extended;
            }
            ClientOption::SetMetaContext(queries) => {
                option_bytes(OPT_SET_META_CONTEXT, &meta_context_query(queries), &mut out)
            }
            ClientOption::ListMetaContext => option_bytes(OPT_LIST_META_CONTEXT, &meta_context_query(&[]), &mut out),
            ClientOption::List => option_bytes(OPT_LIST, &[], &mut out),
            ClientOption::Info(name) => {
                let mut data = Vec::new();
                InfoRequest { name, info_types: vec![INFO_BLOCK_SIZE, INFO_NAME, INFO_DESCRIPTION] }.encode(&mut data);
                option_bytes(OPT_INFO, &data, &mut out);
            }
            ClientOption::StartTls => option_bytes(OPT_STARTTLS, &[], &mut out),
            ClientOption::Unknown(option, data) => option_bytes(*option, data, &mut out),
        }
    }
    if session.abort {
        option_bytes(OPT_ABORT, &[], &mut out);
        return out;
    }
    if session.go {
        let mut data = Vec::new();
        InfoRequest { name: &session.export_name, info_types: vec![INFO_BLOCK_SIZE] }.encode(&mut data);
        option_bytes(OPT_GO, &data, &mut out);
    } else {
        option_bytes(OPT_EXPORT_NAME, &session.export_name, &mut out);
    }
    for request in &session.requests {
        let header = RequestHeader {
            flags: request.flags,
            command: request.command,
            cookie: request.cookie,
            offset: request.offset,
            length: request.length,
        };
        header.encode(style, &mut out);
        if request.command == CMD_WRITE {
            // The payload the header announces, as far as a test can afford to send it; a
            // longer announcement ends with the stream, cut short.
            let sent = request.length.min(64 * 1024) as usize;
            out.extend((0..sent).map(|index| (index as u8) ^ (request.cookie as u8)));
        }
    }
    if session.disconnect {
        RequestHeader { flags: 0, command: CMD_DISC, cookie: 0, offset: 0, length: 0 }.encode(style, &mut out);
    }
    out
}

fn mutate(bytes: &mut Vec<u8>, mutations: &[Mutation]) {
    for mutation in mutations {
        if bytes.is_empty() {
            return;
        }
        match mutation {
            Mutation::Flip(at, bits) => {
                let at = at.index(bytes.len());
                bytes[at] ^= bits;
            }
            Mutation::Cut(at) => bytes.truncate(at.index(bytes.len())),
            Mutation::Insert(at, inserted) => {
                let at = at.index(bytes.len() + 1);
                bytes.splice(at..at, inserted.iter().copied());
            }
            Mutation::Saturate(at) => {
                let at = at.index(bytes.len());
                let end = (at + 4).min(bytes.len());
                bytes[at..end].fill(0xff);
            }
        }
    }
}

/// Sends `bytes` as one client, after reading the greeting as a client would, and shuts down
/// its sending side; everything the export sends back is read concurrently (a reply may be
/// larger than the socket's buffer). Returns how long the export took to close the connection
/// after the last byte, or an error when it did not within [`CLOSE_WITHIN`].
fn play(path: &std::path::Path, bytes: &[u8]) -> Result<Duration, String> {
    let stream = UnixStream::connect(path).map_err(|error| format!("connect: {error}"))?;
    stream.set_read_timeout(Some(CLOSE_WITHIN)).unwrap();
    stream.set_write_timeout(Some(CLOSE_WITHIN)).unwrap();
    let mut reader = stream.try_clone().unwrap();
    let drained = std::thread::spawn(move || {
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            match reader.read(&mut buffer) {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(error) if error.kind() == ErrorKind::Interrupted => {}
                // A reset is a close too (the export closed with our bytes unread).
                Err(error) if error.kind() == ErrorKind::ConnectionReset => return Ok(()),
                Err(error) => return Err(format!("reading the export's replies: {error}")),
            }
        }
    });
    let mut writer = stream;
    // The export may close before it has read everything (a protocol violation ends the
    // connection): a failed write is expected then, not an error of the test.
    let _ = writer.write_all(bytes);
    let sent = Instant::now();
    let _ = writer.shutdown(std::net::Shutdown::Write);
    let outcome = drained.join().map_err(|_| "the reader thread panicked".to_string())?;
    outcome.map(|()| sent.elapsed()).map_err(|error| format!("{error} ({} bytes sent)", bytes.len()))
}

/// A well-behaved client is served after the hostile one: a write of a fresh pattern to a
/// block reads back (or, read-only, a read answers with the disk's contents).
fn still_serves(server: &TestServer, disk: &MemDisk, read_only: bool, round: u64) -> Result<(), TestCaseError> {
    let (mut client, size, _) = RawClient::negotiated(&server.endpoint, ReplyStyle::Structured);
    prop_assert_eq!(size, DISK_BYTES as u64);
    let offset = (round * 7919 % (DISK_BYTES as u64 / u64::from(BLOCK))) * u64::from(BLOCK);
    let expected = if read_only {
        disk.snapshot()[offset as usize..offset as usize + BLOCK as usize].to_vec()
    } else {
        let pattern: Vec<u8> = (0..BLOCK).map(|index| (index as u64 ^ round) as u8).collect();
        client.request(CMD_WRITE, 0, 1, offset, u64::from(BLOCK), &pattern);
        prop_assert_eq!(client.reply(0).error, 0);
        pattern
    };
    client.request(CMD_READ, 0, 2, offset, u64::from(BLOCK), &[]);
    let reply = client.reply(BLOCK as usize);
    prop_assert_eq!(reply.error, 0);
    prop_assert_eq!(reply.data, expected);
    client.request(CMD_DISC, 0, 3, 0, 0, &[]);
    prop_assert!(client.is_closed());
    Ok(())
}

/// What a run of hostile sessions left.
struct Outcome {
    disk: Arc<MemDisk>,
    /// The disk's contents before the first session.
    before: Vec<u8>,
    report: netdam_initiator::nbd::ServeReport,
    /// Backend calls the hostile sessions made (the well-behaved client's not counted).
    hostile_calls: u64,
}

/// Runs `cases` hostile sessions against one export, each followed by a well-behaved client.
fn run_hostile(read_only: bool, cases: u32) -> Outcome {
    count_panics();
    let disk = Arc::new(MemDisk::new(DISK_BYTES, BLOCK).with_allocation(8));
    // Known contents, so that a read-only export can be shown to have changed nothing.
    {
        let mut data = disk.data.lock().unwrap();
        for (index, byte) in data.iter_mut().enumerate() {
            *byte = (index * 31 % 251) as u8;
        }
    }
    let before = disk.snapshot();
    let options = ExportOptions {
        read_only,
        handshake_timeout: Duration::from_secs(5),
        drain_timeout: Duration::from_secs(5),
        ..ExportOptions::default()
    };
    let server = TestServer::unix(disk.clone(), options);
    let Listen::Unix(path) = &server.endpoint else { unreachable!("a unix export") };
    let path = path.clone();
    let seed = std::env::var("NETDAM_SEED").ok().and_then(|text| text.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
    });
    println!("SEED={seed}");
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[seed.to_le_bytes(); 4].concat());
    let config = Config { cases, failure_persistence: None, ..Config::default() };
    let mut runner = TestRunner::new_with_rng(config, rng);
    let round = AtomicU64::new(0);
    let hostile_calls = AtomicU64::new(0);
    let strategy = (session_strategy(), prop::collection::vec(mutation_strategy(), 0..4));
    let result = runner.run(&strategy, |(session, mutations)| {
        let mut bytes = encode(&session);
        mutate(&mut bytes, &mutations);
        // The greeting is read by the reader thread with the rest.
        let calls_before = backend_calls(&disk);
        let took = play(&path, &bytes).map_err(TestCaseError::fail)?;
        hostile_calls.fetch_add(backend_calls(&disk) - calls_before, Ordering::SeqCst);
        prop_assert!(took < CLOSE_WITHIN, "closed after {took:?}");
        prop_assert_eq!(bad_calls(&disk), 0, "a backend call outside what the export promises");
        still_serves(&server, &disk, read_only, round.fetch_add(1, Ordering::SeqCst))
    });
    if let Err(error) = result {
        panic!("{error}");
    }
    let report = server.stop();
    eprintln!("{cases} hostile sessions made {} backend calls; {report:?}", hostile_calls.load(Ordering::SeqCst));
    Outcome { disk, before, report, hostile_calls: hostile_calls.into_inner() }
}

fn bad_calls(disk: &MemDisk) -> u64 {
    disk.calls.bad_calls.load(Ordering::SeqCst)
}

/// Backend calls of every kind so far.
fn backend_calls(disk: &MemDisk) -> u64 {
    let calls = &disk.calls;
    [&calls.reads, &calls.writes, &calls.flushes, &calls.trims, &calls.write_zeroes, &calls.block_statuses]
        .iter()
        .map(|counter| counter.load(Ordering::SeqCst))
        .sum()
}

#[test]
fn hostile_sessions_never_panic_hang_or_misuse_a_writable_export() {
    let Outcome { disk, report, hostile_calls, .. } = run_hostile(false, 1000);
    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "something panicked (see the output above); {report:#?}");
    assert_eq!(report.backend_panics, 0, "{report:#?}");
    assert_eq!(bad_calls(&disk), 0);
    // The sessions reached the backend (the mutations left many of them whole enough), were
    // refused requests, and some were cut off as protocol violations: all three paths ran.
    assert!(hostile_calls > 300, "only {hostile_calls} backend calls from hostile sessions");
    assert!(report.request_errors > 0, "{report:#?}");
    assert!(report.connection_errors > 0, "{report:#?}");
}

#[test]
fn hostile_sessions_change_nothing_through_a_read_only_export() {
    let Outcome { disk, before, report, hostile_calls } = run_hostile(true, 600);
    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "something panicked (see the output above); {report:#?}");
    assert_eq!(bad_calls(&disk), 0);
    for (name, counter) in
        [("writes", &disk.calls.writes), ("trims", &disk.calls.trims), ("write-zeroes", &disk.calls.write_zeroes)]
    {
        assert_eq!(counter.load(Ordering::SeqCst), 0, "{name} reached the backend of a read-only export");
    }
    assert!(disk.snapshot() == before, "the read-only disk changed");
    assert!(hostile_calls > 80, "only {hostile_calls} backend calls from hostile sessions");
    assert!(report.request_errors > 0, "writes were refused: {report:#?}");
}
