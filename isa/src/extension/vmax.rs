//! VMAX (`0x81`): element-wise maximum of the operand's lanes into memory, the `max` of an
//! Allreduce, as VADD is its sum.
//!
//! Fields (see `docs/PROTOCOL.md`): `aux` = lane type (`0` f32, `1` i32, `2` bf16); no flags;
//! length = operand length = lanes × lane size, 1 to 8192 bytes; offset a multiple of the lane
//! size. No answer. Each lane becomes the larger of itself and the operand's (floats skip NaN).
//! Under VADD's per-chunk flags, so concurrent VMAX, VADD, CAS and FETCH_ADD lose no update.
//! Idempotent: a second VMAX of the same lanes changes nothing.

use super::{Alignment, ByteBounds, ExtensionCall, ExtensionHandler, ExtensionOutcome, ExtensionSpec, Permissions};
use crate::compute;
use crate::limits::MAX_VADD_BYTES;
use crate::opcode::LaneType;
use crate::status::Status;

/// VMAX's opcode number.
pub const VMAX_OPCODE: u8 = 0x81;

/// The VMAX handler.
#[derive(Debug, Clone, Copy, Default)]
pub struct Vmax;

impl ExtensionHandler for Vmax {
    fn spec(&self) -> ExtensionSpec {
        ExtensionSpec {
            opcode: VMAX_OPCODE,
            name: "vmax",
            idempotent: true,
            permissions: Permissions::WRITE.union(Permissions::COMPUTE),
            flags: 0,
            aux_max: LaneType::Bf16 as u32,
            operand_bytes: ByteBounds { min: 1, max: MAX_VADD_BYTES },
            operand_is_length: true,
            length_bytes: ByteBounds { min: 1, max: MAX_VADD_BYTES },
            alignment: Alignment::LaneInAuxLowByte,
            answer_bytes_max: 0,
        }
    }

    fn execute(&self, call: &ExtensionCall<'_>, _answer: &mut [u8]) -> Result<ExtensionOutcome, Status> {
        // The registry checked the lane type (alignment), that the operand is the length and a
        // whole number of lanes, and the bounds.
        let lane = LaneType::from_u32(call.aux).ok_or(Status::Malformed)?;
        compute::vmax(&call.range, 0, lane, call.operand);
        Ok(ExtensionOutcome { answer_len: 0, written: Some(0..call.range.len()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extension::ExtensionRegistry;
    use crate::memory::SharedMemory;
    use crate::semantics::AddressSpaces;
    use crate::wire::Instruction;

    struct One<'a>(SharedMemory<'a>);

    impl AddressSpaces for One<'_> {
        fn memory(&self, space: u16) -> Option<SharedMemory<'_>> {
            (space == 0).then_some(self.0)
        }
    }

    /// Four threads VMAX distinct values into the same 2048 i32 lanes (while a fifth VADDs 0):
    /// every lane ends at the largest value any thread sent, none lost.
    #[test]
    fn concurrent_vmax_keeps_the_largest_value_of_every_lane() {
        let mut registry = ExtensionRegistry::new();
        registry.register(Box::new(Vmax)).unwrap();
        let mut words = vec![0u64; 1100];
        let spaces = One(SharedMemory::from_words(&mut words));
        let start = 20u64;
        let min: Vec<u8> = (0..2048).flat_map(|_| i32::MIN.to_le_bytes()).collect();
        spaces.0.write(start as usize, &min);
        let value = |thread: i32, round: i32, lane: i32| (round * 37 + thread * 11 + lane) % 1000 - 500;
        std::thread::scope(|scope| {
            for thread in 0..4 {
                let (registry, spaces) = (&registry, &spaces);
                scope.spawn(move || {
                    for round in 0..200 {
                        let lanes: Vec<u8> =
                            (0..2048).flat_map(|lane| value(thread, round, lane).to_le_bytes()).collect();
                        let vmax = Instruction {
                            opcode: VMAX_OPCODE,
                            flags: 0,
                            space: 0,
                            offset: start,
                            length: 8192,
                            aux: 1,
                            operand: &lanes,
                        };
                        registry.execute(&vmax, spaces, Permissions::ALL, &mut []).unwrap();
                    }
                });
            }
            scope.spawn(|| {
                let zeros = [0u8; 8192];
                for _ in 0..200 {
                    compute::vadd(&spaces.0, start as usize, LaneType::I32, &zeros, &mut []);
                }
            });
        });
        let mut stored = vec![0u8; 8192];
        spaces.0.read(start as usize, &mut stored);
        for (lane, bytes) in stored.chunks_exact(4).enumerate() {
            let expected = (0..4).flat_map(|thread| (0..200).map(move |round| value(thread, round, lane as i32))).max();
            assert_eq!(Some(i32::from_le_bytes(bytes.try_into().unwrap())), expected, "lane {lane}");
        }
    }

    #[test]
    fn float_lanes_skip_nan_and_the_operand_must_be_the_length() {
        let mut registry = ExtensionRegistry::new();
        registry.register(Box::new(Vmax)).unwrap();
        let mut words = vec![0u64; 4];
        let spaces = One(SharedMemory::from_words(&mut words));
        let stored: Vec<u8> = [1.0f32, f32::NAN, -3.0, 7.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        spaces.0.write(0, &stored);
        let operand: Vec<u8> = [2.0f32, 5.0, f32::NAN, -1.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let vmax =
            Instruction { opcode: VMAX_OPCODE, flags: 0, space: 0, offset: 0, length: 16, aux: 0, operand: &operand };
        let outcome = registry.execute(&vmax, &spaces, Permissions::ALL, &mut []).unwrap();
        assert_eq!(outcome.written.map(|written| (written.offset, written.len)), Some((0, 16)));
        let mut after = [0u8; 16];
        spaces.0.read(0, &mut after);
        let lanes: Vec<f32> = after.chunks_exact(4).map(|lane| f32::from_le_bytes(lane.try_into().unwrap())).collect();
        assert_eq!(lanes, [2.0, 5.0, -3.0, 7.0]);
        let short = Instruction { length: 12, ..vmax };
        assert_eq!(registry.execute(&short, &spaces, Permissions::ALL, &mut []), Err(Status::Malformed));
        assert_eq!(registry.execute(&vmax, &spaces, Permissions::READ, &mut []), Err(Status::PermissionDenied));
    }
}
