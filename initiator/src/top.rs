//! `netdam top`: a live view of a target (or a `netdam nbd`) from its `/metrics`.
//!
//! Two scrapes an interval apart give rates (counter deltas over the interval) and latency
//! quantiles of that interval alone, read from the bucket deltas as Prometheus's
//! `histogram_quantile` does (linear within a bucket). The text format is parsed here, minimally:
//! samples, their labels and values; comments are skipped.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

/// One sample: family-qualified name, labels and value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The sample's name (`netdam_instructions_total`, `..._bucket`).
    pub name: String,
    /// Label pairs in the order written.
    pub labels: Vec<(String, String)>,
    /// The value.
    pub value: f64,
}

impl Sample {
    /// The value of label `name`.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_str())
    }
}

/// Parses a Prometheus text (or OpenMetrics text) exposition; lines that do not parse are an
/// error naming them.
pub fn parse_exposition(text: &str) -> Result<Vec<Sample>, String> {
    let mut samples = Vec::new();
    for line in text.lines() {
        let line = line.trim_end();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        samples.push(parse_sample(line).ok_or_else(|| format!("cannot parse the metrics line {line:?}"))?);
    }
    Ok(samples)
}

fn parse_sample(line: &str) -> Option<Sample> {
    let name_end = line.find(['{', ' ']).unwrap_or(line.len());
    let name = &line[..name_end];
    if name.is_empty() {
        return None;
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(inner) = rest.strip_prefix('{') {
        let mut chars = inner.char_indices().peekable();
        let end = loop {
            // Skip separators, then a key up to '=', then a quoted value with escapes.
            while chars.peek().is_some_and(|(_, c)| *c == ',' || *c == ' ') {
                chars.next();
            }
            match chars.peek() {
                Some((index, '}')) => break *index,
                None => return None,
                _ => {}
            }
            let mut key = String::new();
            for (_, c) in chars.by_ref() {
                if c == '=' {
                    break;
                }
                key.push(c);
            }
            if chars.next().map(|(_, c)| c) != Some('"') {
                return None;
            }
            let mut value = String::new();
            loop {
                match chars.next()?.1 {
                    '"' => break,
                    '\\' => match chars.next()?.1 {
                        'n' => value.push('\n'),
                        other => value.push(other),
                    },
                    c => value.push(c),
                }
            }
            labels.push((key.trim().to_string(), value));
        };
        rest = &inner[end + 1..];
    }
    // The value, then an optional timestamp (and in OpenMetrics an exemplar after '#').
    let value_text = rest.split('#').next()?.split_whitespace().next()?;
    let value = match value_text {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        text => text.parse().ok()?,
    };
    Some(Sample { name: name.to_string(), labels, value })
}

/// Cumulative bucket counts of one histogram series: (upper bound in seconds, count), ascending,
/// `+Inf` last.
pub type Buckets = Vec<(f64, f64)>;

/// The `q` quantile (0 < q < 1) of the values counted in cumulative `buckets`, in seconds, as
/// `histogram_quantile` computes it: linear interpolation within the bucket holding the rank,
/// from 0 for the first bucket; a rank in the `+Inf` bucket gives the highest finite bound.
/// `None` when nothing was counted.
pub fn quantile(q: f64, buckets: &[(f64, f64)]) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 || buckets.len() < 2 {
        return None;
    }
    let rank = q * total;
    let mut lower_bound = 0.0;
    let mut lower_count = 0.0;
    for &(bound, count) in buckets {
        if count >= rank && count > lower_count {
            if bound.is_infinite() {
                return Some(lower_bound);
            }
            return Some(lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count));
        }
        lower_bound = bound;
        lower_count = count;
    }
    Some(lower_bound)
}

/// Cumulative bucket deltas `later - earlier` of one series (same bounds). A histogram whose
/// total fell was reset (its process restarted in between): everything it counted since then
/// is the interval's, as Prometheus's `increase` reads a reset.
pub fn bucket_deltas(earlier: &[(f64, f64)], later: &[(f64, f64)]) -> Buckets {
    let total = |buckets: &[(f64, f64)]| buckets.last().map_or(0.0, |&(_, count)| count);
    if total(later) < total(earlier) {
        return later.to_vec();
    }
    later
        .iter()
        .map(|&(bound, count)| {
            let before = earlier.iter().find(|(other, _)| *other == bound).map_or(0.0, |(_, count)| *count);
            (bound, (count - before).max(0.0))
        })
        .collect()
}

