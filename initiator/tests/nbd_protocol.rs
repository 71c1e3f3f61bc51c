//! The NBD export against hand-written clients over raw sockets: misbehaving clients (cut-off
//! handshakes, huge options, requests past the end, unaligned or forbidden requests, bad magic,
//! clients that vanish with requests in flight), every reply style, pipelining, and shutdown.

mod nbd_support;

use std::collections::BTreeSet;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use nbd_support::{cookies, pattern, Calls, MemDisk, RawClient, Reply, TestServer};
use netdam_initiator::nbd::codec::{
    OptionHeader, ReplyStyle, CMD_BLOCK_STATUS, CMD_CACHE, CMD_DISC, CMD_FLAG_FAST_ZERO, CMD_FLAG_FUA,
    CMD_FLAG_NO_HOLE, CMD_FLAG_PAYLOAD_LEN, CMD_FLAG_REQ_ONE, CMD_FLUSH, CMD_READ, CMD_TRIM, CMD_WRITE,
    CMD_WRITE_ZEROES, FLAG_C_FIXED_NEWSTYLE, FLAG_C_NO_ZEROES, FLAG_FIXED_NEWSTYLE, FLAG_NO_ZEROES, FLAG_READ_ONLY,
    FLAG_SEND_DF, FLAG_SEND_FAST_ZERO, OPT_ABORT, OPT_EXPORT_NAME, OPT_LIST, REP_ACK, REP_ERR_TOO_BIG, REP_ERR_UNKNOWN,
    REP_SERVER, STATE_HOLE, STATE_ZERO,
};
use netdam_initiator::nbd::ExportOptions;

const EPERM: u32 = 1;
const EIO: u32 = 5;
const EINVAL: u32 = 22;
const ENOSPC: u32 = 28;
const EOVERFLOW: u32 = 75;
const ENOTSUP: u32 = 95;

const STYLES: [ReplyStyle; 3] = [ReplyStyle::Simple, ReplyStyle::Structured, ReplyStyle::Extended];

fn disk(size: usize, block: u32) -> Arc<MemDisk> {
    Arc::new(MemDisk::new(size, block))
}

/// One request and its reply.
fn call(client: &mut RawClient, command: u16, flags: u16, offset: u64, length: u64, payload: &[u8]) -> Reply {
    client.request(command, flags, 42, offset, length, payload);
    let read_len = if command == CMD_READ { length as usize } else { 0 };
    let reply = client.reply(read_len);
    assert_eq!(reply.cookie, 42);
    reply
}

#[test]
fn every_reply_style_reads_writes_flushes_trims_and_zeroes() {
    for (n, style) in STYLES.into_iter().enumerate() {
        let disk = disk(1 << 20, 512);
        let server = if n % 2 == 0 {
            TestServer::unix(disk.clone(), ExportOptions::default())
        } else {
            TestServer::tcp(disk.clone(), ExportOptions::default())
        };
        let (mut client, size, flags) = RawClient::negotiated(&server.endpoint, style);
        assert_eq!(size, 1 << 20);
        assert_eq!(flags & FLAG_SEND_DF != 0, style != ReplyStyle::Simple, "{style:?}");
        let data = pattern(n as u64 + 1, 8192);
        let write_flags =
            if style == ReplyStyle::Extended { CMD_FLAG_PAYLOAD_LEN | CMD_FLAG_FUA } else { CMD_FLAG_FUA };
        assert_eq!(call(&mut client, CMD_WRITE, write_flags, 4096, 8192, &data).error, 0);
        assert_eq!(call(&mut client, CMD_READ, 0, 4096, 8192, &[]).data, data, "{style:?}");
        assert_eq!(call(&mut client, CMD_FLUSH, 0, 0, 0, &[]).error, 0);
        assert_eq!(call(&mut client, CMD_TRIM, 0, 4096, 512, &[]).error, 0);
        assert_eq!(call(&mut client, CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 4608, 512, &[]).error, 0);
        let reply = call(&mut client, CMD_READ, 0, 4096, 1024, &[]);
        assert!(reply.data.iter().all(|&b| b == 0), "trimmed and zeroed");
        // An empty read is answered, with no data.
        let reply = call(&mut client, CMD_READ, 0, 0, 0, &[]);
        assert_eq!((reply.error, reply.data.len()), (0, 0));
        client.request(CMD_DISC, 0, 1, 0, 0, &[]);
        assert!(client.is_closed(), "DISC closes the connection");
        let snapshot = disk.snapshot();
        assert_eq!(snapshot[5120..12288], data[1024..]);
        assert_eq!(Calls::get(&disk.calls.fua_writes), 1);
        assert_eq!(Calls::get(&disk.calls.flushes), 1);
        assert_eq!(Calls::get(&disk.calls.trims), 1);
        assert_eq!(Calls::get(&disk.calls.write_zeroes), 1);
        let report = server.stop();
        assert_eq!(report.connection_errors, 0, "{report:#?}");
        assert_eq!(report.requests, 7);
    }
}

