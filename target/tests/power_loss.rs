//! Power loss, simulated on the block layer: the target serves a namespace on the crash-test
//! device, a client runs random writes (with and without FUA), flushes and trims, and at random
//! moments the device draws an image a power cut could leave (`CrashImage::power_cut`: per
//! 512-byte sector, the durable bytes or those of any write completed since, so unflushed writes
//! are lost, reordered and torn). On every image the durability contract of DESIGN.md holds:
//! each sector holds its block's last durable version (a FUA write, or a write or trim answered
//! before an answered FLUSH) or a version written after it.
//!
//! The same for a persistent memory region on the crash-test region (`Region::crash_test`:
//! persisted cache lines are durable, every 8-byte word stored since survives or not on its
//! own): after each answered WRITE or FETCH_ADD (alone, several to a datagram, or a write split
//! over datagrams), every power-cut image holds every answered byte.
//!
//! Runs `NETDAM_POWER_CUT_SEEDS` seeds (default 32) from `NETDAM_SEED`, printed first.

mod common;

use std::sync::Arc;

use common::durability::{holds, pattern, Candidates};
use common::{seed, Rng, TestTarget};
use netdam_initiator::{Client, Op};
use netdam_nvme::{BlockDevice, CrashImage};
use netdam_pmem::Region;
use netdam_target::config::{Config, PollMode};
use netdam_target::namespaces::Namespace;
use netdam_target::Target;

const BLOCK_BYTES: usize = 4096;
const BLOCKS: u64 = 64;
/// The smallest unit a power cut may tear a write at: a 512-byte sector.
const SECTOR_BYTES: usize = 512;
const STEPS: usize = 150;
const KIND: u64 = 3;

fn start(image: &CrashImage) -> TestTarget {
    start_with(image, Vec::new())
}

fn start_with(image: &CrashImage, regions: Vec<Region>) -> TestTarget {
    let dir = tempfile::tempdir().expect("temp dir");
    let device_image = image.clone();
    let factory = Arc::new(move |max_transfer: usize, _: netdam_nvme::Submission| {
        Ok(Box::new(device_image.device(64, max_transfer)?) as Box<dyn BlockDevice>)
    });
    let namespace = Namespace::new("cut", "crash-test device", BLOCK_BYTES as u32, BLOCKS, factory);
    let config = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        metrics_listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: Some(dir.path().to_path_buf()),
        poll: PollMode::Blocking,
        regions: vec![common::region("mem", 1 << 20, false)],
        busy_threshold_us: 60_000,
        pin_workers: false,
        lock_memory: false,
        auth: netdam_target::AuthMode::None,
        ..Config::default()
    };
    let target = Target::start_with_spaces(&config, regions, vec![namespace]).expect("target starts");
    TestTarget { target, dir }
}

/// What the power cuts of one run did.
#[derive(Debug, Default)]
struct Observed {
    images: u64,
    /// Sectors an image held older than what reads saw: answered writes a cut lost.
    sectors_lost: u64,
    /// Blocks an image held sectors of two versions of: torn writes.
    blocks_torn: u64,
}

fn run(seed: u64, observed: &mut Observed) {
    let mut rng = Rng::new(seed);
    let image = CrashImage::new(BLOCK_BYTES as u32, BLOCKS);
    let test = start(&image);
    let mut client = Client::connect(test.target.local_addr()).unwrap();
    let disk = client.namespace("cut").unwrap().clone();
    let mut blocks = vec![Candidates::default(); BLOCKS as usize];
    for step in 0..STEPS {
        let version = step as u64 + 1;
        let choice = rng.below(100);
        if choice < 70 {
            let count = 1 + rng.below(4);
            let first = rng.below(BLOCKS - count + 1);
            let fua = rng.chance(0.3);
            let data: Vec<u8> =
                (first..first + count).flat_map(|block| pattern(seed, KIND, 0, block, version, BLOCK_BYTES)).collect();
            client.block_write(&disk, first, &data, fua).unwrap();
            for block in first..first + count {
                if fua {
                    blocks[block as usize].made_durable(version);
                } else {
                    blocks[block as usize].later.push((version, true));
                }
            }
        } else if choice < 85 {
            client.block_flush(&disk).unwrap();
            blocks.iter_mut().for_each(Candidates::flushed);
        } else {
            let count = 1 + rng.below(4);
            let first = rng.below(BLOCKS - count + 1);
            client.trim(&disk, first, count as u32).unwrap();
            for block in first..first + count {
                blocks[block as usize].later.push((0, true));
            }
        }
        if !rng.chance(0.3) {
            continue;
        }
        let cut = image.power_cut(rng.next_u64(), SECTOR_BYTES);
        let written = image.written();
        observed.images += 1;
        for (index, candidates) in blocks.iter().enumerate() {
            let block = &cut[index * BLOCK_BYTES..(index + 1) * BLOCK_BYTES];
            let mut versions_seen = Vec::new();
            for (sector, bytes) in block.chunks_exact(SECTOR_BYTES).enumerate() {
                let first_word = sector * SECTOR_BYTES / 8;
                let found = candidates.versions().find(|&v| holds(bytes, seed, KIND, 0, index as u64, v, first_word));
                let Some(found) = found else {
                    panic!(
                        "SEED={seed} step {step}: block {index} sector {sector} of a power-cut image holds none of \
                         the versions it may (durable {}, later {:?})",
                        candidates.durable, candidates.later
                    );
                };
                if !versions_seen.contains(&found) {
                    versions_seen.push(found);
                }
                let at = index * BLOCK_BYTES + sector * SECTOR_BYTES;
                if *bytes != written[at..at + SECTOR_BYTES] {
                    observed.sectors_lost += 1;
                }
            }
            if versions_seen.len() > 1 {
                observed.blocks_torn += 1;
            }
        }
    }
}

