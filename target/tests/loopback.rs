//! A real target on loopback, driven through the client library: every implemented opcode.

mod common;

use common::{region, start};
use netdam_initiator::{AsyncClient, Client, ClientError, Op};
use netdam_isa::semantics::{bf16_to_f32, f32_to_bf16};
use netdam_isa::{LaneType, Status};

#[test]
fn every_memory_opcode_round_trips() {
    let test = start(vec![region("mem", 1 << 20, false), region("file", 1 << 20, true)], 1, 9000);
    let mut client = Client::connect(test.target.local_addr()).unwrap();
    let regions = &client.info().hello.regions;
    assert_eq!(regions.len(), 2);
    assert!(!regions[0].persistent && regions[1].persistent);
    let (mem, file) = (client.region("mem").unwrap().id, client.region("file").unwrap().id);
    assert_eq!(client.region("1").unwrap().name, "file");
    assert!(matches!(client.region("nope"), Err(ClientError::NoSuchRegion { .. })));

    let reply = client.ping().unwrap();
    assert_eq!(reply.response().header.ttl, 64, "loopback delivers the default TTL, which the target echoes");

    // READ/WRITE across many datagrams in both region kinds.
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    for space in [mem, file] {
        client.write(space, 12_345, &data).unwrap();
        let mut back = vec![0u8; data.len()];
        client.read(space, 12_345, &mut back).unwrap();
        assert_eq!(back, data);
    }

    // Atomics.
    assert_eq!(client.fetch_add(file, 8, 40).unwrap(), 0, "offset 8 lies before the data written at 12345");
    assert_eq!(client.fetch_add(file, 8, 2).unwrap(), 40);
    assert_eq!(client.cas(file, 8, 41, 7).unwrap(), 42, "failed CAS returns the current value");
    assert_eq!(client.cas(file, 8, 42, 7).unwrap(), 42);
    assert_eq!(client.fetch_add(file, 8, 0).unwrap(), 7);

    // FILL, MEMCPY across regions, CRC32.
    client.fill(mem, 500_000, 1000, 0x5A).unwrap();
    client.memcpy(file, 600_000, mem, 500_000, 1000).unwrap();
    let mut copied = vec![0u8; 1000];
    client.read(file, 600_000, &mut copied).unwrap();
    assert_eq!(copied, vec![0x5A; 1000]);
    assert_eq!(client.crc32(file, 600_000, 1000).unwrap(), crc32fast::hash(&copied));

    // VADD: 2048 f32 lanes (one jumbo datagram), i32, bf16.
    let lanes: Vec<u8> = (0..2048).flat_map(|i| (i as f32).to_le_bytes()).collect();
    client.vadd(mem, 0, LaneType::F32, &lanes, false).unwrap();
    let result = client.vadd(mem, 0, LaneType::F32, &lanes, true).unwrap();
    let sums: Vec<f32> = result.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(sums.len(), 2048);
    assert!(sums.iter().enumerate().all(|(i, v)| *v == 2.0 * i as f32));
    let ints: Vec<u8> = [5i32, -9].iter().flat_map(|v| v.to_le_bytes()).collect();
    client.fill(mem, 9000, 8, 0).unwrap();
    let result = client.vadd(mem, 9000, LaneType::I32, &ints, true).unwrap();
    assert_eq!(result, ints);
    let halves: Vec<u8> = [0.5f32, 3.0].iter().flat_map(|v| f32_to_bf16(*v).to_le_bytes()).collect();
    client.fill(mem, 9100, 4, 0).unwrap();
    client.vadd(mem, 9100, LaneType::Bf16, &halves, false).unwrap();
    let result = client.vadd(mem, 9100, LaneType::Bf16, &halves, true).unwrap();
    assert_eq!(bf16_to_f32(u16::from_le_bytes([result[0], result[1]])), 1.0);
    assert_eq!(bf16_to_f32(u16::from_le_bytes([result[2], result[3]])), 6.0);

    // STAT counts what happened.
    let stats = client.stat().unwrap();
    let value = |name: &str| stats.iter().find(|(n, _)| n == name).map(|(_, v)| *v).unwrap();
    assert!(value("status_ok") > 70);
    assert_eq!(value("regions"), 2);
    assert_eq!(value("dropped_bad_crc"), 0);
}