/// What one scrape says, in the terms `top` shows.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    samples: Vec<Sample>,
}

/// The latency histograms `top` reads, in the order tried: a target's service time, then an
/// initiator's end-to-end latency.
const LATENCY_FAMILIES: [&str; 2] = ["netdam_service_time_seconds", "netdam_initiator_latency_seconds"];
/// Request counters per opcode, in the same order.
const REQUEST_FAMILIES: [&str; 2] = ["netdam_instructions_total", "netdam_initiator_requests_total"];

impl Snapshot {
    /// Parses a scrape.
    pub fn parse(text: &str) -> Result<Snapshot, String> {
        Ok(Snapshot { samples: parse_exposition(text)? })
    }

    fn has(&self, name: &str) -> bool {
        self.samples.iter().any(|sample| sample.name == name)
    }

    /// Sum of the samples named `name` whose labels pass `keep`.
    pub fn sum(&self, name: &str, keep: impl Fn(&Sample) -> bool) -> f64 {
        self.samples.iter().filter(|sample| sample.name == name && keep(sample)).map(|sample| sample.value).sum()
    }

    /// How much the counters named `name` whose labels pass `keep` grew since `earlier`, by the
    /// value of label `by` (all under "" without it). Series by series, as Prometheus's
    /// `increase` does: a series whose value fell was reset (its process restarted) and counts
    /// its whole value, and a series new since `earlier` counts from zero.
    pub fn increase_by_label(
        &self,
        earlier: &Snapshot,
        name: &str,
        by: Option<&str>,
        keep: &dyn Fn(&Sample) -> bool,
    ) -> BTreeMap<String, f64> {
        // A series is its label set, whatever order the exposition writes the labels in.
        let series = |sample: &Sample| {
            let mut labels = sample.labels.clone();
            labels.sort_unstable();
            labels
        };
        let earlier_values: std::collections::HashMap<_, f64> = earlier
            .samples
            .iter()
            .filter(|sample| sample.name == name)
            .map(|sample| (series(sample), sample.value))
            .collect();
        let mut increases = BTreeMap::new();
        for sample in self.samples.iter().filter(|sample| sample.name == name && keep(sample)) {
            let before = earlier_values.get(&series(sample)).copied().unwrap_or(0.0);
            let increase = if sample.value < before { sample.value } else { sample.value - before };
            let key = by.and_then(|by| sample.label(by)).unwrap_or("").to_string();
            *increases.entry(key).or_insert(0.0) += increase;
        }
        increases
    }

    /// Values of the samples named `name`, by the value of label `by`.
    pub fn by_label(&self, name: &str, by: &str) -> BTreeMap<String, f64> {
        let mut values = BTreeMap::new();
        for sample in self.samples.iter().filter(|sample| sample.name == name) {
            *values.entry(sample.label(by).unwrap_or("").to_string()).or_insert(0.0) += sample.value;
        }
        values
    }

    /// Cumulative buckets of histogram `family` (name with unit) per opcode, summed over other
    /// labels.
    pub fn histogram(&self, family: &str) -> BTreeMap<String, Buckets> {
        let bucket_name = format!("{family}_bucket");
        let mut histograms: BTreeMap<String, BTreeMap<u64, (f64, f64)>> = BTreeMap::new();
        for sample in self.samples.iter().filter(|sample| sample.name == bucket_name) {
            let Some(bound) = sample.label("le").and_then(|le| match le {
                "+Inf" => Some(f64::INFINITY),
                other => other.parse().ok(),
            }) else {
                continue;
            };
            let opcode = sample.label("opcode").unwrap_or("").to_string();
            // Keyed by the bound's bits: positive floats sort as their bits do.
            let entry = histograms.entry(opcode).or_default().entry(bound.to_bits()).or_insert((bound, 0.0));
            entry.1 += sample.value;
        }
        histograms.into_iter().map(|(opcode, buckets)| (opcode, buckets.into_values().collect())).collect()
    }

