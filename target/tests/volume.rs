//! `Volume`: a namespace as one disk over several sessions, against a real target with several
//! workers; it rides out a restart of the target and the expiry of its idle sessions.

mod common;

use common::{region, seed, start_configured, Rng};
use netdam_initiator::nbd::codec::{STATE_HOLE, STATE_ZERO};
use netdam_initiator::{ClientError, Volume, VolumeOptions};
use netdam_isa::Status;
use netdam_target::config::{ByteSize, NamespaceBackend, NamespaceConfig};

const BLOCK: u32 = 4096;
const BLOCKS: u64 = 2048;

fn namespace(backend: NamespaceBackend, path: &str) -> NamespaceConfig {
    NamespaceConfig {
        name: "disk".into(),
        backend,
        path: path.into(),
        size: Some(ByteSize(BLOCKS * u64::from(BLOCK))),
        block_size: BLOCK,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// Random writes of up to 1 MiB (many transfers, over four sessions on two workers) checked
/// against a model by reads of random ranges; then FUA, flush, trim, write-zeroes, block status
/// and refusals.
fn verify(backend: NamespaceBackend, path: &str) {
    let test = start_configured(vec![region("mem", 1 << 20, false)], |config| {
        config.workers = 2;
        config.namespaces = vec![namespace(backend, path)];
    });
    let addr = test.target.local_addr();
    let mut rng = Rng::new(seed());
    let runtime = runtime();
    runtime.block_on(async {
        let options = VolumeOptions { sessions: 4, ..VolumeOptions::default() };
        let volume = Volume::open(addr, "disk", options).await.unwrap();
        assert_eq!((volume.size_bytes(), volume.block_bytes(), volume.session_count()), (BLOCKS * 4096, BLOCK, 4));
        let block = u64::from(BLOCK);
        let mut model = vec![0u8; (BLOCKS * block) as usize];
        for round in 0..60 {
            let blocks = 1 + rng.below(256);
            let first = rng.below(BLOCKS - blocks + 1);
            let data = rng.bytes((blocks * block) as usize);
            volume.write(first * block, &data, round % 3 == 0).await.unwrap();
            model[(first * block) as usize..((first + blocks) * block) as usize].copy_from_slice(&data);
            let blocks = 1 + rng.below(256);
            let first = rng.below(BLOCKS - blocks + 1);
            let mut back = vec![0u8; (blocks * block) as usize];
            volume.read(first * block, &mut back).await.unwrap();
            let range = (first * block) as usize..((first + blocks) * block) as usize;
            assert!(back == model[range], "round {round}: read differs from what was written");
        }
        volume.flush().await.unwrap();
        volume.trim(8 * block, 16 * block).await.unwrap();
        volume.write_zeroes(100 * block, 3 * block).await.unwrap();
        let mut back = vec![1u8; (16 * block) as usize];
        volume.read(8 * block, &mut back).await.unwrap();
        assert!(back.iter().all(|&byte| byte == 0), "trimmed blocks read as zeroes");
        let mut back = vec![1u8; (3 * block) as usize];
        volume.read(100 * block, &mut back).await.unwrap();
        assert!(back.iter().all(|&byte| byte == 0), "zeroed blocks read as zeroes");
        // Allocation: the trimmed range is a hole on a file; a pmem namespace cannot tell.
        if backend == NamespaceBackend::File {
            assert!(volume.reports_allocation());
            let trimmed = volume.block_status(8 * block, 16 * block).await.unwrap();
            assert_eq!(trimmed, [(16 * block, STATE_HOLE | STATE_ZERO)]);
            let size = volume.size_bytes();
            let covered: u64 = volume.block_status(0, size).await.unwrap().iter().map(|extent| extent.0).sum();
            assert!((block..=size).contains(&covered), "covers at least a block, at most the range");
        } else {
            assert!(!volume.reports_allocation());
            let refused = volume.block_status(0, block).await.unwrap_err();
            assert!(matches!(refused, ClientError::Refused { status: Status::NotSupported, .. }), "{refused}");
        }
        assert!(matches!(volume.block_status(100, block).await, Err(ClientError::Unaligned { .. })));
        let mut small = vec![0u8; 100];
        assert!(matches!(volume.read(0, &mut small).await, Err(ClientError::Unaligned { .. })));
        assert!(matches!(volume.write(100, &[0; 4096], false).await, Err(ClientError::Unaligned { .. })));
        let end = BLOCKS * block;
        assert!(matches!(volume.trim(end - block, 2 * block).await, Err(ClientError::BeyondEnd { .. })));
        let error = Volume::open(addr, "nope", VolumeOptions::default()).await.unwrap_err();
        assert!(error.to_string().contains("disk"), "the error lists what exists: {error}");
    });
    // Every session was closed when the volume (and the failed open's client) was dropped: the
    // I/O tasks send CLOSE on the runtime, which is still running.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let stats = test.target.stats();
        if stats.get("sessions_opened") == stats.get("sessions_closed") {
            assert_eq!(stats.get("sessions_opened"), Some(5), "four for the volume, one for the failed open");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "sessions left open: {stats:?}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    drop(runtime);
}

#[test]
fn a_volume_reads_what_it_wrote_on_a_file_namespace() {
    verify(NamespaceBackend::File, "disk.img");
}

#[test]
fn a_volume_reads_what_it_wrote_on_a_pmem_namespace() {
    verify(NamespaceBackend::Pmem, "disk.region");
}

/// Small requests submitted together share datagrams (the I/O task packs consecutive block
/// reads, and consecutive writes, while they fit), and each caller still gets its own result:
/// 32 concurrent 4 KiB writes of distinct patterns, then 32 concurrent reads, over one session.
#[test]
fn concurrent_small_requests_share_datagrams_and_each_gets_its_own_answer() {
    let test = start_configured(Vec::new(), |config| {
        config.namespaces = vec![namespace(NamespaceBackend::Pmem, "disk.region")];
    });
    let addr = test.target.local_addr();
    let counters = || {
        let stats = test.target.stats();
        (stats.get("datagrams_received").unwrap(), stats.get("instructions_executed").unwrap())
    };
    let pattern = |index: usize| vec![(index * 7 + 1) as u8; BLOCK as usize];
    // One thread: every request is submitted before the I/O task next runs.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let volume = std::sync::Arc::new(Volume::open(addr, "disk", VolumeOptions::default()).await.unwrap());
        let (datagrams_before, instructions_before) = counters();
        let mut writes = tokio::task::JoinSet::new();
        for index in 0..32 {
            let volume = volume.clone();
            writes.spawn(async move { volume.write(index as u64 * u64::from(BLOCK), &pattern(index), false).await });
        }
        while let Some(done) = writes.join_next().await {
            done.unwrap().unwrap();
        }
        let mut reads = tokio::task::JoinSet::new();
        for index in 0..32 {
            let volume = volume.clone();
            reads.spawn(async move {
                let mut back = vec![0u8; BLOCK as usize];
                volume.read(index as u64 * u64::from(BLOCK), &mut back).await.map(|()| (index, back))
            });
        }
        while let Some(done) = reads.join_next().await {
            let (index, back) = done.unwrap().unwrap();
            assert!(back == pattern(index), "read {index} got its own block back");
        }
        let (datagrams_after, instructions_after) = counters();
        let (datagrams, instructions) = (datagrams_after - datagrams_before, instructions_after - instructions_before);
        // Unpacked, a datagram carries one instruction at most; packed, two 4 KiB blocks share
        // one (retransmissions on a loaded machine add a few datagrams either way).
        assert!(instructions >= 64, "every request executed: {instructions}");
        assert!(instructions > datagrams, "requests share datagrams: {instructions} instructions in {datagrams}");
    });
}

/// A caller that waits for each answer before its next request (queue depth 1, as `qemu-io`
/// or a synchronous application through `netdam nbd`): with `ClientPoll::Adaptive` the session
/// spins for those answers instead of sleeping until they come, and every request still gets
/// its own answer; deeper callers and `Blocking` sessions never spin. A target that goes away
/// while the session spins is reported, not waited on forever.
#[test]
fn lone_requests_are_answered_while_the_session_spins_for_them() {
    use netdam_initiator::metrics::InitiatorMetrics;
    use netdam_initiator::ClientPoll;

    let test = start_configured(Vec::new(), |config| {
        config.namespaces = vec![namespace(NamespaceBackend::Pmem, "disk.region")];
    });
    let addr = test.target.local_addr();
    let spun_for = |metrics: &std::sync::Arc<InitiatorMetrics>| {
        let text = netdam_metrics::http::encode(
            &InitiatorMetrics::registry(metrics.clone()),
            netdam_metrics::http::Format::Prometheus,
        )
        .unwrap();
        assert!(text.contains("\nnetdam_initiator_answers_spun_for_total "), "the counter is exported");
        let snapshot = netdam_initiator::top::Snapshot::parse(&text).unwrap();
        snapshot.sum("netdam_initiator_answers_spun_for_total", |_| true)
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    for poll in [ClientPoll::Adaptive, ClientPoll::Blocking] {
        let metrics = std::sync::Arc::new(InitiatorMetrics::default());
        let spun = runtime.block_on(async {
            let mut options = VolumeOptions::default();
            options.client.poll = poll;
            let volume = Volume::open_observed(addr, "disk", options, Some(&metrics)).await.unwrap();
            for index in 0..200u64 {
                let data = vec![(index % 251) as u8; BLOCK as usize];
                let at = (index % BLOCKS) * u64::from(BLOCK);
                volume.write(at, &data, false).await.unwrap();
                let mut back = vec![0u8; BLOCK as usize];
                volume.read(at, &mut back).await.unwrap();
                assert!(back == data, "request {index} read back what it wrote");
            }
            volume.close().await;
            spun_for(&metrics)
        });
        match poll {
            // At least a twentieth of the 400 answers (most, on an idle machine; a loaded one may
            // let many outlast the spin).
            ClientPoll::Adaptive => assert!(spun >= 20.0, "spun for {spun} of 400 answers"),
            _ => assert_eq!(spun, 0.0, "a blocking session never spins"),
        }
    }

    // Two requests outstanding at a time, over two sessions: each session sees one request at
    // a time, but the caller is not waiting for each answer, and nothing spins.
    let metrics = std::sync::Arc::new(InitiatorMetrics::default());
    let spun = runtime.block_on(async {
        let mut options = VolumeOptions { sessions: 2, ..VolumeOptions::default() };
        options.client.poll = ClientPoll::Adaptive;
        let volume = Volume::open_observed(addr, "disk", options, Some(&metrics)).await.unwrap();
        for index in 0..200u64 {
            let (mut first, mut second) = (vec![0u8; BLOCK as usize], vec![0u8; BLOCK as usize]);
            let at = (index % (BLOCKS - 1)) * u64::from(BLOCK);
            let (a, b) = tokio::join!(volume.read(at, &mut first), volume.read(at + u64::from(BLOCK), &mut second));
            a.unwrap();
            b.unwrap();
        }
        volume.close().await;
        spun_for(&metrics)
    });
    assert_eq!(spun, 0.0, "a caller with two requests outstanding is not spun for");

    // The target goes away while lone requests are spun for: with no patience for a restart,
    // the next request fails with NotListening instead of hanging.
    let metrics = std::sync::Arc::new(InitiatorMetrics::default());
    let mut options = VolumeOptions::default();
    options.client.poll = ClientPoll::Adaptive;
    options.client.session.reconnect_patience = netdam_isa::Duration::ZERO;
    options.client.session.min_patience = netdam_isa::Duration::from_millis(500);
    let outcome = runtime.block_on(async {
        let volume = Volume::open_observed(addr, "disk", options, Some(&metrics)).await.unwrap();
        let mut back = vec![0u8; BLOCK as usize];
        for _ in 0..10 {
            volume.read(0, &mut back).await.unwrap();
        }
        drop(test);
        let mut outcome = Ok(());
        for _ in 0..20 {
            outcome = volume.read(0, &mut back).await;
            if outcome.is_err() {
                break;
            }
        }
        outcome
    });
    match outcome {
        Err(ClientError::NotListening(_)) => {}
        other => panic!("expected NotListening, got {other:?}"),
    }
}

#[test]
fn a_volume_rides_out_idle_expiry_and_a_target_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_path_buf();
    let configure = |listen: std::net::SocketAddr| {
        let data_dir = data_dir.clone();
        move |config: &mut netdam_target::Config| {
            config.listen = listen;
            config.data_dir = Some(data_dir);
            config.namespaces = vec![namespace(NamespaceBackend::File, "disk.img")];
            config.session_idle_timeout_ms = 1_000;
        }
    };
    let first = start_configured(vec![region("mem", 1 << 20, false)], configure("127.0.0.1:0".parse().unwrap()));
    let addr = first.target.local_addr();
    let runtime = runtime();
    let volume = runtime.block_on(Volume::open(addr, "disk", VolumeOptions { sessions: 2, ..Default::default() }));
    let volume = volume.unwrap();
    let data = vec![0x5Au8; 64 << 10];
    runtime.block_on(volume.write(0, &data, true)).unwrap();

    // Silent past the idle timeout: the target forgets the sessions, the volume says HELLO again.
    std::thread::sleep(std::time::Duration::from_millis(1_500));
    let mut back = vec![0u8; data.len()];
    runtime.block_on(volume.read(0, &mut back)).unwrap();
    assert_eq!(back, data);
    let stats = first.target.stats();
    assert!(stats.get("sessions_expired").unwrap() >= 1, "the sessions did expire");
    assert!(stats.get("answered_no_session").unwrap() >= 1, "and the volume found out");

    // A new target on the same address and files: the same again, and the data is there.
    drop(first.target);
    let second = start_configured(vec![region("mem", 1 << 20, false)], configure(addr));
    let mut back = vec![0u8; data.len()];
    runtime.block_on(volume.read(0, &mut back)).unwrap();
    assert_eq!(back, data, "a FUA write survives the restart, and the volume reconnects");
    runtime.block_on(volume.write(0, &[7u8; 4096], false)).unwrap();
    drop(volume);
    drop(second);
}
