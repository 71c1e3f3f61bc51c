//! The v1 datagram layout (docs/PROTOCOL.md is the byte-level truth this module matches).
//!
//! Untrusted bytes enter only through [`Request::parse`] and [`Response::parse`], which check the
//! whole datagram (magic, version, CRC, reserved fields, every instruction's framing, no trailing
//! bytes) before anything is executed. Encoding goes through [`RequestBuilder`] and
//! [`ResponseWriter`], which write into caller-owned buffers and never allocate.

use core::ops::Range;

use crate::checksum;
use crate::limits::MAX_INSTRUCTIONS_PER_DATAGRAM;
use crate::status::Status;

/// First two bytes of every datagram: "ND".
pub const MAGIC: [u8; 2] = [0x4E, 0x44];
/// The protocol version this crate speaks.
pub const VERSION: u8 = 0x01;
/// Bytes of the datagram header, in requests and responses alike.
pub const HEADER_LEN: usize = 32;
/// Bytes of a request instruction's fixed part, before its operand.
pub const INSTRUCTION_HEADER_LEN: usize = 24;
/// Bytes of a response instruction's fixed part, before its data.
pub const RESPONSE_INSTRUCTION_HEADER_LEN: usize = 8;

/// Header flag: the datagram is a response. A target never answers a datagram carrying it.
pub const FLAG_RESPONSE: u8 = 0x01;
const FLAGS_KNOWN: u8 = FLAG_RESPONSE;

/// Flag bit 1: the datagram ends with the MAC trailer of an authenticated session
/// (PROTOCOL.md, "Authentication"); its CRC field is 0 and not checked, the MAC covers it.
pub const FLAG_SEALED: u8 = 0x02;

/// Flag bit 2, with [`FLAG_SEALED`]: the body (instructions or results) is encrypted, in a
/// session whose HELLO asked for encryption (PROTOCOL.md, "Authentication").
pub const FLAG_ENCRYPTED: u8 = 0x04;

/// Whether a datagram's header says its body is encrypted (flags byte read at the v1 position).
pub fn peek_is_encrypted(bytes: &[u8]) -> bool {
    bytes.len() > header_field::FLAGS && bytes[header_field::FLAGS] & FLAG_ENCRYPTED != 0
}

/// Whether a datagram's header says it is sealed (flags byte read at the v1 position).
pub fn peek_is_sealed(bytes: &[u8]) -> bool {
    bytes.len() > header_field::FLAGS && bytes[header_field::FLAGS] & FLAG_SEALED != 0
}

/// Marks a finished datagram as sealed: sets [`FLAG_SEALED`] and zeroes the CRC field. The
/// caller appends the trailer next (`netdam_auth::trailer::seal`).
pub fn mark_sealed(datagram: &mut [u8]) {
    assert!(datagram.len() >= HEADER_LEN, "a finished datagram has a whole header");
    datagram[header_field::FLAGS] |= FLAG_SEALED;
    datagram[header_field::CRC].fill(0);
}

/// Named byte ranges of the datagram header.
mod header_field {
    use core::ops::Range;
    pub const MAGIC: Range<usize> = 0..2;
    pub const VERSION: usize = 2;
    pub const FLAGS: usize = 3;
    pub const SESSION: Range<usize> = 4..8;
    pub const SEQUENCE: Range<usize> = 8..16;
    pub const COUNT: Range<usize> = 16..18;
    pub const STATUS: usize = 18;
    pub const TTL: usize = 19;
    pub const SERVICE_TIME_NS: Range<usize> = 20..24;
    pub const QUEUE_DEPTH: Range<usize> = 24..26;
    pub const QUEUEING_US: Range<usize> = 26..28;
    pub const CRC: Range<usize> = 28..32;
}

/// Named byte ranges of a request instruction.
mod instruction_field {
    use core::ops::Range;
    pub const OPCODE: usize = 0;
    pub const FLAGS: usize = 1;
    pub const SPACE: Range<usize> = 2..4;
    pub const OPERAND_LEN: Range<usize> = 4..8;
    pub const OFFSET: Range<usize> = 8..16;
    pub const LENGTH: Range<usize> = 16..20;
    pub const AUX: Range<usize> = 20..24;
}

