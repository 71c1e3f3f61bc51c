//! One worker's sessions: which initiators it knows, and the replay window that makes
//! non-idempotent instructions execute at most once.
//!
//! SO_REUSEPORT sends every datagram of one initiator socket to the same worker, so each worker
//! owns its sessions outright: no lock, no sharing. A session id carries its slot (bits 0..8),
//! the worker (bits 8..14) and a generation (above), so lookup is one array access and an id
//! from a closed session or an earlier target run does not match a new one.
//!
//! Per session the table remembers the last `REPLAY_WINDOW` sequences executed. A retransmitted
//! request is answered from the stored response when it was not idempotent and executed again
//! when it was; a non-idempotent request older than the window, or whose stored answer has been
//! overwritten, is refused `stale`. Stored answers live in a fixed ring of bytes, so memory never grows.

use netdam_isa::limits::{REPLAY_ARENA_BYTES, REPLAY_WINDOW, SESSIONS_PER_WORKER};
use netdam_isa::{Duration, Instant};

/// How long a session may stay silent before a new HELLO may take its slot.
pub const SESSION_IDLE_TIMEOUT: Duration = Duration::from_millis(30_000);

const SLOT_BITS: u32 = 8;
const WORKER_BITS: u32 = 6;

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
    /// Still executing (waiting for block I/O): drop it, the answer is on its way.
    InProgress,
    /// No such session: answer `no_session`.
    UnknownSession,
}

/// Where to record an executed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordTicket {
    slot: usize,
    id: u32,
    sequence: u64,
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

#[derive(Debug, Clone)]
struct Session {
    id: u32,
    last_active: Instant,
    highest_sequence: u64,
    window: Box<[Remembered]>,
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

/// Counters of session events, for STAT.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionEvents {
    /// Sessions opened.
    pub opened: u64,
    /// Idle sessions whose slot a new HELLO took.
    pub evicted: u64,
}

/// The sessions of one worker.
#[derive(Debug)]
pub struct SessionTable {
    worker: u32,
    generation: u32,
    slots: Vec<Session>,
    arena: ReplayArena,
    events: SessionEvents,
}

impl SessionTable {
    /// The table of worker `worker`; `epoch` (e.g. the start time) seeds the generation so ids of
    /// an earlier run are not reused.
    pub fn new(worker: usize, epoch: u64) -> SessionTable {
        assert!(worker < 1 << WORKER_BITS, "worker index does not fit a session id");
        let empty = Session {
            id: 0,
            last_active: Instant::ZERO,
            highest_sequence: 0,
            window: vec![Remembered::default(); REPLAY_WINDOW].into_boxed_slice(),
        };
        SessionTable {
            worker: worker as u32,
            generation: (epoch ^ (epoch >> 32)) as u32,
            slots: vec![empty; SESSIONS_PER_WORKER],
            arena: ReplayArena { bytes: vec![0u8; REPLAY_ARENA_BYTES].into_boxed_slice(), position: 0 },
            events: SessionEvents::default(),
        }
    }

    /// Counters so far.
    pub fn events(&self) -> SessionEvents {
        self.events
    }

    /// Opens a session, reusing a free slot or the longest-idle one silent for over
    /// `SESSION_IDLE_TIMEOUT`; `None` when every slot is busy.
    pub fn open(&mut self, now: Instant) -> Option<u32> {
        let free = self.slots.iter().position(|session| session.id == 0);
        let slot = free.or_else(|| {
            let (slot, session) = self.slots.iter().enumerate().min_by_key(|(_, session)| session.last_active)?;
            (now.saturating_since(session.last_active) > SESSION_IDLE_TIMEOUT).then_some(slot)
        })?;
        if free.is_none() {
            self.events.evicted += 1;
        }
        loop {
            self.generation = self.generation.wrapping_add(1);
            let id = (self.generation << (SLOT_BITS + WORKER_BITS)) | (self.worker << SLOT_BITS) | slot as u32;
            // Id 0 means "no session".
            if id != 0 {
                let session = &mut self.slots[slot];
                session.id = id;
                session.last_active = now;
                session.highest_sequence = 0;
                session.window.fill(Remembered::default());
                self.events.opened += 1;
                return Some(id);
            }
        }
    }

