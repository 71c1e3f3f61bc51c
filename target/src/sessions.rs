//! One worker's sessions: which initiators it knows, the replay window that makes
//! non-idempotent instructions execute at most once, and the rules that keep any one sender from
//! holding the table.
//!
//! SO_REUSEPORT sends every datagram of one initiator socket to the same worker, so each worker
//! owns its sessions outright: no lock, no sharing. A session id carries its slot (bits 0..10),
//! the worker (bits 10..16) and a generation (above), so lookup is one array access and an id
//! from a closed session or an earlier target run does not match a new one. A session belongs to
//! the address and port that opened it: a datagram naming it from anywhere else is not its.
//!
//! Slots are bounded three ways. HELLO opens a session only with a valid cookie (`cookies`), so
//! a forged source address gets none. One address (an IPv4 address, or an IPv6 /64, since one
//! host holds a whole /64) holds at most `per_address` sessions. Sessions end by CLOSE, by
//! silence (`idle_timeout`, or [`UNUSED_SESSION_TIMEOUT`] for one that never sent a request after
//! its HELLO), or, when the table or the address's share is full, by eviction of an idle one.
//!
//! Per session the table remembers the last `REPLAY_WINDOW` sequences executed. A retransmitted
//! request is answered from the stored response when it was not idempotent and executed again
//! when it was; a non-idempotent request older than the window, or whose stored answer has been
//! overwritten, is refused `stale`. Stored answers live in a fixed ring of bytes, so memory never grows.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use netdam_isa::limits::{
    MAX_SESSIONS_PER_WORKER, MAX_WORKERS, MIN_SESSIONS_PER_WORKER, REPLAY_ARENA_BYTES, REPLAY_WINDOW,
    SESSION_IDLE_BEFORE_EVICTION, UNUSED_SESSION_TIMEOUT,
};
use netdam_isa::{Duration, Instant};

use crate::cookies::CookieTag;
use crate::qos::UsageTable;

/// How long a full table with no idle session is taken to stay so (unless a session ends).
const FULL_TABLE_RECHECK: Duration = Duration::from_millis(1);

const SLOT_BITS: u32 = 10;
const WORKER_BITS: u32 = 6;
const _: () = assert!(MAX_SESSIONS_PER_WORKER <= 1 << SLOT_BITS && MAX_WORKERS <= 1 << WORKER_BITS);

/// How many sessions a worker holds and for how long: validated settings (see `Config`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLimits {
    /// Slots in the table.
    pub slots: usize,
    /// Sessions one address may hold.
    pub per_address: usize,
    /// Silence after which a session expires.
    pub idle_timeout: Duration,
}

/// The sender address sessions are counted by: an IPv4 address, or the /64 prefix of an IPv6
/// address (one host commonly holds a whole /64, so counting single IPv6 addresses would let it
/// take every slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AddressKey(u128);

impl AddressKey {
    /// The key of `ip`.
    pub fn of(ip: IpAddr) -> AddressKey {
        match ip {
            IpAddr::V4(ip) => AddressKey(u128::from(ip.to_ipv6_mapped())),
            IpAddr::V6(ip) => match ip.to_ipv4_mapped() {
                Some(v4) => AddressKey(u128::from(v4.to_ipv6_mapped())),
                None => AddressKey(u128::from(ip) & !u128::from(u64::MAX)),
            },
        }
    }
}

/// What the table says about an arriving request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// A new sequence: execute it, then `record` it under this ticket.
    Execute(RecordTicket),
    /// Seen and idempotent: execute it again (same effect), no record needed.
    ExecuteAgain,
    /// Seen and not idempotent: send this stored answer (`len` bytes, already copied to `out`).
    Replay(usize),
    /// Older than the window, or its answer is gone: answer `stale`, never execute.
    Stale,
    /// Still executing (waiting for block I/O, or its answer for a group commit): not executed
    /// again; answered with an in-progress notice, the answer being on its way.
    InProgress,
    /// No such session, or it belongs to another sender: answer `no_session`.
    UnknownSession,
}

/// Where to record an executed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordTicket {
    slot: usize,
    id: u32,
    sequence: u64,
}

/// A session HELLO got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    /// Its id.
    pub id: u32,
    /// The session this sender opened with the same cookie before: a retransmitted (or
    /// replayed) HELLO, answered again without taking another slot.
    pub existing: bool,
    /// An idle session was evicted to make room.
    pub evicted: bool,
    /// Sessions found expired while looking for room (ended here rather than by the sweep).
    pub expired: u64,
}

/// Why HELLO got no session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenRefusal {
    /// Every slot is held, and the address holding the most has no idle session.
    TableFull {
        /// Sessions found expired on the way (they ended, though none was free for this one).
        expired: u64,
    },
    /// The sender's address holds its share and none of those sessions is idle.
    AddressLimit {
        /// As above.
        expired: u64,
    },
}

