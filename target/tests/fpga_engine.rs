//! The differential conformance suite across engines (issue 14) and the FPGA engine's fault
//! tests.
//!
//! The same seeded instruction streams (memory, atomics, compute, errors and out-of-bounds, from
//! `netdam_fpga::conformance`, plus MEMCPYs between a region on the device and one left on the
//! host) run against the software engine, the FPGA engine over the device model on a thread, and
//! the FPGA engine over the model as a separate process (`netdam-fpga-model`); every answer and
//! the memory each leaves behind are compared byte for byte. Through the real target
//! (`--engine fpga=PATH` against `--engine software`) the same is done with block instructions
//! added and the namespace files compared (the FPGA target's namespace served by the model's
//! NVMe SSD, `fpga_namespace`, until the model is killed). Fault tests: the device stalls, resets itself, or its
//! process is killed mid-stream; the engine fails over to software and ends with the reference's
//! memory, every acknowledged write intact.
//!
//! Each test prints `SEED=`; `NETDAM_FPGA_SEED=0x...` replays it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;

use netdam_fpga::conformance::{random_instruction, StreamSpaces, ANSWER_BYTES_MAX};
use netdam_fpga::model::{self, Faults, ModelConfig};
use netdam_fpga::window::{FileWindow, Window};
use netdam_initiator::{Client, Op};
use netdam_isa::control::TARGET_FLAG_FPGA;
use netdam_isa::engine::Engine;
use netdam_isa::rng::Rng;
use netdam_isa::wire::Instruction;
use netdam_isa::{Duration, Opcode, Status};
use netdam_target::config::{ByteSize, EngineChoice, NamespaceBackend, NamespaceConfig, RegionBackend, RegionConfig};
use netdam_target::engine::SoftwareEngine;
use netdam_target::fpga_engine::{DeviceNamespace, EngineState, FpgaEngine, FpgaSettings};
use netdam_target::regions::RegionTable;
use netdam_target::{Config, Target};

const REGION_BYTES: u64 = 64 * 1024;
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

/// The seed of this run: `NETDAM_FPGA_SEED` (hex with 0x, or decimal) or `default`; printed.
fn seed(default: u64) -> u64 {
    let seed = match std::env::var("NETDAM_FPGA_SEED") {
        Ok(text) => match text.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).expect("NETDAM_FPGA_SEED in hex after 0x"),
            None => text.parse().expect("NETDAM_FPGA_SEED as a decimal or 0x-hex number"),
        },
        Err(_) => default,
    };
    println!("SEED={seed:#x} (replay with NETDAM_FPGA_SEED={seed:#x})");
    seed
}

/// Regions 0 and 1 in memory (placed on the device by the FPGA engine), region 2 a file
/// (persistent: it stays on the host).
fn region_configs(directory: &Path) -> Vec<RegionConfig> {
    let mem = |name: &str| RegionConfig {
        name: name.into(),
        backend: RegionBackend::Mem,
        path: None,
        size: ByteSize(REGION_BYTES),
    };
    vec![
        mem("a"),
        mem("b"),
        RegionConfig {
            name: "host".into(),
            backend: RegionBackend::File,
            path: Some(directory.join("host.region")),
            size: ByteSize(REGION_BYTES),
        },
    ]
}

/// Streams alternate between the two device regions and a device region with the host one.
const STREAMS: [StreamSpaces; 2] = [
    StreamSpaces { first: 0, second: 1, bytes: REGION_BYTES },
    StreamSpaces { first: 1, second: 2, bytes: REGION_BYTES },
];

/// The wedge deadline of the fault tests: short enough to wait out, long enough that a model
/// descheduled on a loaded machine is not taken for a wedged one.
const TEST_DEADLINE_MS: u64 = 2_000;

fn test_settings() -> FpgaSettings {
    FpgaSettings { progress_deadline: Duration::from_millis(TEST_DEADLINE_MS), ..FpgaSettings::default() }
}

/// The model binary, built beside `netdam-target` by `cargo build --workspace`.
fn model_binary() -> PathBuf {
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_netdam-target")).with_file_name("netdam-fpga-model");
    assert!(binary.exists(), "{} is missing: build the workspace first (cargo build --workspace)", binary.display());
    binary
}

