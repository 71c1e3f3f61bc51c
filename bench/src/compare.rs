//! `netdam-bench compare OLD.json NEW.json`: the regression guard. Two reports of the same kind
//! (latency, throughput, block, fio, noise) are flattened into named figures, and each figure's change
//! is printed; figures of merit (latency percentiles, rates, ratios to a floor or a peer) that
//! moved past the threshold are flagged, as worse or better where the figure says which way is
//! good. It compares measurements, so it is a report, not a test: by default it exits 0 whatever
//! moved, and `--fail-on-worse` makes a worse figure an error for scripts that want one.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// Settings of the comparison.
#[derive(Debug, Clone, clap::Args)]
pub struct CompareArgs {
    /// The earlier report (a JSON file written by `--out`).
    pub old: PathBuf,
    /// The later report, of the same kind.
    pub new: PathBuf,
    /// Relative change past which a figure is flagged (0.10: 10%).
    #[arg(long, default_value_t = 0.10)]
    pub threshold: f64,
    /// Print every numeric field, not only the figures of merit.
    #[arg(long)]
    pub all: bool,
    /// Exit with an error when a figure moved past the threshold in the worse direction.
    #[arg(long)]
    pub fail_on_worse: bool,
}

/// Fields that say which case an array element is, not what was measured.
const IDENTITY_FIELDS: &[&str] = &[
    "system", "socket", "rw", "pattern", "op", "poll", "bytes", "size", "depth", "batch", "sessions", "goal", "name",
    "cpu",
];

/// Which way a figure is good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Better {
    Lower,
    Higher,
    Unknown,
}

/// Whether `field` (the last part of a figure's name) is a figure of merit, and which way it is
/// good. Latencies and CPU costs are better lower; rates and a rate's ratio to its floor higher;
/// a latency's ratio to its floor lower.
fn merit(field: &str) -> Option<Better> {
    // A percentile anywhere in the name: `p50_ns`, `lat_p999_ns`, `p50_ratio`.
    let latency = field
        .split('_')
        .any(|part| part.len() > 1 && part.starts_with('p') && part[1..].chars().all(|c| c.is_ascii_digit()));
    if field.contains("cpu") || (latency && (field.ends_with("_ns") || field.ends_with("_us"))) {
        return Some(Better::Lower);
    }
    if latency && field.ends_with("_ratio") {
        return Some(Better::Lower);
    }
    // The machine's noise: gaps a spinning thread met, and the time it lost to them.
    if (field.starts_with("gaps") && field.ends_with("_per_s")) || field == "lost_share" {
        return Some(Better::Lower);
    }
    if field.contains("iops") || field.contains("ops_per_s") || field.contains("bytes_per_s") {
        return Some(Better::Higher);
    }
    if field == "instructions_per_datagram" {
        // The fio report's packing: fewer instructions per datagram is lost coalescing.
        return Some(Better::Higher);
    }
    if field == "ratio" {
        // Throughput points: netdam's rate over the floor's. A goal's ratio says its own way
        // (`at_most`), which `flatten` reads into the name.
        return Some(Better::Higher);
    }
    if field == "ratio(at_most)" {
        return Some(Better::Lower);
    }
    if field == "ratio(at_least)" {
        return Some(Better::Higher);
    }
    None
}

/// A short label for an array element from its identity fields (`system=nbdkit memory,depth=32`),
/// or its index when it has none.
fn label(element: &Value, index: usize) -> String {
    let Value::Object(fields) = element else { return index.to_string() };
    let parts: Vec<String> = IDENTITY_FIELDS
        .iter()
        .filter_map(|&key| match fields.get(key)? {
            Value::String(text) => Some(format!("{key}={text}")),
            Value::Number(number) => Some(format!("{key}={number}")),
            _ => None,
        })
        .collect();
    if parts.is_empty() {
        index.to_string()
    } else {
        parts.join(",")
    }
}

/// Per-round detail of a report measured in rounds (`--rounds`): each round's cases and ratios.
/// Its figures are the medians beside them; a single round moves too much to compare.
const ROUND_DETAIL: &[&str] = &["round_cases", "round_ratios"];

/// Every numeric leaf of `value`, by its path (`cases[op=READ,bytes=64].netdam.p50_ns`).
fn flatten(value: &Value, path: &str, out: &mut BTreeMap<String, f64>) {
    match value {
        Value::Number(number) => {
            if let Some(number) = number.as_f64() {
                out.insert(path.to_string(), number);
            }
        }
        Value::Object(fields) => {
            for (key, field) in fields {
                if (IDENTITY_FIELDS.contains(&key.as_str()) && !field.is_object())
                    || ROUND_DETAIL.contains(&key.as_str())
                {
                    continue;
                }
                // A goal's ratio is good in the direction its bound says.
                let key = match (key.as_str(), fields.get("at_most").and_then(Value::as_bool)) {
                    ("ratio", Some(true)) => "ratio(at_most)".to_string(),
                    ("ratio", Some(false)) => "ratio(at_least)".to_string(),
                    _ => key.clone(),
                };
                let path = if path.is_empty() { key } else { format!("{path}.{key}") };
                flatten(field, &path, out);
            }
        }
        Value::Array(elements) => {
            for (index, element) in elements.iter().enumerate() {
                flatten(element, &format!("{path}[{}]", label(element, index)), out);
            }
        }
        _ => {}
    }
}

