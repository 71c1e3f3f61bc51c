//! The initiator's session as a sans-IO state machine: sequencing, requests in flight,
//! retransmission of idempotent requests, completion.
//!
//! It never reads a clock or touches a socket: the driver hands it `now` and datagrams and asks
//! it what to send and when to wake up (`poll_transmit`, `poll_timeout`, `handle_timeout`).

use std::collections::VecDeque;

use netdam_isa::limits::{DEFAULT_DATAGRAM_BYTES, MAX_IN_FLIGHT};
use netdam_isa::wire::{InstructionResult, RequestBuilder, Response};
use netdam_isa::{Duration, Instant, Status};

use crate::error::ClientError;
use crate::op::Op;

/// Settings of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionConfig {
    /// Requests in flight at once.
    pub max_in_flight: usize,
    /// Wait before the first retransmission.
    pub initial_rto: Duration,
    /// Ceiling of the exponential back-off.
    pub max_rto: Duration,
    /// Transmissions of one request before it fails.
    pub max_attempts: u32,
    /// Largest datagram sent or expected back.
    pub max_datagram_bytes: usize,
}

impl Default for SessionConfig {
    fn default() -> SessionConfig {
        SessionConfig {
            max_in_flight: 32,
            // A persistent write waits for msync, which takes milliseconds on a disk; retransmitting
            // sooner only adds load. The RTT estimator of the congestion-control work refines this.
            initial_rto: Duration::from_millis(200),
            max_rto: Duration::from_millis(2_000),
            max_attempts: 5,
            max_datagram_bytes: DEFAULT_DATAGRAM_BYTES,
        }
    }
}

/// An answered request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    bytes: Vec<u8>,
    /// Time from the last transmission to the answer.
    pub rtt: Duration,
    /// Transmissions it took.
    pub attempts: u32,
}

impl Reply {
    /// The decoded response (checked when it arrived).
    pub fn response(&self) -> Response<'_> {
        Response::parse(&self.bytes).expect("replies are checked on arrival")
    }

    /// The raw response datagram.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Data of result `index`, or the error its status (or the datagram's) says.
    pub fn data(&self, index: usize) -> Result<&[u8], ClientError> {
        let response = self.response();
        if response.status() != Status::Ok {
            return Err(ClientError::DatagramRefused(response.status()));
        }
        let result = response.results().nth(index).ok_or(ClientError::MissingResult(index))?;
        match result.status {
            Status::Ok => Ok(result.data),
            status => Err(ClientError::Refused { opcode: result.opcode, status }),
        }
    }

    /// Every result's status and data, failing on a datagram-level status only.
    pub fn results(&self) -> Result<Vec<InstructionResult<'_>>, ClientError> {
        let response = self.response();
        if response.status() != Status::Ok {
            return Err(ClientError::DatagramRefused(response.status()));
        }
        Ok(response.results().collect())
    }
}

/// A finished request: its token and outcome.
#[derive(Debug)]
pub struct Completion {
    /// The token given to `submit`.
    pub token: u64,
    /// The answer, or why there is none.
    pub result: Result<Reply, ClientError>,
}

#[derive(Debug)]
struct InFlight {
    token: u64,
    sequence: u64,
    datagram: Vec<u8>,
    idempotent: bool,
    attempts: u32,
    rto: Duration,
    /// When the latest transmission left; None while queued for (re)transmission.
    sent_at: Option<Instant>,
}

/// Counters of one session.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionStats {
    /// Requests submitted.
    pub submitted: u64,
    /// Datagrams sent, retransmissions included.
    pub transmissions: u64,
    /// Retransmissions.
    pub retransmissions: u64,
    /// Requests that failed after their last attempt.
    pub timeouts: u64,
    /// Datagrams received that answered nothing in flight (late duplicates) or did not parse.
    pub ignored: u64,
}

/// One session with a target.
#[derive(Debug)]
pub struct Session {
    config: SessionConfig,
    session_id: u32,
    next_sequence: u64,
    in_flight: Vec<InFlight>,
    transmit_queue: VecDeque<u64>,
    completions: VecDeque<Completion>,
    stats: SessionStats,
    /// Encoding space of the negotiated datagram size, reused so a request costs only its bytes.
    scratch: Vec<u8>,
}

impl Session {
    /// A session with id `session_id` (0 before HELLO has assigned one).
    pub fn new(config: SessionConfig, session_id: u32) -> Session {
        assert!((1..=MAX_IN_FLIGHT).contains(&config.max_in_flight), "max_in_flight must be 1..={MAX_IN_FLIGHT}");
        Session {
            config,
            session_id,
            next_sequence: 1,
            in_flight: Vec::with_capacity(config.max_in_flight),
            transmit_queue: VecDeque::with_capacity(config.max_in_flight),
            completions: VecDeque::new(),
            stats: SessionStats::default(),
            scratch: Vec::new(),
        }
    }

