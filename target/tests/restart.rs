//! Restarts seen from the initiator: `netdam-target` (the binary) is killed with SIGKILL and
//! started again on the same port and data directory while a blocking `Client` and a `Volume`
//! (over `AsyncClient`s) keep requests in flight. What the initiator promises across a restart:
//!
//! - every session opens again against the new target (it knows none of the old ones and
//!   answers `no_session`; meanwhile the port refuses, which counts as loss, not as failure);
//! - idempotent requests (WRITE, READ, BWRITE, BREAD, FLUSH) in flight are retried and
//!   succeed: none of them fails;
//! - a FETCH_ADD whose outcome the restart left unknown fails as such (`SessionLost`, or
//!   `OutcomeUnknown` after its last attempt) and is never applied twice: the counter ends
//!   between the answered adds and the answered plus the unknown ones, and the answered adds
//!   returned distinct values below it. Eight are in flight at a time, so kills land among them.
//!
//! The region is persistent and the namespace's writes carry FUA, so every answered write is
//! read back after the last restart.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::daemon::{admin, start, START_TIMEOUT};
use netdam_initiator::{AsyncClient, Client, ClientError, ClientOptions, ClientPoll, Op, Volume, VolumeOptions};

const RESTARTS: usize = 3;
const REGION: &str = "restart-region";
const NAMESPACE: &str = "restart-disk";
const SLOTS: u64 = 64;
const SLOT_BYTES: usize = 1024;
const BLOCKS: u64 = 64;
const BLOCK_BYTES: usize = 4096;
/// FETCH_ADDs the blocking client keeps in flight together.
const ADDS_IN_FLIGHT: usize = 8;
/// The FETCH_ADD counter, after the slots.
const COUNTER: u64 = SLOTS * SLOT_BYTES as u64;
/// How long the clients wait for the target to come back: generous, since the test is about
/// what happens when it does (a loaded machine may take seconds to start it).
const PATIENCE: netdam_isa::Duration = netdam_isa::Duration::from_millis(120_000);
/// The target's config file, in the test's directory.
const CONFIG: &str = "restart.toml";

/// Writes the target's config file into `dir`: a free loopback port (returned; restarts keep
/// it), the directory as data directory, the test settings, then `rest` (settings and spaces).
fn write_config(dir: &std::path::Path, rest: &str) -> u16 {
    let port = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let common = format!(
        "listen = \"127.0.0.1:{port}\"\ndata_dir = \".\"\npoll = \"blocking\"\npin_workers = false\nlock_memory = false\n\
         busy_threshold_us = 60000\nauth = \"none\"\n"
    );
    std::fs::write(dir.join(CONFIG), common + rest).unwrap();
    port
}

/// Starts the target daemon in `dir` (metrics off) serving one file namespace, `NAMESPACE`, on
/// `file` of `size`.
fn start_with_one_namespace(dir: &std::path::Path, file: &str, size: &str) -> (common::daemon::Daemon, SocketAddr) {
    write_config(
        dir,
        &format!(
            "metrics_listen = \"off\"\n\
             [[namespace]]\nname = \"{NAMESPACE}\"\nbackend = \"file\"\npath = \"{file}\"\nsize = \"{size}\"\n"
        ),
    );
    let (daemon, addr, _) = start(dir, CONFIG);
    (daemon, addr)
}

fn patient_options() -> ClientOptions {
    let mut options = ClientOptions::default();
    options.session.min_patience = PATIENCE;
    options.session.reconnect_patience = PATIENCE;
    options
}

/// Bytes of version `version` of slot or block `index` (never all zeroes).
fn pattern(kind: u8, index: u64, version: u64, len: usize) -> Vec<u8> {
    let seed = (index << 40) ^ (version << 8) ^ u64::from(kind);
    (0..len as u64).map(|at| ((seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (at % 57)) as u8) ^ (at as u8) | 1).collect()
}

/// What the blocking client did.
#[derive(Debug, Default)]
struct SyncLog {
    /// Last answered version of each slot (0: never written).
    slots: Vec<u64>,
    writes: u64,
    adds_answered: u64,
    adds_unknown: u64,
    /// What the answered FETCH_ADDs returned: all distinct if none ran twice.
    adds_returned: Vec<u64>,
    sessions_lost: u64,
}

