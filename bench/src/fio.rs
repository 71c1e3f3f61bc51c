//! `netdam-bench fio`: the same fio 3.33 jobs (4 KiB random reads and writes at each depth)
//! through three ways of reaching block storage held in memory, in one run: the netdam fio
//! engine (libnetdam_fio.so) against a netdam target; fio's `nbd` engine against `netdam nbd`
//! exporting that target's namespace; and fio's `nbd` engine against `nbdkit memory`, the peer.
//! The NBD cases run over TCP on loopback and over a Unix socket.
//!
//! The target runs in this process with one worker and a 1 GiB pmem namespace (a file mapping
//! under a temporary directory on tmpfs where the machine has /dev/shm, so memory, like
//! `nbdkit memory`); `netdam nbd`, nbdkit and fio are child
//! processes, killed when their cases end (also on an error). A system that cannot run here
//! (no fio, no nbdkit, no engine, no `netdam` binary) is skipped with the reason and the rest
//! still run. The goals are ratios within the run and never fail. Every block is written before
//! the cases, so that reads of a sparse store do not return zeroes for free.
//!
//! The NBD cases at depth 32 run once more in the *remote layout*: the target's worker keeps its
//! CPU to itself, as a target on another machine would, and fio and the NBD server (`netdam
//! nbd`, or nbdkit) run on the other CPUs only. In the shared layout nbdkit has every core while
//! netdam's busy worker spins on one of them beside fio and the export; the remote layout gives
//! both servers the same CPUs.

use std::fmt::Write as _;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use netdam_target::config::{ByteSize, NamespaceBackend, NamespaceConfig, PollMode};
use netdam_target::Target;
use serde_json::json;

use crate::block::BlockPoll;
use crate::latency::LatencyPoll;

/// The namespace every netdam case uses.
const NAMESPACE: &str = "mem";
const NAMESPACE_BYTES: u64 = 1 << 30;
/// The namespace's file, under the temporary data directory.
const NAMESPACE_FILE: &str = "mem.region";
/// Where the namespace's file goes when the machine has it: memory, not disk.
const SHARED_MEMORY_DIR: &str = "/dev/shm";
const BLOCK_BYTES: u32 = 4096;
/// The depths the goals compare at.
const LATENCY_DEPTH: usize = 1;
const THROUGHPUT_DEPTH: usize = 32;
/// How long a child server may take to accept its first connection.
const SERVER_START_TIMEOUT: Duration = Duration::from_secs(10);
const PATTERNS: [&str; 2] = ["randread", "randwrite"];
/// How long the machine's noise is measured before each round (`netdam-bench noise`).
const NOISE_SECONDS: f64 = 2.0;

/// Settings of the fio comparison.
#[derive(Debug, Clone, clap::Args)]
pub struct FioArgs {
    /// Seconds each case is measured (fio's runtime, after one second of fio's ramp time).
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// fio iodepths, comma-separated (the goals compare depths 1 and 32).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 32])]
    pub depths: Vec<usize>,
    /// How the target worker waits, and the netdam engine's poll= (the same mode). NBD clients
    /// and servers always sleep in the kernel.
    #[arg(long, value_enum, default_value_t = BlockPoll::Adaptive)]
    pub poll: BlockPoll,
    /// Also measure depth 32 with fio submitting and completing I/Os in batches of this many
    /// (`iodepth_batch_submit` = `iodepth_batch_complete_min`), on every system alike: the
    /// netdam engine then packs the I/Os of a batch into shared datagrams. 1 turns it off.
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// The netdam fio engine [default: what ops/fio-plugin.sh builds and prints].
    #[arg(long, value_name = "PATH")]
    pub plugin: Option<PathBuf>,
    /// The `netdam` command-line binary for `netdam nbd` [default: `netdam` beside this program].
    #[arg(long, value_name = "PATH")]
    pub netdam: Option<PathBuf>,
    /// Systems to measure, comma-separated: engine (the fio plugin), nbd (`netdam nbd`),
    /// nbdkit. Goals whose figures are missing are reported as not measured.
    #[arg(long, value_delimiter = ',', default_values_t = ["engine".to_string(), "nbd".to_string(), "nbdkit".to_string()])]
    pub systems: Vec<String>,
    /// Leave out the remote layout (the NBD cases at depth 32 again, with fio and the NBD server
    /// kept off the target worker's CPU: see the module's documentation).
    #[arg(long)]
    pub no_remote_layout: bool,
    /// Run every case this many times, one round after the other (each system in turn in each
    /// round), and report the median of the rounds: each case's figures, and each goal's ratio
    /// (its ratio in every round beside it). This machine's rates move by 10-30% between runs
    /// of the same case, so a goal within that of its bound needs rounds to settle.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub rounds: u32,
    /// Also write fio.json, fio.md and fio-iops.png / fio-latency.png to this directory.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// One fio job's result.
#[derive(Clone)]
struct Case {
    system: &'static str,
    socket: &'static str,
    pattern: &'static str,
    depth: usize,
    /// fio's submission and completion batch (1: fio's defaults).
    batch: usize,
    /// The round it was measured in (from 0).
    round: usize,
    iops: f64,
    ops: u64,
    p50_ns: u64,
    p99_ns: u64,
    p999_ns: u64,
    /// Instructions the target executed per datagram it received while the case ran, fio's
    /// start and ramp included (netdam's cases through fio): how well requests were packed,
    /// which IOPS alone do not show (the engine's coalescing once stopped packing, unseen,
    /// docs/DECISIONS.md).
    instructions_per_datagram: Option<f64>,
}

/// Reads the target's counters (datagrams received, instructions executed), for a case that
/// goes through it.
type TargetCounters<'a> = Option<&'a dyn Fn() -> (u64, u64)>;

/// The counters `datagrams_received` and `instructions_executed` of `target`, summed over workers.
fn target_counters(target: &Target) -> (u64, u64) {
    let stats = target.stats();
    (stats.get("datagrams_received").unwrap_or(0), stats.get("instructions_executed").unwrap_or(0))
}

impl Case {
    /// As JSON, with `round_field` ("round": the round it was measured in, or "rounds": how many
    /// rounds a median case is the median of).
    fn to_json(&self, round_field: (&str, usize)) -> serde_json::Value {
        json!({"system": self.system, "socket": self.socket, "rw": self.pattern, "depth": self.depth,
               "batch": self.batch, round_field.0: round_field.1, "iops": self.iops, "ios": self.ops, "lat_p50_ns": self.p50_ns, "lat_p99_ns": self.p99_ns,
               "lat_p999_ns": (self.p999_ns > 0).then_some(self.p999_ns),
               "instructions_per_datagram": self.instructions_per_datagram})
    }
}

const PLUGIN: &str = "netdam fio engine";
const NETDAM_NBD: &str = "netdam nbd";
const NBDKIT: &str = "nbdkit memory";
/// `netdam nbd` and nbdkit in the remote layout: fio and the server off the target worker's CPU.
const NETDAM_NBD_REMOTE: &str = "netdam nbd (remote layout)";
const NBDKIT_REMOTE: &str = "nbdkit memory (remote layout)";
/// `netdam-bench throughput`'s client (BREAD/BWRITE of 4 KiB, no fio) on the same target.
const THROUGHPUT: &str = "netdam-bench throughput";
/// A raw UDP echo with a read's or a write's datagram sizes, one at a time: the machine's
/// floor for the depth-1 cases (no fio), measured in the same run.
const FLOOR: &str = "UDP echo (floor)";

/// How fio reaches one system.
enum Access<'a> {
    Plugin {
        engine: PathBuf,
        target: SocketAddr,
    },
    /// An NBD server; with `cpus`, fio runs on those CPUs only (the remote layout).
    Nbd {
        uri: &'a str,
        cpus: Option<&'a [usize]>,
    },
}

/// What one goal compares, and whether it was met.
struct Goal {
    name: String,
    pattern: &'static str,
    /// The measured ratio (the median of the rounds' ratios), or why it could not be computed.
    ratio: Result<f64, String>,
    /// The ratio in each round, in order (`None` where a round could not compute it).
    rounds: Vec<Option<f64>>,
    /// `ratio <= bound` when `at_most`, else `ratio >= bound`.
    bound: f64,
    at_most: bool,
}

impl Goal {
    fn met(&self) -> Option<bool> {
        self.ratio.as_ref().ok().map(|&ratio| if self.at_most { ratio <= self.bound } else { ratio >= self.bound })
    }

    fn verdict(&self) -> String {
        match (&self.ratio, self.met()) {
            (Ok(_), Some(true)) => "met".into(),
            (Ok(_), _) => "not met".into(),
            (Err(reason), _) => format!("not measured: {reason}"),
        }
    }

    fn to_json(&self) -> serde_json::Value {
        json!({"goal": self.name, "rw": self.pattern, "ratio": self.ratio.as_ref().ok(), "round_ratios": self.rounds,
               "bound": self.bound, "at_most": self.at_most, "met": self.met(), "verdict": self.verdict()})
    }
}

/// Everything one run found.
struct Run {
    /// Where the namespace's file lives (tmpfs or a disk's file system).
    medium: &'static str,
    fio: Option<String>,
    nbdkit: Option<String>,
    plugin: Option<PathBuf>,
    /// The round being measured (from 0).
    round: usize,
    /// Rounds measured whole: the medians are theirs.
    rounds_completed: usize,
    /// Every case of every round.
    cases: Vec<Case>,
    /// Each case's median over the rounds, with how many rounds measured it.
    medians: Vec<(Case, usize)>,
    skipped: Vec<String>,
    goals: Vec<Goal>,
    /// The CPUs fio and the NBD servers ran on in the remote layout (`None`: not run).
    remote_cpus: Option<Vec<usize>>,
    /// Per round measured, gaps of 20 µs or more a second that spinning threads met on every CPU
    /// together before the round (`netdam-bench noise`): what sets the QD1 p99.9 here.
    noise: Vec<f64>,
}