/// Named byte ranges of a response instruction.
mod result_field {
    use core::ops::Range;
    pub const OPCODE: usize = 0;
    pub const STATUS: usize = 1;
    pub const RESERVED: Range<usize> = 2..4;
    pub const DATA_LEN: Range<usize> = 4..8;
}

const _: () = assert!(header_field::CRC.end == HEADER_LEN);
const _: () = assert!(instruction_field::AUX.end == INSTRUCTION_HEADER_LEN);
const _: () = assert!(result_field::DATA_LEN.end == RESPONSE_INSTRUCTION_HEADER_LEN);

/// Why a datagram could not be decoded. [`DecodeError::disposition`] says what a target does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    /// Shorter than the header.
    TooShort,
    /// The first two bytes are not the magic.
    BadMagic,
    /// A version other than [`VERSION`].
    UnsupportedVersion(u8),
    /// The CRC does not match the bytes.
    BadCrc,
    /// A reserved header field, flag or instruction field is not zero.
    ReservedNotZero,
    /// The instruction count is zero or over the limit.
    BadInstructionCount,
    /// An instruction runs past the end of the datagram.
    Truncated,
    /// Bytes follow the last instruction.
    TrailingBytes,
    /// The response flag does not match what the parser expected.
    WrongDirection,
    /// A response carries a status this crate does not know.
    UnknownStatus(u8),
}

/// What a target does with a datagram it could not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Nothing in it can be trusted to address an answer: drop it and count the reason.
    Drop,
    /// Answer with this datagram status and no instructions.
    Answer(Status),
}

impl DecodeError {
    /// Whether the target drops the datagram or answers it with a datagram-level status.
    pub fn disposition(self) -> Disposition {
        match self {
            DecodeError::TooShort | DecodeError::BadMagic | DecodeError::BadCrc | DecodeError::WrongDirection => {
                Disposition::Drop
            }
            DecodeError::UnsupportedVersion(_) => Disposition::Answer(Status::UnsupportedVersion),
            DecodeError::ReservedNotZero
            | DecodeError::BadInstructionCount
            | DecodeError::Truncated
            | DecodeError::TrailingBytes
            | DecodeError::UnknownStatus(_) => Disposition::Answer(Status::Malformed),
        }
    }
}

impl core::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            DecodeError::TooShort => write!(f, "datagram shorter than the {HEADER_LEN}-byte header"),
            DecodeError::BadMagic => write!(f, "datagram does not start with the magic 4E 44"),
            DecodeError::UnsupportedVersion(v) => {
                write!(f, "protocol version {v} is not supported (this side speaks {VERSION})")
            }
            DecodeError::BadCrc => write!(f, "CRC32 does not match the datagram"),
            DecodeError::ReservedNotZero => write!(f, "a reserved field or flag is not zero"),
            DecodeError::BadInstructionCount => {
                write!(f, "instruction count is zero or over {MAX_INSTRUCTIONS_PER_DATAGRAM}")
            }
            DecodeError::Truncated => write!(f, "an instruction runs past the end of the datagram"),
            DecodeError::TrailingBytes => write!(f, "bytes follow the last instruction"),
            DecodeError::WrongDirection => write!(f, "response flag is not what was expected"),
            DecodeError::UnknownStatus(s) => write!(f, "unknown status code {s:#04x}"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Why an encoder could not write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncodeError {
    /// The buffer has no room for the next item.
    NoRoom,
    /// The datagram already holds the most instructions allowed.
    TooManyInstructions,
    /// An operand is longer than a u32 length field can say.
    OperandTooLong,
}

impl core::fmt::Display for EncodeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            EncodeError::NoRoom => f.write_str("datagram buffer has no room for the instruction"),
            EncodeError::TooManyInstructions => {
                write!(f, "a datagram carries at most {MAX_INSTRUCTIONS_PER_DATAGRAM} instructions")
            }
            EncodeError::OperandTooLong => f.write_str("operand longer than 4 GiB"),
        }
    }
}

impl std::error::Error for EncodeError {}

fn read_u16(bytes: &[u8], range: Range<usize>) -> u16 {
    let mut word = [0u8; 2];
    word.copy_from_slice(&bytes[range]);
    u16::from_le_bytes(word)
}

fn read_u32(bytes: &[u8], range: Range<usize>) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[range]);
    u32::from_le_bytes(word)
}

