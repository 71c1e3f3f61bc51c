//! `netdam-bench allreduce`: Allreduce through the target (VADD into an accumulator, a FETCH_ADD
//! counter per chunk as the barrier, then READ: `netdam_initiator::allreduce`) against the
//! obvious alternative, host-side reduction (each worker WRITEs its buffer to the target, a
//! FETCH_ADD counter is the barrier, then it READs every other worker's buffer and sums them
//! itself), in the same run, on the same target, for each number of workers and buffer size.
//!
//! Workers are separate processes (this program started again as `allreduce-worker`), each with
//! its own client and session, as `netdam allreduce` runs. Each generates its i32 buffer, says
//! it is ready, and starts when told, so every worker of a run starts together. Each reports
//! how long it took to hold the result, the bytes its session sent and received (counted by the
//! session, datagram by datagram, retransmissions included) and a hash of its result, which
//! must equal the hash of the exact (wrapping) sum computed here: both methods give the same,
//! exact result, or the report fails.
//!
//! The two methods alternate (and swap order every repeat) so drift in the machine's load falls
//! on both alike. Times are the slowest worker's: when every worker holds the result.

use std::collections::hash_map::DefaultHasher;
use std::hash::Hasher;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use netdam_initiator::allreduce::{self, AllreduceOp, AllreducePlan};
use netdam_initiator::{Client, ClientError, Op};
use netdam_isa::units::parse_bytes;
use netdam_isa::LaneType;
use netdam_metrics::MetricsListen;
use netdam_target::config::{ByteSize, Config, PollMode, RegionBackend, RegionConfig};
use netdam_target::Target;
use serde_json::json;

use crate::report::machine;

/// IPv4 (20 B) and UDP (8 B) headers: what each counted datagram adds on the wire around its
/// payload (loopback has no link-layer framing).
pub const IP_UDP_HEADER_BYTES: u64 = 28;

/// How the workers reduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Method {
    /// VADD into the target's accumulator, a FETCH_ADD counter per chunk, READ of the sum.
    Target,
    /// WRITE own buffer, FETCH_ADD barrier, READ every other buffer and sum on the host.
    Host,
}

impl Method {
    fn name(self) -> &'static str {
        match self {
            Method::Target => "through the target",
            Method::Host => "host-side",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Method::Target => "target",
            Method::Host => "host",
        }
    }
}

/// Settings of the Allreduce comparison.
#[derive(Debug, Clone, clap::Args)]
pub struct AllreduceArgs {
    /// Worker processes per run, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [2u32, 4, 8])]
    pub workers: Vec<u32>,
    /// Bytes of each worker's buffer (i32 lanes), comma-separated; KiB/MiB suffixes.
    #[arg(long, value_delimiter = ',', value_parser = parse_bytes, default_values = ["1MiB", "16MiB", "64MiB"])]
    pub sizes: Vec<u64>,
    /// Runs of each method per case (alternating methods); the report gives the median.
    #[arg(long, default_value_t = 3)]
    pub repeats: u32,
    /// Target worker threads (each its own socket; the kernel spreads sessions over them).
    #[arg(long, default_value_t = 2)]
    pub target_workers: usize,
    /// A worker still missing a contribution after this long fails.
    #[arg(long, default_value_t = 120.0)]
    pub timeout_seconds: f64,
    /// A line to put in the report about the conditions of the run (other load on the machine).
    #[arg(long)]
    pub conditions: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also write allreduce.json, allreduce.md and allreduce.png to this directory.
    #[arg(long, value_name = "DIR")]
    pub out: Option<std::path::PathBuf>,
}

/// One worker process (started by `netdam-bench allreduce`, not by people).
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    #[arg(long)]
    target: SocketAddr,
    #[arg(long, value_enum)]
    method: Method,
    /// This worker's index, 0..workers.
    #[arg(long)]
    worker: u32,
    #[arg(long)]
    workers: u32,
    /// Bytes of the buffer.
    #[arg(long)]
    len: usize,
    /// Where the Allreduce area (header, counters, accumulator) starts.
    #[arg(long)]
    area: u64,
    /// Where the host-side area (a counter, then one slot per worker) starts.
    #[arg(long)]
    slots: u64,
    #[arg(long)]
    timeout_seconds: f64,
}

