//! The NBD wire format (doc/proto.md of the NetworkBlockDevice project, with the extended-headers
//! extension): constants, and the encoding and decoding of every message the server exchanges.
//! Pure functions over byte slices; no I/O, no policy. Every integer on the wire is big-endian.
//! Untrusted bytes enter only through the `parse` functions, which check lengths and magic
//! numbers and never panic.

use crate::nbd::limits::{MAX_META_CONTEXT_QUERIES, MAX_STRING_BYTES};

/// `NBDMAGIC`, the first eight bytes the server sends.
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: second word of the greeting, and the magic of every client option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic of every option reply.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Magic of a compact (28-byte) request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic of an extended (32-byte) request.
pub const EXTENDED_REQUEST_MAGIC: u32 = 0x21e4_1c71;
/// Magic of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Magic of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;
/// Magic of an extended reply chunk.
pub const EXTENDED_REPLY_MAGIC: u32 = 0x6e8a_278c;

/// Handshake flag: the server speaks fixed newstyle.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
/// Handshake flag: the server may omit the 124 zero bytes after `NBD_OPT_EXPORT_NAME`.
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
/// Client flag: the client speaks fixed newstyle.
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
/// Client flag: the client wants no zero padding after `NBD_OPT_EXPORT_NAME`.
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

/// Transmission flag: always set.
pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
/// Transmission flag: the export is read-only.
pub const FLAG_READ_ONLY: u16 = 1 << 1;
/// Transmission flag: `NBD_CMD_FLUSH` is supported.
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
/// Transmission flag: `NBD_CMD_FLAG_FUA` is supported.
pub const FLAG_SEND_FUA: u16 = 1 << 3;
/// Transmission flag: `NBD_CMD_TRIM` is supported.
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
/// Transmission flag: `NBD_CMD_WRITE_ZEROES` (and `NBD_CMD_FLAG_NO_HOLE`) are supported.
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
/// Transmission flag: `NBD_CMD_FLAG_DF` is supported on reads.
pub const FLAG_SEND_DF: u16 = 1 << 7;
/// Transmission flag: flush and FUA take effect across every connection.
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
/// Transmission flag: `NBD_CMD_CACHE` is supported.
pub const FLAG_SEND_CACHE: u16 = 1 << 10;
/// Transmission flag: `NBD_CMD_FLAG_FAST_ZERO` is supported.
pub const FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

/// Option: choose the export and enter transmission (no error reply possible).
pub const OPT_EXPORT_NAME: u32 = 1;
/// Option: the client ends the session.
pub const OPT_ABORT: u32 = 2;
/// Option: list exports.
pub const OPT_LIST: u32 = 3;
/// Option: upgrade to TLS.
pub const OPT_STARTTLS: u32 = 5;
/// Option: describe an export.
pub const OPT_INFO: u32 = 6;
/// Option: describe an export and enter transmission.
pub const OPT_GO: u32 = 7;
/// Option: use structured replies.
pub const OPT_STRUCTURED_REPLY: u32 = 8;
/// Option: list metadata contexts.
pub const OPT_LIST_META_CONTEXT: u32 = 9;
/// Option: select metadata contexts.
pub const OPT_SET_META_CONTEXT: u32 = 10;
/// Option: use extended (64-bit) request and reply headers.
pub const OPT_EXTENDED_HEADERS: u32 = 11;

/// Option reply: success, or the end of a list.
pub const REP_ACK: u32 = 1;
/// Option reply: one export of a list.
pub const REP_SERVER: u32 = 2;
/// Option reply: one piece of information about an export.
pub const REP_INFO: u32 = 3;
/// Option reply: one metadata context.
pub const REP_META_CONTEXT: u32 = 4;
const REP_ERROR_BIT: u32 = 1 << 31;
/// Option error: unknown option.
pub const REP_ERR_UNSUP: u32 = REP_ERROR_BIT | 1;
/// Option error: forbidden by policy.
pub const REP_ERR_POLICY: u32 = REP_ERROR_BIT | 2;
/// Option error: syntactically or semantically invalid.
pub const REP_ERR_INVALID: u32 = REP_ERROR_BIT | 3;
/// Option error: not available on this platform.
pub const REP_ERR_PLATFORM: u32 = REP_ERROR_BIT | 4;
/// Option error: TLS required first.
pub const REP_ERR_TLS_REQD: u32 = REP_ERROR_BIT | 5;
/// Option error: no such export.
pub const REP_ERR_UNKNOWN: u32 = REP_ERROR_BIT | 6;
/// Option error: the server is shutting down.
pub const REP_ERR_SHUTDOWN: u32 = REP_ERROR_BIT | 7;
/// Option error: the client must request block sizes first.
pub const REP_ERR_BLOCK_SIZE_REQD: u32 = REP_ERROR_BIT | 8;
/// Option error: request or reply too large.
pub const REP_ERR_TOO_BIG: u32 = REP_ERROR_BIT | 9;
/// Option error: extended headers required (or already negotiated, for structured replies).
pub const REP_ERR_EXT_HEADER_REQD: u32 = REP_ERROR_BIT | 10;

