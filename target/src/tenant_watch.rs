//! Applying tenant changes to a running target: a thread polls the metadata store's file and,
//! when it changed, re-reads the tenants and publishes a new [`TenantSnapshot`] through the
//! target's [`TenantCell`], so a revoked grant or a rotated key is in force within a second.
//! It also withdraws a key slot deleted (or deleted and made anew) in the store meanwhile
//! ([`KeyRing::withdraw_changed`]): a grant given on a slot made anew must not open what the
//! deleted key sealed.
//!
//! The target never keeps the store open: redb locks the file while it is open, and an admin
//! command must be able to change it. Each read opens it read-only for a few milliseconds
//! (waiting while an admin command holds it, see [`crate::metadata::read_tenants`]). Why a
//! polled file and not inotify or a control socket: docs/DECISIONS.md.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use crate::crypto::KeyRing;
use crate::metadata::{read_tenants, MetadataError, MetadataStore, METADATA_FILE};
use crate::namespaces::NamespaceTable;
use crate::regions::RegionTable;
use crate::tenants::{TenantCell, TenantRecord, TenantSnapshot};

/// How often the store file is looked at: with a read that takes milliseconds, a change is in
/// force well within the one second promised.
pub const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// The file in the data directory where a running target says which tenants it applied: a
/// digest of the records it last published ([`records_digest`]). An admin command waits until
/// it names what the command committed ([`wait_until_applied`]), so a key is usable once the
/// command returns. File times cannot say it: they are kept at the kernel's clock tick, and two
/// changes in one tick look alike.
pub const APPLIED_FILE: &str = "tenants.applied";

