//! Every kind of bad datagram gets its documented answer, or is dropped and counted by reason;
//! the target keeps serving throughout.

mod common;

use std::net::UdpSocket;
use std::time::Duration;

use common::{hello, region, start};
use netdam_isa::wire::{datagram_crc, Instruction, RequestBuilder, Response, HEADER_LEN};
use netdam_isa::{Opcode, Status};
use netdam_target::stats::StatsSnapshot;

const MAX_DATAGRAM: usize = 4096;

struct Probe {
    socket: UdpSocket,
}

impl Probe {
    fn new(addr: std::net::SocketAddr) -> Probe {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        socket.connect(addr).unwrap();
        socket.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        Probe { socket }
    }

    /// Sends `bytes`; returns the answer naming its sequence if one comes within `wait`. Answers
    /// to other datagrams (late ones, on a slow machine) are skipped.
    fn exchange_within(&self, bytes: &[u8], wait: Duration) -> Option<Vec<u8>> {
        let sequence = netdam_isa::wire::peek_session_sequence(bytes).map(|(_, sequence)| sequence);
        self.socket.send(bytes).unwrap();
        let started = std::time::Instant::now();
        let mut buffer = vec![0u8; 65_536];
        while started.elapsed() < wait {
            match self.socket.recv(&mut buffer) {
                Ok(len) => {
                    let answered = Response::parse(&buffer[..len]).ok().map(|response| response.header.sequence);
                    if answered.is_some() && answered == sequence {
                        return Some(buffer[..len].to_vec());
                    }
                }
                Err(error) if matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                }
                Err(error) => panic!("recv: {error}"),
            }
        }
        None
    }

    /// Sends `bytes` and waits up to 2 s for its answer.
    fn exchange(&self, bytes: &[u8]) -> Option<Vec<u8>> {
        self.exchange_within(bytes, Duration::from_secs(2))
    }

    /// Sends `bytes` and checks that nothing answers it within 300 ms.
    fn silent(&self, bytes: &[u8], why: &str) {
        assert_eq!(self.exchange_within(bytes, Duration::from_millis(300)), None, "{why}");
    }
}

fn request(session: u32, sequence: u64, instructions: &[Instruction<'_>]) -> Vec<u8> {
    let mut buffer = vec![0u8; 65_536];
    let mut builder = RequestBuilder::new(&mut buffer, session, sequence).unwrap();
    for instruction in instructions {
        builder.push(instruction).unwrap();
    }
    let len = builder.finish();
    buffer.truncate(len);
    buffer
}

fn read(offset: u64, length: u32) -> Instruction<'static> {
    Instruction { opcode: Opcode::Read as u8, flags: 0, space: 0, offset, length, aux: 0, operand: &[] }
}

fn fix_crc(bytes: &mut [u8]) {
    let crc = datagram_crc(bytes);
    bytes[28..32].copy_from_slice(&crc.to_le_bytes());
}

fn delta(before: &StatsSnapshot, after: &StatsSnapshot, name: &str) -> u64 {
    after.get(name).unwrap() - before.get(name).unwrap()
}

