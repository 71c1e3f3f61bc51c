//! `netdam-bench tenancy`: what tenant authentication costs and what QoS protects, in one run.
//!
//! 1. READ 64 B through three sessions of one in-process target, alike but for authentication:
//!    none, a MAC on every datagram, and encrypted bodies (the target runs `auth = "none"`, which
//!    still authenticates a HELLO that offers a key); rounds alternate between the three so that
//!    drift on the machine falls on all of them.
//! 2. A latency-critical tenant's READ 64 B latency alone, then beside a best-effort tenant that
//!    floods the target from several sessions, and the same flood from a tenant that is not
//!    best-effort and has no rate limit (what QoS protects against).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use netdam_auth::{Credentials, TenantKey};
use netdam_initiator::{Client, ClientOptions, ClientPoll, Op};
use netdam_target::config::PollMode;
use netdam_target::tenants::{GrantRecord, GrantSpace, QosClass, TenantLimits, TenantRecord, TenantSnapshot};
use netdam_target::{AuthMode, Target};

use crate::report::Summary;

/// `netdam-bench tenancy`.
#[derive(Debug, Clone, clap::Args)]
pub struct TenancyArgs {
    /// Measured READs per authentication mode (split over the rounds).
    #[arg(long, default_value_t = 60_000)]
    pub requests: u64,
    /// Rounds the modes alternate in.
    #[arg(long, default_value_t = 6)]
    pub rounds: u64,
    /// Measured READs of the latency-critical tenant per QoS phase and round.
    #[arg(long, default_value_t = 20_000)]
    pub qos_requests: u64,
    /// Rounds of the QoS phases (alone, then beside each flood, in turn): the tables pool every
    /// round, and each flood's p99 against alone is also given per round with its median, since
    /// one round's tail moves with whatever else the machine does.
    #[arg(long, default_value_t = 5)]
    pub qos_rounds: u64,
    /// Sessions the flooding tenant sends from (1 to 32, what a target allows one address),
    /// each keeping `--flood-window` requests in flight.
    #[arg(long, default_value_t = 4, value_parser = crate::cli::sessions_per_address())]
    pub flood_sessions: usize,
    /// Requests in flight per flooding session (1 to 256).
    #[arg(long, default_value_t = 32, value_parser = crate::cli::in_flight())]
    pub flood_window: usize,
    /// The best-effort tenant's rate, cost units per second (a 4 KiB WRITE costs 4).
    #[arg(long, default_value_t = 100_000)]
    pub best_effort_rate: u64,
    /// How the targets' workers wait.
    #[arg(long, value_enum, default_value_t = PollMode::Busy)]
    pub poll: PollMode,
}

const KEYS: [u8; 3] = [0x11, 0x22, 0x33];

fn tenant(id: u32, name: &str, class: QosClass, limits: TenantLimits) -> TenantRecord {
    TenantRecord {
        name: name.into(),
        id,
        key_version: 1,
        key_hex: TenantKey::from_bytes([KEYS[id as usize - 1]; 32]).to_hex(),
        class,
        limits,
        grants: vec![GrantRecord { space: GrantSpace::All, permissions: vec!["all".into()], range: None }],
    }
}

fn credentials(id: u32) -> Credentials {
    Credentials { tenant: id, key_version: 1, key: TenantKey::from_bytes([KEYS[id as usize - 1]; 32]) }
}

fn start(data_dir: &std::path::Path, poll: PollMode, auth: AuthMode, tenants: &[TenantRecord]) -> Target {
    start_pinned(data_dir, poll, auth, tenants, false)
}

