//! Opcode numbers of ISA v1 and the properties the transport needs from each.

/// An instruction's operation. Numbers are grouped by DESIGN's instruction table; numbers not
/// listed are unknown, except 0x80..=0xFF which belong to registered extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// Session setup: negotiates the datagram size and lists regions.
    Hello = 0x01,
    /// Liveness and round-trip probe.
    Ping = 0x02,
    /// Target counters.
    Stat = 0x03,
    /// Ends the session it is sent in, freeing its slot at once.
    Close = 0x04,
    /// Read bytes of a region.
    Read = 0x10,
    /// Write bytes into a region.
    Write = 0x11,
    /// Compare-and-swap of an aligned 8-byte word.
    Cas = 0x12,
    /// Fetch-and-add of an aligned 8-byte word.
    FetchAdd = 0x13,
    /// Copy a range within the target, between or within regions.
    Memcpy = 0x14,
    /// Set a range to one byte value.
    Fill = 0x15,
    /// Element-wise add of the operand's lanes into memory.
    Vadd = 0x20,
    /// CRC32 of a range.
    Crc32 = 0x28,
    /// AES-256-GCM-encrypt a range with a key slot; answers the nonce and tag (see `crypto`).
    Encrypt = 0x30,
    /// AES-256-GCM-decrypt a range with a key slot, given ENCRYPT's nonce and tag.
    Decrypt = 0x31,
    /// Read blocks of a namespace (reserved).
    BlockRead = 0x40,
    /// Write blocks of a namespace (reserved).
    BlockWrite = 0x41,
    /// Make acknowledged block writes durable (reserved).
    Flush = 0x42,
    /// Deallocate blocks (reserved).
    Trim = 0x43,
    /// Zero blocks (reserved).
    WriteZeroes = 0x44,
    /// Report which blocks of a range are allocated and which read as zeroes.
    BlockStatus = 0x45,
}

/// First opcode number of the extension range dispatched to registered handlers.
pub const EXTENSION_OPCODE_FIRST: u8 = 0x80;

impl Opcode {
    /// Every defined opcode.
    pub const ALL: [Opcode; 20] = [
        Opcode::Hello,
        Opcode::Ping,
        Opcode::Stat,
        Opcode::Close,
        Opcode::Read,
        Opcode::Write,
        Opcode::Cas,
        Opcode::FetchAdd,
        Opcode::Memcpy,
        Opcode::Fill,
        Opcode::Vadd,
        Opcode::Crc32,
        Opcode::Encrypt,
        Opcode::Decrypt,
        Opcode::BlockRead,
        Opcode::BlockWrite,
        Opcode::Flush,
        Opcode::Trim,
        Opcode::WriteZeroes,
        Opcode::BlockStatus,
    ];

    /// The opcode with this number, if one is defined.
    pub fn from_u8(value: u8) -> Option<Opcode> {
        Some(match value {
            0x01 => Opcode::Hello,
            0x02 => Opcode::Ping,
            0x03 => Opcode::Stat,
            0x04 => Opcode::Close,
            0x10 => Opcode::Read,
            0x11 => Opcode::Write,
            0x12 => Opcode::Cas,
            0x13 => Opcode::FetchAdd,
            0x14 => Opcode::Memcpy,
            0x15 => Opcode::Fill,
            0x20 => Opcode::Vadd,
            0x28 => Opcode::Crc32,
            0x30 => Opcode::Encrypt,
            0x31 => Opcode::Decrypt,
            0x40 => Opcode::BlockRead,
            0x41 => Opcode::BlockWrite,
            0x42 => Opcode::Flush,
            0x43 => Opcode::Trim,
            0x44 => Opcode::WriteZeroes,
            0x45 => Opcode::BlockStatus,
            _ => return None,
        })
    }