#[derive(Debug, Clone, Copy, Default)]
struct Remembered {
    sequence: u64,
    executed: bool,
    /// Admitted and not yet recorded: its block I/O is in flight.
    in_progress: bool,
    /// Position and length of the stored answer in the arena (non-idempotent requests only).
    stored: Option<(u64, u32)>,
}

/// What an authenticated session holds: its keys, whose it is, and its send counter.
#[derive(Debug)]
pub struct SessionAuth {
    /// The session's two keys.
    pub keys: netdam_auth::SessionKeys,
    /// The tenant it belongs to.
    pub tenant: u32,
    /// The version of the tenant's key it was opened with: a rotation ends it.
    pub key_version: u32,
    /// The initiator's HELLO nonce: a retransmitted HELLO (same nonce) keeps the keys.
    pub nonce: [u8; netdam_auth::hello::NONCE_BYTES],
    /// Counter of the next answer sealed: the nonce, never used twice under the response key.
    pub sent: u64,
    /// The session counts against its tenant's `max_sessions` (until it ends).
    pub counted: bool,
    /// Its HELLO asked for encryption: every datagram's body is encrypted, both ways.
    pub encrypt: bool,
}

#[derive(Debug)]
struct Session {
    /// 0 when the slot is free.
    id: u32,
    peer: SocketAddr,
    address: AddressKey,
    /// The cookie of the HELLO that opened it.
    cookie: CookieTag,
    opened_at: Instant,
    last_active: Instant,
    /// A request other than its HELLO has arrived.
    used: bool,
    /// Requests admitted and still waiting for block I/O.
    in_progress: u32,
    highest_sequence: u64,
    window: Box<[Remembered]>,
    /// Keys and tenant of an authenticated session; `None` with `auth = "none"`.
    auth: Option<SessionAuth>,
    /// The id the slot held until it ended (0: none since its reuse): its keys still seal the
    /// answer to the datagram that ended it.
    closed_id: u32,
}

impl Session {
    fn is_open(&self) -> bool {
        self.id != 0
    }

    /// Silent long enough, and nothing in progress: its slot may go to a new session.
    fn is_idle(&self, now: Instant) -> bool {
        self.in_progress == 0 && now.saturating_since(self.last_active) >= SESSION_IDLE_BEFORE_EVICTION
    }

    fn is_expired(&self, now: Instant, idle_timeout: Duration) -> bool {
        if self.in_progress > 0 {
            // Its answer is still to come: it ends when the device answers and the silence after.
            return false;
        }
        let unused_too_long = !self.used && now.saturating_since(self.opened_at) > UNUSED_SESSION_TIMEOUT;
        unused_too_long || now.saturating_since(self.last_active) > idle_timeout
    }
}

/// Answers stored as a ring of bytes with a monotonic write position: an answer at position `p`
/// is intact while the position has not moved past `p + capacity`.
#[derive(Debug)]
struct ReplayArena {
    bytes: Box<[u8]>,
    position: u64,
}

impl ReplayArena {
    fn store(&mut self, answer: &[u8]) -> Option<(u64, u32)> {
        let capacity = self.bytes.len() as u64;
        if answer.len() as u64 > capacity {
            return None;
        }
        let offset = self.position % capacity;
        if offset + answer.len() as u64 > capacity {
            // Skip the tail so the answer is contiguous.
            self.position += capacity - offset;
        }
        let start = self.position;
        let offset = (start % capacity) as usize;
        self.bytes[offset..offset + answer.len()].copy_from_slice(answer);
        self.position += answer.len() as u64;
        Some((start, answer.len() as u32))
    }

    fn get(&self, start: u64, len: u32) -> Option<&[u8]> {
        if self.position > start + self.bytes.len() as u64 {
            return None;
        }
        let offset = (start % self.bytes.len() as u64) as usize;
        Some(&self.bytes[offset..offset + len as usize])
    }
}

/// Ends `session`: frees its slot, and gives an authenticated session back to its tenant's count.
/// Its keys stay until the slot is reused, so the answer to the CLOSE that ended it can still
/// be sealed (`closed_id`).
fn end(session: &mut Session, usage: &UsageTable) {
    session.closed_id = session.id;
    session.id = 0;
    if let Some(auth) = session.auth.as_mut().filter(|auth| auth.counted) {
        auth.counted = false;
        usage.get(auth.tenant).close_session();
    }
}

/// The sessions of one worker.
#[derive(Debug)]
pub struct SessionTable {
    worker: u32,
    generation: u32,
    limits: SessionLimits,
    slots: Vec<Session>,
    arena: ReplayArena,
    /// Next slot the expiry sweep looks at.
    sweep_cursor: usize,
    /// Room to sort (address, last activity, slot) when the table is full; allocated once.
    by_address: Vec<(AddressKey, Instant, u16)>,
    /// A full table had no idle session at the last look: until this instant (or until a
    /// session ends), HELLOs are refused without looking again.
    full_until: Instant,
    /// Sessions per tenant, over every worker: an authenticated session that ends gives its
    /// tenant's count back here.
    usage: Arc<UsageTable>,
}

