//! `netdam top --once --json` against a live target under load: the READ rate it reports is
//! what was sent, and its quantiles come from the interval's buckets.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use netdam_initiator::Client;

/// `netdam` is built by the initiator crate into the same directory as this crate's binaries.
fn netdam_binary() -> PathBuf {
    let netdam = PathBuf::from(env!("CARGO_BIN_EXE_netdam-target")).with_file_name("netdam");
    assert!(netdam.exists(), "{} is missing: build the workspace first (cargo build --workspace)", netdam.display());
    netdam
}

#[test]
fn top_once_json_shows_the_read_rate_of_a_loaded_target() {
    let test = common::start(vec![common::region("mem", 1 << 20, false)], 1, 9000);
    let url = format!("http://{}/metrics", test.target.metrics_addr().expect("metrics on"));
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let addr = test.target.local_addr();
    let load = {
        let (stop, reads) = (stop.clone(), reads.clone());
        std::thread::spawn(move || {
            let mut client = Client::connect(addr).unwrap();
            let mut out = [0u8; 64];
            while !stop.load(Ordering::Relaxed) {
                client.read(0, 0, &mut out).unwrap();
                reads.fetch_add(1, Ordering::Relaxed);
                // A gentle load: the machine is shared.
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        })
    };
    let output = Command::new(netdam_binary())
        .args(["--json", "top", "--once", "--interval", "0.5", "--metrics", &url])
        .output()
        .expect("netdam runs");
    stop.store(true, Ordering::Relaxed);
    load.join().unwrap();
    assert!(output.status.success(), "netdam top failed: {}", String::from_utf8_lossy(&output.stderr));
    let view: serde_json::Value = serde_json::from_slice(&output.stdout).expect("one JSON object");
    assert_eq!(view["metrics"], url.as_str());
    assert_eq!(view["latency"], "netdam_service_time_seconds");
    let read = &view["opcodes"]["read"];
    let rate = read["rate_per_s"].as_f64().expect("a READ rate");
    assert!(rate > 0.0, "{view}");
    // No more than were sent in the whole run, over half a second.
    assert!(rate <= reads.load(Ordering::Relaxed) as f64 / 0.4, "{view}");
    let (p50, p999) = (read["p50_us"].as_f64().unwrap(), read["p999_us"].as_f64().unwrap());
    assert!(p50 > 0.0 && p50 <= p999, "{view}");
    assert_eq!(view["sessions_open"], 1.0);
    assert_eq!(view["errors_per_s"], 0.0);
    assert_eq!(view["build"]["engine"], "software");
}

#[test]
fn top_names_an_unreachable_endpoint() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let output = Command::new(netdam_binary())
        .args(["top", "--once", "--metrics", &format!("http://{port}/metrics")])
        .output()
        .expect("netdam runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(&format!("http://{port}/metrics")), "{stderr}");
}
