//! REDUCE (`0x80`): the sum, minimum or maximum of the lanes of a range of a region, computed
//! where the data sits, so a check of a result buffer costs 8 bytes on the wire instead of the
//! whole buffer.
//!
//! Fields (see `docs/PROTOCOL.md`): `aux` = lane type (low byte: `0` f32, `1` i32, `2` bf16) |
//! operation << 8 (`0` sum, `1` min, `2` max); no flags, no operand; length = bytes of lanes,
//! 1 to [`REDUCE_MAX_BYTES`]. Answer: 8 bytes, an `i64` for i32 lanes (sums exact), an `f64`
//! for f32 and bf16 lanes. Float sums add lane `i` into accumulator `i mod 8` in f64 and then
//! the eight accumulators in order: deterministic, so one range always gives the same bits.
//! Float minimum and maximum skip NaN lanes (NaN only when every lane is).

use super::{Alignment, ByteBounds, ExtensionCall, ExtensionHandler, ExtensionOutcome, ExtensionSpec, Permissions};
use crate::compute::bf16_to_f32;
use crate::opcode::LaneType;
use crate::status::Status;

/// REDUCE's opcode number.
pub const REDUCE_OPCODE: u8 = 0x80;

/// Largest range one REDUCE addresses: 64 KiB of lanes, a few microseconds of the worker (the
/// same order as the largest VADD); an initiator splits longer ranges.
pub const REDUCE_MAX_BYTES: usize = 64 << 10;

/// Bytes of REDUCE's answer.
pub const REDUCE_ANSWER_BYTES: usize = 8;

/// Lane bytes read per pass into the worker's stack.
const PASS_BYTES: usize = 4096;

/// Accumulators of a float sum (see the module comment).
const SUM_ACCUMULATORS: usize = 8;

/// What REDUCE computes over the lanes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ReduceOp {
    /// The sum.
    Sum = 0,
    /// The smallest lane.
    Min = 1,
    /// The largest lane.
    Max = 2,
}

impl ReduceOp {
    /// The operation with this number.
    pub fn from_u8(value: u8) -> Option<ReduceOp> {
        match value {
            0 => Some(ReduceOp::Sum),
            1 => Some(ReduceOp::Min),
            2 => Some(ReduceOp::Max),
            _ => None,
        }
    }
}

/// REDUCE's `aux`: the lane type and the operation.
pub fn reduce_aux(lane: LaneType, op: ReduceOp) -> u32 {
    lane as u32 | (op as u32) << 8
}

/// The REDUCE handler.
#[derive(Debug, Clone, Copy, Default)]
pub struct Reduce;

impl ExtensionHandler for Reduce {
    fn spec(&self) -> ExtensionSpec {
        ExtensionSpec {
            opcode: REDUCE_OPCODE,
            name: "reduce",
            idempotent: true,
            permissions: Permissions::READ,
            flags: 0,
            aux_max: reduce_aux(LaneType::Bf16, ReduceOp::Max),
            operand_bytes: ByteBounds::exactly(0),
            operand_is_length: false,
            length_bytes: ByteBounds { min: 1, max: REDUCE_MAX_BYTES },
            alignment: Alignment::LaneInAuxLowByte,
            answer_bytes_max: REDUCE_ANSWER_BYTES,
        }
    }

    fn execute(&self, call: &ExtensionCall<'_>, answer: &mut [u8]) -> Result<ExtensionOutcome, Status> {
        // The registry checked the lane type (alignment), the bound of aux, and that the length
        // is a whole, non-zero number of lanes; the operation number is ours to check.
        let lane = LaneType::from_u32(call.aux & 0xFF).ok_or(Status::Malformed)?;
        let op = ReduceOp::from_u8((call.aux >> 8) as u8).ok_or(Status::Malformed)?;
        let value = reduce(call.range, lane, op);
        answer[..REDUCE_ANSWER_BYTES].copy_from_slice(&value);
        Ok(ExtensionOutcome { answer_len: REDUCE_ANSWER_BYTES, written: None })
    }
}

/// Running state of one reduction.
struct Accumulator {
    lane: LaneType,
    op: ReduceOp,
    integer: i64,
    sums: [f64; SUM_ACCUMULATORS],
    float: f64,
    lanes_seen: usize,
}

impl Accumulator {
    fn new(lane: LaneType, op: ReduceOp) -> Accumulator {
        let integer = match op {
            ReduceOp::Sum => 0,
            ReduceOp::Min => i64::MAX,
            ReduceOp::Max => i64::MIN,
        };
        Accumulator { lane, op, integer, sums: [0.0; SUM_ACCUMULATORS], float: f64::NAN, lanes_seen: 0 }
    }

    fn add_pass(&mut self, bytes: &[u8]) {
        match self.lane {
            LaneType::I32 => {
                let lanes = bytes
                    .chunks_exact(4)
                    .map(|lane| i64::from(i32::from_le_bytes([lane[0], lane[1], lane[2], lane[3]])));
                self.integer = match self.op {
                    ReduceOp::Sum => lanes.fold(self.integer, |total, lane| total + lane),
                    ReduceOp::Min => lanes.fold(self.integer, i64::min),
                    ReduceOp::Max => lanes.fold(self.integer, i64::max),
                };
            }
            LaneType::F32 => {
                let lanes = bytes.chunks_exact(4).map(|lane| f32::from_le_bytes([lane[0], lane[1], lane[2], lane[3]]));
                self.add_floats(lanes);
            }
            LaneType::Bf16 => {
                let lanes = bytes.chunks_exact(2).map(|lane| bf16_to_f32(u16::from_le_bytes([lane[0], lane[1]])));
                self.add_floats(lanes);
            }
        }
    }

