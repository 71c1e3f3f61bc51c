//! What a worker does with one datagram, apart from the socket: decode, execute every
//! instruction in order, and write the response. Sans-IO: it takes bytes and writes bytes, so
//! tests and the simulator drive it without a network.
//!
//! Datagrams that cannot be attributed (too short, wrong magic, bad CRC, a response) are dropped
//! and counted; a readable datagram that breaks the framing gets a datagram-level status; every
//! instruction of a well-framed request gets its own status, and a failed instruction does not
//! stop the ones after it.

use std::sync::Arc;

use netdam_isa::block::BlockOp;
use netdam_isa::control::{decode_hello_operand, encode_hello_answer, StatWriter};
use netdam_isa::engine::Engine;
use netdam_isa::limits::{MAX_INSTRUCTIONS_PER_DATAGRAM, MIN_DATAGRAM_BYTES};
use netdam_isa::wire::{
    peek_is_response, peek_session_sequence, DecodeError, Disposition, Instruction, Request, ResponseWriter,
    RESPONSE_INSTRUCTION_HEADER_LEN,
};
use netdam_isa::{Duration, Instant, Opcode, Status};
use netdam_nvme::{BlockDevice, BlockRequest, BufferIndex};
use netdam_pmem::Durability;

use crate::block::{self, BlockPath, Pending, ReplyTo, RunEntry};
use crate::namespaces::NamespaceTable;
use crate::regions::RegionTable;
use crate::sessions::{Admission, RecordTicket, SessionTable};
use crate::stats::{Counter, WorkerStats, STATUS_COUNTER_PREFIX};

/// STAT entries that describe the target rather than count events.
pub const TARGET_STAT_ENTRIES: usize = 3;

/// State every worker of one target shares; read-mostly.
#[derive(Debug)]
pub struct Shared {
    /// The regions served.
    pub regions: Arc<RegionTable>,
    /// The block namespaces served.
    pub namespaces: Arc<NamespaceTable>,
    /// Each worker's counters, by worker index.
    pub stats: Arc<[WorkerStats]>,
    /// Largest datagram received or sent.
    pub max_datagram_bytes: usize,
    /// Distinguishes this run's session ids from an earlier run's (e.g. the start time).
    pub epoch: u64,
    /// A request that queued longer than this is answered BUSY instead of executed.
    pub busy_threshold: Duration,
}

impl Shared {
    /// State for `workers` workers over `regions` and `namespaces`.
    pub fn new(
        regions: Arc<RegionTable>,
        namespaces: Arc<NamespaceTable>,
        workers: usize,
        max_datagram_bytes: usize,
        epoch: u64,
        busy_threshold: Duration,
    ) -> Shared {
        let stats = (0..workers).map(|_| WorkerStats::default()).collect();
        Shared { regions, namespaces, stats, max_datagram_bytes, epoch, busy_threshold }
    }
}

/// What to do with a handled datagram.
#[derive(Debug)]
pub enum Handled<'b> {
    /// Nothing to send (dropped and counted).
    Dropped,
    /// Send this response once finished; then `record` it if a ticket is given.
    Answer {
        /// The response, to be finished with TTL, service time and queue depth.
        response: ResponseWriter<'b>,
        /// Where to record the executed request, and whether its answer must be stored.
        record: Option<(RecordTicket, bool)>,
    },
    /// Send the first `len` bytes of `out` as they are: a stored answer replayed.
    Replay(usize),
    /// Waiting for block I/O in this slot: the driver says where the answer goes
    /// ([`Dispatcher::set_reply_to`]) and sends it when [`Dispatcher::poll_block`] hands it over.
    Deferred(u16),
}

/// One worker's datagram handler.
#[derive(Debug)]
pub struct Dispatcher<E> {
    engine: E,
    shared: Arc<Shared>,
    worker: usize,
    sessions: SessionTable,
    block: BlockPath,
}

impl<E: Engine> Dispatcher<E> {
    /// The handler of worker `worker`, executing memory instructions with `engine` and block
    /// instructions on `devices` (this worker's, by namespace id).
    pub fn new(engine: E, shared: Arc<Shared>, worker: usize, devices: Vec<Box<dyn BlockDevice>>) -> Dispatcher<E> {
        assert!(worker < shared.stats.len(), "worker index beyond the stats table");
        let sessions = SessionTable::new(worker, shared.epoch);
        let block = BlockPath::new(devices, shared.max_datagram_bytes);
        Dispatcher { engine, shared, worker, sessions, block }
    }

