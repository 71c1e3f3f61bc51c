//! The NBD export against the stock clients: libnbd's `nbdinfo`, `qemu-io` and `qemu-img`,
//! over a unix socket and over TCP, with an in-memory backend whose contents are checked
//! directly. A missing tool makes its test say SKIPPED and return.

mod nbd_support;

use std::process::Command;
use std::sync::Arc;

use nbd_support::{pattern, Calls, MemDisk, Scratch, TestServer};
use netdam_initiator::nbd::ExportOptions;

const MIB: usize = 1024 * 1024;

/// Whether `tool` runs; if not, says why the test is skipped.
fn installed(tool: &str, package: &str) -> bool {
    match Command::new(tool).arg("--version").output() {
        Ok(output) if output.status.success() => true,
        _ => {
            println!("SKIPPED: {tool} not installed (apt-get install {package})");
            false
        }
    }
}

/// Runs a command, failing the test with its output if it fails; returns its stdout.
fn run(command: &mut Command) -> String {
    let output = command.output().unwrap_or_else(|error| panic!("cannot run {command:?}: {error}"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{command:?} failed ({}):\n{stdout}\n{stderr}", output.status);
    stdout
}

/// qemu-io on `uri` with each of `commands`; returns its output (which must not report an
/// error: qemu-io exits 0 even when a command fails).
fn qemu_io(uri: &str, commands: &[&str]) -> String {
    let mut command = Command::new("qemu-io");
    command.args(["-f", "raw"]);
    for c in commands {
        command.args(["-c", c]);
    }
    command.arg(uri);
    let output = run(&mut command);
    let lowered = output.to_lowercase();
    assert!(
        !lowered.contains("failed") && !lowered.contains("error") && !lowered.contains("pattern verification"),
        "qemu-io reported a failure:\n{output}"
    );
    output
}

fn nbdinfo_json(uri: &str) -> serde_json::Value {
    let output = run(Command::new("nbdinfo").args(["--json", uri]));
    serde_json::from_str(&output).unwrap_or_else(|error| panic!("nbdinfo printed no JSON ({error}):\n{output}"))
}

#[test]
fn nbdinfo_sees_size_block_sizes_and_flags() {
    if !installed("nbdinfo", "libnbd-bin") {
        return;
    }
    let disk = Arc::new(MemDisk::new(8 * MIB, 4096));
    let server = TestServer::unix(disk.clone(), ExportOptions::default());
    let info = nbdinfo_json(&server.uri());
    assert_eq!(info["protocol"], "newstyle-fixed");
    let export = &info["exports"][0];
    assert_eq!(export["export-size"], 8 * MIB as u64, "{info:#}");
    assert_eq!(export["block_size_minimum"], 4096, "{info:#}");
    assert_eq!(export["block_size_preferred"], 65536, "{info:#}");
    assert_eq!(export["block_size_maximum"], 32 * MIB as u64, "{info:#}");
    for (flag, expected) in [
        ("is_read_only", false),
        ("can_flush", true),
        ("can_fua", true),
        ("can_trim", true),
        ("can_zero", true),
        ("can_fast_zero", true),
        ("can_multi_conn", true),
        ("can_cache", false),
    ] {
        assert_eq!(export[flag], expected, "{flag} in {info:#}");
    }
    let report = server.stop();
    assert_eq!(report.connection_errors, 0, "{report:#?}");
    assert!(report.transmissions >= 1);
}

#[test]
fn nbdinfo_over_tcp_sees_a_named_read_only_export() {
    if !installed("nbdinfo", "libnbd-bin") {
        return;
    }
    let disk = Arc::new(MemDisk::new(MIB, 512));
    let options = ExportOptions {
        name: "vol0".into(),
        description: Some("netdam test volume".into()),
        read_only: true,
        ..ExportOptions::default()
    };
    let server = TestServer::tcp(disk, options);
    let info = nbdinfo_json(&server.uri_of("vol0"));
    let export = &info["exports"][0];
    assert_eq!(export["export-name"], "vol0", "{info:#}");
    assert_eq!(export["description"], "netdam test volume", "{info:#}");
    assert_eq!(export["is_read_only"], true, "{info:#}");
    assert_eq!(export["can_trim"], false, "{info:#}");
    assert_eq!(export["can_zero"], false, "{info:#}");
    assert_eq!(export["block_size_minimum"], 512, "{info:#}");

    // An unknown export is refused with an error (NBD_REP_ERR_UNKNOWN), not a hang.
    let output = Command::new("nbdinfo").arg(server.uri_of("nope")).output().unwrap();
    assert!(!output.status.success());
    let report = server.stop();
    assert_eq!(report.connection_errors, 0, "{report:#?}");
}

#[test]
fn qemu_io_writes_reads_zeroes_discards_and_flushes() {
    if !installed("qemu-io", "qemu-utils") {
        return;
    }
    let disk = Arc::new(MemDisk::new(8 * MIB, 4096));
    disk.fill(0x11);
    let server = TestServer::unix(disk.clone(), ExportOptions::default());
    qemu_io(
        &server.uri(),
        &[
            "write -P 0xab 0 1M",
            "read -P 0xab 0 1M",
            "write -z 1M 64k",
            "discard 2M 64k",
            "flush",
            "write -f -P 0xcd 4M 4k",
            "read -P 0 1M 64k",
            "read -P 0xcd 4M 4k",
            "read -P 0x11 5M 1M",
        ],
    );
    let data = disk.snapshot();
    assert!(data[..MIB].iter().all(|&b| b == 0xab), "write");
    assert!(data[MIB..MIB + 64 * 1024].iter().all(|&b| b == 0), "write -z");
    assert!(data[MIB + 64 * 1024..2 * MIB].iter().all(|&b| b == 0x11), "untouched");
    assert!(data[4 * MIB..4 * MIB + 4096].iter().all(|&b| b == 0xcd), "write -f");
    assert!(data[4 * MIB + 4096..].iter().all(|&b| b == 0x11), "untouched");
    let calls = &disk.calls;
    assert!(Calls::get(&calls.flushes) >= 1, "flush reached the backend");
    assert!(Calls::get(&calls.fua_writes) >= 1, "write -f is a FUA write");
    assert!(Calls::get(&calls.write_zeroes) >= 1, "write -z without -u must not punch holes");
    assert_eq!(Calls::get(&calls.bad_calls), 0);
    assert!(Calls::get(&calls.largest_call_bytes) <= 256 * 1024, "1M requests were split for the backend");
    let report = server.stop();
    assert_eq!(report.connection_errors, 0, "{report:#?}");
    assert_eq!(report.request_errors, 0, "{report:#?}");
    println!("qemu-io: {report:?}, trims {}", Calls::get(&calls.trims));
}

#[test]
fn qemu_io_over_tcp() {
    if !installed("qemu-io", "qemu-utils") {
        return;
    }
    let disk = Arc::new(MemDisk::new(4 * MIB, 512));
    let server = TestServer::tcp(disk.clone(), ExportOptions { name: "tcpdisk".into(), ..ExportOptions::default() });
    qemu_io(
        &server.uri_of("tcpdisk"),
        &["write -P 0x5a 512 64k", "read -P 0x5a 512 64k", "write -z -u 1M 1M", "flush"],
    );
    let data = disk.snapshot();
    assert!(data[512..512 + 64 * 1024].iter().all(|&b| b == 0x5a));
    assert!(Calls::get(&disk.calls.trims) >= 1, "write -z -u may deallocate, so it is done by trim");
    let report = server.stop();
    assert_eq!(report.connection_errors, 0, "{report:#?}");
}

#[test]
fn qemu_io_on_a_read_only_export_cannot_write() {
    if !installed("qemu-io", "qemu-utils") {
        return;
    }
    let disk = Arc::new(MemDisk::new(MIB, 512));
    disk.fill(0x77);
    let server = TestServer::unix(disk.clone(), ExportOptions { read_only: true, ..ExportOptions::default() });
    // qemu refuses to open a read-only export for writing, so ask for read-only access.
    let output = run(Command::new("qemu-io").args(["-r", "-f", "raw", "-c", "read -P 0x77 0 64k", &server.uri()]));
    assert!(!output.to_lowercase().contains("fail"), "{output}");
    let output = Command::new("qemu-io").args(["-f", "raw", "-c", "write 0 4k", &server.uri()]).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(!output.status.success() || text.to_lowercase().contains("fail") || text.contains("read-only"), "{text}");
    assert!(disk.snapshot().iter().all(|&b| b == 0x77), "the data is unchanged");
    drop(server);
}

#[test]
fn qemu_img_convert_round_trips_a_random_image() {
    if !installed("qemu-img", "qemu-utils") {
        return;
    }
    let size = 24 * MIB;
    // Random data with zero stretches, so qemu-img's zero detection sends WRITE_ZEROES too.
    let mut image = pattern(0x6e62_6421, size);
    for hole in [MIB..3 * MIB, 10 * MIB..10 * MIB + 4096, 20 * MIB..size] {
        image[hole].fill(0);
    }
    let source = Scratch::new("src.img");
    let copy = Scratch::new("copy.img");
    std::fs::write(&source.0, &image).unwrap();

    let disk = Arc::new(MemDisk::new(size, 4096));
    disk.fill(0xee);
    let server = TestServer::unix(disk.clone(), ExportOptions::default());
    run(Command::new("qemu-img").args(["convert", "-n", "-f", "raw", "-O", "raw"]).arg(&source.0).arg(server.uri()));
    assert!(disk.snapshot() == image, "the export holds the image after convert in");
    run(Command::new("qemu-img").args(["convert", "-f", "raw", "-O", "raw", &server.uri()]).arg(&copy.0));
    let copied = std::fs::read(&copy.0).unwrap();
    assert_eq!(copied.len(), size);
    assert!(copied == image, "convert out returns the same bytes");

    assert_eq!(Calls::get(&disk.calls.bad_calls), 0);
    let report = server.stop();
    assert_eq!(report.connection_errors, 0, "{report:#?}");
    println!("qemu-img: {report:?}, most backend calls at once {:?}", disk.calls.most_running);
}

/// `nbdinfo --map` and `qemu-img map` read `base:allocation`: written ranges are data, trimmed
/// and never-written ones holes that read as zeroes. The backend answers at most 4 extents at a
/// time, so both tools must follow short answers. A backend that cannot tell shows as all data.
#[test]
fn nbdinfo_and_qemu_img_map_the_allocation() {
    if !installed("nbdinfo", "libnbd-bin") || !installed("qemu-io", "qemu-utils") {
        return;
    }
    let disk = Arc::new(MemDisk::new(8 * MIB, 4096).with_allocation(4));
    let server = TestServer::unix(disk.clone(), ExportOptions::default());
    let info = nbdinfo_json(&server.uri());
    let contexts = &info["exports"][0]["contexts"];
    assert!(contexts.as_array().is_some_and(|list| list.iter().any(|c| c == "base:allocation")), "{info:#}");
    qemu_io(&server.uri(), &["write -P 0xab 0 2M", "write -P 0xcd 4M 1M", "discard 1M 512k"]);

    // (offset, length, hole) runs, merged where neighbours agree.
    let expected = [(0, MIB, false), (MIB, MIB / 2, true), (3 * MIB / 2, MIB / 2, false), (2 * MIB, 2 * MIB, true)];
    let expected: Vec<(u64, u64, bool)> = expected
        .into_iter()
        .chain([(4 * MIB, MIB, false), (5 * MIB, 3 * MIB, true)])
        .map(|(offset, len, hole)| (offset as u64, len as u64, hole))
        .collect();
    let merge = |runs: Vec<(u64, u64, bool)>| {
        let mut merged: Vec<(u64, u64, bool)> = Vec::new();
        for (offset, len, hole) in runs {
            match merged.last_mut() {
                Some(last) if last.2 == hole && last.0 + last.1 == offset => last.1 += len,
                _ => merged.push((offset, len, hole)),
            }
        }
        merged
    };

    // A tool's JSON list of extents as (offset, length, hole) runs, each read by `extent`.
    let runs_of = |output: String, extent: &dyn Fn(&serde_json::Value) -> (u64, u64, bool)| {
        let map: serde_json::Value = serde_json::from_str(&output).unwrap_or_else(|error| panic!("{error}: {output}"));
        let runs = map.as_array().expect("a list of extents").iter().map(extent).collect();
        (merge(runs), map)
    };
    let (runs, map) = runs_of(run(Command::new("nbdinfo").args(["--map", "--json", &server.uri()])), &|extent| {
        let flags = extent["type"].as_u64().unwrap();
        let hole = flags & 1 != 0;
        assert_eq!(flags & 2 != 0, hole, "holes read as zeroes here, data is not known zero: {extent}");
        (extent["offset"].as_u64().unwrap(), extent["length"].as_u64().unwrap(), hole)
    });
    assert_eq!(runs, expected, "nbdinfo --map: {map:#}");
    let (runs, map) =
        runs_of(run(Command::new("qemu-img").args(["map", "--output=json", "-f", "raw", &server.uri()])), &|extent| {
            let hole = extent["data"] == false;
            assert_eq!(extent["zero"] == true, hole, "{extent}");
            (extent["start"].as_u64().unwrap(), extent["length"].as_u64().unwrap(), hole)
        });
    assert_eq!(runs, expected, "qemu-img map: {map:#}");
    assert!(Calls::get(&disk.calls.block_statuses) >= 4, "short answers were followed up");
    assert_eq!(Calls::get(&disk.calls.bad_calls), 0);
    let report = server.stop();
    assert_eq!(report.connection_errors, 0, "{report:#?}");

    // Without allocation reporting the export offers no context, and maps as one data extent.
    let server = TestServer::unix(Arc::new(MemDisk::new(MIB, 4096)), ExportOptions::default());
    let map = run(Command::new("qemu-img").args(["map", "--output=json", "-f", "raw", &server.uri()]));
    let map: serde_json::Value = serde_json::from_str(&map).unwrap();
    assert_eq!(map.as_array().map(Vec::len), Some(1), "{map:#}");
    assert_eq!(map[0]["data"], true, "{map:#}");
    server.stop();
}
