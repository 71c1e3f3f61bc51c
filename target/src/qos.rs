//! Per-tenant usage and limits the workers share: sessions open, block datagrams in flight, and
//! a token bucket over the cost of what a tenant asks for (as ReFlex charges a 4 KiB write more
//! than a read). One fixed table of atomics indexed by tenant id, allocated at start and never
//! resized, so the per-request path takes no lock and allocates nothing.
//!
//! The bucket is GCRA (the generic cell rate algorithm): a single "theoretical arrival time" per
//! tenant, moved forward by each request's cost with one compare-and-swap. A request may run if
//! that time is no further ahead of now than the burst allows.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use netdam_isa::wire::Instruction;
use netdam_isa::Opcode;

use crate::stats::Counter;
use crate::tenants::{TenantLimits, MAX_TENANTS};

/// Bytes one cost unit covers beyond the first: a request costs 1 + ceil(bytes / 4096) units.
const COST_BYTES: u64 = 4096;

/// Why a request of a tenant was answered BUSY rather than executed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shed {
    /// Its token bucket was empty: it asks for more than its `cost_per_second`.
    Rate,
    /// It is best-effort and requests had started to queue at the worker.
    Overload,
    /// It already has `max_in_flight` block datagrams at the target.
    InFlight,
}

impl Shed {
    /// Every reason, in the order of the counters.
    pub const ALL: [Shed; 3] = [Shed::Rate, Shed::Overload, Shed::InFlight];

    /// The label `/metrics` uses.
    pub fn name(self) -> &'static str {
        match self {
            Shed::Rate => "rate",
            Shed::Overload => "overload",
            Shed::InFlight => "in_flight",
        }
    }

    /// The worker counter of BUSY answers for this reason: apart from `AnsweredBusy`, which
    /// counts only a standing queue, so that a tenant held to its share does not read as an
    /// overloaded target.
    pub fn busy_counter(self) -> Counter {
        match self {
            Shed::Rate => Counter::BusyTenantRate,
            Shed::Overload => Counter::BusyTenantOverload,
            Shed::InFlight => Counter::BusyTenantInFlight,
        }
    }
}

/// One tenant's shared counters.
#[derive(Debug, Default)]
pub struct TenantUsage {
    /// Sessions open now, over every worker.
    pub sessions: AtomicU32,
    /// Block datagrams waiting for I/O at the target now.
    pub in_flight: AtomicU32,
    /// The bucket's theoretical arrival time, ns on the workers' clock.
    arrival_ns: AtomicU64,
    /// The bucket's arrival time as if every refused request not yet due had been admitted, ns:
    /// each refusal is told to come back when it fits behind those refused before it, so that
    /// retries arrive at the rate the bucket admits them, and not all at once when it next has
    /// room (a burst that would mostly be refused again, and that queues ahead of every other
    /// tenant's requests at the worker). It runs at most one burst ahead of the bucket: a
    /// refused request that never comes back, or comes back early and is refused again, must not
    /// push every later hint further out.
    retry_ns: AtomicU64,
    /// Requests answered BUSY, by [`Shed`] reason.
    shed: [AtomicU64; 3],
    /// HELLOs refused because the tenant held `max_sessions`.
    pub sessions_refused: AtomicU64,
}

impl TenantUsage {
    /// Requests shed for `reason` so far.
    pub fn shed(&self, reason: Shed) -> u64 {
        self.shed[reason as usize].load(Ordering::Relaxed)
    }