    /// Adopts the id and datagram size HELLO negotiated.
    pub fn establish(&mut self, session_id: u32, max_datagram_bytes: usize) {
        self.session_id = session_id;
        self.config.max_datagram_bytes = max_datagram_bytes;
    }

    /// The settings in force.
    pub fn config(&self) -> &SessionConfig {
        &self.config
    }

    /// Counters so far.
    pub fn stats(&self) -> SessionStats {
        self.stats
    }

    /// Requests sent and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Whether another request may be submitted now.
    pub fn has_room(&self) -> bool {
        self.in_flight.len() < self.config.max_in_flight
    }

    /// Queues one datagram carrying `ops`; its completion will carry `token`.
    pub fn submit(&mut self, ops: &[Op], token: u64) -> Result<(), ClientError> {
        if !self.has_room() {
            return Err(ClientError::WindowFull(self.config.max_in_flight));
        }
        let sequence = self.next_sequence;
        self.scratch.resize(self.config.max_datagram_bytes, 0);
        let mut builder = RequestBuilder::new(&mut self.scratch, self.session_id, sequence)
            .map_err(|_| ClientError::TooLarge(self.config.max_datagram_bytes))?;
        for op in ops {
            builder.push(&op.as_instruction()).map_err(|_| ClientError::TooLarge(self.config.max_datagram_bytes))?;
        }
        if builder.is_empty() {
            return Err(ClientError::Empty);
        }
        let len = builder.finish();
        let datagram = self.scratch[..len].to_vec();
        self.next_sequence += 1;
        self.in_flight.push(InFlight {
            token,
            sequence,
            datagram,
            idempotent: ops.iter().all(Op::is_idempotent),
            attempts: 0,
            rto: self.config.initial_rto,
            sent_at: None,
        });
        self.transmit_queue.push_back(sequence);
        self.stats.submitted += 1;
        Ok(())
    }

    /// The next datagram to send, if any; the caller sends it now.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<&[u8]> {
        while let Some(sequence) = self.transmit_queue.pop_front() {
            let Some(index) = self.in_flight.iter().position(|request| request.sequence == sequence) else {
                continue;
            };
            let request = &mut self.in_flight[index];
            request.attempts += 1;
            request.sent_at = Some(now);
            self.stats.transmissions += 1;
            if request.attempts > 1 {
                self.stats.retransmissions += 1;
            }
            return Some(&self.in_flight[index].datagram);
        }
        None
    }

    /// Takes a received datagram.
    pub fn handle_datagram(&mut self, now: Instant, bytes: &[u8]) {
        let Ok(response) = Response::parse(bytes) else {
            self.stats.ignored += 1;
            return;
        };
        let header = response.header;
        let found = self.in_flight.iter().position(|request| {
            request.sequence == header.sequence && (header.session == self.session_id || header.session == 0)
        });
        let Some(index) = found else {
            self.stats.ignored += 1;
            return;
        };
        let request = self.in_flight.swap_remove(index);
        let rtt = request.sent_at.map(|sent| now.saturating_since(sent)).unwrap_or(Duration::ZERO);
        self.completions.push_back(Completion {
            token: request.token,
            result: Ok(Reply { bytes: bytes.to_vec(), rtt, attempts: request.attempts }),
        });
    }

    /// When `handle_timeout` should next be called, if anything is in flight.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.in_flight.iter().filter_map(|request| request.sent_at.map(|sent| sent + request.rto)).min()
    }

    /// Retransmits idempotent requests whose time is up, and fails those out of attempts.
    pub fn handle_timeout(&mut self, now: Instant) {
        let mut index = 0;
        while index < self.in_flight.len() {
            let request = &mut self.in_flight[index];
            let expired = request.sent_at.is_some_and(|sent| sent + request.rto <= now);
            if !expired {
                index += 1;
                continue;
            }
            if request.idempotent && request.attempts < self.config.max_attempts {
                request.rto = request.rto.doubled().min(self.config.max_rto);
                request.sent_at = None;
                self.transmit_queue.push_back(request.sequence);
                index += 1;
                continue;
            }
            let request = self.in_flight.swap_remove(index);
            self.stats.timeouts += 1;
            let error = if request.idempotent {
                ClientError::TimedOut { attempts: request.attempts }
            } else {
                ClientError::OutcomeUnknown { attempts: request.attempts }
            };
            self.completions.push_back(Completion { token: request.token, result: Err(error) });
        }
    }

    /// The next finished request, if any.
    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.completions.pop_front()
    }
}
