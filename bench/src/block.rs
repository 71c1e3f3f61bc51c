//! `netdam-bench block`: 4 KiB random reads and writes on a namespace through netdam, beside
//! fio's io_uring engine on the same file in the same run (the device floor); then READ 64 B
//! latency of memory with and without a concurrent 4 KiB random-write load on the namespace.
//!
//! The netdam target runs in this process with one worker, its namespace on the file; one
//! client keeps `depth` requests in flight and times each from submission to answer. fio runs
//! as a child process with O_DIRECT, registered files and buffers, like the target's backend.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use netdam_initiator::session::SessionConfig;
use netdam_initiator::swift::SwiftConfig;
use netdam_initiator::{Client, ClientOptions, ClientPoll, Op};
use netdam_isa::control::NamespaceInfo;
use netdam_isa::limits::IN_PROGRESS_NOTICE_INTERVAL;
use netdam_isa::rng::Rng;
use netdam_target::config::{Config, NamespaceBackend, NamespaceConfig, PollMode};
use netdam_target::stats::Counter;
use netdam_target::Target;
use serde_json::json;

use crate::{histogram, record};

/// How the target worker and the timed client wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BlockPoll {
    /// Worker and client spin: lowest latency, two cores busy.
    Busy,
    /// The worker spins briefly after each datagram (and while I/O is in flight), then sleeps;
    /// the client spins while an answer is due soon, then sleeps (`ClientPoll::Adaptive`). The
    /// target's default.
    Adaptive,
    /// Worker (when no I/O is in flight) and client sleep in the kernel.
    Blocking,
}

impl BlockPoll {
    pub(crate) fn target(self) -> PollMode {
        match self {
            BlockPoll::Busy => PollMode::Busy,
            BlockPoll::Adaptive => PollMode::Adaptive,
            BlockPoll::Blocking => PollMode::Blocking,
        }
    }

    pub(crate) fn client(self) -> ClientPoll {
        match self {
            BlockPoll::Busy => ClientPoll::Busy,
            BlockPoll::Adaptive => ClientPoll::Adaptive,
            BlockPoll::Blocking => ClientPoll::Blocking,
        }
    }
}

const BLOCK: u32 = 4096;

/// Settings of the block benchmark.
#[derive(Debug, Clone, clap::Args)]
pub struct BlockArgs {
    /// Backing file, filled with data first if shorter than --file-size [default: a file in a
    /// temporary directory under $TMPDIR, removed afterwards]. It must be on a file system
    /// with O_DIRECT (not tmpfs). A virtual disk may take random writes to a file written
    /// moments before several times slower than to an older one (the one these results were
    /// measured on did: docs/DECISIONS.md): to compare runs, name a file kept between them.
    #[arg(long, value_name = "PATH")]
    pub file: Option<PathBuf>,
    /// Size of the backing file.
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    pub file_size: u64,
    /// Seconds each case is measured (after one second of warm-up).
    #[arg(long, default_value_t = 5.0, value_parser = crate::cli::seconds)]
    pub seconds: f64,
    /// Requests in flight, comma-separated (1 to 256).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 32], value_parser = crate::cli::in_flight())]
    pub depths: Vec<usize>,
    /// How the target worker and the timed client wait (fio sleeps in io_uring_enter). The
    /// write-load client of the READ measurement always sleeps.
    #[arg(long, value_enum, default_value_t = BlockPoll::Adaptive)]
    pub poll: BlockPoll,
    /// Congestion control (Swift) of the timed clients on, or a fixed window of --depths
    /// requests, like fio's queue depth.
    #[arg(long, value_enum, default_value_t = crate::OnOff::On)]
    pub cc: crate::OnOff,
    /// The target's `block_sqpoll_idle_ms`: 0 submits inline in the worker; N > 0 gives the
    /// worker's ring a kernel submission thread that sleeps after N ms without work.
    #[arg(long, default_value_t = 0)]
    pub sqpoll_idle_ms: u32,
    /// Skip fio (when it is not installed).
    #[arg(long)]
    pub no_fio: bool,
    /// Measure every case this many times, fio and netdam in turn in each round, and report
    /// each round's ratio to fio beside their median (this VM's disk moves by 10-30% between
    /// runs of the same case).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub rounds: u32,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Also write block.json and block.md to this directory.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

fn parse_size(text: &str) -> Result<u64, String> {
    netdam_isa::units::parse_bytes(text)
}

/// One measured case.
struct Case {
    system: String,
    pattern: &'static str,
    depth: usize,
    /// The round it was measured in (from 0).
    round: usize,
    ops: u64,
    seconds: f64,
    p50_ns: u64,
    p99_ns: u64,
    p999_ns: u64,
    /// netdam only: what the session saw, and the target of its retransmissions.
    session: Option<SessionFigures>,
}

/// A netdam case's session at its end, and what its target made of the retransmissions.
#[derive(Debug, Clone, Copy)]
struct SessionFigures {
    retransmissions: u64,
    /// Of those, requests with block I/O (the rest: HELLO and other control requests).
    block_retransmissions: u64,
    busy: u64,
    window: f64,
    /// Swift's two windows at the end, when it ran: which one held the depth back (the endpoint
    /// window answers requests waiting at the target, the fabric one the rest of the round trip).
    windows: Option<(f64, f64)>,
    /// The last fabric delay Swift saw and its fabric target then, µs (diagnosis).
    fabric_delay_us: Option<(f64, f64)>,
    /// Retransmissions of requests still waiting for their I/O, which the target answered with
    /// an in-progress notice: the device (or the worker) was slower than the timeout.
    still_in_progress: u64,
    /// In-progress notices the session received: requests that waited
    /// [`IN_PROGRESS_NOTICE_INTERVAL`] or more for their I/O (a stalling disk), whose timers the
    /// notices restarted instead of a resend.
    notices: u64,
    /// Retransmissions of requests the target had already answered: the answer was on its way,
    /// or waited in the initiator's socket, when the timeout fired.
    answered_before: u64,
}

impl Case {
    fn iops(&self) -> f64 {
        self.ops as f64 / self.seconds
    }