/// `netdam-fpga-model` as a separate process, killed on drop.
struct ModelProcess {
    child: Child,
    window: PathBuf,
}

impl ModelProcess {
    fn start(window: &Path, args: &[&str]) -> ModelProcess {
        let child = Command::new(model_binary())
            .arg("--window")
            .arg(window)
            .args(args)
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("netdam-fpga-model starts");
        let started = std::time::Instant::now();
        // The model renames its window into place once powered on.
        while !window.exists() {
            assert!(started.elapsed() < PATIENCE, "the model did not create {} in {PATIENCE:?}", window.display());
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        ModelProcess { child, window: window.to_path_buf() }
    }

    fn kill(&mut self) {
        self.child.kill().expect("SIGKILL the model");
        self.child.wait().expect("reap the model");
    }
}

impl Drop for ModelProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.window);
    }
}

/// One engine under test with what keeps it alive.
struct Rig {
    engine: Box<dyn Engine>,
    state: Option<Arc<EngineState>>,
    _model_thread: Option<model::ModelThread>,
    model_process: Option<ModelProcess>,
    /// The device's window and the host copies of the regions (FPGA rigs).
    device: Option<(Arc<dyn Window>, Arc<RegionTable>)>,
    _directory: tempfile::TempDir,
}

impl Rig {
    /// Regions 0 and 1 as the device holds them in its on-board memory, and as their host
    /// copies hold them.
    fn device_and_host_bytes(&self) -> [(Vec<u8>, Vec<u8>); 2] {
        let (window, regions) = self.device.as_ref().expect("an FPGA rig");
        let memory_offset =
            window.u64_at(netdam_fpga::registers::DEVICE_MEMORY_OFFSET).load(std::sync::atomic::Ordering::Acquire);
        [0u16, 1].map(|space| {
            // Placed in region order, each at a 4 KiB boundary: region 1 right after region 0.
            let mut on_device = vec![0u8; REGION_BYTES as usize];
            window.read_bytes(memory_offset + u64::from(space) * REGION_BYTES, &mut on_device).unwrap();
            let mut on_host = vec![0u8; REGION_BYTES as usize];
            regions.get(space).unwrap().memory().read(0, &mut on_host);
            (on_device, on_host)
        })
    }
}

fn software_rig() -> Rig {
    let directory = tempfile::tempdir().unwrap();
    let regions = RegionTable::open(&region_configs(directory.path()), directory.path()).unwrap();
    Rig {
        engine: Box::new(SoftwareEngine::new(Arc::new(regions))),
        state: None,
        _model_thread: None,
        model_process: None,
        device: None,
        _directory: directory,
    }
}

fn fpga_rig(window: Arc<dyn Window>, directory: tempfile::TempDir, settings: FpgaSettings) -> Rig {
    let regions = Arc::new(RegionTable::open(&region_configs(directory.path()), directory.path()).unwrap());
    let (engine, state) = FpgaEngine::attach(Arc::clone(&window), Arc::clone(&regions), &[], None, settings).unwrap();
    assert!(state.on_fpga() && state.region_on_device(0) && state.region_on_device(1));
    assert!(!state.region_on_device(2), "a persistent region stays on the host");
    Rig {
        engine: Box::new(engine),
        state: Some(state),
        _model_thread: None,
        model_process: None,
        device: Some((window, regions)),
        _directory: directory,
    }
}

fn thread_rig(faults: Faults, settings: FpgaSettings) -> Rig {
    let directory = tempfile::tempdir().unwrap();
    let config = ModelConfig { faults, ..ModelConfig::default() };
    let window: Arc<dyn Window> =
        Arc::new(FileWindow::create(&directory.path().join("window"), config.window_bytes() as usize).unwrap());
    let thread = model::spawn(Arc::clone(&window), config).unwrap();
    let mut rig = fpga_rig(window, directory, settings);
    rig._model_thread = Some(thread);
    rig
}