fn read_u64(bytes: &[u8], range: Range<usize>) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[range]);
    u64::from_le_bytes(word)
}

/// The datagram checksum, CRC-32C ([`crate::checksum`]): the header before the CRC field, then
/// everything after it.
pub fn datagram_crc(datagram: &[u8]) -> u32 {
    let header = checksum::update(checksum::INITIAL, &datagram[..header_field::CRC.start]);
    checksum::finish(checksum::update(header, &datagram[header_field::CRC.end..]))
}

/// The decoded datagram header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    /// Flag bits ([`FLAG_RESPONSE`]).
    pub flags: u8,
    /// Session id; 0 before a session exists.
    pub session: u32,
    /// Request sequence number, echoed in the response.
    pub sequence: u64,
    /// Instructions that follow the header.
    pub count: u16,
    /// Datagram status: non-zero in a response whose instructions were not executed at all.
    pub status: u8,
    /// IP TTL the target received the request with (0: unknown). Zero in requests.
    pub ttl: u8,
    /// Target service time for this request in ns, saturating. Zero in requests.
    pub service_time_ns: u32,
    /// Datagrams waiting behind this one at the worker when it was taken. Zero in requests.
    pub queue_depth: u16,
    /// How long the request waited at the target before execution began, µs (saturating): the
    /// endpoint's queueing, which congestion control reacts to. In a BUSY answer, the wait the
    /// target expects, which the initiator takes as its back-off. Zero in requests.
    pub queueing_us: u16,
}

impl Header {
    /// Whether this header belongs to a response.
    pub fn is_response(&self) -> bool {
        self.flags & FLAG_RESPONSE != 0
    }

    fn write(&self, buf: &mut [u8]) {
        buf[header_field::MAGIC].copy_from_slice(&MAGIC);
        buf[header_field::VERSION] = VERSION;
        buf[header_field::FLAGS] = self.flags;
        buf[header_field::SESSION].copy_from_slice(&self.session.to_le_bytes());
        buf[header_field::SEQUENCE].copy_from_slice(&self.sequence.to_le_bytes());
        buf[header_field::COUNT].copy_from_slice(&self.count.to_le_bytes());
        buf[header_field::STATUS] = self.status;
        buf[header_field::TTL] = self.ttl;
        buf[header_field::SERVICE_TIME_NS].copy_from_slice(&self.service_time_ns.to_le_bytes());
        buf[header_field::QUEUE_DEPTH].copy_from_slice(&self.queue_depth.to_le_bytes());
        buf[header_field::QUEUEING_US].copy_from_slice(&self.queueing_us.to_le_bytes());
        buf[header_field::CRC].fill(0);
    }

    /// Checks magic, version and CRC, then decodes the header fields. `opened`: the datagram's
    /// trailer was checked and removed by the caller, so it must carry [`FLAG_SEALED`] and its
    /// CRC field is 0; otherwise the flag is refused.
    /// The header's fields, read without a check; `bytes` holds at least a header.
    fn fields(bytes: &[u8]) -> Header {
        Header {
            flags: bytes[header_field::FLAGS],
            session: read_u32(bytes, header_field::SESSION),
            sequence: read_u64(bytes, header_field::SEQUENCE),
            count: read_u16(bytes, header_field::COUNT),
            status: bytes[header_field::STATUS],
            ttl: bytes[header_field::TTL],
            service_time_ns: read_u32(bytes, header_field::SERVICE_TIME_NS),
            queue_depth: read_u16(bytes, header_field::QUEUE_DEPTH),
            queueing_us: read_u16(bytes, header_field::QUEUEING_US),
        }
    }

    fn parse_checked(bytes: &[u8], opened: bool) -> Result<Header, DecodeError> {
        if bytes.len() < HEADER_LEN {
            return Err(DecodeError::TooShort);
        }
        if bytes[header_field::MAGIC] != MAGIC {
            return Err(DecodeError::BadMagic);
        }
        if bytes[header_field::VERSION] != VERSION {
            return Err(DecodeError::UnsupportedVersion(bytes[header_field::VERSION]));
        }
        let crc = read_u32(bytes, header_field::CRC);
        if opened {
            if crc != 0 || bytes[header_field::FLAGS] & FLAG_SEALED == 0 {
                return Err(DecodeError::ReservedNotZero);
            }
        } else if crc != datagram_crc(bytes) {
            return Err(DecodeError::BadCrc);
        }
        let header = Header::fields(bytes);
        let known = if opened { FLAGS_KNOWN | FLAG_SEALED | FLAG_ENCRYPTED } else { FLAGS_KNOWN };
        if header.flags & !known != 0 {
            return Err(DecodeError::ReservedNotZero);
        }
        Ok(header)
    }
}

