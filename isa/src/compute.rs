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
    update_chunks(memory, start, Update::Add, lane, operand, result);
}

/// Replaces each lane in `memory` at `start` with the larger of it and `operand`'s lane, under
/// the same per-chunk flags as VADD (the `vmax` extension).
pub fn vmax(memory: &SharedMemory<'_>, start: usize, lane: LaneType, operand: &[u8]) {
    update_chunks(memory, start, Update::Max, lane, operand, &mut []);
}

/// What a chunk update does to each stored lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Update {
    Add,
    Max,
}

fn update_chunks(
    memory: &SharedMemory<'_>,
    start: usize,
    update: Update,
    lane: LaneType,
    operand: &[u8],
    result: &mut [u8],
) {
    debug_assert!(result.is_empty() || result.len() == operand.len(), "result holds every lane or none");
    let base = memory.base() as usize;
    let in_memory = memory.range(start as u64, operand.len());
    assert!(in_memory.is_some(), "VADD {start}+{} beyond memory: the executor must bounds-check", operand.len());
    // Every line of the range is asked for before the first chunk's flag is taken, so the adds
    // do not wait for memory one line at a time (the target's handling of a VADD of 8 KiB at
    // random offsets: 1.42 -> 1.31 µs; docs/DECISIONS.md).
    memory.prefetch(start as u64, operand.len(), true);
    let mut done = 0;
    while done < operand.len() {
        let at = start + done;
        let chunk_end = ((base + at) / VADD_CHUNK_BYTES + 1) * VADD_CHUNK_BYTES - base;
        let len = (chunk_end - at).min(operand.len() - done);
        let other = &operand[done..done + len];
        {
            let _guard = lock_chunk(base + at);
            // SAFETY: `at..at + len` lies within the memory (asserted above for the whole
            // operand); the chunk's flag excludes every other adder, and `other` is a caller
            // buffer outside the region. Lanes are updated in place, read and written through
            // raw pointers (no reference to shared memory is formed).
            unsafe { update_in_place(update, lane, memory.base().add(at), other) };
            if !result.is_empty() {
                // Copied under the flag: the values this add produced, before any later add.
                memory.read(at, &mut result[done..done + len]);
            }
        }
        done += len;
    }
}

/// Updates `other.len()` bytes of lanes at `stored` in place, with the widest vector unit the CPU
/// has (AVX2 where present, detected once; the portable build otherwise).
///
/// # Safety
/// `stored..stored + other.len()` must be valid for reads and writes and not overlap `other`.
unsafe fn update_in_place(update: Update, lane: LaneType, stored: *mut u8, other: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (checked); the pointer contract is the caller's.
        return unsafe { update_in_place_avx2(update, lane, stored, other) };
    }
    // SAFETY: the caller's contract.
    unsafe { update_lanes(update, lane, stored, other) }
}

/// `update_lanes` compiled for AVX2 (8 f32 lanes per instruction instead of SSE2's 4).
///
/// # Safety
/// AVX2 must be present; otherwise as `update_in_place`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn update_in_place_avx2(update: Update, lane: LaneType, stored: *mut u8, other: &[u8]) {
    // SAFETY: the caller's contract.
    unsafe { update_lanes(update, lane, stored, other) }
}

/// Lanes handled per step: one 32-byte vector of f32/i32, two of bf16 once widened.
const STEP_BYTES: usize = 32;

/// The lane loops, in steps of `STEP_BYTES` that the compiler turns into vector instructions
/// (fixed-size arrays read and written unaligned), then the tail lane by lane. The operation is
/// chosen once, outside the loop: a choice inside it kept each step's lanes on the stack (a
/// store and reload per step) and cost 379 against 226 ns per 8 KiB f32 VADD in cache.
///
/// # Safety
/// As `update_in_place`.
#[inline(always)]
unsafe fn update_lanes(update: Update, lane: LaneType, stored: *mut u8, other: &[u8]) {
    // SAFETY (every arm): the caller's contract.
    unsafe {
        match (update, lane) {
            (Update::Add, LaneType::F32) => each_step(stored, other, |mine, theirs| {
                each_u32(mine, theirs, |a, b| (f32::from_bits(a) + f32::from_bits(b)).to_bits())
            }),
            (Update::Add, LaneType::I32) => {
                each_step(stored, other, |mine, theirs| each_u32(mine, theirs, |a, b| a.wrapping_add(b)))
            }
            (Update::Add, LaneType::Bf16) => each_step(stored, other, |mine, theirs| {
                each_u16(mine, theirs, |a, b| f32_to_bf16(bf16_to_f32(a) + bf16_to_f32(b)))
            }),
            (Update::Max, LaneType::F32) => each_step(stored, other, |mine, theirs| {
                each_u32(mine, theirs, |a, b| f32::from_bits(a).max(f32::from_bits(b)).to_bits())
            }),
            (Update::Max, LaneType::I32) => {
                each_step(stored, other, |mine, theirs| each_u32(mine, theirs, |a, b| (a as i32).max(b as i32) as u32))
            }
            (Update::Max, LaneType::Bf16) => each_step(stored, other, |mine, theirs| {
                each_u16(mine, theirs, |a, b| {
                    // The other lane wins when larger or when ours is NaN (as f32::max).
                    let (x, y) = (bf16_to_f32(a), bf16_to_f32(b));
                    if y > x || x.is_nan() {
                        b
                    } else {
                        a
                    }
                })
            }),
        }
    }
}

