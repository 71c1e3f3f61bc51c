//! Real sockets through a fault-injecting proxy, losing, duplicating and reordering datagrams in
//! each direction:
//! - 1,000,000 FETCH_ADDs from four initiators at 5% loss, 1% duplication and 1% reordering. Every
//!   operation must complete, and the old values returned must be exactly 0..1,000,000, each
//!   once: nothing lost, nothing applied twice.
//! - VADDs of 2048 i32 lanes, each with a FETCH_ADD counter in the same datagram (as an
//!   Allreduce sends a VADD with an earlier chunk's count), and VMAXs, from four initiators into the same lanes of a target with
//!   two workers: every lane ends at exactly the sum of the VADDs acknowledged (and the maximum of
//!   the VMAXs), the counter at their number.
//! - VADDs with `RETURN_RESULT` adding 1 to 2048 i32 lanes from four initiators: every lane ends
//!   at the number of VADDs applied, and the values answered for a lane are each the lane's value
//!   right after one add: distinct, 1..=total, and higher for a VADD sent after another's answer.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use netdam_bench::proxy::{test_seed, Faults, Proxy};
use netdam_initiator::{Client, ClientError, ClientOptions, Op, SessionConfig};
use netdam_isa::extension::vmax::VMAX_OPCODE;
use netdam_isa::{LaneType, Status};
use netdam_target::config::{ByteSize, Config, PollMode, RegionBackend, RegionConfig};
use netdam_target::Target;

const INITIATORS: u64 = 4;
const OPERATIONS: u64 = 1_000_000;
/// FETCH_ADDs per datagram: a lost datagram loses (and a replay answers) all of them together.
const PER_DATAGRAM: u64 = 4;
const WINDOW: usize = 16;

/// A target and its data directory of its own (a directory serves one target at a time).
struct Served {
    target: Target,
    _data_dir: tempfile::TempDir,
}

impl std::ops::Deref for Served {
    type Target = Target;
    fn deref(&self) -> &Target {
        &self.target
    }
}

/// A target on a loopback port (metrics on any free port: tests run many targets at once),
/// serving one memory region, unauthenticated (these tests are about loss, not tenants).
fn start(region: &str, size: u64, adjust: impl FnOnce(&mut Config)) -> Served {
    let data_dir = tempfile::tempdir().unwrap();
    let mut config = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        metrics_listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: Some(data_dir.path().to_path_buf()),
        poll: PollMode::Blocking,
        regions: vec![RegionConfig {
            name: region.into(),
            backend: RegionBackend::Mem,
            path: None,
            size: ByteSize(size),
        }],
        auth: netdam_target::AuthMode::None,
        ..Config::default()
    };
    adjust(&mut config);
    Served { target: Target::start(&config).unwrap(), _data_dir: data_dir }
}

