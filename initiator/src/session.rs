//! The initiator's session as a sans-IO state machine: sequencing, the bound on requests in
//! flight, congestion control (Swift), retransmission with an RTT-based timeout, BUSY back-off,
//! and completion.
//!
//! It never reads a clock or touches a socket: the driver hands it `now` and datagrams and asks
//! what to send and when to wake up (`poll_transmit`, `poll_timeout`, `handle_timeout`).
//!
//! Every request may be retransmitted: the target's replay window answers a retransmitted
//! non-idempotent request from its stored answer instead of executing it twice.
//!
//! The session also says HELLO itself ([`Session::start_hello`]): a cookie first, then the
//! session. When the target answers `no_session` (it restarted, or the session expired or was
//! evicted), the session says HELLO again and sends the request once more in the new session
//! when that is safe: when it is idempotent, or when the transmission answered `no_session` was
//! its only one (the target executes nothing for a session it does not know). A request whose
//! earlier transmission may have run fails with `SessionLost`, also when the new target happens
//! to give the lost session's id again. Requests submitted meanwhile wait for the new session.
//! While the target restarts its port refuses: once a session has existed, the driver counts
//! refusals as lost datagrams for `reconnect_patience` ([`Session::handle_refused`]).

use std::collections::VecDeque;
use std::sync::Arc;

use netdam_auth::{Credentials, HelloAuth, SessionKeys, TenantKey, TRAILER_BYTES};
use netdam_isa::control::{Cookie, HelloAnswer, NamespaceInfo, RegionInfo, NO_COOKIE};
use netdam_isa::control::{HELLO_AUTH_ENCRYPT, HELLO_AUTH_LEN, HELLO_AUTH_MAC};
use netdam_isa::limits::{DEFAULT_DATAGRAM_BYTES, MAX_IN_FLIGHT, REPLAY_WINDOW};
use netdam_isa::wire::{
    mark_sealed, peek_datagram_status, peek_is_encrypted, peek_is_sealed, peek_session_sequence, set_request_session,
    Instruction, InstructionResult, RequestBuilder, Response, FLAG_ENCRYPTED, FLAG_SEALED,
};
use netdam_isa::{Duration, Instant, Opcode, Status};

use crate::error::ClientError;
use crate::hello::{check_hello_answer, hello_step, HelloStep, HELLO_ROUNDS};
use crate::op::Op;
use crate::swift::{hops_from_ttl, Swift, SwiftConfig, SwiftMetrics};

/// Datagram buffers a session keeps for reuse (those of finished requests, and replies given
/// back): as many as requests may be in flight, so that a session in steady state allocates
/// nothing per request.
const SPARE_BUFFERS_MAX: usize = MAX_IN_FLIGHT;

/// Capacity of a request's own buffer at the least (`Session::encode`): the answer to a small
/// request (a READ of up to ~200 bytes, an atomic, a write's acknowledgement) then replaces it in
/// place. A session whose answers are larger sizes its buffers by the last one
/// (`Session::answer_bytes`), so that a run of 4 KiB reads does not grow each buffer again (a
/// second allocation and a copy per request, on the way from the answer to its caller).
const SMALL_ANSWER_BYTES: usize = 256;

/// Settings of a session.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SessionConfig {
    /// Requests submitted and not yet answered, at most (the application's bound; congestion
    /// control decides how many of them are on the wire).
    pub max_in_flight: usize,
    /// Retransmission timeout before the first RTT sample.
    pub initial_rto: Duration,
    /// Floor of the retransmission timeout.
    pub min_rto: Duration,
    /// Floor of the retransmission timeout of requests with block instructions: a device's
    /// latency has tails of milliseconds that no smoothed round trip foresees, and a block
    /// request resent while its device works only adds a datagram and shrinks the window
    /// (the target answers the duplicate of a request still in progress with an in-progress
    /// notice, and executes nothing). Keep it at least twice the target's notice interval
    /// (5 ms), so that notices restart the timer before it fires.
    pub min_block_rto: Duration,
    /// Floor of a HELLO's retransmission timeout (every HELLO's: the first one's too, where
    /// `initial_rto` is shorter). The second HELLO is timed by the cookie's round trip (half a
    /// millisecond or less), yet its answer may take longer: the target creates the session
    /// then, and a target that has just started pauses for milliseconds now and then
    /// (docs/DECISIONS.md, "Millisecond pauses on this VM come from below the guest"), so HELLOs
    /// were resent at the start of sessions that lost nothing. HELLOs go once per session (and
    /// again after a lost one): a lost HELLO costs this much, doubled for each loss in a row.
    pub min_hello_rto: Duration,
    /// Ceiling of the retransmission timeout and its back-off.
    pub max_rto: Duration,
    /// Transmissions of one request before it may fail.
    pub max_attempts: u32,
    /// Least time from a request's first transmission to its failure: a request that has used
    /// its attempts sooner is sent again (its back-off capped at `max_rto`) until this much
    /// time has passed. A
    /// storage target may stall (a device flushing, a loaded machine) for longer than the
    /// attempts' back-off adds up to (about 127 ms from a 500 µs timeout), and failing a
    /// request then fails the user's I/O for a pause, not for a dead target (a refusal fails at
    /// once before any session, and after `reconnect_patience` once there was one).
    pub min_patience: Duration,
    /// How long after its first transmission a request's in-progress notices keep its timer
    /// from firing (PROTOCOL.md, "In-progress notices"). Past it they are ignored, and the
    /// request, which the target has said it holds but not finished, fails at its next timeout:
    /// a device that never completes (or notices replayed by someone on the path) cannot keep a
    /// request waiting for ever.
    pub max_in_progress_wait: Duration,
    /// BUSY answers one request may get before it fails.
    pub max_busy_retries: u32,
    /// Largest datagram sent or expected back.
    pub max_datagram_bytes: usize,
    /// Swift settings; `None` sends up to `max_in_flight` with no congestion control.
    pub congestion: Option<SwiftConfig>,
    /// How long refusals (nothing listens at the target's port: the kernel answered ICMP port
    /// unreachable) count as lost datagrams, counted from the first refusal since the last
    /// answer, once a session has been established: a target that answered before and now
    /// refuses is most likely restarting, and its requests are retried (by their timeouts) in
    /// the session it will open again. Past it, or before any session, a refusal fails what is
    /// waiting (`NotListening`). Zero fails at once.
    pub reconnect_patience: Duration,
    /// How long a HELLO refused for want of a session (`busy`: the worker's slots are held by
    /// active sessions; `session_limit`: the address's or the tenant's share is) is asked again,
    /// at growing intervals, before the requests waiting for the session fail with the refusal:
    /// other clients' sessions end (a one-shot command holds one for milliseconds). Zero, the
    /// default, fails at once: a program that opens many sessions of its own (a volume, a fio
    /// job) would otherwise wait to take the place of its own idle sessions (an idle session
    /// of the address gives its slot to a newcomer after a second), and lose them to the next
    /// HELLO, rather than hear that it asked for more than the target allows. The `netdam`
    /// command line waits 5 s (`COMMAND_SESSION_WAIT`).
    pub session_wait: Duration,
    /// The tenant's key: HELLO proves it and every datagram of the session is sealed with a MAC
    /// (PROTOCOL.md, "Authentication"). `None` for a target with `auth = "none"`.
    pub credentials: Option<Credentials>,
    /// With credentials: encrypt the body of every datagram of the session, both ways (HELLO
    /// method 2), besides the MAC.
    pub encrypt: bool,
}

impl Default for SessionConfig {
    fn default() -> SessionConfig {
        SessionConfig {
            max_in_flight: 32,
            initial_rto: Duration::from_millis(200),
            min_rto: Duration::from_micros(500),
            min_block_rto: Duration::from_millis(20),
            min_hello_rto: Duration::from_millis(20),
            max_rto: Duration::from_millis(2_000),
            max_attempts: 8,
            min_patience: Duration::from_millis(5_000),
            max_in_progress_wait: Duration::from_millis(30_000),
            max_busy_retries: 64,
            max_datagram_bytes: DEFAULT_DATAGRAM_BYTES,
            congestion: Some(SwiftConfig::default()),
            reconnect_patience: Duration::from_millis(5_000),
            session_wait: Duration::ZERO,
            credentials: None,
            encrypt: false,
        }
    }
}

/// An answered request: the answer datagram, or this caller's share of one that answered
/// several callers' instructions together (see [`Reply::split`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    bytes: ReplyBytes,
    /// This reply's results: `first..first + count` of the datagram's.
    first: usize,
    count: usize,
    /// Time from the last transmission to the answer.
    pub rtt: Duration,
    /// Transmissions it took.
    pub attempts: u32,
}

/// An answer datagram held by one reply, or shared by the replies it was split into.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ReplyBytes {
    Owned(Datagram),
    Shared(Arc<Datagram>),
}

