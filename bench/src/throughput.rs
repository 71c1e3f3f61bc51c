//! `netdam-bench throughput`: operations per second as requests in flight and sessions grow,
//! beside a raw UDP echo driven the same way (same datagram sizes, same depth, same number of
//! client threads) in the same run; latency and CPU time per operation at each point.
//!
//! CPU time comes from the kernel's per-thread accounting: the target's worker thread (from
//! /proc) and each client thread (`getrusage(RUSAGE_THREAD)`).

use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use netdam_initiator::session::SessionConfig;
use netdam_initiator::{Client, ClientOptions, ClientPoll, Op};
use netdam_isa::limits::{DEFAULT_DATAGRAM_BYTES, MAX_INSTRUCTIONS_PER_DATAGRAM};
use netdam_isa::wire::{HEADER_LEN, RESPONSE_INSTRUCTION_HEADER_LEN};
use netdam_target::config::Config;
use netdam_target::Target;
use serde_json::json;

use crate::floor;
use crate::latency::{thread_cpu, LatencyPoll};

/// Instructions the throughput benchmark drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ThroughputOp {
    Read,
    Write,
    FetchAdd,
    Bread,
    Bwrite,
}

impl ThroughputOp {
    /// The instruction's name, as the wire format spells it.
    pub fn name(self) -> &'static str {
        match self {
            ThroughputOp::Read => "READ",
            ThroughputOp::Write => "WRITE",
            ThroughputOp::FetchAdd => "FETCH_ADD",
            ThroughputOp::Bread => "BREAD",
            ThroughputOp::Bwrite => "BWRITE",
        }
    }
}

/// Settings of the throughput benchmark.
#[derive(Debug, Clone, clap::Args)]
pub struct ThroughputArgs {
    /// Instruction to drive.
    #[arg(long, value_enum, default_value_t = ThroughputOp::Read)]
    pub op: ThroughputOp,
    /// Bytes per instruction, comma-separated (block instructions round up to 512-byte blocks):
    /// from 1 to what one 9000-byte datagram carries for --batch instructions (at --batch 1:
    /// READ 8960, WRITE 8944, BREAD and BWRITE 8704). FETCH_ADD always moves 8.
    #[arg(long, value_delimiter = ',', default_values_t = [64u32],
          value_parser = clap::value_parser!(u32).range(1..=DEFAULT_DATAGRAM_BYTES as i64))]
    pub sizes: Vec<u32>,
    /// Requests in flight per session, comma-separated (1 to 256).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 2, 4, 8, 16, 32, 64, 128],
          value_parser = crate::cli::in_flight())]
    pub depths: Vec<usize>,
    /// Sessions (client threads), comma-separated: 1 to 32, the sessions the target allows
    /// one address.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize],
          value_parser = crate::cli::sessions_per_address())]
    pub sessions: Vec<usize>,
    /// Instructions per datagram (1 to 64).
    #[arg(long, default_value_t = 1,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=MAX_INSTRUCTIONS_PER_DATAGRAM as u64))]
    pub batch: usize,
    /// Seconds per point, more than 0 (after a quarter of that as warm-up).
    #[arg(long, default_value_t = 2.0, value_parser = crate::cli::seconds)]
    pub seconds: f64,
    /// busy (worker, clients and echo spin), adaptive or blocking.
    #[arg(long, value_enum, default_value_t = LatencyPoll::Busy)]
    pub poll: LatencyPoll,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also write throughput.json and throughput.md to this directory.
    #[arg(long, value_name = "DIR")]
    pub out: Option<std::path::PathBuf>,
}

/// One point of the sweep.
pub struct Point {
    pub sessions: usize,
    pub depth: usize,
    pub size: u32,
    /// Echo round trips per second.
    pub floor_rate: f64,
    /// netdam instructions per second.
    pub ops_per_s: f64,
    /// Payload bytes per second.
    pub bytes_per_s: f64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    /// CPU time per instruction, ns: the target's worker, and the clients together.
    pub target_cpu_ns: f64,
    pub client_cpu_ns: f64,
    pub retransmissions: u64,
    pub busy: u64,
}

