//! The host driver against the device model: in-process (a thread) and as a separate process
//! over a shared file. Answers and memory contents are compared with the ISA's reference
//! semantics (what the software engine executes) on a copy of the same memory.
//!
//! No timing assertions: every wait is a bounded poll with a generous timeout, and the wedge
//! deadline runs on a clock the test advances only while it polls.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use netdam_fpga::conformance::{random_instruction, StreamSpaces};
use netdam_fpga::driver::{Completion, Driver, DriverConfig, DriverError, SubmitError};
use netdam_fpga::model::{self, Faults, ModelConfig};
use netdam_fpga::registers::{self as reg, NamespaceEntry, RegionEntry};
use netdam_fpga::window::{FileWindow, Window};
use netdam_isa::memory::SharedMemory;
use netdam_isa::rng::Rng;
use netdam_isa::semantics::{self, AddressSpaces};
use netdam_isa::wire::Instruction;
use netdam_isa::{Duration, Instant, Opcode, Status};

/// Longest any single wait may take before the test gives up (a loaded machine is slow, not
/// this slow).
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);
const ANSWER_CAPACITY: u32 = 4096;
const REGION_A: u16 = 7;
const REGION_B: u16 = 9;
const REGION_BYTES: u64 = 64 * 1024;

fn regions() -> Vec<RegionEntry> {
    vec![
        RegionEntry { space: REGION_A, offset: 0, bytes: REGION_BYTES },
        RegionEntry { space: REGION_B, offset: REGION_BYTES, bytes: REGION_BYTES },
    ]
}

/// Wedge deadline of the tests that do not want a wedge: far beyond any scheduling delay of a
/// loaded machine.
const GENEROUS_DEADLINE: Duration = Duration::from_millis(30_000);
/// Wedge deadline of the stall test: the stall is permanent, so a short one cannot misfire.
const SHORT_DEADLINE: Duration = Duration::from_millis(200);

fn driver_config(ring_entries: u32) -> DriverConfig {
    DriverConfig {
        ring_entries,
        slot_bytes: 16 * 1024,
        progress_deadline: GENEROUS_DEADLINE,
        regions: regions(),
        namespaces: Vec::new(),
    }
}

struct Clock(std::time::Instant);

impl Clock {
    fn now(&self) -> Instant {
        Instant::from_nanos(self.0.elapsed().as_nanos() as u64)
    }
}

struct Rig {
    _directory: tempfile::TempDir,
    window: Arc<dyn Window>,
    model: Option<model::ModelThread>,
    driver: Driver,
    clock: Clock,
}

fn rig(ring_entries: u32, faults: Faults) -> Rig {
    rig_with(driver_config(ring_entries), faults)
}

fn rig_with(driver_config: DriverConfig, faults: Faults) -> Rig {
    let directory = tempfile::tempdir().unwrap();
    let config = ModelConfig { faults, ..ModelConfig::default() };
    let window: Arc<dyn Window> =
        Arc::new(FileWindow::create(&directory.path().join("window"), config.window_bytes() as usize).unwrap());
    let model = model::spawn(Arc::clone(&window), config).unwrap();
    let driver = Driver::attach(Arc::clone(&window), &driver_config, PATIENCE).unwrap();
    Rig { _directory: directory, window, model: Some(model), driver, clock: Clock(std::time::Instant::now()) }
}

/// Polls until one completion arrives or the driver fails.
fn reap(driver: &mut Driver, clock: &Clock, answer: &mut [u8]) -> Result<Completion, DriverError> {
    let started = std::time::Instant::now();
    loop {
        if let Some(completion) = driver.poll_completion(clock.now(), answer)? {
            return Ok(completion);
        }
        assert!(started.elapsed() < PATIENCE, "no completion and no failure within {PATIENCE:?}");
        std::thread::sleep(std::time::Duration::from_micros(20));
    }
}

fn run(rig: &mut Rig, instruction: &Instruction<'_>) -> Result<Vec<u8>, Status> {
    let tag = rig.driver.submit(rig.clock.now(), instruction, ANSWER_CAPACITY).unwrap();
    let mut answer = vec![0u8; ANSWER_CAPACITY as usize];
    let completion = reap(&mut rig.driver, &rig.clock, &mut answer).unwrap();
    assert_eq!(completion.tag, tag);
    completion.result.map(|len| answer[..len].to_vec())
}

