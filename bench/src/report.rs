//! Reports: percentile tables with ratios against the floor measured in the same run, as text
//! for people, JSON for machines and markdown for the README, each naming the machine.

use std::path::Path;

use hdrhistogram::Histogram;
use serde_json::json;

use crate::latency::{LatencyArgs, LatencyCase};

/// Percentiles of one system, in nanoseconds.
#[derive(Debug, Clone)]
pub struct Summary {
    /// What was measured.
    pub name: String,
    /// Samples.
    pub count: u64,
    /// Percentiles.
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub p999: u64,
    pub p9999: u64,
    /// Largest sample.
    pub max: u64,
    /// Mean and standard deviation.
    pub mean: f64,
    pub stdev: f64,
}

impl Summary {
    /// Summarizes `histogram` under `name`.
    pub fn new(name: String, histogram: &Histogram<u64>) -> Summary {
        Summary {
            name,
            count: histogram.len(),
            p50: histogram.value_at_quantile(0.50),
            p90: histogram.value_at_quantile(0.90),
            p99: histogram.value_at_quantile(0.99),
            p999: histogram.value_at_quantile(0.999),
            p9999: histogram.value_at_quantile(0.9999),
            max: histogram.max(),
            mean: histogram.mean(),
            stdev: histogram.stdev(),
        }
    }

    /// p99.9 − p50: how far the tail sits from the middle.
    pub fn jitter(&self) -> u64 {
        self.p999.saturating_sub(self.p50)
    }

    fn to_json(&self) -> serde_json::Value {
        json!({"name": self.name, "count": self.count, "p50_ns": self.p50, "p90_ns": self.p90, "p99_ns": self.p99,
               "p999_ns": self.p999, "p9999_ns": self.p9999, "max_ns": self.max, "mean_ns": self.mean,
               "stdev_ns": self.stdev, "jitter_ns": self.jitter()})
    }
}

/// Cores, CPU model and kernel of this machine, for every report.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|line| line.starts_with("model name"))
                .map(|line| line.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".to_string());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string();
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    format!("{cores} cores, {cpu}, Linux {kernel}")
}

/// `items` grouped by `key`, groups in the order their first item comes, items in their order:
/// a case measured in several rounds, as one group per case.
pub fn groups_by<T, K: PartialEq>(items: &[T], key: impl Fn(&T) -> K) -> Vec<Vec<&T>> {
    let mut groups: Vec<(K, Vec<&T>)> = Vec::new();
    for item in items {
        let item_key = key(item);
        match groups.iter_mut().find(|(group_key, _)| *group_key == item_key) {
            Some((_, group)) => group.push(item),
            None => groups.push((item_key, vec![item])),
        }
    }
    groups.into_iter().map(|(_, group)| group).collect()
}

/// What [`run_rounds`] measured: each round's result, up to a round that failed after the first.
#[derive(Debug)]
pub struct Rounds<T> {
    /// Rounds asked for.
    pub asked: u32,
    /// The results of the rounds that completed, in order.
    pub measured: Vec<T>,
    /// The round that failed (from 0) and why, when one ended the rounds early.
    pub failed: Option<(usize, String)>,
}

impl<T> Rounds<T> {
    /// "rounds N to M: why", when a round ended them early.
    pub fn missing(&self) -> Option<String> {
        self.failed.as_ref().map(|(round, reason)| format!("{}: {reason}", rounds_not_measured(*round, self.asked)))
    }
}

/// "rounds N to M": the rounds from `failed` (from 0) to the last of `asked`, counted from 1.
pub fn rounds_not_measured(failed: usize, asked: u32) -> String {
    format!("rounds {} to {asked}", failed + 1)
}

