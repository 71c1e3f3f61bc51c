//! VADD at vector speed, and the short per-chunk exclusion that keeps it from losing updates.
//!
//! A lane-by-lane compare-and-swap loop is atomic but slow (one locked instruction per lane:
//! 2048 f32 lanes held a worker about 19 µs). Here a VADD instead adds one chunk of lanes at a
//! time with plain loads and stores that the compiler vectorises, and excludes other adders from
//! that chunk for the few tens of nanoseconds it takes: a small fixed table of spin flags, keyed
//! by the chunk's address, one flag taken at a time (so no deadlock), never allocated, never a
//! system call while nobody else holds it. CAS and FETCH_ADD take the flag of their word's chunk
//! too, so they stay atomic against VADD (see `docs/DECISIONS.md` for the choice and figures).
//!
//! The flags are keyed by address in this process: every worker thread (and the in-process FPGA
//! model) shares them. Another process mapping the same file does not; the protocol promises
//! atomicity only among instructions executed by one target.

use core::sync::atomic::{AtomicBool, Ordering};

use crate::limits::{VADD_CHUNK_BYTES, VADD_CHUNK_LOCKS};
use crate::memory::SharedMemory;
use crate::opcode::LaneType;

/// One spin flag, alone in its cache line so that adders of neighbouring chunks do not bounce
/// each other's line.
#[repr(align(64))]
struct ChunkLock(AtomicBool);

static CHUNK_LOCKS: [ChunkLock; VADD_CHUNK_LOCKS] = [const { ChunkLock(AtomicBool::new(false)) }; VADD_CHUNK_LOCKS];

/// Spins before a waiter starts yielding its core: far longer than any holder needs (one chunk's
/// add is well under a microsecond), so a yield happens only when the holder's thread was
/// descheduled mid-add (more threads than cores), where spinning on would only delay it more.
const SPINS_BEFORE_YIELD: u32 = 1 << 14;

/// Holds a chunk's flag; releases it when dropped.
pub struct ChunkGuard {
    lock: &'static AtomicBool,
}

impl Drop for ChunkGuard {
    fn drop(&mut self) {
        self.lock.store(false, Ordering::Release);
    }
}

/// Index in the flag table of the chunk holding the byte at `address`.
fn lock_index(address: usize) -> usize {
    (address / VADD_CHUNK_BYTES) % VADD_CHUNK_LOCKS
}

/// Takes the flag of the chunk that holds the byte at `address` (an address in this process).
/// Callers hold at most one at a time.
pub fn lock_chunk(address: usize) -> ChunkGuard {
    let lock = &CHUNK_LOCKS[lock_index(address)].0;
    let mut spins = 0u32;
    loop {
        if !lock.swap(true, Ordering::Acquire) {
            return ChunkGuard { lock };
        }
        while lock.load(Ordering::Relaxed) {
            core::hint::spin_loop();
            spins = spins.saturating_add(1);
            if spins >= SPINS_BEFORE_YIELD {
                std::thread::yield_now();
            }
        }
    }
}

/// Adds `operand`'s lanes into `memory` at `start` (lane-aligned, in bounds: checked by the
/// caller), one chunk at a time under its flag, so concurrent VADDs, CAS and FETCH_ADD on the
/// same lanes lose no update. The new lane values go to `result` when it is not empty (then it
/// is as long as `operand`).
pub fn vadd(memory: &SharedMemory<'_>, start: usize, lane: LaneType, operand: &[u8], result: &mut [u8]) {
    update_chunks(memory, start, operand, result, |stored, addend| add_lanes(lane, stored, addend));
}

/// Replaces each lane of `memory` at `start` by the larger of it and `operand`'s lane (the
/// `vmax` extension), under the same per-chunk flags as VADD, so concurrent VMAX, VADD, CAS
/// and FETCH_ADD lose no update. Float lanes skip NaN (a NaN operand lane leaves memory as it
/// is; a NaN in memory gives way to a number).
pub fn vmax(memory: &SharedMemory<'_>, start: usize, lane: LaneType, operand: &[u8]) {
    update_chunks(memory, start, operand, &mut [], |stored, other| max_lanes(lane, stored, other));
}