/// The reference: two regions in ordinary memory, executed with the ISA's semantics.
struct Reference {
    _a: Vec<u64>,
    _b: Vec<u64>,
    /// Taken once from the vectors' unique borrows; the vectors are not touched again.
    a: *mut u8,
    b: *mut u8,
}

impl AddressSpaces for Reference {
    fn memory(&self, space: u16) -> Option<SharedMemory<'_>> {
        let base = match space {
            REGION_A => self.a,
            REGION_B => self.b,
            _ => return None,
        };
        // SAFETY: each pointer covers REGION_BYTES of a live, 8-byte aligned vector owned by
        // `self`, reached only through these views.
        Some(unsafe { SharedMemory::from_raw(base, REGION_BYTES as usize) })
    }
}

impl Reference {
    fn new() -> Reference {
        let mut a = vec![0u64; REGION_BYTES as usize / 8];
        let mut b = vec![0u64; REGION_BYTES as usize / 8];
        let (a_base, b_base) = (a.as_mut_ptr().cast::<u8>(), b.as_mut_ptr().cast::<u8>());
        Reference { _a: a, _b: b, a: a_base, b: b_base }
    }

    fn run(&self, instruction: &Instruction<'_>) -> Result<Vec<u8>, Status> {
        let mut answer = vec![0u8; ANSWER_CAPACITY as usize];
        semantics::execute(instruction, self, &mut answer).map(|outcome| answer[..outcome.data_len].to_vec())
    }

    fn bytes(&self, space: u16) -> Vec<u8> {
        let memory = self.memory(space).unwrap();
        let mut bytes = vec![0u8; memory.len()];
        memory.read(0, &mut bytes);
        bytes
    }
}

fn device_bytes(window: &dyn Window, region: &RegionEntry) -> Vec<u8> {
    let base = window.u64_at(reg::DEVICE_MEMORY_OFFSET).load(Ordering::Acquire) + region.offset;
    let mut bytes = vec![0u8; region.bytes as usize];
    window.read_bytes(base, &mut bytes).unwrap();
    bytes
}

const SPACES: StreamSpaces = StreamSpaces { first: REGION_A, second: REGION_B, bytes: REGION_BYTES };

#[test]
fn answers_and_memory_match_the_reference_semantics() {
    let seed = 0x5EED_F96A;
    println!("SEED={seed:#x}");
    let mut rig = rig(8, Faults::default());
    let reference = Reference::new();
    let mut rng = Rng::new(seed);
    let mut operands: Vec<Vec<u8>> = vec![Vec::new(); 8];
    let mut answer = vec![0u8; ANSWER_CAPACITY as usize];
    type Expected = (u64, Result<Vec<u8>, Status>);
    let mut expected: Vec<Expected> = Vec::new();
    let (mut succeeded, mut failed) = (0, 0);
    for _batch in 0..150 {
        // Up to 8 in flight at once; the device executes in ring order, so the reference runs
        // them in submission order.
        let batch = rng.below(8) as usize + 1;
        expected.clear();
        for operand in operands.iter_mut().take(batch) {
            let instruction = random_instruction(&mut rng, &SPACES, operand);
            let tag = rig.driver.submit(rig.clock.now(), &instruction, ANSWER_CAPACITY).unwrap();
            expected.push((tag, reference.run(&instruction)));
        }
        for (tag, want) in &expected {
            let completion = reap(&mut rig.driver, &rig.clock, &mut answer).unwrap();
            assert_eq!(completion.tag, *tag, "completions come back in ring order");
            let got = completion.result.map(|len| answer[..len].to_vec());
            assert_eq!(&got, want, "tag {tag}");
            if got.is_ok() {
                succeeded += 1;
            } else {
                failed += 1;
            }
        }
    }
    for region in regions() {
        assert!(
            device_bytes(&*rig.window, &region) == reference.bytes(region.space),
            "region {} differs",
            region.space
        );
    }
    assert_eq!(rig.driver.in_flight(), 0);
    assert!(succeeded > 300 && failed > 20, "the stream exercises both: {succeeded} ok, {failed} failed");
}