/// Information type: size and transmission flags.
pub const INFO_EXPORT: u16 = 0;
/// Information type: canonical export name.
pub const INFO_NAME: u16 = 1;
/// Information type: human-readable description.
pub const INFO_DESCRIPTION: u16 = 2;
/// Information type: minimum, preferred and maximum sizes.
pub const INFO_BLOCK_SIZE: u16 = 3;

/// Command: read.
pub const CMD_READ: u16 = 0;
/// Command: write (carries a payload).
pub const CMD_WRITE: u16 = 1;
/// Command: disconnect.
pub const CMD_DISC: u16 = 2;
/// Command: flush.
pub const CMD_FLUSH: u16 = 3;
/// Command: trim (discard).
pub const CMD_TRIM: u16 = 4;
/// Command: cache (prefetch hint).
pub const CMD_CACHE: u16 = 5;
/// Command: write zeroes.
pub const CMD_WRITE_ZEROES: u16 = 6;
/// Command: block status.
pub const CMD_BLOCK_STATUS: u16 = 7;

/// Command flag: force unit access.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
/// Command flag: write zeroes must not deallocate.
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
/// Command flag: read reply in one content chunk.
pub const CMD_FLAG_DF: u16 = 1 << 2;
/// Command flag: block status with one extent.
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
/// Command flag: write zeroes only if fast, else fail with `ENOTSUP` at once.
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;
/// Command flag (extended headers): the length is a payload length.
pub const CMD_FLAG_PAYLOAD_LEN: u16 = 1 << 5;

/// Reply flag: last chunk of a reply.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
/// Chunk type: no payload (final chunk).
pub const REPLY_TYPE_NONE: u16 = 0;
/// Chunk type: data at an offset.
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
/// Chunk type: block status descriptors of one metadata context (32-bit lengths and flags).
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
/// Chunk type (extended headers): block status descriptors with 64-bit lengths and flags.
pub const REPLY_TYPE_BLOCK_STATUS_EXT: u16 = 6;
/// Chunk type: an error with a message.
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) | 1;

/// The one metadata context this server may offer: allocation.
pub const BASE_ALLOCATION: &str = "base:allocation";
/// `base:allocation` flag: the extent is a hole (not allocated).
pub const STATE_HOLE: u32 = 1 << 0;
/// `base:allocation` flag: the extent reads as zeroes.
pub const STATE_ZERO: u32 = 1 << 1;

/// Length of the server greeting: NBDMAGIC, IHAVEOPT, handshake flags.
pub const GREETING_LEN: usize = 18;
/// Length of an option header: IHAVEOPT, option, length.
pub const OPTION_HEADER_LEN: usize = 16;
/// Length of a compact request header.
pub const COMPACT_REQUEST_LEN: usize = 28;
/// Length of an extended request header.
pub const EXTENDED_REQUEST_LEN: usize = 32;
/// Length of a simple reply header.
pub const SIMPLE_REPLY_LEN: usize = 16;
/// Length of a structured reply chunk header.
pub const STRUCTURED_REPLY_LEN: usize = 20;
/// Length of an extended reply chunk header.
pub const EXTENDED_REPLY_LEN: usize = 32;
/// Longest reply head [`encode_reply_head`] writes (extended header plus the data offset).
pub const MAX_REPLY_HEAD_LEN: usize = EXTENDED_REPLY_LEN + 8;
/// Zero padding after the `NBD_OPT_EXPORT_NAME` reply unless `NO_ZEROES` was agreed.
pub const EXPORT_NAME_PADDING_LEN: usize = 124;

/// An error value of the transmission phase, as the protocol defines them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Errno {
    /// Operation not permitted (writes to a read-only export).
    Perm = 1,
    /// Input/output error.
    Io = 5,
    /// Cannot allocate memory.
    NoMem = 12,
    /// Invalid argument.
    Inval = 22,
    /// No space left on device.
    NoSpc = 28,
    /// Value too large.
    Overflow = 75,
    /// Operation not supported.
    NotSup = 95,
    /// Server is shutting down.
    Shutdown = 108,
}

impl Errno {
    /// The value on the wire.
    pub fn code(self) -> u32 {
        self as u32
    }
}

/// How replies are framed in transmission, as negotiated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyStyle {
    /// Simple replies only (nothing negotiated).
    Simple,
    /// `NBD_OPT_STRUCTURED_REPLY`: structured chunks, simple replies allowed without payload.
    Structured,
    /// `NBD_OPT_EXTENDED_HEADERS`: 32-byte requests and extended chunks for every reply.
    Extended,
}

impl ReplyStyle {
    /// Length of a request header in this style.
    pub fn request_header_len(self) -> usize {
        match self {
            ReplyStyle::Extended => EXTENDED_REQUEST_LEN,
            ReplyStyle::Simple | ReplyStyle::Structured => COMPACT_REQUEST_LEN,
        }
    }
}

