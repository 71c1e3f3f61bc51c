//! `netdam-bench latency` and `floor`: round trips of one instruction at a time, per opcode, size
//! and polling mode, each beside a raw UDP echo of the same request and answer sizes measured in
//! the same run (the floor).
//!
//! The target runs in this process with one worker, serving a memory region and a block
//! namespace on a pmem region (so block numbers show netdam's path, not a disk); one client
//! thread times each round trip.

use std::path::Path;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use netdam_initiator::{Client, ClientOptions, ClientPoll, Op};
use netdam_isa::limits::{DEFAULT_DATAGRAM_BYTES, MAX_DATAGRAM_BYTES, MAX_VADD_BYTES};
use netdam_isa::wire::{HEADER_LEN, RESPONSE_INSTRUCTION_HEADER_LEN};
use netdam_isa::LaneType;
use netdam_metrics::MetricsListen;
use netdam_target::config::{Config, EngineChoice, NamespaceBackend, PollMode};
use netdam_target::Target;

use crate::floor;
use crate::report::Summary;

/// Instructions the latency benchmark can time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchOp {
    Read,
    Write,
    Cas,
    FetchAdd,
    Vadd,
    Crc32,
    Bread,
    Bwrite,
}

impl BenchOp {
    /// The instruction's name, as reports print it.
    pub fn name(self) -> &'static str {
        match self {
            BenchOp::Read => "READ",
            BenchOp::Write => "WRITE",
            BenchOp::Cas => "CAS",
            BenchOp::FetchAdd => "FETCH_ADD",
            BenchOp::Vadd => "VADD",
            BenchOp::Crc32 => "CRC32",
            BenchOp::Bread => "BREAD",
            BenchOp::Bwrite => "BWRITE",
        }
    }
}

/// An engine the latency cases run through: one the target chooses itself, or a device model
/// process the benchmark starts (`model`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BenchEngine {
    /// `software`, `auto`, `fpga` or `fpga=PATH`, as the target's `--engine` takes them.
    Target(EngineChoice),
    /// A spinning `netdam-fpga-model` on a window of this run's own.
    Model,
}

impl std::str::FromStr for BenchEngine {
    type Err = String;

    fn from_str(text: &str) -> Result<BenchEngine, String> {
        if text == "model" {
            return Ok(BenchEngine::Model);
        }
        text.parse().map(BenchEngine::Target).map_err(|error: String| format!("{error}, or model"))
    }
}

/// A `netdam-fpga-model --spin` process serving a window in `dir`; killed when dropped.
struct ModelProcess {
    child: std::process::Child,
    window: std::path::PathBuf,
}

impl ModelProcess {
    /// Device memory it offers: the 64 MiB bench region and room to spare.
    const DEVICE_MEMORY_BYTES: u64 = 80 << 20;

    /// Starts the model; its SSD serves `namespace` (a file of `NAMESPACE_BYTES`, blocks of
    /// `NAMESPACE_BLOCK`), the file the targets' namespace is, so that BREAD and BWRITE reach
    /// the device's NVMe through the FPGA engine.
    fn start(dir: &Path, namespace: &Path) -> ModelProcess {
        let program = std::env::current_exe().expect("this program's path").with_file_name("netdam-fpga-model");
        let window = dir.join("fpga-model.window");
        let child = std::process::Command::new(&program)
            .arg("--window")
            .arg(&window)
            .args(["--device-memory-bytes", &Self::DEVICE_MEMORY_BYTES.to_string(), "--spin"])
            .arg("--namespace")
            .arg(namespace)
            .args(["--block-bytes", &NAMESPACE_BLOCK.to_string()])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|error| panic!("{}: {error} (build it: cargo build --release --bins)", program.display()));
        // Not pinned: pinned to the core the worker leaves, it shared that core with the client,
        // whose every wake-up then waited for the spinning model's slice to end (a run of minutes).
        let mut model = ModelProcess { child, window };
        // The model publishes its window (renamed into place) once it is powered on.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !model.window.exists() {
            if let Ok(Some(status)) = model.child.try_wait() {
                panic!("netdam-fpga-model exited before its window appeared: {status}");
            }
            assert!(Instant::now() < deadline, "netdam-fpga-model: no window after 10 s");
            std::thread::sleep(Duration::from_millis(10));
        }
        model
    }
}

