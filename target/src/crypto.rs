//! ENCRYPT and DECRYPT with AES-256-GCM (`ring`): the key slots a target loaded at start, the
//! per-slot nonce counters reserved ahead of use in the data directory, and the execution of
//! one instruction through a worker's scratch buffer.
//!
//! **Nonces never repeat under one key.** A nonce is the key version and a per-slot counter
//! (`netdam_isa::crypto::Nonce`). Before a counter value is used, the end of a block of
//! `limits::NONCE_RESERVATION_BLOCK` values containing it is written and fsynced to the slot's
//! reservation file (`crypto-nonces-<slot>` in the data directory). After a crash or restart the
//! counter starts at the reserved end: everything below may have been used, nothing above has.
//! The counter does not restart when the key is rotated, so it is unique across every version
//! of the slot. The running target needs no redb lock for this (admin commands open the store
//! while it runs).
//!
//! Workers share a slot's counter: a compare-and-swap takes a value below the reserved end.
//! When half of the block is used, the one worker that wins a flag reserves the next block (one
//! `pwrite` and one `fdatasync` of 16 bytes, no allocation) while the others keep using the
//! half still in hand; only if that is used up before the fsync returns do they answer `busy`.
//!
//! Memory is sealed through a scratch buffer owned by the worker (the region is shared with
//! other workers and cannot be handed to `ring` as `&mut`): the source range is copied in,
//! sealed or opened there, and copied to the destination only if that succeeded, so a DECRYPT
//! that fails authentication writes nothing.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use netdam_isa::crypto::{self as wire, Nonce, Seal, KEY_LEN, SEAL_LEN, TAG_LEN};
use netdam_isa::extension::Permissions;
use netdam_isa::limits::{CRYPTO_KEY_SLOTS, MAX_CRYPTO_AAD_BYTES, MAX_CRYPTO_BYTES};
use netdam_isa::semantics::{AddressSpaces, Outcome, Written};
use netdam_isa::wire::Instruction;
use netdam_isa::Status;
use ring::aead::{Aad, LessSafeKey, UnboundKey, AES_256_GCM};
use ring::rand::{SecureRandom, SystemRandom};

use crate::metadata::{KeyMaterial, StoredKeyDigests, StoredKeySlot};

/// What ENCRYPT and DECRYPT need on the regions they address: read the source, write the
/// result (in place, or at the destination).
pub const CRYPTO_PERMISSIONS: Permissions = Permissions::READ.union(Permissions::WRITE);

/// File name prefix of a slot's nonce reservation file in the data directory.
pub const NONCE_FILE_PREFIX: &str = "crypto-nonces-";

/// Bytes of a reservation record: the reserved end `u64`, its CRC32 `u32`, 4 zero bytes.
const RESERVATION_RECORD_LEN: usize = 16;

/// Why key slots could not be loaded or a key made.
#[derive(Debug, thiserror::Error)]
pub enum CryptoError {
    /// A reservation file could not be read, written or synced.
    #[error("nonce reservation file {path}: {source}")]
    Reservation { path: PathBuf, source: io::Error },
    /// A reservation file holds something else than a reservation record.
    #[error(
        "nonce reservation file {path} is damaged ({reason}); no nonce of its key slot can be proven unused. \
         Rotate or recreate the key slot (netdam-target crypto-key rotate SLOT), then delete the file"
    )]
    Damaged { path: PathBuf, reason: &'static str },
    /// A slot holds a key and its reservation file is gone (a store restored or copied without
    /// it): the nonces its key used are unknown, and one used again breaks AES-GCM. The file is
    /// made when the slot's key is created or rotated, so a slot with a key always has one.
    #[error(
        "nonce reservation file {path} of key slot {slot} is missing, though the slot holds a key: the nonces its \
         key has used cannot be known, and one used twice would break AES-GCM. Rotate the key slot \
         (netdam-target crypto-key rotate {slot}): a new key has used none"
    )]
    Missing { path: PathBuf, slot: u32 },
    /// A stored key is not a valid AES-256 key, or the OS random source failed.
    #[error("key slot {slot}: {reason}")]
    Key { slot: u32, reason: &'static str },
}

/// Draws a new AES-256 key from the operating system's random source.
pub fn generate_key() -> Result<KeyMaterial, CryptoError> {
    let mut key = [0u8; KEY_LEN];
    SystemRandom::new()
        .fill(&mut key)
        .map_err(|_| CryptoError::Key { slot: 0, reason: "the OS random source failed" })?;
    Ok(KeyMaterial(key))
}

