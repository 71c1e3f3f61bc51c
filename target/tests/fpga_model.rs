//! The software engine and the FPGA device model (through the host driver, over a shared
//! window) answer the same seeded instruction stream identically and leave the same bytes in
//! memory. The driver-level comparison; `fpga_engine.rs` runs the conformance suite across the
//! target's engines.

use std::sync::Arc;

use netdam_fpga::conformance::{random_instruction, StreamSpaces, ANSWER_BYTES_MAX};
use netdam_fpga::driver::{Driver, DriverConfig};
use netdam_fpga::model::{self, ModelConfig};
use netdam_fpga::registers::RegionEntry;
use netdam_fpga::window::{FileWindow, Window};
use netdam_isa::engine::Engine;
use netdam_isa::rng::Rng;
use netdam_isa::wire::Instruction;
use netdam_isa::{Duration, Instant, Opcode, Status};
use netdam_target::config::{ByteSize, RegionBackend, RegionConfig};
use netdam_target::engine::SoftwareEngine;
use netdam_target::regions::RegionTable;

const REGION_BYTES: u64 = 64 * 1024;
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

fn region(name: &str) -> RegionConfig {
    RegionConfig { name: name.into(), backend: RegionBackend::Mem, path: None, size: ByteSize(REGION_BYTES) }
}

/// The device model on a thread and a driver attached to it.
struct Device {
    _directory: tempfile::TempDir,
    _model: model::ModelThread,
    driver: Driver,
    started: std::time::Instant,
}

impl Device {
    fn new() -> Device {
        let directory = tempfile::tempdir().unwrap();
        let config = ModelConfig::default();
        let window: Arc<dyn Window> =
            Arc::new(FileWindow::create(&directory.path().join("window"), config.window_bytes() as usize).unwrap());
        let model = model::spawn(Arc::clone(&window), config).unwrap();
        let regions = vec![
            RegionEntry { space: 0, offset: 0, bytes: REGION_BYTES },
            RegionEntry { space: 1, offset: REGION_BYTES, bytes: REGION_BYTES },
        ];
        let driver_config = DriverConfig {
            ring_entries: 8,
            slot_bytes: 4096,
            progress_deadline: Duration::from_millis(30_000),
            regions,
            namespaces: Vec::new(),
        };
        let driver = Driver::attach(window, &driver_config, PATIENCE).unwrap();
        Device { _directory: directory, _model: model, driver, started: std::time::Instant::now() }
    }

    fn now(&self) -> Instant {
        Instant::from_nanos(self.started.elapsed().as_nanos() as u64)
    }

    fn execute(&mut self, instruction: &Instruction<'_>, out: &mut [u8]) -> Result<usize, Status> {
        let tag = self.driver.submit(self.now(), instruction, out.len() as u32).unwrap();
        let waiting = std::time::Instant::now();
        loop {
            if let Some(completion) = self.driver.poll_completion(self.now(), out).unwrap() {
                assert_eq!(completion.tag, tag);
                return completion.result;
            }
            assert!(waiting.elapsed() < PATIENCE, "the model did not answer within {PATIENCE:?}");
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
    }
}

#[test]
fn software_engine_and_device_model_agree_on_a_seeded_stream() {
    let seed = 0xF96A_2026;
    println!("SEED={seed:#x}");
    let directory = tempfile::tempdir().unwrap();
    let regions = RegionTable::open(&[region("a"), region("b")], directory.path()).unwrap();
    let mut software = SoftwareEngine::new(Arc::new(regions));
    let mut device = Device::new();
    let spaces = StreamSpaces { first: 0, second: 1, bytes: REGION_BYTES };
    let mut rng = Rng::new(seed);
    let mut operand = Vec::new();
    let (mut software_out, mut device_out) = (vec![0u8; ANSWER_BYTES_MAX], vec![0u8; ANSWER_BYTES_MAX]);
    for index in 0..2000 {
        let instruction = random_instruction(&mut rng, &spaces, &mut operand);
        let expected = software.execute(&instruction, &mut software_out).map(|len| &software_out[..len]);
        let got = device.execute(&instruction, &mut device_out).map(|len| &device_out[..len]);
        assert_eq!(got, expected, "instruction {index} of seed {seed:#x}: {instruction:?}");
    }
    // The memory each engine is left with, read through the engines themselves.
    for space in [0u16, 1] {
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
            let expected = software.execute(&read, &mut software_out).map(|len| &software_out[..len]);
            let got = device.execute(&read, &mut device_out).map(|len| &device_out[..len]);
            assert!(got == expected, "space {space} bytes {}.. differ", chunk * ANSWER_BYTES_MAX as u64);
        }
    }
}
