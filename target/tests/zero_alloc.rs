//! The target's request path allocates nothing once warm: a counting global allocator watches a
//! real target on loopback while a client that itself allocates nothing in its loop (a raw
//! socket and fixed buffers) sends every memory instruction, and a block namespace's reads,
//! writes and block status (`lseek`s on the worker, into a fixed extent array), the `reduce`
//! extension, ENCRYPT and DECRYPT; then the same (but `reduce` and the crypto instructions, which
//! do not run on a region held by a device) with the FPGA engine over `netdam-fpga-model` as a
//! separate process. One test in its own binary, so no other test's allocations are counted.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::net::UdpSocket;
use std::os::fd::AsRawFd;
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

fn namespace() -> NamespaceConfig {
    NamespaceConfig {
        name: "disk".into(),
        backend: NamespaceBackend::File,
        path: "disk.img".into(),
        size: Some(ByteSize(1 << 20)),
        block_size: 4096,
    }
}

#[test]
fn the_request_path_allocates_nothing_after_warm_up() {
    // With the `reduce` extension on, and a key in slot 1: extension handlers, ENCRYPT and
    // DECRYPT run on this path too.
    let test = common::start_with_keys(vec![common::region("mem", 1 << 20, false)], &[1], |config| {
        config.namespaces = vec![namespace()];
        config.extensions = vec!["reduce".to_string()];
    });
    assert_eq!(test.target.engine_name(), "software");
    // The key slot was written to the metadata store just before the start: the tenant watcher
    // reads a store changed within the last second again (file times are coarse), allocating
    // as it does. Those reads are not the request path: let them end before counting.
    std::thread::sleep(Duration::from_millis(1500) + 2 * netdam_target::tenant_watch::POLL_INTERVAL);
    // A sealed range to DECRYPT again and again (to a separate destination: the source stays).
    let seal = netdam_initiator::Client::connect(test.target.local_addr())
        .unwrap()
        .encrypt(0, 100_000, 512, 1, None, b"aad")
        .unwrap();
    count_allocations(&test, true, None, Some(seal));
    drop(test);

    // An authenticated session: every request opened (its MAC checked) and checked against the
    // tenant's grants, every answer sealed.
    let test = common::start_configured(vec![common::region("mem", 1 << 20, false)], |config| {
        config.namespaces = vec![namespace()];
        config.extensions = vec!["reduce".to_string()];
        config.auth = netdam_target::AuthMode::Tenants;
    });
    let key = netdam_auth::TenantKey::from_bytes([0x42; 32]);
    let record = netdam_target::tenants::TenantRecord {
        name: "bench".into(),
        id: 1,
        key_version: 1,
        key_hex: key.to_hex(),
        class: Default::default(),
        limits: Default::default(),
        grants: vec![netdam_target::tenants::GrantRecord {
            space: netdam_target::tenants::GrantSpace::All,
            permissions: vec!["all".into()],
            range: None,
        }],
    };
    let (snapshot, _) =
        netdam_target::tenants::TenantSnapshot::resolve(&[record], test.target.regions(), test.target.namespaces());
    test.target.tenants().publish(snapshot);
    count_allocations(&test, true, Some((1, key, false)), None);
    // And with every body encrypted both ways (decrypted into the worker's own buffer).
    count_allocations(&test, true, Some((1, key, true)), None);
    drop(test);

    // The FPGA engine: the region is placed on the device, every memory instruction crosses the
    // rings. The model runs as a process of its own, so only the target's allocations count.
    let model_dir = tempfile::tempdir().unwrap();
    let window = model_dir.path().join("window");
    let model_binary =
        std::path::PathBuf::from(env!("CARGO_BIN_EXE_netdam-target")).with_file_name("netdam-fpga-model");
    assert!(model_binary.exists(), "{} is missing: build the workspace first", model_binary.display());
    let mut model = std::process::Command::new(model_binary)
        .arg("--window")
        .arg(&window)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while !window.exists() {
        assert!(started.elapsed() < Duration::from_secs(60), "the model did not create its window");
        std::thread::sleep(Duration::from_millis(5));
    }
    let test = common::start_configured(vec![common::region("mem", 1 << 20, false)], |config| {
        config.namespaces = vec![namespace()];
        config.engine = netdam_target::config::EngineChoice::Fpga(Some(window.clone()));
    });
    assert_eq!(test.target.engine_name(), "fpga");
    count_allocations(&test, false, None, None);
    assert!(test.target.engine_state().on_fpga(), "the device served the whole run");
    drop(test);
    let _ = model.kill();
    let _ = model.wait();
}

