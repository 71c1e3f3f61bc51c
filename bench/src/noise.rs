//! How much of a spinning thread's time this machine takes away, and in what pieces.
//!
//! Every party of a busy-polled round trip (the target's worker, a spinning client, fio's job)
//! spins on a CPU. Whatever takes that CPU for a while (the scheduler's tick, an interrupt, a
//! kernel thread, another task, a hypervisor running something else on the virtual CPU) delays
//! the request in flight by as long, and no user-space change removes it. So it sets the tail:
//! a round trip meets such a gap in about (gaps per second on its parties' CPUs) / (round trips
//! per second) of its requests, and every percentile above that share includes them.
//! `netdam-bench noise` spins one thread on each CPU at once, as a busy worker and a busy client
//! do together, counts the gaps in their loops by length, and sets beside them what the kernel
//! counted on those CPUs over the same time: timer and other interrupts, and preemptions of the
//! spinning thread (docs/DECISIONS.md, "What a spinning CPU loses").

use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

/// The spinning threads' start signal: wait, go, or leave without measuring (a thread for another
/// CPU could not be started).
const WAIT: u8 = 0;
const GO: u8 = 1;
const ABORT: u8 = 2;

/// `netdam-bench noise`.
#[derive(Debug, Clone, clap::Args)]
pub struct NoiseArgs {
    /// How long every thread spins, seconds.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// CPUs to spin on, all at once, comma-separated (default: every CPU this process may run
    /// on, as a busy worker and a busy client beside it take them).
    #[arg(long, value_delimiter = ',')]
    pub cpus: Vec<usize>,
    /// Write noise.json and noise.md into this directory too.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Lower bounds of the gap lengths counted apart, µs; the last bucket is open-ended.
pub const BUCKET_FROM_US: [u64; 7] = [2, 5, 10, 20, 40, 80, 1_000];

/// The shortest loop iteration counted as a gap, ns (the first bucket's bound): the loop itself
/// (one clock read) takes tens of ns, so anything from 2 µs on is time the thread did not have.
pub const MIN_GAP_NS: u64 = BUCKET_FROM_US[0] * 1_000;

/// Gaps from this long, µs, are the ones a tail is made of here (several times a round trip),
/// counted apart in every report.
pub const LONG_GAP_US: u64 = 20;

/// Gaps of [`LONG_GAP_US`] or more a second, on every CPU of `noise` together.
pub fn long_gaps_per_second(noise: &[CpuNoise]) -> f64 {
    noise.iter().map(CpuNoise::long_gaps_per_second).sum()
}

/// The gaps one spinning thread met.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Gaps {
    /// Gaps per length bucket ([`BUCKET_FROM_US`]).
    pub counts: [u64; BUCKET_FROM_US.len()],
    /// Their total length, ns.
    pub lost_ns: u64,
    /// The longest, ns.
    pub longest_ns: u64,
}

impl Gaps {
    /// Counts one loop iteration of `ns`, if it is a gap ([`MIN_GAP_NS`] or more).
    pub fn add(&mut self, ns: u64) {
        if ns < MIN_GAP_NS {
            return;
        }
        let bucket = BUCKET_FROM_US.iter().rposition(|&from_us| ns >= from_us * 1_000).unwrap_or(0);
        self.counts[bucket] += 1;
        self.lost_ns += ns;
        self.longest_ns = self.longest_ns.max(ns);
    }

    /// Every gap counted.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Gaps of at least `from_us` µs, which must be one of [`BUCKET_FROM_US`].
    pub fn at_least(&self, from_us: u64) -> u64 {
        let first = BUCKET_FROM_US.iter().position(|&bound| bound == from_us).expect("a bucket's lower bound");
        self.counts[first..].iter().sum()
    }
}

/// What one CPU's spinning thread met.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuNoise {
    /// The CPU.
    pub cpu: usize,
    /// How long its thread spun, seconds.
    pub seconds: f64,
    /// Loop iterations (clock reads).
    pub loops: u64,
    /// The gaps between them.
    pub gaps: Gaps,
    /// Times the scheduler took the CPU from the spinning thread (`nonvoluntary_ctxt_switches`),
    /// when `/proc` told.
    pub preemptions: Option<u64>,
    /// Local timer interrupts on the CPU over the run (`LOC` in `/proc/interrupts`).
    pub timer_interrupts: Option<u64>,
    /// Interrupts of every kind on the CPU over the run, the timer's included.
    pub interrupts: Option<u64>,
}

impl CpuNoise {
    fn per_second(&self, count: u64) -> f64 {
        count as f64 / self.seconds
    }

    /// Gaps of [`LONG_GAP_US`] or more a second.
    pub fn long_gaps_per_second(&self) -> f64 {
        self.per_second(self.gaps.at_least(LONG_GAP_US))
    }