/// A child server, killed (and reaped) when dropped.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs every case, prints the tables and writes the files asked for.
pub fn run(args: &FioArgs) -> Result<(), String> {
    if args.depths.is_empty() || args.depths.contains(&0) {
        return Err("--depths: give one or more depths of at least 1".into());
    }
    if args.seconds.is_nan() || args.seconds < 1.0 {
        return Err(format!("--seconds {}: fio measures whole seconds, give at least 1", args.seconds));
    }
    for system in &args.systems {
        if !["engine", "nbd", "nbdkit"].contains(&system.as_str()) {
            return Err(format!("--systems: {system:?} is not one of engine, nbd, nbdkit"));
        }
    }
    // On tmpfs where there is one, so that the namespace is memory as `nbdkit memory` is: a
    // pmem namespace's writes land in a file mapping, which on a disk-backed file the kernel
    // writes back beside the cases (the jobs ask for no FUA or FLUSH, so nothing waits for it).
    let scratch = match std::path::Path::new(SHARED_MEMORY_DIR).is_dir() {
        true => tempfile::Builder::new().prefix("netdam-bench-fio").tempdir_in(SHARED_MEMORY_DIR),
        false => tempfile::tempdir(),
    }
    .map_err(|error| format!("temporary directory: {error}"))?;
    let on_tmpfs = scratch.path().starts_with(SHARED_MEMORY_DIR);
    let mut run = Run {
        medium: "",
        fio: None,
        nbdkit: None,
        plugin: None,
        round: 0,
        rounds_completed: 0,
        cases: Vec::new(),
        medians: Vec::new(),
        skipped: Vec::new(),
        goals: Vec::new(),
        remote_cpus: None,
        noise: Vec::new(),
    };
    run.medium = if on_tmpfs {
        "a file mapping on tmpfs: memory, as volatile as nbdkit memory"
    } else {
        "a file mapping on a disk's file system: writes reach the disk"
    };
    match version("fio") {
        Ok(found) => run.fio = Some(found),
        Err(reason) => skip(&mut run.skipped, "every system", &format!("{reason} (apt-get install fio)")),
    }
    prefill_file(&scratch.path().join(NAMESPACE_FILE), NAMESPACE_BYTES)?;
    let rounds = crate::report::run_rounds(args.rounds, |round| {
        run.round = round;
        measure_round(args, &mut run, scratch.path())
    })?;
    if let Some((failed, reason)) = &rounds.failed {
        end_rounds_early(&mut run, *failed, args.rounds, reason);
    }
    run.rounds_completed = rounds.measured.len();
    // The remote layout's CPUs as the last round found them.
    run.remote_cpus = rounds.measured.into_iter().last().flatten();
    run.medians = median_cases(&run.cases);
    let per_round: Vec<Vec<Goal>> = (0..run.rounds_completed)
        .map(|round| goals(&of_round(&run.cases, round), args.batch, run.remote_cpus.is_some()))
        .collect();
    run.goals = median_goals(per_round);
    let text = markdown(args, &run);
    print!("{text}");
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).map_err(|error| format!("creating {}: {error}", dir.display()))?;
        let write = |name: &str, text: String| {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(|error| format!("writing {}: {error}", path.display()))
        };
        write("fio.json", format!("{:#}\n", report_json(args, &run)))?;
        write("fio.md", text)?;
        eprintln!("wrote {}/fio.json and fio.md", dir.display());
        // The plots show fio's view; the throughput client has no p99.9 to plot.
        // fio's default batching only: one bar per system and socket.
        let fio_cases: Vec<Case> = run
            .medians
            .iter()
            .map(|(case, _)| case)
            .filter(|case| ![THROUGHPUT, FLOOR].contains(&case.system) && case.batch == 1)
            .cloned()
            .collect();
        crate::report::print_plotted(plot(&fio_cases, dir));
    }
    Ok(())
}

/// One round: the floor, the engine and the throughput client, `netdam nbd`, then nbdkit, each
/// case's result added to `run.cases` under `run.round`. Returns the remote layout's CPUs when
/// it ran.
fn measure_round(args: &FioArgs, run: &mut Run, scratch: &Path) -> Result<Option<Vec<usize>>, String> {
    let wanted = |system: &str| args.systems.iter().any(|wanted| wanted == system);
    // Before the target starts: its busy worker would take a core from the echo's two spinners
    // (and from the noise's spinners, one per CPU).
    if wanted("engine") {
        measure_noise(run);
        measure_floor(args, run);
    }
    let config = target_config(scratch, args.poll);
    let target = Target::start(&config).map_err(|error| error.to_string())?;
    // Only the NBD cases run in the remote layout.
    let remote_cpus = if args.no_remote_layout || !(wanted("nbd") || wanted("nbdkit")) {
        None
    } else {
        match remote_layout_cpus(&config) {
            Ok(cpus) => Some(cpus),
            Err(reason) => {
                skip(&mut run.skipped, "the remote layout", &reason);
                None
            }
        }
    };
    let all_points = points(args);
    let remote_points = [(THROUGHPUT_DEPTH, 1)];
    if run.fio.is_some() {
        match plugin_path(args) {
            Ok(_) if !wanted("engine") => {}
            Ok(engine) => {
                let access = Access::Plugin { engine: engine.clone(), target: target.local_addr() };
                measure(args, &access, PLUGIN, "udp", &all_points, run, Some(&|| target_counters(&target)));
                run.plugin = Some(engine);
                measure_throughput(args, &target, run);
            }
            Err(reason) => skip(&mut run.skipped, PLUGIN, &reason),
        }
        match netdam_binary(args) {
            Ok(_) if !wanted("nbd") => {}
            Ok(netdam) => {
                let points = (&all_points[..], &remote_points[..]);
                let names = [(NETDAM_NBD, "netdam-nbd"), (NETDAM_NBD_REMOTE, "netdam-nbd-remote")];
                let layouts = layouts(names, points, remote_cpus.as_deref());
                let counters = || target_counters(&target);
                serve_layouts(args, run, scratch, &layouts, false, Some(&counters), |listen| {
                    let mut command = Command::new(&netdam);
                    command.arg("--target").arg(target.local_addr().to_string());
                    command.args(["nbd", "--namespace", NAMESPACE, "--listen", listen]);
                    command
                })?;
            }
            Err(reason) => skip(&mut run.skipped, NETDAM_NBD, &reason),
        }
        // nbdkit needs no target: stopping it first gives nbdkit the cores a busy-polling
        // worker would otherwise spin on.
        target.stop();
        match version("nbdkit") {
            Ok(_) if !wanted("nbdkit") => {}
            Ok(found) => {
                run.nbdkit = Some(found);
                let points = (&all_points[..], &remote_points[..]);
                let names = [(NBDKIT, "nbdkit"), (NBDKIT_REMOTE, "nbdkit-remote")];
                // Every block written before the cases (`fill_first`), as netdam's namespace is.
                let layouts = layouts(names, points, remote_cpus.as_deref());
                serve_layouts(args, run, scratch, &layouts, true, None, |listen| {
                    let mut command = Command::new("nbdkit");
                    command.args(["-f", "--exit-with-parent"]);
                    match listen.split_once(':') {
                        Some(("tcp", address)) => {
                            let (host, port) = address.rsplit_once(':').expect("endpoint writes HOST:PORT");
                            command.args(["-i", host, "-p", port]);
                        }
                        _ => {
                            command.arg("-U").arg(listen.trim_start_matches("unix:"));
                        }
                    }
                    command.args(["memory", "1G"]);
                    command
                })?;
            }
            Err(reason) => skip(&mut run.skipped, NBDKIT, &format!("{reason} (apt-get install nbdkit)")),
        }
    }
    Ok(remote_cpus)
}

/// How many rounds `cases` come from.
fn rounds_in(cases: &[Case]) -> usize {
    cases.iter().map(|case| case.round + 1).max().unwrap_or(0)
}

/// The cases of `round`.
fn of_round(cases: &[Case], round: usize) -> Vec<Case> {
    cases.iter().filter(|case| case.round == round).cloned().collect()
}

/// A late round that failed (a server that would not start, `report::run_rounds`): the rounds
/// before it stand, its own cases (added as it went) go, and the report says which rounds are
/// missing and why.
fn end_rounds_early(run: &mut Run, failed: usize, asked: u32, reason: &str) {
    run.cases.retain(|case| case.round < failed);
    skip(&mut run.skipped, &crate::report::rounds_not_measured(failed, asked), reason);
}

/// What the machine takes from threads spinning on every CPU, as the floor's two parties and the
/// engine's (fio's job and the target's worker) do: gaps of 20 µs or more a second, all CPUs
/// together, into `run.noise`.
fn measure_noise(run: &mut Run) {
    match crate::noise::measure(&netdam_target::worker::allowed_cpus(), NOISE_SECONDS) {
        Ok(cpus) => run.noise.push(crate::noise::long_gaps_per_second(&cpus)),
        Err(reason) => skip(&mut run.skipped, "the machine's noise", &reason),
    }
}