    /// This worker's counters.
    pub fn stats(&self) -> &WorkerStats {
        &self.shared.stats[self.worker]
    }

    /// Handles one datagram whose execution starts at `now` after it queued for `queueing`.
    /// `out` must be `max_datagram_bytes` long.
    pub fn handle<'b>(&mut self, now: Instant, queueing: Duration, datagram: &[u8], out: &'b mut [u8]) -> Handled<'b> {
        self.stats().add(Counter::DatagramsReceived, 1);
        if peek_is_response(datagram) {
            // Answering a response could start a loop between two targets.
            self.stats().add(Counter::DroppedNotRequest, 1);
            return Handled::Dropped;
        }
        let request = match Request::parse(datagram) {
            Ok(request) => request,
            Err(error) => return self.refuse(datagram, error, out),
        };
        let header = request.header;
        let queueing_us = u16::try_from(queueing.as_nanos() / 1000).unwrap_or(u16::MAX);
        if queueing > self.shared.busy_threshold {
            // Overloaded: the queue is the problem, so do not add to it. The initiator waits about
            // as long as this request waited, then retries; nothing was executed.
            self.count(Counter::AnsweredBusy);
            let mut response = ResponseWriter::new(out, header.session, header.sequence);
            response.set_status(Status::Busy);
            response.set_queueing_us(queueing_us);
            return Handled::Answer { response, record: None };
        }
        let mut record = None;
        if header.session != 0 {
            let idempotent = request.instructions().all(|instruction| instruction.is_idempotent());
            match self.sessions.admit(now, header.session, header.sequence, idempotent, out) {
                Admission::Execute(ticket) => record = Some((ticket, !idempotent)),
                Admission::ExecuteAgain => self.count(Counter::DuplicatesExecutedAgain),
                Admission::Replay(len) => {
                    self.count(Counter::DuplicatesReplayed);
                    return Handled::Replay(len);
                }
                Admission::Stale => return self.datagram_status(out, header.session, header.sequence, Status::Stale),
                Admission::InProgress => {
                    self.count(Counter::DuplicatesInProgress);
                    return Handled::Dropped;
                }
                Admission::UnknownSession => {
                    return self.datagram_status(out, header.session, header.sequence, Status::NoSession);
                }
            }
        } else if !request.instructions().all(|instruction| is_control(instruction.opcode)) {
            // Without a session only HELLO, PING and STAT: anything else needs the replay window.
            return self.datagram_status(out, 0, header.sequence, Status::NoSession);
        }
        let serves_blocks = !self.block.devices.is_empty();
        if serves_blocks && request.instructions().any(|instruction| is_block(instruction.opcode)) {
            return self.defer(now, queueing, queueing_us, datagram, record, out);
        }
        let mut response = ResponseWriter::new(out, header.session, header.sequence);
        response.set_queueing_us(queueing_us);
        for instruction in request.instructions() {
            self.execute_into(now, &instruction, &mut response);
        }
        self.stats().add(Counter::InstructionsExecuted, u64::from(response.count()));
        Handled::Answer { response, record }
    }

    /// Executes one memory or control instruction and writes its result.
    fn execute_into(&mut self, now: Instant, instruction: &Instruction<'_>, response: &mut ResponseWriter<'_>) {
        let capacity = response.data_capacity();
        let result = self.execute(now, instruction, &mut response.data_area()[..capacity]);
        let (status, data_len) = match result {
            Ok(data_len) => (Status::Ok, data_len),
            Err(status) => (status, 0),
        };
        self.stats().count_status(status);
        response.commit(instruction.opcode, status, data_len);
    }

    /// Takes a datagram with block instructions into a pending slot and starts executing it.
    fn defer<'b>(
        &mut self,
        now: Instant,
        queueing: Duration,
        queueing_us: u16,
        datagram: &[u8],
        record: Option<(RecordTicket, bool)>,
        out: &'b mut [u8],
    ) -> Handled<'b> {
        let (session, sequence) = peek_session_sequence(datagram).expect("a parsed request has a header");
        let Some(slot) = self.block.free_slots.pop() else {
            // Nothing was executed: the initiator backs off and sends it again.
            self.count(Counter::BusyBlockSlotsFull);
            let mut response = ResponseWriter::new(out, session, sequence);
            response.set_status(Status::Busy);
            response.set_queueing_us(queueing_us);
            return Handled::Answer { response, record: None };
        };
        self.count(Counter::BlockDatagramsDeferred);
        if let Some((ticket, _)) = record {
            self.sessions.mark_in_progress(ticket);
        }
        let pending = &mut self.block.slots[usize::from(slot)];
        pending.request[..datagram.len()].copy_from_slice(datagram);
        pending.request_len = datagram.len();
        let mut response = ResponseWriter::new(&mut pending.response, session, sequence);
        response.set_queueing_us(queueing_us);
        pending.progress = Some(response.suspend());
        pending.next_instruction = 0;
        pending.run_len = 0;
        pending.outstanding = 0;
        pending.record = record;
        pending.reply_to = None;
        pending.queueing = queueing;
        pending.started = now;
        self.advance(now, slot);
        Handled::Deferred(slot)
    }

    /// Keeps the kernel's helper threads for this worker's block devices on `cpus` (called from
    /// the worker's thread once it is pinned).
    pub fn place_block_helpers(&mut self, cpus: &[usize]) {
        for device in &mut self.block.devices {
            if let Err(error) = device.place_helpers(cpus) {
                tracing::warn!(worker = self.worker, %error, "cannot place io_uring helper threads");
            }
        }
    }

    /// Says where the answer of the datagram deferred in `slot` goes.
    pub fn set_reply_to(&mut self, slot: u16, reply_to: ReplyTo) {
        self.block.slots[usize::from(slot)].reply_to = Some(reply_to);
    }

    /// Datagrams waiting for block I/O (or to be sent): while any are, the driver must keep
    /// calling [`Dispatcher::poll_block`] rather than sleep.
    pub fn block_pending(&self) -> usize {
        self.block.pending()
    }

    /// Reaps block completions, continues the datagrams they complete, and hands each finished
    /// answer to `send` with where it goes; returns how many were handed over.
    pub fn poll_block(&mut self, now: Instant, send: &mut dyn FnMut(ReplyTo, &[u8])) -> usize {
        if self.block.pending() == 0 {
            return 0;
        }
        self.block.reap();
        while let Some(slot) = self.block.ready.pop() {
            let mut pending = std::mem::take(&mut self.block.slots[usize::from(slot)]);
            self.write_run_results(&mut pending);
            self.block.slots[usize::from(slot)] = pending;
            self.advance(now, slot);
        }
        let mut sent = 0;
        while let Some(slot) = self.block.finished.pop() {
            let mut pending = std::mem::take(&mut self.block.slots[usize::from(slot)]);
            let progress = pending.progress.take().expect("a finished answer has its progress");
            let response = ResponseWriter::resume(&mut pending.response, progress);
            let count = response.count();
            let held = pending.queueing + now.saturating_since(pending.started);
            let service_time_ns = u32::try_from(held.as_nanos()).unwrap_or(u32::MAX);
            let depth = u16::try_from(self.block.pending() - 1).unwrap_or(u16::MAX);
            let reply_to = pending.reply_to.expect("the driver set where the answer goes");
            let len = response.finish(reply_to.ttl, service_time_ns, depth);
            self.stats().add(Counter::InstructionsExecuted, u64::from(count));
            if let Some((ticket, store)) = pending.record.take() {
                self.sessions.record(ticket, store.then_some(&pending.response[..len]));
            }
            // Counted before the send, like every answer (see the worker).
            self.count(Counter::ResponsesSent);
            send(reply_to, &pending.response[..len]);
            sent += 1;
            self.block.slots[usize::from(slot)] = pending;
            self.block.free_slots.push(slot);
        }
        sent
    }

    /// Executes the datagram in `slot` from its next instruction until it waits for a run of
    /// block requests or is finished.
    fn advance(&mut self, now: Instant, slot: u16) {
        // Taken out of the table so the engine and sessions can be used alongside it; moving the
        // boxes allocates nothing.
        let mut pending = std::mem::take(&mut self.block.slots[usize::from(slot)]);
        let waiting = self.advance_pending(now, slot, &mut pending);
        self.block.slots[usize::from(slot)] = pending;
        if !waiting {
            self.block.finished.push(slot);
        }
    }

    /// Returns whether the datagram now waits for block I/O.
    fn advance_pending(&mut self, now: Instant, slot: u16, pending: &mut Pending) -> bool {
        let Pending { request, request_len, response, progress, next_instruction, run, run_len, outstanding, .. } =
            pending;
        let request = Request::parse(&request[..*request_len]).expect("the datagram was accepted before");
        let mut response = ResponseWriter::resume(response, progress.take().expect("a pending answer"));
        let mut instructions = request.instructions().skip(*next_instruction).peekable();
        while let Some(instruction) = instructions.next() {
            *next_instruction += 1;
            if !is_block(instruction.opcode) {
                self.execute_into(now, &instruction, &mut response);
                continue;
            }
            // A run: this block instruction and the ones right after it, but a FLUSH runs alone
            // so that every write before it has completed when it is submitted.
            *run_len = 0;
            let mut reserved = 0;
            let mut current = instruction;
            loop {
                let room = response.data_capacity().saturating_sub(reserved);
                let entry = self.submit_block(slot, *run_len, &current, room);
                reserved += RESPONSE_INSTRUCTION_HEADER_LEN + entry.data_len;
                run[*run_len] = entry;
                *run_len += 1;
                let alone = current.opcode == Opcode::Flush as u8;
                match instructions.peek() {
                    Some(next) if !alone && is_block(next.opcode) && next.opcode != Opcode::Flush as u8 => {
                        current = instructions.next().expect("peeked");
                        *next_instruction += 1;
                    }
                    _ => break,
                }
            }
            *outstanding = run[..*run_len].iter().filter(|entry| entry.in_flight).count();
            if *outstanding > 0 {
                *progress = Some(response.suspend());
                return true;
            }
            write_results(&mut self.block.devices, &mut self.block.free_buffers, &run[..*run_len], &mut response);
            self.count_run(&run[..*run_len]);
        }
        *progress = Some(response.suspend());
        false
    }

    /// Writes the results of a completed run into the pending answer.
    fn write_run_results(&mut self, pending: &mut Pending) {
        let progress = pending.progress.take().expect("a pending answer");
        let mut response = ResponseWriter::resume(&mut pending.response, progress);
        let run = &pending.run[..pending.run_len];
        write_results(&mut self.block.devices, &mut self.block.free_buffers, run, &mut response);
        self.count_run(run);
        pending.progress = Some(response.suspend());
    }

    fn count_run(&self, run: &[RunEntry]) {
        for entry in run {
            self.stats().count_status(entry.status);
        }
    }

    /// Checks one block instruction and submits it; the entry says whether it is in flight or
    /// already answered.
    fn submit_block(&mut self, slot: u16, index: usize, instruction: &Instruction<'_>, room: usize) -> RunEntry {
        let namespace = instruction.space;
        let mut entry = RunEntry { opcode: instruction.opcode, namespace, ..RunEntry::default() };
        let Some(shape) = self.block.shapes.get(usize::from(namespace)) else {
            entry.status = Status::NoSuchSpace;
            return entry;
        };
        let op = match netdam_isa::block::decode(instruction, shape, room) {
            Ok(op) => op,
            Err(status) => {
                entry.status = status;
                return entry;
            }
        };
        let block_bytes = shape.block_bytes as usize;
        let namespace = usize::from(namespace);
        let buffer = match op {
            BlockOp::Read { .. } | BlockOp::Write { .. } => match self.block.free_buffers[namespace].pop() {
                Some(buffer) => Some(BufferIndex(buffer)),
                None => {
                    entry.status = Status::Busy;
                    return entry;
                }
            },
            _ => None,
        };
        let device = &mut self.block.devices[namespace];
        let request = match (op, buffer) {
            (BlockOp::Read { offset_blocks, num_blocks }, Some(buffer)) => {
                entry.data_len = num_blocks as usize * block_bytes;
                BlockRequest::Read { offset_blocks, num_blocks, buffer }
            }
            (BlockOp::Write { offset_blocks, data, fua }, Some(buffer)) => {
                device.buffer(buffer)[..data.len()].copy_from_slice(data);
                BlockRequest::Write { offset_blocks, num_blocks: (data.len() / block_bytes) as u32, buffer, fua }
            }
            (BlockOp::Flush, _) => BlockRequest::Flush,
            (BlockOp::Trim { offset_blocks, num_blocks }, _) => BlockRequest::Trim { offset_blocks, num_blocks },
            (BlockOp::WriteZeroes { offset_blocks, num_blocks }, _) => {
                BlockRequest::WriteZeroes { offset_blocks, num_blocks }
            }
            (BlockOp::Read { .. } | BlockOp::Write { .. }, None) => unreachable!("transfers took a buffer above"),
        };
        match device.submit(block::tag(slot, index), request) {
            Ok(()) => {
                self.count(Counter::BlockRequestsSubmitted);
                entry.in_flight = true;
                entry.buffer = buffer.map(|buffer| buffer.0);
            }
            Err(error) => {
                if let Some(buffer) = buffer {
                    self.block.free_buffers[namespace].push(buffer.0);
                }
                entry.status = block::failure_status(&error);
                entry.data_len = 0;
            }
        }
        entry
    }

    /// Records an executed request in its session's replay window; `answer` (the finished
    /// response) is kept when the ticket asked for it.
    pub fn record(&mut self, ticket: RecordTicket, answer: Option<&[u8]>) {
        self.sessions.record(ticket, answer);
    }

    fn datagram_status<'b>(&self, out: &'b mut [u8], session: u32, sequence: u64, status: Status) -> Handled<'b> {
        self.count(match status {
            Status::Stale => Counter::AnsweredStale,
            Status::NoSession => Counter::AnsweredNoSession,
            _ => Counter::AnsweredMalformed,
        });
        let mut response = ResponseWriter::new(out, session, sequence);
        response.set_status(status);
        Handled::Answer { response, record: None }
    }

    fn refuse<'b>(&mut self, datagram: &[u8], error: DecodeError, out: &'b mut [u8]) -> Handled<'b> {
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
            return Handled::Dropped;
        };
        // A readable header names the request; the answer is no longer than it (no amplification).
        let Some((session, sequence)) = peek_session_sequence(datagram) else {
            return Handled::Dropped;
        };
        let mut response = ResponseWriter::new(out, session, sequence);
        response.set_status(status);
        Handled::Answer { response, record: None }
    }

    fn execute(&mut self, now: Instant, instruction: &Instruction<'_>, out: &mut [u8]) -> Result<usize, Status> {
        match Opcode::from_u8(instruction.opcode) {
            Some(Opcode::Hello) => self.hello(now, instruction, out),
            Some(Opcode::Ping) => control_fields_empty(instruction).map(|()| 0),
            Some(Opcode::Stat) => {
                control_fields_empty(instruction)?;
                self.stat(out)
            }
            // Reached only when this target serves no namespace at all.
            Some(opcode) if opcode.is_block() => Err(Status::NoSuchSpace),
            _ => self.engine.execute(instruction, out),
        }
    }

    fn hello(&mut self, now: Instant, instruction: &Instruction<'_>, out: &mut [u8]) -> Result<usize, Status> {
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
        let session = self.sessions.open(now).ok_or(Status::Busy)?;
        self.count(Counter::SessionsOpened);
        let namespaces = self
            .shared
            .namespaces
            .iter()
            .map(|(id, namespace)| (id, namespace.name(), namespace.block_bytes(), namespace.capacity_blocks()));
        encode_hello_answer(out, session, negotiated, MAX_INSTRUCTIONS_PER_DATAGRAM as u16, regions, namespaces)
    }

    fn stat(&self, out: &mut [u8]) -> Result<usize, Status> {
        // Summed in place: STAT allocates nothing either.
        let workers = &self.shared.stats;
        let mut writer = StatWriter::new(out)?;
        writer.push("workers", self.shared.stats.len() as u64)?;
        writer.push("regions", self.shared.regions.iter().len() as u64)?;
        writer.push("namespaces", self.shared.namespaces.iter().len() as u64)?;
        for counter in Counter::ALL {
            writer.push(counter.name(), workers.iter().map(|worker| worker.get(*counter)).sum())?;
        }
        for status in Status::ALL {
            let count = workers.iter().map(|worker| worker.status_count(status)).sum();
            writer.push_prefixed(STATUS_COUNTER_PREFIX, status.name(), count)?;
        }
        Ok(writer.finish())
    }
}