/// As `start`; with `pin_workers` its worker is pinned to the last CPU this thread may use.
fn start_pinned(
    data_dir: &std::path::Path,
    poll: PollMode,
    auth: AuthMode,
    tenants: &[TenantRecord],
    pin_workers: bool,
) -> Target {
    let namespace = crate::target::pmem_namespace("tenancy-namespace.region", 4 << 20, 4096);
    let config = crate::target::config(data_dir, poll, namespace);
    let target = Target::start(&netdam_target::Config { auth, pin_workers, lock_memory: false, ..config })
        .unwrap_or_else(|error| panic!("netdam target: {error}"));
    {
        let (snapshot, warnings) = TenantSnapshot::resolve(tenants, target.regions(), target.namespaces());
        assert!(warnings.is_empty(), "{warnings:?}");
        target.tenants().publish(snapshot);
    }
    target
}

fn connect(target: &Target, credentials: Option<Credentials>, encrypt: bool, poll: ClientPoll) -> Client {
    let mut options = ClientOptions { poll, ..ClientOptions::default() };
    options.session.credentials = credentials;
    options.session.encrypt = encrypt;
    Client::connect_with(target.local_addr(), options).unwrap_or_else(|error| panic!("netdam client: {error}"))
}

/// `count` READs of 64 B, each timed.
fn reads(client: &mut Client, count: u64, into: &mut Histogram<u64>) {
    let read = [Op::read(0, 0, 64)];
    for _ in 0..count {
        let started = Instant::now();
        let reply = client.call(&read).unwrap_or_else(|error| panic!("READ: {error}"));
        into.record(started.elapsed().as_nanos() as u64).expect("within the histogram's range");
        client.recycle(reply);
    }
}

fn row(name: &str, summary: &Summary, base: Option<&Summary>) -> String {
    let us = |ns: u64| ns as f64 / 1000.0;
    let ratio = |a: u64, b: u64| if b == 0 { f64::NAN } else { a as f64 / b as f64 };
    let (p50, p99, p999) = match base {
        Some(base) => (
            format!("{:.2}x", ratio(summary.p50, base.p50)),
            format!("{:.2}x", ratio(summary.p99, base.p99)),
            format!("{:.2}x", ratio(summary.p999, base.p999)),
        ),
        None => ("".into(), "".into(), "".into()),
    };
    format!(
        "| {name} | {:.1} | {:.1} | {:.1} | {p50} | {p99} | {p999} |",
        us(summary.p50),
        us(summary.p99),
        us(summary.p999)
    )
}

