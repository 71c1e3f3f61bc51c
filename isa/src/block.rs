//! Block instructions: the field checks of BREAD, BWRITE, FLUSH, TRIM, WRITE_ZEROES and
//! BLOCK_STATUS, as a pure function from an instruction and its namespace's shape to a decoded
//! operation, and the extent list a BLOCK_STATUS answers with.
//!
//! Addresses are in logical blocks of the namespace (`offset` = first block, `length` = block
//! count); data moves whole blocks. docs/PROTOCOL.md gives the same rules.

use crate::limits::{MAX_BLOCK_STATUS_EXTENTS, MAX_BLOCK_ZERO_BYTES};
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
    /// Report allocation from `offset_blocks` on, in at most `max_extents` extents covering at
    /// most `num_blocks`.
    Status { offset_blocks: u64, num_blocks: u32, max_extents: usize },
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
    // BLOCK_STATUS answers as many extents as fit (at least one): its work is bounded by the
    // extent count, not by the range, so any range is fine.
    let max_extents = (room / EXTENT_BYTES).min(MAX_BLOCK_STATUS_EXTENTS);
    let too_large = match opcode {
        Opcode::BlockRead => num_blocks > shape.max_transfer_blocks || bytes > room as u64,
        Opcode::BlockWrite => num_blocks > shape.max_transfer_blocks,
        Opcode::BlockStatus => max_extents == 0,
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
        Opcode::BlockStatus => BlockOp::Status { offset_blocks, num_blocks, max_extents },
        _ => BlockOp::WriteZeroes { offset_blocks, num_blocks },
    })
}

/// Bytes of one extent in a BLOCK_STATUS answer: blocks `u32`, flags `u32`.
pub const EXTENT_BYTES: usize = 8;

/// Extent flag: the blocks are not allocated (a hole).
pub const EXTENT_FLAG_HOLE: u32 = 0x1;
/// Extent flag: the blocks read as zeroes.
pub const EXTENT_FLAG_ZERO: u32 = 0x2;
/// Every extent flag v1 defines; the other bits are reserved, zero.
pub const EXTENT_FLAGS_KNOWN: u32 = EXTENT_FLAG_HOLE | EXTENT_FLAG_ZERO;

/// A run of blocks that share an allocation state, as BLOCK_STATUS reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Extent {
    /// Blocks in the run, at least one.
    pub num_blocks: u32,
    /// [`EXTENT_FLAG_HOLE`] and [`EXTENT_FLAG_ZERO`]; 0 is allocated data.
    pub flags: u32,
}

/// Writes `extents` into `out` (which must hold them); returns the bytes written.
pub fn encode_extents(extents: &[Extent], out: &mut [u8]) -> usize {
    let len = extents.len() * EXTENT_BYTES;
    assert!(out.len() >= len, "the caller sizes the answer by the extent count it allowed");
    for (extent, bytes) in extents.iter().zip(out.chunks_exact_mut(EXTENT_BYTES)) {
        bytes[0..4].copy_from_slice(&extent.num_blocks.to_le_bytes());
        bytes[4..8].copy_from_slice(&extent.flags.to_le_bytes());
    }
    len
}

/// Why the data of a BLOCK_STATUS answer is not a valid extent list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtentError {
    /// No extent, or a length that is not a whole number of extents.
    BadLength(usize),
    /// An extent of no blocks.
    EmptyExtent,
    /// A flag bit v1 does not define.
    ReservedFlags(u32),
    /// The extents cover more blocks than were asked about.
    BeyondRequest {
        /// Blocks covered.
        covered_blocks: u64,
        /// Blocks asked about.
        requested_blocks: u32,
    },
}

impl core::fmt::Display for ExtentError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ExtentError::BadLength(len) => {
                write!(f, "{len} bytes of extents: must be one or more {EXTENT_BYTES}-byte extents")
            }
            ExtentError::EmptyExtent => write!(f, "an extent of zero blocks"),
            ExtentError::ReservedFlags(flags) => write!(f, "extent flags {flags:#x} set reserved bits"),
            ExtentError::BeyondRequest { covered_blocks, requested_blocks } => {
                write!(f, "extents cover {covered_blocks} blocks, {requested_blocks} were asked about")
            }
        }
    }
}

