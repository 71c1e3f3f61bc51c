//! Allreduce through a target region: N workers (threads, processes or hosts, each with its own
//! client) sum, or take the lane-wise maximum of, equal-length buffers of f32, i32 or bf16
//! lanes, and each gets the result.
//!
//! Layout at `offset` of the region: a 32-byte header (a magic number, the workers, lane type,
//! operation and buffer size [`prepare`] set the area up for, and a count of workers that have
//! joined), one `u64` counter per chunk, then the accumulation buffer (8-byte aligned). A worker
//! reads the header first and refuses an area not prepared, prepared for other buffers or
//! workers, or already used by as many workers as it was prepared for: any of these would sum
//! what is not its round's. Each worker sends, per chunk, a VADD (for a maximum: the `vmax` extension,
//! which the target must enable) of its chunk into the accumulator, and a FETCH_ADD of 1 to the
//! chunk's counter once the target has answered that the VADD added; that FETCH_ADD rides in the
//! datagram of a later chunk's VADD. So a counter counts only contributions already added (the
//! barrier), even when the target refuses a VADD (a datagram's instructions execute each on its
//! own). Chunks are pipelined (16 in flight). Then the worker polls the counters of the first
//! chunks still pending with READs and reads back each run of chunks whose counters reached N
//! (one pipelined READ per run). Both instructions are non-idempotent and execute
//! at most once (the target replays their stored answer to a retransmission), so loss neither
//! drops nor doubles a contribution.
//!
//! Results: i32 sums are exact (wrapping, as VADD). f32 and bf16 sums depend on the order the
//! contributions arrive in (each VADD rounds once): every lane is within
//! (N − 1) · u · Σ|xᵢ| of the exact sum, u = 2⁻²⁴ for f32 and 2⁻⁸ for bf16, the bound of
//! recursive summation in any order. Maxima are exact (float maxima skip NaN lanes; a lane NaN in
//! every buffer comes out as negative infinity, the accumulator's start). A worker that dies leaves its chunks short of N: the others
//! fail with [`AllreduceError::Incomplete`] once `timeout` passes, never hang.
//!
//! The area must be prepared before any worker adds ([`prepare`]), and serves one Allreduce.

use std::time::{Duration, Instant};

use netdam_isa::extension::vmax::VMAX_OPCODE;
use netdam_isa::LaneType;

use crate::client::Client;
use crate::error::ClientError;
use crate::op::Op;
use crate::target_info::chunks;

/// What an Allreduce computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllreduceOp {
    /// The lane-wise sum (VADD).
    Sum,
    /// The lane-wise maximum (the `vmax` extension).
    Max,
}

/// Where and how N workers reduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllreducePlan {
    /// What to compute.
    pub op: AllreduceOp,
    /// Region id.
    pub space: u16,
    /// Start of the area in the region, a multiple of 8.
    pub offset: u64,
    /// Workers contributing.
    pub workers: u32,
    /// Bytes of each worker's buffer.
    pub len: usize,
    /// Lane type.
    pub lane: LaneType,
    /// Bytes per chunk (one VADD): whole lanes, at most what one VADD and its FETCH_ADD carry.
    pub chunk_bytes: usize,
}

/// Why an Allreduce failed.
#[derive(Debug, thiserror::Error)]
pub enum AllreduceError {
    /// A request failed.
    #[error("allreduce: {0}")]
    Client(#[from] ClientError),
    /// The plan does not fit the region or the protocol.
    #[error("allreduce: {0}")]
    Plan(String),
    /// Contributions missing after the timeout.
    #[error(
        "allreduce: chunk {chunk} (bytes {first_byte}..) has {arrived} of {workers} contributions after {waited_ms} ms: \
         a worker died, was never started, or uses another area; the result is incomplete"
    )]
    Incomplete {
        /// The first chunk still short.
        chunk: usize,
        /// Its first byte in the buffer.
        first_byte: usize,
        /// Contributions counted.
        arrived: u64,
        /// Contributions expected.
        workers: u32,
        /// How long this worker waited.
        waited_ms: u64,
    },
}

