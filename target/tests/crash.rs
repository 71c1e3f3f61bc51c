//! Process crashes under load: `netdam-target` (the binary) is killed with SIGKILL at random
//! moments while several initiators run a mixed load on a persistent (file-mapped) region and a
//! file-backed namespace of 1 GiB each, both kept in the metadata store. Each initiator logs
//! what it was answered; after every restart the test checks what the durability contract of
//! DESIGN.md promises, and nothing more, against those logs:
//!
//! - Region (persistent): an answered WRITE or FETCH_ADD is durable. A request left unanswered
//!   by the kill (its outcome unknown) may have executed or not, a WRITE possibly in part (READ
//!   and WRITE are atomic per aligned 8-byte word only), a FETCH_ADD at most once. So each
//!   8-byte word of a slot holds its last answered version or one written after it; a counter
//!   holds at least the answered adds and at most the answered plus the unknown ones; and every
//!   answered FETCH_ADD returned a value within those bounds (so none was applied twice).
//! - Namespace: a BWRITE answered with FUA is durable, and so is every BWRITE or TRIM answered
//!   before an answered FLUSH. Writes answered without FUA and not yet flushed, and unanswered
//!   writes, may each be there or not, in part per 512-byte sector. So each sector of a block
//!   holds its last durable version or one written after it (a trim's version reads as zeroes).
//! - The metadata store opens after every kill (redb recovers it) and lists both spaces.
//!
//! Some kills land while the target starts (opening the store and the spaces) instead.
//! `NETDAM_CRASH_KILLS` sets the kills under load (default 10; the full run is 50 or more) and
//! `NETDAM_SEED` repeats a run. Start-to-serving times of the 1 GiB spaces are printed.

mod common;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::daemon::{admin, spawn, start};
use common::durability::{holds, pattern, word, Candidates};
use common::{seed, Rng};
use netdam_initiator::{Client, ClientError, ClientOptions};
use netdam_isa::control::NamespaceInfo;
use netdam_target::metadata::MetadataStore;

const INITIATORS: usize = 3;
/// Bytes of the region and of the namespace: the sizes whose start-to-serving time is measured.
const SPACE_BYTES: u64 = 1 << 30;
const REGION: &str = "crash-region";
const NAMESPACE: &str = "crash-disk";
/// Memory slots each initiator writes whole, one WRITE each.
const SLOTS: u64 = 32;
const SLOT_BYTES: usize = 4096;
/// Blocks each initiator writes and trims, 1 to 4 at a time.
const BLOCKS: u64 = 128;
const BLOCK_BYTES: usize = 4096;
/// The unit a write interrupted by a crash may be torn at on a block device.
const SECTOR_BYTES: usize = 512;
/// Region offset of the counters: word `i` is initiator `i`'s own, `SHARED_COUNTER` everyone's.
const COUNTERS: u64 = 0;
const SHARED_COUNTER: u64 = COUNTERS + 8 * INITIATORS as u64;

const MEMORY: u64 = 1;
const BLOCK: u64 = 2;
/// The target's config file, in the test's directory.
const CONFIG: &str = "crash.toml";

/// An initiator's log: every answered operation, and the ones whose outcome the kill left unknown.
#[derive(Debug, Clone)]
struct Log {
    initiator: usize,
    seed: u64,
    rng: Rng,
    next_version: u64,
    slots: Vec<Candidates>,
    blocks: Vec<Candidates>,
    /// Own counter: answered adds, and adds of unknown outcome since the last answered one.
    own_answered: u64,
    own_unknown: u64,
    shared_answered: u64,
    shared_unknown: u64,
    /// Values the shared counter's answered FETCH_ADDs returned: all distinct if none ran twice.
    shared_returned: Vec<u64>,
    counts: Counts,
}

/// Operations answered (and checked after the next restart), by kind.
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    writes: u64,
    fetch_adds: u64,
    block_writes_fua: u64,
    block_writes: u64,
    flushes: u64,
    trims: u64,
    unknown: u64,
}

impl Counts {
    fn answered(&self) -> u64 {
        self.writes + self.fetch_adds + self.block_writes_fua + self.block_writes + self.flushes + self.trims
    }

    fn add(&mut self, other: &Counts) {
        self.writes += other.writes;
        self.fetch_adds += other.fetch_adds;
        self.block_writes_fua += other.block_writes_fua;
        self.block_writes += other.block_writes;
        self.flushes += other.flushes;
        self.trims += other.trims;
        self.unknown += other.unknown;
    }
}

