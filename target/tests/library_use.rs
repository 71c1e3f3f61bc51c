//! The initiator crate as an application drives it, hurried or careless: ranges that run past a
//! region or past 2^64, refusals it matches on by kind, a namespace whose blocks its datagrams
//! cannot carry, and connects it gives up on. (A library user's pass found each of these.)

mod common;

use std::time::Duration;

use common::{region, start_configured};
use netdam_initiator::{AsyncClient, Client, ClientError, Op, Volume, VolumeOptions};
use netdam_isa::{LaneType, Opcode, Status};
use netdam_target::config::{ByteSize, NamespaceBackend, NamespaceConfig};

const REGION_BYTES: u64 = 1 << 20;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn refused_unsent(result: Result<(), ClientError>, opcode: Opcode, what: &str) {
    match result {
        Err(error @ ClientError::OutsideRegion { opcode: refused, .. }) if refused == opcode as u8 => {
            assert!(error.to_string().ends_with("nothing was sent"), "{what}: {error}");
        }
        other => panic!("{what}: {other:?}"),
    }
}

/// A write (or read, or VADD) whose range ends past the region, or whose end wraps past 2^64,
/// is refused before anything is sent: its pieces inside the region used to be written while
/// the call failed, and with overflow checks off (release builds) the pieces whose offsets
/// wrapped landed at the region's start. The asynchronous client refuses the wrap (a range past
/// the end is its target's to refuse: its HELLO answer may be older than a restart). The
/// region's start and end are unchanged.
#[test]
fn byte_ranges_past_the_region_or_past_2_64_are_refused_before_anything_is_sent() {
    let test = start_configured(vec![region("mem", REGION_BYTES, false)], |_| {});
    let mut client = Client::connect(test.target.local_addr()).unwrap();
    let pattern: Vec<u8> = (0..65536u32).map(|index| (index % 251) as u8).collect();
    let tail = REGION_BYTES - pattern.len() as u64;
    client.write(0, 0, &pattern).unwrap();
    client.write(0, tail, &pattern).unwrap();
    for (offset, what) in [(u64::MAX - 100, "past 2^64"), (REGION_BYTES - 100, "past the region's end")] {
        refused_unsent(client.write(0, offset, &[0xEE; 32768]), Opcode::Write, what);
        refused_unsent(client.read(0, offset, &mut [0u8; 32768]), Opcode::Read, what);
        refused_unsent(client.vadd(0, offset, LaneType::I32, &[1; 32768], false).map(|_| ()), Opcode::Vadd, what);
    }
    runtime().block_on(async {
        let client = AsyncClient::connect(test.target.local_addr()).await.unwrap();
        let offset = u64::MAX - 100;
        refused_unsent(client.write(0, offset, &[0xEE; 32768]).await, Opcode::Write, "async write");
        refused_unsent(client.read(0, offset, 32768).await.map(|_| ()), Opcode::Read, "async read");
        let vadd = client.vadd(0, offset, LaneType::I32, &[1; 32768], false).await;
        refused_unsent(vadd.map(|_| ()), Opcode::Vadd, "async vadd");
        client.close().await;
    });
    for at in [0, tail] {
        let mut back = vec![0u8; pattern.len()];
        client.read(0, at, &mut back).unwrap();
        assert!(back == pattern, "the region was written at {at}");
    }
    // A range that ends exactly at the region's end is the region's.
    client.write(0, REGION_BYTES - 32768, &[7; 32768]).unwrap();
}

/// A request the session refuses before sending it keeps its kind through the asynchronous
/// client (it came back as "socket error: ..." of kind `Io`).
#[test]
fn a_request_refused_before_it_leaves_keeps_its_kind() {
    let test = start_configured(vec![region("mem", REGION_BYTES, false)], |_| {});
    runtime().block_on(async {
        let client = AsyncClient::connect(test.target.local_addr()).await.unwrap();
        let empty = client.call(Vec::new()).await;
        assert!(matches!(empty, Err(ClientError::Empty)), "{:?}", empty.err());
        let huge = client.call(vec![Op::write(0, 0, &vec![0u8; 16384])]).await;
        assert!(matches!(huge, Err(ClientError::TooLarge(_))), "{:?}", huge.err());
        client.close().await;
    });
}

