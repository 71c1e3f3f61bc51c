//! The SSD model behind the FPGA's NVMe controller: real SQEs in, CQEs with phase tags out,
//! data moved through PRPs, backed by a file through `netdam-nvme`. The test plays the FPGA's
//! controller logic (building SQEs, ringing doorbells, consuming CQEs).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use netdam_fpga::nvme::{self, opcode, status, CompletionEntry, QueuePair, SsdModel, SubmissionEntry};
use netdam_fpga::window::{FileWindow, Window};
use netdam_isa::Status;
use netdam_nvme::UringDevice;

const PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);
const BLOCK_BYTES: usize = 512;
const NAMESPACE_BYTES: u64 = 1 << 20;
const NSID: u32 = 1;
/// Data pages in the window (on-board memory as the SSD sees it).
const DATA: u64 = 0x2_0000;
const PAGE: u64 = 4096;

/// The controller side: SQ tail, CQ head and the phase it expects.
struct Controller {
    window: Arc<dyn Window>,
    queues: QueuePair,
    sq_tail: u32,
    cq_head: u32,
    phase: bool,
}

impl Controller {
    fn submit(&mut self, entry: &SubmissionEntry) {
        let at = self.queues.sq_base + u64::from(self.sq_tail) * nvme::SUBMISSION_ENTRY_BYTES as u64;
        self.window.write_bytes(at, &entry.encode()).unwrap();
        self.sq_tail = (self.sq_tail + 1) % self.queues.entries;
        self.window.u32_at(self.queues.doorbells).store(self.sq_tail, Ordering::Release);
    }

    fn complete(&mut self, ssd: &mut SsdModel) -> CompletionEntry {
        let started = std::time::Instant::now();
        let at = self.queues.cq_base + u64::from(self.cq_head) * nvme::COMPLETION_ENTRY_BYTES as u64;
        loop {
            let _ = self.window.u64_at(at + 8).load(Ordering::Acquire);
            let mut bytes = [0u8; 16];
            self.window.read_bytes(at, &mut bytes).unwrap();
            let entry = CompletionEntry::decode(&bytes);
            if entry.phase == self.phase {
                self.cq_head = (self.cq_head + 1) % self.queues.entries;
                if self.cq_head == 0 {
                    self.phase = !self.phase;
                }
                self.window.u32_at(self.queues.doorbells + 4).store(self.cq_head, Ordering::Release);
                return entry;
            }
            assert!(started.elapsed() < PATIENCE, "no completion within {PATIENCE:?}");
            if !ssd.step() {
                std::thread::sleep(std::time::Duration::from_micros(20));
            }
        }
    }

    fn run(&mut self, ssd: &mut SsdModel, entry: &SubmissionEntry) -> CompletionEntry {
        self.submit(entry);
        let completion = self.complete(ssd);
        assert_eq!(completion.command_id, entry.command_id);
        assert_eq!(completion.sq_id, self.queues.sq_id);
        completion
    }
}