impl SessionTable {
    /// The table of worker `worker`; `epoch` (e.g. the start time) seeds the generation so ids of
    /// an earlier run are not reused.
    pub fn new(worker: usize, epoch: u64, limits: SessionLimits) -> SessionTable {
        assert!(worker < 1 << WORKER_BITS, "worker index does not fit a session id");
        assert!(
            (MIN_SESSIONS_PER_WORKER..=MAX_SESSIONS_PER_WORKER).contains(&limits.slots)
                && (1..=limits.slots).contains(&limits.per_address),
            "session limits are validated with the configuration: {limits:?}"
        );
        let unspecified = SocketAddr::from(([0, 0, 0, 0], 0));
        let empty = || Session {
            id: 0,
            peer: unspecified,
            address: AddressKey::of(unspecified.ip()),
            cookie: [0; 16],
            opened_at: Instant::ZERO,
            last_active: Instant::ZERO,
            used: false,
            in_progress: 0,
            highest_sequence: 0,
            window: vec![Remembered::default(); REPLAY_WINDOW].into_boxed_slice(),
            auth: None,
            closed_id: 0,
        };
        SessionTable {
            worker: worker as u32,
            generation: (epoch ^ (epoch >> 32)) as u32,
            limits,
            slots: (0..limits.slots).map(|_| empty()).collect(),
            arena: ReplayArena { bytes: vec![0u8; REPLAY_ARENA_BYTES].into_boxed_slice(), position: 0 },
            sweep_cursor: 0,
            by_address: Vec::with_capacity(limits.slots),
            full_until: Instant::ZERO,
            usage: Arc::new(UsageTable::default()),
        }
    }

    /// The same table counting authenticated sessions per tenant in `usage`.
    pub fn with_usage(self, usage: Arc<UsageTable>) -> SessionTable {
        SessionTable { usage, ..self }
    }

    /// The limits in force.
    pub fn limits(&self) -> SessionLimits {
        self.limits
    }

    /// Sessions open now.
    pub fn open_count(&self) -> usize {
        self.slots.iter().filter(|session| session.is_open()).count()
    }

    /// Opens a session for `peer`, whose HELLO carried a valid cookie with MAC `cookie`.
    ///
    /// The same cookie from the same sender gets the session it opened before (HELLO is
    /// idempotent, and a replayed HELLO takes no second slot). An address at its share takes the
    /// slot of its own longest-idle session, if one is idle. A full table evicts the
    /// longest-idle session of the address that holds the most sessions among those that have
    /// an idle one; an active session is never evicted.
    pub fn open(&mut self, now: Instant, peer: SocketAddr, cookie: CookieTag) -> Result<Opened, OpenRefusal> {
        let address = AddressKey::of(peer.ip());
        let idle_timeout = self.limits.idle_timeout;
        let mut expired = 0;
        let mut free = None;
        let mut held_by_address = 0;
        // This address's longest-idle session that may give up its slot.
        let mut own_idle: Option<(Instant, usize)> = None;
        for (slot, session) in self.slots.iter_mut().enumerate() {
            if session.is_open() && session.is_expired(now, idle_timeout) {
                end(session, &self.usage);
                expired += 1;
            }
            if !session.is_open() {
                free = free.or(Some(slot));
                continue;
            }
            if session.peer == peer && session.cookie == cookie {
                return Ok(Opened { id: session.id, existing: true, evicted: false, expired });
            }
            if session.address == address {
                held_by_address += 1;
                if session.is_idle(now) && own_idle.is_none_or(|(since, _)| session.last_active < since) {
                    own_idle = Some((session.last_active, slot));
                }
            }
        }
        if expired > 0 {
            self.full_until = Instant::ZERO;
        }
        let (slot, evicted) = if held_by_address >= self.limits.per_address {
            match own_idle {
                Some((_, slot)) => (slot, true),
                None => return Err(OpenRefusal::AddressLimit { expired }),
            }
        } else if let Some(slot) = free {
            (slot, false)
        } else {
            match self.idle_slot_of_largest_holder(now) {
                Some(slot) => (slot, true),
                None => return Err(OpenRefusal::TableFull { expired }),
            }
        };
        let id = self.next_id(slot);
        let session = &mut self.slots[slot];
        if session.is_open() {
            // An evicted session.
            end(session, &self.usage);
        }
        session.id = id;
        session.peer = peer;
        session.address = address;
        session.cookie = cookie;
        session.opened_at = now;
        session.last_active = now;
        session.used = false;
        session.in_progress = 0;
        session.highest_sequence = 0;
        session.window.fill(Remembered::default());
        session.auth = None;
        session.closed_id = 0;
        Ok(Opened { id, existing: false, evicted, expired })
    }