/// Session and sequence of a datagram whose header cannot be fully trusted, read from their v1
/// positions so an error answer can still name the request (see [`DecodeError::disposition`]).
pub fn peek_session_sequence(bytes: &[u8]) -> Option<(u32, u64)> {
    if bytes.len() < HEADER_LEN || bytes[header_field::MAGIC] != MAGIC {
        return None;
    }
    Some((read_u32(bytes, header_field::SESSION), read_u64(bytes, header_field::SEQUENCE)))
}

/// Moves an encoded request into session `session`: rewrites its session field and its CRC.
/// (An initiator sends a request again in a new session after the target lost the old one.)
pub fn set_request_session(datagram: &mut [u8], session: u32) {
    assert!(datagram.len() >= HEADER_LEN, "an encoded request has a whole header");
    datagram[header_field::SESSION].copy_from_slice(&session.to_le_bytes());
    let crc = datagram_crc(datagram);
    datagram[header_field::CRC].copy_from_slice(&crc.to_le_bytes());
}

/// Restamps an encoded response held back by its target (group commit): its service time, and
/// its datagram status when given (the persist failed), with the CRC recomputed once (none for
/// an answer finished to be sealed, which is sealed after this).
pub fn restamp_response(datagram: &mut [u8], service_time_ns: u32, status: Option<Status>) {
    assert!(datagram.len() >= HEADER_LEN, "an encoded response has a whole header");
    datagram[header_field::SERVICE_TIME_NS].copy_from_slice(&service_time_ns.to_le_bytes());
    if let Some(status) = status {
        datagram[header_field::STATUS] = status as u8;
    }
    if datagram[header_field::FLAGS] & FLAG_SEALED != 0 {
        // Sealed after this: the MAC covers it, the CRC stays 0.
        return;
    }
    let crc = datagram_crc(datagram);
    datagram[header_field::CRC].copy_from_slice(&crc.to_le_bytes());
}

/// The datagram status byte of an encoded response (`None` if shorter than a header).
pub fn peek_datagram_status(bytes: &[u8]) -> Option<u8> {
    (bytes.len() >= HEADER_LEN).then(|| bytes[header_field::STATUS])
}

/// Whether the datagram claims to be a response (its flags byte read at the v1 position).
pub fn peek_is_response(bytes: &[u8]) -> bool {
    bytes.len() > header_field::FLAGS && bytes[header_field::FLAGS] & FLAG_RESPONSE != 0
}

/// One request instruction, borrowed from the datagram or built by a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Instruction<'a> {
    /// Opcode number; unknown numbers decode and are answered with [`Status::UnknownOpcode`].
    pub opcode: u8,
    /// Per-opcode flags.
    pub flags: u8,
    /// Region or namespace id.
    pub space: u16,
    /// Byte offset within the space (or first block, for block opcodes).
    pub offset: u64,
    /// Bytes addressed (or blocks, for block opcodes).
    pub length: u32,
    /// Per-opcode extra operand (lane type, fill byte, key slot).
    pub aux: u32,
    /// Operand bytes that follow the fixed part.
    pub operand: &'a [u8],
}

impl Instruction<'_> {
    /// Bytes this instruction takes in a request datagram.
    pub fn encoded_len(&self) -> usize {
        INSTRUCTION_HEADER_LEN + self.operand.len()
    }

    /// Whether executing it twice has the same effect as once. Unknown opcodes are not; a MEMCPY
    /// is only while source and destination do not overlap (a second copy would read what the
    /// first one wrote).
    pub fn is_idempotent(&self) -> bool {
        match crate::Opcode::from_u8(self.opcode) {
            Some(crate::Opcode::Memcpy) if self.operand.len() == 16 => {
                let source_space = u16::from_le_bytes([self.operand[0], self.operand[1]]);
                let source_offset = read_u64(self.operand, 8..16);
                let length = u64::from(self.length);
                source_space != self.space
                    || source_offset.saturating_add(length) <= self.offset
                    || self.offset.saturating_add(length) <= source_offset
            }
            Some(crate::Opcode::Decrypt) => crate::crypto::is_idempotent(self),
            Some(opcode) => opcode.is_idempotent(),
            None => false,
        }
    }
}