/// A digest of `records` as [`read_tenants`] returns them (SHA-256 of their JSON, in hex).
pub fn records_digest(records: &[TenantRecord]) -> String {
    let json = serde_json::to_vec(records).expect("tenant records always serialize");
    ring::digest::digest(&ring::digest::SHA256, &json).as_ref().iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Waits, at most `limit`, until the target running on `data_dir` has applied the tenants its
/// store holds now (its [`APPLIED_FILE`] names them); whether it has.
pub fn wait_until_applied(data_dir: &Path, limit: Duration) -> bool {
    let Ok(records) = read_tenants(data_dir) else { return false };
    let wanted = records_digest(&records);
    let started = std::time::Instant::now();
    loop {
        if std::fs::read_to_string(data_dir.join(APPLIED_FILE)).is_ok_and(|applied| applied.trim() == wanted) {
            return true;
        }
        if started.elapsed() >= limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Writes `records`' digest to `data_dir`'s [`APPLIED_FILE`] (beside it first, then renamed:
/// a reader sees the old digest or the new one). Best effort: an admin command that cannot read
/// it waits its limit and says so.
fn note_applied(data_dir: &Path, records: &[TenantRecord]) {
    let (path, staged) = (data_dir.join(APPLIED_FILE), data_dir.join(format!("{APPLIED_FILE}.new")));
    let written = std::fs::write(&staged, records_digest(records)).and_then(|()| std::fs::rename(&staged, &path));
    if let Err(error) = written {
        tracing::debug!(path = %path.display(), %error, "cannot note the tenants applied");
    }
}

/// How long a store that failed to read, and has not changed since, waits for the next try.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(5);

/// A file changed less than this long ago is read again at the next poll even if it looks the
/// same: file times are kept at the kernel's clock tick, so a second write in the tick of the
/// first, after the read, leaves time, size and inode as they were.
const RECENT_CHANGE: Duration = Duration::from_secs(1);

/// The tenants of `data_dir`'s store resolved against the spaces served, with the warnings of
/// [`TenantSnapshot::resolve`] (records left out and why).
pub fn load_snapshot(
    data_dir: &Path,
    regions: &RegionTable,
    namespaces: &NamespaceTable,
) -> Result<(TenantSnapshot, Vec<String>), MetadataError> {
    let records = read_tenants(data_dir)?;
    Ok(TenantSnapshot::resolve(&records, regions, namespaces))
}

/// The running watcher; dropping it stops the thread and waits for it (at most one poll).
#[derive(Debug)]
pub struct WatchHandle {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for WatchHandle {
    fn drop(&mut self) {
        // Closing the channel wakes the thread at once.
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("the tenant watcher thread panicked");
            }
        }
    }
}

/// What the tenants are resolved against, and the key slots loaded at start.
#[derive(Debug, Clone)]
pub struct Watched {
    /// The regions served.
    pub regions: Arc<RegionTable>,
    /// The namespaces served.
    pub namespaces: Arc<NamespaceTable>,
    /// The key slots loaded.
    pub keys: Arc<KeyRing>,
}

/// Reads the tenants of `data_dir`'s store, publishes them into `cell`, and starts a thread
/// that publishes them again whenever the store file changes (and withdraws key slots the store
/// no longer holds), until the handle drops. Fails when the store cannot be read now, or the
/// thread cannot start.
pub fn watch(data_dir: &Path, watched: Watched, cell: Arc<TenantCell>) -> std::io::Result<WatchHandle> {
    let Watched { regions, namespaces, keys } = watched;
    let mut watcher = Watcher {
        data_dir: data_dir.to_path_buf(),
        path: data_dir.join(METADATA_FILE),
        regions,
        namespaces,
        keys,
        keys_checked: true,
        cell,
        seen: None,
        records: Vec::new(),
        recent: false,
        failing: None,
        failed_at: None,
    };
    watcher.reload(true).map_err(std::io::Error::other)?;
    let (stop, stopped) = mpsc::channel::<()>();
    let thread = std::thread::Builder::new().name("netdam-tenants".into()).spawn(move || loop {
        match stopped.recv_timeout(POLL_INTERVAL) {
            Err(RecvTimeoutError::Timeout) => watcher.poll(),
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
    })?;
    Ok(WatchHandle { stop: Some(stop), thread: Some(thread) })
}

/// What identifies one version of the store file: a write changes its time (or size), a
/// replaced file its inode. `None`: there is no file.
type Stamp = Option<(u64, u64, u64, i64, i64, i64, i64)>;

fn stamp(path: &Path) -> Stamp {
    let metadata = std::fs::metadata(path).ok()?;
    Some((
        metadata.dev(),
        metadata.ino(),
        metadata.size(),
        metadata.mtime(),
        metadata.mtime_nsec(),
        metadata.ctime(),
        metadata.ctime_nsec(),
    ))
}

/// Whether `path` was modified less than [`RECENT_CHANGE`] ago (by the wall clock, either way).
fn changed_recently(path: &Path) -> bool {
    let Ok(modified) = std::fs::metadata(path).and_then(|metadata| metadata.modified()) else {
        return false;
    };
    let now = SystemTime::now();
    let age = now.duration_since(modified).or_else(|_| modified.duration_since(now)).unwrap_or_default();
    age < RECENT_CHANGE
}

struct Watcher {
    data_dir: PathBuf,
    path: PathBuf,
    regions: Arc<RegionTable>,
    namespaces: Arc<NamespaceTable>,
    keys: Arc<KeyRing>,
    /// Whether the last read compared the store's keys with those loaded (see
    /// `withdraw_deleted_keys`).
    keys_checked: bool,
    cell: Arc<TenantCell>,
    /// The file as it was before the last successful read.
    seen: Stamp,
    /// What that read found.
    records: Vec<TenantRecord>,
    /// The file had changed shortly before that read: read it again.
    recent: bool,
    /// The last read's error, logged once until a read succeeds.
    failing: Option<String>,
    /// The file as it was when that read failed, and when.
    failed_at: Option<(Stamp, std::time::Instant)>,
}

impl Watcher {
    /// Withdraws the loaded key slots that the store no longer holds with the same keys
    /// ([`KeyRing::withdraw_changed`]); whether the store's keys could be read to compare.
    fn withdraw_deleted_keys(&self) -> bool {
        if self.keys.loaded().next().is_none() {
            return true;
        }
        let stored = match MetadataStore::read_crypto_key_digests(&self.data_dir) {
            Ok(stored) => stored,
            Err(error) => {
                tracing::warn!(%error, "cannot read the key slots to compare them with those loaded; no tenant uses a key slot until they can be");
                return false;
            }
        };
        for slot in self.keys.withdraw_changed(&stored) {
            tracing::warn!(
                slot,
                "key slot {slot} was deleted from the metadata store: it serves no more ENCRYPT or DECRYPT (a key \
                 made anew in the slot serves from the target's next start)"
            );
        }
        true
    }

    fn poll(&mut self) {
        let now = stamp(&self.path);
        if now == self.seen && !self.recent {
            return;
        }
        // A file that failed to read is read again once it changes, or after a while (a read
        // can fail for a passing reason, such as an admin command holding the store longer
        // than the wait), not at every poll: a damaged one would fail, and print redb's panic,
        // five times a second.
        if self.failing.is_some()
            && self.failed_at.as_ref().is_some_and(|(stamp, at)| *stamp == now && at.elapsed() < RETRY_AFTER_FAILURE)
        {
            return;
        }
        if let Err(error) = self.reload(false) {
            self.failed_at = Some((now, std::time::Instant::now()));
            let message = error.to_string();
            if self.failing.as_ref() != Some(&message) {
                tracing::warn!(error = %message, "cannot re-read the tenants; the ones in force stay until a read succeeds");
                self.failing = Some(message);
            }
        }
    }

    /// Reads the store and publishes what it holds when that differs from the last read (or
    /// `always`). The stamp is taken before the read: a write during the read shows at the next poll.
    fn reload(&mut self, always: bool) -> Result<(), MetadataError> {
        let before = stamp(&self.path);
        if before.is_none() && self.seen.is_some() {
            // A store that was there and is gone (moved away, deleted) holds no tenants to read:
            // taking it for an empty store would shut every tenant out on a mistake.
            return Err(MetadataError::Store {
                path: self.path.clone(),
                message: "the file is gone: put it back; the tenants read before stay in force".into(),
            });
        }
        let records = read_tenants(&self.data_dir)?;
        // Before the tenants are published (and noted applied): a command that deleted a slot
        // and granted it anew finds the old key gone once it returns.
        let keys_checked = self.withdraw_deleted_keys();
        self.seen = before;
        // Keys not compared are read again at the next poll, changed or not.
        self.recent = changed_recently(&self.path) || !keys_checked;
        if self.failing.take().is_some() {
            tracing::info!("the tenants can be read again");
        }
        if !always && records == self.records && keys_checked == self.keys_checked {
            return Ok(());
        }
        let (snapshot, warnings) = TenantSnapshot::resolve(&records, &self.regions, &self.namespaces);
        // Keys that could not be compared with the store may be deleted ones: no tenant uses
        // any until they can, and the tenants' other changes (a revoke) still apply.
        let snapshot = if keys_checked { snapshot } else { snapshot.without_key_slots() };
        self.keys_checked = keys_checked;
        let tenants = snapshot.iter().count();
        self.cell.publish(snapshot);
        let generation = self.cell.generation();
        if warnings.is_empty() && generation <= 1 {
            // At start: the start line says how many (it must stay the first line).
            tracing::debug!(tenants, generation, "tenants loaded from the metadata store");
        } else if warnings.is_empty() {
            tracing::info!(tenants, generation, "tenants loaded from the metadata store");
        } else {
            tracing::warn!(tenants, generation, warnings = %warnings.join("; "), "tenants loaded from the metadata store, some left out");
        }
        note_applied(&self.data_dir, &records);
        self.records = records;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ByteSize, RegionBackend, RegionConfig};
    use crate::metadata::{KnownSpaces, MetadataStore, TenantSettings};
    use crate::tenants::{GrantRecord, GrantSpace};
    use netdam_auth::TenantKey;
    use netdam_isa::extension::Permissions;
    use std::time::Instant;

    fn watched(regions: Arc<RegionTable>, namespaces: Arc<NamespaceTable>) -> Watched {
        Watched { regions, namespaces, keys: Arc::new(KeyRing::default()) }
    }

    fn spaces(dir: &Path) -> (Arc<RegionTable>, Arc<NamespaceTable>) {
        let scratch =
            RegionConfig { name: "scratch".into(), backend: RegionBackend::Mem, path: None, size: ByteSize(65536) };
        (Arc::new(RegionTable::open(&[scratch], dir).unwrap()), Arc::new(NamespaceTable::open(&[], dir).unwrap()))
    }

    fn known() -> KnownSpaces {
        KnownSpaces { regions: vec![("scratch".into(), Some(65536))], ..KnownSpaces::default() }
    }

    fn grant(permissions: &[&str]) -> GrantRecord {
        GrantRecord {
            space: GrantSpace::Region("scratch".into()),
            permissions: permissions.iter().map(|name| name.to_string()).collect(),
            range: None,
        }
    }

    /// Waits up to `limit` for the cell's generation to pass `after`; returns how long it took.
    fn wait_for_generation(cell: &TenantCell, after: u64, limit: Duration) -> Option<Duration> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if cell.generation() > after {
                return Some(start.elapsed());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    }

    /// Stores tenant alice holding read and write on `scratch`, and closes the store.
    fn store_alice_with_read_write(dir: &Path) {
        let store = MetadataStore::open(dir).unwrap();
        store.create_tenant("alice", &TenantKey::generate().unwrap(), &TenantSettings::default()).unwrap();
        store.grant("alice", &grant(&["read", "write"]), &known()).unwrap();
    }

    /// The watcher names what it applied, so an admin command can wait for it: a change is
    /// applied once the watcher read it, and not while no watcher runs.
    #[test]
    fn the_tenants_applied_are_named_for_admin_commands_to_wait_on() {
        let dir = tempfile::tempdir().unwrap();
        let (regions, namespaces) = spaces(dir.path());
        store_alice_with_read_write(dir.path());
        let handle = watch(dir.path(), watched(regions, namespaces), Arc::new(TenantCell::default())).unwrap();
        assert!(wait_until_applied(dir.path(), Duration::ZERO), "applied at start");
        MetadataStore::open(dir.path()).unwrap().revoke("alice", &GrantSpace::Region("scratch".into()), None).unwrap();
        assert!(wait_until_applied(dir.path(), Duration::from_secs(5)), "the revoke is applied");
        drop(handle);
        let store = MetadataStore::open(dir.path()).unwrap();
        store.grant("alice", &grant(&["read"]), &known()).unwrap();
        drop(store);
        assert!(!wait_until_applied(dir.path(), Duration::from_millis(300)), "no watcher applied the grant");
    }

    #[test]
    fn a_changed_grant_is_published_within_a_second_and_nothing_holds_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let (regions, namespaces) = spaces(dir.path());
        store_alice_with_read_write(dir.path());
        let cell = Arc::new(TenantCell::default());
        let handle = watch(dir.path(), watched(regions, namespaces), cell.clone()).unwrap();
        let (generation, snapshot) = cell.load();
        let alice = snapshot.iter().next().expect("alice is published at start");
        let held = alice.region_grant(0).expect("alice holds scratch");
        assert!(held.allows(Permissions::WRITE, 0, 65536));

        // Between polls nothing holds the store: an admin command opens it at once.
        let store = MetadataStore::open(dir.path()).expect("the watcher does not keep the store open");
        store.revoke("alice", &GrantSpace::Region("scratch".into()), Some(&["write".into()])).unwrap();
        drop(store);
        let took = wait_for_generation(&cell, generation, Duration::from_secs(1)).expect("published within 1 s");
        let (generation, snapshot) = cell.load();
        let held = snapshot.tenant(alice.id).unwrap().region_grant(0).unwrap();
        assert!(!held.allows(Permissions::WRITE, 0, 1), "write was revoked ({took:?} after the commit)");
        assert!(held.allows(Permissions::READ, 0, 1));

        // A rotated key too.
        let old_key = snapshot.tenant(alice.id).unwrap().key;
        let (_, new_key) = MetadataStore::open(dir.path()).unwrap().rotate_key("alice").unwrap();
        wait_for_generation(&cell, generation, Duration::from_secs(1)).expect("published within 1 s");
        let (generation, snapshot) = cell.load();
        let alice = snapshot.tenant(alice.id).unwrap();
        assert_eq!((alice.key_version, &alice.key), (2, &new_key));
        assert_ne!(alice.key, old_key);

        // Nothing changes: nothing is published, and the store is not open in this process.
        std::thread::sleep(RECENT_CHANGE + 3 * POLL_INTERVAL);
        assert_eq!(cell.generation(), generation, "an unchanged store publishes nothing");
        let store_path = dir.path().join(METADATA_FILE).canonicalize().unwrap();
        let open_here = std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
            .any(|target| target == store_path);
        assert!(!open_here, "the watcher keeps no descriptor of the store between reads");
        let started = Instant::now();
        drop(handle);
        assert!(started.elapsed() < POLL_INTERVAL * 2, "dropping the handle stops the thread promptly");
    }

    /// A store damaged under a running target (pages overwritten) or moved away leaves the
    /// tenants in force: the watcher neither dies on redb's panic nor publishes "no tenants";
    /// once the file is back, changes apply again.
    #[test]
    fn a_damaged_or_missing_store_keeps_the_tenants_in_force_until_it_is_back() {
        let dir = tempfile::tempdir().unwrap();
        let (regions, namespaces) = spaces(dir.path());
        store_alice_with_read_write(dir.path());
        let path = dir.path().join(METADATA_FILE);
        let good = std::fs::read(&path).unwrap();
        let cell = Arc::new(TenantCell::default());
        let _handle = watch(dir.path(), watched(regions, namespaces), cell.clone()).unwrap();
        let (generation, _) = cell.load();

        // Every page but the header overwritten, then the file moved away.
        let mut damaged = good.clone();
        damaged[4096..].fill(0xde);
        std::fs::write(&path, &damaged).unwrap();
        std::thread::sleep(RECENT_CHANGE + 3 * POLL_INTERVAL);
        std::fs::rename(&path, dir.path().join("moved.redb")).unwrap();
        std::thread::sleep(3 * POLL_INTERVAL);
        let (now, snapshot) = cell.load();
        assert_eq!(now, generation, "nothing was published while the store could not be read");
        assert!(snapshot.iter().next().is_some_and(|alice| alice.name == "alice"), "alice stays in force");

        std::fs::write(&path, &good).unwrap();
        MetadataStore::open(dir.path())
            .unwrap()
            .revoke("alice", &GrantSpace::Region("scratch".into()), Some(&["write".into()]))
            .unwrap();
        wait_for_generation(&cell, generation, Duration::from_secs(2)).expect("the watcher reads the store again");
        let (_, snapshot) = cell.load();
        let held = snapshot.iter().next().unwrap().region_grant(0).unwrap();
        assert!(!held.allows(Permissions::WRITE, 0, 1) && held.allows(Permissions::READ, 0, 1));
    }

    #[test]
    fn admin_commands_succeed_while_the_watcher_reads() {
        let dir = tempfile::tempdir().unwrap();
        let (regions, namespaces) = spaces(dir.path());
        MetadataStore::open(dir.path())
            .unwrap()
            .create_tenant("busy", &TenantKey::generate().unwrap(), &TenantSettings::default())
            .unwrap();
        let cell = Arc::new(TenantCell::default());
        let _handle = watch(dir.path(), watched(regions, namespaces), cell.clone()).unwrap();
        let start_generation = cell.generation();
        // Every change makes the watcher read (and read again while the file is recent), so
        // commands and reads keep meeting on the file lock; each command must still succeed.
        for round in 0..60 {
            let store = MetadataStore::open(dir.path()).unwrap_or_else(|error| panic!("round {round}: {error}"));
            if round % 2 == 0 {
                store.grant("busy", &grant(&["read"]), &known()).unwrap();
            } else {
                store.revoke("busy", &GrantSpace::Region("scratch".into()), None).unwrap();
            }
            drop(store);
            std::thread::sleep(Duration::from_millis(round % 7 * 10));
        }
        // The last change (a revoke) is what the target ends with.
        let deadline = Instant::now() + Duration::from_secs(1) + POLL_INTERVAL;
        loop {
            let (_, snapshot) = cell.load();
            let busy = snapshot.iter().next().unwrap();
            if busy.region_grant(0).is_none() {
                break;
            }
            assert!(Instant::now() < deadline, "the last revoke is not in force");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(cell.generation() > start_generation + 1, "changes were published along the way");
    }

    #[test]
    fn no_store_means_no_tenants_until_one_appears() {
        let dir = tempfile::tempdir().unwrap();
        let (regions, namespaces) = spaces(dir.path());
        let (snapshot, warnings) = load_snapshot(dir.path(), &regions, &namespaces).unwrap();
        assert!(snapshot.is_empty() && warnings.is_empty());
        let cell = Arc::new(TenantCell::default());
        let _handle = watch(dir.path(), watched(regions.clone(), namespaces.clone()), cell.clone()).unwrap();
        let (generation, snapshot) = cell.load();
        assert!(snapshot.is_empty());
        assert!(!dir.path().join(METADATA_FILE).exists(), "the watcher creates no store");
        let key_file = crate::tenant_admin::ensure_default_tenant(dir.path()).unwrap().unwrap();
        wait_for_generation(&cell, generation, Duration::from_secs(1)).expect("published within 1 s");
        let (_, snapshot) = cell.load();
        let default = snapshot.iter().next().unwrap();
        assert_eq!(default.name, "default");
        assert!(default.admin);
        assert!(default.region_grant(0).unwrap().allows(Permissions::ALL, 0, 65536));
        assert_eq!(default.key, netdam_auth::KeyFile::load(&key_file).unwrap().key);
        let (loaded, _) = load_snapshot(dir.path(), &regions, &namespaces).unwrap();
        assert_eq!(loaded.iter().count(), 1);
    }

    #[test]
    fn grants_that_cannot_be_one_are_not_widened() {
        let dir = tempfile::tempdir().unwrap();
        let (regions, namespaces) = spaces(dir.path());
        let record = |grants: Vec<GrantRecord>| TenantRecord {
            name: "carol".into(),
            id: 1,
            key_version: 1,
            key_hex: "11".repeat(32),
            class: Default::default(),
            limits: Default::default(),
            grants,
        };
        let all_read = GrantRecord { space: GrantSpace::All, permissions: vec!["read".into()], range: None };
        let ranged_write = GrantRecord { range: Some((0, 4096)), ..grant(&["write"]) };
        // Written past the store (which refuses this pair): the first grant is kept, warned.
        let (snapshot, warnings) =
            TenantSnapshot::resolve(&[record(vec![all_read.clone(), ranged_write])], &regions, &namespaces);
        let held = snapshot.tenant(1).unwrap().region_grant(0).unwrap();
        assert!(held.allows(Permissions::READ, 0, 65536));
        assert!(!held.allows(Permissions::WRITE, 8192, 1), "write must not spread past its range");
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        // A ranged grant within a wider one that covers it is simply the wider one.
        let ranged_read = GrantRecord { range: Some((0, 4096)), ..grant(&["read"]) };
        let (snapshot, warnings) =
            TenantSnapshot::resolve(&[record(vec![all_read, ranged_read])], &regions, &namespaces);
        assert!(warnings.is_empty(), "{warnings:?}");
        assert!(snapshot.tenant(1).unwrap().region_grant(0).unwrap().allows(Permissions::READ, 0, 65536));
    }

    /// Key slots the store's keys can no longer be compared with (a slot's record unreadable)
    /// may be deleted ones: no tenant uses any until the keys can be read again, while the
    /// tenants' other changes still apply; once readable, the grants on slots come back.
    #[test]
    fn unreadable_keys_stop_key_slot_grants_until_they_can_be_read_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let (regions, namespaces) = spaces(dir.path());
        store_alice_with_read_write(dir.path());
        let store = MetadataStore::open(dir.path()).unwrap();
        store.create_crypto_key(1, &crate::metadata::KeyMaterial([9; 32])).unwrap();
        let on_slot = GrantRecord { space: GrantSpace::KeySlot(1), permissions: vec!["encrypt".into()], range: None };
        store.grant("alice", &on_slot, &known()).unwrap();
        drop(store);
        let keys =
            Arc::new(KeyRing::load(MetadataStore::load_crypto_keys(dir.path()).unwrap(), dir.path(), 64).unwrap());
        let cell = Arc::new(TenantCell::default());
        let _handle = watch(dir.path(), Watched { regions, namespaces, keys }, cell.clone()).unwrap();
        let (generation, snapshot) = cell.load();
        let alice = snapshot.iter().next().expect("alice is published at start").id;
        assert!(snapshot.tenant(alice).unwrap().key_slots.allows(1, false), "alice seals with slot 1");

        // Another slot's record damaged (a length no key entry has): the keys cannot be read.
        // The table is opened by its name and types, as the store defines it.
        let table: redb::TableDefinition<u32, &[u8]> = redb::TableDefinition::new("crypto_keys");
        let damage = |bytes: Option<&[u8]>| {
            // The watcher opens the store for its reads (five a second just after a change): wait
            // for it, as the admin commands do.
            let path = dir.path().join(METADATA_FILE);
            let db = crate::metadata::wait_while_busy(&path, || redb::Database::open(&path)).unwrap();
            let write = db.begin_write().unwrap();
            {
                let mut opened = write.open_table(table).unwrap();
                match bytes {
                    Some(bytes) => drop(opened.insert(2, bytes).unwrap()),
                    None => drop(opened.remove(2).unwrap()),
                }
            }
            write.commit().unwrap();
        };
        damage(Some(&[1, 2, 3, 4, 5]));
        wait_for_generation(&cell, generation, Duration::from_secs(2)).expect("published within 2 s");
        let (generation, snapshot) = cell.load();
        let held = snapshot.tenant(alice).unwrap();
        assert!(!held.key_slots.allows(1, false), "no key slot is used while the keys cannot be compared");
        assert!(held.region_grant(0).unwrap().allows(Permissions::WRITE, 0, 1), "the region grant stays");

        // A revoke still applies meanwhile.
        let store = MetadataStore::open(dir.path()).unwrap();
        store.revoke("alice", &GrantSpace::Region("scratch".into()), Some(&["write".into()])).unwrap();
        drop(store);
        wait_for_generation(&cell, generation, Duration::from_secs(2)).expect("the revoke is published");
        let (generation, snapshot) = cell.load();
        let held = snapshot.tenant(alice).unwrap();
        assert!(!held.region_grant(0).unwrap().allows(Permissions::WRITE, 0, 1), "the revoke applied");
        assert!(!held.key_slots.allows(1, false), "still no key slot");

        // Readable again: slot 1's grant is back (its key never changed).
        damage(None);
        wait_for_generation(&cell, generation, Duration::from_secs(2)).expect("published once readable");
        assert!(cell.load().1.tenant(alice).unwrap().key_slots.allows(1, false), "slot 1 serves alice again");
    }
}