#[test]
fn several_instructions_in_one_datagram_each_get_a_status() {
    let test = start(vec![region("mem", 65536, false)], 1, 9000);
    let mut client = Client::connect(test.target.local_addr()).unwrap();
    let reply = client
        .call(&[
            Op::write(0, 0, b"abcdefgh"),
            Op::read(0, 65_530, 16),           // out of range
            Op::fetch_add(0, 3, 1),            // unaligned
            Op { opcode: 0x7E, ..Op::ping() }, // unknown opcode
            Op::read(9, 0, 1),                 // no such region
            Op { opcode: 0x40, ..Op::ping() }, // block read: this target has no namespace
            Op::read(0, 0, 8),                 // still executed after the failures
        ])
        .unwrap();
    let results = reply.results().unwrap();
    let statuses: Vec<Status> = results.iter().map(|result| result.status).collect();
    assert_eq!(
        statuses,
        [
            Status::Ok,
            Status::OutOfRange,
            Status::Unaligned,
            Status::UnknownOpcode,
            Status::NoSuchSpace,
            Status::NoSuchSpace,
            Status::Ok
        ]
    );
    assert_eq!(results[6].data, b"abcdefgh");
    // A READ whose answer cannot fit in a datagram is refused, not truncated.
    let reply = client.call(&[Op::read(0, 0, 9000)]).unwrap();
    assert!(matches!(reply.data(0), Err(ClientError::Refused { status: Status::TooLarge, .. })));
}

#[test]
fn pipelined_requests_complete_in_any_order() {
    let test = start(vec![region("mem", 65536, false)], 1, 9000);
    let mut client = Client::connect(test.target.local_addr()).unwrap();
    let tickets: Vec<_> =
        (0..20u64).map(|i| client.submit(&[Op::write(0, i * 8, &i.to_le_bytes())]).unwrap()).collect();
    // Wait in reverse order: answers that arrive first are kept for their own ticket.
    for ticket in tickets.into_iter().rev() {
        client.wait(ticket).unwrap().data(0).unwrap();
    }
    let mut back = vec![0u8; 160];
    client.read(0, 0, &mut back).unwrap();
    for (i, word) in back.chunks_exact(8).enumerate() {
        assert_eq!(u64::from_le_bytes(word.try_into().unwrap()), i as u64);
    }
}

/// Requests enqueued together leave in one train (one system call; the target still gets
/// them as separate datagrams), and a window refilled by `pipeline` does too.
#[test]
fn requests_enqueued_together_leave_in_trains() {
    let test = start(vec![region("mem", 1 << 20, false)], 1, 9000);
    // A fixed window: Swift's would pace a new session's first requests out a few at a time.
    let mut options = netdam_initiator::ClientOptions::default();
    options.session.congestion = None;
    let mut client = Client::connect_with(test.target.local_addr(), options).unwrap();
    let before = client.session_stats();
    let ops: Vec<Op> = (0..12u8).map(|i| Op::write(0, u64::from(i) * 1000, &[i; 1000])).collect();
    let tickets: Vec<_> = ops.iter().map(|op| client.enqueue_with(1, |_| op.as_instruction()).unwrap()).collect();
    assert_eq!(client.session_stats().transmissions, before.transmissions, "enqueued, not sent yet");
    client.send_enqueued();
    let sent = client.session_stats();
    assert_eq!(sent.transmissions - before.transmissions, 12, "all twelve went at once");
    assert_eq!(sent.trains - before.trains, 1, "in one train");
    for ticket in tickets {
        client.wait(ticket).unwrap().data(0).unwrap();
    }
    let mut back = vec![0u8; 12_000];
    client.read(0, 0, &mut back).unwrap();
    for (i, piece) in back.chunks(1000).enumerate() {
        assert!(piece.iter().all(|&byte| byte == i as u8), "piece {i} came back as written");
    }
    // A bulk write fills the window at once: trains again, and every byte lands.
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let trains = client.session_stats().trains;
    client.write(0, 100_000, &data).unwrap();
    assert!(client.session_stats().trains > trains);
    let mut back = vec![0u8; data.len()];
    client.read(0, 100_000, &mut back).unwrap();
    assert!(back == data);
}

/// With `request_trains` off the same requests go one by one, and land the same.
#[test]
fn request_trains_can_be_turned_off() {
    let test = start(vec![region("mem", 1 << 20, false)], 1, 9000);
    let mut options = netdam_initiator::ClientOptions { request_trains: false, ..Default::default() };
    // A fixed window, as above, where trains would be certain.
    options.session.congestion = None;
    let mut client = Client::connect_with(test.target.local_addr(), options).unwrap();
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 241) as u8).collect();
    client.write(0, 0, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    client.read(0, 0, &mut back).unwrap();
    assert!(back == data);
    assert_eq!(client.session_stats().trains, 0);
}