/// For reference beside the QD1 p99.9 goal: the share of the engine's QD1 I/Os that a gap of
/// 20 µs or more meets, per pattern: the median noise over the median QD1 rate (`None` where
/// either was not measured). Above 0.1%, the p99.9 includes such a gap.
fn noise_share(noise: &[f64], medians: &[Case]) -> Vec<(&'static str, Option<f64>)> {
    let gaps_per_s = (!noise.is_empty()).then(|| crate::report::median(noise));
    PATTERNS
        .iter()
        .map(|&pattern| {
            let iops = find(medians, PLUGIN, "udp", pattern, LATENCY_DEPTH).map(|case| case.iops);
            (pattern, gaps_per_s.zip(iops.filter(|&iops| iops > 0.0)).map(|(gaps, iops)| gaps / iops))
        })
        .collect()
}

/// Records that `what` was not measured and why (once, however many rounds find it so).
fn skip(skipped: &mut Vec<String>, what: &str, reason: &str) {
    eprintln!("skipping {what}: {reason}");
    let line = format!("{what}: {reason}");
    if !skipped.contains(&line) {
        skipped.push(line);
    }
}

/// Each case's median over the rounds that measured it, with how many did: IOPS, I/Os and each
/// percentile taken apart (so a median case need not be one round's).
fn median_cases(cases: &[Case]) -> Vec<(Case, usize)> {
    crate::report::groups_by(cases, |case| (case.system, case.socket, case.pattern, case.depth, case.batch))
        .into_iter()
        .map(|rounds| {
            let median_of = |value: fn(&Case) -> f64| {
                crate::report::median(&rounds.iter().map(|case| value(case)).collect::<Vec<_>>())
            };
            let median = Case {
                iops: median_of(|case| case.iops),
                ops: median_of(|case| case.ops as f64) as u64,
                p50_ns: median_of(|case| case.p50_ns as f64) as u64,
                p99_ns: median_of(|case| case.p99_ns as f64) as u64,
                p999_ns: median_of(|case| case.p999_ns as f64) as u64,
                instructions_per_datagram: {
                    let measured: Vec<f64> = rounds.iter().filter_map(|case| case.instructions_per_datagram).collect();
                    (!measured.is_empty()).then(|| crate::report::median(&measured))
                },
                ..rounds[0].clone()
            };
            (median, rounds.len())
        })
        .collect()
}

/// The goals of every round (each round's list in the same order) as one list: each goal's
/// ratio is the median of the rounds that computed it, beside every round's own.
fn median_goals(per_round: Vec<Vec<Goal>>) -> Vec<Goal> {
    let mut rounds = per_round.into_iter();
    let Some(first) = rounds.next() else { return Vec::new() };
    let mut goals: Vec<Goal> =
        first.into_iter().map(|goal| Goal { rounds: vec![goal.ratio.as_ref().ok().copied()], ..goal }).collect();
    for round in rounds {
        // `goals` lists the same goals in every round (from the patterns, the batch and the
        // layouts, never from which cases ran): a round that could not compute one has its
        // reason in that goal's place.
        assert_eq!(round.len(), goals.len(), "every round lists the same goals");
        for (goal, later) in goals.iter_mut().zip(round) {
            assert_eq!((&goal.name, goal.pattern), (&later.name, later.pattern), "the same goals in the same order");
            goal.rounds.push(later.ratio.as_ref().ok().copied());
            if goal.ratio.is_err() {
                goal.ratio = later.ratio;
            }
        }
    }
    for goal in &mut goals {
        let measured: Vec<f64> = goal.rounds.iter().flatten().copied().collect();
        if !measured.is_empty() {
            goal.ratio = Ok(crate::report::median(&measured));
        }
    }
    goals
}

fn target_config(data_dir: &Path, poll: BlockPoll) -> netdam_target::config::Config {
    let poll = match poll {
        BlockPoll::Busy => PollMode::Busy,
        BlockPoll::Adaptive => PollMode::Adaptive,
        BlockPoll::Blocking => PollMode::Blocking,
    };
    let namespace = NamespaceConfig {
        name: NAMESPACE.into(),
        backend: NamespaceBackend::Pmem,
        path: NAMESPACE_FILE.into(),
        size: Some(ByteSize(NAMESPACE_BYTES)),
        block_size: BLOCK_BYTES,
    };
    crate::target::config(data_dir, poll, namespace)
}

fn version(program: &str) -> Result<String, String> {
    let output = Command::new(program)
        .arg("--version")
        .output()
        .map_err(|error| format!("{program} is not installed or not on PATH ({error})"))?;
    let text = String::from_utf8_lossy(&output.stdout);
    Ok(text.lines().next().unwrap_or("").trim().to_string())
}

/// The repository this program was built in (build/release/netdam-bench), else the current
/// directory.
fn repository() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.ancestors().nth(3).map(Path::to_path_buf))
        .filter(|root| root.join("ops/fio-plugin.sh").is_file())
        .unwrap_or_else(|| PathBuf::from("."))
}

fn plugin_path(args: &FioArgs) -> Result<PathBuf, String> {
    if let Some(path) = &args.plugin {
        return if path.is_file() {
            Ok(path.clone())
        } else {
            Err(format!("--plugin {}: no such file", path.display()))
        };
    }
    let script = repository().join("ops/fio-plugin.sh");
    let output = Command::new(&script)
        .stderr(Stdio::piped())
        .output()
        .map_err(|error| format!("running {}: {error} (or pass --plugin PATH)", script.display()))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    match output.status.code() {
        Some(0) => {
            let stdout = String::from_utf8_lossy(&output.stdout);
            let path = PathBuf::from(stdout.lines().last().unwrap_or("").trim());
            if path.is_file() {
                Ok(path)
            } else {
                Err(format!("{} printed {:?}, which is not a file", script.display(), path))
            }
        }
        Some(77) => Err(stderr.lines().find(|line| line.starts_with("SKIPPED")).unwrap_or("SKIPPED").to_string()),
        _ => Err(format!("{} failed: {}", script.display(), stderr.trim())),
    }
}

fn netdam_binary(args: &FioArgs) -> Result<PathBuf, String> {
    let path = match &args.netdam {
        Some(path) => path.clone(),
        None => {
            std::env::current_exe().map_err(|error| format!("where this program is: {error}"))?.with_file_name("netdam")
        }
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!("{} not found: cargo build --release --bin netdam, or pass --netdam PATH", path.display()))
    }
}

/// Where a server listens (`netdam nbd --listen` form) and the NBD URI fio connects to.
fn endpoint(dir: &Path, name: &str, socket: &str) -> Result<(String, String), String> {
    if socket == "tcp" {
        // The kernel picks a free port; the server binds it right after (a race only another
        // program binding ports at the same instant could lose).
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map_err(|error| format!("finding a free TCP port: {error}"))?
            .port();
        Ok((format!("tcp:127.0.0.1:{port}"), format!("nbd://127.0.0.1:{port}")))
    } else {
        let path = dir.join(format!("{name}.sock"));
        // A socket file left by the server of an earlier round would pass for the new server
        // listening (`wait_until_listening`).
        match std::fs::remove_file(&path) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                return Err(format!("removing {}: {error}", path.display()))
            }
            _ => {}
        }
        Ok((format!("unix:{}", path.display()), format!("nbd+unix:///?socket={}", path.display())))
    }
}

/// (depth, fio batch) of each case of a system.
type Points<'a> = &'a [(usize, usize)];

/// Where one NBD server runs and what is measured there.
#[derive(Clone, Copy)]
struct Layout<'a> {
    /// The system's name in the report.
    system: &'static str,
    /// Its socket and log files' name.
    label: &'static str,
    /// The CPUs the server and its fio run on (the remote layout); `None`: any.
    cpus: Option<&'a [usize]>,
    points: Points<'a>,
}

/// One NBD server to measure.
struct Server<'a> {
    listen: &'a str,
    uri: &'a str,
    socket: &'static str,
    layout: Layout<'a>,
    /// Write every block through the server before its cases (a store that starts empty).
    fill_first: bool,
}

/// A server's layouts: the shared one (`names[0]`: its name in the report and its files'
/// label) at `points.0`, then, where there are `remote_cpus`, the remote one (`names[1]`) at
/// `points.1`.
fn layouts<'a>(
    names: [(&'static str, &'static str); 2],
    points: (Points<'a>, Points<'a>),
    remote_cpus: Option<&'a [usize]>,
) -> Vec<Layout<'a>> {
    let shared = Layout { system: names[0].0, label: names[0].1, cpus: None, points: points.0 };
    let remote =
        remote_cpus.map(|cpus| Layout { system: names[1].0, label: names[1].1, cpus: Some(cpus), points: points.1 });
    std::iter::once(shared).chain(remote).collect()
}