/// What one worker reported.
#[derive(Debug, Clone, Default)]
struct WorkerReport {
    elapsed_ns: u64,
    bytes_sent: u64,
    bytes_received: u64,
    datagrams_sent: u64,
    datagrams_received: u64,
    retransmissions: u64,
    result_hash: u64,
}

impl WorkerReport {
    fn wire_bytes(&self) -> u64 {
        self.bytes_sent + self.bytes_received + IP_UDP_HEADER_BYTES * (self.datagrams_sent + self.datagrams_received)
    }
}

/// One method on one case, over the repeats.
#[derive(Debug, Clone, Default)]
struct MethodResult {
    /// Per repeat: the slowest worker's time (every worker holds the result), ns.
    slowest_ns: Vec<u64>,
    /// Every worker of every repeat.
    workers: Vec<WorkerReport>,
}

impl MethodResult {
    fn time_ms(&self) -> f64 {
        median(&self.slowest_ns) as f64 / 1e6
    }

    /// `median (min–max)` of the slowest worker's times over the repeats, ms.
    fn time_cell(&self) -> String {
        let ms = |ns: u64| ns as f64 / 1e6;
        let low = self.slowest_ns.iter().copied().min().unwrap_or(0);
        let high = self.slowest_ns.iter().copied().max().unwrap_or(0);
        if self.slowest_ns.len() > 1 {
            format!("{:.1} ({:.1}–{:.1})", self.time_ms(), ms(low), ms(high))
        } else {
            format!("{:.1}", self.time_ms())
        }
    }

    fn retransmissions(&self) -> u64 {
        self.workers.iter().map(|report| report.retransmissions).sum()
    }

    fn mean(&self, field: impl Fn(&WorkerReport) -> u64) -> f64 {
        self.workers.iter().map(|report| field(report) as f64).sum::<f64>() / self.workers.len().max(1) as f64
    }

    fn to_json(&self) -> serde_json::Value {
        json!({
            "time_ms": self.time_ms(),
            "slowest_worker_ms_per_repeat": self.slowest_ns.iter().map(|ns| *ns as f64 / 1e6).collect::<Vec<_>>(),
            "wire_bytes_per_worker": self.mean(WorkerReport::wire_bytes),
            "udp_payload_bytes_sent_per_worker": self.mean(|report| report.bytes_sent),
            "udp_payload_bytes_received_per_worker": self.mean(|report| report.bytes_received),
            "datagrams_sent_per_worker": self.mean(|report| report.datagrams_sent),
            "datagrams_received_per_worker": self.mean(|report| report.datagrams_received),
            "retransmissions": self.retransmissions(),
        })
    }
}

/// One (workers, size) case.
#[derive(Debug, Clone)]
struct Case {
    workers: u32,
    bytes: u64,
    target: MethodResult,
    host: MethodResult,
}

impl Case {
    fn speedup(&self) -> f64 {
        self.host.time_ms() / self.target.time_ms().max(1e-9)
    }

    fn bytes_ratio(&self) -> f64 {
        self.host.mean(WorkerReport::wire_bytes) / self.target.mean(WorkerReport::wire_bytes).max(1.0)
    }
}

fn median(values: &[u64]) -> u64 {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    sorted.get(sorted.len() / 2).copied().unwrap_or(0)
}

/// Lane `lane` of worker `worker`'s buffer: spread over the whole i32 range, so the sums wrap and
/// any lane added twice or lost shows.
fn lane_value(worker: u32, lane: usize) -> i32 {
    let mixed = (lane as u32).wrapping_mul(0x9E37_79B1) ^ worker.wrapping_mul(0x85EB_CA77).rotate_left(13);
    mixed.wrapping_add(worker) as i32
}