/// Runs `asked` rounds of `measure`. A round after the first that fails ends them: the rounds
/// before it stand (minutes of measurement are not thrown away for the last round's failure),
/// and the report says which rounds are missing and why. A first round that fails is the run's
/// error.
pub fn run_rounds<T>(asked: u32, mut measure: impl FnMut(usize) -> Result<T, String>) -> Result<Rounds<T>, String> {
    let mut rounds = Rounds { asked, measured: Vec::new(), failed: None };
    for round in 0..asked as usize {
        if asked > 1 {
            eprintln!("round {} of {}", round + 1, asked);
        }
        match measure(round) {
            Ok(result) => rounds.measured.push(result),
            Err(reason) if round > 0 => {
                eprintln!("round {} failed, ending with the {round} rounds before it: {reason}", round + 1);
                rounds.failed = Some((round, reason));
                break;
            }
            Err(reason) => return Err(reason),
        }
    }
    Ok(rounds)
}

/// The median of `values` (the mean of the middle two for an even count); NaN for none.
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

fn ratio(value: u64, floor: u64) -> f64 {
    value as f64 / floor.max(1) as f64
}

fn latency_json(cases: &[LatencyCase], args: &LatencyArgs) -> serde_json::Value {
    let rows: Vec<_> = cases
        .iter()
        .map(|case| {
            let netdam = case.netdam.as_ref();
            json!({"op": case.op, "bytes": case.size, "poll": case.poll.name(), "engine": case.engine,
                   "floor": case.floor.to_json(),
                   "netdam": netdam.map(Summary::to_json),
                   "p50_ratio": netdam.map(|n| ratio(n.p50, case.floor.p50)),
                   "p999_ratio": netdam.map(|n| ratio(n.p999, case.floor.p999)),
                   "idle_worker_cpu_percent": case.idle_worker_cpu, "retransmissions": case.retransmissions,
                   "target_service_p50_ns": case.target_service_p50_ns,
                   "floor_client_cpu_ns": case.floor_client_cpu_ns,
                   "netdam_client_cpu_ns": case.netdam_client_cpu_ns,
                   "client_cpu_ratio": case.netdam_client_cpu_ns.map(|cpu| ratio(cpu, case.floor_client_cpu_ns)),
                   "metrics_off": case.metrics_off.as_ref().map(Summary::to_json),
                   "metrics_on_off_p50_ratio": case.metrics_off.as_ref().zip(netdam).map(|(off, on)| ratio(on.p50, off.p50)),
                   "metrics_on_off_p999_ratio": case.metrics_off.as_ref().zip(netdam).map(|(off, on)| ratio(on.p999, off.p999))})
        })
        .collect();
    json!({"machine": machine(), "note": "absolute times hold for this machine only; the ratios are the result",
           "requests": args.requests, "warmup": args.warmup, "cases": rows})
}