impl Log {
    fn new(initiator: usize, seed: u64) -> Log {
        Log {
            initiator,
            seed,
            rng: Rng::new(seed ^ (initiator as u64 + 1).wrapping_mul(0xA24B_AED4_963E_E407)),
            next_version: 1,
            slots: vec![Candidates::default(); SLOTS as usize],
            blocks: vec![Candidates::default(); BLOCKS as usize],
            own_answered: 0,
            own_unknown: 0,
            shared_answered: 0,
            shared_unknown: 0,
            shared_returned: Vec::new(),
            counts: Counts::default(),
        }
    }

    /// Region offset of slot `slot`: each initiator's slots lie in its own part of the region,
    /// spread over it, page-aligned (so a torn WRITE tears at the words the check compares).
    fn slot_offset(&self, slot: u64) -> u64 {
        let part = SPACE_BYTES / INITIATORS as u64 / 4096 * 4096;
        let stride = (part - 4096) / SLOTS / 4096 * 4096;
        self.initiator as u64 * part + 4096 + slot * stride
    }

    fn first_block(&self) -> u64 {
        self.initiator as u64 * (SPACE_BYTES / BLOCK_BYTES as u64 / INITIATORS as u64)
    }

    /// Runs random operations until one fails. A failure after the kill leaves that operation's
    /// outcome unknown; a failure before it is the test's failure.
    fn run(&mut self, target: SocketAddr, killed: &AtomicBool) -> Result<(), String> {
        let failed = |error: ClientError, what: &str| {
            if killed.load(Ordering::SeqCst) {
                Ok(())
            } else {
                Err(format!("initiator failed before the kill, on {what}: {error}"))
            }
        };
        // Each restart serves on a new port, so the killed one stays refused: fail at once
        // instead of waiting for a restart there (`reconnect_patience`).
        let mut options = ClientOptions::default();
        options.session.reconnect_patience = netdam_isa::Duration::ZERO;
        let mut client = match Client::connect_with(target, options) {
            Ok(client) => client,
            Err(error) => return failed(error, "connecting"),
        };
        let region = match client.region(REGION) {
            Ok(region) => region.id,
            Err(error) => return Err(format!("the target serves no {REGION}: {error}")),
        };
        let disk: NamespaceInfo = client.namespace(NAMESPACE).map_err(|error| error.to_string())?.clone();
        loop {
            let choice = self.rng.below(100);
            let version = self.next_version;
            self.next_version += 1;
            let outcome = if choice < 30 {
                let slot = self.rng.below(SLOTS);
                let data = pattern(self.seed, MEMORY, self.initiator, slot, version, SLOT_BYTES);
                let result = client.write(region, self.slot_offset(slot), &data);
                let candidates = &mut self.slots[slot as usize];
                match result {
                    Ok(()) => {
                        candidates.made_durable(version);
                        self.counts.writes += 1;
                        Ok(())
                    }
                    Err(error) => {
                        candidates.later.push((version, false));
                        Err((error, "WRITE"))
                    }
                }
            } else if choice < 45 {
                let offset = COUNTERS + 8 * self.initiator as u64;
                match client.fetch_add(region, offset, 1) {
                    Ok(old) => {
                        let (low, high) = (self.own_answered, self.own_answered + self.own_unknown);
                        if !(low..=high).contains(&old) {
                            return Err(format!(
                                "initiator {}: FETCH_ADD on its own counter returned {old}, outside {low}..={high} \
                                 (answered adds .. answered + unknown ones)",
                                self.initiator
                            ));
                        }
                        // Now known exactly: the unknown adds before it happened or not.
                        self.own_answered = old + 1;
                        self.own_unknown = 0;
                        self.counts.fetch_adds += 1;
                        Ok(())
                    }
                    Err(error) => {
                        self.own_unknown += 1;
                        Err((error, "FETCH_ADD"))
                    }
                }
            } else if choice < 55 {
                match client.fetch_add(region, SHARED_COUNTER, 1) {
                    Ok(old) => {
                        self.shared_answered += 1;
                        self.shared_returned.push(old);
                        self.counts.fetch_adds += 1;
                        Ok(())
                    }
                    Err(error) => {
                        self.shared_unknown += 1;
                        Err((error, "shared FETCH_ADD"))
                    }
                }
            } else if choice < 85 {
                let count = 1 + self.rng.below(4);
                let first = self.rng.below(BLOCKS - count + 1);
                let fua = self.rng.chance(0.5);
                let data: Vec<u8> = (first..first + count)
                    .flat_map(|block| pattern(self.seed, BLOCK, self.initiator, block, version, BLOCK_BYTES))
                    .collect();
                let result = client.block_write(&disk, self.first_block() + first, &data, fua);
                let answered = result.is_ok();
                for block in first..first + count {
                    let candidates = &mut self.blocks[block as usize];
                    if answered && fua {
                        candidates.made_durable(version);
                    } else {
                        candidates.later.push((version, answered));
                    }
                }
                match result {
                    Ok(()) if fua => {
                        self.counts.block_writes_fua += 1;
                        Ok(())
                    }
                    Ok(()) => {
                        self.counts.block_writes += 1;
                        Ok(())
                    }
                    Err(error) => Err((error, "BWRITE")),
                }
            } else if choice < 92 {
                match client.block_flush(&disk) {
                    Ok(()) => {
                        self.blocks.iter_mut().for_each(Candidates::flushed);
                        self.counts.flushes += 1;
                        Ok(())
                    }
                    Err(error) => Err((error, "FLUSH")),
                }
            } else {
                let count = 1 + self.rng.below(4);
                let first = self.rng.below(BLOCKS - count + 1);
                let result = client.trim(&disk, self.first_block() + first, count as u32);
                for block in first..first + count {
                    self.blocks[block as usize].later.push((0, result.is_ok()));
                }
                match result {
                    Ok(()) => {
                        self.counts.trims += 1;
                        Ok(())
                    }
                    Err(error) => Err((error, "TRIM")),
                }
            };
            if let Err((error, what)) = outcome {
                self.counts.unknown += 1;
                return failed(error, what);
            }
        }
    }

