//! Status codes: one per wire-visible outcome, split by who is at fault.

use core::fmt;

/// The outcome of one instruction, or of a whole datagram (header byte 18).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Status {
    /// Executed.
    Ok = 0x00,
    // The sender's bytes are wrong.
    /// Fields contradict each other or a reserved field is not zero.
    Malformed = 0x01,
    /// The datagram's version is not one this target speaks (datagram status only).
    UnsupportedVersion = 0x02,
    /// No opcode has this number.
    UnknownOpcode = 0x03,
    // The target refuses the request.
    /// The opcode is defined but this target does not serve it.
    NotSupported = 0x04,
    /// No region or namespace has this id.
    NoSuchSpace = 0x05,
    /// The addressed range does not lie within the region.
    OutOfRange = 0x06,
    /// An atomic or lane-wise instruction is not aligned to its word or lane size.
    Unaligned = 0x07,
    /// The answer would not fit in the negotiated datagram size, or an operand is over its limit.
    TooLarge = 0x08,
    /// Persisting or reading the backing store failed; written bytes may not be durable.
    IoError = 0x09,
    /// The worker is overloaded; retry after the back-off hint. For HELLO: every session slot
    /// is held and no session is idle.
    Busy = 0x0A,
    /// The session is unknown to the target, or belongs to another sender address.
    NoSession = 0x0B,
    /// The tenant lacks the permission (reserved for security).
    PermissionDenied = 0x0C,
    /// The sequence number is older than the replay window, or its stored answer is gone.
    Stale = 0x0D,
    /// HELLO only: the sender must prove its address first; this result's data is the cookie to
    /// echo in a second HELLO.
    Retry = 0x0E,
    /// HELLO only: the sender's address holds as many sessions as the target allows one address.
    SessionLimit = 0x0F,
    /// The backing store is full (a file system out of space or quota): the write did not
    /// happen, or happened in part; freeing space makes it succeed again.
    NoSpace = 0x10,
    /// The target requires tenant authentication and this was not proven: a HELLO without a
    /// key, with an unknown tenant, a wrong proof or a rotated key, or a sessionless request
    /// only an authenticated session may make (PROTOCOL.md, "Authentication").
    Unauthenticated = 0x11,
    /// DECRYPT: the ciphertext, tag, nonce or associated data is not what the key sealed (or the
    /// nonce names a key version the slot does not hold); nothing was written.
    AuthFailed = 0x12,
    /// ENCRYPT or DECRYPT: the key slot holds no key.
    NoSuchKey = 0x13,
    /// Datagram status of a notice, not an answer: the request is executing (its block I/O
    /// is in flight) and its answer will follow. The initiator restarts its retransmission
    /// timer instead of resending (PROTOCOL.md, "In-progress notices").
    InProgress = 0x14,
}

impl Status {
    /// Every status, in wire order.
    pub const ALL: [Status; 21] = [
        Status::Ok,
        Status::Malformed,
        Status::UnsupportedVersion,
        Status::UnknownOpcode,
        Status::NotSupported,
        Status::NoSuchSpace,
        Status::OutOfRange,
        Status::Unaligned,
        Status::TooLarge,
        Status::IoError,
        Status::Busy,
        Status::NoSession,
        Status::PermissionDenied,
        Status::Stale,
        Status::Retry,
        Status::SessionLimit,
        Status::NoSpace,
        Status::Unauthenticated,
        Status::AuthFailed,
        Status::NoSuchKey,
        Status::InProgress,
    ];

    /// The status with this wire value, if any.
    pub fn from_u8(value: u8) -> Option<Status> {
        Status::ALL.get(usize::from(value)).copied()
    }

    /// A stable lower-case name, used in STAT counters and CLI output.
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Malformed => "malformed",
            Status::UnsupportedVersion => "unsupported_version",
            Status::UnknownOpcode => "unknown_opcode",
            Status::NotSupported => "not_supported",
            Status::NoSuchSpace => "no_such_space",
            Status::OutOfRange => "out_of_range",
            Status::Unaligned => "unaligned",
            Status::TooLarge => "too_large",
            Status::IoError => "io_error",
            Status::Busy => "busy",
            Status::NoSession => "no_session",
            Status::PermissionDenied => "permission_denied",
            Status::Stale => "stale",
            Status::Retry => "retry",
            Status::SessionLimit => "session_limit",
            Status::NoSpace => "no_space",
            Status::Unauthenticated => "unauthenticated",
            Status::AuthFailed => "auth_failed",
            Status::NoSuchKey => "no_such_key",
            Status::InProgress => "in_progress",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_values_round_trip_and_are_dense() {
        for (index, status) in Status::ALL.iter().enumerate() {
            assert_eq!(*status as u8 as usize, index);
            assert_eq!(Status::from_u8(*status as u8), Some(*status));
        }
        assert_eq!(Status::from_u8(Status::ALL.len() as u8), None);
    }
}
