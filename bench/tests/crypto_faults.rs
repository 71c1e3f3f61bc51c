//! In-place ENCRYPTs and DECRYPTs through a fault-injecting proxy (5% loss, 2% duplication, 1%
//! reordering in each direction) from two initiators: every one completes, exactly once.
//! - ENCRYPT: each seals its own range once; had a retransmission or a duplicate executed it
//!   again, the range would hold ciphertext of ciphertext and the seal answered would not open
//!   it. So decrypting every range with the seal its initiator got must give the original bytes
//!   back, and no nonce repeats.
//! - DECRYPT: each opens a range sealed beforehand; run again, it would try to open plaintext
//!   and fail authentication (writing nothing). So every answer must be ok, the target must have
//!   answered no `auth_failed`, and every range must hold its original bytes.

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use netdam_bench::proxy::{test_seed, Faults, Proxy};
use netdam_initiator::{Client, ClientError, ClientOptions, Op, SessionConfig};
use netdam_isa::crypto::Seal;
use netdam_isa::Status;
use netdam_target::config::{ByteSize, Config, PollMode, RegionBackend, RegionConfig};
use netdam_target::Target;

const INITIATORS: u64 = 2;
const ENCRYPTIONS: u64 = 2_000;
const RANGE_BYTES: u64 = 256;
const SLOT: u32 = 3;
const WINDOW: usize = 16;

fn pattern(index: u64) -> Vec<u8> {
    (0..RANGE_BYTES).map(|at| (index.wrapping_mul(31) ^ at.wrapping_mul(7)) as u8).collect()
}

/// A target with key slot `SLOT` and one memory region of `ENCRYPTIONS` ranges, in `dir`.
fn start(dir: &tempfile::TempDir) -> Target {
    let store = netdam_target::metadata::MetadataStore::open(dir.path()).unwrap();
    store.create_crypto_key(SLOT, &netdam_target::crypto::generate_key().unwrap()).unwrap();
    drop(store);
    let config = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        metrics_listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: Some(dir.path().to_path_buf()),
        poll: PollMode::Blocking,
        workers: 2,
        pin_workers: false,
        lock_memory: false,
        busy_threshold_us: 60_000,
        // This test is about at-most-once execution; tests/auth.rs covers tenants.
        auth: netdam_target::AuthMode::None,
        regions: vec![RegionConfig {
            name: "sealed".into(),
            backend: RegionBackend::Mem,
            path: None,
            size: ByteSize(ENCRYPTIONS * RANGE_BYTES),
        }],
        ..Config::default()
    };
    Target::start(&config).unwrap()
}

fn faults(seed: u64) -> Faults {
    Faults { loss: 0.05, duplicate: 0.02, reorder: 0.01, reorder_delay: Duration::from_micros(300), seed }
}

fn options() -> ClientOptions {
    ClientOptions {
        session: SessionConfig { max_in_flight: WINDOW, max_attempts: 40, ..SessionConfig::default() },
        ..ClientOptions::default()
    }
}

#[test]
fn in_place_encrypts_through_loss_duplication_and_reordering_run_exactly_once() {
    let seed = test_seed();
    let dir = tempfile::tempdir().unwrap();
    let target = start(&dir);
    let mut direct = Client::connect(target.local_addr()).unwrap();
    for index in 0..ENCRYPTIONS {
        direct.write(0, index * RANGE_BYTES, &pattern(index)).unwrap();
    }
    let proxy = Proxy::start(target.local_addr(), faults(seed)).unwrap();
    let options = options();
    let per_initiator = ENCRYPTIONS / INITIATORS;
    let proxy_addr = proxy.addr();
    let seals: Vec<(u64, Seal)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..INITIATORS)
            .map(|initiator| {
                scope.spawn(move || {
                    let mut client = Client::connect_with(proxy_addr, options).expect("connect through the proxy");
                    let first = initiator * per_initiator;
                    let mut seals = Vec::new();
                    let mut pending = VecDeque::new();
                    let mut next = first;
                    while next < first + per_initiator || !pending.is_empty() {
                        while next < first + per_initiator && pending.len() < WINDOW {
                            let op = Op::encrypt(0, next * RANGE_BYTES, RANGE_BYTES as u32, SLOT, None, b"");
                            pending.push_back((next, client.submit(&[op]).expect("submit")));
                            next += 1;
                        }
                        let (index, ticket) = pending.pop_front().expect("pending");
                        let reply = client.wait(ticket).unwrap_or_else(|e| panic!("SEED={seed}: {e}"));
                        let data = reply.data(0).unwrap_or_else(|e| panic!("SEED={seed}: {e}"));
                        seals.push((index, Seal::from_bytes(data).expect("a 28-byte seal")));
                    }
                    seals
                })
            })
            .collect();
        workers.into_iter().flat_map(|worker| worker.join().expect("initiator thread")).collect()
    });
    let counts = proxy.stop().unwrap();
    let stats = target.stats();
    println!("proxy: {counts:?}; target: {} duplicates replayed", stats.get("duplicates_replayed").unwrap());
    assert_eq!(seals.len() as u64, ENCRYPTIONS, "SEED={seed}: encryptions lost");
    let nonces: HashSet<u64> = seals.iter().map(|(_, seal)| seal.nonce.counter).collect();
    assert_eq!(nonces.len() as u64, ENCRYPTIONS, "SEED={seed}: a nonce was answered twice");
    for (index, seal) in &seals {
        let offset = index * RANGE_BYTES;
        direct
            .decrypt(0, offset, RANGE_BYTES as u32, SLOT, seal, None, b"")
            .unwrap_or_else(|e| panic!("SEED={seed}: range {index} does not open with its seal (run twice?): {e}"));
        let mut back = vec![0u8; RANGE_BYTES as usize];
        direct.read(0, offset, &mut back).unwrap();
        assert_eq!(back, pattern(*index), "SEED={seed}: range {index}");
    }
    assert!(counts.dropped > 0 && counts.duplicated > 0, "the proxy injected faults");
    assert!(stats.get("duplicates_replayed").unwrap() > 0, "retransmissions were answered from the window");
}