    /// Decides what to do with request `sequence` of session `id`; a replayed answer is copied
    /// into `out`.
    pub fn admit(&mut self, now: Instant, id: u32, sequence: u64, idempotent: bool, out: &mut [u8]) -> Admission {
        let slot = (id & ((1 << SLOT_BITS) - 1)) as usize;
        let Some(session) = self.slots.get_mut(slot).filter(|session| session.id == id && id != 0) else {
            return Admission::UnknownSession;
        };
        session.last_active = now;
        if sequence.saturating_add(REPLAY_WINDOW as u64) <= session.highest_sequence {
            // Beyond memory: harmless to run again if idempotent, never otherwise.
            return if idempotent { Admission::ExecuteAgain } else { Admission::Stale };
        }
        let remembered = session.window[(sequence % REPLAY_WINDOW as u64) as usize];
        if remembered.in_progress && remembered.sequence == sequence {
            return Admission::InProgress;
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
    /// retransmissions are dropped instead of executed a second time.
    pub fn mark_in_progress(&mut self, ticket: RecordTicket) {
        let session = &mut self.slots[ticket.slot];
        if session.id == ticket.id {
            session.window[(ticket.sequence % REPLAY_WINDOW as u64) as usize] =
                Remembered { sequence: ticket.sequence, executed: false, in_progress: true, stored: None };
        }
    }

    /// Records that a request admitted with `ticket` executed; `answer` is kept for replay when
    /// the request was not idempotent.
    pub fn record(&mut self, ticket: RecordTicket, answer: Option<&[u8]>) {
        if self.slots[ticket.slot].id != ticket.id {
            // The session was replaced while the request waited for block I/O.
            return;
        }
        let stored = answer.and_then(|answer| self.arena.store(answer));
        let session = &mut self.slots[ticket.slot];
        session.window[(ticket.sequence % REPLAY_WINDOW as u64) as usize] =
            Remembered { sequence: ticket.sequence, executed: true, in_progress: false, stored };
        session.highest_sequence = session.highest_sequence.max(ticket.sequence);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_idempotent_requests_are_replayed_not_executed_again() {
        let mut table = SessionTable::new(3, 99);
        let now = Instant::ZERO;
        let id = table.open(now).unwrap();
        assert_eq!((id >> SLOT_BITS) & 63, 3, "the id names its worker");
        let mut out = [0u8; 64];
        let Admission::Execute(ticket) = table.admit(now, id, 1, false, &mut out) else { panic!("new sequence") };
        table.record(ticket, Some(b"answer-1"));
        assert_eq!(table.admit(now, id, 1, false, &mut out), Admission::Replay(8));
        assert_eq!(&out[..8], b"answer-1");
        let Admission::Execute(ticket) = table.admit(now, id, 2, true, &mut out) else { panic!("new sequence") };
        table.record(ticket, None);
        assert_eq!(table.admit(now, id, 2, true, &mut out), Admission::ExecuteAgain);
        assert_eq!(table.admit(now, id ^ (1 << 20), 1, true, &mut out), Admission::UnknownSession);
        let Admission::Execute(ticket) = table.admit(now, id, 3, false, &mut out) else { panic!("new sequence") };
        table.mark_in_progress(ticket);
        assert_eq!(table.admit(now, id, 3, false, &mut out), Admission::InProgress, "waiting for its block I/O");
        table.record(ticket, Some(b"answer-3"));
        assert_eq!(table.admit(now, id, 3, false, &mut out), Admission::Replay(8));
        assert_eq!(table.admit(now, 0, 1, true, &mut out), Admission::UnknownSession);
    }

    #[test]
    fn old_sequences_are_stale() {
        let mut table = SessionTable::new(0, 1);
        let id = table.open(Instant::ZERO).unwrap();
        let mut out = [0u8; 8];
        let far = REPLAY_WINDOW as u64 + 10;
        let Admission::Execute(ticket) = table.admit(Instant::ZERO, id, far, false, &mut out) else { panic!() };
        table.record(ticket, Some(b"x"));
        assert_eq!(table.admit(Instant::ZERO, id, 10, false, &mut out), Admission::Stale);
        assert_eq!(
            table.admit(Instant::ZERO, id, 10, true, &mut out),
            Admission::ExecuteAgain,
            "idempotent: run again"
        );
        assert!(matches!(table.admit(Instant::ZERO, id, 11, true, &mut out), Admission::Execute(_)));
    }

    #[test]
    fn overwritten_answers_make_retransmissions_stale() {
        let mut table = SessionTable::new(0, 1);
        let id = table.open(Instant::ZERO).unwrap();
        let mut out = vec![0u8; 65_536];
        let big = vec![7u8; 60_000];
        for sequence in 1..=(REPLAY_ARENA_BYTES / big.len()) as u64 + 2 {
            let Admission::Execute(ticket) = table.admit(Instant::ZERO, id, sequence, false, &mut out) else {
                panic!()
            };
            table.record(ticket, Some(&big));
        }
        assert_eq!(table.admit(Instant::ZERO, id, 1, false, &mut out), Admission::Stale, "answer 1 was overwritten");
        let last = (REPLAY_ARENA_BYTES / big.len()) as u64 + 2;
        assert_eq!(table.admit(Instant::ZERO, id, last, false, &mut out), Admission::Replay(big.len()));
    }

    #[test]
    fn a_full_table_evicts_only_idle_sessions() {
        let mut table = SessionTable::new(0, 1);
        let start = Instant::ZERO;
        let ids: Vec<u32> = (0..SESSIONS_PER_WORKER).map(|_| table.open(start).unwrap()).collect();
        assert_eq!(table.open(start + Duration::from_millis(1)), None, "every session is recent");
        let later = start + SESSION_IDLE_TIMEOUT + Duration::from_millis(1);
        let mut out = [0u8; 8];
        assert!(matches!(table.admit(later, ids[1], 1, true, &mut out), Admission::Execute(_)));
        let new = table.open(later).unwrap();
        assert_eq!(new & 0xFF, ids[0] & 0xFF, "the idle slot 0 is reused, not the active slot 1");
        assert_eq!(table.admit(later, ids[0], 1, true, &mut out), Admission::UnknownSession);
        assert_eq!(table.events().evicted, 1);
    }
}
