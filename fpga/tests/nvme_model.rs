//! The SSD model behind the FPGA's NVMe controller: real SQEs in, CQEs with phase tags out,
//! data moved through PRPs, backed by a file through `netdam-nvme`. The test plays the FPGA's
//! controller logic (building SQEs, ringing doorbells, consuming CQEs), including the admin
//! bring-up: IDENTIFY and I/O queue creation.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use netdam_fpga::nvme::{
    self, admin_opcode, cns, opcode, status, CompletionEntry, QueuePair, SsdModel, SubmissionEntry,
};
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
/// The SSD's doorbell registers: the admin pair's at +0, I/O queue 1's at +8.
const DOORBELLS: u64 = 0x1_2000;
/// Where the I/O queues go once created.
const IO_SQ: u64 = 0x1_0000;
const IO_CQ: u64 = 0x1_1000;
/// Largest transfer the test's device takes (IDENTIFY must report it as MDTS = 4: 16 pages).
const DEVICE_TRANSFER_BYTES: usize = 64 * 1024;

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

/// An SSD with only its admin queues (4 entries, so that completions wrap), and the two host
/// sides: the admin pair and the I/O pair of `entries` as it will be once created.
fn bare_rig(entries: u32) -> (tempfile::TempDir, Controller, Controller, SsdModel) {
    let directory = tempfile::tempdir().unwrap();
    let window: Arc<dyn Window> = Arc::new(FileWindow::create(&directory.path().join("window"), 1 << 20).unwrap());
    let backing = directory.path().join("namespace");
    std::fs::File::create(&backing).unwrap().set_len(NAMESPACE_BYTES).unwrap();
    let device = UringDevice::open(&backing, BLOCK_BYTES as u32, 4, DEVICE_TRANSFER_BYTES).unwrap();
    let admin = QueuePair { sq_id: 0, entries: 4, sq_base: 0x1_3000, cq_base: 0x1_4000, doorbells: DOORBELLS };
    let io = QueuePair { sq_id: nvme::IO_QUEUE_ID, entries, sq_base: IO_SQ, cq_base: IO_CQ, doorbells: DOORBELLS + 8 };
    let ssd = SsdModel::new(Arc::clone(&window), admin, Box::new(device));
    let host = |queues| Controller { window: Arc::clone(&window), queues, sq_tail: 0, cq_head: 0, phase: true };
    (directory, host(admin), host(io), ssd)
}

/// CREATE I/O COMPLETION QUEUE 1: `CDW11 = IV << 16 | IEN << 1 | PC`.
fn create_cq(id: u16, base: u64, entries: u32, cdw11: u32) -> SubmissionEntry {
    SubmissionEntry::create_io_queue(admin_opcode::CREATE_IO_COMPLETION_QUEUE, id, 1, entries, base, cdw11)
}

/// CREATE I/O SUBMISSION QUEUE 1: `CDW11 = CQID << 16 | QPRIO << 1 | PC`.
fn create_sq(id: u16, base: u64, entries: u32, cdw11: u32) -> SubmissionEntry {
    SubmissionEntry::create_io_queue(admin_opcode::CREATE_IO_SUBMISSION_QUEUE, id, 1, entries, base, cdw11)
}

/// Creates I/O queue pair 1 through the admin queue, as a host does after IDENTIFY.
fn create_io_queues(admin: &mut Controller, ssd: &mut SsdModel, entries: u32) {
    assert_eq!(admin.run(ssd, &create_cq(0x40, IO_CQ, entries, 1)).status, status::SUCCESS);
    assert_eq!(admin.run(ssd, &create_sq(0x41, IO_SQ, entries, 1 << 16 | 1)).status, status::SUCCESS);
}