impl Reply {
    fn new(bytes: Datagram, rtt: Duration, attempts: u32) -> Reply {
        Reply { bytes: ReplyBytes::Owned(bytes), first: 0, count: usize::MAX, rtt, attempts }
    }

    fn datagram(&self) -> &Datagram {
        match &self.bytes {
            ReplyBytes::Owned(datagram) => datagram,
            ReplyBytes::Shared(datagram) => datagram,
        }
    }

    /// The decoded response (checked when it arrived): the whole datagram, whatever share of
    /// its results this reply has.
    pub fn response(&self) -> Response<'_> {
        // Every byte was checked when it arrived (a sealed answer opened: its MAC checked, its
        // trailer cut), and a reply's bytes never change: read again without checking them
        // once more. (Checking cost a CRC over the whole datagram each time: two per `data`
        // call, on each caller's share of a packed 8 KiB answer.)
        Response::parse_checked_before(self.datagram().as_slice())
    }

    /// The raw response datagram.
    pub fn bytes(&self) -> &[u8] {
        self.datagram().as_slice()
    }

    /// This reply's results, in order.
    pub fn result_iter(&self) -> impl Iterator<Item = InstructionResult<'_>> {
        self.shares(self.response())
    }

    /// This reply's share of `response`'s results (its own datagram, read once by the caller).
    fn shares<'a>(&self, response: Response<'a>) -> impl Iterator<Item = InstructionResult<'a>> {
        response.results().skip(self.first).take(self.count)
    }

    /// Data of result `index`, or the error its status (or the datagram's) says.
    pub fn data(&self, index: usize) -> Result<&[u8], ClientError> {
        let response = self.response();
        if response.status() != Status::Ok {
            return Err(ClientError::DatagramRefused(response.status()));
        }
        let result = self.shares(response).nth(index).ok_or(ClientError::MissingResult(index))?;
        match result.status {
            Status::Ok => Ok(result.data),
            status => Err(ClientError::Refused { opcode: result.opcode, status }),
        }
    }

    /// Every result, failing on a datagram-level status only.
    pub fn results(&self) -> Result<Vec<InstructionResult<'_>>, ClientError> {
        let response = self.response();
        if response.status() != Status::Ok {
            return Err(ClientError::DatagramRefused(response.status()));
        }
        Ok(self.shares(response).collect())
    }

    /// Splits the answer to a datagram that carried several callers' instructions back to
    /// back: one reply per caller, the k-th holding the next `counts[k]` results. The replies
    /// share the datagram (nothing is copied).
    pub fn split(self, counts: &[usize]) -> Vec<Reply> {
        let shared = match self.bytes {
            ReplyBytes::Owned(datagram) => Arc::new(datagram),
            ReplyBytes::Shared(datagram) => datagram,
        };
        let mut first = self.first;
        counts
            .iter()
            .map(|&count| {
                let reply = Reply {
                    bytes: ReplyBytes::Shared(shared.clone()),
                    first,
                    count,
                    rtt: self.rtt,
                    attempts: self.attempts,
                };
                first += count;
                reply
            })
            .collect()
    }
}

/// A datagram in a reusable buffer: the buffer keeps its full length (at least the datagram
/// size), so that reusing it never writes it over with zeroes first; `len` bytes are the datagram.
#[derive(Debug, Clone, Default)]
struct Datagram {
    buffer: Vec<u8>,
    len: usize,
}

/// Two datagrams are equal when their bytes are: what lies beyond `len` is spare room.
impl PartialEq for Datagram {
    fn eq(&self, other: &Datagram) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Datagram {}

impl Datagram {
    fn as_slice(&self) -> &[u8] {
        &self.buffer[..self.len]
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.buffer[..self.len]
    }

    /// Replaces the datagram with a copy of `bytes`, growing the buffer only if it is shorter.
    fn replace_with(&mut self, bytes: &[u8]) {
        if self.buffer.len() < bytes.len() {
            // Grown without zeroing what is overwritten next.
            self.buffer.clear();
            self.buffer.extend_from_slice(bytes);
        } else {
            self.buffer[..bytes.len()].copy_from_slice(bytes);
        }
        self.len = bytes.len();
    }
}

impl SessionConfig {
    /// Refuses settings a session cannot run with, naming the setting: a window outside
    /// 1..=[`MAX_IN_FLIGHT`] (the target's replay window covers no more), or encryption without
    /// a key. The clients call it before they build a [`Session`], whose constructor asserts the
    /// window; a program that builds one itself with a user's setting should call it too.
    pub fn check(&self) -> Result<(), ClientError> {
        self.check_window()?;
        check_encryption(self)
    }

    /// The window part of [`SessionConfig::check`], for a client that says no HELLO (a
    /// sessionless one), where encryption settings do not apply.
    pub fn check_window(&self) -> Result<(), ClientError> {
        if (1..=MAX_IN_FLIGHT).contains(&self.max_in_flight) {
            return Ok(());
        }
        Err(ClientError::Setting(format!(
            "max_in_flight is {}: requests in flight per session must be 1 to {MAX_IN_FLIGHT}",
            self.max_in_flight
        )))
    }
}

/// Whether a HELLO refusal is for want of a free slot, which other sessions' ending gives:
/// the exchange asks again for a while (`SessionConfig::session_wait`).
fn wants_a_free_slot(error: &ClientError) -> bool {
    matches!(error, ClientError::HelloRefused(Status::Busy | Status::SessionLimit) | ClientError::SessionLimit { .. })
}

/// Refuses a session that asks for encryption without a key to derive it from: it would go on
/// in the clear, which the caller asked not to.
pub(crate) fn check_encryption(config: &SessionConfig) -> Result<(), ClientError> {
    if config.encrypt && config.credentials.is_none() {
        return Err(ClientError::Setting(
            "--encrypt: encryption needs a tenant key, and none was given (--key FILE or NETDAM_KEY; a \
             target with auth = \"none\" cannot encrypt): without one the session would be in the clear"
                .into(),
        ));
    }
    Ok(())
}

/// Seals an encoded request of session `session_id` (not one waiting for its session, id 0)
/// with the session's request key and the next counter, when the session is authenticated.
fn seal_request(keys: Option<&SessionKeys>, counter: &mut u64, session_id: u32, datagram: &mut Datagram) {
    let Some(keys) = keys else { return };
    if session_id == 0 {
        return;
    }
    mark_sealed(datagram.as_mut_slice());
    let sealed = netdam_auth::trailer::seal(&keys.request, *counter, &mut datagram.buffer, datagram.len)
        .expect("request buffers keep room for the trailer");
    *counter += 1;
    datagram.len = sealed;
}

/// A finished request: its token and outcome.
#[derive(Debug)]
pub struct Completion {
    /// The token given to `submit`.
    pub token: u64,
    /// The answer, or why there is none.
    pub result: Result<Reply, ClientError>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Waiting for a session: the target lost the one it was sent in, or HELLO is under way.
    Parked,
    /// Queued for (re)transmission.
    Waiting,
    /// On the wire; retransmit at `deadline`.
    Sent { deadline: Instant },
    /// Answered BUSY: send again at `until`.
    Held { until: Instant },
}

/// Whose request it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// Submitted by the driver: completes through `poll_completion`.
    Caller,
    /// The session's own HELLO.
    Hello,
}

#[derive(Debug)]
struct Request {
    origin: Origin,
    token: u64,
    /// The session id its datagram carries: its answer echoes it, even after the session
    /// changed (a target that lost the session answers `no_session` under the old id).
    session_id: u32,
    sequence: u64,
    datagram: Datagram,
    idempotent: bool,
    /// Whose service time its timeout allows for.
    kind: ServiceKind,
    attempts: u32,
    busy_retries: u32,
    state: State,
    /// When the latest transmission left.
    sent_at: Instant,
    /// When the first transmission left (what `min_patience` counts from); a BUSY answer,
    /// which gives the attempt back, does not restart it.
    first_sent_at: Option<Instant>,
    /// Whether the target has said it holds the request (an in-progress notice was heeded).
    noticed: bool,
    /// Whether an instruction of it names a region or namespace (all but PING, STAT, CLOSE and
    /// HELLO): such a request fails once the target's spaces changed (`spaces_changed`).
    addresses_space: bool,
}

/// What executes a request at the target, and so how long its service takes: memory answers
/// in microseconds, a block device in up to milliseconds when it is loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ServiceKind {
    Memory = 0,
    Block = 1,
}

/// The retransmission timeouts: round trips are smoothed per kind of request, each with its
/// variance, so a block request's timeout allows for the service time its device takes (the
/// target reports it in every answer, and it is in that kind's round trips) and a memory
/// request's does not wait for a disk. A session that mixes memory requests with block requests
/// to a loaded disk would otherwise time its block requests by round trips that memory requests
/// keep short, and resend them while the disk works. A session of one kind times as before.
#[derive(Debug, Clone, Copy, Default)]
struct Timeouts {
    by_kind: [RttEstimator; 2],
}