/// Runs both parts and prints their tables.
pub fn run(args: &TenancyArgs) {
    let scratch = tempfile::tempdir().expect("temporary directory");
    let poll = if args.poll == PollMode::Busy { ClientPoll::Busy } else { ClientPoll::Blocking };
    let everyone = [
        tenant(1, "interactive", QosClass::LatencyCritical, TenantLimits::default()),
        tenant(
            2,
            "batch",
            QosClass::BestEffort,
            TenantLimits {
                cost_per_second: args.best_effort_rate,
                burst: args.best_effort_rate / 10,
                ..TenantLimits::default()
            },
        ),
        tenant(3, "unshaped", QosClass::LatencyCritical, TenantLimits::default()),
    ];

    // 1. What authentication costs.
    // One target, so that one worker serves every mode (a second target would spin beside it).
    let auth_target = start(scratch.path(), args.poll, AuthMode::None, &everyone);
    let mut clients = [
        ("no authentication", connect(&auth_target, None, false, poll)),
        ("MAC", connect(&auth_target, Some(credentials(1)), false, poll)),
        ("MAC + encryption", connect(&auth_target, Some(credentials(1)), true, poll)),
    ];
    let mut histograms: Vec<Histogram<u64>> = (0..clients.len()).map(|_| crate::histogram()).collect();
    for (_, client) in clients.iter_mut() {
        let mut warm = crate::histogram();
        reads(client, 2_000, &mut warm);
    }
    let per_round = (args.requests / args.rounds.max(1)).max(1);
    for _ in 0..args.rounds.max(1) {
        for ((_, client), histogram) in clients.iter_mut().zip(histograms.iter_mut()) {
            reads(client, per_round, histogram);
        }
    }
    let summaries: Vec<Summary> = clients
        .iter()
        .zip(&histograms)
        .map(|((name, _), histogram)| Summary::new(name.to_string(), histogram))
        .collect();
    println!(
        "READ 64 B, {} requests per mode in {} alternating rounds, {:?} polling",
        per_round * args.rounds,
        args.rounds,
        args.poll
    );
    println!("| session | p50 µs | p99 µs | p99.9 µs | p50 / no auth | p99 / no auth | p99.9 / no auth |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for (index, summary) in summaries.iter().enumerate() {
        println!("{}", row(&summary.name, summary, (index > 0).then(|| &summaries[0])));
    }
    drop(clients);

    // 2. What QoS protects: the interactive tenant alone, beside a best-effort flood, and beside
    // the same flood from a tenant without QoS; first with the flood's threads scheduled like any
    // other, then at SCHED_IDLE, standing in for initiators on other hosts.
    let sink_dir = scratch.path().join("sink");
    std::fs::create_dir_all(&sink_dir).expect("sink target directory");
    let sink = start(&sink_dir, PollMode::Blocking, AuthMode::None, &everyone);
    let mut interactive = connect(&auth_target, Some(credentials(1)), false, poll);
    // The machine's own floor: the same best-effort flood sent to a second target, so nothing of
    // it passes the interactive tenant's target, yet its client threads and its serving take the
    // same cores. What the interactive tenant loses here, no scheduling in our target can win
    // back on a machine whose cores the load generator shares (docs/DECISIONS.md).
    let contended = [
        (2u32, "beside a best-effort flood", auth_target.local_addr()),
        (3u32, "beside the same flood, no QoS", auth_target.local_addr()),
        (2u32, "beside the same flood sent to another target", sink.local_addr()),
    ];
    let title = format!(
        "QoS: a latency-critical tenant's READ 64 B ({} per phase and round), alone and beside {} sessions x {} in flight of 4 KiB WRITEs",
        args.qos_requests, args.flood_sessions, args.flood_window
    );
    qos_table(args, &title, &mut interactive, &contended, FloodThreads::Normal);
    // On other hosts the flood would take none of this machine's cores. Its threads at
    // SCHED_IDLE run only on time nothing else here wants, so what the interactive tenant still
    // loses is the target's doing. The interactive client sleeps for its answers (spinning, it
    // would leave the flood no core at all), alone as beside the flood.
    let mut interactive = connect(&auth_target, Some(credentials(1)), false, ClientPoll::Blocking);
    let remote = [
        (2u32, "beside a best-effort flood at SCHED_IDLE", auth_target.local_addr()),
        (3u32, "beside the same flood at SCHED_IDLE, no QoS", auth_target.local_addr()),
    ];
    let title = format!(
        "QoS, the flood as if from other hosts (its threads spinning at SCHED_IDLE; the interactive client blocking): \
         READ 64 B ({} per phase and round) alone and beside {} sessions x {} in flight of 4 KiB WRITEs",
        args.qos_requests, args.flood_sessions, args.flood_window
    );
    qos_table(args, &title, &mut interactive, &remote, FloodThreads::Idle);
    drop(interactive);
    auth_target.stop();

    // The same, with the target's worker on a core of its own: a flood thread at SCHED_IDLE
    // still gets a slice of a core whose only other thread is the busy worker, and on other
    // hosts it would get none. The worker is pinned to the last CPU; this thread (the
    // interactive client) and the flood's threads, which inherit its affinity, to the others.
    let allowed = netdam_target::worker::allowed_cpus();
    let others = netdam_target::worker::cpus_beside_worker(&allowed, 0);
    let Some(worker_cpu) = netdam_target::worker::worker_cpu(&allowed, 0).filter(|_| !others.is_empty()) else {
        println!("\n(one CPU: the QoS phases with the worker on a core of its own are skipped)");
        return;
    };
    let pinned_dir = scratch.path().join("pinned");
    std::fs::create_dir_all(&pinned_dir).expect("pinned target directory");
    let pinned = start_pinned(&pinned_dir, args.poll, AuthMode::None, &everyone, true);
    let affinity = |cpus: &[usize]| {
        netdam_target::worker::set_affinity(cpus).unwrap_or_else(|error| panic!("sched_setaffinity {cpus:?}: {error}"))
    };
    affinity(&others);
    let mut interactive = connect(&pinned, Some(credentials(1)), false, ClientPoll::Blocking);
    let remote = [
        (2u32, "beside a best-effort flood at SCHED_IDLE, off the worker's core", pinned.local_addr()),
        (3u32, "beside the same flood, no QoS", pinned.local_addr()),
    ];
    let title = format!(
        "QoS, the flood as if from other hosts and the worker on a core of its own (worker pinned to CPU {}, \
         the interactive client and the flood at SCHED_IDLE on CPUs {:?}): READ 64 B ({} per phase and round) \
         alone and beside {} sessions x {} in flight of 4 KiB WRITEs",
        worker_cpu, others, args.qos_requests, args.flood_sessions, args.flood_window
    );
    qos_table(args, &title, &mut interactive, &remote, FloodThreads::Idle);
    drop(interactive);
    affinity(&allowed);
    pinned.stop();
}