/// Sends every request 400 times over a raw socket; the last 200 rounds must allocate nothing.
/// With `tenant`, over an authenticated session of that tenant (id, key, whether encrypted); with `seal` (of the
/// 512 bytes at offset 100,000, slot 1, associated data `aad`), ENCRYPT and DECRYPT too.
fn count_allocations(
    test: &common::TestTarget,
    with_reduce: bool,
    tenant: Option<(u32, netdam_auth::TenantKey, bool)>,
    seal: Option<netdam_isa::crypto::Seal>,
) {
    // Recording the per-opcode counters and histograms is part of the path measured here.
    assert!(test.target.metrics_addr().is_some(), "metrics are on in the test settings");
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.connect(test.target.local_addr()).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let encrypt = tenant.as_ref().is_some_and(|(_, _, encrypt)| *encrypt);
    let (session, keys) = match &tenant {
        Some((id, key, encrypt)) => {
            let method =
                if *encrypt { netdam_isa::control::HELLO_AUTH_ENCRYPT } else { netdam_isa::control::HELLO_AUTH_MAC };
            let (session, keys) = common::auth_hello_with(&socket, *id, key, method);
            (session, Some(keys))
        }
        None => (common::hello(&socket), None),
    };
    let mut sealed = 0u64;

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
    let all: [&[Instruction<'_>]; 13] = [
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
    ];
    let mut decrypt_operand = Vec::new();
    if let Some(seal) = &seal {
        let destination = netdam_isa::crypto::Destination { space: 0, offset: 200_000 };
        netdam_isa::crypto::encode_operand(&mut decrypt_operand, Some(seal), Some(destination), b"aad");
    }
    let crypto = [
        Instruction { aux: 1, ..instruction(Opcode::Encrypt, 0, 300_000, 4096, b"aad") },
        Instruction {
            flags: netdam_isa::crypto::CRYPTO_FLAG_TO_DESTINATION,
            aux: 1,
            ..instruction(Opcode::Decrypt, 0, 100_000, 512, &decrypt_operand)
        },
    ];
    let mut requests: Vec<&[Instruction<'_>]> = if with_reduce { all.to_vec() } else { all[..12].to_vec() };
    if seal.is_some() {
        requests.push(&crypto[..1]);
        requests.push(&crypto[1..]);
    }
    let mut out = vec![0u8; 9000];
    let mut answer = vec![0u8; 65_536];
    // Bursts of requests sent before any answer is read: the worker receives several per pass
    // and answers them in trains (`netdam_udp::Train`), whose path is counted too. Plain sessions
    // only (a sealed request's sealing shares `exchange`'s state).
    const BURST: usize = 16;
    let mut burst_out = vec![[0u8; 256]; BURST];
    let mut burst_answer = vec![0u8; 65_536];
    let burst = |first_sequence: u64, burst_out: &mut [[u8; 256]], burst_answer: &mut [u8]| {
        // One `sendmmsg`, so that the worker, woken by the first, finds the others queued
        // (separate sends on a shared core hand it each datagram alone).
        let mut iovecs = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; BURST];
        for (index, datagram) in burst_out.iter_mut().enumerate() {
            let mut builder = RequestBuilder::new(datagram, session, first_sequence + index as u64).unwrap();
            builder.push(&instruction(Opcode::Read, 0, 64 * index as u64, 64, &[])).unwrap();
            let len = builder.finish();
            iovecs[index] = libc::iovec { iov_base: datagram.as_mut_ptr().cast(), iov_len: len };
        }
        // SAFETY: mmsghdr is a plain C struct (all-zero is valid); each points at a live iovec.
        let mut messages: [libc::mmsghdr; BURST] = unsafe { std::mem::zeroed() };
        for (message, iovec) in messages.iter_mut().zip(iovecs.iter_mut()) {
            message.msg_hdr.msg_iov = iovec;
            message.msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: BURST messages over live buffers, on a connected socket.
        let sent = unsafe { libc::sendmmsg(socket.as_raw_fd(), messages.as_mut_ptr(), BURST as u32, 0) };
        assert_eq!(sent, BURST as i32, "the burst was sent whole");
        let mut answered = 0;
        while answered < BURST {
            let len = socket.recv(burst_answer).expect("every request of a burst is answered");
            let response = Response::parse(&burst_answer[..len]).expect("the answer decodes");
            if response.header.sequence >= first_sequence {
                assert_eq!(response.status(), Status::Ok);
                answered += 1;
            }
        }
    };
    let mut sequence = 0u64;
    let mut exchange = |ops: &[Instruction<'_>], sequence: u64| {
        let mut builder = RequestBuilder::new(&mut out, session, sequence).unwrap();
        for op in ops {
            builder.push(op).unwrap();
        }
        let mut len = builder.finish();
        if let Some(keys) = &keys {
            netdam_isa::wire::mark_sealed(&mut out[..len]);
            len = if encrypt {
                out[3] |= netdam_isa::wire::FLAG_ENCRYPTED;
                netdam_auth::trailer::seal_encrypted(&keys.request, sealed, &mut out, len).unwrap()
            } else {
                netdam_auth::trailer::seal(&keys.request, sealed, &mut out, len).unwrap()
            };
            sealed += 1;
        }
        socket.send(&out[..len]).unwrap();
        loop {
            let len = match socket.recv(&mut answer) {
                Ok(len) => len,
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(error) => panic!("no answer to request {sequence} within 5 s: {error}"),
            };
            let response = match &keys {
                Some(keys) if encrypt => {
                    let opened = netdam_auth::trailer::open_encrypted(&keys.response, &mut answer[..len])
                        .expect("a sealed answer");
                    Response::parse_opened(&answer[..opened]).expect("the answer decodes")
                }
                Some(keys) => {
                    let opened = netdam_auth::trailer::open(&keys.response, &answer[..len]).expect("a sealed answer");
                    Response::parse_opened(&answer[..opened]).expect("the answer decodes")
                }
                None => Response::parse(&answer[..len]).expect("the answer decodes"),
            };
            // An in-progress notice (a block request that waited 5 ms or more on a loaded
            // machine) is not the answer.
            if response.header.sequence == sequence && response.status() != Status::InProgress {
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
            for &ops in &requests {
                sequence += 1;
                exchange(ops, sequence);
            }
        }
        if keys.is_none() {
            for _ in 0..20 {
                burst(sequence + 1, &mut burst_out, &mut burst_answer);
                sequence += BURST as u64;
            }
        }
        let allocations = ALLOCATIONS.load(Ordering::Relaxed) - before;
        if round == 1 {
            // The first round warms up (the session, lazily initialised state); the second counts.
            let count = 200 * requests.len();
            assert_eq!(allocations, 0, "{allocations} heap allocations in {count} requests after warm-up");
        }
    }
    if keys.is_none() && with_reduce {
        // A pass of several datagrams answered them in trains at least once. (Not over the FPGA
        // model, whose READs take longer than a train waits for the next answer: there every
        // answer leaves alone, by `TRAIN_WAIT`.)
        let trains = test.target.stats().get("answer_trains").unwrap_or(0);
        assert!(trains > 0, "no answers left in trains during the bursts");
    }
}