/// Bytes that do not form a valid message, with what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// An option did not start with `IHAVEOPT`.
    #[error("bad option magic 0x{0:016x} (expected IHAVEOPT 0x{IHAVEOPT:016x})")]
    BadOptionMagic(u64),
    /// A request did not start with the magic of the negotiated header style.
    #[error("bad request magic 0x{found:08x} (expected 0x{expected:08x})")]
    BadRequestMagic {
        /// What arrived.
        found: u32,
        /// What the negotiated style requires.
        expected: u32,
    },
    /// A message was shorter than its fixed part.
    #[error("{what} is {len} bytes, expected {expected}")]
    Short {
        /// Which message.
        what: &'static str,
        /// Bytes present.
        len: usize,
        /// Bytes needed.
        expected: usize,
    },
    /// The payload of an option is inconsistent with its own length fields.
    #[error("malformed {option} option: {reason}")]
    MalformedOption {
        /// The option's name.
        option: &'static str,
        /// What is wrong.
        reason: String,
    },
}

/// Writes the server greeting: NBDMAGIC, IHAVEOPT, and the handshake flags.
pub fn encode_greeting(handshake_flags: u16, out: &mut Vec<u8>) {
    out.extend_from_slice(&NBD_MAGIC.to_be_bytes());
    out.extend_from_slice(&IHAVEOPT.to_be_bytes());
    out.extend_from_slice(&handshake_flags.to_be_bytes());
}

/// The fixed part of a client option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    /// Which option.
    pub option: u32,
    /// Length of the payload that follows.
    pub length: u32,
}

impl OptionHeader {
    /// Parses the 16-byte option header.
    pub fn parse(bytes: &[u8]) -> Result<OptionHeader, WireError> {
        let bytes: &[u8; OPTION_HEADER_LEN] = fixed(bytes, "option header")?;
        let magic = u64::from_be_bytes(take(bytes, 0));
        if magic != IHAVEOPT {
            return Err(WireError::BadOptionMagic(magic));
        }
        Ok(OptionHeader { option: u32::from_be_bytes(take(bytes, 8)), length: u32::from_be_bytes(take(bytes, 12)) })
    }

    /// Encodes the header (for tests and clients).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&IHAVEOPT.to_be_bytes());
        out.extend_from_slice(&self.option.to_be_bytes());
        out.extend_from_slice(&self.length.to_be_bytes());
    }
}

/// Writes one option reply: magic, the option it answers, its type, and its payload.
pub fn encode_option_reply(option: u32, reply_type: u32, payload: &[&[u8]], out: &mut Vec<u8>) {
    let len: usize = payload.iter().map(|part| part.len()).sum();
    // Option replies are built by the server from bounded strings, never from client lengths.
    assert!(len <= u32::MAX as usize, "option reply payload of {len} bytes cannot be framed");
    out.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply_type.to_be_bytes());
    out.extend_from_slice(&(len as u32).to_be_bytes());
    for part in payload {
        out.extend_from_slice(part);
    }
}

/// Writes an option error reply with a human-readable message (cut to the protocol's string
/// limit at a character boundary).
pub fn encode_option_error(option: u32, reply_type: u32, message: &str, out: &mut Vec<u8>) {
    debug_assert!(reply_type & REP_ERROR_BIT != 0, "0x{reply_type:x} is not an error reply");
    encode_option_reply(option, reply_type, &[truncate_message(message).as_bytes()], out);
}

/// An `NBD_OPT_INFO` or `NBD_OPT_GO` payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest<'a> {
    /// The export name asked for (raw bytes; the spec wants UTF-8 but a mismatch is merely an
    /// unknown export).
    pub name: &'a [u8],
    /// The information types asked for, in the client's order.
    pub info_types: Vec<u16>,
}

impl<'a> InfoRequest<'a> {
    /// Parses the payload: name length, name, count, and `count` 16-bit information types.
    pub fn parse(option: &'static str, data: &'a [u8]) -> Result<InfoRequest<'a>, WireError> {
        let mut reader = Reader { data, option };
        let name = reader.string("export name")?;
        let count = reader.u16("information request count")?;
        let mut info_types = Vec::with_capacity(usize::from(count).min(reader.data.len() / 2));
        for _ in 0..count {
            info_types.push(reader.u16("information request")?);
        }
        reader.finish()?;
        Ok(InfoRequest { name, info_types })
    }

    /// Encodes the payload (for tests and clients).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.name.len() as u32).to_be_bytes());
        out.extend_from_slice(self.name);
        out.extend_from_slice(&(self.info_types.len() as u16).to_be_bytes());
        for info in &self.info_types {
            out.extend_from_slice(&info.to_be_bytes());
        }
    }
}

/// An `NBD_OPT_LIST_META_CONTEXT` or `NBD_OPT_SET_META_CONTEXT` payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaContextRequest<'a> {
    /// The export name.
    pub name: &'a [u8],
    /// The queries.
    pub queries: Vec<&'a [u8]>,
}

impl<'a> MetaContextRequest<'a> {
    /// Parses the payload: name length, name, query count, then length-prefixed queries.
    pub fn parse(option: &'static str, data: &'a [u8]) -> Result<MetaContextRequest<'a>, WireError> {
        let mut reader = Reader { data, option };
        let name = reader.string("export name")?;
        let count = reader.u32("query count")?;
        if count as usize > MAX_META_CONTEXT_QUERIES {
            return Err(reader.malformed(format!("{count} queries (at most {MAX_META_CONTEXT_QUERIES})")));
        }
        let mut queries = Vec::with_capacity(count as usize);
        for _ in 0..count {
            queries.push(reader.string("query")?);
        }
        reader.finish()?;
        Ok(MetaContextRequest { name, queries })
    }
}

