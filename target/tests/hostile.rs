//! 100,000 random and mutated datagrams against one target: it stays up, answers a ping after
//! every burst, touches no byte outside the ranges the datagrams legitimately address, and STAT
//! accounts for every datagram by reason.

mod common;

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use common::{hello, region, seed, start_configured_in, Rng};
use netdam_initiator::Client;
use netdam_isa::crypto::{CRYPTO_FLAG_TO_DESTINATION, SEAL_LEN};
use netdam_isa::wire::{datagram_crc, Instruction, Request, RequestBuilder, Response, HEADER_LEN};
use netdam_isa::Opcode;
use netdam_target::config::{ByteSize, NamespaceBackend, NamespaceConfig};

const DATAGRAMS: usize = 100_000;
const BURST: usize = 128;
const REGION_BYTES: usize = 1 << 20;
/// Well-formed requests address only this prefix of each region; mutations may aim anywhere.
const SCRATCH_BYTES: u64 = 64 << 10;
const MAX_DATAGRAM: usize = 4096;
const NAMESPACE_BLOCK: u32 = 512;
const NAMESPACE_BLOCKS: u64 = 256;

fn fix_crc(bytes: &mut [u8]) {
    if bytes.len() >= HEADER_LEN {
        let crc = datagram_crc(bytes);
        bytes[28..32].copy_from_slice(&crc.to_le_bytes());
    }
}

/// A well-formed request of one to four instructions, valid or not in its fields.
/// `space`: the region the instructions address, or `None` for any of 0, 1 and the missing 2.
fn well_formed(rng: &mut Rng, session: u32, sequence: u64, space: Option<u16>) -> Vec<u8> {
    const OPCODES: [Opcode; 19] = [
        Opcode::Read,
        Opcode::Write,
        Opcode::Cas,
        Opcode::FetchAdd,
        Opcode::Memcpy,
        Opcode::Fill,
        Opcode::Vadd,
        Opcode::Crc32,
        Opcode::Ping,
        Opcode::Stat,
        Opcode::Hello,
        Opcode::BlockRead,
        Opcode::BlockWrite,
        Opcode::Flush,
        Opcode::Trim,
        Opcode::WriteZeroes,
        Opcode::BlockStatus,
        Opcode::Encrypt,
        Opcode::Decrypt,
    ];
    let mut buffer = vec![0u8; MAX_DATAGRAM];
    let session = if rng.below(50) == 0 { rng.next_u64() as u32 } else { session };
    let mut builder = RequestBuilder::new(&mut buffer, session, sequence).unwrap();
    for _ in 0..1 + rng.below(4) {
        let opcode = if rng.below(20) == 0 {
            rng.next_u64() as u8
        } else {
            OPCODES[rng.below(OPCODES.len() as u64) as usize] as u8
        };
        let block = Opcode::from_u8(opcode).is_some_and(Opcode::is_block);
        // Block instructions count blocks: mostly one or two, so some are well formed.
        let length = if block { rng.below(3) as u32 } else { rng.below(700) as u32 };
        let operand_len = match Opcode::from_u8(opcode) {
            Some(Opcode::Write | Opcode::Vadd) => length as usize,
            Some(Opcode::BlockWrite) => length as usize * NAMESPACE_BLOCK as usize,
            Some(Opcode::Cas | Opcode::Memcpy) => 16,
            Some(Opcode::FetchAdd) => 8,
            Some(Opcode::Hello) => netdam_isa::control::HELLO_OPERAND_LEN,
            _ => 0,
        };
        let mut operand = rng.bytes(operand_len);
        if opcode == Opcode::Hello as u8 && rng.below(2) == 0 {
            // Well formed but for its cookie: random, or none at all.
            let mut cookie = [0u8; netdam_isa::control::COOKIE_LEN];
            if rng.below(2) == 0 {
                cookie.copy_from_slice(&rng.bytes(netdam_isa::control::COOKIE_LEN));
            }
            let hello = netdam_isa::control::HelloRequest { max_datagram_bytes: 4096, cookie };
            operand = netdam_isa::control::encode_hello_operand(&hello).to_vec();
        }
        let mut flags = if rng.below(8) == 0 { rng.next_u64() as u8 } else { 0 };
        if matches!(Opcode::from_u8(opcode), Some(Opcode::Encrypt | Opcode::Decrypt)) {
            // A seal (random: DECRYPT fails authentication), maybe a destination, then random
            // associated data; or, now and then, arbitrary operand bytes.
            let to_destination = rng.below(2) == 0;
            if rng.below(8) == 0 {
                let len = rng.below(64) as usize;
                operand = rng.bytes(len);
            } else {
                operand = if opcode == Opcode::Decrypt as u8 { rng.bytes(SEAL_LEN) } else { Vec::new() };
                if to_destination {
                    operand.extend_from_slice(&(rng.below(3) as u16).to_le_bytes());
                    operand.extend_from_slice(&[0; 6]);
                    operand.extend_from_slice(&rng.below(SCRATCH_BYTES).to_le_bytes());
                }
                let aad_len = rng.below(40) as usize;
                operand.extend_from_slice(&rng.bytes(aad_len));
            }
            if flags == 0 && to_destination {
                flags = CRYPTO_FLAG_TO_DESTINATION;
            }
        }
        if opcode == Opcode::Memcpy as u8 {
            operand[2..8].fill(0);
            operand[0..2].copy_from_slice(&(rng.below(3) as u16).to_le_bytes());
            operand[8..16].copy_from_slice(&rng.below(SCRATCH_BYTES).to_le_bytes());
        }
        let instruction = Instruction {
            opcode,
            flags,
            space: space.unwrap_or_else(|| rng.below(3) as u16),
            offset: if block {
                rng.below(NAMESPACE_BLOCKS + 2)
            } else {
                rng.below(SCRATCH_BYTES) & !if rng.below(2) == 0 { 7 } else { 0 }
            },
            length,
            aux: if rng.below(8) == 0 { rng.below(4) as u32 } else { 0 },
            operand: &operand,
        };
        if builder.push(&instruction).is_err() {
            break;
        }
    }
    let len = builder.finish();
    buffer.truncate(len);
    buffer
}