    /// With every slot taken: the longest-idle session of the address holding the most sessions
    /// among addresses that have an idle one (of those tied, the one idle longest).
    ///
    /// This sorts the table, so after finding nothing it answers at once for
    /// [`FULL_TABLE_RECHECK`] (or until a session ends): a stream of valid HELLOs against a full
    /// table must not cost the worker a sort each.
    fn idle_slot_of_largest_holder(&mut self, now: Instant) -> Option<usize> {
        if now < self.full_until {
            return None;
        }
        self.by_address.clear();
        for (slot, session) in self.slots.iter().enumerate() {
            self.by_address.push((session.address, session.last_active, slot as u16));
        }
        self.by_address.sort_unstable();
        // Groups of one address, oldest activity first: (group size, idle since, slot).
        let mut best: Option<(usize, Instant, usize)> = None;
        let mut start = 0;
        while start < self.by_address.len() {
            let address = self.by_address[start].0;
            let size = self.by_address[start..].iter().take_while(|entry| entry.0 == address).count();
            let group = &self.by_address[start..start + size];
            let idle = group.iter().find(|(_, _, slot)| self.slots[usize::from(*slot)].is_idle(now));
            if let Some(&(_, since, slot)) = idle {
                let better = best.is_none_or(|(best_size, best_since, _)| {
                    size > best_size || (size == best_size && since < best_since)
                });
                if better {
                    best = Some((size, since, usize::from(slot)));
                }
            }
            start += size;
        }
        if best.is_none() {
            self.full_until = now + FULL_TABLE_RECHECK;
        }
        best.map(|(_, _, slot)| slot)
    }

    fn next_id(&mut self, slot: usize) -> u32 {
        loop {
            self.generation = self.generation.wrapping_add(1);
            let id = (self.generation << (SLOT_BITS + WORKER_BITS)) | (self.worker << SLOT_BITS) | slot as u32;
            // Id 0 means "no session".
            if id != 0 {
                return id;
            }
        }
    }

    /// Ends session `id` if `peer` owns it; returns whether it did.
    pub fn close(&mut self, id: u32, peer: SocketAddr) -> bool {
        match self.owned_slot(id, peer) {
            Some(slot) => {
                end(&mut self.slots[slot], &self.usage);
                self.full_until = Instant::ZERO;
                true
            }
            None => false,
        }
    }

    /// Ends sessions silent past their timeout, looking at the next `slots` slots only (bounded
    /// work per call, at most the whole table); returns how many ended.
    pub fn expire(&mut self, now: Instant, slots: usize) -> u64 {
        let mut expired = 0;
        for _ in 0..slots.min(self.slots.len()) {
            let session = &mut self.slots[self.sweep_cursor];
            if session.is_open() && session.is_expired(now, self.limits.idle_timeout) {
                end(session, &self.usage);
                expired += 1;
            }
            self.sweep_cursor = (self.sweep_cursor + 1) % self.slots.len();
        }
        if expired > 0 {
            self.full_until = Instant::ZERO;
        }
        expired
    }

    fn owned_slot(&self, id: u32, peer: SocketAddr) -> Option<usize> {
        let slot = (id & ((1 << SLOT_BITS) - 1)) as usize;
        let session = self.slots.get(slot)?;
        (id != 0 && session.id == id && session.peer == peer).then_some(slot)
    }

    /// Gives session `id` (just opened or found again by its HELLO) its keys and tenant; returns
    /// false, changing nothing, when the session holds other keys already. A retransmitted
    /// HELLO (the same nonce and tenant) keeps the keys and the send counter in use: a counter
    /// must never be reused under a key, and a live session's keys are never replaced.
    pub fn authenticate(&mut self, id: u32, peer: SocketAddr, auth: SessionAuth) -> bool {
        let Some(slot) = self.owned_slot(id, peer) else { return false };
        let session = &mut self.slots[slot];
        match &session.auth {
            None => {
                session.auth = Some(auth);
                true
            }
            // A retransmitted HELLO: the same keys, and the counter goes on.
            Some(held) => held.nonce == auth.nonce && held.tenant == auth.tenant,
        }
    }

    /// Whether `peer` holds a live session opened with cookie `cookie` (a retransmitted HELLO
    /// would get it again).
    pub fn is_open_by(&self, peer: SocketAddr, cookie: CookieTag) -> bool {
        self.slots.iter().any(|session| session.is_open() && session.peer == peer && session.cookie == cookie)
    }

    /// Whether session `id` belongs to `peer`, and its keys and tenant if it is authenticated:
    /// `None` for an unknown session, `Some(None)` for an unauthenticated one.
    pub fn auth(&self, id: u32, peer: SocketAddr) -> Option<Option<&SessionAuth>> {
        self.owned_slot(id, peer).map(|slot| self.slots[slot].auth.as_ref())
    }

