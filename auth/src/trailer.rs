//! The trailer of an authenticated datagram (docs/PROTOCOL.md, "Authentication"): 8 bytes of
//! the sender's counter, then a 16-byte tag: the tag AES-256-GCM gives when it seals the
//! datagram's body (everything after the 32-byte header, up to the trailer) as plaintext, with
//! the header and the counter (40 bytes) as associated data, under the sender's direction key and
//! the nonce counter ‖ 4 zero bytes. The ciphertext itself is not sent: the receiver computes the
//! same tag from the body it received and compares. (Sealing the body as plaintext takes
//! ring's fast AES-GCM path, about 3x faster at 4 KiB than feeding it all as associated data,
//! i.e. GMAC; DECISIONS.md has the figures. An encrypted session would send that ciphertext.)
//!
//! The counter is the nonce: each sender seals with its own direction's key and never uses a
//! counter twice under it, so no nonce repeats under a key. (A retransmission resends the same
//! bytes; that repeats nothing new.)
//!
//! Sealing and opening work on the caller's buffer and a per-thread scratch buffer allocated on
//! first use, so the steady state allocates nothing.

use std::cell::RefCell;

use ring::aead::{Aad, LessSafeKey, Nonce, NONCE_LEN};

/// Bytes of the counter.
pub const COUNTER_BYTES: usize = 8;
/// Bytes of the tag.
pub const TAG_BYTES: usize = 16;
/// Bytes a trailer adds to a datagram.
pub const TRAILER_BYTES: usize = COUNTER_BYTES + TAG_BYTES;
/// Bytes of the datagram header, which the tag covers as associated data (PROTOCOL.md).
pub const HEADER_BYTES: usize = 32;
/// The largest body the scratch buffer takes (a UDP datagram's payload).
const MAX_BODY_BYTES: usize = 65_536;

thread_local! {
    /// Where the body is encrypted to compute its tag; its ciphertext is thrown away.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Why a datagram did not open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TrailerError {
    /// Shorter than a header and a trailer.
    #[error("too short for a header and a trailer")]
    TooShort,
    /// The tag does not match: forged, altered, or sealed with another session's key.
    #[error("the MAC does not match")]
    BadTag,
    /// No room after the datagram for a trailer, or shorter than a header.
    #[error("no room for the trailer")]
    NoRoom,
    /// Larger than any datagram.
    #[error("larger than a datagram")]
    TooLarge,
}

/// The tag of `datagram[..len]` (header and body) with `counter`.
fn tag(key: &LessSafeKey, counter: u64, datagram: &[u8], len: usize) -> Result<[u8; TAG_BYTES], TrailerError> {
    let body = &datagram[HEADER_BYTES..len];
    if body.len() > MAX_BODY_BYTES {
        return Err(TrailerError::TooLarge);
    }
    let (associated, nonce) = associated_and_nonce(&datagram[..HEADER_BYTES], counter);
    SCRATCH.with(|scratch| {
        let mut scratch = scratch.borrow_mut();
        if scratch.len() < MAX_BODY_BYTES {
            scratch.resize(MAX_BODY_BYTES, 0);
        }
        let scratch = &mut scratch[..body.len()];
        scratch.copy_from_slice(body);
        let tag = key
            .seal_in_place_separate_tag(nonce, Aad::from(&associated), scratch)
            .expect("AES-GCM of a datagram-sized input cannot fail");
        let mut out = [0u8; TAG_BYTES];
        out.copy_from_slice(tag.as_ref());
        Ok(out)
    })
}

/// Appends the trailer to `buffer[..len]` under `key` with `counter` (the sender's next, never
/// reused); returns the sealed length, `len + TRAILER_BYTES`.
pub fn seal(key: &LessSafeKey, counter: u64, buffer: &mut [u8], len: usize) -> Result<usize, TrailerError> {
    let sealed = len + TRAILER_BYTES;
    if buffer.len() < sealed || len < HEADER_BYTES {
        return Err(TrailerError::NoRoom);
    }
    let tag = tag(key, counter, buffer, len)?;
    buffer[len..len + COUNTER_BYTES].copy_from_slice(&counter.to_le_bytes());
    buffer[len + COUNTER_BYTES..sealed].copy_from_slice(&tag);
    Ok(sealed)
}

/// Seals `buffer[..len]` of an encrypted session: the body is encrypted in place (the same
/// AES-256-GCM as [`seal`], whose ciphertext is here sent) and the trailer appended; returns the
/// sealed length. The header (with its flags) must be final before: it is authenticated.
pub fn seal_encrypted(key: &LessSafeKey, counter: u64, buffer: &mut [u8], len: usize) -> Result<usize, TrailerError> {
    let sealed = len + TRAILER_BYTES;
    if buffer.len() < sealed || len < HEADER_BYTES {
        return Err(TrailerError::NoRoom);
    }
    let (associated, nonce) = associated_and_nonce(&buffer[..HEADER_BYTES], counter);
    let tag = key
        .seal_in_place_separate_tag(nonce, Aad::from(&associated), &mut buffer[HEADER_BYTES..len])
        .expect("AES-GCM of a datagram-sized input cannot fail");
    buffer[len..len + COUNTER_BYTES].copy_from_slice(&counter.to_le_bytes());
    buffer[len + COUNTER_BYTES..sealed].copy_from_slice(tag.as_ref());
    Ok(sealed)
}