impl Timeouts {
    fn update(&mut self, kind: ServiceKind, rtt: Duration) {
        self.by_kind[kind as usize].update(rtt);
    }

    /// The timeout of a request of `kind`: the initial one until that kind has been answered.
    fn rto(&self, kind: ServiceKind, config: &SessionConfig) -> Duration {
        let floor = match kind {
            ServiceKind::Memory => config.min_rto,
            ServiceKind::Block => config.min_block_rto.max(config.min_rto),
        };
        self.by_kind[kind as usize].allowance().unwrap_or(config.initial_rto).clamp(floor, config.max_rto)
    }

    /// The longer timeout of the kinds answered so far (the initial one before any answer).
    fn largest(&self, config: &SessionConfig) -> Duration {
        let learned = |kind: ServiceKind| self.by_kind[kind as usize].allowance().map(|_| self.rto(kind, config));
        learned(ServiceKind::Memory)
            .into_iter()
            .chain(learned(ServiceKind::Block))
            .max()
            .unwrap_or_else(|| self.rto(ServiceKind::Memory, config))
    }
}

/// A smoothed time and its variance (RFC 6298's estimator).
#[derive(Debug, Clone, Copy, Default)]
struct RttEstimator {
    smoothed_ns: Option<f64>,
    variance_ns: f64,
}

impl RttEstimator {
    fn update(&mut self, sample: Duration) {
        let sample = sample.as_nanos() as f64;
        match self.smoothed_ns {
            None => {
                self.smoothed_ns = Some(sample);
                self.variance_ns = sample / 2.0;
            }
            Some(smoothed) => {
                self.variance_ns = 0.75 * self.variance_ns + 0.25 * (smoothed - sample).abs();
                self.smoothed_ns = Some(0.875 * smoothed + 0.125 * sample);
            }
        }
    }

    /// The smoothed value plus four variances, once there is a sample.
    fn allowance(&self) -> Option<Duration> {
        self.smoothed_ns.map(|smoothed| Duration::from_nanos((smoothed + 4.0 * self.variance_ns) as u64))
    }
}

/// Counters and controller state of one session: a plain struct for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SessionStats {
    /// Requests submitted.
    pub submitted: u64,
    /// Datagrams sent, retransmissions included.
    pub transmissions: u64,
    /// Bytes of those datagrams (UDP payload, headers of the protocol included): what this
    /// session put on the wire, counted as it was handed over, not computed.
    pub bytes_transmitted: u64,
    /// Datagrams received, answers to nothing waiting and unparsable ones included.
    pub datagrams_received: u64,
    /// Bytes of those datagrams (UDP payload).
    pub bytes_received: u64,
    /// Trains: runs of this session's datagrams sent in one system call (`netdam_udp::Train`),
    /// counted by the client that sends them.
    pub trains: u64,
    /// Answers the client spun for instead of sleeping until they came (an async client's
    /// lone requests, `ClientPoll::Adaptive`), counted by that client.
    pub spun_for: u64,
    /// Retransmissions after a timeout.
    pub retransmissions: u64,
    /// Those of requests with block instructions: a block I/O resent because its answer came
    /// later than its timeout (the rest are memory and control requests, HELLO included).
    pub block_retransmissions: u64,
    /// Requests of the caller that failed after their last attempt (the session's own HELLOs
    /// are not counted).
    pub timeouts: u64,
    /// BUSY answers received.
    pub busy: u64,
    /// In-progress notices received: the target still executed a request (its block I/O was
    /// in flight) and said so, so its retransmission timer started again instead of firing.
    pub in_progress_notices: u64,
    /// Datagrams received that answered nothing waiting (late duplicates) or did not parse.
    pub ignored: u64,
    /// Times the target no longer knew the session and it said HELLO again.
    pub sessions_lost: u64,
    /// Whether the session holds an id a HELLO gave it that the target has not said it lost,
    /// and the target's port has not refused a datagram since it was last heard from (nothing
    /// listening there knows the session): open, as far as the initiator knows.
    pub open: bool,
    /// Smoothed RTT.
    pub smoothed_rtt: Duration,
    /// Current retransmission timeout of the slower kind of request learned so far (memory or
    /// block: each allows for its own service time).
    pub rto: Duration,
    /// Effective congestion window in requests (`max_in_flight` without congestion control).
    pub window: f64,
    /// Congestion controller state, when there is one.
    pub swift: Option<SwiftMetrics>,
}

/// One session with a target.
#[derive(Debug)]
pub struct Session {
    config: SessionConfig,
    session_id: u32,
    next_sequence: u64,
    requests: Vec<Request>,
    send_queue: VecDeque<u64>,
    completions: VecDeque<Completion>,
    /// Whole round trips, for the statistics.
    rtt: RttEstimator,
    /// What the retransmission timeouts are made of.
    timeouts: Timeouts,
    swift: Option<Swift>,
    stats: SessionStats,
    /// Datagram buffers of finished requests and recycled replies, reused (grown once to the
    /// negotiated datagram size) so that a request in steady state allocates nothing. At most
    /// [`SPARE_BUFFERS_MAX`].
    spare_buffers: Vec<Datagram>,
    /// Where a request is encoded when no spare buffer is left, before it is copied into a
    /// buffer of its own size (`encode`); of the datagram size once the first request grew it.
    scratch: Vec<u8>,
    /// The datagram size to ask HELLO for; `None` for a session that never says HELLO
    /// (sessionless PING and STAT).
    hello_size: Option<u32>,
    /// The HELLO exchange under way: the cookie to echo and the HELLOs sent so far.
    hello: Option<(Cookie, usize)>,
    /// Refusals for want of a session in the HELLO exchange under way, and when the first came
    /// (`SessionConfig::session_wait` counts from it).
    hello_refused: Option<(Instant, u32)>,
    /// How the last HELLO exchange ended, until the driver takes it.
    established: Option<Result<HelloAnswer, ClientError>>,
    /// Whether a HELLO exchange has ever succeeded: only then may a refusal be a restart.
    ever_established: bool,
    /// The regions and namespaces the first HELLO answer listed: the ids the caller was given.
    first_spaces: Option<(Vec<RegionInfo>, Vec<NamespaceInfo>)>,
    /// Set when a later HELLO answer listed them otherwise (`spaces_change`): every request
    /// that addresses a space fails with it from then on.
    spaces_changed: Option<String>,
    /// The first refusal since the last datagram received, while refusals count as loss.
    refused_since: Option<Instant>,
    /// When the target was last heard from (an answer that parsed).
    last_heard: Option<Instant>,
    /// When a request last ran out of attempts with nothing heard since its last transmission
    /// (`handle_timeout`: a second such failure, unheard since, means the target is silent).
    unanswered_failure: Option<Instant>,
    /// Keys of the session in use (an authenticated one), and of the one the HELLO under way
    /// will open.
    keys: Option<SessionKeys>,
    /// The proof the HELLO under way sent, from which the new session's keys are derived once
    /// its sealed answer names the session (the keys depend on its id).
    hello_proof: Option<(HelloAuth, TenantKey, Cookie)>,
    /// Those keys, with the session id they were derived for.
    hello_keys: Option<(u32, SessionKeys)>,
    /// Counter of the next datagram sealed: never reused under the session's request key.
    sealed: u64,
    /// Where an encrypted answer is decrypted.
    decrypted: Vec<u8>,
    /// Where an encrypted session's request is sealed for its transmission.
    transmit: Vec<u8>,
    /// The last TTL an answer reported (0: none yet).
    last_ttl: u8,
    /// Bytes of the last answer to a caller's request, trailer room included: what a request's
    /// own buffer is sized for (at least `SMALL_ANSWER_BYTES`), at most a datagram's.
    answer_bytes: usize,
}

impl Session {
    /// A session with id `session_id` (0 before HELLO has assigned one).
    pub fn new(mut config: SessionConfig, session_id: u32) -> Session {
        // Checked before: by the clients (`SessionConfig::check`) or by whoever built the config.
        assert!(
            (1..=MAX_IN_FLIGHT).contains(&config.max_in_flight),
            "max_in_flight must be 1..={MAX_IN_FLIGHT} (SessionConfig::check refuses it with an error)"
        );
        if config.credentials.is_some() {
            // Requests made before HELLO answers are sealed once it has: leave their trailer room.
            config.max_datagram_bytes -= TRAILER_BYTES;
        }
        Session {
            config,
            session_id,
            next_sequence: 1,
            requests: Vec::with_capacity(config.max_in_flight),
            send_queue: VecDeque::with_capacity(config.max_in_flight),
            completions: VecDeque::new(),
            rtt: RttEstimator::default(),
            timeouts: Timeouts::default(),
            swift: config.congestion.map(Swift::new),
            stats: SessionStats::default(),
            spare_buffers: Vec::new(),
            scratch: Vec::new(),
            hello_size: None,
            hello: None,
            hello_refused: None,
            established: None,
            ever_established: false,
            first_spaces: None,
            spaces_changed: None,
            refused_since: None,
            last_heard: None,
            unanswered_failure: None,
            keys: None,
            hello_proof: None,
            hello_keys: None,
            sealed: 0,
            decrypted: Vec::new(),
            transmit: Vec::new(),
            last_ttl: 0,
            answer_bytes: SMALL_ANSWER_BYTES,
        }
    }

