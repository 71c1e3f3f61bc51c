//! Tenants and authenticated sessions against a real target on loopback: who may open a
//! session, what each tenant may touch, and what a forged, altered or replayed datagram gets
//! (nothing executed, memory compared).

mod common;

use std::net::UdpSocket;
use std::time::Duration;

use netdam_auth::{Credentials, SessionKeys, TenantKey, TRAILER_BYTES};
use netdam_initiator::client::{Client, ClientOptions};
use netdam_initiator::error::ClientError;
use netdam_initiator::session::SessionConfig;
use netdam_isa::control::SessionLimitKind;
use netdam_isa::wire::{mark_sealed, peek_datagram_status, peek_is_sealed, Instruction, RequestBuilder, Response};
use netdam_isa::{Opcode, Status};
use netdam_target::config::AuthMode;
use netdam_target::tenants::{GrantRecord, GrantSpace, QosClass, TenantLimits, TenantRecord, TenantSnapshot};

const REGION: u64 = 1 << 20;

fn key(byte: u8) -> TenantKey {
    TenantKey::from_bytes([byte; 32])
}

fn record(name: &str, id: u32, key_byte: u8, grants: Vec<GrantRecord>) -> TenantRecord {
    TenantRecord {
        name: name.into(),
        id,
        key_version: 1,
        key_hex: key(key_byte).to_hex(),
        class: Default::default(),
        limits: Default::default(),
        grants,
    }
}

fn grant(space: GrantSpace, permissions: &[&str], range: Option<(u64, u64)>) -> GrantRecord {
    GrantRecord { space, permissions: permissions.iter().map(|name| name.to_string()).collect(), range }
}

/// Alice may read and write the first half of "shared" and do anything to "alice"; Bob may
/// only read "shared"; root may do anything anywhere.
fn records() -> Vec<TenantRecord> {
    vec![
        record(
            "alice",
            1,
            0xA1,
            vec![
                grant(GrantSpace::Region("alice".into()), &["all"], None),
                grant(GrantSpace::Region("shared".into()), &["read", "write", "atomic"], Some((0, REGION / 2))),
            ],
        ),
        record("bob", 2, 0xB0, vec![grant(GrantSpace::Region("shared".into()), &["read"], None)]),
        record("root", 3, 0x77, vec![grant(GrantSpace::All, &["all"], None)]),
    ]
}

fn start() -> common::TestTarget {
    let regions = vec![common::region("alice", REGION, false), common::region("shared", REGION, false)];
    let target = common::start_configured(regions, |config| config.auth = AuthMode::Tenants);
    publish(&target, &records());
    target
}

/// As [`start`] with no tenant published yet, its sessions ending after 1 s of silence.
fn start_expiring() -> common::TestTarget {
    let regions = vec![common::region("alice", REGION, false), common::region("shared", REGION, false)];
    common::start_configured(regions, |config| {
        config.auth = AuthMode::Tenants;
        config.session_idle_timeout_ms = 1_000;
    })
}

fn publish(target: &common::TestTarget, records: &[TenantRecord]) {
    let (snapshot, warnings) = TenantSnapshot::resolve(records, target.target.regions(), target.target.namespaces());
    assert!(warnings.is_empty(), "{warnings:?}");
    target.target.tenants().publish(snapshot);
}

fn credentials(tenant: u32, key_byte: u8) -> Credentials {
    Credentials { tenant, key_version: 1, key: key(key_byte) }
}

fn client(target: &common::TestTarget, credentials: Option<Credentials>) -> Result<Client, ClientError> {
    // Refusals are what these tests look at: none is waited out.
    let session = SessionConfig {
        credentials,
        max_attempts: 3,
        min_patience: netdam_isa::Duration::ZERO,
        session_wait: netdam_isa::Duration::ZERO,
        ..Default::default()
    };
    Client::connect_with(target.target.local_addr(), ClientOptions { session, ..Default::default() })
}

fn refused(result: Result<Client, ClientError>) -> Status {
    match result {
        Err(ClientError::HelloRefused(status)) => status,
        Err(ClientError::SessionLimit { .. }) => Status::SessionLimit,
        Err(other) => panic!("expected a refused HELLO, got {other}"),
        Ok(_) => panic!("expected a refused HELLO, got a session"),
    }
}

fn stat(target: &common::TestTarget, name: &str) -> u64 {
    target.target.stats().get(name).unwrap_or_else(|| panic!("no STAT entry {name}"))
}

#[test]
fn only_a_tenant_with_its_current_key_gets_a_session() {
    let target = start();
    assert_eq!(refused(client(&target, None)), Status::Unauthenticated, "no key");
    assert_eq!(refused(client(&target, Some(credentials(1, 0xB0)))), Status::Unauthenticated, "bob's key as alice");
    assert_eq!(refused(client(&target, Some(credentials(9, 0xA1)))), Status::Unauthenticated, "unknown tenant");
    let old_version = Credentials { key_version: 2, ..credentials(1, 0xA1) };
    assert_eq!(refused(client(&target, Some(old_version))), Status::Unauthenticated, "another key version");
    assert!(stat(&target, "hello_unauthenticated") >= 4);
    let mut alice = client(&target, Some(credentials(1, 0xA1))).expect("alice's key opens a session");
    alice.write(0, 0, b"alice was here").unwrap();
    let mut back = [0u8; 14];
    alice.read(0, 0, &mut back).unwrap();
    assert_eq!(&back, b"alice was here");
    // The counters are for admins: a sessionless STAT is refused, an admin's session STATs.
    let error = Client::sessionless(target.target.local_addr()).unwrap().stat().unwrap_err();
    assert!(matches!(error, ClientError::DatagramRefused(Status::Unauthenticated)), "{error}");
    let error = alice.stat().unwrap_err();
    assert!(matches!(error, ClientError::Refused { status: Status::PermissionDenied, .. }), "{error:?}");
    let mut root = client(&target, Some(credentials(3, 0x77))).unwrap();
    assert!(root.stat().unwrap().iter().any(|(name, _)| name == "sessions_open"));
}