impl Drop for ModelProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How the target worker and the client wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LatencyPoll {
    /// Worker, client and echo spin.
    Busy,
    /// The worker spins for its adaptive spin time after each datagram, then sleeps; client and
    /// echo spin (so the floor is the busy one, and back-to-back requests find the worker awake).
    Adaptive,
    /// Worker, client and echo sleep in the kernel.
    Blocking,
}

impl LatencyPoll {
    /// The target's polling mode for this case.
    pub fn target(self) -> PollMode {
        match self {
            LatencyPoll::Busy => PollMode::Busy,
            LatencyPoll::Adaptive => PollMode::Adaptive,
            LatencyPoll::Blocking => PollMode::Blocking,
        }
    }

    pub fn spins(self) -> bool {
        self != LatencyPoll::Blocking
    }

    /// Name for reports.
    pub fn name(self) -> &'static str {
        match self {
            LatencyPoll::Busy => "busy",
            LatencyPoll::Adaptive => "adaptive",
            LatencyPoll::Blocking => "blocking",
        }
    }
}

/// Settings of the latency benchmark.
#[derive(Debug, Clone, clap::Args)]
pub struct LatencyArgs {
    /// Measured round trips per case and system.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub requests: u64,
    /// Unmeasured round trips first.
    #[arg(long, default_value_t = 10_000)]
    pub warmup: u64,
    /// Instructions to time, comma-separated: read, write, cas, fetch-add, vadd, crc32, bread,
    /// bwrite. CAS and FETCH_ADD always move 8 bytes; block sizes round up to 512-byte blocks.
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["read"])]
    pub ops: Vec<BenchOp>,
    /// Bytes moved per instruction, comma-separated: from 1 to what one datagram of the
    /// client's default size (9000 bytes) carries: READ 8960, WRITE 8944, VADD 8192 (2048 f32
    /// lanes; sizes round down to whole lanes), BREAD and BWRITE 8704 (17 blocks), CRC32 1 MiB;
    /// READ and WRITE 24 bytes less with `--auth` (the trailer). `floor` takes what one UDP
    /// datagram carries (READ 65467, WRITE 65451, BREAD and BWRITE 65024).
    #[arg(long, value_delimiter = ',', default_values_t = [64u32],
          value_parser = clap::value_parser!(u32).range(1..=SPAN_BYTES as i64))]
    pub sizes: Vec<u32>,
    /// Polling modes, comma-separated: busy, adaptive, blocking.
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["busy"])]
    pub poll: Vec<LatencyPoll>,
    /// Pin the target's worker to a core (the target's default), or let the scheduler move it.
    #[arg(long, value_enum, default_value_t = crate::OnOff::On)]
    pub pin: crate::OnOff,
    /// Lock the process's memory (the target's default), or not.
    #[arg(long, value_enum, default_value_t = crate::OnOff::On)]
    pub lock_memory: crate::OnOff,
    /// The target's engines, comma-separated, each case run through each: software, auto,
    /// fpga=PATH (a running `netdam-fpga-model` window; start the model with
    /// `--device-memory-bytes 67108864` or more so that the 64 MiB bench region is placed on
    /// it), or model: a `netdam-fpga-model --spin` process this run starts on a window of its
    /// own beside this program, for the whole run (every engine's cases then run beside it
    /// alike). The model takes a core: on two cores, compare the engines
    /// with `--poll blocking`, since a busy worker, a busy client and the model are one spinner
    /// too many.
    #[arg(long, value_delimiter = ',', default_value = "software", value_name = "software|auto|fpga[=PATH]|model")]
    pub engine: Vec<BenchEngine>,
    /// Authenticated sessions: the target requires tenants, and every datagram of netdam's
    /// client carries a MAC trailer (its CRC is then not computed) and every instruction is
    /// checked against the tenant's grants. Without it, `auth = "none"`.
    #[arg(long)]
    pub auth: bool,
    /// With `--auth`: encrypted sessions (every datagram's body encrypted, both ways).
    #[arg(long, requires = "auth")]
    pub encrypt: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also measure netdam with the target's metrics off (no /metrics, no per-opcode recording)
    /// in the same run, alternating on and off in four rounds of half the requests each, and
    /// report the on/off ratios of p50 and p99.9 (the goal is at most 1.03x).
    #[arg(long)]
    pub metrics_compare: bool,
    /// Also write latency.json and latency.md (and plots, where fonts exist) to this directory.
    #[arg(long, value_name = "DIR")]
    pub out: Option<std::path::PathBuf>,
    /// Run every case this many times (each with its own floor) and report each case's p50 and
    /// p99.9 ratios per round and their medians: the figure to hold a goal against on a noisy
    /// machine. The table, JSON cases and plots are those of the last round.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rounds: u32,
}