    fn to_json(&self) -> serde_json::Value {
        json!({"system": self.system, "pattern": self.pattern, "depth": self.depth, "round": self.round, "ops": self.ops,
               "seconds": self.seconds, "iops": self.iops(), "p50_ns": self.p50_ns, "p99_ns": self.p99_ns,
               "p999_ns": self.p999_ns, "retransmissions": self.session.map(|s| s.retransmissions),
               "block_retransmissions": self.session.map(|s| s.block_retransmissions),
               "busy": self.session.map(|s| s.busy), "window": self.session.map(|s| s.window),
               "endpoint_window": self.session.and_then(|s| s.windows.map(|w| w.0)),
               "fabric_window": self.session.and_then(|s| s.windows.map(|w| w.1)),
               "last_fabric_delay_us": self.session.and_then(|s| s.fabric_delay_us.map(|d| d.0)),
               "fabric_target_us": self.session.and_then(|s| s.fabric_delay_us.map(|d| d.1)),
               "duplicates_in_progress": self.session.map(|s| s.still_in_progress),
               "in_progress_notices": self.session.map(|s| s.notices),
               "duplicates_answered_before": self.session.map(|s| s.answered_before)})
    }
}

/// Runs the benchmark and prints its tables.
pub fn run(args: &BlockArgs) -> Result<(), String> {
    let scratch = tempfile::tempdir().map_err(|error| format!("temporary directory: {error}"))?;
    let file = args.file.clone().unwrap_or_else(|| scratch.path().join("netdam-bench-block.img"));
    prepare_file(&file, args.file_size)?;
    let fio = if args.no_fio { None } else { Some(fio_version()?) };
    let rounds = crate::report::run_rounds(args.rounds, |round| {
        measure_round(&file, scratch.path(), args, fio.is_some(), round)
    })?;
    let completed = rounds.measured.len();
    let mut missing = rounds.missing();
    let cases: Vec<Case> = rounds.measured.into_iter().flatten().collect();
    let under_load = match read_under_write_load(&file, scratch.path(), args) {
        Ok(under_load) => under_load,
        // Whatever ended the rounds early may fail this too: the rounds measured still stand.
        Err(reason) if missing.is_some() => {
            missing = missing.map(|missing| format!("{missing}; the memory READ under load: {reason}"));
            Vec::new()
        }
        Err(reason) => return Err(reason),
    };
    let rounds = RoundsDone { asked: args.rounds, completed, missing };
    if args.json {
        println!("{}", report_json(args, fio.as_deref(), &rounds, &cases, &under_load));
    } else {
        print!("{}", tables(args, fio.as_deref(), &rounds, &cases, &under_load));
    }
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).map_err(|error| format!("creating {}: {error}", dir.display()))?;
        let json = format!("{:#}\n", report_json(args, fio.as_deref(), &rounds, &cases, &under_load));
        std::fs::write(dir.join("block.json"), json).map_err(|error| error.to_string())?;
        let markdown = format!("```text\n{}```\n", tables(args, fio.as_deref(), &rounds, &cases, &under_load));
        std::fs::write(dir.join("block.md"), markdown).map_err(|error| error.to_string())?;
        eprintln!("wrote {}/block.json and block.md", dir.display());
    }
    Ok(())
}