fn rig(entries: u32) -> (tempfile::TempDir, Controller, SsdModel) {
    let directory = tempfile::tempdir().unwrap();
    let window: Arc<dyn Window> = Arc::new(FileWindow::create(&directory.path().join("window"), 1 << 20).unwrap());
    let backing = directory.path().join("namespace");
    std::fs::File::create(&backing).unwrap().set_len(NAMESPACE_BYTES).unwrap();
    let device = UringDevice::open(&backing, BLOCK_BYTES as u32, 4, 64 * 1024).unwrap();
    let queues = QueuePair { nsid: NSID, sq_id: 1, entries, sq_base: 0x1_0000, cq_base: 0x1_1000, doorbells: 0x1_2000 };
    let ssd = SsdModel::new(Arc::clone(&window), queues, Box::new(device));
    (directory, Controller { window, queues, sq_tail: 0, cq_head: 0, phase: true }, ssd)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|index| (index as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn rw(opcode: u8, id: u16, slba: u64, blocks: u32, fua: bool, prps: (u64, u64)) -> SubmissionEntry {
    SubmissionEntry::read_write(opcode, id, NSID, slba, blocks, fua, prps)
}

#[test]
fn reads_and_writes_move_data_through_prps_to_the_backing_file() {
    let (directory, mut controller, mut ssd) = rig(8);
    let window = Arc::clone(&controller.window);

    // One page, FUA.
    let one_page = pattern(PAGE as usize, 1);
    window.write_bytes(DATA, &one_page).unwrap();
    let done = controller.run(&mut ssd, &rw(opcode::WRITE, 1, 8, 8, true, (DATA, 0)));
    assert_eq!(done.status, status::SUCCESS);

    // 24 blocks starting 0x200 into a page: four pages, so PRP2 points at a PRP list.
    let long = pattern(24 * BLOCK_BYTES, 7);
    let start = DATA + 4 * PAGE + 0x200;
    window.write_bytes(start, &long).unwrap();
    let list = DATA + 16 * PAGE;
    for (index, page) in [5u64, 6, 7].iter().enumerate() {
        window.write_bytes(list + 8 * index as u64, &(DATA + page * PAGE).to_le_bytes()).unwrap();
    }
    assert_eq!(controller.run(&mut ssd, &rw(opcode::WRITE, 2, 100, 24, false, (start, list))).status, status::SUCCESS);
    assert_eq!(
        controller
            .run(&mut ssd, &SubmissionEntry { opcode: opcode::FLUSH, command_id: 3, nsid: NSID, ..Default::default() })
            .status,
        0
    );

    // The bytes are in the file where the LBAs say.
    let file = std::fs::read(directory.path().join("namespace")).unwrap();
    assert!(file[8 * BLOCK_BYTES..16 * BLOCK_BYTES] == one_page[..]);
    assert!(file[100 * BLOCK_BYTES..124 * BLOCK_BYTES] == long[..]);

    // Read both back into other pages (two pages: PRP2 is the second page itself).
    let target = DATA + 32 * PAGE;
    assert_eq!(controller.run(&mut ssd, &rw(opcode::READ, 4, 8, 16, false, (target, target + PAGE))).status, 0);
    let mut read = vec![0u8; 16 * BLOCK_BYTES];
    window.read_bytes(target, &mut read).unwrap();
    assert!(read[..PAGE as usize] == one_page[..]);
    assert!(read[PAGE as usize..] == file[16 * BLOCK_BYTES..24 * BLOCK_BYTES]);
}

#[test]
fn deallocate_and_write_zeroes_read_back_as_zeroes() {
    let (_directory, mut controller, mut ssd) = rig(8);
    let window = Arc::clone(&controller.window);
    window.write_bytes(DATA, &pattern(8 * PAGE as usize, 3)).unwrap();
    let list = DATA + 8 * PAGE;
    for (index, page) in (1..8u64).enumerate() {
        window.write_bytes(list + 8 * index as u64, &(DATA + page * PAGE).to_le_bytes()).unwrap();
    }
    assert_eq!(controller.run(&mut ssd, &rw(opcode::WRITE, 1, 0, 64, false, (DATA, list))).status, 0);

    // Two ranges deallocated: blocks 0..8 and 40..48.
    let ranges = DATA + 12 * PAGE;
    let mut bytes = [0u8; 32];
    bytes[4..8].copy_from_slice(&8u32.to_le_bytes());
    bytes[8..16].copy_from_slice(&0u64.to_le_bytes());
    bytes[20..24].copy_from_slice(&8u32.to_le_bytes());
    bytes[24..32].copy_from_slice(&40u64.to_le_bytes());
    window.write_bytes(ranges, &bytes).unwrap();
    let dsm = SubmissionEntry {
        opcode: opcode::DATASET_MANAGEMENT,
        command_id: 2,
        nsid: NSID,
        prp1: ranges,
        cdw: [1, 1 << 2, 0, 0, 0, 0],
        ..Default::default()
    };
    assert_eq!(controller.run(&mut ssd, &dsm).status, 0);
    let zeroes = SubmissionEntry {
        opcode: opcode::WRITE_ZEROES,
        command_id: 3,
        nsid: NSID,
        cdw: [20, 0, 3, 0, 0, 0],
        ..Default::default()
    };
    assert_eq!(controller.run(&mut ssd, &zeroes).status, 0);

    let target = DATA + 16 * PAGE;
    let target_list = DATA + 24 * PAGE;
    for (index, page) in (17..24u64).enumerate() {
        window.write_bytes(target_list + 8 * index as u64, &(DATA + page * PAGE).to_le_bytes()).unwrap();
    }
    assert_eq!(controller.run(&mut ssd, &rw(opcode::READ, 4, 0, 64, false, (target, target_list))).status, 0);
    let mut read = vec![0u8; 64 * BLOCK_BYTES];
    window.read_bytes(target, &mut read).unwrap();
    let written = pattern(8 * PAGE as usize, 3);
    for block in 0..64 {
        let range = block * BLOCK_BYTES..(block + 1) * BLOCK_BYTES;
        let zeroed = block < 8 || (20..24).contains(&block) || (40..48).contains(&block);
        if zeroed {
            assert!(read[range].iter().all(|&byte| byte == 0), "block {block} should read as zeroes");
        } else {
            assert!(read[range.clone()] == written[range], "block {block} should be unchanged");
        }
    }
}

#[test]
fn bad_commands_complete_with_nvme_statuses_and_phases_flip_on_every_wrap() {
    let (_directory, mut controller, mut ssd) = rig(4);
    let cases = [
        (rw(opcode::READ, 1, NAMESPACE_BYTES / BLOCK_BYTES as u64, 1, false, (DATA, 0)), status::LBA_OUT_OF_RANGE),
        (SubmissionEntry { nsid: 9, ..rw(opcode::READ, 2, 0, 1, false, (DATA, 0)) }, status::INVALID_NAMESPACE),
        (SubmissionEntry { opcode: 0x7F, ..rw(opcode::READ, 3, 0, 1, false, (DATA, 0)) }, status::INVALID_OPCODE),
        (rw(opcode::READ, 4, 0, 1, false, (1 << 40, 0)), status::DATA_TRANSFER_ERROR),
        (rw(opcode::READ, 5, 0, 16, false, (DATA, DATA + 5)), status::PRP_OFFSET_INVALID),
    ];
    let mut phases = Vec::new();
    for round in 0..3u16 {
        for (entry, expected) in &cases {
            let entry = SubmissionEntry { command_id: entry.command_id + 100 * round, ..*entry };
            let completion = controller.run(&mut ssd, &entry);
            assert_eq!(completion.status & 0x7FF, *expected, "command {}", entry.command_id);
            phases.push(completion.phase);
        }
    }
    // Four entries per queue: the phase flips after every fourth completion.
    let expected: Vec<bool> = (0..phases.len()).map(|index| (index / 4) % 2 == 0).collect();
    assert_eq!(phases, expected);
    assert_eq!(nvme::wire_status(status::LBA_OUT_OF_RANGE | status::DO_NOT_RETRY), Status::OutOfRange);
}