/// WRITEs to slots and FETCH_ADDs on the counter until `stop`; an idempotent request that
/// fails, or a FETCH_ADD that returns a value outside what the log allows, fails the test.
fn sync_load(addr: SocketAddr, stop: &AtomicBool, progress: &AtomicU64) -> Result<SyncLog, String> {
    let mut client = Client::connect_with(addr, patient_options()).map_err(|error| error.to_string())?;
    let region = client.region(REGION).map_err(|error| error.to_string())?.id;
    let mut log = SyncLog { slots: vec![0; SLOTS as usize], ..SyncLog::default() };
    let mut version = 0;
    while !stop.load(Ordering::SeqCst) {
        version += 1;
        let slot = version % SLOTS;
        let data = pattern(1, slot, version, SLOT_BYTES);
        client
            .write(region, slot * SLOT_BYTES as u64, &data)
            .map_err(|error| format!("WRITE of slot {slot} (version {version}) failed across a restart: {error}"))?;
        log.slots[slot as usize] = version;
        log.writes += 1;
        // Several FETCH_ADDs in flight at once, so that kills land among them.
        let tickets: Vec<_> = (0..ADDS_IN_FLIGHT)
            .map(|_| client.submit(&[Op::fetch_add(region, COUNTER, 1)]))
            .collect::<Result<_, _>>()
            .map_err(|error| format!("FETCH_ADD not submitted: {error}"))?;
        for ticket in tickets {
            match client.wait(ticket).and_then(|reply| Ok(u64::from_le_bytes(reply.data(0)?.try_into().unwrap()))) {
                Ok(old) => {
                    // Below every add made so far: none of them ran twice.
                    let bound = log.adds_answered + log.adds_unknown + ADDS_IN_FLIGHT as u64;
                    if old >= bound {
                        return Err(format!("FETCH_ADD returned {old}, beyond the {bound} adds ever sent"));
                    }
                    log.adds_returned.push(old);
                    log.adds_answered += 1;
                }
                Err(ClientError::SessionLost | ClientError::OutcomeUnknown { .. }) => log.adds_unknown += 1,
                Err(error) => return Err(format!("FETCH_ADD failed other than as of unknown outcome: {error}")),
            }
        }
        progress.fetch_add(1, Ordering::SeqCst);
    }
    log.sessions_lost = client.session_stats().sessions_lost;
    Ok(log)
}

/// FUA block writes over a two-session volume, each read back at once, until `stop`; returns
/// the last version of each block.
async fn volume_load(addr: SocketAddr, stop: Arc<AtomicBool>, progress: Arc<AtomicU64>) -> Result<Vec<u64>, String> {
    let options = VolumeOptions { sessions: 2, client: patient_options() };
    let volume = Volume::open(addr, NAMESPACE, options).await.map_err(|error| error.to_string())?;
    let mut blocks = vec![0; BLOCKS as usize];
    let mut version = 0;
    let mut back = vec![0u8; 2 * BLOCK_BYTES];
    while !stop.load(Ordering::SeqCst) {
        version += 1;
        let first = version % (BLOCKS - 1);
        let data: Vec<u8> = (first..first + 2).flat_map(|block| pattern(2, block, version, BLOCK_BYTES)).collect();
        let offset = first * BLOCK_BYTES as u64;
        volume.write(offset, &data, version % 2 == 0).await.map_err(|error| format!("BWRITE failed: {error}"))?;
        if version % 2 == 1 {
            volume.flush().await.map_err(|error| format!("FLUSH failed: {error}"))?;
        }
        volume.read(offset, &mut back).await.map_err(|error| format!("BREAD failed: {error}"))?;
        if back != data {
            return Err(format!("blocks {first}.. read back other bytes than version {version} just written"));
        }
        blocks[first as usize] = version;
        blocks[first as usize + 1] = version;
        progress.fetch_add(1, Ordering::SeqCst);
    }
    volume.close().await;
    Ok(blocks)
}