    /// Checks what a restarted target holds against the log.
    fn check(&mut self, client: &mut Client, region: u16, disk: &NamespaceInfo) -> Result<(), String> {
        let who = self.initiator;
        let mut slot = vec![0u8; SLOT_BYTES];
        for index in 0..SLOTS {
            client.read(region, self.slot_offset(index), &mut slot).map_err(|error| error.to_string())?;
            let candidates = &self.slots[index as usize];
            for (at, bytes) in slot.chunks_exact(8).enumerate() {
                let value = u64::from_le_bytes(bytes.try_into().unwrap());
                if !candidates.versions().any(|version| word(self.seed, MEMORY, who, index, version, at) == value) {
                    return Err(format!(
                        "initiator {who}, slot {index}, word {at}: {value:#x} is none of the versions it may hold \
                         (durable {}, later {:?})",
                        candidates.durable, candidates.later
                    ));
                }
            }
        }
        let mut blocks = vec![0u8; BLOCKS as usize * BLOCK_BYTES];
        client.block_read(disk, self.first_block(), &mut blocks).map_err(|error| error.to_string())?;
        for (index, block) in blocks.chunks_exact(BLOCK_BYTES).enumerate() {
            let index = index as u64;
            let candidates = &self.blocks[index as usize];
            for (sector, bytes) in block.chunks_exact(SECTOR_BYTES).enumerate() {
                let first_word = sector * SECTOR_BYTES / 8;
                if !candidates.versions().any(|version| holds(bytes, self.seed, BLOCK, who, index, version, first_word))
                {
                    return Err(format!(
                        "initiator {who}, block {index}, sector {sector}: none of the versions it may hold \
                         (durable {}, later {:?})",
                        candidates.durable, candidates.later
                    ));
                }
            }
        }
        let mut counter = [0u8; 8];
        client.read(region, COUNTERS + 8 * who as u64, &mut counter).map_err(|error| error.to_string())?;
        let value = u64::from_le_bytes(counter);
        let (low, high) = (self.own_answered, self.own_answered + self.own_unknown);
        if !(low..=high).contains(&value) {
            return Err(format!("initiator {who}: its counter holds {value}, outside {low}..={high}"));
        }
        Ok(())
    }
}

/// The store opens (redb recovers it after a kill) and still lists both spaces.
fn check_metadata(dir: &Path) {
    let stored = MetadataStore::load(dir).unwrap_or_else(|error| panic!("the metadata store does not open: {error}"));
    assert!(stored.regions.iter().any(|region| region.name == REGION), "the store lost {REGION}: {stored:?}");
    assert!(stored.namespaces.iter().any(|ns| ns.name == NAMESPACE), "the store lost {NAMESPACE}: {stored:?}");
}

fn kills_under_load() -> usize {
    match std::env::var("NETDAM_CRASH_KILLS") {
        Ok(text) => text.parse().unwrap_or_else(|_| panic!("NETDAM_CRASH_KILLS={text:?}: give a number of kills")),
        Err(_) => 10,
    }
}