fn buffer_of(worker: u32, len: usize) -> Vec<u8> {
    (0..len / 4).flat_map(|lane| lane_value(worker, lane).to_le_bytes()).collect()
}

fn hash(bytes: &[u8]) -> u64 {
    // The same binary hashes in every process (fixed keys), which is all the comparison needs.
    let mut hasher = DefaultHasher::new();
    hasher.write(bytes);
    hasher.finish()
}

/// The exact (wrapping) sum of every worker's buffer, hashed.
fn expected_hash(workers: u32, len: usize) -> u64 {
    let sum: Vec<u8> = (0..len / 4)
        .flat_map(|lane| {
            (0..workers).map(|worker| lane_value(worker, lane)).fold(0i32, i32::wrapping_add).to_le_bytes()
        })
        .collect();
    hash(&sum)
}

fn add_i32(into: &mut [u8], from: &[u8]) {
    for (sum, lane) in into.chunks_exact_mut(4).zip(from.chunks_exact(4)) {
        let total = i32::from_le_bytes(sum.try_into().expect("4 bytes"))
            .wrapping_add(i32::from_le_bytes(lane.try_into().expect("4 bytes")));
        sum.copy_from_slice(&total.to_le_bytes());
    }
}

/// Where the two methods' areas sit in the region, and its size.
struct Layout {
    area: u64,
    slots: u64,
    region_bytes: u64,
}

/// The host-side layout at `slots`: a counter, then one slot per worker.
fn slot_offset(slots: u64, worker: u32, len: usize) -> u64 {
    slots + 8 + u64::from(worker) * len as u64
}

/// Host-side reduction: write this worker's buffer, count it, wait for every worker's count,
/// then read every other buffer and sum it here. Nothing is pipelined across the barrier: the
/// obvious way, with each transfer as deep as the session's window allows.
fn host_side(
    client: &mut Client,
    args: &WorkerArgs,
    buffer: &[u8],
    result: &mut [u8],
    timeout: Duration,
) -> Result<(), String> {
    let fail = |error: ClientError| error.to_string();
    client.write(0, slot_offset(args.slots, args.worker, args.len), buffer).map_err(fail)?;
    client.call(&[Op::fetch_add(0, args.slots, 1)]).map_err(fail)?.data(0).map_err(fail)?;
    // Poll the counter as the Allreduce polls its chunks' counters: back off up to 1 ms.
    let started = Instant::now();
    let mut pause = Duration::from_micros(50);
    loop {
        let mut counter = [0u8; 8];
        client.read(0, args.slots, &mut counter).map_err(fail)?;
        let arrived = u64::from_le_bytes(counter);
        if arrived >= u64::from(args.workers) {
            break;
        }
        if started.elapsed() > timeout {
            return Err(format!(
                "host-side: {arrived} of {} workers wrote their buffer after {timeout:?}",
                args.workers
            ));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(1));
    }
    result.copy_from_slice(buffer);
    let mut other = vec![0u8; args.len];
    // Start with the next worker's buffer, so the workers do not all read the same slot at once.
    for step in 1..args.workers {
        let worker = (args.worker + step) % args.workers;
        client.read(0, slot_offset(args.slots, worker, args.len), &mut other).map_err(fail)?;
        add_i32(result, &other);
    }
    Ok(())
}