/// Iterator over the instructions of a request already checked by [`Request::parse`].
#[derive(Debug, Clone)]
pub struct Instructions<'a> {
    rest: &'a [u8],
    remaining: u16,
}

impl<'a> Instructions<'a> {
    fn next_checked(&mut self) -> Result<Option<Instruction<'a>>, DecodeError> {
        if self.remaining == 0 {
            return Ok(None);
        }
        if self.rest.len() < INSTRUCTION_HEADER_LEN {
            return Err(DecodeError::Truncated);
        }
        let fixed = &self.rest[..INSTRUCTION_HEADER_LEN];
        let operand_len = read_u32(fixed, instruction_field::OPERAND_LEN) as usize;
        let available = self.rest.len() - INSTRUCTION_HEADER_LEN;
        if operand_len > available {
            return Err(DecodeError::Truncated);
        }
        let end = INSTRUCTION_HEADER_LEN + operand_len;
        let instruction = Instruction {
            opcode: fixed[instruction_field::OPCODE],
            flags: fixed[instruction_field::FLAGS],
            space: read_u16(fixed, instruction_field::SPACE),
            offset: read_u64(fixed, instruction_field::OFFSET),
            length: read_u32(fixed, instruction_field::LENGTH),
            aux: read_u32(fixed, instruction_field::AUX),
            operand: &self.rest[INSTRUCTION_HEADER_LEN..end],
        };
        self.rest = &self.rest[end..];
        self.remaining -= 1;
        Ok(Some(instruction))
    }
}

impl<'a> Iterator for Instructions<'a> {
    type Item = Instruction<'a>;

    fn next(&mut self) -> Option<Instruction<'a>> {
        // Request::parse walked the same bytes with next_checked, so framing errors cannot occur.
        self.next_checked().ok().flatten()
    }
}

/// A request datagram whose framing has been checked end to end.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// The decoded header.
    pub header: Header,
    body: &'a [u8],
}