/// Opens a datagram of an encrypted session in place: checks the tag and decrypts the body;
/// returns the length without the trailer. On failure the body is left as garbage.
pub fn open_encrypted(key: &LessSafeKey, datagram: &mut [u8]) -> Result<usize, TrailerError> {
    let len =
        datagram.len().checked_sub(TRAILER_BYTES).filter(|&len| len >= HEADER_BYTES).ok_or(TrailerError::TooShort)?;
    let counter = u64::from_le_bytes(datagram[len..len + COUNTER_BYTES].try_into().expect("8 bytes"));
    let (associated, nonce) = associated_and_nonce(&datagram[..HEADER_BYTES], counter);
    let mut tag = [0u8; TAG_BYTES];
    tag.copy_from_slice(&datagram[len + COUNTER_BYTES..]);
    let body = &mut datagram[HEADER_BYTES..len];
    key.open_in_place_separate_tag(nonce, Aad::from(&associated), ring::aead::Tag::from(tag), body, 0..)
        .map(|_| len)
        .map_err(|_| TrailerError::BadTag)
}

/// The associated data (header, counter) and the nonce of a datagram's tag.
fn associated_and_nonce(header: &[u8], counter: u64) -> ([u8; HEADER_BYTES + COUNTER_BYTES], Nonce) {
    let mut associated = [0u8; HEADER_BYTES + COUNTER_BYTES];
    associated[..HEADER_BYTES].copy_from_slice(header);
    associated[HEADER_BYTES..].copy_from_slice(&counter.to_le_bytes());
    let mut nonce = [0u8; NONCE_LEN];
    nonce[..COUNTER_BYTES].copy_from_slice(&counter.to_le_bytes());
    (associated, Nonce::assume_unique_for_key(nonce))
}

/// Checks the trailer of `datagram` under `key`; returns the length without it.
pub fn open(key: &LessSafeKey, datagram: &[u8]) -> Result<usize, TrailerError> {
    let len =
        datagram.len().checked_sub(TRAILER_BYTES).filter(|&len| len >= HEADER_BYTES).ok_or(TrailerError::TooShort)?;
    let counter = u64::from_le_bytes(datagram[len..len + COUNTER_BYTES].try_into().expect("8 bytes"));
    let expected = tag(key, counter, datagram, len)?;
    // In constant time: how much of a guess matched must not show in the timing.
    let difference = expected.iter().zip(&datagram[len + COUNTER_BYTES..]).fold(0u8, |acc, (a, b)| acc | (a ^ b));
    if difference == 0 {
        Ok(len)
    } else {
        Err(TrailerError::BadTag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hello::SessionKeys;
    use crate::keyfile::TenantKey;

    fn keys(seed: u8) -> SessionKeys {
        SessionKeys::derive(&TenantKey::from_bytes([seed; 32]), &[1; 24], &[2; 16], 1, 7)
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
    fn an_encrypted_datagram_hides_its_body_opens_to_it_and_carries_the_same_tag() {
        let keys = keys(3);
        let mut plain = [0u8; 200];
        for (index, byte) in plain[..100].iter_mut().enumerate() {
            *byte = index as u8;
        }
        let mut macced = plain;
        let sealed = seal(&keys.request, 9, &mut macced, 100).unwrap();
        let mut encrypted = plain;
        assert_eq!(seal_encrypted(&keys.request, 9, &mut encrypted, 100).unwrap(), sealed);
        assert_eq!(encrypted[..HEADER_BYTES], plain[..HEADER_BYTES], "the header stays readable");
        assert_ne!(encrypted[HEADER_BYTES..100], plain[HEADER_BYTES..100], "the body is hidden");
        assert_eq!(encrypted[100..sealed], macced[100..sealed], "one construction: the same trailer");
        let mut received = encrypted;
        assert_eq!(open_encrypted(&keys.request, &mut received[..sealed]), Ok(100));
        assert_eq!(received[..100], plain[..100]);
        let mut altered = encrypted;
        altered[50] ^= 1;
        assert_eq!(open_encrypted(&keys.request, &mut altered[..sealed]), Err(TrailerError::BadTag));
        let mut other_key = encrypted;
        assert_eq!(open_encrypted(&keys.response, &mut other_key[..sealed]), Err(TrailerError::BadTag));
    }

    #[test]
    fn another_key_or_direction_does_not_open_it() {
        let (ours, theirs) = (keys(1), keys(2));
        let mut buffer = [9u8; 100];
        let sealed = seal(&ours.request, 1, &mut buffer, 40).unwrap();
        assert_eq!(open(&theirs.request, &buffer[..sealed]), Err(TrailerError::BadTag));
        assert_eq!(open(&ours.response, &buffer[..sealed]), Err(TrailerError::BadTag));
        assert_eq!(open(&ours.request, &buffer[..40]), Err(TrailerError::TooShort));
        assert_eq!(seal(&ours.request, 2, &mut buffer, 90), Err(TrailerError::NoRoom));
    }
}
