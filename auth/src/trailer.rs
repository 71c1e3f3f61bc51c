//! The trailer of an authenticated datagram (docs/PROTOCOL.md, "Authentication"): 8 bytes of
//! the sender's counter, then a 16-byte AES-256-GCM tag over everything before the tag (header,
//! instructions or results, and the counter) as associated data with an empty plaintext, i.e.
//! GMAC. The counter is the nonce: each sender seals with its own direction's key and never uses
//! a counter twice under it, so no nonce repeats under a key. (A retransmission resends the same
//! bytes; that repeats nothing new.)
//!
//! Sealing and opening work in place on the caller's buffer and allocate nothing.

use ring::aead::{Aad, LessSafeKey, Nonce, NONCE_LEN};

/// Bytes of the counter.
pub const COUNTER_BYTES: usize = 8;
/// Bytes of the tag.
pub const TAG_BYTES: usize = 16;
/// Bytes a trailer adds to a datagram.
pub const TRAILER_BYTES: usize = COUNTER_BYTES + TAG_BYTES;

/// Why a datagram did not open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TrailerError {
    /// Shorter than a trailer.
    #[error("too short for a trailer")]
    TooShort,
    /// The tag does not match: forged, altered, or sealed with another session's key.
    #[error("the MAC does not match")]
    BadTag,
    /// No room after the datagram for a trailer.
    #[error("no room for the trailer")]
    NoRoom,
}

fn nonce(counter: u64) -> Nonce {
    let mut bytes = [0u8; NONCE_LEN];
    bytes[..COUNTER_BYTES].copy_from_slice(&counter.to_le_bytes());
    Nonce::assume_unique_for_key(bytes)
}

/// Appends the trailer to `buffer[..len]` under `key` with `counter` (the sender's next, never
/// reused); returns the sealed length, `len + TRAILER_BYTES`.
pub fn seal(key: &LessSafeKey, counter: u64, buffer: &mut [u8], len: usize) -> Result<usize, TrailerError> {
    let sealed = len + TRAILER_BYTES;
    if buffer.len() < sealed {
        return Err(TrailerError::NoRoom);
    }
    buffer[len..len + COUNTER_BYTES].copy_from_slice(&counter.to_le_bytes());
    let covered = len + COUNTER_BYTES;
    let tag = key
        .seal_in_place_separate_tag(nonce(counter), Aad::from(&buffer[..covered]), &mut [])
        .expect("GMAC of a datagram-sized input cannot fail");
    buffer[covered..sealed].copy_from_slice(tag.as_ref());
    Ok(sealed)
}

/// Checks the trailer of `datagram` under `key`; returns the length without it.
pub fn open(key: &LessSafeKey, datagram: &[u8]) -> Result<usize, TrailerError> {
    let len = datagram.len().checked_sub(TRAILER_BYTES).ok_or(TrailerError::TooShort)?;
    let covered = len + COUNTER_BYTES;
    let counter = u64::from_le_bytes(datagram[len..covered].try_into().expect("8 bytes"));
    let mut tag = [0u8; TAG_BYTES];
    tag.copy_from_slice(&datagram[covered..]);
    // Opening with an empty ciphertext checks the tag over the associated data only.
    key.open_in_place(nonce(counter), Aad::from(&datagram[..covered]), &mut tag)
        .map(|_| len)
        .map_err(|_| TrailerError::BadTag)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hello::SessionKeys;
    use crate::keyfile::TenantKey;

    fn keys(seed: u8) -> SessionKeys {
        SessionKeys::derive(&TenantKey::from_bytes([seed; 32]), &[1; 24], &[2; 16], 1)
    }

    #[test]
    fn a_sealed_datagram_opens_and_any_changed_bit_is_refused() {
        let keys = keys(1);
        let mut buffer = [0u8; 128];
        for (index, byte) in buffer[..60].iter_mut().enumerate() {
            *byte = index as u8;
        }
        let sealed = seal(&keys.request, 5, &mut buffer, 60).unwrap();
        assert_eq!(sealed, 60 + TRAILER_BYTES);
        assert_eq!(open(&keys.request, &buffer[..sealed]), Ok(60));
        for bit in 0..sealed * 8 {
            let mut altered = buffer;
            altered[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(open(&keys.request, &altered[..sealed]), Err(TrailerError::BadTag), "bit {bit}");
        }
    }

    #[test]
    fn another_key_or_direction_does_not_open_it() {
        let (ours, theirs) = (keys(1), keys(2));
        let mut buffer = [9u8; 100];
        let sealed = seal(&ours.request, 1, &mut buffer, 40).unwrap();
        assert_eq!(open(&theirs.request, &buffer[..sealed]), Err(TrailerError::BadTag));
        assert_eq!(open(&ours.response, &buffer[..sealed]), Err(TrailerError::BadTag));
        assert_eq!(open(&ours.request, &buffer[..10]), Err(TrailerError::TooShort));
        assert_eq!(seal(&ours.request, 2, &mut buffer, 90), Err(TrailerError::NoRoom));
    }
}