impl AllreducePlan {
    /// A plan for `workers` buffers of `len` bytes at `offset` of `space`, chunked as `client`'s
    /// negotiated datagram allows.
    pub fn new(
        client: &Client,
        space: u16,
        offset: u64,
        workers: u32,
        len: usize,
        lane: LaneType,
        op: AllreduceOp,
    ) -> Result<AllreducePlan, AllreduceError> {
        if workers == 0 || len == 0 || !len.is_multiple_of(lane.lane_bytes()) || !offset.is_multiple_of(8) {
            return Err(AllreduceError::Plan(format!(
                "need at least one worker, a buffer of whole {lane:?} lanes and an 8-byte aligned offset \
                 (workers {workers}, {len} bytes, offset {offset})"
            )));
        }
        // The datagram carries the VADD and the FETCH_ADD (24 + 8 bytes) after it.
        let info = client.info();
        let room = info.write_chunk_bytes().saturating_sub(netdam_isa::wire::INSTRUCTION_HEADER_LEN + 8);
        let chunk_bytes = info.vadd_chunk_bytes(lane, false).min(room) / lane.lane_bytes() * lane.lane_bytes();
        if chunk_bytes == 0 {
            return Err(AllreduceError::Plan("the negotiated datagram holds no lane".to_string()));
        }
        let plan = AllreducePlan { op, space, offset, workers, len, lane, chunk_bytes };
        // Checked here, not left to the target: a worker whose VADDs the target refuses for
        // their range makes every other worker fail `Incomplete` after its timeout; better to
        // say at once that the area does not fit.
        let region_bytes = info.hello.regions.iter().find(|region| region.id == space).map(|region| region.size_bytes);
        match region_bytes {
            Some(size) if offset.checked_add(plan.area_bytes()).is_some_and(|end| end <= size) => Ok(plan),
            Some(size) => Err(AllreducePlan::too_big(&plan, size)),
            None => Err(AllreduceError::Plan(format!("the target has no region {space}"))),
        }
    }

    fn too_big(plan: &AllreducePlan, region_bytes: u64) -> AllreduceError {
        AllreduceError::Plan(format!(
            "the area ({} bytes of counters and accumulator at {}) does not fit the region's {region_bytes} bytes",
            plan.area_bytes(),
            plan.offset
        ))
    }

    /// Chunks of the buffer.
    pub fn chunk_count(&self) -> usize {
        self.len.div_ceil(self.chunk_bytes)
    }

    fn counters_bytes(&self) -> u64 {
        8 * self.chunk_count() as u64
    }

    /// Where the chunks' counters start: after the header.
    fn counters(&self) -> u64 {
        self.offset + HEADER_BYTES
    }

    /// Where the accumulator starts.
    pub fn accumulator(&self) -> u64 {
        self.counters() + self.counters_bytes()
    }

    /// The FETCH_ADD that counts one contribution to chunk `index`.
    fn count(&self, index: usize) -> Op {
        Op::fetch_add(self.space, self.counters() + 8 * index as u64, 1)
    }

    /// Bytes of the region the area takes: header, counters and accumulator.
    pub fn area_bytes(&self) -> u64 {
        HEADER_BYTES + self.counters_bytes() + self.len as u64
    }

    /// The header's first 24 bytes as [`prepare`] writes them: the magic number, then workers,
    /// lane type and operation, then the buffer's bytes (the joined count follows, zeroed).
    fn header(&self) -> [u8; 24] {
        let op = match self.op {
            AllreduceOp::Sum => 0u64,
            AllreduceOp::Max => 1,
        };
        let shape = u64::from(self.workers) | (u64::from(self.lane as u8) << 32) | (op << 40);
        let mut header = [0u8; 24];
        header[..8].copy_from_slice(&HEADER_MAGIC.to_le_bytes());
        header[8..16].copy_from_slice(&shape.to_le_bytes());
        header[16..].copy_from_slice(&(self.len as u64).to_le_bytes());
        header
    }
}