    /// Seals the answer in `buffer[..len]` for session `id` of `peer` (marks it sealed and
    /// appends the trailer under the response key with the session's next counter); `None` when
    /// the session has ended meanwhile or has no keys.
    pub fn seal(&mut self, id: u32, peer: SocketAddr, buffer: &mut [u8], len: usize) -> Option<usize> {
        let slot = (id & ((1 << SLOT_BITS) - 1)) as usize;
        let session = self.slots.get_mut(slot)?;
        let current = id != 0 && (session.id == id || session.closed_id == id);
        if !current || session.peer != peer {
            return None;
        }
        let auth = session.auth.as_mut()?;
        netdam_isa::wire::mark_sealed(&mut buffer[..len]);
        let sealed = if auth.encrypt {
            buffer[3] |= netdam_isa::wire::FLAG_ENCRYPTED;
            netdam_auth::trailer::seal_encrypted(&auth.keys.response, auth.sent, buffer, len).ok()?
        } else {
            netdam_auth::trailer::seal(&auth.keys.response, auth.sent, buffer, len).ok()?
        };
        auth.sent += 1;
        Some(sealed)
    }

    /// Ends every authenticated session `refuse` names (its tenant was deleted or its key
    /// rotated); returns how many ended.
    pub fn end_sessions_where(&mut self, mut refuse: impl FnMut(&SessionAuth) -> bool) -> u64 {
        let mut ended = 0;
        for session in &mut self.slots {
            if session.is_open() && session.auth.as_ref().is_some_and(&mut refuse) {
                end(session, &self.usage);
                ended += 1;
            }
        }
        if ended > 0 {
            self.full_until = Instant::ZERO;
        }
        ended
    }

    /// Decides what to do with request `sequence` of session `id` from `peer`; a replayed answer
    /// is copied into `out`.
    pub fn admit(
        &mut self,
        now: Instant,
        id: u32,
        peer: SocketAddr,
        sequence: u64,
        idempotent: bool,
        out: &mut [u8],
    ) -> Admission {
        let Some(slot) = self.owned_slot(id, peer) else {
            return Admission::UnknownSession;
        };
        let session = &mut self.slots[slot];
        session.last_active = now;
        session.used = true;
        if sequence.saturating_add(REPLAY_WINDOW as u64) <= session.highest_sequence {
            // Beyond memory: harmless to run again if idempotent, never otherwise.
            return if idempotent { Admission::ExecuteAgain } else { Admission::Stale };
        }
        let remembered = session.window[(sequence % REPLAY_WINDOW as u64) as usize];
        if remembered.in_progress {
            // Its own retransmission is not executed again; a sequence a whole window away cannot be
            // tracked while this one executes (an initiator keeps under a window in flight), so
            // it is refused rather than allowed to overwrite the entry.
            return if remembered.sequence == sequence { Admission::InProgress } else { Admission::Stale };
        }
        if remembered.executed && remembered.sequence == sequence {
            return match remembered.stored {
                Some((start, len)) => match self.arena.get(start, len) {
                    Some(answer) if answer.len() <= out.len() => {
                        out[..answer.len()].copy_from_slice(answer);
                        Admission::Replay(answer.len())
                    }
                    _ => Admission::Stale,
                },
                None if idempotent => Admission::ExecuteAgain,
                // Executed, not idempotent, and its answer was never stored: the answer was
                // lost before it could be recorded (send failure). Never execute twice.
                None => Admission::Stale,
            };
        }
        Admission::Execute(RecordTicket { slot, id, sequence })
    }

    /// Marks a request admitted with `ticket` as executing until it is recorded, so that its
    /// retransmissions are answered in progress instead of executed a second time.
    pub fn mark_in_progress(&mut self, ticket: RecordTicket) {
        let session = &mut self.slots[ticket.slot];
        if session.id == ticket.id {
            session.in_progress += 1;
            session.window[(ticket.sequence % REPLAY_WINDOW as u64) as usize] =
                Remembered { sequence: ticket.sequence, executed: false, in_progress: true, stored: None };
        }
    }