#[test]
fn every_instruction_is_checked_against_the_tenants_grants_and_touches_nothing_when_refused() {
    let target = start();
    let mut root = client(&target, Some(credentials(3, 0x77))).unwrap();
    let mut alice = client(&target, Some(credentials(1, 0xA1))).unwrap();
    let mut bob = client(&target, Some(credentials(2, 0xB0))).unwrap();
    let (alice_region, shared) = (alice.region("alice").unwrap().id, alice.region("shared").unwrap().id);
    let pattern: Vec<u8> = (0..4096u32).map(|index| (index % 251) as u8).collect();
    root.write(shared, 0, &pattern).unwrap();
    root.write(shared, REGION - 4096, &pattern).unwrap();
    root.write(alice_region, 0, &pattern).unwrap();
    let denied = |result: Result<(), ClientError>| {
        matches!(result, Err(ClientError::Refused { status: Status::PermissionDenied, .. }))
    };
    // Bob reads "shared" but may not change it, nor see "alice".
    let mut back = vec![0u8; 4096];
    bob.read(shared, 0, &mut back).unwrap();
    assert_eq!(back, pattern);
    assert!(denied(bob.write(shared, 0, b"bob")));
    assert!(denied(bob.fill(shared, 0, 64, 0xFF)));
    assert!(denied(bob.fetch_add(shared, 8, 1).map(|_| ())));
    assert!(denied(bob.cas(shared, 8, 0, 1).map(|_| ())));
    assert!(denied(bob.read(alice_region, 0, &mut back)));
    assert!(denied(bob.crc32(alice_region, 0, 64).map(|_| ())));
    // Alice holds the first half of "shared" only.
    alice.write(shared, 4096, b"inside").unwrap();
    assert!(denied(alice.write(shared, REGION - 4096, b"outside")));
    assert!(denied(alice.read(shared, REGION / 2 - 2, &mut back[..4])), "straddles the grant's end");
    assert!(denied(alice.fill(shared, REGION / 2, 64, 0)));
    // MEMCPY needs read on the source and write on the destination.
    assert!(denied(alice.memcpy(shared, 0, shared, REGION - 4096, 64)), "source outside her grant");
    assert!(denied(bob.memcpy(shared, 0, alice_region, 0, 64)), "bob may not read alice's region");
    alice.memcpy(alice_region, 8192, shared, 0, 64).unwrap();
    // Nothing refused changed anything.
    root.read(shared, REGION - 4096, &mut back).unwrap();
    assert_eq!(back, pattern, "the second half of shared is untouched");
    root.read(shared, 0, &mut back).unwrap();
    assert_eq!(back[..4096], pattern[..], "bob's refused writes left the first block alone");
    let mut copied = vec![0u8; 64];
    root.read(alice_region, 8192, &mut copied).unwrap();
    assert_eq!(copied, pattern[..64], "alice's own MEMCPY ran");
}

#[test]
fn a_revoked_grant_or_a_rotated_key_applies_to_live_sessions() {
    let target = start();
    let mut alice = client(&target, Some(credentials(1, 0xA1))).unwrap();
    let shared = alice.region("shared").unwrap().id;
    alice.write(shared, 0, b"before").unwrap();
    // Revoke: the next instruction of the same session is refused.
    let mut revoked = records();
    revoked[0].grants.retain(|grant| grant.space != GrantSpace::Region("shared".into()));
    publish(&target, &revoked);
    assert!(matches!(
        alice.write(shared, 0, b"after"),
        Err(ClientError::Refused { status: Status::PermissionDenied, .. })
    ));
    // Rotate: the session ends, and the old key opens none.
    let mut rotated = revoked.clone();
    rotated[0].key_version = 2;
    rotated[0].key_hex = key(0xA2).to_hex();
    publish(&target, &rotated);
    let error = alice.write(0, 0, b"x").unwrap_err();
    assert!(matches!(error, ClientError::HelloRefused(Status::Unauthenticated)), "{error}");
    assert!(stat(&target, "sessions_ended_by_tenant_change") >= 1);
    let new_key = Credentials { tenant: 1, key_version: 2, key: key(0xA2) };
    client(&target, Some(new_key)).expect("the rotated key opens a session").write(0, 0, b"x").unwrap();
}

/// A tenant is told of the spaces it holds a grant on, and of every space if it holds `admin`:
/// nothing about a space outside its grants, not even its name. A session whose later HELLO no
/// longer lists a space it was told of (its grant revoked while the session was lost) sends
/// nothing more that names a space: its client cannot tell a revoked grant from a renumbering
/// that gave the id to another space. A new client, once the grant is back, is served.
#[test]
fn a_hello_lists_only_the_spaces_granted_and_a_session_told_of_a_space_no_longer_listed_stops() {
    let target = start_expiring();
    let mut tenants = records();
    tenants.push(record("keys-only", 4, 0x44, vec![grant(GrantSpace::All, &["encrypt", "decrypt"], None)]));
    tenants.push(record("nothing", 5, 0x55, Vec::new()));
    tenants.push(record("admin-only", 6, 0x66, vec![grant(GrantSpace::All, &["admin"], None)]));
    publish(&target, &tenants);
    let listed = |tenant: u32, key_byte: u8| {
        let client = client(&target, Some(credentials(tenant, key_byte))).unwrap();
        let names: Vec<(u16, String)> =
            client.info().hello.regions.iter().map(|region| (region.id, region.name.clone())).collect();
        names
    };
    let both = vec![(0, "alice".to_string()), (1, "shared".to_string())];
    assert_eq!(listed(1, 0xA1), both, "alice holds grants on both");
    assert_eq!(listed(2, 0xB0), [(1, "shared".to_string())], "bob holds one on shared only, listed by its own id");
    assert_eq!(listed(3, 0x77), both, "root holds all");
    assert_eq!(listed(4, 0x44), [], "key slots are no region");
    assert_eq!(listed(5, 0x55), [], "no grant, no space");
    assert_eq!(listed(6, 0x66), both, "an admin sees every space");

    let mut bob = client(&target, Some(credentials(2, 0xB0))).unwrap();
    let mut word = [0u8; 8];
    bob.read(1, 0, &mut word).unwrap();
    let mut revoked = tenants.clone();
    revoked[1].grants.clear();
    publish(&target, &revoked);
    // Silent past the idle timeout: the session ends; the next request opens another, whose
    // HELLO lists no region.
    std::thread::sleep(Duration::from_millis(1_500));
    let error = bob.read(1, 0, &mut word).unwrap_err();
    assert!(matches!(&error, ClientError::SpacesChanged(what) if what.contains("\"shared\"")), "{error}");
    assert!(stat(&target, "sessions_expired") >= 1, "the session did end");
    publish(&target, &tenants);
    let still = bob.read(1, 0, &mut word).unwrap_err();
    assert!(matches!(still, ClientError::SpacesChanged(_)), "the session stays stopped: {still}");
    let mut again = client(&target, Some(credentials(2, 0xB0))).unwrap();
    again.read(1, 0, &mut word).expect("granted again, a new client reads");
}

