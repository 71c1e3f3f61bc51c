//! Percentile tables and ratios against the first (floor) row.

use hdrhistogram::Histogram;
use serde_json::json;

use crate::LatencyArgs;

/// Percentiles of one system, in nanoseconds.
pub struct Summary {
    name: String,
    count: u64,
    p50: u64,
    p90: u64,
    p99: u64,
    p999: u64,
    p9999: u64,
    max: u64,
    mean: f64,
    stdev: f64,
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

/// Prints every summary with its ratio to the first.
pub fn print(summaries: &[Summary], args: &LatencyArgs, as_json: bool) {
    let floor = &summaries[0];
    let us = |ns: u64| ns as f64 / 1000.0;
    if as_json {
        let rows: Vec<_> = summaries
            .iter()
            .map(|s| {
                json!({"name": s.name, "count": s.count, "p50_ns": s.p50, "p90_ns": s.p90, "p99_ns": s.p99,
                       "p999_ns": s.p999, "p9999_ns": s.p9999, "max_ns": s.max, "mean_ns": s.mean, "stdev_ns": s.stdev,
                       "jitter_ns": s.p999.saturating_sub(s.p50),
                       "p50_ratio": s.p50 as f64 / floor.p50 as f64, "p999_ratio": s.p999 as f64 / floor.p999 as f64})
            })
            .collect();
        println!(
            "{}",
            json!({"machine": machine(), "poll": format!("{:?}", args.poll).to_lowercase(), "results": rows})
        );
        return;
    }
    println!("machine: {} (absolute times hold for this machine only; ratios are the result)", machine());
    println!("polling: {:?}, {} measured round trips each after {} warm-up", args.poll, args.requests, args.warmup);
    println!(
        "{:<28} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8}",
        "system (µs)", "p50", "p90", "p99", "p99.9", "p99.99", "max", "stdev", "p50 x", "p99.9 x"
    );
    for s in summaries {
        println!(
            "{:<28} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>8.2} {:>8.2}",
            s.name,
            us(s.p50),
            us(s.p90),
            us(s.p99),
            us(s.p999),
            us(s.p9999),
            us(s.max),
            s.stdev / 1000.0,
            s.p50 as f64 / floor.p50 as f64,
            s.p999 as f64 / floor.p999 as f64
        );
    }
}
