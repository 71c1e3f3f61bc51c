//! Real sockets through a fault-injecting proxy: 1,000,000 FETCH_ADDs from four initiators at 5%
//! loss, 1% duplication and 1% reordering in each direction. Every operation must complete, and
//! the old values returned must be exactly 0..1,000,000, each once: nothing lost, nothing applied
//! twice.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use netdam_bench::proxy::{Faults, Proxy};
use netdam_initiator::{Client, ClientOptions, Op, SessionConfig};
use netdam_target::config::{ByteSize, Config, PollMode, RegionBackend, RegionConfig};
use netdam_target::Target;

const INITIATORS: u64 = 4;
const OPERATIONS: u64 = 1_000_000;
/// FETCH_ADDs per datagram: a lost datagram loses (and a replay answers) all of them together.
const PER_DATAGRAM: u64 = 4;
const WINDOW: usize = 16;

#[test]
fn a_million_fetch_adds_through_loss_duplication_and_reordering_apply_exactly_once() {
    let seed = std::env::var("NETDAM_SEED").ok().and_then(|text| text.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
    });
    println!("SEED={seed}");
    let config = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        // Metrics on, on any free port: tests and benchmarks run many targets at once.
        metrics_listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: Some(std::env::temp_dir()),
        poll: PollMode::Blocking,
        regions: vec![RegionConfig {
            name: "counters".into(),
            backend: RegionBackend::Mem,
            path: None,
            size: ByteSize(4096),
        }],
        auth: netdam_target::AuthMode::None,
        ..Config::default()
    };
    let target = Target::start(&config).unwrap();
    let faults = Faults { loss: 0.05, duplicate: 0.01, reorder: 0.01, reorder_delay: Duration::from_micros(300), seed };
    let proxy = Proxy::start(target.local_addr(), faults).unwrap();
    let options = ClientOptions {
        session: SessionConfig { max_in_flight: WINDOW, max_attempts: 40, ..SessionConfig::default() },
        ..ClientOptions::default()
    };
    let started = Instant::now();
    let per_initiator = OPERATIONS / INITIATORS;
    let mut old_values: Vec<u64> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..INITIATORS)
            .map(|_| {
                scope.spawn(|| {
                    let mut client = Client::connect_with(proxy.addr(), options).expect("connect through the proxy");
                    let ops = vec![Op::fetch_add(0, 0, 1); PER_DATAGRAM as usize];
                    let mut values = Vec::with_capacity(per_initiator as usize);
                    let mut pending = VecDeque::new();
                    let mut submitted = 0;
                    while submitted < per_initiator || !pending.is_empty() {
                        while submitted < per_initiator && pending.len() < WINDOW {
                            pending.push_back(client.submit(&ops).expect("submit"));
                            submitted += PER_DATAGRAM;
                        }
                        let reply = client
                            .wait(pending.pop_front().expect("pending"))
                            .unwrap_or_else(|e| panic!("SEED={seed}: {e}"));
                        for result in reply.results().unwrap_or_else(|e| panic!("SEED={seed}: {e}")) {
                            let word: [u8; 8] = result.data.try_into().expect("an 8-byte old value");
                            values.push(u64::from_le_bytes(word));
                        }
                    }
                    (values, client.session_stats())
                })
            })
            .collect();
        let mut all = Vec::new();
        for worker in workers {
            let (values, stats) = worker.join().expect("initiator thread");
            println!(
                "initiator: {} transmissions, {} retransmissions, window {:.1}, srtt {} µs",
                stats.transmissions,
                stats.retransmissions,
                stats.window,
                stats.smoothed_rtt.as_nanos() / 1000
            );
            all.extend(values);
        }
        all
    });
    let elapsed = started.elapsed();
    let counts = proxy.stop().unwrap();
    let stats = target.stats();
    println!(
        "{OPERATIONS} operations in {:.1} s; proxy: {counts:?}; target: {} duplicates replayed, {} stale",
        elapsed.as_secs_f64(),
        stats.get("duplicates_replayed").unwrap(),
        stats.get("answered_stale").unwrap()
    );

    assert_eq!(old_values.len() as u64, OPERATIONS, "SEED={seed}: operations lost");
    old_values.sort_unstable();
    for (expected, value) in old_values.iter().enumerate() {
        assert_eq!(*value, expected as u64, "SEED={seed}: an old value is missing or repeated: applied twice or lost");
    }
    let mut direct = Client::connect(target.local_addr()).unwrap();
    assert_eq!(direct.fetch_add(0, 0, 0).unwrap(), OPERATIONS, "SEED={seed}: the counter disagrees");
    assert!(counts.dropped > 0 && counts.duplicated > 0 && counts.reordered > 0, "the proxy injected every fault");
    assert!(
        stats.get("duplicates_replayed").unwrap() > 0,
        "retransmissions and duplicates were answered from the window"
    );
}