/// Applies `step` to every `STEP_BYTES` of lanes at `stored` with those of `other`, in place,
/// then to the tail (padded with zero lanes, of which only the tail's bytes are written back).
///
/// # Safety
/// As `update_in_place`.
#[inline(always)]
unsafe fn each_step(stored: *mut u8, other: &[u8], step: impl Fn(&mut [u8; STEP_BYTES], &[u8; STEP_BYTES])) {
    let whole = other.len() / STEP_BYTES * STEP_BYTES;
    let mut at = 0;
    while at < whole {
        // SAFETY: `at + STEP_BYTES <= other.len()`, within the caller's valid range.
        let target = unsafe { stored.add(at) };
        // SAFETY: as above; unaligned reads and writes of plain bytes.
        let mut mine = unsafe { core::ptr::read_unaligned(target.cast::<[u8; STEP_BYTES]>()) };
        let theirs: &[u8; STEP_BYTES] = other[at..at + STEP_BYTES].try_into().expect("a whole step");
        step(&mut mine, theirs);
        // SAFETY: as above.
        unsafe { core::ptr::write_unaligned(target.cast::<[u8; STEP_BYTES]>(), mine) };
        at += STEP_BYTES;
    }
    if at < other.len() {
        let tail = other.len() - at;
        let mut mine = [0u8; STEP_BYTES];
        // SAFETY: `at + tail == other.len()`, within the caller's valid range.
        unsafe { core::ptr::copy_nonoverlapping(stored.add(at), mine.as_mut_ptr(), tail) };
        let mut theirs = [0u8; STEP_BYTES];
        theirs[..tail].copy_from_slice(&other[at..]);
        step(&mut mine, &theirs);
        // SAFETY: as above; only the tail's bytes are written back.
        unsafe { core::ptr::copy_nonoverlapping(mine.as_ptr(), stored.add(at), tail) };
    }
}

#[inline(always)]
fn each_u32(mine: &mut [u8; STEP_BYTES], theirs: &[u8; STEP_BYTES], op: impl Fn(u32, u32) -> u32) {
    for (mine, theirs) in mine.chunks_exact_mut(4).zip(theirs.chunks_exact(4)) {
        let a = u32::from_le_bytes([mine[0], mine[1], mine[2], mine[3]]);
        let b = u32::from_le_bytes([theirs[0], theirs[1], theirs[2], theirs[3]]);
        mine.copy_from_slice(&op(a, b).to_le_bytes());
    }
}