/// Prints the latency cases as a table (or JSON).
pub fn print_latency(cases: &[LatencyCase], args: &LatencyArgs) {
    if args.json {
        println!("{}", latency_json(cases, args));
        return;
    }
    let us = |ns: u64| ns as f64 / 1000.0;
    // `floor` measures no netdam: no ratios, no time in a target.
    let with_netdam = cases.iter().any(|case| case.netdam.is_some());
    println!("machine: {} (absolute times hold for this machine only; ratios are the result)", machine());
    println!("{} measured round trips per system and case, after {} warm-up", args.requests, args.warmup);
    let header = format!(
        "{:<34} {:<8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "system (µs)", "poll", "p50", "p90", "p99", "p99.9", "p99.99", "max", "stdev", "jitter"
    );
    if with_netdam {
        println!("{header} {:>7} {:>7} {:>9}", "p50 x", "p99.9 x", "in target");
    } else {
        println!("{header}");
    }
    for case in cases {
        for (summary, is_floor) in [(Some(&case.floor), true), (case.netdam.as_ref(), false)] {
            let Some(s) = summary else { continue };
            let (p50x, p999x, service) = if is_floor {
                (String::new(), String::new(), String::new())
            } else {
                (
                    format!("{:.2}", ratio(s.p50, case.floor.p50)),
                    format!("{:.2}", ratio(s.p999, case.floor.p999)),
                    case.target_service_p50_ns.map(|ns| format!("{:.1}", us(ns))).unwrap_or_default(),
                )
            };
            let row = format!(
                "{:<34} {:<8} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1}",
                s.name,
                case.poll.name(),
                us(s.p50),
                us(s.p90),
                us(s.p99),
                us(s.p999),
                us(s.p9999),
                us(s.max),
                s.stdev / 1000.0,
                us(s.jitter()),
            );
            if with_netdam {
                println!("{row} {p50x:>7} {p999x:>7} {service:>9}");
            } else {
                println!("{row}");
            }
        }
    }
    for case in cases {
        let (Some(on), Some(off)) = (case.netdam.as_ref(), case.metrics_off.as_ref()) else { continue };
        println!(
            "metrics on/off {} {} B {}: p50 {:.1}/{:.1} µs = {:.3}x, p99.9 {:.1}/{:.1} µs = {:.3}x (goal ≤ 1.03x)",
            case.op,
            case.size,
            case.poll.name(),
            us(on.p50),
            us(off.p50),
            ratio(on.p50, off.p50),
            us(on.p999),
            us(off.p999),
            ratio(on.p999, off.p999)
        );
    }
    let idle: Vec<String> = cases
        .iter()
        .filter_map(|case| case.idle_worker_cpu.map(|cpu| (case.poll.name(), cpu)))
        .collect::<std::collections::BTreeMap<_, _>>()
        .into_iter()
        .map(|(poll, cpu)| format!("{poll} {cpu:.1}%"))
        .collect();
    if !idle.is_empty() {
        println!("idle worker CPU (share of one core over 2 s with no requests): {}", idle.join(", "));
    }
    for case in cases {
        let Some(cpu) = case.netdam_client_cpu_ns else { continue };
        println!(
            "client CPU per request, {} {} B {}: floor {:.2} µs, netdam {:.2} µs = {:.2}x{}",
            case.op,
            case.size,
            case.poll.name(),
            us(case.floor_client_cpu_ns),
            us(cpu),
            ratio(cpu, case.floor_client_cpu_ns),
            if case.poll.spins() { " (spinning clients: CPU is wall time)" } else { "" }
        );
    }
    if with_netdam {
        println!("{IN_TARGET}");
    }
    let retransmissions: u64 = cases.iter().map(|case| case.retransmissions).sum();
    if retransmissions > 0 {
        println!("note: {retransmissions} retransmissions during the netdam runs");
    }
}

/// Each netdam case's p50 and p99.9 ratios to its floor in every round, in the order of the
/// cases: (label, p50 ratios, p99.9 ratios).
fn round_ratios(rounds: &[Vec<LatencyCase>]) -> Vec<(String, Vec<f64>, Vec<f64>)> {
    let Some(first) = rounds.first() else { return Vec::new() };
    (0..first.len())
        .filter(|&index| first[index].netdam.is_some())
        .map(|index| {
            let case = &first[index];
            let label = format!("{} {} B {}", case.op, case.size, case.poll.name());
            let pairs = rounds.iter().filter_map(|round| {
                let case = round.get(index)?;
                let netdam = case.netdam.as_ref()?;
                Some((ratio(netdam.p50, case.floor.p50), ratio(netdam.p999, case.floor.p999)))
            });
            let (p50, p999): (Vec<f64>, Vec<f64>) = pairs.unzip();
            (label, p50, p999)
        })
        .collect()
}

/// Prints the per-round ratios and their medians (nothing for a single round).
pub fn print_latency_rounds(rounds: &[Vec<LatencyCase>]) {
    if rounds.len() < 2 {
        return;
    }
    println!("over {} rounds, each against its own floor:", rounds.len());
    for (label, p50, p999) in round_ratios(rounds) {
        println!(
            "  {label}: p50 x median {:.2} ({}), p99.9 x median {:.2} ({})",
            median(&p50),
            ratio_list(&p50, " "),
            median(&p999),
            ratio_list(&p999, " ")
        );
    }
}

