//! The latency bucket layout shared by every netdam histogram.
//!
//! Upper bounds grow by 2^(1/4) (1.19x) from 2^10 ns (1.024 µs) to 2^30 ns (1.074 s): four
//! buckets per power of two, 81 finite bounds and `+Inf`, so a tail in the tens of microseconds
//! is resolved to within 19 % everywhere between 1 µs and 1 s. Bounds are whole nanoseconds
//! (`ceil(2^(k/4))`), and a value exactly on a bound belongs to that bound's bucket (`le`).
//!
//! The index of a value is computed with integer operations only: the power of two from the
//! leading zeros, then the quarter within it by comparing the value's normalised mantissa with
//! the three constants 2^(63 + j/4), j = 1, 2, 3 (rounded up, so the comparison is exact).

/// Buckets per power of two.
pub const BUCKETS_PER_OCTAVE: usize = 4;
/// log2 of the first bound in nanoseconds (1024 ns).
pub const FIRST_OCTAVE: u32 = 10;
/// log2 of the last finite bound in nanoseconds (2^30 ns, 1.074 s).
pub const LAST_OCTAVE: u32 = 30;
/// Finite upper bounds.
pub const FINITE_BOUNDS: usize = (LAST_OCTAVE - FIRST_OCTAVE) as usize * BUCKETS_PER_OCTAVE + 1;
/// Buckets, the `+Inf` one included.
pub const BUCKETS: usize = FINITE_BOUNDS + 1;

/// ceil(2^(63 + j/4)) for j = 1, 2, 3: a value's mantissa, shifted to bit 63, is at least the
/// j-th constant exactly when the value is at least 2^(octave + j/4).
const QUARTERS: [u64; 3] = [0x9837_f051_8db8_a970, 0xb504_f333_f9de_6485, 0xd744_fcca_d69d_6af5];

// The layout the issue asks for: about 1 µs to about 1 s, at most 1.2x apart.
const _: () = assert!(FINITE_BOUNDS == 81 && BUCKETS == 82);

/// Upper bound in nanoseconds of bucket `index < FINITE_BOUNDS`.
const fn bound_ns(index: usize) -> u64 {
    if index == 0 {
        return 1 << FIRST_OCTAVE;
    }
    let octave = FIRST_OCTAVE + ((index - 1) / BUCKETS_PER_OCTAVE) as u32;
    let quarter = (index - 1) % BUCKETS_PER_OCTAVE + 1;
    if quarter == BUCKETS_PER_OCTAVE {
        return 1 << (octave + 1);
    }
    // ceil(2^(octave + quarter/4)) = floor((ceil(2^(63 + quarter/4)) - 1) / 2^(63 - octave)) + 1,
    // because 2^(63 + quarter/4) is irrational.
    ((QUARTERS[quarter - 1] - 1) >> (63 - octave)) + 1
}

/// Upper bounds of the finite buckets, in nanoseconds, ascending.
pub const BUCKET_BOUNDS_NS: [u64; FINITE_BOUNDS] = {
    let mut bounds = [0u64; FINITE_BOUNDS];
    let mut index = 0;
    while index < FINITE_BOUNDS {
        bounds[index] = bound_ns(index);
        index += 1;
    }
    bounds
};

/// The bucket of a value in nanoseconds: the first whose bound is at least `value_ns`, or
/// `BUCKETS - 1` (`+Inf`) past the last bound.
#[inline]
pub fn bucket_index(value_ns: u64) -> usize {
    // A value on a bound belongs to it: work on value - 1 against half-open buckets.
    let below = value_ns.saturating_sub(1);
    if below < 1 << FIRST_OCTAVE {
        return 0;
    }
    if below >= 1 << LAST_OCTAVE {
        return BUCKETS - 1;
    }
    let leading = below.leading_zeros();
    let octave = 63 - leading;
    let mantissa = below << leading;
    let quarter =
        (mantissa >= QUARTERS[0]) as usize + (mantissa >= QUARTERS[1]) as usize + (mantissa >= QUARTERS[2]) as usize;
    1 + (octave - FIRST_OCTAVE) as usize * BUCKETS_PER_OCTAVE + quarter
}

/// Upper bound of bucket `index` in seconds (`+Inf` for the last).
pub fn bound_seconds(index: usize) -> f64 {
    match BUCKET_BOUNDS_NS.get(index) {
        Some(&ns) => ns as f64 / 1e9,
        None => f64::INFINITY,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The index by definition: the first bound at or above the value.
    fn by_search(value_ns: u64) -> usize {
        BUCKET_BOUNDS_NS.iter().position(|&bound| value_ns <= bound).unwrap_or(BUCKETS - 1)
    }

    #[test]
    fn bounds_ascend_at_most_1_2x_apart_from_1_us_to_1_s() {
        assert_eq!(BUCKET_BOUNDS_NS[0], 1024);
        assert_eq!(BUCKET_BOUNDS_NS[FINITE_BOUNDS - 1], 1 << 30);
        // ceil(1024 * 2^(1/4)) = ceil(1217.75...), ceil(1024 * sqrt 2) = ceil(1448.15...).
        assert_eq!(&BUCKET_BOUNDS_NS[..5], &[1024, 1218, 1449, 1723, 2048]);
        for pair in BUCKET_BOUNDS_NS.windows(2) {
            let ratio = pair[1] as f64 / pair[0] as f64;
            assert!(ratio > 1.18 && ratio < 1.2, "{pair:?}: {ratio}");
        }
        for (index, &bound) in BUCKET_BOUNDS_NS.iter().enumerate() {
            let exact = 2f64.powf(FIRST_OCTAVE as f64 + index as f64 / 4.0);
            assert_eq!(bound, exact.ceil() as u64, "bound {index}");
        }
    }

    #[test]
    fn index_of_zero_bounds_and_huge_values() {
        assert_eq!(bucket_index(0), 0);
        assert_eq!(bucket_index(1), 0);
        assert_eq!(bucket_index(1024), 0);
        assert_eq!(bucket_index(1025), 1);
        assert_eq!(bucket_index(1218), 1);
        assert_eq!(bucket_index(1219), 2);
        assert_eq!(bucket_index(1 << 30), FINITE_BOUNDS - 1);
        assert_eq!(bucket_index((1 << 30) + 1), BUCKETS - 1);
        assert_eq!(bucket_index(u64::MAX), BUCKETS - 1);
        for (index, &bound) in BUCKET_BOUNDS_NS.iter().enumerate() {
            assert_eq!(bucket_index(bound), index, "on bound {bound}");
            assert_eq!(bucket_index(bound + 1), index + 1, "just past bound {bound}");
            assert_eq!(bucket_index(bound - 1), if index == 0 { 0 } else { by_search(bound - 1) });
        }
    }

    #[test]
    fn index_matches_the_definition_everywhere() {
        // Every value up to 70 µs, then a sweep with a growing stride up to past the last bound.
        for value in 0..70_000 {
            assert_eq!(bucket_index(value), by_search(value), "{value}");
        }
        let mut value = 70_000u64;
        while value < 1 << 31 {
            assert_eq!(bucket_index(value), by_search(value), "{value}");
            value += 1 + value / 9973;
        }
        assert_eq!(bound_seconds(BUCKETS - 1), f64::INFINITY);
        assert_eq!(bound_seconds(0), 1.024e-6);
    }
}