fn process_rig(args: &[&str], settings: FpgaSettings) -> Rig {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("window");
    let process = ModelProcess::start(&path, args);
    let window: Arc<dyn Window> = Arc::new(FileWindow::open(&path).unwrap());
    let mut rig = fpga_rig(window, directory, settings);
    rig.model_process = Some(process);
    rig
}

fn answer(engine: &mut dyn Engine, instruction: &Instruction<'_>) -> Result<Vec<u8>, Status> {
    let mut out = [0u8; ANSWER_BYTES_MAX];
    engine.execute(instruction, &mut out).map(|len| out[..len].to_vec())
}

/// Every region's bytes, read through the engine itself.
fn memory(engine: &mut dyn Engine) -> Vec<Vec<u8>> {
    (0u16..3)
        .map(|space| {
            let mut bytes = Vec::new();
            for chunk in 0..REGION_BYTES / ANSWER_BYTES_MAX as u64 {
                let read = Instruction {
                    opcode: Opcode::Read as u8,
                    flags: 0,
                    space,
                    offset: chunk * ANSWER_BYTES_MAX as u64,
                    length: ANSWER_BYTES_MAX as u32,
                    aux: 0,
                    operand: &[],
                };
                bytes.extend(answer(engine, &read).expect("a read within the region"));
            }
            bytes
        })
        .collect()
}

fn assert_same_memory(expected: &[Vec<u8>], got: &[Vec<u8>], seed: u64, what: &str) {
    for (space, (expected, got)) in expected.iter().zip(got).enumerate() {
        if let Some(at) = expected.iter().zip(got).position(|(a, b)| a != b) {
            panic!("seed {seed:#x}: {what}: region {space} differs from byte {at} on");
        }
    }
}

#[test]
fn every_engine_answers_a_seeded_stream_alike_and_leaves_the_same_memory() {
    let seed = seed(0x0014_C0DE);
    let mut rigs = [
        ("software", software_rig()),
        ("model thread", thread_rig(Faults::default(), test_settings())),
        ("model process", process_rig(&[], test_settings())),
    ];
    let mut rng = Rng::new(seed);
    let mut operand = Vec::new();
    for index in 0..3000 {
        let spaces = &STREAMS[index % STREAMS.len()];
        let instruction = random_instruction(&mut rng, spaces, &mut operand);
        let expected = answer(&mut *rigs[0].1.engine, &instruction);
        for (name, rig) in &mut rigs[1..] {
            let got = answer(&mut *rig.engine, &instruction);
            assert_eq!(got, expected, "seed {seed:#x}, instruction {index}, {name}: {instruction:?}");
        }
    }
    let expected = memory(&mut *rigs[0].1.engine);
    for (name, rig) in &mut rigs[1..] {
        assert_same_memory(&expected, &memory(&mut *rig.engine), seed, name);
        let state = rig.state.as_ref().unwrap();
        assert!(state.on_fpga() && state.failovers() == 0, "{name} never failed over");
        // The device executed them: its memory holds the result, the host copies are untouched.
        for (space, (on_device, on_host)) in rig.device_and_host_bytes().into_iter().enumerate() {
            assert!(on_device == expected[space], "seed {seed:#x}: {name}: region {space} on the device");
            assert!(on_host.iter().all(|&byte| byte == 0), "{name}: region {space}'s host copy was written");
        }
    }
}