fn seeds() -> u64 {
    match std::env::var("NETDAM_POWER_CUT_SEEDS") {
        Ok(text) => text.parse().unwrap_or_else(|_| panic!("NETDAM_POWER_CUT_SEEDS={text:?}: give a number")),
        Err(_) => 32,
    }
}

#[test]
fn every_power_cut_image_keeps_what_was_made_durable() {
    let first = seed();
    let seeds = seeds();
    let mut observed = Observed::default();
    for round in 0..seeds {
        run(first.wrapping_add(round), &mut observed);
    }
    println!(
        "SEED={first}: {seeds} seeds, {} power-cut images checked; {} sectors lost answered but unflushed \
         writes, {} blocks torn between versions",
        observed.images, observed.sectors_lost, observed.blocks_torn
    );
    // The images must exercise what a cut may do, or the contract was checked against nothing.
    assert!(observed.images > 0 && observed.sectors_lost > 0, "no image lost an unflushed write: {observed:?}");
    assert!(observed.blocks_torn > 0, "no image tore a block: {observed:?}");
}

const REGION_BYTES: usize = 64 << 10;

/// Answered WRITEs and FETCH_ADDs to a crash-test region, then power cuts: every image holds
/// the region exactly as the answers left it.
#[test]
fn every_power_cut_image_of_a_region_holds_every_answered_write() {
    let first = seed();
    let mut images = 0;
    for round in 0..seeds() {
        let seed = first.wrapping_add(round);
        let mut rng = Rng::new(seed);
        let region = Region::crash_test("pmem-cut", REGION_BYTES as u64).unwrap();
        let test = start_with(&CrashImage::new(BLOCK_BYTES as u32, 1), vec![region]);
        let mut client = Client::connect(test.target.local_addr()).unwrap();
        let id = client.region("pmem-cut").unwrap().id;
        assert!(client.region("pmem-cut").unwrap().persistent, "the crash-test region is persistent");
        let served = test.target.regions().get(id).unwrap();
        // What every answer said the region holds.
        let mut model = vec![0u8; REGION_BYTES];
        for step in 0..100 {
            match rng.below(3) {
                0 => {
                    // One write, split over datagrams when long.
                    let len = 8 * (1 + rng.below(3000) as usize);
                    let offset = 8 * rng.below(((REGION_BYTES - len) / 8) as u64 + 1) as usize;
                    let data = rng.bytes(len);
                    client.write(id, offset as u64, &data).unwrap();
                    model[offset..offset + len].copy_from_slice(&data);
                }
                1 => {
                    // Several small writes and adds in one datagram: one group commit.
                    let mut ops = Vec::new();
                    // Per instruction: its offset, and the bytes written or the addend added.
                    let mut changes: Vec<(usize, Result<Vec<u8>, u64>)> = Vec::new();
                    for _ in 0..1 + rng.below(6) {
                        let offset = 8 * rng.below((REGION_BYTES / 8) as u64 - 8) as usize;
                        if rng.chance(0.5) {
                            let data = rng.bytes(64);
                            ops.push(Op::write(id, offset as u64, &data));
                            changes.push((offset, Ok(data)));
                        } else {
                            let addend = 1 + rng.below(1000);
                            ops.push(Op::fetch_add(id, offset as u64, addend));
                            changes.push((offset, Err(addend)));
                        }
                    }
                    let reply = client.call(&ops).unwrap();
                    for (index, (offset, change)) in changes.into_iter().enumerate() {
                        let result = reply.data(index).unwrap();
                        match change {
                            Ok(data) => model[offset..offset + data.len()].copy_from_slice(&data),
                            Err(addend) => {
                                let old = u64::from_le_bytes(result.try_into().unwrap());
                                assert_eq!(old.to_le_bytes(), model[offset..offset + 8], "SEED={seed} step {step}");
                                model[offset..offset + 8].copy_from_slice(&old.wrapping_add(addend).to_le_bytes());
                            }
                        }
                    }
                }
                _ => {
                    let offset = 8 * rng.below((REGION_BYTES / 8) as u64) as usize;
                    let old = client.fetch_add(id, offset as u64, 7).unwrap();
                    model[offset..offset + 8].copy_from_slice(&old.wrapping_add(7).to_le_bytes());
                }
            }
            let cut = served.power_cut(rng.next_u64()).expect("a crash-test region draws power cuts");
            images += 1;
            if let Some(word) =
                (0..REGION_BYTES / 8).find(|word| cut[word * 8..word * 8 + 8] != model[word * 8..word * 8 + 8])
            {
                panic!("SEED={seed} step {step}: a power cut loses the answered word at offset {}", word * 8);
            }
        }
        // The image is not simply what memory holds: a store nobody persisted survives some
        // cuts and not others.
        served.memory().write(0, &[0xEE; 8]);
        let first_words: Vec<[u8; 8]> =
            (0..32).map(|draw| served.power_cut(draw).unwrap()[..8].try_into().unwrap()).collect();
        assert!(
            first_words.contains(&[0xEE; 8]) && first_words.iter().any(|word| word[..] == model[..8]),
            "SEED={seed}: an unpersisted store survived every cut, or none"
        );
    }
    println!("SEED={first}: {} seeds, {images} power-cut images of a region checked against every answer", seeds());
}