/// One case: an instruction, its size and a polling mode, with the floor and netdam.
pub struct LatencyCase {
    /// Instruction name.
    pub op: &'static str,
    /// Bytes moved.
    pub size: u32,
    /// Polling mode.
    pub poll: LatencyPoll,
    /// The UDP echo of the same sizes.
    pub floor: Summary,
    /// netdam, when measured.
    pub netdam: Option<Summary>,
    /// Percent of one core the idle worker used over two seconds before the case.
    pub idle_worker_cpu: Option<f64>,
    /// Retransmissions during the netdam run.
    pub retransmissions: u64,
    /// Median time the target held a request (from the kernel's receive timestamp to the
    /// answer), as its answers report it: the part of netdam's round trip spent in the target.
    pub target_service_p50_ns: Option<u64>,
    /// With `--metrics-compare`: netdam with metrics off (`netdam` is then the metrics-on runs).
    pub metrics_off: Option<Summary>,
    /// The engine the target ran (`software` or `fpga`).
    pub engine: &'static str,
    /// CPU time of the floor's client thread per round trip, system time included (ns).
    pub floor_client_cpu_ns: u64,
    /// The same for netdam's client, when measured.
    pub netdam_client_cpu_ns: Option<u64>,
}

const NAMESPACE_BLOCK: u32 = 512;
/// The bench namespace's size.
const NAMESPACE_BYTES: u64 = 32 << 20;
/// Bytes of the region the memory instructions address: their offsets cycle through the first
/// 32 MiB.
const SPAN_BYTES: u32 = 32 << 20;