#[test]
fn rings_wrap_around_many_times_without_losing_or_repeating() {
    let mut rig = rig(4, Faults::default());
    let add_one = 1u64.to_le_bytes();
    let instruction = Instruction {
        opcode: Opcode::FetchAdd as u8,
        flags: 0,
        space: REGION_A,
        offset: 64,
        length: 8,
        aux: 0,
        operand: &add_one,
    };
    let mut answer = vec![0u8; ANSWER_CAPACITY as usize];
    let mut next_expected_tag = 0u64;
    let mut submitted = 0u64;
    let total = 1000u64;
    while next_expected_tag < total {
        // Keep the ring as full as it goes, then reap one.
        while submitted < total {
            match rig.driver.submit(rig.clock.now(), &instruction, 8) {
                Ok(tag) => {
                    assert_eq!(tag, submitted);
                    submitted += 1;
                }
                Err(SubmitError::Full) => break,
                Err(error) => panic!("{error}"),
            }
        }
        let completion = reap(&mut rig.driver, &rig.clock, &mut answer).unwrap();
        assert_eq!(completion.tag, next_expected_tag);
        assert_eq!(completion.result, Ok(8));
        assert_eq!(u64::from_le_bytes(answer[..8].try_into().unwrap()), next_expected_tag, "each add seen once");
        next_expected_tag += 1;
    }
    assert_eq!(
        run(&mut rig, &Instruction { opcode: Opcode::Read as u8, length: 8, operand: &[], ..instruction }),
        Ok(total.to_le_bytes().to_vec())
    );
}

#[test]
fn a_full_ring_pushes_back_until_a_completion_is_reaped() {
    let mut rig = rig(4, Faults::default());
    let read = Instruction {
        opcode: Opcode::Read as u8,
        flags: 0,
        space: REGION_A,
        offset: 0,
        length: 8,
        aux: 0,
        operand: &[],
    };
    for expected_tag in 0..4 {
        assert_eq!(rig.driver.submit(rig.clock.now(), &read, 8), Ok(expected_tag));
    }
    // However fast the device is, four unreaped completions hold all four slots.
    assert_eq!(rig.driver.submit(rig.clock.now(), &read, 8), Err(SubmitError::Full));
    assert_eq!(rig.driver.in_flight(), 4);
    let mut answer = [0u8; 8];
    assert_eq!(reap(&mut rig.driver, &rig.clock, &mut answer).unwrap().tag, 0);
    assert_eq!(rig.driver.submit(rig.clock.now(), &read, 8), Ok(4));
    assert_eq!(rig.driver.submit(rig.clock.now(), &read, 8), Err(SubmitError::Full));
    let too_big = vec![0u8; 16 * 1024 + 1];
    let write = Instruction { opcode: Opcode::Write as u8, length: too_big.len() as u32, operand: &too_big, ..read };
    assert_eq!(rig.driver.submit(rig.clock.now(), &write, 0), Err(SubmitError::TooLarge));
}

#[test]
fn an_injected_device_error_is_reported_for_that_instruction_only() {
    let mut rig = rig(8, Faults { error_at: Some(2), ..Faults::default() });
    let value = 0xABCD_u64.to_le_bytes();
    let write = Instruction {
        opcode: Opcode::Write as u8,
        flags: 0,
        space: REGION_B,
        offset: 8,
        length: 8,
        aux: 0,
        operand: &value,
    };
    let read = Instruction { opcode: Opcode::Read as u8, operand: &[], ..write };
    assert_eq!(run(&mut rig, &write), Ok(vec![]));
    assert_eq!(run(&mut rig, &read), Ok(value.to_vec()));
    assert_eq!(run(&mut rig, &read), Err(Status::IoError));
    assert_eq!(run(&mut rig, &read), Ok(value.to_vec()), "the device keeps working after a per-instruction error");
}