/// The worker process: connect, ready the buffer, say `ready`, wait for `go`, reduce, report one
/// JSON line.
pub fn worker(args: &WorkerArgs) -> Result<(), String> {
    let mut client = Client::connect(args.target).map_err(|error| format!("connect: {error}"))?;
    let buffer = buffer_of(args.worker, args.len);
    let mut result = vec![0u8; args.len];
    let timeout = Duration::try_from_secs_f64(args.timeout_seconds).map_err(|error| error.to_string())?;
    let plan = AllreducePlan::new(&client, 0, args.area, args.workers, args.len, LaneType::I32, AllreduceOp::Sum)
        .map_err(|error| error.to_string())?;
    println!("ready");
    std::io::stdout().flush().map_err(|error| error.to_string())?;
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).map_err(|error| error.to_string())?;
    if line.trim() != "go" {
        return Err(format!("expected \"go\" from the benchmark, got {line:?}"));
    }
    let before = client.session_stats();
    let started = Instant::now();
    match args.method {
        Method::Target => allreduce::allreduce(&mut client, &plan, &buffer, &mut result, timeout)
            .map_err(|error| error.to_string())?,
        Method::Host => host_side(&mut client, args, &buffer, &mut result, timeout)?,
    }
    let elapsed_ns = started.elapsed().as_nanos() as u64;
    let after = client.session_stats();
    println!(
        "{}",
        json!({
            "elapsed_ns": elapsed_ns,
            "bytes_sent": after.bytes_transmitted - before.bytes_transmitted,
            "bytes_received": after.bytes_received - before.bytes_received,
            "datagrams_sent": after.transmissions - before.transmissions,
            "datagrams_received": after.datagrams_received - before.datagrams_received,
            "retransmissions": after.retransmissions - before.retransmissions,
            "result_hash": hash(&result),
        })
    );
    Ok(())
}

/// Smallest chunk an Allreduce plan takes on any datagram the target negotiates (the default
/// datagram gives 8 KiB): the layout leaves room for a counter per chunk of this size.
const MIN_CHUNK_BYTES: usize = 1024;

fn layout(workers: u32, len: usize) -> Layout {
    // The Allreduce area first (its header, a counter per chunk, then the accumulator), then
    // the host-side area on its own page.
    let area_bytes = allreduce::HEADER_BYTES + 8 * len.div_ceil(MIN_CHUNK_BYTES) as u64 + len as u64;
    let slots = area_bytes.div_ceil(4096) * 4096;
    let region_bytes = (slot_offset(slots, workers, len)).div_ceil(4096) * 4096;
    Layout { area: 0, slots, region_bytes }
}

fn target_config(data_dir: &Path, target_workers: usize, region_bytes: u64) -> Config {
    Config {
        listen: "127.0.0.1:0".parse().expect("valid literal"),
        metrics_listen: MetricsListen::Off,
        data_dir: Some(data_dir.to_path_buf()),
        workers: target_workers,
        // Up to eight worker processes share two cores with the target: nobody spins.
        poll: PollMode::Blocking,
        pin_workers: false,
        lock_memory: false,
        regions: vec![RegionConfig {
            name: "allreduce".into(),
            backend: RegionBackend::Mem,
            path: None,
            size: ByteSize(region_bytes),
        }],
        auth: netdam_target::AuthMode::None,
        ..Config::default()
    }
}