/// Applies `update(stored_chunk, operand_chunk)` to memory one chunk at a time, each under its
/// flag; the updated bytes go to `result` when it is not empty.
fn update_chunks(
    memory: &SharedMemory<'_>,
    start: usize,
    operand: &[u8],
    result: &mut [u8],
    update: impl Fn(&mut [u8], &[u8]),
) {
    debug_assert!(result.is_empty() || result.len() == operand.len(), "result holds every lane or none");
    let base = memory.base() as usize;
    let mut done = 0;
    while done < operand.len() {
        let at = start + done;
        // Up to the end of the chunk that holds `at`: chunk boundaries are multiples of the lane
        // sizes, so no lane straddles two chunks.
        let chunk_end = ((base + at) / VADD_CHUNK_BYTES + 1) * VADD_CHUNK_BYTES - base;
        let len = (chunk_end - at).min(operand.len() - done);
        let addend = &operand[done..done + len];
        let mut lanes = [0u8; VADD_CHUNK_BYTES];
        let lanes = &mut lanes[..len];
        {
            let _guard = lock_chunk(base + at);
            memory.read(at, lanes);
            update(lanes, addend);
            memory.write(at, lanes);
        }
        if !result.is_empty() {
            result[done..done + len].copy_from_slice(lanes);
        }
        done += len;
    }
}

/// `stored[i] = max(stored[i], other[i])` for every lane (floats skip NaN).
pub fn max_lanes(lane: LaneType, stored: &mut [u8], other: &[u8]) {
    match lane {
        LaneType::F32 => {
            for (stored, other) in stored.chunks_exact_mut(4).zip(other.chunks_exact(4)) {
                let max = f32::from_le_bytes([stored[0], stored[1], stored[2], stored[3]])
                    .max(f32::from_le_bytes([other[0], other[1], other[2], other[3]]));
                stored.copy_from_slice(&max.to_le_bytes());
            }
        }
        LaneType::I32 => {
            for (stored, other) in stored.chunks_exact_mut(4).zip(other.chunks_exact(4)) {
                let max = i32::from_le_bytes([stored[0], stored[1], stored[2], stored[3]])
                    .max(i32::from_le_bytes([other[0], other[1], other[2], other[3]]));
                stored.copy_from_slice(&max.to_le_bytes());
            }
        }
        LaneType::Bf16 => {
            for (stored, other) in stored.chunks_exact_mut(2).zip(other.chunks_exact(2)) {
                let (mine, theirs) =
                    (u16::from_le_bytes([stored[0], stored[1]]), u16::from_le_bytes([other[0], other[1]]));
                // Exact: bf16 widens to f32 without rounding, so the larger keeps its own bits.
                let max =
                    if bf16_to_f32(theirs) > bf16_to_f32(mine) || bf16_to_f32(mine).is_nan() { theirs } else { mine };
                stored.copy_from_slice(&max.to_le_bytes());
            }
        }
    }
}

/// `stored[i] += addend[i]` for every lane, in the lane type's arithmetic; both are
/// little-endian lanes of equal length.
pub fn add_lanes(lane: LaneType, stored: &mut [u8], addend: &[u8]) {
    match lane {
        LaneType::F32 => add_f32(stored, addend),
        LaneType::I32 => add_i32(stored, addend),
        LaneType::Bf16 => add_bf16(stored, addend),
    }
}

// The loops below are written so the compiler turns them into vector instructions (fixed-size
// lane arrays from and to little-endian bytes, no branches but selects).

fn add_f32(stored: &mut [u8], addend: &[u8]) {
    for (stored, addend) in stored.chunks_exact_mut(4).zip(addend.chunks_exact(4)) {
        let sum = f32::from_le_bytes([stored[0], stored[1], stored[2], stored[3]])
            + f32::from_le_bytes([addend[0], addend[1], addend[2], addend[3]]);
        stored.copy_from_slice(&sum.to_le_bytes());
    }
}