/// Requests sent together, lone and in trains, to a target that is gone fail with
/// `NotListening` once the session stops waiting for a restart. (That the refusal of a train's
/// own `sendmsg` is reported is checked in the initiator's `client` tests; here the refusal may
/// also come from a receive.)
#[test]
fn requests_to_a_target_that_is_gone_fail_with_not_listening() {
    let test = start(vec![region("mem", 1 << 20, false)], 1, 9000);
    let mut options = netdam_initiator::ClientOptions::default();
    // No patience for a restart: the first refusal fails what waits.
    options.session.reconnect_patience = netdam_isa::Duration::ZERO;
    let mut client = Client::connect_with(test.target.local_addr(), options).unwrap();
    client.write(0, 0, b"here").unwrap();
    drop(test);
    let ops: Vec<Op> = (0..4u8).map(|i| Op::write(0, u64::from(i) * 100, &[i; 100])).collect();
    let mut outcome = Ok(());
    for _ in 0..20 {
        // A lone request draws the ICMP port-unreachable; the kernel then reports it on the
        // socket's next call, which is the train's `sendmsg`, not a receive.
        let _lone = client.submit(&[Op::write(0, 0, b"gone")]).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let tickets: Vec<_> = ops.iter().map(|op| client.enqueue_with(1, |_| op.as_instruction()).unwrap()).collect();
        client.send_enqueued();
        outcome = client.wait(tickets[0]).map(|_| ());
        if outcome.is_err() {
            break;
        }
    }
    match outcome {
        Err(ClientError::NotListening(_)) => {}
        other => panic!("expected NotListening, got {other:?}"),
    }
}

#[test]
fn workers_share_the_port_and_atomics_stay_exact() {
    let test = start(vec![region("counters", 4096, false)], 2, 9000);
    let addr = test.target.local_addr();
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(move || {
                let mut client = Client::connect(addr).unwrap();
                for _ in 0..500 {
                    client.fetch_add(0, 0, 1).unwrap();
                    client.vadd(0, 8, LaneType::I32, &1i32.to_le_bytes(), false).unwrap();
                }
            });
        }
    });
    let mut client = Client::connect(addr).unwrap();
    assert_eq!(client.fetch_add(0, 0, 0).unwrap(), 2000);
    let mut lane = [0u8; 4];
    client.read(0, 8, &mut lane).unwrap();
    assert_eq!(i32::from_le_bytes(lane), 2000);
    let stats = test.target.stats();
    assert!(stats.get("datagrams_received").unwrap() >= 4000);
}

#[test]
fn async_client_runs_many_requests_concurrently() {
    let test = start(vec![region("mem", 1 << 20, false)], 1, 9000);
    let addr = test.target.local_addr();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async move {
        let client = AsyncClient::connect(addr).await.unwrap();
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
        client.write(0, 100, &data).await.unwrap();
        assert_eq!(client.read(0, 100, data.len()).await.unwrap(), data);
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                for _ in 0..50 {
                    client.fetch_add(0, 1 << 19, 1).await.unwrap();
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(client.fetch_add(0, 1 << 19, 0).await.unwrap(), 400);
        assert_eq!(client.crc32(0, 100, 1000).await.unwrap(), crc32fast::hash(&data[..1000]));
        assert!(client.ping().await.is_ok());
        assert!(client.stat().await.unwrap().iter().any(|(name, value)| name == "status_ok" && *value > 400));
    });
}

#[test]
fn a_missing_target_is_reported_as_such() {
    // Bind and drop a socket to find a free port, on a loopback address no other test binds (a
    // target started by a parallel test on 127.0.0.1 could otherwise take the port meanwhile).
    let port = std::net::UdpSocket::bind("127.45.67.89:0").unwrap().local_addr().unwrap();
    match Client::connect(port) {
        Err(ClientError::NotListening(addr)) => assert_eq!(addr, port),
        other => panic!("expected NotListening, got {other:?}"),
    }
}

/// A target on `addr` with one anonymous region and its files in `data_dir`, as after a
/// restart.
fn start_at(addr: std::net::SocketAddr, data_dir: &std::path::Path) -> netdam_target::Target {
    let config = netdam_target::Config {
        listen: addr,
        // Metrics on, on any free port: tests and benchmarks run many targets at once.
        metrics_listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: Some(data_dir.to_path_buf()),
        poll: netdam_target::PollMode::Blocking,
        regions: vec![region("mem", 65536, false)],
        auth: netdam_target::AuthMode::None,
        ..netdam_target::Config::default()
    };
    netdam_target::Target::start(&config).unwrap()
}