#[test]
fn a_handshake_cut_off_halfway_is_closed_without_holding_up_others() {
    let disk = disk(1 << 20, 512);
    let options = ExportOptions { handshake_timeout: Duration::from_millis(300), ..ExportOptions::default() };
    let server = TestServer::unix(disk.clone(), options);

    // A stalls halfway through its flags.
    let mut stalled = RawClient::connect(&server.endpoint);
    stalled.greeting();
    stalled.send(&[0, 0]);
    // B hangs up halfway through an option header.
    let mut cut = RawClient::connect(&server.endpoint);
    cut.greeting();
    cut.send(&(FLAG_C_FIXED_NEWSTYLE).to_be_bytes());
    cut.send(b"IHAVE");
    drop(cut);
    // C is served meanwhile.
    let (mut client, _, _) = RawClient::negotiated(&server.endpoint, ReplyStyle::Structured);
    assert_eq!(call(&mut client, CMD_WRITE, 0, 0, 512, &[7; 512]).error, 0);
    assert_eq!(call(&mut client, CMD_READ, 0, 0, 512, &[]).data, vec![7; 512]);

    // Within the raw client's 5 s read timeout, so by the server's 300 ms handshake timeout.
    assert!(stalled.is_closed(), "the stalled client is disconnected");
    client.request(CMD_DISC, 0, 1, 0, 0, &[]);
    assert!(client.is_closed());

    let report = server.stop();
    assert_eq!(report.connections, 3);
    assert_eq!(report.transmissions, 1);
    assert_eq!(report.connection_errors, 2, "{report:#?}");
    assert!(report.recent_errors.iter().any(|e| e.contains("not finished within")), "{report:#?}");
    assert!(report.recent_errors.iter().any(|e| e.contains("closed the connection")), "{report:#?}");
}

#[test]
fn a_huge_option_length_is_refused_and_disconnected() {
    let server = TestServer::unix(disk(1 << 20, 512), ExportOptions::default());

    let mut client = RawClient::connect(&server.endpoint);
    client.greeting();
    client.send(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes());
    // A header claiming 4 GiB of option data, and none of it sent.
    let mut header = Vec::new();
    OptionHeader { option: OPT_LIST, length: u32::MAX }.encode(&mut header);
    client.send(&header);
    let (option, kind, message) = client.option_reply();
    assert_eq!((option, kind), (OPT_LIST, REP_ERR_TOO_BIG));
    assert!(String::from_utf8_lossy(&message).contains("4294967295"));
    assert!(client.is_closed());

    // EXPORT_NAME cannot be answered with an error: just closed.
    let mut client = RawClient::connect(&server.endpoint);
    client.greeting();
    client.send(&(FLAG_C_FIXED_NEWSTYLE).to_be_bytes());
    let mut header = Vec::new();
    OptionHeader { option: OPT_EXPORT_NAME, length: 1 << 30 }.encode(&mut header);
    client.send(&header);
    assert!(client.is_closed());

    // The server still serves.
    let (mut client, _, _) = RawClient::negotiated(&server.endpoint, ReplyStyle::Simple);
    assert_eq!(call(&mut client, CMD_READ, 0, 0, 512, &[]).error, 0);
    drop(client);
    let report = server.stop();
    assert_eq!(report.connection_errors, 2, "{report:#?}");
    assert!(report.recent_errors.iter().any(|e| e.contains("exceeds the limit")), "{report:#?}");
}

