//! The target's request path allocates nothing once warm: a counting global allocator watches a
//! real target on loopback while a client that itself allocates nothing in its loop (a raw
//! socket and fixed buffers) sends every memory instruction, and a block namespace's reads,
//! writes and block status (`lseek`s on the worker, into a fixed extent array), the `reduce`
//! extension, ENCRYPT and DECRYPT. One test in its own binary, so no other test's allocations
//! are counted.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::net::UdpSocket;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use netdam_isa::extension::reduce::{reduce_aux, ReduceOp, REDUCE_OPCODE};
use netdam_isa::opcode::VADD_FLAG_RETURN_RESULT;
use netdam_isa::wire::{Instruction, RequestBuilder, Response};
use netdam_isa::{LaneType, Opcode, Status};
use netdam_target::config::{ByteSize, NamespaceBackend, NamespaceConfig};

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn instruction(opcode: Opcode, space: u16, offset: u64, length: u32, operand: &[u8]) -> Instruction<'_> {
    Instruction { opcode: opcode as u8, flags: 0, space, offset, length, aux: 0, operand }
}

#[test]
fn the_request_path_allocates_nothing_after_warm_up() {
    let namespace = NamespaceConfig {
        name: "disk".into(),
        backend: NamespaceBackend::File,
        path: "disk.img".into(),
        size: Some(ByteSize(1 << 20)),
        block_size: 4096,
    };
    // With the `reduce` extension on, and a key in slot 1: extension handlers and ENCRYPT and
    // DECRYPT run on this path too.
    let test = common::start_with_keys(vec![common::region("mem", 1 << 20, false)], &[1], |config| {
        config.namespaces = vec![namespace];
        config.extensions = vec!["reduce".to_string()];
    });
    // Recording the per-opcode counters and histograms is part of the path measured here.
    assert!(test.target.metrics_addr().is_some(), "metrics are on in the test settings");
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.connect(test.target.local_addr()).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // The key slot was written to the metadata store just before the start: the tenant watcher
    // reads a store changed within the last second again (file times are coarse), allocating
    // as it does. Those reads are not the request path: let them end before counting.
    std::thread::sleep(std::time::Duration::from_millis(1500) + 2 * netdam_target::tenant_watch::POLL_INTERVAL);
    let session = common::hello(&socket);

    // Every buffer and operand is made before counting starts.
    let word = 5u64.to_le_bytes();
    let cas = [0u8; 16];
    let lanes = [0u8; 8192];
    let data = [7u8; 512];
    let block = [9u8; 4096];
    let memcpy = {
        let mut operand = [0u8; 16];
        operand[8..16].copy_from_slice(&4096u64.to_le_bytes());
        operand
    };
    let mut vadd = instruction(Opcode::Vadd, 0, 0, lanes.len() as u32, &lanes);
    vadd.aux = LaneType::F32 as u32;
    vadd.flags = VADD_FLAG_RETURN_RESULT;
    let mut fill = instruction(Opcode::Fill, 0, 8192, 256, &[]);
    fill.aux = 0x5A;
    let reduce = Instruction {
        opcode: REDUCE_OPCODE,
        aux: reduce_aux(LaneType::F32, ReduceOp::Max),
        ..instruction(Opcode::Read, 0, 0, 65536, &[])
    };
    // A sealed range to DECRYPT again and again (to a separate destination: the source stays).
    let seal = netdam_initiator::Client::connect(test.target.local_addr())
        .unwrap()
        .encrypt(0, 100_000, 512, 1, None, b"aad")
        .unwrap();
    let mut decrypt_operand = Vec::new();
    netdam_isa::crypto::encode_operand(
        &mut decrypt_operand,
        Some(&seal),
        Some(netdam_isa::crypto::Destination { space: 0, offset: 200_000 }),
        b"aad",
    );
    let decrypt = Instruction {
        opcode: Opcode::Decrypt as u8,
        flags: netdam_isa::crypto::CRYPTO_FLAG_TO_DESTINATION,
        aux: 1,
        ..instruction(Opcode::Decrypt, 0, 100_000, 512, &decrypt_operand)
    };
    let encrypt = Instruction { aux: 1, ..instruction(Opcode::Encrypt, 0, 300_000, 4096, b"aad") };
    let requests: [&[Instruction<'_>]; 15] = [
        &[instruction(Opcode::Read, 0, 0, 64, &[])],
        &[instruction(Opcode::Write, 0, 64, data.len() as u32, &data)],
        &[instruction(Opcode::Cas, 0, 1024, 8, &cas)],
        &[instruction(Opcode::FetchAdd, 0, 2048, 8, &word)],
        &[instruction(Opcode::Memcpy, 0, 65536, 512, &memcpy)],
        &[fill],
        &[vadd],
        &[instruction(Opcode::Crc32, 0, 0, 4096, &[])],
        &[instruction(Opcode::Read, 0, 0, 64, &[]), instruction(Opcode::FetchAdd, 0, 2048, 8, &word)],
        &[instruction(Opcode::BlockWrite, 0, 3, 1, &block)],
        &[instruction(Opcode::BlockRead, 0, 3, 1, &[]), instruction(Opcode::Flush, 0, 0, 0, &[])],
        &[instruction(Opcode::BlockStatus, 0, 0, 256, &[])],
        &[reduce],
        &[encrypt],
        &[decrypt],
    ];
    let mut out = vec![0u8; 9000];
    let mut answer = vec![0u8; 65_536];
    let mut sequence = 0u64;
    let mut exchange = |ops: &[Instruction<'_>], sequence: u64| {
        let mut builder = RequestBuilder::new(&mut out, session, sequence).unwrap();
        for op in ops {
            builder.push(op).unwrap();
        }
        let len = builder.finish();
        socket.send(&out[..len]).unwrap();
        loop {
            let len = match socket.recv(&mut answer) {
                Ok(len) => len,
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(error) => panic!("no answer to request {sequence} within 5 s: {error}"),
            };
            let response = Response::parse(&answer[..len]).expect("the answer decodes");
            if response.header.sequence == sequence {
                assert_eq!(response.status(), Status::Ok);
                let mut results = response.results();
                assert!(results.all(|result| result.status == Status::Ok), "request {sequence} failed");
                return;
            }
        }
    };
    for round in 0..2 {
        let before = ALLOCATIONS.load(Ordering::Relaxed);
        for _ in 0..200 {
            for ops in requests {
                sequence += 1;
                exchange(ops, sequence);
            }
        }
        let allocations = ALLOCATIONS.load(Ordering::Relaxed) - before;
        if round == 1 {
            // The first round warms up (the session, lazily initialised state); the second counts.
            assert_eq!(allocations, 0, "{allocations} heap allocations in 3,000 requests after warm-up");
        }
    }
}