#[test]
fn clients_and_volumes_ride_out_target_restarts_under_load() {
    let began = Instant::now();
    let home = tempfile::tempdir().unwrap();
    let dir = home.path();
    // A free port, kept by every restart.
    let port = write_config(
        dir,
        "metrics_listen = \"127.0.0.1:0\"\nworkers = 2\n[[region]]\nname = \"scratch\"\nbackend = \"mem\"\nsize = \"1MiB\"\n",
    );
    admin(
        dir,
        CONFIG,
        &["region", "create", REGION, "--backend", "file", "--path", "restart.region", "--size", "1MiB"],
    );
    admin(
        dir,
        CONFIG,
        &["namespace", "create", NAMESPACE, "--backend", "file", "--path", "restart.img", "--size", "1MiB"],
    );
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();

    let (mut daemon, _, _) = start(dir, CONFIG);
    let stop = Arc::new(AtomicBool::new(false));
    let sync_progress = Arc::new(AtomicU64::new(0));
    let volume_progress = Arc::new(AtomicU64::new(0));
    let sync_runner = {
        let (stop, progress) = (stop.clone(), sync_progress.clone());
        std::thread::spawn(move || sync_load(addr, &stop, &progress))
    };
    let volume_runner = {
        let (stop, progress) = (stop.clone(), volume_progress.clone());
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
            runtime.block_on(volume_load(addr, stop, progress))
        })
    };
    // Each restart lands under load: both loads have made progress since the last one.
    let wait_for_progress = |since: (u64, u64)| {
        let deadline = Instant::now() + START_TIMEOUT;
        while sync_progress.load(Ordering::SeqCst) < since.0 + 20
            || volume_progress.load(Ordering::SeqCst) < since.1 + 20
        {
            assert!(!sync_runner.is_finished() && !volume_runner.is_finished(), "a load ended early");
            assert!(Instant::now() < deadline, "no progress after a restart within {START_TIMEOUT:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
        (sync_progress.load(Ordering::SeqCst), volume_progress.load(Ordering::SeqCst))
    };
    let mut seen = wait_for_progress((0, 0));
    for _ in 0..RESTARTS {
        daemon.kill();
        // Down for a moment: the port refuses what the clients retransmit meanwhile.
        std::thread::sleep(Duration::from_millis(300));
        (daemon, _, _) = start(dir, CONFIG);
        seen = wait_for_progress(seen);
    }
    stop.store(true, Ordering::SeqCst);
    let sync_log = sync_runner.join().expect("the blocking load panicked").unwrap_or_else(|error| panic!("{error}"));
    let blocks = volume_runner.join().expect("the volume load panicked").unwrap_or_else(|error| panic!("{error}"));
    assert!(
        sync_log.sessions_lost >= RESTARTS as u64,
        "the client opened its session again after each of {RESTARTS} restarts: {sync_log:?}"
    );

    // One more restart, then every answered write is there and the counter is exact.
    drop(daemon);
    let (_daemon, _, _) = start(dir, CONFIG);
    let mut verifier = Client::connect(addr).unwrap();
    let region = verifier.region(REGION).unwrap().id;
    let mut slot = vec![0u8; SLOT_BYTES];
    for (index, &version) in sync_log.slots.iter().enumerate() {
        verifier.read(region, index as u64 * SLOT_BYTES as u64, &mut slot).unwrap();
        let expected = if version == 0 { vec![0u8; SLOT_BYTES] } else { pattern(1, index as u64, version, SLOT_BYTES) };
        assert!(slot == expected, "slot {index} lost its answered version {version}");
    }
    let counter = verifier.fetch_add(region, COUNTER, 0).unwrap();
    let (low, high) = (sync_log.adds_answered, sync_log.adds_answered + sync_log.adds_unknown);
    assert!((low..=high).contains(&counter), "the counter holds {counter}, outside {low}..={high}");
    let mut returned = sync_log.adds_returned.clone();
    returned.sort_unstable();
    returned.dedup();
    assert_eq!(returned.len(), sync_log.adds_returned.len(), "two answered FETCH_ADDs returned the same value");
    assert!(returned.last().is_none_or(|&last| last < counter), "an answered FETCH_ADD returned more than the count");
    let disk = verifier.namespace(NAMESPACE).unwrap().clone();
    let mut back = vec![0u8; BLOCK_BYTES];
    for (index, &version) in blocks.iter().enumerate() {
        verifier.block_read(&disk, index as u64, &mut back).unwrap();
        // Each write covers two blocks; the later write of a pair overwrote the earlier one's.
        let expected =
            if version == 0 { vec![0u8; BLOCK_BYTES] } else { pattern(2, index as u64, version, BLOCK_BYTES) };
        assert!(back == expected, "block {index} lost its answered version {version}");
    }
    println!(
        "{RESTARTS} restarts under load in {:.1} s: {} WRITEs and {} FETCH_ADDs answered, {} FETCH_ADDs of unknown \
         outcome (counter {counter}), {} volume rounds (BWRITE + FLUSH or FUA + BREAD); sessions lost {}",
        began.elapsed().as_secs_f64(),
        sync_log.writes,
        sync_log.adds_answered,
        sync_log.adds_unknown,
        volume_progress.load(Ordering::SeqCst),
        sync_log.sessions_lost
    );
}

/// An `AsyncClient` that spins for the answer of a caller waiting for each one (`ClientPoll::
/// Adaptive`, as `netdam nbd` by default) meets a restarted target, in-process on the same
/// port, several times: the answer its spin reads is `no_session`, which queues a HELLO (and
/// then the request again). Those must go out. They once waited, unsent and with no timer
/// armed, for whatever event came next: an export's NBD client hung until another connection
/// sent something.
#[test]
fn a_spinning_async_client_says_hello_again_after_a_restart() {
    const ROUNDS: usize = 5;
    let regions = || vec![common::region("mem", 1 << 16, false)];
    let mut target = common::start(regions(), 1, 9000);
    let addr = target.target.local_addr();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let options = ClientOptions { poll: ClientPoll::Adaptive, ..patient_options() };
        let metrics = netdam_initiator::metrics::InitiatorMetrics::default().new_session();
        let client = AsyncClient::connect_observed(addr, options, Some(metrics.clone())).await.expect("connects");
        let space = client.region("mem").expect("region mem").id;
        for round in 0..ROUNDS as u8 {
            // One request at a time, so that the client spins for each answer. The spin is the
            // path under test (without it the answer is read after epoll); an answer slower than
            // the spin (a machine busy with other work) is read after epoll, so the writes go on
            // until one answer was spun for, 8 at least and 2,000 at most.
            let spun_before = metrics.answers_spun_for();
            for index in 0..2_000u32 {
                client.write(space, 0, &[round ^ index as u8; 64]).await.expect("a write before the restart");
                if index >= 7 && metrics.answers_spun_for() > spun_before {
                    break;
                }
            }
            assert!(metrics.answers_spun_for() > spun_before, "round {round}: the client never spun for an answer");
            drop(target);
            target = common::start_configured(regions(), |config| config.listen = addr);
            let read = tokio::time::timeout(Duration::from_secs(20), client.read(space, 0, 64)).await;
            let data = read
                .unwrap_or_else(|_| panic!("round {round}: no answer 20 s after the restart: the HELLO was never sent"))
                .expect("the read succeeds in the new session");
            // A new in-process target has new (anonymous) memory.
            assert_eq!(data, vec![0u8; 64], "round {round}");
        }
        client.close().await;
    });
}