impl core::error::Error for ExtentError {}

/// Decodes the extents a BLOCK_STATUS of `requested_blocks` answered, checking that they are
/// well formed: at least one, none empty, no reserved flag, no more blocks than asked about.
pub fn decode_extents(data: &[u8], requested_blocks: u32) -> Result<Vec<Extent>, ExtentError> {
    if data.is_empty() || !data.len().is_multiple_of(EXTENT_BYTES) {
        return Err(ExtentError::BadLength(data.len()));
    }
    let mut extents = Vec::with_capacity(data.len() / EXTENT_BYTES);
    let mut covered_blocks = 0u64;
    for bytes in data.chunks_exact(EXTENT_BYTES) {
        let extent = Extent {
            num_blocks: u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
            flags: u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]),
        };
        if extent.num_blocks == 0 {
            return Err(ExtentError::EmptyExtent);
        }
        if extent.flags & !EXTENT_FLAGS_KNOWN != 0 {
            return Err(ExtentError::ReservedFlags(extent.flags));
        }
        covered_blocks += u64::from(extent.num_blocks);
        extents.push(extent);
    }
    if covered_blocks > u64::from(requested_blocks) {
        return Err(ExtentError::BeyondRequest { covered_blocks, requested_blocks });
    }
    Ok(extents)
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

    #[test]
    fn block_status_is_bounded_by_its_answer_not_its_range() {
        let status =
            |offset, length, room| decode(&instruction(Opcode::BlockStatus, 0, offset, length, &[]), &SHAPE, room);
        assert_eq!(status(0, 100, 4096), Ok(BlockOp::Status { offset_blocks: 0, num_blocks: 100, max_extents: 64 }));
        assert_eq!(status(99, 1, 24), Ok(BlockOp::Status { offset_blocks: 99, num_blocks: 1, max_extents: 3 }));
        assert_eq!(status(0, 1, EXTENT_BYTES - 1), Err(Status::TooLarge), "room for not even one extent");
        assert_eq!(status(99, 2, 4096), Err(Status::OutOfRange));
        assert_eq!(status(0, 0, 4096), Err(Status::Malformed));
        let huge = NamespaceShape { capacity_blocks: u64::MAX, ..SHAPE };
        let all = decode(&instruction(Opcode::BlockStatus, 0, 0, u32::MAX, &[]), &huge, 4096);
        assert_eq!(all, Ok(BlockOp::Status { offset_blocks: 0, num_blocks: u32::MAX, max_extents: 64 }));
        assert_eq!(
            decode(&Instruction { aux: 1, ..instruction(Opcode::BlockStatus, 0, 0, 1, &[]) }, &SHAPE, 4096),
            Err(Status::Malformed)
        );
        assert_eq!(decode(&instruction(Opcode::BlockStatus, 0, 0, 1, &[0]), &SHAPE, 4096), Err(Status::Malformed));
    }

    #[test]
    fn extents_round_trip_and_bad_lists_are_refused() {
        let extents = [
            Extent { num_blocks: 3, flags: 0 },
            Extent { num_blocks: 5, flags: EXTENT_FLAG_HOLE | EXTENT_FLAG_ZERO },
            Extent { num_blocks: 1, flags: EXTENT_FLAG_ZERO },
        ];
        let mut out = [0u8; 64];
        let len = encode_extents(&extents, &mut out);
        assert_eq!(len, 24);
        assert_eq!(&out[..8], &[3, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&out[8..16], &[5, 0, 0, 0, 3, 0, 0, 0]);
        assert_eq!(decode_extents(&out[..len], 9), Ok(extents.to_vec()));
        assert_eq!(
            decode_extents(&out[..len], 8),
            Err(ExtentError::BeyondRequest { covered_blocks: 9, requested_blocks: 8 })
        );
        assert_eq!(decode_extents(&out[..len - 1], 9), Err(ExtentError::BadLength(23)));
        assert_eq!(decode_extents(&[], 9), Err(ExtentError::BadLength(0)));
        assert_eq!(decode_extents(&[0; 8], 9), Err(ExtentError::EmptyExtent));
        assert_eq!(decode_extents(&[1, 0, 0, 0, 4, 0, 0, 0], 9), Err(ExtentError::ReservedFlags(4)));
    }
}