/// Runs a stream against `rig` and a software reference. The instruction during which the rig
/// fails over is the abandoned one: idempotent, it must be answered as the reference answers it;
/// otherwise `io_error`, and (the faults here all strike before the device fetches it) the
/// reference skips it. Returns the index of that instruction.
fn stream_through_a_failover(rig: &mut Rig, seed: u64, kill_model_at: Option<usize>) -> usize {
    let mut reference = software_rig();
    let state = Arc::clone(rig.state.as_ref().unwrap());
    let mut rng = Rng::new(seed);
    let mut operand = Vec::new();
    let mut failed_over_at = None;
    for index in 0..1500 {
        if Some(index) == kill_model_at {
            rig.model_process.as_mut().expect("a model process to kill").kill();
        }
        let spaces = &STREAMS[index % STREAMS.len()];
        let instruction = random_instruction(&mut rng, spaces, &mut operand);
        let before = state.on_fpga();
        let got = answer(&mut *rig.engine, &instruction);
        if before && !state.on_fpga() {
            failed_over_at = Some(index);
            if !instruction.is_idempotent() {
                assert_eq!(got, Err(Status::IoError), "seed {seed:#x}: abandoned non-idempotent {index}");
                continue;
            }
        }
        let expected = answer(&mut *reference.engine, &instruction);
        assert_eq!(got, expected, "seed {seed:#x}, instruction {index}: {instruction:?}");
    }
    let failed_over_at = failed_over_at.unwrap_or_else(|| panic!("seed {seed:#x}: the engine never failed over"));
    assert_eq!(state.failovers(), 1);
    assert!(!state.region_on_device(0) && !state.region_on_device(1));
    let expected = memory(&mut *reference.engine);
    assert_same_memory(&expected, &memory(&mut *rig.engine), seed, "after failover");
    // Served from the host copies now, which hold every acknowledged write.
    for (space, (_, on_host)) in rig.device_and_host_bytes().into_iter().enumerate() {
        assert!(on_host == expected[space], "seed {seed:#x}: region {space}'s host copy after failover");
    }
    failed_over_at
}

#[test]
fn a_stalled_completion_ring_fails_over_to_software_with_every_acknowledged_write_intact() {
    let seed = seed(0x057A_11ED);
    let mut rig = thread_rig(Faults { stall_at: Some(400), ..Faults::default() }, test_settings());
    let at = stream_through_a_failover(&mut rig, seed, None);
    assert!(at >= 400, "the device executed 400 descriptors before stalling, failed over at {at}");
}

#[test]
fn a_device_reset_fails_over_to_software_with_every_acknowledged_write_intact() {
    let seed = seed(0x0002_E5E7);
    let mut rig = thread_rig(Faults { reset_at: Some(300), ..Faults::default() }, test_settings());
    let at = stream_through_a_failover(&mut rig, seed, None);
    assert!(at >= 300, "failed over at {at}");
}

#[test]
fn a_killed_model_process_fails_over_to_software_with_every_acknowledged_write_intact() {
    let seed = seed(0x04B1_11ED);
    let mut rig = process_rig(&[], test_settings());
    let at = stream_through_a_failover(&mut rig, seed, Some(700));
    assert!(at >= 700, "failed over at {at}, before the model was killed");
}

#[test]
fn a_device_error_fails_one_instruction_without_failing_over() {
    let mut rig = thread_rig(Faults { error_at: Some(0), ..Faults::default() }, test_settings());
    let write = Instruction {
        opcode: Opcode::Write as u8,
        flags: 0,
        space: 0,
        offset: 64,
        length: 8,
        aux: 0,
        operand: &[7; 8],
    };
    assert_eq!(answer(&mut *rig.engine, &write), Err(Status::IoError));
    assert_eq!(answer(&mut *rig.engine, &write), Ok(Vec::new()));
    let state = rig.state.as_ref().unwrap();
    assert!(state.on_fpga() && state.failovers() == 0);
}

// Through the real target.

const BLOCK_BYTES: u32 = 512;
const NAMESPACE_BLOCKS: u64 = 256;

fn target_config(directory: &Path, engine: EngineChoice) -> Config {
    Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        metrics_listen: netdam_metrics::MetricsListen::Off,
        data_dir: Some(directory.to_path_buf()),
        pin_workers: false,
        lock_memory: false,
        engine,
        fpga_progress_deadline_ms: TEST_DEADLINE_MS,
        regions: region_configs(directory),
        namespaces: vec![NamespaceConfig {
            name: "disk".into(),
            backend: NamespaceBackend::File,
            path: directory.join("disk.img"),
            size: Some(ByteSize(NAMESPACE_BLOCKS * u64::from(BLOCK_BYTES))),
            block_size: BLOCK_BYTES,
        }],
        auth: netdam_target::AuthMode::None,
        ..Config::default()
    }
}

