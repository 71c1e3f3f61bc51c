//! `netdam-bench`: where netdam stands on this machine, measured against the floor of the
//! machine in the same run. Absolute times hold for this machine only; the ratios are the result.

mod allreduce;
mod block;
mod bulk;
mod cli;
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

use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use hdrhistogram::Histogram;
use netdam_initiator::{Client, Op};

/// Where netdam stands on this machine: every number beside a floor or a peer measured in the
/// same run, because absolute times hold for one machine only and the ratios are the result.
/// No result is pass/fail.
///
/// What each subcommand measures (`netdam-bench help COMMAND` for its options):
///   latency     round trips of one instruction at a time per opcode, size and polling mode, beside
///               a raw UDP echo of the same sizes (the floor); percentiles, jitter, idle CPU
///   floor       only that UDP echo, for the same cases
///   throughput  operations/s, latency and CPU per operation as depth (1 to 256) and sessions grow
///   block       4 KiB random reads and writes on a namespace beside fio's io_uring engine
///   fio         fio through the netdam engine and `netdam nbd`, beside `nbdkit memory`
///   allreduce   Allreduce through the target (VADD) against host-side reduction, N processes
///   compare     two reports of one kind (OLD.json NEW.json), moves past a threshold flagged
///   sim         one run of the congestion-control simulator (virtual clock, seeded network)
///   sim-table   the table of simulated results (docs/SIMULATION.md)
///   bulk        one large WRITE and READ through the client's pipeline beside a UDP transfer
///   tenancy     what authentication costs and what QoS protects, in one run
///   integrity   what checking one datagram costs: CRC-32C, the MAC trailer, HMAC-SHA256
///   noise       what this machine takes from a spinning thread on each CPU: the floor of the tail
///   load        one initiator writing to a running target; one JSON line (ops/netns-incast.sh)
///
/// `--out DIR` writes JSON for machines, markdown for people and PNG plots; every report names
/// the machine (cores, CPU model, kernel). `ops/performance.sh` regenerates the README's results
/// in docs/results.
#[derive(Debug, Parser)]
#[command(name = "netdam-bench", version, verbatim_doc_comment)]
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
    /// Where this initiator's writes start (bytes: 4096, 0x1000, 64KiB, 1MiB); they cycle
    /// through --span bytes from here, which must end inside the region.
    #[arg(long, default_value = "0", value_parser = cli::bytes)]
    offset: u64,
    /// Bytes the writes cycle through.
    #[arg(long, default_value = "1MiB", value_parser = cli::bytes)]
    span: u64,
    /// Bytes per write: 1 to 8920, what one 9000-byte datagram carries with its headers and an
    /// authentication trailer.
    #[arg(long, default_value = "1024", value_parser = load_write_bytes)]
    size: usize,
    /// How long to write, seconds (more than 0).
    #[arg(long, default_value_t = 5.0, value_parser = cli::seconds)]
    seconds: f64,
    /// Requests in flight at most (1 to 256).
    #[arg(long, default_value_t = 32, value_parser = cli::in_flight())]
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
    /// Initiators sharing the bottleneck to the target (at least 1).
    #[arg(long, default_value_t = 8, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    initiators: usize,
    /// incast: 4 KiB writes as fast as the window allows for --millis; checked: --ops operations
    /// per initiator checked for exactly-once execution.
    #[arg(long, value_enum, default_value_t = SimWorkload::Incast)]
    workload: SimWorkload,
    /// Simulated milliseconds of incast (1 to 3,600,000: an hour).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    millis: u64,
    /// Operations per initiator (checked workload).
    #[arg(long, default_value_t = 1000)]
    ops: u64,
    /// Congestion control (Swift) on, or a fixed window of --window requests.
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    cc: OnOff,
    /// Requests each initiator keeps in flight at most (1 to 256).
    #[arg(long, default_value_t = 32, value_parser = cli::in_flight())]
    window: usize,
    /// Probability of losing a datagram at the bottleneck (0 to 1).
    #[arg(long, default_value_t = 0.0, value_parser = cli::probability)]
    loss: f64,
    /// Probability of duplicating one (0 to 1).
    #[arg(long, default_value_t = 0.0, value_parser = cli::probability)]
    duplicate: f64,
    /// Probability of delaying one past later ones (0 to 1).
    #[arg(long, default_value_t = 0.0, value_parser = cli::probability)]
    reorder: f64,
    /// One-way propagation delay per link, µs (0 to 1,000,000).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    propagation_us: u64,
    /// Swift's initial window, requests (more than 0; with --cc on).
    #[arg(long, default_value_t = netdam_initiator::swift::SwiftConfig::default().initial_window,
          value_parser = positive_window)]
    initial_window: f64,
    /// Buffer of the bottleneck port, KiB (1 to 1,048,576: a GiB).
    #[arg(long, default_value_t = 256,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1 << 20))]
    buffer_kib: usize,
    /// Floor of the retransmission timeout, µs (1 to 60,000,000: a minute).
    #[arg(long, default_value_t = netdam_initiator::session::SessionConfig::default().min_rto.as_nanos() / 1000,
          value_parser = clap::value_parser!(u64).range(1..=60_000_000))]
    min_rto_us: u64,
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

