//! What a worker does with one datagram, apart from the socket: decode, execute every
//! instruction in order, and write the response. Sans-IO: it takes bytes and writes bytes, so
//! tests and the simulator drive it without a network.
//!
//! Datagrams that cannot be attributed (too short, wrong magic, bad CRC, a response) are dropped
//! and counted; a readable datagram that breaks the framing gets a datagram-level status; every
//! instruction of a well-framed request gets its own status, and a failed instruction does not
//! stop the ones after it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use netdam_isa::control::{decode_hello_operand, encode_hello_answer, StatWriter};
use netdam_isa::engine::Engine;
use netdam_isa::limits::{MAX_INSTRUCTIONS_PER_DATAGRAM, MIN_DATAGRAM_BYTES};
use netdam_isa::wire::{
    peek_is_response, peek_session_sequence, DecodeError, Disposition, Instruction, Request, ResponseWriter,
};
use netdam_isa::{Opcode, Status};
use netdam_pmem::Durability;

use crate::regions::RegionTable;
use crate::stats::{status_counter_name, Counter, WorkerStats};

/// STAT entries that describe the target rather than count events.
pub const TARGET_STAT_ENTRIES: usize = 3;

/// State every worker of one target shares; read-mostly.
#[derive(Debug)]
pub struct Shared {
    /// The regions served.
    pub regions: Arc<RegionTable>,
    /// Each worker's counters, by worker index.
    pub stats: Arc<[WorkerStats]>,
    /// Largest datagram received or sent.
    pub max_datagram_bytes: usize,
    next_session: AtomicU32,
}

impl Shared {
    /// State for `workers` workers over `regions`.
    pub fn new(regions: Arc<RegionTable>, workers: usize, max_datagram_bytes: usize) -> Shared {
        Shared {
            regions,
            stats: (0..workers).map(|_| WorkerStats::default()).collect(),
            max_datagram_bytes,
            next_session: AtomicU32::new(1),
        }
    }

    /// Sessions handed out by HELLO so far.
    pub fn sessions_opened(&self) -> u64 {
        u64::from(self.next_session.load(Ordering::Relaxed) - 1)
    }

    fn open_session(&self) -> u32 {
        loop {
            let session = self.next_session.fetch_add(1, Ordering::Relaxed);
            // Session 0 means "no session"; skip it when the counter wraps.
            if session != 0 {
                return session;
            }
        }
    }
}

/// One worker's datagram handler.
#[derive(Debug)]
pub struct Dispatcher<E> {
    engine: E,
    shared: Arc<Shared>,
    worker: usize,
}

impl<E: Engine> Dispatcher<E> {
    /// The handler of worker `worker`, executing with `engine`.
    pub fn new(engine: E, shared: Arc<Shared>, worker: usize) -> Dispatcher<E> {
        assert!(worker < shared.stats.len(), "worker index beyond the stats table");
        Dispatcher { engine, shared, worker }
    }

    fn stats(&self) -> &WorkerStats {
        &self.shared.stats[self.worker]
    }