/// Measures one kind of NBD server in each of its `layouts`, over TCP and a Unix socket;
/// `command` starts the server listening at the address it is given.
/// `fill_first`: write every block before the cases; `counters`: the target's, for a server in
/// front of it.
fn serve_layouts(
    args: &FioArgs,
    run: &mut Run,
    dir: &Path,
    layouts: &[Layout<'_>],
    fill_first: bool,
    counters: TargetCounters<'_>,
    command: impl Fn(&str) -> Command,
) -> Result<(), String> {
    for &layout in layouts {
        for socket in ["tcp", "unix"] {
            let (listen, uri) = endpoint(dir, layout.label, socket)?;
            let server = Server { listen: &listen, uri: &uri, socket, layout, fill_first };
            serve(args, command(&listen), &server, dir, run, counters);
        }
    }
    Ok(())
}

/// The CPUs of the remote layout: those this process may run on but the one the target's
/// worker is pinned to (the target's own rule, `worker::worker_cpu`), for a target `config`
/// with one pinned worker.
fn remote_layout_cpus(config: &netdam_target::config::Config) -> Result<Vec<usize>, String> {
    if !config.pin_workers || config.workers != 1 {
        return Err(format!(
            "it keeps one pinned worker's CPU apart; this target has {} worker(s), pin_workers = {}",
            config.workers, config.pin_workers
        ));
    }
    let allowed = netdam_target::worker::allowed_cpus();
    let others = netdam_target::worker::cpus_beside_worker(&allowed, 0);
    if others.is_empty() {
        return Err(format!("this process may run on CPUs {allowed:?} only: none is left beside the target worker's"));
    }
    Ok(others)
}

/// Makes `command`'s process (and every thread it starts) run on `cpus` only.
fn confine(command: &mut Command, cpus: &[usize]) {
    use std::os::unix::process::CommandExt;
    let cpus = cpus.to_vec();
    // SAFETY: between fork and exec the closure only calls `set_affinity`, which allocates
    // nothing and takes no lock (a CPU set on the stack, one system call).
    unsafe {
        command.pre_exec(move || netdam_target::worker::set_affinity(&cpus));
    }
}

/// Starts a server, waits until it accepts connections, runs the cases against it, kills it.
fn serve(
    args: &FioArgs,
    mut command: Command,
    server: &Server<'_>,
    dir: &Path,
    run: &mut Run,
    counters: TargetCounters<'_>,
) {
    let Server { listen, uri, socket, layout: Layout { system, label, cpus, points }, fill_first } = *server;
    let what = format!("{system} over {socket}");
    if let Some(cpus) = cpus {
        confine(&mut command, cpus);
    }
    let log = dir.join(format!("{label}-{socket}.log"));
    let started = std::fs::File::create(&log)
        .and_then(|file| {
            let copy = file.try_clone()?;
            command.stdin(Stdio::null()).stdout(file).stderr(copy).spawn()
        })
        .map(ChildGuard);
    let mut child = match started {
        Ok(child) => child,
        Err(error) => return skip(&mut run.skipped, &what, &format!("start: {error}")),
    };
    if let Err(reason) = wait_until_listening(&mut child.0, listen, &log) {
        return skip(&mut run.skipped, &what, &reason);
    }
    if fill_first {
        if let Err(reason) = prefill(uri) {
            return skip(&mut run.skipped, &what, &reason);
        }
    }
    measure(args, &Access::Nbd { uri, cpus }, system, socket, points, run, counters);
    drop(child);
}

/// Waits until the server listens, without connecting: a probe that hangs up mid-handshake
/// would be a failed client in the server's log (and a connection nbdkit counts). A Unix
/// server is ready when its socket file exists (`endpoint` removes an earlier round's); a TCP
/// server when the kernel lists its port as listening in /proc/net/tcp.
fn wait_until_listening(child: &mut Child, listen: &str, log: &Path) -> Result<(), String> {
    let deadline = Instant::now() + SERVER_START_TIMEOUT;
    loop {
        let listening = match listen.split_once(':') {
            Some(("tcp", address)) => tcp_listening(address),
            _ => {
                use std::os::unix::fs::FileTypeExt;
                std::fs::symlink_metadata(listen.trim_start_matches("unix:"))
                    .is_ok_and(|metadata| metadata.file_type().is_socket())
            }
        };
        let output = || std::fs::read_to_string(log).unwrap_or_default().trim().to_string();
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("exited ({status}) before listening on {listen}: {}", output()));
        }
        if listening {
            // A Unix socket file appears at bind(), just before listen().
            std::thread::sleep(Duration::from_millis(100));
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("not listening on {listen} after {SERVER_START_TIMEOUT:?}: {}", output()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether 127.0.0.1:PORT is in state LISTEN (0A) in /proc/net/tcp.
fn tcp_listening(address: &str) -> bool {
    let Some(port) = address.rsplit_once(':').and_then(|(_, port)| port.parse::<u16>().ok()) else { return false };
    let wanted = format!("0100007F:{port:04X}");
    std::fs::read_to_string("/proc/net/tcp").is_ok_and(|table| {
        table.lines().skip(1).any(|line| {
            let mut fields = line.split_whitespace().skip(1);
            fields.next() == Some(wanted.as_str()) && fields.nth(1) == Some("0A")
        })
    })
}

/// Writes every block of the export once (untimed), so that reads return data rather than an
/// unallocated page of a sparse store.
fn prefill(uri: &str) -> Result<(), String> {
    let output = Command::new("fio")
        .args(["--name=prefill", "--ioengine=nbd", &format!("--uri={uri}"), "--rw=write", "--bs=1m", "--iodepth=8"])
        .stdin(Stdio::null())
        .output()
        .map_err(|error| format!("running fio: {error}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!("prefill failed ({}): {}", output.status, String::from_utf8_lossy(&output.stderr).trim()))
    }
}

/// The namespace's file, every block written, before the target maps it.
fn prefill_file(path: &Path, bytes: u64) -> Result<(), String> {
    use std::io::Write;
    let fail = |error: std::io::Error| format!("preparing {}: {error}", path.display());
    let mut file = std::fs::File::create(path).map_err(fail)?;
    let chunk = netdam_isa::rng::Rng::new(42).bytes(1 << 20);
    let mut written = 0;
    while written < bytes {
        file.write_all(&chunk).map_err(fail)?;
        written += chunk.len() as u64;
    }
    // On disk before the cases, so the kernel's write-back of the fill does not run under them.
    file.sync_all().map_err(fail)
}

/// (depth, fio batch) of the cases of a system: every depth, then depth 32 in batches
/// (`--batch`).
fn points(args: &FioArgs) -> Vec<(usize, usize)> {
    let batched = (args.batch > 1).then_some((THROUGHPUT_DEPTH, args.batch));
    args.depths.iter().map(|&depth| (depth, 1)).chain(batched).collect()
}

/// Both patterns at each of `points`; the first failure skips the rest of this system.
/// `counters`: the target's, for a system that goes through it (the packing per datagram).
fn measure(
    args: &FioArgs,
    access: &Access,
    system: &'static str,
    socket: &'static str,
    points: &[(usize, usize)],
    run: &mut Run,
    counters: TargetCounters<'_>,
) {
    for pattern in PATTERNS {
        for &(depth, batch) in points {
            eprintln!("{system} over {socket}: {pattern} at depth {depth}, batch {batch}");
            let before = counters.map(|read| read());
            let result = fio_case(args, access, pattern, depth, batch);
            let instructions_per_datagram = counters.zip(before).and_then(|(read, (datagrams, instructions))| {
                let (datagrams_now, instructions_now) = read();
                let datagrams = datagrams_now.saturating_sub(datagrams);
                (datagrams > 0).then(|| instructions_now.saturating_sub(instructions) as f64 / datagrams as f64)
            });
            match result {
                Ok((iops, ops, [p50_ns, p99_ns, p999_ns])) => run.cases.push(Case {
                    system,
                    socket,
                    pattern,
                    depth,
                    batch,
                    round: run.round,
                    iops,
                    ops,
                    p50_ns,
                    p99_ns,
                    p999_ns,
                    instructions_per_datagram,
                }),
                Err(reason) => return skip(&mut run.skipped, &format!("{system} over {socket}"), &reason),
            }
        }
    }
}

/// BREAD and BWRITE of 4 KiB at depth 32 with `netdam-bench throughput`'s client against the
/// same target: what the engine's depth-32 IOPS are compared with. Its p99.9 is not recorded.
fn measure_throughput(args: &FioArgs, target: &Target, run: &mut Run) {
    use crate::throughput::{measure_point, PointSpec, ThroughputOp};
    let poll = if args.poll == BlockPoll::Busy { LatencyPoll::Busy } else { LatencyPoll::Blocking };
    for (pattern, op) in [("randread", ThroughputOp::Bread), ("randwrite", ThroughputOp::Bwrite)] {
        eprintln!("{THROUGHPUT}: {pattern} at depth {THROUGHPUT_DEPTH}");
        let spec = PointSpec {
            op,
            size: BLOCK_BYTES,
            block_bytes: BLOCK_BYTES,
            batch: 1,
            sessions: 1,
            depth: THROUGHPUT_DEPTH,
        };
        match measure_point(target, &spec, poll, args.seconds) {
            Ok(point) => run.cases.push(Case {
                system: THROUGHPUT,
                socket: "udp",
                pattern,
                depth: THROUGHPUT_DEPTH,
                batch: 1,
                round: run.round,
                iops: point.ops_per_s,
                ops: (point.ops_per_s * args.seconds) as u64,
                p50_ns: point.p50_ns,
                p99_ns: point.p99_ns,
                p999_ns: 0,
                instructions_per_datagram: None,
            }),
            Err(reason) => return skip(&mut run.skipped, THROUGHPUT, &reason),
        }
    }
}

/// The UDP echo floor at depth 1: a 4 KiB read's sizes (a small request, a block back) and a
/// write's (a block out, a small answer), as many round trips as the measured seconds hold at
/// the floor's pace, busy or blocking as the engine waits.
fn measure_floor(args: &FioArgs, run: &mut Run) {
    let busy = args.poll == BlockPoll::Busy;
    let header = netdam_isa::wire::HEADER_LEN + netdam_isa::wire::INSTRUCTION_HEADER_LEN;
    let block = BLOCK_BYTES as usize;
    for (pattern, request_bytes, response_bytes) in
        [("randread", header, header + block), ("randwrite", header + block, header)]
    {
        eprintln!("{FLOOR}: {pattern} sizes at depth 1");
        let server = crate::floor::EchoServer::start(busy, response_bytes);
        let requests = (args.seconds * 50_000.0) as u64;
        let started = std::time::Instant::now();
        let histogram = crate::floor::measure(server.addr(), busy, request_bytes, requests / 10, requests);
        let elapsed = started.elapsed().as_secs_f64();
        server.stop();
        run.cases.push(Case {
            system: FLOOR,
            socket: "udp",
            pattern,
            depth: LATENCY_DEPTH,
            batch: 1,
            round: run.round,
            // Warm-up included: a rate for orientation only.
            iops: (requests + requests / 10) as f64 / elapsed.max(f64::MIN_POSITIVE),
            ops: requests,
            p50_ns: histogram.value_at_quantile(0.50),
            p99_ns: histogram.value_at_quantile(0.99),
            p999_ns: histogram.value_at_quantile(0.999),
            instructions_per_datagram: None,
        });
    }
}

/// One fio job: IOPS, I/Os and total latency (submission to completion) p50/p99/p99.9 in ns.
///
/// Total latency, not fio's clat: for an asynchronous engine fio starts the clat clock after
/// `queue` returns, and both the nbd engine and netdam's send the request inside `queue`, so an
/// answer that arrives before `queue` returns shows as a clat near zero (measured: nbdkit QD1
/// clat p50 1.6 µs while its round trip takes over 10).
fn fio_case(
    args: &FioArgs,
    access: &Access,
    pattern: &str,
    depth: usize,
    batch: usize,
) -> Result<(f64, u64, [u64; 3]), String> {
    let mut command = Command::new("fio");
    command.args([
        "--name=netdam-bench",
        &format!("--rw={pattern}"),
        "--bs=4k",
        &format!("--iodepth={depth}"),
        "--time_based=1",
        "--ramp_time=1",
        &format!("--runtime={}", args.seconds.ceil() as u64),
        "--percentile_list=50:99:99.9",
        "--lat_percentiles=1",
        "--norandommap=1",
        "--randrepeat=0",
        "--output-format=json",
    ]);
    if batch > 1 {
        command.args([format!("--iodepth_batch_submit={batch}"), format!("--iodepth_batch_complete_min={batch}")]);
    }
    match access {
        Access::Plugin { engine, target } => {
            let poll = engine_poll(args.poll);
            command.arg(format!("--ioengine=external:{}", engine.display()));
            command.args([format!("--target={target}"), format!("--namespace={NAMESPACE}"), format!("--poll={poll}")]);
        }
        Access::Nbd { uri, cpus } => {
            command.args(["--ioengine=nbd".to_string(), format!("--uri={uri}")]);
            if let Some(cpus) = cpus {
                confine(&mut command, cpus);
            }
        }
    }
    let output = command.stdin(Stdio::null()).output().map_err(|error| format!("running fio: {error}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        return Err(format!("fio failed ({}): {}", output.status, stderr.trim()));
    }
    // The nbd engine prints "fio: connected to NBD server" on standard output before the JSON.
    let json_text =
        stdout.find('{').map(|start| &stdout[start..]).ok_or_else(|| format!("no JSON from fio: {stdout}"))?;
    let report: serde_json::Value =
        serde_json::from_str(json_text).map_err(|error| format!("fio's JSON: {error}: {json_text}"))?;
    let job = &report["jobs"][0];
    if job["error"].as_i64().unwrap_or(0) != 0 {
        return Err(format!("fio job error {}: {}", job["error"], stderr.trim()));
    }
    let side = &job[if pattern == "randread" { "read" } else { "write" }];
    let ops = side["total_ios"].as_u64().unwrap_or(0);
    if ops == 0 {
        return Err(format!("fio completed no I/O: {}", stderr.trim()));
    }
    let percentile = |key: &str| side["lat_ns"]["percentile"][key].as_u64().unwrap_or(0);
    Ok((
        side["iops"].as_f64().unwrap_or(0.0),
        ops,
        [percentile("50.000000"), percentile("99.000000"), percentile("99.900000")],
    ))
}

/// The case of `system` over `socket` at `depth` with fio's default batching.
fn find<'a>(cases: &'a [Case], system: &str, socket: &str, pattern: &str, depth: usize) -> Option<&'a Case> {
    find_batched(cases, system, socket, pattern, depth, 1)
}

fn find_batched<'a>(
    cases: &'a [Case],
    system: &str,
    socket: &str,
    pattern: &str,
    depth: usize,
    batch: usize,
) -> Option<&'a Case> {
    cases.iter().find(|case| {
        case.system == system
            && case.socket == socket
            && case.pattern == pattern
            && case.depth == depth
            && case.batch == batch
    })
}

/// The goals, per pattern: ratios of cases in this run (at fio's default batching), the
/// export's in the remote layout when it ran (`remote`), and the depth-32 ones again with both
/// sides batched by `batch` (when it is over 1).
fn goals(cases: &[Case], batch: usize, remote: bool) -> Vec<Goal> {
    let mut goals = Vec::new();
    for pattern in PATTERNS {
        let ratio = |system: &str,
                     socket: &str,
                     peer: &str,
                     peer_socket: &str,
                     depth: usize,
                     batch: usize,
                     value: fn(&Case) -> f64| {
            let ours = find_batched(cases, system, socket, pattern, depth, batch);
            let theirs = find_batched(cases, peer, peer_socket, pattern, depth, batch);
            match (ours, theirs) {
                (Some(ours), Some(theirs)) => Ok(value(ours) / value(theirs).max(f64::MIN_POSITIVE)),
                (None, _) => Err(format!("no {system} over {socket} at depth {depth}, batch {batch}")),
                (_, None) => Err(format!("no {peer} over {peer_socket} at depth {depth}, batch {batch}")),
            }
        };
        // At fio's default batching.
        let pair =
            |system: &str, socket: &str, peer: &str, peer_socket: &str, depth: usize, value: fn(&Case) -> f64| {
                ratio(system, socket, peer, peer_socket, depth, 1, value)
            };
        let p50 = |case: &Case| case.p50_ns as f64;
        let p999 = |case: &Case| case.p999_ns as f64;
        let iops = |case: &Case| case.iops;
        goals.push(Goal {
            name: "engine QD1 p50 / nbdkit over TCP QD1 p50".into(),
            pattern,
            ratio: pair(PLUGIN, "udp", NBDKIT, "tcp", LATENCY_DEPTH, p50),
            bound: 0.6,
            at_most: true,
            rounds: Vec::new(),
        });
        goals.push(Goal {
            name: "engine QD1 p99.9 / nbdkit over TCP QD1 p99.9".into(),
            pattern,
            ratio: pair(PLUGIN, "udp", NBDKIT, "tcp", LATENCY_DEPTH, p999),
            bound: 0.3,
            at_most: true,
            rounds: Vec::new(),
        });
        goals.push(Goal {
            name: "engine QD32 IOPS / nbdkit over TCP QD32 IOPS".into(),
            pattern,
            ratio: pair(PLUGIN, "udp", NBDKIT, "tcp", THROUGHPUT_DEPTH, iops),
            bound: 2.0,
            at_most: false,
            rounds: Vec::new(),
        });
        goals.push(Goal {
            name: format!(
                "engine QD32 IOPS / netdam-bench throughput {} 4 KiB QD32",
                if pattern == "randread" { "BREAD" } else { "BWRITE" }
            ),
            pattern,
            ratio: pair(PLUGIN, "udp", THROUGHPUT, "udp", THROUGHPUT_DEPTH, iops),
            bound: 0.8,
            at_most: false,
            rounds: Vec::new(),
        });
        // The shared layout, then (when it ran) the remote one, where both servers and their fio
        // have the same CPUs, the target's core apart.
        let layouts = [(NETDAM_NBD, NBDKIT, ""), (NETDAM_NBD_REMOTE, NBDKIT_REMOTE, ", remote layout")];
        for (ours, theirs, layout) in layouts.into_iter().take(if remote { 2 } else { 1 }) {
            for socket in ["tcp", "unix"] {
                goals.push(Goal {
                    name: format!("netdam nbd QD32 IOPS / nbdkit QD32 IOPS, both over {socket}{layout}"),
                    pattern,
                    ratio: pair(ours, socket, theirs, socket, THROUGHPUT_DEPTH, iops),
                    bound: 1.0,
                    at_most: false,
                    rounds: Vec::new(),
                });
            }
        }
        if batch > 1 {
            goals.push(Goal {
                name: format!("engine QD32 IOPS / nbdkit over TCP QD32 IOPS, both in fio batches of {batch}"),
                pattern,
                ratio: ratio(PLUGIN, "udp", NBDKIT, "tcp", THROUGHPUT_DEPTH, batch, iops),
                bound: 2.0,
                at_most: false,
                rounds: Vec::new(),
            });
            for socket in ["tcp", "unix"] {
                goals.push(Goal {
                    name: format!(
                        "netdam nbd QD32 IOPS / nbdkit QD32 IOPS, both over {socket} in fio batches of {batch}"
                    ),
                    pattern,
                    ratio: ratio(NETDAM_NBD, socket, NBDKIT, socket, THROUGHPUT_DEPTH, batch, iops),
                    bound: 1.0,
                    at_most: false,
                    rounds: Vec::new(),
                });
            }
        }
    }
    goals
}

/// For reference beside the goals, not a goal itself: the engine's QD1 p99.9 over the UDP echo
/// floor's, per pattern (`None` where either was not measured).
fn floor_ratios(cases: &[Case]) -> Vec<(&'static str, Option<f64>)> {
    qd1_p999_ratios(cases, (PLUGIN, "udp"), (FLOOR, "udp"))
}

/// For reference beside the QD1 p99.9 goal: the UDP echo floor's own QD1 p99.9 over nbdkit's
/// over TCP, per pattern. The engine's tail includes the floor's (each request is one such
/// round trip), so this is about the least the goal's ratio can be on the machine measured.
fn floor_over_nbdkit(cases: &[Case]) -> Vec<(&'static str, Option<f64>)> {
    qd1_p999_ratios(cases, (FLOOR, "udp"), (NBDKIT, "tcp"))
}

/// `(system, socket)`'s QD1 p99.9 over `(peer, socket)`'s, per pattern: the median of the
/// rounds' ratios, as the goals are (`None` where no round measured both).
fn qd1_p999_ratios(
    cases: &[Case],
    (system, socket): (&str, &str),
    (peer, peer_socket): (&str, &str),
) -> Vec<(&'static str, Option<f64>)> {
    let rounds: Vec<Vec<Case>> = (0..rounds_in(cases)).map(|round| of_round(cases, round)).collect();
    PATTERNS
        .iter()
        .map(|&pattern| {
            let ratios: Vec<f64> = rounds
                .iter()
                .filter_map(|cases| {
                    let ours = find(cases, system, socket, pattern, LATENCY_DEPTH)?;
                    let theirs = find(cases, peer, peer_socket, pattern, LATENCY_DEPTH)?;
                    Some(ours.p999_ns as f64 / (theirs.p999_ns as f64).max(1.0))
                })
                .collect();
            (pattern, (!ratios.is_empty()).then(|| crate::report::median(&ratios)))
        })
        .collect()
}

/// The engine's `poll=` beside a target worker polling `poll`: the same mode (adaptive: the
/// engine spins while an answer is due soon, then sleeps).
fn engine_poll(poll: BlockPoll) -> &'static str {
    match poll {
        BlockPoll::Busy => "busy",
        BlockPoll::Adaptive => "adaptive",
        BlockPoll::Blocking => "blocking",
    }
}

