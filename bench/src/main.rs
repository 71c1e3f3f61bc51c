//! `netdam-bench`: where netdam stands on this machine, measured against the floor of the
//! machine in the same run. Absolute times hold for this machine only; the ratios are the result.

mod allreduce;
mod block;
mod bulk;
mod compare;
mod fio;
mod floor;
mod integrity;
mod latency;
mod noise;
mod plots;
mod report;
mod target;
mod tenancy;
mod throughput;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand, ValueEnum};
use hdrhistogram::Histogram;
use netdam_initiator::{Client, Op};

/// Where netdam stands on this machine: every number beside a floor or a peer measured in the
/// same run, because absolute times hold for one machine only and the ratios are the result.
/// No result is pass/fail.
///
/// - `latency`: round trips of one instruction at a time per opcode (READ, WRITE, CAS, FETCH_ADD,
///   VADD, CRC32, BREAD, BWRITE), size (64 B to 8 KiB) and polling mode (busy, adaptive,
///   blocking); HDR histograms, p50 to p99.99, max, standard deviation and jitter (p99.9 − p50),
///   each beside a raw UDP echo of the same request and answer sizes (the floor), and the
///   target's idle CPU.
/// - `floor`: only the UDP echo, for the same cases.
/// - `throughput`: operations/s, bytes/s, p50/p99 and CPU time per operation (target worker and
///   clients) as requests in flight (1 to 128) and sessions grow, beside the echo driven alike.
/// - `block`: 4 KiB random reads and writes through a namespace at QD1 and QD32 beside fio's
///   io_uring engine on the same file (the device floor); memory READ with and without a block
///   write load.
/// - `fio`: fio 3.33's 4 KiB random reads and writes (QD1, QD32) through the netdam fio engine,
///   through `netdam nbd` (fio's nbd engine, TCP and Unix socket) and through `nbdkit memory`
///   (the peer), on memory-backed storage in the same run; IOPS, p50/p99/p99.9 of total latency
///   and goals as ratios to nbdkit and to `throughput`'s client.
/// - `allreduce`: Allreduce through the target (VADD, FETCH_ADD barrier, READ) against host-side
///   reduction (each worker reads every other worker's buffer and sums it), N worker processes
///   for N = 2, 4, 8 and 1 to 64 MiB buffers: time, bytes on the wire per worker (counted), speedup.
/// - `noise`: what this machine takes from a spinning thread on each CPU (gaps by length,
///   interrupts, preemptions): the tail that no change to netdam lowers.
/// - `compare OLD.json NEW.json`: the regression guard; every figure of two reports of the same
///   kind, with the ones that moved past a threshold (10% by default) flagged worse or better.
/// - `sim`, `sim-table`, `load`: the congestion-control simulator and the incast load generator.
///
/// `--out DIR` writes JSON for machines, markdown for people and PNG plots (latency percentiles,
/// throughput against depth, latency against throughput); every report names the machine (cores,
/// CPU model, kernel). `ops/performance.sh` regenerates the README's results in docs/results.
#[derive(Debug, Parser)]
#[command(name = "netdam-bench", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Round-trip latency per opcode, size and polling mode, each beside the raw UDP echo floor
    /// of the same sizes.
    Latency(latency::LatencyArgs),
    /// Only the raw UDP echo floor, for the same cases.
    Floor(latency::LatencyArgs),
    /// Operations per second as requests in flight and sessions grow, beside a UDP echo driven
    /// alike; latency and CPU time per operation at each point.
    Throughput(throughput::ThroughputArgs),
    /// 4 KiB random reads and writes on a namespace (QD1, QD32) beside fio's io_uring engine on
    /// the same file, then memory READ latency with and without a block write load.
    Block(block::BlockArgs),
    /// fio's 4 KiB random reads and writes (QD1, QD32) through the netdam fio engine, through
    /// `netdam nbd` and through `nbdkit memory` (TCP and Unix socket), on memory-backed storage;
    /// IOPS, latency percentiles and goals as ratios to nbdkit in the same run.
    Fio(fio::FioArgs),
    /// Allreduce through the target (VADD into an accumulator, FETCH_ADD barrier, READ) against
    /// host-side reduction (WRITE, barrier, READ every other buffer, sum locally), with N worker
    /// processes; time, bytes on the wire per worker and speedup, and the results checked exact.
    Allreduce(allreduce::AllreduceArgs),
    /// One worker process of `allreduce` (started by it).
    #[command(hide = true)]
    AllreduceWorker(allreduce::WorkerArgs),
    /// Two reports of the same kind (the JSON `--out` writes), figure by figure: each figure's
    /// change, and the figures of merit that moved past a threshold flagged worse or better.
    Compare(compare::CompareArgs),
    /// One run of the deterministic simulator (initiators and a target on a virtual clock).
    Sim(SimArgs),
    /// Print the table of simulated results (docs/SIMULATION.md) to standard output.
    SimTable,
    /// One large WRITE and READ of a volatile region through the client's pipeline (what
    /// `netdam write` and `netdam read` do), beside a UDP bulk transfer with the same datagram
    /// sizes and window, alternating; MiB/s and their ratio.
    Bulk(bulk::BulkArgs),
    /// What tenant authentication costs (READ 64 B with no authentication, a MAC, encryption)
    /// and what QoS protects (a latency-critical tenant alone and beside a flood), in one run.
    Tenancy(tenancy::TenancyArgs),
    /// What checking one datagram costs: CRC-32C, the MAC trailer of an authenticated session
    /// (seal and open) and HMAC-SHA256, per datagram size.
    Integrity(integrity::IntegrityArgs),
    /// How much of a spinning thread's time this machine takes away: one thread spinning on each
    /// CPU at once, as a busy worker and a busy client do, its gaps counted by length beside the
    /// CPU's timer and other interrupts and the thread's preemptions. The tail no user-space
    /// change lowers: a round trip meets a gap in about (gaps per second) / (round trips per
    /// second) of its requests.
    Noise(noise::NoiseArgs),
    /// One initiator writing to a running target as fast as its window allows, for a while;
    /// prints one JSON line. Used by ops/netns-incast.sh, one per network namespace.
    Load(LoadArgs),
}