/// A target whose host stops for seconds (SIGSTOP, as a paused VM) while a volume keeps 32
/// reads in flight: the reads are retried through the silence, none fails, and once the target
/// runs again the volume is back at work within seconds. By then Swift's window sits at its
/// minimum and the first answers carry the pause in their round trips; pacing at RTT / window
/// once held the next request for minutes, which hung `netdam nbd` for good.
#[test]
fn a_volume_rides_out_a_target_paused_for_seconds() {
    const PAUSE: Duration = Duration::from_secs(8);
    const READERS: usize = 32;
    const PAUSED_BLOCKS: u64 = 1024;
    let home = tempfile::tempdir().unwrap();
    let dir = home.path();
    let (daemon, addr) = start_with_one_namespace(dir, "paused.img", "4MiB");
    let signal = |signal| {
        // SAFETY: a signal to our own child, which has not been reaped (the daemon holds it).
        assert_eq!(unsafe { libc::kill(daemon.pid() as libc::pid_t, signal) }, 0);
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let options = VolumeOptions { sessions: 1, client: patient_options() };
        let volume = Arc::new(Volume::open(addr, NAMESPACE, options).await.expect("the volume opens"));
        let stop = Arc::new(AtomicBool::new(false));
        let reads = Arc::new(AtomicU64::new(0));
        let readers: Vec<_> = (0..READERS as u64)
            .map(|reader| {
                let (volume, stop, reads) = (volume.clone(), stop.clone(), reads.clone());
                tokio::spawn(async move {
                    let mut block = vec![0u8; BLOCK_BYTES];
                    let mut index = reader;
                    while !stop.load(Ordering::SeqCst) {
                        index = (index * 7 + 13) % PAUSED_BLOCKS;
                        volume
                            .read(index * BLOCK_BYTES as u64, &mut block)
                            .await
                            .map_err(|error| format!("a read failed across the pause: {error}"))?;
                        reads.fetch_add(1, Ordering::SeqCst);
                    }
                    Ok::<(), String>(())
                })
            })
            .collect();
        let until = |count: u64, within: Duration| {
            let reads = reads.clone();
            async move {
                let deadline = Instant::now() + within;
                while reads.load(Ordering::SeqCst) < count {
                    assert!(
                        Instant::now() < deadline,
                        "{} reads, not {count}, within {within:?}",
                        reads.load(Ordering::SeqCst)
                    );
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        };
        until(1_000, START_TIMEOUT).await;
        signal(libc::SIGSTOP);
        tokio::time::sleep(PAUSE).await;
        signal(libc::SIGCONT);
        let resumed = reads.load(Ordering::SeqCst);
        // Seconds, where the stall was minutes.
        until(resumed + 2_000, Duration::from_secs(20)).await;
        stop.store(true, Ordering::SeqCst);
        for reader in readers {
            reader.await.expect("a reader task").expect("every read succeeds");
        }
    });
    drop(daemon);
}

/// What the NBD export serves, a namespace by name, finds its namespace again when a restart
/// renumbered the namespaces (here listed the other way round; a `namespace delete` and a
/// restart does the same), and serves on with its new id: every write reaches the namespace it
/// was meant for, none the one that took its old id. A namespace of another size is not served
/// on: the request fails (EIO), naming the change.
#[test]
fn an_export_volume_finds_its_namespace_again_by_name_after_a_renumbering_restart() {
    use netdam_initiator::nbd::{BackendError, NbdBackend};
    use netdam_initiator::volume_by_name::VolumeByName;
    use netdam_target::config::{ByteSize, NamespaceBackend, NamespaceConfig};

    let namespace = |name: &str, size: u64| NamespaceConfig {
        name: name.into(),
        backend: NamespaceBackend::File,
        path: format!("{name}.img").into(),
        size: Some(ByteSize(size)),
        block_size: 4096,
    };
    let served = |dir: tempfile::TempDir, addr: Option<SocketAddr>, namespaces: Vec<NamespaceConfig>| {
        common::start_configured_in(dir, Vec::new(), |config| {
            config.namespaces = namespaces;
            if let Some(addr) = addr {
                config.listen = addr;
            }
        })
    };
    let common::TestTarget { target, dir } =
        served(tempfile::tempdir().unwrap(), None, vec![namespace("first", 1 << 20), namespace("second", 1 << 20)]);
    let addr = target.local_addr();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let options = VolumeOptions { sessions: 2, client: patient_options() };
    let volume = runtime.block_on(VolumeByName::open(addr, "second", options, None)).unwrap();
    let (before, after) = (pattern(1, 0, 1, 4096), pattern(1, 1, 1, 4096));
    runtime.block_on(volume.write(0, &before, true)).unwrap();
    drop(target);

    let common::TestTarget { target, dir } =
        served(dir, Some(addr), vec![namespace("second", 1 << 20), namespace("first", 1 << 20)]);
    runtime.block_on(volume.write(4096, &after, true)).expect("served on under the namespace's new id");
    let mut both = vec![0u8; 8192];
    runtime.block_on(volume.read(0, &mut both)).unwrap();
    assert_eq!((&both[..4096], &both[4096..]), (&before[..], &after[..]));
    let mut client = Client::connect(addr).unwrap();
    let first = client.namespace("first").unwrap().clone();
    let mut untouched = vec![1u8; 8192];
    client.block_read(&first, 0, &mut untouched).unwrap();
    assert!(untouched.iter().all(|&byte| byte == 0), "nothing reached the namespace that took the old id");
    drop(client);
    drop(target);

    // "second" on a new file of twice the size.
    let larger = NamespaceConfig { path: "second-larger.img".into(), ..namespace("second", 2 << 20) };
    let _target = served(dir, Some(addr), vec![namespace("first", 1 << 20), larger]);
    let error = runtime.block_on(volume.write(0, &after, true)).unwrap_err();
    assert!(
        matches!(&error, BackendError::Io(what) if what.contains("is now 512 blocks of 4096 bytes, not 256")),
        "{error}"
    );
    let soon = runtime.block_on(volume.write(0, &after, true)).unwrap_err();
    assert!(
        matches!(&soon, BackendError::Io(what) if what.contains("a moment ago")),
        "not looked for again at once: {soon}"
    );
    runtime.block_on(volume.close());
}

/// A target that comes back with its spaces numbered otherwise (here its two regions listed the
/// other way round; a `region delete` and a restart does the same): a live client's next
/// requests would address the other region by the id it was given. They fail instead, naming
/// the change, and nothing reaches the region that now holds the old id. A fio job and an NBD
/// export wrote into another namespace this way, reporting no error.
#[test]
fn a_client_does_not_address_another_space_after_a_restart_renumbered_them() {
    let listed = vec![common::region("alpha", 1 << 16, false), common::region("beta", 1 << 16, false)];
    let target = common::start(listed, 1, 9000);
    let addr = target.target.local_addr();
    let mut client = Client::connect_with(addr, patient_options()).unwrap();
    let beta = client.region("beta").unwrap().id;
    client.write(beta, 0, b"before").unwrap();
    drop(target);
    let swapped = vec![common::region("beta", 1 << 16, false), common::region("alpha", 1 << 16, false)];
    let target = common::start_configured(swapped, |config| config.listen = addr);
    let error = client.write(beta, 0, b"after").unwrap_err();
    assert!(matches!(error, ClientError::SpacesChanged(_)), "{error}");
    let text = error.to_string();
    assert!(text.contains("region 0 \"alpha\"") && text.contains("is now \"beta\""), "the first change: {text}");
    let again = client.read(beta, 0, &mut [0u8; 5]).unwrap_err();
    assert!(matches!(again, ClientError::SpacesChanged(_)), "every later request fails too: {again}");
    client.ping().expect("a PING names no space: it goes on");

    let mut fresh = Client::connect(addr).unwrap();
    assert_eq!(fresh.region("alpha").unwrap().id, beta, "the old id now names alpha");
    let mut alpha = [0u8; 5];
    fresh.read(beta, 0, &mut alpha).unwrap();
    assert_eq!(alpha, [0; 5], "nothing written into alpha");
    drop(target);
}

/// `netdam nbd` stops cleanly on SIGHUP (a closed terminal) as on SIGTERM, saying how long it
/// drains, unless SIGHUP was ignored when it started (`nohup`); while a request waits for a
/// target that does not answer (its host paused), a second SIGTERM ends the drain at once
/// instead of after its 30 s.
#[test]
fn the_export_stops_on_sighup_and_a_second_signal_ends_its_drain() {
    use std::io::{Read, Write};
    use std::os::unix::process::CommandExt;
    /// The export's process, killed if the test fails before it exits.
    struct Export(std::process::Child);
    impl Drop for Export {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let home = tempfile::tempdir().unwrap();
    let dir = home.path();
    let (daemon, addr) = start_with_one_namespace(dir, "drain.img", "1MiB");
    let socket = dir.join("drain.sock");
    let log = dir.join("export.log");
    let logged = || std::fs::read_to_string(&log).unwrap_or_default();
    // `ignore_hangup`: started as `nohup` starts it.
    let export = |ignore_hangup: bool| {
        let mut command = std::process::Command::new(common::netdam_binary());
        command
            .args(["--target", &addr.to_string(), "nbd", "--namespace", NAMESPACE, "--metrics-listen", "127.0.0.1:0"])
            .arg("--listen")
            .arg(format!("unix:{}", socket.display()))
            .env_remove("NETDAM_LOG")
            .env_remove("RUST_LOG")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        if ignore_hangup {
            // SAFETY: only async-signal-safe calls between fork and exec.
            unsafe {
                command.pre_exec(|| {
                    libc::signal(libc::SIGHUP, libc::SIG_IGN);
                    Ok(())
                });
            }
        }
        let child = Export(command.spawn().unwrap());
        let deadline = Instant::now() + START_TIMEOUT;
        while !logged().contains("exporting namespace") {
            assert!(Instant::now() < deadline, "netdam nbd did not start: {}", logged());
            std::thread::sleep(Duration::from_millis(20));
        }
        child
    };
    let signal = |pid: u32, signal| {
        // SAFETY: a signal to a child of this test that has not been reaped.
        assert_eq!(unsafe { libc::kill(pid as libc::pid_t, signal) }, 0);
    };
    let exited_within = |child: &mut Export, within: Duration| {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = child.0.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };

    let mut child = export(false);
    signal(child.0.id(), libc::SIGHUP);
    let status = exited_within(&mut child, Duration::from_secs(20)).expect("netdam nbd stopped on SIGHUP");
    assert!(status.success(), "{status:?}: {}", logged());
    assert!(logged().contains("stopping (SIGHUP): finishing the requests in flight for at most 30s"), "{}", logged());
    assert!(!socket.exists(), "the socket is removed as on any clean stop");

    // Under nohup the hangup is not taken: the export serves on until a SIGTERM.
    let mut child = export(true);
    signal(child.0.id(), libc::SIGHUP);
    assert!(exited_within(&mut child, Duration::from_secs(1)).is_none(), "a SIGHUP ignored at start: {}", logged());
    assert!(socket.exists());
    signal(child.0.id(), libc::SIGTERM);
    let status = exited_within(&mut child, Duration::from_secs(20)).expect("netdam nbd stopped on SIGTERM");
    assert!(status.success() && logged().contains("stopping (SIGTERM)"), "{status:?}: {}", logged());

    // A read in flight to a target whose host is paused: the drain would wait 30 s for it.
    let mut child = export(false);
    let metrics = logged()
        .split_whitespace()
        .find_map(|word| word.strip_prefix("metrics=http://"))
        .and_then(|rest| rest.split('/').next())
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no metrics address in the log: {}", logged()));
    let in_flight = || {
        let mut http = std::net::TcpStream::connect(&metrics).unwrap();
        http.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut page = String::new();
        http.read_to_string(&mut page).unwrap();
        page.lines()
            .find_map(|line| line.strip_prefix("netdam_nbd_requests_in_flight "))
            .and_then(|value| value.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let mut client = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    client.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut greeting = [0u8; 18];
    client.read_exact(&mut greeting).unwrap();
    assert_eq!(&greeting[..8], b"NBDMAGIC");
    // Fixed newstyle, no zeroes; NBD_OPT_EXPORT_NAME with the export's name (the namespace's).
    client.write_all(&3u32.to_be_bytes()).unwrap();
    let mut option = Vec::new();
    option.extend_from_slice(&0x4948_4156_454F_5054u64.to_be_bytes());
    option.extend_from_slice(&1u32.to_be_bytes());
    option.extend_from_slice(&(NAMESPACE.len() as u32).to_be_bytes());
    option.extend_from_slice(NAMESPACE.as_bytes());
    client.write_all(&option).unwrap();
    let mut export_info = [0u8; 10];
    client.read_exact(&mut export_info).unwrap();
    signal(daemon.pid(), libc::SIGSTOP);
    let mut read = Vec::new();
    read.extend_from_slice(&0x2560_9513u32.to_be_bytes());
    read.extend_from_slice(&0u16.to_be_bytes()); // flags
    read.extend_from_slice(&0u16.to_be_bytes()); // NBD_CMD_READ
    read.extend_from_slice(&7u64.to_be_bytes()); // cookie
    read.extend_from_slice(&0u64.to_be_bytes()); // offset
    read.extend_from_slice(&4096u32.to_be_bytes());
    client.write_all(&read).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while in_flight() < 1.0 {
        assert!(Instant::now() < deadline, "the read never reached the export: {}", logged());
        std::thread::sleep(Duration::from_millis(20));
    }
    signal(child.0.id(), libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !logged().contains("stopping (SIGTERM)") {
        assert!(Instant::now() < deadline, "no stopping line: {}", logged());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(exited_within(&mut child, Duration::from_secs(2)).is_none(), "it drains the read first: {}", logged());
    signal(child.0.id(), libc::SIGTERM);
    let status = exited_within(&mut child, Duration::from_secs(5)).expect("the second SIGTERM ends the drain at once");
    assert!(!status.success(), "a drain cut short is not a clean stop: {}", logged());
    assert!(logged().contains("stopped by a second SIGTERM"), "{}", logged());
    signal(daemon.pid(), libc::SIGCONT);
    drop(daemon);
}