#[test]
fn a_stalled_device_is_reported_wedged_and_its_work_abandoned() {
    let config = DriverConfig { progress_deadline: SHORT_DEADLINE, ..driver_config(8) };
    let mut rig = rig_with(config, Faults { stall_at: Some(1), ..Faults::default() });
    let read = Instruction {
        opcode: Opcode::Read as u8,
        flags: 0,
        space: REGION_A,
        offset: 0,
        length: 8,
        aux: 0,
        operand: &[],
    };
    assert_eq!(run(&mut rig, &read), Ok(vec![0; 8]));
    let stuck = rig.driver.submit(rig.clock.now(), &read, 8).unwrap();
    let mut answer = [0u8; 8];
    match reap(&mut rig.driver, &rig.clock, &mut answer) {
        Err(DriverError::Wedged { in_flight: 1, .. }) => {}
        other => panic!("expected wedged, got {other:?}"),
    }
    assert_eq!(rig.driver.abandoned().collect::<Vec<_>>(), vec![stuck]);
    assert!(matches!(
        rig.driver.submit(rig.clock.now(), &read, 8),
        Err(SubmitError::Device(DriverError::Wedged { .. }))
    ));
}

#[test]
fn a_device_reset_is_detected_and_memory_survives_a_reattach() {
    let mut rig = rig(8, Faults { reset_at: Some(2), ..Faults::default() });
    let value = 0x1122_3344_u64.to_le_bytes();
    let write = Instruction {
        opcode: Opcode::Write as u8,
        flags: 0,
        space: REGION_A,
        offset: 512,
        length: 8,
        aux: 0,
        operand: &value,
    };
    let read = Instruction { opcode: Opcode::Read as u8, operand: &[], ..write };
    assert_eq!(run(&mut rig, &write), Ok(vec![]));
    assert_eq!(run(&mut rig, &read), Ok(value.to_vec()));
    let lost = rig.driver.submit(rig.clock.now(), &read, 8).unwrap();
    let mut answer = [0u8; 8];
    match reap(&mut rig.driver, &rig.clock, &mut answer) {
        Err(DriverError::Reset { attached: 1, now: 2 }) => {}
        other => panic!("expected a reset, got {other:?}"),
    }
    assert_eq!(rig.driver.abandoned().collect::<Vec<_>>(), vec![lost]);

    let mut driver = Driver::attach(Arc::clone(&rig.window), &driver_config(8), PATIENCE).unwrap();
    let tag = driver.submit(rig.clock.now(), &read, 8).unwrap();
    let completion = reap(&mut driver, &rig.clock, &mut answer).unwrap();
    assert_eq!((completion.tag, completion.result), (tag, Ok(8)));
    assert_eq!(answer, value, "on-board memory is kept across a reset");
}

/// A rig whose device is stopped after attach, with one READ in flight: the test owns the
/// completion ring. Returns the tag and the ring's address.
fn stopped_rig_with_one_in_flight() -> (Rig, u64, u64) {
    let mut rig = rig(4, Faults::default());
    drop(rig.model.take());
    let read = Instruction {
        opcode: Opcode::Read as u8,
        flags: 0,
        space: REGION_A,
        offset: 0,
        length: 8,
        aux: 0,
        operand: &[],
    };
    let tag = rig.driver.submit(rig.clock.now(), &read, 8).unwrap();
    let completion_base = rig.window.u64_at(reg::COMPLETION_RING_BASE).load(Ordering::Acquire);
    (rig, tag, completion_base)
}

/// Posts a completion the way the device does: tag, then the status word with release.
fn post(window: &dyn Window, completion_base: u64, index: u64, entry: netdam_fpga::CompletionEntry) {
    let at = completion_base + index * 16;
    window.u64_at(at).store(entry.tag, Ordering::Relaxed);
    window.u64_at(at + 8).store(entry.status_word(), Ordering::Release);
}