/// The most bytes one `op` may move in a case (`--sizes`), and why; `None` for CAS and
/// FETCH_ADD, which always move 8. With netdam, what one datagram of the size the client asks
/// for carries ([`DEFAULT_DATAGRAM_BYTES`], less the trailer of an authenticated session) and
/// what the instruction allows; for the floor alone, what one UDP datagram carries
/// ([`MAX_DATAGRAM_BYTES`]), since the echo answers with one datagram of netdam's sizes.
pub fn max_size(op: BenchOp, with_netdam: bool, auth: bool) -> Option<(u32, String)> {
    let trailer = if with_netdam && auth { netdam_auth::TRAILER_BYTES } else { 0 };
    let datagram = if with_netdam { DEFAULT_DATAGRAM_BYTES } else { MAX_DATAGRAM_BYTES };
    let room = crate::cli::instruction_room(datagram, trailer, 1);
    let (answer_room, operand_room) = (room.answer, room.request);
    let carried = if !with_netdam {
        format!("the floor echoes it in one UDP datagram of at most {MAX_DATAGRAM_BYTES} bytes")
    } else if auth {
        format!(
            "one datagram of {DEFAULT_DATAGRAM_BYTES} bytes carries it with its headers and the authentication trailer"
        )
    } else {
        format!("one datagram of {DEFAULT_DATAGRAM_BYTES} bytes carries it with its headers")
    };
    // Block sizes round up to whole blocks, so the largest is the whole blocks that fit. A
    // target's largest block transfer is its datagram size in blocks (17 of 512 bytes in 9000),
    // which the room in a datagram never exceeds.
    let whole_blocks = |bytes: usize| crate::cli::whole_blocks(bytes, NAMESPACE_BLOCK as usize);
    let (bytes, why) = match op {
        BenchOp::Cas | BenchOp::FetchAdd => return None,
        BenchOp::Read => (answer_room, format!("its answer: {carried}")),
        BenchOp::Write => (operand_room, format!("its request: {carried}")),
        BenchOp::Vadd if with_netdam => (MAX_VADD_BYTES, "the largest VADD operand, 2048 f32 lanes".to_string()),
        BenchOp::Vadd => (operand_room, format!("its request: {carried}")),
        BenchOp::Crc32 => (
            netdam_isa::limits::MAX_LONG_INSTRUCTION_BYTES,
            "the most one CRC32 may address (MAX_LONG_INSTRUCTION_BYTES)".to_string(),
        ),
        BenchOp::Bread => (whole_blocks(answer_room), format!("whole 512-byte blocks in its answer: {carried}")),
        BenchOp::Bwrite => (whole_blocks(operand_room), format!("whole 512-byte blocks in its request: {carried}")),
    };
    Some((bytes as u32, why))
}

/// Refuses a `--sizes` value that one of `--ops` cannot move (see [`max_size`]), naming the
/// instruction and its range, before anything runs.
pub fn check(args: &LatencyArgs, with_netdam: bool) -> Result<(), String> {
    for &op in &args.ops {
        let Some((max, why)) = max_size(op, with_netdam, args.auth) else { continue };
        if let Some(size) = args.sizes.iter().find(|&&size| size > max) {
            return Err(format!("invalid value '{size}' for '--sizes': {} moves 1 to {max} bytes ({why})", op.name()));
        }
    }
    Ok(())
}

fn op_for(op: BenchOp, size: u32, index: u64, payload: &[u8]) -> (Op, &'static str, u32) {
    let span = u64::from(SPAN_BYTES) / u64::from(size.max(8));
    let offset = (index.wrapping_mul(2_654_435_761) % span) * u64::from(size.max(8));
    let word = (offset / 8) * 8;
    match op {
        BenchOp::Read => (Op::read(0, offset, size), op.name(), size),
        BenchOp::Write => (Op::write(0, offset, &payload[..size as usize]), op.name(), size),
        BenchOp::Cas => (Op::cas(0, word, index, index + 1), op.name(), 8),
        BenchOp::FetchAdd => (Op::fetch_add(0, word, 1), op.name(), 8),
        BenchOp::Vadd => {
            let lanes = (size / 4).max(1) * 4;
            let offset = (offset / 4) * 4;
            (Op::vadd(0, offset, LaneType::F32, &payload[..lanes as usize], false), op.name(), lanes)
        }
        BenchOp::Crc32 => (Op::crc32(0, offset, size), op.name(), size),
        BenchOp::Bread | BenchOp::Bwrite => {
            let blocks = size.div_ceil(NAMESPACE_BLOCK).max(1);
            let span_blocks = NAMESPACE_BYTES / u64::from(NAMESPACE_BLOCK) - u64::from(blocks);
            let first = index.wrapping_mul(2_654_435_761) % span_blocks;
            let bytes = blocks * NAMESPACE_BLOCK;
            if op == BenchOp::Bread {
                (Op::block_read(0, first, blocks), op.name(), bytes)
            } else {
                let data = &payload[..bytes as usize];
                (Op::block_write(0, first, NAMESPACE_BLOCK, data, false), op.name(), bytes)
            }
        }
    }
}

/// Request and answer sizes of `op` on the wire, for the floor to echo alike.
fn wire_sizes(op: &Op, answer_data: usize) -> (usize, usize) {
    (HEADER_LEN + op.as_instruction().encoded_len(), HEADER_LEN + RESPONSE_INSTRUCTION_HEADER_LEN + answer_data)
}

