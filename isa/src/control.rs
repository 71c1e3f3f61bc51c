//! Operands and answers of the control opcodes HELLO and STAT.

use crate::limits::{MAX_REGION_NAME_BYTES, MAX_STAT_ENTRIES, MAX_STAT_NAME_BYTES};
use crate::status::Status;
use crate::wire::DecodeError;

/// Bytes of the HELLO operand: requested datagram size, authentication method, cookie, and the
/// authentication area. The first HELLO is as long as the second, so the cookie answer to it is
/// never longer than what arrived (no amplification toward a forged source address).
pub const HELLO_OPERAND_LEN: usize = 96;
/// Bytes of a HELLO cookie: the target's issue time in ns (u64) and a 16-byte MAC.
pub const COOKIE_LEN: usize = 24;
/// Bytes of the HELLO operand reserved for a tenant's identity and key proof (zero in v1).
pub const HELLO_AUTH_LEN: usize = 64;
/// Authentication method of a HELLO without tenant authentication.
pub const HELLO_AUTH_NONE: u8 = 0;
/// Authentication method of a tenant's HELLO: its authentication area proves the tenant's key,
/// and every datagram of the session carries a MAC trailer (PROTOCOL.md, "Authentication").
pub const HELLO_AUTH_MAC: u8 = 1;
/// As [`HELLO_AUTH_MAC`], and the body of every datagram of the session is encrypted.
pub const HELLO_AUTH_ENCRYPT: u8 = 2;

/// Operand layout of HELLO (offsets within the operand).
mod hello_field {
    use core::ops::Range;
    pub const MAX_DATAGRAM_BYTES: Range<usize> = 0..4;
    pub const AUTH_METHOD: usize = 4;
    pub const RESERVED: Range<usize> = 5..8;
    pub const COOKIE: Range<usize> = 8..32;
    pub const AUTH: Range<usize> = 32..96;
}
const _: () = assert!(hello_field::COOKIE.end - hello_field::COOKIE.start == COOKIE_LEN);
const _: () = assert!(hello_field::AUTH.end - hello_field::AUTH.start == HELLO_AUTH_LEN);
const _: () = assert!(hello_field::AUTH.end == HELLO_OPERAND_LEN);

/// A HELLO cookie: proof, issued by the target, that the sender receives at its address.
pub type Cookie = [u8; COOKIE_LEN];

/// The cookie of a first HELLO, which has none yet.
pub const NO_COOKIE: Cookie = [0; COOKIE_LEN];

/// What a HELLO asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HelloRequest {
    /// Largest datagram the initiator sends and accepts.
    pub max_datagram_bytes: u32,
    /// The cookie of the target's `retry` answer, or [`NO_COOKIE`] on a first HELLO.
    pub cookie: Cookie,
}

/// Bytes of the fixed part of the HELLO answer.
pub const HELLO_ANSWER_FIXED_LEN: usize = 16;
/// Bytes of a region entry before its name.
pub const REGION_ENTRY_FIXED_LEN: usize = 12;
/// Region entry flag: the region is persistent.
pub const REGION_FLAG_PERSISTENT: u8 = 0x01;
/// Bytes of a namespace entry before its name.
pub const NAMESPACE_ENTRY_FIXED_LEN: usize = 16;
/// Namespace entry flag: BLOCK_STATUS can tell allocated blocks from holes (a file namespace);
/// without it BLOCK_STATUS answers `not_supported`.
pub const NAMESPACE_FLAG_REPORTS_ALLOCATION: u8 = 0x01;

/// Encodes the HELLO operand of an unauthenticated HELLO.
pub fn encode_hello_operand(hello: &HelloRequest) -> [u8; HELLO_OPERAND_LEN] {
    encode_hello_operand_with(hello, HELLO_AUTH_NONE, &[0; HELLO_AUTH_LEN])
}