/// How many of the rounds asked for were measured, and why the rest were not, for the report.
#[derive(Debug)]
struct RoundsDone {
    asked: u32,
    completed: usize,
    /// "rounds N to M: reason" (`report::Rounds::missing`), and the memory READ under load's
    /// failure after it, if any.
    missing: Option<String>,
}

/// One round: every pattern and depth, fio (when it runs) then netdam.
fn measure_round(
    file: &Path,
    data_dir: &Path,
    args: &BlockArgs,
    with_fio: bool,
    round: usize,
) -> Result<Vec<Case>, String> {
    let mut cases = Vec::new();
    for pattern in ["randread", "randwrite"] {
        for &depth in &args.depths {
            if with_fio {
                cases.push(Case { round, ..fio_case(file, args, pattern, depth)? });
            }
            cases.push(Case { round, ..netdam_case(file, data_dir, args, pattern, depth)? });
        }
    }
    Ok(cases)
}

/// Makes `path` at least `bytes` long with every block allocated and written (reads of holes
/// would not reach the device).
fn prepare_file(path: &Path, bytes: u64) -> Result<(), String> {
    use std::io::Write;
    let existing = std::fs::metadata(path).map(|metadata| metadata.len()).unwrap_or(0);
    if existing >= bytes {
        return Ok(());
    }
    let fail = |error: std::io::Error| format!("preparing {}: {error}", path.display());
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(fail)?;
    let mut rng = Rng::new(42);
    let chunk = rng.bytes(1 << 20);
    let mut written = existing;
    while written < bytes {
        let len = (bytes - written).min(chunk.len() as u64) as usize;
        file.write_all(&chunk[..len]).map_err(fail)?;
        written += len as u64;
    }
    file.sync_all().map_err(fail)
}