/// Parses the `NBD_REP_SERVER` payload of an `NBD_OPT_LIST` reply: (name, description).
pub fn parse_rep_server(data: &[u8]) -> Result<(&[u8], &[u8]), WireError> {
    let mut reader = Reader { data, option: "NBD_REP_SERVER" };
    let name = reader.string("export name")?;
    Ok((name, reader.data))
}

/// A transmission request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    /// Command flags.
    pub flags: u16,
    /// Command type.
    pub command: u16,
    /// The client's opaque cookie, echoed in the reply.
    pub cookie: u64,
    /// Offset in the export.
    pub offset: u64,
    /// Length: payload length for writes (and extended requests with `PAYLOAD_LEN`), effect
    /// length otherwise. 32-bit in compact requests.
    pub length: u64,
}

impl RequestHeader {
    /// Parses a request header of the given style (28 bytes compact, 32 extended).
    pub fn parse(style: ReplyStyle, bytes: &[u8]) -> Result<RequestHeader, WireError> {
        let (expected_magic, what) = match style {
            ReplyStyle::Extended => (EXTENDED_REQUEST_MAGIC, "extended request header"),
            ReplyStyle::Simple | ReplyStyle::Structured => (REQUEST_MAGIC, "request header"),
        };
        if bytes.len() != style.request_header_len() {
            return Err(WireError::Short { what, len: bytes.len(), expected: style.request_header_len() });
        }
        let magic = u32::from_be_bytes(take(bytes, 0));
        if magic != expected_magic {
            return Err(WireError::BadRequestMagic { found: magic, expected: expected_magic });
        }
        let length = match style {
            ReplyStyle::Extended => u64::from_be_bytes(take(bytes, 24)),
            ReplyStyle::Simple | ReplyStyle::Structured => u64::from(u32::from_be_bytes(take(bytes, 24))),
        };
        Ok(RequestHeader {
            flags: u16::from_be_bytes(take(bytes, 4)),
            command: u16::from_be_bytes(take(bytes, 6)),
            cookie: u64::from_be_bytes(take(bytes, 8)),
            offset: u64::from_be_bytes(take(bytes, 16)),
            length,
        })
    }

    /// Encodes the header in the given style (for tests and clients). A compact header keeps
    /// the low 32 bits of the length.
    pub fn encode(&self, style: ReplyStyle, out: &mut Vec<u8>) {
        let magic = if style == ReplyStyle::Extended { EXTENDED_REQUEST_MAGIC } else { REQUEST_MAGIC };
        out.extend_from_slice(&magic.to_be_bytes());
        out.extend_from_slice(&self.flags.to_be_bytes());
        out.extend_from_slice(&self.command.to_be_bytes());
        out.extend_from_slice(&self.cookie.to_be_bytes());
        out.extend_from_slice(&self.offset.to_be_bytes());
        if style == ReplyStyle::Extended {
            out.extend_from_slice(&self.length.to_be_bytes());
        } else {
            out.extend_from_slice(&(self.length as u32).to_be_bytes());
        }
    }
}

/// What a reply says, apart from its cookie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyBody<'a> {
    /// Success without data.
    Done,
    /// Success with `len` bytes of data read at `offset`; the data follows the head.
    Data {
        /// Where the data was read.
        offset: u64,
        /// How many bytes follow.
        len: usize,
    },
    /// Block status of one metadata context: consecutive extents `(length in bytes, flags)`
    /// from the request's offset. Only in structured and extended replies (a session without
    /// them selects no context, so never asks).
    BlockStatus {
        /// The context's id, as `NBD_OPT_SET_META_CONTEXT` gave it.
        context_id: u32,
        /// The extents, at least one. In a structured reply each length fits 32 bits (a
        /// compact request's length bounds them).
        extents: &'a [(u64, u32)],
    },
    /// Failure, with a message for a human (sent only in structured and extended replies).
    Error {
        /// The error value.
        errno: Errno,
        /// What went wrong.
        message: &'a str,
    },
}