/// A hostile datagram. Well-formed ones use `clean_session`; mutated ones are built on
/// `mutated_session`, whose window a mutated sequence number may push far ahead.
fn hostile(rng: &mut Rng, clean_session: u32, mutated_session: u32, sequence: u64) -> Vec<u8> {
    let kind = rng.below(10);
    if kind < 2 {
        return well_formed(rng, clean_session, sequence, None);
    }
    // Mutated datagrams start out addressing region 1: a flipped length byte turns a FILL into a
    // legitimate 64 KiB write, and region 0 must stay mostly unaddressed to be a strong check.
    let mut bytes = well_formed(rng, mutated_session, sequence, Some(1));
    match kind {
        2 | 3 => {
            // Flip bytes; half the time fix the CRC so the mutation reaches the decoder.
            for _ in 0..1 + rng.below(6) {
                let at = rng.below(bytes.len() as u64) as usize;
                bytes[at] = rng.next_u64() as u8;
            }
            if rng.below(2) == 0 {
                fix_crc(&mut bytes);
            }
        }
        4 => bytes.truncate(rng.below(bytes.len() as u64) as usize),
        5 => {
            // Grow or cut, CRC fixed: framing errors.
            if rng.below(2) == 0 {
                let extra = 1 + rng.below(40) as usize;
                bytes.extend(rng.bytes(extra));
            } else {
                bytes.truncate(HEADER_LEN + rng.below((bytes.len() - HEADER_LEN) as u64) as usize);
            }
            fix_crc(&mut bytes);
        }
        6 => {
            // Random bytes, sometimes behind a valid magic and version.
            let len = rng.below(600) as usize;
            bytes = rng.bytes(len);
            if bytes.len() >= 3 && rng.below(2) == 0 {
                bytes[..3].copy_from_slice(&[0x4E, 0x44, 0x01]);
                fix_crc(&mut bytes);
            }
        }
        7 => {
            let len = MAX_DATAGRAM + 1 + rng.below(2000) as usize;
            bytes = rng.bytes(len);
        }
        8 => {
            bytes[2] = 2 + rng.below(250) as u8;
        }
        _ => {
            bytes[3] |= 0x01;
            fix_crc(&mut bytes);
        }
    }
    bytes
}

/// Marks the bytes a datagram may legitimately modify: every in-bounds target range of a
/// mutating instruction the protocol's own decoder accepts.
fn mark_footprint(bytes: &[u8], touched: &mut [Vec<bool>; 2]) {
    for (space, start, end) in footprint(bytes) {
        if let Some(region) = touched.get_mut(usize::from(space)) {
            region[start..end].fill(true);
        }
    }
}

