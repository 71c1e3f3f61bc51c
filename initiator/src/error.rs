//! What can go wrong for a client, split by who is at fault.

use std::io;
use std::net::SocketAddr;

use netdam_isa::block::ExtentError;
use netdam_isa::control::SessionLimitKind;
use netdam_isa::wire::DecodeError;
use netdam_isa::{Opcode, Status};

/// A client-side failure.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing listens at the address (the kernel reported the port unreachable).
    #[error("nothing is listening at {0} (is netdam-target running there?)")]
    NotListening(SocketAddr),
    /// A socket call failed.
    #[error("socket error: {0}")]
    Io(#[from] io::Error),
    /// An idempotent request got no answer after every attempt.
    #[error("{}", timed_out_message(*attempts))]
    TimedOut {
        /// Transmissions made.
        attempts: u32,
    },
    /// A non-idempotent request got no answer; it may or may not have executed.
    #[error("no answer after {attempts} attempt(s) to a non-idempotent request: it may or may not have executed")]
    OutcomeUnknown {
        /// Transmissions made.
        attempts: u32,
    },
    /// The target refused one instruction.
    #[error("target refused {}: {status}{}", opcode_name(*opcode), refusal_hint(*opcode, *status))]
    Refused {
        /// Opcode number of the refused instruction.
        opcode: u8,
        /// The status it gave.
        status: Status,
    },
    /// The target did not confirm CLOSE in time; the session expires there by itself.
    #[error("the target did not confirm closing the session within {waited_ms} ms; it will expire there on its own")]
    CloseUnconfirmed {
        /// How long the client waited.
        waited_ms: u64,
    },
    /// The system random source failed (a HELLO nonce could not be drawn).
    #[error("the system random source failed")]
    Random,
    /// The target would not open a session.
    #[error("the target refused a session: {}", hello_refusal(*.0))]
    HelloRefused(Status),
    /// The target would not open a session: the limit it names is reached.
    #[error("the target refused a session: {}", session_limit_message(*kind, *limit))]
    SessionLimit {
        /// Which limit: the address's share of a worker's sessions, or the tenant's.
        kind: SessionLimitKind,
        /// Its value.
        limit: u32,
    },
    /// The target no longer knows the session (it restarted, or evicted the session after a long
    /// silence) while a non-idempotent request was outstanding.
    #[error("the target no longer knows this session (restarted or evicted it); the non-idempotent request may or may not have executed before")]
    SessionLost,
    /// The target answered a new HELLO (after it lost the session: a restart) with spaces other
    /// than the first HELLO's: requests name regions and namespaces by id, and the ids this
    /// client was told may now name others. Nothing more is sent in this session; connect again
    /// to look the spaces up by name. The message names the first difference.
    #[error("the target's spaces changed while this session was lost (a restart): {0}; nothing more is sent in this session (its requests name spaces by id, which could now address another): connect again")]
    SpacesChanged(String),
    /// The target refused the whole datagram.
    #[error("target refused the datagram: {0}{hint}", hint = datagram_refusal_hint(*.0))]
    DatagramRefused(Status),
    /// The answer has fewer results than the request had instructions.
    #[error("answer lacks result {0}")]
    MissingResult(usize),
    /// The answer did not decode.
    #[error("undecodable answer: {0}")]
    Protocol(#[from] DecodeError),
    /// The HELLO answer holds a value no netdam target sends (a datagram size, a block size or a
    /// namespace size out of range); the message names it. Nothing is sent in the session.
    #[error("the target's HELLO answer is not one a netdam target sends: {0}; is a netdam target listening there?")]
    InvalidHello(String),
    /// A BLOCK_STATUS answer is not a valid extent list.
    #[error("invalid BLOCK_STATUS answer: {0}")]
    BadExtents(#[from] ExtentError),
    /// The request does not fit in one datagram.
    #[error("request does not fit in the negotiated datagram size of {0} bytes")]
    TooLarge(usize),
    /// A request with no instructions.
    #[error("a request needs at least one instruction")]
    Empty,
    /// Too many requests in flight.
    #[error("{0} requests already in flight")]
    WindowFull(usize),
    /// No region with that name or id.
    #[error(
        "the target has no region {name:?} (it has, by name and id: {available}; a tenant is told only of the spaces \
         granted to it)"
    )]
    NoSuchRegion {
        /// What was asked for.
        name: String,
        /// What exists.
        available: String,
    },
    /// No namespace with that name or id.
    #[error(
        "the target has no namespace {name:?} (it has, by name and id: {available}; a tenant is told only of the \
         spaces granted to it)"
    )]
    NoSuchNamespace {
        /// What was asked for.
        name: String,
        /// What exists.
        available: String,
    },
    /// A block transfer that is not a whole number of blocks.
    #[error("{len} bytes is not a whole number of {block_bytes}-byte blocks")]
    PartialBlock {
        /// Bytes given.
        len: usize,
        /// The namespace's block size.
        block_bytes: u32,
    },
    /// A byte request on a namespace that is not a whole number of blocks.
    #[error("{what} of {len} bytes at offset {offset}: offsets and lengths must be multiples of the {block_bytes}-byte block")]
    Unaligned {
        /// The request.
        what: String,
        /// Its offset in bytes.
        offset: u64,
        /// Its length in bytes.
        len: u64,
        /// The namespace's block size.
        block_bytes: u32,
    },
    /// A byte request that runs past the end of the namespace.
    #[error("{len} bytes at offset {offset} run past the end of the {size_bytes}-byte namespace")]
    BeyondEnd {
        /// Its offset in bytes.
        offset: u64,
        /// Its length in bytes.
        len: u64,
        /// The namespace's size.
        size_bytes: u64,
    },
    /// A client setting out of range; the message names it.
    /// A byte range of a region that ends past it (or past 2^64), refused before anything was
    /// sent: the target would have executed the pieces inside it.
    #[error("{} of {len} bytes at offset {offset}: {}; nothing was sent", opcode_name(*opcode), range_end(*offset, *len, *size_bytes))]
    OutsideRegion {
        /// The instruction the range was for.
        opcode: u8,
        /// Its first byte.
        offset: u64,
        /// Its length.
        len: u64,
        /// The region's size, where the end past it (not past 2^64) is at fault.
        size_bytes: Option<u64>,
    },
    #[error("{0}")]
    Setting(String),
    /// The client's I/O task ended.
    #[error("client is shut down")]
    Closed,
}

