//! Splitting a range into pieces that one backend call, transfer or instruction can carry. The
//! NBD export, [`crate::Volume`], the fio engine and the CLI all split this one way.

use netdam_isa::limits::MAX_BLOCK_ZERO_BYTES;

/// Splits `len` bytes at `offset` into consecutive pieces of at most `max_piece_bytes`, each
/// `(offset, position in the range, bytes)`. With an aligned offset and a piece size that is a
/// multiple of the block size, every piece is aligned.
pub fn pieces(offset: u64, len: u64, max_piece_bytes: u64) -> impl Iterator<Item = (u64, u64, u64)> {
    assert!(max_piece_bytes > 0, "pieces of zero bytes would never end");
    let mut position = 0u64;
    std::iter::from_fn(move || {
        if position >= len {
            return None;
        }
        let piece = (len - position).min(max_piece_bytes);
        let at = position;
        position += piece;
        Some((offset + at, at, piece))
    })
}

/// The most bytes one TRIM or WRITE_ZEROES (or a region's FILL standing in for a trim) may
/// cover with blocks of `block_bytes`: the target refuses more as `too_large`, so that one
/// request does not hold a worker for long. Whole blocks, at least one.
pub fn zeroing_piece_bytes(block_bytes: u32) -> u64 {
    let block = u64::from(block_bytes).max(1);
    (MAX_BLOCK_ZERO_BYTES / block).max(1) * block
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_the_range_exactly() {
        let all: Vec<_> = pieces(4096, 20_480, 8192).collect();
        assert_eq!(all, vec![(4096, 0, 8192), (12_288, 8192, 8192), (20_480, 16_384, 4096)]);
        assert_eq!(pieces(0, 0, 512).count(), 0);
        assert_eq!(pieces(0, 512, u64::MAX).collect::<Vec<_>>(), vec![(0, 0, 512)]);
        // Near the end of the address space, nothing overflows.
        assert_eq!(pieces(u64::MAX - 1023, 1024, 512).count(), 2);
    }

    #[test]
    fn a_zeroing_piece_is_whole_blocks_within_the_instruction_bound() {
        assert_eq!(zeroing_piece_bytes(4096), MAX_BLOCK_ZERO_BYTES);
        let odd = zeroing_piece_bytes(3000);
        assert!(odd <= MAX_BLOCK_ZERO_BYTES && odd.is_multiple_of(3000) && odd + 3000 > MAX_BLOCK_ZERO_BYTES);
        assert_eq!(zeroing_piece_bytes(0), MAX_BLOCK_ZERO_BYTES, "a zero block size cannot loop forever");
    }
}
