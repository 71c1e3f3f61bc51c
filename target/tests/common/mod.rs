//! Helpers shared by the target's integration tests: a target on a loopback port with chosen
//! regions, and a seeded random source.

#![allow(dead_code)]

pub mod daemon;
pub mod durability;
pub mod slow_device;

use netdam_target::config::{ByteSize, Config, NamespaceConfig, PollMode, RegionBackend, RegionConfig};
use netdam_target::Target;

/// The `netdam` CLI built beside the target binary; says how to build it when it is missing.
pub fn netdam_binary() -> std::path::PathBuf {
    let netdam = std::path::PathBuf::from(env!("CARGO_BIN_EXE_netdam-target")).with_file_name("netdam");
    assert!(netdam.exists(), "{} is missing: build the workspace first (cargo build --workspace)", netdam.display());
    netdam
}

/// A running target and the directory its files live in (removed on drop).
pub struct TestTarget {
    pub target: Target,
    pub dir: tempfile::TempDir,
}

/// A region of `size` bytes: anonymous memory when `file` is false, else a file in the data dir.
pub fn region(name: &str, size: u64, file: bool) -> RegionConfig {
    RegionConfig {
        name: name.to_string(),
        backend: if file { RegionBackend::File } else { RegionBackend::Mem },
        path: file.then(|| format!("{name}.region").into()),
        size: ByteSize(size),
    }
}

/// Starts a target on 127.0.0.1 with an ephemeral port. Tests use blocking polling so that the
/// parallel test threads do not compete with spinning workers for the machine's cores.
pub fn start(regions: Vec<RegionConfig>, workers: usize, max_datagram_bytes: usize) -> TestTarget {
    start_with_namespaces(regions, Vec::new(), workers, max_datagram_bytes)
}

/// Like [`start`], also serving `namespaces` (their files under the temporary data directory).
pub fn start_with_namespaces(
    regions: Vec<RegionConfig>,
    namespaces: Vec<NamespaceConfig>,
    workers: usize,
    max_datagram_bytes: usize,
) -> TestTarget {
    start_configured(regions, |config| {
        config.namespaces = namespaces;
        config.workers = workers;
        config.max_datagram_bytes = max_datagram_bytes;
    })
}

/// Starts a target with the test settings of [`start`] (one worker, 9000-byte datagrams),
/// changed by `adjust`.
pub fn start_configured(regions: Vec<RegionConfig>, adjust: impl FnOnce(&mut Config)) -> TestTarget {
    start_configured_in(tempfile::tempdir().expect("temp dir"), regions, adjust)
}

/// Like [`start_configured`], with key slots `slots` created in the data directory first (keys
/// drawn as `netdam-target crypto-key create` draws them).
pub fn start_with_keys(regions: Vec<RegionConfig>, slots: &[u32], adjust: impl FnOnce(&mut Config)) -> TestTarget {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = netdam_target::metadata::MetadataStore::open(dir.path()).expect("metadata store");
    for &slot in slots {
        store.create_crypto_key(slot, &netdam_target::crypto::generate_key().unwrap()).unwrap();
    }
    drop(store);
    start_configured_in(dir, regions, adjust)
}

/// Like [`start_configured`], on the data directory `dir` (which the result keeps).
pub fn start_configured_in(
    dir: tempfile::TempDir,
    regions: Vec<RegionConfig>,
    adjust: impl FnOnce(&mut Config),
) -> TestTarget {
    let mut config = test_config(dir.path(), regions);
    adjust(&mut config);
    let target = Target::start(&config).expect("target starts");
    TestTarget { target, dir }
}

/// Starts a target with the test settings of [`start`] and a 1 MiB region "mem", also serving
/// `devices`: namespaces on test devices of the test's own.
pub fn start_with_devices(devices: Vec<netdam_target::namespaces::Namespace>) -> TestTarget {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = test_config(dir.path(), vec![region("mem", 1 << 20, false)]);
    let target = Target::start_with(&config, devices).expect("target starts");
    TestTarget { target, dir }
}