/// Largest `load --size`: one WRITE in a datagram of the default size, with its headers and the
/// trailer of an authenticated session (`--key`).
const LOAD_MAX_WRITE_BYTES: usize =
    cli::instruction_room(netdam_isa::limits::DEFAULT_DATAGRAM_BYTES, netdam_auth::TRAILER_BYTES, 1).request;

fn load_write_bytes(text: &str) -> Result<usize, String> {
    let bytes = cli::bytes(text)?;
    if (1..=LOAD_MAX_WRITE_BYTES as u64).contains(&bytes) {
        Ok(bytes as usize)
    } else {
        Err(format!(
            "{bytes} is not in 1..={LOAD_MAX_WRITE_BYTES} (one WRITE per {}-byte datagram)",
            netdam_isa::limits::DEFAULT_DATAGRAM_BYTES
        ))
    }
}

fn positive_window(text: &str) -> Result<f64, String> {
    let window: f64 = text.trim().parse().map_err(|_| format!("{text:?} is not a number of requests"))?;
    if window > 0.0 && window.is_finite() {
        Ok(window)
    } else {
        Err(format!("{text} is not a window: give a number of requests above 0"))
    }
}

impl Command {
    /// Refuses what clap's value parsers cannot see alone (a size an instruction cannot move,
    /// given the others): the subcommand's name and the message.
    fn check(&self) -> Result<(), (&'static str, String)> {
        match self {
            Command::Latency(args) => latency::check(args, true).map_err(|message| ("latency", message)),
            Command::Floor(args) => latency::check(args, false).map_err(|message| ("floor", message)),
            Command::Throughput(args) => throughput::check(args).map_err(|message| ("throughput", message)),
            _ => Ok(()),
        }
    }
}

/// Parses the command line and checks it, so that a value no run can use is refused with
/// clap's error and usage (exit status 2) before anything starts.
fn parse_cli<I, T>(arguments: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = Cli::try_parse_from(arguments)?;
    cli.command.check().map_err(|(name, message)| {
        let mut command = Cli::command();
        command.build();
        let subcommand = command.find_subcommand_mut(name).expect("every checked subcommand exists");
        subcommand.error(clap::error::ErrorKind::ValueValidation, message)
    })?;
    Ok(cli)
}