impl<'a> Request<'a> {
    /// Checks every byte of an untrusted request datagram. Semantic checks (opcode known, bounds,
    /// alignment) are left to execution, which answers them per instruction.
    pub fn parse(bytes: &'a [u8]) -> Result<Request<'a>, DecodeError> {
        Request::parse_with(bytes, false)
    }

    /// As [`Request::parse`], for a sealed request whose trailer the caller has checked (MAC)
    /// and cut off: `bytes` ends before the trailer.
    pub fn parse_opened(bytes: &'a [u8]) -> Result<Request<'a>, DecodeError> {
        Request::parse_with(bytes, true)
    }

    fn parse_with(bytes: &'a [u8], opened: bool) -> Result<Request<'a>, DecodeError> {
        let header = Header::parse_checked(bytes, opened)?;
        if header.is_response() {
            return Err(DecodeError::WrongDirection);
        }
        let measured = header.ttl != 0 || header.service_time_ns != 0 || header.queue_depth != 0;
        if header.status != 0 || measured || header.queueing_us != 0 {
            return Err(DecodeError::ReservedNotZero);
        }
        if header.count == 0 || usize::from(header.count) > MAX_INSTRUCTIONS_PER_DATAGRAM {
            return Err(DecodeError::BadInstructionCount);
        }
        let request = Request { header, body: &bytes[HEADER_LEN..] };
        let mut walk = request.instructions();
        while walk.next_checked()?.is_some() {}
        if !walk.rest.is_empty() {
            return Err(DecodeError::TrailingBytes);
        }
        Ok(request)
    }

    /// The instructions, in datagram order.
    pub fn instructions(&self) -> Instructions<'a> {
        Instructions { rest: self.body, remaining: self.header.count }
    }
}

/// Writes a request datagram into a caller-owned buffer.
#[derive(Debug)]
pub struct RequestBuilder<'b> {
    buf: &'b mut [u8],
    header: Header,
    len: usize,
}

impl<'b> RequestBuilder<'b> {
    /// Starts a request for `session` with `sequence`.
    pub fn new(buf: &'b mut [u8], session: u32, sequence: u64) -> Result<RequestBuilder<'b>, EncodeError> {
        if buf.len() < HEADER_LEN {
            return Err(EncodeError::NoRoom);
        }
        let header = Header { session, sequence, ..Header::default() };
        Ok(RequestBuilder { buf, header, len: HEADER_LEN })
    }

    /// Appends one instruction.
    pub fn push(&mut self, instruction: &Instruction<'_>) -> Result<(), EncodeError> {
        if usize::from(self.header.count) >= MAX_INSTRUCTIONS_PER_DATAGRAM {
            return Err(EncodeError::TooManyInstructions);
        }
        let operand_len = u32::try_from(instruction.operand.len()).map_err(|_| EncodeError::OperandTooLong)?;
        let end = self.len + instruction.encoded_len();
        if end > self.buf.len() {
            return Err(EncodeError::NoRoom);
        }
        let fixed = &mut self.buf[self.len..self.len + INSTRUCTION_HEADER_LEN];
        fixed[instruction_field::OPCODE] = instruction.opcode;
        fixed[instruction_field::FLAGS] = instruction.flags;
        fixed[instruction_field::SPACE].copy_from_slice(&instruction.space.to_le_bytes());
        fixed[instruction_field::OPERAND_LEN].copy_from_slice(&operand_len.to_le_bytes());
        fixed[instruction_field::OFFSET].copy_from_slice(&instruction.offset.to_le_bytes());
        fixed[instruction_field::LENGTH].copy_from_slice(&instruction.length.to_le_bytes());
        fixed[instruction_field::AUX].copy_from_slice(&instruction.aux.to_le_bytes());
        self.buf[self.len + INSTRUCTION_HEADER_LEN..end].copy_from_slice(instruction.operand);
        self.len = end;
        self.header.count += 1;
        Ok(())
    }

    /// Bytes the datagram would take if finished now.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no instruction has been pushed yet.
    pub fn is_empty(&self) -> bool {
        self.header.count == 0
    }

    /// Writes header and CRC; returns the datagram length.
    pub fn finish(self) -> usize {
        self.header.write(self.buf);
        let crc = datagram_crc(&self.buf[..self.len]);
        self.buf[header_field::CRC].copy_from_slice(&crc.to_le_bytes());
        self.len
    }

    /// Writes the header of a datagram the caller seals next ([`FLAG_SEALED`] set, CRC 0: the
    /// MAC covers it, so no CRC is computed); returns the length before the trailer.
    pub fn finish_sealed(self) -> usize {
        let header = Header { flags: self.header.flags | FLAG_SEALED, ..self.header };
        header.write(self.buf);
        self.len
    }
}

/// Writes a response datagram into a caller-owned buffer, one instruction result at a time.
///
/// Each result is written as: [`ResponseWriter::data_area`] to fill the data in place, then
/// [`ResponseWriter::commit`] with its status and data length.
#[derive(Debug)]
pub struct ResponseWriter<'b> {
    buf: &'b mut [u8],
    header: Header,
    len: usize,
}

impl<'b> ResponseWriter<'b> {
    /// Starts the response to a request with `session` and `sequence`.
    ///
    /// The buffer must hold at least a header; the caller bounds it to the datagram size.
    pub fn new(buf: &'b mut [u8], session: u32, sequence: u64) -> ResponseWriter<'b> {
        assert!(buf.len() >= HEADER_LEN, "response buffer smaller than a header");
        let header = Header { flags: FLAG_RESPONSE, session, sequence, ..Header::default() };
        ResponseWriter { buf, header, len: HEADER_LEN }
    }

    /// Room left for the next result's data after its fixed part (zero if even that won't fit).
    pub fn data_capacity(&self) -> usize {
        self.buf.len().saturating_sub(self.len + RESPONSE_INSTRUCTION_HEADER_LEN)
    }

    /// The bytes where the next result's data goes.
    pub fn data_area(&mut self) -> &mut [u8] {
        let start = (self.len + RESPONSE_INSTRUCTION_HEADER_LEN).min(self.buf.len());
        &mut self.buf[start..]
    }

    /// Records the next result: its opcode, status, and how much of the data area it used.
    pub fn commit(&mut self, opcode: u8, status: Status, data_len: usize) {
        assert!(
            data_len <= self.data_capacity(),
            "result data beyond the response buffer: the executor must check data_capacity"
        );
        let fixed = &mut self.buf[self.len..self.len + RESPONSE_INSTRUCTION_HEADER_LEN];
        fixed[result_field::OPCODE] = opcode;
        fixed[result_field::STATUS] = status as u8;
        fixed[result_field::RESERVED].fill(0);
        // data_len <= buffer length, which the caller bounds to MAX_DATAGRAM_BYTES.
        fixed[result_field::DATA_LEN].copy_from_slice(&(data_len as u32).to_le_bytes());
        self.len += RESPONSE_INSTRUCTION_HEADER_LEN + data_len;
        self.header.count += 1;
    }

    /// Names `session` in the answer's header instead of the request's (the answer that opens
    /// an authenticated session; PROTOCOL.md, "Authentication").
    pub fn set_session(&mut self, session: u32) {
        self.header.session = session;
    }

    /// Sets the datagram status (for a datagram none of whose instructions were executed).
    pub fn set_status(&mut self, status: Status) {
        self.header.status = status as u8;
    }

    /// Sets the queueing the request saw (or, in a BUSY answer, the wait to expect).
    pub fn set_queueing_us(&mut self, hint_us: u16) {
        self.header.queueing_us = hint_us;
    }

    /// Results committed so far.
    pub fn count(&self) -> u16 {
        self.header.count
    }

    /// Bytes the response holds so far, header included.
    pub fn encoded_len(&self) -> usize {
        self.len
    }

    /// Writes the header with the target's measurements and the CRC; returns the length.
    pub fn finish(self, ttl: u8, service_time_ns: u32, queue_depth: u16) -> usize {
        let header = Header { ttl, service_time_ns, queue_depth, ..self.header };
        header.write(self.buf);
        let crc = datagram_crc(&self.buf[..self.len]);
        self.buf[header_field::CRC].copy_from_slice(&crc.to_le_bytes());
        self.len
    }

    /// As [`ResponseWriter::finish`], for an answer the caller seals next: [`FLAG_SEALED`] set
    /// and CRC 0, not computed (the MAC covers the datagram).
    pub fn finish_sealed(self, ttl: u8, service_time_ns: u32, queue_depth: u16) -> usize {
        let header =
            Header { flags: self.header.flags | FLAG_SEALED, ttl, service_time_ns, queue_depth, ..self.header };
        header.write(self.buf);
        self.len
    }
}

/// A response under construction, detached from its buffer while block I/O is in flight.
#[derive(Debug, Clone, Copy)]
pub struct ResponseProgress {
    header: Header,
    len: usize,
}

impl ResponseProgress {
    /// Results committed so far.
    pub fn count(&self) -> u16 {
        self.header.count
    }
}

impl<'b> ResponseWriter<'b> {
    /// Detaches the response from its buffer; `resume` with the same buffer continues it.
    pub fn suspend(self) -> ResponseProgress {
        ResponseProgress { header: self.header, len: self.len }
    }

