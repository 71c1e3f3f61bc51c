//! The binaries as a user runs them: `netdam-target` with no arguments serves its embedded
//! default; `netdam write` then `netdam read` of 1 MiB returns the same bytes, before and after
//! the target is killed with SIGKILL and restarted.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use common::{seed, Rng};

/// `netdam` is built by the initiator crate into the same directory as this crate's binaries.
fn netdam_binary() -> PathBuf {
    let target_binary = PathBuf::from(env!("CARGO_BIN_EXE_netdam-target"));
    let netdam = target_binary.with_file_name("netdam");
    assert!(netdam.exists(), "{} is missing: build the workspace first (cargo build --workspace)", netdam.display());
    netdam
}

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `netdam-target` with no arguments, its data directory under `home`; waits for the banner.
fn start_default_target(home: &Path) -> Daemon {
    let mut child = Command::new(env!("CARGO_BIN_EXE_netdam-target"))
        .env("XDG_DATA_HOME", home.join("data"))
        .env("HOME", home)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("netdam-target starts");
    let mut banner = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut banner).unwrap();
    if !banner.contains("serving on 127.0.0.1:7800") {
        let _ = child.kill();
        let output = child.wait_with_output().unwrap();
        panic!(
            "netdam-target did not start on its default address; stdout {banner:?}, stderr {:?} \
             (is something else using UDP port 7800?)",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Daemon(child)
}

fn netdam(args: &[&str]) -> Output {
    let output = Command::new(netdam_binary()).args(args).output().expect("netdam runs");
    assert!(
        output.status.success(),
        "netdam {args:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

#[test]
fn default_target_keeps_a_1_mib_write_across_kill_and_restart() {
    let mut rng = Rng::new(seed());
    let home = tempfile::tempdir().unwrap();
    let input = home.path().join("in.bin");
    let output = home.path().join("out.bin");
    let data = rng.bytes(1 << 20);
    std::fs::write(&input, &data).unwrap();

    let mut daemon = start_default_target(home.path());
    assert!(home.path().join("data/netdam/default.region").exists(), "the default region lives in the user's data dir");
    let written = netdam(&["write", "default", "0", "--file", input.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&written.stdout).contains("wrote 1048576 bytes"));
    netdam(&["read", "default", "0", "1MiB", "--out", output.to_str().unwrap()]);
    assert!(std::fs::read(&output).unwrap() == data, "read returned other bytes than were written");

    // SIGKILL: no chance to flush anything; acknowledged writes were persisted before the answer.
    daemon.0.kill().unwrap();
    daemon.0.wait().unwrap();
    drop(daemon);
    let _daemon = start_default_target(home.path());
    std::fs::remove_file(&output).unwrap();
    netdam(&["read", "default", "0", "1MiB", "--out", output.to_str().unwrap()]);
    assert!(std::fs::read(&output).unwrap() == data, "the default region lost bytes across a restart");

    // JSON output parses, and errors name the culprit.
    let stat = netdam(&["--json", "stat"]);
    let stat: serde_json::Value = serde_json::from_slice(&stat.stdout).unwrap();
    // Since the restart: the 1 MiB read in chunks of at most 8960 bytes, plus the HELLOs.
    assert!(stat["status_ok"].as_u64().unwrap() >= 118);
    let missing = Command::new(netdam_binary()).args(["read", "nope", "0", "1"]).output().unwrap();
    assert!(!missing.status.success());
    let message = String::from_utf8_lossy(&missing.stderr);
    assert!(message.contains("no region \"nope\"") && message.contains("default"), "{message}");
    let crc = netdam(&["--json", "crc", "default", "0", "1MiB"]);
    let crc: serde_json::Value = serde_json::from_slice(&crc.stdout).unwrap();
    assert_eq!(crc["crc32"].as_u64().unwrap(), u64::from(crc32fast::hash(&data)));
}

#[test]
fn bad_settings_are_refused_with_the_setting_named() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    std::fs::write(&config, "workers = 0\n").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_netdam-target"))
        .args(["serve", "--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("workers = 0"));
    std::fs::write(&config, "listen = \"127.0.0.1:0\"\npoling = \"busy\"\n").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_netdam-target"))
        .args(["config", "--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && message.contains("poling") && message.contains("bad.toml"), "{message}");
}
