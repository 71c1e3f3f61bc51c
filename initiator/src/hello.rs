//! Reading the answers to the session's control requests: the two-step HELLO (run by
//! [`crate::session::Session`] for every driver) and CLOSE.
//!
//! A first HELLO carries no cookie and is answered `retry` with one; the HELLO that echoes it
//! from the same address and port gets the session. A cookie can expire, or the target restart
//! with a new secret, between the two: the answer is then another `retry`, and the exchange
//! goes on with the new cookie, a bounded number of times.

use netdam_isa::control::{decode_hello_answer, decode_session_limit, Cookie, HelloAnswer, COOKIE_LEN};
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