impl ClientError {
    /// A copy for each of several callers a failure reaches, of the same variant (callers match
    /// on them: `TooLarge`, `Empty`); only an `io::Error`, which cannot be cloned, is copied as
    /// its message.
    pub fn duplicate(&self) -> ClientError {
        match self {
            ClientError::Io(error) => ClientError::Io(io::Error::new(error.kind(), error.to_string())),
            ClientError::NotListening(addr) => ClientError::NotListening(*addr),
            ClientError::TimedOut { attempts } => ClientError::TimedOut { attempts: *attempts },
            ClientError::OutcomeUnknown { attempts } => ClientError::OutcomeUnknown { attempts: *attempts },
            ClientError::Refused { opcode, status } => ClientError::Refused { opcode: *opcode, status: *status },
            ClientError::HelloRefused(status) => ClientError::HelloRefused(*status),
            ClientError::SessionLimit { kind, limit } => ClientError::SessionLimit { kind: *kind, limit: *limit },
            ClientError::SessionLost => ClientError::SessionLost,
            ClientError::SpacesChanged(what) => ClientError::SpacesChanged(what.clone()),
            ClientError::DatagramRefused(status) => ClientError::DatagramRefused(*status),
            ClientError::Closed => ClientError::Closed,
            ClientError::Random => ClientError::Random,
            ClientError::CloseUnconfirmed { waited_ms } => ClientError::CloseUnconfirmed { waited_ms: *waited_ms },
            ClientError::MissingResult(index) => ClientError::MissingResult(*index),
            ClientError::Protocol(error) => ClientError::Protocol(*error),
            ClientError::InvalidHello(what) => ClientError::InvalidHello(what.clone()),
            ClientError::BadExtents(error) => ClientError::BadExtents(*error),
            ClientError::TooLarge(bytes) => ClientError::TooLarge(*bytes),
            ClientError::Empty => ClientError::Empty,
            ClientError::WindowFull(requests) => ClientError::WindowFull(*requests),
            ClientError::NoSuchRegion { name, available } => {
                ClientError::NoSuchRegion { name: name.clone(), available: available.clone() }
            }
            ClientError::NoSuchNamespace { name, available } => {
                ClientError::NoSuchNamespace { name: name.clone(), available: available.clone() }
            }
            ClientError::PartialBlock { len, block_bytes } => {
                ClientError::PartialBlock { len: *len, block_bytes: *block_bytes }
            }
            ClientError::Unaligned { what, offset, len, block_bytes } => {
                ClientError::Unaligned { what: what.clone(), offset: *offset, len: *len, block_bytes: *block_bytes }
            }
            ClientError::BeyondEnd { offset, len, size_bytes } => {
                ClientError::BeyondEnd { offset: *offset, len: *len, size_bytes: *size_bytes }
            }
            ClientError::OutsideRegion { opcode, offset, len, size_bytes } => {
                ClientError::OutsideRegion { opcode: *opcode, offset: *offset, len: *len, size_bytes: *size_bytes }
            }
            ClientError::Setting(text) => ClientError::Setting(text.clone()),
        }
    }
}