    fn latency_family(&self) -> (&'static str, &'static str) {
        for (latency, requests) in LATENCY_FAMILIES.into_iter().zip(REQUEST_FAMILIES) {
            if self.has(&format!("{latency}_count")) || self.has(requests) {
                return (latency, requests);
            }
        }
        (LATENCY_FAMILIES[0], REQUEST_FAMILIES[0])
    }
}

/// Per-opcode figures over one interval.
#[derive(Debug, Clone, PartialEq)]
pub struct OpcodeView {
    /// Opcode name.
    pub opcode: String,
    /// Requests (instructions) per second.
    pub rate_per_second: f64,
    /// Latency quantiles of the interval, seconds (p50, p99, p99.9), when any were recorded.
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    pub p999: Option<f64>,
}

/// Everything `top` shows for one interval.
#[derive(Debug, Clone)]
pub struct View {
    /// The histogram the quantiles come from.
    pub latency_family: &'static str,
    /// Seconds between the scrapes.
    pub interval_seconds: f64,
    /// Opcodes with traffic in the interval (or any latency recorded), by name.
    pub opcodes: Vec<OpcodeView>,
    /// Rates per second of errors, drops, BUSY answers and retransmissions.
    pub errors_per_second: f64,
    pub drops_per_second: f64,
    pub busy_per_second: f64,
    pub retransmissions_per_second: f64,
    /// Gauges at the second scrape.
    pub sessions_open: Option<f64>,
    pub block_in_flight: BTreeMap<String, f64>,
    /// Per target worker, how often a second its thread was preempted (taken off its CPU while
    /// it could run) and slept, from `netdam_worker_context_switches_total`.
    pub workers: BTreeMap<String, WorkerView>,
    /// Per-session windows (requests) and target delays (seconds), where an initiator exports them.
    pub windows: BTreeMap<String, f64>,
    pub target_delays: BTreeMap<String, f64>,
    /// Labels of the build info metric.
    pub build: Vec<(String, String)>,
}

/// A target worker's context switches per second over the interval.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WorkerView {
    /// Involuntary: another thread or process took its CPU.
    pub preempted_per_second: f64,
    /// Voluntary: it slept, waiting for datagrams.
    pub slept_per_second: f64,
}

/// Statuses that are not errors: `retry` is the cookie step of HELLO.
fn is_error_status(sample: &Sample) -> bool {
    !matches!(sample.label("status"), Some("ok") | Some("retry"))
}