#[test]
fn requests_past_the_end_are_refused_and_change_nothing() {
    for style in STYLES {
        let disk = disk(1 << 20, 512);
        disk.fill(0x55);
        let server = TestServer::unix(disk.clone(), ExportOptions::default());
        let (mut client, size, _) = RawClient::negotiated(&server.endpoint, style);
        let reply = call(&mut client, CMD_READ, 0, size, 512, &[]);
        assert_eq!(reply.error, EINVAL, "{style:?}");
        assert!(reply.data.is_empty());
        if style != ReplyStyle::Simple {
            assert!(reply.message.contains("past the end"), "{reply:?}");
        }
        let reply = call(&mut client, CMD_WRITE, 0, size - 512, 1024, &[0xaa; 1024]);
        assert_eq!(reply.error, ENOSPC, "the spec asks for ENOSPC on writes past the end");
        assert_eq!(call(&mut client, CMD_TRIM, 0, size - 512, 1024, &[]).error, EINVAL);
        assert_eq!(call(&mut client, CMD_WRITE_ZEROES, 0, size, 512, &[]).error, ENOSPC);
        // An offset near 2^64 must not wrap around.
        assert_eq!(call(&mut client, CMD_READ, 0, u64::MAX - 511, 1024, &[]).error, EINVAL);
        // The stream is still in step: the refused write's payload was consumed.
        assert_eq!(call(&mut client, CMD_READ, 0, size - 512, 512, &[]).data, vec![0x55; 512]);
        assert!(disk.snapshot().iter().all(|&b| b == 0x55), "nothing changed");
        drop(client);
        let report = server.stop();
        assert_eq!(report.request_errors, 5);
        assert_eq!(report.connection_errors, 0, "{report:#?}");
    }
}

#[test]
fn unaligned_requests_are_invalid() {
    let disk = disk(1 << 20, 4096);
    disk.fill(0x33);
    let server = TestServer::tcp(disk.clone(), ExportOptions::default());
    let (mut client, _, _) = RawClient::negotiated(&server.endpoint, ReplyStyle::Structured);
    let reply = call(&mut client, CMD_READ, 0, 512, 4096, &[]);
    assert_eq!(reply.error, EINVAL);
    assert!(reply.message.contains("4096-byte minimum block size"), "{reply:?}");
    assert_eq!(call(&mut client, CMD_READ, 0, 0, 1000, &[]).error, EINVAL);
    assert_eq!(call(&mut client, CMD_WRITE, 0, 100, 4096, &[1; 4096]).error, EINVAL);
    assert_eq!(call(&mut client, CMD_WRITE, 0, 0, 512, &[1; 512]).error, EINVAL);
    assert_eq!(call(&mut client, CMD_TRIM, 0, 4096, 100, &[]).error, EINVAL);
    assert_eq!(call(&mut client, CMD_WRITE_ZEROES, 0, 2048, 4096, &[]).error, EINVAL);
    assert_eq!(call(&mut client, CMD_READ, 0, 0, 4096, &[]).data, vec![0x33; 4096], "still in step");
    assert!(disk.snapshot().iter().all(|&b| b == 0x33));
    assert_eq!(Calls::get(&disk.calls.bad_calls), 0, "nothing unaligned reached the backend");
    drop(client);
    server.stop();
}

#[test]
fn writes_to_a_read_only_export_are_not_permitted() {
    let disk = disk(1 << 20, 512);
    disk.fill(0x44);
    let server = TestServer::unix(disk.clone(), ExportOptions { read_only: true, ..ExportOptions::default() });
    for style in STYLES {
        let (mut client, _, flags) = RawClient::negotiated(&server.endpoint, style);
        assert_ne!(flags & FLAG_READ_ONLY, 0);
        assert_eq!(flags & FLAG_SEND_FAST_ZERO, 0);
        let reply = call(&mut client, CMD_WRITE, 0, 0, 512, &[0; 512]);
        assert_eq!(reply.error, EPERM, "{style:?}");
        assert_eq!(call(&mut client, CMD_TRIM, 0, 0, 512, &[]).error, EPERM);
        assert_eq!(call(&mut client, CMD_WRITE_ZEROES, 0, 0, 512, &[]).error, EPERM);
        assert_eq!(call(&mut client, CMD_READ, 0, 0, 512, &[]).data, vec![0x44; 512]);
        assert_eq!(call(&mut client, CMD_FLUSH, 0, 0, 0, &[]).error, 0);
    }
    assert!(disk.snapshot().iter().all(|&b| b == 0x44), "nothing changed");
    assert_eq!(Calls::get(&disk.calls.writes) + Calls::get(&disk.calls.trims), 0);
    let report = server.stop();
    assert_eq!(report.request_errors, 9);
}