fn range_end(offset: u64, len: u64, size_bytes: Option<u64>) -> String {
    match (offset.checked_add(len), size_bytes) {
        (Some(end), Some(size)) => format!("it ends at {end}, past the end of the {size}-byte region"),
        _ => "its end would lie past 2^64".to_string(),
    }
}

fn timed_out_message(attempts: u32) -> String {
    if attempts == 0 {
        // Failed with the others when the target stopped answering, before its turn to leave.
        "not sent: the target stopped answering the requests before it (down or unreachable); it never ran, so it \
         may be sent again"
            .to_string()
    } else {
        format!("no answer after {attempts} attempt(s): the target is down or unreachable")
    }
}

fn session_limit_message(kind: SessionLimitKind, limit: u32) -> String {
    match kind {
        SessionLimitKind::Address => format!(
            "this address already holds {limit} active sessions on the target worker this socket reached \
             (max_sessions_per_address = {limit}, counted on each worker apart; the kernel picks each \
             socket's worker); use fewer sessions, close idle clients, or raise max_sessions_per_address \
             or the target's workers"
        ),
        SessionLimitKind::Tenant => format!(
            "this tenant already holds its {limit} sessions over the whole target (its --max-sessions); \
             use fewer sessions, close idle clients, or raise it (`netdam-target tenant set NAME --max-sessions N`)"
        ),
    }
}

fn hello_refusal(status: Status) -> String {
    match status {
        Status::Busy => "every session slot is held by an active session; try again later \
                         (`netdam stat` shows the target's session counts)"
            .to_string(),
        Status::SessionLimit => "this host or this tenant already holds as many sessions as the target allows \
                                 (max_sessions_per_address for one address, or the tenant's --max-sessions); \
                                 close idle clients or raise the limit"
            .to_string(),
        Status::Retry => "it kept answering with a new cookie; is the initiator's source address changing?".to_string(),
        Status::Unauthenticated => "unauthenticated: the target did not accept the tenant key: none was given \
                                    to a target that requires one, or the key is unknown there, wrong or \
                                    rotated (a running target takes a new tenant or key within a second \
                                    of its command); give the tenant's key file (`netdam-target tenant create NAME` \
                                    writes one): --key FILE or NETDAM_KEY for `netdam`, key= for the fio \
                                    engine, SessionConfig::credentials (keys::resolve) for the library; \
                                    --key none for a target with auth = \"none\""
            .to_string(),
        other => other.to_string(),
    }
}

/// What a refusal of a whole datagram usually means. Sessionless requests (PING, STAT) meet it
/// on a target that requires tenants: STAT needs an authenticated tenant's key.
fn datagram_refusal_hint(status: Status) -> &'static str {
    match status {
        Status::Unauthenticated => {
            " (the target requires a tenant's key for this: --key FILE or NETDAM_KEY for `netdam`, \
             SessionConfig::credentials for the library; `netdam-target tenant create NAME` writes one, \
             and a target started with its embedded default wrote the default tenant's)"
        }
        _ => "",
    }
}