struct Running {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

fn read_line(worker: &mut Running, index: u32) -> Result<String, String> {
    let mut line = String::new();
    let read = worker.stdout.read_line(&mut line).map_err(|error| format!("worker {index}: {error}"))?;
    if read == 0 {
        let status = worker.child.wait().map_err(|error| error.to_string())?;
        return Err(format!("worker {index} ended ({status}) without answering: see its message above"));
    }
    Ok(line)
}

/// One run of `method` with `workers` processes: the slowest worker's time and every report.
fn run_once(
    target: SocketAddr,
    method: Method,
    workers: u32,
    len: usize,
    layout: &Layout,
    timeout_seconds: f64,
) -> Result<(u64, Vec<WorkerReport>), String> {
    let program = std::env::current_exe().map_err(|error| format!("this program's path: {error}"))?;
    let mut running = Vec::new();
    for worker in 0..workers {
        let mut child = Command::new(&program)
            .arg("allreduce-worker")
            .args(["--target", &target.to_string(), "--method", method.key()])
            .args(["--worker", &worker.to_string(), "--workers", &workers.to_string()])
            .args(["--len", &len.to_string(), "--area", &layout.area.to_string()])
            .args(["--slots", &layout.slots.to_string(), "--timeout-seconds", &timeout_seconds.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|error| format!("starting worker {worker}: {error}"))?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        running.push(Running { child, stdin, stdout });
    }
    let outcome = (|| {
        for (index, worker) in running.iter_mut().enumerate() {
            let line = read_line(worker, index as u32)?;
            if line.trim() != "ready" {
                return Err(format!("worker {index} said {line:?} instead of ready"));
            }
        }
        for worker in running.iter_mut() {
            worker.stdin.write_all(b"go\n").and_then(|()| worker.stdin.flush()).map_err(|error| error.to_string())?;
        }
        let mut reports = Vec::new();
        for (index, worker) in running.iter_mut().enumerate() {
            let line = read_line(worker, index as u32)?;
            let value: serde_json::Value =
                serde_json::from_str(&line).map_err(|error| format!("worker {index}: {error} in {line:?}"))?;
            let field =
                |name: &str| value[name].as_u64().ok_or_else(|| format!("worker {index}: no {name} in {line:?}"));
            reports.push(WorkerReport {
                elapsed_ns: field("elapsed_ns")?,
                bytes_sent: field("bytes_sent")?,
                bytes_received: field("bytes_received")?,
                datagrams_sent: field("datagrams_sent")?,
                datagrams_received: field("datagrams_received")?,
                retransmissions: field("retransmissions")?,
                result_hash: field("result_hash")?,
            });
        }
        Ok(reports)
    })();
    for (index, mut worker) in running.into_iter().enumerate() {
        if outcome.is_err() {
            // One failed: the others would only wait out their timeout.
            let _ = worker.child.kill();
        }
        let status = worker.child.wait().map_err(|error| error.to_string())?;
        if outcome.is_ok() && !status.success() {
            return Err(format!("worker {index} of {method:?} failed ({status})"));
        }
    }
    let reports = outcome?;
    let slowest = reports.iter().map(|report| report.elapsed_ns).max().unwrap_or(0);
    Ok((slowest, reports))
}

fn prepare(client: &mut Client, method: Method, plan: &AllreducePlan, layout: &Layout) -> Result<(), String> {
    match method {
        Method::Target => allreduce::prepare(client, plan).map_err(|error| error.to_string()),
        Method::Host => client.write(0, layout.slots, &[0; 8]).map_err(|error| error.to_string()),
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| text.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_string())
}

/// Runs every case.
pub fn run(args: &AllreduceArgs) -> Result<(), String> {
    if args.workers.contains(&0) || args.sizes.iter().any(|bytes| *bytes == 0 || bytes % 4 != 0) {
        return Err("workers must be at least 1 and sizes whole i32 lanes (multiples of 4 bytes)".to_string());
    }
    let scratch = tempfile::tempdir().map_err(|error| format!("temporary directory: {error}"))?;
    let load_before = load_average();
    let mut cases = Vec::new();
    for &bytes in &args.sizes {
        let len = usize::try_from(bytes).map_err(|_| format!("{bytes} bytes: too large"))?;
        for &workers in &args.workers {
            let layout = layout(workers, len);
            let config = target_config(scratch.path(), args.target_workers, layout.region_bytes);
            let target = Target::start(&config).map_err(|error| format!("netdam target: {error}"))?;
            let mut setup = Client::connect(target.local_addr()).map_err(|error| error.to_string())?;
            let plan = AllreducePlan::new(&setup, 0, layout.area, workers, len, LaneType::I32, AllreduceOp::Sum)
                .map_err(|error| error.to_string())?;
            assert!(
                plan.area_bytes() <= layout.slots,
                "the layout leaves room for chunks of {MIN_CHUNK_BYTES} B at least"
            );
            let expected = expected_hash(workers, len);
            let mut case = Case { workers, bytes, target: MethodResult::default(), host: MethodResult::default() };
            for repeat in 0..args.repeats.max(1) {
                let order =
                    if repeat % 2 == 0 { [Method::Target, Method::Host] } else { [Method::Host, Method::Target] };
                for method in order {
                    prepare(&mut setup, method, &plan, &layout)?;
                    let (slowest, reports) =
                        run_once(target.local_addr(), method, workers, len, &layout, args.timeout_seconds)?;
                    if let Some(index) = reports.iter().position(|report| report.result_hash != expected) {
                        return Err(format!(
                            "{workers} workers, {bytes} bytes, {}: worker {index}'s result is not the exact sum",
                            method.name()
                        ));
                    }
                    let result = if method == Method::Target { &mut case.target } else { &mut case.host };
                    result.slowest_ns.push(slowest);
                    result.workers.extend(reports);
                    if !args.json {
                        eprintln!(
                            "{workers} workers, {}, {}: {:.1} ms",
                            size_name(bytes),
                            method.name(),
                            slowest as f64 / 1e6
                        );
                    }
                }
            }
            drop(setup);
            target.stop();
            cases.push(case);
        }
    }
    let conditions = Conditions {
        load_before,
        load_after: load_average(),
        note: args.conditions.clone(),
        target_workers: args.target_workers,
        repeats: args.repeats.max(1),
    };
    if args.json {
        println!("{:#}", to_json(&cases, &conditions));
    } else {
        print!("{}", markdown(&cases, &conditions));
    }
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).map_err(|error| format!("creating {}: {error}", dir.display()))?;
        let write = |name: &str, text: String| {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(|error| format!("writing {}: {error}", path.display()))
        };
        write("allreduce.json", format!("{:#}\n", to_json(&cases, &conditions)))?;
        write("allreduce.md", markdown(&cases, &conditions))?;
        eprintln!("wrote {}/allreduce.json and allreduce.md", dir.display());
        let points: Vec<PlotPoint> = cases
            .iter()
            .map(|case| PlotPoint {
                workers: case.workers,
                bytes: case.bytes,
                target_ms: case.target.time_ms(),
                host_ms: case.host.time_ms(),
                target_wire_bytes: case.target.mean(WorkerReport::wire_bytes),
                host_wire_bytes: case.host.mean(WorkerReport::wire_bytes),
            })
            .collect();
        crate::report::print_plotted(crate::plots::allreduce(&points, dir));
    }
    Ok(())
}