/// Path of slot `slot`'s reservation file under `data_dir`.
pub fn reservation_path(data_dir: &Path, slot: u32) -> PathBuf {
    data_dir.join(format!("{NONCE_FILE_PREFIX}{slot}"))
}

/// Makes slot `slot`'s reservation file under `data_dir`, durably, if it does not exist (one
/// that does is kept: its end is never lowered). A key slot's create and rotate call it before
/// they commit the new key, which has used no nonce: a target then refuses a slot holding a key
/// whose file is missing ([`CryptoError::Missing`]).
pub fn start_reservation(data_dir: &Path, slot: u32) -> Result<(), CryptoError> {
    let path = reservation_path(data_dir, slot);
    let fail = |source| CryptoError::Reservation { path: path.clone(), source };
    let file = match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => return Ok(()),
        Err(error) => return Err(fail(error)),
    };
    file.write_all_at(&reservation_record(0), 0).map_err(fail)?;
    file.sync_all().map_err(fail)?;
    File::open(data_dir).and_then(|dir| dir.sync_all()).map_err(fail)
}

/// The reserved end a reservation file records (0 when it does not exist).
pub fn read_reservation(path: &Path) -> Result<u64, CryptoError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(source) => return Err(CryptoError::Reservation { path: path.to_path_buf(), source }),
    };
    let damaged = |reason| CryptoError::Damaged { path: path.to_path_buf(), reason };
    if bytes.len() != RESERVATION_RECORD_LEN {
        return Err(damaged("wrong length"));
    }
    let mut end = [0u8; 8];
    end.copy_from_slice(&bytes[..8]);
    let crc = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    if crc != crc32fast::hash(&end) || bytes[12..] != [0; 4] {
        return Err(damaged("bad checksum"));
    }
    Ok(u64::from_le_bytes(end))
}

fn reservation_record(end: u64) -> [u8; RESERVATION_RECORD_LEN] {
    let mut record = [0u8; RESERVATION_RECORD_LEN];
    record[..8].copy_from_slice(&end.to_le_bytes());
    record[8..12].copy_from_slice(&crc32fast::hash(&end.to_le_bytes()).to_le_bytes());
    record
}

/// A slot's nonce counter: values below `limit` are reserved durably.
#[derive(Debug)]
pub struct NonceCounter {
    next: AtomicU64,
    limit: AtomicU64,
    /// A worker is reserving the next block.
    extending: AtomicBool,
    block: u64,
    file: File,
    path: PathBuf,
}

impl NonceCounter {
    /// Opens (creating) the reservation file at `path`, starts past everything it reserved, and
    /// reserves the first block of `block` values before returning.
    pub fn open(path: &Path, block: u64) -> Result<NonceCounter, CryptoError> {
        assert!(block >= 2, "a reservation block holds at least two nonces (one half in hand)");
        let start = read_reservation(path)?;
        let fail = |source| CryptoError::Reservation { path: path.to_path_buf(), source };
        let existed = path.exists();
        // Owner-only, like the store that holds the keys it counts for.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(fail)?;
        let end = start
            .checked_add(block)
            .ok_or(CryptoError::Damaged { path: path.to_path_buf(), reason: "counter exhausted" })?;
        file.write_all_at(&reservation_record(end), 0).map_err(fail)?;
        file.sync_all().map_err(fail)?;
        if !existed {
            // The file's directory entry must survive a crash too.
            if let Some(dir) = path.parent() {
                File::open(dir).and_then(|dir| dir.sync_all()).map_err(fail)?;
            }
        }
        Ok(NonceCounter {
            next: AtomicU64::new(start),
            limit: AtomicU64::new(end),
            extending: AtomicBool::new(false),
            block,
            file,
            path: path.to_path_buf(),
        })
    }

    /// Takes a counter value never handed out before, here or in an earlier run; `busy` when the
    /// reserved block is used up before its successor is durable, `io_error` when it cannot be.
    pub fn take(&self) -> Result<u64, Status> {
        loop {
            let next = self.next.load(Ordering::Acquire);
            let limit = self.limit.load(Ordering::Acquire);
            let mut extended = Ok(());
            if limit - next.min(limit) <= self.block / 2 {
                extended = self.extend(limit);
            }
            if next >= self.limit.load(Ordering::Acquire) {
                // Used up: the next block is being reserved by another worker (busy), or could
                // not be (its error). While values remain, a failed reservation is retried.
                return Err(extended.err().unwrap_or(Status::Busy));
            }
            if self.next.compare_exchange_weak(next, next + 1, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                return Ok(next);
            }
        }
    }