    /// Tells the session that sending to or receiving from the target was refused (nothing
    /// listens at its port). Returns `true` when the refusal counts as lost datagrams (a session
    /// was established before and the refusals began less than `reconnect_patience` ago: the
    /// target is presumably restarting, and requests are retransmitted by their timeouts), or
    /// `false` when the driver should fail what is waiting with `NotListening`.
    pub fn handle_refused(&mut self, now: Instant) -> bool {
        if !self.ever_established || self.hello_size.is_none() {
            return false;
        }
        let since = *self.refused_since.get_or_insert(now);
        now.saturating_since(since) < self.config.reconnect_patience
    }

    /// Says HELLO asking for datagrams of `max_datagram_bytes`, and again whenever the target
    /// loses the session. Requests submitted before the session exists wait for it.
    pub fn start_hello(&mut self, max_datagram_bytes: u32) {
        self.hello_size = Some(max_datagram_bytes);
        self.begin_hello();
    }

    /// How the last HELLO exchange ended (the answer, with the target's regions and namespaces,
    /// or why it failed), once; `None` while none has ended since the last call.
    pub fn poll_established(&mut self) -> Option<Result<HelloAnswer, ClientError>> {
        self.established.take()
    }

    /// When the target was last heard from (any datagram of it taken: an answer, a notice),
    /// if ever.
    pub fn last_heard(&self) -> Option<Instant> {
        self.last_heard
    }

    /// When the longest-waiting request still outstanding first left, if one has (a walk over
    /// the window: for a caller that has found the target silent, not for the request path).
    pub fn oldest_first_sent(&self) -> Option<Instant> {
        self.requests.iter().filter_map(|request| request.first_sent_at).min()
    }

    /// Datagrams sent again so far (a field read, for callers on the request path).
    pub fn retransmissions(&self) -> u64 {
        self.stats.retransmissions
    }

    /// Whether a HELLO exchange is under way.
    pub fn is_establishing(&self) -> bool {
        self.hello.is_some()
    }

    /// Whether the HELLO exchange under way was refused for want of a slot and waits to ask
    /// again (`SessionConfig::session_wait`), with no HELLO on the wire: the target holds no
    /// session of this exchange, so a driver whose caller gave up may stop here.
    pub fn waits_for_a_slot(&self) -> bool {
        self.hello_refused.is_some()
            && self
                .requests
                .iter()
                .all(|request| request.origin != Origin::Hello || matches!(request.state, State::Held { .. }))
    }

    fn begin_hello(&mut self) {
        self.session_id = 0;
        self.hello = Some((NO_COOKIE, 0));
        self.send_hello();
    }

    /// Queues the exchange's next HELLO ahead of everything else. It is the session's own
    /// request: it does not count against the caller's bound on requests in flight.
    fn send_hello(&mut self) {
        self.send_hello_at(None);
    }

    /// As [`Session::send_hello`], held until `at` when given.
    fn send_hello_at(&mut self, at: Option<Instant>) {
        let (Some(size), Some((cookie, _))) = (self.hello_size, self.hello) else { return };
        let method = if self.config.encrypt { HELLO_AUTH_ENCRYPT } else { HELLO_AUTH_MAC };
        let hello = match self.config.credentials {
            None => Op::hello(size, cookie),
            Some(_) if cookie == NO_COOKIE => Op::hello_with(size, cookie, method, &[0; HELLO_AUTH_LEN]),
            Some(credentials) => {
                let (tenant, version, key) = (credentials.tenant, credentials.key_version, &credentials.key);
                match HelloAuth::prove(key, tenant, version, &cookie, method, size) {
                    Ok(area) => {
                        self.hello_proof = Some((area, *key, cookie));
                        self.hello_keys = None;
                        Op::hello_with(size, cookie, method, &area.encode())
                    }
                    Err(_) => return self.end_hello(Err(ClientError::Random)),
                }
            }
        };
        match (self.encode(1, &|_| hello.as_instruction()), at) {
            (Ok(datagram), None) => {
                let sequence =
                    self.push(Origin::Hello, 0, datagram, (true, ServiceKind::Memory, false), State::Waiting);
                self.send_queue.push_front(sequence);
            }
            (Ok(datagram), Some(until)) => {
                self.push(Origin::Hello, 0, datagram, (true, ServiceKind::Memory, false), State::Held { until });
            }
            (Err(error), _) => self.end_hello(Err(error)),
        }
    }

    /// Ends the HELLO exchange: adopts the session and sends the requests that waited for it,
    /// or fails them.
    fn end_hello(&mut self, mut outcome: Result<HelloAnswer, ClientError>) {
        self.hello = None;
        self.hello_refused = None;
        if let (Ok(answer), Some(_)) = (&mut outcome, &self.config.credentials) {
            // What a driver may fill: the negotiated size less the trailer every datagram of an
            // authenticated session carries.
            answer.max_datagram_bytes -= TRAILER_BYTES as u32;
        }
        match &outcome {
            Ok(answer) => {
                self.ever_established = true;
                self.hello_proof = None;
                if let Some((_, keys)) = self.hello_keys.take() {
                    self.keys = Some(keys);
                    self.sealed = 0;
                }
                // Less the trailer already, for an authenticated session (above).
                self.establish(answer.session, answer.max_datagram_bytes as usize);
                self.settle_reused_id();
                match &self.first_spaces {
                    None => self.first_spaces = Some((answer.regions.clone(), answer.namespaces.clone())),
                    Some((regions, namespaces)) => {
                        if let Some(change) = spaces_change(regions, namespaces, answer) {
                            // A warning: a caller that looks its space up again by name (the
                            // export does) serves on; one that cannot gets the error itself.
                            tracing::warn!(
                                "the target's spaces changed while the session was lost: {change}; this session's \
                                 requests that name a space fail from now on (a caller that opens new sessions and \
                                 looks its space up by name, as `netdam nbd` does, serves on)"
                            );
                            self.spaces_changed = Some(change);
                        }
                    }
                }
                if let Some(change) = &self.spaces_changed {
                    // Every request made so far that names a space carries the old ids: sent
                    // again, or executed under an old session id the restarted target handed out
                    // anew, it could address another space. PING, STAT and CLOSE go on.
                    let mut index = 0;
                    while index < self.requests.len() {
                        if self.requests[index].addresses_space {
                            let request = self.requests.swap_remove(index);
                            let error = ClientError::SpacesChanged(change.clone());
                            self.completions.push_back(Completion { token: request.token, result: Err(error) });
                        } else {
                            index += 1;
                        }
                    }
                }
                let mut parked: Vec<usize> =
                    (0..self.requests.len()).filter(|&index| self.requests[index].state == State::Parked).collect();
                parked.sort_by_key(|&index| self.requests[index].sequence);
                for index in parked {
                    self.reseat(index);
                }
            }
            Err(error) => {
                let mut index = 0;
                while index < self.requests.len() {
                    if self.requests[index].state == State::Parked {
                        let request = self.requests.swap_remove(index);
                        self.completions.push_back(Completion { token: request.token, result: Err(error.duplicate()) });
                    } else {
                        index += 1;
                    }
                }
            }
        }
        self.established = Some(outcome);
    }

    /// A restarted target may hand out the id of the session it lost again (its ids carry 16
    /// bits of a generation seeded by its start time): requests still on their way in the lost
    /// session would then be taken as the new session's. An idempotent one may run again; one
    /// that is not, and was sent, may have run before the restart: it fails as `SessionLost`
    /// rather than be sent again under an id the new target would execute it in.
    fn settle_reused_id(&mut self) {
        let mut index = 0;
        while index < self.requests.len() {
            let request = &self.requests[index];
            let reused = request.origin == Origin::Caller
                && request.session_id == self.session_id
                && request.state != State::Parked
                && request.attempts > 0
                && !request.idempotent;
            if reused {
                let request = self.requests.swap_remove(index);
                self.completions.push_back(Completion { token: request.token, result: Err(ClientError::SessionLost) });
            } else {
                index += 1;
            }
        }
    }