/// How the flood's threads are scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FloodThreads {
    /// Like every other thread: on a small machine they take cores the target and the
    /// interactive client need.
    Normal,
    /// `SCHED_IDLE`, spinning: they run only on time no other thread wants, and never sleep.
    Idle,
}

/// The interactive tenant's READs alone, then beside each flood of `phases` (flooding tenant,
/// name, address flooded), `--qos-rounds` times over; prints the pooled table, each flood's
/// p99 against alone per round with the median, and each flood's rates.
fn qos_table(
    args: &TenancyArgs,
    title: &str,
    interactive: &mut Client,
    phases: &[(u32, &str, std::net::SocketAddr)],
    threads: FloodThreads,
) {
    let mut warm = crate::histogram();
    reads(interactive, 2_000, &mut warm);
    let rounds = args.qos_rounds.max(1);
    let mut alone = crate::histogram();
    let mut pooled: Vec<Histogram<u64>> = phases.iter().map(|_| crate::histogram()).collect();
    let mut p99_ratios: Vec<Vec<f64>> = vec![Vec::new(); phases.len()];
    let mut flood_totals = vec![(0.0f64, 0.0f64); phases.len()];
    for _ in 0..rounds {
        let mut alone_round = crate::histogram();
        reads(interactive, args.qos_requests, &mut alone_round);
        alone.add(&alone_round).expect("histograms alike");
        let alone_p99 = alone_round.value_at_quantile(0.99).max(1) as f64;
        for (index, &(flooder, _, addr)) in phases.iter().enumerate() {
            let (beside, writes, busy) = beside_flood(args, interactive, flooder, addr, threads);
            p99_ratios[index].push(beside.value_at_quantile(0.99) as f64 / alone_p99);
            pooled[index].add(&beside).expect("histograms alike");
            flood_totals[index].0 += writes / rounds as f64;
            flood_totals[index].1 += busy / rounds as f64;
        }
    }
    let mut summaries = vec![Summary::new("interactive alone".into(), &alone)];
    summaries.extend(phases.iter().zip(&pooled).map(|(&(_, name, _), histogram)| Summary::new(name.into(), histogram)));
    println!();
    println!("{title}; {rounds} rounds, pooled");
    println!("| interactive tenant | p50 µs | p99 µs | p99.9 µs | p50 / alone | p99 / alone | p99.9 / alone |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for (index, summary) in summaries.iter().enumerate() {
        println!("{}", row(&summary.name, summary, (index > 0).then(|| &summaries[0])));
    }
    println!("p99 / alone per round (each against the alone phase of its round):");
    for (&(_, name, _), ratios) in phases.iter().zip(&p99_ratios) {
        let listed: Vec<String> = ratios.iter().map(|ratio| format!("{ratio:.2}x")).collect();
        println!("- {name}: {}; median {:.2}x", listed.join(", "), crate::report::median(ratios));
    }
    // The first phase is the best-effort tenant's flood (issue 13's goal: at most 1.5x alone).
    if let (Some(&(_, name, _)), Some(ratios)) = (phases.first(), p99_ratios.first()) {
        let ratio = crate::report::median(ratios);
        let verdict = if ratio <= 1.5 { "met" } else { "not met" };
        println!("goal, p99 {name} at most 1.5x alone: median {ratio:.2}x, {verdict}");
    }
    for (&(_, name, _), (rate, busy)) in phases.iter().zip(flood_totals) {
        println!("flood {name}: {rate:.0} WRITEs/s completed, {busy:.0} BUSY answers/s (mean of the rounds)");
    }
}

