//! The deterministic simulator in CI: many seeds of faulty networks with exactly-once checks,
//! the 32-to-1 incast with congestion control on and off, the step bound, and the checked-in
//! results table.

use netdam_bench::sim::{self, Scenario, Workload};
use netdam_isa::Duration;

/// Seeds per run: $NETDAM_SIM_SEEDS, default 1000; $NETDAM_SIM_SEED=N repeats one. Each run prints
/// its seed first, so a failure names the seed that reproduces it.
fn seeds() -> Vec<u64> {
    if let Some(seed) = std::env::var("NETDAM_SIM_SEED").ok().and_then(|text| text.parse().ok()) {
        return vec![seed];
    }
    let count = std::env::var("NETDAM_SIM_SEEDS").ok().and_then(|text| text.parse().ok()).unwrap_or(1000u64);
    let base = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    (0..count)
        .map(|index| {
            base.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(index.wrapping_mul(1_442_695_040_888_963_407)) | 1
        })
        .collect()
}

#[test]
fn every_operation_completes_exactly_once_on_a_faulty_network() {
    for seed in seeds() {
        println!("SEED={seed}");
        // The seed also picks the faults: loss up to 10%, duplication up to 5%, reordering up to
        // 4%, 2 to 8 initiators, and congestion control off in a quarter of the runs.
        let mut scenario = Scenario::new(seed, 2 + (seed % 7) as usize, Workload::Checked { ops: 240 });
        scenario.network.loss = (seed % 11) as f64 / 100.0;
        scenario.network.duplicate = (seed % 6) as f64 / 100.0;
        scenario.network.reorder = (seed % 5) as f64 / 100.0;
        if seed % 4 == 1 {
            scenario.session.congestion = None;
        }
        // run() checks the invariants: FETCH_ADD old values are 0..n exactly once, the counter and
        // VADD lanes hold exact totals, every READ returns what the WRITE before it wrote.
        let report = sim::run(&scenario).unwrap_or_else(|error| panic!("{error}"));
        assert_eq!(report.completed, 240 * scenario.initiators as u64, "SEED={seed}");
    }
}

#[test]
fn duplicated_and_retransmitted_non_idempotent_requests_are_answered_from_the_replay_window() {
    println!("SEED=7");
    let mut scenario = Scenario::new(7, 4, Workload::Checked { ops: 600 });
    scenario.network.loss = 0.08;
    scenario.network.duplicate = 0.05;
    let report = sim::run(&scenario).unwrap_or_else(|error| panic!("{error}"));
    assert!(report.replayed > 20, "duplicates of FETCH_ADD/VADD must be replayed, not executed: {}", report.replayed);
}

fn incast(congestion_control: bool) -> sim::Report {
    let workload = Workload::Incast { write_bytes: 4096, duration: Duration::from_millis(10) };
    let mut scenario = Scenario::new(3, 32, workload);
    scenario.network.bottleneck_buffer_bytes = 1 << 20;
    if !congestion_control {
        scenario.session.congestion = None;
    }
    sim::run(&scenario).unwrap_or_else(|error| panic!("{error}"))
}

#[test]
fn incast_32_to_1_keeps_the_queue_near_target_only_with_congestion_control() {
    println!("SEED=3");
    let on = incast(true);
    let off = incast(false);
    let us = |d: Duration| d.as_nanos() / 1000;
    for (name, report) in [("swift on", &on), ("fixed window 32", &off)] {
        println!(
            "{name:>15}: {:.2} Gb/s, fairness {:.3}, bottleneck queue p50 {} µs p99 {} µs, congestion drops {}, \
             retransmissions {}, completion p99 {} µs",
            report.throughput_gbps,
            report.fairness,
            us(report.bottleneck_queueing_p50),
            us(report.bottleneck_queueing_p99),
            report.congestion_drops,
            report.retransmissions,
            us(report.latency_p99)
        );
    }
    // Fabric target: 50 µs base + 10 µs for the one hop + up to 100 µs of flow scaling.
    assert!(on.bottleneck_queueing_p99 < Duration::from_micros(250), "queue p99 {:?}", on.bottleneck_queueing_p99);
    assert_eq!(on.congestion_drops, 0);
    assert!(on.throughput_gbps > 9.0 && on.fairness > 0.99, "{on:?}");
    assert!(off.bottleneck_queueing_p99 > Duration::from_micros(700), "without control the buffer fills");
    assert!(off.congestion_drops > 1000, "{off:?}");
    assert!(off.throughput_gbps < on.throughput_gbps);
}

#[test]
fn a_livelock_becomes_an_error_naming_its_seed() {
    let mut scenario = Scenario::new(99, 2, Workload::Checked { ops: 1000 });
    scenario.step_limit = 500;
    let error = sim::run(&scenario).unwrap_err();
    assert_eq!(error.seed, 99);
    assert!(error.to_string().starts_with("SEED=99: livelock"), "{error}");
    // A network that loses everything fails the operations, not the simulator.
    let mut scenario = Scenario::new(5, 1, Workload::Checked { ops: 3 });
    scenario.network.loss = 1.0;
    let error = sim::run(&scenario).unwrap_err();
    assert!(error.message.contains("HELLO failed"), "{error}");
}

#[test]
fn the_same_seed_gives_the_same_run() {
    let mut scenario = Scenario::new(11, 6, Workload::Checked { ops: 150 });
    scenario.network.loss = 0.05;
    scenario.network.reorder = 0.05;
    assert_eq!(sim::run(&scenario).unwrap(), sim::run(&scenario).unwrap());
}

#[test]
fn the_checked_in_results_table_is_current() {
    let expected = include_str!("../../docs/SIMULATION.md");
    let generated = sim::table::generate().unwrap();
    assert!(
        generated == expected,
        "docs/SIMULATION.md differs from a fresh run: regenerate it with \
         `cargo run --release --bin netdam-bench -- sim-table > docs/SIMULATION.md` and review the diff"
    );
}

#[test]
fn an_overloaded_target_answers_busy_and_initiators_back_off_without_losing_operations() {
    println!("SEED=21");
    // The target, not the network, is the bottleneck: 60 µs per request for 16 initiators with
    // windows of 32 builds a queue far past the 1 ms BUSY threshold.
    for congestion_control in [true, false] {
        let mut scenario = Scenario::new(21, 16, Workload::Checked { ops: 300 });
        scenario.target_service = Duration::from_micros(60);
        if !congestion_control {
            scenario.session.congestion = None;
        }
        let report = sim::run(&scenario).unwrap_or_else(|error| panic!("{error}"));
        println!(
            "congestion control {congestion_control}: {} BUSY answers, completion p99 {} µs",
            report.busy,
            report.latency_p99.as_nanos() / 1000
        );
        assert_eq!(report.completed, 16 * 300);
        if !congestion_control {
            assert!(report.busy > 100, "without a controller only BUSY protects the target: {}", report.busy);
        }
    }
}