fn load(path: &Path) -> Result<BTreeMap<String, f64>, String> {
    let text = std::fs::read_to_string(path).map_err(|error| format!("{}: {error}", path.display()))?;
    let value: Value =
        serde_json::from_str(&text).map_err(|error| format!("{}: not a JSON report: {error}", path.display()))?;
    let mut figures = BTreeMap::new();
    flatten(&value, "", &mut figures);
    if figures.is_empty() {
        return Err(format!("{}: no numbers in it", path.display()));
    }
    Ok(figures)
}

/// One compared figure.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub name: String,
    pub old: f64,
    pub new: f64,
    /// (new − old) / old; `None` when old is 0.
    pub relative: Option<f64>,
    /// "worse", "better" or "changed" when past the threshold; empty otherwise.
    pub flag: &'static str,
}

/// Compares the figures two reports share. Returns the changes and the names found in only one.
fn compare(
    old: &BTreeMap<String, f64>,
    new: &BTreeMap<String, f64>,
    threshold: f64,
    all: bool,
) -> (Vec<Change>, Vec<String>) {
    let mut changes = Vec::new();
    let mut unmatched = Vec::new();
    for (name, &before) in old {
        let field = name.rsplit('.').next().unwrap_or(name);
        let better = merit(field);
        if better.is_none() && !all {
            continue;
        }
        let Some(&after) = new.get(name) else {
            unmatched.push(format!("only in the old report: {name}"));
            continue;
        };
        let relative = (before != 0.0).then(|| (after - before) / before.abs());
        let moved = relative.is_some_and(|relative| relative.abs() > threshold);
        let flag = match (moved, better.unwrap_or(Better::Unknown), relative.unwrap_or(0.0) > 0.0) {
            (false, _, _) => "",
            (true, Better::Lower, true) | (true, Better::Higher, false) => "worse",
            (true, Better::Lower, false) | (true, Better::Higher, true) => "better",
            (true, Better::Unknown, _) => "changed",
        };
        changes.push(Change { name: name.clone(), old: before, new: after, relative, flag });
    }
    for name in new.keys() {
        let field = name.rsplit('.').next().unwrap_or(name);
        if !old.contains_key(name) && (all || merit(field).is_some()) {
            unmatched.push(format!("only in the new report: {name}"));
        }
    }
    (changes, unmatched)
}

