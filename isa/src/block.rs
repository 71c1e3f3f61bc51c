//! Block instructions: the field checks of BREAD, BWRITE, FLUSH, TRIM and WRITE_ZEROES, as a
//! pure function from an instruction and its namespace's shape to a decoded operation.
//!
//! Addresses are in logical blocks of the namespace (`offset` = first block, `length` = block
//! count); data moves whole blocks. docs/PROTOCOL.md gives the same rules.

use crate::limits::MAX_BLOCK_ZERO_BYTES;
use crate::opcode::BWRITE_FLAG_FUA;
use crate::status::Status;
use crate::wire::Instruction;
use crate::Opcode;

/// A namespace's shape, as block instructions need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamespaceShape {
    /// Bytes per block.
    pub block_bytes: u32,
    /// Blocks in the namespace.
    pub capacity_blocks: u64,
    /// Largest read or write, in blocks.
    pub max_transfer_blocks: u32,
}

/// A checked block operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockOp<'a> {
    /// Read `num_blocks` from `offset_blocks`.
    Read { offset_blocks: u64, num_blocks: u32 },
    /// Write `data` at `offset_blocks`; with `fua`, durably before the answer.
    Write { offset_blocks: u64, data: &'a [u8], fua: bool },
    /// Make every write answered before this one durable.
    Flush,
    /// Deallocate blocks: they read as zeroes.
    Trim { offset_blocks: u64, num_blocks: u32 },
    /// Write zeroes.
    WriteZeroes { offset_blocks: u64, num_blocks: u32 },
}

/// Checks a block instruction against its namespace, in the order PROTOCOL.md gives: fields,
/// then range, then size. `room` is the data the answer may still carry (for BREAD).
pub fn decode<'a>(instruction: &Instruction<'a>, shape: &NamespaceShape, room: usize) -> Result<BlockOp<'a>, Status> {
    let opcode = Opcode::from_u8(instruction.opcode).filter(|opcode| opcode.is_block()).ok_or(Status::Malformed)?;
    let allowed_flags = if opcode == Opcode::BlockWrite { BWRITE_FLAG_FUA } else { 0 };
    let takes_operand = opcode == Opcode::BlockWrite;
    if instruction.flags & !allowed_flags != 0
        || instruction.aux != 0
        || (!takes_operand && !instruction.operand.is_empty())
    {
        return Err(Status::Malformed);
    }
    let offset_blocks = instruction.offset;
    let num_blocks = instruction.length;
    if opcode == Opcode::Flush {
        return if offset_blocks == 0 && num_blocks == 0 { Ok(BlockOp::Flush) } else { Err(Status::Malformed) };
    }
    if num_blocks == 0 {
        return Err(Status::Malformed);
    }
    let bytes = u64::from(num_blocks) * u64::from(shape.block_bytes);
    if opcode == Opcode::BlockWrite && instruction.operand.len() as u64 != bytes {
        return Err(Status::Malformed);
    }
    match offset_blocks.checked_add(u64::from(num_blocks)) {
        Some(end) if end <= shape.capacity_blocks => {}
        _ => return Err(Status::OutOfRange),
    }
    let too_large = match opcode {
        Opcode::BlockRead => num_blocks > shape.max_transfer_blocks || bytes > room as u64,
        Opcode::BlockWrite => num_blocks > shape.max_transfer_blocks,
        _ => bytes > MAX_BLOCK_ZERO_BYTES,
    };
    if too_large {
        return Err(Status::TooLarge);
    }
    Ok(match opcode {
        Opcode::BlockRead => BlockOp::Read { offset_blocks, num_blocks },
        Opcode::BlockWrite => {
            BlockOp::Write { offset_blocks, data: instruction.operand, fua: instruction.flags & BWRITE_FLAG_FUA != 0 }
        }
        Opcode::Trim => BlockOp::Trim { offset_blocks, num_blocks },
        _ => BlockOp::WriteZeroes { offset_blocks, num_blocks },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHAPE: NamespaceShape = NamespaceShape { block_bytes: 512, capacity_blocks: 100, max_transfer_blocks: 8 };

    fn instruction(opcode: Opcode, flags: u8, offset: u64, length: u32, operand: &[u8]) -> Instruction<'_> {
        Instruction { opcode: opcode as u8, flags, space: 0, offset, length, aux: 0, operand }
    }

    #[test]
    fn block_fields_are_checked_in_order() {
        let data = [7u8; 1024];
        let write = instruction(Opcode::BlockWrite, BWRITE_FLAG_FUA, 98, 2, &data);
        assert_eq!(decode(&write, &SHAPE, 0), Ok(BlockOp::Write { offset_blocks: 98, data: &data, fua: true }));
        let read = instruction(Opcode::BlockRead, 0, 0, 8, &[]);
        assert_eq!(decode(&read, &SHAPE, 4096), Ok(BlockOp::Read { offset_blocks: 0, num_blocks: 8 }));
        assert_eq!(decode(&read, &SHAPE, 4095), Err(Status::TooLarge), "the answer must fit");
        assert_eq!(decode(&instruction(Opcode::BlockRead, 0, 0, 9, &[]), &SHAPE, 1 << 20), Err(Status::TooLarge));
        assert_eq!(decode(&instruction(Opcode::BlockRead, 0, 99, 2, &[]), &SHAPE, 4096), Err(Status::OutOfRange));
        assert_eq!(decode(&instruction(Opcode::BlockRead, 0, u64::MAX, 2, &[]), &SHAPE, 4096), Err(Status::OutOfRange));
        assert_eq!(decode(&instruction(Opcode::BlockRead, 1, 0, 1, &[]), &SHAPE, 4096), Err(Status::Malformed));
        assert_eq!(decode(&instruction(Opcode::BlockRead, 0, 0, 0, &[]), &SHAPE, 4096), Err(Status::Malformed));
        assert_eq!(
            decode(&instruction(Opcode::BlockWrite, 0, 0, 3, &data), &SHAPE, 0),
            Err(Status::Malformed),
            "the operand must be exactly the blocks written"
        );
        assert_eq!(decode(&instruction(Opcode::Flush, 0, 0, 0, &[]), &SHAPE, 0), Ok(BlockOp::Flush));
        assert_eq!(decode(&instruction(Opcode::Flush, 0, 1, 0, &[]), &SHAPE, 0), Err(Status::Malformed));
        assert_eq!(
            decode(&instruction(Opcode::Trim, 0, 10, 90, &[]), &SHAPE, 0),
            Ok(BlockOp::Trim { offset_blocks: 10, num_blocks: 90 })
        );
        assert_eq!(decode(&instruction(Opcode::WriteZeroes, 0, 10, 91, &[]), &SHAPE, 0), Err(Status::OutOfRange));
        let huge = NamespaceShape { capacity_blocks: u64::MAX, ..SHAPE };
        let too_many = (MAX_BLOCK_ZERO_BYTES / 512 + 1) as u32;
        assert_eq!(decode(&instruction(Opcode::Trim, 0, 0, too_many, &[]), &huge, 0), Err(Status::TooLarge));
        assert_eq!(decode(&instruction(Opcode::Read, 0, 0, 1, &[]), &SHAPE, 0), Err(Status::Malformed));
    }
}