/// Encodes the HELLO operand with authentication `method` and its area.
pub fn encode_hello_operand_with(
    hello: &HelloRequest,
    method: u8,
    area: &[u8; HELLO_AUTH_LEN],
) -> [u8; HELLO_OPERAND_LEN] {
    let mut operand = [0u8; HELLO_OPERAND_LEN];
    operand[hello_field::MAX_DATAGRAM_BYTES].copy_from_slice(&hello.max_datagram_bytes.to_le_bytes());
    operand[hello_field::AUTH_METHOD] = method;
    operand[hello_field::COOKIE].copy_from_slice(&hello.cookie);
    operand[hello_field::AUTH].copy_from_slice(area);
    operand
}

/// Decodes the HELLO operand. Reserved bytes must be zero, and so must the authentication area
/// of an unauthenticated HELLO (`malformed`); a method other than none or MAC is
/// `not_supported`. The authentication itself is read with [`decode_hello_auth`].
pub fn decode_hello_operand(operand: &[u8]) -> Result<HelloRequest, Status> {
    if operand.len() != HELLO_OPERAND_LEN || operand[hello_field::RESERVED] != [0; 3] {
        return Err(Status::Malformed);
    }
    match operand[hello_field::AUTH_METHOD] {
        HELLO_AUTH_NONE if operand[hello_field::AUTH].iter().any(|&byte| byte != 0) => return Err(Status::Malformed),
        HELLO_AUTH_NONE | HELLO_AUTH_MAC | HELLO_AUTH_ENCRYPT => {}
        _ => return Err(Status::NotSupported),
    }
    let mut size = [0u8; 4];
    size.copy_from_slice(&operand[hello_field::MAX_DATAGRAM_BYTES]);
    let mut cookie = NO_COOKIE;
    cookie.copy_from_slice(&operand[hello_field::COOKIE]);
    Ok(HelloRequest { max_datagram_bytes: u32::from_le_bytes(size), cookie })
}

/// The authentication method and area of a HELLO operand that [`decode_hello_operand`]
/// accepted.
pub fn decode_hello_auth(operand: &[u8]) -> (u8, [u8; HELLO_AUTH_LEN]) {
    let mut area = [0u8; HELLO_AUTH_LEN];
    area.copy_from_slice(&operand[hello_field::AUTH]);
    (operand[hello_field::AUTH_METHOD], area)
}

/// Bytes of the data a `session_limit` answer to HELLO carries: which limit was reached
/// (u32, [`SessionLimitKind`]) and its value (u32), both little-endian.
pub const SESSION_LIMIT_DETAIL_LEN: usize = 8;

/// Which limit a HELLO answered `session_limit` ran into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionLimitKind {
    /// The sender's address holds `max_sessions_per_address` active sessions on the worker the
    /// HELLO reached (each worker counts its own).
    Address = 1,
    /// The tenant holds its `max_sessions` over the whole target.
    Tenant = 2,
}

/// Writes a `session_limit` answer's data into `out` (at least [`SESSION_LIMIT_DETAIL_LEN`]
/// bytes); returns its length.
pub fn encode_session_limit(out: &mut [u8], kind: SessionLimitKind, limit: u32) -> usize {
    out[..4].copy_from_slice(&(kind as u32).to_le_bytes());
    out[4..SESSION_LIMIT_DETAIL_LEN].copy_from_slice(&limit.to_le_bytes());
    SESSION_LIMIT_DETAIL_LEN
}

/// Which limit and its value, from a `session_limit` answer's data; `None` for data of another
/// length or an unknown kind (a target from before the detail sends none).
pub fn decode_session_limit(data: &[u8]) -> Option<(SessionLimitKind, u32)> {
    let data: &[u8; SESSION_LIMIT_DETAIL_LEN] = data.try_into().ok()?;
    let kind = match u32::from_le_bytes([data[0], data[1], data[2], data[3]]) {
        1 => SessionLimitKind::Address,
        2 => SessionLimitKind::Tenant,
        _ => return None,
    };
    Some((kind, u32::from_le_bytes([data[4], data[5], data[6], data[7]])))
}

/// One region as HELLO lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionInfo {
    /// The id instructions address it by.
    pub id: u16,
    /// Its name.
    pub name: String,
    /// Its size in bytes.
    pub size_bytes: u64,
    /// Whether acknowledged writes are persisted.
    pub persistent: bool,
}