    /// The first value not yet handed out (tests and the restart check).
    pub fn peek(&self) -> u64 {
        self.next.load(Ordering::Acquire)
    }

    /// Reserves the block after `seen_limit`, unless another worker is doing so or has done it.
    fn extend(&self, seen_limit: u64) -> Result<(), Status> {
        if self.extending.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire).is_err() {
            return Ok(());
        }
        let result = if self.limit.load(Ordering::Acquire) != seen_limit {
            Ok(())
        } else if let Some(end) = seen_limit.checked_add(self.block) {
            match self.file.write_all_at(&reservation_record(end), 0).and_then(|()| self.file.sync_data()) {
                Ok(()) => {
                    self.limit.store(end, Ordering::Release);
                    Ok(())
                }
                Err(error) => {
                    tracing::error!(path = %self.path.display(), %error, "cannot reserve nonces");
                    Err(Status::IoError)
                }
            }
        } else {
            Ok(())
        };
        self.extending.store(false, Ordering::Release);
        result
    }
}

/// A digest (SHA-256) of a key: what tells a running target that the store's key of a slot
/// is not the one it loaded, without keeping a second copy of the key.
pub fn key_digest(key: &KeyMaterial) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, key.bytes());
    digest.as_ref().try_into().expect("SHA-256 gives 32 bytes")
}

/// One key slot: every version of its key, and its nonce counter.
pub struct KeySlot {
    /// Versions, oldest first; the last seals.
    versions: Vec<(u32, LessSafeKey)>,
    /// Each version's [`key_digest`].
    digests: Vec<(u32, [u8; 32])>,
    nonces: NonceCounter,
    /// Set once the store no longer holds the keys loaded (the slot was deleted, or deleted and
    /// made again): the slot serves no more, until a restart loads what the store holds.
    withdrawn: AtomicBool,
}

impl std::fmt::Debug for KeySlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let versions: Vec<u32> = self.versions.iter().map(|(version, _)| *version).collect();
        f.debug_struct("KeySlot").field("versions", &versions).field("nonces", &self.nonces).finish()
    }
}

impl KeySlot {
    /// The slot's nonce counter.
    pub fn nonces(&self) -> &NonceCounter {
        &self.nonces
    }

    fn current(&self) -> &(u32, LessSafeKey) {
        self.versions.last().expect("a loaded slot holds at least one key version")
    }

    fn version(&self, version: u32) -> Option<&LessSafeKey> {
        self.versions.iter().find(|(held, _)| *held == version).map(|(_, key)| key)
    }
}

/// The key slots a target serves, loaded at start; read-only afterwards but for the counters.
#[derive(Debug)]
pub struct KeyRing {
    slots: Box<[Option<KeySlot>]>,
}

impl Default for KeyRing {
    fn default() -> KeyRing {
        KeyRing { slots: (0..CRYPTO_KEY_SLOTS).map(|_| None).collect() }
    }
}