    /// Continues a suspended response in the buffer it was started in.
    pub fn resume(buf: &'b mut [u8], progress: ResponseProgress) -> ResponseWriter<'b> {
        assert!(buf.len() >= progress.len, "a response resumes in the buffer it was started in");
        ResponseWriter { buf, header: progress.header, len: progress.len }
    }
}

/// One instruction's result within a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstructionResult<'a> {
    /// The opcode number of the request instruction it answers.
    pub opcode: u8,
    /// Its outcome.
    pub status: Status,
    /// Data the instruction returned.
    pub data: &'a [u8],
}

/// A response datagram whose framing has been checked end to end.
#[derive(Debug, Clone)]
pub struct Response<'a> {
    /// The decoded header.
    pub header: Header,
    body: &'a [u8],
}

impl<'a> Response<'a> {
    /// Checks every byte of an untrusted response datagram.
    pub fn parse(bytes: &'a [u8]) -> Result<Response<'a>, DecodeError> {
        Response::parse_with(bytes, false)
    }

    /// As [`Response::parse`], for a sealed response whose trailer the caller has checked (MAC)
    /// and cut off: `bytes` ends before the trailer.
    pub fn parse_opened(bytes: &'a [u8]) -> Result<Response<'a>, DecodeError> {
        Response::parse_with(bytes, true)
    }

    /// A response this process has already checked with [`Response::parse`] or
    /// [`Response::parse_opened`] and kept unchanged since: read again without checking every
    /// byte once more (no CRC, no walk over the results). Use it only on such bytes: the results
    /// of anything else are unspecified (but never unsafe: a short datagram ends the results
    /// early).
    pub fn parse_checked_before(bytes: &'a [u8]) -> Response<'a> {
        debug_assert!(
            Response::parse(bytes).is_ok() || Response::parse_opened(bytes).is_ok(),
            "parse_checked_before on bytes that do not parse"
        );
        if bytes.len() < HEADER_LEN {
            return Response { header: Header::default(), body: &[] };
        }
        Response { header: Header::fields(bytes), body: &bytes[HEADER_LEN..] }
    }

    fn parse_with(bytes: &'a [u8], opened: bool) -> Result<Response<'a>, DecodeError> {
        let header = Header::parse_checked(bytes, opened)?;
        if !header.is_response() {
            return Err(DecodeError::WrongDirection);
        }
        if usize::from(header.count) > MAX_INSTRUCTIONS_PER_DATAGRAM {
            return Err(DecodeError::BadInstructionCount);
        }
        if header.status != 0 {
            Status::from_u8(header.status).ok_or(DecodeError::UnknownStatus(header.status))?;
        }
        let response = Response { header, body: &bytes[HEADER_LEN..] };
        let mut walk = response.results();
        while walk.next_checked()?.is_some() {}
        if !walk.rest.is_empty() {
            return Err(DecodeError::TrailingBytes);
        }
        Ok(response)
    }

    /// The datagram status: `Ok` unless the target answered the datagram as a whole.
    pub fn status(&self) -> Status {
        // parse() rejected unknown values.
        Status::from_u8(self.header.status).unwrap_or(Status::Malformed)
    }

    /// The instruction results, in request order.
    pub fn results(&self) -> Results<'a> {
        Results { rest: self.body, remaining: self.header.count }
    }
}

/// Iterator over the results of a response already checked by [`Response::parse`].
#[derive(Debug, Clone)]
pub struct Results<'a> {
    rest: &'a [u8],
    remaining: u16,
}

impl<'a> Results<'a> {
    fn next_checked(&mut self) -> Result<Option<InstructionResult<'a>>, DecodeError> {
        if self.remaining == 0 {
            return Ok(None);
        }
        if self.rest.len() < RESPONSE_INSTRUCTION_HEADER_LEN {
            return Err(DecodeError::Truncated);
        }
        let fixed = &self.rest[..RESPONSE_INSTRUCTION_HEADER_LEN];
        if read_u16(fixed, result_field::RESERVED) != 0 {
            return Err(DecodeError::ReservedNotZero);
        }
        let status_byte = fixed[result_field::STATUS];
        let status = Status::from_u8(status_byte).ok_or(DecodeError::UnknownStatus(status_byte))?;
        let data_len = read_u32(fixed, result_field::DATA_LEN) as usize;
        if data_len > self.rest.len() - RESPONSE_INSTRUCTION_HEADER_LEN {
            return Err(DecodeError::Truncated);
        }
        let end = RESPONSE_INSTRUCTION_HEADER_LEN + data_len;
        let result = InstructionResult {
            opcode: fixed[result_field::OPCODE],
            status,
            data: &self.rest[RESPONSE_INSTRUCTION_HEADER_LEN..end],
        };
        self.rest = &self.rest[end..];
        self.remaining -= 1;
        Ok(Some(result))
    }
}

impl<'a> Iterator for Results<'a> {
    type Item = InstructionResult<'a>;

    fn next(&mut self) -> Option<InstructionResult<'a>> {
        // Response::parse walked the same bytes with next_checked.
        self.next_checked().ok().flatten()
    }
}

/// Writes a datagram-level error answer (no instructions) to `session`/`sequence`.
pub fn encode_datagram_error(buf: &mut [u8], session: u32, sequence: u64, status: Status) -> usize {
    let mut writer = ResponseWriter::new(buf, session, sequence);
    writer.set_status(status);
    writer.finish(0, 0, 0)
}