/// With a backend that tracks allocation: `base:allocation` is selected, and block status
/// follows writes, trims and write-zeroes in both chunked styles, with REQ_ONE, short answers
/// and refusals; without a selection, or with a backend that cannot tell, there is no context.
#[test]
fn block_status_reports_allocation_through_the_selected_context() {
    const HOLE: u32 = STATE_HOLE | STATE_ZERO;
    for style in [ReplyStyle::Structured, ReplyStyle::Extended] {
        let disk = Arc::new(MemDisk::new(1 << 20, 4096).with_allocation(3));
        let server = TestServer::unix(disk.clone(), ExportOptions::default());
        let ((mut client, size, _), selected) =
            RawClient::negotiated_with_contexts(&server.endpoint, style, &["base:allocation"]);
        assert_eq!(selected.len(), 1, "{style:?}");
        let (context, name) = selected[0].clone();
        assert_eq!(name, "base:allocation");
        let status = |client: &mut RawClient, flags: u16, offset: u64, length: u64| {
            let reply = call(client, CMD_BLOCK_STATUS, flags, offset, length, &[]);
            assert_eq!(reply.error, 0, "{reply:?}");
            let (id, extents) = reply.status.expect("a block status chunk");
            assert_eq!(id, context, "the selected context's id");
            extents
        };
        assert_eq!(status(&mut client, 0, 0, size), [(size, HOLE)], "{style:?}: a new disk is one hole");

        let write_flags = if style == ReplyStyle::Extended { CMD_FLAG_PAYLOAD_LEN } else { 0 };
        assert_eq!(call(&mut client, CMD_WRITE, write_flags, 8192, 8192, &pattern(1, 8192)).error, 0);
        assert_eq!(call(&mut client, CMD_WRITE, write_flags, 65536, 4096, &pattern(2, 4096)).error, 0);
        assert_eq!(call(&mut client, CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 16384, 4096, &[]).error, 0);
        assert_eq!(call(&mut client, CMD_TRIM, 0, 12288, 4096, &[]).error, 0);
        // Blocks 0-1 hole, 2 data, 3 trimmed, 4 zeroed, 5-15 hole, 16 data, then hole; the
        // backend answers at most three extents, so the answer is short: ask again.
        let first = status(&mut client, 0, 0, size);
        assert_eq!(first, [(8192, HOLE), (4096, 0), (4096, HOLE)]);
        let second = status(&mut client, 0, 16384, size - 16384);
        assert_eq!(second, [(4096, STATE_ZERO), (45056, HOLE), (4096, 0)]);
        assert_eq!(status(&mut client, CMD_FLAG_REQ_ONE, 0, size), [(8192, HOLE)], "REQ_ONE: one extent");
        assert_eq!(status(&mut client, CMD_FLAG_REQ_ONE, 8192, 4096), [(4096, 0)]);
        assert_eq!(status(&mut client, 0, 8192, 6000), [(4096, 0)], "an unaligned length is a hint");
        // Refusals keep the stream in step.
        assert_eq!(call(&mut client, CMD_BLOCK_STATUS, 0, size - 4096, 8192, &[]).error, EINVAL, "past the end");
        assert_eq!(call(&mut client, CMD_BLOCK_STATUS, 0, 100, 4096, &[]).error, EINVAL, "unaligned offset");
        assert_eq!(call(&mut client, CMD_BLOCK_STATUS, 0, 0, 0, &[]).error, EINVAL, "nothing asked");
        assert_eq!(call(&mut client, CMD_BLOCK_STATUS, CMD_FLAG_NO_HOLE, 0, 4096, &[]).error, EINVAL);
        assert_eq!(call(&mut client, CMD_READ, 0, 8192, 4096, &[]).data, pattern(1, 8192)[..4096], "in step");
        assert_eq!(Calls::get(&disk.calls.bad_calls), 0);
        drop(client);

        // Another client that selects nothing gets EINVAL for block status.
        let ((mut other, _, _), selected) = RawClient::negotiated_with_contexts(&server.endpoint, style, &["base:"]);
        assert!(selected.is_empty(), "base: is a wildcard for listing only");
        assert_eq!(call(&mut other, CMD_BLOCK_STATUS, 0, 0, 4096, &[]).error, EINVAL);
        drop(other);
        let report = server.stop();
        assert_eq!(report.connection_errors, 0, "{report:#?}");
    }

    // A backend that cannot tell offers nothing to select.
    let server = TestServer::unix(disk(1 << 20, 512), ExportOptions::default());
    let ((mut client, _, _), selected) =
        RawClient::negotiated_with_contexts(&server.endpoint, ReplyStyle::Structured, &["base:allocation"]);
    assert!(selected.is_empty());
    assert_eq!(call(&mut client, CMD_BLOCK_STATUS, 0, 0, 512, &[]).error, EINVAL);
    drop(client);
    server.stop();
}

