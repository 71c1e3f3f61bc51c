//! The transmission phase's rules, sans-IO: what the negotiated session is, and what to do with
//! each request header (execute it, refuse it with an error while keeping the stream in step,
//! disconnect, or close on a violation that cannot be skipped). The server's connection task
//! applies the decision; nothing here touches a socket or the backend.

use crate::nbd::codec::{
    command_name, Errno, ReplyStyle, RequestHeader, WireError, CMD_BLOCK_STATUS, CMD_CACHE, CMD_DISC, CMD_FLAG_DF,
    CMD_FLAG_FAST_ZERO, CMD_FLAG_FUA, CMD_FLAG_NO_HOLE, CMD_FLAG_PAYLOAD_LEN, CMD_FLAG_REQ_ONE, CMD_FLUSH, CMD_READ,
    CMD_TRIM, CMD_WRITE, CMD_WRITE_ZEROES, FLAG_SEND_FAST_ZERO,
};
use crate::nbd::limits::MAX_PAYLOAD_READ_BYTES;
use crate::nbd::negotiate::ExportInfo;

/// What was agreed in the handshake and governs every request of one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Session {
    /// Request and reply framing.
    pub style: ReplyStyle,
    /// Export size in bytes.
    pub size_bytes: u64,
    /// Offsets and lengths must be multiples of this.
    pub min_block_bytes: u32,
    /// Largest read or write payload.
    pub max_payload_bytes: u32,
    /// Writes are refused.
    pub read_only: bool,
    /// The transmission flags the client was given.
    pub transmission_flags: u16,
    /// Zeroing may be done by trim (the backend's trim reads back as zeroes).
    pub trim_reads_zeroes: bool,
    /// The id of the selected `base:allocation` context: `NBD_CMD_BLOCK_STATUS` is answered
    /// only when one was selected (which needs chunked replies).
    pub allocation_context: Option<u32>,
}

impl Session {
    /// The session for a client of `export` that negotiated `style` and selected
    /// `base:allocation` under `allocation_context` (or nothing).
    pub fn new(export: &ExportInfo, style: ReplyStyle, allocation_context: Option<u32>) -> Session {
        debug_assert!(
            allocation_context.is_none() || (style != ReplyStyle::Simple && export.reports_allocation),
            "a context is selected only with chunked replies, on a backend that can report allocation"
        );
        Session {
            style,
            size_bytes: export.size_bytes,
            min_block_bytes: export.min_block_bytes,
            max_payload_bytes: export.max_payload_bytes,
            read_only: export.read_only,
            transmission_flags: export.transmission_flags(style),
            trim_reads_zeroes: export.trim_reads_zeroes,
            allocation_context,
        }
    }

    /// Length of a request header in this session.
    pub fn request_header_len(&self) -> usize {
        self.style.request_header_len()
    }