fn poll_spins(poll: LatencyPoll) -> bool {
    poll != LatencyPoll::Blocking
}

fn thread_cpu_self() -> Duration {
    // SAFETY: getrusage fills the struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    let micros = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    Duration::from_micros(micros(usage.ru_utime) + micros(usage.ru_stime))
}

/// Block size of the namespace this benchmark starts.
const BLOCK_BYTES: u32 = 512;

/// The most bytes one `op` may move when `batch` of them share a datagram of the client's
/// default size, and what bounds it; `None` for FETCH_ADD, which always moves 8.
fn max_size(op: ThroughputOp, batch: usize) -> Option<(u32, &'static str)> {
    let crate::cli::InstructionRoom { request, answer } =
        crate::cli::instruction_room(DEFAULT_DATAGRAM_BYTES, 0, batch);
    let whole_blocks = |bytes: usize| crate::cli::whole_blocks(bytes, BLOCK_BYTES as usize);
    let (bytes, what) = match op {
        ThroughputOp::FetchAdd => return None,
        ThroughputOp::Read => (answer, "answers"),
        ThroughputOp::Write => (request, "requests"),
        ThroughputOp::Bread => (whole_blocks(answer), "answers (whole 512-byte blocks)"),
        ThroughputOp::Bwrite => (whole_blocks(request), "requests (whole 512-byte blocks)"),
    };
    Some((bytes as u32, what))
}

/// Refuses `--sizes` that `--batch` instructions of `--op` cannot carry in one datagram, naming
/// the instruction and its range, before anything runs.
pub fn check(args: &ThroughputArgs) -> Result<(), String> {
    let Some((max, what)) = max_size(args.op, args.batch) else { return Ok(()) };
    let name = args.op.name();
    let batch = args.batch;
    if max == 0 {
        return Err(format!(
            "invalid value '{batch}' for '--batch': {batch} {name} {what} do not fit one datagram of \
             {DEFAULT_DATAGRAM_BYTES} bytes even at one block each; lower --batch"
        ));
    }
    match args.sizes.iter().find(|&&size| size > max) {
        Some(size) => Err(format!(
            "invalid value '{size}' for '--sizes': {name} moves 1 to {max} bytes at --batch {batch} ({batch} such \
             {what} share one datagram of {DEFAULT_DATAGRAM_BYTES} bytes)"
        )),
        None => Ok(()),
    }
}

/// Starts client threads together, as a barrier does, except that the thread that opens it
/// learns when a client ended before it arrived (it failed to connect, or panicked): a barrier
/// would wait for that client for ever. Each client [`arrive`](StartGate::arrive)s; the
/// measuring thread waits in [`open_when_ready`](StartGate::open_when_ready).
struct StartGate {
    state: Mutex<GateState>,
    changed: Condvar,
}

struct GateState {
    arrived: usize,
    /// `None` while waiting; then whether the clients run (`false`: one failed, all give up).
    open: Option<bool>,
}

/// What a client returns when the start was called off because another one failed.
const CALLED_OFF: &str = "called off: another client failed to start";

impl StartGate {
    fn new() -> Arc<StartGate> {
        Arc::new(StartGate { state: Mutex::new(GateState { arrived: 0, open: None }), changed: Condvar::new() })
    }