    /// Counts a request shed for `reason`.
    pub fn count_shed(&self, reason: Shed) {
        self.shed[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Takes `cost` units from the bucket at `now_ns` under `limits`; `Err(wait_ns)`: empty, with
    /// the time to come back: when this cost would fit, or, behind requests refused before it
    /// and not yet due, one such cost after the last of them. Unlimited (`cost_per_second` 0)
    /// always succeeds.
    pub fn take(&self, now_ns: u64, cost: u64, limits: &TenantLimits) -> Result<(), u64> {
        if limits.cost_per_second == 0 || cost == 0 {
            return Ok(());
        }
        let per_unit_ns = (1_000_000_000 / limits.cost_per_second).max(1);
        let increment = cost.saturating_mul(per_unit_ns);
        // A burst of `burst` units may arrive at once: the arrival time may run that far ahead.
        // A request that alone costs more than the burst runs when the bucket is full (and then
        // holds the tenant back for its whole cost): under `burst` alone it could never run,
        // and its initiator would be told BUSY for ever.
        let tolerance = limits.burst.max(cost).saturating_mul(per_unit_ns);
        let mut arrival = self.arrival_ns.load(Ordering::Relaxed);
        loop {
            let start = arrival.max(now_ns);
            let next = start.saturating_add(increment);
            if next.saturating_sub(now_ns) > tolerance {
                return Err(self.retry_slot(start, increment, tolerance).saturating_sub(now_ns));
            }
            match self.arrival_ns.compare_exchange_weak(arrival, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Ok(()),
                Err(current) => arrival = current,
            }
        }
    }

    /// Reserves a refused request's place behind the bucket's arrival time `arrival_ns` and the
    /// refused requests before it, at most a burst (`tolerance`) behind it; returns when it fits
    /// there (the reserved arrival less the burst `tolerance`).
    fn retry_slot(&self, arrival_ns: u64, increment: u64, tolerance: u64) -> u64 {
        let mut reserved = self.retry_ns.load(Ordering::Relaxed);
        loop {
            let behind = reserved.clamp(arrival_ns, arrival_ns.saturating_add(tolerance));
            let next = behind.saturating_add(increment);
            match self.retry_ns.compare_exchange_weak(reserved, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return next.saturating_sub(tolerance),
                Err(current) => reserved = current,
            }
        }
    }

    /// Opens a session if the tenant holds fewer than `max`; returns whether it did.
    pub fn open_session(&self, max: u32) -> bool {
        self.sessions
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |open| (open < max).then_some(open + 1))
            .is_ok()
    }

    /// Ends a session counted by [`TenantUsage::open_session`].
    pub fn close_session(&self) {
        let _ = self.sessions.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |open| open.checked_sub(1));
    }

    /// Starts a block datagram if the tenant has fewer than `max` in flight.
    pub fn start_in_flight(&self, max: u32) -> bool {
        self.in_flight
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| (held < max).then_some(held + 1))
            .is_ok()
    }

    /// Ends a block datagram counted by [`TenantUsage::start_in_flight`].
    pub fn end_in_flight(&self) {
        let _ = self.in_flight.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| held.checked_sub(1));
    }
}

/// Every tenant's usage, by id (0 unused), for the target's life.
#[derive(Debug)]
pub struct UsageTable {
    tenants: Box<[TenantUsage]>,
}

impl Default for UsageTable {
    fn default() -> UsageTable {
        UsageTable { tenants: (0..=MAX_TENANTS).map(|_| TenantUsage::default()).collect() }
    }
}

impl UsageTable {
    /// Tenant `id`'s usage (ids beyond the table share its last entry, which no tenant has:
    /// the store bounds ids by [`MAX_TENANTS`]).
    pub fn get(&self, id: u32) -> &TenantUsage {
        let last = self.tenants.len() - 1;
        &self.tenants[(id as usize).min(last)]
    }
}