/// One block namespace as HELLO lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceInfo {
    /// The id block instructions address it by.
    pub id: u16,
    /// Its name.
    pub name: String,
    /// Bytes per block.
    pub block_bytes: u32,
    /// Blocks in the namespace.
    pub capacity_blocks: u64,
    /// Whether BLOCK_STATUS reports allocation here ([`NAMESPACE_FLAG_REPORTS_ALLOCATION`]).
    pub reports_allocation: bool,
}

/// One namespace as [`encode_hello_answer`] lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamespaceEntry<'n> {
    /// Its id.
    pub id: u16,
    /// Its name (validated at start-up: at most [`MAX_REGION_NAME_BYTES`]).
    pub name: &'n str,
    /// Bytes per block.
    pub block_bytes: u32,
    /// Blocks it holds.
    pub capacity_blocks: u64,
    /// Whether BLOCK_STATUS reports allocation on it.
    pub reports_allocation: bool,
}

/// Bit 0 of HELLO's target flags: the target executes instructions on an FPGA engine (regions
/// placed on the device); clear when it executes on the CPU, including after a failover.
pub const TARGET_FLAG_FPGA: u16 = 0x0001;

/// What HELLO answers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HelloAnswer {
    /// Session id for the initiator's requests.
    pub session: u32,
    /// Negotiated datagram size: the smaller of both sides' limits.
    pub max_datagram_bytes: u32,
    /// Instructions per datagram the target accepts.
    pub max_instructions: u16,
    /// Target flags ([`TARGET_FLAG_FPGA`]); other bits are reserved, 0.
    pub target_flags: u16,
    /// The regions the target serves.
    pub regions: Vec<RegionInfo>,
    /// The block namespaces the target serves.
    pub namespaces: Vec<NamespaceInfo>,
}

/// Writes the HELLO answer into `out` without allocating; returns its length.
pub fn encode_hello_answer<'r>(
    out: &mut [u8],
    session: u32,
    max_datagram_bytes: u32,
    max_instructions: u16,
    target_flags: u16,
    regions: impl Iterator<Item = (u16, &'r str, u64, bool)> + Clone,
    namespaces: impl Iterator<Item = NamespaceEntry<'r>> + Clone,
) -> Result<usize, Status> {
    // Counted on a copy of each iterator: a target lists only the spaces a tenant may use, and
    // a filtered list knows its length only by walking it (no allocation for it).
    let count = u16::try_from(regions.clone().count()).map_err(|_| Status::TooLarge)?;
    let namespace_count = u16::try_from(namespaces.clone().count()).map_err(|_| Status::TooLarge)?;
    if out.len() < HELLO_ANSWER_FIXED_LEN {
        return Err(Status::TooLarge);
    }
    out[0..4].copy_from_slice(&session.to_le_bytes());
    out[4..8].copy_from_slice(&max_datagram_bytes.to_le_bytes());
    out[8..10].copy_from_slice(&max_instructions.to_le_bytes());
    out[10..12].copy_from_slice(&count.to_le_bytes());
    out[12..14].copy_from_slice(&namespace_count.to_le_bytes());
    out[14..16].copy_from_slice(&target_flags.to_le_bytes());
    let mut len = HELLO_ANSWER_FIXED_LEN;
    for (id, name, size_bytes, persistent) in regions {
        assert!(name.len() <= MAX_REGION_NAME_BYTES, "region names are validated at start-up");
        let end = len + REGION_ENTRY_FIXED_LEN + name.len();
        if end > out.len() {
            return Err(Status::TooLarge);
        }
        let entry = &mut out[len..end];
        entry[0..2].copy_from_slice(&id.to_le_bytes());
        entry[2] = if persistent { REGION_FLAG_PERSISTENT } else { 0 };
        entry[3] = name.len() as u8;
        entry[4..12].copy_from_slice(&size_bytes.to_le_bytes());
        entry[12..].copy_from_slice(name.as_bytes());
        len = end;
    }
    for namespace in namespaces {
        let name = namespace.name;
        assert!(name.len() <= MAX_REGION_NAME_BYTES, "namespace names are validated at start-up");
        let end = len + NAMESPACE_ENTRY_FIXED_LEN + name.len();
        if end > out.len() {
            return Err(Status::TooLarge);
        }
        let entry = &mut out[len..end];
        entry[0..2].copy_from_slice(&namespace.id.to_le_bytes());
        entry[2] = if namespace.reports_allocation { NAMESPACE_FLAG_REPORTS_ALLOCATION } else { 0 };
        entry[3] = name.len() as u8;
        entry[4..8].copy_from_slice(&namespace.block_bytes.to_le_bytes());
        entry[8..16].copy_from_slice(&namespace.capacity_blocks.to_le_bytes());
        entry[16..].copy_from_slice(name.as_bytes());
        len = end;
    }
    Ok(len)
}