/// The plan a header (as [`AllreducePlan::header`] writes it) describes, in words.
fn header_text(header: &[u8]) -> String {
    let word = |index: usize| u64::from_le_bytes(header[8 * index..8 * index + 8].try_into().expect("8 bytes"));
    let (shape, len) = (word(1), word(2));
    let lane = (shape >> 32) & 0xFF;
    let lane = [LaneType::F32, LaneType::I32, LaneType::Bf16]
        .into_iter()
        .find(|known| *known as u64 == lane)
        .map_or_else(|| format!("lane type {lane}"), |lane| format!("{lane:?} lanes"));
    let op = if shape >> 40 == 0 { "sum" } else { "maximum" };
    format!("{} workers with buffers of {len} bytes of {lane}, {op}", shape & 0xFFFF_FFFF)
}

/// Bytes of the area's header (see the module documentation).
pub const HEADER_BYTES: u64 = 32;

/// The header's first word once [`prepare`] has run.
const HEADER_MAGIC: u64 = u64::from_le_bytes(*b"NDallrd1");

/// Checks the area's header against `plan` and joins it: fails if the area was not prepared, was
/// prepared for another plan, or has already had as many workers as it was prepared for.
fn join(client: &mut Client, plan: &AllreducePlan) -> Result<(), AllreduceError> {
    let mut header = [0u8; HEADER_BYTES as usize];
    client.read(plan.space, plan.offset, &mut header)?;
    let at = format!("the area at {} of region {}", plan.offset, plan.space);
    if header[..8] != HEADER_MAGIC.to_le_bytes() {
        return Err(AllreduceError::Plan(format!(
            "{at} is not prepared for an Allreduce: run it with --prepare once, before the workers \
             (an area's old contents would be summed in)"
        )));
    }
    if header[..24] != plan.header() {
        return Err(AllreduceError::Plan(format!(
            "{at} was prepared for {}; this worker asks for {}: give every worker the --workers, --type \
             and buffer size it was prepared with",
            header_text(&header),
            header_text(&plan.header()),
        )));
    }
    let joined = client.fetch_add(plan.space, plan.offset + 24, 1)?;
    if joined >= u64::from(plan.workers) {
        return Err(AllreduceError::Plan(format!(
            "{at} has served its Allreduce already ({joined} workers joined it, of {}): prepare it again \
             (--prepare) for another round",
            plan.workers
        )));
    }
    Ok(())
}

/// Readies the area for one Allreduce: counters zero, the accumulator zero for a sum and the
/// lane type's least value for a maximum, and the header naming the plan. Run once, before any
/// worker starts, and again before each later round on the same area.
pub fn prepare(client: &mut Client, plan: &AllreducePlan) -> Result<(), AllreduceError> {
    // A short pause of the target's worker per FILL or WRITE.
    let piece_bytes = netdam_isa::limits::MAX_LONG_INSTRUCTION_BYTES;
    let (zeroed, accumulator) = match plan.op {
        AllreduceOp::Sum => (plan.area_bytes() as usize, 0),
        AllreduceOp::Max => ((HEADER_BYTES + plan.counters_bytes()) as usize, plan.len),
    };
    for (at, _, len) in chunks(plan.offset, zeroed, piece_bytes) {
        client.call(&[Op::fill(plan.space, at, len as u32, 0)])?.data(0)?;
    }
    if accumulator > 0 {
        let pattern: Vec<u8> =
            least_lane(plan.lane).iter().copied().cycle().take(piece_bytes.min(accumulator)).collect();
        for (at, _, len) in chunks(plan.accumulator(), accumulator, pattern.len()) {
            client.write(plan.space, at, &pattern[..len])?;
        }
    }
    // Last: a worker that reads the header before this finds the area not prepared yet.
    client.write(plan.space, plan.offset, &plan.header())?;
    Ok(())
}

