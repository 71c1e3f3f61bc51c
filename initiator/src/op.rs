//! Owned instructions a client sends, with a constructor per opcode that fills the operand
//! layout of docs/PROTOCOL.md.

use netdam_isa::control::{encode_hello_operand, encode_hello_operand_with, Cookie, HelloRequest, HELLO_AUTH_LEN};
use netdam_isa::crypto::{encode_operand, Destination, Seal, CRYPTO_FLAG_TO_DESTINATION};
use netdam_isa::extension::reduce::{reduce_aux, ReduceOp, REDUCE_OPCODE};
use netdam_isa::opcode::{BWRITE_FLAG_FUA, VADD_FLAG_RETURN_RESULT};
use netdam_isa::wire::Instruction;
use netdam_isa::{LaneType, Opcode};

/// One instruction to send, owning its operand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// Opcode number.
    pub opcode: u8,
    /// Per-opcode flags.
    pub flags: u8,
    /// Region id (namespace id for block opcodes).
    pub space: u16,
    /// Byte offset (first block for block opcodes).
    pub offset: u64,
    /// Bytes addressed (blocks for block opcodes).
    pub length: u32,
    /// Per-opcode extra operand.
    pub aux: u32,
    /// Operand bytes.
    pub operand: Vec<u8>,
}

impl Op {
    fn new(opcode: Opcode, space: u16, offset: u64, length: u32) -> Op {
        Op { opcode: opcode as u8, flags: 0, space, offset, length, aux: 0, operand: Vec::new() }
    }