/// Ratios with two decimals, joined by `separator`.
fn ratio_list(values: &[f64], separator: &str) -> String {
    values.iter().map(|value| format!("{value:.2}")).collect::<Vec<_>>().join(separator)
}

fn latency_rounds_json(rounds: &[Vec<LatencyCase>]) -> serde_json::Value {
    let rows: Vec<_> = round_ratios(rounds)
        .into_iter()
        .map(|(case, p50, p999)| {
            json!({"case": case, "p50_ratio_median": median(&p50), "p999_ratio_median": median(&p999),
                   "p50_ratios": p50, "p999_ratios": p999})
        })
        .collect();
    json!({"count": rounds.len(), "cases": rows})
}

fn latency_rounds_markdown(rounds: &[Vec<LatencyCase>]) -> String {
    let mut text = format!(
        "\nOver {} rounds, each case against its own floor (the table above is the last round):\n\n| case | p50 x, median | p50 x per round | p99.9 x, median | p99.9 x per round |\n| --- | --- | --- | --- | --- |\n",
        rounds.len()
    );
    for (label, p50, p999) in round_ratios(rounds) {
        text.push_str(&format!(
            "| {label} | {:.2} | {} | {:.2} | {} |\n",
            median(&p50),
            ratio_list(&p50, ", "),
            median(&p999),
            ratio_list(&p999, ", ")
        ));
    }
    text
}

/// The latency cases as a markdown table.
pub fn latency_markdown(cases: &[LatencyCase], args: &LatencyArgs) -> String {
    if cases.iter().all(|case| case.netdam.is_none()) {
        return floor_markdown(cases, args);
    }
    let us = |ns: u64| ns as f64 / 1000.0;
    let mut text = format!(
        "Machine: {}. {} round trips per case after {} warm-up. Absolute times hold for this machine only; the ratios to the floor (a raw UDP echo of the same sizes, same polling, same run) are the result.\n\n",
        machine(),
        args.requests,
        args.warmup
    );
    text.push_str("| case | poll | floor p50 | netdam p50 | p90 | p99 | floor p99.9 | netdam p99.9 | p99.99 | max | jitter | p50 x | p99.9 x |\n");
    text.push_str("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for case in cases {
        let Some(n) = &case.netdam else { continue };
        text.push_str(&format!(
            "| {} {} B | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} |\n",
            case.op,
            case.size,
            case.poll.name(),
            us(case.floor.p50),
            us(n.p50),
            us(n.p90),
            us(n.p99),
            us(case.floor.p999),
            us(n.p999),
            us(n.p9999),
            us(n.max),
            us(n.jitter()),
            ratio(n.p50, case.floor.p50),
            ratio(n.p999, case.floor.p999)
        ));
    }
    text.push_str("\nTimes in µs; jitter is p99.9 − p50.\n\n");
    text.push_str("| case | poll | in target | client CPU per request, floor | netdam | ratio |\n| --- | --- | --- | --- | --- | --- |\n");
    for case in cases {
        let Some(cpu) = case.netdam_client_cpu_ns else { continue };
        text.push_str(&format!(
            "| {} {} B | {} | {} | {:.2} | {:.2} | {:.2} |\n",
            case.op,
            case.size,
            case.poll.name(),
            case.target_service_p50_ns.map(|ns| format!("{:.1}", us(ns))).unwrap_or_default(),
            us(case.floor_client_cpu_ns),
            us(cpu),
            ratio(cpu, case.floor_client_cpu_ns)
        ));
    }
    text.push_str(&format!(
        "\nClient CPU is the client thread's CPU time (system time included) per round trip; a spinning client's is its wall time. {IN_TARGET}\n"
    ));
    text
}