/// A raw authenticated session: what a client does, by hand, so datagrams can be forged.
struct Raw {
    socket: UdpSocket,
    session: u32,
    keys: SessionKeys,
    counter: u64,
}

fn request(session: u32, sequence: u64, instruction: &Instruction<'_>) -> Vec<u8> {
    let mut buffer = vec![0u8; 9000];
    let mut builder = RequestBuilder::new(&mut buffer, session, sequence).unwrap();
    builder.push(instruction).unwrap();
    let len = builder.finish();
    buffer.truncate(len);
    buffer
}

fn receive(socket: &UdpSocket) -> Option<Vec<u8>> {
    let mut answer = vec![0u8; 65536];
    socket.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    socket.recv(&mut answer).ok().map(|len| answer[..len].to_vec())
}

impl Raw {
    fn open(target: &common::TestTarget, tenant: u32, key_byte: u8) -> Raw {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        socket.connect(target.target.local_addr()).unwrap();
        let (session, keys) = common::auth_hello(&socket, tenant, &key(key_byte));
        Raw { socket, session, keys, counter: 0 }
    }

    fn sealed(&mut self, session: u32, sequence: u64, instruction: &Instruction<'_>) -> Vec<u8> {
        let mut datagram = request(session, sequence, instruction);
        let len = datagram.len();
        mark_sealed(&mut datagram);
        datagram.resize(len + TRAILER_BYTES, 0);
        netdam_auth::trailer::seal(&self.keys.request, self.counter, &mut datagram, len).unwrap();
        self.counter += 1;
        datagram
    }

    /// Sends `datagram`; the first result's status and data of a verified answer, `None` for
    /// no answer.
    fn exchange(&self, datagram: &[u8]) -> Option<(Status, Vec<u8>)> {
        self.socket.send(datagram).unwrap();
        let mut answer = receive(&self.socket)?;
        // A block request that waits 5 ms or more (a loaded machine) earns in-progress notices
        // first: not the answer.
        while peek_datagram_status(&answer) == Some(Status::InProgress as u8) {
            answer = receive(&self.socket)?;
        }
        if !peek_is_sealed(&answer) {
            let response = Response::parse(&answer).unwrap();
            return Some((response.status(), Vec::new()));
        }
        let len = netdam_auth::trailer::open(&self.keys.response, &answer).expect("answers are sealed with our key");
        let response = Response::parse_opened(&answer[..len]).unwrap();
        if response.status() != Status::Ok {
            return Some((response.status(), Vec::new()));
        }
        let result = response.results().next().unwrap();
        Some((result.status, result.data.to_vec()))
    }
}

fn fetch_add(space: u16, offset: u64, addend: &[u8; 8]) -> Instruction<'_> {
    Instruction { opcode: Opcode::FetchAdd as u8, flags: 0, space, offset, length: 8, aux: 0, operand: addend }
}