/// The settings of the test targets, with their files under `data_dir`.
pub fn test_config(data_dir: &std::path::Path, regions: Vec<RegionConfig>) -> Config {
    Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        // Metrics on, on any free port: tests and benchmarks run many targets at once.
        metrics_listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: Some(data_dir.to_path_buf()),
        workers: 1,
        poll: PollMode::Blocking,
        max_datagram_bytes: 9000,
        regions,
        // Tests run in parallel on few cores: a worker may wait milliseconds for a CPU, which is
        // not the overload these tests are about, so BUSY answers are kept out of their way.
        busy_threshold_us: 60_000,
        // Parallel tests would all pin their workers to the first CPU.
        pin_workers: false,
        // Many targets share one test process: leave its memory alone.
        lock_memory: false,
        // Tests of the instruction set itself; tests/auth.rs covers tenants.
        auth: netdam_target::config::AuthMode::None,
        ..Config::default()
    }
}

// Not every test file that includes this module draws random numbers.
#[allow(unused_imports)]
pub use netdam_isa::rng::Rng;

/// The seed for a randomized test: $NETDAM_SEED, or one drawn from the clock; printed first.
pub fn seed() -> u64 {
    let seed = std::env::var("NETDAM_SEED").ok().and_then(|text| text.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
    });
    println!("SEED={seed}");
    seed
}

/// Encodes a HELLO datagram (session 0) asking for 9000-byte datagrams with `cookie`.
#[allow(dead_code)] // not every test file that includes this module builds HELLOs by hand
pub fn hello_datagram(sequence: u64, cookie: &netdam_isa::control::Cookie) -> Vec<u8> {
    use netdam_isa::control::{encode_hello_operand, HelloRequest};
    use netdam_isa::wire::{Instruction, RequestBuilder};
    let operand = encode_hello_operand(&HelloRequest { max_datagram_bytes: 9000, cookie: *cookie });
    let mut buffer = [0u8; 256];
    let mut builder = RequestBuilder::new(&mut buffer, 0, sequence).unwrap();
    let hello = Instruction {
        opcode: netdam_isa::Opcode::Hello as u8,
        flags: 0,
        space: 0,
        offset: 0,
        length: 0,
        aux: 0,
        operand: &operand,
    };
    builder.push(&hello).unwrap();
    let len = builder.finish();
    buffer[..len].to_vec()
}

/// Opens a session over a raw socket with the two-step HELLO (a cookie, then the session; session
/// 0 may carry control instructions only); returns the session id.
pub fn hello(socket: &std::net::UdpSocket) -> u32 {
    try_hello(socket).unwrap_or_else(|status| panic!("HELLO refused: {status}"))
}

/// Like [`hello`], returning the status of a refused HELLO (`busy` answers are retried).
pub fn try_hello(socket: &std::net::UdpSocket) -> Result<u32, netdam_isa::Status> {
    use netdam_isa::control::{decode_hello_answer, Cookie, NO_COOKIE};
    use netdam_isa::wire::Response;
    use netdam_isa::Status;
    let mut cookie = NO_COOKIE;
    let mut sequence = u64::MAX / 2;
    let mut request = hello_datagram(sequence, &cookie);
    socket.send(&request).unwrap();
    let mut answer = vec![0u8; 65_536];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        assert!(std::time::Instant::now() < deadline, "no HELLO answer");
        let Ok(len) = socket.recv(&mut answer) else { continue };
        let Ok(response) = Response::parse(&answer[..len]) else { continue };
        if response.header.sequence != sequence {
            continue;
        }
        if response.status() == Status::Busy {
            // The datagram queued too long: nothing was executed, send it again.
            socket.send(&request).unwrap();
            continue;
        }
        let result = response.results().next().expect("HELLO result");
        match result.status {
            Status::Retry => {
                cookie = Cookie::try_from(result.data).expect("a retry answer carries a cookie");
                sequence += 1;
                request = hello_datagram(sequence, &cookie);
                socket.send(&request).unwrap();
            }
            Status::Ok => return Ok(decode_hello_answer(result.data).expect("HELLO answer decodes").session),
            other => return Err(other),
        }
    }
}

/// Opens an authenticated session over a raw socket, as a client does: a cookie, then a HELLO
/// proving `key` for `tenant` (key version 1); returns the session id and its keys. The answer
/// that opens the session must be sealed with the session's response key.
pub fn auth_hello(
    socket: &std::net::UdpSocket,
    tenant: u32,
    key: &netdam_auth::TenantKey,
) -> (u32, netdam_auth::SessionKeys) {
    auth_hello_with(socket, tenant, key, netdam_isa::control::HELLO_AUTH_MAC)
}