/// Decodes a HELLO answer.
pub fn decode_hello_answer(data: &[u8]) -> Result<HelloAnswer, DecodeError> {
    if data.len() < HELLO_ANSWER_FIXED_LEN {
        return Err(DecodeError::Truncated);
    }
    let count = u16::from_le_bytes([data[10], data[11]]);
    let namespace_count = u16::from_le_bytes([data[12], data[13]]);
    let target_flags = u16::from_le_bytes([data[14], data[15]]);
    if target_flags & !TARGET_FLAG_FPGA != 0 {
        return Err(DecodeError::ReservedNotZero);
    }
    let mut regions = Vec::with_capacity(usize::from(count));
    let mut rest = &data[HELLO_ANSWER_FIXED_LEN..];
    for _ in 0..count {
        if rest.len() < REGION_ENTRY_FIXED_LEN {
            return Err(DecodeError::Truncated);
        }
        let name_len = usize::from(rest[3]);
        let end = REGION_ENTRY_FIXED_LEN + name_len;
        if rest.len() < end {
            return Err(DecodeError::Truncated);
        }
        if rest[2] & !REGION_FLAG_PERSISTENT != 0 {
            return Err(DecodeError::ReservedNotZero);
        }
        let mut size = [0u8; 8];
        size.copy_from_slice(&rest[4..12]);
        regions.push(RegionInfo {
            id: u16::from_le_bytes([rest[0], rest[1]]),
            name: String::from_utf8_lossy(&rest[REGION_ENTRY_FIXED_LEN..end]).into_owned(),
            size_bytes: u64::from_le_bytes(size),
            persistent: rest[2] & REGION_FLAG_PERSISTENT != 0,
        });
        rest = &rest[end..];
    }
    let mut namespaces = Vec::with_capacity(usize::from(namespace_count));
    for _ in 0..namespace_count {
        if rest.len() < NAMESPACE_ENTRY_FIXED_LEN {
            return Err(DecodeError::Truncated);
        }
        let end = NAMESPACE_ENTRY_FIXED_LEN + usize::from(rest[3]);
        if rest.len() < end {
            return Err(DecodeError::Truncated);
        }
        if rest[2] & !NAMESPACE_FLAG_REPORTS_ALLOCATION != 0 {
            return Err(DecodeError::ReservedNotZero);
        }
        let mut capacity = [0u8; 8];
        capacity.copy_from_slice(&rest[8..16]);
        namespaces.push(NamespaceInfo {
            id: u16::from_le_bytes([rest[0], rest[1]]),
            name: String::from_utf8_lossy(&rest[NAMESPACE_ENTRY_FIXED_LEN..end]).into_owned(),
            block_bytes: u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]),
            capacity_blocks: u64::from_le_bytes(capacity),
            reports_allocation: rest[2] & NAMESPACE_FLAG_REPORTS_ALLOCATION != 0,
        });
        rest = &rest[end..];
    }
    if !rest.is_empty() {
        return Err(DecodeError::TrailingBytes);
    }
    Ok(HelloAnswer {
        session: u32::from_le_bytes([data[0], data[1], data[2], data[3]]),
        max_datagram_bytes: u32::from_le_bytes([data[4], data[5], data[6], data[7]]),
        max_instructions: u16::from_le_bytes([data[8], data[9]]),
        target_flags,
        regions,
        namespaces,
    })
}