/// Runs the comparison and prints it.
pub fn run(args: &CompareArgs) -> Result<(), String> {
    if !(args.threshold.is_finite() && args.threshold >= 0.0) {
        return Err(format!("--threshold {}: give a relative change such as 0.10", args.threshold));
    }
    let old = load(&args.old)?;
    let new = load(&args.new)?;
    let (changes, unmatched) = compare(&old, &new, args.threshold, args.all);
    if changes.is_empty() {
        return Err(format!(
            "{} and {} share no figures: are they reports of the same kind?",
            args.old.display(),
            args.new.display()
        ));
    }
    let mut text = String::new();
    let _ = writeln!(text, "{:<88} {:>14} {:>14} {:>9}  flag", "figure", "old", "new", "change");
    for change in &changes {
        let relative = change.relative.map_or("-".to_string(), |relative| format!("{:+.1}%", relative * 100.0));
        let _ = writeln!(
            text,
            "{:<88} {:>14.2} {:>14.2} {:>9}  {}",
            change.name, change.old, change.new, relative, change.flag
        );
    }
    for line in &unmatched {
        let _ = writeln!(text, "{line}");
    }
    let count = |flag: &str| changes.iter().filter(|change| change.flag == flag).count();
    let worse = count("worse");
    let _ = writeln!(
        text,
        "{} figures compared; past ±{:.0}%: {worse} worse, {} better, {} changed (direction unknown)",
        changes.len(),
        args.threshold * 100.0,
        count("better"),
        count("changed")
    );
    print!("{text}");
    if args.fail_on_worse && worse > 0 {
        return Err(format!("{worse} figures moved past ±{:.0}% in the worse direction", args.threshold * 100.0));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn figures(value: Value) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        flatten(&value, "", &mut out);
        out
    }

    #[test]
    fn cases_are_named_by_their_identity_fields() {
        let report = json!({"cases": [{"op": "READ", "bytes": 64, "poll": "busy", "netdam": {"p50_ns": 5000}}]});
        let flat = figures(report);
        assert_eq!(flat.get("cases[op=READ,poll=busy,bytes=64].netdam.p50_ns"), Some(&5000.0), "{flat:?}");
    }

    #[test]
    fn a_slower_latency_and_a_lower_rate_are_worse_and_small_moves_are_not_flagged() {
        let old = figures(json!({"cases": [{"system": "x", "p99_ns": 100, "iops": 1000, "count": 5}]}));
        let new = figures(json!({"cases": [{"system": "x", "p99_ns": 130, "iops": 1050, "count": 9}]}));
        let (changes, unmatched) = compare(&old, &new, 0.10, false);
        let flag = |name: &str| changes.iter().find(|change| change.name.ends_with(name)).map(|change| change.flag);
        assert_eq!(flag("p99_ns"), Some("worse"));
        assert_eq!(flag("iops"), Some(""), "+5% is inside the threshold");
        assert_eq!(flag("count"), None, "not a figure of merit");
        assert!(unmatched.is_empty());
        let faster = figures(json!({"cases": [{"system": "x", "p99_ns": 50, "iops": 2000}]}));
        let (changes, _) = compare(&old, &faster, 0.10, false);
        assert!(changes.iter().all(|change| change.flag == "better"), "{changes:?}");
    }

    /// A noise report's CPUs are matched by number, not place; more gaps or more time lost is worse.
    #[test]
    fn noise_reports_compare_cpu_by_cpu_and_more_gaps_are_worse() {
        let cpu = |cpu: u64, gaps_per_s: f64, lost_share: f64| json!({"cpu": cpu, "gaps_from_20us_per_s": gaps_per_s, "lost_share": lost_share, "loops": 1_000});
        let old = figures(json!({"cpus": [cpu(0, 100.0, 0.01), cpu(1, 100.0, 0.01)]}));
        let new = figures(json!({"cpus": [cpu(1, 300.0, 0.01)]}));
        let (changes, unmatched) = compare(&old, &new, 0.10, false);
        let flag = |name: &str| changes.iter().find(|change| change.name == name).map(|change| change.flag);
        assert_eq!(flag("cpus[cpu=1].gaps_from_20us_per_s"), Some("worse"), "{changes:?}");
        assert_eq!(flag("cpus[cpu=1].lost_share"), Some(""));
        assert_eq!(flag("cpus[cpu=1].loops"), None, "not a figure of merit");
        assert!(unmatched.iter().any(|name| name.contains("cpu=0")), "{unmatched:?}");
    }

    #[test]
    fn fewer_instructions_per_datagram_is_lost_packing_and_worse() {
        let old = figures(json!({"cases": [{"system": "engine", "instructions_per_datagram": 2.0}]}));
        let new = figures(json!({"cases": [{"system": "engine", "instructions_per_datagram": 1.0}]}));
        let (changes, _) = compare(&old, &new, 0.10, false);
        assert_eq!(
            changes.iter().find(|change| change.name.ends_with("instructions_per_datagram")).map(|change| change.flag),
            Some("worse")
        );
    }

    #[test]
    fn reports_in_rounds_compare_their_medians_only() {
        let report = |iops: f64, noisy: f64| {
            json!({"rounds": 2,
                   "cases": [{"system": "x", "rounds": 2, "iops": iops}],
                   "round_cases": [{"system": "x", "round": 0, "iops": noisy}, {"system": "x", "round": 1, "iops": iops}],
                   "goals": [{"goal": "g", "ratio": 1.0, "at_most": false, "round_ratios": [noisy, 1.0]}]})
        };
        let (old, new) = (figures(report(100.0, 10.0)), figures(report(100.0, 1000.0)));
        assert!(old.keys().all(|name| !name.contains("round_")), "{old:?}");
        assert_eq!(old.get("cases[system=x].iops"), Some(&100.0));
        // A round that moved tenfold is not a change of the report's figures.
        assert_eq!(old, new);
        // A report of one round (no round detail) compares with one of several.
        let single = figures(json!({"cases": [{"system": "x", "iops": 100.0}]}));
        assert_eq!(single.get("cases[system=x].iops"), old.get("cases[system=x].iops"));
    }

    #[test]
    fn fio_latency_figures_are_figures_of_merit() {
        let old = figures(json!({"cases": [{"system": "x", "lat_p999_ns": 100}]}));
        let new = figures(json!({"cases": [{"system": "x", "lat_p999_ns": 200}]}));
        let (changes, _) = compare(&old, &new, 0.10, false);
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].flag, "worse");
    }

    #[test]
    fn a_goals_ratio_is_good_in_the_direction_of_its_bound() {
        let goal = |ratio: f64, at_most: bool| json!({"goals": [{"goal": "g", "ratio": ratio, "at_most": at_most}]});
        let (changes, _) = compare(&figures(goal(0.5, true)), &figures(goal(0.7, true)), 0.1, false);
        assert_eq!(changes[0].flag, "worse");
        let (changes, _) = compare(&figures(goal(2.0, false)), &figures(goal(2.5, false)), 0.1, false);
        assert_eq!(changes[0].flag, "better");
    }

    #[test]
    fn figures_in_one_report_only_are_listed() {
        let old = figures(json!({"cases": [{"system": "a", "iops": 1}]}));
        let new = figures(json!({"cases": [{"system": "b", "iops": 1}]}));
        let (changes, unmatched) = compare(&old, &new, 0.1, false);
        assert!(changes.is_empty());
        assert_eq!(unmatched.len(), 2, "{unmatched:?}");
    }
}