fn fio_version() -> Result<String, String> {
    let output = Command::new("fio").arg("--version").output().map_err(|error| {
        format!("fio is needed for the device floor ({error}); install it (apt-get install fio) or pass --no-fio")
    })?;
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

fn fio_case(file: &Path, args: &BlockArgs, pattern: &'static str, depth: usize) -> Result<Case, String> {
    let output = Command::new("fio")
        .args([
            "--name=floor",
            &format!("--filename={}", file.display()),
            &format!("--size={}", args.file_size),
            &format!("--rw={pattern}"),
            "--bs=4k",
            "--direct=1",
            "--ioengine=io_uring",
            "--fixedbufs=1",
            "--registerfiles=1",
            &format!("--iodepth={depth}"),
            "--time_based=1",
            "--ramp_time=1",
            &format!("--runtime={}", args.seconds.max(1.0).ceil() as u64),
            "--lat_percentiles=1",
            "--percentile_list=50:99:99.9",
            "--norandommap=1",
            "--randrepeat=0",
            "--output-format=json",
        ])
        .output()
        .map_err(|error| format!("running fio: {error}"))?;
    if !output.status.success() {
        return Err(format!("fio failed: {}", String::from_utf8_lossy(&output.stderr)));
    }
    let report: serde_json::Value = serde_json::from_slice(&output.stdout)
        .map_err(|error| format!("fio's JSON: {error}: {}", String::from_utf8_lossy(&output.stdout)))?;
    let side = if pattern == "randread" { "read" } else { "write" };
    let job = &report["jobs"][0][side];
    let percentile = |key: &str| job["lat_ns"]["percentile"][key].as_u64().unwrap_or(0);
    let ops = job["total_ios"].as_u64().unwrap_or(0);
    let seconds = job["runtime"].as_f64().unwrap_or(0.0) / 1000.0;
    Ok(Case {
        system: "fio io_uring".into(),
        pattern,
        depth,
        round: 0,
        ops,
        seconds,
        p50_ns: percentile("50.000000"),
        p99_ns: percentile("99.000000"),
        p999_ns: percentile("99.900000"),
        session: None,
    })
}

fn target_config(file: &Path, data_dir: &Path, args: &BlockArgs) -> Config {
    let namespace = NamespaceConfig {
        name: "disk".into(),
        backend: NamespaceBackend::File,
        path: file.to_path_buf(),
        size: None,
        block_size: BLOCK,
    };
    Config {
        block_sqpoll_idle_ms: args.sqpoll_idle_ms,
        ..crate::target::config(data_dir, args.poll.target(), namespace)
    }
}

impl BlockArgs {
    /// The timed clients' congestion control: none with `--cc off`.
    fn congestion(&self) -> Option<SwiftConfig> {
        (self.cc == crate::OnOff::On).then(SwiftConfig::default)
    }
}

fn client(
    target: &Target,
    poll: ClientPoll,
    depth: usize,
    congestion: Option<SwiftConfig>,
) -> Result<(Client, NamespaceInfo), String> {
    let session = SessionConfig { max_in_flight: depth.max(1), congestion, ..SessionConfig::default() };
    let client = Client::connect_with(target.local_addr(), ClientOptions { session, poll, ..ClientOptions::default() })
        .map_err(|error| format!("netdam client: {error}"))?;
    let disk = client.namespace("disk").map_err(|error| error.to_string())?.clone();
    Ok((client, disk))
}

/// Random 4 KiB reads or writes at `depth` for `seconds` (after `warmup`), each timed.
fn drive(
    client: &mut Client,
    disk: &NamespaceInfo,
    write: bool,
    depth: usize,
    warmup: Duration,
    seconds: f64,
    seed: u64,
) -> Result<(Histogram<u64>, u64), String> {
    let mut rng = Rng::new(seed);
    let data = rng.bytes(BLOCK as usize);
    let mut histogram = histogram();
    let mut submitted_at = std::collections::HashMap::with_capacity(depth * 2);
    let started = Instant::now();
    let measure_from = started + warmup;
    let stop_at = measure_from + Duration::from_secs_f64(seconds);
    let mut measured = 0u64;
    let mut in_flight = 0usize;
    loop {
        let now = Instant::now();
        while now < stop_at && in_flight < depth {
            let block = rng.below(disk.capacity_blocks);
            let op = if write {
                Op::block_write(disk.id, block, BLOCK, &data, false)
            } else {
                Op::block_read(disk.id, block, 1)
            };
            let started = Instant::now();
            let ticket = client.submit(&[op]).map_err(|error| error.to_string())?;
            submitted_at.insert(ticket, started);
            in_flight += 1;
        }
        let Some((ticket, result)) = client.wait_any().map_err(|error| error.to_string())? else { break };
        in_flight -= 1;
        let reply = result.map_err(|error| error.to_string())?;
        reply.data(0).map_err(|error| error.to_string())?;
        let submitted = submitted_at.remove(&ticket).expect("every ticket was timed");
        let done = Instant::now();
        if submitted >= measure_from && done <= stop_at {
            record(&mut histogram, done - submitted);
            measured += 1;
        }
    }
    Ok((histogram, measured))
}

fn netdam_case(
    file: &Path,
    data_dir: &Path,
    args: &BlockArgs,
    pattern: &'static str,
    depth: usize,
) -> Result<Case, String> {
    let target = Target::start(&target_config(file, data_dir, args)).map_err(|error| error.to_string())?;
    let (mut client, disk) = client(&target, args.poll.client(), depth, args.congestion())?;
    let write = pattern == "randwrite";
    let (histogram, ops) = drive(&mut client, &disk, write, depth, Duration::from_secs(1), args.seconds, 7)?;
    let seconds = args.seconds;
    let stats = client.session_stats();
    drop(client);
    let counters = target.stats();
    let counter = |counter: Counter| counters.get(counter.name()).expect("every counter is in the snapshot");
    let session = SessionFigures {
        retransmissions: stats.retransmissions,
        block_retransmissions: stats.block_retransmissions,
        busy: stats.busy,
        window: stats.window,
        windows: stats.swift.map(|swift| (swift.endpoint_window, swift.fabric_window)),
        fabric_delay_us: stats.swift.map(|swift| {
            (swift.last_fabric_delay.as_nanos() as f64 / 1e3, swift.fabric_target.as_nanos() as f64 / 1e3)
        }),
        still_in_progress: counter(Counter::DuplicatesInProgress),
        notices: stats.in_progress_notices,
        answered_before: counter(Counter::DuplicatesExecutedAgain) + counter(Counter::DuplicatesReplayed),
    };
    target.stop();
    Ok(Case {
        system: "netdam".into(),
        pattern,
        depth,
        round: 0,
        ops,
        seconds,
        p50_ns: histogram.value_at_quantile(0.5),
        p99_ns: histogram.value_at_quantile(0.99),
        p999_ns: histogram.value_at_quantile(0.999),
        session: Some(session),
    })
}

/// READ 64 B round trips on the memory region: alone, then while another client keeps 32
/// random 4 KiB writes in flight on the namespace served by the same worker.
fn read_under_write_load(
    file: &Path,
    data_dir: &Path,
    args: &BlockArgs,
) -> Result<Vec<(String, Histogram<u64>, u64)>, String> {
    let target = Target::start(&target_config(file, data_dir, args)).map_err(|error| error.to_string())?;
    let mut results = Vec::new();
    for loaded in [false, true] {
        let stop = Arc::new(AtomicBool::new(false));
        let load = loaded.then(|| {
            let stop = stop.clone();
            let addr = target.local_addr();
            std::thread::spawn(move || -> Result<u64, String> {
                // Sleeping, so that on a small machine the load competes for the worker, not for
                // the CPU the timed client spins on.
                let session = SessionConfig { max_in_flight: 32, ..SessionConfig::default() };
                let options = ClientOptions { session, poll: ClientPoll::Blocking, ..ClientOptions::default() };
                let mut client = Client::connect_with(addr, options).map_err(|e| e.to_string())?;
                let disk = client.namespace("disk").map_err(|e| e.to_string())?.clone();
                let mut writes = 0;
                while !stop.load(Ordering::Relaxed) {
                    let (_, done) = drive(&mut client, &disk, true, 32, Duration::ZERO, 0.2, writes)?;
                    writes += done;
                }
                Ok(writes)
            })
        });
        if loaded {
            std::thread::sleep(Duration::from_secs(1));
        }
        let (mut reader, _) = client(&target, args.poll.client(), 1, Some(SwiftConfig::default()))?;
        let mut histogram = histogram();
        let stop_at = Instant::now() + Duration::from_secs_f64(args.seconds);
        let mut index = 0u64;
        while Instant::now() < stop_at {
            let offset = (index.wrapping_mul(2_654_435_761) % (1 << 20)) * 64;
            index += 1;
            let started = Instant::now();
            let reply = reader.call(&[Op::read(0, offset, 64)]).map_err(|error| error.to_string())?;
            reply.data(0).map_err(|error| error.to_string())?;
            record(&mut histogram, started.elapsed());
        }
        stop.store(true, Ordering::Relaxed);
        let writes = match load {
            Some(thread) => thread.join().map_err(|_| "the write-load thread panicked".to_string())??,
            None => 0,
        };
        let name = if loaded { "READ 64 B, 32 random 4 KiB writes in flight" } else { "READ 64 B, idle namespace" };
        results.push((name.to_string(), histogram, writes));
    }
    target.stop();
    Ok(results)
}

type UnderLoad = [(String, Histogram<u64>, u64)];

/// Each case's median over the rounds (system, pattern and depth): IOPS and percentiles each
/// taken apart, the session's retransmissions and BUSY answers summed. What `compare` reads.
fn median_cases_json(cases: &[Case]) -> Vec<serde_json::Value> {
    let mut medians = Vec::new();
    for rounds in crate::report::groups_by(cases, |case| (case.system.clone(), case.pattern, case.depth)) {
        let case = rounds[0];
        let median_of = |value: &dyn Fn(&Case) -> f64| {
            crate::report::median(&rounds.iter().map(|case| value(case)).collect::<Vec<_>>())
        };
        let sum_of = |value: &dyn Fn(&SessionFigures) -> u64| {
            rounds.iter().filter_map(|case| case.session.as_ref().map(value)).reduce(|a, b| a + b)
        };
        medians.push(json!({"system": case.system, "pattern": case.pattern, "depth": case.depth,
            "rounds": rounds.len(), "iops": median_of(&|case| case.iops()),
            "p50_ns": median_of(&|case| case.p50_ns as f64) as u64, "p99_ns": median_of(&|case| case.p99_ns as f64) as u64,
            "p999_ns": median_of(&|case| case.p999_ns as f64) as u64,
            "retransmissions": sum_of(&|s| s.retransmissions), "busy": sum_of(&|s| s.busy)}));
    }
    medians
}

/// fio's case of the same round, pattern and depth as `case`: what its ratios are to.
fn floor_of<'a>(cases: &'a [Case], case: &Case) -> Option<&'a Case> {
    cases.iter().find(|other| {
        other.system.starts_with("fio")
            && (other.round, other.pattern, other.depth) == (case.round, case.pattern, case.depth)
    })
}

