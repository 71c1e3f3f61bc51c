//! The authenticated HELLO (docs/PROTOCOL.md, "Authentication"): the initiator proves it holds
//! its tenant's key by an HMAC over the target's cookie, which serves as the challenge, and a
//! nonce of its own; both sides then derive the session's two keys with HKDF-SHA256. The key
//! itself never crosses the network.

use ring::aead::{LessSafeKey, UnboundKey, AES_256_GCM};
use ring::rand::{SecureRandom, SystemRandom};
use ring::{hkdf, hmac};

use crate::keyfile::{KeyError, TenantKey};

/// Bytes of the initiator's nonce.
pub const NONCE_BYTES: usize = 16;
/// Bytes of the HELLO proof (HMAC-SHA256).
pub const PROOF_BYTES: usize = 32;
/// Bytes of the authentication area of a HELLO operand.
pub const AREA_BYTES: usize = 64;

/// Authentication methods a HELLO names (operand byte 4).
pub mod method {
    /// No authentication (a target with `auth = "none"`).
    pub const NONE: u8 = 0;
    /// Every datagram carries a MAC (AES-256-GCM's tag over the whole datagram).
    pub const MAC: u8 = 1;
    /// As MAC, and every datagram's body (instructions, results) is encrypted.
    pub const ENCRYPT: u8 = 2;
}

/// Label the proof's HMAC starts with.
const PROOF_LABEL: &[u8] = b"netdam-hello-v1";
/// Longest cookie the proof covers (the protocol's are 24 bytes).
const COOKIE_MAX: usize = 64;
/// Room for everything the proof covers.
const PROOF_INPUT_MAX: usize = 15 + COOKIE_MAX + NONCE_BYTES + 13;
/// HKDF salt of the session keys.
const SESSION_SALT: &[u8] = b"netdam-session-v1";

/// What the authentication area of a HELLO carries (64 bytes; PROTOCOL.md gives the layout).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HelloAuth {
    /// The tenant's number.
    pub tenant: u32,
    /// The version of the key the proof was made with.
    pub key_version: u32,
    /// The initiator's fresh nonce.
    pub nonce: [u8; NONCE_BYTES],
    /// HMAC-SHA256 under the tenant key (see [`HelloAuth::proof_input`]).
    pub proof: [u8; PROOF_BYTES],
}

impl HelloAuth {
    /// A proof for `cookie` with a fresh nonce: what the second HELLO carries.
    pub fn prove(
        key: &TenantKey,
        tenant: u32,
        key_version: u32,
        cookie: &[u8],
        method: u8,
        datagram_bytes: u32,
    ) -> Result<HelloAuth, KeyError> {
        let mut nonce = [0; NONCE_BYTES];
        SystemRandom::new().fill(&mut nonce).map_err(|_| KeyError::Random)?;
        Ok(HelloAuth::with_nonce(key, tenant, key_version, cookie, method, datagram_bytes, nonce))
    }

    /// A proof with a given nonce (tests and the protocol examples).
    pub fn with_nonce(
        key: &TenantKey,
        tenant: u32,
        key_version: u32,
        cookie: &[u8],
        method: u8,
        datagram_bytes: u32,
        nonce: [u8; NONCE_BYTES],
    ) -> HelloAuth {
        let mut area = HelloAuth { tenant, key_version, nonce, proof: [0; PROOF_BYTES] };
        let (input, len) = area.proof_input(cookie, method, datagram_bytes);
        let tag = hmac::sign(&hmac_key(key), &input[..len]);
        area.proof.copy_from_slice(tag.as_ref());
        area
    }

    /// What the proof's HMAC covers: the label, the cookie, the nonce, the tenant, the key
    /// version, the method and the requested datagram size (on the stack: HELLO allocates
    /// nothing either).
    fn proof_input(&self, cookie: &[u8], method: u8, datagram_bytes: u32) -> ([u8; PROOF_INPUT_MAX], usize) {
        let mut input = [0u8; PROOF_INPUT_MAX];
        let cookie = &cookie[..cookie.len().min(COOKIE_MAX)];
        let mut len = 0;
        let parts: [&[u8]; 7] = [
            PROOF_LABEL,
            cookie,
            &self.nonce,
            &self.tenant.to_le_bytes(),
            &self.key_version.to_le_bytes(),
            &[method],
            &datagram_bytes.to_le_bytes(),
        ];
        for part in parts {
            input[len..len + part.len()].copy_from_slice(part);
            len += part.len();
        }
        (input, len)
    }

    /// Whether the proof was made with `key` for this cookie, method and size (in constant
    /// time).
    pub fn verify(&self, key: &TenantKey, cookie: &[u8], method: u8, datagram_bytes: u32) -> bool {
        let (input, len) = self.proof_input(cookie, method, datagram_bytes);
        hmac::verify(&hmac_key(key), &input[..len], &self.proof).is_ok()
    }

