//! CRC-32C (Castagnoli: reflected polynomial 0x82F63B78, initial value and final XOR
//! 0xFFFFFFFF), the datagram checksum (`wire::datagram_crc`).
//!
//! Two ways to one result, chosen by length. Most datagrams are small (a READ's request and a
//! WRITE's answer are under 100 bytes), and for them the SSE4.2 `crc32` instruction, eight bytes
//! at a time, needs no tables, no SIMD set-up and no dispatch: a 64-byte datagram is eight
//! instructions. Block data (4 KiB and more) goes to `crc-fast`, which interleaves `crc32` with
//! carry-less multiplication (VPCLMULQDQ where the CPU has it) and checks 4 KiB as fast as
//! crc32fast's CRC-32 did (docs/DECISIONS.md, "The datagram checksum is CRC-32C"). Without
//! SSE4.2 everything goes to `crc-fast`, which falls back to tables.

/// Up to this many bytes the `crc32` instruction is used directly; longer inputs go to
/// `crc-fast` (at 256 bytes the two cost about the same here).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const DIRECT_MAX_BYTES: usize = 256;

/// The CRC-32C register before any byte.
pub const INITIAL: u32 = 0xFFFF_FFFF;

/// Advances the CRC-32C register `state` over `bytes` (no final XOR: see [`finish`]).
#[inline]
pub fn update(state: u32, bytes: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if bytes.len() <= DIRECT_MAX_BYTES && std::is_x86_feature_detected!("sse4.2") {
        // SAFETY: the CPU has SSE4.2, checked just above.
        return unsafe { update_sse42(state, bytes) };
    }
    update_crc_fast(state, bytes)
}

/// The checksum of a register that has taken every byte.
#[inline]
pub fn finish(state: u32) -> u32 {
    !state
}

/// CRC-32C of `bytes`.
pub fn crc32c(bytes: &[u8]) -> u32 {
    finish(update(INITIAL, bytes))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
fn update_sse42(state: u32, bytes: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u16, _mm_crc32_u32, _mm_crc32_u64, _mm_crc32_u8};
    let mut rest = bytes;
    let mut wide = u64::from(state);
    // Four words per iteration: the chain of `crc32`s is serial whatever the loop, so this only
    // saves the loop's own instructions.
    while let Some((block, tail)) = rest.split_first_chunk::<32>() {
        for word in block.chunks_exact(8) {
            let mut le = [0u8; 8];
            le.copy_from_slice(word);
            wide = _mm_crc32_u64(wide, u64::from_le_bytes(le));
        }
        rest = tail;
    }
    while let Some((word, tail)) = rest.split_first_chunk::<8>() {
        wide = _mm_crc32_u64(wide, u64::from_le_bytes(*word));
        rest = tail;
    }
    // The tail in at most three steps (a header's 28 bytes end in 4), not byte by byte.
    let mut state = wide as u32;
    if let Some((word, tail)) = rest.split_first_chunk::<4>() {
        state = _mm_crc32_u32(state, u32::from_le_bytes(*word));
        rest = tail;
    }
    if let Some((word, tail)) = rest.split_first_chunk::<2>() {
        state = _mm_crc32_u16(state, u16::from_le_bytes(*word));
        rest = tail;
    }
    if let Some(&byte) = rest.first() {
        state = _mm_crc32_u8(state, byte);
    }
    state
}

fn update_crc_fast(state: u32, bytes: &[u8]) -> u32 {
    let mut digest = crc_fast::Digest::new_with_init_state(crc_fast::CrcAlgorithm::Crc32Iscsi, u64::from(state));
    digest.update(bytes);
    digest.get_state() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The check value of the CRC catalogue (reveng): CRC-32/ISCSI of "123456789" is 0xE3069283.
    #[test]
    fn the_catalogue_check_value() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(finish(update(INITIAL, b"123456789")), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
    }

    /// CRC-32C bit by bit, as the catalogue defines it: the reference both fast paths are held to.
    fn bitwise(state: u32, bytes: &[u8]) -> u32 {
        bytes.iter().fold(state, |mut state, &byte| {
            state ^= u32::from(byte);
            for _ in 0..8 {
                state = (state >> 1) ^ (0x82F6_3B78 & 0u32.wrapping_sub(state & 1));
            }
            state
        })
    }

    /// Every length up to a jumbo datagram's and beyond (block data goes to crc-fast's large-input
    /// kernels), from the initial register and from one a header left, against the bitwise
    /// reference: an independent check, not crc-fast against itself.
    #[test]
    fn every_length_to_a_jumbo_datagram_matches_the_bitwise_reference() {
        let data: Vec<u8> = (0..9_200u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        let mut reference = INITIAL;
        let header = bitwise(INITIAL, &data[..28]);
        for len in 0..=data.len() {
            assert_eq!(update(INITIAL, &data[..len]), reference, "length {len}");
            if len > 28 && len % 7 == 0 {
                assert_eq!(update(header, &data[28..len]), reference, "length {len} after a 28-byte header");
            }
            if let Some(&byte) = data.get(len) {
                reference = bitwise(reference, &[byte]);
            }
        }
    }

    /// The direct path and crc-fast agree at every length around the switch and on splits, so a
    /// datagram checked in two pieces (header, then body) of any sizes gets one answer.
    #[test]
    fn both_paths_agree_at_every_length_and_split() {
        let data: Vec<u8> = (0..2 * DIRECT_MAX_BYTES + 67).map(|i| (i * 131 + 7) as u8).collect();
        for len in 0..data.len() {
            let whole = crc_fast::crc32_iscsi(&data[..len]);
            assert_eq!(crc32c(&data[..len]), whole, "length {len}");
            assert_eq!(finish(update_crc_fast(INITIAL, &data[..len])), whole, "crc-fast at {len}");
            #[cfg(target_arch = "x86_64")]
            if std::is_x86_feature_detected!("sse4.2") {
                // SAFETY: checked.
                assert_eq!(finish(unsafe { update_sse42(INITIAL, &data[..len]) }), whole, "crc32 at {len}");
            }
            for split in [0, 1, 7, 28, len / 2, len.saturating_sub(3)] {
                let split = split.min(len);
                let state = update(update(INITIAL, &data[..split]), &data[split..len]);
                assert_eq!(finish(state), whole, "length {len} split at {split}");
            }
        }
    }
}
