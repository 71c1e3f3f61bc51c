//! Disk faults, seen from the initiator and from a stock NBD client:
//!
//! - A namespace whose device fails (a test device that answers EIO for a range of blocks, and
//!   for FLUSH once told to) gives the initiator `io_error` and `netdam nbd`'s client EIO, while
//!   the same session, the target's other namespace and its memory region go on working.
//! - A namespace file on a full file system (a small tmpfs, mounted when the test runs as root)
//!   answers `no_space` (NBD ENOSPC), not a generic I/O error, and works again once a trim frees
//!   room.
//! - A persistent region too big for its file system stops the start with a message, instead of
//!   a SIGBUS on the first store the file system cannot back.
//! - `netdam bread` failing midway (on the failing device) leaves in its --out file what it
//!   read before, and says how many bytes that is.
//!
//! device-mapper's `dm-error` would fail a real block device the same way, but it needs the
//! kernel's device-mapper driver, which the machines these tests run on lack; the in-process
//! device needs no kernel support and no root.

mod common;

use std::collections::HashMap;
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::TestTarget;
use netdam_initiator::{Client, ClientError};
use netdam_isa::Status;
use netdam_nvme::{
    BlockDevice, BlockError, BlockRequest, BufferIndex, Completion, CrashImage, CrashTestDevice, Geometry,
};
use netdam_target::config::{ByteSize, Config, NamespaceBackend, NamespaceConfig, PollMode};
use netdam_target::namespaces::Namespace;
use netdam_target::Target;

const BLOCK: u32 = 4096;

/// Which requests the failing device fails.
struct Faults {
    /// Reads, writes and trims touching these blocks fail with EIO.
    bad_blocks: Range<u64>,
    /// While set, FLUSH fails with EIO.
    flush_fails: AtomicBool,
}

/// A crash-test device that fails the requests `faults` names, after executing them (a failed
/// write may have written part of its blocks, as on a real disk).
struct FailingDevice {
    inner: CrashTestDevice,
    faults: Arc<Faults>,
    submitted: HashMap<u64, BlockRequest>,
}

fn eio() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

impl Faults {
    fn failure(&self, request: &BlockRequest) -> Option<BlockError> {
        match *request {
            BlockRequest::Flush => {
                self.flush_fails.load(Ordering::SeqCst).then(|| BlockError::FlushFailed { source: eio() })
            }
            BlockRequest::Read { offset_blocks, num_blocks, .. } => self
                .touches(offset_blocks, num_blocks)
                .then(|| BlockError::ReadFailed { offset_blocks, num_blocks, source: eio() }),
            BlockRequest::Write { offset_blocks, num_blocks, .. }
            | BlockRequest::Trim { offset_blocks, num_blocks }
            | BlockRequest::WriteZeroes { offset_blocks, num_blocks } => self
                .touches(offset_blocks, num_blocks)
                .then(|| BlockError::WriteFailed { offset_blocks, num_blocks, source: eio() }),
        }
    }

    fn touches(&self, offset_blocks: u64, num_blocks: u32) -> bool {
        offset_blocks < self.bad_blocks.end && self.bad_blocks.start < offset_blocks + u64::from(num_blocks)
    }
}

impl BlockDevice for FailingDevice {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    fn submit(&mut self, tag: u64, request: BlockRequest) -> Result<(), BlockError> {
        self.inner.submit(tag, request)?;
        self.submitted.insert(tag, request);
        Ok(())
    }
    fn reap(&mut self, on_completion: &mut dyn FnMut(Completion)) -> usize {
        let (faults, submitted) = (&self.faults, &mut self.submitted);
        self.inner.reap(&mut |mut completion: Completion| {
            let request = submitted.remove(&completion.tag).expect("a completion for a submitted request");
            if let (Ok(()), Some(error)) = (&completion.result, faults.failure(&request)) {
                completion.result = Err(error);
            }
            on_completion(completion)
        })
    }
    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }
    fn buffer(&mut self, index: BufferIndex) -> &mut [u8] {
        self.inner.buffer(index)
    }
}

fn file_namespace(name: &str, path: &Path, blocks: u64) -> NamespaceConfig {
    NamespaceConfig {
        name: name.into(),
        backend: NamespaceBackend::File,
        path: path.to_path_buf(),
        size: Some(ByteSize(blocks * u64::from(BLOCK))),
        block_size: BLOCK,
    }
}