/// Adds `buffer` (this worker's `plan.len` bytes) into the area (or takes the maximum), waits for
/// every worker's contribution, and writes the result into `result`. Fails, never hangs, if some chunk lacks a
/// contribution after `timeout`.
pub fn allreduce(
    client: &mut Client,
    plan: &AllreducePlan,
    buffer: &[u8],
    result: &mut [u8],
    timeout: Duration,
) -> Result<(), AllreduceError> {
    if buffer.len() != plan.len || result.len() != plan.len {
        return Err(AllreduceError::Plan(format!(
            "buffer of {} and result of {} bytes for a plan of {}",
            buffer.len(),
            result.len(),
            plan.len
        )));
    }
    if plan.op == AllreduceOp::Max {
        // A target without the extension refuses every VMAX: say why once, before anything.
        let least = least_lane(plan.lane);
        let probe =
            Op::extension(VMAX_OPCODE, 0, plan.space, plan.accumulator(), least.len() as u32, plan.lane as u32, least);
        if let Err(error) = client.call(&[probe])?.data(0) {
            return Err(AllreduceError::Plan(format!(
                "the target does not run the vmax extension for this session ({error}): a maximum needs \
                 extensions = [\"vmax\"] and the write and compute permissions"
            )));
        }
    }
    join(client, plan)?;
    // 1. Contribute: VADD (or VMAX) per chunk, pipelined, and a chunk's FETCH_ADD only once the
    // target has answered that it added (see `add_chunks`). Every chunk answered as added is
    // counted, also when a later one was refused: the other workers then stop at exactly the
    // first chunk this worker could not add, and fail `Incomplete` naming it.
    let mut added = std::collections::VecDeque::new();
    let outcome = add_chunks(client, plan, buffer, &mut added);
    let counted = count_chunks(client, plan, added);
    outcome?;
    counted?;
    // 2. Wait for every chunk's N contributions, then read it. Each poll reads the counters of
    // the first chunks still pending (one datagram's worth: chunks complete roughly in order),
    // and each run of consecutive complete chunks is read back in one pipelined READ.
    let started = Instant::now();
    let chunk_count = plan.chunk_count();
    let mut done = vec![false; chunk_count];
    let mut first_pending = 0;
    let mut counters = vec![0u8; 8 * chunk_count];
    let mut pause = Duration::from_micros(50);
    while first_pending < chunk_count {
        let last = (first_pending + COUNTERS_PER_POLL).min(chunk_count);
        client.read(
            plan.space,
            plan.counters() + 8 * first_pending as u64,
            &mut counters[8 * first_pending..8 * last],
        )?;
        let complete = |index: usize| {
            let arrived = u64::from_le_bytes(counters[8 * index..8 * index + 8].try_into().expect("8 bytes"));
            arrived >= u64::from(plan.workers)
        };
        let mut progressed = false;
        let mut index = first_pending;
        while index < last {
            if done[index] || !complete(index) {
                index += 1;
                continue;
            }
            let run_start = index;
            while index < last && !done[index] && complete(index) {
                done[index] = true;
                index += 1;
            }
            let position = run_start * plan.chunk_bytes;
            let end = (index * plan.chunk_bytes).min(plan.len);
            client.read(plan.space, plan.accumulator() + position as u64, &mut result[position..end])?;
            progressed = true;
        }
        while first_pending < chunk_count && done[first_pending] {
            first_pending += 1;
        }
        if first_pending == chunk_count {
            break;
        }
        if started.elapsed() > timeout {
            let chunk = first_pending;
            let arrived = u64::from_le_bytes(counters[8 * chunk..8 * chunk + 8].try_into().expect("8 bytes"));
            return Err(AllreduceError::Incomplete {
                chunk,
                first_byte: chunk * plan.chunk_bytes,
                arrived,
                workers: plan.workers,
                waited_ms: started.elapsed().as_millis() as u64,
            });
        }
        // Others are still adding: back off a little, up to a millisecond, so polling does not
        // crowd out their VADDs.
        pause = if progressed { Duration::from_micros(50) } else { (pause * 2).min(Duration::from_millis(1)) };
        std::thread::sleep(pause);
    }
    Ok(())
}