#[test]
fn unsupported_commands_and_flags_are_invalid() {
    let options = ExportOptions { max_payload_bytes: 64 * 1024, ..ExportOptions::default() };
    let server = TestServer::unix(disk(1 << 20, 512), options);
    let (mut client, _, _) = RawClient::negotiated(&server.endpoint, ReplyStyle::Structured);
    assert_eq!(call(&mut client, CMD_BLOCK_STATUS, 0, 0, 512, &[]).error, EINVAL, "no meta context was offered");
    assert_eq!(call(&mut client, CMD_CACHE, 0, 0, 512, &[]).error, EINVAL);
    assert_eq!(call(&mut client, 99, 0, 0, 512, &[]).error, EINVAL);
    assert_eq!(call(&mut client, CMD_WRITE, CMD_FLAG_NO_HOLE, 0, 512, &[0; 512]).error, EINVAL);
    let reply = call(&mut client, CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO | CMD_FLAG_NO_HOLE, 0, 512, &[]);
    assert_eq!(reply.error, ENOTSUP, "fast zeroing without holes is not promised");
    assert_eq!(call(&mut client, CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 0, 512, &[]).error, 0, "trim is fast");
    // Oversize reads: EOVERFLOW with chunked replies, so the client retries smaller.
    assert_eq!(call(&mut client, CMD_READ, 0, 0, 128 * 1024, &[]).error, EOVERFLOW);
    // Oversize writes: EINVAL, their payload skipped.
    assert_eq!(call(&mut client, CMD_WRITE, 0, 0, 128 * 1024, &[0; 128 * 1024]).error, EINVAL);
    assert_eq!(call(&mut client, CMD_READ, 0, 0, 512, &[]).error, 0, "still in step");
    drop(client);
    server.stop();
}

#[test]
fn zeroing_never_relies_on_a_trim_that_keeps_data() {
    let disk = Arc::new(MemDisk::new(1 << 20, 512).with_trim_keeping_data());
    disk.fill(0x21);
    let server = TestServer::unix(disk.clone(), ExportOptions::default());
    let (mut client, _, _) = RawClient::negotiated(&server.endpoint, ReplyStyle::Structured);
    assert_eq!(call(&mut client, CMD_WRITE_ZEROES, 0, 0, 4096, &[]).error, 0);
    assert_eq!(call(&mut client, CMD_READ, 0, 0, 4096, &[]).data, vec![0; 4096]);
    assert_eq!(Calls::get(&disk.calls.trims), 0, "zeroed by write-zeroes, not trim");
    let reply = call(&mut client, CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 4096, 4096, &[]);
    assert_eq!(reply.error, ENOTSUP, "nothing fast to offer");
    assert_eq!(disk.snapshot()[4096..8192], [0x21; 4096], "a refused fast zero changes nothing");
    drop(client);
    server.stop();
}

#[test]
fn extended_headers_carry_64_bit_lengths() {
    let disk = disk(4 << 20, 512);
    disk.fill(0x99);
    let server = TestServer::unix(disk.clone(), ExportOptions { max_payload_bytes: 1 << 20, ..Default::default() });
    let (mut client, size, _) = RawClient::negotiated(&server.endpoint, ReplyStyle::Extended);
    // An effect length beyond the maximum payload is fine for commands without payload.
    assert_eq!(call(&mut client, CMD_WRITE_ZEROES, 0, 0, size, &[]).error, 0);
    assert!(disk.snapshot().iter().all(|&b| b == 0));
    // A 64-bit length past the end.
    assert_eq!(call(&mut client, CMD_TRIM, 0, 0, 1 << 40, &[]).error, EINVAL);
    // A payload on a command that takes none is skipped and refused.
    assert_eq!(call(&mut client, CMD_TRIM, CMD_FLAG_PAYLOAD_LEN, 0, 16, &[1; 16]).error, EINVAL);
    assert_eq!(call(&mut client, CMD_WRITE, CMD_FLAG_PAYLOAD_LEN, 512, 512, &[3; 512]).error, 0);
    assert_eq!(call(&mut client, CMD_READ, 0, 512, 512, &[]).data, vec![3; 512]);
    // A payload claim too large to skip ends the connection.
    client.request(CMD_WRITE, CMD_FLAG_PAYLOAD_LEN, 7, 0, 1 << 40, &[]);
    assert!(client.is_closed());
    let report = server.stop();
    assert_eq!(report.connection_errors, 1);
    assert!(report.recent_errors[0].contains("over the limit"), "{report:#?}");
}