    /// Borrowed view for encoding.
    pub fn as_instruction(&self) -> Instruction<'_> {
        Instruction {
            opcode: self.opcode,
            flags: self.flags,
            space: self.space,
            offset: self.offset,
            length: self.length,
            aux: self.aux,
            operand: &self.operand,
        }
    }

    /// Whether sending it twice is harmless (see `Instruction::is_idempotent`).
    pub fn is_idempotent(&self) -> bool {
        self.as_instruction().is_idempotent()
    }

    /// HELLO asking for datagrams of up to `max_datagram_bytes`, echoing `cookie` from the
    /// target's `retry` answer ([`netdam_isa::control::NO_COOKIE`] on the first HELLO).
    pub fn hello(max_datagram_bytes: u32, cookie: Cookie) -> Op {
        let operand = encode_hello_operand(&HelloRequest { max_datagram_bytes, cookie }).to_vec();
        Op { operand, ..Op::new(Opcode::Hello, 0, 0, 0) }
    }

    /// HELLO with authentication `method` and its 64-byte area (a tenant's proof).
    pub fn hello_with(max_datagram_bytes: u32, cookie: Cookie, method: u8, area: &[u8; HELLO_AUTH_LEN]) -> Op {
        let operand = encode_hello_operand_with(&HelloRequest { max_datagram_bytes, cookie }, method, area).to_vec();
        Op { operand, ..Op::new(Opcode::Hello, 0, 0, 0) }
    }

    /// CLOSE: ends the session it is sent in.
    pub fn close() -> Op {
        Op::new(Opcode::Close, 0, 0, 0)
    }

    /// PING.
    pub fn ping() -> Op {
        Op::new(Opcode::Ping, 0, 0, 0)
    }

    /// STAT.
    pub fn stat() -> Op {
        Op::new(Opcode::Stat, 0, 0, 0)
    }

    /// STAT padded with zero operand bytes so that its datagram is `datagram_bytes` long:
    /// without a session the target answers in no more bytes than it received.
    pub fn stat_padded(datagram_bytes: usize) -> Op {
        let fixed = netdam_isa::wire::HEADER_LEN + netdam_isa::wire::INSTRUCTION_HEADER_LEN;
        Op { operand: vec![0; datagram_bytes.saturating_sub(fixed)], ..Op::stat() }
    }

    /// READ `length` bytes at `offset`.
    pub fn read(space: u16, offset: u64, length: u32) -> Op {
        Op::new(Opcode::Read, space, offset, length)
    }

    /// WRITE `data` at `offset`.
    pub fn write(space: u16, offset: u64, data: &[u8]) -> Op {
        Op { operand: data.to_vec(), ..Op::new(Opcode::Write, space, offset, data.len() as u32) }
    }

    /// Compare-and-swap of the aligned word at `offset`.
    pub fn cas(space: u16, offset: u64, expected: u64, desired: u64) -> Op {
        let mut operand = expected.to_le_bytes().to_vec();
        operand.extend_from_slice(&desired.to_le_bytes());
        Op { operand, ..Op::new(Opcode::Cas, space, offset, 8) }
    }

    /// Fetch-and-add (wrapping) of the aligned word at `offset`.
    pub fn fetch_add(space: u16, offset: u64, addend: u64) -> Op {
        Op { operand: addend.to_le_bytes().to_vec(), ..Op::new(Opcode::FetchAdd, space, offset, 8) }
    }

    /// Copy `length` bytes from (`source_space`, `source_offset`) to (`space`, `offset`).
    pub fn memcpy(space: u16, offset: u64, source_space: u16, source_offset: u64, length: u32) -> Op {
        let mut operand = vec![0u8; 16];
        operand[0..2].copy_from_slice(&source_space.to_le_bytes());
        operand[8..16].copy_from_slice(&source_offset.to_le_bytes());
        Op { operand, ..Op::new(Opcode::Memcpy, space, offset, length) }
    }

    /// Set `length` bytes at `offset` to `value`.
    pub fn fill(space: u16, offset: u64, length: u32, value: u8) -> Op {
        Op { aux: u32::from(value), ..Op::new(Opcode::Fill, space, offset, length) }
    }

    /// Add `lanes` (little-endian values of `lane`) into memory at `offset`.
    pub fn vadd(space: u16, offset: u64, lane: LaneType, lanes: &[u8], return_result: bool) -> Op {
        Op {
            flags: if return_result { VADD_FLAG_RETURN_RESULT } else { 0 },
            aux: lane as u32,
            operand: lanes.to_vec(),
            ..Op::new(Opcode::Vadd, space, offset, lanes.len() as u32)
        }
    }

    /// An extension instruction (opcode `0x80..=0xFF`), fields as its handler defines them.
    pub fn extension(opcode: u8, flags: u8, space: u16, offset: u64, length: u32, aux: u32, operand: &[u8]) -> Op {
        Op { opcode, flags, space, offset, length, aux, operand: operand.to_vec() }
    }

    /// REDUCE (the extension `reduce`): `op` over the `lane` lanes of `length` bytes at `offset`.
    pub fn reduce(space: u16, offset: u64, length: u32, lane: LaneType, op: ReduceOp) -> Op {
        Op::extension(REDUCE_OPCODE, 0, space, offset, length, reduce_aux(lane, op), &[])
    }

    /// ENCRYPT `length` bytes at `offset` with AES-256-GCM under key slot `slot`: in place, or
    /// into `destination` (region, offset); `aad` is authenticated with them, not stored. The
    /// answer's data is the 28-byte seal DECRYPT needs.
    pub fn encrypt(space: u16, offset: u64, length: u32, slot: u32, destination: Option<(u16, u64)>, aad: &[u8]) -> Op {
        Op::crypto(Opcode::Encrypt, space, offset, length, slot, None, destination, aad)
    }

    /// DECRYPT `length` bytes at `offset` sealed as `seal` says, under key slot `slot` and with the
    /// same `aad`: in place, or into `destination` (region, offset).
    pub fn decrypt(
        space: u16,
        offset: u64,
        length: u32,
        slot: u32,
        seal: &Seal,
        destination: Option<(u16, u64)>,
        aad: &[u8],
    ) -> Op {
        Op::crypto(Opcode::Decrypt, space, offset, length, slot, Some(seal), destination, aad)
    }

    #[allow(clippy::too_many_arguments)] // the two public constructors above name them
    fn crypto(
        opcode: Opcode,
        space: u16,
        offset: u64,
        length: u32,
        slot: u32,
        seal: Option<&Seal>,
        destination: Option<(u16, u64)>,
        aad: &[u8],
    ) -> Op {
        let destination = destination.map(|(space, offset)| Destination { space, offset });
        let mut operand = Vec::new();
        encode_operand(&mut operand, seal, destination, aad);
        Op {
            flags: if destination.is_some() { CRYPTO_FLAG_TO_DESTINATION } else { 0 },
            aux: slot,
            operand,
            ..Op::new(opcode, space, offset, length)
        }
    }

    /// CRC32 of `length` bytes at `offset`.
    pub fn crc32(space: u16, offset: u64, length: u32) -> Op {
        Op::new(Opcode::Crc32, space, offset, length)
    }

    /// BREAD: `num_blocks` blocks from block `offset_blocks` of namespace `namespace`.
    pub fn block_read(namespace: u16, offset_blocks: u64, num_blocks: u32) -> Op {
        Op::new(Opcode::BlockRead, namespace, offset_blocks, num_blocks)
    }

    /// BWRITE: `data` (whole blocks of `block_bytes`) at block `offset_blocks`; with `fua` the
    /// answer comes once the data is durable.
    pub fn block_write(namespace: u16, offset_blocks: u64, block_bytes: u32, data: &[u8], fua: bool) -> Op {
        let num_blocks = (data.len() / block_bytes.max(1) as usize) as u32;
        Op {
            flags: if fua { BWRITE_FLAG_FUA } else { 0 },
            operand: data.to_vec(),
            ..Op::new(Opcode::BlockWrite, namespace, offset_blocks, num_blocks)
        }
    }

    /// FLUSH: every write answered before it becomes durable.
    pub fn flush(namespace: u16) -> Op {
        Op::new(Opcode::Flush, namespace, 0, 0)
    }

    /// TRIM: deallocate blocks; they read as zeroes.
    pub fn trim(namespace: u16, offset_blocks: u64, num_blocks: u32) -> Op {
        Op::new(Opcode::Trim, namespace, offset_blocks, num_blocks)
    }

    /// WRITE_ZEROES: set blocks to zero.
    pub fn write_zeroes(namespace: u16, offset_blocks: u64, num_blocks: u32) -> Op {
        Op::new(Opcode::WriteZeroes, namespace, offset_blocks, num_blocks)
    }

    /// BLOCK_STATUS: which of `num_blocks` blocks from `offset_blocks` are allocated and which
    /// are holes (the answer may cover fewer blocks).
    pub fn block_status(namespace: u16, offset_blocks: u64, num_blocks: u32) -> Op {
        Op::new(Opcode::BlockStatus, namespace, offset_blocks, num_blocks)
    }
}