#[test]
fn in_place_decrypts_through_loss_duplication_and_reordering_run_exactly_once() {
    let seed = test_seed();
    let dir = tempfile::tempdir().unwrap();
    let target = start(&dir);
    // Sealed directly, without faults: every range ciphertext, its seal known.
    let mut direct = Client::connect(target.local_addr()).unwrap();
    let seals: Vec<Seal> = (0..ENCRYPTIONS)
        .map(|index| {
            direct.write(0, index * RANGE_BYTES, &pattern(index)).unwrap();
            direct.encrypt(0, index * RANGE_BYTES, RANGE_BYTES as u32, SLOT, None, b"").unwrap()
        })
        .collect();
    let mut sealed = vec![0u8; RANGE_BYTES as usize];
    for index in 0..ENCRYPTIONS {
        direct.read(0, index * RANGE_BYTES, &mut sealed).unwrap();
        assert_ne!(sealed, pattern(index), "range {index} was encrypted in place");
    }
    let auth_failed = |target: &Target| {
        target.stats().by_status.iter().find(|(status, _)| *status == Status::AuthFailed).map(|(_, count)| *count)
    };
    assert_eq!(auth_failed(&target), Some(0));
    let proxy = Proxy::start(target.local_addr(), faults(seed)).unwrap();
    let options = options();
    let per_initiator = ENCRYPTIONS / INITIATORS;
    let proxy_addr = proxy.addr();
    let seals = &seals;
    let opened: Vec<u64> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..INITIATORS)
            .map(|initiator| {
                scope.spawn(move || {
                    let mut client = Client::connect_with(proxy_addr, options).expect("connect through the proxy");
                    let first = initiator * per_initiator;
                    let mut opened = Vec::new();
                    let mut pending = VecDeque::new();
                    let mut next = first;
                    while next < first + per_initiator || !pending.is_empty() {
                        while next < first + per_initiator && pending.len() < WINDOW {
                            let seal = &seals[next as usize];
                            let op = Op::decrypt(0, next * RANGE_BYTES, RANGE_BYTES as u32, SLOT, seal, None, b"");
                            pending.push_back((next, client.submit(&[op]).expect("submit")));
                            next += 1;
                        }
                        let (index, ticket) = pending.pop_front().expect("pending");
                        let reply = client.wait(ticket).unwrap_or_else(|e| panic!("SEED={seed}: {e}"));
                        let data = reply.data(0).unwrap_or_else(|e| panic!("SEED={seed}: range {index}: {e}"));
                        assert!(data.is_empty(), "SEED={seed}: an in-place DECRYPT answers no data");
                        opened.push(index);
                    }
                    opened
                })
            })
            .collect();
        workers.into_iter().flat_map(|worker| worker.join().expect("initiator thread")).collect()
    });
    let counts = proxy.stop().unwrap();
    let stats = target.stats();
    println!("proxy: {counts:?}; target: {} duplicates replayed", stats.get("duplicates_replayed").unwrap());
    let mut opened = opened;
    opened.sort_unstable();
    assert!(opened.into_iter().eq(0..ENCRYPTIONS), "SEED={seed}: a decryption was lost or answered twice");
    assert_eq!(
        auth_failed(&target),
        Some(0),
        "SEED={seed}: a DECRYPT ran again on its own plaintext (or opened something else)"
    );
    let mut back = vec![0u8; RANGE_BYTES as usize];
    for index in 0..ENCRYPTIONS {
        direct.read(0, index * RANGE_BYTES, &mut back).unwrap();
        assert_eq!(back, pattern(index), "SEED={seed}: range {index}");
    }
    assert!(counts.dropped > 0 && counts.duplicated > 0, "the proxy injected faults");
    assert!(stats.get("duplicates_replayed").unwrap() > 0, "retransmissions were answered from the window");
    // What a second run would have done: refuse, count auth_failed, and leave the plaintext.
    let again = direct.decrypt(0, 0, RANGE_BYTES as u32, SLOT, &seals[0], None, b"").unwrap_err();
    assert!(matches!(again, ClientError::Refused { status: Status::AuthFailed, .. }), "{again:?}");
    assert_eq!(auth_failed(&target), Some(1));
    direct.read(0, 0, &mut back).unwrap();
    assert_eq!(back, pattern(0));
}