fn answer_data(op: BenchOp, bytes: u32) -> usize {
    match op {
        BenchOp::Read | BenchOp::Bread => bytes as usize,
        BenchOp::Cas | BenchOp::FetchAdd => 8,
        BenchOp::Crc32 => 4,
        _ => 0,
    }
}

fn target_config(
    data_dir: &Path,
    poll: LatencyPoll,
    pin: bool,
    lock_memory: bool,
    metrics: bool,
    engine: &EngineChoice,
    namespace_file: Option<&Path>,
) -> Config {
    let mut namespace = crate::target::pmem_namespace("bench-namespace.region", NAMESPACE_BYTES, NAMESPACE_BLOCK);
    let mut fpga_namespace = None;
    if let Some(file) = namespace_file {
        namespace.backend = NamespaceBackend::File;
        namespace.path = file.to_path_buf();
        fpga_namespace = matches!(engine, EngineChoice::Fpga(_)).then(|| namespace.name.clone());
    }
    let config = crate::target::config(data_dir, poll.target(), namespace);
    let metrics_listen = if metrics { config.metrics_listen } else { MetricsListen::Off };
    Config { pin_workers: pin, lock_memory, metrics_listen, engine: engine.clone(), fpga_namespace, ..config }
}

/// The /proc directory of the thread named `name` of this process, if there is one.
pub fn thread_dir(name: &str) -> Option<std::path::PathBuf> {
    std::fs::read_dir("/proc/self/task")
        .ok()?
        .flatten()
        .map(|entry| entry.path())
        .find(|path| std::fs::read_to_string(path.join("comm")).is_ok_and(|comm| comm.trim() == name))
}

/// CPU time the thread named `name` of this process has used, from /proc.
pub fn thread_cpu(name: &str) -> Option<Duration> {
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let stat = std::fs::read_to_string(thread_dir(name)?.join("stat")).ok()?;
    // Fields after the parenthesised name: state is field 3, utime 14, stime 15.
    let after = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let used: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_nanos(used * 1_000_000_000 / ticks))
}

/// Percent of a core the idle worker uses over `window`.
fn idle_cpu(window: Duration) -> Option<f64> {
    // A new thread names itself once it runs: give it a moment.
    let named_by = Instant::now() + Duration::from_secs(1);
    let before = loop {
        match thread_cpu("netdam-worker-0") {
            Some(cpu) => break cpu,
            None if Instant::now() < named_by => std::thread::sleep(Duration::from_millis(5)),
            None => return None,
        }
    };
    std::thread::sleep(window);
    let after = thread_cpu("netdam-worker-0")?;
    Some((after - before).as_secs_f64() / window.as_secs_f64() * 100.0)
}

/// Runs every case, through each engine in turn.
pub fn run(args: &LatencyArgs, with_netdam: bool) -> Vec<LatencyCase> {
    let scratch = tempfile::tempdir().expect("temporary directory");
    let mut cases = Vec::new();
    // The model runs through every engine's cases, not only its own: a process spinning on one
    // of the machine's cores changes every other figure (on two cores it keeps a core awake,
    // and blocking wake-ups fall from tens of µs to a few), so all engines are measured beside it.
    // With the model, every engine's namespace is one file that the model's SSD serves too: the
    // software engine reads it through the target's own file device, the FPGA engine through
    // the device's NVMe (`fpga_namespace`), so their BREAD figures compare the same data path's
    // ends. On tmpfs where there is one, as the pmem namespace of the other runs is memory.
    let model_namespace = (with_netdam && args.engine.contains(&BenchEngine::Model)).then(|| {
        let dir = Path::new("/dev/shm");
        let file = if dir.is_dir() { tempfile::NamedTempFile::new_in(dir) } else { tempfile::NamedTempFile::new() }
            .expect("a namespace file");
        file.as_file().set_len(NAMESPACE_BYTES).expect("the namespace file's size");
        file
    });
    let model = model_namespace.as_ref().map(|namespace| ModelProcess::start(scratch.path(), namespace.path()));
    if !with_netdam {
        // The floor alone needs no engine: once.
        run_engine(args, &EngineChoice::Software, scratch.path(), None, false, &mut cases);
        return cases;
    }
    let namespace_file = model_namespace.as_ref().map(tempfile::NamedTempFile::path);
    for engine in &args.engine {
        let choice = match (engine, &model) {
            (BenchEngine::Target(choice), _) => choice.clone(),
            (BenchEngine::Model, Some(model)) => EngineChoice::Fpga(Some(model.window.clone())),
            (BenchEngine::Model, None) => unreachable!("started above whenever an engine is `model`"),
        };
        run_engine(args, &choice, scratch.path(), namespace_file, true, &mut cases);
    }
    cases
}