    /// Says this client is ready and waits for the start; `false` when it was called off.
    fn arrive(&self) -> bool {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.arrived += 1;
        self.changed.notify_all();
        while state.open.is_none() {
            state = self.changed.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
        state.open == Some(true)
    }

    /// Opens the gate once every one of `clients` has arrived and returns `true`; or, when one
    /// of them ends first, calls the start off and returns `false` (their results say why).
    fn open_when_ready<T>(&self, clients: &[JoinHandle<T>]) -> bool {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let open = loop {
            if state.arrived == clients.len() {
                break true;
            }
            // A client that has arrived waits for the gate, so one that ended never arrived.
            if clients.iter().any(JoinHandle::is_finished) {
                break false;
            }
            state =
                self.changed.wait_timeout(state, Duration::from_millis(10)).unwrap_or_else(PoisonError::into_inner).0;
        };
        state.open = Some(open);
        self.changed.notify_all();
        open
    }
}

/// Joins every client: their results, or the first failure (a client's error, or its panic,
/// whose message the panic hook has printed) that is not a start called off because of it.
fn join_all<T>(clients: Vec<JoinHandle<Result<T, String>>>) -> Result<Vec<T>, String> {
    let mut results = Vec::new();
    let (mut failure, mut called_off) = (None, false);
    for client in clients {
        match client.join() {
            Ok(Ok(result)) => results.push(result),
            Ok(Err(message)) if message == CALLED_OFF => called_off = true,
            Ok(Err(message)) => {
                failure.get_or_insert(message);
            }
            Err(_) => {
                failure.get_or_insert_with(|| "a client thread panicked (its message is above)".to_string());
            }
        }
    }
    match (failure, called_off) {
        (Some(message), _) => Err(message),
        (None, true) => Err(CALLED_OFF.to_string()),
        (None, false) => Ok(results),
    }
}

fn ops(op: ThroughputOp, size: u32, block: u32, batch: usize, index: u64, payload: &[u8]) -> (Vec<Op>, u32) {
    let blocks = size.div_ceil(block).max(1);
    let moved = match op {
        ThroughputOp::Bread | ThroughputOp::Bwrite => blocks * block,
        ThroughputOp::FetchAdd => 8,
        _ => size,
    };
    let list = (0..batch as u64)
        .map(|k| {
            let slot = (index * batch as u64 + k).wrapping_mul(2_654_435_761);
            let offset = (slot % ((32u64 << 20) / u64::from(moved.max(8)))) * u64::from(moved.max(8));
            let first = slot % ((32u64 << 20) / u64::from(block) - u64::from(blocks));
            match op {
                ThroughputOp::Read => Op::read(0, offset, size),
                ThroughputOp::Write => Op::write(0, offset, &payload[..size as usize]),
                ThroughputOp::FetchAdd => Op::fetch_add(0, offset / 8 * 8, 1),
                ThroughputOp::Bread => Op::block_read(0, first, blocks),
                ThroughputOp::Bwrite => Op::block_write(0, first, block, &payload[..moved as usize], false),
            }
        })
        .collect();
    (list, moved)
}

fn target_config(data_dir: &std::path::Path, poll: LatencyPoll) -> Config {
    crate::target::config(
        data_dir,
        poll.target(),
        crate::target::pmem_namespace("throughput-namespace.region", 32 << 20, BLOCK_BYTES),
    )
}

/// Echo round trips per second with `sessions` threads each keeping `depth` datagrams in flight.
fn floor_rate(
    poll: LatencyPoll,
    sessions: usize,
    depth: usize,
    sizes: (usize, usize),
    seconds: f64,
) -> Result<f64, String> {
    let spins = poll_spins(poll);
    let echo = floor::EchoServer::start(spins, sizes.1);
    let addr = echo.addr();
    let gate = StartGate::new();
    let threads: Vec<_> = (0..sessions)
        .map(|_| {
            let gate = gate.clone();
            std::thread::spawn(move || echo_client(addr, spins, depth, sizes.0, seconds, &gate))
        })
        .collect();
    gate.open_when_ready(&threads);
    let total: u64 = join_all(threads)?.into_iter().sum();
    echo.stop();
    Ok(total as f64 / seconds)
}

fn echo_client(
    addr: SocketAddr,
    spins: bool,
    depth: usize,
    request_bytes: usize,
    seconds: f64,
    gate: &StartGate,
) -> Result<u64, String> {
    let socket = floor::client_socket(addr, spins, Duration::from_millis(20));
    let request = vec![0xA5u8; request_bytes];
    let mut buffer = vec![0u8; 65_536];
    if !gate.arrive() {
        return Err(CALLED_OFF.into());
    }
    let warm_until = Instant::now() + Duration::from_secs_f64(seconds / 4.0);
    let stop_at = warm_until + Duration::from_secs_f64(seconds);
    let mut outstanding = 0;
    let mut counted = 0;
    loop {
        while outstanding < depth {
            if socket.send(&request).is_ok() {
                outstanding += 1;
            } else {
                break;
            }
        }
        let now = Instant::now();
        if now >= stop_at {
            return Ok(counted);
        }
        match socket.recv(&mut buffer) {
            Ok(_) => {
                outstanding -= 1;
                if now >= warm_until {
                    counted += 1;
                }
            }
            // A lost datagram (full socket buffer at high depth): count it as no longer in flight.
            Err(error)
                if error.kind() == std::io::ErrorKind::TimedOut || error.kind() == std::io::ErrorKind::WouldBlock =>
            {
                if !spins {
                    outstanding = outstanding.saturating_sub(1);
                }
            }
            Err(_) => {}
        }
    }
}

struct ClientResult {
    histogram: Histogram<u64>,
    instructions: u64,
    cpu: Duration,
    retransmissions: u64,
    busy: u64,
}

#[allow(clippy::too_many_arguments)]
fn netdam_client(
    addr: SocketAddr,
    poll: LatencyPoll,
    op: ThroughputOp,
    size: u32,
    block: u32,
    batch: usize,
    depth: usize,
    seconds: f64,
    gate: &StartGate,
) -> Result<ClientResult, String> {
    let session = SessionConfig { max_in_flight: depth, ..SessionConfig::default() };
    let poll = if poll_spins(poll) { ClientPoll::Busy } else { ClientPoll::Blocking };
    let mut client = Client::connect_with(addr, ClientOptions { session, poll, ..ClientOptions::default() })
        .map_err(|e| e.to_string())?;
    let payload = vec![0x3Cu8; 1 << 16];
    let mut histogram = crate::histogram();
    let mut submitted_at = std::collections::HashMap::with_capacity(depth * 2);
    if !gate.arrive() {
        return Err(CALLED_OFF.into());
    }
    let warm_until = Instant::now() + Duration::from_secs_f64(seconds / 4.0);
    let stop_at = warm_until + Duration::from_secs_f64(seconds);
    let mut cpu_start = None;
    let mut index = 0u64;
    let mut in_flight = 0;
    let mut instructions = 0u64;
    let stats_before = client.session_stats();
    loop {
        let now = Instant::now();
        if now >= warm_until && cpu_start.is_none() {
            cpu_start = Some(thread_cpu_self());
        }
        while now < stop_at && in_flight < depth {
            let (list, _) = ops(op, size, block, batch, index, &payload);
            index += 1;
            let started = Instant::now();
            let ticket = client.submit(&list).map_err(|e| e.to_string())?;
            submitted_at.insert(ticket, started);
            in_flight += 1;
        }
        let Some((ticket, result)) = client.wait_any().map_err(|e| e.to_string())? else { break };
        in_flight -= 1;
        let reply = result.map_err(|e| e.to_string())?;
        let done = Instant::now();
        let submitted = submitted_at.remove(&ticket).expect("timed");
        if submitted >= warm_until && done <= stop_at {
            for k in 0..batch {
                reply.data(k).map_err(|e| e.to_string())?;
            }
            crate::record(&mut histogram, done - submitted);
            instructions += batch as u64;
        }
    }
    let cpu = thread_cpu_self().saturating_sub(cpu_start.unwrap_or_default());
    let stats = client.session_stats();
    Ok(ClientResult {
        histogram,
        instructions,
        cpu,
        retransmissions: stats.retransmissions - stats_before.retransmissions,
        busy: stats.busy - stats_before.busy,
    })
}

fn netdam_point(
    target: &Target,
    args: &ThroughputArgs,
    sessions: usize,
    depth: usize,
    size: u32,
) -> Result<Point, String> {
    let spec = PointSpec { op: args.op, size, block_bytes: BLOCK_BYTES, batch: args.batch, sessions, depth };
    measure_point(target, &spec, args.poll, args.seconds)
}

/// What one point drives: against namespace 0 (block instructions) or region 0.
#[derive(Debug, Clone, Copy)]
pub struct PointSpec {
    pub op: ThroughputOp,
    /// Bytes per instruction.
    pub size: u32,
    /// The namespace's block size (block instructions).
    pub block_bytes: u32,
    pub batch: usize,
    pub sessions: usize,
    pub depth: usize,
}

/// Measures one point against a running target (its namespace 0 or region 0, whose first
/// 32 MiB are addressed), without the echo floor.
pub fn measure_point(target: &Target, spec: &PointSpec, poll: LatencyPoll, seconds: f64) -> Result<Point, String> {
    let addr = target.local_addr();
    let PointSpec { op, size, block_bytes, batch, sessions, depth } = *spec;
    let gate = StartGate::new();
    let threads: Vec<_> = (0..sessions)
        .map(|_| {
            let gate = gate.clone();
            std::thread::spawn(move || netdam_client(addr, poll, op, size, block_bytes, batch, depth, seconds, &gate))
        })
        .collect();
    if !gate.open_when_ready(&threads) {
        return Err(join_all(threads).err().unwrap_or_else(|| "a client ended before the start".to_string()));
    }
    std::thread::sleep(Duration::from_secs_f64(seconds / 4.0));
    let worker_before = thread_cpu("netdam-worker-0").unwrap_or_default();
    std::thread::sleep(Duration::from_secs_f64(seconds));
    let worker_cpu = thread_cpu("netdam-worker-0").unwrap_or_default().saturating_sub(worker_before);
    let mut histogram = crate::histogram();
    let (mut instructions, mut client_cpu, mut retransmissions, mut busy) = (0, Duration::ZERO, 0, 0);
    for result in join_all(threads)? {
        histogram.add(&result.histogram).map_err(|e| e.to_string())?;
        instructions += result.instructions;
        client_cpu += result.cpu;
        retransmissions += result.retransmissions;
        busy += result.busy;
    }
    let (_, moved) = ops(op, size, block_bytes, 1, 0, &[0u8; 1 << 16]);
    let per = |cpu: Duration| cpu.as_nanos() as f64 / instructions.max(1) as f64;
    Ok(Point {
        sessions,
        depth,
        size: moved,
        floor_rate: 0.0,
        ops_per_s: instructions as f64 / seconds,
        bytes_per_s: instructions as f64 * f64::from(moved) / seconds,
        p50_ns: histogram.value_at_quantile(0.5),
        p99_ns: histogram.value_at_quantile(0.99),
        target_cpu_ns: per(worker_cpu),
        client_cpu_ns: per(client_cpu),
        retransmissions,
        busy,
    })
}

/// Runs the sweep.
pub fn run(args: &ThroughputArgs) -> Result<Vec<Point>, String> {
    let scratch = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut points = Vec::new();
    for &size in &args.sizes {
        let payload = vec![0u8; 1 << 16];
        let (sample, moved) = ops(args.op, size, BLOCK_BYTES, args.batch, 0, &payload);
        let request_bytes = HEADER_LEN + sample.iter().map(|op| op.as_instruction().encoded_len()).sum::<usize>();
        let answer_data = match args.op {
            ThroughputOp::Read | ThroughputOp::Bread => moved as usize,
            ThroughputOp::FetchAdd => 8,
            _ => 0,
        };
        let response_bytes = HEADER_LEN + args.batch * (RESPONSE_INSTRUCTION_HEADER_LEN + answer_data);
        for &sessions in &args.sessions {
            for &depth in &args.depths {
                let floor = floor_rate(args.poll, sessions, depth, (request_bytes, response_bytes), args.seconds)?;
                let target = Target::start(&target_config(scratch.path(), args.poll)).map_err(|e| e.to_string())?;
                let mut point = netdam_point(&target, args, sessions, depth, size)?;
                target.stop();
                point.floor_rate = floor * args.batch as f64;
                points.push(point);
            }
        }
    }
    Ok(points)
}

fn points_json(points: &[Point], args: &ThroughputArgs) -> serde_json::Value {
    let rows: Vec<_> = points
        .iter()
        .map(|p| {
            json!({"sessions": p.sessions, "depth": p.depth, "bytes": p.size, "floor_ops_per_s": p.floor_rate,
                   "ops_per_s": p.ops_per_s, "ratio": p.ops_per_s / p.floor_rate.max(1.0), "bytes_per_s": p.bytes_per_s,
                   "p50_ns": p.p50_ns, "p99_ns": p.p99_ns, "target_cpu_ns_per_op": p.target_cpu_ns,
                   "client_cpu_ns_per_op": p.client_cpu_ns, "retransmissions": p.retransmissions, "busy": p.busy})
        })
        .collect();
    json!({"machine": crate::report::machine(), "op": format!("{:?}", args.op).to_lowercase(), "batch": args.batch,
           "poll": args.poll.name(), "seconds": args.seconds,
           "note": "floor: a UDP echo with the same datagram sizes, depth and client threads, same run", "points": rows})
}

fn markdown(points: &[Point], args: &ThroughputArgs) -> String {
    let mut text = format!(
        "Machine: {}. {:?} of the sizes below, {} per datagram, {} polling, {} s per point. The floor is a UDP echo with the same datagram sizes, depth and client threads, in the same run.\n\n",
        crate::report::machine(),
        args.op,
        args.batch,
        args.poll.name(),
        args.seconds
    );
    text.push_str("| sessions | depth | bytes | floor ops/s | netdam ops/s | x floor | MB/s | p50 µs | p99 µs | target CPU ns/op | client CPU ns/op |\n");
    text.push_str("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for p in points {
        text.push_str(&format!(
            "| {} | {} | {} | {:.0} | {:.0} | {:.2} | {:.1} | {:.1} | {:.1} | {:.0} | {:.0} |\n",
            p.sessions,
            p.depth,
            p.size,
            p.floor_rate,
            p.ops_per_s,
            p.ops_per_s / p.floor_rate.max(1.0),
            p.bytes_per_s / 1e6,
            p.p50_ns as f64 / 1000.0,
            p.p99_ns as f64 / 1000.0,
            p.target_cpu_ns,
            p.client_cpu_ns
        ));
    }
    text
}

/// Whether `perf stat` can count instructions here (virtual machines often cannot).
fn perf_counts_instructions() -> Result<(), String> {
    let output = std::process::Command::new("perf")
        .args(["stat", "-x,", "-e", "instructions", "true"])
        .output()
        .map_err(|error| format!("perf is not installed ({error})"))?;
    let text = String::from_utf8_lossy(&output.stderr);
    if text.contains("not supported") || text.contains("not counted") || !output.status.success() {
        Err("perf stat cannot count instructions on this machine (no hardware counters)".into())
    } else {
        Ok(())
    }
}

/// Prints the sweep and writes the files asked for.
pub fn report(points: &[Point], args: &ThroughputArgs) -> Result<(), String> {
    if let Err(reason) = perf_counts_instructions() {
        eprintln!("note: {reason}; CPU time per operation comes from the kernel's per-thread accounting");
    } else {
        eprintln!(
            "note: perf counts instructions here; for instructions per operation run `perf stat -e instructions -t <worker tid>` during a point"
        );
    }
    if args.json {
        println!("{}", points_json(points, args));
    } else {
        print!("{}", markdown(points, args));
        let rexmit: u64 = points.iter().map(|p| p.retransmissions).sum();
        let busy: u64 = points.iter().map(|p| p.busy).sum();
        println!("\nretransmissions: {rexmit}, busy answers: {busy}");
    }
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        std::fs::write(dir.join("throughput.json"), format!("{:#}\n", points_json(points, args)))
            .map_err(|e| e.to_string())?;
        std::fs::write(dir.join("throughput.md"), markdown(points, args)).map_err(|e| e.to_string())?;
        eprintln!("wrote {}/throughput.json and throughput.md", dir.display());
        crate::report::print_plotted(crate::plots::throughput(points, dir));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client that panics before the start neither hangs the others nor the measuring thread:
    /// the start is called off and the panic is the failure reported.
    #[test]
    fn a_client_that_dies_before_the_start_calls_it_off() {
        let gate = StartGate::new();
        let clients: Vec<JoinHandle<Result<u32, String>>> = (0..3)
            .map(|index| {
                let gate = gate.clone();
                std::thread::spawn(move || {
                    if index == 1 {
                        panic!("client {index} cannot connect");
                    }
                    if gate.arrive() {
                        Ok(index)
                    } else {
                        Err(CALLED_OFF.into())
                    }
                })
            })
            .collect();
        assert!(!gate.open_when_ready(&clients));
        assert_eq!(join_all(clients).unwrap_err(), "a client thread panicked (its message is above)");
    }

    #[test]
    fn a_client_error_is_the_failure_reported_and_ready_clients_start() {
        let gate = StartGate::new();
        let failing: Vec<JoinHandle<Result<u32, String>>> = vec![
            std::thread::spawn(|| Err("netdam client: max_in_flight is 0".into())),
            std::thread::spawn({
                let gate = gate.clone();
                move || if gate.arrive() { Ok(1) } else { Err(CALLED_OFF.into()) }
            }),
        ];
        assert!(!gate.open_when_ready(&failing));
        assert_eq!(join_all(failing).unwrap_err(), "netdam client: max_in_flight is 0");

        let gate = StartGate::new();
        let ready: Vec<JoinHandle<Result<u32, String>>> = (0..2)
            .map(|index| {
                let gate = gate.clone();
                std::thread::spawn(move || if gate.arrive() { Ok(index) } else { Err(CALLED_OFF.into()) })
            })
            .collect();
        assert!(gate.open_when_ready(&ready));
        assert_eq!(join_all(ready), Ok(vec![0, 1]));
    }

    #[test]
    fn sizes_a_batch_cannot_carry_are_refused_naming_the_op() {
        let args = |op, sizes: &[u32], batch| ThroughputArgs {
            op,
            sizes: sizes.to_vec(),
            depths: vec![1],
            sessions: vec![1],
            batch,
            seconds: 1.0,
            poll: LatencyPoll::Busy,
            json: false,
            out: None,
        };
        assert_eq!(check(&args(ThroughputOp::Read, &[64, 8960], 1)), Ok(()));
        let refused = check(&args(ThroughputOp::Read, &[8961], 1)).unwrap_err();
        assert!(refused.contains("'8961' for '--sizes': READ moves 1 to 8960 bytes at --batch 1"), "{refused}");
        let refused = check(&args(ThroughputOp::Write, &[4096], 4)).unwrap_err();
        assert!(refused.contains("WRITE moves 1 to 2218 bytes at --batch 4"), "{refused}");
        let refused = check(&args(ThroughputOp::Bwrite, &[512], 64)).unwrap_err();
        assert!(refused.contains("'64' for '--batch'"), "{refused}");
        assert_eq!(check(&args(ThroughputOp::FetchAdd, &[9000], 64)), Ok(()));
    }
}