fn add_i32(stored: &mut [u8], addend: &[u8]) {
    for (stored, addend) in stored.chunks_exact_mut(4).zip(addend.chunks_exact(4)) {
        let sum = i32::from_le_bytes([stored[0], stored[1], stored[2], stored[3]])
            .wrapping_add(i32::from_le_bytes([addend[0], addend[1], addend[2], addend[3]]));
        stored.copy_from_slice(&sum.to_le_bytes());
    }
}

fn add_bf16(stored: &mut [u8], addend: &[u8]) {
    for (stored, addend) in stored.chunks_exact_mut(2).zip(addend.chunks_exact(2)) {
        let sum = bf16_to_f32(u16::from_le_bytes([stored[0], stored[1]]))
            + bf16_to_f32(u16::from_le_bytes([addend[0], addend[1]]));
        stored.copy_from_slice(&f32_to_bf16(sum).to_le_bytes());
    }
}

/// Widens a bfloat16 to f32 (exact).
#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// Narrows an f32 to bfloat16, rounding to nearest even and keeping NaNs NaN (quiet).
#[inline]
pub fn f32_to_bf16(value: f32) -> u16 {
    let bits = value.to_bits();
    let rounding = 0x7FFF + ((bits >> 16) & 1);
    let rounded = (bits.wrapping_add(rounding) >> 16) as u16;
    let quiet_nan = ((bits >> 16) as u16) | 0x0040;
    // A select rather than an early return, so the lane loop stays branch-free.
    if value.is_nan() {
        quiet_nan
    } else {
        rounded
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_split_at_chunk_boundaries_and_every_lane_is_added_once() {
        let mut words = vec![0u64; 3 * VADD_CHUNK_BYTES / 8];
        let memory = SharedMemory::from_words(&mut words);
        // Starts 4 bytes before a chunk boundary and crosses the next one too.
        let start = VADD_CHUNK_BYTES - 4;
        let lanes = (VADD_CHUNK_BYTES + 8) / 4;
        let operand: Vec<u8> = (1..=lanes as i32).flat_map(|value| value.to_le_bytes()).collect();
        let mut result = vec![0u8; operand.len()];
        vadd(&memory, start, LaneType::I32, &operand, &mut result);
        vadd(&memory, start, LaneType::I32, &operand, &mut []);
        let mut stored = vec![0u8; memory.len()];
        memory.read(0, &mut stored);
        for index in 0..memory.len() / 4 {
            let value = i32::from_le_bytes(stored[index * 4..index * 4 + 4].try_into().unwrap());
            let lane = (index * 4).checked_sub(start).map(|byte| byte / 4).filter(|&lane| lane < lanes);
            let expected = lane.map_or(0, |lane| 2 * (lane as i32 + 1));
            assert_eq!(value, expected, "byte {}", index * 4);
        }
        let first: Vec<i32> = result.chunks_exact(4).map(|lane| i32::from_le_bytes(lane.try_into().unwrap())).collect();
        assert_eq!(first, (1..=lanes as i32).collect::<Vec<_>>(), "the result is the sum after the first add");
    }

    #[test]
    fn bf16_rounding_is_to_nearest_even_and_nan_stays_nan() {
        assert_eq!(f32_to_bf16(1.0), 0x3F80);
        // 1 + 2^-8 lies halfway between two bf16 values: ties go to the even one (1.0).
        assert_eq!(f32_to_bf16(1.0 + 1.0 / 256.0), 0x3F80);
        // 1 + 3 * 2^-8 is halfway too: the even neighbour is above.
        assert_eq!(f32_to_bf16(1.0 + 3.0 / 256.0), 0x3F82);
        assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
        assert_eq!(f32_to_bf16(f32::INFINITY), 0x7F80);
    }
}