/// Every case through one engine.
fn run_engine(
    args: &LatencyArgs,
    engine: &EngineChoice,
    scratch: &Path,
    namespace_file: Option<&Path>,
    with_netdam: bool,
    cases: &mut Vec<LatencyCase>,
) {
    let payload = vec![0x3Cu8; 1 << 16];
    for &poll in &args.poll {
        let start_with = |metrics: bool| {
            let config = target_config(
                scratch,
                poll,
                args.pin == crate::OnOff::On,
                args.lock_memory == crate::OnOff::On,
                metrics,
                engine,
                namespace_file,
            );
            let auth = if args.auth { netdam_target::AuthMode::Tenants } else { netdam_target::AuthMode::None };
            let target =
                Target::start(&Config { auth, ..config }).unwrap_or_else(|error| panic!("netdam target: {error}"));
            if args.auth {
                crate::target::publish_bench_tenant(&target);
            }
            // Memory instructions through the device only if the bench region is on it.
            if target.engine_name() == "fpga" && !target.engine_state().region_on_device(0) {
                panic!(
                    "the 64 MiB bench region does not fit in the device's memory: start netdam-fpga-model \
                     with --device-memory-bytes 67108864 or more"
                );
            }
            if target.engine_name() == "fpga" && namespace_file.is_some() {
                assert!(target.engine_state().namespace_on_device(0), "the bench namespace is on the device's NVMe");
            }
            target
        };
        let start = || start_with(true);
        let idle_worker_cpu = if with_netdam {
            let target = start();
            let idle = idle_cpu(Duration::from_secs(2));
            target.stop();
            idle
        } else {
            None
        };
        // Started once to learn the engine's name: `auto` may find a device or not.
        let engine = if with_netdam {
            let target = start();
            let name = target.engine_name();
            target.stop();
            name
        } else {
            "software"
        };
        let labelled = |what: String| if engine == "software" { what } else { format!("{what}, {engine} engine") };
        for &op in &args.ops {
            let sizes: &[u32] = if matches!(op, BenchOp::Cas | BenchOp::FetchAdd) { &[8] } else { &args.sizes };
            let mut measured_bytes = Vec::new();
            for &size in sizes {
                let (sample, name, bytes) = op_for(op, size, 0, &payload);
                // Block sizes round up to whole blocks: measure each resulting size once.
                if measured_bytes.contains(&bytes) {
                    continue;
                }
                measured_bytes.push(bytes);
                let (request_bytes, response_bytes) = wire_sizes(&sample, answer_data(op, bytes));
                // The floor runs alone: a spinning netdam worker would take one of its cores.
                let echo = floor::EchoServer::start(poll.spins(), response_bytes);
                let (floor, floor_client_cpu_ns) =
                    floor::measure_with_cpu(echo.addr(), poll.spins(), request_bytes, args.warmup, args.requests);
                echo.stop();
                let floor = Summary::new(format!("udp echo {request_bytes} B → {response_bytes} B"), &floor);
                let mut metrics_off = None;
                let mut netdam_client_cpu_ns = None;
                let (netdam, retransmissions, service) = if with_netdam && args.metrics_compare {
                    // On, off, on, off: drift over the run (heat, other load) falls on both alike.
                    let half = LatencyArgs { requests: (args.requests / 2).max(1), ..args.clone() };
                    let (mut on, mut off) = (crate::histogram(), crate::histogram());
                    let (mut retransmissions, mut service) = (0, 0);
                    for round in 0..4 {
                        let metrics = round % 2 == 0;
                        let target = start_with(metrics);
                        let (histogram, retransmitted, service_p50, cpu) =
                            measure_netdam(&target, &half, poll, op, size, &payload);
                        target.stop();
                        netdam_client_cpu_ns = Some(netdam_client_cpu_ns.unwrap_or(0) + cpu / 4);
                        retransmissions += retransmitted;
                        if metrics {
                            on.add(&histogram).expect("histograms of one shape add");
                            service = service_p50;
                        } else {
                            off.add(&histogram).expect("histograms of one shape add");
                        }
                    }
                    metrics_off = Some(Summary::new(labelled(format!("netdam {name} {bytes} B, metrics off")), &off));
                    let metrics_on = Summary::new(labelled(format!("netdam {name} {bytes} B, metrics on")), &on);
                    (Some(metrics_on), retransmissions, Some(service))
                } else if with_netdam {
                    let target = start();
                    let (histogram, retransmissions, service, cpu) =
                        measure_netdam(&target, args, poll, op, size, &payload);
                    target.stop();
                    netdam_client_cpu_ns = Some(cpu);
                    let summary = Summary::new(labelled(format!("netdam {name} {bytes} B")), &histogram);
                    (Some(summary), retransmissions, Some(service))
                } else {
                    (None, 0, None)
                };
                cases.push(LatencyCase {
                    op: name,
                    size: bytes,
                    poll,
                    floor,
                    netdam,
                    idle_worker_cpu,
                    retransmissions,
                    target_service_p50_ns: service,
                    metrics_off,
                    engine,
                    floor_client_cpu_ns,
                    netdam_client_cpu_ns,
                });
            }
        }
    }
}