    /// The share of its time the thread lost to gaps.
    pub fn lost_share(&self) -> f64 {
        self.gaps.lost_ns as f64 / (self.seconds * 1e9)
    }

    /// A loop iteration's own cost, ns: the time not lost to gaps over the loops.
    pub fn loop_ns(&self) -> f64 {
        (self.seconds * 1e9 - self.gaps.lost_ns as f64).max(0.0) / self.loops.max(1) as f64
    }

    fn to_json(&self) -> serde_json::Value {
        let buckets: Vec<_> = BUCKET_FROM_US
            .iter()
            .zip(self.gaps.counts)
            .map(|(from_us, count)| serde_json::json!({ "from_us": from_us, "count": count }))
            .collect();
        serde_json::json!({
            "cpu": self.cpu, "seconds": self.seconds, "loops": self.loops, "loop_ns": self.loop_ns(),
            "gaps": self.gaps.total(), "gaps_per_s": self.per_second(self.gaps.total()),
            "gaps_from_20us_per_s": self.long_gaps_per_second(),
            "buckets": buckets, "lost_ns": self.gaps.lost_ns, "lost_share": self.lost_share(),
            "longest_ns": self.gaps.longest_ns,
            "preemptions": self.preemptions, "timer_interrupts": self.timer_interrupts, "interrupts": self.interrupts,
        })
    }
}

/// Interrupt counts per CPU from the text of `/proc/interrupts`: `(cpu, local timer, every
/// kind)`. The header names the CPU of each column (offline CPUs have none); a row counts when it
/// has a number for every column. `ERR:` and `MIS:` are machine-wide totals (one number, which
/// on a one-CPU machine would pass for a column) and are left out.
pub fn parse_interrupts(text: &str) -> Vec<(usize, u64, u64)> {
    let mut lines = text.lines();
    let Some(header) = lines.next() else { return Vec::new() };
    let cpus: Vec<usize> =
        header.split_whitespace().filter_map(|name| name.strip_prefix("CPU")?.parse().ok()).collect();
    let mut timer = vec![0u64; cpus.len()];
    let mut every = vec![0u64; cpus.len()];
    for line in lines {
        let mut fields = line.split_whitespace();
        let Some(label) = fields.next() else { continue };
        if matches!(label, "ERR:" | "MIS:") {
            continue;
        }
        let counts: Vec<u64> = fields.take(cpus.len()).map_while(|field| field.parse().ok()).collect();
        if counts.len() != cpus.len() {
            continue;
        }
        for (column, count) in counts.iter().enumerate() {
            every[column] += count;
            if label == "LOC:" {
                timer[column] += count;
            }
        }
    }
    cpus.into_iter().zip(timer).zip(every).map(|((cpu, timer), every)| (cpu, timer, every)).collect()
}

fn read_interrupts() -> Vec<(usize, u64, u64)> {
    std::fs::read_to_string("/proc/interrupts").map(|text| parse_interrupts(&text)).unwrap_or_default()
}

/// Spins one thread pinned to each of `cpus`, all at once, for `seconds`, and counts what each
/// met. Fails, naming the CPU, when a thread cannot be pinned.
pub fn measure(cpus: &[usize], seconds: f64) -> Result<Vec<CpuNoise>, String> {
    if !(seconds.is_finite() && seconds > 0.0 && seconds <= 3_600.0) {
        return Err(format!("--seconds {seconds}: give a time from above 0 to 3600 s"));
    }
    if cpus.is_empty() {
        return Err("no CPU to spin on".into());
    }
    let allowed = netdam_target::worker::allowed_cpus();
    if let Some(cpu) = cpus.iter().find(|cpu| !allowed.contains(cpu)) {
        return Err(format!("CPU {cpu} is not one this process may run on (it may use {allowed:?})"));
    }
    if let Some(cpu) = cpus.iter().enumerate().find_map(|(index, cpu)| cpus[..index].contains(cpu).then_some(cpu)) {
        // Two spinners on one CPU would take turns and count each other's turns as gaps.
        return Err(format!("CPU {cpu} is listed twice in --cpus"));
    }
    let spin_ns = (seconds * 1e9) as u64;
    // Every thread pins itself, then all start together: each meets the others spinning.
    let start = Arc::new(AtomicU8::new(WAIT));
    let mut threads = Vec::with_capacity(cpus.len());
    for &cpu in cpus {
        let signal = start.clone();
        match std::thread::Builder::new().name(format!("noise-cpu{cpu}")).spawn(move || spin(cpu, spin_ns, &signal)) {
            Ok(thread) => threads.push(thread),
            Err(error) => {
                // The threads started so far leave instead of waiting for ever.
                start.store(ABORT, Ordering::Release);
                for thread in threads {
                    let _ = thread.join();
                }
                return Err(format!("starting a thread for CPU {cpu}: {error}"));
            }
        }
    }
    let before = read_interrupts();
    start.store(GO, Ordering::Release);
    let mut results = Vec::with_capacity(threads.len());
    for thread in threads {
        results.push(thread.join().map_err(|_| "a spinning thread panicked".to_string())?);
    }
    let after = read_interrupts();
    let mut measured = Vec::with_capacity(results.len());
    for result in results {
        let mut noise = result?;
        let counted = |list: &[(usize, u64, u64)]| list.iter().find(|(cpu, ..)| *cpu == noise.cpu).copied();
        if let (Some((_, timer0, every0)), Some((_, timer1, every1))) = (counted(&before), counted(&after)) {
            noise.timer_interrupts = Some(timer1.saturating_sub(timer0));
            noise.interrupts = Some(every1.saturating_sub(every0));
        }
        measured.push(noise);
    }
    Ok(measured)
}