#[inline(always)]
fn each_u16(mine: &mut [u8; STEP_BYTES], theirs: &[u8; STEP_BYTES], op: impl Fn(u16, u16) -> u16) {
    for (mine, theirs) in mine.chunks_exact_mut(2).zip(theirs.chunks_exact(2)) {
        let a = u16::from_le_bytes([mine[0], mine[1]]);
        let b = u16::from_le_bytes([theirs[0], theirs[1]]);
        mine.copy_from_slice(&op(a, b).to_le_bytes());
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

    /// The lane-by-lane definition the vector loops must match bit for bit.
    fn reference(update: Update, lane: LaneType, stored: &mut [u8], other: &[u8]) {
        match lane {
            LaneType::F32 | LaneType::I32 => {
                for (mine, theirs) in stored.chunks_exact_mut(4).zip(other.chunks_exact(4)) {
                    let (a, b) = (
                        u32::from_le_bytes(mine[..4].try_into().unwrap()),
                        u32::from_le_bytes(theirs.try_into().unwrap()),
                    );
                    let (x, y) = (f32::from_bits(a), f32::from_bits(b));
                    let new = match (update, lane) {
                        (Update::Add, LaneType::F32) => (x + y).to_bits(),
                        (Update::Max, LaneType::F32) => x.max(y).to_bits(),
                        (Update::Add, _) => (a as i32).wrapping_add(b as i32) as u32,
                        (Update::Max, _) => (a as i32).max(b as i32) as u32,
                    };
                    mine.copy_from_slice(&new.to_le_bytes());
                }
            }
            LaneType::Bf16 => {
                for (mine, theirs) in stored.chunks_exact_mut(2).zip(other.chunks_exact(2)) {
                    let (a, b) = (
                        u16::from_le_bytes(mine[..2].try_into().unwrap()),
                        u16::from_le_bytes(theirs.try_into().unwrap()),
                    );
                    let (x, y) = (bf16_to_f32(a), bf16_to_f32(b));
                    let new = match update {
                        Update::Add => f32_to_bf16(x + y),
                        Update::Max if y > x || x.is_nan() => b,
                        Update::Max => a,
                    };
                    mine.copy_from_slice(&new.to_le_bytes());
                }
            }
        }
    }

    /// Lane bit patterns that exercise the edges: NaNs, infinities, zeros of both signs,
    /// subnormals, carries into the sign bit, and bf16 values that round either way.
    fn lane_bytes(rng: &mut crate::rng::Rng, len: usize) -> Vec<u8> {
        const SPECIAL: [u32; 10] = [
            0x7FC0_0000,
            0xFFC0_0001,
            0x7F80_0000,
            0xFF80_0000,
            0,
            0x8000_0000,
            1,
            0x7FFF_FFFF,
            0x3F80_8000,
            0x3F81_8000,
        ];
        let mut bytes = rng.bytes(len);
        for word in bytes.chunks_exact_mut(4) {
            if rng.chance(0.2) {
                word.copy_from_slice(&SPECIAL[rng.below(SPECIAL.len() as u64) as usize].to_le_bytes());
            }
        }
        bytes
    }

    /// Lane by lane, the same bits, or NaN in both: which NaN an operation on NaNs gives is not
    /// specified (the compiler may swap the operands of an add), only that it is a NaN.
    fn same_lanes(lane: LaneType, got: &[u8], want: &[u8]) -> bool {
        got.len() == want.len()
            && match lane {
                LaneType::I32 => got == want,
                LaneType::F32 => got.chunks_exact(4).zip(want.chunks_exact(4)).all(|(a, b)| {
                    let (a, b) = (f32::from_le_bytes(a.try_into().unwrap()), f32::from_le_bytes(b.try_into().unwrap()));
                    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
                }),
                LaneType::Bf16 => got.chunks_exact(2).zip(want.chunks_exact(2)).all(|(a, b)| {
                    let (a, b) = (u16::from_le_bytes([a[0], a[1]]), u16::from_le_bytes([b[0], b[1]]));
                    a == b || (bf16_to_f32(a).is_nan() && bf16_to_f32(b).is_nan())
                }),
            }
    }

    #[test]
    fn vector_loops_match_the_lane_by_lane_definition_for_every_lane_type_length_and_start() {
        let mut rng = crate::rng::Rng::new(0x5EED_0ADD);
        for round in 0..3000 {
            let lane = [LaneType::F32, LaneType::I32, LaneType::Bf16][round % 3];
            let update = if round % 2 == 0 { Update::Add } else { Update::Max };
            let lane_bytes_len = lane.lane_bytes();
            let len = rng.below(3 * VADD_CHUNK_BYTES as u64 / 4) as usize / 4 * 4;
            let start = rng.below(VADD_CHUNK_BYTES as u64) as usize / lane_bytes_len * lane_bytes_len;
            let mut words = vec![0u64; 2 * VADD_CHUNK_BYTES / 8 + 1];
            let memory = SharedMemory::from_words(&mut words);
            let before = lane_bytes(&mut rng, memory.len() / 4 * 4);
            memory.write(0, &before);
            let operand = lane_bytes(&mut rng, len);
            let mut result = if rng.chance(0.5) { vec![0u8; len] } else { Vec::new() };
            update_chunks(&memory, start, update, lane, &operand, &mut result);
            let mut expected = before.clone();
            reference(update, lane, &mut expected[start..start + len], &operand);
            let mut stored = vec![0u8; before.len()];
            memory.read(0, &mut stored);
            assert!(
                same_lanes(lane, &stored, &expected),
                "round {round}: {update:?} {lane:?} of {len} bytes at {start}"
            );
            if !result.is_empty() {
                assert!(same_lanes(lane, &result, &expected[start..start + len]), "round {round}: the returned lanes");
            }
        }
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