/// Writes the head of the complete reply to one request in the negotiated style: everything
/// except the read data, which the caller sends right after (a block status reply is written
/// whole). Every reply is a single message (one simple reply, or one chunk flagged DONE), so
/// replies of different requests never need to be interleaved. `request_offset` is echoed by
/// extended replies.
pub fn encode_reply_head(style: ReplyStyle, cookie: u64, request_offset: u64, body: ReplyBody<'_>, out: &mut Vec<u8>) {
    match (style, body) {
        (ReplyStyle::Simple, ReplyBody::Done | ReplyBody::Data { .. }) => simple_reply(0, cookie, out),
        (ReplyStyle::Simple, ReplyBody::Error { errno, .. }) => simple_reply(errno.code(), cookie, out),
        // A structured reply may use a simple reply for anything but a read; that is smaller.
        (ReplyStyle::Structured, ReplyBody::Done) => simple_reply(0, cookie, out),
        (_, ReplyBody::Done) => chunk_head(style, REPLY_TYPE_NONE, cookie, request_offset, 0, out),
        // An empty read has no data chunk to send (OFFSET_DATA needs at least one byte).
        (_, ReplyBody::Data { len: 0, .. }) => chunk_head(style, REPLY_TYPE_NONE, cookie, request_offset, 0, out),
        (_, ReplyBody::Data { offset, len }) => {
            chunk_head(style, REPLY_TYPE_OFFSET_DATA, cookie, request_offset, 8 + len as u64, out);
            out.extend_from_slice(&offset.to_be_bytes());
        }
        (ReplyStyle::Simple, ReplyBody::BlockStatus { .. }) => {
            panic!("block status needs chunked replies: Session::decide refuses it without a selected context")
        }
        (_, ReplyBody::BlockStatus { context_id, extents }) => {
            assert!(!extents.is_empty(), "a block status reply carries at least one extent");
            if style == ReplyStyle::Extended {
                let len = 8 + 16 * extents.len() as u64;
                chunk_head(style, REPLY_TYPE_BLOCK_STATUS_EXT, cookie, request_offset, len, out);
                out.extend_from_slice(&context_id.to_be_bytes());
                out.extend_from_slice(&(extents.len() as u32).to_be_bytes());
                for &(length, flags) in extents {
                    out.extend_from_slice(&length.to_be_bytes());
                    out.extend_from_slice(&u64::from(flags).to_be_bytes());
                }
            } else {
                let len = 4 + 8 * extents.len() as u64;
                chunk_head(style, REPLY_TYPE_BLOCK_STATUS, cookie, request_offset, len, out);
                out.extend_from_slice(&context_id.to_be_bytes());
                for &(length, flags) in extents {
                    let length = u32::try_from(length).expect("a compact request's length bounds its extents");
                    out.extend_from_slice(&length.to_be_bytes());
                    out.extend_from_slice(&flags.to_be_bytes());
                }
            }
        }
        (_, ReplyBody::Error { errno, message }) => {
            let message = truncate_message(message);
            chunk_head(style, REPLY_TYPE_ERROR, cookie, request_offset, 6 + message.len() as u64, out);
            out.extend_from_slice(&errno.code().to_be_bytes());
            out.extend_from_slice(&(message.len() as u16).to_be_bytes());
            out.extend_from_slice(message.as_bytes());
        }
    }
}

fn simple_reply(error: u32, cookie: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
}

fn chunk_head(style: ReplyStyle, chunk_type: u16, cookie: u64, request_offset: u64, len: u64, out: &mut Vec<u8>) {
    if style == ReplyStyle::Extended {
        out.extend_from_slice(&EXTENDED_REPLY_MAGIC.to_be_bytes());
    } else {
        out.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    }
    out.extend_from_slice(&REPLY_FLAG_DONE.to_be_bytes());
    out.extend_from_slice(&chunk_type.to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
    if style == ReplyStyle::Extended {
        out.extend_from_slice(&request_offset.to_be_bytes());
        out.extend_from_slice(&len.to_be_bytes());
    } else {
        // Structured chunks carry at most a maximum payload plus 8 bytes, far below 4 GiB.
        debug_assert!(len <= u64::from(u32::MAX), "structured chunk of {len} bytes");
        out.extend_from_slice(&(len as u32).to_be_bytes());
    }
}

/// Cuts a message to the protocol's string limit at a character boundary.
pub fn truncate_message(message: &str) -> &str {
    if message.len() <= MAX_STRING_BYTES {
        return message;
    }
    let mut end = MAX_STRING_BYTES;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    &message[..end]
}

/// The name of an option, for messages.
pub fn option_name(option: u32) -> &'static str {
    match option {
        OPT_EXPORT_NAME => "NBD_OPT_EXPORT_NAME",
        OPT_ABORT => "NBD_OPT_ABORT",
        OPT_LIST => "NBD_OPT_LIST",
        4 => "NBD_OPT_PEEK_EXPORT",
        OPT_STARTTLS => "NBD_OPT_STARTTLS",
        OPT_INFO => "NBD_OPT_INFO",
        OPT_GO => "NBD_OPT_GO",
        OPT_STRUCTURED_REPLY => "NBD_OPT_STRUCTURED_REPLY",
        OPT_LIST_META_CONTEXT => "NBD_OPT_LIST_META_CONTEXT",
        OPT_SET_META_CONTEXT => "NBD_OPT_SET_META_CONTEXT",
        OPT_EXTENDED_HEADERS => "NBD_OPT_EXTENDED_HEADERS",
        _ => "unknown option",
    }
}

/// An option as messages name it: its name, or for one this server does not know, its number
/// ("option 99"), so that a message never reads "unknown option option".
pub fn option_label(option: u32) -> String {
    match option_name(option) {
        "unknown option" => format!("option {option}"),
        name => name.to_string(),
    }
}

/// The name of a command, for messages.
pub fn command_name(command: u16) -> &'static str {
    match command {
        CMD_READ => "NBD_CMD_READ",
        CMD_WRITE => "NBD_CMD_WRITE",
        CMD_DISC => "NBD_CMD_DISC",
        CMD_FLUSH => "NBD_CMD_FLUSH",
        CMD_TRIM => "NBD_CMD_TRIM",
        CMD_CACHE => "NBD_CMD_CACHE",
        CMD_WRITE_ZEROES => "NBD_CMD_WRITE_ZEROES",
        CMD_BLOCK_STATUS => "NBD_CMD_BLOCK_STATUS",
        8 => "NBD_CMD_RESIZE",
        _ => "unknown command",
    }
}