/// The in-bounds ranges (space, start, end) a datagram may modify, if the decoder accepts it.
fn footprint(bytes: &[u8]) -> Vec<(u16, usize, usize)> {
    let mut ranges = Vec::new();
    let Ok(request) = Request::parse(bytes) else { return ranges };
    let in_bounds = |offset: u64, length: u64| {
        offset.checked_add(length).filter(|end| *end <= REGION_BYTES as u64).map(|end| (offset as usize, end as usize))
    };
    for instruction in request.instructions() {
        if let Ok(crypto) = netdam_isa::crypto::decode(&instruction) {
            // ENCRYPT and DECRYPT write their result in place or at their destination.
            let target = crypto.target_of(&instruction);
            if let Some((start, end)) = in_bounds(target.offset, u64::from(instruction.length)) {
                ranges.push((target.space, start, end));
            }
            continue;
        }
        let mutating = matches!(
            Opcode::from_u8(instruction.opcode),
            Some(Opcode::Write | Opcode::Cas | Opcode::FetchAdd | Opcode::Memcpy | Opcode::Fill | Opcode::Vadd)
        );
        let length = if matches!(Opcode::from_u8(instruction.opcode), Some(Opcode::Cas | Opcode::FetchAdd)) {
            8
        } else {
            u64::from(instruction.length)
        };
        if let (true, Some((start, end))) = (mutating, in_bounds(instruction.offset, length)) {
            ranges.push((instruction.space, start, end));
        }
    }
    ranges
}

/// A hostile datagram that modifies at most 64 KiB of region 0: only stray mutations reach it,
/// and it must stay mostly unaddressed for the check of its untouched bytes to mean much (two
/// lucky flips, one of the space and one of a FILL's length, could otherwise address all of it).
fn hostile_sparing_region_0(rng: &mut Rng, clean_session: u32, mutated_session: u32, sequence: u64) -> Vec<u8> {
    loop {
        let bytes = hostile(rng, clean_session, mutated_session, sequence);
        let on_region_0: usize =
            footprint(&bytes).iter().filter(|(space, _, _)| *space == 0).map(|(_, start, end)| end - start).sum();
        if on_region_0 <= 64 * 1024 {
            return bytes;
        }
    }
}

