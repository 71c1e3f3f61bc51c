//! The protocol's own time types: nanoseconds since an arbitrary origin.
//!
//! Sans-IO state machines take an [`Instant`] from their driver and never read a clock, so a
//! simulator can start at [`Instant::ZERO`] and advance time by hand.

use core::ops::{Add, Sub};

/// A point in time, in nanoseconds since the driver's origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant {
    nanos: u64,
}

/// A span of time in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Duration {
    nanos: u64,
}

impl Instant {
    /// The origin of time, where a simulation starts.
    pub const ZERO: Instant = Instant { nanos: 0 };

    /// An instant `nanos` after the origin.
    pub const fn from_nanos(nanos: u64) -> Instant {
        Instant { nanos }
    }

    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.nanos
    }

    /// Time from `earlier` to `self`, zero if `earlier` is later.
    pub const fn saturating_since(self, earlier: Instant) -> Duration {
        Duration { nanos: self.nanos.saturating_sub(earlier.nanos) }
    }
}

impl Duration {
    /// No time at all.
    pub const ZERO: Duration = Duration { nanos: 0 };

    /// The longest duration there is: "unknown, longer than anything measured".
    pub const MAX: Duration = Duration { nanos: u64::MAX };

    /// A duration of `nanos` nanoseconds.
    pub const fn from_nanos(nanos: u64) -> Duration {
        Duration { nanos }
    }

    /// A duration of `micros` microseconds.
    pub const fn from_micros(micros: u64) -> Duration {
        Duration { nanos: micros * 1_000 }
    }

    /// A duration of `millis` milliseconds.
    pub const fn from_millis(millis: u64) -> Duration {
        Duration { nanos: millis * 1_000_000 }
    }

    /// Length in nanoseconds.
    pub const fn as_nanos(self) -> u64 {
        self.nanos
    }

    /// `self - other`, zero if `other` is longer.
    pub const fn saturating_sub(self, other: Duration) -> Duration {
        Duration { nanos: self.nanos.saturating_sub(other.nanos) }
    }

    /// Converts to the standard library's duration, for drivers that sleep.
    pub const fn to_std(self) -> core::time::Duration {
        core::time::Duration::from_nanos(self.nanos)
    }
}

impl From<core::time::Duration> for Duration {
    fn from(value: core::time::Duration) -> Duration {
        Duration { nanos: u64::try_from(value.as_nanos()).unwrap_or(u64::MAX) }
    }
}

/// Reads the monotonic clock as the protocol's `Instant`, counted from the clock's creation.
/// For drivers only: sans-IO cores take `now` from them and never read a clock.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    /// `CLOCK_MONOTONIC` at the origin, in ns.
    origin_ns: u64,
}

impl MonotonicClock {
    /// A clock whose origin is now.
    pub fn new() -> MonotonicClock {
        MonotonicClock { origin_ns: monotonic_ns() }
    }

    /// Time since the origin.
    #[inline]
    pub fn now(&self) -> Instant {
        Instant::from_nanos(monotonic_ns().saturating_sub(self.origin_ns))
    }
}

/// `CLOCK_REALTIME` in ns (a vDSO call): the clock of the kernel's receive timestamps
/// (`SO_TIMESTAMPNS`), which the target and initiators compare them with.
pub fn realtime_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME)
}

/// Clock `clock` (a `clock_gettime` id: `CLOCK_THREAD_CPUTIME_ID` for a thread's CPU time, ...)
/// in ns.
#[inline]
pub fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a clock id and a live timespec to write; an invalid id leaves it zero.
    unsafe { libc::clock_gettime(clock, &mut now) };
    (now.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(now.tv_nsec as u64)
}

/// `CLOCK_MONOTONIC` in ns (a vDSO call), the clock `std::time::Instant` reads. Read directly
/// because the request path reads it several times per request on both sides, and
/// `Instant::elapsed` adds a normalised subtraction and a 128-bit conversion to each read.
#[inline]
fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

impl Default for MonotonicClock {
    fn default() -> MonotonicClock {
        MonotonicClock::new()
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, rhs: Duration) -> Instant {
        Instant { nanos: self.nanos.saturating_add(rhs.nanos) }
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    fn sub(self, rhs: Instant) -> Duration {
        self.saturating_since(rhs)
    }
}

impl Add for Duration {
    type Output = Duration;
    fn add(self, rhs: Duration) -> Duration {
        Duration { nanos: self.nanos.saturating_add(rhs.nanos) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates_instead_of_wrapping() {
        let later = Instant::ZERO + Duration::from_micros(5);
        assert_eq!(later.as_nanos(), 5_000);
        assert_eq!(Instant::ZERO - later, Duration::ZERO);
        assert_eq!(later - Instant::ZERO, Duration::from_nanos(5_000));
        assert_eq!((Instant::from_nanos(u64::MAX) + Duration::from_nanos(1)).as_nanos(), u64::MAX);
        assert_eq!(Duration::from(core::time::Duration::from_millis(3)), Duration::from_millis(3));
    }
}