/// The next operation of a target-level stream: one of the engine stream's, or a block one.
fn random_op(rng: &mut Rng, index: usize, operand: &mut Vec<u8>) -> Op {
    if rng.chance(0.2) {
        let blocks = rng.below(8) as u32 + 1;
        let at = rng.below(NAMESPACE_BLOCKS + 4 - u64::from(blocks)); // sometimes out of range
        return match rng.below(5) {
            0 | 1 => {
                Op::block_write(0, at, BLOCK_BYTES, &rng.bytes(blocks as usize * BLOCK_BYTES as usize), rng.chance(0.5))
            }
            2 => Op::block_read(0, at, blocks),
            3 => Op::trim(0, at, blocks),
            _ => Op::write_zeroes(0, at, blocks),
        };
    }
    let instruction = random_instruction(rng, &STREAMS[index % STREAMS.len()], operand);
    Op {
        opcode: instruction.opcode,
        flags: instruction.flags,
        space: instruction.space,
        offset: instruction.offset,
        length: instruction.length,
        aux: instruction.aux,
        operand: instruction.operand.to_vec(),
    }
}

/// What a target answered to one op: each instruction's status and data, or the client's error.
fn call(client: &mut Client, op: &Op) -> Result<Vec<(Status, Vec<u8>)>, String> {
    client
        .call(std::slice::from_ref(op))
        .map(|reply| reply.result_iter().map(|result| (result.status, result.data.to_vec())).collect())
        .map_err(|error| error.to_string())
}

fn stat(client: &mut Client, name: &str) -> u64 {
    client.stat().unwrap().into_iter().find(|(key, _)| key == name).unwrap_or_else(|| panic!("STAT has {name}")).1
}

fn target_memory(client: &mut Client) -> Vec<Vec<u8>> {
    (0u16..3)
        .map(|space| {
            let mut bytes = vec![0u8; REGION_BYTES as usize];
            client.read(space, 0, &mut bytes).unwrap();
            bytes
        })
        .collect()
}