    /// Whether executing the instruction twice has the same effect as once, so a lost answer
    /// may be recovered by sending the request again.
    pub fn is_idempotent(self) -> bool {
        match self {
            Opcode::Hello
            | Opcode::Ping
            | Opcode::Stat
            | Opcode::Close
            | Opcode::Read
            | Opcode::Write
            | Opcode::Memcpy
            | Opcode::Fill
            | Opcode::Crc32
            | Opcode::BlockRead
            | Opcode::BlockWrite
            | Opcode::Flush
            | Opcode::Trim
            | Opcode::WriteZeroes
            | Opcode::BlockStatus => true,
            // MEMCPY is idempotent only while source and destination do not overlap, DECRYPT only
            // to a separate destination: Instruction::is_idempotent checks that. ENCRYPT never is
            // (a fresh nonce each time, see `crypto::is_idempotent`).
            Opcode::Cas | Opcode::FetchAdd | Opcode::Vadd | Opcode::Encrypt | Opcode::Decrypt => false,
        }
    }

    /// Whether it addresses a block namespace (and completes asynchronously on the target).
    pub fn is_block(self) -> bool {
        matches!(
            self,
            Opcode::BlockRead
                | Opcode::BlockWrite
                | Opcode::Flush
                | Opcode::Trim
                | Opcode::WriteZeroes
                | Opcode::BlockStatus
        )
    }

    /// A stable lower-case name, used in counters and CLI output.
    pub fn name(self) -> &'static str {
        match self {
            Opcode::Hello => "hello",
            Opcode::Ping => "ping",
            Opcode::Stat => "stat",
            Opcode::Close => "close",
            Opcode::Read => "read",
            Opcode::Write => "write",
            Opcode::Cas => "cas",
            Opcode::FetchAdd => "fetch_add",
            Opcode::Memcpy => "memcpy",
            Opcode::Fill => "fill",
            Opcode::Vadd => "vadd",
            Opcode::Crc32 => "crc32",
            Opcode::Encrypt => "encrypt",
            Opcode::Decrypt => "decrypt",
            Opcode::BlockRead => "bread",
            Opcode::BlockWrite => "bwrite",
            Opcode::Flush => "flush",
            Opcode::Trim => "trim",
            Opcode::WriteZeroes => "write_zeroes",
            Opcode::BlockStatus => "block_status",
        }
    }
}

/// Element type of VADD lanes, carried in the instruction's `aux` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum LaneType {
    /// IEEE 754 binary32.
    F32 = 0,
    /// Two's-complement 32-bit integer; addition wraps.
    I32 = 1,
    /// bfloat16 (the upper half of a binary32); sums round to nearest even.
    Bf16 = 2,
}

impl LaneType {
    /// The lane type with this `aux` value.
    pub fn from_u32(value: u32) -> Option<LaneType> {
        match value {
            0 => Some(LaneType::F32),
            1 => Some(LaneType::I32),
            2 => Some(LaneType::Bf16),
            _ => None,
        }
    }

    /// Bytes per lane.
    pub fn lane_bytes(self) -> usize {
        match self {
            LaneType::F32 | LaneType::I32 => 4,
            LaneType::Bf16 => 2,
        }
    }
}

/// Instruction flag of VADD: also return the lanes' new values.
pub const VADD_FLAG_RETURN_RESULT: u8 = 0x01;

/// BWRITE flag: force unit access, the data is durable before the answer.
pub const BWRITE_FLAG_FUA: u8 = 0x01;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_round_trip_and_do_not_collide_with_extensions() {
        for opcode in Opcode::ALL {
            assert_eq!(Opcode::from_u8(opcode as u8), Some(opcode));
            assert!((opcode as u8) < EXTENSION_OPCODE_FIRST);
        }
        for value in 0..=u8::MAX {
            let listed = Opcode::ALL.iter().copied().find(|opcode| *opcode as u8 == value);
            assert_eq!(Opcode::from_u8(value), listed, "{value:#04x}");
        }
    }
}