/// Sends every chunk's VADD (or VMAX), pipelined, and each chunk's FETCH_ADD in the datagram of
/// a later chunk's VADD once the target has answered that it added the chunk; what was added and
/// is not yet counted is left in `added`. The target executes every instruction of a datagram
/// on its own, so a FETCH_ADD sent beside its own VADD would count a VADD that was refused (a
/// grant short of the accumulator, a region that shrank), and the other workers would read a sum
/// without it as if it were complete. Riding in a later VADD's datagram, counts cost no datagram
/// of their own (counting in datagrams of their own measured 450 -> 560 ms at N = 4, 64 MiB).
fn add_chunks(
    client: &mut Client,
    plan: &AllreducePlan,
    buffer: &[u8],
    added: &mut std::collections::VecDeque<usize>,
) -> Result<(), AllreduceError> {
    let mut in_flight = std::collections::VecDeque::new();
    let settle = |client: &mut Client, added: &mut std::collections::VecDeque<usize>, (index, counts, ticket)| {
        let reply = client.wait(ticket)?;
        reply.data(0)?;
        added.push_back(index);
        if counts {
            reply.data(1)?;
        }
        Ok::<(), AllreduceError>(())
    };
    for (index, (at, position, len)) in chunks(plan.accumulator(), plan.len, plan.chunk_bytes).enumerate() {
        while in_flight.len() >= IN_FLIGHT {
            settle(client, added, in_flight.pop_front().expect("not empty"))?;
        }
        let lanes = &buffer[position..position + len];
        let combine = match plan.op {
            AllreduceOp::Sum => Op::vadd(plan.space, at, plan.lane, lanes, false),
            AllreduceOp::Max => Op::extension(VMAX_OPCODE, 0, plan.space, at, len as u32, plan.lane as u32, lanes),
        };
        let ticket = match added.pop_front() {
            Some(earlier) => (index, true, client.submit(&[combine, plan.count(earlier)])?),
            None => (index, false, client.submit(&[combine])?),
        };
        in_flight.push_back(ticket);
    }
    while let Some(ticket) = in_flight.pop_front() {
        settle(client, added, ticket)?;
    }
    Ok(())
}

/// Counts the chunks of `added` (answered as added, not yet counted), several per datagram.
fn count_chunks(
    client: &mut Client,
    plan: &AllreducePlan,
    added: std::collections::VecDeque<usize>,
) -> Result<(), AllreduceError> {
    let counts: Vec<Op> = added.into_iter().map(|index| plan.count(index)).collect();
    let tickets =
        counts.chunks(COUNTS_PER_DATAGRAM).map(|counts| client.submit(counts)).collect::<Result<Vec<_>, _>>()?;
    for (ticket, counts) in tickets.into_iter().zip(counts.chunks(COUNTS_PER_DATAGRAM)) {
        let reply = client.wait(ticket)?;
        for index in 0..counts.len() {
            reply.data(index)?;
        }
    }
    Ok(())
}

/// VADD datagrams a worker keeps in flight.
const IN_FLIGHT: usize = 16;

/// FETCH_ADDs per datagram when the last chunks' counts go together (at most `IN_FLIGHT` are
/// left, and a datagram holds up to 64 instructions).
const COUNTS_PER_DATAGRAM: usize = 32;

/// Counters read per poll: one 8 KiB READ, the chunks of 8 MiB at 8 KiB per chunk.
const COUNTERS_PER_POLL: usize = 1024;

/// The least value of a lane type, little-endian: where a maximum starts (i32::MIN, −∞).
fn least_lane(lane: LaneType) -> &'static [u8] {
    match lane {
        LaneType::I32 => &[0x00, 0x00, 0x00, 0x80],
        LaneType::F32 => &[0x00, 0x00, 0x80, 0xFF],
        LaneType::Bf16 => &[0x80, 0xFF],
    }
}