    /// The 64-byte area: tenant `u32`, key version `u32`, nonce (16), proof (32), 8 zero bytes.
    pub fn encode(&self) -> [u8; AREA_BYTES] {
        let mut area = [0; AREA_BYTES];
        area[0..4].copy_from_slice(&self.tenant.to_le_bytes());
        area[4..8].copy_from_slice(&self.key_version.to_le_bytes());
        area[8..24].copy_from_slice(&self.nonce);
        area[24..56].copy_from_slice(&self.proof);
        area
    }

    /// Reads an area; `None` when its reserved bytes are not zero.
    pub fn decode(area: &[u8; AREA_BYTES]) -> Option<HelloAuth> {
        if area[56..].iter().any(|&byte| byte != 0) {
            return None;
        }
        let word = |range: std::ops::Range<usize>| u32::from_le_bytes(area[range].try_into().expect("4 bytes"));
        Some(HelloAuth {
            tenant: word(0..4),
            key_version: word(4..8),
            nonce: area[8..24].try_into().expect("16 bytes"),
            proof: area[24..56].try_into().expect("32 bytes"),
        })
    }

    /// The keys of session `session`, as both sides derive them from this HELLO and the id the
    /// target gave the session (fresh for every session it opens, so a HELLO replayed after its
    /// session ended gets other keys).
    pub fn session_keys(&self, key: &TenantKey, cookie: &[u8], session: u32) -> SessionKeys {
        SessionKeys::derive(key, cookie, &self.nonce, self.tenant, session)
    }
}

fn hmac_key(key: &TenantKey) -> hmac::Key {
    hmac::Key::new(hmac::HMAC_SHA256, key.as_bytes())
}

/// The two keys of a session: one seals what the initiator sends, the other what the target
/// sends, so the two directions never share a nonce under one key.
pub struct SessionKeys {
    /// Seals requests (initiator to target).
    pub request: LessSafeKey,
    /// Seals responses (target to initiator).
    pub response: LessSafeKey,
}

impl std::fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionKeys(<secret>)")
    }
}

/// HKDF output length for the two AES-256 keys.
struct TwoKeys;

impl hkdf::KeyType for TwoKeys {
    fn len(&self) -> usize {
        64
    }
}

impl SessionKeys {
    /// HKDF-SHA256 with salt `netdam-session-v1`, the tenant key as input key material, and
    /// info = cookie ‖ nonce ‖ tenant (`u32`) ‖ session id (`u32`): 64 bytes, the request key
    /// then the response key.
    pub fn derive(key: &TenantKey, cookie: &[u8], nonce: &[u8; NONCE_BYTES], tenant: u32, session: u32) -> SessionKeys {
        let tenant = tenant.to_le_bytes();
        let session = session.to_le_bytes();
        let info: [&[u8]; 4] = [cookie, nonce, &tenant, &session];
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, SESSION_SALT).extract(key.as_bytes());
        let mut bytes = [0u8; 64];
        prk.expand(&info, TwoKeys)
            .and_then(|okm| okm.fill(&mut bytes))
            .expect("64 bytes is a valid HKDF-SHA256 output length");
        let aes =
            |half: &[u8]| LessSafeKey::new(UnboundKey::new(&AES_256_GCM, half).expect("32 bytes is an AES-256 key"));
        SessionKeys { request: aes(&bytes[..32]), response: aes(&bytes[32..]) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COOKIE: [u8; 24] = [7; 24];

    fn key(byte: u8) -> TenantKey {
        TenantKey::from_bytes([byte; 32])
    }

    #[test]
    fn a_proof_verifies_only_with_its_key_cookie_method_and_size() {
        let area = HelloAuth::prove(&key(1), 3, 1, &COOKIE, method::MAC, 9000).unwrap();
        assert!(area.verify(&key(1), &COOKIE, method::MAC, 9000));
        assert!(!area.verify(&key(2), &COOKIE, method::MAC, 9000), "another key");
        assert!(!area.verify(&key(1), &[8; 24], method::MAC, 9000), "another cookie");
        assert!(!area.verify(&key(1), &COOKIE, method::NONE, 9000), "another method");
        assert!(!area.verify(&key(1), &COOKIE, method::MAC, 4096), "another size");
        let other_tenant = HelloAuth { tenant: 4, ..area };
        assert!(!other_tenant.verify(&key(1), &COOKIE, method::MAC, 9000), "another tenant");
    }

    #[test]
    fn the_area_round_trips_and_refuses_reserved_bytes() {
        let area = HelloAuth::prove(&key(1), 3, 2, &COOKIE, method::MAC, 9000).unwrap();
        let bytes = area.encode();
        assert_eq!(HelloAuth::decode(&bytes), Some(area));
        let mut dirty = bytes;
        dirty[63] = 1;
        assert_eq!(HelloAuth::decode(&dirty), None);
    }

    #[test]
    fn two_hellos_get_different_nonces_and_keys() {
        let first = HelloAuth::prove(&key(1), 3, 1, &COOKIE, method::MAC, 9000).unwrap();
        let second = HelloAuth::prove(&key(1), 3, 1, &COOKIE, method::MAC, 9000).unwrap();
        assert_ne!(first.nonce, second.nonce);
    }
}