impl View {
    /// The view of the interval between `earlier` and `later`.
    pub fn between(earlier: &Snapshot, later: &Snapshot, interval: Duration) -> View {
        let seconds = interval.as_secs_f64().max(1e-9);
        let rate = |name: &str, keep: &dyn Fn(&Sample) -> bool| {
            // A fold from +0.0: an empty float sum is -0.0, which prints as "-0.0/s".
            later.increase_by_label(earlier, name, None, keep).values().fold(0.0, |total, value| total + value)
                / seconds
        };
        let (latency_family, requests_family) = later.latency_family();
        let before = earlier.histogram(latency_family);
        let after = later.histogram(latency_family);
        let requests_by_opcode = later.increase_by_label(earlier, requests_family, Some("opcode"), &|_| true);
        let mut opcodes = Vec::new();
        for (opcode, &requests) in &requests_by_opcode {
            let deltas = after.get(opcode).map(|buckets| bucket_deltas(before.get(opcode).map_or(&[], |b| b), buckets));
            let quantile_of = |q| deltas.as_deref().and_then(|buckets| quantile(q, buckets));
            if requests == 0.0 && quantile_of(0.5).is_none() {
                continue;
            }
            opcodes.push(OpcodeView {
                opcode: opcode.clone(),
                rate_per_second: requests / seconds,
                p50: quantile_of(0.5),
                p99: quantile_of(0.99),
                p999: quantile_of(0.999),
            });
        }
        let all = |_: &Sample| true;
        let errors =
            rate("netdam_instruction_results_total", &is_error_status) + rate("netdam_initiator_errors_total", &all);
        let build = later
            .samples
            .iter()
            .find(|sample| sample.name.ends_with("build_info"))
            .map(|sample| sample.labels.clone())
            .unwrap_or_default();
        let gauge = |name: &str| later.has(name).then(|| later.sum(name, all));
        let switches = |kind: &'static str| {
            later.increase_by_label(
                earlier,
                "netdam_worker_context_switches_total",
                Some("worker"),
                &move |sample: &Sample| sample.label("kind") == Some(kind),
            )
        };
        let mut workers: BTreeMap<String, WorkerView> = BTreeMap::new();
        for (worker, count) in switches("involuntary") {
            workers.entry(worker).or_default().preempted_per_second = count / seconds;
        }
        for (worker, count) in switches("voluntary") {
            workers.entry(worker).or_default().slept_per_second = count / seconds;
        }
        View {
            latency_family,
            interval_seconds: seconds,
            opcodes,
            errors_per_second: errors,
            drops_per_second: rate("netdam_datagrams_dropped_total", &all),
            busy_per_second: rate("netdam_busy_answers_total", &all)
                + rate("netdam_initiator_busy_answers_total", &all),
            retransmissions_per_second: rate("netdam_initiator_retransmissions_total", &all),
            sessions_open: gauge("netdam_sessions_open").or_else(|| gauge("netdam_initiator_sessions")),
            block_in_flight: later.by_label("netdam_block_requests_in_flight", "namespace"),
            workers,
            windows: later.by_label("netdam_initiator_window", "session"),
            target_delays: later.by_label("netdam_initiator_target_delay_seconds", "session"),
            build,
        }
    }

    /// The view as one JSON object (latencies in microseconds).
    pub fn to_json(&self, url: &str) -> Value {
        let us = |seconds: Option<f64>| seconds.map(|s| (s * 1e7).round() / 10.0);
        let opcodes: serde_json::Map<String, Value> = self
            .opcodes
            .iter()
            .map(|view| {
                (
                    view.opcode.clone(),
                    json!({"rate_per_s": view.rate_per_second, "p50_us": us(view.p50), "p99_us": us(view.p99),
                           "p999_us": us(view.p999)}),
                )
            })
            .collect();
        json!({
            "metrics": url,
            "interval_s": self.interval_seconds,
            "latency": self.latency_family,
            "opcodes": opcodes,
            "errors_per_s": self.errors_per_second,
            "drops_per_s": self.drops_per_second,
            "busy_per_s": self.busy_per_second,
            "retransmissions_per_s": self.retransmissions_per_second,
            "sessions_open": self.sessions_open,
            "block_in_flight": self.block_in_flight,
            "workers": self.workers.iter().map(|(worker, view)| {
                (worker.clone(), json!({"preempted_per_s": view.preempted_per_second, "slept_per_s": view.slept_per_second}))
            }).collect::<serde_json::Map<_, _>>(),
            "windows": self.windows,
            "target_delays_us": self.target_delays.iter().map(|(k, v)| (k.clone(), v * 1e6)).collect::<BTreeMap<_, _>>(),
            "build": self.build.iter().cloned().collect::<BTreeMap<_, _>>(),
        })
    }

    /// The view as a screen of text.
    pub fn to_text(&self, url: &str) -> String {
        use std::fmt::Write;
        let mut text = String::new();
        let build: Vec<String> = self.build.iter().map(|(key, value)| format!("{key}={value}")).collect();
        let _ = writeln!(text, "netdam top  {url}  every {:.1} s  {}", self.interval_seconds, build.join(" "));
        let _ = writeln!(
            text,
            "errors {:.1}/s  drops {:.1}/s  busy {:.1}/s  retransmissions {:.1}/s  sessions {}",
            self.errors_per_second,
            self.drops_per_second,
            self.busy_per_second,
            self.retransmissions_per_second,
            self.sessions_open.map_or("-".to_string(), |open| format!("{open:.0}"))
        );
        let _ = writeln!(
            text,
            "\n{:<14} {:>12} {:>10} {:>10} {:>10}   ({})",
            "opcode", "rate/s", "p50 µs", "p99 µs", "p99.9 µs", self.latency_family
        );
        let us = |seconds: Option<f64>| seconds.map_or("-".to_string(), |s| format!("{:.1}", s * 1e6));
        for view in &self.opcodes {
            let _ = writeln!(
                text,
                "{:<14} {:>12.1} {:>10} {:>10} {:>10}",
                view.opcode,
                view.rate_per_second,
                us(view.p50),
                us(view.p99),
                us(view.p999)
            );
        }
        if self.opcodes.is_empty() {
            let _ = writeln!(text, "(no requests in this interval)");
        }
        for (namespace, in_flight) in &self.block_in_flight {
            let _ = writeln!(text, "block in flight  {namespace}: {in_flight:.0}");
        }
        for (worker, view) in &self.workers {
            let _ = writeln!(
                text,
                "worker {worker}: preempted {:.1}/s  slept {:.1}/s",
                view.preempted_per_second, view.slept_per_second
            );
        }
        for (session, window) in &self.windows {
            let delay = self.target_delays.get(session).map_or("-".to_string(), |d| format!("{:.1} µs", d * 1e6));
            let _ = writeln!(text, "session {session}: window {window:.1} requests, target delay {delay}");
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_parse_with_labels_escapes_and_infinities() {
        let text = "# HELP x y\n# TYPE x counter\nx_total 3\nh_bucket{opcode=\"read\",le=\"+Inf\"} 7\n\
                    i_info{version=\"a\\\"b\\\\c\",engine=\"soft, ware\"} 1\nt{a=\"1\"} 2.5 1700000000\n";
        let samples = parse_exposition(text).unwrap();
        assert_eq!(samples.len(), 4);
        assert_eq!(samples[0], Sample { name: "x_total".into(), labels: vec![], value: 3.0 });
        assert_eq!(samples[1].label("le"), Some("+Inf"));
        assert_eq!(samples[1].value, 7.0);
        assert_eq!(samples[2].label("version"), Some("a\"b\\c"));
        assert_eq!(samples[2].label("engine"), Some("soft, ware"));
        assert_eq!(samples[3].value, 2.5);
        assert!(parse_exposition("x{a=\"1\" 2").is_err());
        assert!(parse_exposition("x{a=1} 2").is_err());
        assert!(parse_exposition("x notanumber").is_err());
    }

    /// Cumulative buckets at bounds 1, 2, 4, 8 and +Inf.
    fn cumulative(counts: [f64; 5]) -> Buckets {
        let bounds = [1.0, 2.0, 4.0, 8.0, f64::INFINITY];
        let mut total = 0.0;
        bounds
            .iter()
            .zip(counts)
            .map(|(&bound, count)| {
                total += count;
                (bound, total)
            })
            .collect()
    }

    #[test]
    fn quantiles_interpolate_within_the_bucket_like_histogram_quantile() {
        // 100 values: 50 in (0, 1], 40 in (1, 2], 9 in (2, 4], 1 in (4, 8].
        let buckets = cumulative([50.0, 40.0, 9.0, 1.0, 0.0]);
        assert_eq!(quantile(0.5, &buckets), Some(1.0));
        assert_eq!(quantile(0.25, &buckets), Some(0.5));
        // Rank 70: 20 of the 40 in (1, 2].
        assert_eq!(quantile(0.7, &buckets), Some(1.5));
        // Rank 99: the last of the 9 in (2, 4].
        assert_eq!(quantile(0.99, &buckets), Some(4.0));
        // Rank 99.9: 0.9 of the one in (4, 8].
        let p999 = quantile(0.999, &buckets).unwrap();
        assert!((p999 - 7.6).abs() < 1e-9, "{p999}");
        assert_eq!(quantile(0.5, &cumulative([0.0; 5])), None);
        // Beyond the last finite bound: the highest finite bound, as Prometheus answers.
        assert_eq!(quantile(0.99, &cumulative([1.0, 0.0, 0.0, 0.0, 99.0])), Some(8.0));
    }

    #[test]
    fn an_interval_is_the_difference_of_two_scrapes() {
        let first = cumulative([10.0, 0.0, 0.0, 0.0, 0.0]);
        let second = cumulative([10.0, 100.0, 0.0, 0.0, 0.0]);
        // Over the whole run p50 is in (1, 2]; over the interval alone every value is.
        let deltas = bucket_deltas(&first, &second);
        assert_eq!(deltas[0], (1.0, 0.0));
        assert_eq!(quantile(0.5, &deltas), Some(1.5));
        let scrape = |reads: u64, buckets: &Buckets| {
            let mut text = format!("netdam_instructions_total{{opcode=\"read\"}} {reads}\n");
            for (bound, count) in buckets {
                let le = if bound.is_infinite() { "+Inf".to_string() } else { bound.to_string() };
                text += &format!("netdam_service_time_seconds_bucket{{opcode=\"read\",le=\"{le}\"}} {count}\n");
            }
            text += &format!("netdam_service_time_seconds_count{{opcode=\"read\"}} {}\n", buckets.last().unwrap().1);
            text +=
                "netdam_busy_answers_total{reason=\"queueing\"} 4\nnetdam_instruction_results_total{status=\"ok\"} 9\n";
            text += "netdam_instruction_results_total{status=\"retry\"} 1\nnetdam_sessions_open 2\n";
            let preempted = reads / 10;
            text += &format!(
                "netdam_worker_context_switches_total{{worker=\"0\",kind=\"involuntary\"}} {preempted}\n\
                 netdam_worker_context_switches_total{{worker=\"0\",kind=\"voluntary\"}} 3\n"
            );
            Snapshot::parse(&text).unwrap()
        };
        let view = View::between(&scrape(10, &first), &scrape(110, &second), Duration::from_millis(500));
        assert_eq!(view.latency_family, "netdam_service_time_seconds");
        assert_eq!(view.opcodes.len(), 1);
        assert_eq!(view.opcodes[0].rate_per_second, 200.0);
        assert_eq!(view.opcodes[0].p50, Some(1.5));
        assert_eq!(view.busy_per_second, 0.0);
        assert_eq!(view.errors_per_second, 0.0);
        assert_eq!(view.sessions_open, Some(2.0));
        // 1 -> 11 preemptions in half a second; the sleeps did not change.
        assert_eq!(view.workers["0"], WorkerView { preempted_per_second: 20.0, slept_per_second: 0.0 });
        assert!(view.to_text("http://x/metrics").contains("worker 0: preempted 20.0/s  slept 0.0/s"));
        let json = view.to_json("http://x/metrics");
        assert_eq!(json["workers"]["0"]["preempted_per_s"], 20.0);
        assert_eq!(json["opcodes"]["read"]["rate_per_s"], 200.0);
        assert_eq!(json["opcodes"]["read"]["p50_us"], 1_500_000.0);
        assert!(view.to_text("http://x/metrics").contains("read"));

        // The target restarted between the scrapes: what the new process counted is the
        // interval's, as Prometheus's `increase` reads a reset, not nothing.
        let restarted = cumulative([0.0, 0.0, 30.0, 0.0, 0.0]);
        let view = View::between(&scrape(110, &second), &scrape(30, &restarted), Duration::from_secs(1));
        assert_eq!(view.opcodes.len(), 1, "{view:?}");
        assert_eq!(view.opcodes[0].rate_per_second, 30.0);
        assert_eq!(view.opcodes[0].p50, Some(3.0));
        // Counters that did not fall are differences as before, series by series.
        let counters = |ok: u64, busy: u64| {
            Snapshot::parse(&format!(
                "netdam_instruction_results_total{{status=\"ok\"}} {ok}\n\
                 netdam_instruction_results_total{{status=\"no_such_region\"}} 5\n\
                 netdam_busy_answers_total{{reason=\"queueing\"}} {busy}\n"
            ))
            .unwrap()
        };
        let view = View::between(&counters(100, 40), &counters(3, 46), Duration::from_secs(2));
        assert_eq!(view.busy_per_second, 3.0);
        assert_eq!(view.errors_per_second, 0.0, "the error series did not change");
        assert!(view.retransmissions_per_second.is_sign_positive(), "no series prints as 0.0/s, not -0.0/s");
        // A series is its label set, in whatever order the labels are written.
        let before = Snapshot::parse("x_total{a=\"1\",b=\"2\"} 5\n").unwrap();
        let after = Snapshot::parse("x_total{b=\"2\",a=\"1\"} 7\n").unwrap();
        assert_eq!(after.increase_by_label(&before, "x_total", Some("a"), &|_| true)["1"], 2.0);
    }
}