#[test]
fn backend_errors_reach_the_client_and_the_connection_goes_on() {
    let disk = Arc::new(MemDisk::new(1 << 20, 512).with_failing_read_at(8192));
    let server = TestServer::unix(disk, ExportOptions::default());
    for style in STYLES {
        let (mut client, _, _) = RawClient::negotiated(&server.endpoint, style);
        let reply = call(&mut client, CMD_READ, 0, 4096, 8192, &[]);
        assert_eq!(reply.error, EIO, "{style:?}");
        assert!(reply.data.is_empty(), "no data after an error");
        if style != ReplyStyle::Simple {
            assert!(reply.message.contains("medium error"), "{reply:?}");
        }
        assert_eq!(call(&mut client, CMD_READ, 0, 0, 4096, &[]).error, 0);
    }
    server.stop();
}

#[test]
fn a_panicking_backend_call_is_answered_with_eio() {
    let disk = Arc::new(MemDisk::new(1 << 20, 512).with_panicking_read_at(4096));
    let server = TestServer::unix(disk, ExportOptions::default());
    let (mut client, _, _) = RawClient::negotiated(&server.endpoint, ReplyStyle::Structured);
    let reply = call(&mut client, CMD_READ, 0, 4096, 512, &[]);
    assert_eq!(reply.error, EIO);
    assert!(reply.message.contains("panicked"), "{reply:?}");
    assert_eq!(call(&mut client, CMD_READ, 0, 0, 512, &[]).error, 0, "the connection goes on");
    drop(client);
    let report = server.stop();
    assert_eq!(report.backend_panics, 1, "{report:#?}");
}

#[test]
fn requests_run_concurrently_and_replies_may_come_out_of_order() {
    let disk = Arc::new(MemDisk::new(1 << 20, 512).with_delay(Duration::from_millis(20)));
    let options = ExportOptions { max_in_flight_per_connection: 8, ..ExportOptions::default() };
    let server = TestServer::unix(disk.clone(), options);
    let (mut client, _, _) = RawClient::negotiated(&server.endpoint, ReplyStyle::Structured);
    // 32 writes then 32 reads, all sent before any reply is read.
    for i in 0..32u64 {
        client.request(CMD_WRITE, 0, i, i * 4096, 4096, &pattern(i, 4096));
    }
    let writes: Vec<Reply> = (0..32).map(|_| client.reply(0)).collect();
    assert_eq!(cookies(&writes), (0..32).collect::<BTreeSet<_>>());
    assert!(writes.iter().all(|reply| reply.error == 0));
    let most = disk.calls.most_running.load(std::sync::atomic::Ordering::SeqCst);
    assert!((2..=8).contains(&most), "requests ran concurrently, within the bound: {most}");
    for i in 0..32u64 {
        client.request(CMD_READ, 0, 100 + i, i * 4096, 4096, &[]);
    }
    for _ in 0..32 {
        let reply = client.reply(0);
        let i = reply.cookie - 100;
        assert_eq!(reply.data, pattern(i, 4096), "read {i}");
    }
    drop(client);
    server.stop();
}

#[test]
fn a_client_that_vanishes_with_requests_in_flight_does_not_disturb_others() {
    let disk = Arc::new(MemDisk::new(1 << 20, 512).with_delay(Duration::from_millis(100)));
    let server = TestServer::unix(disk.clone(), ExportOptions::default());
    let (mut gone, _, _) = RawClient::negotiated(&server.endpoint, ReplyStyle::Simple);
    for i in 0..8u64 {
        gone.request(CMD_WRITE, 0, i, i * 512, 512, &[0xee; 512]);
    }
    // Give the server a moment to read them, then vanish without reading a reply.
    std::thread::sleep(Duration::from_millis(30));
    drop(gone);
    let (mut client, _, _) = RawClient::negotiated(&server.endpoint, ReplyStyle::Simple);
    assert_eq!(call(&mut client, CMD_WRITE, 0, 8192, 512, &[1; 512]).error, 0);
    assert_eq!(call(&mut client, CMD_READ, 0, 8192, 512, &[]).data, vec![1; 512]);
    client.request(CMD_DISC, 0, 1, 0, 0, &[]);
    assert!(client.is_closed());
    let report = server.stop();
    assert_eq!(report.connections, 2);
    // The writes that were read ran to completion even though nobody waited for them.
    assert!(disk.snapshot()[..4096].iter().all(|&b| b == 0xee), "{report:#?}");
    assert!(report.connection_errors <= 1, "at most the vanished client's write error: {report:#?}");
}