    /// Decides what to do with a request.
    ///
    /// Checks run in this order: payload framing (a payload too large to skip ends the
    /// connection), the command, read-only, flags, alignment, bounds, size. A refused request
    /// still has its payload consumed, so the next header is found where the client put it.
    pub fn decide(&self, header: &RequestHeader) -> Decision {
        let extended = self.style == ReplyStyle::Extended;
        let command = header.command;
        let name = command_name(command);
        // A write always carries its length in payload. With extended headers the spec wants
        // NBD_CMD_FLAG_PAYLOAD_LEN on writes, but qemu's client (8.2 to 10.0 at least) leaves
        // it out; qemu-nbd accepts that, and so do we: the bytes are on the wire either way.
        let payload_bytes = if command == CMD_WRITE || (extended && header.flags & CMD_FLAG_PAYLOAD_LEN != 0) {
            header.length
        } else {
            0
        };
        if payload_bytes > MAX_PAYLOAD_READ_BYTES {
            return Decision::Violation(ProtocolViolation::PayloadTooLarge {
                command: name,
                length: payload_bytes,
                limit: MAX_PAYLOAD_READ_BYTES,
            });
        }
        let refuse = |errno: Errno, message: String| Decision::Refuse { errno, message, discard_bytes: payload_bytes };

        let allowed_flags = match command {
            CMD_DISC => return Decision::Disconnect,
            CMD_READ if self.style == ReplyStyle::Simple => CMD_FLAG_FUA,
            CMD_READ => CMD_FLAG_FUA | CMD_FLAG_DF,
            CMD_WRITE if extended => CMD_FLAG_FUA | CMD_FLAG_PAYLOAD_LEN,
            CMD_WRITE | CMD_FLUSH | CMD_TRIM => CMD_FLAG_FUA,
            CMD_WRITE_ZEROES if self.transmission_flags & FLAG_SEND_FAST_ZERO != 0 => {
                CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO
            }
            CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE,
            CMD_BLOCK_STATUS if self.allocation_context.is_some() => CMD_FLAG_FUA | CMD_FLAG_REQ_ONE,
            CMD_BLOCK_STATUS => {
                let message = format!("{name} needs a metadata context selected with NBD_OPT_SET_META_CONTEXT");
                return refuse(Errno::Inval, message);
            }
            CMD_CACHE => {
                return refuse(Errno::Inval, format!("{name} is not offered by this export"));
            }
            _ => return refuse(Errno::Inval, format!("unknown command {command}")),
        };
        let writes = matches!(command, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
        if writes && self.read_only {
            return refuse(Errno::Perm, format!("{name} on a read-only export"));
        }
        let unknown_flags = header.flags & !allowed_flags;
        if unknown_flags != 0 {
            return refuse(Errno::Inval, format!("flags 0x{unknown_flags:04x} are not valid for {name} here"));
        }
        let fua = header.flags & CMD_FLAG_FUA != 0;
        if command == CMD_FLUSH {
            // Offset and length are reserved (zero); being lenient costs nothing.
            return Decision::Execute(Command::Flush);
        }

        let (offset, len) = (header.offset, header.length);
        let block = u64::from(self.min_block_bytes);
        if command == CMD_BLOCK_STATUS {
            return self.block_status(header, block);
        }
        if !offset.is_multiple_of(block) || !len.is_multiple_of(block) {
            return refuse(
                Errno::Inval,
                format!(
                    "{name} at offset {offset} of {len} bytes is not aligned to the {block}-byte minimum block size"
                ),
            );
        }
        if offset.checked_add(len).is_none_or(|end| end > self.size_bytes) {
            // The spec asks for ENOSPC when a write runs past the end, EINVAL otherwise.
            let errno = if matches!(command, CMD_WRITE | CMD_WRITE_ZEROES) { Errno::NoSpc } else { Errno::Inval };
            let message = format!(
                "{name} at offset {offset} of {len} bytes runs past the end of the export ({} bytes)",
                self.size_bytes
            );
            return refuse(errno, message);
        }
        let max = u64::from(self.max_payload_bytes);
        match command {
            CMD_READ if len > max => {
                // With chunked replies the spec lets a server refuse a large read with
                // EOVERFLOW so the client retries smaller; simple replies only know EINVAL.
                let errno = if self.style == ReplyStyle::Simple { Errno::Inval } else { Errno::Overflow };
                refuse(errno, format!("{name} of {len} bytes exceeds the maximum payload of {max} bytes"))
            }
            CMD_READ => Decision::Execute(Command::Read { offset, len }),
            CMD_WRITE if len > max => {
                refuse(Errno::Inval, format!("{name} of {len} bytes exceeds the maximum payload of {max} bytes"))
            }
            CMD_WRITE => Decision::Execute(Command::Write { offset, len, fua }),
            CMD_TRIM => Decision::Execute(Command::Trim { offset, len, fua }),
            _ => {
                debug_assert_eq!(command, CMD_WRITE_ZEROES, "every other command returned above");
                let may_trim = header.flags & CMD_FLAG_NO_HOLE == 0 && self.trim_reads_zeroes;
                let fast = header.flags & CMD_FLAG_FAST_ZERO != 0;
                if fast && !may_trim {
                    // Zeroing without trim is a backend write-zeroes whose speed the backend
                    // does not promise; the spec wants a quick ENOTSUP then, before touching
                    // the data.
                    let message = if self.trim_reads_zeroes {
                        "fast zeroing is only offered when holes are allowed"
                    } else {
                        "fast zeroing is not offered: this backend's trim does not read back as zeroes"
                    };
                    return refuse(Errno::NotSup, message.into());
                }
                Decision::Execute(Command::WriteZeroes { offset, len, fua, may_trim, fast })
            }
        }
    }
}

impl Session {
    /// Checks `NBD_CMD_BLOCK_STATUS` (flags already checked). Its length is a hint, so an
    /// unaligned one is rounded down to whole blocks, or up to one block when it is shorter and
    /// the client allows an extent past it (no `REQ_ONE`); the offset must be aligned.
    fn block_status(&self, header: &RequestHeader, block: u64) -> Decision {
        let (offset, len) = (header.offset, header.length);
        let name = command_name(CMD_BLOCK_STATUS);
        let refuse = |message: String| Decision::Refuse { errno: Errno::Inval, message, discard_bytes: 0 };
        let context_id = self.allocation_context.expect("decide refuses BLOCK_STATUS without a context");
        let one = header.flags & CMD_FLAG_REQ_ONE != 0;
        if len == 0 {
            return refuse(format!("{name} of 0 bytes"));
        }
        if !offset.is_multiple_of(block) {
            return refuse(format!("{name} at offset {offset} is not aligned to the {block}-byte minimum block size"));
        }
        if offset.checked_add(len).is_none_or(|end| end > self.size_bytes) {
            let size = self.size_bytes;
            return refuse(format!(
                "{name} at offset {offset} of {len} bytes runs past the end of the export ({size} bytes)"
            ));
        }
        let whole = len / block * block;
        let len = match whole {
            0 if one => {
                return refuse(format!("{name} with REQ_ONE of {len} bytes, under the {block}-byte block size"));
            }
            0 if offset + block > self.size_bytes => return refuse(format!("{name} of a partial last block")),
            0 => block,
            whole => whole,
        };
        Decision::Execute(Command::BlockStatus { offset, len, one, context_id })
    }
}

/// What to do with one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Execute the command (a write's payload follows the header).
    Execute(Command),
    /// Answer with an error without touching the backend, after discarding the
    /// `discard_bytes` of payload that follow the header.
    Refuse {
        /// The error to send.
        errno: Errno,
        /// Why, for the client's user (sent in chunked replies).
        message: String,
        /// Payload bytes to read and drop.
        discard_bytes: u64,
    },
    /// `NBD_CMD_DISC`: finish what is in flight, then close.
    Disconnect,
    /// The stream cannot be kept in step: close the connection.
    Violation(ProtocolViolation),
}

