//! ENCRYPT and DECRYPT (AES-256-GCM on a range of a region): the operand, nonce and seal layouts
//! of `docs/PROTOCOL.md`. Pure: the target executes them with its keys (`netdam-target`'s
//! `crypto` module), the initiator builds and reads them with these functions.
//!
//! ENCRYPT replaces a range by its ciphertext (same length, in place or at a destination) and
//! answers the 28-byte **seal**: the 12-byte nonce it used followed by the 16-byte tag. DECRYPT
//! takes that seal back in its operand. The nonce carries the key version it was sealed under,
//! so a rotated slot still opens what its older versions sealed.

use crate::limits::CRYPTO_KEY_SLOTS;
use crate::opcode::Opcode;
use crate::status::Status;
use crate::wire::Instruction;

/// Flag of ENCRYPT and DECRYPT: the result goes to the destination named in the operand instead
/// of replacing the source range.
pub const CRYPTO_FLAG_TO_DESTINATION: u8 = 0x01;
/// Bytes of an AES-GCM nonce: key version `u32`, then counter `u64`.
pub const NONCE_LEN: usize = 12;
/// Bytes of an AES-GCM tag.
pub const TAG_LEN: usize = 16;
/// Bytes of a seal: nonce, then tag. ENCRYPT's answer data; DECRYPT's first operand bytes.
pub const SEAL_LEN: usize = NONCE_LEN + TAG_LEN;
/// Bytes of a destination in the operand: region `u16`, 6 reserved zero bytes, offset `u64`.
pub const DESTINATION_LEN: usize = 16;
/// Bytes of an AES-256 key.
pub const KEY_LEN: usize = 32;

/// The nonce of one ENCRYPT: which version of the slot's key sealed it, and that key's counter
/// value (never used twice under one key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Nonce {
    /// Version of the slot's key (1 for the key `crypto-key create` made, +1 per rotation).
    pub key_version: u32,
    /// The slot's nonce counter.
    pub counter: u64,
}

impl Nonce {
    /// The 12 nonce bytes: version, then counter, little-endian.
    pub fn to_bytes(self) -> [u8; NONCE_LEN] {
        let mut bytes = [0u8; NONCE_LEN];
        bytes[..4].copy_from_slice(&self.key_version.to_le_bytes());
        bytes[4..].copy_from_slice(&self.counter.to_le_bytes());
        bytes
    }

    /// The nonce of 12 bytes.
    pub fn from_bytes(bytes: &[u8; NONCE_LEN]) -> Nonce {
        let mut version = [0u8; 4];
        version.copy_from_slice(&bytes[..4]);
        let mut counter = [0u8; 8];
        counter.copy_from_slice(&bytes[4..]);
        Nonce { key_version: u32::from_le_bytes(version), counter: u64::from_le_bytes(counter) }
    }
}

/// What ENCRYPT answers and DECRYPT needs back: the nonce and the tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Seal {
    /// The nonce the range was sealed with.
    pub nonce: Nonce,
    /// The authentication tag over the ciphertext and associated data.
    pub tag: [u8; TAG_LEN],
}

impl Seal {
    /// The 28 bytes on the wire.
    pub fn to_bytes(&self) -> [u8; SEAL_LEN] {
        let mut bytes = [0u8; SEAL_LEN];
        bytes[..NONCE_LEN].copy_from_slice(&self.nonce.to_bytes());
        bytes[NONCE_LEN..].copy_from_slice(&self.tag);
        bytes
    }

    /// The seal of `bytes`, which must be exactly [`SEAL_LEN`] long.
    pub fn from_bytes(bytes: &[u8]) -> Option<Seal> {
        if bytes.len() != SEAL_LEN {
            return None;
        }
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&bytes[..NONCE_LEN]);
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&bytes[NONCE_LEN..]);
        Some(Seal { nonce: Nonce::from_bytes(&nonce), tag })
    }
}

