//! The `netdam-bench` program as a user meets it: values no run can use are refused up front
//! with a usage error (exit status 2) naming the option, `load` says why a run measured nothing,
//! and what it prints for people reads as prose and tables, not as a Debug dump.

use std::process::{Command, Output};

use netdam_auth::{KeyFile, TenantKey};
use netdam_target::config::{ByteSize, Config, PollMode, RegionBackend, RegionConfig};
use netdam_target::tenants::{GrantRecord, GrantSpace, TenantRecord, TenantSnapshot};
use netdam_target::{AuthMode, Target};

fn bench(arguments: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_netdam-bench")).args(arguments).output().expect("netdam-bench runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A target serving one 64 MiB memory region "bench" with blocking workers, and its directory.
fn target(auth: AuthMode) -> (Target, tempfile::TempDir) {
    let data_dir = tempfile::tempdir().unwrap();
    let config = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        metrics_listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: Some(data_dir.path().to_path_buf()),
        workers: 1,
        poll: PollMode::Blocking,
        pin_workers: false,
        lock_memory: false,
        regions: vec![RegionConfig {
            name: "bench".into(),
            backend: RegionBackend::Mem,
            path: None,
            size: ByteSize(64 << 20),
        }],
        auth,
        ..Config::default()
    };
    (Target::start(&config).unwrap(), data_dir)
}

#[test]
fn sizes_an_instruction_cannot_move_are_usage_errors_before_anything_runs() {
    for (arguments, names) in [
        (&["latency", "--sizes", "9000"][..], "READ moves 1 to 8960 bytes"),
        (&["latency", "--sizes", "100000"][..], "READ moves 1 to 8960 bytes"),
        (&["latency", "--sizes", "0"][..], "'0' for '--sizes <SIZES>'"),
        (&["floor", "--sizes", "70000", "--poll", "blocking"][..], "READ moves 1 to 65467 bytes"),
        (&["throughput", "--depths", "0", "--seconds", "1"][..], "'0' for '--depths <DEPTHS>': 0 is not in 1..=256"),
        (&["throughput", "--sessions", "0"][..], "'0' for '--sessions <SESSIONS>'"),
        (&["throughput", "--seconds", "0"][..], "'0' for '--seconds <SECONDS>'"),
        (&["load", "--target", "127.0.0.1:9", "--size", "0"][..], "'0' for '--size <SIZE>'"),
    ] {
        let output = bench(arguments);
        assert_eq!(output.status.code(), Some(2), "{arguments:?}: {}", text(&output.stderr));
        assert!(text(&output.stderr).contains(names), "{arguments:?}: {}", text(&output.stderr));
        assert!(output.stdout.is_empty(), "{arguments:?} ran: {}", text(&output.stdout));
    }
}

#[test]
fn load_refuses_a_range_past_the_region_and_takes_netdam_s_byte_counts() {
    let (target, _data_dir) = target(AuthMode::None);
    let address = target.local_addr().to_string();
    let load = |offset: &str| {
        Command::new(env!("CARGO_BIN_EXE_netdam-bench"))
            .args(["load", "--target", &address, "--region", "bench", "--seconds", "0.2", "--offset", offset])
            .env("NETDAM_KEY", "none")
            .output()
            .unwrap()
    };
    let past = load("64MiB");
    assert_eq!(past.status.code(), Some(2), "{}", text(&past.stdout));
    let said = text(&past.stdout);
    assert!(
        said.contains("\"error\"") && said.contains("past the end of region \\\"bench\\\" (67108864 bytes)"),
        "{said}"
    );
    let inside = load("63MiB");
    assert!(inside.status.success(), "{}", text(&inside.stdout));
    assert!(text(&inside.stdout).contains("\"failed\":0"), "{}", text(&inside.stdout));
    target.stop();
}

#[test]
fn a_load_whose_every_write_failed_fails_with_the_first_reason() {
    let (target, data_dir) = target(AuthMode::Tenants);
    let key = TenantKey::from_bytes([0x42; 32]);
    let reader = TenantRecord {
        name: "reader".into(),
        id: 7,
        key_version: 1,
        key_hex: key.to_hex(),
        class: Default::default(),
        limits: Default::default(),
        grants: vec![GrantRecord { space: GrantSpace::All, permissions: vec!["read".into()], range: None }],
    };
    let (snapshot, warnings) = TenantSnapshot::resolve(&[reader], target.regions(), target.namespaces());
    assert!(warnings.is_empty(), "{warnings:?}");
    target.tenants().publish(snapshot);
    let key_file = data_dir.path().join("reader.key");
    KeyFile { tenant: "reader".into(), id: 7, version: 1, key }.write(&key_file, false).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_netdam-bench"))
        .args(["load", "--target", &target.local_addr().to_string(), "--region", "bench", "--seconds", "0.2"])
        .arg("--key")
        .arg(&key_file)
        .output()
        .unwrap();
    let said = text(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{said}");
    assert!(said.contains("\"error\":\"every write failed: target refused WRITE: permission_denied"), "{said}");
    assert!(said.contains("\"operations\":0"), "{said}");
    target.stop();
}

#[test]
fn the_help_lists_every_subcommand_on_a_line_of_its_own() {
    let help = text(&bench(&["--help"]).stdout);
    let (about, rest) = help.split_once("Usage:").expect("a usage line");
    let commands = rest.split_once("Commands:").expect("a command list").1;
    let names: Vec<&str> = commands
        .lines()
        .skip(1)
        .take_while(|line| !line.trim().is_empty())
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .collect();
    assert!(names.contains(&"bulk") && names.contains(&"integrity") && names.len() >= 14, "{names:?}");
    for name in names {
        assert!(
            about.lines().any(|line| line.trim_start().starts_with(&format!("{name} "))),
            "the description has no line for {name}:\n{about}"
        );
    }
}

#[test]
fn sim_prints_a_summary_and_states_its_defaults() {
    let output = bench(&["sim", "--millis", "1", "--initiators", "2"]);
    assert!(output.status.success());
    let said = text(&output.stdout);
    assert!(said.starts_with("SEED=1\n"), "{said}");
    assert!(said.contains("latency: p50 ") && said.contains(" µs, p99 "), "{said}");
    assert!(!said.contains("Duration {") && !said.contains("Report {"), "{said}");
    let help = text(&bench(&["sim", "--help"]).stdout);
    assert!(help.contains("initial window, requests (more than 0; with --cc on) [default: 1]"), "{help}");
    assert!(
        help.contains("Floor of the retransmission timeout, µs (1 to 60,000,000: a minute) [default: 500]"),
        "{help}"
    );
}

#[test]
fn the_floor_alone_names_no_target_and_lists_no_empty_plots() {
    let out = tempfile::tempdir().unwrap();
    let output = bench(&[
        "floor",
        "--requests",
        "200",
        "--warmup",
        "20",
        "--poll",
        "blocking",
        "--out",
        out.path().to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let (said, noted) = (text(&output.stdout), text(&output.stderr));
    assert!(said.contains("udp echo") && !said.contains("In target"), "{said}");
    assert!(!noted.lines().any(|line| line.trim() == "plotted"), "{noted}");
    let markdown = std::fs::read_to_string(out.path().join("latency.md")).unwrap();
    assert!(markdown.contains("| READ 64 B | udp echo") && !markdown.contains("In target"), "{markdown}");
}