impl Decision {
    /// What a request read while the server is stopping gets instead: `NBD_ESHUTDOWN`, which
    /// tells the client to disconnect (doc/proto.md, "Terminating the transmission phase"),
    /// with its payload still consumed so the stream stays in step. A FLUSH still runs: it
    /// makes writes already acknowledged durable, which a client disconnecting wants (the
    /// kernel's client flushes before it lets go). A disconnect or a violation is kept as it is.
    pub fn at_shutdown(self) -> Decision {
        let discard_bytes = match &self {
            Decision::Execute(Command::Flush) => return self,
            Decision::Execute(Command::Write { len, .. }) => *len,
            Decision::Execute(_) => 0,
            Decision::Refuse { discard_bytes, .. } => *discard_bytes,
            Decision::Disconnect | Decision::Violation(_) => return self,
        };
        Decision::Refuse { errno: Errno::Shutdown, message: "the server is shutting down".into(), discard_bytes }
    }
}

/// A request to execute, checked against the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Read `len` bytes at `offset`.
    Read {
        /// Byte offset.
        offset: u64,
        /// Bytes.
        len: u64,
    },
    /// Write the `len` payload bytes that follow the header at `offset`.
    Write {
        /// Byte offset.
        offset: u64,
        /// Bytes (payload length).
        len: u64,
        /// Durable before the reply.
        fua: bool,
    },
    /// Make every completed write durable.
    Flush,
    /// Discard a range.
    Trim {
        /// Byte offset.
        offset: u64,
        /// Bytes.
        len: u64,
        /// Durable before the reply.
        fua: bool,
    },
    /// Zero a range.
    WriteZeroes {
        /// Byte offset.
        offset: u64,
        /// Bytes.
        len: u64,
        /// Durable before the reply.
        fua: bool,
        /// The client allows deallocation (no `NO_HOLE`) and the backend's trim reads back as
        /// zeroes: trim may do the zeroing.
        may_trim: bool,
        /// `FAST_ZERO`: fail with `ENOTSUP` rather than zero slowly.
        fast: bool,
    },
    /// Report allocation from `offset` on.
    BlockStatus {
        /// Byte offset.
        offset: u64,
        /// Bytes to report on at most, whole blocks.
        len: u64,
        /// `REQ_ONE`: answer exactly one extent.
        one: bool,
        /// The selected `base:allocation` context's id.
        context_id: u32,
    },
}