#[test]
fn bad_datagrams_are_answered_or_dropped_by_reason() {
    let test = start(vec![region("mem", 65536, false)], 1, MAX_DATAGRAM);
    let probe = Probe::new(test.target.local_addr());
    let session = hello(&probe.socket);
    let request = |sequence, instructions: &[Instruction<'_>]| request(session, sequence, instructions);
    let good = request(1, &[read(0, 8)]);
    assert!(probe.exchange(&good).is_some(), "a good request is answered");
    let before = test.target.stats();

    // Dropped, each with its reason.
    probe.silent(&good[..HEADER_LEN - 1], "truncated below a header");
    let mut magic = good.clone();
    magic[0] = b'X';
    probe.silent(&magic, "wrong magic");
    // Foreign bytes whose flags byte happens to have the response bit are still foreign.
    magic[3] = 0x01;
    probe.silent(&magic, "wrong magic, response flag set");
    let mut garbled = good.clone();
    garbled[HEADER_LEN + 9] ^= 0x40;
    probe.silent(&garbled, "garbled: CRC mismatch");
    probe.silent(&good[..good.len() - 3], "cut short: CRC mismatch");
    let oversized = request(2, &[Instruction { operand: &[7u8; MAX_DATAGRAM], ..read(0, 0) }]);
    probe.silent(&oversized, "over max_datagram_bytes");
    let mut response_flag = good.clone();
    response_flag[3] = 0x01;
    fix_crc(&mut response_flag);
    probe.silent(&response_flag, "a response is never answered");

    // Answered with a datagram status naming the request.
    let mut version = request(77, &[read(0, 8)]);
    version[2] = 9;
    let answer = probe.exchange(&version).expect("wrong version is answered");
    let response = Response::parse(&answer).unwrap();
    assert_eq!(
        (response.status(), response.header.sequence, response.header.count),
        (Status::UnsupportedVersion, 77, 0)
    );
    assert!(answer.len() <= version.len(), "an error answer is never larger than the request");

    let mut trailing = request(78, &[read(0, 8)]);
    trailing.push(0);
    fix_crc(&mut trailing);
    let response_bytes = probe.exchange(&trailing).expect("trailing bytes are answered");
    assert_eq!(Response::parse(&response_bytes).unwrap().status(), Status::Malformed);

    let mut lying_length = request(79, &[read(0, 8)]);
    lying_length[HEADER_LEN + 4] = 200; // operand length beyond the datagram
    fix_crc(&mut lying_length);
    let response_bytes = probe.exchange(&lying_length).expect("a lying operand length is answered");
    assert_eq!(Response::parse(&response_bytes).unwrap().status(), Status::Malformed);

    let mut reserved = request(80, &[read(0, 8)]);
    reserved[26] = 1;
    fix_crc(&mut reserved);
    let response_bytes = probe.exchange(&reserved).expect("a reserved header byte is answered");
    assert_eq!(Response::parse(&response_bytes).unwrap().status(), Status::Malformed);

    // Per-instruction statuses.
    let eight = [1u8; 8];
    let cases: Vec<(Instruction<'_>, Status)> = vec![
        (Instruction { opcode: 0x7F, ..read(0, 8) }, Status::UnknownOpcode),
        (Instruction { opcode: 0xC0, ..read(0, 8) }, Status::UnknownOpcode),
        (read(65_535, 2), Status::OutOfRange),
        (read(u64::MAX, 1), Status::OutOfRange),
        (Instruction { opcode: Opcode::FetchAdd as u8, operand: &eight, ..read(4, 8) }, Status::Unaligned),
        (Instruction { opcode: Opcode::Cas as u8, operand: &eight, ..read(0, 8) }, Status::Malformed),
        (Instruction { space: 3, ..read(0, 8) }, Status::NoSuchSpace),
        (read(0, 4096), Status::TooLarge),
        (Instruction { opcode: Opcode::Ping as u8, ..read(0, 8) }, Status::Malformed),
        // ENCRYPT is served, but this target holds no key in slot 0.
        (Instruction { opcode: Opcode::Encrypt as u8, ..read(0, 8) }, Status::NoSuchKey),
    ];
    for (index, (instruction, status)) in cases.iter().enumerate() {
        let answer = probe.exchange(&request(100 + index as u64, &[*instruction])).expect("answered");
        let response = Response::parse(&answer).unwrap();
        let result = response.results().next().unwrap();
        assert_eq!(result.status, *status, "{instruction:?}");
    }

    // Still serving.
    let answer = probe.exchange(&request(999, &[read(0, 8)])).expect("still serving");
    assert_eq!(Response::parse(&answer).unwrap().results().next().unwrap().status, Status::Ok);

    let after = test.target.stats();
    assert_eq!(delta(&before, &after, "dropped_too_short"), 1);
    assert_eq!(delta(&before, &after, "dropped_bad_magic"), 2);
    assert_eq!(delta(&before, &after, "dropped_bad_crc"), 2);
    assert_eq!(delta(&before, &after, "dropped_oversized"), 1);
    assert_eq!(delta(&before, &after, "dropped_not_request"), 1);
    assert_eq!(delta(&before, &after, "answered_unsupported_version"), 1);
    assert_eq!(delta(&before, &after, "answered_malformed"), 3);
    assert_eq!(delta(&before, &after, "datagrams_received"), 7 + 4 + cases.len() as u64 + 1);
    let by_status = |status: Status| after.by_status[status as usize].1 - before.by_status[status as usize].1;
    assert_eq!(by_status(Status::UnknownOpcode), 2);
    assert_eq!(by_status(Status::OutOfRange), 2);
    assert_eq!(by_status(Status::Malformed), 2);
}

fn fetch_add(offset: u64, addend: &[u8; 8]) -> Instruction<'_> {
    Instruction { opcode: Opcode::FetchAdd as u8, operand: addend, ..read(offset, 8) }
}