/// One spinning thread: pinned to `cpu`, it reads the clock in a loop for `spin_ns` once `start`
/// says go.
fn spin(cpu: usize, spin_ns: u64, start: &AtomicU8) -> Result<CpuNoise, String> {
    netdam_target::worker::set_affinity(&[cpu]).map_err(|error| format!("pinning a thread to CPU {cpu}: {error}"))?;
    loop {
        match start.load(Ordering::Acquire) {
            GO => break,
            ABORT => return Err("not started".into()),
            _ => std::thread::yield_now(),
        }
    }
    // SAFETY: gettid takes no argument and cannot fail.
    let thread_id = unsafe { libc::gettid() } as u32;
    let preempted =
        || netdam_target::stats::thread_context_switches("self", thread_id).map(|(_, involuntary)| involuntary);
    let preempted_before = preempted();
    let clock = || netdam_isa::time::clock_ns(libc::CLOCK_MONOTONIC);
    let started = clock();
    let deadline = started + spin_ns;
    let mut gaps = Gaps::default();
    let mut loops = 0u64;
    let mut last = started;
    while last < deadline {
        let now = clock();
        gaps.add(now - last);
        last = now;
        loops += 1;
    }
    let preemptions = preempted_before.zip(preempted()).map(|(before, after)| after.saturating_sub(before));
    Ok(CpuNoise {
        cpu,
        seconds: (last - started) as f64 / 1e9,
        loops,
        gaps,
        preemptions,
        timer_interrupts: None,
        interrupts: None,
    })
}

/// The markdown report: one row per CPU.
pub fn markdown(noise: &[CpuNoise]) -> String {
    let mut out = format!(
        "Machine: {}. One thread spinning on each CPU listed, all at once, reading the clock in a \
         loop; a gap is an iteration of 2 µs or more (time the thread did not have).\n\n",
        crate::report::machine()
    );
    out.push_str("| CPU | seconds | loop ns | gaps/s |");
    for (index, from_us) in BUCKET_FROM_US.iter().enumerate() {
        match BUCKET_FROM_US.get(index + 1) {
            Some(to_us) => out.push_str(&format!(" {from_us}–{to_us} µs |")),
            None => out.push_str(&format!(" ≥ {from_us} µs |")),
        }
    }
    out.push_str(&format!(
        " ≥ {LONG_GAP_US} µs /s | longest µs | time lost | preempted/s | timer interrupts/s | interrupts/s |\n|"
    ));
    out.push_str(&" --- |".repeat(4 + BUCKET_FROM_US.len() + 6));
    out.push('\n');
    let rate = |noise: &CpuNoise, count: Option<u64>| match count {
        Some(count) => format!("{:.0}", noise.per_second(count)),
        None => "-".into(),
    };
    for cpu in noise {
        out.push_str(&format!(
            "| {} | {:.1} | {:.0} | {:.0} |",
            cpu.cpu,
            cpu.seconds,
            cpu.loop_ns(),
            cpu.per_second(cpu.gaps.total())
        ));
        for count in cpu.gaps.counts {
            out.push_str(&format!(" {count} |"));
        }
        out.push_str(&format!(
            " {:.0} | {:.1} | {:.2}% | {} | {} | {} |\n",
            cpu.long_gaps_per_second(),
            cpu.gaps.longest_ns as f64 / 1e3,
            cpu.lost_share() * 100.0,
            rate(cpu, cpu.preemptions),
            rate(cpu, cpu.timer_interrupts),
            rate(cpu, cpu.interrupts),
        ));
    }
    let from_20 = long_gaps_per_second(noise);
    out.push_str(&format!(
        "\nGaps of {LONG_GAP_US} µs or more on these CPUs together: {from_20:.0} a second. A round trip whose \
         parties spin on them, at N round trips a second, meets one in about {from_20:.0}/N of its \
         requests (at 100,000 a second: {:.2}%), and its percentiles above that share include them.\n",
        from_20 / 100_000.0 * 100.0
    ));
    out
}