/// An SSD with its I/O queues created, and the I/O host side.
fn rig(entries: u32) -> (tempfile::TempDir, Controller, SsdModel) {
    let (directory, mut admin, io, mut ssd) = bare_rig(entries);
    create_io_queues(&mut admin, &mut ssd, entries);
    (directory, io, ssd)
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

#[test]
fn identify_reports_the_controller_and_namespace_1() {
    let (_directory, mut admin, mut io, mut ssd) = bare_rig(8);
    let window = Arc::clone(&admin.window);
    let page = |at: u64| {
        let mut data = vec![0u8; nvme::IDENTIFY_BYTES];
        window.read_bytes(at, &mut data).unwrap();
        data
    };

    assert_eq!(admin.run(&mut ssd, &SubmissionEntry::identify(1, 0, cns::CONTROLLER, DATA)).status, status::SUCCESS);
    let controller = page(DATA);
    assert_eq!(&controller[0..2], &nvme::VENDOR_ID.to_le_bytes()); // VID
    let serial = std::str::from_utf8(&controller[4..24]).unwrap();
    assert!(!serial.trim().is_empty() && serial.is_ascii(), "SN {serial:?}");
    let model = std::str::from_utf8(&controller[24..64]).unwrap();
    assert!(!model.trim().is_empty() && model.is_ascii(), "MN {model:?}");
    assert_eq!(controller[77], 4, "MDTS: 2^4 pages of 4 KiB = the device's 64 KiB");
    assert_eq!(u32::from_le_bytes(controller[516..520].try_into().unwrap()), 1, "NN");
    assert_eq!(ssd.max_transfer_bytes(), DEVICE_TRANSFER_BYTES as u64);

    // PRP1 inside a page: the rest of the 4 KiB goes to PRP2's page.
    let (first, second) = (DATA + 8 * PAGE + 0x800, DATA + 12 * PAGE);
    let with_prp2 = SubmissionEntry { prp2: second, ..SubmissionEntry::identify(3, NSID, cns::NAMESPACE, first) };
    assert_eq!(admin.run(&mut ssd, &with_prp2).status, status::SUCCESS);
    let mut namespace = page(first)[..0x800].to_vec();
    namespace.extend_from_slice(&page(second)[..0x800]);
    let blocks = NAMESPACE_BYTES / BLOCK_BYTES as u64;
    for (field, at) in [("NSZE", 0), ("NCAP", 8), ("NUSE", 16)] {
        assert_eq!(u64::from_le_bytes(namespace[at..at + 8].try_into().unwrap()), blocks, "{field}");
    }
    assert_eq!(namespace[25], 0, "NLBAF");
    assert_eq!(namespace[26], 0, "FLBAS");
    let lba_format = u32::from_le_bytes(namespace[128..132].try_into().unwrap());
    assert_eq!(lba_format, 9 << 16, "LBA format 0: LBADS = log2(512), no metadata");

    // The limit IDENTIFY reports is the one READ and WRITE are held to.
    create_io_queues(&mut admin, &mut ssd, 8);
    let too_long = (DEVICE_TRANSFER_BYTES / BLOCK_BYTES) as u32 + 1;
    let completion = io.run(&mut ssd, &rw(opcode::READ, 9, 0, too_long, false, (DATA, DATA + 16 * PAGE)));
    assert_eq!(completion.status, status::INVALID_FIELD | status::DO_NOT_RETRY);
}

#[test]
fn created_io_queues_carry_a_write_and_read_round_trip_and_go_away_when_deleted() {
    let (directory, mut admin, mut io, mut ssd) = bare_rig(4);
    let window = Arc::clone(&admin.window);
    create_io_queues(&mut admin, &mut ssd, 4);

    let data = pattern(2 * PAGE as usize, 5);
    window.write_bytes(DATA, &data).unwrap();
    // Six commands on a four-entry queue: the I/O phase wraps too.
    for round in 0..3u16 {
        let written = io.run(&mut ssd, &rw(opcode::WRITE, 10 + round, 16, 16, true, (DATA, DATA + PAGE)));
        assert_eq!(written.status, status::SUCCESS);
        let target = DATA + 4 * PAGE;
        window.write_bytes(target, &vec![0u8; 2 * PAGE as usize]).unwrap();
        let read = io.run(&mut ssd, &rw(opcode::READ, 20 + round, 16, 16, false, (target, target + PAGE)));
        assert_eq!(read.status, status::SUCCESS);
        let mut back = vec![0u8; 2 * PAGE as usize];
        window.read_bytes(target, &mut back).unwrap();
        assert!(back == data, "round {round}: read back what was written");
    }
    let file = std::fs::read(directory.path().join("namespace")).unwrap();
    assert!(file[16 * BLOCK_BYTES..32 * BLOCK_BYTES] == data[..]);

    // The CQ cannot go while the SQ uses it; SQ first, then CQ.
    let delete =
        |id: u16, opcode: u8| SubmissionEntry { opcode, command_id: id, cdw: [1, 0, 0, 0, 0, 0], ..Default::default() };
    let status_of = |admin: &mut Controller, ssd: &mut SsdModel, entry| admin.run(ssd, &entry).status & 0x7FF;
    assert_eq!(
        status_of(&mut admin, &mut ssd, delete(50, admin_opcode::DELETE_IO_COMPLETION_QUEUE)),
        status::INVALID_QUEUE_DELETION
    );
    assert_eq!(status_of(&mut admin, &mut ssd, delete(51, admin_opcode::DELETE_IO_SUBMISSION_QUEUE)), status::SUCCESS);
    assert_eq!(status_of(&mut admin, &mut ssd, delete(52, admin_opcode::DELETE_IO_COMPLETION_QUEUE)), status::SUCCESS);
    assert_eq!(
        status_of(&mut admin, &mut ssd, delete(53, admin_opcode::DELETE_IO_SUBMISSION_QUEUE)),
        status::INVALID_QUEUE_IDENTIFIER
    );

    // A deleted queue's doorbell does nothing.
    let before = std::fs::read(directory.path().join("namespace")).unwrap();
    window.write_bytes(DATA, &pattern(PAGE as usize, 77)).unwrap();
    io.submit(&rw(opcode::WRITE, 60, 16, 8, true, (DATA, 0)));
    assert_nothing_happens(&mut ssd);
    assert!(std::fs::read(directory.path().join("namespace")).unwrap() == before);
}

/// Steps the SSD for a while; it must report no progress.
fn assert_nothing_happens(ssd: &mut SsdModel) {
    for _ in 0..50 {
        assert!(!ssd.step(), "the SSD did something");
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
}

#[test]
fn io_submitted_before_its_queue_exists_is_not_executed() {
    let (directory, mut admin, mut io, mut ssd) = bare_rig(8);
    let window = Arc::clone(&admin.window);
    window.write_bytes(DATA, &pattern(PAGE as usize, 9)).unwrap();
    // The host writes an SQE where the I/O SQ will be and rings queue 1's tail doorbell.
    io.submit(&rw(opcode::WRITE, 1, 0, 8, true, (DATA, 0)));
    assert_nothing_happens(&mut ssd);
    let mut completions = vec![0u8; 8 * nvme::COMPLETION_ENTRY_BYTES];
    window.read_bytes(IO_CQ, &mut completions).unwrap();
    assert!(completions.iter().all(|&byte| byte == 0), "no CQE was posted");
    let file = std::fs::read(directory.path().join("namespace")).unwrap();
    assert!(file.iter().all(|&byte| byte == 0), "the namespace is unchanged");

    // Creating the queues starts them empty (tail 0): the stale SQE is not run afterwards either.
    create_io_queues(&mut admin, &mut ssd, 8);
    assert_nothing_happens(&mut ssd);
    let file = std::fs::read(directory.path().join("namespace")).unwrap();
    assert!(file.iter().all(|&byte| byte == 0), "the namespace is unchanged after creation");
}

#[test]
fn admin_commands_are_refused_with_nvme_statuses() {
    let (_directory, mut admin, _io, mut ssd) = bare_rig(8);
    let too_many = nvme::IO_QUEUE_ENTRIES_MAX + 1;
    let with_qid = |entry: SubmissionEntry, queue_id: u32| SubmissionEntry {
        cdw: [entry.cdw[0] & 0xFFFF_0000 | queue_id, entry.cdw[1], 0, 0, 0, 0],
        ..entry
    };
    let cases = [
        (SubmissionEntry { opcode: 0x7F, command_id: 1, ..Default::default() }, status::INVALID_OPCODE),
        (SubmissionEntry::identify(2, 0, 0x02, DATA), status::INVALID_FIELD), // CNS 2: active namespace list, not served
        (SubmissionEntry::identify(3, 2, cns::NAMESPACE, DATA), status::INVALID_NAMESPACE), // NN = 1
        (SubmissionEntry::identify(4, 0, cns::NAMESPACE, DATA), status::INVALID_NAMESPACE),
        (with_qid(create_cq(5, IO_CQ, 8, 1), 2), status::INVALID_QUEUE_IDENTIFIER),
        (with_qid(create_cq(6, IO_CQ, 8, 1), 0), status::INVALID_QUEUE_IDENTIFIER),
        (create_cq(7, IO_CQ, too_many, 1), status::INVALID_QUEUE_SIZE),
        (create_cq(8, IO_CQ, 1, 1), status::INVALID_QUEUE_SIZE), // QSIZE 0: one entry
        (create_cq(9, IO_CQ, 8, 0), status::INVALID_FIELD),      // PC = 0
        (create_cq(10, IO_CQ, 8, 1 << 1 | 1), status::INVALID_FIELD), // IEN = 1: no interrupts
        (create_cq(11, IO_CQ + 0x100, 8, 1), status::INVALID_FIELD), // not page aligned
        (create_sq(12, IO_SQ, 8, 1 << 16 | 1), status::COMPLETION_QUEUE_INVALID), // no CQ 1 yet
        (create_cq(13, IO_CQ, 8, 1), status::SUCCESS),
        (create_cq(14, IO_CQ, 8, 1), status::INVALID_QUEUE_IDENTIFIER), // already there
        (create_sq(15, IO_SQ, 8, 2 << 16 | 1), status::COMPLETION_QUEUE_INVALID), // CQ 2
        (create_sq(16, IO_SQ, too_many, 1 << 16 | 1), status::INVALID_QUEUE_SIZE),
        (create_sq(17, IO_SQ, 8, 1 << 16), status::INVALID_FIELD), // PC = 0
        (with_qid(create_sq(18, IO_SQ, 8, 1 << 16 | 1), 2), status::INVALID_QUEUE_IDENTIFIER),
        (create_sq(19, IO_SQ, 8, 1 << 16 | 1), status::SUCCESS),
    ];
    // Admin queues of four entries: the cases wrap them several times.
    for (entry, expected) in &cases {
        let completion = admin.run(&mut ssd, entry);
        assert_eq!(completion.status & 0x7FF, *expected, "command {}", entry.command_id);
        let retry_forbidden = completion.status & status::DO_NOT_RETRY != 0;
        assert_eq!(retry_forbidden, *expected != status::SUCCESS, "DNR on command {}", entry.command_id);
        assert_eq!(completion.sq_id, 0);
    }
}

/// The SSD's controller registers, as the FPGA's controller drives them (FPGA.md §9.1): CAP
/// read, admin queues placed with AQA/ASQ/ACQ, CC.EN set and CSTS.RDY awaited; nothing is
/// fetched before that; admin queues it cannot serve are CSTS.CFS; clearing CC.EN resets the
/// controller (I/O queues gone, CSTS 0) and a new enable serves afresh.
#[test]
fn the_controller_registers_enable_disable_and_refuse_what_cannot_be_served() {
    use nvme::register;
    const REGISTERS: u64 = DOORBELLS + 0x800;
    let directory = tempfile::tempdir().unwrap();
    let window: Arc<dyn Window> = Arc::new(FileWindow::create(&directory.path().join("window"), 1 << 20).unwrap());
    let backing = directory.path().join("namespace");
    std::fs::File::create(&backing).unwrap().set_len(NAMESPACE_BYTES).unwrap();
    let device = UringDevice::open(&backing, BLOCK_BYTES as u32, 4, DEVICE_TRANSFER_BYTES).unwrap();
    let mut ssd = SsdModel::powered(Arc::clone(&window), REGISTERS, DOORBELLS, Box::new(device));
    let reg32 = |offset: u64| window.u32_at(REGISTERS + offset);
    let reg64 = |offset: u64| window.u64_at(REGISTERS + offset);
    let cap = reg64(register::CAP).load(Ordering::Acquire);
    assert_eq!((cap & 0xFFFF) + 1, u64::from(nvme::IO_QUEUE_ENTRIES_MAX), "MQES");
    assert!(cap & register::CAP_CQR != 0 && cap & register::CAP_CSS_NVM != 0);
    assert_eq!((cap >> 32) & 0xF, 0, "DSTRD 0: doorbells 4 bytes apart");
    assert_eq!(reg32(register::VS).load(Ordering::Relaxed), 0x0001_0400);
    assert_eq!(reg32(register::CSTS).load(Ordering::Relaxed), 0, "disabled at power-on");

    let admin = QueuePair { sq_id: 0, entries: 4, sq_base: 0x1_3000, cq_base: 0x1_4000, doorbells: DOORBELLS };
    let mut host = Controller { window: Arc::clone(&window), queues: admin, sq_tail: 0, cq_head: 0, phase: true };
    // A command before the enable is not fetched.
    host.submit(&SubmissionEntry::identify(1, 0, cns::CONTROLLER, DATA));
    assert_nothing_happens(&mut ssd);

    let enable = |ssd: &mut SsdModel, aqa: u32, cc: u32| {
        reg32(register::AQA).store(aqa, Ordering::Relaxed);
        reg64(register::ASQ).store(admin.sq_base, Ordering::Relaxed);
        reg64(register::ACQ).store(admin.cq_base, Ordering::Relaxed);
        reg32(register::CC).store(cc, Ordering::Release);
        for _ in 0..4 {
            ssd.step();
        }
        reg32(register::CSTS).load(Ordering::Acquire)
    };
    let disable = |ssd: &mut SsdModel| {
        reg32(register::CC).store(0, Ordering::Release);
        for _ in 0..4 {
            ssd.step();
        }
        reg32(register::CSTS).load(Ordering::Acquire)
    };
    // One-entry admin queues (AQA 0-based 0), and 128-byte SQEs: fatal status, no queues.
    assert_eq!(enable(&mut ssd, 0, register::CC_ENABLE), register::CSTS_CFS);
    assert_eq!(disable(&mut ssd), 0, "a disable clears the fatal status");
    assert_eq!(enable(&mut ssd, 3 << 16 | 3, register::CC_EN | 7 << 16 | 4 << 20), register::CSTS_CFS);
    assert_eq!(disable(&mut ssd), 0);

    // Enabled properly: ready, and the admin queue serves from its first entry.
    host.sq_tail = 0;
    assert_eq!(enable(&mut ssd, 3 << 16 | 3, register::CC_ENABLE), register::CSTS_RDY);
    let completion = host.run(&mut ssd, &SubmissionEntry::identify(2, 0, cns::CONTROLLER, DATA));
    assert_eq!(completion.status, status::SUCCESS);
    let io =
        QueuePair { sq_id: nvme::IO_QUEUE_ID, entries: 8, sq_base: IO_SQ, cq_base: IO_CQ, doorbells: DOORBELLS + 8 };
    create_io_queues(&mut host, &mut ssd, io.entries);

    // A controller reset: not ready, and the I/O queues are gone (a WRITE on them is not run).
    assert_eq!(disable(&mut ssd), 0);
    let mut io_host = Controller { window: Arc::clone(&window), queues: io, sq_tail: 0, cq_head: 0, phase: true };
    io_host.submit(&rw(opcode::WRITE, 9, 0, 1, false, (DATA, 0)));
    assert_nothing_happens(&mut ssd);

    // Enabled again: the admin queues start over, and queues can be created afresh.
    let mut host = Controller { window: Arc::clone(&window), queues: admin, sq_tail: 0, cq_head: 0, phase: true };
    window.write_bytes(admin.cq_base, &[0u8; 4096]).unwrap();
    assert_eq!(enable(&mut ssd, 3 << 16 | 3, register::CC_ENABLE), register::CSTS_RDY);
    create_io_queues(&mut host, &mut ssd, io.entries);
    let mut io_host = Controller { window: Arc::clone(&window), queues: io, sq_tail: 0, cq_head: 0, phase: true };
    window.write_bytes(DATA, &pattern(BLOCK_BYTES, 7)).unwrap();
    assert_eq!(io_host.run(&mut ssd, &rw(opcode::WRITE, 10, 3, 1, true, (DATA, 0))).status, status::SUCCESS);
    let mut back = vec![0u8; BLOCK_BYTES];
    use std::os::unix::fs::FileExt;
    std::fs::File::open(&backing).unwrap().read_exact_at(&mut back, 3 * BLOCK_BYTES as u64).unwrap();
    assert_eq!(back, pattern(BLOCK_BYTES, 7), "the write after re-enabling reached the file");
}