/// As [`auth_hello`], with authentication `method` (MAC, or MAC and encryption).
pub fn auth_hello_with(
    socket: &std::net::UdpSocket,
    tenant: u32,
    key: &netdam_auth::TenantKey,
    method: u8,
) -> (u32, netdam_auth::SessionKeys) {
    use netdam_isa::control::{decode_hello_answer, encode_hello_operand_with, Cookie, HelloRequest, NO_COOKIE};
    use netdam_isa::wire::{peek_is_sealed, Instruction, RequestBuilder, Response};
    use netdam_isa::{Opcode, Status};
    let hello = |cookie: Cookie, area: [u8; 64], sequence: u64| {
        let operand = encode_hello_operand_with(&HelloRequest { max_datagram_bytes: 9000, cookie }, method, &area);
        let instruction = Instruction {
            opcode: Opcode::Hello as u8,
            flags: 0,
            space: 0,
            offset: 0,
            length: 0,
            aux: 0,
            operand: &operand,
        };
        let mut buffer = vec![0u8; 512];
        let mut builder = RequestBuilder::new(&mut buffer, 0, sequence).unwrap();
        builder.push(&instruction).unwrap();
        let len = builder.finish();
        buffer.truncate(len);
        buffer
    };
    let mut answer = vec![0u8; 65536];
    socket.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
    socket.send(&hello(NO_COOKIE, [0; 64], u64::MAX / 2)).unwrap();
    let len = socket.recv(&mut answer).expect("a cookie");
    let response = Response::parse(&answer[..len]).unwrap();
    let result = response.results().next().unwrap();
    assert_eq!(result.status, Status::Retry);
    let cookie: Cookie = result.data.try_into().unwrap();
    let area = netdam_auth::HelloAuth::prove(key, tenant, 1, &cookie, method, 9000).unwrap();
    socket.send(&hello(cookie, area.encode(), u64::MAX / 2 + 1)).unwrap();
    let len = socket.recv(&mut answer).expect("a session");
    assert!(peek_is_sealed(&answer[..len]), "the answer that opens a session is sealed");
    // Its header names the new session, whose id the keys are derived with.
    let (named, _) = netdam_isa::wire::peek_session_sequence(&answer[..len]).unwrap();
    let keys = area.session_keys(key, &cookie, named);
    let opened = if netdam_isa::wire::peek_is_encrypted(&answer[..len]) {
        netdam_auth::trailer::open_encrypted(&keys.response, &mut answer[..len]).expect("sealed with the session's key")
    } else {
        netdam_auth::trailer::open(&keys.response, &answer[..len]).expect("sealed with the session's key")
    };
    let response = Response::parse_opened(&answer[..opened]).unwrap();
    let session = decode_hello_answer(response.results().next().unwrap().data).unwrap().session;
    assert_eq!(session, named, "the header names the session the answer opens");
    (session, keys)
}

/// Tenant `id` named `name` holding `grants`, its key drawn from its id ([`tenant_client`]
/// connects with it): for tests that publish tenants of their own.
// Not every test file that includes this module has tenants.
#[allow(dead_code)]
pub fn tenant_record(
    name: &str,
    id: u32,
    grants: Vec<netdam_target::tenants::GrantRecord>,
) -> netdam_target::tenants::TenantRecord {
    netdam_target::tenants::TenantRecord {
        name: name.into(),
        id,
        key_version: 1,
        key_hex: netdam_auth::TenantKey::from_bytes([id as u8; 32]).to_hex(),
        class: Default::default(),
        limits: Default::default(),
        grants,
    }
}

/// Makes `records` the tenants `target` knows (they must resolve without a warning).
#[allow(dead_code)]
pub fn publish_tenants(target: &Target, records: &[netdam_target::tenants::TenantRecord]) {
    let (snapshot, warnings) =
        netdam_target::tenants::TenantSnapshot::resolve(records, target.regions(), target.namespaces());
    assert!(warnings.is_empty(), "{warnings:?}");
    target.tenants().publish(snapshot);
}

/// A client of tenant `id` of [`tenant_record`] on `target`.
#[allow(dead_code)]
pub fn tenant_client(target: &Target, id: u32) -> netdam_initiator::Client {
    let credentials = netdam_auth::Credentials {
        tenant: id,
        key_version: 1,
        key: netdam_auth::TenantKey::from_bytes([id as u8; 32]),
    };
    let session = netdam_initiator::SessionConfig { credentials: Some(credentials), ..Default::default() };
    let options = netdam_initiator::ClientOptions { session, ..Default::default() };
    netdam_initiator::Client::connect_with(target.local_addr(), options).expect("the tenant's client connects")
}