/// A namespace whose blocks the negotiated datagrams cannot carry is refused when the volume
/// opens, naming both sizes; before, the open succeeded and every write failed.
#[test]
fn a_volume_whose_blocks_no_datagram_carries_is_refused_at_open() {
    let test = start_configured(vec![region("mem", REGION_BYTES, false)], |config| {
        config.namespaces = vec![NamespaceConfig {
            name: "big".into(),
            backend: NamespaceBackend::File,
            path: "big.img".into(),
            size: Some(ByteSize(1 << 20)),
            block_size: 8192,
        }];
    });
    runtime().block_on(async {
        let mut options = VolumeOptions::default();
        options.client.session.max_datagram_bytes = 4096;
        let opened = Volume::open(test.target.local_addr(), "big", options).await;
        match opened {
            Err(ClientError::Setting(message)) => {
                assert!(message.contains("8192-byte blocks") && message.contains("(4096 bytes)"), "{message}")
            }
            other => panic!("{:?}", other.map(|volume| volume.transfer_bytes())),
        }
        let volume = Volume::open(test.target.local_addr(), "big", VolumeOptions::default()).await.unwrap();
        volume.write(0, &[5; 8192], false).await.unwrap();
        volume.close().await;
    });
}

/// Forwards one client's datagrams to `target` and the answers back, holding each answer after
/// the first (a HELLO's cookie) for `hold`: the answer that opens the session arrives after a
/// caller who gave up at once has stopped waiting. Stops when dropped.
struct SlowAnswers {
    addr: std::net::SocketAddr,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl SlowAnswers {
    fn start(target: std::net::SocketAddr, hold: Duration) -> SlowAnswers {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::{Arc, Mutex};
        let front = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let back = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        back.connect(target).unwrap();
        for socket in [&front, &back] {
            socket.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        }
        let addr = front.local_addr().unwrap();
        let (front, back) = (Arc::new(front), Arc::new(back));
        let client = Arc::new(Mutex::new(None));
        let stop = Arc::new(AtomicBool::new(false));
        let requests = {
            let (front, back, client, stop) = (front.clone(), back.clone(), client.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut buffer = vec![0u8; 65536];
                while !stop.load(Ordering::Relaxed) {
                    if let Ok((len, from)) = front.recv_from(&mut buffer) {
                        *client.lock().unwrap() = Some(from);
                        let _ = back.send(&buffer[..len]);
                    }
                }
            })
        };
        let answers = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut buffer = vec![0u8; 65536];
                let mut answered = 0;
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(len) = back.recv(&mut buffer) {
                        answered += 1;
                        if answered > 1 {
                            std::thread::sleep(hold);
                        }
                        if let Some(client) = *client.lock().unwrap() {
                            let _ = front.send_to(&buffer[..len], client);
                        }
                    }
                }
            })
        };
        SlowAnswers { addr, stop, threads: vec![requests, answers] }
    }
}