/// The cases of `floor` (the UDP echo alone) as a markdown table.
fn floor_markdown(cases: &[LatencyCase], args: &LatencyArgs) -> String {
    let us = |ns: u64| ns as f64 / 1000.0;
    let mut text = format!(
        "Machine: {}. {} round trips per case after {} warm-up: a raw UDP echo of netdam's request and answer sizes (the floor), without netdam. Absolute times hold for this machine only.\n\n",
        machine(),
        args.requests,
        args.warmup
    );
    text.push_str(
        "| case | echo | poll | p50 | p90 | p99 | p99.9 | p99.99 | max | jitter | client CPU per request |\n",
    );
    text.push_str("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for case in cases {
        let floor = &case.floor;
        text.push_str(&format!(
            "| {} {} B | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} |\n",
            case.op,
            case.size,
            floor.name,
            case.poll.name(),
            us(floor.p50),
            us(floor.p90),
            us(floor.p99),
            us(floor.p999),
            us(floor.p9999),
            us(floor.max),
            us(floor.jitter()),
            us(case.floor_client_cpu_ns)
        ));
    }
    text.push_str("\nTimes in µs; jitter is p99.9 − p50. Client CPU is the client thread's CPU time (system time included) per round trip; a spinning client's is its wall time.\n");
    text
}

/// Says which plots were written; nothing when there were none to draw (a floor-only run
/// has no netdam curve), and why plotting failed when it did.
pub fn print_plotted(plots: Result<Vec<String>, String>) {
    match plots {
        Ok(plots) if plots.is_empty() => {}
        Ok(plots) => eprintln!("plotted {}", plots.join(", ")),
        Err(message) => eprintln!("{message}"),
    }
}

/// What the "in target" figure is.
const IN_TARGET: &str = "In target: the median time the target held a request, from its answers: from the kernel's receive timestamp to the answer, or, for a lone request to a polling worker that reads no timestamps then, from the empty poll before it.";

/// Writes latency.json and latency.md into `dir`.
pub fn write_latency(rounds: &[Vec<LatencyCase>], args: &LatencyArgs, dir: &Path) -> Result<(), String> {
    let cases = rounds.last().map(Vec::as_slice).unwrap_or_default();
    std::fs::create_dir_all(dir).map_err(|error| format!("creating {}: {error}", dir.display()))?;
    let write = |name: &str, text: String| {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|error| format!("writing {}: {error}", path.display()))
    };
    let mut json = latency_json(cases, args);
    let mut markdown = latency_markdown(cases, args);
    if rounds.len() > 1 {
        json["rounds"] = latency_rounds_json(rounds);
        markdown.push_str(&latency_rounds_markdown(rounds));
    }
    write("latency.json", format!("{json:#}\n"))?;
    write("latency.md", markdown)?;
    eprintln!("wrote {}/latency.json and latency.md", dir.display());
    print_plotted(crate::plots::latency(cases, dir));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{groups_by, median};

    #[test]
    fn groups_keep_the_order_of_their_first_item_and_of_their_items() {
        let rounds = [("a", 0), ("b", 0), ("a", 1), ("c", 0), ("b", 1)];
        let groups = groups_by(&rounds, |(name, _)| *name);
        let seen: Vec<Vec<(&str, i32)>> =
            groups.iter().map(|group| group.iter().map(|item| **item).collect()).collect();
        assert_eq!(seen, [vec![("a", 0), ("a", 1)], vec![("b", 0), ("b", 1)], vec![("c", 0)]]);
    }

    #[test]
    fn the_median_is_the_middle_value_or_the_mean_of_the_middle_two() {
        assert_eq!(median(&[1.76, 1.19, 1.38, 1.21, 1.74]), 1.38);
        assert_eq!(median(&[2.0, 1.0, 4.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
    }
}