/// Writes a completed run's results in order, copying BREAD data out of the transfer buffers,
/// and gives the buffers back.
fn write_results(
    devices: &mut [Box<dyn BlockDevice>],
    free_buffers: &mut [Vec<u16>],
    run: &[RunEntry],
    response: &mut ResponseWriter<'_>,
) {
    for entry in run {
        let namespace = usize::from(entry.namespace);
        let mut data_len = 0;
        if let Some(buffer) = entry.buffer {
            if entry.status == Status::Ok && entry.opcode == Opcode::BlockRead as u8 {
                data_len = entry.data_len;
                let data = &devices[namespace].buffer(BufferIndex(buffer))[..data_len];
                response.data_area()[..data_len].copy_from_slice(data);
            }
            free_buffers[namespace].push(buffer);
        }
        response.commit(entry.opcode, entry.status, data_len);
    }
}

fn is_block(opcode: u8) -> bool {
    Opcode::from_u8(opcode).is_some_and(Opcode::is_block)
}

/// HELLO, PING and STAT: the opcodes a datagram without a session may carry.
fn is_control(opcode: u8) -> bool {
    matches!(Opcode::from_u8(opcode), Some(Opcode::Hello | Opcode::Ping | Opcode::Stat))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ByteSize, RegionBackend, RegionConfig};
    use crate::engine::SoftwareEngine;
    use netdam_isa::control::{decode_hello_answer, encode_hello_operand};
    use netdam_isa::wire::{RequestBuilder, Response};

    fn dispatcher() -> Dispatcher<SoftwareEngine> {
        let config = RegionConfig { name: "r".into(), backend: RegionBackend::Mem, path: None, size: ByteSize(4096) };
        let regions = Arc::new(RegionTable::open(&[config], std::path::Path::new(".")).unwrap());
        let namespaces = Arc::new(NamespaceTable::default());
        let shared = Arc::new(Shared::new(regions.clone(), namespaces, 1, 9000, 1, Duration::from_millis(1)));
        Dispatcher::new(SoftwareEngine::new(regions), shared, 0, Vec::new())
    }

    fn instruction(opcode: Opcode, length: u32, operand: &[u8]) -> Instruction<'_> {
        Instruction { opcode: opcode as u8, flags: 0, space: 0, offset: 0, length, aux: 0, operand }
    }

    /// Hands one request to the dispatcher after it queued for `queued`; returns the finished
    /// answer and whether the request was recorded as executed.
    fn exchange(
        dispatcher: &mut Dispatcher<SoftwareEngine>,
        session: u32,
        queued: Duration,
        op: Instruction<'_>,
    ) -> (Vec<u8>, bool) {
        let mut request = vec![0u8; 256];
        let mut builder = RequestBuilder::new(&mut request, session, 1).unwrap();
        builder.push(&op).unwrap();
        let len = builder.finish();
        let mut out = vec![0u8; 9000];
        match dispatcher.handle(Instant::ZERO, queued, &request[..len], &mut out) {
            Handled::Answer { response, record } => {
                let len = response.finish(64, 0, 0);
                if let Some((ticket, store)) = record {
                    dispatcher.record(ticket, store.then_some(&out[..len]));
                }
                (out[..len].to_vec(), record.is_some())
            }
            other => panic!("expected an answer, got {other:?}"),
        }
    }

    #[test]
    fn a_request_that_queued_too_long_is_answered_busy_and_not_executed() {
        let mut dispatcher = dispatcher();
        let operand = encode_hello_operand(9000);
        let (hello, _) = exchange(&mut dispatcher, 0, Duration::ZERO, instruction(Opcode::Hello, 0, &operand));
        let hello = Response::parse(&hello).unwrap();
        let session = decode_hello_answer(hello.results().next().unwrap().data).unwrap().session;

        let add = 1u64.to_le_bytes();
        let (busy, executed) =
            exchange(&mut dispatcher, session, Duration::from_micros(2500), instruction(Opcode::FetchAdd, 8, &add));
        let busy = Response::parse(&busy).unwrap();
        assert_eq!((busy.status(), busy.header.count, busy.header.queueing_us), (Status::Busy, 0, 2500));
        assert!(!executed, "a BUSY answer executes nothing");

        // Once the queue has drained, the same request executes: BUSY left no trace.
        let (done, executed) =
            exchange(&mut dispatcher, session, Duration::from_micros(20), instruction(Opcode::FetchAdd, 8, &add));
        let done = Response::parse(&done).unwrap();
        assert!(executed);
        assert_eq!(done.header.queueing_us, 20, "the answer reports the queueing it saw");
        assert_eq!(done.results().next().unwrap().data, 0u64.to_le_bytes());
        assert_eq!(dispatcher.stats().get(Counter::AnsweredBusy), 1);
    }
}