/// What the plot needs of one case.
pub struct PlotPoint {
    /// Worker processes.
    pub workers: u32,
    /// Bytes of each worker's buffer.
    pub bytes: u64,
    /// Time through the target, ms (median of the slowest worker).
    pub target_ms: f64,
    /// Time host-side, ms.
    pub host_ms: f64,
    /// Bytes on the wire per worker through the target.
    pub target_wire_bytes: f64,
    /// Bytes on the wire per worker host-side.
    pub host_wire_bytes: f64,
}

struct Conditions {
    load_before: String,
    load_after: String,
    note: Option<String>,
    target_workers: usize,
    repeats: u32,
}

/// `1 MiB`, `64 MiB`, or bytes.
pub fn size_name(bytes: u64) -> String {
    if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 10 && bytes.is_multiple_of(1 << 10) {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} B")
    }
}

fn to_json(cases: &[Case], conditions: &Conditions) -> serde_json::Value {
    let rows: Vec<_> = cases
        .iter()
        .map(|case| {
            json!({"workers": case.workers, "bytes": case.bytes, "lane": "i32",
                   "through_target": case.target.to_json(), "host_side": case.host.to_json(),
                   "speedup": case.speedup(), "wire_bytes_host_over_target": case.bytes_ratio(),
                   "results_exact_and_equal": true})
        })
        .collect();
    json!({
        "machine": machine(),
        "note": "a ratio within one run: both methods on the same target, alternating; absolute times hold for this machine and its load only",
        "load_average_before": conditions.load_before,
        "load_average_after": conditions.load_after,
        "conditions": conditions.note,
        "target_workers": conditions.target_workers,
        "target_poll": "blocking",
        "repeats": conditions.repeats,
        "time": "median over repeats of the slowest worker's time from the common start until it holds the result",
        "wire_bytes": "per worker: UDP payload bytes its session sent and received, counted datagram by datagram (retransmissions included), plus 28 B of IPv4 and UDP header per datagram",
        "cases": rows,
    })
}