#[test]
fn forged_altered_unsealed_and_replayed_datagrams_execute_nothing() {
    let target = start();
    let mut root = client(&target, Some(credentials(3, 0x77))).unwrap();
    let mut raw = Raw::open(&target, 1, 0xA1);
    let one = 1u64.to_le_bytes();
    let add = fetch_add(0, 64, &one);
    let counter = |root: &mut Client| {
        let mut word = [0u8; 8];
        root.read(0, 64, &mut word).unwrap();
        u64::from_le_bytes(word)
    };
    // A good one executes.
    let good = raw.sealed(raw.session, 1, &add);
    assert_eq!(raw.exchange(&good), Some((Status::Ok, 0u64.to_le_bytes().to_vec())));
    assert_eq!(counter(&mut root), 1);
    // Replayed: the stored answer, not a second add.
    assert_eq!(raw.exchange(&good), Some((Status::Ok, 0u64.to_le_bytes().to_vec())));
    assert_eq!(counter(&mut root), 1);
    // Every single-bit change anywhere is dropped unanswered.
    let dropped_before = stat(&target, "dropped_bad_mac");
    let fresh = raw.sealed(raw.session, 2, &add);
    for bit in [0usize, 8 * 5, 8 * 9, 8 * 40, 8 * (fresh.len() - 20), 8 * fresh.len() - 1] {
        let mut altered = fresh.clone();
        altered[bit / 8] ^= 1 << (bit % 8);
        let answer = raw.exchange(&altered);
        // A changed session id names no session of ours: `no_session`, unsealed, nothing run.
        assert!(answer.is_none() || answer == Some((Status::NoSession, Vec::new())), "bit {bit}: {answer:?}");
    }
    assert!(stat(&target, "dropped_bad_mac") >= dropped_before + 4);
    assert_eq!(counter(&mut root), 1, "no altered datagram executed");
    // The same datagram without its MAC (a CRC'd copy) is dropped too.
    let unsealed = request(raw.session, 3, &add);
    assert_eq!(raw.exchange(&unsealed), None);
    assert_eq!(counter(&mut root), 1);
    // Another session's datagram, from another socket: its MAC is not under that session's
    // keys, and the session is not the sender's.
    let mut other = Raw::open(&target, 1, 0xA1);
    let theirs = raw.sealed(other.session, 4, &add);
    other.socket.send(&theirs).unwrap();
    assert_eq!(receive(&other.socket), None, "another session's key does not open in this one");
    let spliced = other.sealed(raw.session, 5, &add);
    assert_eq!(raw.exchange(&spliced), None, "a datagram sealed by another session is dropped");
    assert_eq!(counter(&mut root), 1);
    // The fresh one still executes once.
    assert_eq!(raw.exchange(&fresh).map(|(status, _)| status), Some(Status::Ok));
    assert_eq!(counter(&mut root), 2);
    // A WRITE replayed after a newer WRITE gets its stored answer and does not undo the newer.
    let write = |data: &'static [u8]| Instruction {
        opcode: Opcode::Write as u8,
        flags: 0,
        space: 0,
        offset: 4096,
        length: data.len() as u32,
        aux: 0,
        operand: data,
    };
    let older = raw.sealed(raw.session, 10, &write(b"AAAA"));
    assert_eq!(raw.exchange(&older).map(|(status, _)| status), Some(Status::Ok));
    let newer = raw.sealed(raw.session, 11, &write(b"BBBB"));
    assert_eq!(raw.exchange(&newer).map(|(status, _)| status), Some(Status::Ok));
    assert_eq!(raw.exchange(&older).map(|(status, _)| status), Some(Status::Ok), "the stored answer");
    let mut bytes = [0u8; 4];
    root.read(0, 4096, &mut bytes).unwrap();
    assert_eq!(&bytes, b"BBBB", "a replayed WRITE ran again");
}

#[test]
fn a_datagram_replayed_after_a_restart_finds_no_session() {
    let regions = vec![common::region("alice", REGION, true), common::region("shared", REGION, false)];
    let first = common::start_configured(regions.clone(), |config| config.auth = AuthMode::Tenants);
    publish(&first, &records());
    let mut raw = Raw::open(&first, 1, 0xA1);
    let one = 1u64.to_le_bytes();
    let add = fetch_add(0, 0, &one);
    let datagram = raw.sealed(raw.session, 1, &add);
    assert_eq!(raw.exchange(&datagram).map(|(status, _)| status), Some(Status::Ok));
    let (addr, dir) = (first.target.local_addr(), first.dir);
    first.target.stop();
    let second = common::TestTarget {
        target: netdam_target::Target::start(&netdam_target::Config {
            listen: addr,
            metrics_listen: "127.0.0.1:0".parse().unwrap(),
            data_dir: Some(dir.path().to_path_buf()),
            workers: 1,
            poll: netdam_target::PollMode::Blocking,
            regions,
            pin_workers: false,
            lock_memory: false,
            ..netdam_target::Config::default()
        })
        .unwrap(),
        dir,
    };
    publish(&second, &records());
    assert_eq!(raw.exchange(&datagram), Some((Status::NoSession, Vec::new())));
    let mut root = client(&second, Some(credentials(3, 0x77))).unwrap();
    let mut word = [0u8; 8];
    root.read(0, 0, &mut word).unwrap();
    assert_eq!(u64::from_le_bytes(word), 1, "the replay did not add again after the restart");
}

#[test]
fn a_datagram_of_an_expired_session_finds_no_session_and_adds_nothing() {
    let target = start_expiring();
    publish(&target, &records());
    let mut raw = Raw::open(&target, 1, 0xA1);
    let one = 1u64.to_le_bytes();
    let add = fetch_add(0, 0, &one);
    let first = raw.sealed(raw.session, 1, &add);
    assert_eq!(raw.exchange(&first).map(|(status, _)| status), Some(Status::Ok));
    // Silent past the idle timeout: the session ends, and its keys with it.
    std::thread::sleep(Duration::from_millis(1_500));
    let late = raw.sealed(raw.session, 2, &add);
    assert_eq!(raw.exchange(&late), Some((Status::NoSession, Vec::new())));
    // Nor does the answered datagram, sent again, get its stored answer or run again.
    assert_eq!(raw.exchange(&first), Some((Status::NoSession, Vec::new())));
    assert!(stat(&target, "sessions_expired") >= 1);
    let mut root = client(&target, Some(credentials(3, 0x77))).unwrap();
    let mut word = [0u8; 8];
    root.read(0, 0, &mut word).unwrap();
    assert_eq!(u64::from_le_bytes(word), 1, "only the datagram sent while the session lived added");
}

#[test]
fn an_unauthenticated_target_refuses_to_listen_beyond_loopback_unless_forced() {
    let mut config = netdam_target::Config {
        listen: "0.0.0.0:0".parse().unwrap(),
        auth: AuthMode::None,
        ..netdam_target::Config::default()
    };
    let error = config.validate().unwrap_err().to_string();
    assert!(error.contains("allow_unauthenticated_network"), "{error}");
    config.allow_unauthenticated_network = true;
    config.validate().unwrap();
    config.auth = AuthMode::Tenants;
    config.allow_unauthenticated_network = false;
    config.validate().unwrap();
}

fn limited(name: &str, id: u32, key_byte: u8, class: QosClass, limits: TenantLimits) -> TenantRecord {
    TenantRecord {
        class,
        limits,
        ..record(name, id, key_byte, vec![grant(GrantSpace::Region("shared".into()), &["read", "write"], None)])
    }
}