/// With every slot taken a client waits, unanswered, in the backlog (and the report counts the
/// limit as reached); when a client leaves, the waiting one gets its greeting and is served.
#[test]
fn a_client_beyond_max_connections_waits_for_a_free_slot() {
    let disk = disk(1 << 20, 512);
    let server = TestServer::unix(disk.clone(), ExportOptions { max_connections: 1, ..ExportOptions::default() });
    let (mut first, _, _) = RawClient::negotiated(&server.endpoint, ReplyStyle::Simple);
    assert_eq!(call(&mut first, CMD_WRITE, 0, 0, 512, &[7; 512]).error, 0);
    let mut waiting = RawClient::connect(&server.endpoint);
    assert!(waiting.nothing_within(Duration::from_millis(300)), "no greeting while the only slot is taken");
    first.request(CMD_DISC, 0, 1, 0, 0, &[]);
    assert!(first.is_closed());
    waiting.greeting();
    waiting.send(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes());
    waiting.go(b"", &[]).expect("GO succeeds once the slot is free");
    assert_eq!(call(&mut waiting, CMD_READ, 0, 0, 512, &[]).data, vec![7; 512]);
    drop(waiting);
    let report = server.stop();
    assert_eq!(report.connections, 2);
    assert_eq!(report.connection_limit_reached, 2, "each client took the only slot: {report:#?}");
}

#[test]
fn shutdown_lets_in_flight_requests_finish_and_reply() {
    let disk = Arc::new(MemDisk::new(1 << 20, 512).with_delay(Duration::from_millis(300)));
    let server = TestServer::tcp(disk.clone(), ExportOptions::default());
    let (mut client, _, _) = RawClient::negotiated(&server.endpoint, ReplyStyle::Extended);
    client.request(CMD_WRITE, CMD_FLAG_PAYLOAD_LEN, 5, 0, 512, &[9; 512]);
    client.request(CMD_READ, 0, 6, 512, 512, &[]);
    std::thread::sleep(Duration::from_millis(50));
    let stopping = std::thread::spawn(move || server.stop());
    let replies: Vec<Reply> = (0..2).map(|_| client.reply(0)).collect();
    assert_eq!(cookies(&replies), BTreeSet::from([5, 6]));
    assert!(replies.iter().all(|reply| reply.error == 0));
    assert!(client.is_closed(), "closed after the drain");
    let report = stopping.join().unwrap();
    assert_eq!(report.requests, 2);
    assert_eq!(report.connection_errors, 0, "{report:#?}");
    assert_eq!(report.connections_cut_at_drain, 0);
    assert_eq!(disk.snapshot()[..512], [9; 512]);
}

#[test]
fn requests_sent_while_the_server_stops_are_answered_eshutdown_and_not_executed() {
    let disk = Arc::new(MemDisk::new(1 << 20, 512).with_delay(Duration::from_millis(300)));
    let server = TestServer::unix(disk.clone(), ExportOptions::default());
    let (mut client, _, _) = RawClient::negotiated(&server.endpoint, ReplyStyle::Structured);
    client.request(CMD_WRITE, 0, 1, 0, 512, &[9; 512]);
    std::thread::sleep(Duration::from_millis(50));
    let stopping = std::thread::spawn(move || server.stop());
    // The write above is still in the backend; these arrive after the stop.
    std::thread::sleep(Duration::from_millis(50));
    client.request(CMD_WRITE, CMD_FLAG_FUA, 2, 4096, 512, &[7; 512]);
    client.request(CMD_READ, 0, 3, 0, 512, &[]);
    client.request(CMD_FLUSH, 0, 5, 0, 0, &[]);
    let replies: Vec<Reply> = (0..4).map(|_| client.reply(0)).collect();
    let by_cookie = |cookie| replies.iter().find(|reply| reply.cookie == cookie).expect("every request answered");
    assert_eq!(by_cookie(1).error, 0, "the write read before the stop is served");
    assert_eq!(by_cookie(5).error, 0, "a FLUSH still runs: it makes acknowledged writes durable");
    for cookie in [2, 3] {
        let reply = by_cookie(cookie);
        assert_eq!(reply.error, 108, "NBD_ESHUTDOWN for request {cookie}: {reply:?}");
        assert!(reply.message.contains("shutting down"), "{reply:?}");
    }
    // The spec's answer to ESHUTDOWN is a soft disconnect; the server does not wait for it:
    // with nothing in flight and SHUTDOWN_QUIET past since the stop, it closes.
    assert!(client.is_closed());
    let report = stopping.join().unwrap();
    assert_eq!(report.refused_at_shutdown, 2, "{report:#?}");
    assert_eq!(report.connection_errors, 0, "{report:#?}");
    assert_eq!(report.connections_cut_at_drain, 0, "{report:#?}");
    let snapshot = disk.snapshot();
    assert_eq!(snapshot[..512], [9; 512]);
    assert!(snapshot[4096..4608].iter().all(|&b| b == 0), "the refused write wrote nothing");
}