    /// Handles one received datagram. Returns the response to send, still to be finished with the
    /// TTL, service time and queue depth, or `None` when the datagram is dropped.
    ///
    /// `out` must be `max_datagram_bytes` long.
    pub fn handle<'b>(&mut self, datagram: &[u8], out: &'b mut [u8]) -> Option<ResponseWriter<'b>> {
        self.stats().add(Counter::DatagramsReceived, 1);
        if peek_is_response(datagram) {
            // Answering a response could start a loop between two targets.
            self.stats().add(Counter::DroppedNotRequest, 1);
            return None;
        }
        let request = match Request::parse(datagram) {
            Ok(request) => request,
            Err(error) => return self.refuse(datagram, error, out),
        };
        let mut response = ResponseWriter::new(out, request.header.session, request.header.sequence);
        for instruction in request.instructions() {
            let capacity = response.data_capacity();
            let result = self.execute(&instruction, &mut response.data_area()[..capacity]);
            let (status, data_len) = match result {
                Ok(data_len) => (Status::Ok, data_len),
                Err(status) => (status, 0),
            };
            self.stats().count_status(status);
            response.commit(instruction.opcode, status, data_len);
        }
        self.stats().add(Counter::InstructionsExecuted, u64::from(response.count()));
        Some(response)
    }

    fn refuse<'b>(&mut self, datagram: &[u8], error: DecodeError, out: &'b mut [u8]) -> Option<ResponseWriter<'b>> {
        let counter = match (error, error.disposition()) {
            (DecodeError::TooShort, _) => Counter::DroppedTooShort,
            (DecodeError::BadMagic, _) => Counter::DroppedBadMagic,
            (DecodeError::BadCrc, _) => Counter::DroppedBadCrc,
            (_, Disposition::Drop) => Counter::DroppedNotRequest,
            (DecodeError::UnsupportedVersion(_), Disposition::Answer(_)) => Counter::AnsweredUnsupportedVersion,
            (_, Disposition::Answer(_)) => Counter::AnsweredMalformed,
        };
        self.stats().add(counter, 1);
        let Disposition::Answer(status) = error.disposition() else {
            return None;
        };
        // A readable header names the request; the answer is no longer than it (no amplification).
        let (session, sequence) = peek_session_sequence(datagram)?;
        let mut response = ResponseWriter::new(out, session, sequence);
        response.set_status(status);
        Some(response)
    }

    fn execute(&mut self, instruction: &Instruction<'_>, out: &mut [u8]) -> Result<usize, Status> {
        match Opcode::from_u8(instruction.opcode) {
            Some(Opcode::Hello) => self.hello(instruction, out),
            Some(Opcode::Ping) => control_fields_empty(instruction).map(|()| 0),
            Some(Opcode::Stat) => {
                control_fields_empty(instruction)?;
                self.stat(out)
            }
            _ => self.engine.execute(instruction, out),
        }
    }

    fn hello(&mut self, instruction: &Instruction<'_>, out: &mut [u8]) -> Result<usize, Status> {
        let plain = Instruction { operand: &[], ..*instruction };
        control_fields_empty(&plain)?;
        let requested = decode_hello_operand(instruction.operand)?;
        if (requested as usize) < MIN_DATAGRAM_BYTES {
            return Err(Status::Malformed);
        }
        let negotiated = (requested as usize).min(self.shared.max_datagram_bytes) as u32;
        let regions = self.shared.regions.iter().map(|(id, region)| {
            (id, region.name(), region.len() as u64, region.durability() == Durability::Persistent)
        });
        let session = self.shared.open_session();
        encode_hello_answer(out, session, negotiated, MAX_INSTRUCTIONS_PER_DATAGRAM as u16, regions)
    }

    fn stat(&self, out: &mut [u8]) -> Result<usize, Status> {
        // Summed in place: STAT allocates nothing either.
        let workers = &self.shared.stats;
        let mut writer = StatWriter::new(out)?;
        writer.push("workers", self.shared.stats.len() as u64)?;
        writer.push("regions", self.shared.regions.iter().len() as u64)?;
        writer.push("sessions_opened", self.shared.sessions_opened())?;
        for counter in Counter::ALL {
            writer.push(counter.name(), workers.iter().map(|worker| worker.get(*counter)).sum())?;
        }
        for status in Status::ALL {
            writer.push(status_counter_name(status), workers.iter().map(|worker| worker.status_count(status)).sum())?;
        }
        Ok(writer.finish())
    }
}

/// Control instructions address nothing: every field but the opcode is zero.
fn control_fields_empty(instruction: &Instruction<'_>) -> Result<(), Status> {
    let empty = instruction.flags == 0
        && instruction.space == 0
        && instruction.offset == 0
        && instruction.length == 0
        && instruction.aux == 0
        && instruction.operand.is_empty();
    if empty {
        Ok(())
    } else {
        Err(Status::Malformed)
    }
}

impl<E> Dispatcher<E> {
    /// Counts an event the driver saw (oversized datagrams, socket errors).
    pub fn count(&self, counter: Counter) {
        self.shared.stats[self.worker].add(counter, 1);
    }
}