/// Writes a STAT answer (named counters) into a buffer without allocating.
#[derive(Debug)]
pub struct StatWriter<'b> {
    out: &'b mut [u8],
    len: usize,
    count: u16,
}

impl<'b> StatWriter<'b> {
    /// Starts an answer in `out`.
    pub fn new(out: &'b mut [u8]) -> Result<StatWriter<'b>, Status> {
        if out.len() < 2 {
            return Err(Status::TooLarge);
        }
        Ok(StatWriter { out, len: 2, count: 0 })
    }

    /// Appends one counter.
    pub fn push(&mut self, name: &str, value: u64) -> Result<(), Status> {
        self.push_prefixed("", name, value)
    }

    /// Appends one counter named `prefix` then `name`, without building the name anywhere.
    pub fn push_prefixed(&mut self, prefix: &str, name: &str, value: u64) -> Result<(), Status> {
        let name_len = prefix.len() + name.len();
        assert!(name_len <= MAX_STAT_NAME_BYTES, "counter names are compile-time constants");
        if usize::from(self.count) >= MAX_STAT_ENTRIES {
            return Err(Status::TooLarge);
        }
        let end = self.len + 1 + name_len + 8;
        if end > self.out.len() {
            return Err(Status::TooLarge);
        }
        self.out[self.len] = name_len as u8;
        let name_start = self.len + 1;
        self.out[name_start..name_start + prefix.len()].copy_from_slice(prefix.as_bytes());
        self.out[name_start + prefix.len()..name_start + name_len].copy_from_slice(name.as_bytes());
        self.out[end - 8..end].copy_from_slice(&value.to_le_bytes());
        self.len = end;
        self.count += 1;
        Ok(())
    }

    /// Writes the entry count; returns the answer's length.
    pub fn finish(self) -> usize {
        self.out[0..2].copy_from_slice(&self.count.to_le_bytes());
        self.len
    }
}

/// Decodes a STAT answer into (name, value) pairs in target order.
pub fn decode_stat_answer(data: &[u8]) -> Result<Vec<(String, u64)>, DecodeError> {
    if data.len() < 2 {
        return Err(DecodeError::Truncated);
    }
    let count = usize::from(u16::from_le_bytes([data[0], data[1]]));
    let mut rest = &data[2..];
    let mut entries = Vec::with_capacity(count.min(MAX_STAT_ENTRIES));
    for _ in 0..count {
        let name_len = usize::from(*rest.first().ok_or(DecodeError::Truncated)?);
        let end = 1 + name_len + 8;
        if rest.len() < end {
            return Err(DecodeError::Truncated);
        }
        let name = String::from_utf8_lossy(&rest[1..1 + name_len]).into_owned();
        let mut value = [0u8; 8];
        value.copy_from_slice(&rest[1 + name_len..end]);
        entries.push((name, u64::from_le_bytes(value)));
        rest = &rest[end..];
    }
    if !rest.is_empty() {
        return Err(DecodeError::TrailingBytes);
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_limit_details_round_trip_and_anything_else_is_none() {
        let mut out = [0u8; 16];
        for (kind, limit) in [(SessionLimitKind::Address, 32), (SessionLimitKind::Tenant, u32::MAX)] {
            let len = encode_session_limit(&mut out, kind, limit);
            assert_eq!(decode_session_limit(&out[..len]), Some((kind, limit)));
        }
        assert_eq!(decode_session_limit(&[]), None, "an older target's answer has no data");
        assert_eq!(decode_session_limit(&out[..9]), None);
        assert_eq!(decode_session_limit(&[3, 0, 0, 0, 1, 0, 0, 0]), None, "an unknown kind");
    }

    #[test]
    fn hello_answer_round_trips() {
        let mut out = [0u8; 256];
        let regions = [(0u16, "default", 1u64 << 26, true), (1, "scratch", 4096, false)];
        let namespaces = [
            NamespaceEntry {
                id: 0,
                name: "disk",
                block_bytes: 4096,
                capacity_blocks: 1 << 20,
                reports_allocation: true,
            },
            NamespaceEntry { id: 1, name: "pm", block_bytes: 512, capacity_blocks: 8, reports_allocation: false },
        ];
        let len = encode_hello_answer(
            &mut out,
            7,
            9000,
            64,
            TARGET_FLAG_FPGA,
            regions.iter().map(|r| (r.0, r.1, r.2, r.3)),
            namespaces.iter().copied(),
        )
        .unwrap();
        let answer = decode_hello_answer(&out[..len]).unwrap();
        let disk = NamespaceInfo {
            id: 0,
            name: "disk".into(),
            block_bytes: 4096,
            capacity_blocks: 1 << 20,
            reports_allocation: true,
        };
        let pm =
            NamespaceInfo { id: 1, name: "pm".into(), block_bytes: 512, capacity_blocks: 8, reports_allocation: false };
        assert_eq!(answer.namespaces, vec![disk, pm]);
        assert_eq!(answer.session, 7);
        assert_eq!(answer.max_datagram_bytes, 9000);
        assert_eq!(answer.target_flags, TARGET_FLAG_FPGA);
        assert_eq!(out[14..16], [0x01, 0x00], "target flags at offset 14, little endian");
        assert_eq!(answer.regions.len(), 2);
        assert_eq!(answer.regions[0].name, "default");
        assert!(answer.regions[0].persistent);
        assert_eq!(answer.regions[1].size_bytes, 4096);
        assert_eq!(decode_hello_answer(&out[..len - 1]), Err(DecodeError::Truncated));
        // Target flags other than bit 0 are reserved.
        out[14] |= 0x02;
        assert_eq!(decode_hello_answer(&out[..len]), Err(DecodeError::ReservedNotZero));
        out[14] = 0;
        assert_eq!(decode_hello_answer(&out[..len]).unwrap().target_flags, 0);
        // The first namespace entry's flags byte: bits other than "reports allocation" are reserved.
        let flags_at = HELLO_ANSWER_FIXED_LEN + 2 * REGION_ENTRY_FIXED_LEN + "default".len() + "scratch".len() + 2;
        assert_eq!(out[flags_at], NAMESPACE_FLAG_REPORTS_ALLOCATION);
        out[flags_at] |= 0x02;
        assert_eq!(decode_hello_answer(&out[..len]), Err(DecodeError::ReservedNotZero));
    }

    #[test]
    fn stat_answer_round_trips_and_refuses_overflow() {
        let mut out = [0u8; 64];
        let mut writer = StatWriter::new(&mut out).unwrap();
        writer.push("datagrams_received", 12).unwrap();
        writer.push("dropped_bad_crc", 3).unwrap();
        assert_eq!(writer.push("a_name_that_does_not_fit_anymore", 1), Err(Status::TooLarge));
        let len = writer.finish();
        let entries = decode_stat_answer(&out[..len]).unwrap();
        assert_eq!(entries, vec![("datagrams_received".to_string(), 12), ("dropped_bad_crc".to_string(), 3)]);
    }

    #[test]
    fn hello_operand_round_trips_and_rejects_reserved_bytes() {
        let hello = HelloRequest { max_datagram_bytes: 9000, cookie: [7; COOKIE_LEN] };
        let operand = encode_hello_operand(&hello);
        assert_eq!(decode_hello_operand(&operand), Ok(hello));
        assert_eq!(decode_hello_operand(&operand[..HELLO_OPERAND_LEN - 1]), Err(Status::Malformed));
        assert_eq!(decode_hello_operand(&[0; 8]), Err(Status::Malformed), "the 8-byte operand of earlier builds");
        for (at, value, status) in [(5, 1, Status::Malformed), (40, 1, Status::Malformed), (4, 3, Status::NotSupported)]
        {
            let mut bad = operand;
            bad[at] = value;
            assert_eq!(decode_hello_operand(&bad), Err(status), "byte {at}");
        }
    }
}