#[test]
fn the_target_answers_alike_on_software_and_on_the_model_process_then_keeps_serving_when_it_dies() {
    let seed = seed(0x007A_26E7);
    let software_dir = tempfile::tempdir().unwrap();
    let software = Target::start(&target_config(software_dir.path(), EngineChoice::Software)).unwrap();
    assert_eq!(software.engine_name(), "software");
    let fpga_dir = tempfile::tempdir().unwrap();
    let window = fpga_dir.path().join("window");
    // The device's SSD serves the target's namespace file: block instructions go to its NVMe
    // until the model dies, then to the target's own file.
    let disk = fpga_dir.path().join("disk.img");
    std::fs::File::create(&disk).unwrap().set_len(NAMESPACE_BLOCKS * u64::from(BLOCK_BYTES)).unwrap();
    let block_bytes = BLOCK_BYTES.to_string();
    let mut model = ModelProcess::start(
        &window,
        &["--namespace", disk.to_str().expect("a UTF-8 temporary path"), "--block-bytes", &block_bytes],
    );
    let fpga_config = Config {
        fpga_namespace: Some("disk".into()),
        ..target_config(fpga_dir.path(), EngineChoice::Fpga(Some(window.clone())))
    };
    let fpga = Target::start(&fpga_config).unwrap();
    assert_eq!(fpga.engine_name(), "fpga");
    assert!(fpga.engine_state().namespace_on_device(0), "the namespace is placed on the device's NVMe");
    assert!(
        fpga.engine_state().sleeps_on_interrupt(),
        "the target took the model's completion interrupt over the socket beside its window"
    );
    let mut expected_client = Client::connect(software.local_addr()).unwrap();
    let mut fpga_client = Client::connect(fpga.local_addr()).unwrap();
    assert_eq!(expected_client.info().hello.target_flags & TARGET_FLAG_FPGA, 0);
    assert_eq!(fpga_client.info().hello.target_flags & TARGET_FLAG_FPGA, TARGET_FLAG_FPGA);
    assert_eq!((stat(&mut fpga_client, "engine_fpga"), stat(&mut expected_client, "engine_fpga")), (1, 0));

    let mut rng = Rng::new(seed);
    let mut operand = Vec::new();
    let kill_at = 600;
    let mut abandoned = None;
    for index in 0..1200 {
        if index == kill_at {
            let on_device = stat(&mut fpga_client, "engine_fpga_block_instructions");
            assert!(on_device > 0, "seed {seed:#x}: the device's NVMe answered no block instruction");
            println!("{on_device} block instructions answered by the device's NVMe before the model is killed");
            model.kill();
        }
        let op = random_op(&mut rng, index, &mut operand);
        let got = call(&mut fpga_client, &op);
        if index >= kill_at && abandoned.is_none() && fpga.engine_state().failovers() == 1 {
            abandoned = Some(index);
            if !op.is_idempotent() {
                assert_eq!(got, Ok(vec![(Status::IoError, Vec::new())]), "seed {seed:#x}: abandoned op {index}");
                continue;
            }
        }
        let expected = call(&mut expected_client, &op);
        assert_eq!(got, expected, "seed {seed:#x}, op {index}: {op:?}");
    }
    assert!(abandoned.is_some(), "seed {seed:#x}: the target never failed over after the model was killed");
    assert_same_memory(&target_memory(&mut expected_client), &target_memory(&mut fpga_client), seed, "target");
    // Namespaces: the same bytes in each target's file.
    let mut expected_blocks = vec![0u8; (NAMESPACE_BLOCKS * u64::from(BLOCK_BYTES)) as usize];
    let mut got_blocks = expected_blocks.clone();
    let namespace = expected_client.namespace("disk").unwrap().clone();
    expected_client.block_read(&namespace, 0, &mut expected_blocks).unwrap();
    fpga_client.block_read(&namespace, 0, &mut got_blocks).unwrap();
    assert!(expected_blocks == got_blocks, "seed {seed:#x}: namespace contents differ");
    // The engine in use is visible: STAT, and HELLO's flags for a new session.
    assert_eq!((stat(&mut fpga_client, "engine_fpga"), stat(&mut fpga_client, "engine_failovers")), (0, 1));
    let late = Client::connect(fpga.local_addr()).unwrap();
    assert_eq!(late.info().hello.target_flags, 0, "after failover the target executes on software");
    assert!(!fpga.engine_state().namespace_on_device(0), "after failover the target's file serves the namespace");
}

#[test]
fn an_fpga_window_that_cannot_be_mapped_stops_the_start_naming_it_and_auto_falls_back() {
    let directory = tempfile::tempdir().unwrap();
    let missing = directory.path().join("no-window");
    let error = Target::start(&target_config(directory.path(), EngineChoice::Fpga(Some(missing.clone()))))
        .expect_err("no window, no start")
        .to_string();
    assert!(error.contains(&missing.display().to_string()), "{error}");
    // A file that is no device: refused by name too.
    let not_a_device = directory.path().join("zeroes");
    std::fs::write(&not_a_device, vec![0u8; 8192]).unwrap();
    let error = Target::start(&target_config(directory.path(), EngineChoice::Fpga(Some(not_a_device.clone()))))
        .expect_err("no device, no start")
        .to_string();
    assert!(error.contains("zeroes") && error.contains("DEVICE_ID"), "{error}");
    // auto with a model window configured finds it when there is no card.
    let window = directory.path().join("window");
    let _model = ModelProcess::start(&window, &[]);
    let config = Config { fpga_window: Some(window), ..target_config(directory.path(), EngineChoice::Auto) };
    let target = Target::start(&config).unwrap();
    assert_eq!(target.engine_name(), "fpga");
    drop(target);
    // auto with a window that is not there: software.
    let config = Config { fpga_window: Some(missing), ..target_config(directory.path(), EngineChoice::Auto) };
    assert_eq!(Target::start(&config).unwrap().engine_name(), "software");
}

