//! Client side of the `reduce` extension: its answer, and how the answers of a range split over
//! several REDUCEs combine.

use netdam_isa::extension::reduce::{ReduceOp, REDUCE_ANSWER_BYTES};
use netdam_isa::LaneType;

use crate::error::ClientError;

/// The reduction of a range: exact for i32 lanes, an f64 for f32 and bf16 lanes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ReduceValue {
    /// Of i32 lanes: the exact sum, or the minimum or maximum.
    Integer(i64),
    /// Of f32 or bf16 lanes (NaN when a summed lane is NaN, or every lane is for min and max).
    Float(f64),
}

impl std::fmt::Display for ReduceValue {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReduceValue::Integer(value) => write!(formatter, "{value}"),
            ReduceValue::Float(value) => write!(formatter, "{value}"),
        }
    }
}

/// Decodes one REDUCE answer over `lane` lanes.
pub fn decode(lane: LaneType, data: &[u8]) -> Result<ReduceValue, ClientError> {
    let bytes: [u8; REDUCE_ANSWER_BYTES] = data.try_into().map_err(|_| ClientError::MissingResult(0))?;
    Ok(match lane {
        LaneType::I32 => ReduceValue::Integer(i64::from_le_bytes(bytes)),
        LaneType::F32 | LaneType::Bf16 => ReduceValue::Float(f64::from_le_bytes(bytes)),
    })
}

/// Combines the reductions of two consecutive pieces of one range (`earlier` first, so a float
/// sum over pieces is added in range order and always gives the same bits).
pub fn combine(op: ReduceOp, earlier: ReduceValue, later: ReduceValue) -> ReduceValue {
    match (earlier, later) {
        (ReduceValue::Integer(a), ReduceValue::Integer(b)) => ReduceValue::Integer(match op {
            // Exact: a range holds at most 2^62 / 2^31 lanes long before this could overflow.
            ReduceOp::Sum => a.saturating_add(b),
            ReduceOp::Min => a.min(b),
            ReduceOp::Max => a.max(b),
        }),
        (ReduceValue::Float(a), ReduceValue::Float(b)) => ReduceValue::Float(match op {
            ReduceOp::Sum => a + b,
            // As the target: NaN pieces (every lane NaN) give way to numbers.
            ReduceOp::Min => a.min(b),
            ReduceOp::Max => a.max(b),
        }),
        // One range has one lane type.
        (mixed, _) => mixed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_combine_like_one_range() {
        let int = ReduceValue::Integer;
        assert_eq!(combine(ReduceOp::Sum, int(i64::from(i32::MAX)), int(i64::from(i32::MAX))), int(2 * 2147483647));
        assert_eq!(combine(ReduceOp::Min, int(-3), int(4)), int(-3));
        assert_eq!(combine(ReduceOp::Max, int(-3), int(4)), int(4));
        let float = ReduceValue::Float;
        assert_eq!(combine(ReduceOp::Max, float(f64::NAN), float(2.5)), float(2.5));
        assert_eq!(combine(ReduceOp::Sum, float(0.5), float(0.25)), float(0.75));
        assert_eq!(decode(LaneType::I32, &(-5i64).to_le_bytes()).unwrap(), int(-5));
        assert!(decode(LaneType::F32, &[0; 4]).is_err(), "a short answer is refused");
    }
}