/// What a datagram's instructions cost a tenant's bucket: per instruction 1 unit plus one per
/// 4 KiB it moves, doubled for instructions that write (a write costs the device and the
/// persist more than a read); control instructions are free.
pub fn cost<'a>(instructions: impl Iterator<Item = Instruction<'a>>, block_bytes: impl Fn(u16) -> u64) -> u64 {
    instructions
        .map(|instruction| {
            let Some(opcode) = Opcode::from_u8(instruction.opcode) else {
                return 1;
            };
            let bytes = if opcode.is_block() {
                u64::from(instruction.length).saturating_mul(block_bytes(instruction.space))
            } else {
                u64::from(instruction.length)
            };
            let units = 1 + bytes.div_ceil(COST_BYTES);
            match opcode {
                Opcode::Hello | Opcode::Ping | Opcode::Stat | Opcode::Close => 0,
                Opcode::Read | Opcode::Crc32 | Opcode::BlockRead | Opcode::BlockStatus => units,
                Opcode::Cas | Opcode::FetchAdd | Opcode::Flush => 1,
                _ => 2 * units,
            }
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000_000;

    fn limits(rate: u64, burst: u64) -> TenantLimits {
        TenantLimits { cost_per_second: rate, burst, ..TenantLimits::default() }
    }

    #[test]
    fn a_bucket_passes_its_burst_then_its_rate() {
        let usage = TenantUsage::default();
        let limits = limits(1000, 10);
        let now = 5 * SECOND;
        let passed = (0..10).filter(|_| usage.take(now, 1, &limits).is_ok()).count();
        assert_eq!(passed, 10, "the burst at once");
        let wait = usage.take(now, 1, &limits).unwrap_err();
        assert!(wait > 0 && wait <= SECOND / 1000, "{wait} ns until one unit");
        // Over one more second, about the rate.
        let mut passed = 0;
        for step in 0..10_000u64 {
            if usage.take(now + step * (SECOND / 10_000), 1, &limits).is_ok() {
                passed += 1;
            }
        }
        assert!((990..=1010).contains(&passed), "{passed} in a second at 1000 units/s");
    }

    #[test]
    fn refused_requests_come_back_when_they_fit_behind_those_refused_before() {
        const MS: u64 = SECOND / 1000;
        let usage = TenantUsage::default();
        // A millisecond per unit, a burst of ten.
        let limits = limits(1000, 10);
        let now = 5 * SECOND;
        assert!(usage.take(now, 10, &limits).is_ok(), "the burst");
        let costs = [1, 1, 3, 1];
        let waits: Vec<u64> = costs.iter().map(|&cost| usage.take(now, cost, &limits).unwrap_err()).collect();
        assert_eq!(waits, [MS, 2 * MS, 5 * MS, 6 * MS], "each one's cost behind the one before");
        // Each, back at its time, fits.
        for (wait, cost) in waits.iter().zip(costs) {
            assert!(usage.take(now + wait, cost, &limits).is_ok(), "{cost} unit(s) at +{wait} ns");
        }
        // Once those are due, a refusal waits for its own cost only.
        let later = now + SECOND;
        assert!(usage.take(later, 10, &limits).is_ok());
        assert_eq!(usage.take(later, 1, &limits).unwrap_err(), MS);
    }

    #[test]
    fn refusals_that_never_come_back_hold_later_hints_to_one_burst() {
        const MS: u64 = SECOND / 1000;
        let usage = TenantUsage::default();
        let limits = limits(1000, 10);
        let now = 5 * SECOND;
        // A flood refused ten thousand times at once, none of it back at its time.
        let passed = (0..10_000).filter(|_| usage.take(now, 1, &limits).is_ok()).count();
        assert_eq!(passed, 10);
        let wait = usage.take(now, 1, &limits).unwrap_err();
        assert!(wait <= 11 * MS, "{wait} ns: at most a burst behind the bucket, plus the request's cost");
        // Nor after a second of it at the rate: hints stay within a burst of when one unit fits.
        for step in 0..10_000u64 {
            let _ = usage.take(now + step * (SECOND / 10_000), 1, &limits);
        }
        let end = now + SECOND;
        while usage.take(end, 1, &limits).is_ok() {}
        let wait = usage.take(end, 1, &limits).unwrap_err();
        assert!(wait <= 11 * MS, "{wait} ns after a second of refusals");
    }

    /// A datagram costing more than the whole burst runs once the bucket is full, and the rate
    /// still holds: it is followed by a wait of its own cost.
    #[test]
    fn a_request_larger_than_the_burst_runs_on_a_full_bucket() {
        const MS: u64 = SECOND / 1000;
        let usage = TenantUsage::default();
        // 10 ms per unit, a burst of three; an 8 KiB WRITE costs 6.
        let limits = limits(100, 3);
        let now = 5 * SECOND;
        assert!(usage.take(now, 6, &limits).is_ok(), "a full bucket takes it");
        let wait = usage.take(now, 6, &limits).unwrap_err();
        assert_eq!(wait, 60 * MS, "the next one waits for the first one's cost");
        assert!(usage.take(now + wait, 6, &limits).is_ok(), "and fits then");
        assert!(usage.take(now + wait, 1, &limits).is_err(), "small ones wait too: the rate holds");
    }

    #[test]
    fn an_unlimited_tenant_always_passes_and_limits_are_counted() {
        let usage = TenantUsage::default();
        assert!((0..1000).all(|_| usage.take(0, 100, &limits(0, 0)).is_ok()));
        assert!(usage.open_session(2) && usage.open_session(2) && !usage.open_session(2));
        usage.close_session();
        assert!(usage.open_session(2));
        assert!(usage.start_in_flight(1) && !usage.start_in_flight(1));
        usage.end_in_flight();
        usage.end_in_flight();
        assert_eq!(usage.in_flight.load(Ordering::Relaxed), 0, "never below zero");
    }

    #[test]
    fn writes_cost_more_than_reads_and_control_is_free() {
        let read = Instruction {
            opcode: Opcode::Read as u8,
            flags: 0,
            space: 0,
            offset: 0,
            length: 4096,
            aux: 0,
            operand: &[],
        };
        let write = Instruction { opcode: Opcode::Write as u8, ..read };
        let ping = Instruction { opcode: Opcode::Ping as u8, length: 0, ..read };
        let bread = Instruction { opcode: Opcode::BlockRead as u8, length: 2, ..read };
        assert_eq!(cost([read].into_iter(), |_| 4096), 2);
        assert_eq!(cost([write].into_iter(), |_| 4096), 4);
        assert_eq!(cost([ping].into_iter(), |_| 4096), 0);
        assert_eq!(cost([bread].into_iter(), |_| 4096), 3);
    }
}