impl KeyRing {
    /// The slots of `stored` (from the metadata store), with their counters resumed from the
    /// reservation files in `data_dir`, `block` nonces reserved at a time.
    pub fn load(stored: Vec<StoredKeySlot>, data_dir: &Path, block: u64) -> Result<KeyRing, CryptoError> {
        let mut ring = KeyRing::default();
        for (slot, versions) in stored {
            let index = usize::try_from(slot).ok().filter(|&index| index < ring.slots.len());
            let Some(index) = index else {
                return Err(CryptoError::Key { slot, reason: "slot number beyond the slots a target holds" });
            };
            if versions.is_empty() {
                continue;
            }
            let digests = versions.iter().map(|(version, material)| (*version, key_digest(material))).collect();
            let keys = versions
                .into_iter()
                .map(|(version, material)| {
                    UnboundKey::new(&AES_256_GCM, material.bytes())
                        .map(|key| (version, LessSafeKey::new(key)))
                        .map_err(|_| CryptoError::Key { slot, reason: "not an AES-256 key" })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let path = reservation_path(data_dir, slot);
            if !path.exists() {
                return Err(CryptoError::Missing { path, slot });
            }
            let nonces = NonceCounter::open(&path, block)?;
            ring.slots[index] = Some(KeySlot { versions: keys, digests, nonces, withdrawn: AtomicBool::new(false) });
        }
        Ok(ring)
    }

    /// Slots holding a key, by number.
    pub fn loaded(&self) -> impl Iterator<Item = (u32, &KeySlot)> {
        self.slots.iter().enumerate().filter_map(|(index, slot)| slot.as_ref().map(|slot| (index as u32, slot)))
    }

    /// Slot `slot`, if it holds a key that was not withdrawn.
    pub fn slot(&self, slot: u32) -> Option<&KeySlot> {
        self.slots.get(usize::try_from(slot).ok()?)?.as_ref().filter(|slot| !slot.withdrawn.load(Ordering::Acquire))
    }

    /// Withdraws every loaded slot whose keys `stored` (the store's slots, as
    /// [`crate::metadata::MetadataStore::read_crypto_key_digests`] reads them) no longer holds,
    /// each version with the same key: a slot deleted, or deleted and made anew, while the
    /// target runs. A withdrawn slot answers `no_such_key` from the next instruction on. A
    /// rotation adds a version and keeps the others, so it withdraws nothing (the new version
    /// seals from the next start). Returns the slots withdrawn now.
    pub fn withdraw_changed(&self, stored: &[StoredKeyDigests]) -> Vec<u32> {
        let mut withdrawn = Vec::new();
        for (number, slot) in self.loaded() {
            if slot.withdrawn.load(Ordering::Acquire) {
                continue;
            }
            let held = stored.iter().find(|(stored, _)| *stored == number).map(|(_, versions)| versions);
            let kept = held.is_some_and(|held| slot.digests.iter().all(|loaded| held.contains(loaded)));
            if !kept {
                slot.withdrawn.store(true, Ordering::Release);
                withdrawn.push(number);
            }
        }
        withdrawn
    }

    /// Whether slot `slot` was withdrawn ([`KeyRing::withdraw_changed`]).
    pub fn is_withdrawn(&self, slot: u32) -> bool {
        let index = usize::try_from(slot).unwrap_or(usize::MAX);
        self.slots.get(index).and_then(Option::as_ref).is_some_and(|slot| slot.withdrawn.load(Ordering::Acquire))
    }
}

/// Executes one ENCRYPT or DECRYPT: `scratch` is the worker's buffer of [`MAX_CRYPTO_BYTES`],
/// `granted` what the session may do, `out` the room left in the response.
///
/// Checks, in order: fields (`malformed`), the regions (`no_such_space`), the grant
/// (`permission_denied`), the key slot (`no_such_key`), the ranges (`out_of_range`), sizes
/// (`too_large`); then DECRYPT's key version and tag (`auth_failed`). Nothing is written unless
/// all pass.
pub fn execute(
    instruction: &Instruction<'_>,
    spaces: &impl AddressSpaces,
    keys: &KeyRing,
    granted: Permissions,
    scratch: &mut [u8],
    out: &mut [u8],
) -> Result<Outcome, Status> {
    let request = wire::decode(instruction)?;
    let source = spaces.memory(instruction.space).ok_or(Status::NoSuchSpace)?;
    let target = request.target_of(instruction);
    let destination = spaces.memory(target.space).ok_or(Status::NoSuchSpace)?;
    if !granted.contains(CRYPTO_PERMISSIONS) {
        return Err(Status::PermissionDenied);
    }
    let slot = keys.slot(request.slot).ok_or(Status::NoSuchKey)?;
    let length = instruction.length as usize;
    let source_start = source.range(instruction.offset, length).ok_or(Status::OutOfRange)?.start;
    let destination_start = destination.range(target.offset, length).ok_or(Status::OutOfRange)?.start;
    let answer_len = if request.decrypt { 0 } else { SEAL_LEN };
    if length > MAX_CRYPTO_BYTES
        || length > scratch.len()
        || request.aad.len() > MAX_CRYPTO_AAD_BYTES
        || out.len() < answer_len
    {
        return Err(Status::TooLarge);
    }
    let buffer = &mut scratch[..length];
    source.read(source_start, buffer);
    let aad = Aad::from(request.aad);
    if let Some(seal) = request.seal {
        let key = slot.version(seal.nonce.key_version).ok_or(Status::AuthFailed)?;
        let nonce = ring::aead::Nonce::assume_unique_for_key(seal.nonce.to_bytes());
        key.open_in_place_separate_tag(nonce, aad, ring::aead::Tag::from(seal.tag), buffer, 0..)
            .map_err(|_| Status::AuthFailed)?;
    } else {
        let (version, key) = slot.current();
        let nonce = Nonce { key_version: *version, counter: slot.nonces.take()? };
        let tag = key
            .seal_in_place_separate_tag(ring::aead::Nonce::assume_unique_for_key(nonce.to_bytes()), aad, buffer)
            .map_err(|_| Status::TooLarge)?;
        let mut tag_bytes = [0u8; TAG_LEN];
        tag_bytes.copy_from_slice(tag.as_ref());
        out[..SEAL_LEN].copy_from_slice(&Seal { nonce, tag: tag_bytes }.to_bytes());
    }
    destination.write(destination_start, &scratch[..length]);
    let written = (length > 0).then_some(Written { space: target.space, offset: destination_start, len: length });
    Ok(Outcome { data_len: answer_len, written })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::Arc;

    #[test]
    fn nonces_from_two_threads_are_distinct_and_a_reopened_counter_starts_past_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = reservation_path(dir.path(), 7);
        // A small block: the threads cross many reservations.
        let counter = Arc::new(NonceCounter::open(&path, 64).unwrap());
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let counter = counter.clone();
                std::thread::spawn(move || {
                    let mut taken = Vec::new();
                    while taken.len() < 5_000 {
                        match counter.take() {
                            Ok(value) => taken.push(value),
                            Err(Status::Busy) => std::thread::yield_now(),
                            Err(other) => panic!("{other}"),
                        }
                    }
                    taken
                })
            })
            .collect();
        let mut all = HashSet::new();
        for thread in threads {
            for value in thread.join().unwrap() {
                assert!(all.insert(value), "nonce counter {value} handed out twice");
            }
        }
        assert_eq!(all.len(), 10_000);
        let highest = *all.iter().max().unwrap();
        let reserved = read_reservation(&path).unwrap();
        assert!(reserved > highest, "the file reserves beyond every value used ({reserved} <= {highest})");
        drop(counter);
        let reopened = NonceCounter::open(&path, 64).unwrap();
        assert!(reopened.peek() > highest);
        assert_eq!(reopened.peek(), reserved, "a reopened counter starts at the reserved end");
        assert_eq!(read_reservation(&path).unwrap(), reserved + 64, "and reserves its first block at once");
    }

    #[test]
    fn a_slot_is_withdrawn_when_the_store_no_longer_holds_its_loaded_keys() {
        let dir = tempfile::tempdir().unwrap();
        let (one, two, three) = (KeyMaterial([1; 32]), KeyMaterial([2; 32]), KeyMaterial([3; 32]));
        for slot in [1, 2, 3, 4] {
            start_reservation(dir.path(), slot).unwrap();
        }
        let stored = vec![
            (1, vec![(1, one.clone())]),
            (2, vec![(1, one.clone()), (2, two.clone())]),
            (3, vec![(1, three.clone())]),
            (4, vec![(1, one.clone())]),
        ];
        let ring = KeyRing::load(stored, dir.path(), 64).unwrap();
        let digests = |versions: &[(u32, &KeyMaterial)]| -> Vec<(u32, [u8; 32])> {
            versions.iter().map(|(version, key)| (*version, key_digest(key))).collect()
        };
        let now = vec![
            // 1: rotated, the loaded version kept.
            (1, digests(&[(1, &one), (2, &two)])),
            // 2: its first version gone.
            (2, digests(&[(2, &two)])),
            // 3: deleted and made anew (version 1 again, another key). 4: deleted.
            (3, digests(&[(1, &one)])),
        ];
        assert_eq!(ring.withdraw_changed(&now), [2, 3, 4]);
        assert!(ring.slot(1).is_some() && !ring.is_withdrawn(1));
        assert!((2..=4).all(|slot| ring.slot(slot).is_none() && ring.is_withdrawn(slot)));
        assert!(ring.withdraw_changed(&now).is_empty(), "withdrawn once");
        assert!(!ring.is_withdrawn(5) && !ring.is_withdrawn(u32::MAX), "an empty slot is not withdrawn");
    }

    #[test]
    fn a_damaged_reservation_file_is_refused_not_reset() {
        let dir = tempfile::tempdir().unwrap();
        let path = reservation_path(dir.path(), 1);
        NonceCounter::open(&path, 64).unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[0] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let error = NonceCounter::open(&path, 64).unwrap_err().to_string();
        assert!(error.contains("damaged"), "{error}");
    }
}