/// netdam's IOPS over fio's, per pattern and depth: each round's ratio (fio's case of the same
/// round) and their median.
fn iops_ratios(cases: &[Case]) -> Vec<(&'static str, usize, Vec<f64>, f64)> {
    let paired: Vec<(&Case, f64)> = cases
        .iter()
        .filter(|case| case.system == "netdam")
        .filter_map(|case| Some((case, case.iops() / floor_of(cases, case)?.iops().max(f64::MIN_POSITIVE))))
        .collect();
    crate::report::groups_by(&paired, |(case, _)| (case.pattern, case.depth))
        .into_iter()
        .map(|group| {
            let rounds: Vec<f64> = group.iter().map(|(_, ratio)| *ratio).collect();
            let median = crate::report::median(&rounds);
            (group[0].0.pattern, group[0].0.depth, rounds, median)
        })
        .collect()
}

/// Per pattern and depth, over the rounds: netdam's cases, how many got BUSY answers (and how
/// many in all), and how many resent requests (and how many in all). Issue 11 asks for neither
/// with one initiator at depth 32.
struct SessionTally {
    pattern: &'static str,
    depth: usize,
    cases: usize,
    cases_busy: usize,
    busy: u64,
    cases_resent: usize,
    retransmissions: u64,
    cases_noticed: usize,
    notices: u64,
}