#[test]
fn out_of_order_completions_are_reaped_once_each_and_a_repeat_is_refused() {
    let (mut rig, first, completion_base) = stopped_rig_with_one_in_flight();
    let read = Instruction {
        opcode: Opcode::Read as u8,
        flags: 0,
        space: REGION_A,
        offset: 0,
        length: 8,
        aux: 0,
        operand: &[],
    };
    let second = rig.driver.submit(rig.clock.now(), &read, 8).unwrap();
    let third = rig.driver.submit(rig.clock.now(), &read, 8).unwrap();
    let entry =
        |tag, answer_len| netdam_fpga::CompletionEntry { tag, answer_len, status: 0, flags: 1, submission_head: 3 };
    // The device finishes the third first, then the first, then the second.
    post(&*rig.window, completion_base, 0, entry(third, 0));
    post(&*rig.window, completion_base, 1, entry(first, 8));
    post(&*rig.window, completion_base, 2, entry(second, 0));
    let mut answer = [0u8; 8];
    let mut reaped = Vec::new();
    for _ in 0..3 {
        reaped.push(rig.driver.poll_completion(rig.clock.now(), &mut answer).unwrap().unwrap().tag);
    }
    assert_eq!(reaped, vec![third, first, second]);
    assert_eq!(rig.driver.in_flight(), 0);
    assert_eq!(rig.driver.poll_completion(rig.clock.now(), &mut answer), Ok(None));
    // A fourth submission reuses slot 3; the device then repeats the first completion.
    let fourth = rig.driver.submit(rig.clock.now(), &read, 8).unwrap();
    post(&*rig.window, completion_base, 3, entry(first, 0));
    assert_eq!(
        rig.driver.poll_completion(rig.clock.now(), &mut answer),
        Err(DriverError::Protocol { reason: "completion for a tag not in flight" })
    );
    assert_eq!(rig.driver.abandoned().collect::<Vec<_>>(), vec![fourth]);
}

#[test]
fn a_host_doorbell_overrun_makes_the_device_fatal() {
    let mut rig = rig(4, Faults::default());
    // A host bug: the tail more than a ring ahead of the head.
    rig.window.u32_at(reg::SUBMISSION_TAIL).store(100, Ordering::Release);
    let mut answer = [0u8; 8];
    let started = std::time::Instant::now();
    let error = loop {
        match rig.driver.poll_completion(rig.clock.now(), &mut answer) {
            Err(error) => break error,
            Ok(_) => assert!(started.elapsed() < PATIENCE, "the device did not notice"),
        }
        std::thread::sleep(std::time::Duration::from_micros(50));
    };
    assert_eq!(error, DriverError::Fatal { error_code: reg::ERROR_DOORBELL_OVERRUN });
}

#[test]
fn garbage_in_the_completion_ring_fails_the_driver_without_panicking() {
    fn good(tag: u64) -> netdam_fpga::CompletionEntry {
        netdam_fpga::CompletionEntry { tag, answer_len: 8, status: 0, flags: 1, submission_head: 1 }
    }
    type Garbage = fn(u64) -> (u64, u64);
    let cases: [(&str, Garbage); 5] = [
        ("answer longer than its capacity", |tag| {
            (tag, netdam_fpga::CompletionEntry { answer_len: 4096, ..good(tag) }.status_word())
        }),
        ("tag never submitted", |tag| (tag + 1000, good(tag).status_word())),
        ("unknown status code", |tag| (tag, netdam_fpga::CompletionEntry { status: 0xEE, ..good(tag) }.status_word())),
        ("reserved flag", |tag| (tag, netdam_fpga::CompletionEntry { flags: 0xFF, ..good(tag) }.status_word())),
        ("all ones", |_| (u64::MAX, u64::MAX)),
    ];
    for (name, garbage) in cases {
        let (mut rig, tag, completion_base) = stopped_rig_with_one_in_flight();
        let (stored_tag, status_word) = garbage(tag);
        rig.window.u64_at(completion_base).store(stored_tag, Ordering::Relaxed);
        rig.window.u64_at(completion_base + 8).store(status_word, Ordering::Release);
        let mut answer = [0u8; 8];
        let result = rig.driver.poll_completion(rig.clock.now(), &mut answer);
        assert!(matches!(result, Err(DriverError::Protocol { .. })), "{name}: {result:?}");
        assert_eq!(rig.driver.abandoned().collect::<Vec<_>>(), vec![tag], "{name}");
        assert_eq!(rig.driver.poll_completion(rig.clock.now(), &mut answer), result, "{name}: the failure sticks");
    }
    // And a well-formed completion written the same way is accepted: the cases above fail for
    // their garbage, not for the way the test writes the ring.
    let (mut rig, tag, completion_base) = stopped_rig_with_one_in_flight();
    rig.window.u64_at(completion_base).store(tag, Ordering::Relaxed);
    rig.window.u64_at(completion_base + 8).store(good(tag).status_word(), Ordering::Release);
    let mut answer = [0u8; 8];
    assert_eq!(rig.driver.poll_completion(rig.clock.now(), &mut answer), Ok(Some(Completion { tag, result: Ok(8) })));
}

