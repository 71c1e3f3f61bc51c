//! What a client learned from HELLO, and the helpers both clients share to turn it into requests
//! and to read answers.

use std::net::SocketAddr;

use netdam_isa::control::{HelloAnswer, NamespaceInfo, RegionInfo};
use netdam_isa::limits::MAX_VADD_BYTES;
use netdam_isa::wire::{HEADER_LEN, INSTRUCTION_HEADER_LEN, RESPONSE_INSTRUCTION_HEADER_LEN};
use netdam_isa::LaneType;

use crate::error::ClientError;
use crate::session::Reply;

/// A target as HELLO described it.
#[derive(Debug, Clone)]
pub struct TargetInfo {
    /// Its address.
    pub addr: SocketAddr,
    /// Its HELLO answer.
    pub hello: HelloAnswer,
}

/// What a lookup by name or id could have found, for its error: `disk (0), small (1)`, or
/// `none`.
fn names_and_ids<'a>(spaces: impl Iterator<Item = (&'a str, u16)>) -> String {
    let listed: Vec<String> = spaces.map(|(name, id)| format!("{name} ({id})")).collect();
    if listed.is_empty() {
        "none".to_string()
    } else {
        listed.join(", ")
    }
}

impl TargetInfo {
    /// The region named `name`, or with id `name` when it is a number.
    pub fn region(&self, name: &str) -> Result<&RegionInfo, ClientError> {
        let by_id = name.parse::<u16>().ok();
        self.hello.regions.iter().find(|region| region.name == name || Some(region.id) == by_id).ok_or_else(|| {
            let available = self.hello.regions.iter().map(|region| (region.name.as_str(), region.id));
            ClientError::NoSuchRegion { name: name.to_string(), available: names_and_ids(available) }
        })
    }

    /// The namespace named `name`, or with id `name` when it is a number.
    pub fn namespace(&self, name: &str) -> Result<&NamespaceInfo, ClientError> {
        let by_id = name.parse::<u16>().ok();
        let namespaces = &self.hello.namespaces;
        namespaces.iter().find(|namespace| namespace.name == name || Some(namespace.id) == by_id).ok_or_else(|| {
            let available = namespaces.iter().map(|namespace| (namespace.name.as_str(), namespace.id));
            ClientError::NoSuchNamespace { name: name.to_string(), available: names_and_ids(available) }
        })
    }

    /// The size of region `space` as the last HELLO gave it, if it listed the region (a
    /// sessionless client's lists none).
    pub fn region_size(&self, space: u16) -> Option<u64> {
        self.hello.regions.iter().find(|region| region.id == space).map(|region| region.size_bytes)
    }

    /// Most whole blocks one BREAD may return, or one BWRITE carry, within the datagram size.
    pub fn blocks_per_transfer(&self, block_bytes: u32) -> u32 {
        let bytes = self.read_chunk_bytes().min(self.write_chunk_bytes());
        (bytes / block_bytes.max(1) as usize) as u32
    }

    /// Most bytes one READ instruction may return within the negotiated datagram size.
    pub fn read_chunk_bytes(&self) -> usize {
        // Saturating: a sessionless client has no negotiated size, and no room.
        (self.hello.max_datagram_bytes as usize).saturating_sub(HEADER_LEN + RESPONSE_INSTRUCTION_HEADER_LEN)
    }

    /// Most operand bytes one VADD of `lane` lanes may carry: at most the ISA's 2048 f32 lanes,
    /// within the negotiated datagram (and its answer, when it returns the result), in whole lanes.
    pub fn vadd_chunk_bytes(&self, lane: LaneType, return_result: bool) -> usize {
        let mut bytes = MAX_VADD_BYTES.min(self.write_chunk_bytes());
        if return_result {
            bytes = bytes.min(self.read_chunk_bytes());
        }
        bytes / lane.lane_bytes() * lane.lane_bytes()
    }

    /// Most bytes one WRITE instruction may carry.
    pub fn write_chunk_bytes(&self) -> usize {
        (self.hello.max_datagram_bytes as usize).saturating_sub(HEADER_LEN + INSTRUCTION_HEADER_LEN)
    }
}

/// The 8-byte word answered by CAS or FETCH_ADD (its old value).
pub fn word_result(reply: &Reply) -> Result<u64, ClientError> {
    let data = reply.data(0)?;
    let word: [u8; 8] = data.try_into().map_err(|_| ClientError::MissingResult(0))?;
    Ok(u64::from_le_bytes(word))
}

/// The CRC32 answered by CRC32.
pub fn crc_result(reply: &Reply) -> Result<u32, ClientError> {
    let data = reply.data(0)?;
    let word: [u8; 4] = data.try_into().map_err(|_| ClientError::MissingResult(0))?;
    Ok(u32::from_le_bytes(word))
}

/// Refuses, before anything is sent, `len` bytes at `offset` that end past 2^64, or past
/// `region_size` where the caller knows it. Split into pieces, the pieces inside would be
/// executed while the caller hears only that the whole failed, and a piece whose offset wrapped
/// would land at the region's start (in a build without overflow checks; a panic with them).
pub fn check_byte_range(opcode: u8, offset: u64, len: usize, region_size: Option<u64>) -> Result<(), ClientError> {
    let inside = match (offset.checked_add(len as u64), region_size) {
        (None, _) => false,
        (Some(end), Some(size)) => end <= size,
        (Some(_), None) => true,
    };
    if inside || len == 0 {
        Ok(())
    } else {
        Err(ClientError::OutsideRegion { opcode, offset, len: len as u64, size_bytes: region_size })
    }
}

/// Splits `offset..offset + len` into pieces of at most `chunk` bytes: (offset, position, len).
pub fn chunks(offset: u64, len: usize, chunk: usize) -> impl Iterator<Item = (u64, usize, usize)> {
    (0..len).step_by(chunk.max(1)).map(move |position| (offset + position as u64, position, chunk.min(len - position)))
}