    /// Puts a parked request into the current session and queues it.
    fn reseat(&mut self, index: usize) {
        let request = &mut self.requests[index];
        if peek_is_sealed(request.datagram.as_slice()) {
            // Sealed for the session that was lost: cut the old trailer, seal it anew below.
            request.datagram.len -= TRAILER_BYTES;
            request.datagram.buffer[3] &= !FLAG_SEALED;
        }
        set_request_session(request.datagram.as_mut_slice(), self.session_id);
        if !self.config.encrypt {
            seal_request(self.keys.as_ref(), &mut self.sealed, self.session_id, &mut request.datagram);
        }
        let request = &mut self.requests[index];
        request.session_id = self.session_id;
        request.attempts = 0;
        request.busy_retries = 0;
        request.noticed = false;
        request.state = State::Waiting;
        self.send_queue.push_back(request.sequence);
    }

    /// The HELLO under way was answered (or failed after its last attempt) at `now`.
    fn on_hello_answer(&mut self, now: Instant, result: Result<Reply, ClientError>) {
        let authenticated = self.config.credentials.is_some();
        let offered = self.hello_size.unwrap_or(self.config.max_datagram_bytes as u32);
        let step = result.and_then(|reply| {
            let step = hello_step(&reply)?;
            if let HelloStep::Established(answer) = &step {
                if authenticated && !peek_is_sealed(reply.bytes()) {
                    // Only a target holding the tenant's key can seal the answer that opens a session.
                    return Err(ClientError::HelloRefused(Status::Unauthenticated));
                }
                check_hello_answer(answer, offered)?;
            }
            Ok(step)
        });
        match step {
            Ok(HelloStep::Retry(cookie)) => {
                let rounds = self.hello.map_or(0, |(_, rounds)| rounds) + 1;
                if rounds >= HELLO_ROUNDS {
                    self.end_hello(Err(ClientError::HelloRefused(Status::Retry)));
                } else {
                    self.hello = Some((cookie, rounds));
                    self.send_hello();
                }
            }
            Ok(HelloStep::Established(answer)) => self.end_hello(Ok(answer)),
            Err(error) if wants_a_free_slot(&error) => {
                // Slots free up as other sessions end: ask again after 10 ms, 20, 40, ... 320.
                let (first, refusals) = self.hello_refused.unwrap_or((now, 0));
                if now.saturating_since(first) >= self.config.session_wait {
                    return self.end_hello(Err(error));
                }
                self.hello_refused = Some((first, refusals + 1));
                // The target answered: the cookie rounds start again (a wait longer than a
                // cookie's 5 s renews it, which is no sign of a changing source address).
                if let Some((cookie, _)) = self.hello {
                    self.hello = Some((cookie, 0));
                }
                let pause = Duration::from_millis(10 << refusals.min(5));
                self.send_hello_at(Some(now + pause));
            }
            Err(error) => self.end_hello(Err(error)),
        }
    }

    /// The target answered `no_session` to request `index`, which was sent in a session.
    fn on_session_lost(&mut self, index: usize) {
        let request = &self.requests[index];
        let lost_current = request.session_id == self.session_id;
        // An unsealed `no_session` may be forged in an authenticated session: a request that may
        // have run is then not sent again on its word, unless running twice is harmless.
        let believed = self.config.credentials.is_none() && request.attempts == 1;
        if let (Some(change), true) = (&self.spaces_changed, request.addresses_space) {
            // Its ids are those of the target before the change: never sent again.
            let error = ClientError::SpacesChanged(change.clone());
            let request = self.requests.swap_remove(index);
            self.completions.push_back(Completion { token: request.token, result: Err(error) });
        } else if believed || request.idempotent {
            // This transmission did not run, and no other did (or running twice is harmless).
            self.requests[index].state = State::Parked;
            if !lost_current && self.hello.is_none() && self.session_id != 0 {
                // Sent in an older session; the current one is up already.
                self.reseat(index);
            }
        } else {
            let request = self.requests.swap_remove(index);
            self.completions.push_back(Completion { token: request.token, result: Err(ClientError::SessionLost) });
        }
        if lost_current && self.hello.is_none() {
            self.stats.sessions_lost += 1;
            self.begin_hello();
        }
    }

    /// Adopts the id and datagram size HELLO negotiated.
    fn establish(&mut self, session_id: u32, max_datagram_bytes: usize) {
        self.session_id = session_id;
        self.config.max_datagram_bytes = max_datagram_bytes;
    }

    /// Forgets the session id (the target no longer knows it): what is sent next, a HELLO first
    /// of all, goes out without a session.
    pub fn forget(&mut self) {
        self.session_id = 0;
    }

    /// The session id in use: 0 before HELLO, after `forget`, or for a sessionless client.
    pub fn id(&self) -> u32 {
        self.session_id
    }

    /// The settings in force.
    pub fn config(&self) -> &SessionConfig {
        &self.config
    }

    /// Counters and controller state so far.
    pub fn stats(&self) -> SessionStats {
        SessionStats {
            smoothed_rtt: self.smoothed_rtt().unwrap_or(Duration::ZERO),
            rto: self.timeouts.largest(&self.config),
            window: self.swift.as_ref().map_or(self.config.max_in_flight as f64, Swift::window),
            swift: self.swift.as_ref().map(Swift::metrics),
            open: self.session_id != 0 && self.refused_since.is_none(),
            ..self.stats
        }
    }

    /// The smoothed round trip of this session's answers, once there is one.
    pub fn smoothed_rtt(&self) -> Option<Duration> {
        self.rtt.smoothed_ns.map(|smoothed| Duration::from_nanos(smoothed as u64))
    }