#[test]
fn attach_reports_a_region_table_the_device_refuses() {
    let directory = tempfile::tempdir().unwrap();
    let config = ModelConfig::default();
    let window: Arc<dyn Window> =
        Arc::new(FileWindow::create(&directory.path().join("window"), config.window_bytes() as usize).unwrap());
    let _model = model::spawn(Arc::clone(&window), config.clone()).unwrap();
    let mut bad = driver_config(4);
    bad.regions.push(RegionEntry { space: 1, offset: 0, bytes: config.device_memory_bytes + 8 });
    assert_eq!(
        Driver::attach(Arc::clone(&window), &bad, PATIENCE).unwrap_err(),
        DriverError::Fatal { error_code: reg::ERROR_BAD_REGION_TABLE }
    );
    // A reset at the next attach clears FATAL.
    assert!(Driver::attach(window, &driver_config(4), PATIENCE).is_ok());
}

/// The model as a separate process, killed when the test ends (even by a panic).
struct ModelProcess(std::process::Child);

impl Drop for ModelProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_model_as_a_separate_process_serves_the_same_answers() {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("window");
    let namespace_file = directory.path().join("namespace");
    std::fs::File::create(&namespace_file).unwrap().set_len(1 << 20).unwrap();
    let mut process = ModelProcess(
        std::process::Command::new(env!("CARGO_BIN_EXE_netdam-fpga-model"))
            .arg("--window")
            .arg(&path)
            .arg("--namespace")
            .arg(&namespace_file)
            .arg("--block-bytes")
            .arg("4096")
            .arg("--stage-latency-ns")
            .arg("1000")
            .spawn()
            .unwrap(),
    );
    // The model renames the window into place once it is powered on.
    let started = std::time::Instant::now();
    while !path.exists() {
        assert!(process.0.try_wait().unwrap().is_none(), "the model exited early");
        assert!(started.elapsed() < PATIENCE, "the model did not create its window");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let window: Arc<dyn Window> = Arc::new(FileWindow::open(&path).unwrap());
    let namespace = NamespaceEntry { space: 3, lba_shift: 12, nsid: model::SSD_NSID, blocks: 256 };
    let config = DriverConfig { namespaces: vec![namespace], ..driver_config(16) };
    let driver = Driver::attach(Arc::clone(&window), &config, PATIENCE).unwrap();
    let mut rig = Rig { _directory: directory, window, model: None, driver, clock: Clock(std::time::Instant::now()) };
    let reference = Reference::new();
    let mut rng = Rng::new(0x0DD_BA11);
    let mut operand = Vec::new();
    for _ in 0..300 {
        let instruction = random_instruction(&mut rng, &SPACES, &mut operand);
        assert_eq!(run(&mut rig, &instruction), reference.run(&instruction), "{instruction:?}");
    }
    for region in regions() {
        assert!(
            device_bytes(&*rig.window, &region) == reference.bytes(region.space),
            "region {} differs",
            region.space
        );
    }
    // A block write and read through the process's NVMe controller, into the namespace file.
    let blocks: Vec<u8> = (0..8192u32).map(|index| (index % 251) as u8).collect();
    let write = Instruction {
        opcode: Opcode::BlockWrite as u8,
        flags: 0x01,
        space: 3,
        offset: 5,
        length: 2,
        aux: 0,
        operand: &blocks,
    };
    assert_eq!(run(&mut rig, &write), Ok(vec![]));
    // One block per read: the test's answer room is 4 KiB.
    let read = Instruction { opcode: Opcode::BlockRead as u8, flags: 0, length: 1, operand: &[], ..write };
    assert!(run(&mut rig, &read) == Ok(blocks[..4096].to_vec()));
    assert!(run(&mut rig, &Instruction { offset: 6, ..read }) == Ok(blocks[4096..].to_vec()));
    assert!(std::fs::read(&namespace_file).unwrap()[5 * 4096..7 * 4096] == blocks[..]);
    assert!(process.0.try_wait().unwrap().is_none(), "the model is still running");

    // Removing the window stops it.
    std::fs::remove_file(&path).unwrap();
    let removed = std::time::Instant::now();
    while process.0.try_wait().unwrap().is_none() {
        assert!(removed.elapsed() < PATIENCE, "the model kept running without its window");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