fn session_tallies(cases: &[Case]) -> Vec<SessionTally> {
    let netdam: Vec<(&Case, SessionFigures)> =
        cases.iter().filter_map(|case| case.session.map(|session| (case, session))).collect();
    crate::report::groups_by(&netdam, |(case, _)| (case.pattern, case.depth))
        .into_iter()
        .map(|group| SessionTally {
            pattern: group[0].0.pattern,
            depth: group[0].0.depth,
            cases: group.len(),
            cases_busy: group.iter().filter(|(_, session)| session.busy > 0).count(),
            busy: group.iter().map(|(_, session)| session.busy).sum(),
            cases_resent: group.iter().filter(|(_, session)| session.retransmissions > 0).count(),
            retransmissions: group.iter().map(|(_, session)| session.retransmissions).sum(),
            cases_noticed: group.iter().filter(|(_, session)| session.notices > 0).count(),
            notices: group.iter().map(|(_, session)| session.notices).sum(),
        })
        .collect()
}

fn report_json(
    args: &BlockArgs,
    fio: Option<&str>,
    rounds: &RoundsDone,
    cases: &[Case],
    under_load: &UnderLoad,
) -> serde_json::Value {
    let loads: Vec<_> = under_load
        .iter()
        .map(|(name, h, writes)| {
            json!({"name": name, "count": h.len(), "p50_ns": h.value_at_quantile(0.5), "p99_ns": h.value_at_quantile(0.99),
                   "p999_ns": h.value_at_quantile(0.999), "max_ns": h.max(), "concurrent_writes": writes})
        })
        .collect();
    let rows = median_cases_json(cases);
    let round_rows: Vec<_> = cases.iter().map(Case::to_json).collect();
    let ratios: Vec<_> = iops_ratios(cases)
        .into_iter()
        .map(|(pattern, depth, rounds, median)| {
            json!({"pattern": pattern, "depth": depth, "round_ratios": rounds, "iops_x_fio": median})
        })
        .collect();
    json!({"machine": crate::report::machine(), "fio": fio, "poll": format!("{:?}", args.poll).to_lowercase(),
           "congestion_control": format!("{:?}", args.cc).to_lowercase(), "file_bytes": args.file_size, "file": file_origin(args),
           "seconds": args.seconds, "sqpoll_idle_ms": args.sqpoll_idle_ms, "rounds": rounds.completed, "rounds_asked": rounds.asked,
           "rounds_missing": rounds.missing, "cases": rows, "round_cases": round_rows, "iops_x_fio": ratios, "read_under_write_load": loads})
}

/// Where the file came from, for the report (never its path): random writes on some virtual
/// disks run several times slower on a file written moments before (docs/DECISIONS.md).
fn file_origin(args: &BlockArgs) -> &'static str {
    if args.file.is_some() {
        "given with --file"
    } else {
        "written for this run"
    }
}