    /// Requests submitted and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.requests.len()
    }

    /// Whether another request may be submitted now: under `max_in_flight`, and not so far ahead
    /// of the oldest unanswered request that the target's replay window would no longer cover it
    /// (one request stuck in retransmission must not let the rest run 256 sequences ahead).
    pub fn has_room(&self) -> bool {
        // One walk over the requests (it runs before every submission).
        let (mut callers, mut oldest) = (0, self.next_sequence);
        for request in self.requests.iter().filter(|request| request.origin == Origin::Caller) {
            callers += 1;
            oldest = oldest.min(request.sequence);
        }
        callers < self.config.max_in_flight && self.next_sequence - oldest < REPLAY_WINDOW as u64
    }

    /// Queues one datagram carrying `ops`; its completion will carry `token`. Without a session
    /// (HELLO under way, or a failed one to retry) it waits for the session.
    pub fn submit(&mut self, ops: &[Op], token: u64) -> Result<(), ClientError> {
        self.submit_with(ops.len(), |index| ops[index].as_instruction(), token)
    }

    /// As [`Session::submit`], for `count` instructions built by `instruction(index)` from
    /// borrowed operands (a driver's own buffers): nothing is copied but into the datagram.
    pub fn submit_with<'a>(
        &mut self,
        count: usize,
        instruction: impl Fn(usize) -> Instruction<'a>,
        token: u64,
    ) -> Result<(), ClientError> {
        if !self.has_room() {
            return Err(ClientError::WindowFull(self.requests.len()));
        }
        let addresses_space = (0..count).any(|index| addresses_a_space(instruction(index).opcode));
        if let (Some(change), true) = (&self.spaces_changed, addresses_space) {
            return Err(ClientError::SpacesChanged(change.clone()));
        }
        let datagram = self.encode(count, &instruction)?;
        let idempotent = (0..count).all(|index| instruction(index).is_idempotent());
        let block = (0..count).any(|index| Opcode::from_u8(instruction(index).opcode).is_some_and(Opcode::is_block));
        let kind = if block { ServiceKind::Block } else { ServiceKind::Memory };
        if self.session_id == 0 && self.hello_size.is_some() {
            if self.hello.is_none() {
                // The last HELLO failed; this request asks again.
                self.begin_hello();
            }
            self.push(Origin::Caller, token, datagram, (idempotent, kind, addresses_space), State::Parked);
        } else {
            let sequence =
                self.push(Origin::Caller, token, datagram, (idempotent, kind, addresses_space), State::Waiting);
            self.send_queue.push_back(sequence);
        }
        self.stats.submitted += 1;
        Ok(())
    }

    /// Encodes `count` instructions as the next sequence of the current session: in place into
    /// a spare buffer when there is one (a driver that recycles its replies), otherwise into the
    /// session's scratch buffer and then copied into a buffer of the request's own size. The
    /// request's buffer goes to the caller with the answer; one of the full datagram size would
    /// be allocated and zeroed (9 KiB) for every request of a caller that does not recycle.
    fn encode<'a>(
        &mut self,
        count: usize,
        instruction: &impl Fn(usize) -> Instruction<'a>,
    ) -> Result<Datagram, ClientError> {
        let size = self.config.max_datagram_bytes;
        let spare = self.spare_buffers.pop();
        let recycled = spare.is_some();
        let mut buffer = match spare {
            Some(datagram) => datagram.buffer,
            None => std::mem::take(&mut self.scratch),
        };
        // Room for a trailer too (the size of an authenticated session leaves it out).
        if buffer.len() < size + TRAILER_BYTES {
            buffer.resize(size + TRAILER_BYTES, 0);
        }
        let encoded = match RequestBuilder::new(&mut buffer[..size], self.session_id, self.next_sequence) {
            Ok(mut builder) => {
                let pushed = (0..count).all(|index| builder.push(&instruction(index)).is_ok());
                match (pushed, builder.is_empty()) {
                    (false, _) => Err(ClientError::TooLarge(size)),
                    (true, true) => Err(ClientError::Empty),
                    // A request of an authenticated session is sealed next: no CRC.
                    // (An encrypted session keeps requests in the clear and seals each transmission.)
                    (true, false) if self.keys.is_some() && self.session_id != 0 && !self.config.encrypt => {
                        Ok(builder.finish_sealed())
                    }
                    (true, false) => Ok(builder.finish()),
                }
            }
            Err(_) => Err(ClientError::TooLarge(size)),
        };
        let len = match encoded {
            Ok(len) => len,
            Err(error) => {
                if recycled {
                    self.recycle_buffer(Datagram { buffer, len: 0 });
                } else {
                    self.scratch = buffer;
                }
                return Err(error);
            }
        };
        let mut datagram = if recycled {
            Datagram { buffer, len }
        } else {
            // Room for an answer as large as the last one, so that it takes the buffer as is.
            let mut own = Vec::with_capacity((len + TRAILER_BYTES).max(self.answer_bytes));
            // The trailer's room is copied from the scratch buffer (which has it) rather than
            // zeroed: a seal writes all of it, and one copy is cheaper than a copy and a fill.
            own.extend_from_slice(&buffer[..len + TRAILER_BYTES]);
            self.scratch = buffer;
            Datagram { buffer: own, len }
        };
        if !self.config.encrypt {
            // An encrypted session seals each transmission (`poll_transmit`).
            seal_request(self.keys.as_ref(), &mut self.sealed, self.session_id, &mut datagram);
        }
        Ok(datagram)
    }

    /// Keeps `datagram`'s buffer for a later request, while there are fewer than
    /// [`SPARE_BUFFERS_MAX`].
    fn recycle_buffer(&mut self, datagram: Datagram) {
        if self.spare_buffers.len() < SPARE_BUFFERS_MAX {
            self.spare_buffers.push(datagram);
        }
    }

    /// Gives a reply's buffer back for later requests: a driver that has taken what it needs
    /// from a reply calls this, so that requests in steady state allocate nothing.
    pub fn recycle(&mut self, reply: Reply) {
        if let ReplyBytes::Owned(datagram) = reply.bytes {
            self.recycle_buffer(datagram);
        }
    }

    /// Adds an encoded request (of the next sequence); returns its sequence.
    fn push(
        &mut self,
        origin: Origin,
        token: u64,
        datagram: Datagram,
        (idempotent, kind, addresses_space): (bool, ServiceKind, bool),
        state: State,
    ) -> u64 {
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        self.requests.push(Request {
            origin,
            token,
            session_id: self.session_id,
            sequence,
            datagram,
            idempotent,
            kind,
            attempts: 0,
            busy_retries: 0,
            state,
            sent_at: Instant::ZERO,
            first_sent_at: None,
            noticed: false,
            addresses_space,
        });
        sequence
    }

    /// The retransmission timeout of `request`'s next transmission, before back-off: its kind's
    /// (`Timeouts::rto`), and for a HELLO at least `min_hello_rto`.
    fn rto_of(&self, request: &Request) -> Duration {
        let rto = self.timeouts.rto(request.kind, &self.config);
        match request.origin {
            Origin::Hello => rto.max(self.config.min_hello_rto).min(self.config.max_rto),
            Origin::Caller => rto,
        }
    }

    /// How long `request`'s latest transmission waits for its answer: [`Session::rto_of`],
    /// doubled for each transmission before it, at most `max_rto`.
    fn backed_off_rto(&self, request: &Request) -> Duration {
        let rto = self.rto_of(request);
        let doublings = request.attempts.saturating_sub(1).min(16);
        Duration::from_nanos(rto.as_nanos().saturating_mul(1 << doublings)).min(self.config.max_rto)
    }

    /// Requests on the wire now (sent, not answered, not timed out): what the window bounds,
    /// and the answers an adaptive client may expect soon.
    pub fn on_wire(&self) -> usize {
        self.requests.iter().filter(|request| matches!(request.state, State::Sent { .. })).count()
    }

    /// Whether requests wait to be sent: `poll_transmit` may have something (or the window may
    /// hold them back), so a driver with nothing queued need not read its clock for it.
    pub fn has_queued(&self) -> bool {
        !self.send_queue.is_empty()
    }

    /// Counts `trains` sent by the driver (the session does no I/O itself).
    pub fn count_trains(&mut self, trains: u64) {
        self.stats.trains += trains;
    }

    /// Counts an answer the driver spun for.
    pub fn count_spun_for(&mut self) {
        self.stats.spun_for += 1;
    }

    /// How many requests wait to be sent (`poll_transmit` may hold some back for the window).
    pub fn queued(&self) -> usize {
        self.send_queue.len()
    }

    /// The next datagram to send now, if any; the caller sends it, or copies it (into a train),
    /// before the next call: an encrypted session seals each transmission into one buffer that
    /// the next call overwrites.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<&[u8]> {
        while let Some(&sequence) = self.send_queue.front() {
            let Some(index) = self.requests.iter().position(|request| request.sequence == sequence) else {
                self.send_queue.pop_front();
                continue;
            };
            let first_send = self.requests[index].attempts == 0;
            // Retransmissions too need room in the window (or their pacing slot): resending every
            // lost request at once after a loss burst would only repeat the burst.
            if let Some(swift) = &self.swift {
                if swift.may_send(now, self.on_wire()).is_err() {
                    return None;
                }
            }
            self.send_queue.pop_front();
            self.requests[index].attempts += 1;
            let timeout = self.backed_off_rto(&self.requests[index]);
            let request = &mut self.requests[index];
            request.state = State::Sent { deadline: now + timeout };
            request.sent_at = now;
            request.first_sent_at.get_or_insert(now);
            self.stats.transmissions += 1;
            self.stats.bytes_transmitted += self.requests[index].datagram.as_slice().len() as u64;
            if !first_send {
                self.stats.retransmissions += 1;
                if self.requests[index].kind == ServiceKind::Block {
                    self.stats.block_retransmissions += 1;
                }
            }
            if let Some(swift) = &mut self.swift {
                swift.on_send(now);
            }
            let datagram = self.requests[index].datagram.as_slice();
            if let (true, Some(keys), false) = (self.config.encrypt, &self.keys, self.session_id == 0) {
                // Encrypted anew for each transmission, with the next counter: the request is
                // kept in the clear, so it can move to a new session and be sent again.
                let len = datagram.len();
                if self.transmit.len() < len + TRAILER_BYTES {
                    self.transmit.resize(len + TRAILER_BYTES, 0);
                }
                self.transmit[..len].copy_from_slice(datagram);
                mark_sealed(&mut self.transmit[..len]);
                self.transmit[3] |= FLAG_ENCRYPTED;
                let sealed = netdam_auth::trailer::seal_encrypted(&keys.request, self.sealed, &mut self.transmit, len)
                    .expect("the transmit buffer has room for the trailer");
                self.sealed += 1;
                return Some(&self.transmit[..sealed]);
            }
            return Some(self.requests[index].datagram.as_slice());
        }
        None
    }

    /// Takes a received datagram.
    pub fn handle_datagram(&mut self, now: Instant, bytes: &[u8]) {
        self.handle_datagram_waited(now, Duration::ZERO, bytes);
    }

    /// Takes a received datagram that arrived `waited` before `now` (by the kernel's receive
    /// timestamp, or at most that long by the driver's own bound): the round trip that
    /// congestion control and the retransmission timeout learn from ends at its arrival, not at
    /// this thread's reading it (`stamped`). A `waited` as long as the round trip or longer
    /// ([`Duration::MAX`]: unknown) gives no sample.
    pub fn handle_datagram_waited(&mut self, now: Instant, waited: Duration, bytes: &[u8]) {
        self.stats.datagrams_received += 1;
        self.stats.bytes_received += bytes.len() as u64;
        if peek_is_sealed(bytes) && peek_is_encrypted(bytes) {
            // Decrypted (which checks the tag) into the session's own buffer, taken out while
            // the answer is handled; it grows to the largest datagram once.
            let mut plain = std::mem::take(&mut self.decrypted);
            if plain.len() < bytes.len() {
                plain.resize(bytes.len(), 0);
            }
            plain[..bytes.len()].copy_from_slice(bytes);
            match self.open_encrypted(&mut plain[..bytes.len()]) {
                Some(len) => self.handle_opened(now, waited, &plain[..len]),
                None => self.stats.ignored += 1,
            }
            self.decrypted = plain;
            return;
        }
        let Some(bytes) = self.open(bytes) else {
            self.stats.ignored += 1;
            return;
        };
        self.handle_opened(now, waited, bytes);
    }

    /// Decrypts an encrypted answer in place and checks its tag (the session's keys, or in
    /// session 0 the HELLO's); the length without the trailer.
    fn open_encrypted(&mut self, datagram: &mut [u8]) -> Option<usize> {
        let (session, _) = peek_session_sequence(datagram)?;
        let keys = self.keys_for(session)?;
        netdam_auth::trailer::open_encrypted(&keys.response, datagram).ok()
    }

    /// The keys that open an answer naming `session`: the session's, or those of the session
    /// the HELLO under way opened (derived from its proof and the id the answer gives).
    fn keys_for(&mut self, session: u32) -> Option<&SessionKeys> {
        if session != 0 && session == self.session_id && self.keys.is_some() {
            return self.keys.as_ref();
        }
        let (area, key, cookie) = self.hello_proof.as_ref()?;
        if session == 0 {
            return None;
        }
        if self.hello_keys.as_ref().is_none_or(|(id, _)| *id != session) {
            self.hello_keys = Some((session, area.session_keys(key, cookie, session)));
        }
        self.hello_keys.as_ref().map(|(_, keys)| keys)
    }

    /// Takes an answer that is plain or opened (its MAC checked, its trailer cut).
    fn handle_opened(&mut self, now: Instant, waited: Duration, bytes: &[u8]) {
        let parsed = if peek_is_sealed(bytes) { Response::parse_opened(bytes) } else { Response::parse(bytes) };
        let Ok(response) = parsed else {
            self.stats.ignored += 1;
            return;
        };
        // Something listens again: a later refusal starts a new wait.
        self.refused_since = None;
        self.last_heard = Some(now);
        let header = response.header;
        // A request queued for retransmission may still get the answer to its earlier send.
        let found = self.requests.iter().position(|request| {
            request.sequence == header.sequence
                && request.attempts > 0
                && !matches!(request.state, State::Held { .. })
                // The answer that opens an authenticated session names it; others echo the
                // request's session, or 0.
                && (header.session == request.session_id || header.session == 0 || request.origin == Origin::Hello)
        });
        let Some(index) = found else {
            self.stats.ignored += 1;
            return;
        };
        if response.status() == Status::InProgress {
            // Not an answer: the target still executes the request (its block I/O is in flight)
            // and the answer follows. Its timer starts again, a resend already queued for it is
            // called off, and nothing counts as a round trip or a loss (PROTOCOL.md, "In-progress
            // notices").
            self.stats.in_progress_notices += 1;
            let timeout = self.backed_off_rto(&self.requests[index]);
            let request = &mut self.requests[index];
            let first_sent_at = request.first_sent_at.unwrap_or(now);
            if now.saturating_since(first_sent_at) >= self.config.max_in_progress_wait {
                // Held too long: the timer runs out, and the request fails (`handle_timeout`).
                return;
            }
            request.noticed = true;
            let sequence = request.sequence;
            match request.state {
                State::Sent { .. } => request.state = State::Sent { deadline: now + timeout },
                State::Waiting => {
                    request.state = State::Sent { deadline: now + timeout };
                    self.send_queue.retain(|&queued| queued != sequence);
                }
                State::Held { .. } | State::Parked => {}
            }
            return;
        }
        if response.status() == Status::Busy {
            self.stats.busy += 1;
            if let Some(swift) = &mut self.swift {
                swift.on_busy(now);
            }
            let request = &mut self.requests[index];
            request.busy_retries += 1;
            if request.busy_retries <= self.config.max_busy_retries {
                // Wait as long as the target says its queue is, doubling with each BUSY this
                // request gets in a row, so requests that keep losing the race stop adding to it.
                let hint = u64::from(header.queueing_us).max(1) * 1000;
                let backoff = hint.saturating_mul(1 << (request.busy_retries - 1).min(16));
                let hold = Duration::from_nanos(backoff).min(self.config.max_rto);
                request.state = State::Held { until: now + hold };
                // A BUSY answer is not a lost datagram: the attempt does not count.
                request.attempts -= 1;
                return;
            }
        }
        if response.status() == Status::NoSession && self.requests[index].session_id != 0 && self.hello_size.is_some() {
            self.on_session_lost(index);
            return;
        }
        let request = self.requests.swap_remove(index);
        let rtt = now.saturating_since(request.sent_at);
        // TTL 0 is "unknown" (a target reading no TTLs while it serves lone requests): the hop
        // count of the last answer that had one stands.
        if header.ttl != 0 {
            self.last_ttl = header.ttl;
        }
        // Karn: a retransmitted request's RTT is ambiguous; only first transmissions are samples.
        // Nor is one whose wait at this end is not known to be shorter than the round trip.
        if request.attempts == 1 && response.status() != Status::Busy && (waited.as_nanos() == 0 || waited < rtt) {
            let arrived = rtt.saturating_sub(waited);
            self.rtt.update(arrived);
            self.timeouts.update(request.kind, arrived);
            if let Some(swift) = &mut self.swift {
                let service = Duration::from_nanos(u64::from(header.service_time_ns));
                let queueing = Duration::from_micros(u64::from(header.queueing_us));
                swift.on_answer(now, arrived, service, queueing, hops_from_ttl(self.last_ttl), 1);
            }
        }
        if request.origin == Origin::Caller {
            // At most a datagram and its trailer: what this session can receive.
            let largest = self.config.max_datagram_bytes + 2 * TRAILER_BYTES;
            self.answer_bytes = (bytes.len() + TRAILER_BYTES).min(largest).max(SMALL_ANSWER_BYTES);
        }
        // The request's buffer (of the datagram size) takes the answer: no allocation.
        let mut answer = request.datagram;
        answer.replace_with(bytes);
        let result = Ok(Reply::new(answer, rtt, request.attempts));
        match request.origin {
            Origin::Caller => self.completions.push_back(Completion { token: request.token, result }),
            Origin::Hello => self.on_hello_answer(now, result),
        }
    }

    /// Checks a sealed answer's MAC and cuts its trailer: the session's keys, or for an answer
    /// in session 0 (the HELLO's) the keys the HELLO under way derived. With credentials an
    /// unsealed answer is believed only where the target cannot seal: in session 0 (a cookie,
    /// a refused HELLO, a sessionless PING or STAT) and `no_session` (the target lost the
    /// session and its keys). `None`: ignore it.
    fn open<'b>(&mut self, bytes: &'b [u8]) -> Option<&'b [u8]> {
        let (session, _) = peek_session_sequence(bytes)?;
        if peek_is_sealed(bytes) {
            if self.config.encrypt {
                // An encrypted session's answers are all encrypted (the other path).
                return None;
            }
            let keys = self.keys_for(session)?;
            let len = netdam_auth::trailer::open(&keys.response, bytes).ok()?;
            return Some(&bytes[..len]);
        }
        if self.config.credentials.is_none()
            || session == 0
            || peek_datagram_status(bytes) == Some(Status::NoSession as u8)
        {
            Some(bytes)
        } else {
            None
        }
    }

    /// When `handle_timeout` (or `poll_transmit`, for pacing) should next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let timers = self.requests.iter().filter_map(|request| match request.state {
            State::Sent { deadline, .. } => Some(deadline),
            State::Held { until } => Some(until),
            State::Waiting | State::Parked => None,
        });
        let pacing = self.swift.as_ref().and_then(|swift| {
            // Something is waiting to be sent (new or retransmission) and pacing holds it. Asked
            // "at the origin", may_send returns the release time whenever pacing holds.
            self.send_queue.front()?;
            match swift.may_send(Instant::ZERO, self.on_wire()) {
                Err(Some(release)) => Some(release),
                _ => None,
            }
        });
        timers.chain(pacing).min()
    }

    /// Retransmits requests whose time is up, releases BUSY holds, and fails requests out of
    /// attempts.
    pub fn handle_timeout(&mut self, now: Instant) {
        let mut hello_failed = None;
        let mut target_silent = false;
        let mut index = 0;
        while index < self.requests.len() {
            let request = &mut self.requests[index];
            match request.state {
                State::Held { until } if until <= now => {
                    request.state = State::Waiting;
                    self.send_queue.push_front(request.sequence);
                }
                State::Sent { deadline, .. } if deadline <= now => {
                    if let Some(swift) = &mut self.swift {
                        swift.on_timeout(now);
                    }
                    let first_sent_at = request.first_sent_at.unwrap_or(now);
                    let since_first = now.saturating_since(first_sent_at);
                    let patient = since_first < self.config.min_patience;
                    // The target said it holds the request, for longer than the session waits:
                    // resending would only earn more notices.
                    let held_too_long = request.noticed && since_first >= self.config.max_in_progress_wait;
                    if !held_too_long && (request.attempts < self.config.max_attempts || patient) {
                        request.state = State::Waiting;
                        // Retransmissions go before new requests.
                        self.send_queue.push_front(request.sequence);
                    } else {
                        // The target is silent, not this one datagram lost: nothing was heard
                        // since it first left, and a request sent since is unanswered too.
                        let heard_since = self.last_heard.is_some_and(|heard| heard >= first_sent_at);
                        let heard_since_last_sent = self.last_heard.is_some_and(|heard| heard >= request.sent_at);
                        let sequence = request.sequence;
                        let another_unanswered = self.requests.iter().any(|other| {
                            other.sequence != sequence && other.first_sent_at.is_some_and(|sent| sent >= first_sent_at)
                        });
                        // Or the second request in a row to run out with nothing heard since its
                        // last transmission, nor since the first ran out. A lone request failing
                        // may be a path that drops its datagram, so the one behind it gets its own
                        // chance; when that one fails unanswered too, the target is silent. (Behind
                        // a window that timeouts closed to one, the requests would otherwise fail
                        // one patience apart: minutes at depth.)
                        let silent_again = !heard_since_last_sent
                            && self.unanswered_failure.is_some_and(|at| self.last_heard.is_none_or(|heard| heard < at));
                        target_silent |= (!heard_since && another_unanswered) || silent_again;
                        if !heard_since_last_sent {
                            self.unanswered_failure = Some(now);
                        }
                        let request = self.requests.swap_remove(index);
                        let error = if request.idempotent {
                            ClientError::TimedOut { attempts: request.attempts }
                        } else {
                            ClientError::OutcomeUnknown { attempts: request.attempts }
                        };
                        match request.origin {
                            Origin::Caller => {
                                // A HELLO is the session's own, not a request of the caller's.
                                self.stats.timeouts += 1;
                                self.completions.push_back(Completion { token: request.token, result: Err(error) })
                            }
                            // Ended after the loop: ending it changes the request list.
                            Origin::Hello => hello_failed = Some(error),
                        }
                        continue;
                    }
                }
                _ => {}
            }
            index += 1;
        }
        if target_silent {
            hello_failed = self.fail_outstanding().or(hello_failed);
        }
        if let Some(error) = hello_failed {
            self.on_hello_answer(now, Err(error));
        }
    }

    /// Fails every request still outstanding, sent or not: a request ran out of attempts and
    /// patience without the target answering anything since it first left, while another sent
    /// after it went unanswered too, so the target is down or unreachable. Left alone, each of
    /// the others would wait out a patience of its own, counted from a first transmission that
    /// the window (closed by the timeouts) holds back: minutes at depth. Returns the error of
    /// the session's own HELLO, if one was among them.
    fn fail_outstanding(&mut self) -> Option<ClientError> {
        let mut hello_failed = None;
        self.send_queue.clear();
        let mut outstanding = std::mem::take(&mut self.requests);
        // In the order they were submitted (the list is kept by swap_remove).
        outstanding.sort_unstable_by_key(|request| request.sequence);
        for request in outstanding {
            let attempts = request.attempts;
            // One never sent never ran, nor did one parked for a new session (the target said
            // it did not, or it may run again): either can be retried whatever it does.
            let error = if request.idempotent || attempts == 0 || matches!(request.state, State::Parked) {
                ClientError::TimedOut { attempts }
            } else {
                ClientError::OutcomeUnknown { attempts }
            };
            match request.origin {
                Origin::Caller => {
                    self.stats.timeouts += 1;
                    self.completions.push_back(Completion { token: request.token, result: Err(error) })
                }
                Origin::Hello => hello_failed = Some(error),
            }
        }
        hello_failed
    }

    /// The next finished request, if any.
    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.completions.pop_front()
    }
}