// Never inlined: `ops/client-instructions.sh` counts instructions from its entry to its exit.
#[inline(never)]
fn measure_netdam(
    target: &Target,
    args: &LatencyArgs,
    poll: LatencyPoll,
    op: BenchOp,
    size: u32,
    payload: &[u8],
) -> (Histogram<u64>, u64, u64, u64) {
    let mut options = ClientOptions {
        poll: if poll.spins() { ClientPoll::Busy } else { ClientPoll::Blocking },
        ..ClientOptions::default()
    };
    if args.auth {
        options.session.credentials = Some(crate::target::BENCH_CREDENTIALS);
        options.session.encrypt = args.encrypt;
    }
    let mut client =
        Client::connect_with(target.local_addr(), options).unwrap_or_else(|error| panic!("netdam client: {error}"));
    let before = client.session_stats().retransmissions;
    let mut histogram = crate::histogram();
    let mut service = crate::histogram();
    let mut cpu_from = crate::thread_cpu_ns();
    for index in 0..args.warmup + args.requests {
        if index == args.warmup {
            cpu_from = crate::thread_cpu_ns();
        }
        let (request, name, _) = op_for(op, size, index, payload);
        let started = Instant::now();
        let reply = client.call(std::slice::from_ref(&request)).unwrap_or_else(|error| panic!("{name}: {error}"));
        let elapsed = started.elapsed();
        if let Err(error) = reply.data(0) {
            panic!("{name} answered {error}");
        }
        if index >= args.warmup {
            crate::record(&mut histogram, elapsed);
            service.saturating_record(u64::from(reply.response().header.service_time_ns));
        }
        // Its buffer serves the next request, as the fio engine's does: a request in steady
        // state then allocates nothing on this side either.
        client.recycle(reply);
    }
    let cpu_per_request = (crate::thread_cpu_ns() - cpu_from) / args.requests.max(1);
    (histogram, client.session_stats().retransmissions - before, service.value_at_quantile(0.5), cpu_per_request)
}