#[derive(Debug, Clone, clap::Args)]
struct LoadArgs {
    /// Target address.
    #[arg(long)]
    target: SocketAddr,
    /// Region to write into (name or id).
    #[arg(long, default_value = "0")]
    region: String,
    /// Where this initiator's writes start; they cycle through --span bytes from here.
    #[arg(long, default_value_t = 0)]
    offset: u64,
    /// Bytes the writes cycle through.
    #[arg(long, default_value_t = 1 << 20)]
    span: u64,
    /// Bytes per write.
    #[arg(long, default_value_t = 1024)]
    size: usize,
    /// How long to write, seconds.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Requests in flight at most.
    #[arg(long, default_value_t = 32)]
    window: usize,
    /// Congestion control (Swift) on, or a fixed window.
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    cc: OnOff,
    /// Swift's fabric base target delay, µs: must exceed the fabric's unloaded round trip.
    #[arg(long)]
    base_target_us: Option<u64>,
    /// The tenant's key file (else the default tenant's, as `netdam` finds it).
    #[arg(long, env = "NETDAM_KEY", value_name = "FILE")]
    key: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, clap::Args)]
struct SimArgs {
    /// Seed of every random choice; the same seed gives the same run.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Initiators sharing the bottleneck to the target.
    #[arg(long, default_value_t = 8)]
    initiators: usize,
    /// incast: 4 KiB writes as fast as the window allows for --millis; checked: --ops operations
    /// per initiator checked for exactly-once execution.
    #[arg(long, value_enum, default_value_t = SimWorkload::Incast)]
    workload: SimWorkload,
    /// Simulated milliseconds of incast.
    #[arg(long, default_value_t = 10)]
    millis: u64,
    /// Operations per initiator (checked workload).
    #[arg(long, default_value_t = 1000)]
    ops: u64,
    /// Congestion control (Swift) on, or a fixed window of --window requests.
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    cc: OnOff,
    /// Requests each initiator keeps in flight at most.
    #[arg(long, default_value_t = 32)]
    window: usize,
    /// Probability of losing a datagram at the bottleneck.
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// Probability of duplicating one.
    #[arg(long, default_value_t = 0.0)]
    duplicate: f64,
    /// Probability of delaying one past later ones.
    #[arg(long, default_value_t = 0.0)]
    reorder: f64,
    /// One-way propagation delay per link, µs.
    #[arg(long, default_value_t = 2)]
    propagation_us: u64,
    /// Swift's initial window, requests.
    #[arg(long)]
    initial_window: Option<f64>,
    /// Buffer of the bottleneck port, KiB.
    #[arg(long, default_value_t = 256)]
    buffer_kib: usize,
    /// Floor of the retransmission timeout, µs.
    #[arg(long)]
    min_rto_us: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum SimWorkload {
    Incast,
    Checked,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OnOff {
    On,
    Off,
}

fn main() {
    let cli = Cli::parse();
    match cli.command {
        Command::Latency(args) => latency(&args, true),
        Command::Floor(args) => latency(&args, false),
        Command::Integrity(args) => integrity::run(&args),
        Command::Noise(args) => {
            if let Err(message) = noise::run(&args) {
                eprintln!("netdam-bench noise: {message}");
                std::process::exit(1);
            }
        }
        Command::Tenancy(args) => tenancy::run(&args),
        Command::Sim(args) => simulate(&args),
        Command::Throughput(args) => {
            if let Err(message) = throughput::run(&args).and_then(|points| throughput::report(&points, &args)) {
                eprintln!("netdam-bench throughput: {message}");
                std::process::exit(1);
            }
        }
        Command::Bulk(args) => {
            if let Err(message) = bulk::run(&args) {
                eprintln!("netdam-bench bulk: {message}");
                std::process::exit(1);
            }
        }
        Command::Block(args) => {
            if let Err(message) = block::run(&args) {
                eprintln!("netdam-bench block: {message}");
                std::process::exit(1);
            }
        }
        Command::Fio(args) => {
            if let Err(message) = fio::run(&args) {
                eprintln!("netdam-bench fio: {message}");
                std::process::exit(1);
            }
        }
        Command::Allreduce(args) => {
            if let Err(message) = allreduce::run(&args) {
                eprintln!("netdam-bench allreduce: {message}");
                std::process::exit(1);
            }
        }
        Command::AllreduceWorker(args) => {
            if let Err(message) = allreduce::worker(&args) {
                eprintln!("netdam-bench allreduce worker: {message}");
                std::process::exit(1);
            }
        }
        Command::Compare(args) => {
            if let Err(message) = compare::run(&args) {
                eprintln!("netdam-bench compare: {message}");
                std::process::exit(1);
            }
        }
        Command::Load(args) => load(&args),
        Command::SimTable => match netdam_bench::sim::table::generate() {
            Ok(table) => print!("{table}"),
            Err(error) => {
                eprintln!("{error}");
                std::process::exit(1);
            }
        },
    }
}

fn load(args: &LoadArgs) {
    use netdam_initiator::{session::SessionConfig, ClientOptions};
    let mut session = SessionConfig { max_in_flight: args.window, ..SessionConfig::default() };
    match (args.cc, args.base_target_us) {
        (OnOff::Off, _) => session.congestion = None,
        (OnOff::On, Some(base_us)) => {
            if let Some(swift) = session.congestion.as_mut() {
                swift.base_target = netdam_isa::Duration::from_micros(base_us);
            }
        }
        (OnOff::On, None) => {}
    }
    let fail = |message: String| -> ! {
        println!("{}", serde_json::json!({ "error": message }));
        std::process::exit(1);
    };
    session.credentials =
        netdam_initiator::keys::resolve(args.key.as_deref()).unwrap_or_else(|error| fail(format!("--key: {error}")));
    let mut client = Client::connect_with(args.target, ClientOptions { session, ..ClientOptions::default() })
        .unwrap_or_else(|error| fail(format!("connect: {error}")));
    let space = client.region(&args.region).map(|region| region.id).unwrap_or_else(|error| fail(error.to_string()));
    let data = vec![0xA5u8; args.size];
    let mut latency = histogram();
    let mut rtt = histogram();
    let mut pending = std::collections::VecDeque::new();
    let mut failed = 0u64;
    let mut written = 0u64;
    let started = Instant::now();
    let stop_at = started + Duration::from_secs_f64(args.seconds);
    let slots = (args.span / args.size as u64).max(1);
    let mut next = 0u64;
    loop {
        let now = Instant::now();
        while now < stop_at && pending.len() < args.window {
            let offset = args.offset + (next % slots) * args.size as u64;
            next += 1;
            let ticket = client.submit(&[Op::write(space, offset, &data)]).unwrap_or_else(|e| fail(e.to_string()));
            pending.push_back((Instant::now(), ticket));
        }
        let Some((submitted, ticket)) = pending.pop_front() else { break };
        match client.wait(ticket).and_then(|reply| reply.data(0).map(|_| reply.rtt)) {
            Ok(round_trip) => {
                written += args.size as u64;
                record(&mut latency, submitted.elapsed());
                record(&mut rtt, round_trip.to_std());
            }
            Err(_) => failed += 1,
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let stats = client.session_stats();
    let us = |histogram: &Histogram<u64>, q: f64| histogram.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "{}",
        serde_json::json!({
            "operations": latency.len(), "failed": failed, "seconds": elapsed,
            "mbit_per_s": written as f64 * 8.0 / elapsed / 1e6,
            "latency_p50_us": us(&latency, 0.5), "latency_p99_us": us(&latency, 0.99),
            "rtt_p50_us": us(&rtt, 0.5), "rtt_p99_us": us(&rtt, 0.99),
            "transmissions": stats.transmissions, "retransmissions": stats.retransmissions,
            "busy": stats.busy, "window": stats.window,
        })
    );
}

fn simulate(args: &SimArgs) {
    use netdam_bench::sim::{self, Scenario, Workload};
    use netdam_isa::Duration;
    println!("SEED={}", args.seed);
    let workload = match args.workload {
        SimWorkload::Incast => Workload::Incast { write_bytes: 4096, duration: Duration::from_millis(args.millis) },
        SimWorkload::Checked => Workload::Checked { ops: args.ops },
    };
    let mut scenario = Scenario::new(args.seed, args.initiators, workload);
    scenario.session.max_in_flight = args.window;
    if args.cc == OnOff::Off {
        scenario.session.congestion = None;
    }
    scenario.network.loss = args.loss;
    scenario.network.duplicate = args.duplicate;
    scenario.network.reorder = args.reorder;
    scenario.network.propagation = Duration::from_micros(args.propagation_us);
    scenario.network.bottleneck_buffer_bytes = args.buffer_kib << 10;
    if let Some(min_rto_us) = args.min_rto_us {
        scenario.session.min_rto = Duration::from_micros(min_rto_us);
    }
    if let (Some(window), Some(swift)) = (args.initial_window, scenario.session.congestion.as_mut()) {
        swift.initial_window = window;
    }
    match sim::run(&scenario) {
        Ok(report) => println!("{report:#?}"),
        Err(error) => {
            eprintln!("{error}");
            std::process::exit(1);
        }
    }
}

/// CPU time this thread has used, system time included (ns).
fn thread_cpu_ns() -> u64 {
    netdam_isa::time::clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 10_000_000_000, 3).expect("valid histogram bounds")
}

fn record(histogram: &mut Histogram<u64>, elapsed: Duration) {
    histogram.saturating_record(elapsed.as_nanos() as u64);
}

fn latency(args: &latency::LatencyArgs, with_netdam: bool) {
    let rounds: Vec<_> = (0..args.rounds).map(|_| latency::run(args, with_netdam)).collect();
    let cases = rounds.last().expect("at least one round");
    report::print_latency(cases, args);
    report::print_latency_rounds(&rounds);
    if let Some(dir) = &args.out {
        if let Err(message) = report::write_latency(&rounds, args, dir) {
            eprintln!("netdam-bench: {message}");
            std::process::exit(1);
        }
    }
}