/// Where a result goes when [`CRYPTO_FLAG_TO_DESTINATION`] is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Destination {
    /// Region id.
    pub space: u16,
    /// Byte offset in it.
    pub offset: u64,
}

/// A decoded ENCRYPT or DECRYPT, its fields checked (step 1 of the checks: `malformed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CryptoRequest<'a> {
    /// DECRYPT (else ENCRYPT).
    pub decrypt: bool,
    /// Key slot (`aux`), below [`CRYPTO_KEY_SLOTS`].
    pub slot: u32,
    /// DECRYPT's seal.
    pub seal: Option<Seal>,
    /// Where the result goes; `None`: in place.
    pub destination: Option<Destination>,
    /// Associated data: authenticated, not encrypted, not stored (the rest of the operand).
    pub aad: &'a [u8],
}

impl CryptoRequest<'_> {
    /// Where the result goes: the destination, or the source range itself.
    pub fn target_of(&self, instruction: &Instruction<'_>) -> Destination {
        self.destination.unwrap_or(Destination { space: instruction.space, offset: instruction.offset })
    }
}

/// Decodes the flags, aux and operand of an ENCRYPT or DECRYPT: `malformed` for an unknown flag,
/// a slot number of [`CRYPTO_KEY_SLOTS`] or more, an operand shorter than its fixed part, or a
/// non-zero reserved byte. Bounds and sizes are the executor's later checks.
pub fn decode<'a>(instruction: &Instruction<'a>) -> Result<CryptoRequest<'a>, Status> {
    let decrypt = match Opcode::from_u8(instruction.opcode) {
        Some(Opcode::Encrypt) => false,
        Some(Opcode::Decrypt) => true,
        _ => return Err(Status::Malformed),
    };
    if instruction.flags & !CRYPTO_FLAG_TO_DESTINATION != 0 || instruction.aux >= CRYPTO_KEY_SLOTS {
        return Err(Status::Malformed);
    }
    let mut rest = instruction.operand;
    let seal = if decrypt {
        if rest.len() < SEAL_LEN {
            return Err(Status::Malformed);
        }
        let (seal, after) = rest.split_at(SEAL_LEN);
        rest = after;
        Seal::from_bytes(seal)
    } else {
        None
    };
    let destination = if instruction.flags & CRYPTO_FLAG_TO_DESTINATION != 0 {
        if rest.len() < DESTINATION_LEN || rest[2..8] != [0; 6] {
            return Err(Status::Malformed);
        }
        let (fixed, after) = rest.split_at(DESTINATION_LEN);
        rest = after;
        let mut offset = [0u8; 8];
        offset.copy_from_slice(&fixed[8..16]);
        Some(Destination { space: u16::from_le_bytes([fixed[0], fixed[1]]), offset: u64::from_le_bytes(offset) })
    } else {
        None
    };
    Ok(CryptoRequest { decrypt, slot: instruction.aux, seal, destination, aad: rest })
}

/// Appends an ENCRYPT or DECRYPT operand to `operand`: the seal (DECRYPT), the destination (if
/// any), then the associated data.
pub fn encode_operand(operand: &mut Vec<u8>, seal: Option<&Seal>, destination: Option<Destination>, aad: &[u8]) {
    if let Some(seal) = seal {
        operand.extend_from_slice(&seal.to_bytes());
    }
    if let Some(destination) = destination {
        operand.extend_from_slice(&destination.space.to_le_bytes());
        operand.extend_from_slice(&[0; 6]);
        operand.extend_from_slice(&destination.offset.to_le_bytes());
    }
    operand.extend_from_slice(aad);
}