/// Checks that `bytes` is exactly a fixed-size message.
fn fixed<'a, const N: usize>(bytes: &'a [u8], what: &'static str) -> Result<&'a [u8; N], WireError> {
    bytes.try_into().map_err(|_| WireError::Short { what, len: bytes.len(), expected: N })
}

/// The `N` bytes at `at`. Callers check the length first, so this cannot fail.
fn take<const N: usize>(bytes: &[u8], at: usize) -> [u8; N] {
    let mut field = [0u8; N];
    field.copy_from_slice(&bytes[at..at + N]);
    field
}

/// A cursor over an option payload that reports what it could not read.
struct Reader<'a> {
    data: &'a [u8],
    option: &'static str,
}

impl<'a> Reader<'a> {
    fn bytes(&mut self, len: usize, what: &str) -> Result<&'a [u8], WireError> {
        if self.data.len() < len {
            return Err(self.malformed(format!("{what} needs {len} bytes, {} left", self.data.len())));
        }
        let (head, rest) = self.data.split_at(len);
        self.data = rest;
        Ok(head)
    }

    fn u16(&mut self, what: &str) -> Result<u16, WireError> {
        Ok(u16::from_be_bytes(take(self.bytes(2, what)?, 0)))
    }

    fn u32(&mut self, what: &str) -> Result<u32, WireError> {
        Ok(u32::from_be_bytes(take(self.bytes(4, what)?, 0)))
    }

    /// A 32-bit length and that many bytes, within the protocol's string limit.
    fn string(&mut self, what: &str) -> Result<&'a [u8], WireError> {
        let len = self.u32(what)? as usize;
        if len > MAX_STRING_BYTES {
            return Err(self.malformed(format!("{what} of {len} bytes (at most {MAX_STRING_BYTES})")));
        }
        self.bytes(len, what)
    }

    fn finish(&self) -> Result<(), WireError> {
        if self.data.is_empty() {
            Ok(())
        } else {
            Err(self.malformed(format!("{} trailing bytes", self.data.len())))
        }
    }

    fn malformed(&self, reason: String) -> WireError {
        WireError::MalformedOption { option: self.option, reason }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greeting_is_nbdmagic_ihaveopt_flags() {
        let mut out = Vec::new();
        encode_greeting(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES, &mut out);
        assert_eq!(out.len(), GREETING_LEN);
        assert_eq!(&out[..8], b"NBDMAGIC");
        assert_eq!(&out[8..16], b"IHAVEOPT");
        assert_eq!(&out[16..], &[0, 3]);
    }

    #[test]
    fn option_header_round_trips_and_checks_magic() {
        let header = OptionHeader { option: OPT_GO, length: 0x0102_0304 };
        let mut out = Vec::new();
        header.encode(&mut out);
        assert_eq!(out.len(), OPTION_HEADER_LEN);
        assert_eq!(OptionHeader::parse(&out), Ok(header));
        out[0] ^= 1;
        assert!(matches!(OptionHeader::parse(&out), Err(WireError::BadOptionMagic(_))));
        assert!(matches!(OptionHeader::parse(&out[..15]), Err(WireError::Short { len: 15, .. })));
    }

    #[test]
    fn option_reply_layout() {
        let mut out = Vec::new();
        encode_option_reply(OPT_LIST, REP_SERVER, &[&[0, 0, 0, 1], b"a"], &mut out);
        assert_eq!(&out[..8], &OPTION_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&out[8..12], &OPT_LIST.to_be_bytes());
        assert_eq!(&out[12..16], &REP_SERVER.to_be_bytes());
        assert_eq!(&out[16..20], &5u32.to_be_bytes());
        assert_eq!(&out[20..], &[0, 0, 0, 1, b'a']);
    }

    #[test]
    fn option_error_messages_are_cut_at_the_string_limit() {
        let mut out = Vec::new();
        let long = "é".repeat(MAX_STRING_BYTES);
        encode_option_error(OPT_GO, REP_ERR_INVALID, &long, &mut out);
        let len = u32::from_be_bytes(out[16..20].try_into().unwrap()) as usize;
        assert!(len <= MAX_STRING_BYTES);
        assert!(std::str::from_utf8(&out[20..]).is_ok(), "cut at a character boundary");
    }

    #[test]
    fn info_request_round_trips() {
        let request = InfoRequest { name: b"disk", info_types: vec![INFO_BLOCK_SIZE, INFO_NAME] };
        let mut data = Vec::new();
        request.encode(&mut data);
        assert_eq!(InfoRequest::parse("NBD_OPT_GO", &data), Ok(request));
    }

    #[test]
    fn info_request_rejects_inconsistent_lengths() {
        // Name length beyond the payload.
        let data = [0, 0, 0, 9, b'a', 0, 0];
        assert!(matches!(InfoRequest::parse("NBD_OPT_GO", &data), Err(WireError::MalformedOption { .. })));
        // Count says two requests, one present.
        let data = [0, 0, 0, 0, 0, 2, 0, 3];
        assert!(InfoRequest::parse("NBD_OPT_GO", &data).is_err());
        // Trailing byte.
        let data = [0, 0, 0, 0, 0, 0, 7];
        assert!(InfoRequest::parse("NBD_OPT_GO", &data).is_err());
        // Missing count.
        assert!(InfoRequest::parse("NBD_OPT_GO", &[0, 0, 0, 0]).is_err());
        // A name longer than the protocol allows, without reading it.
        let mut data = ((MAX_STRING_BYTES + 1) as u32).to_be_bytes().to_vec();
        data.extend(std::iter::repeat_n(b'x', MAX_STRING_BYTES + 1));
        data.extend([0, 0]);
        assert!(InfoRequest::parse("NBD_OPT_GO", &data).is_err());
    }

    #[test]
    fn info_request_with_a_huge_count_allocates_by_what_is_present() {
        // 65535 requests claimed, none present: an error, and the vector is sized by the data.
        let data = [0, 0, 0, 0, 0xff, 0xff];
        assert!(InfoRequest::parse("NBD_OPT_INFO", &data).is_err());
    }

    #[test]
    fn meta_context_request_parses_queries() {
        let mut data = Vec::new();
        data.extend(2u32.to_be_bytes());
        data.extend(b"ex");
        data.extend(2u32.to_be_bytes());
        data.extend(15u32.to_be_bytes());
        data.extend(b"base:allocation");
        data.extend(5u32.to_be_bytes());
        data.extend(b"qemu:");
        let request = MetaContextRequest::parse("NBD_OPT_SET_META_CONTEXT", &data).unwrap();
        assert_eq!(request.name, b"ex");
        assert_eq!(request.queries, vec![&b"base:allocation"[..], &b"qemu:"[..]]);
        // A query running past the end.
        let cut = &data[..data.len() - 1];
        assert!(MetaContextRequest::parse("NBD_OPT_SET_META_CONTEXT", cut).is_err());
        // Too many queries claimed.
        let mut data = vec![0, 0, 0, 0];
        data.extend(u32::MAX.to_be_bytes());
        assert!(MetaContextRequest::parse("NBD_OPT_LIST_META_CONTEXT", &data).is_err());
    }

    #[test]
    fn request_headers_round_trip_in_both_styles() {
        let header = RequestHeader { flags: CMD_FLAG_FUA, command: CMD_WRITE, cookie: 7, offset: 4096, length: 512 };
        for style in [ReplyStyle::Simple, ReplyStyle::Structured, ReplyStyle::Extended] {
            let mut out = Vec::new();
            header.encode(style, &mut out);
            assert_eq!(out.len(), style.request_header_len());
            assert_eq!(RequestHeader::parse(style, &out), Ok(header));
        }
        let big = RequestHeader { length: 1 << 40, ..header };
        let mut out = Vec::new();
        big.encode(ReplyStyle::Extended, &mut out);
        assert_eq!(RequestHeader::parse(ReplyStyle::Extended, &out).unwrap().length, 1 << 40);
    }

    #[test]
    fn request_header_magic_must_match_the_style() {
        let header = RequestHeader { flags: 0, command: CMD_READ, cookie: 1, offset: 0, length: 512 };
        let mut compact = Vec::new();
        header.encode(ReplyStyle::Simple, &mut compact);
        let mut extended = Vec::new();
        header.encode(ReplyStyle::Extended, &mut extended);
        assert!(matches!(RequestHeader::parse(ReplyStyle::Extended, &compact), Err(WireError::Short { .. })));
        extended[..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        assert_eq!(
            RequestHeader::parse(ReplyStyle::Extended, &extended),
            Err(WireError::BadRequestMagic { found: REQUEST_MAGIC, expected: EXTENDED_REQUEST_MAGIC })
        );
        compact[0] = 0;
        assert!(matches!(RequestHeader::parse(ReplyStyle::Simple, &compact), Err(WireError::BadRequestMagic { .. })));
    }

    #[test]
    fn simple_replies() {
        let mut out = Vec::new();
        encode_reply_head(ReplyStyle::Simple, 0xabcd, 0, ReplyBody::Data { offset: 0, len: 512 }, &mut out);
        assert_eq!(out.len(), SIMPLE_REPLY_LEN);
        assert_eq!(&out[..4], &SIMPLE_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&out[4..8], &[0; 4]);
        assert_eq!(&out[8..], &0xabcdu64.to_be_bytes());
        out.clear();
        let error = ReplyBody::Error { errno: Errno::Perm, message: "read-only" };
        encode_reply_head(ReplyStyle::Simple, 1, 0, error, &mut out);
        assert_eq!(out.len(), SIMPLE_REPLY_LEN, "simple replies carry no message");
        assert_eq!(&out[4..8], &1u32.to_be_bytes());
    }

    #[test]
    fn structured_replies() {
        let mut out = Vec::new();
        encode_reply_head(ReplyStyle::Structured, 5, 4096, ReplyBody::Data { offset: 4096, len: 512 }, &mut out);
        assert_eq!(out.len(), STRUCTURED_REPLY_LEN + 8);
        assert_eq!(&out[..4], &STRUCTURED_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&out[4..6], &REPLY_FLAG_DONE.to_be_bytes());
        assert_eq!(&out[6..8], &REPLY_TYPE_OFFSET_DATA.to_be_bytes());
        assert_eq!(&out[8..16], &5u64.to_be_bytes());
        assert_eq!(&out[16..20], &520u32.to_be_bytes());
        assert_eq!(&out[20..28], &4096u64.to_be_bytes());

        out.clear();
        encode_reply_head(ReplyStyle::Structured, 5, 0, ReplyBody::Done, &mut out);
        assert_eq!(&out[..4], &SIMPLE_REPLY_MAGIC.to_be_bytes(), "no payload: a simple reply will do");

        out.clear();
        encode_reply_head(ReplyStyle::Structured, 5, 0, ReplyBody::Data { offset: 0, len: 0 }, &mut out);
        assert_eq!(&out[6..8], &REPLY_TYPE_NONE.to_be_bytes(), "an empty read ends with NONE");
        assert_eq!(&out[16..20], &0u32.to_be_bytes());

        out.clear();
        let error = ReplyBody::Error { errno: Errno::Inval, message: "beyond the end" };
        encode_reply_head(ReplyStyle::Structured, 5, 0, error, &mut out);
        assert_eq!(&out[6..8], &REPLY_TYPE_ERROR.to_be_bytes());
        assert_eq!(&out[16..20], &(6 + 14u32).to_be_bytes());
        assert_eq!(&out[20..24], &22u32.to_be_bytes());
        assert_eq!(&out[24..26], &14u16.to_be_bytes());
        assert_eq!(&out[26..], b"beyond the end");
    }

    #[test]
    fn extended_replies_echo_the_request_offset() {
        let mut out = Vec::new();
        encode_reply_head(ReplyStyle::Extended, 9, 8192, ReplyBody::Done, &mut out);
        assert_eq!(out.len(), EXTENDED_REPLY_LEN);
        assert_eq!(&out[..4], &EXTENDED_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&out[6..8], &REPLY_TYPE_NONE.to_be_bytes());
        assert_eq!(&out[16..24], &8192u64.to_be_bytes());
        assert_eq!(&out[24..32], &0u64.to_be_bytes());

        out.clear();
        encode_reply_head(ReplyStyle::Extended, 9, 8192, ReplyBody::Data { offset: 8192, len: 4096 }, &mut out);
        assert_eq!(out.len(), MAX_REPLY_HEAD_LEN);
        assert_eq!(&out[24..32], &(4096u64 + 8).to_be_bytes());
        assert_eq!(&out[32..40], &8192u64.to_be_bytes());
    }

    #[test]
    fn block_status_chunks_in_both_chunked_styles() {
        let extents = [(8192u64, STATE_HOLE | STATE_ZERO), (4096, 0)];
        let body = ReplyBody::BlockStatus { context_id: 1, extents: &extents };
        let mut out = Vec::new();
        encode_reply_head(ReplyStyle::Structured, 5, 4096, body, &mut out);
        assert_eq!(out.len(), STRUCTURED_REPLY_LEN + 4 + 2 * 8);
        assert_eq!(&out[..4], &STRUCTURED_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&out[4..6], &REPLY_FLAG_DONE.to_be_bytes());
        assert_eq!(&out[6..8], &REPLY_TYPE_BLOCK_STATUS.to_be_bytes());
        assert_eq!(&out[8..16], &5u64.to_be_bytes());
        assert_eq!(&out[16..20], &20u32.to_be_bytes(), "context id and two descriptors");
        assert_eq!(&out[20..24], &1u32.to_be_bytes());
        assert_eq!(&out[24..32], &[0, 0, 0x20, 0, 0, 0, 0, 3]);
        assert_eq!(&out[32..40], &[0, 0, 0x10, 0, 0, 0, 0, 0]);

        out.clear();
        encode_reply_head(ReplyStyle::Extended, 5, 4096, body, &mut out);
        assert_eq!(out.len(), EXTENDED_REPLY_LEN + 8 + 2 * 16);
        assert_eq!(&out[..4], &EXTENDED_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&out[6..8], &REPLY_TYPE_BLOCK_STATUS_EXT.to_be_bytes());
        assert_eq!(&out[16..24], &4096u64.to_be_bytes(), "the request's offset");
        assert_eq!(&out[24..32], &40u64.to_be_bytes(), "context id, count and two descriptors");
        assert_eq!(&out[32..36], &1u32.to_be_bytes());
        assert_eq!(&out[36..40], &2u32.to_be_bytes(), "descriptor count");
        assert_eq!(&out[40..48], &8192u64.to_be_bytes());
        assert_eq!(&out[48..56], &3u64.to_be_bytes(), "flags widened to 64 bits");
        assert_eq!(&out[56..64], &4096u64.to_be_bytes());
        assert_eq!(&out[64..72], &0u64.to_be_bytes());
    }

    #[test]
    fn rep_server_payload_parses() {
        let mut data = 4u32.to_be_bytes().to_vec();
        data.extend(b"diska disk");
        assert_eq!(parse_rep_server(&data), Ok((&b"disk"[..], &b"a disk"[..])));
        assert!(parse_rep_server(&[0, 0, 0, 5, b'x']).is_err());
    }
}