/// The interactive tenant's READs while `flooder` floods `addr` with 4 KiB WRITEs from
/// `--flood-sessions` sessions; with the flood's WRITEs and BUSY answers per second.
fn beside_flood(
    args: &TenancyArgs,
    interactive: &mut Client,
    flooder: u32,
    addr: std::net::SocketAddr,
    threads: FloodThreads,
) -> (Histogram<u64>, f64, f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let busy = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let flood: Vec<_> = (0..args.flood_sessions)
        .map(|_| {
            let (stop, done, busy) = (stop.clone(), done.clone(), busy.clone());
            // At SCHED_IDLE the flood's clients spin: a client that sleeps for its answers
            // and its BUSY back-offs is woken by timers and interrupts on the interactive
            // client's core, which a flood from other hosts would not do (docs/DECISIONS.md).
            // Spinning at SCHED_IDLE, they give way to it whenever it wakes.
            let flood_poll = if threads == FloodThreads::Idle { ClientPoll::Busy } else { ClientPoll::Blocking };
            let mut options = ClientOptions { poll: flood_poll, ..ClientOptions::default() };
            options.session.credentials = Some(credentials(flooder));
            options.session.max_in_flight = args.flood_window;
            std::thread::spawn(move || {
                if threads == FloodThreads::Idle {
                    let param = libc::sched_param { sched_priority: 0 };
                    // SAFETY: sets this thread's own policy (pid 0); lowering needs no privilege.
                    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0 {
                        panic!("flood: SCHED_IDLE refused: {}", std::io::Error::last_os_error());
                    }
                }
                let mut client = Client::connect_with(addr, options).unwrap_or_else(|error| panic!("flood: {error}"));
                let data = vec![0x5Au8; 4096];
                let mut offset = 1u64 << 20;
                while !stop.load(Ordering::Relaxed) {
                    while client.has_room() {
                        offset = if offset >= 32 << 20 { 1 << 20 } else { offset + 4096 };
                        if client.submit(&[Op::write(0, offset, &data)]).is_err() {
                            break;
                        }
                    }
                    // Answers (BUSY ones are retried by the session after its back-off).
                    if let Ok(Some((_, Ok(reply)))) = client.wait_any() {
                        done.fetch_add(1, Ordering::Relaxed);
                        client.recycle(reply);
                    }
                }
                busy.fetch_add(client.session_stats().busy, Ordering::Relaxed);
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut beside = crate::histogram();
    reads(interactive, args.qos_requests, &mut beside);
    stop.store(true, Ordering::Relaxed);
    // A flood client that failed leaves figures "beside a flood" that were not: end the run.
    let failed = flood.into_iter().map(std::thread::JoinHandle::join).filter(Result::is_err).count();
    assert!(failed == 0, "{failed} flood client thread(s) panicked (the message is above): no figures beside a flood");
    let seconds = started.elapsed().as_secs_f64();
    (beside, done.load(Ordering::Relaxed) as f64 / seconds, busy.load(Ordering::Relaxed) as f64 / seconds)
}