/// What a refusal's status usually means for this opcode, and what to do, where the status alone
/// does not say (the target's answer carries only the status).
fn refusal_hint(opcode: u8, status: Status) -> &'static str {
    let atomic = [Opcode::Cas as u8, Opcode::FetchAdd as u8].contains(&opcode);
    match status {
        Status::PermissionDenied if opcode == Opcode::Stat as u8 => {
            " (STAT is for a tenant that holds admin: `netdam-target grant NAME all admin` gives it; \
             `netdam-target tenant list` shows the grants)"
        }
        Status::PermissionDenied if [Opcode::Encrypt as u8, Opcode::Decrypt as u8].contains(&opcode) => {
            " (ENCRYPT and DECRYPT need a grant on the key slot (`netdam-target grant NAME key:SLOT \
             encrypt,decrypt`) and read and write on the range's region (write on a destination's): \
             `netdam-target tenant list` shows the grants)"
        }
        Status::PermissionDenied => {
            " (the tenant of this key holds no grant for this on this space or range: \
             `netdam-target tenant list` shows its grants, `netdam-target grant` adds one)"
        }
        Status::NoSuchKey => {
            " (the running target holds no key in this slot: `netdam-target crypto-key list` shows the slots; a \
             slot created after the target started serves from its next start, and a deleted one serves no more)"
        }
        Status::AuthFailed if opcode == Opcode::Decrypt as u8 => {
            " (the bytes did not open: the ciphertext, its seal, the associated data (--aad) or the key slot \
             differ from what ENCRYPT sealed; nothing was written)"
        }
        Status::NotSupported if opcode == Opcode::BlockStatus as u8 => {
            " (this namespace cannot tell holes from data: only a namespace of backend `file` reports its \
             allocation; `netdam namespaces --json` shows `reports_allocation`)"
        }
        Status::Unaligned if atomic => " (atomics work on 8-byte words: give an offset that is a multiple of 8)",
        Status::Unaligned => " (lane-wise instructions need an offset that is a multiple of the lane size)",
        Status::UnknownOpcode | Status::NotSupported if Opcode::from_u8(opcode).is_none() => {
            " (the target does not run this extension: enable it with extensions = [...] in its configuration)"
        }
        _ => "",
    }
}

fn opcode_name(opcode: u8) -> String {
    if opcode == netdam_isa::extension::reduce::REDUCE_OPCODE {
        return "REDUCE (extension)".to_string();
    }
    Opcode::from_u8(opcode).map(|known| known.name().to_uppercase()).unwrap_or_else(|| format!("opcode {opcode:#04x}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refusal whose status alone leaves the user guessing says what it usually means.
    #[test]
    fn refusals_carry_what_to_do() {
        let refused = |opcode: u8, status| ClientError::Refused { opcode, status }.to_string();
        assert!(refused(Opcode::Read as u8, Status::PermissionDenied).contains("netdam-target grant"));
        assert!(
            refused(Opcode::Stat as u8, Status::PermissionDenied).contains("grant NAME all admin"),
            "STAT needs admin"
        );
        assert!(
            refused(Opcode::Decrypt as u8, Status::PermissionDenied).contains("grant NAME key:SLOT encrypt,decrypt"),
            "crypto needs the key slot"
        );
        assert!(refused(Opcode::Encrypt as u8, Status::NoSuchKey).contains("serves from its next start"));
        assert!(refused(Opcode::FetchAdd as u8, Status::Unaligned).contains("multiple of 8"));
        assert!(refused(Opcode::Decrypt as u8, Status::AuthFailed).contains("(--aad)"));
        assert!(refused(Opcode::BlockStatus as u8, Status::NotSupported).contains("of backend `file` reports"));
        assert!(refused(Opcode::Vadd as u8, Status::Unaligned).contains("lane size"));
        let extension = refused(netdam_isa::extension::reduce::REDUCE_OPCODE, Status::UnknownOpcode);
        assert!(
            extension.starts_with("target refused REDUCE (extension): unknown_opcode")
                && extension.contains("extensions = [")
        );
        assert_eq!(refused(Opcode::Read as u8, Status::OutOfRange), "target refused READ: out_of_range");
        let whole = ClientError::DatagramRefused(Status::Unauthenticated).to_string();
        assert!(whole.starts_with("target refused the datagram: unauthenticated (") && whole.contains("--key FILE"));
        assert_eq!(ClientError::DatagramRefused(Status::Busy).to_string(), "target refused the datagram: busy");
    }
}
