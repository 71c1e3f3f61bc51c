//! Seeded streams of memory and compute instructions, for comparing engines: the same seed gives
//! the same stream, which every engine (software, the device model in-process or as a process)
//! must answer identically and leave the same memory behind. About one instruction in twelve is
//! one that must fail (out of range, unaligned, unknown space or opcode, malformed), so errors
//! are compared too. Block instructions are not part of it: the target's dispatch answers them
//! before any engine sees them, so they need a comparison of their own.

use netdam_isa::rng::Rng;
use netdam_isa::wire::Instruction;
use netdam_isa::Opcode;

/// The two regions a stream addresses, both `bytes` long (a multiple of 8, at least 4 KiB).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamSpaces {
    /// First region's space id.
    pub first: u16,
    /// Second region's space id.
    pub second: u16,
    /// Bytes of each.
    pub bytes: u64,
}

/// The largest answer a stream instruction asks for: give every engine at least this much room.
pub const ANSWER_BYTES_MAX: usize = 1024;

/// The next instruction of the stream; its operand is built in `operand`.
pub fn random_instruction<'o>(rng: &mut Rng, spaces: &StreamSpaces, operand: &'o mut Vec<u8>) -> Instruction<'o> {
    assert!(spaces.bytes >= 4096 && spaces.bytes.is_multiple_of(8), "regions of at least 4 KiB, whole words");
    operand.clear();
    let size = spaces.bytes;
    let space = if rng.chance(0.5) { spaces.first } else { spaces.second };
    let word = rng.below(size / 8) * 8;
    let mut instruction = Instruction { opcode: 0, flags: 0, space, offset: word, length: 0, aux: 0, operand: &[] };
    match rng.below(12) {
        0 | 1 => {
            instruction.opcode = Opcode::Read as u8;
            instruction.length = rng.below(256) as u32 + 1;
            instruction.offset = rng.below(size - 256);
        }
        2 | 3 => {
            instruction.opcode = Opcode::Write as u8;
            let len = rng.below(512) as usize + 1;
            operand.extend(rng.bytes(len));
            instruction.length = len as u32;
            instruction.offset = rng.below(size - 512);
        }
        4 => {
            instruction.opcode = Opcode::Cas as u8;
            instruction.length = 8;
            // Expected values from a tiny set, so that some swaps succeed.
            operand.extend(rng.below(3).to_le_bytes());
            operand.extend(rng.next_u64().to_le_bytes());
        }
        5 | 6 => {
            instruction.opcode = Opcode::FetchAdd as u8;
            instruction.length = 8;
            operand.extend(rng.next_u64().to_le_bytes());
        }
        7 => {
            instruction.opcode = Opcode::Fill as u8;
            instruction.length = rng.below(300) as u32;
            instruction.aux = rng.below(256) as u32;
            instruction.offset = rng.below(size - 300);
        }
        8 => {
            instruction.opcode = Opcode::Memcpy as u8;
            instruction.length = rng.below(300) as u32;
            instruction.offset = rng.below(size - 300);
            let source = if rng.chance(0.5) { spaces.first } else { spaces.second };
            operand.extend(source.to_le_bytes());
            operand.extend([0u8; 6]);
            operand.extend(rng.below(size - 300).to_le_bytes());
        }
        9 => {
            instruction.opcode = Opcode::Vadd as u8;
            instruction.aux = rng.below(3) as u32; // f32, i32 or bf16 lanes
            let lane_bytes = if instruction.aux == 2 { 2 } else { 4 };
            instruction.flags = rng.below(2) as u8; // RETURN_RESULT or not
            let len = lane_bytes * (rng.below(128) as usize + 1);
            operand.extend(rng.bytes(len));
            instruction.length = len as u32;
            instruction.offset = rng.below((size - 512) / 4) * 4;
        }
        10 => {
            instruction.opcode = Opcode::Crc32 as u8;
            instruction.length = rng.below(1024) as u32;
            instruction.offset = rng.below(size - 1024);
        }
        _ => match rng.below(5) {
            0 => {
                instruction.opcode = Opcode::Read as u8;
                instruction.offset = size - 4;
                instruction.length = 8; // out_of_range
            }
            1 => {
                instruction.opcode = Opcode::Cas as u8;
                instruction.offset = word + 4; // unaligned
                instruction.length = 8;
                operand.extend([0u8; 16]);
            }
            2 => {
                instruction.opcode = Opcode::Read as u8;
                instruction.space = u16::MAX; // no_such_space
                instruction.length = 8;
            }
            3 => instruction.opcode = 0x7E, // unknown_opcode
            _ => {
                instruction.opcode = Opcode::Read as u8;
                instruction.flags = 0x80; // malformed: READ takes no flags
                instruction.length = 8;
            }
        },
    }
    instruction.operand = operand;
    instruction
}
