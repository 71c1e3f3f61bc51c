//! Block instructions through the driver and the device model: checked as the software path
//! checks them, turned into NVMe commands for the SSD model, data moved through the transfer
//! buffer in on-board memory and landing in the namespace's backing file.

use std::sync::Arc;

use netdam_fpga::driver::{Driver, DriverConfig, DriverError};
use netdam_fpga::model::{self, Faults, ModelConfig, NamespaceBacking, SSD_NSID};
use netdam_fpga::registers::{self as reg, NamespaceEntry, RegionEntry};
use netdam_fpga::window::{FileWindow, Window};
use netdam_isa::wire::Instruction;
use netdam_isa::{Duration, Instant, Opcode, Status};

const PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);
const BLOCK_BYTES: usize = 512;
const NAMESPACE_BLOCKS: u64 = 2048;
const SPACE: u16 = 3;

struct Rig {
    directory: tempfile::TempDir,
    _model: model::ModelThread,
    driver: Driver,
    started: std::time::Instant,
}

fn namespace(blocks: u64) -> NamespaceEntry {
    NamespaceEntry { space: SPACE, lba_shift: BLOCK_BYTES.trailing_zeros() as u8, nsid: SSD_NSID, blocks }
}

fn start(namespaces: Vec<NamespaceEntry>) -> (tempfile::TempDir, model::ModelThread, Result<Driver, DriverError>) {
    start_with(namespaces, Vec::new(), Faults::default())
}

fn start_with(
    namespaces: Vec<NamespaceEntry>,
    regions: Vec<RegionEntry>,
    faults: Faults,
) -> (tempfile::TempDir, model::ModelThread, Result<Driver, DriverError>) {
    let directory = tempfile::tempdir().unwrap();
    let backing = directory.path().join("namespace");
    std::fs::File::create(&backing).unwrap().set_len(NAMESPACE_BLOCKS * BLOCK_BYTES as u64).unwrap();
    let config = ModelConfig {
        namespace: Some(NamespaceBacking { path: backing, block_bytes: BLOCK_BYTES as u32 }),
        faults,
        ..ModelConfig::default()
    };
    let window: Arc<dyn Window> =
        Arc::new(FileWindow::create(&directory.path().join("window"), config.window_bytes() as usize).unwrap());
    let model = model::spawn(Arc::clone(&window), config).unwrap();
    let driver_config = DriverConfig {
        ring_entries: 8,
        slot_bytes: 16 * 1024,
        progress_deadline: Duration::from_millis(30_000),
        regions,
        namespaces,
    };
    let driver = Driver::attach(window, &driver_config, PATIENCE);
    (directory, model, driver)
}

fn rig() -> Rig {
    let (directory, model, driver) = start(vec![namespace(NAMESPACE_BLOCKS)]);
    Rig { directory, _model: model, driver: driver.unwrap(), started: std::time::Instant::now() }
}

impl Rig {
    fn run(&mut self, instruction: &Instruction<'_>, answer_capacity: u32) -> Result<Vec<u8>, Status> {
        let now = || Instant::from_nanos(self.started.elapsed().as_nanos() as u64);
        let tag = self.driver.submit(now(), instruction, answer_capacity).unwrap();
        let mut answer = vec![0u8; answer_capacity as usize];
        let waiting = std::time::Instant::now();
        loop {
            if let Some(completion) = self.driver.poll_completion(now(), &mut answer).unwrap() {
                assert_eq!(completion.tag, tag);
                return completion.result.map(|len| answer[..len].to_vec());
            }
            assert!(waiting.elapsed() < PATIENCE, "no completion within {PATIENCE:?}");
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
    }

    fn file(&self) -> Vec<u8> {
        std::fs::read(self.directory.path().join("namespace")).unwrap()
    }
}

fn block(opcode: Opcode, flags: u8, offset: u64, length: u32, operand: &[u8]) -> Instruction<'_> {
    Instruction { opcode: opcode as u8, flags, space: SPACE, offset, length, aux: 0, operand }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|index| (index as u8).wrapping_mul(13).wrapping_add(seed)).collect()
}

#[test]
fn block_writes_reach_the_file_and_read_back_through_the_device() {
    let mut rig = rig();
    // 24 blocks (12 KiB): three pages, so the controller writes a PRP list.
    let data = pattern(24 * BLOCK_BYTES, 5);
    assert_eq!(rig.run(&block(Opcode::BlockWrite, 0x01, 100, 24, &data), 0), Ok(vec![]));
    assert!(rig.file()[100 * BLOCK_BYTES..124 * BLOCK_BYTES] == data[..], "FUA write is in the file");
    let small = pattern(BLOCK_BYTES, 9);
    assert_eq!(rig.run(&block(Opcode::BlockWrite, 0, 7, 1, &small), 0), Ok(vec![]));
    assert_eq!(rig.run(&block(Opcode::Flush, 0, 0, 0, &[]), 0), Ok(vec![]));
    assert_eq!(rig.run(&block(Opcode::BlockRead, 0, 100, 24, &[]), 16 * 1024), Ok(data.clone()));
    assert_eq!(rig.run(&block(Opcode::BlockRead, 0, 7, 1, &[]), 4096), Ok(small));

    // TRIM and WRITE_ZEROES read back as zeroes; the blocks around them keep their data.
    assert_eq!(rig.run(&block(Opcode::Trim, 0, 104, 4, &[]), 0), Ok(vec![]));
    assert_eq!(rig.run(&block(Opcode::WriteZeroes, 0, 110, 2, &[]), 0), Ok(vec![]));
    let mut expected = data;
    expected[4 * BLOCK_BYTES..8 * BLOCK_BYTES].fill(0);
    expected[10 * BLOCK_BYTES..12 * BLOCK_BYTES].fill(0);
    assert_eq!(rig.run(&block(Opcode::BlockRead, 0, 100, 24, &[]), 16 * 1024), Ok(expected));
}