fn scrape(target: &common::TestTarget) -> String {
    use std::io::{Read, Write};
    let addr = target.target.metrics_addr().expect("metrics are on in the test settings");
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: test\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text
}

fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series).and_then(|rest| rest.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no series {series} in /metrics"))
}

#[test]
fn a_tenant_gets_no_more_sessions_than_its_share() {
    let target = start();
    let mut tenants = records();
    tenants.push(limited(
        "capped",
        4,
        0xC4,
        QosClass::LatencyCritical,
        TenantLimits { max_sessions: 2, ..Default::default() },
    ));
    publish(&target, &tenants);
    let first = client(&target, Some(credentials(4, 0xC4))).unwrap();
    let _second = client(&target, Some(credentials(4, 0xC4))).unwrap();
    let over = client(&target, Some(credentials(4, 0xC4))).expect_err("a third session is refused");
    assert!(
        matches!(over, ClientError::SessionLimit { kind: SessionLimitKind::Tenant, limit: 2 }),
        "the answer names the tenant's limit: {over:?}"
    );
    assert!(over.to_string().contains("this tenant already holds its 2 sessions"), "{over}");
    // Another tenant is not affected, and a closed session gives its place back.
    client(&target, Some(credentials(2, 0xB0))).expect("bob still gets a session");
    first.close().unwrap();
    client(&target, Some(credentials(4, 0xC4))).expect("a closed session frees its share");
    let metrics = scrape(&target);
    assert_eq!(sample(&metrics, "netdam_tenant_sessions_refused_total{tenant=\"capped\"}"), 1.0);
}