fn tables(args: &BlockArgs, fio: Option<&str>, rounds: &RoundsDone, cases: &[Case], under_load: &UnderLoad) -> String {
    use std::fmt::Write;
    let us = |ns: u64| ns as f64 / 1000.0;
    let mut text = String::new();
    let _ = writeln!(text, "machine: {} (absolute numbers hold for this machine only)", crate::report::machine());
    let _ = writeln!(
        text,
        "4 KiB random I/O on one {} MiB file ({}), {:.0} s per case, {:?} polling, congestion control {:?}, {}; fio: {}",
        args.file_size >> 20,
        file_origin(args),
        args.seconds,
        args.poll,
        args.cc,
        match args.sqpoll_idle_ms {
            0 => "block I/O submitted inline by the worker".to_string(),
            idle => format!("block I/O submitted by a kernel thread (SQPOLL, idle after {idle} ms)"),
        },
        fio.unwrap_or("skipped")
    );
    let _ = writeln!(
        text,
        "{:<14} {:>5} {:<10} {:>5} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9}  session",
        "system", "round", "pattern", "depth", "IOPS", "p50 µs", "p99 µs", "p99.9 µs", "IOPS x", "p99.9 x"
    );
    for case in cases {
        let floor = floor_of(cases, case);
        let (iops_ratio, tail_ratio) = match floor {
            Some(floor) => (
                format!("{:.2}", case.iops() / floor.iops()),
                format!("{:.2}", case.p999_ns as f64 / floor.p999_ns as f64),
            ),
            None => ("-".into(), "-".into()),
        };
        let session = case
            .session
            .map(|figures| {
                let SessionFigures {
                    retransmissions,
                    block_retransmissions,
                    busy,
                    window,
                    windows,
                    fabric_delay_us,
                    still_in_progress,
                    notices,
                    answered_before,
                } = figures;
                let why = if retransmissions > 0 {
                    format!(
                        " ({block_retransmissions} of block I/O; at the target {still_in_progress} still in progress, \
                         {answered_before} answered before)"
                    )
                } else {
                    String::new()
                };
                let windows = windows
                    .map(|(endpoint, fabric)| format!(" (endpoint {endpoint:.1}, fabric {fabric:.1})"))
                    .unwrap_or_default();
                let windows = match fabric_delay_us {
                    Some((delay, target)) => format!("{windows}, fabric delay {delay:.0} µs against {target:.0}"),
                    None => windows,
                };
                format!(
                    "{retransmissions} retransmitted{why}, {notices} in-progress notices, {busy} busy, \
                     window {window:.1}{windows}"
                )
            })
            .unwrap_or_default();
        let _ = writeln!(
            text,
            "{:<14} {:>5} {:<10} {:>5} {:>10.0} {:>9.1} {:>9.1} {:>9.1} {:>9} {:>9}  {session}",
            case.system,
            case.round + 1,
            case.pattern,
            case.depth,
            case.iops(),
            us(case.p50_ns),
            us(case.p99_ns),
            us(case.p999_ns),
            iops_ratio,
            tail_ratio
        );
    }
    let _ = writeln!(text);
    let ratios = iops_ratios(cases);
    if let Some(missing) = &rounds.missing {
        let _ = writeln!(text, "not measured: {missing}\n");
    }
    if rounds.completed > 1 && !ratios.is_empty() {
        let _ = writeln!(
            text,
            "netdam's IOPS over fio's in the same round, and the median of the {} rounds:",
            rounds.completed
        );
        for (pattern, depth, per_round, median) in ratios {
            let each: Vec<String> = per_round.iter().map(|ratio| format!("{ratio:.2}")).collect();
            let _ = writeln!(text, "  {pattern:<10} depth {depth:>3}: {}  median {median:.2}", each.join(" "));
        }
        let _ = writeln!(text);
    }
    let tallies = session_tallies(cases);
    if !tallies.is_empty() {
        let _ = writeln!(
            text,
            "netdam's cases with BUSY answers, with requests resent, and with in-progress notices (requests that \
             waited {} ms or more for the disk, not resent):",
            IN_PROGRESS_NOTICE_INTERVAL.as_nanos() / 1_000_000
        );
        for tally in tallies {
            let _ = writeln!(
                text,
                "  {:<10} depth {:>3}: BUSY in {} of {} ({} answers), resent in {} of {} ({} requests), notices in {} of {} ({})",
                tally.pattern,
                tally.depth,
                tally.cases_busy,
                tally.cases,
                tally.busy,
                tally.cases_resent,
                tally.cases,
                tally.retransmissions,
                tally.cases_noticed,
                tally.cases,
                tally.notices
            );
        }
        let _ = writeln!(text);
    }
    let _ = writeln!(
        text,
        "{:<46} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "memory READ while the namespace works", "count", "p50 µs", "p99 µs", "p99.9 µs", "writes"
    );
    for (name, h, writes) in under_load {
        let _ = writeln!(
            text,
            "{:<46} {:>9} {:>9.1} {:>9.1} {:>9.1} {:>9}",
            name,
            h.len(),
            us(h.value_at_quantile(0.5)),
            us(h.value_at_quantile(0.99)),
            us(h.value_at_quantile(0.999)),
            writes
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(system: &str, round: usize, depth: usize, ops: u64) -> Case {
        Case {
            system: system.into(),
            pattern: "randread",
            depth,
            round,
            ops,
            seconds: 1.0,
            p50_ns: 1,
            p99_ns: 1,
            p999_ns: 1,
            session: None,
        }
    }

    #[test]
    fn each_rounds_ratio_is_to_fio_of_the_same_round() {
        let cases = [
            case("fio io_uring", 0, 32, 100),
            case("netdam", 0, 32, 80),
            case("fio io_uring", 1, 32, 200),
            case("netdam", 1, 32, 190),
            case("fio io_uring", 2, 32, 100),
            case("netdam", 2, 32, 90),
            // Another depth is a ratio of its own.
            case("fio io_uring", 0, 1, 10),
            case("netdam", 0, 1, 10),
        ];
        let ratios = iops_ratios(&cases);
        assert_eq!(ratios.len(), 2);
        let (pattern, depth, rounds, median) = &ratios[0];
        assert_eq!((*pattern, *depth), ("randread", 32));
        assert_eq!(rounds, &[0.8, 0.95, 0.9]);
        assert!((median - 0.9).abs() < 1e-12, "{median}");
        assert_eq!((ratios[1].1, ratios[1].3), (1, 1.0));
    }

    #[test]
    fn busy_answers_and_resent_requests_are_tallied_per_pattern_and_depth_over_the_rounds() {
        let with_session = |round: usize, depth: usize, busy: u64, retransmissions: u64, notices: u64| Case {
            session: Some(SessionFigures {
                retransmissions,
                block_retransmissions: retransmissions,
                busy,
                window: 32.0,
                windows: None,
                fabric_delay_us: None,
                still_in_progress: 0,
                notices,
                answered_before: 0,
            }),
            ..case("netdam", round, depth, 100)
        };
        let cases = [
            case("fio io_uring", 0, 32, 100),
            with_session(0, 32, 0, 0, 0),
            with_session(1, 32, 82, 0, 0),
            with_session(2, 32, 0, 24, 0),
            with_session(3, 32, 0, 0, 96),
            with_session(0, 1, 0, 0, 0),
        ];
        let tallies = session_tallies(&cases);
        let lines: Vec<_> = tallies
            .iter()
            .map(|t| {
                (t.depth, t.cases, t.cases_busy, t.busy, t.cases_resent, t.retransmissions, t.cases_noticed, t.notices)
            })
            .collect();
        assert_eq!(lines, [(32, 4, 1, 82, 1, 24, 1, 96), (1, 1, 0, 0, 0, 0, 0, 0)]);
    }

    #[test]
    fn a_late_round_that_fails_leaves_the_rounds_before_it_in_the_report() {
        let args = BlockArgs {
            file: None,
            file_size: 1 << 30,
            seconds: 1.0,
            depths: vec![32],
            poll: BlockPoll::Busy,
            cc: crate::OnOff::On,
            sqpoll_idle_ms: 0,
            no_fio: false,
            rounds: 5,
            json: false,
            out: None,
        };
        // Two rounds measure; the third fails; the rounds after it never run.
        let mut asked_for = Vec::new();
        let measured = crate::report::run_rounds(5, |round| {
            asked_for.push(round);
            match round {
                0 | 1 => {
                    Ok(vec![case("fio io_uring", round, 32, 100), case("netdam", round, 32, 80 + 10 * round as u64)])
                }
                _ => Err("fio failed: no space left on device".to_string()),
            }
        })
        .unwrap();
        assert_eq!(asked_for, [0, 1, 2]);
        let rounds = RoundsDone { asked: 5, completed: measured.measured.len(), missing: measured.missing() };
        assert_eq!(rounds.completed, 2);
        let cases: Vec<Case> = measured.measured.into_iter().flatten().collect();
        assert_eq!(cases.iter().map(|case| case.round).collect::<Vec<_>>(), [0, 0, 1, 1]);
        // A first round that fails is the run's error.
        assert!(crate::report::run_rounds(5, |_| Err::<Vec<Case>, _>("fio is missing".to_string())).is_err());
        let text = tables(&args, Some("fio-3.33"), &rounds, &cases, &Vec::new());
        assert!(text.contains("not measured: rounds 3 to 5: fio failed: no space left on device"), "{text}");
        assert!(text.contains("median of the 2 rounds"), "{text}");
        assert!(text.contains("0.80 0.90  median 0.85"), "{text}");
        let json = report_json(&args, Some("fio-3.33"), &rounds, &cases, &Vec::new());
        assert_eq!(json["rounds"], 2);
        assert_eq!(json["rounds_asked"], 5);
        assert_eq!(json["rounds_missing"], "rounds 3 to 5: fio failed: no space left on device");
        assert_eq!(json["iops_x_fio"][0]["round_ratios"], serde_json::json!([0.8, 0.9]));
    }
}