fn main() {
    // An empty NETDAM_KEY (`export NETDAM_KEY=`, a shell's way to clear it) counts as unset,
    // as in `netdam` and the fio engine, rather than clap's "a value is required".
    if std::env::var_os("NETDAM_KEY").is_some_and(|value| value.is_empty()) {
        // SAFETY: at the start of main, before any thread exists.
        unsafe { std::env::remove_var("NETDAM_KEY") };
    }
    let cli = parse_cli(std::env::args_os()).unwrap_or_else(|error| error.exit());
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
    let region = client.region(&args.region).unwrap_or_else(|error| fail(error.to_string())).clone();
    let space = region.id;
    let slots = (args.span / args.size as u64).max(1);
    // The region's size is known only now: a range past its end is the caller's mistake (exit
    // status 2, as for the options clap refuses), not a run whose every write fails.
    let end = slots.checked_mul(args.size as u64).and_then(|bytes| bytes.checked_add(args.offset));
    if end.is_none_or(|end| end > region.size_bytes) {
        println!(
            "{}",
            serde_json::json!({ "error": format!(
                "--offset {} with --span {} and --size {}: the writes reach byte {}, past the end of region {:?} \
                 ({} bytes); keep --offset + --span within it",
                args.offset, args.span, args.size,
                end.map_or("2^64".to_string(), |end| end.to_string()), region.name, region.size_bytes
            ) })
        );
        std::process::exit(2);
    }
    let data = vec![0xA5u8; args.size];
    let mut latency = histogram();
    let mut rtt = histogram();
    let mut pending = std::collections::VecDeque::new();
    let mut failed = 0u64;
    let mut first_error = None;
    let mut written = 0u64;
    let started = Instant::now();
    let stop_at = started + Duration::from_secs_f64(args.seconds);
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
            Err(error) => {
                failed += 1;
                first_error.get_or_insert_with(|| error.to_string());
            }
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let stats = client.session_stats();
    let us = |histogram: &Histogram<u64>, q: f64| histogram.value_at_quantile(q) as f64 / 1000.0;
    let mut row = serde_json::json!({
        "operations": latency.len(), "failed": failed, "seconds": elapsed,
        "mbit_per_s": written as f64 * 8.0 / elapsed / 1e6,
        "latency_p50_us": us(&latency, 0.5), "latency_p99_us": us(&latency, 0.99),
        "rtt_p50_us": us(&rtt, 0.5), "rtt_p99_us": us(&rtt, 0.99),
        "transmissions": stats.transmissions, "retransmissions": stats.retransmissions,
        "busy": stats.busy, "window": stats.window,
    });
    if let Some(error) = &first_error {
        row["first_error"] = error.as_str().into();
    }
    // A run in which nothing was written measured nothing: it fails, with the reason.
    let nothing_written = latency.is_empty();
    if nothing_written {
        let reason =
            first_error.map_or("no write completed".to_string(), |error| format!("every write failed: {error}"));
        row["error"] = reason.into();
    }
    println!("{row}");
    if nothing_written {
        std::process::exit(1);
    }
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
    scenario.session.min_rto = Duration::from_micros(args.min_rto_us);
    if let Some(swift) = scenario.session.congestion.as_mut() {
        swift.initial_window = args.initial_window;
    }
    match sim::run(&scenario) {
        Ok(report) => print!("{report}"),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The message of the error `arguments` are refused with (clap's, or a check's).
    fn refusal(arguments: &str) -> String {
        match parse_cli(std::iter::once("netdam-bench").chain(arguments.split_whitespace())) {
            Ok(cli) => panic!("{arguments:?} accepted: {cli:?}"),
            Err(error) => {
                assert_eq!(error.exit_code(), 2, "{arguments:?} is a usage error");
                error.to_string()
            }
        }
    }

    fn accepted(arguments: &str) -> Cli {
        parse_cli(std::iter::once("netdam-bench").chain(arguments.split_whitespace()))
            .unwrap_or_else(|error| panic!("{arguments:?} refused: {error}"))
    }

    #[test]
    fn latency_sizes_are_what_each_instruction_can_move() {
        assert!(refusal("latency --sizes 0").contains("0 is not in 1..="));
        let read = refusal("latency --sizes 9000");
        assert!(read.contains("'9000' for '--sizes': READ moves 1 to 8960 bytes"), "{read}");
        assert!(read.contains("Usage: netdam-bench latency"), "{read}");
        assert!(refusal("latency --sizes 100000").contains("READ moves 1 to 8960"));
        assert!(refusal("latency --ops write --sizes 8945").contains("WRITE moves 1 to 8944"));
        assert!(refusal("latency --ops read --sizes 8937 --auth").contains("READ moves 1 to 8936"));
        assert!(refusal("latency --ops read,vadd --sizes 8192,8196").contains("VADD moves 1 to 8192"));
        assert!(refusal("latency --ops bwrite --sizes 8705").contains("BWRITE moves 1 to 8704"));
        assert!(refusal("latency --requests 0").contains("'0' for '--requests"));
        let Command::Latency(args) = accepted("latency --ops read,cas,bread --sizes 64,8704").command else {
            panic!("latency parses as latency")
        };
        assert_eq!(args.sizes, [64, 8704]);
        accepted("latency --ops crc32 --sizes 1048576");
        // The target answers a longer CRC32 too_large: refused here, not a panic mid-run.
        assert!(refusal("latency --ops crc32 --sizes 1048577").contains("CRC32 moves 1 to 1048576"));
    }

    #[test]
    fn floor_sizes_are_what_one_datagram_carries() {
        let refused = refusal("floor --sizes 70000 --poll blocking");
        assert!(refused.contains("READ moves 1 to 65467 bytes"), "{refused}");
        assert!(refused.contains("Usage: netdam-bench floor"), "{refused}");
        accepted("floor --sizes 9000,65467");
    }

    #[test]
    fn throughput_refuses_what_would_panic_hang_or_print_nonsense() {
        assert!(
            refusal("throughput --depths 0 --seconds 1").contains("'0' for '--depths <DEPTHS>': 0 is not in 1..=256")
        );
        assert!(refusal("throughput --depths 1,257").contains("257 is not in 1..=256"));
        assert!(refusal("throughput --sessions 0").contains("'0' for '--sessions <SESSIONS>': 0 is not in 1..=32"));
        assert!(refusal("throughput --seconds 0").contains("'0' for '--seconds <SECONDS>'"));
        assert!(refusal("throughput --seconds NaN").contains("'NaN' for '--seconds <SECONDS>'"));
        assert!(refusal("throughput --batch 0").contains("'0' for '--batch <BATCH>'"));
        assert!(refusal("throughput --sizes 9000").contains("READ moves 1 to 8960 bytes at --batch 1"));
        let Command::Throughput(args) = accepted("throughput --depths 1,256 --sessions 32 --seconds 0.5").command
        else {
            panic!("throughput parses as throughput")
        };
        assert_eq!((args.depths, args.sessions, args.seconds), (vec![1, 256], vec![32], 0.5));
    }

    #[test]
    fn load_takes_byte_counts_as_netdam_does_and_refuses_empty_writes() {
        let load = |extra: &str| format!("load --target 127.0.0.1:7800 {extra}");
        assert!(refusal(&load("--size 0")).contains("0 is not in 1..=8920"));
        assert!(refusal(&load("--size 9000")).contains("9000 is not in 1..=8920"));
        assert!(refusal(&load("--window 0")).contains("0 is not in 1..=256"));
        assert!(refusal(&load("--seconds 0")).contains("'--seconds <SECONDS>'"));
        assert!(refusal(&load("--offset 64MiBs")).contains("unknown unit"));
        let Command::Load(args) = accepted(&load("--offset 64MiB --span 0x1000 --size 4KiB")).command else {
            panic!("load parses as load")
        };
        assert_eq!((args.offset, args.span, args.size), (64 << 20, 4096, 4096));
    }

    #[test]
    fn sim_refuses_windows_and_probabilities_out_of_range() {
        assert!(refusal("sim --window 0").contains("0 is not in 1..=256"));
        assert!(refusal("sim --initiators 0").contains("'0' for '--initiators"));
        assert!(refusal("sim --loss 1.5").contains("[0, 1]"));
        assert!(refusal("sim --initial-window 0").contains("above 0"));
        let Command::Sim(args) = accepted("sim").command else { panic!("sim parses as sim") };
        assert_eq!((args.initial_window, args.min_rto_us), (1.0, 500));
    }

    #[test]
    fn block_and_tenancy_windows_are_a_session_s() {
        assert!(refusal("block --depths 0").contains("0 is not in 1..=256"));
        assert!(refusal("tenancy --flood-window 300").contains("300 is not in 1..=256"));
    }
}
