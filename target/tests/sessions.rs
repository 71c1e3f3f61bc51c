//! No client can lock others out of the target: sessions close when their clients are done, a
//! HELLO holds a slot only once its sender has proven its address, one address holds a bounded
//! share, and PING and STAT need no session at all.

mod common;

use std::net::{SocketAddr, UdpSocket};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{hello_datagram, region, seed, start_configured, try_hello, Rng, TestTarget};
use netdam_initiator::{AsyncClient, Client, ClientError, ClientOptions};
use netdam_isa::control::{Cookie, SessionLimitKind, NO_COOKIE};
use netdam_isa::wire::{datagram_crc, Response, HEADER_LEN};
use netdam_isa::Status;
use netdam_target::stats::StatsSnapshot;

/// Sessions open at the target: opened and not yet ended (as STAT derives `sessions_open`).
fn sessions_open(stats: &StatsSnapshot) -> u64 {
    let get = |name| stats.get(name).unwrap();
    get("sessions_opened") - get("sessions_closed") - get("sessions_expired") - get("sessions_evicted")
}

/// Waits (up to `limit`) until the target's open sessions number `expected`; returns the count.
fn settle_sessions(test: &TestTarget, expected: u64, limit: Duration) -> u64 {
    let deadline = Instant::now() + limit;
    loop {
        let open = sessions_open(&test.target.stats());
        if open == expected || Instant::now() > deadline {
            return open;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Client options sending from `host` on loopback (127.0.0.0/8 is all local on Linux).
fn from_host(host: [u8; 4]) -> ClientOptions {
    ClientOptions { local_addr: Some(SocketAddr::from((host, 0))), ..ClientOptions::default() }
}

/// A target that holds 4 sessions per address, and 4 clients of 127.0.0.1 that hold them, each
/// having added 1 to the first word of region 0.
fn four_per_address_all_held() -> (TestTarget, Vec<Client>) {
    let test = start_configured(vec![region("mem", 1 << 20, false)], |config| config.max_sessions_per_address = 4);
    let addr = test.target.local_addr();
    let mut held: Vec<Client> =
        (0..4).map(|_| Client::connect_with(addr, from_host([127, 0, 0, 1])).unwrap()).collect();
    for client in &mut held {
        client.fetch_add(0, 0, 1).unwrap();
    }
    (test, held)
}

/// Clients kept active (a ping each every 50 ms) on a thread of their own until `stop`: a
/// session silent for a second is idle, and an idle one gives its slot to a newcomer.
struct KeptActive {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Vec<Client>>,
}

impl KeptActive {
    fn start(mut clients: Vec<Client>) -> KeptActive {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            while !stopping.load(std::sync::atomic::Ordering::Relaxed) {
                for client in &mut clients {
                    client.ping().unwrap();
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            clients
        });
        KeptActive { stop, thread }
    }

    /// Stops pinging and gives the clients back.
    fn stop(self) -> Vec<Client> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// As [`from_host`], for a client whose refusal a test looks at: it does not wait for a slot
/// (`SessionConfig::session_wait`, 0 by default too), where an idle session would give it one
/// after a second.
fn refused_at_once_from(host: [u8; 4]) -> ClientOptions {
    let mut options = from_host(host);
    options.session.session_wait = netdam_isa::Duration::ZERO;
    options
}

#[test]
fn ten_thousand_cli_commands_in_a_row_all_succeed() {
    const COMMANDS: usize = 10_000;
    let test = start_configured(vec![region("mem", 1 << 20, false)], |_| {});
    let target = test.target.local_addr().to_string();
    let netdam = common::netdam_binary();
    let started = Instant::now();
    let mut fetch_adds = 0u64;
    for index in 0..COMMANDS {
        let data = format!("run {index:05}");
        let args: Vec<&str> = match index % 10 {
            0..=3 => vec!["fetch-add", "mem", "0", "1"],
            4 => vec!["ping"],
            5 => vec!["stat"],
            6 => vec!["write", "mem", "4096", "--data", &data],
            7 => vec!["read", "mem", "4096", "9"],
            8 => vec!["cas", "mem", "8", "0", "0"],
            _ => vec!["regions"],
        };
        if index % 10 <= 3 {
            fetch_adds += 1;
        }
        let output = Command::new(&netdam).arg("--target").arg(&target).args(&args).output().expect("netdam runs");
        assert!(
            output.status.success(),
            "command {index} (netdam {args:?}) failed after {:.1} s: {}{}",
            started.elapsed().as_secs_f64(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    println!("{COMMANDS} commands in {:.1} s", started.elapsed().as_secs_f64());
    let stats = test.target.stats();
    assert_eq!(sessions_open(&stats), 0, "every command closed its session on exit");
    assert_eq!(stats.get("sessions_opened"), stats.get("sessions_closed"));
    assert_eq!(stats.get("sessions_opened"), Some(COMMANDS as u64 * 8 / 10), "ping and stat opened none");
    assert_eq!(stats.get("hello_refused_table_full"), Some(0));
    assert_eq!(stats.get("hello_refused_address_limit"), Some(0));
    let mut client = Client::connect(test.target.local_addr()).unwrap();
    assert_eq!(client.fetch_add(0, 0, 0).unwrap(), fetch_adds, "each FETCH_ADD applied exactly once");
}

#[test]
fn two_thousand_clients_connecting_and_dropping_leave_no_session_behind() {
    let test = start_configured(vec![region("mem", 1 << 20, false)], |_| {});
    let addr = test.target.local_addr();
    for index in 0..2_000u64 {
        let mut client = Client::connect(addr).unwrap_or_else(|error| panic!("client {index}: {error}"));
        assert_eq!(client.fetch_add(0, 0, 1).unwrap(), index);
        if index % 2 == 0 {
            drop(client);
        } else {
            client.close().unwrap();
        }
    }
    // Async clients close when their last handle is dropped, from their I/O task.
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    for index in 0..200u64 {
        runtime.block_on(async {
            let client = AsyncClient::connect(addr).await.unwrap();
            let copy = client.clone();
            assert_eq!(copy.fetch_add(0, 0, 1).await.unwrap(), 2_000 + index);
        });
    }
    assert_eq!(settle_sessions(&test, 0, Duration::from_secs(5)), 0, "no session left behind");
    let stats = test.target.stats();
    assert_eq!(stats.get("sessions_opened"), Some(2_200));
    assert_eq!(stats.get("sessions_closed"), Some(2_200), "all ended by CLOSE, none left to expire");
    let mut probe = Client::sessionless(addr).unwrap();
    let stat = probe.stat().unwrap();
    assert!(stat.contains(&("sessions_open".to_string(), 0)), "STAT says so too: {stat:?}");
}

/// A recorded two-step HELLO: the second datagram (with its cookie) and the session it opened.
fn record_exchange(socket: &UdpSocket) -> (Vec<u8>, u32) {
    socket.send(&hello_datagram(1, &NO_COOKIE)).unwrap();
    let mut buffer = vec![0u8; 65_536];
    let len = socket.recv(&mut buffer).unwrap();
    let response = Response::parse(&buffer[..len]).unwrap();
    let result = response.results().next().unwrap();
    assert_eq!(result.status, Status::Retry);
    let cookie = Cookie::try_from(result.data).unwrap();
    let second = hello_datagram(2, &cookie);
    socket.send(&second).unwrap();
    let len = socket.recv(&mut buffer).unwrap();
    let response = Response::parse(&buffer[..len]).unwrap();
    let result = response.results().next().unwrap();
    assert_eq!(result.status, Status::Ok);
    let session = netdam_isa::control::decode_hello_answer(result.data).unwrap().session;
    (second, session)
}

fn connected(host: [u8; 4], addr: SocketAddr) -> UdpSocket {
    let socket = UdpSocket::bind(SocketAddr::from((host, 0))).unwrap();
    socket.connect(addr).unwrap();
    socket
}

#[test]
fn a_flood_of_replayed_and_mutated_hellos_leaves_room_for_a_legitimate_client() {
    const FLOOD: usize = 100_000;
    const BURST: usize = 1_000;
    let seed = seed();
    let mut rng = Rng::new(seed);
    let test = start_configured(vec![region("mem", 1 << 20, false)], |_| {});
    let addr = test.target.local_addr();
    let per_address = netdam_target::Config::default().max_sessions_per_address as u64;

    // The attacker, at 127.0.0.1, records a real exchange, then floods from 64 source ports:
    // the recorded second HELLO replayed from its own port and from others, mutated copies,
    // forged cookies and first HELLOs; and completes real exchanges from 64 more ports.
    let recorder = connected([127, 0, 0, 1], addr);
    recorder.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let (recorded, _) = record_exchange(&recorder);
    recorder.set_nonblocking(true).unwrap();
    let flooders: Vec<UdpSocket> = (0..64)
        .map(|_| {
            let socket = connected([127, 0, 0, 1], addr);
            socket.set_nonblocking(true).unwrap();
            socket
        })
        .collect();
    let handshakers: Vec<UdpSocket> = (0..64)
        .map(|_| {
            let socket = connected([127, 0, 0, 1], addr);
            socket.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
            socket
        })
        .collect();

    // The legitimate client, at 127.0.0.2, connects, writes, reads back and closes, over and
    // over, during the flood and after it.
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicUsize::new(0));
    let legitimate = {
        let (stop, rounds) = (stop.clone(), rounds.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let round = rounds.load(Ordering::Relaxed);
                let mut client = Client::connect_with(addr, from_host([127, 0, 0, 2]))
                    .unwrap_or_else(|error| panic!("legitimate client, round {round}: {error}"));
                let data = format!("round {round}");
                client.write(0, 4096, data.as_bytes()).unwrap();
                let mut back = vec![0u8; data.len()];
                client.read(0, 4096, &mut back).unwrap();
                assert_eq!(back, data.as_bytes());
                drop(client);
                rounds.fetch_add(1, Ordering::Relaxed);
            }
        })
    };

    let mut sent = 0usize;
    let mut refused_for_limit = 0;
    let mut handshakes_served = 0u64;
    let mut most_open = 0;
    let flood_started = Instant::now();
    // At least FLOOD datagrams, and on until the legitimate client has worked during the flood.
    while sent < FLOOD || rounds.load(Ordering::Relaxed) < 3 {
        assert!(
            flood_started.elapsed() < Duration::from_secs(60),
            "SEED={seed}: the legitimate client made no progress"
        );
        for _ in 0..BURST {
            let (socket, bytes) = match rng.below(5) {
                0 => (&recorder, recorded.clone()),
                1 => (&flooders[rng.below(64) as usize], recorded.clone()),
                2 => {
                    // A mutated copy: random bytes in the HELLO operand, CRC fixed so that it
                    // reaches the decoder.
                    let mut bytes = recorded.clone();
                    for _ in 0..1 + rng.below(4) {
                        let at = HEADER_LEN + 24 + rng.below(96) as usize;
                        bytes[at] = rng.next_u64() as u8;
                    }
                    let crc = datagram_crc(&bytes);
                    bytes[28..32].copy_from_slice(&crc.to_le_bytes());
                    (&flooders[rng.below(64) as usize], bytes)
                }
                3 => (&flooders[rng.below(64) as usize], hello_datagram(rng.next_u64(), &NO_COOKIE)),
                _ => {
                    let mut forged = [0u8; netdam_isa::control::COOKIE_LEN];
                    forged.copy_from_slice(&rng.bytes(netdam_isa::control::COOKIE_LEN));
                    (&recorder, hello_datagram(rng.next_u64(), &forged))
                }
            };
            // A full socket buffer drops the datagram, as a congested network would.
            let _ = socket.send(&bytes);
            sent += 1;
        }
        // One real exchange per burst from the attacker's address: at most its share succeeds.
        let handshaker = &handshakers[(sent / BURST) % handshakers.len()];
        match try_hello(handshaker) {
            Ok(_) => handshakes_served += 1,
            Err(status) => {
                assert_eq!(status, Status::SessionLimit, "SEED={seed}");
                refused_for_limit += 1;
            }
        }
        let open = sessions_open(&test.target.stats());
        most_open = most_open.max(open);
        // The attacker's share, and the legitimate client's one session.
        assert!(open <= per_address + 1, "SEED={seed}: {open} sessions open during the flood");
        std::thread::sleep(Duration::from_millis(5));
    }
    let during = rounds.load(Ordering::Relaxed);
    println!(
        "flood of {sent} datagrams in {:.1} s; legitimate rounds during it: {during}; most sessions open: {most_open}",
        flood_started.elapsed().as_secs_f64()
    );
    // And after the flood.
    while rounds.load(Ordering::Relaxed) < during + 3 {
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Ordering::Relaxed);
    legitimate.join().expect("the legitimate client never failed");

    let stats = test.target.stats();
    for (name, value) in &stats.counters {
        if name.contains("session") || name.contains("cookie") || name.contains("hello") {
            println!("{name:<30} {value}");
        }
    }
    let get = |name| stats.get(name).unwrap();
    assert!(get("cookies_sent") > 10_000, "SEED={seed}: first HELLOs and bad cookies got cookies");
    assert!(get("hello_bad_cookie") > 10_000, "SEED={seed}: replays from other ports and mutations are caught");
    assert!(refused_for_limit > 0 && get("hello_refused_address_limit") >= refused_for_limit);
    assert_eq!(get("hello_refused_table_full"), 0, "the table never filled");
    // Thousands of replays of the recorded HELLO from its own port found the session it had
    // opened; once that one expired unused (after a second), a replay could open one more,
    // until the cookie itself expired after 5 s: a handful of sessions, not thousands.
    let legitimate_sessions = rounds.load(Ordering::Relaxed) as u64;
    let from_replays = get("sessions_opened") - legitimate_sessions - handshakes_served;
    assert!(from_replays <= 6, "SEED={seed}: replays of one HELLO opened {from_replays} sessions");
    // The attacker's sessions never sent a request: each expires within about a second.
    assert_eq!(settle_sessions(&test, 0, Duration::from_secs(5)), 0, "SEED={seed}: unused sessions expire");
    // Now even the attacker's address is served again.
    let mut client = Client::connect(addr).unwrap();
    client.write(0, 0, b"after").unwrap();
}

#[test]
fn an_address_at_its_limit_is_refused_while_another_address_is_served() {
    let (test, mut held) = four_per_address_all_held();
    let addr = test.target.local_addr();
    let refused = Client::connect_with(addr, refused_at_once_from([127, 0, 0, 1])).unwrap_err();
    assert!(
        matches!(refused, ClientError::SessionLimit { kind: SessionLimitKind::Address, limit: 4 }),
        "the answer says which limit, and its value: {refused:?}"
    );
    assert!(
        refused.to_string().contains("max_sessions_per_address = 4, counted on each worker"),
        "the message names the setting: {refused}"
    );
    let mut other = Client::connect_with(addr, from_host([127, 0, 0, 3])).expect("another address is served");
    other.fetch_add(0, 0, 1).unwrap();
    // Closing one frees its place at once.
    held.pop().unwrap().close().unwrap();
    let mut again = Client::connect_with(addr, from_host([127, 0, 0, 1])).expect("a place was freed");
    assert_eq!(again.fetch_add(0, 0, 0).unwrap(), 5);
    assert_eq!(test.target.stats().get("hello_refused_address_limit"), Some(1));
}

/// Clients beyond their address's share wait for a slot rather than fail, as many one-shot
/// commands started at once do (`SessionConfig::session_wait`): here 8 of them while 4 active
/// sessions hold the address's share until the target has refused HELLOs 8 times (a waiting
/// client asks again every 10 to 320 ms, so one may count several).
#[test]
fn clients_beyond_the_share_wait_for_a_slot_and_all_get_one() {
    let (test, held) = four_per_address_all_held();
    let addr = test.target.local_addr();
    let active = KeptActive::start(held);
    let waiting: Vec<_> = (0..8)
        .map(|_| {
            std::thread::spawn(move || {
                let mut options = from_host([127, 0, 0, 1]);
                options.session.session_wait = netdam_isa::Duration::from_millis(5_000);
                let mut client = Client::connect_with(addr, options)?;
                client.fetch_add(0, 0, 1)?;
                client.close()
            })
        })
        .collect();
    let refused = || test.target.stats().get("hello_refused_address_limit").unwrap_or(0);
    let deadline = Instant::now() + Duration::from_secs(4);
    while refused() < 8 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let refused_while_held = refused();
    for client in active.stop() {
        client.close().unwrap();
    }
    assert!(refused_while_held >= 8, "refusals while the share was held (8 clients waiting): {refused_while_held}");
    for (index, thread) in waiting.into_iter().enumerate() {
        thread.join().unwrap().unwrap_or_else(|error| panic!("client {index} of 8 failed: {error}"));
    }
    let mut check = Client::connect(addr).unwrap();
    assert_eq!(check.fetch_add(0, 0, 0).unwrap(), 12, "4 held and 8 waiting clients each added once");
}

#[test]
fn ping_and_stat_answer_when_every_slot_is_taken_and_idle_sessions_make_room() {
    let test = start_configured(vec![region("mem", 1 << 20, false)], |config| {
        config.sessions_per_worker = 16;
        config.max_sessions_per_address = 16;
    });
    let addr = test.target.local_addr();
    let mut held: Vec<Client> = (0..16).map(|_| Client::connect(addr).unwrap()).collect();
    for client in &mut held {
        client.ping().unwrap();
    }
    let refused = Client::connect_with(addr, refused_at_once_from([127, 0, 0, 4])).unwrap_err();
    assert!(matches!(refused, ClientError::HelloRefused(Status::Busy)), "{refused:?}");

    // Sessionless: the library's and the command line's PING and STAT still answer.
    let mut probe = Client::sessionless(addr).unwrap();
    probe.ping().unwrap();
    let stat = probe.stat().unwrap();
    assert!(stat.contains(&("sessions_open".to_string(), 16)), "{stat:?}");
    assert!(stat.contains(&("hello_refused_table_full".to_string(), 1)), "{stat:?}");
    for command in ["ping", "stat"] {
        let output =
            Command::new(common::netdam_binary()).args(["--target", &addr.to_string(), command]).output().unwrap();
        assert!(output.status.success(), "netdam {command}: {}", String::from_utf8_lossy(&output.stderr));
    }
    // A command that needs a session, from the address holding every slot, is refused for
    // that address's share (checked before the table as a whole), and says so: once it has
    // waited for a slot (the command line's 5 s of `SessionConfig::session_wait`), while the
    // sessions stay active.
    let active = KeptActive::start(held);
    let output =
        Command::new(common::netdam_binary()).args(["--target", &addr.to_string(), "regions"]).output().unwrap();
    let mut held = active.stop();
    assert!(!output.status.success(), "a command that needs a session is refused");
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(message.contains("max_sessions_per_address"), "the CLI says why: {message}");
    assert!(refused.to_string().contains("every session slot is held"), "and the library: {refused}");

    // After a second of silence the sessions are idle: a newcomer takes the longest-idle one.
    std::thread::sleep(Duration::from_millis(1_100));
    for client in &mut held[1..] {
        client.ping().unwrap();
    }
    let mut newcomer = Client::connect_with(addr, from_host([127, 0, 0, 4])).expect("an idle session made room");
    newcomer.ping().unwrap();
    assert_eq!(test.target.stats().get("sessions_evicted"), Some(1));
    // The evicted client says HELLO again when it next speaks, and gets in once a slot frees.
    drop(newcomer);
    held[0].ping().expect("the evicted client rejoins");
}

#[test]
fn a_client_whose_session_expired_or_was_lost_carries_on() {
    let test = start_configured(vec![region("mem", 1 << 20, false)], |config| config.session_idle_timeout_ms = 1_000);
    let addr = test.target.local_addr();
    let mut unused = Client::connect(addr).unwrap();
    let mut used = Client::connect(addr).unwrap();
    used.fetch_add(0, 0, 1).unwrap();
    // One expires unused after a second, the other silent after the idle timeout.
    std::thread::sleep(Duration::from_millis(1_300));
    let data: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
    for client in [&mut unused, &mut used] {
        client.write(0, 4096, &data).expect("a pipelined write after expiry");
        let mut back = vec![0u8; data.len()];
        client.read(0, 4096, &mut back).unwrap();
        assert_eq!(back, data);
    }
    assert_eq!(used.fetch_add(0, 0, 1).unwrap(), 1, "a FETCH_ADD refused for want of a session ran once, later");
    assert_eq!(unused.session_stats().sessions_lost, 1);
    let stats = test.target.stats();
    assert_eq!(stats.get("sessions_expired"), Some(2));
    assert!(stats.get("answered_no_session").unwrap() >= 2);
}