/// `netdam-bench noise`: measures, prints the markdown and writes the files asked for.
pub fn run(args: &NoiseArgs) -> Result<(), String> {
    let cpus = if args.cpus.is_empty() { netdam_target::worker::allowed_cpus() } else { args.cpus.clone() };
    let noise = measure(&cpus, args.seconds)?;
    let markdown = markdown(&noise);
    print!("{markdown}");
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).map_err(|error| format!("creating {}: {error}", dir.display()))?;
        let json = serde_json::json!({
            "machine": crate::report::machine(), "min_gap_ns": MIN_GAP_NS,
            "cpus": noise.iter().map(CpuNoise::to_json).collect::<Vec<_>>(),
        });
        let text = serde_json::to_string_pretty(&json).expect("JSON of plain values");
        for (name, contents) in [("noise.json", text + "\n"), ("noise.md", markdown)] {
            let path = dir.join(name);
            std::fs::write(&path, contents).map_err(|error| format!("writing {}: {error}", path.display()))?;
        }
        println!("wrote {}/noise.json and noise.md", dir.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each length lands in its bucket (bounds inclusive from below), shorter than a gap in none.
    #[test]
    fn gaps_are_counted_by_length() {
        let mut gaps = Gaps::default();
        for ns in [30, 1_999, 2_000, 4_999, 5_000, 19_999, 20_000, 79_999, 80_000, 999_999, 1_000_000, 7_000_000] {
            gaps.add(ns);
        }
        assert_eq!(gaps.counts, [2, 1, 1, 1, 1, 2, 2]);
        assert_eq!(gaps.total(), 10);
        assert_eq!(gaps.at_least(20), 6);
        assert_eq!(gaps.at_least(2), 10);
        assert_eq!(
            gaps.lost_ns,
            2_000 + 4_999 + 5_000 + 19_999 + 20_000 + 79_999 + 80_000 + 999_999 + 1_000_000 + 7_000_000
        );
        assert_eq!(gaps.longest_ns, 7_000_000);
    }

    /// Columns follow the header's CPU names (CPU 1 offline here); rows without a count per
    /// column are left out; the local timer is counted apart and in the total.
    #[test]
    fn interrupts_are_read_per_cpu_column() {
        let text = "           CPU0       CPU2       \n\
                    \x20 0:         31          4   IO-APIC   2-edge      timer\n\
                    \x20 9:          0          7   IO-APIC   9-fasteoi   acpi\n\
                    LOC:       1000       2500   Local timer interrupts\n\
                    RES:         10         20   Rescheduling interrupts\n\
                    ERR:          3\n";
        assert_eq!(parse_interrupts(text), [(0, 1000, 1041), (2, 2500, 2531)]);
        assert_eq!(parse_interrupts(""), []);
        // One CPU: the machine-wide totals have as many numbers as there are columns.
        let one = "           CPU0\nLOC:        500   Local timer interrupts\nERR:          9\nMIS:          1\n";
        assert_eq!(parse_interrupts(one), [(0, 500, 500)]);
    }

    /// A short run on every CPU this process may use: each CPU reported once, in order, with
    /// loops counted, no more time lost than it spun, and the loop's own cost positive.
    #[test]
    fn a_short_run_reports_every_cpu() {
        let cpus = netdam_target::worker::allowed_cpus();
        let noise = measure(&cpus, 0.05).expect("the CPUs this process may use");
        assert_eq!(noise.iter().map(|cpu| cpu.cpu).collect::<Vec<_>>(), cpus);
        for cpu in &noise {
            assert!(cpu.loops > 0 && cpu.seconds >= 0.05, "{cpu:?}");
            assert!(cpu.gaps.lost_ns as f64 <= cpu.seconds * 1e9, "{cpu:?}");
            assert!(cpu.loop_ns() > 0.0, "{cpu:?}");
        }
        let report = markdown(&noise);
        assert_eq!(
            report
                .lines()
                .filter(|line| line.starts_with("| ") && !line.starts_with("| CPU") && !line.starts_with("| ---"))
                .count(),
            cpus.len()
        );
    }

    /// A CPU the process may not use, or one listed twice, is refused by name, and nothing hangs.
    #[test]
    fn a_cpu_out_of_reach_is_named() {
        let error = measure(&[4_000], 0.01).expect_err("no machine here has CPU 4000");
        assert!(error.contains("CPU 4000"), "{error}");
        let cpu = netdam_target::worker::allowed_cpus()[0];
        let error = measure(&[cpu, cpu], 0.01).expect_err("one CPU twice");
        assert!(error.contains(&format!("CPU {cpu} is listed twice")), "{error}");
        let error = measure(&[cpu], 0.0).expect_err("no time to spin");
        assert!(error.contains("--seconds"), "{error}");
    }
}