#[test]
fn several_workers_share_the_device_and_its_atomics_stay_atomic() {
    let directory = tempfile::tempdir().unwrap();
    let window = directory.path().join("window");
    let _model = ModelProcess::start(&window, &[]);
    let config = Config {
        workers: 2,
        extensions: vec!["reduce".to_string()],
        ..target_config(directory.path(), EngineChoice::Fpga(Some(window)))
    };
    let target = Target::start(&config).unwrap();
    assert!(target.engine_state().region_on_device(0));
    let addr = target.local_addr();
    // The kernel spreads the clients over the workers by address and port (SO_REUSEPORT).
    let threads: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                let mut client = Client::connect(addr).unwrap();
                let mut seen = Vec::new();
                for _ in 0..250 {
                    seen.push(client.fetch_add(0, 64, 1).unwrap());
                }
                seen
            })
        })
        .collect();
    let mut seen: Vec<u64> = threads.into_iter().flat_map(|thread| thread.join().unwrap()).collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..1000).collect::<Vec<u64>>(), "every FETCH_ADD saw a distinct old value");
    let mut client = Client::connect(addr).unwrap();
    assert_eq!(client.fetch_add(0, 64, 0).unwrap(), 1000);
    // Extension handlers read host memory: refused on a region the device holds, served on
    // a host one.
    let refused =
        client.reduce(0, 0, 64, netdam_isa::LaneType::F32, netdam_isa::extension::reduce::ReduceOp::Sum).unwrap_err();
    assert!(refused.to_string().contains("not_supported"), "{refused}");
    client.reduce(2, 0, 64, netdam_isa::LaneType::F32, netdam_isa::extension::reduce::ReduceOp::Sum).unwrap();
}

/// CPU time the calling thread has used.
fn thread_cpu_time() -> std::time::Duration {
    // SAFETY: rusage is plain data; getrusage fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    let micros = |time: libc::timeval| time.tv_sec as u64 * 1_000_000 + time.tv_usec as u64;
    std::time::Duration::from_micros(micros(usage.ru_utime) + micros(usage.ru_stime))
}

/// A device whose answers take milliseconds (each pipeline stage 2 ms): an engine allowed to
/// sleep arms the completion interrupt and sleeps on it, using a fraction of the wall time in
/// CPU, and every answer is right; one that may not (a busy-polling worker's) spins and never
/// sleeps.
#[test]
fn a_slow_device_answer_is_slept_through_on_the_completion_interrupt() {
    for sleep in [true, false] {
        let directory = tempfile::tempdir().unwrap();
        let config = ModelConfig { stage_latency: std::time::Duration::from_millis(2), ..ModelConfig::default() };
        let window: Arc<dyn Window> =
            Arc::new(FileWindow::create(&directory.path().join("window"), config.window_bytes() as usize).unwrap());
        let socket = netdam_fpga::interrupt::socket_path(&directory.path().join("window"));
        let line = netdam_fpga::interrupt::serve(&socket).unwrap();
        let _model = model::spawn_with(Arc::clone(&window), config, Some(Arc::clone(&line))).unwrap();
        let link = netdam_fpga::interrupt::request(&socket).unwrap();
        let regions = Arc::new(RegionTable::open(&region_configs(directory.path()), directory.path()).unwrap());
        let settings =
            FpgaSettings { sleep_after: sleep.then_some(std::time::Duration::from_micros(20)), ..test_settings() };
        let (mut engine, state) = FpgaEngine::attach(Arc::clone(&window), regions, &[], Some(link), settings).unwrap();
        assert_eq!((state.on_fpga(), state.sleeps_on_interrupt()), (true, sleep));
        if sleep {
            assert_eq!(line.listeners(), 1, "the engine holds its link");
        }
        let wall = std::time::Instant::now();
        let cpu = thread_cpu_time();
        for index in 0..8u64 {
            let value = 0x1111_0000 + index;
            let write = Instruction {
                opcode: Opcode::Write as u8,
                flags: 0,
                space: 0,
                offset: index * 8,
                length: 8,
                aux: 0,
                operand: &value.to_le_bytes(),
            };
            assert_eq!(answer(&mut engine, &write), Ok(Vec::new()));
            let read = Instruction { opcode: Opcode::Read as u8, operand: &[], ..write };
            assert_eq!(answer(&mut engine, &read), Ok(value.to_le_bytes().to_vec()), "sleep {sleep}: read {index}");
        }
        let (wall, cpu) = (wall.elapsed(), thread_cpu_time() - cpu);
        let (sleeps, wakeups) = engine.interrupt_waits();
        println!(
            "sleep {sleep}: 16 answers in {wall:?}, {cpu:?} of CPU, {sleeps} sleeps, {wakeups} woken by the interrupt"
        );
        assert_eq!(state.failovers(), 0);
        if sleep {
            // 16 answers, each after a 2 ms stage: most sleeps end on the interrupt, not on
            // the 1 ms slice (a model that never raised it would wake none).
            assert!(wakeups >= 8, "the interrupt woke the engine {wakeups} times in {sleeps} sleeps");
            assert!(cpu < wall / 2, "sleeping, the thread used {cpu:?} of CPU in {wall:?}");
        } else {
            assert_eq!((sleeps, wakeups), (0, 0), "a busy worker's engine spins");
        }
    }
}