impl Drop for SlowAnswers {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// A connect the caller gives up on after its HELLO has left, and whose answer (the target has
/// made the session) arrives only then, closes that session: the client's task sees the
/// exchange to its end. Before, it stopped where the caller left, and the session held one of
/// its address's slots until the target expired it unused; a loop of connects with a timeout
/// filled the share and the next open was refused.
#[test]
fn connects_given_up_on_leave_no_session_open() {
    let test = start_configured(vec![region("mem", REGION_BYTES, false)], |_| {});
    let runtime = runtime();
    let relays: Vec<SlowAnswers> =
        (0..8).map(|_| SlowAnswers::start(test.target.local_addr(), Duration::from_millis(150))).collect();
    runtime.block_on(async {
        for relay in &relays {
            let connect = tokio::time::timeout(Duration::from_millis(40), AsyncClient::connect(relay.addr)).await;
            assert!(connect.is_err(), "the connect was answered before the caller gave up");
        }
    });
    // The runtime runs on while the abandoned connects' tasks finish their exchanges: each
    // session is closed by its client, not left for the target to expire (after a second
    // unused, UNUSED_SESSION_TIMEOUT, meanwhile holding an address's slot).
    let settled = std::time::Instant::now();
    loop {
        let stats = test.target.stats();
        let (opened, closed) = (stats.get("sessions_opened").unwrap(), stats.get("sessions_closed").unwrap());
        if opened == 8 && closed == 8 {
            break;
        }
        let expired = stats.get("sessions_expired").unwrap();
        assert!(
            settled.elapsed() < Duration::from_secs(5),
            "8 connects given up on: {opened} sessions opened, {closed} closed by the client, {expired} expired"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(runtime);
}

/// A connect given up on while its HELLO waits for a slot (refused `session_limit`, to be asked
/// again for `session_wait`) stops asking: no session was made, so there is none to close, and
/// a HELLO asked again later would take a slot nobody uses. Before, its task went on asking in
/// the background for the whole `session_wait`.
#[test]
fn a_connect_given_up_on_while_it_waits_for_a_slot_stops_asking() {
    let test = start_configured(vec![region("mem", REGION_BYTES, false)], |config| config.max_sessions_per_address = 1);
    // Holds the address's one slot; idle for under a second, it keeps it.
    let _holder = Client::connect(test.target.local_addr()).unwrap();
    let runtime = runtime();
    let refused = || test.target.stats().get("hello_refused_address_limit").unwrap();
    runtime.block_on(async {
        let mut options = netdam_initiator::ClientOptions::default();
        options.session.session_wait = Duration::from_secs(5).into();
        let connect = AsyncClient::connect_with(test.target.local_addr(), options);
        let connect = tokio::time::timeout(Duration::from_millis(100), connect).await;
        assert!(connect.is_err(), "the connect got a slot its address does not have: {connect:?}");
        // A HELLO on the wire when the caller gave up is still answered: its refusal is
        // counted once the longest pause between two HELLOs (320 ms) has passed, and none
        // after that.
        tokio::time::sleep(Duration::from_millis(400)).await;
        let given_up = refused();
        assert!(given_up >= 2, "the target refused {given_up} HELLOs while the caller waited");
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert_eq!(refused(), given_up, "HELLOs were asked again after the caller gave up on the connect");
    });
    drop(runtime);
}

/// FILL, CRC32 and MEMCPY over more than a MiB go as several instructions of at most a MiB
/// (a worker answers nothing else while it runs one: a 4 GiB FILL held a worker 2.8 s), with
/// the same result as one: the bytes set, the CRC of the whole range (combined from the
/// pieces'), the bytes copied; overlapping copies stay one instruction, as `memmove`.
#[test]
fn long_fills_crcs_and_copies_go_in_pieces_with_the_result_of_one() {
    const BYTES: u64 = 8 << 20;
    let test = start_configured(vec![region("mem", BYTES, false)], |_| {});
    let mut client = Client::connect(test.target.local_addr()).unwrap();
    let executed = || test.target.stats().get("instructions_executed").unwrap();
    // The count once it has stopped moving: a worker publishes its counts as it goes, and may
    // still be counting what it answered a moment ago.
    let settled = || {
        let mut last = executed();
        loop {
            std::thread::sleep(Duration::from_millis(30));
            let now = executed();
            if now == last {
                return now;
            }
            last = now;
        }
    };
    // Instructions executed by `run`: `n`, and any of its requests resent (a late answer) may
    // be counted again.
    let pieces_of = |client: &mut Client, n: u64, what: &str, run: &dyn Fn(&mut Client)| {
        let (before, resent) = (settled(), client.session_stats().retransmissions);
        run(client);
        let (counted, resent) = (settled() - before, client.session_stats().retransmissions - resent);
        assert!(counted >= n && counted <= n + resent, "{what}: {counted} instructions executed, {resent} resent");
    };
    let mut local: Vec<u8> = (0..BYTES as usize).map(|index| (index * 7 % 251) as u8).collect();
    for (at, piece) in local.chunks(60_000).enumerate() {
        client.write(0, (at * 60_000) as u64, piece).unwrap();
    }
    let piece = netdam_isa::limits::MAX_LONG_INSTRUCTION_BYTES as u64;
    let (offset, len) = (7, 3 * piece as u32 + 5);

    pieces_of(&mut client, 4, "a fill of 3 MiB and 5 bytes", &|client| client.fill(0, offset, len, 0xA5).unwrap());
    local[offset as usize..offset as usize + len as usize].fill(0xA5);

    let crc = std::cell::Cell::new(0);
    pieces_of(&mut client, 4, "a CRC of 3 MiB and 1005 bytes", &|client| {
        crc.set(client.crc32(0, 3, len + 1000).unwrap())
    });
    assert_eq!(crc.get(), crc32fast::hash(&local[3..3 + len as usize + 1000]), "the CRC of the whole range");
    let asynchronous = runtime().block_on(async {
        let client = AsyncClient::connect(test.target.local_addr()).await.unwrap();
        let crc = client.crc32(0, 3, len + 1000).await.unwrap();
        client.close().await;
        crc
    });
    assert_eq!(asynchronous, crc.get(), "the asynchronous client's CRC of the same range");

    let (to, from) = (5 << 20, 1 << 20);
    let copy = |client: &mut Client| client.memcpy(0, to, 0, from, 2 * piece as u32 + 9).unwrap();
    pieces_of(&mut client, 3, "a copy of 2 MiB and 9 bytes between ranges apart", &copy);
    local.copy_within(from as usize..from as usize + 2 * piece as usize + 9, to as usize);
    // Overlapping ranges, the destination above the source and below it: memmove's result.
    let upwards = |client: &mut Client| client.memcpy(0, 1000, 0, 0, 2 * piece as u32 + 3).unwrap();
    pieces_of(&mut client, 3, "an overlapping copy of 2 MiB and 3 bytes, upwards", &upwards);
    local.copy_within(0..2 * piece as usize + 3, 1000);
    let downwards = |client: &mut Client| client.memcpy(0, 3 << 20, 0, (3 << 20) + 777, 2 * piece as u32 + 3).unwrap();
    pieces_of(&mut client, 3, "an overlapping copy of 2 MiB and 3 bytes, downwards", &downwards);
    local.copy_within((3 << 20) + 777..(3 << 20) + 777 + 2 * piece as usize + 3, 3 << 20);

    // The target itself refuses one instruction over the bound, and changes nothing.
    let limit = piece as u32;
    for (what, op) in [
        ("FILL", Op::fill(0, 0, limit + 1, 0x11)),
        ("CRC32", Op::crc32(0, 0, limit + 1)),
        ("MEMCPY", Op::memcpy(0, 4 << 20, 0, 0, limit + 1)),
    ] {
        let status = client.call(std::slice::from_ref(&op)).unwrap().results().unwrap()[0].status;
        assert_eq!(status, Status::TooLarge, "one {what} of a MiB and a byte");
    }
    for op in [Op::fill(0, 0, limit, 0x5A), Op::memcpy(0, 5 << 20, 0, 1 << 20, limit)] {
        assert_eq!(client.call(std::slice::from_ref(&op)).unwrap().results().unwrap()[0].status, Status::Ok);
    }
    local[..piece as usize].fill(0x5A);
    local.copy_within(1 << 20..2 << 20, 5 << 20);

    let mut back = vec![0u8; BYTES as usize];
    for (at, piece) in back.chunks_mut(60_000).enumerate() {
        client.read(0, (at * 60_000) as u64, piece).unwrap();
    }
    assert!(back == local, "the region differs from the same operations done locally");
}