#[test]
fn sessions_make_non_idempotent_requests_execute_at_most_once() {
    let test = start(vec![region("mem", 65536, false)], 1, MAX_DATAGRAM);
    let probe = Probe::new(test.target.local_addr());
    let session = hello(&probe.socket);
    let one = 1u64.to_le_bytes();
    let result = |answer: Vec<u8>| {
        let response = Response::parse(&answer).unwrap();
        assert_eq!(response.status(), Status::Ok);
        let result = response.results().next().unwrap();
        (result.status, result.data.to_vec())
    };

    // The same FETCH_ADD datagram three times: executed once, answered three times alike.
    let add = request(session, 1, &[fetch_add(0, &one)]);
    let first = probe.exchange(&add).unwrap();
    assert_eq!(probe.exchange(&add).unwrap(), first, "the replay is the stored answer, byte for byte");
    assert_eq!(probe.exchange(&add).unwrap(), first);
    assert_eq!(result(first).1, 0u64.to_le_bytes());
    let check = probe.exchange(&request(session, 2, &[read(0, 8)])).unwrap();
    assert_eq!(result(check).1, 1u64.to_le_bytes(), "executed exactly once");

    // An idempotent duplicate is executed again: it reads the current value.
    let add_again = request(session, 3, &[fetch_add(0, &one)]);
    probe.exchange(&add_again).unwrap();
    let reread = probe.exchange(&request(session, 2, &[read(0, 8)])).unwrap();
    assert_eq!(result(reread).1, 2u64.to_le_bytes());

    // Far behind the newest sequence: stale, never executed.
    probe.exchange(&request(session, 1_000, &[read(0, 8)])).unwrap();
    let stale = probe.exchange(&request(session, 500, &[fetch_add(0, &one)])).unwrap();
    assert_eq!(Response::parse(&stale).unwrap().status(), Status::Stale);

    // Unknown sessions, and non-control instructions without a session, are refused.
    let unknown = probe.exchange(&request(session ^ 0x0100_0000, 1, &[read(0, 8)])).unwrap();
    assert_eq!(Response::parse(&unknown).unwrap().status(), Status::NoSession);
    let sessionless = probe.exchange(&request(0, 1, &[fetch_add(0, &one)])).unwrap();
    assert_eq!(Response::parse(&sessionless).unwrap().status(), Status::NoSession);
    let ping = Instruction { opcode: Opcode::Ping as u8, ..read(0, 0) };
    let control = probe.exchange(&request(0, 1, &[ping])).unwrap();
    assert_eq!(Response::parse(&control).unwrap().status(), Status::Ok, "PING needs no session");

    let stats = test.target.stats();
    assert_eq!(stats.get("duplicates_replayed"), Some(2));
    assert_eq!(stats.get("duplicates_executed_again"), Some(1));
    assert_eq!(stats.get("answered_stale"), Some(1));
    assert_eq!(stats.get("answered_no_session"), Some(2));
    let final_value = probe.exchange(&request(session, 1_001, &[read(0, 8)])).unwrap();
    assert_eq!(result(final_value).1, 2u64.to_le_bytes(), "refused requests changed nothing");
}