#[test]
fn block_instructions_fail_with_the_software_paths_statuses() {
    let mut rig = rig();
    let one = vec![0u8; BLOCK_BYTES];
    let cases: [(Instruction<'_>, u32, Status); 8] = [
        (block(Opcode::BlockRead, 0, NAMESPACE_BLOCKS, 1, &[]), 4096, Status::OutOfRange),
        (block(Opcode::BlockRead, 0, u64::MAX, 2, &[]), 4096, Status::OutOfRange),
        (Instruction { space: 99, ..block(Opcode::BlockRead, 0, 0, 1, &[]) }, 4096, Status::NoSuchSpace),
        (block(Opcode::BlockRead, 0x01, 0, 1, &[]), 4096, Status::Malformed),
        (block(Opcode::BlockWrite, 0, 0, 2, &one), 0, Status::Malformed),
        (block(Opcode::BlockRead, 0, 0, 0, &[]), 4096, Status::Malformed),
        (block(Opcode::BlockRead, 0, 0, 16, &[]), 4096, Status::TooLarge),
        (block(Opcode::BlockStatus, 0, 0, 1, &[]), 4096, Status::NotSupported),
    ];
    for (instruction, capacity, expected) in cases {
        assert_eq!(rig.run(&instruction, capacity), Err(expected), "{instruction:?}");
    }
}

#[test]
fn a_namespace_table_the_ssd_does_not_match_is_refused_at_attach() {
    let (_directory, _model, driver) = start(vec![namespace(NAMESPACE_BLOCKS + 1)]);
    assert_eq!(driver.unwrap_err(), DriverError::Fatal { error_code: reg::ERROR_BAD_NAMESPACE_TABLE });
    let wrong_block_size = NamespaceEntry { lba_shift: 12, ..namespace(8) };
    let (_directory, _model, driver) = start(vec![wrong_block_size]);
    assert_eq!(driver.unwrap_err(), DriverError::Fatal { error_code: reg::ERROR_BAD_NAMESPACE_TABLE });
}

#[test]
fn regions_may_use_on_board_memory_up_to_the_nvme_area_and_not_into_it() {
    let config = ModelConfig {
        namespace: Some(NamespaceBacking { path: "unused".into(), block_bytes: BLOCK_BYTES as u32 }),
        ..ModelConfig::default()
    };
    assert_eq!(config.nvme_area_offset(), config.device_memory_bytes - model::NVME_AREA_BYTES);
    // Queues, doorbells, PRP list, admin queues (a page each) and the transfer buffer.
    assert_eq!(model::NVME_AREA_BYTES, 6 * 4096 + 16 * 1024);
    let below = RegionEntry { space: 7, offset: 0, bytes: config.nvme_area_offset() };
    let (_directory, _model, driver) = start_with(vec![namespace(8)], vec![below], Faults::default());
    assert!(driver.is_ok(), "a region ending where the NVMe area starts is accepted");
    let into = RegionEntry { bytes: config.nvme_area_offset() + 8, ..below };
    let (_directory, _model, driver) = start_with(vec![namespace(8)], vec![into], Faults::default());
    assert_eq!(driver.unwrap_err(), DriverError::Fatal { error_code: reg::ERROR_BAD_REGION_TABLE });
}

#[test]
fn an_ssd_media_error_is_io_error_on_that_instruction_only() {
    let (directory, model, driver) = start_with(
        vec![namespace(NAMESPACE_BLOCKS)],
        Vec::new(),
        Faults { media_error_at: Some(1), ..Faults::default() },
    );
    let mut rig = Rig { directory, _model: model, driver: driver.unwrap(), started: std::time::Instant::now() };
    let data = pattern(BLOCK_BYTES, 1);
    assert_eq!(rig.run(&block(Opcode::BlockWrite, 0, 0, 1, &data), 0), Ok(vec![]));
    assert_eq!(rig.run(&block(Opcode::BlockRead, 0, 0, 1, &[]), 4096), Err(Status::IoError));
    assert_eq!(rig.run(&block(Opcode::BlockRead, 0, 0, 1, &[]), 4096), Ok(data), "one command fails, not the SSD");
}