fn poll_description(poll: BlockPoll) -> String {
    format!("target worker {} polling, engine poll={}", format!("{poll:?}").to_lowercase(), engine_poll(poll))
}

/// The median cases without their round counts.
fn medians_only(run: &Run) -> Vec<Case> {
    run.medians.iter().map(|(case, _)| case.clone()).collect()
}

fn report_json(args: &FioArgs, run: &Run) -> serde_json::Value {
    let cases: Vec<_> = run.medians.iter().map(|(case, rounds)| case.to_json(("rounds", *rounds))).collect();
    let round_cases: Vec<_> = run.cases.iter().map(|case| case.to_json(("round", case.round))).collect();
    let goals: Vec<_> = run.goals.iter().map(Goal::to_json).collect();
    json!({"machine": crate::report::machine(), "fio": run.fio, "nbdkit": run.nbdkit,
           // The plugin's file name: its directory is this machine's, not the report's business.
           "engine": run.plugin.as_ref().and_then(|path| path.file_name()).map(|name| name.to_string_lossy().into_owned()),
           "poll": format!("{:?}", args.poll).to_lowercase(), "poll_description": poll_description(args.poll),
           "namespace": {"name": NAMESPACE, "backend": "pmem", "medium": run.medium, "bytes": NAMESPACE_BYTES, "block_bytes": BLOCK_BYTES},
           "nbdkit_plugin": "memory 1G", "seconds": args.seconds, "ramp_seconds": 1, "depths": args.depths,
           "batch": args.batch,
           "rounds": run.rounds_completed, "rounds_asked": args.rounds, "cases": cases, "round_cases": round_cases, "goals": goals, "skipped": run.skipped,
           "remote_layout_cpus": run.remote_cpus,
           "engine_qd1_p999_over_floor": floor_ratios(&run.cases).into_iter().collect::<std::collections::BTreeMap<_, _>>(),
           "floor_qd1_p999_over_nbdkit_tcp": floor_over_nbdkit(&run.cases).into_iter().collect::<std::collections::BTreeMap<_, _>>(),
           "noise": {"seconds": NOISE_SECONDS, "gaps_from_20us_per_s_rounds": run.noise,
                     "engine_qd1_share": noise_share(&run.noise, &medians_only(run)).into_iter().collect::<std::collections::BTreeMap<_, _>>()},
           "note": "goals are ratios of cases measured in the same round, the median of the rounds' ratios (round_ratios); cases give each figure's median over the rounds (round_cases: every round's); absolute numbers hold for this machine only; see namespace.medium for whether netdam's writes are as volatile as nbdkit memory's"})
}

