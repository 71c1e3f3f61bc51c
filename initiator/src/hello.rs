//! Reading the answers to the session's control requests: the two-step HELLO (run by
//! [`crate::session::Session`] for every driver) and CLOSE.
//!
//! A first HELLO carries no cookie and is answered `retry` with one; the HELLO that echoes it
//! from the same address and port gets the session. A cookie can expire, or the target restart
//! with a new secret, between the two: the answer is then another `retry`, and the exchange
//! goes on with the new cookie, a bounded number of times.

use netdam_isa::control::{decode_hello_answer, decode_session_limit, Cookie, HelloAnswer, COOKIE_LEN};
use netdam_isa::limits::{MAX_BLOCK_BYTES, MIN_DATAGRAM_BYTES};
use netdam_isa::Status;

use crate::error::ClientError;
use crate::session::Reply;

/// HELLOs one exchange sends at most before it gives up.
pub const HELLO_ROUNDS: usize = 4;

/// What a HELLO's answer says to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HelloStep {
    /// Say HELLO again, echoing this cookie.
    Retry(Cookie),
    /// The session is open.
    Established(HelloAnswer),
}

/// Reads the answer to a datagram whose only instruction was HELLO.
pub fn hello_step(reply: &Reply) -> Result<HelloStep, ClientError> {
    let response = reply.response();
    if response.status() == Status::Unauthenticated {
        return Err(ClientError::HelloRefused(Status::Unauthenticated));
    }
    if response.status() != Status::Ok {
        return Err(ClientError::DatagramRefused(response.status()));
    }
    let result = response.results().next().ok_or(ClientError::MissingResult(0))?;
    match result.status {
        Status::Ok => Ok(HelloStep::Established(decode_hello_answer(result.data)?)),
        Status::Retry => {
            let cookie: Cookie = result.data.try_into().map_err(|_| ClientError::MissingResult(0))?;
            debug_assert_eq!(cookie.len(), COOKIE_LEN);
            Ok(HelloStep::Retry(cookie))
        }
        // Which limit, where the target says (a target from before the detail does not).
        Status::SessionLimit => Err(match decode_session_limit(result.data) {
            Some((kind, limit)) => ClientError::SessionLimit { kind, limit },
            None => ClientError::HelloRefused(Status::SessionLimit),
        }),
        Status::Busy | Status::Unauthenticated => Err(ClientError::HelloRefused(result.status)),
        status => Err(ClientError::Refused { opcode: result.opcode, status }),
    }
}

/// Refuses a HELLO answer with a value no netdam target sends, before anything is sized or
/// divided by it: a negotiated datagram size below the protocol's least or above what this
/// session offered (`offered`), no instruction per datagram, a namespace block size that is not
/// a power of two from 512 to [`MAX_BLOCK_BYTES`], or a namespace too large to address in
/// bytes. Whoever can send to the initiator's port can answer a HELLO of a session without a
/// tenant key, and a block size of 0 would otherwise be divided by.
pub fn check_hello_answer(answer: &HelloAnswer, offered: u32) -> Result<(), ClientError> {
    let invalid = |message: String| Err(ClientError::InvalidHello(message));
    if !(MIN_DATAGRAM_BYTES as u32..=offered.max(MIN_DATAGRAM_BYTES as u32)).contains(&answer.max_datagram_bytes) {
        return invalid(format!(
            "a datagram size of {} bytes, where {MIN_DATAGRAM_BYTES} to the {offered} offered are possible",
            answer.max_datagram_bytes
        ));
    }
    if answer.max_instructions == 0 {
        return invalid("no instruction allowed per datagram".into());
    }
    for namespace in &answer.namespaces {
        let block = namespace.block_bytes;
        if !block.is_power_of_two() || !(512..=MAX_BLOCK_BYTES).contains(&block) {
            return invalid(format!(
                "namespace \"{}\" (id {}) has a block size of {block} bytes, not a power of two from 512 to {MAX_BLOCK_BYTES}",
                namespace.name, namespace.id
            ));
        }
        if namespace.capacity_blocks.checked_mul(u64::from(block)).is_none() {
            return invalid(format!(
                "namespace \"{}\" (id {}) has {} blocks of {block} bytes, more bytes than 64 bits count",
                namespace.name, namespace.id, namespace.capacity_blocks
            ));
        }
    }
    Ok(())
}

/// Whether the answer to a CLOSE says the session is gone: `ok`, or `no_session` (the target
/// had already forgotten it). Anything else (an older target that does not know CLOSE, say)
/// leaves it to expire there.
pub fn close_outcome(result: Result<Reply, ClientError>) -> Result<(), ClientError> {
    let reply = result?;
    match reply.response().status() {
        Status::NoSession => Ok(()),
        Status::Ok => reply.data(0).map(|_| ()),
        status => Err(ClientError::DatagramRefused(status)),
    }
}

#[cfg(test)]
mod tests {
    use netdam_isa::control::NamespaceInfo;

    use super::*;

    fn answer(max_datagram_bytes: u32, block_bytes: u32, capacity_blocks: u64) -> HelloAnswer {
        HelloAnswer {
            session: 1,
            max_datagram_bytes,
            max_instructions: 64,
            namespaces: vec![NamespaceInfo {
                id: 3,
                name: "disk".into(),
                block_bytes,
                capacity_blocks,
                reports_allocation: false,
            }],
            ..HelloAnswer::default()
        }
    }

    fn refusal(answer: &HelloAnswer, offered: u32) -> String {
        match check_hello_answer(answer, offered) {
            Err(error @ ClientError::InvalidHello(_)) => error.to_string(),
            other => panic!("expected InvalidHello, got {other:?}"),
        }
    }

    #[test]
    fn a_hello_answer_out_of_what_a_target_sends_is_refused_naming_the_value() {
        assert!(check_hello_answer(&answer(9000, 4096, 1 << 20), 9000).is_ok());
        assert!(
            check_hello_answer(&answer(4096, 512, u64::MAX / 512), 9000).is_ok(),
            "the least size, the most blocks"
        );
        assert!(refusal(&answer(0, 4096, 1), 9000).contains("datagram size of 0 bytes"));
        assert!(refusal(&answer(9001, 4096, 1), 9000).contains("the 9000 offered"), "more than offered");
        let zero = refusal(&answer(9000, 0, 1), 9000);
        assert!(zero.contains("namespace \"disk\" (id 3) has a block size of 0 bytes"), "{zero}");
        assert!(refusal(&answer(9000, 3000, 1), 9000).contains("3000"), "not a power of two");
        assert!(refusal(&answer(9000, 16384, 1), 9000).contains("16384"), "larger than a target's blocks");
        assert!(refusal(&answer(9000, 4096, u64::MAX), 9000).contains("more bytes than 64 bits"));
        let mut none = answer(9000, 4096, 1);
        none.max_instructions = 0;
        assert!(refusal(&none, 9000).contains("no instruction"));
    }
}