    /// Records that a request admitted with `ticket` executed; `answer` is kept for replay when
    /// the request was not idempotent.
    pub fn record(&mut self, ticket: RecordTicket, answer: Option<&[u8]>) {
        if self.slots[ticket.slot].id != ticket.id {
            // The session ended (closed, or evicted) while the request executed.
            return;
        }
        let stored = answer.and_then(|answer| self.arena.store(answer));
        let session = &mut self.slots[ticket.slot];
        let remembered = &mut session.window[(ticket.sequence % REPLAY_WINDOW as u64) as usize];
        if remembered.in_progress && remembered.sequence == ticket.sequence {
            session.in_progress -= 1;
        }
        *remembered = Remembered { sequence: ticket.sequence, executed: true, in_progress: false, stored };
        session.highest_sequence = session.highest_sequence.max(ticket.sequence);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netdam_isa::limits::{DEFAULT_SESSIONS_PER_ADDRESS, DEFAULT_SESSIONS_PER_WORKER, DEFAULT_SESSION_IDLE_TIMEOUT};

    const LIMITS: SessionLimits = SessionLimits {
        slots: DEFAULT_SESSIONS_PER_WORKER,
        per_address: DEFAULT_SESSIONS_PER_ADDRESS,
        idle_timeout: DEFAULT_SESSION_IDLE_TIMEOUT,
    };

    fn peer(host: u8, port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, host], port))
    }

    /// A distinct cookie MAC per call site.
    fn cookie(n: u32) -> CookieTag {
        let mut tag = [0u8; 16];
        tag[..4].copy_from_slice(&n.to_le_bytes());
        tag
    }

    fn at(millis: u64) -> Instant {
        Instant::ZERO + Duration::from_millis(millis)
    }

    fn open(table: &mut SessionTable, now: Instant, peer: SocketAddr, n: u32) -> u32 {
        let opened = table.open(now, peer, cookie(n)).unwrap();
        assert!(!opened.existing);
        opened.id
    }

    #[test]
    fn non_idempotent_requests_are_replayed_not_executed_again() {
        let mut table = SessionTable::new(3, 99, LIMITS);
        let now = Instant::ZERO;
        let me = peer(1, 5000);
        let id = open(&mut table, now, me, 1);
        assert_eq!((id >> SLOT_BITS) & 63, 3, "the id names its worker");
        let mut out = [0u8; 64];
        let Admission::Execute(ticket) = table.admit(now, id, me, 1, false, &mut out) else { panic!("new sequence") };
        table.record(ticket, Some(b"answer-1"));
        assert_eq!(table.admit(now, id, me, 1, false, &mut out), Admission::Replay(8));
        assert_eq!(&out[..8], b"answer-1");
        let Admission::Execute(ticket) = table.admit(now, id, me, 2, true, &mut out) else { panic!("new sequence") };
        table.record(ticket, None);
        assert_eq!(table.admit(now, id, me, 2, true, &mut out), Admission::ExecuteAgain);
        assert_eq!(table.admit(now, id ^ (1 << 20), me, 1, true, &mut out), Admission::UnknownSession);
        let Admission::Execute(ticket) = table.admit(now, id, me, 3, false, &mut out) else { panic!("new sequence") };
        table.mark_in_progress(ticket);
        assert_eq!(table.admit(now, id, me, 3, false, &mut out), Admission::InProgress, "waiting for its block I/O");
        table.record(ticket, Some(b"answer-3"));
        assert_eq!(table.admit(now, id, me, 3, false, &mut out), Admission::Replay(8));
        assert_eq!(table.admit(now, 0, me, 1, true, &mut out), Admission::UnknownSession);
    }

    #[test]
    fn a_session_belongs_to_the_address_and_port_that_opened_it() {
        let mut table = SessionTable::new(0, 1, LIMITS);
        let me = peer(1, 5000);
        let id = open(&mut table, Instant::ZERO, me, 1);
        let mut out = [0u8; 8];
        for other in [peer(1, 5001), peer(2, 5000)] {
            assert_eq!(table.admit(Instant::ZERO, id, other, 1, true, &mut out), Admission::UnknownSession);
            assert!(!table.close(id, other), "a CLOSE from elsewhere is ignored");
        }
        assert!(matches!(table.admit(Instant::ZERO, id, me, 1, true, &mut out), Admission::Execute(_)));
        assert!(table.close(id, me));
        assert!(!table.close(id, me), "closing twice ends nothing more");
        assert_eq!(table.admit(Instant::ZERO, id, me, 2, true, &mut out), Admission::UnknownSession);
        assert_eq!(table.open_count(), 0);
    }

    #[test]
    fn the_same_cookie_finds_the_session_it_opened() {
        let mut table = SessionTable::new(0, 1, LIMITS);
        let me = peer(1, 5000);
        let id = open(&mut table, at(0), me, 7);
        for _ in 0..1000 {
            let again = table.open(at(10), me, cookie(7)).unwrap();
            assert_eq!((again.id, again.existing), (id, true), "a replayed HELLO takes no slot");
        }
        assert_eq!(table.open_count(), 1);
        let other = table.open(at(10), peer(1, 5001), cookie(7)).unwrap();
        assert!(!other.existing, "another port's HELLO is another session");
    }

    #[test]
    fn old_sequences_are_stale() {
        let mut table = SessionTable::new(0, 1, LIMITS);
        let me = peer(1, 1);
        let id = open(&mut table, Instant::ZERO, me, 1);
        let mut out = [0u8; 8];
        let far = REPLAY_WINDOW as u64 + 10;
        let Admission::Execute(ticket) = table.admit(Instant::ZERO, id, me, far, false, &mut out) else { panic!() };
        table.record(ticket, Some(b"x"));
        assert_eq!(table.admit(Instant::ZERO, id, me, 10, false, &mut out), Admission::Stale);
        assert_eq!(
            table.admit(Instant::ZERO, id, me, 10, true, &mut out),
            Admission::ExecuteAgain,
            "idempotent: run again"
        );
        assert!(matches!(table.admit(Instant::ZERO, id, me, 11, true, &mut out), Admission::Execute(_)));
    }

    #[test]
    fn overwritten_answers_make_retransmissions_stale() {
        let mut table = SessionTable::new(0, 1, LIMITS);
        let me = peer(1, 1);
        let id = open(&mut table, Instant::ZERO, me, 1);
        let mut out = vec![0u8; 65_536];
        let big = vec![7u8; 60_000];
        for sequence in 1..=(REPLAY_ARENA_BYTES / big.len()) as u64 + 2 {
            let Admission::Execute(ticket) = table.admit(Instant::ZERO, id, me, sequence, false, &mut out) else {
                panic!()
            };
            table.record(ticket, Some(&big));
        }
        assert_eq!(
            table.admit(Instant::ZERO, id, me, 1, false, &mut out),
            Admission::Stale,
            "answer 1 was overwritten"
        );
        let last = (REPLAY_ARENA_BYTES / big.len()) as u64 + 2;
        assert_eq!(table.admit(Instant::ZERO, id, me, last, false, &mut out), Admission::Replay(big.len()));
    }

    /// Runs the sweep over the whole table.
    fn sweep(table: &mut SessionTable, now: Instant) -> u64 {
        table.expire(now, table.slots.len())
    }

    #[test]
    fn unused_sessions_expire_within_a_second_and_idle_ones_after_the_timeout() {
        let limits = SessionLimits { idle_timeout: Duration::from_millis(5_000), ..LIMITS };
        let mut table = SessionTable::new(0, 1, limits);
        let unused = open(&mut table, at(0), peer(1, 1), 1);
        let used = open(&mut table, at(0), peer(1, 2), 2);
        let mut out = [0u8; 8];
        assert!(matches!(table.admit(at(10), used, peer(1, 2), 1, true, &mut out), Admission::Execute(_)));
        assert_eq!(sweep(&mut table, at(1_000)), 0, "one second is allowed");
        assert_eq!(sweep(&mut table, at(1_001)), 1);
        assert_eq!(table.admit(at(1_001), unused, peer(1, 1), 1, true, &mut out), Admission::UnknownSession);
        assert_eq!(sweep(&mut table, at(5_010)), 0, "used 5 s ago: not yet");
        assert_eq!(sweep(&mut table, at(5_011)), 1);
        assert_eq!(table.open_count(), 0);
    }

    #[test]
    fn a_session_waiting_for_block_io_does_not_expire() {
        let mut table = SessionTable::new(0, 1, LIMITS);
        let me = peer(1, 1);
        let id = open(&mut table, at(0), me, 1);
        let mut out = [0u8; 8];
        let Admission::Execute(ticket) = table.admit(at(0), id, me, 1, false, &mut out) else { panic!() };
        table.mark_in_progress(ticket);
        let much_later = at(0) + DEFAULT_SESSION_IDLE_TIMEOUT + Duration::from_millis(1);
        assert_eq!(sweep(&mut table, much_later), 0);
        table.record(ticket, Some(b"done"));
        assert_eq!(sweep(&mut table, much_later), 1, "silent since, once answered");
    }

    #[test]
    fn an_address_at_its_share_is_refused_unless_it_has_an_idle_session() {
        let limits = SessionLimits { per_address: 4, ..LIMITS };
        let mut table = SessionTable::new(0, 1, limits);
        let mut out = [0u8; 8];
        let ids: Vec<u32> = (0..4).map(|port| open(&mut table, at(0), peer(1, port), u32::from(port))).collect();
        for (port, id) in ids.iter().enumerate() {
            assert!(matches!(
                table.admit(at(500), *id, peer(1, port as u16), 1, true, &mut out),
                Admission::Execute(_)
            ));
        }
        let refused = table.open(at(600), peer(1, 10), cookie(10));
        assert_eq!(refused, Err(OpenRefusal::AddressLimit { expired: 0 }));
        assert!(table.open(at(600), peer(2, 10), cookie(10)).is_ok(), "another address is served");
        // Session 2 goes quiet: after a second it is idle, and the address may replace it.
        for (port, id) in ids.iter().enumerate().filter(|(port, _)| *port != 2) {
            assert!(matches!(
                table.admit(at(1_400), *id, peer(1, port as u16), 2, true, &mut out),
                Admission::Execute(_)
            ));
        }
        let opened = table.open(at(1_600), peer(1, 11), cookie(11)).unwrap();
        assert!(opened.evicted);
        assert_eq!(opened.id & 0x3FF, ids[2] & 0x3FF, "the idle session's slot");
        assert_eq!(table.admit(at(1_600), ids[2], peer(1, 2), 2, true, &mut out), Admission::UnknownSession);
    }

    #[test]
    fn a_full_table_evicts_the_longest_idle_session_of_the_largest_holder_only() {
        let limits = SessionLimits { slots: 16, per_address: 8, ..LIMITS };
        let mut table = SessionTable::new(0, 1, limits);
        let mut out = [0u8; 8];
        // Host 1 holds 8, hosts 2 and 3 hold 4 each; every session sends at t = 100 ms except
        // host 1's port 5 (last heard at 50 ms) and host 2's port 0 (last heard at 10 ms).
        let mut sessions = Vec::new();
        for (host, count) in [(1u8, 8u16), (2, 4), (3, 4)] {
            for port in 0..count {
                let id = open(&mut table, at(0), peer(host, port), u32::from(host) * 100 + u32::from(port));
                sessions.push((host, port, id));
            }
        }
        for &(host, port, id) in &sessions {
            let when = match (host, port) {
                (1, 5) => 50,
                (2, 0) => 10,
                _ => 100,
            };
            assert!(matches!(table.admit(at(when), id, peer(host, port), 1, true, &mut out), Admission::Execute(_)));
        }
        let newcomer = peer(4, 0);
        assert_eq!(
            table.open(at(900), newcomer, cookie(400)),
            Err(OpenRefusal::TableFull { expired: 0 }),
            "host 1's sessions are all active"
        );
        // At 1.05 s host 1's port 5 has been silent a second: idle. Host 2's port 0 has been idle
        // longer, but host 2 holds fewer sessions, so it stays.
        let opened = table.open(at(1_050), newcomer, cookie(400)).unwrap();
        assert!(opened.evicted);
        let (_, _, victim) = sessions.iter().copied().find(|&(host, port, _)| (host, port) == (1, 5)).unwrap();
        assert_eq!(opened.id & 0x3FF, victim & 0x3FF);
        assert_eq!(table.admit(at(1_050), victim, peer(1, 5), 2, true, &mut out), Admission::UnknownSession);
        assert_eq!(table.open_count(), 16);
    }

    #[test]
    fn a_sequence_a_window_away_from_one_in_progress_is_refused_and_cannot_pin_the_session() {
        let mut table = SessionTable::new(0, 1, LIMITS);
        let me = peer(1, 1);
        let id = open(&mut table, at(0), me, 1);
        let mut out = [0u8; 8];
        let Admission::Execute(first) = table.admit(at(0), id, me, 5, true, &mut out) else { panic!() };
        table.mark_in_progress(first);
        let far = 5 + REPLAY_WINDOW as u64;
        assert_eq!(table.admit(at(0), id, me, far, true, &mut out), Admission::Stale, "its window entry is taken");
        table.record(first, None);
        let later = at(0) + DEFAULT_SESSION_IDLE_TIMEOUT + Duration::from_millis(1);
        assert_eq!(sweep(&mut table, later), 1, "nothing left in progress: it expires");
    }

    #[test]
    fn a_full_table_passes_over_a_larger_holder_with_no_idle_session_and_never_evicts_io_in_flight() {
        let limits = SessionLimits { slots: 16, per_address: 10, ..LIMITS };
        let mut table = SessionTable::new(0, 1, limits);
        let mut out = [0u8; 8];
        // Host 1 holds 10 active sessions; host 2 holds 6, of which port 0 waits for block I/O
        // and port 1 has been quiet since 0 ms.
        let mut host2 = Vec::new();
        for port in 0..10u16 {
            let id = open(&mut table, at(0), peer(1, port), 100 + u32::from(port));
            assert!(matches!(table.admit(at(1_500), id, peer(1, port), 1, true, &mut out), Admission::Execute(_)));
        }
        for port in 0..6u16 {
            let id = open(&mut table, at(0), peer(2, port), 200 + u32::from(port));
            let Admission::Execute(ticket) = table.admit(at(0), id, peer(2, port), 1, true, &mut out) else { panic!() };
            match port {
                0 => table.mark_in_progress(ticket),
                1 => {}
                _ => assert!(matches!(
                    table.admit(at(1_500), id, peer(2, port), 2, true, &mut out),
                    Admission::Execute(_)
                )),
            }
            host2.push(id);
        }
        let opened = table.open(at(1_600), peer(3, 0), cookie(300)).unwrap();
        assert!(opened.evicted);
        assert_eq!(opened.id & 0x3FF, host2[1] & 0x3FF, "host 2's quiet session, not the one waiting for I/O");
        assert_eq!(table.open(at(1_600), peer(3, 1), cookie(301)), Err(OpenRefusal::TableFull { expired: 0 }));
    }

    #[test]
    fn ipv6_senders_are_counted_by_their_64_bit_prefix() {
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(AddressKey::of(a), AddressKey::of(b));
        assert_ne!(AddressKey::of(a), AddressKey::of(c));
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        assert_eq!(AddressKey::of(mapped), AddressKey::of("127.0.0.1".parse().unwrap()));
        assert_ne!(AddressKey::of("127.0.0.2".parse().unwrap()), AddressKey::of("127.0.0.1".parse().unwrap()));
    }
}