/// Whether executing this instruction twice has the effect of once. ENCRYPT never: each
/// execution draws a fresh nonce, so a second one writes other ciphertext and answers another
/// seal (and the first answer, if it arrives, would not open what memory then holds). DECRYPT
/// only to a destination that does not overlap its source: the same ciphertext and seal give
/// the same plaintext; in place, a second run would decrypt plaintext and fail.
pub fn is_idempotent(instruction: &Instruction<'_>) -> bool {
    let Ok(request) = decode(instruction) else {
        return false;
    };
    let Some(destination) = request.destination.filter(|_| request.decrypt) else {
        return false;
    };
    let length = u64::from(instruction.length);
    destination.space != instruction.space
        || destination.offset.saturating_add(length) <= instruction.offset
        || instruction.offset.saturating_add(length) <= destination.offset
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instruction(opcode: Opcode, flags: u8, aux: u32, operand: &[u8]) -> Instruction<'_> {
        Instruction { opcode: opcode as u8, flags, space: 1, offset: 4096, length: 64, aux, operand }
    }

    #[test]
    fn operands_round_trip_and_bad_fields_are_malformed() {
        let seal = Seal { nonce: Nonce { key_version: 2, counter: 0x0102_0304_0506 }, tag: [7; TAG_LEN] };
        assert_eq!(Seal::from_bytes(&seal.to_bytes()), Some(seal));
        let destination = Destination { space: 3, offset: 8192 };
        let mut operand = Vec::new();
        encode_operand(&mut operand, Some(&seal), Some(destination), b"header");
        assert_eq!(operand.len(), SEAL_LEN + DESTINATION_LEN + 6);
        let decoded = decode(&instruction(Opcode::Decrypt, CRYPTO_FLAG_TO_DESTINATION, 5, &operand)).unwrap();
        assert_eq!(
            decoded,
            CryptoRequest { decrypt: true, slot: 5, seal: Some(seal), destination: Some(destination), aad: b"header" }
        );
        let encrypt = decode(&instruction(Opcode::Encrypt, 0, 0, &[])).unwrap();
        assert_eq!((encrypt.decrypt, encrypt.seal, encrypt.destination, encrypt.aad), (false, None, None, &[][..]));
        let bad = [
            instruction(Opcode::Encrypt, 0x02, 0, &[]),
            instruction(Opcode::Encrypt, 0, CRYPTO_KEY_SLOTS, &[]),
            instruction(Opcode::Encrypt, CRYPTO_FLAG_TO_DESTINATION, 0, &[0; 15]),
            instruction(Opcode::Decrypt, 0, 0, &[0; SEAL_LEN - 1]),
            instruction(Opcode::Read, 0, 0, &[]),
        ];
        for bad in bad {
            assert_eq!(decode(&bad), Err(Status::Malformed), "{bad:?}");
        }
        let mut reserved = vec![0u8; DESTINATION_LEN];
        reserved[5] = 1;
        assert_eq!(
            decode(&instruction(Opcode::Encrypt, CRYPTO_FLAG_TO_DESTINATION, 0, &reserved)),
            Err(Status::Malformed)
        );
    }

    #[test]
    fn only_decrypt_to_a_separate_range_is_idempotent() {
        let seal = [0u8; SEAL_LEN];
        let to = |space: u16, offset: u64| {
            let mut operand = seal.to_vec();
            encode_operand(&mut operand, None, Some(Destination { space, offset }), &[]);
            operand
        };
        let apart = to(1, 4096 + 64);
        let overlapping = to(1, 4096 + 63);
        let elsewhere = to(2, 4096);
        assert!(is_idempotent(&instruction(Opcode::Decrypt, CRYPTO_FLAG_TO_DESTINATION, 0, &apart)));
        assert!(is_idempotent(&instruction(Opcode::Decrypt, CRYPTO_FLAG_TO_DESTINATION, 0, &elsewhere)));
        assert!(!is_idempotent(&instruction(Opcode::Decrypt, CRYPTO_FLAG_TO_DESTINATION, 0, &overlapping)));
        assert!(!is_idempotent(&instruction(Opcode::Decrypt, 0, 0, &seal)), "in place");
        assert!(!is_idempotent(&instruction(Opcode::Encrypt, CRYPTO_FLAG_TO_DESTINATION, 0, &apart[SEAL_LEN..])));
        assert!(!is_idempotent(&instruction(Opcode::Encrypt, 0, 0, &[])));
    }
}