/// The client broke transmission framing in a way that cannot be skipped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolViolation {
    /// A header that is not a request.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// A payload too large to read or skip.
    #[error("{command} carries a payload of {length} bytes, over the limit of {limit} bytes")]
    PayloadTooLarge {
        /// The command's name.
        command: &'static str,
        /// The claimed payload length.
        length: u64,
        /// The bound.
        limit: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nbd::codec::{CMD_FLAG_REQ_ONE, FLAG_SEND_DF};

    fn session(style: ReplyStyle) -> Session {
        let export = ExportInfo {
            name: String::new(),
            description: None,
            size_bytes: 1 << 20,
            read_only: false,
            min_block_bytes: 512,
            preferred_block_bytes: 4096,
            max_payload_bytes: 64 * 1024,
            trim_reads_zeroes: true,
            reports_allocation: true,
        };
        Session::new(&export, style, None)
    }

    fn request(command: u16, flags: u16, offset: u64, length: u64) -> RequestHeader {
        RequestHeader { flags, command, cookie: 1, offset, length }
    }

    fn refused(decision: Decision) -> (Errno, u64) {
        match decision {
            Decision::Refuse { errno, discard_bytes, message } => {
                assert!(!message.is_empty());
                (errno, discard_bytes)
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn valid_requests_execute() {
        let s = session(ReplyStyle::Simple);
        assert_eq!(
            s.decide(&request(CMD_READ, 0, 512, 4096)),
            Decision::Execute(Command::Read { offset: 512, len: 4096 })
        );
        assert_eq!(
            s.decide(&request(CMD_WRITE, CMD_FLAG_FUA, 0, 512)),
            Decision::Execute(Command::Write { offset: 0, len: 512, fua: true })
        );
        assert_eq!(s.decide(&request(CMD_FLUSH, 0, 0, 0)), Decision::Execute(Command::Flush));
        assert_eq!(
            s.decide(&request(CMD_TRIM, 0, 0, 1 << 20)),
            Decision::Execute(Command::Trim { offset: 0, len: 1 << 20, fua: false })
        );
        assert_eq!(
            s.decide(&request(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 0, 512)),
            Decision::Execute(Command::WriteZeroes { offset: 0, len: 512, fua: false, may_trim: false, fast: false })
        );
        assert_eq!(
            s.decide(&request(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 0, 512)),
            Decision::Execute(Command::WriteZeroes { offset: 0, len: 512, fua: false, may_trim: true, fast: true })
        );
        assert_eq!(s.decide(&request(CMD_DISC, 0, 0, 0)), Decision::Disconnect);
    }

    #[test]
    fn at_shutdown_requests_are_refused_with_their_payload_consumed_but_flush_runs() {
        let s = session(ReplyStyle::Simple);
        let at_shutdown =
            |command, flags, offset, length| refused(s.decide(&request(command, flags, offset, length)).at_shutdown());
        assert_eq!(at_shutdown(CMD_WRITE, CMD_FLAG_FUA, 0, 4096), (Errno::Shutdown, 4096));
        assert_eq!(at_shutdown(CMD_READ, 0, 0, 4096), (Errno::Shutdown, 0));
        assert_eq!(s.decide(&request(CMD_FLUSH, 0, 0, 0)).at_shutdown(), Decision::Execute(Command::Flush));
        assert_eq!(at_shutdown(CMD_TRIM, 0, 0, 4096), (Errno::Shutdown, 0));
        // Refused anyway: the error becomes ESHUTDOWN, the payload is still skipped.
        assert_eq!(at_shutdown(CMD_WRITE, 0, 0, 100), (Errno::Shutdown, 100));
        assert_eq!(s.decide(&request(CMD_DISC, 0, 0, 0)).at_shutdown(), Decision::Disconnect);
        let too_large = request(CMD_WRITE, 0, 0, MAX_PAYLOAD_READ_BYTES + 1);
        assert!(matches!(s.decide(&too_large).at_shutdown(), Decision::Violation(_)));
    }

    #[test]
    fn unaligned_requests_are_invalid_and_keep_the_stream_in_step() {
        let s = session(ReplyStyle::Simple);
        assert_eq!(refused(s.decide(&request(CMD_READ, 0, 1, 512))), (Errno::Inval, 0));
        assert_eq!(refused(s.decide(&request(CMD_READ, 0, 0, 100))), (Errno::Inval, 0));
        assert_eq!(refused(s.decide(&request(CMD_WRITE, 0, 0, 100))), (Errno::Inval, 100), "payload is skipped");
    }

    #[test]
    fn requests_past_the_end() {
        let s = session(ReplyStyle::Simple);
        assert_eq!(refused(s.decide(&request(CMD_READ, 0, 1 << 20, 512))), (Errno::Inval, 0));
        assert_eq!(refused(s.decide(&request(CMD_TRIM, 0, (1 << 20) - 512, 1024))), (Errno::Inval, 0));
        assert_eq!(refused(s.decide(&request(CMD_WRITE, 0, 1 << 20, 512))), (Errno::NoSpc, 512));
        assert_eq!(refused(s.decide(&request(CMD_WRITE_ZEROES, 0, 1 << 20, 512))), (Errno::NoSpc, 0));
        // An offset near 2^64 must not overflow.
        let s = session(ReplyStyle::Extended);
        assert_eq!(refused(s.decide(&request(CMD_READ, 0, u64::MAX - 511, 1024))), (Errno::Inval, 0));
        assert_eq!(refused(s.decide(&request(CMD_TRIM, 0, 512, u64::MAX - 511))), (Errno::Inval, 0));
    }

    #[test]
    fn writes_to_a_read_only_export_are_not_permitted() {
        let s = Session { read_only: true, ..session(ReplyStyle::Structured) };
        assert_eq!(refused(s.decide(&request(CMD_WRITE, 0, 0, 512))), (Errno::Perm, 512));
        assert_eq!(refused(s.decide(&request(CMD_TRIM, 0, 0, 512))), (Errno::Perm, 0));
        assert_eq!(refused(s.decide(&request(CMD_WRITE_ZEROES, 0, 0, 512))), (Errno::Perm, 0));
        assert!(matches!(s.decide(&request(CMD_READ, 0, 0, 512)), Decision::Execute(_)));
        assert!(matches!(s.decide(&request(CMD_FLUSH, 0, 0, 0)), Decision::Execute(_)));
    }

    #[test]
    fn oversize_requests() {
        let s = session(ReplyStyle::Simple);
        assert_eq!(refused(s.decide(&request(CMD_READ, 0, 0, 128 * 1024))), (Errno::Inval, 0));
        assert_eq!(refused(s.decide(&request(CMD_WRITE, 0, 0, 128 * 1024))), (Errno::Inval, 128 * 1024));
        let s = session(ReplyStyle::Structured);
        assert_eq!(refused(s.decide(&request(CMD_READ, 0, 0, 128 * 1024))), (Errno::Overflow, 0));
        // Commands without payload may exceed the maximum payload: they are split.
        assert!(matches!(s.decide(&request(CMD_TRIM, 0, 0, 1 << 20)), Decision::Execute(_)));
        // A payload too large to skip ends the connection.
        let s = session(ReplyStyle::Simple);
        assert!(matches!(s.decide(&request(CMD_WRITE, 0, 0, u32::MAX.into())), Decision::Violation(_)));
    }

    #[test]
    fn flags_are_checked_per_command() {
        let s = session(ReplyStyle::Simple);
        assert_eq!(refused(s.decide(&request(CMD_READ, CMD_FLAG_DF, 0, 512))), (Errno::Inval, 0), "DF needs chunks");
        assert_eq!(refused(s.decide(&request(CMD_WRITE, CMD_FLAG_NO_HOLE, 0, 512))), (Errno::Inval, 512));
        assert_eq!(refused(s.decide(&request(CMD_TRIM, CMD_FLAG_REQ_ONE, 0, 512))), (Errno::Inval, 0));
        assert_eq!(refused(s.decide(&request(CMD_READ, 0x8000, 0, 512))), (Errno::Inval, 0));
        assert!(matches!(s.decide(&request(CMD_READ, CMD_FLAG_FUA, 0, 512)), Decision::Execute(_)), "FUA is harmless");
        let s = session(ReplyStyle::Structured);
        assert_ne!(s.transmission_flags & FLAG_SEND_DF, 0);
        assert!(matches!(s.decide(&request(CMD_READ, CMD_FLAG_DF, 0, 512)), Decision::Execute(_)));
    }

    #[test]
    fn fast_zero_without_holes_fails_fast() {
        let s = session(ReplyStyle::Structured);
        let decision = s.decide(&request(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO | CMD_FLAG_NO_HOLE, 0, 512));
        assert_eq!(refused(decision), (Errno::NotSup, 0));
    }

    #[test]
    fn without_zeroing_trims_zeroes_are_written_and_never_fast() {
        let s = Session { trim_reads_zeroes: false, ..session(ReplyStyle::Structured) };
        assert_eq!(
            s.decide(&request(CMD_WRITE_ZEROES, 0, 0, 512)),
            Decision::Execute(Command::WriteZeroes { offset: 0, len: 512, fua: false, may_trim: false, fast: false })
        );
        assert_eq!(refused(s.decide(&request(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 0, 512))), (Errno::NotSup, 0));
    }

    #[test]
    fn unknown_and_unoffered_commands_are_invalid() {
        let s = session(ReplyStyle::Structured);
        for command in [CMD_CACHE, CMD_BLOCK_STATUS, 8, 0xffff] {
            assert_eq!(refused(s.decide(&request(command, 0, 0, 512))), (Errno::Inval, 0), "command {command}");
        }
    }

    #[test]
    fn block_status_needs_a_selected_context_and_takes_its_length_as_a_hint() {
        let s = session(ReplyStyle::Structured);
        assert_eq!(refused(s.decide(&request(CMD_BLOCK_STATUS, 0, 0, 512))), (Errno::Inval, 0), "no context selected");
        let s = Session { allocation_context: Some(7), ..s };
        let status = |offset, len, one| Decision::Execute(Command::BlockStatus { offset, len, one, context_id: 7 });
        assert_eq!(s.decide(&request(CMD_BLOCK_STATUS, 0, 512, 4096)), status(512, 4096, false));
        assert_eq!(s.decide(&request(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 0, 1 << 20)), status(0, 1 << 20, true));
        // Far beyond the maximum payload: it carries none, and answers may come back short.
        let big = Session { size_bytes: 1 << 40, style: ReplyStyle::Extended, ..s };
        assert_eq!(big.decide(&request(CMD_BLOCK_STATUS, 0, 0, 1 << 40)), status(0, 1 << 40, false));
        // Unaligned lengths: whole blocks, or one block when the client allows a longer extent.
        assert_eq!(s.decide(&request(CMD_BLOCK_STATUS, 0, 0, 1500)), status(0, 1024, false));
        assert_eq!(s.decide(&request(CMD_BLOCK_STATUS, 0, 0, 100)), status(0, 512, false));
        assert_eq!(refused(s.decide(&request(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 0, 100))), (Errno::Inval, 0));
        // Refusals: an unaligned offset, nothing asked, past the end, unknown flags.
        assert_eq!(refused(s.decide(&request(CMD_BLOCK_STATUS, 0, 100, 512))), (Errno::Inval, 0));
        assert_eq!(refused(s.decide(&request(CMD_BLOCK_STATUS, 0, 0, 0))), (Errno::Inval, 0));
        assert_eq!(refused(s.decide(&request(CMD_BLOCK_STATUS, 0, (1 << 20) - 512, 1024))), (Errno::Inval, 0));
        assert_eq!(refused(s.decide(&request(CMD_BLOCK_STATUS, CMD_FLAG_NO_HOLE, 0, 512))), (Errno::Inval, 0));
        // A payload (extended headers' filtered form, not offered) is skipped, then refused.
        let s = Session { style: ReplyStyle::Extended, ..s };
        assert_eq!(refused(s.decide(&request(CMD_BLOCK_STATUS, CMD_FLAG_PAYLOAD_LEN, 0, 12))), (Errno::Inval, 12));
        // A read-only export reports allocation too.
        let s = Session { read_only: true, ..s };
        assert_eq!(s.decide(&request(CMD_BLOCK_STATUS, 0, 0, 512)), status(0, 512, false));
    }

    #[test]
    fn extended_payloads_follow_the_payload_flag() {
        let s = session(ReplyStyle::Extended);
        assert_eq!(
            s.decide(&request(CMD_WRITE, CMD_FLAG_PAYLOAD_LEN, 0, 512)),
            Decision::Execute(Command::Write { offset: 0, len: 512, fua: false })
        );
        // A write without the flag still carries its payload (qemu sends it so).
        assert_eq!(
            s.decide(&request(CMD_WRITE, 0, 0, 512)),
            Decision::Execute(Command::Write { offset: 0, len: 512, fua: false })
        );
        assert_eq!(refused(s.decide(&request(CMD_WRITE, 0, 1 << 20, 512))), (Errno::NoSpc, 512));
        // Another command with a payload: skip it, refuse.
        assert_eq!(refused(s.decide(&request(CMD_TRIM, CMD_FLAG_PAYLOAD_LEN, 0, 24))), (Errno::Inval, 24));
        // Effect lengths may be 64-bit.
        assert_eq!(refused(s.decide(&request(CMD_TRIM, 0, 0, 1 << 40))), (Errno::Inval, 0));
        assert!(matches!(
            s.decide(&request(CMD_READ, CMD_FLAG_PAYLOAD_LEN, 0, 1 << 40)),
            Decision::Violation(ProtocolViolation::PayloadTooLarge { .. })
        ));
    }
}
