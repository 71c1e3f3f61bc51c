//! ENCRYPT and DECRYPT against a running target: round trips in place and to a destination,
//! authentication failures that write nothing, the documented refusals, distinct nonces from
//! several workers, and at-most-once execution of a retransmitted in-place ENCRYPT.

mod common;

use std::collections::HashSet;
use std::net::UdpSocket;
use std::time::Duration;

use common::{hello, region, start_with_keys, Rng};
use netdam_initiator::{Client, ClientError, Op};
use netdam_isa::crypto::{Nonce, Seal, CRYPTO_FLAG_TO_DESTINATION, SEAL_LEN};
use netdam_isa::limits::{CRYPTO_KEY_SLOTS, MAX_CRYPTO_BYTES};
use netdam_isa::wire::{RequestBuilder, Response};
use netdam_isa::Status;

const REGION_BYTES: u64 = 1 << 20;
/// The slot every test target holds a key in; slot 2 holds another key.
const SLOT: u32 = 1;
const OTHER_SLOT: u32 = 2;

fn refused_with(result: Result<impl std::fmt::Debug, ClientError>) -> Status {
    match result {
        Err(ClientError::Refused { status, .. }) => status,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn read(client: &mut Client, space: u16, offset: u64, len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    client.read(space, offset, &mut bytes).unwrap();
    bytes
}

#[test]
fn encrypt_then_decrypt_round_trips_in_place_and_to_a_destination() {
    let test =
        start_with_keys(vec![region("a", REGION_BYTES, false), region("b", REGION_BYTES, true)], &[SLOT], |_| {});
    let mut client = Client::connect(test.target.local_addr()).unwrap();
    let mut rng = Rng::new(7);

    // In place, at an odd offset and length: no alignment is required.
    let plain = rng.bytes(4097);
    client.write(0, 3, &plain).unwrap();
    let seal = client.encrypt(0, 3, 4097, SLOT, None, b"").unwrap();
    assert_eq!(seal.nonce.key_version, 1);
    let cipher = read(&mut client, 0, 3, plain.len());
    assert_ne!(cipher, plain, "the range now holds ciphertext");
    client.decrypt(0, 3, 4097, SLOT, &seal, None, b"").unwrap();
    assert_eq!(read(&mut client, 0, 3, plain.len()), plain);

    // To a destination in another (persistent) region, with associated data; the source stays.
    let plain = rng.bytes(MAX_CRYPTO_BYTES);
    client.write(0, 65_536, &plain).unwrap();
    let seal = client.encrypt(0, 65_536, plain.len() as u32, SLOT, Some((1, 8192)), b"volume 7").unwrap();
    assert_eq!(read(&mut client, 0, 65_536, plain.len()), plain, "the source is left as it was");
    let cipher = read(&mut client, 1, 8192, plain.len());
    assert_ne!(cipher, plain);
    client.decrypt(1, 8192, plain.len() as u32, SLOT, &seal, Some((0, 200_000)), b"volume 7").unwrap();
    assert_eq!(read(&mut client, 0, 200_000, plain.len()), plain);
    assert_eq!(read(&mut client, 1, 8192, plain.len()), cipher, "decrypting to a destination keeps the ciphertext");

    // Overlapping source and destination behave like memmove.
    let plain = rng.bytes(1000);
    client.write(0, 300_000, &plain).unwrap();
    let seal = client.encrypt(0, 300_000, 1000, SLOT, Some((0, 300_010)), b"").unwrap();
    client.decrypt(0, 300_010, 1000, SLOT, &seal, Some((0, 299_990)), b"").unwrap();
    assert_eq!(read(&mut client, 0, 299_990, 1000), plain);

    // An empty range still gets a tag over its associated data.
    let seal = client.encrypt(0, 0, 0, SLOT, None, b"just a header").unwrap();
    client.decrypt(0, 0, 0, SLOT, &seal, None, b"just a header").unwrap();
    assert_eq!(refused_with(client.decrypt(0, 0, 0, SLOT, &seal, None, b"just a headex")), Status::AuthFailed);
}

#[test]
fn tampering_fails_authentication_and_writes_nothing() {
    let test = start_with_keys(vec![region("a", REGION_BYTES, false)], &[SLOT, OTHER_SLOT], |_| {});
    let mut client = Client::connect(test.target.local_addr()).unwrap();
    let mut rng = Rng::new(11);
    let plain = rng.bytes(2048);
    client.write(0, 0, &plain).unwrap();
    let seal = client.encrypt(0, 0, 2048, SLOT, None, b"aad").unwrap();
    let cipher = read(&mut client, 0, 0, 2048);
    // The destination and the in-place range hold known bytes, which must survive every failure.
    let guard = rng.bytes(2048);
    client.write(0, 100_000, &guard).unwrap();

    let mut wrong_tag = seal;
    wrong_tag.tag[5] ^= 0x01;
    let mut wrong_counter = seal;
    wrong_counter.nonce.counter ^= 1;
    let mut unknown_version = seal;
    unknown_version.nonce = Nonce { key_version: 9, ..seal.nonce };
    let attempts: [(&str, Seal, u32, &[u8]); 5] = [
        ("tag", wrong_tag, SLOT, b"aad"),
        ("nonce", wrong_counter, SLOT, b"aad"),
        ("key version", unknown_version, SLOT, b"aad"),
        ("slot", seal, OTHER_SLOT, b"aad"),
        ("associated data", seal, SLOT, b"aae"),
    ];
    for (what, seal, slot, aad) in attempts {
        let to_destination = client.decrypt(0, 0, 2048, slot, &seal, Some((0, 100_000)), aad);
        assert_eq!(refused_with(to_destination), Status::AuthFailed, "a changed {what}");
        assert_eq!(read(&mut client, 0, 100_000, 2048), guard, "a changed {what}: the destination is untouched");
        assert_eq!(refused_with(client.decrypt(0, 0, 2048, slot, &seal, None, aad)), Status::AuthFailed);
        assert_eq!(read(&mut client, 0, 0, 2048), cipher, "a changed {what}: the range in place is untouched");
    }

    // One flipped ciphertext bit.
    client.fill(0, 777, 1, cipher[777] ^ 0x80).unwrap();
    assert_eq!(refused_with(client.decrypt(0, 0, 2048, SLOT, &seal, Some((0, 100_000)), b"aad")), Status::AuthFailed);
    assert_eq!(read(&mut client, 0, 100_000, 2048), guard);
    client.fill(0, 777, 1, cipher[777]).unwrap();
    client.decrypt(0, 0, 2048, SLOT, &seal, None, b"aad").unwrap();
    assert_eq!(read(&mut client, 0, 0, 2048), plain, "restored, it opens");
    let stat = client.stat().unwrap();
    let auth_failed = stat.iter().find(|(name, _)| name == "status_auth_failed").map(|(_, value)| *value);
    assert_eq!(auth_failed, Some(11), "STAT counts every authentication failure");
}

#[test]
fn refusals_have_their_documented_statuses() {
    let test = start_with_keys(vec![region("a", REGION_BYTES, false)], &[SLOT], |_| {});
    let mut client = Client::connect(test.target.local_addr()).unwrap();
    let seal = client.encrypt(0, 0, 64, SLOT, None, b"").unwrap();
    let cases: Vec<(&str, Op, Status)> = vec![
        ("a slot without a key", Op::encrypt(0, 0, 64, 0, None, b""), Status::NoSuchKey),
        ("a slot without a key", Op::decrypt(0, 0, 64, 9, &seal, None, b""), Status::NoSuchKey),
        ("a slot beyond the last", Op::encrypt(0, 0, 64, CRYPTO_KEY_SLOTS, None, b""), Status::Malformed),
        ("an unknown flag", Op { flags: 0x02, ..Op::encrypt(0, 0, 64, SLOT, None, b"") }, Status::Malformed),
        (
            "a short seal",
            Op { operand: vec![0; SEAL_LEN - 1], ..Op::decrypt(0, 0, 64, SLOT, &seal, None, b"") },
            Status::Malformed,
        ),
        (
            "a destination flag without a destination",
            Op { flags: CRYPTO_FLAG_TO_DESTINATION, ..Op::encrypt(0, 0, 64, SLOT, None, b"") },
            Status::Malformed,
        ),
        ("a missing region", Op::encrypt(3, 0, 64, SLOT, None, b""), Status::NoSuchSpace),
        ("a missing destination region", Op::encrypt(0, 0, 64, SLOT, Some((3, 0)), b""), Status::NoSuchSpace),
        ("a range past the end", Op::encrypt(0, REGION_BYTES - 63, 64, SLOT, None, b""), Status::OutOfRange),
        ("an offset that wraps", Op::encrypt(0, u64::MAX - 8, 64, SLOT, None, b""), Status::OutOfRange),
        ("a destination past the end", Op::encrypt(0, 0, 64, SLOT, Some((0, REGION_BYTES)), b""), Status::OutOfRange),
        ("over 16 KiB", Op::encrypt(0, 0, MAX_CRYPTO_BYTES as u32 + 1, SLOT, None, b""), Status::TooLarge),
        ("over 1 KiB of associated data", Op::encrypt(0, 0, 64, SLOT, None, &[0; 1025]), Status::TooLarge),
    ];
    let before = read(&mut client, 0, 0, 4096);
    for (what, op, status) in cases {
        let reply = client.call(&[op]).unwrap();
        assert_eq!(refused_with(reply.data(0)), status, "{what}");
    }
    assert_eq!(read(&mut client, 0, 0, 4096), before, "no refused instruction wrote anything");

    // A target whose sessions may only read refuses both.
    let reader = start_with_keys(vec![region("a", 4096, false)], &[SLOT], |config| {
        config.session_permissions = vec!["read".to_string()];
    });
    let mut client = Client::connect(reader.target.local_addr()).unwrap();
    assert_eq!(refused_with(client.encrypt(0, 0, 64, SLOT, None, b"")), Status::PermissionDenied);
    assert_eq!(refused_with(client.decrypt(0, 0, 64, SLOT, &seal, None, b"")), Status::PermissionDenied);
}

#[test]
fn nonces_are_distinct_across_workers_and_sessions() {
    const CLIENTS: usize = 4;
    const EACH: usize = 300;
    let test = start_with_keys(vec![region("a", REGION_BYTES, false)], &[SLOT], |config| config.workers = 2);
    let addr = test.target.local_addr();
    // Several sockets, so that SO_REUSEPORT spreads them over both workers.
    let threads: Vec<_> = (0..CLIENTS)
        .map(|index| {
            std::thread::spawn(move || {
                let mut client = Client::connect(addr).unwrap();
                let offset = index as u64 * 4096;
                (0..EACH).map(|_| client.encrypt(0, offset, 256, SLOT, None, b"").unwrap().nonce).collect::<Vec<_>>()
            })
        })
        .collect();
    let mut seen = HashSet::new();
    for thread in threads {
        for nonce in thread.join().unwrap() {
            assert_eq!(nonce.key_version, 1);
            assert!(seen.insert(nonce.counter), "nonce counter {} used twice", nonce.counter);
        }
    }
    assert_eq!(seen.len(), CLIENTS * EACH);
    let reserved =
        netdam_target::crypto::read_reservation(&netdam_target::crypto::reservation_path(test.dir.path(), SLOT))
            .unwrap();
    assert!(seen.iter().all(|&counter| counter < reserved), "every nonce used lies below the durable reservation");
}

/// Sends `datagram` on `socket` and returns the answer with its sequence.
fn exchange(socket: &UdpSocket, datagram: &[u8], sequence: u64) -> Vec<u8> {
    socket.send(datagram).unwrap();
    let mut answer = vec![0u8; 65_536];
    loop {
        let len = socket.recv(&mut answer).expect("an answer");
        if Response::parse(&answer[..len]).is_ok_and(|response| response.header.sequence == sequence) {
            return answer[..len].to_vec();
        }
    }
}

#[test]
fn a_retransmitted_in_place_encrypt_gets_its_stored_answer_and_runs_once() {
    let test = start_with_keys(vec![region("a", REGION_BYTES, false)], &[SLOT], |_| {});
    let addr = test.target.local_addr();
    let mut client = Client::connect(addr).unwrap();
    let plain = Rng::new(3).bytes(512);
    client.write(0, 4096, &plain).unwrap();

    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.connect(addr).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let session = hello(&socket);
    let op = Op::encrypt(0, 4096, 512, SLOT, None, b"");
    assert!(!op.is_idempotent(), "ENCRYPT in place is at most once");
    let mut datagram = vec![0u8; 1024];
    let mut builder = RequestBuilder::new(&mut datagram, session, 1).unwrap();
    builder.push(&op.as_instruction()).unwrap();
    let len = builder.finish();
    let first = exchange(&socket, &datagram[..len], 1);
    let second = exchange(&socket, &datagram[..len], 1);
    assert_eq!(first, second, "the retransmission is answered with the stored answer, byte for byte");
    let response = Response::parse(&first).unwrap();
    let result = response.results().next().unwrap();
    assert_eq!(result.status, Status::Ok);
    let seal = Seal::from_bytes(result.data).unwrap();
    // Encrypted once: one decryption with that seal gives the plaintext back.
    client.decrypt(0, 4096, 512, SLOT, &seal, None, b"").unwrap();
    assert_eq!(read(&mut client, 0, 4096, 512), plain);
    let stat = client.stat().unwrap();
    let replayed = stat.iter().find(|(name, _)| name == "duplicates_replayed").map(|(_, value)| *value);
    assert_eq!(replayed, Some(1));
}

/// Smoke measurement (not a benchmark: the machine is shared): the service time the target
/// reports for ENCRYPTs in place of 4 KiB and 16 KiB, for the DECRYPTs that undo them, and for
/// READs of the same sizes, and the throughput per worker core that implies (bytes over the
/// median service time, the whole datagram's cost included). Run with `--nocapture` to see it.
/// What it checks: every DECRYPT gives back the plaintext the ENCRYPT hid.
#[test]
fn service_time_of_4_and_16_kib_encrypts_and_decrypts() {
    // A spinning worker, so that the service time is the work, not the worker's wake-up.
    let test = start_with_keys(vec![region("a", REGION_BYTES, false)], &[SLOT], |config| {
        config.poll = netdam_target::config::PollMode::Busy
    });
    let mut client = Client::connect(test.target.local_addr()).unwrap();
    let median = |mut values: Vec<u32>| {
        values.sort_unstable();
        values[values.len() / 2]
    };
    let mut rng = Rng::new(0xC0FFEE);
    for bytes in [4096u32, MAX_CRYPTO_BYTES as u32] {
        let plain = rng.bytes(bytes as usize);
        client.write(0, 0, &plain).unwrap();
        let (mut encrypt, mut decrypt, mut read_back) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..500 {
            let reply = client.call(&[Op::encrypt(0, 0, bytes, SLOT, None, b"")]).unwrap();
            let seal = Seal::from_bytes(reply.data(0).unwrap()).unwrap();
            encrypt.push(reply.response().header.service_time_ns);
            let reply = client.call(&[Op::decrypt(0, 0, bytes, SLOT, &seal, None, b"")]).unwrap();
            reply.data(0).unwrap();
            decrypt.push(reply.response().header.service_time_ns);
            // READ answers carry the bytes, so the largest READ is what fits in a datagram.
            let read_bytes = bytes.min(8192);
            let reply = client.call(&[Op::read(0, 0, read_bytes)]).unwrap();
            assert_eq!(reply.data(0).unwrap(), &plain[..read_bytes as usize], "decrypted back to the plaintext");
            read_back.push(reply.response().header.service_time_ns);
        }
        let (encrypt, decrypt, read_back) = (median(encrypt), median(decrypt), median(read_back));
        let rate = |ns: u32| f64::from(bytes) * 1000.0 / f64::from(ns.max(1));
        println!(
            "{bytes}-byte in place, service time median (500 each): ENCRYPT {encrypt} ns ({:.0} MB/s per worker \
             core), DECRYPT {decrypt} ns ({:.0} MB/s); {}-byte READ in the same run: {read_back} ns",
            rate(encrypt),
            rate(decrypt),
            bytes.min(8192)
        );
    }
}

/// Tenants with grants, on a target serving `regions` with key slots `slots`.
mod tenanted {
    use super::*;
    use common::TestTarget;
    use netdam_auth::{Credentials, TenantKey};
    use netdam_initiator::{ClientOptions, SessionConfig};
    use netdam_target::config::AuthMode;
    use netdam_target::config::RegionConfig;
    pub use netdam_target::tenants::{GrantRecord, GrantSpace, TenantRecord, TenantSnapshot};

    pub fn grant(space: GrantSpace, permissions: &[&str], range: Option<(u64, u64)>) -> GrantRecord {
        GrantRecord { space, permissions: permissions.iter().map(|name| name.to_string()).collect(), range }
    }

    pub fn region_grant(region: &str, permissions: &[&str], range: Option<(u64, u64)>) -> GrantRecord {
        grant(GrantSpace::Region(region.into()), permissions, range)
    }

    /// Tenant `id`, whose key is 32 bytes of `id`.
    pub fn record(name: &str, id: u32, grants: Vec<GrantRecord>) -> TenantRecord {
        TenantRecord {
            name: name.into(),
            id,
            key_version: 1,
            key_hex: TenantKey::from_bytes([id as u8; 32]).to_hex(),
            class: Default::default(),
            limits: Default::default(),
            grants,
        }
    }

    pub fn start(regions: Vec<RegionConfig>, slots: &[u32]) -> TestTarget {
        start_with_keys(regions, slots, |config| config.auth = AuthMode::Tenants)
    }

    /// Puts `records` in force on `test`'s target, as its store watcher would.
    pub fn publish(test: &TestTarget, records: &[TenantRecord]) {
        let (snapshot, warnings) = TenantSnapshot::resolve(records, test.target.regions(), test.target.namespaces());
        assert!(warnings.is_empty(), "{warnings:?}");
        test.target.tenants().publish(snapshot);
    }

    pub fn connect(test: &TestTarget, tenant: u32) -> Client {
        let credentials = Credentials { tenant, key_version: 1, key: TenantKey::from_bytes([tenant as u8; 32]) };
        let session = SessionConfig { credentials: Some(credentials), ..Default::default() };
        Client::connect_with(test.target.local_addr(), ClientOptions { session, ..Default::default() }).unwrap()
    }
}

/// With tenants, ENCRYPT and DECRYPT need `read` and `write` on the region and `write` on a
/// destination region, over the ranges addressed; a refusal writes nothing.
#[test]
fn tenants_need_read_and_write_on_the_source_and_write_on_the_destination() {
    use tenanted::*;
    // Alice owns "own" and may read and write the first 64 KiB of "shared"; Bob may only read
    // "own". Both may use the key slot.
    let key = || grant(GrantSpace::KeySlot(SLOT), &["encrypt", "decrypt"], None);
    let records = vec![
        record(
            "alice",
            1,
            vec![
                region_grant("own", &["read", "write"], None),
                region_grant("shared", &["read", "write"], Some((0, 65_536))),
                key(),
            ],
        ),
        record("bob", 2, vec![region_grant("own", &["read"], None), key()]),
    ];
    let test = start(vec![region("own", REGION_BYTES, false), region("shared", REGION_BYTES, false)], &[SLOT]);
    publish(&test, &records);
    let mut alice = connect(&test, 1);
    let mut bob = connect(&test, 2);

    let plain = Rng::new(5).bytes(1024);
    alice.write(0, 0, &plain).unwrap();
    let seal = alice.encrypt(0, 0, 1024, SLOT, None, b"").unwrap();
    let cipher = read(&mut alice, 0, 0, 1024);
    // Within her writable range of "shared": allowed.
    alice.decrypt(0, 0, 1024, SLOT, &seal, Some((1, 4096)), b"").unwrap();
    assert_eq!(read(&mut alice, 1, 4096, 1024), plain);
    // Beyond it, as a destination or in place: refused, nothing written.
    // Read in the target's own memory: Alice may not read there.
    let shared_bytes = |offset: usize| {
        let mut bytes = vec![0u8; 1024];
        test.target.regions().get(1).unwrap().memory().read(offset, &mut bytes);
        bytes
    };
    let before = shared_bytes(65_000);
    assert_eq!(refused_with(alice.decrypt(0, 0, 1024, SLOT, &seal, Some((1, 65_000)), b"")), Status::PermissionDenied);
    assert_eq!(refused_with(alice.encrypt(1, 65_000, 1024, SLOT, None, b"")), Status::PermissionDenied);
    assert_eq!(shared_bytes(65_000), before);
    // Bob may read "own" but not write it.
    assert_eq!(refused_with(bob.encrypt(0, 0, 1024, SLOT, None, b"")), Status::PermissionDenied);
    assert_eq!(refused_with(bob.decrypt(0, 0, 1024, SLOT, &seal, None, b"")), Status::PermissionDenied);
    assert_eq!(read(&mut alice, 0, 0, 1024), cipher, "Bob changed nothing");
}

/// A key slot is used only as granted: a tenant with every permission on its own region, but
/// no grant on the slot another tenant sealed with, can neither open that tenant's ciphertext
/// (copied into its region) nor seal with the slot; a grant of `decrypt` alone opens and does
/// not seal. Nothing is written by a refusal.
#[test]
fn a_key_slot_seals_and_opens_only_for_tenants_granted_it() {
    use tenanted::*;
    let alice_grants = vec![
        region_grant("alice", &["read", "write"], None),
        grant(GrantSpace::KeySlot(SLOT), &["encrypt", "decrypt"], None),
    ];
    let bob_region = region_grant("bob", &["read", "write", "atomic", "compute"], None);
    let bob_other_slot = grant(GrantSpace::KeySlot(OTHER_SLOT), &["encrypt", "decrypt"], None);
    let test =
        start(vec![region("alice", REGION_BYTES, false), region("bob", REGION_BYTES, false)], &[SLOT, OTHER_SLOT]);
    publish(
        &test,
        &[record("alice", 1, alice_grants.clone()), record("bob", 2, vec![bob_region.clone(), bob_other_slot.clone()])],
    );
    let mut alice = connect(&test, 1);
    let mut bob = connect(&test, 2);

    let plain = Rng::new(11).bytes(4096);
    alice.write(0, 0, &plain).unwrap();
    let seal = alice.encrypt(0, 0, 4096, SLOT, None, b"tenant").unwrap();
    let cipher = read(&mut alice, 0, 0, 4096);
    assert_ne!(cipher, plain);
    bob.write(1, 0, &cipher).unwrap();
    // Bob holds the ciphertext and every permission on his region, and a key of his own.
    assert_eq!(refused_with(bob.decrypt(1, 0, 4096, SLOT, &seal, None, b"tenant")), Status::PermissionDenied);
    assert_eq!(refused_with(bob.encrypt(1, 0, 4096, SLOT, None, b"")), Status::PermissionDenied);
    // Operands too malformed to name a slot are the executor's `malformed`: nothing executes.
    let malformed = [
        Op { flags: 0x02, ..Op::encrypt(1, 0, 4096, SLOT, None, b"") },
        Op { operand: vec![0; SEAL_LEN - 1], ..Op::decrypt(1, 0, 4096, SLOT, &seal, None, b"") },
        Op::encrypt(1, 0, 4096, CRYPTO_KEY_SLOTS, None, b""),
    ];
    for op in malformed {
        let reply = bob.call(&[op]).unwrap();
        assert_eq!(refused_with(reply.data(0)), Status::Malformed);
    }
    assert_eq!(read(&mut bob, 1, 0, 4096), cipher, "a refusal writes nothing");
    // His own slot seals and opens in his region, and does not open Alice's ciphertext.
    let own_seal = bob.encrypt(1, 8192, 4096, OTHER_SLOT, None, b"").unwrap();
    bob.decrypt(1, 8192, 4096, OTHER_SLOT, &own_seal, None, b"").unwrap();
    assert_eq!(
        refused_with(bob.decrypt(1, 0, 4096, OTHER_SLOT, &seal, None, b"tenant")),
        Status::AuthFailed,
        "another slot's key does not open it"
    );
    // `decrypt` on the slot: he opens what Alice sealed, and still cannot seal with it.
    let bob_decrypts = grant(GrantSpace::KeySlot(SLOT), &["decrypt"], None);
    publish(
        &test,
        &[record("alice", 1, alice_grants), record("bob", 2, vec![bob_region, bob_other_slot, bob_decrypts])],
    );
    bob.decrypt(1, 0, 4096, SLOT, &seal, None, b"tenant").unwrap();
    assert_eq!(read(&mut bob, 1, 0, 4096), plain);
    assert_eq!(refused_with(bob.encrypt(1, 0, 4096, SLOT, None, b"")), Status::PermissionDenied);
    assert_eq!(read(&mut bob, 1, 0, 4096), plain, "a refusal writes nothing");
}

/// A key slot deleted from the store while the target runs serves no more within a second
/// (`no_such_key`), and a key made anew in the slot does not bring the deleted one back: a
/// grant given on the new slot must not open what the old key sealed. A rotation of another
/// slot withdraws nothing.
#[test]
fn a_key_slot_deleted_while_the_target_runs_serves_no_more() {
    use netdam_target::metadata::MetadataStore;
    let test = start_with_keys(vec![region("a", REGION_BYTES, false)], &[SLOT, OTHER_SLOT], |_| {});
    let mut client = Client::connect(test.target.local_addr()).unwrap();
    client.write(0, 0, &Rng::new(3).bytes(4096)).unwrap();
    let seal = client.encrypt(0, 0, 4096, SLOT, None, b"").unwrap();
    let cipher = read(&mut client, 0, 0, 4096);
    {
        let store = MetadataStore::open(test.dir.path()).unwrap();
        store.delete_crypto_key(SLOT).unwrap();
        store.create_crypto_key(SLOT, &netdam_target::crypto::generate_key().unwrap()).unwrap();
        store.rotate_crypto_key(OTHER_SLOT, &netdam_target::crypto::generate_key().unwrap()).unwrap();
    }
    let started = std::time::Instant::now();
    while !test.target.keys().is_withdrawn(SLOT) {
        assert!(started.elapsed() < Duration::from_secs(3), "the deleted slot still serves after 3 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(refused_with(client.decrypt(0, 0, 4096, SLOT, &seal, None, b"")), Status::NoSuchKey);
    assert_eq!(refused_with(client.encrypt(0, 0, 4096, SLOT, None, b"")), Status::NoSuchKey);
    assert_eq!(read(&mut client, 0, 0, 4096), cipher, "nothing was written");
    assert!(!test.target.keys().is_withdrawn(OTHER_SLOT), "a rotation keeps what was loaded");
    let other = client.encrypt(0, 8192, 4096, OTHER_SLOT, None, b"").unwrap();
    client.decrypt(0, 8192, 4096, OTHER_SLOT, &other, None, b"").unwrap();
}