fn markdown(cases: &[Case], conditions: &Conditions) -> String {
    let mib = |bytes: f64| bytes / f64::from(1u32 << 20);
    let mut text = format!(
        "# Allreduce through the target against host-side reduction\n\n\
         Machine: {}. Load average {} before the run, {} after{}.\n\n",
        machine(),
        conditions.load_before,
        conditions.load_after,
        conditions.note.as_ref().map(|note| format!(" ({note})")).unwrap_or_default()
    );
    text.push_str(&format!(
        "N worker processes, each with its own client and session, reduce N buffers of i32 lanes through one \
         target ({} worker threads, blocking polling, memory region), in the same run, both methods on the same \
         target, alternating, {} run(s) of each:\n\n\
         - **through the target**: each worker sends per chunk (8 KiB) one datagram with a VADD of its lanes into \
         the accumulator and a FETCH_ADD of the chunk's counter, then reads each chunk whose counter reached N \
         (`netdam_initiator::allreduce`, as `netdam allreduce` runs it);\n\
         - **host-side**: each worker WRITEs its buffer to its own slot on the target, adds 1 to a counter \
         (FETCH_ADD), waits for N, then READs the N − 1 other buffers and sums them itself.\n\n\
         Time: the slowest worker's, from the common start until it holds the result (median over the runs). \
         Bytes per worker: what its session sent and received, counted datagram by datagram (retransmissions \
         included), UDP payloads plus 28 B of IPv4/UDP header per datagram, averaged over the workers. Every \
         worker's result, by both methods, equals the exact wrapping i32 sum computed by the benchmark (compared \
         by hash; a difference fails the run).\n\n",
        conditions.target_workers, conditions.repeats
    ));
    text.push_str(
        "| workers | buffer | through target, ms: median (min–max) | host-side, ms: median (min–max) | speedup | MiB/worker, target | MiB/worker, host-side | bytes host/target | exact, equal |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for case in cases {
        text.push_str(&format!(
            "| {} | {} | {} | {} | {:.2}x | {:.2} | {:.2} | {:.2}x | yes |\n",
            case.workers,
            size_name(case.bytes),
            case.target.time_cell(),
            case.host.time_cell(),
            case.speedup(),
            mib(case.target.mean(WorkerReport::wire_bytes)),
            mib(case.host.mean(WorkerReport::wire_bytes)),
            case.bytes_ratio()
        ));
    }
    let retransmissions =
        |pick: fn(&Case) -> &MethodResult| cases.iter().map(|case| pick(case).retransmissions()).sum::<u64>();
    text.push_str(&format!(
        "\nSpeedup: host-side time over time through the target. Retransmissions over the whole run: {} through the \
         target, {} host-side (datagrams the kernel dropped from full socket buffers with several senders; they \
         are in the byte counts).\n\n\
         Why it grows with N: through the target each worker sends its buffer once and reads the sum once \
         (2 buffers' worth whatever N), host-side it sends its buffer and reads N − 1 others (N buffers' worth), \
         and the target serves N − 1 times as many READs. At N = 2 both move the same bytes.\n\n\
         This machine has {} cores for the target and all N workers: at N = 4 and 8 the workers and the target \
         contend for them, so the times are those of a crowded host, not of N hosts on a network; the load average \
         after the run includes the run's own workers. The result is the ratio of the two methods within this run; \
         the bytes are counts, which load changes only through retransmissions. On loopback both methods move \
         memory at the speed of the CPU rather than of a link, which favours host-side reduction (its extra bytes \
         cost copies, not wire time).\n",
        retransmissions(|case| &case.target),
        retransmissions(|case| &case.host),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
    ));
    text
}
