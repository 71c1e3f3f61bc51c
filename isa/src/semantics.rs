//! What each memory and compute instruction does, as functions over [`SharedMemory`] views.
//!
//! These are the reference semantics: the target's software engine executes them directly, and
//! any other engine (the FPGA path) is checked against them. Checks run in a fixed order, so the
//! same bad instruction always gets the same status: framing fields (`Malformed`), the space
//! (`NoSuchSpace`), alignment (`Unaligned`), bounds (`OutOfRange`), answer size (`TooLarge`).
//! Nothing is touched unless every check passes.

use crate::compute;
use crate::limits::{MAX_LONG_INSTRUCTION_BYTES, MAX_VADD_BYTES};
use crate::memory::SharedMemory;
use crate::opcode::{LaneType, Opcode, VADD_FLAG_RETURN_RESULT};
use crate::status::Status;
use crate::wire::Instruction;
use core::sync::atomic::Ordering;

/// Bytes of the CAS operand: expected value, then desired value (u64 each).
pub const CAS_OPERAND_LEN: usize = 16;
/// Bytes of the FETCH_ADD operand: the addend (u64).
pub const FETCH_ADD_OPERAND_LEN: usize = 8;
/// Bytes of the MEMCPY operand: source space (u16), 6 reserved bytes, source offset (u64).
pub const MEMCPY_OPERAND_LEN: usize = 16;

/// Lookup of the memory behind a space id.
pub trait AddressSpaces {
    /// The memory of region `space`, if it exists.
    fn memory(&self, space: u16) -> Option<SharedMemory<'_>>;
}

/// A range an instruction modified, which a persistent region must persist before answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// The region written.
    pub space: u16,
    /// First byte written.
    pub offset: usize,
    /// Bytes written.
    pub len: usize,
}

/// What an executed instruction produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Bytes of answer data written to the output buffer.
    pub data_len: usize,
    /// Memory modified, if any.
    pub written: Option<Written>,
}

impl Outcome {
    fn data(data_len: usize) -> Outcome {
        Outcome { data_len, written: None }
    }
}

fn require(condition: bool, status: Status) -> Result<(), Status> {
    if condition {
        Ok(())
    } else {
        Err(status)
    }
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

fn lookup<'s>(spaces: &'s impl AddressSpaces, space: u16) -> Result<SharedMemory<'s>, Status> {
    spaces.memory(space).ok_or(Status::NoSuchSpace)
}

fn within(memory: &SharedMemory<'_>, offset: u64, len: usize) -> Result<usize, Status> {
    memory.range(offset, len).map(|range| range.start).ok_or(Status::OutOfRange)
}