#[test]
fn a_client_rejoins_a_restarted_target_and_resends_what_never_ran() {
    let first = start(vec![region("mem", 65536, false)], 1, 9000);
    let addr = first.target.local_addr();
    // Round trips here take microseconds, and so would the timeout learned from them: on a
    // loaded machine a request would be sent again before the new target's no_session answer
    // is read, and that second no_session (or, for the FETCH_ADD, SessionLost, since its first
    // transmission might then have run) is not what this test is about. A 2 s floor keeps one
    // transmission per request.
    let mut options = netdam_initiator::ClientOptions::default();
    options.session.min_rto = netdam_isa::Duration::from_millis(2_000);
    let mut client = Client::connect_with(addr, options).unwrap();
    client.write(0, 0, b"before").unwrap();
    drop(first);

    // The new target knows no session: the client says HELLO again and resends the READ.
    // One target at a time on the directory, as a restarted target is.
    let data_dir = tempfile::tempdir().unwrap();
    let second = start_at(addr, data_dir.path());
    let reply = client.call(&[Op::read(0, 0, 6)]).unwrap();
    assert_eq!(reply.data(0).unwrap(), [0u8; 6], "a fresh anonymous region");
    assert_eq!(second.stats().get("answered_no_session"), Some(1));
    second.stop();

    // A FETCH_ADD whose only transmission was refused for want of a session never ran: it is
    // resent in the new session and applies exactly once.
    let third = start_at(addr, data_dir.path());
    assert_eq!(
        client.call(&[Op::fetch_add(0, 0, 1)]).and_then(|reply| reply.data(0).map(<[u8]>::to_vec)).unwrap(),
        0u64.to_le_bytes()
    );
    assert_eq!(client.fetch_add(0, 0, 0).unwrap(), 1, "applied once");
    assert_eq!(third.stats().get("answered_no_session"), Some(1));
    third.stop();
}

/// A target stand-in on a raw socket that opens a session, drops the first transmission of the
/// next request, and answers its retransmission `no_session`: the request may have run (its
/// first transmission might have), so a non-idempotent one must not be sent again.
#[test]
fn a_non_idempotent_request_that_may_have_run_is_not_resent_in_a_new_session() {
    use netdam_isa::control::{encode_hello_answer, HelloRequest};
    use netdam_isa::wire::{Request, ResponseWriter};

    let fake = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = fake.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let mut buffer = vec![0u8; 65_536];
        let mut out = vec![0u8; 9000];
        let mut fetch_adds = 0;
        let mut hellos = 0;
        // Serves until nothing has come for half a second: long enough to see any resend.
        fake.set_read_timeout(Some(std::time::Duration::from_millis(500))).unwrap();
        while let Ok((len, from)) = fake.recv_from(&mut buffer) {
            let request = Request::parse(&buffer[..len]).unwrap();
            let instruction = request.instructions().next().unwrap();
            let mut response = ResponseWriter::new(&mut out, request.header.session, request.header.sequence);
            match netdam_isa::Opcode::from_u8(instruction.opcode) {
                Some(netdam_isa::Opcode::Hello) => {
                    hellos += 1;
                    let hello: HelloRequest = netdam_isa::control::decode_hello_operand(instruction.operand).unwrap();
                    if hello.cookie == netdam_isa::control::NO_COOKIE {
                        response.data_area()[..24].fill(9);
                        response.commit(instruction.opcode, Status::Retry, 24);
                    } else {
                        let capacity = response.data_capacity();
                        let len = encode_hello_answer(
                            &mut response.data_area()[..capacity],
                            5 + hellos,
                            9000,
                            64,
                            0,
                            [(0u16, "mem", 4096u64, false)].into_iter(),
                            std::iter::empty(),
                        )
                        .unwrap();
                        response.commit(instruction.opcode, Status::Ok, len);
                    }
                }
                Some(netdam_isa::Opcode::FetchAdd) => {
                    fetch_adds += 1;
                    if fetch_adds == 1 {
                        continue; // lost, as far as the client can tell
                    }
                    response.set_status(Status::NoSession);
                }
                // The client's CLOSE on its way out.
                Some(netdam_isa::Opcode::Close) => response.commit(instruction.opcode, Status::Ok, 0),
                other => panic!("unexpected {other:?}"),
            }
            let len = response.finish(64, 0, 0);
            fake.send_to(&out[..len], from).unwrap();
        }
        fetch_adds
    });
    let mut options = netdam_initiator::ClientOptions::default();
    // The lost first transmission is resent after 200 ms, and a third would follow 400 ms later:
    // long enough, even on a loaded machine, for the no_session answer to the second to arrive
    // first (the timeout learned from HELLO's microsecond round trip would not be).
    options.session.initial_rto = netdam_isa::Duration::from_millis(200);
    options.session.min_rto = netdam_isa::Duration::from_millis(200);
    let mut client = Client::connect_with(addr, options).unwrap();
    assert!(matches!(client.call(&[Op::fetch_add(0, 0, 1)]), Err(ClientError::SessionLost)));
    drop(client);
    assert_eq!(server.join().unwrap(), 2, "sent twice, and never again after the new HELLO");
}