#[test]
fn acknowledged_operations_survive_sigkill_under_load() {
    let seed = seed();
    let mut rng = Rng::new(seed);
    let kills = kills_under_load();
    let home = tempfile::tempdir().unwrap();
    let dir = home.path();
    // A small volatile region in the file keeps the default 64 MiB region away; the measured
    // spaces are in the metadata store, which every start reads.
    std::fs::write(
        dir.join(CONFIG),
        "listen = \"127.0.0.1:0\"\nmetrics_listen = \"127.0.0.1:0\"\ndata_dir = \".\"\nworkers = 2\n\
         poll = \"blocking\"\npin_workers = false\nlock_memory = false\nbusy_threshold_us = 60000\nauth = \"none\"\n\
         [[region]]\nname = \"scratch\"\nbackend = \"mem\"\nsize = \"1MiB\"\n",
    )
    .unwrap();
    admin(dir, CONFIG, &["region", "create", REGION, "--backend", "file", "--path", "crash.region", "--size", "1GiB"]);
    admin(
        dir,
        CONFIG,
        &["namespace", "create", NAMESPACE, "--backend", "file", "--path", "crash.img", "--size", "1GiB"],
    );

    let mut logs: Vec<Log> = (0..INITIATORS).map(|initiator| Log::new(initiator, seed)).collect();
    let mut start_times = Vec::new();
    let mut kills_while_starting = 0;
    for cycle in 0..kills {
        // Now and then the kill lands while the target opens its store and spaces instead.
        if rng.chance(0.25) {
            let mut child = spawn(dir, CONFIG);
            std::thread::sleep(Duration::from_millis(rng.below(300)));
            child.kill().unwrap();
            child.wait().unwrap();
            kills_while_starting += 1;
            check_metadata(dir);
        }
        let (daemon, addr, serving) = start(dir, CONFIG);
        start_times.push(serving);
        let mut verifier = Client::connect(addr).expect("the restarted target answers");
        let region = verifier.region(REGION).expect("the region is served after a restart").id;
        let disk = verifier.namespace(NAMESPACE).expect("the namespace is served after a restart").clone();
        assert_eq!((disk.capacity_blocks, disk.block_bytes), (SPACE_BYTES / BLOCK_BYTES as u64, BLOCK_BYTES as u32));
        for log in &mut logs {
            log.check(&mut verifier, region, &disk)
                .unwrap_or_else(|error| panic!("SEED={seed} cycle {cycle}: {error}"));
        }
        check_shared_counter(&mut verifier, region, &logs, seed, cycle);
        drop(verifier);

        // Load from every initiator, then SIGKILL at a random moment.
        let killed = Arc::new(AtomicBool::new(false));
        let runners: Vec<_> = logs
            .drain(..)
            .map(|mut log| {
                let killed = killed.clone();
                std::thread::spawn(move || {
                    let result = log.run(addr, &killed);
                    (log, result)
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(20 + rng.below(600)));
        killed.store(true, Ordering::SeqCst);
        daemon.kill();
        for runner in runners {
            let (log, result) = runner.join().expect("an initiator panicked");
            if let Err(error) = result {
                panic!("SEED={seed} cycle {cycle}: {error}");
            }
            logs.push(log);
        }
        check_metadata(dir);
    }
    // The last kill's aftermath.
    let (daemon, addr, serving) = start(dir, CONFIG);
    start_times.push(serving);
    let mut verifier = Client::connect(addr).unwrap();
    let region = verifier.region(REGION).unwrap().id;
    let disk = verifier.namespace(NAMESPACE).unwrap().clone();
    for log in &mut logs {
        log.check(&mut verifier, region, &disk).unwrap_or_else(|error| panic!("SEED={seed} last restart: {error}"));
    }
    check_shared_counter(&mut verifier, region, &logs, seed, kills);
    drop(verifier);
    daemon.kill();
    check_metadata(dir);

    // The checks catch a loss: a logged slot and a logged block changed behind the target's
    // back (a word flipped in each file while it is down) are reported after the restart.
    let slot_log = logs.iter().position(|log| log.slots.iter().any(|slot| slot.durable != 0 && slot.later.is_empty()));
    let block_log = logs.iter().position(|log| log.blocks.iter().any(|block| block.durable != 0));
    let (Some(slot_log), Some(block_log)) = (slot_log, block_log) else {
        panic!("SEED={seed}: no durable slot or block was logged to corrupt")
    };
    let slot = logs[slot_log].slots.iter().position(|slot| slot.durable != 0 && slot.later.is_empty()).unwrap();
    flip_word(&dir.join("crash.region"), logs[slot_log].slot_offset(slot as u64) + 8);
    let block = logs[block_log].blocks.iter().position(|block| block.durable != 0).unwrap();
    flip_word(&dir.join("crash.img"), (logs[block_log].first_block() + block as u64) * BLOCK_BYTES as u64 + 16);
    let (daemon, addr, _) = start(dir, CONFIG);
    let mut verifier = Client::connect(addr).unwrap();
    let slot_error = logs[slot_log].check(&mut verifier, region, &disk).expect_err("a flipped word in a slot is seen");
    assert!(slot_error.contains(&format!("slot {slot}")), "{slot_error}");
    if block_log != slot_log {
        let block_error =
            logs[block_log].check(&mut verifier, region, &disk).expect_err("a flipped word in a block is seen");
        assert!(block_error.contains(&format!("block {block}")), "{block_error}");
    }
    drop(verifier);
    daemon.kill();

    // A start with nothing of the two spaces in the page cache: what a start after a reboot
    // reads. (The other starts found the region's pages still cached from the killed process.)
    for file in ["crash.region", "crash.img"] {
        evict_from_page_cache(&dir.join(file));
    }
    let (daemon, _, cold_start) = start(dir, CONFIG);
    daemon.kill();

    let mut counts = Counts::default();
    logs.iter().for_each(|log| counts.add(&log.counts));
    start_times.sort();
    let millis = |duration: &Duration| duration.as_secs_f64() * 1e3;
    println!(
        "SEED={seed}: {} kills ({kills} under load from {INITIATORS} initiators, {kills_while_starting} while starting); \
         answered operations checked: {} ({} WRITE, {} FETCH_ADD, {} BWRITE with FUA, {} BWRITE, {} FLUSH, {} TRIM); \
         {} left unknown by a kill; lost: none",
        kills + kills_while_starting,
        counts.answered(),
        counts.writes,
        counts.fetch_adds,
        counts.block_writes_fua,
        counts.block_writes,
        counts.flushes,
        counts.trims,
        counts.unknown,
    );
    println!(
        "start to serving, 1 GiB file region + 1 GiB file namespace, {} starts after a kill: min {:.0} ms, \
         median {:.0} ms, max {:.0} ms; with both files evicted from the page cache: {:.0} ms",
        start_times.len(),
        millis(&start_times[0]),
        millis(&start_times[start_times.len() / 2]),
        millis(&start_times[start_times.len() - 1]),
        millis(&cold_start),
    );
    // Every kind of operation was answered and then checked across a kill: a run that checked
    // nothing would pass for the wrong reason.
    for (what, count) in [
        ("WRITE", counts.writes),
        ("FETCH_ADD", counts.fetch_adds),
        ("BWRITE with FUA", counts.block_writes_fua),
        ("BWRITE", counts.block_writes),
        ("FLUSH", counts.flushes),
    ] {
        assert!(count > 0, "SEED={seed}: no {what} was answered in {kills} cycles");
    }
}

/// Inverts the 8-byte word at `offset` of `path` (the target is down).
fn flip_word(path: &Path, offset: u64) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
    let mut word = [0u8; 8];
    file.read_exact_at(&mut word, offset).unwrap();
    file.write_all_at(&(!u64::from_le_bytes(word)).to_le_bytes(), offset).unwrap();
    file.sync_all().unwrap();
}

/// Writes `path`'s dirty pages back and drops its pages from the page cache.
fn evict_from_page_cache(path: &Path) {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).unwrap();
    file.sync_all().unwrap();
    // SAFETY: posix_fadvise on an open descriptor only advises the kernel.
    let status = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(status, 0, "posix_fadvise(DONTNEED) on {}", path.display());
}

/// The shared counter holds at least every answered add and at most every add, answered or not;
/// the answered adds returned distinct values below it (an add applied twice, say a retransmission
/// executed again, would push it over the bound or repeat a value).
fn check_shared_counter(client: &mut Client, region: u16, logs: &[Log], seed: u64, cycle: usize) {
    let mut word = [0u8; 8];
    client.read(region, SHARED_COUNTER, &mut word).unwrap();
    let value = u64::from_le_bytes(word);
    let answered: u64 = logs.iter().map(|log| log.shared_answered).sum();
    let unknown: u64 = logs.iter().map(|log| log.shared_unknown).sum();
    assert!(
        (answered..=answered + unknown).contains(&value),
        "SEED={seed} cycle {cycle}: the shared counter holds {value}, outside {answered}..={} (answered ..= answered + unknown adds)",
        answered + unknown
    );
    let mut returned = HashSet::new();
    for old in logs.iter().flat_map(|log| &log.shared_returned) {
        assert!(*old < value, "SEED={seed} cycle {cycle}: an answered add returned {old}, the counter is {value}");
        assert!(returned.insert(*old), "SEED={seed} cycle {cycle}: two answered adds both returned {old}");
    }
}