#[test]
fn target_survives_100k_hostile_datagrams() {
    let seed = seed();
    let mut rng = Rng::new(seed);
    // Namespaces 0 (a file: its datagrams wait for I/O) and 1 (a memory region: executed at
    // once) take block instructions; they are not checked, the regions are.
    let namespace = |name: &str, backend: NamespaceBackend| NamespaceConfig {
        name: name.into(),
        backend,
        path: format!("{name}.img").into(),
        size: Some(ByteSize(NAMESPACE_BLOCKS * u64::from(NAMESPACE_BLOCK))),
        block_size: NAMESPACE_BLOCK,
    };
    let namespaces =
        vec![namespace("scratch", NamespaceBackend::File), namespace("scratch-mem", NamespaceBackend::Pmem)];
    // Key slots 0 and 1 hold keys (the fuzzed aux is 0 to 3): ENCRYPT and DECRYPT execute.
    let dir = tempfile::tempdir().unwrap();
    let store = netdam_target::metadata::MetadataStore::open(dir.path()).unwrap();
    for slot in [0, 1] {
        store.create_crypto_key(slot, &netdam_target::crypto::generate_key().unwrap()).unwrap();
    }
    drop(store);
    let test = start_configured_in(
        dir,
        vec![region("guard0", REGION_BYTES as u64, false), region("guard1", REGION_BYTES as u64, false)],
        |config| {
            config.namespaces = namespaces;
            config.max_datagram_bytes = MAX_DATAGRAM;
        },
    );
    let addr = test.target.local_addr();

    let mut client = Client::connect(addr).unwrap();
    let patterns = [rng.bytes(REGION_BYTES), rng.bytes(REGION_BYTES)];
    for (space, pattern) in patterns.iter().enumerate() {
        client.write(space as u16, 0, pattern).unwrap();
    }

    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.connect(addr).unwrap();
    socket.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let clean_session = hello(&socket);
    let mutated_session = hello(&socket);
    let before = test.target.stats();
    let mut touched = [vec![false; REGION_BYTES], vec![false; REGION_BYTES]];
    let mut receive = vec![0u8; 65_536];
    let mut pings = 0u64;
    let started = Instant::now();
    for burst in 0..DATAGRAMS / BURST {
        for index in 0..BURST {
            let bytes =
                hostile_sparing_region_0(&mut rng, clean_session, mutated_session, (burst * BURST + index) as u64 + 1);
            mark_footprint(&bytes, &mut touched);
            socket.send(&bytes).unwrap();
        }
        // Barrier: one worker serves this socket in order, so the ping's answer means every
        // datagram before it has been handled.
        pings += 1;
        let sequence = u64::MAX - burst as u64;
        let mut ping = vec![0u8; 64];
        let mut builder = RequestBuilder::new(&mut ping, 0, sequence).unwrap();
        builder
            .push(&Instruction {
                opcode: Opcode::Ping as u8,
                flags: 0,
                space: 0,
                offset: 0,
                length: 0,
                aux: 0,
                operand: &[],
            })
            .unwrap();
        let len = builder.finish();
        socket.send(&ping[..len]).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            assert!(Instant::now() < deadline, "SEED={seed}: the target stopped answering after burst {burst}");
            let Ok(len) = socket.recv(&mut receive) else { continue };
            if Response::parse(&receive[..len]).is_ok_and(|response| response.header.sequence == sequence) {
                break;
            }
        }
    }
    let sent = (DATAGRAMS / BURST * BURST) as u64;
    assert!(sent >= 99_968);
    println!("sent {sent} hostile datagrams and {pings} barrier pings in {:.1} s", started.elapsed().as_secs_f64());

    // Every datagram was received and accounted for by reason.
    // Datagrams with block instructions are answered when their I/O completes, which may be
    // after the last barrier: wait until the counts settle.
    let settle = Instant::now() + Duration::from_secs(5);
    let mut after = test.target.stats();
    loop {
        std::thread::sleep(Duration::from_millis(20));
        let now = test.target.stats();
        if now == after || Instant::now() > settle {
            break;
        }
        after = now;
    }
    let delta = |name: &str| after.get(name).unwrap() - before.get(name).unwrap();
    // The two HELLOs came before `before`.
    assert_eq!(delta("datagrams_received"), sent + pings, "SEED={seed}: datagrams lost or double counted");
    let stat = client.stat().unwrap();
    for (name, value) in &stat {
        println!("{name:<30} {value}");
    }
    let value = |name: &str| stat.iter().find(|(n, _)| n == name).map(|(_, v)| *v).unwrap();
    for reason in [
        "dropped_too_short",
        "dropped_bad_magic",
        "dropped_bad_crc",
        "dropped_oversized",
        "dropped_not_request",
        "answered_unsupported_version",
        "answered_malformed",
        "status_ok",
        "status_malformed",
        "status_unknown_opcode",
        "status_no_such_space",
        "status_out_of_range",
        "status_unaligned",
        "answered_no_session",
        "answered_stale",
        "status_auth_failed",
        "status_no_such_key",
    ] {
        assert!(value(reason) > 0, "SEED={seed}: STAT shows no {reason}");
    }
    let answered = delta("responses_sent");
    let dropped: u64 = [
        "dropped_too_short",
        "dropped_bad_magic",
        "dropped_bad_crc",
        "dropped_oversized",
        "dropped_not_request",
        "dropped_bad_mac",
        "dropped_unsealed",
    ]
    .iter()
    .map(|name| delta(name))
    .sum();
    assert!(delta("block_requests_submitted") > 0, "SEED={seed}: no block instruction reached the namespace");
    // (A retransmission of a request still in progress is answered with a notice: in
    // `responses_sent`. The notices a slow block request earns on the timer are not.)
    assert_eq!(answered + dropped, sent + pings, "SEED={seed}: every datagram is either answered or dropped");

    // Memory outside the addressed ranges is exactly as it was.
    for (space, pattern) in patterns.iter().enumerate() {
        let mut now = vec![0u8; REGION_BYTES];
        client.read(space as u16, 0, &mut now).unwrap();
        // Footprints are a superset (mutated FILL lengths reach 64 KiB); region 0, which only
        // stray mutations reach, must stay mostly outside them for the check to mean much.
        let untouched = touched[space].iter().filter(|t| !**t).count();
        println!("region {space}: {untouched} of {REGION_BYTES} bytes outside every addressed range, all checked");
        if space == 0 {
            assert!(untouched > REGION_BYTES / 2, "SEED={seed}: the check must cover most of region 0");
        }
        for offset in 0..REGION_BYTES {
            if !touched[space][offset] {
                assert_eq!(
                    now[offset], pattern[offset],
                    "SEED={seed}: region {space} byte {offset} changed outside every addressed range"
                );
            }
        }
    }
}