#[test]
fn writes_to_a_persistent_region_are_persisted_together_before_any_is_answered() {
    let test = start(vec![region("disk", 1 << 20, true)], 1, 9000);
    let mut client = Client::connect(test.target.local_addr()).unwrap();
    let stat = |client: &mut Client, name: &str| {
        client.stat().unwrap().into_iter().find(|(entry, _)| entry == name).map_or(0, |(_, value)| value)
    };
    let chunk = |i: u64| vec![(i as u8).wrapping_mul(37).wrapping_add(11); 4000];
    // Pipelined: the window keeps many writes in flight, so one receive pass takes several.
    let tickets: Vec<_> = (0..64u64).map(|i| client.submit(&[Op::write(0, i * 4000, &chunk(i))]).unwrap()).collect();
    for ticket in tickets {
        client.wait(ticket).unwrap().data(0).unwrap();
    }
    let held = stat(&mut client, "answers_held");
    let commits = stat(&mut client, "group_commits");
    // Every write's answer waited for a persist; how many shared one depends on how they
    // arrived, so it is printed, not asserted.
    // At least 64: a retransmission answered from the replay window while writes of its pass
    // wait is held too.
    assert!(held >= 64, "every answer to a persistent write waits for its pass's persist: {held} held");
    assert!((1..=held).contains(&commits), "{commits} group commits for {held} held answers");
    println!("64 writes persisted in {commits} group commits");
    assert_eq!(stat(&mut client, "group_commit_failures"), 0);
    drop(client);
    // What was answered is in the file: a new target on the same data directory reads it.
    let common::TestTarget { target, dir } = test;
    target.stop();
    let again = common::start_configured(vec![region("disk", 1 << 20, true)], |config| {
        config.data_dir = Some(dir.path().to_path_buf());
    });
    let mut client = Client::connect(again.target.local_addr()).unwrap();
    let mut back = vec![0u8; 64 * 4000];
    client.read(0, 0, &mut back).unwrap();
    for (i, piece) in back.chunks_exact(4000).enumerate() {
        assert_eq!(piece, chunk(i as u64).as_slice(), "write {i} survived the restart");
    }
}

#[test]
fn writes_to_a_volatile_region_are_not_held() {
    let test = start(vec![region("mem", 1 << 20, false)], 1, 9000);
    let mut client = Client::connect(test.target.local_addr()).unwrap();
    let tickets: Vec<_> =
        (0..32u64).map(|i| client.submit(&[Op::write(0, i * 8, &i.to_le_bytes())]).unwrap()).collect();
    for ticket in tickets {
        client.wait(ticket).unwrap().data(0).unwrap();
    }
    let stats = client.stat().unwrap();
    let value = |name: &str| stats.iter().find(|(entry, _)| entry == name).map_or(u64::MAX, |(_, value)| *value);
    assert_eq!(value("answers_held"), 0);
    assert_eq!(value("group_commits"), 0);
}

/// A second target on a data directory another serves is refused before it opens anything
/// there (two would write the same regions and reserve the same nonces of the same keys), with
/// an error naming the directory and the holder; once the first stops, the directory is free.
#[test]
fn a_second_target_on_a_served_data_directory_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = common::test_config(dir.path(), vec![region("shared", 4096, true)]);
    let first = netdam_target::Target::start(&config).expect("the first target starts");
    let error = netdam_target::Target::start(&config).expect_err("a second target on the same directory");
    let message = error.to_string();
    assert!(
        matches!(error, netdam_target::server::StartError::DataDirInUse { pid: Some(pid), .. } if pid == std::process::id()),
        "{message}"
    );
    assert!(message.contains(&dir.path().display().to_string()) && message.contains("--data-dir"), "{message}");
    first.stop();
    let again = netdam_target::Target::start(&config).expect("the directory is free once the first target stopped");
    again.stop();
}