/// Whether an instruction of `opcode` names a region or namespace by id: all but the control
/// opcodes (PING, STAT, CLOSE, HELLO), which name none.
fn addresses_a_space(opcode: u8) -> bool {
    !matches!(Opcode::from_u8(opcode), Some(Opcode::Ping | Opcode::Stat | Opcode::Close | Opcode::Hello))
}

/// How `answer` lists the spaces of the first HELLO answer (`regions`, `namespaces`)
/// otherwise, if it does: the first region or namespace whose id now names another space, one
/// of another size, or none. Spaces added after them change nothing the caller was told.
///
/// A space no longer listed is a change too, though its id may name nothing now: a tenant is
/// told only of the spaces granted to it, so an id it is no longer told of may name another
/// space after a restart that renumbered them (one deleted before it), which a grant given later
/// would open to the session's old requests.
fn spaces_change(regions: &[RegionInfo], namespaces: &[NamespaceInfo], answer: &HelloAnswer) -> Option<String> {
    let region = |region: &RegionInfo| (region.id, region.name.clone(), format!("{} bytes", region.size_bytes));
    let namespace = |namespace: &NamespaceInfo| {
        let size = format!("{} blocks of {} bytes", namespace.capacity_blocks, namespace.block_bytes);
        (namespace.id, namespace.name.clone(), size)
    };
    first_change("region", regions, &answer.regions, region)
        .or_else(|| first_change("namespace", namespaces, &answer.namespaces, namespace))
}