fn start(namespaces: Vec<NamespaceConfig>, extra: Vec<Namespace>) -> TestTarget {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        // Metrics on, on any free port: tests run many targets at once.
        metrics_listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: Some(dir.path().to_path_buf()),
        poll: PollMode::Blocking,
        regions: vec![common::region("mem", 1 << 20, false)],
        namespaces,
        // As in common::start: no BUSY answers because a loaded test machine was slow.
        busy_threshold_us: 60_000,
        pin_workers: false,
        lock_memory: false,
        auth: netdam_target::AuthMode::None,
        ..Config::default()
    };
    let target = Target::start_with(&config, extra).expect("target starts");
    TestTarget { target, dir }
}

/// The status a refused request was answered with.
fn refusal(result: Result<(), ClientError>) -> Status {
    match result {
        Err(ClientError::Refused { status, .. }) => status,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Instructions the target answered with `status`.
fn answered(target: &Target, status: Status) -> u64 {
    target.stats().by_status.iter().find(|(counted, _)| *counted == status).map_or(0, |(_, count)| *count)
}

/// The memory region, the healthy namespace and the session itself still work.
fn still_serving(client: &mut Client, healthy: &netdam_isa::control::NamespaceInfo, round: u8) {
    let data = vec![round; BLOCK as usize];
    client.block_write(healthy, u64::from(round), &data, true).expect("the healthy namespace takes writes");
    let mut read = vec![0u8; BLOCK as usize];
    client.block_read(healthy, u64::from(round), &mut read).expect("the healthy namespace reads");
    assert!(read == data, "the healthy namespace returned other bytes");
    client.write(0, 64, &[round; 64]).expect("the memory region takes writes");
    let mut memory = [0u8; 64];
    client.read(0, 64, &mut memory).expect("the memory region reads");
    assert_eq!(memory, [round; 64]);
}

/// Namespace "failing": `blocks` blocks of a fresh crash-test image behind a [`FailingDevice`]
/// that fails what `faults` names.
fn failing_namespace(blocks: u64, faults: Arc<Faults>) -> Namespace {
    let image = CrashImage::new(BLOCK, blocks);
    let factory = Arc::new(move |max_transfer: usize, _: netdam_nvme::Submission| {
        let device = FailingDevice {
            inner: image.device(256, max_transfer)?,
            faults: faults.clone(),
            submitted: HashMap::new(),
        };
        Ok(Box::new(device) as Box<dyn BlockDevice>)
    });
    Namespace::new("failing", "failing test device", BLOCK, blocks, factory)
}

#[test]
fn a_failing_device_answers_io_error_and_the_rest_keeps_serving() {
    const BLOCKS: u64 = 256;
    let faults = Arc::new(Faults { bad_blocks: 100..110, flush_fails: AtomicBool::new(false) });
    let failing = failing_namespace(BLOCKS, faults.clone());
    let test = start(vec![file_namespace("healthy", Path::new("healthy.img"), 256)], vec![failing]);
    let mut client = Client::connect(test.target.local_addr()).unwrap();
    let healthy = client.namespace("healthy").unwrap().clone();
    let disk = client.namespace("failing").unwrap().clone();
    let block = vec![0x5A; BLOCK as usize];
    let mut read = vec![0u8; BLOCK as usize];

    client.block_write(&disk, 10, &block, true).expect("blocks outside the bad range work");
    client.block_read(&disk, 10, &mut read).unwrap();
    assert!(read == block);
    still_serving(&mut client, &healthy, 1);
    for fua in [false, true] {
        assert_eq!(refusal(client.block_write(&disk, 105, &block, fua)), Status::IoError, "write, fua {fua}");
    }
    // A transfer that only overlaps the bad range fails as a whole.
    assert_eq!(refusal(client.block_write(&disk, 98, &vec![1; 4 * BLOCK as usize], false)), Status::IoError);
    assert_eq!(refusal(client.block_read(&disk, 100, &mut read)), Status::IoError);
    assert_eq!(refusal(client.trim(&disk, 109, 2)), Status::IoError);
    assert_eq!(refusal(client.write_zeroes(&disk, 90, 20)), Status::IoError);
    still_serving(&mut client, &healthy, 2);
    client.block_flush(&disk).expect("flush works while the device's flush does");
    faults.flush_fails.store(true, Ordering::SeqCst);
    assert_eq!(refusal(client.block_flush(&disk)), Status::IoError, "a failed flush is reported");
    still_serving(&mut client, &healthy, 3);
    assert!(answered(&test.target, Status::IoError) >= 7, "io_error answers are counted");

    // Through `netdam nbd` and qemu-io: the failing blocks give EIO, the others data.
    if let Some(qemu_io) = tool("qemu-io", "qemu-utils") {
        let export = NbdExport::start(test.target.local_addr(), "failing", test.dir.path());
        let output = qemu_io.run(&export.uri(), &["read 0 4k", "write -P 0x33 409600 4k", "read 40960 4k"]);
        assert!(output.contains("read 4096/4096 bytes at offset 0"), "{output}");
        assert!(output.contains("write failed: Input/output error"), "qemu-io saw no EIO for the bad write:\n{output}");
        assert!(output.contains("read 4096/4096 bytes at offset 40960"), "{output}");
        let output = qemu_io.run(&export.uri(), &["read 413696 4k"]);
        assert!(output.contains("read failed: Input/output error"), "no EIO for the bad read:\n{output}");
        // qemu-io prints nothing for a failed flush but exits 1; qemu sends no FLUSH when nothing
        // was written since the last one, so each run writes first.
        faults.flush_fails.store(false, Ordering::SeqCst);
        let output = qemu_io.run(&export.uri(), &["write -P 0x22 0 4k", "flush"]);
        assert!(output.contains("wrote 4096/4096") && output.ends_with("exit: exit status: 0\n"), "{output}");
        faults.flush_fails.store(true, Ordering::SeqCst);
        let output = qemu_io.run(&export.uri(), &["write -P 0x22 0 4k", "flush"]);
        assert!(output.contains("wrote 4096/4096") && output.ends_with("exit: exit status: 1\n"), "{output}");
        drop(export);
        still_serving(&mut client, &healthy, 4);
    }
}

/// `netdam bread` reads a piece (16 MiB) at a time and writes it out before reading the next:
/// when a later piece fails (bad blocks past the first 16 MiB), its --out file holds the pieces
/// before it, and the error says how many bytes that is and in which blocks the read failed.
#[test]
fn a_bread_failing_midway_says_how_much_its_output_holds() {
    const BLOCKS: u64 = 6144; // 24 MiB: a whole piece, then the bad blocks in the second
    const PIECE_BLOCKS: u64 = (16 << 20) / BLOCK as u64;
    let faults = Arc::new(Faults { bad_blocks: 5000..5001, flush_fails: AtomicBool::new(false) });
    let test = start(Vec::new(), vec![failing_namespace(BLOCKS, faults)]);
    // Data at both ends of the first piece, to find in the output.
    let mut client = Client::connect(test.target.local_addr()).unwrap();
    let disk = client.namespace("failing").unwrap().clone();
    let mut rng = common::Rng::new(common::seed());
    let (first, last) = (rng.bytes(4 * BLOCK as usize), rng.bytes(4 * BLOCK as usize));
    client.block_write(&disk, 0, &first, false).unwrap();
    client.block_write(&disk, PIECE_BLOCKS - 4, &last, false).unwrap();
    drop(client);

    let out = test.dir.path().join("out.bin");
    let output = Command::new(common::netdam_binary())
        .env("XDG_DATA_HOME", test.dir.path().join("home"))
        .env_remove("NETDAM_KEY")
        .args(["--target", &test.target.local_addr().to_string(), "bread", "failing", "0", &BLOCKS.to_string()])
        .args(["--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    let message = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{message}");
    let piece_bytes = PIECE_BLOCKS * u64::from(BLOCK);
    let says = format!(
        "io_error (in blocks {PIECE_BLOCKS}+{}); {} holds only the first {piece_bytes} of the {} bytes",
        BLOCKS - PIECE_BLOCKS,
        out.display(),
        BLOCKS * u64::from(BLOCK)
    );
    assert!(message.contains(&says), "the error does not say {says:?}: {message}");
    let written = std::fs::read(&out).unwrap();
    assert_eq!(written.len() as u64, piece_bytes, "{message}");
    assert!(written[..first.len()] == first[..] && written[written.len() - last.len()..] == last[..]);

    // With --json, the object printed is closed as valid JSON that says it is incomplete, and
    // the error object follows on a line of its own.
    let output = Command::new(common::netdam_binary())
        .env("XDG_DATA_HOME", test.dir.path().join("home"))
        .env_remove("NETDAM_KEY")
        .args(["--json", "--target", &test.target.local_addr().to_string(), "bread", "failing", "0"])
        .arg(BLOCKS.to_string())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", String::from_utf8_lossy(&output.stderr));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let objects: Vec<serde_json::Value> =
        stdout.lines().map(|line| serde_json::from_str(line).expect("each line is a JSON object")).collect();
    let read = objects.iter().find(|object| object.get("hex").is_some()).expect("the read's object");
    assert_eq!(read["complete"], serde_json::json!(false));
    assert_eq!(read["bytes_read"], serde_json::json!(piece_bytes));
    assert_eq!(read["hex"].as_str().unwrap().len() as u64, 2 * piece_bytes);
}

/// A tmpfs of `bytes` mounted on a fresh directory, unmounted on drop.
struct SmallFileSystem {
    dir: tempfile::TempDir,
}

impl SmallFileSystem {
    /// Mounts it, or says why it cannot and returns `None`.
    fn mount(bytes: u64) -> Option<SmallFileSystem> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            println!("SKIPPED: the full-file-system test mounts a small tmpfs, which needs root");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let output = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "netdam-test", dir.path().to_str().unwrap()])
            .output();
        match output {
            Ok(output) if output.status.success() => Some(SmallFileSystem { dir }),
            Ok(output) => {
                println!(
                    "SKIPPED: the full-file-system test cannot mount a tmpfs here: {}",
                    String::from_utf8_lossy(&output.stderr).trim()
                );
                None
            }
            Err(error) => {
                println!("SKIPPED: the full-file-system test cannot run mount: {error}");
                None
            }
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for SmallFileSystem {
    fn drop(&mut self) {
        // Lazily: a panicking test may still hold a file there while it unwinds.
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

#[test]
fn a_full_file_system_is_reported_as_no_space() {
    // Room for 64 blocks of a 1024-block (4 MiB) sparse namespace file.
    let Some(small) = SmallFileSystem::mount(64 * u64::from(BLOCK)) else { return };
    let full_path = small.path().join("full.img");
    let test = start(
        vec![file_namespace("healthy", Path::new("healthy.img"), 256), file_namespace("full", &full_path, 1024)],
        Vec::new(),
    );
    let mut client = Client::connect(test.target.local_addr()).unwrap();
    let healthy = client.namespace("healthy").unwrap().clone();
    let disk = client.namespace("full").unwrap().clone();
    let block = vec![0xC3; BLOCK as usize];
    let mut written = 0;
    let status = loop {
        assert!(written < 1024, "1024 blocks fit on a file system sized for 64");
        match client.block_write(&disk, written, &block, true) {
            Ok(()) => written += 1,
            Err(error) => break refusal(Err(error)),
        }
    };
    assert_eq!(status, Status::NoSpace, "a full file system is reported as such, after {written} blocks");
    assert!(written > 0, "the namespace took writes before it filled");
    still_serving(&mut client, &healthy, 1);
    assert!(answered(&test.target, Status::NoSpace) >= 1, "no_space answers are counted");
    // Blocks already written can be rewritten and read: only new allocations fail.
    client.block_write(&disk, 0, &vec![0x11; BLOCK as usize], true).expect("an allocated block takes a rewrite");
    let mut read = vec![0u8; BLOCK as usize];
    client.block_read(&disk, 0, &mut read).unwrap();
    assert!(read.iter().all(|&byte| byte == 0x11));
    // A trim frees room (the file gets a hole), and the write that failed succeeds.
    client.trim(&disk, 0, 8).unwrap();
    client.block_write(&disk, written, &block, true).expect("the write succeeds once room is freed");

    // Through the command line, a write of many pieces refused part way says that it may be
    // partly written (it said only no_space, while the pieces before the refusal had landed).
    let netdam = PathBuf::from(env!("CARGO_BIN_EXE_netdam-target")).with_file_name("netdam");
    if netdam.exists() {
        let input = test.dir.path().join("large.bin");
        std::fs::write(&input, vec![0x5a; 256 * BLOCK as usize]).unwrap();
        let output = Command::new(&netdam)
            .args(["--target", &test.target.local_addr().to_string(), "bwrite", "full", "512", "--file"])
            .arg(&input)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "256 blocks fit where 8 were freed: {stderr}");
        assert!(stderr.contains("no_space") && stderr.contains("may hold the new data"), "{stderr}");
    } else {
        println!("SKIPPED: the bwrite part: {} is missing (cargo build --workspace builds it)", netdam.display());
    }

    if let Some(qemu_io) = tool("qemu-io", "qemu-utils") {
        let export = NbdExport::start(test.target.local_addr(), "full", test.dir.path());
        let output = qemu_io.run(&export.uri(), &["write -P 0x44 2m 256k"]);
        assert!(output.contains("write failed: No space left on device"), "qemu-io saw no ENOSPC:\n{output}");
    }
    drop(client);
    drop(test);
}

/// A persistent region's file is reserved whole when the target starts: a region that does not
/// fit on its file system stops the start with a message saying so, instead of a SIGBUS on the
/// first store into a page the file system cannot allocate; one that fits is served.
#[test]
fn a_region_that_does_not_fit_its_file_system_stops_the_start() {
    let Some(small) = SmallFileSystem::mount(1 << 20) else { return };
    let config = |size: u64| Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        metrics_listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: Some(small.path().to_path_buf()),
        poll: PollMode::Blocking,
        regions: vec![netdam_target::config::RegionConfig {
            name: "persistent".into(),
            backend: netdam_target::config::RegionBackend::File,
            path: Some(format!("region-{size}").into()),
            size: ByteSize(size),
        }],
        pin_workers: false,
        lock_memory: false,
        auth: netdam_target::AuthMode::None,
        ..Config::default()
    };
    let error = Target::start(&config(4 << 20)).expect_err("a 4 MiB region on a 1 MiB file system");
    let message = error.to_string();
    assert!(message.contains("no room") && message.contains("region-4194304"), "{message}");
    let target = Target::start(&config(256 << 10)).expect("a region that fits starts");
    let mut client = Client::connect(target.local_addr()).unwrap();
    let region = client.region("persistent").unwrap().id;
    let data = vec![0x7E; 256 << 10];
    client.write(region, 0, &data).expect("every page of a reserved region takes a store");
    drop(client);
    drop(target);
}

/// A stock NBD client found on this machine.
struct Tool(&'static str);

/// The tool, if it runs; if not, says why its part of the test is skipped.
fn tool(name: &'static str, package: &str) -> Option<Tool> {
    match Command::new(name).arg("--version").output() {
        Ok(output) if output.status.success() => Some(Tool(name)),
        _ => {
            println!("SKIPPED: the NBD part: {name} is not installed (apt-get install {package})");
            None
        }
    }
}

impl Tool {
    /// qemu-io on `uri` running `commands`; returns what it printed (it exits 0 even when a
    /// command fails, and says so in its output).
    fn run(&self, uri: &str, commands: &[&str]) -> String {
        let mut command = Command::new(self.0);
        // Write-back: a write is not followed by a FLUSH of its own (or sent with FUA), so the
        // "flush" command is what sends one.
        command.args(["-f", "raw", "-t", "writeback"]);
        for each in commands {
            command.args(["-c", each]);
        }
        let output = command.arg(uri).output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        format!("{text}exit: {}\n", output.status)
    }
}

/// `netdam nbd` exporting a namespace on a Unix socket; stopped on drop.
struct NbdExport {
    child: Child,
    socket: PathBuf,
    name: String,
}

impl NbdExport {
    fn start(target: std::net::SocketAddr, namespace: &str, dir: &Path) -> NbdExport {
        let netdam = PathBuf::from(env!("CARGO_BIN_EXE_netdam-target")).with_file_name("netdam");
        assert!(
            netdam.exists(),
            "{} is missing: build the workspace first (cargo build --workspace)",
            netdam.display()
        );
        let socket = dir.join(format!("{namespace}.nbd"));
        let child = Command::new(netdam)
            .args(["--target", &target.to_string(), "nbd", "--namespace", namespace])
            .arg("--listen")
            .arg(format!("unix:{}", socket.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let export = NbdExport { child, socket, name: namespace.to_string() };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !export.socket.exists() {
            assert!(Instant::now() < deadline, "netdam nbd did not listen on {}", export.socket.display());
            std::thread::sleep(Duration::from_millis(20));
        }
        export
    }

    fn uri(&self) -> String {
        format!("nbd+unix:///{}?socket={}", self.name, self.socket.display())
    }
}

impl Drop for NbdExport {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