    fn add_floats(&mut self, lanes: impl Iterator<Item = f32>) {
        for value in lanes {
            let value = f64::from(value);
            match self.op {
                ReduceOp::Sum => self.sums[self.lanes_seen % SUM_ACCUMULATORS] += value,
                // f64::min and max return the other operand when one is NaN, so NaN lanes are
                // skipped and the NaN start value gives way to the first number.
                ReduceOp::Min => self.float = self.float.min(value),
                ReduceOp::Max => self.float = self.float.max(value),
            }
            self.lanes_seen += 1;
        }
    }

    fn finish(&self) -> [u8; REDUCE_ANSWER_BYTES] {
        match (self.lane, self.op) {
            (LaneType::I32, _) => self.integer.to_le_bytes(),
            (_, ReduceOp::Sum) => self.sums.iter().fold(0.0f64, |total, sum| total + sum).to_le_bytes(),
            _ => self.float.to_le_bytes(),
        }
    }
}

/// The reduction of every lane of `range` (a whole number of lanes).
pub fn reduce(range: crate::memory::SharedMemory<'_>, lane: LaneType, op: ReduceOp) -> [u8; REDUCE_ANSWER_BYTES] {
    let mut accumulator = Accumulator::new(lane, op);
    let mut pass = [0u8; PASS_BYTES];
    let mut at = 0;
    while at < range.len() {
        let len = (range.len() - at).min(PASS_BYTES);
        range.read(at, &mut pass[..len]);
        accumulator.add_pass(&pass[..len]);
        at += len;
    }
    accumulator.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::SharedMemory;

    /// Reduces `lanes` (little-endian lane bytes) as they would lie in a region.
    fn reduce_bytes(lanes: &[u8], lane: LaneType, op: ReduceOp) -> [u8; 8] {
        let mut words = vec![0u64; lanes.len().div_ceil(8)];
        let memory = SharedMemory::from_words(&mut words);
        memory.write(0, lanes);
        reduce(memory.sub_view(0, lanes.len()), lane, op)
    }

    #[test]
    fn i32_sums_are_exact_beyond_32_bits_and_min_max_signed() {
        // More lanes than one pass, each i32::MAX but one: the sum does not fit 32 bits.
        let count = PASS_BYTES / 4 + 3;
        let lanes: Vec<u8> =
            (0..count).flat_map(|index| if index == 5 { -7i32 } else { i32::MAX }.to_le_bytes()).collect();
        let answer = |op| i64::from_le_bytes(reduce_bytes(&lanes, LaneType::I32, op));
        assert_eq!(answer(ReduceOp::Sum), (count as i64 - 1) * i64::from(i32::MAX) - 7);
        assert_eq!(answer(ReduceOp::Min), -7);
        assert_eq!(answer(ReduceOp::Max), i64::from(i32::MAX));
    }

    #[test]
    fn float_min_max_skip_nan_and_a_nan_lane_makes_the_sum_nan() {
        let values = [1.5f32, f32::NAN, -3.25, 8.0, 0.125, 1e30, -1e30, 2.0, 7.0];
        let lanes: Vec<u8> = values.iter().flat_map(|value| value.to_le_bytes()).collect();
        let answer = |op| f64::from_le_bytes(reduce_bytes(&lanes, LaneType::F32, op));
        assert_eq!(answer(ReduceOp::Min), f64::from(-1e30f32));
        assert_eq!(answer(ReduceOp::Max), f64::from(1e30f32));
        assert!(answer(ReduceOp::Sum).is_nan());
        let only_nan = f32::NAN.to_le_bytes();
        assert!(f64::from_le_bytes(reduce_bytes(&only_nan, LaneType::F32, ReduceOp::Max)).is_nan());
    }

    #[test]
    fn float_sums_follow_the_stated_order() {
        // Lane i goes to accumulator i mod 8: 1e30 and -1e30 meet in accumulator 0 and cancel
        // before 0.25 joins them, and 0.5 waits in accumulator 1, so both survive. A plain
        // left-to-right sum would absorb the 0.5 into 1e30 and answer 0.25.
        let mut values = [0.0f32; 17];
        values[0] = 1e30;
        values[8] = -1e30;
        values[1] = 0.5;
        values[16] = 0.25;
        let lanes: Vec<u8> = values.iter().flat_map(|value| value.to_le_bytes()).collect();
        let sum = f64::from_le_bytes(reduce_bytes(&lanes, LaneType::F32, ReduceOp::Sum));
        assert_eq!(sum, 0.75);
    }

    #[test]
    fn bf16_lanes_widen_exactly() {
        // 1.5, -2.25 and 4.0 in bf16.
        let lanes: Vec<u8> = [0x3FC0u16, 0xC010, 0x4080].iter().flat_map(|lane| lane.to_le_bytes()).collect();
        let answer = |op| f64::from_le_bytes(reduce_bytes(&lanes, LaneType::Bf16, op));
        assert_eq!(answer(ReduceOp::Sum), 3.25);
        assert_eq!(answer(ReduceOp::Min), -2.25);
        assert_eq!(answer(ReduceOp::Max), 4.0);
    }
}
