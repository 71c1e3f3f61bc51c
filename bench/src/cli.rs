//! Value parsers the subcommands' options share, beyond clap's own: each refuses a value no run
//! can use with clap's error (exit status 2) before anything starts, naming the allowed range.

use clap::builder::RangedU64ValueParser;
use netdam_isa::limits::MAX_IN_FLIGHT;
use netdam_isa::wire::{HEADER_LEN, INSTRUCTION_HEADER_LEN, RESPONSE_INSTRUCTION_HEADER_LEN};

/// Longest run a `--seconds` option takes: a day, far past any benchmark, and well inside what a
/// `Duration` holds.
pub const MAX_SECONDS: f64 = 86_400.0;

/// Bytes one instruction's data may take where `batch` instructions share a datagram of
/// `datagram` bytes, less an authenticated session's `trailer`: the limits the benchmarks check
/// `--sizes` and `--size` against.
pub struct InstructionRoom {
    /// In its request, after its instruction header (a WRITE's data).
    pub request: usize,
    /// In its answer, after its result header (a READ's data).
    pub answer: usize,
}

pub const fn instruction_room(datagram: usize, trailer: usize, batch: usize) -> InstructionRoom {
    let share = datagram.saturating_sub(HEADER_LEN + trailer) / if batch == 0 { 1 } else { batch };
    InstructionRoom {
        request: share.saturating_sub(INSTRUCTION_HEADER_LEN),
        answer: share.saturating_sub(RESPONSE_INSTRUCTION_HEADER_LEN),
    }
}

/// The whole `block`-byte blocks within `bytes`, in bytes (block sizes round up to blocks).
pub const fn whole_blocks(bytes: usize, block: usize) -> usize {
    bytes / block * block
}

/// Sessions from one address: 1 to what a target allows one address by default.
pub fn sessions_per_address() -> RangedU64ValueParser<usize> {
    RangedU64ValueParser::new().range(1..=netdam_isa::limits::DEFAULT_SESSIONS_PER_ADDRESS as u64)
}

/// Requests in flight per session (a depth or a window): 1 to [`MAX_IN_FLIGHT`], what a
/// session keeps (the target's replay window covers no more).
pub fn in_flight() -> RangedU64ValueParser<usize> {
    RangedU64ValueParser::new().range(1..=MAX_IN_FLIGHT as u64)
}

/// A duration in seconds: more than 0 and at most [`MAX_SECONDS`].
pub fn seconds(text: &str) -> Result<f64, String> {
    let seconds: f64 = text.trim().parse().map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if seconds > 0.0 && seconds <= MAX_SECONDS {
        Ok(seconds)
    } else {
        Err(format!("{text} is not in (0, {MAX_SECONDS}]: give a duration of more than 0 seconds"))
    }
}

/// A probability: 0 to 1.
pub fn probability(text: &str) -> Result<f64, String> {
    let value: f64 = text.trim().parse().map_err(|_| format!("{text:?} is not a number"))?;
    if (0.0..=1.0).contains(&value) {
        Ok(value)
    } else {
        Err(format!("{text} is not in [0, 1]: give a probability"))
    }
}

/// A byte count as netdam's CLI takes them (4096, 0x1000, 64KiB, 1MiB; see
/// [`netdam_isa::units::parse_bytes`]).
pub fn bytes(text: &str) -> Result<u64, String> {
    netdam_isa::units::parse_bytes(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_must_be_positive_and_finite() {
        assert_eq!(seconds("0.5"), Ok(0.5));
        for refused in ["0", "-1", "NaN", "inf", "1e9"] {
            assert!(seconds(refused).unwrap_err().contains("(0, 86400]"), "{refused}");
        }
        assert!(seconds("soon").unwrap_err().contains("not a number"));
    }

    #[test]
    fn probabilities_are_zero_to_one() {
        assert_eq!(probability("0.1"), Ok(0.1));
        assert!(probability("1.5").unwrap_err().contains("[0, 1]"));
        assert!(probability("NaN").unwrap_err().contains("[0, 1]"));
    }
}