/// A namespace on the device's NVMe when the device fails mid-instruction: if the device took
/// the reset, the target's file serves the namespace from then on (`None`: dispatch's own
/// device); if it ignores the reset and keeps running, it may still write the file, so the
/// namespace is fenced: every block instruction answered `io_error` until a restart.
#[test]
fn a_device_that_keeps_running_after_a_failed_reset_fences_its_namespace() {
    for deaf in [false, true] {
        let directory = tempfile::tempdir().unwrap();
        let disk = directory.path().join("disk.img");
        std::fs::File::create(&disk).unwrap().set_len(NAMESPACE_BLOCKS * u64::from(BLOCK_BYTES)).unwrap();
        let config = ModelConfig {
            namespace: Some(model::NamespaceBacking { path: disk, block_bytes: BLOCK_BYTES }),
            faults: Faults { stall_at: Some(3), deaf_to_reset: deaf, ..Faults::default() },
            ..ModelConfig::default()
        };
        let window: Arc<dyn Window> =
            Arc::new(FileWindow::create(&directory.path().join("window"), config.window_bytes() as usize).unwrap());
        let _model = model::spawn(Arc::clone(&window), config).unwrap();
        let regions = Arc::new(RegionTable::open(&region_configs(directory.path()), directory.path()).unwrap());
        let namespace = DeviceNamespace { space: 0, block_bytes: BLOCK_BYTES, blocks: NAMESPACE_BLOCKS };
        let settings = FpgaSettings { progress_deadline: Duration::from_millis(300), ..FpgaSettings::default() };
        let (mut engine, state) =
            FpgaEngine::attach(Arc::clone(&window), regions, &[namespace], None, settings).unwrap();
        assert!(state.namespace_on_device(0));
        let data = vec![0xC3u8; BLOCK_BYTES as usize];
        let write = |block: u64| Instruction {
            opcode: Opcode::BlockWrite as u8,
            flags: 0,
            space: 0,
            offset: block,
            length: 1,
            aux: 0,
            operand: &data,
        };
        let mut out = vec![0u8; 4096];
        // Descriptors 0 to 2 complete on the device; the fourth stalls it.
        for block in 0..3 {
            assert_eq!(engine.execute_block(&write(block), &mut out[..0]), Some(Ok(0)), "deaf {deaf}: block {block}");
        }
        let stalled = engine.execute_block(&write(3), &mut out[..0]);
        assert_eq!(state.failovers(), 1, "deaf {deaf}: the stall fails the device over");
        assert!(!state.namespace_on_device(0));
        if deaf {
            assert!(state.namespace_fenced(0), "a device still running after a failed reset fences the namespace");
            assert_eq!(stalled, Some(Err(Status::IoError)));
            assert_eq!(engine.execute_block(&write(4), &mut out[..0]), Some(Err(Status::IoError)), "and stays fenced");
        } else {
            assert!(!state.namespace_fenced(0));
            assert_eq!(stalled, None, "the reset took: the target's file serves it again");
            assert_eq!(engine.execute_block(&write(4), &mut out[..0]), None);
        }
    }
}