/// Executes one memory or compute instruction, writing answer data into `out`.
///
/// `out` is the room left in the response datagram; an answer that would not fit is refused with
/// `TooLarge` before anything is modified. Control and block opcodes are not handled here.
pub fn execute(instruction: &Instruction<'_>, spaces: &impl AddressSpaces, out: &mut [u8]) -> Result<Outcome, Status> {
    let opcode = Opcode::from_u8(instruction.opcode).ok_or(Status::UnknownOpcode)?;
    let length = instruction.length as usize;
    let plain = instruction.flags == 0 && instruction.aux == 0;
    match opcode {
        Opcode::Read => {
            require(plain && instruction.operand.is_empty(), Status::Malformed)?;
            let memory = lookup(spaces, instruction.space)?;
            let start = within(&memory, instruction.offset, length)?;
            require(length <= out.len(), Status::TooLarge)?;
            memory.read(start, &mut out[..length]);
            Ok(Outcome::data(length))
        }
        Opcode::Write => {
            require(plain && instruction.operand.len() == length, Status::Malformed)?;
            let memory = lookup(spaces, instruction.space)?;
            let start = within(&memory, instruction.offset, length)?;
            memory.write(start, instruction.operand);
            Ok(Outcome { data_len: 0, written: Some(Written { space: instruction.space, offset: start, len: length }) })
        }
        Opcode::Cas | Opcode::FetchAdd => {
            let operand_len = if opcode == Opcode::Cas { CAS_OPERAND_LEN } else { FETCH_ADD_OPERAND_LEN };
            require(plain && length == 8 && instruction.operand.len() == operand_len, Status::Malformed)?;
            let memory = lookup(spaces, instruction.space)?;
            require(instruction.offset.is_multiple_of(8), Status::Unaligned)?;
            let start = within(&memory, instruction.offset, 8)?;
            require(out.len() >= 8, Status::TooLarge)?;
            let word = memory.atomic_u64(start);
            // Under the flag of the word's VADD chunk: VADD adds with plain loads and stores
            // under that flag, so an atomic here without it could be overwritten (compute.rs).
            let _chunk = compute::lock_chunk(memory.base() as usize + start);
            let (old, changed) = if opcode == Opcode::Cas {
                let expected = u64_at(instruction.operand, 0).to_le();
                let desired = u64_at(instruction.operand, 8).to_le();
                match word.compare_exchange(expected, desired, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(old) => (old, true),
                    Err(old) => (old, false),
                }
            } else {
                let addend = u64_at(instruction.operand, 0);
                let old = word
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |stored| {
                        Some(u64::from_le(stored).wrapping_add(addend).to_le())
                    })
                    .unwrap_or_else(|stored| stored);
                (old, true)
            };
            out[..8].copy_from_slice(&u64::from_le(old).to_le_bytes());
            let written = changed.then_some(Written { space: instruction.space, offset: start, len: 8 });
            Ok(Outcome { data_len: 8, written })
        }
        Opcode::Memcpy => {
            let operand = instruction.operand;
            require(plain && operand.len() == MEMCPY_OPERAND_LEN && operand[2..8] == [0; 6], Status::Malformed)?;
            let source_space = u16::from_le_bytes([operand[0], operand[1]]);
            let source_offset = u64_at(operand, 8);
            let destination = lookup(spaces, instruction.space)?;
            let source = lookup(spaces, source_space)?;
            let start = within(&destination, instruction.offset, length)?;
            let source_start = within(&source, source_offset, length)?;
            require(length <= MAX_LONG_INSTRUCTION_BYTES, Status::TooLarge)?;
            destination.copy_from(start, &source, source_start, length);
            Ok(Outcome { data_len: 0, written: Some(Written { space: instruction.space, offset: start, len: length }) })
        }
        Opcode::Fill => {
            require(
                instruction.flags == 0 && instruction.aux <= 0xFF && instruction.operand.is_empty(),
                Status::Malformed,
            )?;
            let memory = lookup(spaces, instruction.space)?;
            let start = within(&memory, instruction.offset, length)?;
            require(length <= MAX_LONG_INSTRUCTION_BYTES, Status::TooLarge)?;
            memory.fill(start, length, instruction.aux as u8);
            Ok(Outcome { data_len: 0, written: Some(Written { space: instruction.space, offset: start, len: length }) })
        }
        Opcode::Vadd => {
            let lane = LaneType::from_u32(instruction.aux).ok_or(Status::Malformed)?;
            let lane_bytes = lane.lane_bytes();
            require(
                instruction.flags & !VADD_FLAG_RETURN_RESULT == 0
                    && instruction.operand.len() == length
                    && length.is_multiple_of(lane_bytes),
                Status::Malformed,
            )?;
            require(length <= MAX_VADD_BYTES, Status::TooLarge)?;
            let memory = lookup(spaces, instruction.space)?;
            require(instruction.offset.is_multiple_of(lane_bytes as u64), Status::Unaligned)?;
            let start = within(&memory, instruction.offset, length)?;
            let return_result = instruction.flags & VADD_FLAG_RETURN_RESULT != 0;
            require(!return_result || length <= out.len(), Status::TooLarge)?;
            let result = if return_result { &mut out[..length] } else { &mut [][..] };
            compute::vadd(&memory, start, lane, instruction.operand, result);
            Ok(Outcome {
                data_len: if return_result { length } else { 0 },
                written: Some(Written { space: instruction.space, offset: start, len: length }),
            })
        }
        Opcode::Crc32 => {
            require(plain && instruction.operand.is_empty(), Status::Malformed)?;
            let memory = lookup(spaces, instruction.space)?;
            let start = within(&memory, instruction.offset, length)?;
            require(length <= MAX_LONG_INSTRUCTION_BYTES && out.len() >= 4, Status::TooLarge)?;
            out[..4].copy_from_slice(&memory.crc32(start, length).to_le_bytes());
            Ok(Outcome::data(4))
        }
        Opcode::Hello
        | Opcode::Ping
        | Opcode::Stat
        | Opcode::Close
        // ENCRYPT and DECRYPT need the target's keys and nonce counters: its `crypto` module
        // executes them (the layouts are in `crate::crypto`).
        | Opcode::Encrypt
        | Opcode::Decrypt
        | Opcode::BlockRead
        | Opcode::BlockWrite
        | Opcode::Flush
        | Opcode::Trim
        | Opcode::WriteZeroes
        | Opcode::BlockStatus => Err(Status::NotSupported),
    }
}

pub use crate::compute::{bf16_to_f32, f32_to_bf16};