/// Under tenants, a range past a region's end is `out_of_range` for a tenant whose grant
/// reaches the end (as the default tenant's, over everything, does), however far past it lies
/// and even when its end overflows `u64`; a tenant without a grant over the range is
/// `permission_denied`, in range or not, and learns nothing about the region beyond its grant.
#[test]
fn ranges_past_a_region_are_out_of_range_under_a_grant_to_its_end_and_denied_outside_one() {
    use common::{publish_tenants, tenant_client, tenant_record};
    use netdam_initiator::client::Client;
    use netdam_initiator::Op;
    use netdam_target::tenants::{GrantRecord, GrantSpace};

    const REGION: u64 = 65536;
    let test = common::start_configured(vec![region("mem", REGION, false)], |config| {
        config.auth = netdam_target::config::AuthMode::Tenants
    });
    let tenant = |name: &str, id: u32, space: GrantSpace, range: Option<(u64, u64)>| {
        tenant_record(name, id, vec![GrantRecord { space, permissions: vec!["all".into()], range }])
    };
    let mem = || GrantSpace::Region("mem".into());
    let records = [
        // As the default tenant: everything, everywhere.
        tenant("everything", 1, GrantSpace::All, None),
        tenant("upper half", 2, mem(), Some((REGION / 2, REGION / 2))),
        tenant("lower half", 3, mem(), Some((0, REGION / 2))),
        tenant("elsewhere", 4, GrantSpace::Region("elsewhere".into()), None),
    ];
    let target = &test.target;
    publish_tenants(target, &records);
    let connect = |id: u32| tenant_client(target, id);
    let status =
        |client: &mut Client, op: &Op| client.call(std::slice::from_ref(op)).unwrap().results().unwrap()[0].status;
    // (what, instruction) past the region's end, each also past the lower half's grant.
    let past_the_end = [
        ("READ ending at 2^64", Op::read(0, 0xffff_ffff_ffff_fff0, 16)),
        ("READ whose end overflows", Op::read(0, 0xffff_ffff_ffff_fff8, 16)),
        ("READ far past the end", Op::read(0, 0xffff_ffff_ffff_0000, 16)),
        ("READ straddling the end", Op::read(0, REGION - 8, 16)),
        ("WRITE at the last byte number", Op::write(0, u64::MAX, &[0xAB])),
        ("WRITE whose end overflows", Op::write(0, u64::MAX - 1, b"abc")),
        ("FILL whose end overflows", Op::fill(0, u64::MAX - 7, 64, 0xFF)),
        ("CRC32 whose end overflows", Op::crc32(0, u64::MAX - 7, 64)),
        ("FETCH_ADD ending at 2^64", Op::fetch_add(0, u64::MAX - 7, 1)),
        ("MEMCPY to a destination whose end overflows", Op::memcpy(0, u64::MAX - 7, 0, REGION / 2, 16)),
        ("MEMCPY from a source whose end overflows", Op::memcpy(0, REGION / 2, 0, u64::MAX - 7, 16)),
    ];
    for (id, name, expected) in [
        (1, "everything", Status::OutOfRange),
        (2, "upper half", Status::OutOfRange),
        (3, "lower half", Status::PermissionDenied),
        (4, "elsewhere", Status::PermissionDenied),
    ] {
        let mut client = connect(id);
        for (what, op) in &past_the_end {
            assert_eq!(status(&mut client, op), expected, "{name}: {what}");
        }
    }

    // In range, each gets what its grant says.
    let in_the_upper_half = Op::read(0, REGION - 16, 16);
    let in_the_lower_half = Op::write(0, 0, b"lower");
    let straddling_the_halves = Op::crc32(0, REGION / 2 - 8, 16);
    for (id, name, expected) in [
        (1, "everything", [Status::Ok, Status::Ok, Status::Ok]),
        (2, "upper half", [Status::Ok, Status::PermissionDenied, Status::PermissionDenied]),
        (3, "lower half", [Status::PermissionDenied, Status::Ok, Status::PermissionDenied]),
        (4, "elsewhere", [Status::PermissionDenied; 3]),
    ] {
        let mut client = connect(id);
        let got = [&in_the_upper_half, &in_the_lower_half, &straddling_the_halves].map(|op| status(&mut client, op));
        assert_eq!(got, expected, "{name}");
    }
}