fn markdown(args: &FioArgs, run: &Run) -> String {
    let us = |ns: u64| ns as f64 / 1000.0;
    let mut text = String::new();
    let _ = writeln!(
        text,
        "Machine: {}. fio: {}; nbdkit: {}. 4 KiB random I/O, {} s per case after 1 s of ramp, total latency (submission to completion, fio `lat_percentiles=1`) percentiles from fio. netdam: one in-process target, one worker, a {} GiB pmem namespace `{NAMESPACE}` ({}, {BLOCK_BYTES}-byte blocks), {}; `netdam nbd` exports that namespace with one session; the peer is `nbdkit memory 1G`. Absolute numbers hold for this machine only; the goals are ratios within this run.\n",
        crate::report::machine(),
        run.fio.as_deref().unwrap_or("not found"),
        run.nbdkit.as_deref().unwrap_or("not found"),
        args.seconds,
        NAMESPACE_BYTES >> 30,
        run.medium,
        poll_description(args.poll),
    );
    if args.rounds > 1 {
        let _ = writeln!(
            text,
            "{} rounds{}, one after the other, each system in turn in each: every figure below is the median of the rounds (IOPS and each percentile taken apart), every goal's ratio the median of its rounds' ratios, listed beside it.\n",
            run.rounds_completed,
            if run.rounds_completed < args.rounds as usize {
                format!(" of the {} asked (see Skipped)", args.rounds)
            } else {
                String::new()
            }
        );
    }
    text.push_str(
        "| system | socket | rw | depth | fio batch | IOPS | p50 µs | p99 µs | p99.9 µs | instr./datagram |\n",
    );
    text.push_str("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (case, rounds) in &run.medians {
        let _ = writeln!(
            text,
            "| {}{} | {} | {} | {} | {} | {:.0} | {:.1} | {:.1} | {} | {} |",
            case.system,
            // A case some rounds could not measure (see Skipped) is the median of fewer.
            if *rounds < run.rounds_completed {
                format!(" ({rounds} of {} rounds)", run.rounds_completed)
            } else {
                String::new()
            },
            case.socket,
            case.pattern,
            case.depth,
            if case.batch > 1 { case.batch.to_string() } else { "-".to_string() },
            case.iops,
            us(case.p50_ns),
            us(case.p99_ns),
            // Not recorded for the throughput client.
            if case.p999_ns == 0 { "-".to_string() } else { format!("{:.1}", us(case.p999_ns)) },
            case.instructions_per_datagram.map_or("-".to_string(), |packed| format!("{packed:.2}"))
        );
    }
    if args.rounds > 1 {
        text.push_str(
            "\n| goal | rw | ratio (median) | rounds | bound | verdict |\n| --- | --- | --- | --- | --- | --- |\n",
        );
    } else {
        text.push_str("\n| goal | rw | ratio | bound | verdict |\n| --- | --- | --- | --- | --- |\n");
    }
    for goal in &run.goals {
        let ratio = goal.ratio.as_ref().map(|ratio| format!("{ratio:.2}")).unwrap_or_else(|_| "-".into());
        let bound = format!("{} {:.1}", if goal.at_most { "≤" } else { "≥" }, goal.bound);
        let rounds = if args.rounds > 1 {
            let each: Vec<String> =
                goal.rounds.iter().map(|ratio| ratio.map_or("-".to_string(), |ratio| format!("{ratio:.2}"))).collect();
            format!(" {} |", each.join(" "))
        } else {
            String::new()
        };
        let _ = writeln!(text, "| {} | {} | {ratio} |{rounds} {bound} | {} |", goal.name, goal.pattern, goal.verdict());
    }
    if args.rounds > 1 {
        text.push_str(
            "\nA goal's ratio is the median of its rounds' ratios (each round's cases against each other), so it need not equal the ratio of the two medians in the table above.\n",
        );
    }
    let listed = |ratios: Vec<(&str, Option<f64>)>| {
        ratios
            .into_iter()
            .map(|(pattern, ratio)| {
                format!("{pattern} {}", ratio.map_or("-".to_string(), |ratio| format!("{ratio:.2}x")))
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(
        text,
        "\nFor reference (not goals): the engine's QD1 p99.9 over the UDP echo floor's: {}; the floor's own QD1 \
         p99.9 over nbdkit's over TCP, about the least the engine's p99.9 goal ratio can be on this machine: {}.",
        listed(floor_ratios(&run.cases)),
        listed(floor_over_nbdkit(&run.cases))
    );
    if !run.noise.is_empty() {
        let low = run.noise.iter().copied().fold(f64::INFINITY, f64::min);
        let high = run.noise.iter().copied().fold(0.0, f64::max);
        let shares = noise_share(&run.noise, &medians_only(run))
            .into_iter()
            .map(|(pattern, share)| {
                format!("{pattern} {}", share.map_or("-".to_string(), |share| format!("{:.2}%", share * 100.0)))
            })
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            text,
            "\nThe machine's noise (`netdam-bench noise`, {NOISE_SECONDS} s with a thread spinning on every CPU before each round): gaps of {} µs or more, {:.0} a second over the CPUs together (median; {low:.0}–{high:.0}). At the engine's QD1 rate they meet about {shares} of its I/Os; where that is above 0.1%, its p99.9 includes one.",
            crate::noise::LONG_GAP_US,
            crate::report::median(&run.noise),
        );
    }
    if !run.skipped.is_empty() {
        text.push_str("\nSkipped:\n\n");
        for reason in &run.skipped {
            let _ = writeln!(text, "- {reason}");
        }
    }
    if let Some(cpus) = &run.remote_cpus {
        let _ = writeln!(
            text,
            "\nRemote layout: the target's worker keeps its CPU to itself, as a target on another machine would, and fio and the NBD server run on CPUs {:?} only, nbdkit's cases alike. In the shared layout every process may use every CPU: nbdkit then has the cores to itself (the target is stopped before its cases), while netdam's cases share them with the target's worker. The remote layout is an approximation: on loopback the kernel's receive work for a datagram runs on the sender's CPU, so the target's core does some of the export's receive work for read answers, and the export's core some of the target's for write requests.",
            cpus
        );
    }
    text.push_str(
        "\nThe engine reaches the target over UDP on loopback; the NBD cases go fio → NBD server over the socket named, and for `netdam nbd` on to the target over UDP. Every block holds data before the cases run (the namespace's file is written before the target maps it; each nbdkit is filled by an untimed sequential fio write), so reads return data on both sides. A pmem namespace answers a write once it is in the namespace's file mapping: as on an NVMe drive, only FUA or a FLUSH waits for it to be durable, and these jobs ask for neither. On tmpfs the mapping is memory, as volatile as `nbdkit memory`'s (where the file is on a disk, the kernel's write-back of its dirty pages would run beside the cases).\n",
    );
    text
}

/// `fio-iops.png` (IOPS at the deepest depth per system and socket) and `fio-latency.png` (p50
/// and p99.9 at the shallowest), grouped bars, read and write side by side.
fn plot(cases: &[Case], dir: &Path) -> Result<Vec<String>, String> {
    use plotters::prelude::*;
    if !crate::plots::font_ready() {
        let looked = crate::plots::FONT_FILES.join(", ");
        return Err(format!("no usable font for plot text (looked for {looked}): plots skipped"));
    }
    let (Some(shallow), Some(deep)) =
        (cases.iter().map(|case| case.depth).min(), cases.iter().map(|case| case.depth).max())
    else {
        return Ok(Vec::new());
    };
    let mut groups: Vec<(&str, &str)> = Vec::new();
    for case in cases {
        if !groups.contains(&(case.system, case.socket)) {
            groups.push((case.system, case.socket));
        }
    }
    let labels: Vec<String> = groups.iter().map(|(system, socket)| format!("{system} ({socket})")).collect();
    // Group k is centred on x = k; with one label asked per group, plotters puts them there.
    let x_range = -0.5f64..groups.len() as f64 - 0.5;
    let label_of = |x: &f64| {
        let index = x.round();
        if (x - index).abs() < 1e-6 && index >= 0.0 {
            labels.get(index as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    let mut written = Vec::new();

    // IOPS at the deepest depth.
    let series: Vec<(String, Vec<Option<f64>>)> = PATTERNS
        .iter()
        .map(|pattern| {
            let values = groups
                .iter()
                .map(|(system, socket)| find(cases, system, socket, pattern, deep).map(|case| case.iops))
                .collect();
            (pattern.to_string(), values)
        })
        .collect();
    let top = series.iter().flat_map(|(_, values)| values.iter().flatten()).fold(1.0f64, |a, &b| a.max(b));
    let name = "fio-iops.png";
    let path = dir.join(name);
    let root = BitMapBackend::new(&path, (1100, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("fio 4 KiB random I/O, IOPS at iodepth {deep}"), ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(x_range.clone(), 0.0f64..top * 1.15)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(groups.len())
        .x_label_formatter(&label_of)
        .y_label_formatter(&|iops| format!("{iops:.0}"))
        .y_desc("IOPS")
        .draw()
        .map_err(|e| e.to_string())?;
    draw_bars(&mut chart, &series, 0.0)?;
    root.present().map_err(|e| e.to_string())?;
    written.push(name.to_string());

    // p50 and p99.9 at the shallowest depth.
    let mut series: Vec<(String, Vec<Option<f64>>)> = Vec::new();
    for pattern in PATTERNS {
        for (label, pick) in [("p50", 0usize), ("p99.9", 1)] {
            let values = groups
                .iter()
                .map(|(system, socket)| {
                    find(cases, system, socket, pattern, shallow)
                        .map(|case| if pick == 0 { case.p50_ns } else { case.p999_ns } as f64 / 1000.0)
                })
                .collect();
            series.push((format!("{pattern} {label}"), values));
        }
    }
    let top = series.iter().flat_map(|(_, values)| values.iter().flatten()).fold(1.0f64, |a, &b| a.max(b));
    let name = "fio-latency.png";
    let path = dir.join(name);
    let root = BitMapBackend::new(&path, (1100, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("fio 4 KiB random I/O, total latency (submission to completion) at iodepth {shallow}"),
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(x_range, (1.0f64..top * 2.0).log_scale())
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(groups.len())
        .x_label_formatter(&label_of)
        .y_desc("µs (log scale)")
        .draw()
        .map_err(|e| e.to_string())?;
    draw_bars(&mut chart, &series, 1.0)?;
    root.present().map_err(|e| e.to_string())?;
    written.push(name.to_string());
    Ok(written)
}

/// Draws each series as one bar per group, side by side within the group, bars from `base`.
fn draw_bars<'a, 'b: 'a, X, Y>(
    chart: &mut plotters::chart::ChartContext<
        'a,
        plotters::prelude::BitMapBackend<'b>,
        plotters::prelude::Cartesian2d<X, Y>,
    >,
    series: &[(String, Vec<Option<f64>>)],
    base: f64,
) -> Result<(), String>
where
    X: plotters::coord::ranged1d::Ranged<ValueType = f64>,
    Y: plotters::coord::ranged1d::Ranged<ValueType = f64>,
{
    use plotters::prelude::*;
    let width = 0.8 / series.len() as f64;
    for (index, (label, values)) in series.iter().enumerate() {
        let color = Palette99::pick(index).to_rgba();
        let bars = values.iter().enumerate().filter_map(|(group, value)| {
            let left = group as f64 - 0.4 + index as f64 * width;
            value.map(|value| Rectangle::new([(left, base), (left + width * 0.9, value)], color.filled()))
        });
        chart
            .draw_series(bars)
            .map_err(|e| e.to_string())?
            .label(label.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(system: &'static str, socket: &'static str, pattern: &'static str, iops: f64) -> Case {
        Case {
            system,
            socket,
            pattern,
            depth: THROUGHPUT_DEPTH,
            batch: 1,
            round: 0,
            iops,
            ops: iops as u64,
            p50_ns: 1,
            p99_ns: 1,
            p999_ns: 1,
            instructions_per_datagram: None,
        }
    }

    fn goal<'a>(goals: &'a [Goal], name: &str, pattern: &str) -> Option<&'a Goal> {
        goals.iter().find(|goal| goal.name == name && goal.pattern == pattern)
    }

    /// The noise's median over the engine's QD1 rate, per pattern; nothing where either is missing.
    #[test]
    fn the_noise_is_set_against_the_engines_depth_1_rate() {
        let at_depth_1 =
            |system, socket, pattern, iops| Case { depth: LATENCY_DEPTH, ..case(system, socket, pattern, iops) };
        let medians = [
            at_depth_1(PLUGIN, "udp", "randread", 80_000.0),
            // The engine's depth 32 and nbdkit's depth 1 are not the rate asked for.
            case(PLUGIN, "udp", "randwrite", 200_000.0),
            at_depth_1(NBDKIT, "tcp", "randwrite", 20_000.0),
        ];
        let shares = noise_share(&[200.0, 400.0, 300.0], &medians);
        assert_eq!(shares[0].0, "randread");
        assert!((shares[0].1.expect("reads measured") - 300.0 / 80_000.0).abs() < 1e-12, "{shares:?}");
        assert_eq!(shares[1], ("randwrite", None), "no engine case at depth 1 for writes");
        assert_eq!(noise_share(&[], &medians), [("randread", None), ("randwrite", None)]);
    }

    #[test]
    fn a_failed_late_round_keeps_the_rounds_before_it() {
        let mut run = Run {
            medium: "",
            fio: None,
            nbdkit: None,
            plugin: None,
            round: 2,
            rounds_completed: 2,
            cases: (0..3).map(|round| Case { round, ..case(PLUGIN, "udp", "randread", 1.0) }).collect(),
            medians: Vec::new(),
            skipped: Vec::new(),
            goals: Vec::new(),
            remote_cpus: None,
            noise: Vec::new(),
        };
        end_rounds_early(&mut run, 2, 5, "nbdkit did not start");
        assert_eq!(run.cases.iter().map(|case| case.round).collect::<Vec<_>>(), [0, 1]);
        assert_eq!(run.skipped, ["rounds 3 to 5: nbdkit did not start"]);
    }

    #[test]
    fn rounds_report_each_case_and_goal_at_their_median() {
        // Three rounds of the engine and nbdkit over TCP at depth 32, reads only.
        let rounds = [(100_000.0, 60_000.0), (180_000.0, 80_000.0), (150_000.0, 50_000.0)];
        let cases: Vec<Case> = rounds
            .iter()
            .enumerate()
            .flat_map(|(round, &(ours, theirs))| {
                let mut engine =
                    Case { round, p999_ns: 1000 * (round as u64 + 1), ..case(PLUGIN, "udp", "randread", ours) };
                engine.p50_ns = 10 * (3 - round as u64);
                // The target's packing in rounds 0 and 2 only (a round may miss its counters).
                engine.instructions_per_datagram = [Some(2.0), None, Some(1.5)][round];
                [engine, Case { round, ..case(NBDKIT, "tcp", "randread", theirs) }]
            })
            .collect();
        let (medians, rounds): (Vec<Case>, Vec<usize>) = median_cases(&cases).into_iter().unzip();
        assert_eq!(medians.len(), 2, "one median case per system");
        assert_eq!(rounds, [3, 3], "each the median of three rounds");
        let engine = find(&medians, PLUGIN, "udp", "randread", THROUGHPUT_DEPTH).expect("the engine's median");
        assert_eq!(engine.iops, 150_000.0);
        // Each figure's own median: p50s 30, 20, 10 and p99.9s 1000, 2000, 3000.
        assert_eq!((engine.p50_ns, engine.p999_ns), (20, 2000));
        // The packing's median is of the rounds that counted it; nbdkit has none.
        assert_eq!(engine.instructions_per_datagram, Some(1.75));
        let nbdkit = find(&medians, NBDKIT, "tcp", "randread", THROUGHPUT_DEPTH).expect("nbdkit's median");
        assert_eq!(nbdkit.instructions_per_datagram, None);

        let per_round = (0..3).map(|round| goals(&of_round(&cases, round), 1, false)).collect();
        let goals = median_goals(per_round);
        let name = "engine QD32 IOPS / nbdkit over TCP QD32 IOPS";
        let combined = goal(&goals, name, "randread").expect("the goal");
        // Rounds: 1.67, 2.25, 3.0: the median is met though the first round alone is not.
        let each: Vec<f64> = combined.rounds.iter().map(|ratio| ratio.expect("measured")).collect();
        assert_eq!(each.len(), 3);
        assert!((each[0] - 100.0 / 60.0).abs() < 1e-9 && (each[2] - 3.0).abs() < 1e-9, "{each:?}");
        assert_eq!(combined.ratio.as_ref().ok().copied(), Some(2.25));
        assert_eq!(combined.met(), Some(true));
        // A goal no round could compute stays unmeasured, with its reason.
        let unmeasured = goal(&goals, name, "randwrite").expect("the write goal");
        assert!(unmeasured.ratio.is_err() && unmeasured.rounds == [None, None, None]);
    }

    #[test]
    fn each_layout_compares_the_servers_of_that_layout_only() {
        let mut cases = Vec::new();
        for pattern in PATTERNS {
            for socket in ["tcp", "unix"] {
                cases.push(case(NETDAM_NBD, socket, pattern, 80.0));
                cases.push(case(NBDKIT, socket, pattern, 100.0));
                cases.push(case(NETDAM_NBD_REMOTE, socket, pattern, 110.0));
                cases.push(case(NBDKIT_REMOTE, socket, pattern, 125.0));
            }
        }
        let goals = goals(&cases, 1, true);
        let shared = goal(&goals, "netdam nbd QD32 IOPS / nbdkit QD32 IOPS, both over unix", "randread").unwrap();
        assert!((shared.ratio.as_ref().unwrap() - 0.8).abs() < 1e-9);
        assert_eq!(shared.met(), Some(false));
        let remote =
            goal(&goals, "netdam nbd QD32 IOPS / nbdkit QD32 IOPS, both over tcp, remote layout", "randwrite").unwrap();
        assert!((remote.ratio.as_ref().unwrap() - 0.88).abs() < 1e-9);
        assert_eq!(remote.met(), Some(false));

        // A run without the remote layout has no remote goal; where it ran, a missing case is
        // reported as not measured, naming it.
        let goals_shared = super::goals(&cases, 1, false);
        assert!(goals_shared.iter().all(|goal| !goal.name.ends_with("remote layout")));
        let no_peer: Vec<Case> = cases.iter().filter(|case| case.system != NBDKIT_REMOTE).cloned().collect();
        let goals_no_peer = super::goals(&no_peer, 1, true);
        let missing =
            goal(&goals_no_peer, "netdam nbd QD32 IOPS / nbdkit QD32 IOPS, both over unix, remote layout", "randread")
                .unwrap();
        assert!(missing.ratio.as_ref().unwrap_err().contains(NBDKIT_REMOTE));
    }

    /// The reference ratios pair the right systems at depth 1, per pattern, and say "not
    /// measured" (`None`) where a case is missing.
    #[test]
    fn the_floor_references_pair_the_right_cases_at_depth_one() {
        let at_depth_one = |system, socket, pattern, p999_ns| Case {
            depth: LATENCY_DEPTH,
            p999_ns,
            ..case(system, socket, pattern, 1.0)
        };
        let cases = vec![
            // A deeper case of the same systems, listed first: only the depth may skip it.
            Case { p999_ns: 1_000_000, ..case(NBDKIT, "tcp", "randread", 1.0) },
            at_depth_one(PLUGIN, "udp", "randread", 33_000),
            at_depth_one(FLOOR, "udp", "randread", 30_000),
            at_depth_one(NBDKIT, "tcp", "randread", 100_000),
            at_depth_one(NBDKIT, "unix", "randwrite", 50_000),
            at_depth_one(FLOOR, "udp", "randwrite", 25_000),
        ];
        let ratio = |ratios: Vec<(&str, Option<f64>)>, pattern: &str| {
            ratios.into_iter().find(|(named, _)| *named == pattern).and_then(|(_, ratio)| ratio)
        };
        assert!((ratio(floor_ratios(&cases), "randread").unwrap() - 1.1).abs() < 1e-9);
        assert!((ratio(floor_over_nbdkit(&cases), "randread").unwrap() - 0.3).abs() < 1e-9);
        // No engine case for writes, and nbdkit over a Unix socket is not the TCP peer.
        assert_eq!(ratio(floor_ratios(&cases), "randwrite"), None);
        assert_eq!(ratio(floor_over_nbdkit(&cases), "randwrite"), None);
    }

    /// The CPUs a thread of this process named `name` may run on, from /proc.
    fn thread_cpus(name: &str) -> Option<Vec<usize>> {
        let status = std::fs::read_to_string(crate::latency::thread_dir(name)?.join("status")).ok()?;
        let list = status.lines().find_map(|line| line.strip_prefix("Cpus_allowed_list:"))?;
        Some(cpu_list(list.trim()))
    }

    /// "0-2,5" → [0, 1, 2, 5].
    fn cpu_list(text: &str) -> Vec<usize> {
        text.split(',')
            .flat_map(|part| {
                let (low, high) = part.split_once('-').unwrap_or((part, part));
                low.parse::<usize>().unwrap()..=high.parse::<usize>().unwrap()
            })
            .collect()
    }

    #[test]
    fn the_remote_layout_keeps_off_the_cpu_the_targets_worker_runs_on() {
        let allowed = netdam_target::worker::allowed_cpus();
        let dir = tempfile::tempdir().unwrap();
        let mut config = target_config(dir.path(), BlockPoll::Blocking);
        config.namespaces[0].size = Some(ByteSize(1 << 20));
        // A target in a test process must not lock the whole process's memory.
        config.lock_memory = false;
        let target = Target::start(&config).unwrap();
        // The worker pins itself once its thread runs.
        let deadline = Instant::now() + Duration::from_secs(5);
        let worker = loop {
            match thread_cpus("netdam-worker-0") {
                Some(cpus) if cpus.len() == 1 || allowed.len() == 1 => break cpus,
                _ if Instant::now() > deadline => panic!("the worker never pinned itself"),
                _ => std::thread::sleep(Duration::from_millis(10)),
            }
        };
        let remote = remote_layout_cpus(&config);
        target.stop();
        match remote {
            Ok(cpus) => {
                assert!(cpus.iter().all(|cpu| !worker.contains(cpu)), "remote {cpus:?}, worker {worker:?}");
                assert_eq!(cpus.len() + 1, allowed.len());
            }
            Err(reason) => {
                assert_eq!(allowed.len(), 1, "{reason}");
                assert!(reason.contains("none is left"), "{reason}");
            }
        }
        let unpinned = netdam_target::config::Config { pin_workers: false, ..config.clone() };
        assert!(remote_layout_cpus(&unpinned).unwrap_err().contains("pin_workers = false"));
    }

    #[test]
    fn a_confined_child_runs_on_the_cpus_given_only() {
        let allowed = netdam_target::worker::allowed_cpus();
        if allowed.len() < 2 {
            eprintln!("skipped: one CPU allowed, so confining to it proves nothing");
            return;
        }
        let cpu = allowed[0];
        let mut command = Command::new("grep");
        command.args(["Cpus_allowed_list", "/proc/self/status"]);
        confine(&mut command, &[cpu]);
        let output = command.output().expect("grep runs");
        let text = String::from_utf8_lossy(&output.stdout);
        assert_eq!(text.split_whitespace().last(), Some(cpu.to_string().as_str()), "{text}");
    }
}