#[test]
fn a_best_effort_tenant_over_its_rate_is_shed_and_a_latency_critical_one_is_not() {
    let target = start();
    let mut tenants = records();
    // 2,000 cost units a second, a burst of 40; a 64-byte READ costs 2 units.
    let rate = TenantLimits { cost_per_second: 2_000, burst: 40, ..Default::default() };
    tenants.push(limited("batch", 5, 0xBE, QosClass::BestEffort, rate));
    publish(&target, &tenants);
    let mut batch = Raw::open(&target, 5, 0xBE);
    let mut interactive = client(&target, Some(credentials(2, 0xB0))).unwrap();
    let shared = interactive.region("shared").unwrap().id;
    let read = Instruction {
        opcode: Opcode::Read as u8,
        flags: 0,
        space: shared,
        offset: 0,
        length: 64,
        aux: 0,
        operand: &[],
    };
    let started = std::time::Instant::now();
    let (mut executed, mut shed, mut sequence) = (0u64, 0u64, 0u64);
    let mut word = [0u8; 64];
    while started.elapsed() < Duration::from_millis(400) {
        sequence += 1;
        let datagram = batch.sealed(batch.session, sequence, &read);
        match batch.exchange(&datagram) {
            Some((Status::Ok, _)) => executed += 1,
            Some((Status::Busy, _)) => shed += 1,
            other => panic!("unexpected answer {other:?}"),
        }
        if sequence % 50 == 0 {
            // The latency-critical tenant, at a modest rate beside it, is never shed.
            interactive.read(shared, 0, &mut word).unwrap();
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    // What the bucket allows: its burst, then its rate (2 units per READ), with a little slack
    // for the instant the bucket was read.
    let allowed = (40.0 + 2_000.0 * elapsed) / 2.0 + 2.0;
    assert!(shed > 0, "the tenant asked for {sequence} READs in {elapsed:.2} s and none was shed");
    assert!((executed as f64) <= allowed, "{executed} executed, the bucket allows {allowed:.0} in {elapsed:.2} s");
    assert!(executed >= 20, "the burst at least executed: {executed}");
    assert_eq!(interactive.session_stats().busy, 0, "the latency-critical tenant got BUSY answers");
    let metrics = scrape(&target);
    let counted = sample(&metrics, "netdam_tenant_shed_total{tenant=\"batch\",reason=\"rate\"}");
    assert_eq!(counted, shed as f64, "every shed request is counted for its tenant");
    assert_eq!(sample(&metrics, "netdam_tenant_shed_total{tenant=\"bob\",reason=\"rate\"}"), 0.0);
    // Its BUSY answers are its share spent, not a standing queue: an alert on queueing must not
    // take a rate-limited tenant for an overloaded target.
    assert_eq!(sample(&metrics, "netdam_busy_answers_total{reason=\"tenant_rate\"}"), shed as f64);
    assert_eq!(sample(&metrics, "netdam_busy_answers_total{reason=\"queueing\"}"), 0.0, "shedding counted as queueing");
    assert_eq!(stat(&target, "busy_tenant_rate"), shed);
    assert_eq!(stat(&target, "answered_busy"), 0, "STAT answered_busy counts only a standing queue");
}

#[test]
fn hostile_authenticated_hellos_and_trailers_change_nothing_and_never_stop_the_target() {
    let target = start();
    let seed = common::seed();
    let mut rng = common::Rng::new(seed);
    let mut root = client(&target, Some(credentials(3, 0x77))).unwrap();
    let pattern = rng.bytes(REGION as usize);
    root.write(0, 0, &pattern).unwrap();
    root.write(1, 0, &pattern).unwrap();
    // Bob may only read: whatever his session's datagrams become, no byte may change.
    let mut bob = Raw::open(&target, 2, 0xB0);
    let attacker = UdpSocket::bind("127.0.0.1:0").unwrap();
    attacker.connect(target.target.local_addr()).unwrap();
    // A real cookie for the attacker's address, so its HELLOs reach the authentication check.
    let first = netdam_isa::control::encode_hello_operand_with(
        &netdam_isa::control::HelloRequest { max_datagram_bytes: 9000, cookie: [0; 24] },
        netdam_isa::control::HELLO_AUTH_MAC,
        &[0; 64],
    );
    let hello =
        Instruction { opcode: Opcode::Hello as u8, flags: 0, space: 0, offset: 0, length: 0, aux: 0, operand: &first };
    attacker.send(&request(0, 1, &hello)).unwrap();
    let answer = receive(&attacker).expect("a cookie");
    let valid_cookie: [u8; 24] =
        Response::parse(&answer).unwrap().results().next().unwrap().data.try_into().expect("a 24-byte cookie");
    let before = target.target.stats();
    let mut sent = 0u64;
    for sequence in 1..=6_000u64 {
        let kind = rng.below(6);
        let data_len = 1 + rng.below(64) as usize;
        let write_data = rng.bytes(data_len);
        let write = Instruction {
            opcode: [Opcode::Write, Opcode::Fill, Opcode::FetchAdd, Opcode::Read][rng.below(4) as usize] as u8,
            flags: 0,
            space: rng.below(3) as u16,
            offset: rng.below(REGION),
            length: write_data.len() as u32,
            aux: 0,
            operand: &write_data,
        };
        let datagram = match kind {
            // A sealed datagram of bob's, then a byte of it changed (header, body or trailer).
            0 | 1 => {
                let mut sealed = bob.sealed(bob.session, sequence, &write);
                let at = rng.below(sealed.len() as u64) as usize;
                sealed[at] ^= 1 + rng.below(255) as u8;
                sealed
            }
            // Bob's own, unchanged: executed (refused by his grant where it writes).
            2 => bob.sealed(bob.session, sequence, &write),
            // A HELLO with the MAC method and a random area (random tenant, proof), or a random
            // method byte.
            3 => {
                let mut cookie = valid_cookie;
                if rng.below(4) == 0 {
                    cookie.copy_from_slice(&rng.bytes(24));
                }
                let mut area = [0u8; 64];
                area.copy_from_slice(&rng.bytes(64));
                if rng.below(4) != 0 {
                    // Reserved bytes zero: the proof itself is checked (tenant 1 to 4 exist).
                    area[56..].fill(0);
                    area[..4].copy_from_slice(&(rng.below(6) as u32).to_le_bytes());
                }
                let method = if rng.below(4) == 0 { rng.next_u64() as u8 } else { netdam_isa::control::HELLO_AUTH_MAC };
                let operand = netdam_isa::control::encode_hello_operand_with(
                    &netdam_isa::control::HelloRequest { max_datagram_bytes: 9000, cookie },
                    method,
                    &area,
                );
                request(0, sequence, &Instruction { operand: &operand, ..hello })
            }
            // Random bytes behind a sealed header naming bob's session or a random one.
            _ => {
                let mut bytes = request(bob.session, sequence, &write);
                bytes[3] |= 0x02;
                if rng.below(2) == 0 {
                    bytes[4..8].copy_from_slice(&(rng.next_u64() as u32).to_le_bytes());
                }
                let extra = rng.below(40) as usize;
                bytes.extend(rng.bytes(extra));
                bytes
            }
        };
        let socket = if kind == 3 { &attacker } else { &bob.socket };
        socket.send(&datagram).unwrap();
        sent += 1;
        // Drain without waiting: answers are not the point here, the target's state is.
        let mut sink = [0u8; 65536];
        socket.set_nonblocking(true).unwrap();
        while socket.recv(&mut sink).is_ok() {}
        socket.set_nonblocking(false).unwrap();
    }
    // The target still serves, and every region is as root wrote it.
    let mut back = vec![0u8; REGION as usize];
    for space in [0, 1] {
        root.read(space, 0, &mut back).unwrap();
        assert!(back == pattern, "SEED={seed}: region {space} changed under hostile datagrams");
    }
    let after = target.target.stats();
    let delta = |name: &str| after.get(name).unwrap() - before.get(name).unwrap();
    assert!(delta("datagrams_received") >= sent, "SEED={seed}: the target saw every datagram");
    assert!(delta("dropped_bad_mac") > 0, "SEED={seed}: no altered datagram was refused");
    let counts: Vec<(&str, u64)> = [
        "cookies_sent",
        "hello_bad_cookie",
        "hello_expired_cookie",
        "answered_malformed",
        "answered_no_session",
        "responses_sent",
        "datagrams_received",
        "dropped_bad_mac",
        "dropped_unsealed",
        "answered_busy",
        "instructions_executed",
    ]
    .iter()
    .map(|name| (*name, delta(name)))
    .collect();
    assert!(delta("hello_unauthenticated") > 0, "SEED={seed}: no HELLO was refused unauthenticated: {counts:?}");
    assert_eq!(delta("sessions_opened"), 0, "SEED={seed}: a HELLO without the key opened a session");
}

/// Every opcode group outside a tenant's grant: each instruction is refused `permission_denied`
/// and nothing changes in any region or namespace; the same instruction with one byte of its
/// datagram changed gets no answer at all.
#[test]
fn every_opcode_group_is_refused_outside_the_grant_and_a_forged_one_is_dropped() {
    use netdam_isa::extension::reduce::{reduce_aux, ReduceOp, REDUCE_OPCODE};
    let dir = tempfile::tempdir().unwrap();
    let store = netdam_target::metadata::MetadataStore::open(dir.path()).unwrap();
    store.create_crypto_key(0, &netdam_target::crypto::generate_key().unwrap()).unwrap();
    drop(store);
    let regions = vec![common::region("alice", REGION, false), common::region("shared", REGION, false)];
    let target = common::start_configured_in(dir, regions, |config| {
        config.auth = AuthMode::Tenants;
        config.extensions = vec!["reduce".into()];
        config.namespaces = vec![netdam_target::config::NamespaceConfig {
            name: "disk".into(),
            backend: netdam_target::config::NamespaceBackend::File,
            path: "disk.img".into(),
            size: Some(netdam_target::config::ByteSize(1 << 20)),
            block_size: 4096,
        }];
    });
    let mut tenants = records();
    // Narrow may read the first 4 KiB of "shared" and read blocks 0..16 of "disk", nothing else.
    tenants.push(record(
        "narrow",
        6,
        0x66,
        vec![
            grant(GrantSpace::Region("shared".into()), &["read"], Some((0, 4096))),
            grant(GrantSpace::Namespace("disk".into()), &["read", "block"], Some((0, 16 * 4096))),
        ],
    ));
    publish(&target, &tenants);
    let mut root = client(&target, Some(credentials(3, 0x77))).unwrap();
    let mut rng = common::Rng::new(common::seed());
    let pattern = rng.bytes(REGION as usize);
    root.write(0, 0, &pattern).unwrap();
    root.write(1, 0, &pattern).unwrap();
    let disk = root.namespace("disk").unwrap().clone();
    let blocks = rng.bytes(64 * 4096);
    root.block_write(&disk, 0, &blocks, true).unwrap();
    let snapshot = |root: &mut Client| {
        let mut regions = vec![0u8; 2 * REGION as usize];
        root.read(0, 0, &mut regions[..REGION as usize]).unwrap();
        root.read(1, 0, &mut regions[REGION as usize..]).unwrap();
        let mut namespace = vec![0u8; 64 * 4096];
        root.block_read(&disk, 0, &mut namespace).unwrap();
        (regions, namespace)
    };
    let before = snapshot(&mut root);

    let word = 1u64.to_le_bytes();
    let cas = [0u8; 16];
    let lanes = [0u8; 64];
    let block = [7u8; 4096];
    let memcpy = {
        let mut operand = [0u8; 16];
        operand[0..2].copy_from_slice(&1u16.to_le_bytes());
        operand
    };
    let encrypt_operand = {
        let mut operand = Vec::new();
        netdam_isa::crypto::encode_operand(&mut operand, None, None, &[]);
        operand
    };
    let op = |opcode: u8, space: u16, offset: u64, length: u32, operand: &'static [u8]| Instruction {
        opcode,
        flags: 0,
        space,
        offset,
        length,
        aux: 0,
        operand,
    };
    let leak = |bytes: &[u8]| -> &'static [u8] { Box::leak(bytes.to_vec().into_boxed_slice()) };
    let (word, cas, lanes, block, memcpy) = (leak(&word), leak(&cas), leak(&lanes), leak(&block), leak(&memcpy));
    let encrypt_operand = leak(&encrypt_operand);
    let mut vadd = op(Opcode::Vadd as u8, 1, 0, 64, lanes);
    vadd.aux = netdam_isa::LaneType::F32 as u32;
    let reduce =
        Instruction { aux: reduce_aux(netdam_isa::LaneType::F32, ReduceOp::Sum), ..op(REDUCE_OPCODE, 0, 0, 64, &[]) };
    let mut fill = op(Opcode::Fill as u8, 1, 0, 64, &[]);
    fill.aux = 0xEE;
    let cases: Vec<(&str, Instruction<'_>)> = vec![
        ("READ outside the range", op(Opcode::Read as u8, 1, 4096, 64, &[])),
        ("READ of an ungranted region", op(Opcode::Read as u8, 0, 0, 64, &[])),
        ("WRITE without write", op(Opcode::Write as u8, 1, 0, 8, word)),
        ("FILL without write", fill),
        ("CAS without atomic", op(Opcode::Cas as u8, 1, 0, 8, cas)),
        ("FETCH_ADD without atomic", op(Opcode::FetchAdd as u8, 1, 0, 8, word)),
        ("MEMCPY into a read-only grant", op(Opcode::Memcpy as u8, 1, 64, 64, memcpy)),
        ("VADD without compute", vadd),
        ("CRC32 of an ungranted region", op(Opcode::Crc32 as u8, 0, 0, 64, &[])),
        ("REDUCE of an ungranted region", reduce),
        ("ENCRYPT without write", Instruction { aux: 0, ..op(Opcode::Encrypt as u8, 1, 0, 64, encrypt_operand) }),
        ("BREAD outside the range", op(Opcode::BlockRead as u8, 0, 16, 1, &[])),
        ("BWRITE without write", op(Opcode::BlockWrite as u8, 0, 0, 1, block)),
        ("TRIM without write", op(Opcode::Trim as u8, 0, 0, 1, &[])),
        ("WRITE_ZEROES without write", op(Opcode::WriteZeroes as u8, 0, 0, 1, &[])),
        ("BLOCK_STATUS outside the range", op(Opcode::BlockStatus as u8, 0, 20, 4, &[])),
    ];
    let mut narrow = Raw::open(&target, 6, 0x66);
    for (index, (name, instruction)) in cases.iter().enumerate() {
        let sequence = 2 * index as u64 + 1;
        let datagram = narrow.sealed(narrow.session, sequence, instruction);
        assert_eq!(
            narrow.exchange(&datagram).map(|(status, _)| status),
            Some(Status::PermissionDenied),
            "{name}: not refused"
        );
        // One byte of the instruction changed (its offset): the MAC no longer matches.
        let mut forged = narrow.sealed(narrow.session, sequence + 1, instruction);
        forged[32 + 8] ^= 0x01;
        assert_eq!(narrow.exchange(&forged), None, "{name}: a forged datagram was answered");
    }
    // What narrow may do still works, and nothing refused changed a byte anywhere.
    let allowed = narrow.sealed(narrow.session, 1000, &op(Opcode::Read as u8, 1, 0, 64, &[]));
    assert_eq!(narrow.exchange(&allowed).map(|(status, _)| status), Some(Status::Ok));
    let allowed = narrow.sealed(narrow.session, 1001, &op(Opcode::BlockRead as u8, 0, 15, 1, &[]));
    assert_eq!(narrow.exchange(&allowed).map(|(status, _)| status), Some(Status::Ok));
    assert!(snapshot(&mut root) == before, "a refused or forged instruction changed a region or the namespace");
}

#[test]
fn an_encrypted_session_hides_what_it_carries_and_works_as_any_other() {
    let target = start();
    let secret: &'static [u8] = b"a secret the network must not see";
    // Through the library, as users run it: memory and atomics in an encrypted session.
    let session = SessionConfig {
        credentials: Some(credentials(1, 0xA1)),
        encrypt: true,
        max_attempts: 3,
        min_patience: netdam_isa::Duration::ZERO,
        ..Default::default()
    };
    let options = ClientOptions { session, ..Default::default() };
    let mut alice = Client::connect_with(target.target.local_addr(), options).expect("an encrypted session");
    let shared = alice.region("shared").unwrap().id;
    alice.write(shared, 0, secret).unwrap();
    let mut back = vec![0u8; secret.len()];
    alice.read(shared, 0, &mut back).unwrap();
    assert_eq!(back, secret);
    assert_eq!(alice.fetch_add(shared, 4096, 5).unwrap(), 0);
    // On the wire: the same WRITE, encrypted by hand, does not show its bytes, and its answer
    // opens only by decrypting.
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.connect(target.target.local_addr()).unwrap();
    let (session_id, keys) = common::auth_hello_with(&socket, 1, &key(0xA1), netdam_isa::control::HELLO_AUTH_ENCRYPT);
    let write = Instruction {
        opcode: Opcode::Write as u8,
        flags: 0,
        space: shared,
        offset: 8192,
        length: secret.len() as u32,
        aux: 0,
        operand: secret,
    };
    let mut datagram = request(session_id, 1, &write);
    let len = datagram.len();
    mark_sealed(&mut datagram);
    datagram[3] |= netdam_isa::wire::FLAG_ENCRYPTED;
    datagram.resize(len + TRAILER_BYTES, 0);
    netdam_auth::trailer::seal_encrypted(&keys.request, 0, &mut datagram, len).unwrap();
    assert!(!datagram.windows(secret.len()).any(|window| window == secret), "the secret is on the wire");
    socket.send(&datagram).unwrap();
    let mut answer = receive(&socket).expect("an answer");
    assert!(netdam_isa::wire::peek_is_encrypted(&answer), "the answer is encrypted too");
    let opened = netdam_auth::trailer::open_encrypted(&keys.response, &mut answer).expect("it opens");
    let response = Response::parse_opened(&answer[..opened]).unwrap();
    assert_eq!(response.results().next().unwrap().status, Status::Ok);
    alice.read(shared, 8192, &mut back).unwrap();
    assert_eq!(back, secret, "the target wrote what was decrypted");
    // In an encrypted session a datagram with a MAC but in the clear is dropped.
    let mut clear = request(session_id, 2, &write);
    let len = clear.len();
    mark_sealed(&mut clear);
    clear.resize(len + TRAILER_BYTES, 0);
    netdam_auth::trailer::seal(&keys.request, 1, &mut clear, len).unwrap();
    socket.send(&clear).unwrap();
    assert_eq!(receive(&socket), None, "a clear datagram in an encrypted session was answered");
}

/// Two workers sum through "shared"; one tenant's grant ends halfway through the accumulator.
/// Its VADDs beyond the grant are refused, so it fails with `permission_denied`; it counts a
/// chunk only once the target has answered that it added it, and counts every chunk it did add.
/// So the other worker, run after it, finds exactly the first half counted twice and fails
/// `Incomplete` at the first chunk past the grant, instead of returning a sum without it.
#[test]
fn an_allreduce_worker_refused_part_of_the_accumulator_counts_nothing_it_did_not_add() {
    use netdam_initiator::allreduce::{allreduce, prepare, AllreduceError, AllreduceOp, AllreducePlan};
    let regions = vec![common::region("alice", REGION, false), common::region("shared", REGION, false)];
    let target = common::start_configured(regions, |config| config.auth = AuthMode::Tenants);
    publish(&target, &records());
    const LEN: usize = 256 << 10;
    let mut root = client(&target, Some(credentials(3, 0x77))).unwrap();
    let plan = AllreducePlan::new(&root, 1, 0, 2, LEN, netdam_isa::LaneType::I32, AllreduceOp::Sum).unwrap();
    assert_eq!(LEN / 2 % plan.chunk_bytes, 0, "the grant ends on a chunk boundary");
    let half = plan.accumulator() + LEN as u64 / 2;
    let mut records = records();
    records.push(record(
        "half",
        5,
        0x55,
        vec![grant(GrantSpace::Region("shared".into()), &["read", "write", "atomic", "compute"], Some((0, half)))],
    ));
    publish(&target, &records);
    prepare(&mut root, &plan).unwrap();
    // One after the other, so that no timing decides which chunks the first has counted.
    let run = |credentials: Credentials| {
        let mut worker = client(&target, Some(credentials)).unwrap();
        let buffer = vec![1u8; LEN];
        let mut result = vec![0u8; LEN];
        allreduce(&mut worker, &plan, &buffer, &mut result, Duration::from_millis(300)).map(|()| result)
    };
    let partial = run(credentials(5, 0x55));
    let full = run(credentials(3, 0x77));
    match partial {
        Err(AllreduceError::Client(ClientError::Refused { status: Status::PermissionDenied, .. })) => {}
        other => panic!("the worker short of its grant: expected permission_denied, got {other:?}"),
    }
    match full {
        Err(AllreduceError::Incomplete { first_byte, arrived, workers, .. }) => {
            assert_eq!((arrived, workers), (1, 2), "only the full worker counted the chunk");
            assert_eq!(first_byte, LEN / 2, "the first chunk short is the first past the grant");
        }
        Ok(_) => panic!("the full worker read a sum without the other worker's second half"),
        Err(other) => panic!("expected Incomplete, got {other}"),
    }
}