/// The first space of `before` that `now` lists otherwise (`describe`: its id, name and size),
/// said as "KIND ID NAME (SIZE) is not listed (...)" or "... is now NAME (SIZE)".
fn first_change<T>(
    kind: &str,
    before: &[T],
    now: &[T],
    describe: impl Fn(&T) -> (u16, String, String),
) -> Option<String> {
    before.iter().find_map(|old| {
        let (id, name, size) = describe(old);
        let was = format!("{kind} {id} {name:?} ({size})");
        match now.iter().map(&describe).find(|(new_id, _, _)| *new_id == id) {
            None => Some(format!("{was} is not listed (deleted, or no longer granted to this tenant)")),
            Some((_, new_name, new_size)) if new_name != name || new_size != size => {
                Some(format!("{was} is now {new_name:?} ({new_size})"))
            }
            Some(_) => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(regions: Vec<RegionInfo>, namespaces: Vec<NamespaceInfo>) -> HelloAnswer {
        HelloAnswer { session: 1, max_datagram_bytes: 9000, max_instructions: 64, target_flags: 0, regions, namespaces }
    }

    fn region(id: u16, name: &str, size_bytes: u64) -> RegionInfo {
        RegionInfo { id, name: name.into(), size_bytes, persistent: false }
    }

    fn namespace(id: u16, name: &str, capacity_blocks: u64) -> NamespaceInfo {
        NamespaceInfo { id, name: name.into(), block_bytes: 4096, capacity_blocks, reports_allocation: true }
    }

    #[test]
    fn a_space_whose_id_names_another_or_none_is_a_change_and_one_added_is_not() {
        let regions = vec![region(0, "mem", 1 << 20)];
        let namespaces = vec![namespace(0, "disk", 256), namespace(1, "log", 64)];
        let change =
            |regions_now, namespaces_now| spaces_change(&regions, &namespaces, &answer(regions_now, namespaces_now));
        let same = change(regions.clone(), namespaces.clone());
        assert_eq!(same, None);
        let added = change(vec![region(0, "mem", 1 << 20), region(1, "new", 64)], namespaces.clone());
        assert_eq!(added, None, "a space added after the first HELLO's changes nothing");
        let renumbered = change(regions.clone(), vec![namespace(0, "log", 64)]).unwrap();
        assert_eq!(
            renumbered,
            "namespace 0 \"disk\" (256 blocks of 4096 bytes) is now \"log\" (64 blocks of 4096 bytes)"
        );
        let gone = change(regions.clone(), vec![namespace(0, "disk", 256)]).unwrap();
        assert_eq!(
            gone,
            "namespace 1 \"log\" (64 blocks of 4096 bytes) is not listed (deleted, or no longer granted to this tenant)"
        );
        // What a tenant granted only "log" sees after a restart that deleted "disk" before it:
        // id 0 no longer listed (it names another namespace, not granted to it).
        let only_log = [namespace(1, "log", 64)];
        let renumbered_unseen = spaces_change(&[], &only_log, &answer(Vec::new(), Vec::new()));
        assert!(renumbered_unseen.is_some_and(|what| what.contains("not listed")));
        let resized = change(vec![region(0, "mem", 2 << 20)], namespaces.clone()).unwrap();
        assert_eq!(resized, "region 0 \"mem\" (1048576 bytes) is now \"mem\" (2097152 bytes)");
    }
}
