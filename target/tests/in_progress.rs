//! In-progress notices (PROTOCOL.md, "In-progress notices"): a request that waits long for its
//! block I/O is not resent by its initiator, because the target tells it, every 5 ms, that the
//! request is still executing; and a retransmission of such a request is answered with the
//! same notice at once instead of being dropped.

mod common;

use std::net::UdpSocket;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use netdam_initiator::{Client, ClientOptions, ClientPoll, Op};
use netdam_isa::limits::IN_PROGRESS_NOTICE_INTERVAL;
use netdam_isa::wire::{RequestBuilder, Response};
use netdam_isa::Status;

const BLOCK: u32 = 4096;
const BLOCKS: u64 = 64;
/// A device taking over three times the reference initiator's floor of a block request's
/// retransmission timeout (20 ms).
const DEVICE_TIME: Duration = Duration::from_millis(70);
/// A disk stalling for over three times the block timeout's floor of the first test's client
/// (40 ms: eight notice intervals, so that a worker that loses its core for a while on a loaded
/// machine still sends a notice in time), after a start at 1 ms per request: without notices
/// each request of the stall would be resent twice (at 40 and 120 ms).
const STALL: Duration = Duration::from_millis(150);
const QUICK: Duration = Duration::from_millis(1);

fn stat(client: &mut Client, name: &str) -> u64 {
    let stats = client.stat().unwrap();
    stats.iter().find(|(entry, _)| entry == name).unwrap_or_else(|| panic!("STAT has no {name}")).1
}

#[test]
fn a_request_slower_than_its_timeout_is_waited_for_not_resent() {
    let device_time = Arc::new(AtomicU64::new(0));
    let stalling = common::slow_device::namespace_with("slow", BLOCK, BLOCKS, device_time.clone());
    let test = common::start_with_devices(vec![stalling]);
    for poll in [ClientPoll::Blocking, ClientPoll::Busy, ClientPoll::Adaptive] {
        let mut options = ClientOptions { poll, ..ClientOptions::default() };
        options.session.min_block_rto = netdam_isa::Duration::from_millis(40);
        let mut client = Client::connect_with(test.target.local_addr(), options).unwrap();
        let disk = client.namespace("slow").unwrap().clone();
        // The session learns a quick disk: its block timeout falls to its 40 ms floor.
        device_time.store(QUICK.as_nanos() as u64, Ordering::Relaxed);
        let mut block = vec![0u8; BLOCK as usize];
        for round in 0..20 {
            client.block_read(&disk, round, &mut block).unwrap();
        }
        let learned = client.session_stats().rto;
        assert!(
            learned.as_nanos() < (STALL / 3).as_nanos() as u64,
            "{poll:?}: the timeout is shorter than the stall: {learned:?}"
        );
        // Then the disk stalls.
        device_time.store(STALL.as_nanos() as u64, Ordering::Relaxed);
        let data: Vec<u8> = (0..2 * BLOCK as usize).map(|i| (i * 7 + 1) as u8).collect();
        let started = Instant::now();
        client.block_write(&disk, 3, &data, false).unwrap();
        let mut back = vec![0u8; data.len()];
        client.block_read(&disk, 3, &mut back).unwrap();
        let took = started.elapsed();
        assert!(back == data, "{poll:?}: the blocks read back as written");
        assert!(took >= 2 * STALL, "{poll:?}: each request waited for the device: {took:?}");
        let stats = client.session_stats();
        assert_eq!(stats.retransmissions, 0, "{poll:?}: nothing was resent: {stats:?}");
        assert_eq!(stats.timeouts, 0, "{poll:?}");
        // A notice 5 ms after the start and every 5 ms after: 29 in 150 ms, per request. A
        // loaded machine may send fewer, late, but not one per request.
        assert!(stats.in_progress_notices >= 8, "{poll:?}: notices kept the requests alive: {stats:?}");
    }
    let mut client = Client::connect(test.target.local_addr()).unwrap();
    assert!(stat(&mut client, "in_progress_notices") >= 24, "the target counts the notices it sent");
    assert_eq!(stat(&mut client, "status_in_progress"), 0, "a notice is a datagram status, not a result");
}

/// A BREAD of `block` as the next request of `session`, encoded as a client would.
fn block_read_request(session: u32, sequence: u64, namespace: u16, block: u64) -> Vec<u8> {
    let mut buffer = vec![0u8; 256];
    let mut builder = RequestBuilder::new(&mut buffer, session, sequence).unwrap();
    builder.push(&Op::block_read(namespace, block, 1).as_instruction()).unwrap();
    let len = builder.finish();
    buffer.truncate(len);
    buffer
}

#[test]
fn a_retransmission_of_a_request_in_progress_is_answered_in_progress() {
    let test = common::start_with_devices(vec![common::slow_device::namespace("slow", BLOCK, BLOCKS, DEVICE_TIME)]);
    let namespace = Client::connect(test.target.local_addr()).unwrap().namespace("slow").unwrap().id;
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.connect(test.target.local_addr()).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let session = common::hello(&socket);
    let request = block_read_request(session, 1, namespace, 5);
    socket.send(&request).unwrap();
    // Sent again soon, well before the device answers.
    std::thread::sleep(Duration::from_millis(2));
    socket.send(&request).unwrap();
    let mut answers = Vec::new();
    let mut buffer = vec![0u8; 16_384];
    while answers.last().is_none_or(|(status, _, _)| *status == Status::InProgress) {
        let len = socket.recv(&mut buffer).expect("an answer within 2 s");
        let response = Response::parse(&buffer[..len]).expect("the target's datagrams parse");
        assert_eq!((response.header.session, response.header.sequence), (session, 1), "about the request");
        answers.push((response.status(), response.header.count, response.header.service_time_ns));
    }
    // Notices (the duplicate's and the timer's, every 5 ms), then the one answer: the read was
    // not executed twice.
    let notices = &answers[..answers.len() - 1];
    assert!(notices.iter().all(|(status, count, _)| *status == Status::InProgress && *count == 0), "{answers:?}");
    assert!(notices.len() >= 3, "the duplicate's notice and the timer's: {answers:?}");
    // A timer's notice says the target has held the request at least the interval; the one that
    // answered the duplicate says how long the duplicate itself took.
    let interval = IN_PROGRESS_NOTICE_INTERVAL.as_nanos();
    assert!(
        notices.iter().any(|(_, _, held_ns)| u64::from(*held_ns) < interval),
        "a notice answered the duplicate: {answers:?}"
    );
    assert!(
        notices.iter().filter(|(_, _, held_ns)| u64::from(*held_ns) >= interval).count() >= 2,
        "and the timer sent its own: {answers:?}"
    );
    let (last, count, service_ns) = *answers.last().unwrap();
    assert_eq!((last, count), (Status::Ok, 1), "then the answer: {answers:?}");
    assert!(service_ns >= DEVICE_TIME.as_nanos() as u32, "{answers:?}");
    // No second answer follows: the duplicate was not executed.
    socket.set_read_timeout(Some(DEVICE_TIME * 2)).unwrap();
    assert!(socket.recv(&mut buffer).is_err(), "one answer only");
}