#[test]
fn a_quiet_client_is_closed_at_shutdown_without_waiting_for_the_drain_timeout() {
    let options = ExportOptions { drain_timeout: Duration::from_secs(60), ..ExportOptions::default() };
    let server = TestServer::tcp(disk(1 << 20, 512), options);
    let (mut client, _, _) = RawClient::negotiated(&server.endpoint, ReplyStyle::Simple);
    assert_eq!(call(&mut client, CMD_WRITE, 0, 0, 512, &[1; 512]).error, 0);
    let report = server.stop();
    assert!(client.is_closed());
    assert_eq!(report.connections_cut_at_drain, 0, "closed once quiet, not cut: {report:#?}");
    assert_eq!(report.refused_at_shutdown, 0, "{report:#?}");
    assert_eq!(report.connection_errors, 0, "{report:#?}");
}

#[test]
fn the_drain_timeout_cuts_connections_that_do_not_finish() {
    let disk = Arc::new(MemDisk::new(1 << 20, 512).with_delay(Duration::from_secs(30)));
    let options = ExportOptions { drain_timeout: Duration::from_millis(200), ..ExportOptions::default() };
    let server = TestServer::unix(disk, options);
    let (mut client, _, _) = RawClient::negotiated(&server.endpoint, ReplyStyle::Simple);
    client.request(CMD_FLUSH, 0, 1, 0, 0, &[]);
    std::thread::sleep(Duration::from_millis(50));
    // The backend call takes 30 s; the drain gives up after 200 ms.
    let report = server.stop();
    assert_eq!(report.connections_cut_at_drain, 1, "{report:#?}");
    assert!(client.is_closed());
}

#[test]
fn bad_request_magic_disconnects() {
    let server = TestServer::unix(disk(1 << 20, 512), ExportOptions::default());
    let (mut client, _, _) = RawClient::negotiated(&server.endpoint, ReplyStyle::Simple);
    client.send(&[0xde, 0xad, 0xbe, 0xef]);
    client.send(&[0; 24]);
    assert!(client.is_closed());
    let report = server.stop();
    assert_eq!(report.connection_errors, 1);
    assert!(report.recent_errors[0].contains("bad request magic 0xdeadbeef"), "{report:#?}");
}

#[test]
fn list_abort_and_export_name() {
    let disk = disk(1 << 20, 512);
    let options = ExportOptions { name: "vol".into(), description: Some("test".into()), ..ExportOptions::default() };
    let server = TestServer::unix(disk, options);

    let mut client = RawClient::connect(&server.endpoint);
    assert_eq!(client.greeting(), FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
    client.send(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes());
    client.option(OPT_LIST, &[]);
    let (_, kind, payload) = client.option_reply();
    assert_eq!(kind, REP_SERVER);
    assert_eq!(&payload[4..], b"voltest");
    assert_eq!(client.option_reply().1, REP_ACK);
    assert_eq!(client.go(b"other", &[]), Err(REP_ERR_UNKNOWN));
    client.option(OPT_ABORT, &[]);
    assert_eq!(client.option_reply().1, REP_ACK);
    assert!(client.is_closed());

    // EXPORT_NAME, with and without the 124 zero bytes.
    for (flags, padding) in [(FLAG_C_FIXED_NEWSTYLE, 124), (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES, 0)] {
        let mut client = RawClient::connect(&server.endpoint);
        client.greeting();
        client.send(&flags.to_be_bytes());
        client.option(OPT_EXPORT_NAME, b"vol");
        let answer = client.receive(10 + padding);
        assert_eq!(answer[..8], (1u64 << 20).to_be_bytes());
        assert!(answer[10..].iter().all(|&b| b == 0));
        assert_eq!(call(&mut client, CMD_READ, 0, 0, 512, &[]).error, 0, "transmission follows at once");
        client.stream.flush().unwrap();
    }
    let report = server.stop();
    assert_eq!(report.connection_errors, 0, "{report:#?}");
    assert_eq!(report.transmissions, 2);
}