#[test]
fn a_million_fetch_adds_through_loss_duplication_and_reordering_apply_exactly_once() {
    let seed = test_seed();
    let target = start("counters", 4096, |_| {});
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

const LANES: usize = 2048;

/// Lane `lane` of initiator `initiator`'s `round`th VADD (or VMAX): spread over the whole i32
/// range, so that a lane added twice, or a lost add, changes the wrapped sum.
fn lane_value(initiator: u64, round: u64, lane: usize) -> i32 {
    let key = (initiator * 1_000_003 + round).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (key ^ (lane as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F)).rotate_left(29) as i32
}

fn lanes_of(initiator: u64, round: u64) -> Vec<u8> {
    (0..LANES).flat_map(|lane| lane_value(initiator, round, lane).to_le_bytes()).collect()
}

fn i32_lanes(bytes: &[u8]) -> Vec<i32> {
    bytes.chunks_exact(4).map(|lane| i32::from_le_bytes(lane.try_into().unwrap())).collect()
}

/// What one initiator's requests came to: acknowledged, or failed after every attempt (outcome
/// unknown: executed once or not at all).
#[derive(Default)]
struct Outcomes {
    vadds_acknowledged: Vec<(u64, u64)>,
    vadds_unknown: Vec<(u64, u64)>,
    vmaxes_acknowledged: Vec<(u64, u64)>,
    vmaxes_unknown: Vec<(u64, u64)>,
}

/// VADD and FETCH_ADD are not idempotent: the target must execute each datagram at most once
/// however often loss and duplication make it arrive, and answer repeats from its replay window.
/// VMAX is idempotent (the target executes a repeat again, to the same effect), and checked alike.
#[test]
fn vadds_and_their_counters_through_loss_and_duplication_add_every_acknowledged_lane_exactly_once() {
    const ROUNDS: u64 = 300;
    const VADD_AT: u64 = 0;
    const VMAX_AT: u64 = 16_384;
    const COUNTER_AT: u64 = 32_768;
    let seed = test_seed();
    // Two workers: the initiators' sessions are spread over both, adding into the same lanes.
    let target = start("lanes", 65536, |config| {
        config.workers = 2;
        config.extensions = vec!["vmax".to_string()];
    });
    let mut setup = Client::connect(target.local_addr()).unwrap();
    // VMAX lanes start at the least i32.
    setup.write(0, VMAX_AT, &i32::MIN.to_le_bytes().repeat(LANES)).unwrap();
    let faults = Faults { loss: 0.05, duplicate: 0.03, reorder: 0.02, reorder_delay: Duration::from_micros(300), seed };
    let proxy = Proxy::start(target.local_addr(), faults).unwrap();
    let options = ClientOptions {
        session: SessionConfig { max_in_flight: 8, max_attempts: 40, ..SessionConfig::default() },
        ..ClientOptions::default()
    };
    let front = proxy.addr();
    let outcomes: Vec<Outcomes> = std::thread::scope(|scope| {
        let initiators: Vec<_> = (0..INITIATORS)
            .map(|initiator| {
                scope.spawn(move || {
                    let mut client = Client::connect_with(front, options).expect("connect through the proxy");
                    let mut outcomes = Outcomes::default();
                    let mut pending = VecDeque::new();
                    for round in 0..ROUNDS {
                        let lanes = lanes_of(initiator, round);
                        // Every third round a VMAX in its own datagram; every round a VADD and its count.
                        let (is_vmax, ops) = if round % 3 == 2 {
                            let vmax = Op::extension(
                                VMAX_OPCODE,
                                0,
                                0,
                                VMAX_AT,
                                lanes.len() as u32,
                                LaneType::I32 as u32,
                                &lanes,
                            );
                            (true, vec![vmax])
                        } else {
                            let vadd = Op::vadd(0, VADD_AT, LaneType::I32, &lanes, false);
                            (false, vec![vadd, Op::fetch_add(0, COUNTER_AT, 1)])
                        };
                        pending.push_back((is_vmax, round, client.submit(&ops).expect("submit")));
                        while pending.len() >= 8 || (round + 1 == ROUNDS && !pending.is_empty()) {
                            let (is_vmax, round, ticket) = pending.pop_front().unwrap();
                            let settled = client.wait(ticket).and_then(|reply| {
                                (0..reply.results()?.len()).try_for_each(|index| reply.data(index).map(|_| ()))
                            });
                            let list = match (is_vmax, settled) {
                                (false, Ok(())) => &mut outcomes.vadds_acknowledged,
                                (true, Ok(())) => &mut outcomes.vmaxes_acknowledged,
                                (false, Err(ClientError::TimedOut { .. })) => &mut outcomes.vadds_unknown,
                                (true, Err(ClientError::TimedOut { .. })) => &mut outcomes.vmaxes_unknown,
                                (_, Err(error)) => panic!("SEED={seed}: round {round}: {error}"),
                            };
                            list.push((initiator, round));
                        }
                    }
                    outcomes
                })
            })
            .collect();
        initiators.into_iter().map(|initiator| initiator.join().expect("initiator thread")).collect()
    });
    let counts = proxy.stop().unwrap();
    let stats = target.stats();
    let merged = |pick: fn(&Outcomes) -> &Vec<(u64, u64)>| -> Vec<(u64, u64)> {
        outcomes.iter().flat_map(|outcome| pick(outcome).iter().copied()).collect()
    };
    let (vadds_acknowledged, vadds_unknown) = (merged(|o| &o.vadds_acknowledged), merged(|o| &o.vadds_unknown));
    let (vmaxes_acknowledged, vmaxes_unknown) = (merged(|o| &o.vmaxes_acknowledged), merged(|o| &o.vmaxes_unknown));
    println!(
        "{} VADDs acknowledged, {} unknown; {} VMAXs acknowledged, {} unknown; proxy: {counts:?}; target: {} duplicates replayed, {} executed again",
        vadds_acknowledged.len(),
        vadds_unknown.len(),
        vmaxes_acknowledged.len(),
        vmaxes_unknown.len(),
        stats.get("duplicates_replayed").unwrap(),
        stats.get("duplicates_executed_again").unwrap()
    );
    // With 40 attempts at 5% loss each way an unknown outcome is all but impossible; a few are
    // still handled, and more would mean the transport gave up on requests it should carry.
    assert!(vadds_unknown.len() + vmaxes_unknown.len() <= 12, "SEED={seed}: too many requests failed");
    assert_eq!(
        (vadds_acknowledged.len() + vadds_unknown.len() + vmaxes_acknowledged.len() + vmaxes_unknown.len()) as u64,
        INITIATORS * ROUNDS
    );

    let mut stored = vec![0u8; LANES * 4];
    setup.read(0, VADD_AT, &mut stored).unwrap();
    let sums = i32_lanes(&stored);
    let counter = setup.fetch_add(0, COUNTER_AT, 0).unwrap();
    let sum_of = |requests: &mut dyn Iterator<Item = &(u64, u64)>| -> Vec<i32> {
        let mut total = vec![0i32; LANES];
        for &(initiator, round) in requests {
            for (lane, sum) in total.iter_mut().enumerate() {
                *sum = sum.wrapping_add(lane_value(initiator, round, lane));
            }
        }
        total
    };
    let acknowledged = sum_of(&mut vadds_acknowledged.iter());
    // The lanes and the counter are the acknowledged VADDs plus one subset of the unknown ones
    // (each executed at most once, VADD and count together).
    let explained = (0u32..1 << vadds_unknown.len()).any(|subset| {
        let chosen: Vec<&(u64, u64)> =
            vadds_unknown.iter().enumerate().filter(|(index, _)| subset & (1 << index) != 0).map(|(_, r)| r).collect();
        let extra = sum_of(&mut chosen.iter().copied());
        counter == (vadds_acknowledged.len() + chosen.len()) as u64
            && sums.iter().zip(&acknowledged).zip(&extra).all(|((got, ack), more)| *got == ack.wrapping_add(*more))
    });
    if vadds_unknown.is_empty() {
        assert_eq!(counter, vadds_acknowledged.len() as u64, "SEED={seed}: the counter disagrees");
        let wrong = sums.iter().zip(&acknowledged).filter(|(got, expected)| got != expected).count();
        assert_eq!(wrong, 0, "SEED={seed}: {wrong} lanes are not the exact sum of the acknowledged VADDs");
    }
    assert!(explained, "SEED={seed}: lanes or counter not explained by the acknowledged VADDs and unknown ones");

    setup.read(0, VMAX_AT, &mut stored).unwrap();
    let maxima = i32_lanes(&stored);
    for (lane, got) in maxima.iter().enumerate() {
        let acknowledged =
            vmaxes_acknowledged.iter().map(|&(initiator, round)| lane_value(initiator, round, lane)).max().unwrap();
        let possible = vmaxes_unknown.iter().map(|&(initiator, round)| lane_value(initiator, round, lane));
        assert!(
            *got == acknowledged || possible.clone().any(|value| value == *got && value > acknowledged),
            "SEED={seed}: VMAX lane {lane} is {got}, the acknowledged maximum {acknowledged}"
        );
    }
    assert!(counts.dropped > 0 && counts.duplicated > 0 && counts.reordered > 0, "the proxy injected every fault");
    assert!(stats.get("duplicates_replayed").unwrap() > 0, "repeated VADDs were answered from the replay window");
}

/// Each VADD adds 1 to every lane and returns the lanes' new values. Applied exactly once, the
/// `n` VADDs that reach a lane leave it at `n` and answer it `1..=n`, each value once (the
/// target steps through each aligned 4 KiB as one, so a VADD's lanes in one 4 KiB answer the
/// same value). A duplicate executed again would add twice; an answer replayed without its data,
/// or with another request's, would repeat or skip a value.
#[test]
fn vadds_returning_their_result_through_loss_and_duplication_answer_each_value_once() {
    const ROUNDS: usize = 300;
    const IN_FLIGHT: usize = 8;
    /// i32 lanes per aligned chunk the target steps through at once.
    const LANES_PER_STEP: usize = netdam_isa::limits::VADD_CHUNK_BYTES / 4;
    let seed = test_seed();
    let target = start("lanes", 65536, |config| config.workers = 2);
    let faults = Faults { loss: 0.05, duplicate: 0.03, reorder: 0.02, reorder_delay: Duration::from_micros(300), seed };
    let proxy = Proxy::start(target.local_addr(), faults).unwrap();
    let options = ClientOptions {
        session: SessionConfig { max_in_flight: IN_FLIGHT, max_attempts: 40, ..SessionConfig::default() },
        ..ClientOptions::default()
    };
    let ones = 1i32.to_le_bytes().repeat(LANES);
    let front = proxy.addr();
    // Per initiator, per round: the lanes answered, or None when every attempt went unanswered.
    let answers: Vec<Vec<Option<Vec<i32>>>> = std::thread::scope(|scope| {
        let initiators: Vec<_> = (0..INITIATORS)
            .map(|_| {
                let ones = &ones;
                scope.spawn(move || {
                    let mut client = Client::connect_with(front, options).expect("connect through the proxy");
                    assert!(client.info().vadd_chunk_bytes(LaneType::I32, true) >= ones.len(), "one VADD each");
                    let mut answers = Vec::with_capacity(ROUNDS);
                    let mut pending = VecDeque::new();
                    let mut settle = |client: &mut Client, ticket| {
                        let answer = client.wait(ticket).and_then(|reply| reply.data(0).map(i32_lanes));
                        match answer {
                            Ok(lanes) => {
                                assert_eq!(lanes.len(), LANES, "SEED={seed}: the whole result");
                                answers.push(Some(lanes));
                            }
                            // Unanswered, or answered `stale` (its stored answer overwritten in
                            // the replay arena while its retransmissions were lost): it may or
                            // may not have run, which the per-lane bounds allow for.
                            Err(ClientError::TimedOut { .. } | ClientError::DatagramRefused(Status::Stale)) => {
                                answers.push(None)
                            }
                            Err(error) => panic!("SEED={seed}: {error}"),
                        }
                    };
                    for _ in 0..ROUNDS {
                        // Round r goes only once round r - IN_FLIGHT has been answered.
                        if pending.len() == IN_FLIGHT {
                            settle(&mut client, pending.pop_front().unwrap());
                        }
                        let vadd = Op::vadd(0, 0, LaneType::I32, ones, true);
                        pending.push_back(client.submit(&[vadd]).expect("submit"));
                    }
                    while let Some(ticket) = pending.pop_front() {
                        settle(&mut client, ticket);
                    }
                    answers
                })
            })
            .collect();
        initiators.into_iter().map(|initiator| initiator.join().expect("initiator thread")).collect()
    });
    let counts = proxy.stop().unwrap();
    let stats = target.stats();
    let acknowledged = answers.iter().flatten().filter(|answer| answer.is_some()).count();
    let unknown = answers.iter().flatten().filter(|answer| answer.is_none()).count();
    println!(
        "{acknowledged} VADDs answered, {unknown} unknown; proxy: {counts:?}; target: {} duplicates replayed",
        stats.get("duplicates_replayed").unwrap()
    );
    assert_eq!(acknowledged + unknown, INITIATORS as usize * ROUNDS);
    assert!(unknown <= 12, "SEED={seed}: too many requests failed");

    let mut direct = Client::connect(target.local_addr()).unwrap();
    let mut stored = vec![0u8; LANES * 4];
    direct.read(0, 0, &mut stored).unwrap();
    let finals = i32_lanes(&stored);
    for (lane, &last) in finals.iter().enumerate() {
        // Every answered VADD was applied once, each unknown one at most once.
        let applied = last as usize;
        assert!(
            (acknowledged..=acknowledged + unknown).contains(&applied),
            "SEED={seed}: lane {lane} holds {last} after {acknowledged} answered VADDs and {unknown} unknown"
        );
        let mut values: Vec<i32> = answers.iter().flatten().flatten().map(|lanes| lanes[lane]).collect();
        values.sort_unstable();
        values.dedup();
        assert_eq!(values.len(), acknowledged, "SEED={seed}: lane {lane}: two VADDs answered the same value");
        assert!(
            values.first() >= Some(&1) && values.last() <= Some(&last),
            "SEED={seed}: lane {lane}: answered values {:?}..{:?} outside 1..={last}",
            values.first(),
            values.last()
        );
        if unknown == 0 {
            assert!(values.iter().copied().eq(1..=last), "SEED={seed}: lane {lane}: a value is missing");
        }
    }
    for (initiator, rounds) in answers.iter().enumerate() {
        for (round, answer) in rounds.iter().enumerate() {
            let Some(lanes) = answer else { continue };
            for step in lanes.chunks_exact(LANES_PER_STEP) {
                assert!(
                    step.iter().all(|value| *value == step[0]),
                    "SEED={seed}: initiator {initiator} round {round}: lanes of one 4 KiB step answered apart"
                );
            }
            // Sent after the answer to round - IN_FLIGHT: added after it, so every lane is higher.
            let earlier = round.checked_sub(IN_FLIGHT).and_then(|earlier| rounds[earlier].as_ref());
            if let Some(earlier) = earlier {
                assert!(
                    lanes.iter().zip(earlier).all(|(later, earlier)| later > earlier),
                    "SEED={seed}: initiator {initiator} round {round} answered no more than round {}",
                    round - IN_FLIGHT
                );
            }
        }
    }
    assert!(counts.dropped > 0 && counts.duplicated > 0 && counts.reordered > 0, "the proxy injected every fault");
    assert!(stats.get("duplicates_replayed").unwrap() > 0, "repeated VADDs were answered from the replay window");
}
