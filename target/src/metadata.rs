//! The metadata store: regions and namespaces created by `netdam-target region|namespace
//! create`, and tenants with their keys and grants (`netdam-target tenant …`, `grant`,
//! `revoke`), kept in an embedded ACID database (redb) in the data directory. Every change is
//! committed durably (fsync'd) before the command returns.
//!
//! The target reads regions and namespaces once at start-up and closes the store (the daemon
//! then writes which files its configured spaces were served from, when that changed), so admin
//! commands can change it while a target runs; they tell the user to restart the target to
//! serve a new space. Tenants are re-read by a running target whenever the file changes
//! ([`crate::tenant_watch`]), each time opening the store only for the read. redb holds an
//! exclusive file lock while a store is open for writing, so either side waits briefly
//! ([`STORE_BUSY_WAIT`]) for the other to close it. Entries are stored as JSON of the same structs
//! the TOML file uses, so both describe a space alike.

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use netdam_auth::TenantKey;
use netdam_isa::crypto::KEY_LEN;
use redb::{
    Database, DatabaseError, ReadOnlyDatabase, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition,
    TableError,
};

use crate::config::{Config, NamespaceConfig, RegionConfig};
use crate::tenants::{
    GrantRecord, GrantSpace, QosClass, TenantLimits, TenantRecord, KEY_PERMISSION_NAMES, MAX_GRANTS_PER_TENANT,
    MAX_TENANTS,
};

const REGIONS: TableDefinition<&str, &str> = TableDefinition::new("regions");
const NAMESPACES: TableDefinition<&str, &str> = TableDefinition::new("namespaces");
/// Where each region and namespace stands in its list, by name: a space's id is its place in
/// the list, so a create must not move the spaces already there (an initiator holding id 1
/// would reach another namespace after a restart). Each create gets the next number; spaces of a
/// store written before this table existed have none and count as 0, in name order, where their
/// ids always were.
const REGION_ORDER: TableDefinition<&str, u64> = TableDefinition::new("region_order");
const NAMESPACE_ORDER: TableDefinition<&str, u64> = TableDefinition::new("namespace_order");

/// A kind of space in the store: its entries and their order.
#[derive(Clone, Copy)]
struct SpaceTables {
    entries: TableDefinition<'static, &'static str, &'static str>,
    order: TableDefinition<'static, &'static str, u64>,
    kind: &'static str,
}

const REGION_TABLES: SpaceTables = SpaceTables { entries: REGIONS, order: REGION_ORDER, kind: "region" };
const NAMESPACE_TABLES: SpaceTables = SpaceTables { entries: NAMESPACES, order: NAMESPACE_ORDER, kind: "namespace" };
const TENANTS: TableDefinition<&str, &str> = TableDefinition::new("tenants");
/// Facts about the store as a whole, by name.
const STORE_FACTS: TableDefinition<&str, &str> = TableDefinition::new("store_facts");
/// In [`STORE_FACTS`] once `tenant delete` removed the last tenant (its value names that
/// tenant): the store was emptied on purpose, so a target does not create the default tenant.
const TENANTS_EMPTIED: &str = "tenants_emptied";
/// Files of configured spaces (the settings file's regions and namespaces, the embedded
/// default region) that a start has served, by absolute path: a later start that finds one gone
/// does not make it again empty (`configured_files`). The settings file cannot
/// say whether a start came before; this table can.
const CONFIGURED_FILES: TableDefinition<&str, &str> = TableDefinition::new("configured_files");
/// The highest key version a deleted tenant's id was used with, by id: a tenant created later
/// with that id starts one above it, so no (id, key version) pair ever names two tenants. A
/// session is bound to the pair it proved; with ids reused from version 1, a deleted tenant's
/// session that sent nothing until another tenant took its id carried on under that tenant's
/// grants.
const RETIRED_TENANT_VERSIONS: TableDefinition<u32, u32> = TableDefinition::new("retired_tenant_versions");
/// Key slots of ENCRYPT and DECRYPT: slot number to its key versions, each 4 bytes of version
/// (little-endian) then 32 bytes of AES-256 key, in increasing version order.
const CRYPTO_KEYS: TableDefinition<u32, &[u8]> = TableDefinition::new("crypto_keys");
/// Bytes of one stored key version.
const KEY_ENTRY_LEN: usize = 4 + KEY_LEN;

/// How long, in all, opening the store waits for another process (an admin command, or a
/// target reading its tenants) to close it before giving up. Either holds it for milliseconds.
pub const STORE_BUSY_WAIT: Duration = Duration::from_secs(5);

/// Longest pause between two attempts to open a busy store.
const STORE_BUSY_PAUSE_MAX: Duration = Duration::from_millis(50);

/// Permission names a grant may hold, in the order they are stored and shown. `all` stands for
/// every one of them that the grant's space takes ([`space_permissions`]): `encrypt` and
/// `decrypt` are a key slot's, `admin` the whole target's.
pub const PERMISSION_NAMES: [&str; 8] = ["read", "write", "atomic", "compute", "block", "encrypt", "decrypt", "admin"];

/// Longest tenant name: a tenant's name is also its key file's name.
pub const MAX_TENANT_NAME_BYTES: usize = 64;

/// File name of the store in the data directory.
pub const METADATA_FILE: &str = "metadata.redb";

/// Why the store could not be read or changed.
#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    /// The database failed.
    #[error("metadata store {path}: {message}")]
    Store { path: PathBuf, message: String },
    /// A name is already taken.
    #[error("a {kind} named {name:?} already exists{where_}")]
    Exists { kind: &'static str, name: String, where_: &'static str },
    /// No entry has this name.
    #[error("no {kind} named {name:?} in the metadata store {path}")]
    Missing { kind: &'static str, name: String, path: PathBuf },
    /// A change the store refuses: a bad name, permission or range, a bound reached.
    #[error("{0}")]
    Refused(String),
}

/// The spaces a grant may name besides those in the store: the settings file's, with their
/// sizes in bytes where known (a block device's size is not known before it is opened).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KnownSpaces {
    /// Region names and sizes.
    pub regions: Vec<(String, Option<u64>)>,
    /// Namespace names and sizes.
    pub namespaces: Vec<(String, Option<u64>)>,
    /// The settings file they come from; `None`: the built-in settings (no `--config`), which
    /// a refusal says, pointing to `--config`.
    pub settings_file: Option<PathBuf>,
}

impl KnownSpaces {
    /// The regions and namespaces `config` serves (its embedded default region when it names
    /// none), `config` having been read from `settings_file` if any.
    pub fn from_config(config: &Config, settings_file: Option<&Path>) -> KnownSpaces {
        KnownSpaces {
            regions: config.effective_regions().into_iter().map(|region| (region.name, Some(region.size.0))).collect(),
            namespaces: config.namespaces.iter().map(namespace_entry).collect(),
            settings_file: settings_file.map(Path::to_path_buf),
        }
    }

    fn size_of(&self, space: &GrantSpace) -> Option<Option<u64>> {
        let (list, name) = match space {
            GrantSpace::Region(name) => (&self.regions, name),
            GrantSpace::Namespace(name) => (&self.namespaces, name),
            GrantSpace::All => return Some(None),
            GrantSpace::KeySlot(_) => return None,
        };
        list.iter().find(|(known, _)| known == name).map(|(_, size)| *size)
    }
}

fn namespace_entry(namespace: &NamespaceConfig) -> (String, Option<u64>) {
    (namespace.name.clone(), namespace.size.map(|size| size.0))
}

/// Settings of a tenant to create or change; `None` leaves a setting as it is (or at its
/// default, for a new tenant).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantSettings {
    /// Overload class.
    pub class: Option<QosClass>,
    /// Sessions at once.
    pub max_sessions: Option<u32>,
    /// Block datagrams in flight at once.
    pub max_in_flight: Option<u32>,
    /// Token bucket refill, cost units per second; 0 is unlimited.
    pub cost_per_second: Option<u64>,
    /// Token bucket depth, cost units. Once given it stays as given; until then it is one
    /// second of the rate, and follows each new rate.
    pub burst: Option<u64>,
}

impl TenantSettings {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        *self == TenantSettings::default()
    }

    fn apply(&self, class: &mut QosClass, limits: &mut TenantLimits) -> Result<(), MetadataError> {
        if let Some(new) = self.class {
            *class = new;
        }
        if let Some(max_sessions) = self.max_sessions {
            if max_sessions == 0 {
                return Err(MetadataError::Refused("--max-sessions 0 would lock the tenant out: use 1 or more".into()));
            }
            limits.max_sessions = max_sessions;
        }
        if let Some(max_in_flight) = self.max_in_flight {
            if max_in_flight == 0 {
                return Err(MetadataError::Refused(
                    "--max-in-flight 0 would lock the tenant out: use 1 or more".into(),
                ));
            }
            limits.max_in_flight = max_in_flight;
        }
        if let Some(cost_per_second) = self.cost_per_second {
            // A depth never given is one second of the rate, and stays so. A record stored
            // before `burst_explicit` existed reads as not given; a depth other than one second
            // of its rate can only have been given, so it is kept.
            let follows_rate = !limits.burst_explicit && limits.burst == limits.cost_per_second;
            limits.cost_per_second = cost_per_second;
            if follows_rate {
                limits.burst = cost_per_second;
            }
        }
        if let Some(burst) = self.burst {
            limits.burst = burst;
            limits.burst_explicit = true;
        }
        if limits.cost_per_second > 0 && limits.burst == 0 {
            return Err(MetadataError::Refused(format!(
                "--burst 0 with --cost-per-second {}: the tenant could never spend; give a burst of at least one operation's cost",
                limits.cost_per_second
            )));
        }
        Ok(())
    }
}

/// Regions and namespaces kept in the store.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stored {
    /// Regions, by name.
    pub regions: Vec<RegionConfig>,
    /// Namespaces, by name.
    pub namespaces: Vec<NamespaceConfig>,
    /// Files of configured spaces that a start has served ([`MetadataStore::record_configured_files`]).
    pub configured_files: Vec<ConfiguredFile>,
}

/// The file of a configured space that a start served.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ConfiguredFile {
    /// Its absolute path.
    pub path: PathBuf,
    /// `region` or `namespace`.
    pub kind: String,
    /// The space's name then.
    pub name: String,
    /// Its size in bytes then.
    pub size_bytes: u64,
    /// A namespace's block size then (`None` for a region, and in records older than it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_bytes: Option<u32>,
}

/// An AES-256 key as stored: printed by no `Debug`, sent by no instruction or command.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyMaterial(pub [u8; KEY_LEN]);

impl KeyMaterial {
    /// The key bytes.
    pub fn bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }
}

impl std::fmt::Debug for KeyMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyMaterial(..)")
    }
}

/// A key slot and its key versions, oldest first.
pub type StoredKeySlot = (u32, Vec<(u32, KeyMaterial)>);

/// A key slot with a digest of each version's key instead of the key.
pub type StoredKeyDigests = (u32, Vec<(u32, [u8; 32])>);

/// An open store; holds the database's file lock while it lives.
pub struct MetadataStore {
    db: Database,
    path: PathBuf,
}

impl std::fmt::Debug for MetadataStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetadataStore").field("path", &self.path).finish_non_exhaustive()
    }
}

impl MetadataStore {
    /// Opens (creating where missing) the store in `data_dir`, waiting up to
    /// [`STORE_BUSY_WAIT`] while another process has it open.
    pub fn open(data_dir: &Path) -> Result<MetadataStore, MetadataError> {
        let path = data_dir.join(METADATA_FILE);
        check_not_lost(data_dir, &path)?;
        // An empty file made here, which redb then makes a store of: a store this open began
        // and could not finish (no space for its first pages) holds nothing, and would be
        // refused as damaged by every later open, so it is removed again; one another process
        // made (or holds: busy) is never removed.
        let made_here = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path).is_ok();
        let db = guarded(&path, || {
            wait_while_busy(&path, || {
                Database::create(&path).inspect_err(|error| {
                    if made_here && !matches!(error, DatabaseError::DatabaseAlreadyOpen) {
                        let _ = std::fs::remove_file(&path);
                    }
                })
            })
        })?;
        // It holds tenants' keys: owner-only, like a key file.
        let mode = std::fs::metadata(&path).map_err(|error| store_error(&path, error))?.permissions().mode();
        if mode & 0o077 != 0 {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode & 0o700))
                .map_err(|error| store_error(&path, error))?;
        }
        Ok(MetadataStore { db, path })
    }

    /// Reads what `data_dir`'s store holds, read-only (as [`read_tenants`] does); an absent
    /// store holds nothing.
    pub fn load(data_dir: &Path) -> Result<Stored, MetadataError> {
        let path = data_dir.join(METADATA_FILE);
        guarded(&path, || match open_to_read(&path)? {
            Some(store) => Ok(Stored {
                regions: store.list_spaces(&path, REGION_TABLES)?,
                namespaces: store.list_spaces(&path, NAMESPACE_TABLES)?,
                configured_files: store.list(&path, CONFIGURED_FILES)?,
            }),
            None => Ok(Stored::default()),
        })
    }

    /// Where the store lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stored regions, in the order they were created (their ids follow it).
    pub fn regions(&self) -> Result<Vec<RegionConfig>, MetadataError> {
        list_spaces(&self.db, &self.path, REGION_TABLES)
    }

    /// Stored namespaces, in the order they were created (their ids follow it).
    pub fn namespaces(&self) -> Result<Vec<NamespaceConfig>, MetadataError> {
        list_spaces(&self.db, &self.path, NAMESPACE_TABLES)
    }

    /// Adds a region after the others, durably; refuses a name already stored.
    pub fn create_region(&self, region: &RegionConfig) -> Result<(), MetadataError> {
        self.insert_space(REGION_TABLES, &region.name, region)
    }

    /// Adds a namespace after the others, durably; refuses a name already stored.
    pub fn create_namespace(&self, namespace: &NamespaceConfig) -> Result<(), MetadataError> {
        self.insert_space(NAMESPACE_TABLES, &namespace.name, namespace)
    }

    /// Removes a region and every tenant's grant on it, durably; returns what it was and the
    /// tenants whose grant went with it.
    pub fn delete_region(&self, name: &str) -> Result<(RegionConfig, Vec<String>), MetadataError> {
        self.remove_space(REGION_TABLES, name, GrantSpace::Region(name.to_string()))
    }

    /// Removes a namespace and every tenant's grant on it, durably; returns what it was and
    /// the tenants whose grant went with it.
    pub fn delete_namespace(&self, name: &str) -> Result<(NamespaceConfig, Vec<String>), MetadataError> {
        self.remove_space(NAMESPACE_TABLES, name, GrantSpace::Namespace(name.to_string()))
    }

    fn list<T: serde::de::DeserializeOwned>(
        &self,
        table: TableDefinition<&str, &str>,
    ) -> Result<Vec<T>, MetadataError> {
        list_table(&self.db, &self.path, table)
    }

    /// Records, durably, that a start served the configured spaces from `files`, in place of
    /// what was recorded before.
    pub fn record_configured_files(&self, files: &[ConfiguredFile]) -> Result<(), MetadataError> {
        let fail = |error: redb::Error| store_error(&self.path, error);
        let write = self.db.begin_write().map_err(|error| fail(error.into()))?;
        {
            write.delete_table(CONFIGURED_FILES).map_err(|error| fail(error.into()))?;
            let mut table = write.open_table(CONFIGURED_FILES).map_err(|error| fail(error.into()))?;
            for file in files {
                // JSON holds text: a path that is not UTF-8 cannot be recorded (nor keyed alike).
                let (Some(key), Ok(json)) = (file.path.to_str(), serde_json::to_string(file)) else {
                    return Err(MetadataError::Refused(format!(
                        "{} {:?}: its file's path {} is not UTF-8 text, which the store keeps paths as",
                        file.kind,
                        file.name,
                        file.path.display()
                    )));
                };
                table.insert(key, json.as_str()).map_err(|error| fail(error.into()))?;
            }
        }
        write.commit().map_err(|error| fail(error.into()))
    }

    fn insert_space<T: serde::Serialize>(
        &self,
        tables: SpaceTables,
        name: &str,
        value: &T,
    ) -> Result<(), MetadataError> {
        let fail = |error: redb::Error| store_error(&self.path, error);
        let json = serde_json::to_string(value).expect("settings always serialize");
        let write = self.db.begin_write().map_err(|error| fail(error.into()))?;
        {
            let mut entries = write.open_table(tables.entries).map_err(|error| fail(error.into()))?;
            if entries.get(name).map_err(|error| fail(error.into()))?.is_some() {
                let kind = tables.kind;
                return Err(MetadataError::Exists { kind, name: name.to_string(), where_: " in the metadata store" });
            }
            entries.insert(name, json.as_str()).map_err(|error| fail(error.into()))?;
            // After every space there (a few dozen at most: one pass is cheap).
            let mut order = write.open_table(tables.order).map_err(|error| fail(error.into()))?;
            let mut last = 0;
            for entry in order.iter().map_err(|error| fail(error.into()))? {
                last = last.max(entry.map_err(|error| fail(error.into()))?.1.value());
            }
            order.insert(name, last + 1).map_err(|error| fail(error.into()))?;
        }
        // redb's default durability fsyncs the commit before returning.
        write.commit().map_err(|error| fail(error.into()))
    }

    /// Removes space `name` and, in the same commit, every tenant's grant on it (`space`): a
    /// grant names a space, and one left behind would give its tenant a space created later
    /// under the same name.
    fn remove_space<T: serde::de::DeserializeOwned>(
        &self,
        tables: SpaceTables,
        name: &str,
        space: GrantSpace,
    ) -> Result<(T, Vec<String>), MetadataError> {
        let fail = |error: redb::Error| store_error(&self.path, error);
        let write = self.db.begin_write().map_err(|error| fail(error.into()))?;
        let removed = {
            let mut entries = write.open_table(tables.entries).map_err(|error| fail(error.into()))?;
            let removed = entries.remove(name).map_err(|error| fail(error.into()))?;
            let mut order = write.open_table(tables.order).map_err(|error| fail(error.into()))?;
            order.remove(name).map_err(|error| fail(error.into()))?;
            removed.map(|json| json.value().to_string())
        };
        let Some(json) = removed else {
            let kind = tables.kind;
            return Err(MetadataError::Missing { kind, name: name.to_string(), path: self.path.clone() });
        };
        let ungranted = self.drop_grants(&write, &space)?;
        write.commit().map_err(|error| fail(error.into()))?;
        let removed = serde_json::from_str(&json)
            .map_err(|error| MetadataError::Store { path: self.path.clone(), message: error.to_string() })?;
        Ok((removed, ungranted))
    }

    /// Removes every tenant's grant on `space` within `write`; returns the tenants that held one.
    fn drop_grants(&self, write: &redb::WriteTransaction, space: &GrantSpace) -> Result<Vec<String>, MetadataError> {
        let fail = |error: redb::Error| store_error(&self.path, error);
        let mut tenants = write.open_table(TENANTS).map_err(|error| fail(error.into()))?;
        let mut changed = Vec::new();
        for entry in tenants.iter().map_err(|error| fail(error.into()))? {
            let (stored_name, json) = entry.map_err(|error| fail(error.into()))?;
            let mut record = self.decode(stored_name.value(), json.value())?;
            let held = record.grants.len();
            record.grants.retain(|grant| grant.space != *space);
            if record.grants.len() != held {
                changed.push(record);
            }
        }
        let mut ungranted = Vec::new();
        for record in changed {
            tenants.insert(record.name.as_str(), encode(&record).as_str()).map_err(|error| fail(error.into()))?;
            ungranted.push(record.name);
        }
        Ok(ungranted)
    }
}

/// Tenants: every change reads the record, changes it, checks it and commits it in one write
/// transaction, so two admin commands never lose each other's change.
/// Key slots of ENCRYPT and DECRYPT.
impl MetadataStore {
    /// Stores version 1 of key slot `slot`, durably; refuses a slot that holds a key.
    pub fn create_crypto_key(&self, slot: u32, key: &KeyMaterial) -> Result<u32, MetadataError> {
        self.change_crypto_key(slot, |versions| {
            if !versions.is_empty() {
                return Err(MetadataError::Exists {
                    kind: "key slot",
                    name: slot.to_string(),
                    where_: " (rotate it, or delete it first)",
                });
            }
            self.start_nonce_reservation(slot)?;
            versions.push((1, key.clone()));
            Ok(1)
        })
        .map(|(version, _)| version)
    }

    /// Adds the next version of key slot `slot`, durably; the older versions stay, so what they
    /// sealed still opens. Returns the new version.
    pub fn rotate_crypto_key(&self, slot: u32, key: &KeyMaterial) -> Result<u32, MetadataError> {
        let path = self.path.clone();
        self.change_crypto_key(slot, |versions| {
            let Some((last, _)) = versions.last() else {
                return Err(MetadataError::Missing { kind: "key slot", name: slot.to_string(), path });
            };
            let version = last.checked_add(1).ok_or_else(|| MetadataError::Store {
                path: path.clone(),
                message: format!("key slot {slot} has used every version number"),
            })?;
            // A slot whose file was lost gets one again here: the new key has used no nonce.
            self.start_nonce_reservation(slot)?;
            versions.push((version, key.clone()));
            Ok(version)
        })
        .map(|(version, _)| version)
    }

    /// Removes key slot `slot` and every version of its key, and in the same commit every
    /// tenant's grant on the slot (one left behind would give its tenant a key created later in
    /// the slot), durably; returns the versions and the tenants whose grant went.
    pub fn delete_crypto_key(&self, slot: u32) -> Result<(Vec<u32>, Vec<String>), MetadataError> {
        let path = self.path.clone();
        self.change_crypto_key(slot, |versions| {
            if versions.is_empty() {
                return Err(MetadataError::Missing { kind: "key slot", name: slot.to_string(), path });
            }
            Ok(std::mem::take(versions).into_iter().map(|(version, _)| version).collect())
        })
    }

    /// Makes key slot `slot`'s nonce reservation file beside the store if it is missing
    /// (`crypto::start_reservation`), before a new key of the slot is committed.
    fn start_nonce_reservation(&self, slot: u32) -> Result<(), MetadataError> {
        let data_dir = self.path.parent().unwrap_or(Path::new("."));
        crate::crypto::start_reservation(data_dir, slot).map_err(|error| MetadataError::Refused(error.to_string()))
    }

    /// Every key slot with its key versions: what a target loads at start.
    pub fn crypto_keys(&self) -> Result<Vec<StoredKeySlot>, MetadataError> {
        crypto_key_table(&self.db, &self.path)
    }

    /// Reads `data_dir`'s key slots; an absent store holds none.
    pub fn load_crypto_keys(data_dir: &Path) -> Result<Vec<StoredKeySlot>, MetadataError> {
        let path = data_dir.join(METADATA_FILE);
        if !path.exists() {
            return Ok(Vec::new());
        }
        guarded(&path, || MetadataStore::open(data_dir)?.crypto_keys())
    }

    /// `data_dir`'s key slots with each key version's digest ([`crate::crypto::key_digest`]),
    /// read as [`MetadataStore::read_crypto_key_slots`] reads: what a running target compares
    /// with the keys it loaded, to stop serving a slot deleted or replaced since.
    pub fn read_crypto_key_digests(data_dir: &Path) -> Result<Vec<StoredKeyDigests>, MetadataError> {
        Ok(read_crypto_keys(data_dir)?
            .into_iter()
            .map(|(slot, versions)| {
                (slot, versions.iter().map(|(version, key)| (*version, crate::crypto::key_digest(key))).collect())
            })
            .collect())
    }

    /// `data_dir`'s key slots with the versions of their keys (never the keys), read as
    /// [`read_tenants`] reads: read-only, so that listing works on a read-only data directory.
    pub fn read_crypto_key_slots(data_dir: &Path) -> Result<Vec<(u32, Vec<u32>)>, MetadataError> {
        Ok(key_versions_only(read_crypto_keys(data_dir)?))
    }

    /// Reads slot `slot`'s versions, lets `change` edit them, and commits the result durably
    /// unless `change` refuses. An empty list removes the slot and every tenant's grant on it,
    /// whose names come back beside `change`'s result.
    fn change_crypto_key<T>(
        &self,
        slot: u32,
        change: impl FnOnce(&mut Vec<(u32, KeyMaterial)>) -> Result<T, MetadataError>,
    ) -> Result<(T, Vec<String>), MetadataError> {
        let fail = |error: redb::Error| store_error(&self.path, error);
        let write = self.db.begin_write().map_err(|error| fail(error.into()))?;
        let mut ungranted = Vec::new();
        let result = {
            let mut table = write.open_table(CRYPTO_KEYS).map_err(|error| fail(error.into()))?;
            let stored = table.get(slot).map_err(|error| fail(error.into()))?.map(|bytes| bytes.value().to_vec());
            let mut versions = match stored {
                Some(bytes) => decode_key_versions(&self.path, slot, &bytes)?,
                None => Vec::new(),
            };
            let result = change(&mut versions)?;
            if versions.is_empty() {
                table.remove(slot).map_err(|error| fail(error.into()))?;
                drop(table);
                ungranted = self.drop_grants(&write, &GrantSpace::KeySlot(slot))?;
            } else {
                let mut bytes = Vec::with_capacity(versions.len() * KEY_ENTRY_LEN);
                for (version, key) in &versions {
                    bytes.extend_from_slice(&version.to_le_bytes());
                    bytes.extend_from_slice(key.bytes());
                }
                table.insert(slot, bytes.as_slice()).map_err(|error| fail(error.into()))?;
            }
            result
        };
        // `open` keeps the store owner-only: it holds keys.
        // redb's default durability fsyncs the commit before returning.
        write.commit().map_err(|error| fail(error.into()))?;
        Ok((result, ungranted))
    }
}

impl MetadataStore {
    /// Stored tenants, by id.
    pub fn tenants(&self) -> Result<Vec<TenantRecord>, MetadataError> {
        let mut tenants: Vec<TenantRecord> = self.list(TENANTS)?;
        tenants.sort_by_key(|tenant| tenant.id);
        Ok(tenants)
    }

    /// The tenant called `name`.
    pub fn tenant(&self, name: &str) -> Result<TenantRecord, MetadataError> {
        self.tenants()?.into_iter().find(|tenant| tenant.name == name).ok_or_else(|| self.missing_tenant(name))
    }

    /// Adds a tenant holding `key` with `settings` over the defaults and no grant, numbered with
    /// the lowest id free in 1..=[`MAX_TENANTS`], its key version 1, or one above the last
    /// version a deleted tenant used with that id ([`RETIRED_TENANT_VERSIONS`]); durably. Refuses a name
    /// already stored, a key another tenant holds, and a full store.
    pub fn create_tenant(
        &self,
        name: &str,
        key: &TenantKey,
        settings: &TenantSettings,
    ) -> Result<TenantRecord, MetadataError> {
        self.create_tenant_with(name, key, settings, &[], |_| Ok(()))
    }

    /// Like [`MetadataStore::create_tenant`], the tenant holding `grants` (each checked as
    /// [`normalize_permissions`] does, on distinct spaces), and running `before_commit` on the
    /// new record before the commit: the key file is staged there (written beside its place,
    /// installed once the commit succeeded: `tenant_admin`), so a key file that cannot be
    /// written leaves the store as it was, and a failed commit leaves no key file.
    pub fn create_tenant_with(
        &self,
        name: &str,
        key: &TenantKey,
        settings: &TenantSettings,
        grants: &[GrantRecord],
        before_commit: impl FnOnce(&TenantRecord) -> Result<(), String>,
    ) -> Result<TenantRecord, MetadataError> {
        check_tenant_name(name)?;
        let mut normalized = Vec::with_capacity(grants.len());
        for grant in grants {
            let permissions = space_permissions(name, &grant.space, &grant.permissions)?;
            normalized.push(GrantRecord { permissions, ..grant.clone() });
        }
        let mut class = QosClass::default();
        let mut limits = TenantLimits::default();
        settings.apply(&mut class, &mut limits)?;
        let fail = |error: redb::Error| store_error(&self.path, error);
        let write = self.db.begin_write().map_err(|error| fail(error.into()))?;
        let record = {
            let mut table = write.open_table(TENANTS).map_err(|error| fail(error.into()))?;
            let mut taken = Vec::new();
            for entry in table.iter().map_err(|error| fail(error.into()))? {
                let (stored_name, json) = entry.map_err(|error| fail(error.into()))?;
                let other = self.decode(stored_name.value(), json.value())?;
                if other.name == name {
                    return Err(MetadataError::Exists {
                        kind: "tenant",
                        name: name.to_string(),
                        where_: " in the metadata store",
                    });
                }
                if TenantKey::from_hex(&other.key_hex).is_ok_and(|other_key| other_key == *key) {
                    return Err(MetadataError::Refused(format!(
                        "tenant {:?} holds this key already: each tenant needs its own key",
                        other.name
                    )));
                }
                taken.push(other.id);
            }
            let Some(id) = (1..=MAX_TENANTS).find(|id| !taken.contains(id)) else {
                return Err(MetadataError::Refused(format!(
                    "the store holds {MAX_TENANTS} tenants, the most it may: delete one first"
                )));
            };
            let retired = write.open_table(RETIRED_TENANT_VERSIONS).map_err(|error| fail(error.into()))?;
            let retired = retired.get(id).map_err(|error| fail(error.into()))?.map_or(0, |version| version.value());
            let key_version = retired.checked_add(1).ok_or_else(|| {
                MetadataError::Refused(format!("tenant id {id} has used every key version: delete another tenant"))
            })?;
            let record = TenantRecord {
                name: name.to_string(),
                id,
                key_version,
                key_hex: key.to_hex(),
                class,
                limits,
                grants: normalized,
            };
            check_record(&record).map_err(MetadataError::Refused)?;
            table.insert(name, encode(&record).as_str()).map_err(|error| fail(error.into()))?;
            before_commit(&record).map_err(MetadataError::Refused)?;
            record
        };
        // redb's default durability fsyncs the commit before returning.
        write.commit().map_err(|error| fail(error.into()))?;
        Ok(record)
    }

    /// Removes a tenant, durably, and returns what it was. Removing the last one also notes, in
    /// the same commit, that the store's tenants were emptied on purpose
    /// ([`MetadataStore::tenants_emptied`]).
    pub fn delete_tenant(&self, name: &str) -> Result<TenantRecord, MetadataError> {
        let fail = |error: redb::Error| store_error(&self.path, error);
        let write = self.db.begin_write().map_err(|error| fail(error.into()))?;
        let record = {
            let mut table = write.open_table(TENANTS).map_err(|error| fail(error.into()))?;
            let removed = table.remove(name).map_err(|error| fail(error.into()))?.map(|json| json.value().to_string());
            let Some(json) = removed else {
                return Err(self.missing_tenant(name));
            };
            let record = self.decode(name, &json)?;
            let mut retired = write.open_table(RETIRED_TENANT_VERSIONS).map_err(|error| fail(error.into()))?;
            let before =
                retired.get(record.id).map_err(|error| fail(error.into()))?.map_or(0, |version| version.value());
            retired.insert(record.id, before.max(record.key_version)).map_err(|error| fail(error.into()))?;
            if table.is_empty().map_err(|error| fail(error.into()))? {
                let mut facts = write.open_table(STORE_FACTS).map_err(|error| fail(error.into()))?;
                facts.insert(TENANTS_EMPTIED, name).map_err(|error| fail(error.into()))?;
            }
            record
        };
        write.commit().map_err(|error| fail(error.into()))?;
        Ok(record)
    }

    /// Whether `tenant delete` ever removed the last tenant of this store. A target that finds
    /// no tenant creates the default one (every permission) only in a store where this is
    /// false, so that a store an administrator emptied stays closed across a restart.
    pub fn tenants_emptied(&self) -> Result<bool, MetadataError> {
        let fail = |error: redb::Error| store_error(&self.path, error);
        let read = self.db.begin_read().map_err(|error| fail(error.into()))?;
        let Some(facts) = open_if_present(&read, &self.path, STORE_FACTS)? else { return Ok(false) };
        Ok(facts.get(TENANTS_EMPTIED).map_err(|error| fail(error.into()))?.is_some())
    }

    /// Gives a tenant a new random key (its version one more), durably; returns the record and
    /// the key.
    pub fn rotate_key(&self, name: &str) -> Result<(TenantRecord, TenantKey), MetadataError> {
        self.rotate_key_with(name, |_| Ok(()))
    }

    /// Like [`MetadataStore::rotate_key`], running `before_commit` on the new record before the
    /// commit (where the new key file is staged: if it cannot be written, or the commit fails,
    /// the old key and its file stay in force).
    pub fn rotate_key_with(
        &self,
        name: &str,
        before_commit: impl FnOnce(&TenantRecord) -> Result<(), String>,
    ) -> Result<(TenantRecord, TenantKey), MetadataError> {
        let key = TenantKey::generate()
            .map_err(|error| MetadataError::Refused(format!("cannot draw a new key for {name:?}: {error}")))?;
        let record = self.update_tenant(name, |record| {
            record.key_version = record.key_version.checked_add(1).ok_or_else(|| {
                MetadataError::Refused(format!("tenant {name:?}: the key version cannot grow past {}", u32::MAX))
            })?;
            record.key_hex = key.to_hex();
            before_commit(record).map_err(MetadataError::Refused)
        })?;
        Ok((record, key))
    }

    /// Changes a tenant's class and limits, durably.
    pub fn set_tenant(&self, name: &str, settings: &TenantSettings) -> Result<TenantRecord, MetadataError> {
        self.update_tenant(name, |record| settings.apply(&mut record.class, &mut record.limits))
    }

    /// Adds `grant` to a tenant, durably. A grant on a space the tenant holds already adds its
    /// permissions to that grant (over the same range: a different range is refused, since one
    /// space holds one range per tenant). Refuses permission names it does not know, a range
    /// that is empty or past the space's end, and a space named neither in the store nor in
    /// `configured` (the settings file's spaces).
    pub fn grant(
        &self,
        tenant: &str,
        grant: &GrantRecord,
        configured: &KnownSpaces,
    ) -> Result<TenantRecord, MetadataError> {
        let permissions = space_permissions(tenant, &grant.space, &grant.permissions)?;
        let size = self.space_size(&grant.space, configured)?;
        if let Some((offset, len)) = grant.range {
            if grant.space == GrantSpace::All {
                return Err(MetadataError::Refused(
                    "a range applies to one region or namespace, not to `all`: grant each space its range".into(),
                ));
            }
            if let GrantSpace::KeySlot(_) = grant.space {
                return Err(MetadataError::Refused(format!(
                    "a range applies to a region or namespace, not to {}: a key slot is granted whole",
                    space_text(&grant.space)
                )));
            }
            let end = offset.checked_add(len).filter(|_| len > 0).ok_or_else(|| {
                MetadataError::Refused(format!("range {offset}:{len}: give a length above 0 that ends below 2^64"))
            })?;
            if let Some(size) = size.filter(|&size| end > size) {
                return Err(MetadataError::Refused(format!(
                    "range {offset}:{len} ends at byte {end}, past the end of {} ({size} bytes)",
                    space_text(&grant.space)
                )));
            }
        }
        self.update_tenant(tenant, |record| {
            let index = record.grants.iter().position(|held| held.space == grant.space);
            let merged = match index {
                Some(index) => {
                    let held = &record.grants[index];
                    if held.range != grant.range {
                        return Err(MetadataError::Refused(format!(
                            "tenant {tenant:?} holds {} over {} already; grant the same range, or revoke it first",
                            space_text(&grant.space),
                            range_text(held.range)
                        )));
                    }
                    // An `admin` that a record of an earlier version holds on one space never
                    // counted: dropped on the way, not refused (the user did not name it now).
                    // On `all` it is the tenant's admin, kept like any permission held.
                    let mut names: Vec<String> = held
                        .permissions
                        .iter()
                        .filter(|name| grant.space == GrantSpace::All || *name != "admin")
                        .cloned()
                        .collect();
                    names.extend(permissions.iter().cloned());
                    space_permissions(tenant, &grant.space, &names)?
                }
                None => permissions.clone(),
            };
            let new = GrantRecord { space: grant.space.clone(), permissions: merged, range: grant.range };
            check_no_widening(tenant, record, &new)?;
            match index {
                Some(index) => record.grants[index] = new,
                None if record.grants.len() >= MAX_GRANTS_PER_TENANT => {
                    return Err(MetadataError::Refused(format!(
                        "tenant {tenant:?} holds {MAX_GRANTS_PER_TENANT} grants, the most it may: revoke one first"
                    )))
                }
                None => record.grants.push(new),
            }
            Ok(())
        })
    }

    /// Takes `permissions` (all of them when `None`) off a tenant's grant on `space`, durably;
    /// a grant left with none is removed.
    pub fn revoke(
        &self,
        tenant: &str,
        space: &GrantSpace,
        permissions: Option<&[String]>,
    ) -> Result<TenantRecord, MetadataError> {
        let taken = permissions.map(normalize_permissions).transpose()?;
        self.update_tenant(tenant, |record| {
            let Some(index) = record.grants.iter().position(|held| &held.space == space) else {
                let held: Vec<String> = record.grants.iter().map(|grant| space_text(&grant.space)).collect();
                return Err(MetadataError::Refused(format!(
                    "tenant {tenant:?} holds no grant on {} (it holds: {})",
                    space_text(space),
                    if held.is_empty() { "nothing".to_string() } else { held.join(", ") }
                )));
            };
            // A permission named but not held is refused, not skipped: a revoke that changes
            // nothing because of a typo'd space or permission would otherwise look done.
            // Naming `all` takes whatever is held.
            let every = permissions.is_some_and(|names| names.iter().any(|name| name == "all"));
            if let Some(taken) = taken.as_ref().filter(|_| !every) {
                let held = &record.grants[index].permissions;
                let missing: Vec<&str> = taken.iter().filter(|name| !held.contains(name)).map(String::as_str).collect();
                if !missing.is_empty() {
                    return Err(MetadataError::Refused(format!(
                        "tenant {tenant:?} holds no {} on {} (it holds {} there): nothing revoked",
                        missing.join(","),
                        space_text(space),
                        held.join(",")
                    )));
                }
            }
            let left: Vec<String> = match &taken {
                None => Vec::new(),
                Some(taken) => {
                    record.grants[index].permissions.iter().filter(|name| !taken.contains(name)).cloned().collect()
                }
            };
            if left.is_empty() {
                record.grants.remove(index);
            } else {
                record.grants[index].permissions = left;
            }
            Ok(())
        })
    }

    /// Reads tenant `name`, applies `change`, checks the result and commits it, in one write
    /// transaction.
    fn update_tenant(
        &self,
        name: &str,
        change: impl FnOnce(&mut TenantRecord) -> Result<(), MetadataError>,
    ) -> Result<TenantRecord, MetadataError> {
        let fail = |error: redb::Error| store_error(&self.path, error);
        let write = self.db.begin_write().map_err(|error| fail(error.into()))?;
        let record = {
            let mut table = write.open_table(TENANTS).map_err(|error| fail(error.into()))?;
            let json = match table.get(name).map_err(|error| fail(error.into()))? {
                Some(json) => json.value().to_string(),
                None => return Err(self.missing_tenant(name)),
            };
            let mut record = self.decode(name, &json)?;
            change(&mut record)?;
            check_record(&record).map_err(MetadataError::Refused)?;
            table.insert(name, encode(&record).as_str()).map_err(|error| fail(error.into()))?;
            record
        };
        write.commit().map_err(|error| fail(error.into()))?;
        Ok(record)
    }

    /// The size of `space` in bytes where known; an error when the space is unknown (a key slot:
    /// one that holds no key, since a grant left on an empty slot would give a key created
    /// there later).
    fn space_size(&self, space: &GrantSpace, configured: &KnownSpaces) -> Result<Option<u64>, MetadataError> {
        if let GrantSpace::KeySlot(slot) = *space {
            let slots = self.crypto_keys()?;
            if slots.iter().any(|(held, _)| *held == slot) {
                return Ok(None);
            }
            let held: Vec<String> = slots.iter().map(|(held, _)| held.to_string()).collect();
            return Err(MetadataError::Refused(format!(
                "key slot {slot} holds no key in the metadata store {} (slots with a key: {}); create one with  \
                 netdam-target crypto-key create {slot}",
                self.path.display(),
                if held.is_empty() { "none".to_string() } else { held.join(", ") }
            )));
        }
        if let Some(size) = configured.size_of(space) {
            return Ok(size);
        }
        let stored = KnownSpaces {
            regions: self.regions()?.into_iter().map(|region| (region.name, Some(region.size.0))).collect(),
            namespaces: self.namespaces()?.iter().map(namespace_entry).collect(),
            settings_file: None,
        };
        stored.size_of(space).ok_or_else(|| {
            let (kind, names) = match space {
                GrantSpace::Region(_) => ("regions", configured.regions.iter().chain(&stored.regions)),
                _ => ("namespaces", configured.namespaces.iter().chain(&stored.namespaces)),
            };
            let names: Vec<&str> = names.map(|(name, _)| name.as_str()).collect();
            let known = if names.is_empty() { "none".to_string() } else { names.join(", ") };
            let (space, store) = (space_text(space), self.path.display());
            MetadataError::Refused(match &configured.settings_file {
                Some(file) => {
                    format!(
                        "no {space} in the metadata store {store} or the settings file {} (known {kind}: {known})",
                        file.display()
                    )
                }
                None => format!(
                    "no {space} in the metadata store {store} nor in the built-in settings (known {kind}: {known}); \
                     if a settings file defines it, pass --config FILE so the command sees it"
                ),
            })
        })
    }

    fn decode(&self, name: &str, json: &str) -> Result<TenantRecord, MetadataError> {
        let record: TenantRecord = serde_json::from_str(json).map_err(|error| MetadataError::Store {
            path: self.path.clone(),
            message: format!("tenant {name:?} is unreadable: {error}"),
        })?;
        // The pair of the assertion in `encode`: what was written is what is read.
        check_record(&record).map_err(|message| MetadataError::Store { path: self.path.clone(), message })?;
        Ok(record)
    }

    fn missing_tenant(&self, name: &str) -> MetadataError {
        MetadataError::Missing { kind: "tenant", name: name.to_string(), path: self.path.clone() }
    }
}

/// Reads the tenants of `data_dir`'s store (none when there is no store) for a running target:
/// the store is opened read-only (a shared lock) just for the read, waiting while an admin
/// command has it open. A store an interrupted writer left unclean is opened for writing once,
/// which repairs it.
pub fn read_tenants(data_dir: &Path) -> Result<Vec<TenantRecord>, MetadataError> {
    let path = data_dir.join(METADATA_FILE);
    let mut tenants: Vec<TenantRecord> = guarded(&path, || match open_to_read(&path)? {
        Some(store) => store.list(&path, TENANTS),
        None => Ok(Vec::new()),
    })?;
    tenants.sort_by_key(|tenant| tenant.id);
    Ok(tenants)
}

/// Whether a read-only open of `path` fails because the store needs repair.
fn needs_repair(path: &Path) -> bool {
    matches!(ReadOnlyDatabase::open(path), Err(DatabaseError::RepairAborted))
}

fn encode(record: &TenantRecord) -> String {
    assert!(check_record(record).is_ok(), "a tenant record is checked before it is stored: {record:?}");
    serde_json::to_string(record).expect("tenant records always serialize")
}

/// What every stored tenant record satisfies.
fn check_record(record: &TenantRecord) -> Result<(), String> {
    check_tenant_name(&record.name).map_err(|error| error.to_string())?;
    if !(1..=MAX_TENANTS).contains(&record.id) {
        return Err(format!("tenant {:?}: id {} is outside 1..={MAX_TENANTS}", record.name, record.id));
    }
    TenantKey::from_hex(&record.key_hex).map_err(|error| format!("tenant {:?}: {error}", record.name))?;
    if record.grants.len() > MAX_GRANTS_PER_TENANT {
        return Err(format!(
            "tenant {:?}: {} grants, at most {MAX_GRANTS_PER_TENANT}",
            record.name,
            record.grants.len()
        ));
    }
    for (index, grant) in record.grants.iter().enumerate() {
        if !normalize_permissions(&grant.permissions).is_ok_and(|normal| normal == grant.permissions) {
            return Err(format!(
                "tenant {:?}: grant permissions {:?} are not canonical",
                record.name, grant.permissions
            ));
        }
        if record.grants[..index].iter().any(|other| other.space == grant.space) {
            return Err(format!("tenant {:?}: two grants on {}", record.name, space_text(&grant.space)));
        }
        if let GrantSpace::KeySlot(slot) = grant.space {
            let key_uses_only = grant.permissions.iter().all(|name| KEY_PERMISSION_NAMES.contains(&name.as_str()));
            if slot >= netdam_isa::limits::CRYPTO_KEY_SLOTS || !key_uses_only || grant.range.is_some() {
                return Err(format!("tenant {:?}: grant on key slot {slot} is not a key slot's", record.name));
            }
        }
    }
    Ok(())
}

/// Refuses a grant that the target (which keeps one grant per tenant and space) could not
/// combine with the tenant's other grant on the same space without widening or dropping one:
/// a ranged grant holding a permission its tenant's `all` grant lacks.
fn check_no_widening(tenant: &str, record: &TenantRecord, new: &GrantRecord) -> Result<(), MetadataError> {
    let lacking = |wide: &GrantRecord, ranged: &GrantRecord| {
        ranged.range.is_some() && ranged.permissions.iter().any(|name| !wide.permissions.contains(name))
    };
    // An `all` grant of `admin` or key uses only grants nothing on regions and namespaces.
    let on_spaces = |grant: &GrantRecord| {
        grant.permissions.iter().any(|name| netdam_isa::extension::Permissions::from_name(name).is_some())
    };
    let (all, ranged) = if new.space == GrantSpace::All {
        if !on_spaces(new) {
            return Ok(());
        }
        match record.grants.iter().find(|held| held.space != GrantSpace::All && lacking(new, held)) {
            Some(held) => (new, held),
            None => return Ok(()),
        }
    } else {
        match record.grants.iter().find(|held| held.space == GrantSpace::All && on_spaces(held) && lacking(held, new)) {
            Some(held) => (held, new),
            None => return Ok(()),
        }
    };
    Err(MetadataError::Refused(format!(
        "tenant {tenant:?}: {} over bytes {} with {} beside `all` with {}: the target keeps one range per space, \
         so it could not hold both; give `all` those permissions too, grant {} without --range, or revoke one first",
        space_text(&ranged.space),
        range_text(ranged.range),
        ranged.permissions.join(","),
        all.permissions.join(","),
        space_text(&ranged.space),
    )))
}

/// Checks a tenant name: it names the tenant's key file too.
pub fn check_tenant_name(name: &str) -> Result<(), MetadataError> {
    let name_ok = !name.is_empty()
        && name.len() <= MAX_TENANT_NAME_BYTES
        && !name.starts_with('.')
        && name.bytes().all(|byte| byte.is_ascii_alphanumeric() || b"_.-".contains(&byte));
    if name_ok {
        Ok(())
    } else {
        Err(MetadataError::Refused(format!(
            "tenant name {name:?}: use 1 to {MAX_TENANT_NAME_BYTES} characters of A-Z a-z 0-9 _ . - (not starting with .)"
        )))
    }
}

/// Permission names in their stored form: known, each once, in [`PERMISSION_NAMES`] order,
/// `all` expanded. Refuses an unknown name, naming it, and an empty list.
pub fn normalize_permissions(names: &[String]) -> Result<Vec<String>, MetadataError> {
    for name in names {
        if name != "all" && !PERMISSION_NAMES.contains(&name.as_str()) {
            return Err(MetadataError::Refused(format!(
                "unknown permission {name:?}: use {} or all",
                PERMISSION_NAMES.join(", ")
            )));
        }
    }
    if names.is_empty() {
        return Err(MetadataError::Refused(format!("no permission named: use {} or all", PERMISSION_NAMES.join(", "))));
    }
    let every = names.iter().any(|name| name == "all");
    Ok(PERMISSION_NAMES
        .iter()
        .filter(|known| every || names.iter().any(|name| name == *known))
        .map(|known| known.to_string())
        .collect())
}

/// Permission names for a grant on `space`, in stored form ([`normalize_permissions`]).
/// `encrypt` and `decrypt` are about a key slot: they count on `key:SLOT` (which takes nothing
/// else) and on `all` (every slot), and are refused on one region or namespace.
/// `admin` is about the whole target (STAT and management), so it counts only on `all`: named
/// on one region or namespace it is refused, saying where it applies, and `all` there stands
/// for every permission on that space, without `admin`.
pub fn space_permissions(tenant: &str, space: &GrantSpace, names: &[String]) -> Result<Vec<String>, MetadataError> {
    let mut permissions = normalize_permissions(names)?;
    let named = |wanted: &[&str]| names.iter().find(|name| wanted.contains(&name.as_str())).cloned();
    match space {
        GrantSpace::All => {}
        GrantSpace::KeySlot(slot) => {
            if let Some(name) =
                names.iter().find(|name| *name != "all" && !KEY_PERMISSION_NAMES.contains(&name.as_str()))
            {
                return Err(MetadataError::Refused(format!(
                    "{name} is not a permission on a key slot: key:{slot} takes encrypt (ENCRYPT with its key) and \
                     decrypt (DECRYPT), or all for both; the region the bytes are in needs its own grant"
                )));
            }
            permissions.retain(|name| KEY_PERMISSION_NAMES.contains(&name.as_str()));
        }
        GrantSpace::Region(_) | GrantSpace::Namespace(_) => {
            if named(&["admin"]).is_some() {
                return Err(MetadataError::Refused(format!(
                    "admin is a permission on the whole target (STAT and management), not on {}: grant it on every \
                     space with  netdam-target grant {tenant} all admin",
                    space_text(space)
                )));
            }
            if let Some(name) = named(&KEY_PERMISSION_NAMES) {
                return Err(MetadataError::Refused(format!(
                    "{name} is a permission on a key slot, not on {}: grant it with  netdam-target grant {tenant} \
                     key:SLOT encrypt,decrypt  (ENCRYPT and DECRYPT also need read and write on the region)",
                    space_text(space)
                )));
            }
            permissions.retain(|name| name != "admin" && !KEY_PERMISSION_NAMES.contains(&name.as_str()));
        }
    }
    Ok(permissions)
}

/// A space as the command line writes it: `region:NAME`, `namespace:NAME` or `all`.
pub fn space_text(space: &GrantSpace) -> String {
    match space {
        GrantSpace::Region(name) => format!("region:{name}"),
        GrantSpace::Namespace(name) => format!("namespace:{name}"),
        GrantSpace::KeySlot(slot) => format!("key:{slot}"),
        GrantSpace::All => "all".to_string(),
    }
}

/// A grant's range as the command line writes it (`OFFSET:LEN`), or "the whole space".
pub fn range_text(range: Option<(u64, u64)>) -> String {
    match range {
        Some((offset, len)) => format!("{offset}:{len}"),
        None => "the whole space".to_string(),
    }
}

/// Every key slot of `db` with its key versions.
fn crypto_key_table(db: &impl ReadableDatabase, path: &Path) -> Result<Vec<StoredKeySlot>, MetadataError> {
    let fail = |error: redb::Error| store_error(path, error);
    let read = db.begin_read().map_err(|error| fail(error.into()))?;
    let Some(table) = open_if_present(&read, path, CRYPTO_KEYS)? else { return Ok(Vec::new()) };
    let mut slots = Vec::new();
    for entry in table.iter().map_err(|error| fail(error.into()))? {
        let (slot, bytes) = entry.map_err(|error| fail(error.into()))?;
        slots.push((slot.value(), decode_key_versions(path, slot.value(), bytes.value())?));
    }
    Ok(slots)
}

/// `data_dir`'s key slots with their keys, the store opened read-only as [`read_tenants`] opens
/// it (an absent store holds none): what the listing and the running target's comparison read.
fn read_crypto_keys(data_dir: &Path) -> Result<Vec<StoredKeySlot>, MetadataError> {
    let path = data_dir.join(METADATA_FILE);
    guarded(&path, || match open_to_read(&path)? {
        None => Ok(Vec::new()),
        Some(store) => store.crypto_keys(&path),
    })
}

fn key_versions_only(slots: Vec<StoredKeySlot>) -> Vec<(u32, Vec<u32>)> {
    slots
        .into_iter()
        .map(|(slot, versions)| (slot, versions.into_iter().map(|(version, _)| version).collect()))
        .collect()
}

fn decode_key_versions(path: &Path, slot: u32, bytes: &[u8]) -> Result<Vec<(u32, KeyMaterial)>, MetadataError> {
    if !bytes.len().is_multiple_of(KEY_ENTRY_LEN) {
        return Err(MetadataError::Store {
            path: path.to_path_buf(),
            message: format!("key slot {slot} is unreadable ({} bytes)", bytes.len()),
        });
    }
    Ok(bytes
        .chunks_exact(KEY_ENTRY_LEN)
        .map(|entry| {
            let version = u32::from_le_bytes([entry[0], entry[1], entry[2], entry[3]]);
            let mut key = [0u8; KEY_LEN];
            key.copy_from_slice(&entry[4..]);
            (version, KeyMaterial(key))
        })
        .collect())
}

/// A store opened to be read: read-only (a shared lock, which a read-only data directory
/// allows and a serving target does not block), or, where an interrupted writer left it
/// unclean, opened for writing once, which repairs it.
enum ReadStore {
    ReadOnly(ReadOnlyDatabase),
    Repaired(Database),
}

/// Opens the store at `path` to read it, waiting while an admin command has it open; `None`
/// when there is no store.
fn open_to_read(path: &Path) -> Result<Option<ReadStore>, MetadataError> {
    if let Some(data_dir) = path.parent() {
        check_not_lost(data_dir, path)?;
    }
    if !path.exists() {
        return Ok(None);
    }
    match wait_while_busy(path, || ReadOnlyDatabase::open(path)) {
        Ok(db) => Ok(Some(ReadStore::ReadOnly(db))),
        Err(MetadataError::Store { .. }) if needs_repair(path) => {
            Ok(Some(ReadStore::Repaired(wait_while_busy(path, || Database::open(path))?)))
        }
        Err(error) => Err(error),
    }
}

impl ReadStore {
    fn list<T: serde::de::DeserializeOwned>(
        &self,
        path: &Path,
        table: TableDefinition<&str, &str>,
    ) -> Result<Vec<T>, MetadataError> {
        match self {
            ReadStore::ReadOnly(db) => list_table(db, path, table),
            ReadStore::Repaired(db) => list_table(db, path, table),
        }
    }

    fn list_spaces<T: serde::de::DeserializeOwned>(
        &self,
        path: &Path,
        tables: SpaceTables,
    ) -> Result<Vec<T>, MetadataError> {
        match self {
            ReadStore::ReadOnly(db) => list_spaces(db, path, tables),
            ReadStore::Repaired(db) => list_spaces(db, path, tables),
        }
    }

    fn crypto_keys(&self, path: &Path) -> Result<Vec<StoredKeySlot>, MetadataError> {
        match self {
            ReadStore::ReadOnly(db) => crypto_key_table(db, path),
            ReadStore::Repaired(db) => crypto_key_table(db, path),
        }
    }
}

fn list_table<T: serde::de::DeserializeOwned>(
    db: &impl ReadableDatabase,
    path: &Path,
    table: TableDefinition<&str, &str>,
) -> Result<Vec<T>, MetadataError> {
    let read = db.begin_read().map_err(|error| store_error(path, error))?;
    Ok(list_named(&read, path, table)?.into_iter().map(|(_, value)| value).collect())
}

/// `table` as `read` sees it, or `None` where no write has created it yet (a new store, or one
/// from before the table existed).
fn open_if_present<K: redb::Key + 'static, V: redb::Value + 'static>(
    read: &redb::ReadTransaction,
    path: &Path,
    table: TableDefinition<K, V>,
) -> Result<Option<redb::ReadOnlyTable<K, V>>, MetadataError> {
    match read.open_table(table) {
        Ok(table) => Ok(Some(table)),
        Err(TableError::TableDoesNotExist(_)) => Ok(None),
        Err(error) => Err(store_error(path, error)),
    }
}

/// Every entry of `table` with its name, in name order (the table's), as `read` sees them.
fn list_named<T: serde::de::DeserializeOwned>(
    read: &redb::ReadTransaction,
    path: &Path,
    table: TableDefinition<&str, &str>,
) -> Result<Vec<(String, T)>, MetadataError> {
    let fail = |error: redb::Error| store_error(path, error);
    let Some(table) = open_if_present(read, path, table)? else { return Ok(Vec::new()) };
    let mut entries = Vec::new();
    for entry in table.iter().map_err(|error| fail(error.into()))? {
        let (name, json) = entry.map_err(|error| fail(error.into()))?;
        let value = serde_json::from_str(json.value()).map_err(|error| MetadataError::Store {
            path: path.to_path_buf(),
            message: format!("entry {:?} is unreadable: {error}", name.value()),
        })?;
        entries.push((name.value().to_string(), value));
    }
    Ok(entries)
}

/// The spaces of one kind in their order ([`REGION_ORDER`]): by the number each create gave,
/// those without one first, in name order.
fn list_spaces<T: serde::de::DeserializeOwned>(
    db: &impl ReadableDatabase,
    path: &Path,
    tables: SpaceTables,
) -> Result<Vec<T>, MetadataError> {
    let fail = |error: redb::Error| store_error(path, error);
    // One transaction for both tables: a create or delete between two reads could leave an
    // entry without its number, and out of place.
    let read = db.begin_read().map_err(|error| fail(error.into()))?;
    let entries = list_named(&read, path, tables.entries)?;
    let order = open_if_present(&read, path, tables.order)?;
    let mut spaces = Vec::with_capacity(entries.len());
    for (name, value) in entries {
        let place = match &order {
            Some(order) => {
                order.get(name.as_str()).map_err(|error| fail(error.into()))?.map_or(0, |place| place.value())
            }
            None => 0,
        };
        spaces.push((place, value));
    }
    // Stable: among equal numbers (0, a store from before), name order stays.
    spaces.sort_by_key(|(place, _)| *place);
    Ok(spaces.into_iter().map(|(_, value)| value).collect())
}

/// Runs `open` until it does not fail with [`DatabaseError::DatabaseAlreadyOpen`] (what redb 3
/// returns when another process holds the file's lock), pausing a little longer each time, for
/// at most [`STORE_BUSY_WAIT`].
pub(crate) fn wait_while_busy<T>(
    path: &Path,
    mut open: impl FnMut() -> Result<T, DatabaseError>,
) -> Result<T, MetadataError> {
    let deadline = Instant::now() + STORE_BUSY_WAIT;
    let mut pause = Duration::from_millis(1);
    loop {
        match open() {
            Err(DatabaseError::DatabaseAlreadyOpen) if Instant::now() + pause < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(STORE_BUSY_PAUSE_MAX);
            }
            result => return result.map_err(|error| store_error(path, error)),
        }
    }
}

/// Refuses a store that is missing or empty in a data directory holding what only a store
/// makes beside it (tenant key files in `tenants/`, crypto nonce reservations): the store was
/// lost or moved, and starting a new one there would hand out a new default tenant with every
/// permission and forget the stored spaces, the tenants and the crypto keys without a word.
fn check_not_lost(data_dir: &Path, path: &Path) -> Result<(), MetadataError> {
    let state = match std::fs::metadata(path) {
        Ok(metadata) if metadata.len() > 0 => return Ok(()),
        Ok(_) => "empty",
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => "missing",
        Err(_) => return Ok(()),
    };
    let names_in = |dir: &Path, keep: &dyn Fn(&str) -> bool| -> Vec<PathBuf> {
        let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
        let mut found: Vec<PathBuf> = entries
            .filter_map(|entry| entry.ok())
            .filter(|entry| keep(&entry.file_name().to_string_lossy()))
            .map(|entry| entry.path())
            .collect();
        found.sort();
        found
    };
    let mut left = names_in(&data_dir.join(crate::tenant_admin::TENANTS_DIR), &|name: &str| {
        name.ends_with(".key") && !name.starts_with('.')
    });
    left.extend(names_in(data_dir, &|name: &str| name.starts_with(crate::crypto::NONCE_FILE_PREFIX)));
    if left.is_empty() {
        return Ok(());
    }
    let shown: Vec<String> = left.iter().take(3).map(|path| path.display().to_string()).collect();
    let more = if left.len() > 3 { format!(" and {} more", left.len() - 3) } else { String::new() };
    Err(MetadataError::Store {
        path: path.to_path_buf(),
        message: format!(
            "the file is {state}, yet the data directory holds what a store makes ({}{more}): the store was \
             lost or moved. Put it back or restore it from a backup; nothing here creates a new one over the old \
             one's keys. To start afresh, give the target another data directory (or, where those key files were \
             copied here for `netdam` from another target, move them away)",
            shown.join(", ")
        ),
    })
}

/// Runs `read` (an open or a read of the store at `path`), turning a panic inside the database
/// into an error that names the file: redb asserts and reaches `unreachable!` on a file that is
/// truncated or whose pages were overwritten, where a start or an admin command should say the
/// store is damaged and what to do, and a running target's tenant watcher must live on.
fn guarded<T>(path: &Path, read: impl FnOnce() -> Result<T, MetadataError>) -> Result<T, MetadataError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(read)).unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|text| text.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".to_string());
        // A file redb cannot have written.
        Err(MetadataError::Store {
            path: path.to_path_buf(),
            message: format!(
                "the file is damaged ({what}): restore it from a backup; it holds the tenants and their keys, \
                 the stored regions and namespaces and the crypto keys (a data directory whose store is gone \
                 is refused, not started afresh)"
            ),
        })
    })
}

/// What a store that cannot be read as one is, and what to do.
const DAMAGED: &str = " (the file is damaged: restore it from a backup copy of metadata.redb; the spaces' own \
                       files are not in it and stay as they are)";

fn store_error(path: &Path, error: impl Into<redb::Error>) -> MetadataError {
    let error: redb::Error = error.into();
    let message = match &error {
        redb::Error::DatabaseAlreadyOpen => {
            format!(
                "another process kept it open for {} s (an admin command running at the same time?); try again",
                STORE_BUSY_WAIT.as_secs()
            )
        }
        redb::Error::Corrupted(_) => format!("{error}{DAMAGED}"),
        redb::Error::Io(io) if io.kind() == std::io::ErrorKind::InvalidData => format!("{error}{DAMAGED}"),
        other => other.to_string(),
    };
    MetadataError::Store { path: path.to_path_buf(), message }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ByteSize, NamespaceBackend, RegionBackend};

    #[test]
    fn entries_survive_reopening_and_names_are_unique() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(MetadataStore::load(dir.path()).unwrap(), Stored::default(), "no store, nothing stored");
        let region =
            RegionConfig { name: "scratch".into(), backend: RegionBackend::Mem, path: None, size: ByteSize(4096) };
        let namespace = NamespaceConfig {
            name: "disk".into(),
            backend: NamespaceBackend::File,
            path: "disk.img".into(),
            size: Some(ByteSize(1 << 20)),
            block_size: 4096,
        };
        {
            let store = MetadataStore::open(dir.path()).unwrap();
            store.create_region(&region).unwrap();
            store.create_namespace(&namespace).unwrap();
            let again = store.create_namespace(&namespace).unwrap_err().to_string();
            assert!(again.contains("\"disk\" already exists"), "{again}");
        }
        let stored = MetadataStore::load(dir.path()).unwrap();
        assert_eq!(stored.regions, vec![region.clone()]);
        assert_eq!(stored.namespaces, vec![namespace.clone()]);
        let store = MetadataStore::open(dir.path()).unwrap();
        assert_eq!(store.delete_namespace("disk").unwrap(), (namespace, Vec::new()));
        let missing = store.delete_namespace("disk").unwrap_err().to_string();
        assert!(missing.contains("no namespace named \"disk\""), "{missing}");
        assert_eq!(store.namespaces().unwrap(), vec![]);
        assert_eq!(store.regions().unwrap(), vec![region]);
    }

    fn namespace(name: &str) -> NamespaceConfig {
        NamespaceConfig {
            name: name.into(),
            backend: NamespaceBackend::File,
            path: format!("{name}.img").into(),
            size: Some(ByteSize(1 << 20)),
            block_size: 4096,
        }
    }

    fn namespace_names(store: &MetadataStore) -> Vec<String> {
        store.namespaces().unwrap().into_iter().map(|namespace| namespace.name).collect()
    }

    /// A space's id is its place in the list: a create must not move the ones already there,
    /// whatever its name; a delete moves only those after it.
    #[test]
    fn spaces_keep_their_places_when_others_are_created() {
        let dir = tempfile::tempdir().unwrap();
        let store = MetadataStore::open(dir.path()).unwrap();
        for name in ["disk", "small", "mid", "a-first"] {
            store.create_namespace(&namespace(name)).unwrap();
        }
        assert_eq!(namespace_names(&store), names(&["disk", "small", "mid", "a-first"]));
        store.delete_namespace("small").unwrap();
        store.create_namespace(&namespace("b")).unwrap();
        assert_eq!(namespace_names(&store), names(&["disk", "mid", "a-first", "b"]));
        // The same list read-only, as a starting target and `namespace list` read it.
        drop(store);
        let stored = MetadataStore::load(dir.path()).unwrap();
        let loaded: Vec<String> = stored.namespaces.into_iter().map(|namespace| namespace.name).collect();
        assert_eq!(loaded, names(&["disk", "mid", "a-first", "b"]));

        // Regions alike.
        let store = MetadataStore::open(dir.path()).unwrap();
        for name in ["scratch", "a-region"] {
            let region =
                RegionConfig { name: name.into(), backend: RegionBackend::Mem, path: None, size: ByteSize(4096) };
            store.create_region(&region).unwrap();
        }
        let regions: Vec<String> = store.regions().unwrap().into_iter().map(|region| region.name).collect();
        assert_eq!(regions, names(&["scratch", "a-region"]));
    }

    /// A store written before spaces had places keeps its ids (name order), and a create there
    /// comes after all of them.
    #[test]
    fn a_store_without_places_keeps_name_order_and_creates_go_last() {
        let dir = tempfile::tempdir().unwrap();
        let store = MetadataStore::open(dir.path()).unwrap();
        {
            // What an older netdam-target wrote: the entries alone.
            let write = store.db.begin_write().unwrap();
            {
                let mut entries = write.open_table(NAMESPACES).unwrap();
                for name in ["small", "disk"] {
                    entries.insert(name, serde_json::to_string(&namespace(name)).unwrap().as_str()).unwrap();
                }
            }
            write.commit().unwrap();
        }
        assert_eq!(namespace_names(&store), names(&["disk", "small"]));
        store.create_namespace(&namespace("a-new")).unwrap();
        assert_eq!(namespace_names(&store), names(&["disk", "small", "a-new"]));
    }

    fn key(byte: u8) -> TenantKey {
        TenantKey::from_bytes([byte; 32])
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|name| name.to_string()).collect()
    }

    fn region_grant(name: &str, permissions: &[&str], range: Option<(u64, u64)>) -> GrantRecord {
        GrantRecord { space: GrantSpace::Region(name.into()), permissions: names(permissions), range }
    }

    fn configured() -> KnownSpaces {
        KnownSpaces {
            regions: vec![("scratch".into(), Some(1 << 20))],
            namespaces: vec![("disk".into(), None)],
            settings_file: Some("netdam.toml".into()),
        }
    }

    #[test]
    fn tenants_round_trip_and_take_the_lowest_free_id() {
        let dir = tempfile::tempdir().unwrap();
        let store = MetadataStore::open(dir.path()).unwrap();
        let settings = TenantSettings {
            class: Some(QosClass::BestEffort),
            max_sessions: Some(4),
            cost_per_second: Some(1000),
            ..TenantSettings::default()
        };
        let alice = store.create_tenant("alice", &key(1), &settings).unwrap();
        assert_eq!((alice.id, alice.key_version, alice.class), (1, 1, QosClass::BestEffort));
        assert_eq!(
            alice.limits,
            TenantLimits { max_sessions: 4, cost_per_second: 1000, burst: 1000, ..Default::default() }
        );
        let bob = store.create_tenant("bob", &key(2), &TenantSettings::default()).unwrap();
        let carol = store.create_tenant("carol", &key(3), &TenantSettings::default()).unwrap();
        assert_eq!((bob.id, carol.id), (2, 3));
        assert_eq!(store.delete_tenant("bob").unwrap(), bob);
        let dave = store.create_tenant("dave", &key(4), &TenantSettings::default()).unwrap();
        assert_eq!(dave.id, 2, "the lowest free id is reused");
        assert_eq!(dave.key_version, 2, "above the deleted tenant's version: no (id, version) names two tenants");
        let (_, _) = store.rotate_key("dave").unwrap();
        let dave = store.delete_tenant("dave").unwrap();
        assert_eq!(dave.key_version, 3);
        let dave = store.create_tenant("dave", &key(4), &TenantSettings::default()).unwrap();
        assert_eq!((dave.id, dave.key_version), (2, 4), "past the rotated version too");
        drop(store);
        assert_eq!(read_tenants(dir.path()).unwrap(), vec![alice.clone(), dave.clone(), carol.clone()]);
        let store = MetadataStore::open(dir.path()).unwrap();
        assert_eq!(store.tenant("carol").unwrap(), carol);

        let duplicate = store.create_tenant("alice", &key(9), &TenantSettings::default()).unwrap_err().to_string();
        assert!(duplicate.contains("tenant named \"alice\" already exists"), "{duplicate}");
        let same_key = store.create_tenant("eve", &key(1), &TenantSettings::default()).unwrap_err().to_string();
        assert!(same_key.contains("\"alice\" holds this key"), "{same_key}");
        let bad_name = store.create_tenant("../x", &key(8), &TenantSettings::default()).unwrap_err().to_string();
        assert!(bad_name.contains("tenant name \"../x\""), "{bad_name}");
        let missing = store.delete_tenant("zed").unwrap_err().to_string();
        assert!(missing.contains("no tenant named \"zed\""), "{missing}");
        let locked_out = TenantSettings { max_sessions: Some(0), ..TenantSettings::default() };
        assert!(store.set_tenant("alice", &locked_out).unwrap_err().to_string().contains("--max-sessions 0"));

        let faster = TenantSettings { class: Some(QosClass::LatencyCritical), burst: Some(50), ..Default::default() };
        let changed = store.set_tenant("alice", &faster).unwrap();
        assert_eq!(
            (changed.class, changed.limits.burst, changed.limits.max_sessions),
            (QosClass::LatencyCritical, 50, 4)
        );
        assert_eq!(store.tenant("alice").unwrap(), changed);
    }

    #[test]
    fn a_burst_never_given_follows_the_rate_and_a_given_one_stays() {
        let dir = tempfile::tempdir().unwrap();
        let store = MetadataStore::open(dir.path()).unwrap();
        let rate = |cost_per_second| TenantSettings { cost_per_second: Some(cost_per_second), ..Default::default() };
        let burst = |burst| TenantSettings { burst: Some(burst), ..Default::default() };
        let limits = |name: &str| store.tenant(name).unwrap().limits;
        store.create_tenant("q1", &key(1), &rate(1000)).unwrap();
        assert_eq!((limits("q1").burst, limits("q1").burst_explicit), (1000, false));
        store.set_tenant("q1", &rate(2000)).unwrap();
        assert_eq!(limits("q1").burst, 2000, "one second of the new rate");
        store.set_tenant("q1", &rate(0)).unwrap();
        store.set_tenant("q1", &rate(300)).unwrap();
        assert_eq!(limits("q1").burst, 300, "through an unlimited spell too");
        store.set_tenant("q1", &burst(50)).unwrap();
        store.set_tenant("q1", &rate(4000)).unwrap();
        assert_eq!((limits("q1").burst, limits("q1").burst_explicit), (50, true), "a given burst stays");
        store.create_tenant("q2", &key(2), &burst(70)).unwrap();
        store.set_tenant("q2", &rate(100)).unwrap();
        assert_eq!(limits("q2").burst, 70, "given before any rate");

        // Records stored before `burst_explicit` existed read as not given: a burst of one second
        // of the rate follows it, any other was given and stays.
        let write = store.db.begin_write().unwrap();
        {
            let mut table = write.open_table(TENANTS).unwrap();
            for (name, id, key_byte, burst) in [("old-follows", 3, 3, 1000), ("old-given", 4, 4, 250)] {
                let json = format!(
                    r#"{{"name":"{name}","id":{id},"key_version":1,"key_hex":"{}","class":"latency-critical",
                    "limits":{{"max_sessions":64,"max_in_flight":256,"cost_per_second":1000,"burst":{burst}}},
                    "grants":[]}}"#,
                    key(key_byte).to_hex()
                );
                table.insert(name, json.as_str()).unwrap();
            }
        }
        write.commit().unwrap();
        assert!(!limits("old-given").burst_explicit, "an old record reads");
        store.set_tenant("old-follows", &rate(2000)).unwrap();
        store.set_tenant("old-given", &rate(2000)).unwrap();
        assert_eq!((limits("old-follows").burst, limits("old-given").burst), (2000, 250));
    }

    #[test]
    fn deleting_the_last_tenant_is_remembered() {
        let dir = tempfile::tempdir().unwrap();
        let store = MetadataStore::open(dir.path()).unwrap();
        assert!(!store.tenants_emptied().unwrap(), "a new store");
        store.create_tenant("a", &key(1), &TenantSettings::default()).unwrap();
        store.create_tenant("b", &key(2), &TenantSettings::default()).unwrap();
        store.delete_tenant("a").unwrap();
        assert!(!store.tenants_emptied().unwrap(), "one is left");
        assert!(store.delete_tenant("a").is_err());
        assert!(!store.tenants_emptied().unwrap(), "a refused delete changes nothing");
        store.delete_tenant("b").unwrap();
        assert!(store.tenants_emptied().unwrap());
        drop(store);
        assert!(MetadataStore::open(dir.path()).unwrap().tenants_emptied().unwrap(), "durably");
    }

    #[test]
    fn admin_is_granted_on_every_space_only() {
        let dir = tempfile::tempdir().unwrap();
        let store = MetadataStore::open(dir.path()).unwrap();
        store.create_tenant("alice", &key(1), &TenantSettings::default()).unwrap();
        let refused =
            store.grant("alice", &region_grant("scratch", &["read", "admin"], None), &configured()).unwrap_err();
        let refused = refused.to_string();
        assert!(refused.contains("not on region:scratch") && refused.contains("grant alice all admin"), "{refused}");
        assert!(store.tenant("alice").unwrap().grants.is_empty());
        let record = store.grant("alice", &region_grant("scratch", &["all"], None), &configured()).unwrap();
        assert_eq!(record.grants[0].permissions, ["read", "write", "atomic", "compute", "block"]);
        let everything = GrantRecord { space: GrantSpace::All, permissions: names(&["admin"]), range: None };
        let record = store.grant("alice", &everything, &configured()).unwrap();
        assert_eq!(record.grants[1].permissions, ["admin"]);
        // A record of an earlier version may hold `admin` on one space (it never counted there):
        // a later grant on that space drops it instead of refusing what the user asked.
        store.create_tenant("old", &key(2), &TenantSettings::default()).unwrap();
        store.grant("old", &region_grant("scratch", &["read"], None), &configured()).unwrap();
        store
            .update_tenant("old", |record| {
                record.grants[0].permissions.push("admin".into());
                Ok(())
            })
            .unwrap();
        let record = store.grant("old", &region_grant("scratch", &["write"], None), &configured()).unwrap();
        assert_eq!(record.grants[0].permissions, ["read", "write"]);
    }

    #[test]
    fn key_slots_are_granted_for_encrypt_and_decrypt_only_while_they_hold_a_key() {
        let dir = tempfile::tempdir().unwrap();
        let store = MetadataStore::open(dir.path()).unwrap();
        store.create_tenant("alice", &key(1), &TenantSettings::default()).unwrap();
        store.create_tenant("bob", &key(2), &TenantSettings::default()).unwrap();
        let slot = |slot: u32, permissions: &[&str]| GrantRecord {
            space: GrantSpace::KeySlot(slot),
            permissions: names(permissions),
            range: None,
        };
        let refused = |grant: GrantRecord| store.grant("alice", &grant, &configured()).unwrap_err().to_string();
        // An empty slot: a grant there would give a key created later.
        let empty = refused(slot(3, &["encrypt"]));
        assert!(empty.contains("key slot 3 holds no key") && empty.contains("crypto-key create 3"), "{empty}");
        store.create_crypto_key(3, &KeyMaterial([1; KEY_LEN])).unwrap();
        store.create_crypto_key(4, &KeyMaterial([2; KEY_LEN])).unwrap();
        let wrong = refused(slot(3, &["encrypt", "read"]));
        assert!(wrong.contains("read is not a permission on a key slot"), "{wrong}");
        let ranged = refused(GrantRecord { range: Some((0, 4096)), ..slot(3, &["encrypt"]) });
        assert!(ranged.contains("not to key:3"), "{ranged}");
        let on_region = refused(region_grant("scratch", &["read", "decrypt"], None));
        assert!(on_region.contains("decrypt is a permission on a key slot, not on region:scratch"), "{on_region}");
        assert!(store.tenant("alice").unwrap().grants.is_empty(), "nothing refused was stored");
        // `all` on a key slot is its two uses; on a region, no key use; on `all`, every one.
        let record = store.grant("alice", &slot(3, &["all"]), &configured()).unwrap();
        assert_eq!(record.grants[0].permissions, ["encrypt", "decrypt"]);
        let record = store.grant("alice", &region_grant("scratch", &["all"], None), &configured()).unwrap();
        assert_eq!(record.grants[1].permissions, ["read", "write", "atomic", "compute", "block"]);
        let everything = GrantRecord { space: GrantSpace::All, permissions: names(&["all"]), range: None };
        let record = store.grant("bob", &everything, &configured()).unwrap();
        let all = ["read", "write", "atomic", "compute", "block", "encrypt", "decrypt", "admin"];
        assert_eq!(record.grants[0].permissions, all);
        store.grant("bob", &slot(4, &["decrypt"]), &configured()).unwrap();
        let record = store.revoke("alice", &GrantSpace::KeySlot(3), Some(&names(&["decrypt"]))).unwrap();
        assert_eq!(record.grants[0].permissions, ["encrypt"]);
        // Deleting a slot takes its grants with it, in the same commit; `all` stays.
        assert_eq!(store.delete_crypto_key(3).unwrap(), (vec![1], vec!["alice".to_string()]));
        assert_eq!(store.tenant("alice").unwrap().grants.len(), 1, "the region grant stays");
        assert_eq!(store.delete_crypto_key(4).unwrap(), (vec![1], vec!["bob".to_string()]));
        assert_eq!(store.tenant("bob").unwrap().grants, [everything_stored(&all)]);
        drop(store);
        let store = MetadataStore::open(dir.path()).unwrap();
        assert!(!store.tenant("alice").unwrap().grants.iter().any(|grant| grant.space == GrantSpace::KeySlot(3)));
        // An `all` grant of key uses only grants nothing on spaces: a ranged grant beside it
        // does not clash, in either order.
        store.create_tenant("carol", &key(3), &TenantSettings::default()).unwrap();
        let key_uses = GrantRecord { space: GrantSpace::All, permissions: names(&["encrypt"]), range: None };
        store.grant("carol", &key_uses, &configured()).unwrap();
        store.grant("carol", &region_grant("scratch", &["read"], Some((0, 4096))), &configured()).unwrap();
        store.create_tenant("dave", &key(4), &TenantSettings::default()).unwrap();
        store.grant("dave", &region_grant("scratch", &["read"], Some((0, 4096))), &configured()).unwrap();
        store.grant("dave", &key_uses, &configured()).unwrap();
    }

    fn everything_stored(permissions: &[&str]) -> GrantRecord {
        GrantRecord { space: GrantSpace::All, permissions: names(permissions), range: None }
    }

    #[test]
    fn an_unknown_space_points_to_the_settings_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = MetadataStore::open(dir.path()).unwrap();
        store.create_tenant("bob", &key(1), &TenantSettings::default()).unwrap();
        let disk =
            GrantRecord { space: GrantSpace::Namespace("disk".into()), permissions: names(&["read"]), range: None };
        let built_in = store.grant("bob", &disk, &KnownSpaces::default()).unwrap_err().to_string();
        assert!(built_in.contains("known namespaces: none") && built_in.contains("pass --config FILE"), "{built_in}");
        let other = GrantRecord { space: GrantSpace::Namespace("other".into()), ..disk };
        let from_file = store.grant("bob", &other, &configured()).unwrap_err().to_string();
        assert!(from_file.contains("or the settings file netdam.toml (known namespaces: disk)"), "{from_file}");
    }

    #[test]
    fn tenant_ids_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let store = MetadataStore::open(dir.path()).unwrap();
        for index in 0..MAX_TENANTS {
            let name = format!("t{index}");
            let record =
                store.create_tenant(&name, &TenantKey::generate().unwrap(), &TenantSettings::default()).unwrap();
            assert_eq!(record.id, index + 1);
        }
        let full = store.create_tenant("one-more", &key(1), &TenantSettings::default()).unwrap_err().to_string();
        assert!(full.contains(&format!("holds {MAX_TENANTS} tenants")), "{full}");
        store.delete_tenant("t99").unwrap();
        assert_eq!(store.create_tenant("one-more", &key(1), &TenantSettings::default()).unwrap().id, 100);
    }

    #[test]
    fn rotating_changes_the_key_and_its_version() {
        let dir = tempfile::tempdir().unwrap();
        let store = MetadataStore::open(dir.path()).unwrap();
        let before = store.create_tenant("alice", &key(1), &TenantSettings::default()).unwrap();
        let (after, new_key) = store.rotate_key("alice").unwrap();
        assert_eq!(after.key_version, 2);
        assert_eq!(after.key_hex, new_key.to_hex());
        assert_ne!(new_key, key(1));
        assert_eq!((after.id, &after.name), (before.id, &before.name));
        let (again, _) = store.rotate_key("alice").unwrap();
        assert_eq!(again.key_version, 3);
        // A failing step before the commit leaves the old key in force.
        let refused = store.rotate_key_with("alice", |_| Err("key file not writable".into())).unwrap_err();
        assert!(refused.to_string().contains("not writable"));
        assert_eq!(store.tenant("alice").unwrap(), again);
        assert!(store.rotate_key("zed").unwrap_err().to_string().contains("no tenant named \"zed\""));
    }

    #[test]
    fn grants_merge_on_one_space_and_revokes_take_them_apart() {
        let dir = tempfile::tempdir().unwrap();
        let store = MetadataStore::open(dir.path()).unwrap();
        store.create_tenant("alice", &key(1), &TenantSettings::default()).unwrap();
        let known = configured();
        store.grant("alice", &region_grant("scratch", &["write"], None), &known).unwrap();
        let merged = store.grant("alice", &region_grant("scratch", &["read", "write"], None), &known).unwrap();
        assert_eq!(merged.grants, vec![region_grant("scratch", &["read", "write"], None)], "one grant, merged");
        let namespace =
            GrantRecord { space: GrantSpace::Namespace("disk".into()), permissions: names(&["block"]), range: None };
        store.grant("alice", &namespace, &known).unwrap();

        // A space the store holds is known too.
        let stored =
            RegionConfig { name: "stored".into(), backend: RegionBackend::Mem, path: None, size: ByteSize(8192) };
        store.create_region(&stored).unwrap();
        let ranged = region_grant("stored", &["atomic"], Some((4096, 4096)));
        store.grant("alice", &ranged, &known).unwrap();
        let other_range = store.grant("alice", &region_grant("stored", &["read"], Some((0, 4096))), &known);
        assert!(other_range.unwrap_err().to_string().contains("holds region:stored over 4096:4096 already"));
        let same_range = store.grant("alice", &region_grant("stored", &["read"], Some((4096, 4096))), &known).unwrap();
        assert_eq!(same_range.grants[2], region_grant("stored", &["read", "atomic"], Some((4096, 4096))));

        for (grant, culprit) in [
            (region_grant("scratch", &["read", "fly"], None), "unknown permission \"fly\""),
            (region_grant("nowhere", &["read"], None), "no region:nowhere"),
            (region_grant("stored", &["read"], Some((4096, 8192))), "past the end of region:stored (8192 bytes)"),
            (region_grant("scratch", &["read"], Some((0, 0))), "range 0:0"),
            (
                GrantRecord { space: GrantSpace::All, permissions: names(&["read"]), range: Some((0, 1)) },
                "not to `all`",
            ),
            (region_grant("scratch", &[], None), "no permission named"),
        ] {
            let error = store.grant("alice", &grant, &known).unwrap_err().to_string();
            assert!(error.contains(culprit), "{grant:?}: {error}");
        }
        assert!(store
            .grant("zed", &region_grant("scratch", &["read"], None), &known)
            .unwrap_err()
            .to_string()
            .contains("no tenant named"));
        // `all` beside a ranged grant with a permission `all` lacks would widen it: refused.
        let everything = GrantRecord { space: GrantSpace::All, permissions: names(&["read"]), range: None };
        let beside = store.grant("alice", &everything, &known).unwrap_err().to_string();
        assert!(
            beside.contains("region:stored over bytes 4096:4096 with read,atomic beside `all` with read"),
            "{beside}"
        );
        let everything = GrantRecord { permissions: names(&["all"]), ..everything };
        let record = store.grant("alice", &everything, &known).unwrap();
        assert_eq!(record.grants[3].permissions, PERMISSION_NAMES);

        let scratch = GrantSpace::Region("scratch".into());
        let record = store.revoke("alice", &scratch, Some(&names(&["write"]))).unwrap();
        assert_eq!(record.grants[0], region_grant("scratch", &["read"], None));
        let record = store.revoke("alice", &scratch, Some(&names(&["read"]))).unwrap();
        assert!(record.grants.iter().all(|grant| grant.space != scratch), "a grant left with nothing is removed");
        let again = store.revoke("alice", &scratch, None).unwrap_err().to_string();
        assert!(
            again.contains("holds no grant on region:scratch (it holds: namespace:disk, region:stored, all)"),
            "{again}"
        );
        let record = store.revoke("alice", &GrantSpace::All, None).unwrap();
        assert_eq!(record.grants.len(), 2);
        assert!(store.revoke("alice", &GrantSpace::Namespace("disk".into()), Some(&names(&["blok"]))).is_err());
        let unheld = store
            .revoke("alice", &GrantSpace::Region("stored".into()), Some(&names(&["read", "compute"])))
            .unwrap_err()
            .to_string();
        assert!(
            unheld.contains("holds no compute on region:stored (it holds read,atomic there): nothing revoked"),
            "{unheld}"
        );
        drop(store);
        assert_eq!(read_tenants(dir.path()).unwrap()[0], record, "committed, and the refused revoke took nothing");
    }

    #[test]
    fn a_ranged_grant_beside_all_that_lacks_its_permissions_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = MetadataStore::open(dir.path()).unwrap();
        store.create_tenant("bob", &key(2), &TenantSettings::default()).unwrap();
        let everything_read = GrantRecord { space: GrantSpace::All, permissions: names(&["read"]), range: None };
        store.grant("bob", &everything_read, &configured()).unwrap();
        let ranged_write = region_grant("scratch", &["write"], Some((0, 4096)));
        let refused = store.grant("bob", &ranged_write, &configured()).unwrap_err().to_string();
        assert!(refused.contains("region:scratch over bytes 0:4096 with write beside `all` with read"), "{refused}");
        // Within what `all` holds, or over the whole space, the target combines them exactly.
        store.grant("bob", &region_grant("scratch", &["read"], Some((0, 4096))), &configured()).unwrap();
        let disk =
            GrantRecord { space: GrantSpace::Namespace("disk".into()), permissions: names(&["block"]), range: None };
        store.grant("bob", &disk, &configured()).unwrap();
        assert_eq!(store.tenant("bob").unwrap().grants.len(), 3);
    }

    /// `grant T all admin`, then `grant T all read`: the second adds to the first, and the
    /// tenant stays its target's admin (the merge dropped `admin` on every space).
    #[test]
    fn a_grant_on_all_keeps_the_admin_held_there() {
        let dir = tempfile::tempdir().unwrap();
        let store = MetadataStore::open(dir.path()).unwrap();
        store.create_tenant("ops", &key(1), &TenantSettings::default()).unwrap();
        let known = configured();
        let on_all =
            |permissions: &[&str]| GrantRecord { space: GrantSpace::All, permissions: names(permissions), range: None };
        store.grant("ops", &on_all(&["admin"]), &known).unwrap();
        let merged = store.grant("ops", &on_all(&["read"]), &known).unwrap();
        assert_eq!(merged.grants.len(), 1);
        let held = &merged.grants[0].permissions;
        assert!(held.contains(&"admin".to_string()) && held.contains(&"read".to_string()), "{held:?}");
        let again = store.grant("ops", &on_all(&["write"]), &known).unwrap();
        assert!(again.grants[0].permissions.contains(&"admin".to_string()), "{:?}", again.grants[0].permissions);
    }

    #[test]
    fn grants_per_tenant_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let store = MetadataStore::open(dir.path()).unwrap();
        store.create_tenant("alice", &key(1), &TenantSettings::default()).unwrap();
        let known = KnownSpaces {
            regions: (0..=MAX_GRANTS_PER_TENANT).map(|index| (format!("r{index}"), Some(4096))).collect(),
            ..KnownSpaces::default()
        };
        for index in 0..MAX_GRANTS_PER_TENANT {
            store.grant("alice", &region_grant(&format!("r{index}"), &["read"], None), &known).unwrap();
        }
        let last = format!("r{MAX_GRANTS_PER_TENANT}");
        let full = store.grant("alice", &region_grant(&last, &["read"], None), &known).unwrap_err().to_string();
        assert!(full.contains(&format!("holds {MAX_GRANTS_PER_TENANT} grants")), "{full}");
        // Adding to a grant it holds is not a new grant.
        store.grant("alice", &region_grant("r0", &["write"], None), &known).unwrap();
    }

    #[test]
    fn a_store_left_by_a_killed_writer_is_repaired_and_read() {
        const ABANDON: &str = "NETDAM_TEST_ABANDON_STORE";
        if let Some(dir) = std::env::var_os(ABANDON) {
            // The child: commit, then exit without closing the store, as a killed command would.
            let store = MetadataStore::open(Path::new(&dir)).unwrap();
            store.create_tenant("left", &key(5), &TenantSettings::default()).unwrap();
            std::process::exit(0);
        }
        let dir = tempfile::tempdir().unwrap();
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "metadata::tests::a_store_left_by_a_killed_writer_is_repaired_and_read"])
            .env(ABANDON, dir.path())
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
        let path = dir.path().join(METADATA_FILE);
        assert!(
            matches!(ReadOnlyDatabase::open(&path), Err(DatabaseError::RepairAborted)),
            "the store is left unclean"
        );
        let tenants = read_tenants(dir.path()).unwrap();
        assert_eq!(tenants.iter().map(|tenant| tenant.name.as_str()).collect::<Vec<_>>(), ["left"]);
        assert!(ReadOnlyDatabase::open(&path).is_ok(), "repaired: the next read is read-only again");
    }

    /// A store cut short or with pages overwritten makes redb panic (an assertion when it opens,
    /// `unreachable!` when it walks a page); the reads a start and the tenant watcher make, and
    /// the open every admin command makes, return an error naming the file instead.
    #[test]
    fn a_damaged_store_is_an_error_that_names_the_file_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = MetadataStore::open(dir.path()).unwrap();
            store.create_tenant("alice", &key(1), &TenantSettings::default()).unwrap();
            store.create_namespace(&namespace("disk")).unwrap();
            store.create_crypto_key(3, &KeyMaterial([7; KEY_LEN])).unwrap();
        }
        let path = dir.path().join(METADATA_FILE);
        let good = std::fs::read(&path).unwrap();
        let overwritten = |from: usize| {
            let mut bytes = good.clone();
            bytes[from..].fill(0xde);
            bytes
        };
        let mut panicked_somewhere = false;
        for (what, bytes) in [
            ("cut to 512 bytes", good[..512].to_vec()),
            ("cut in half", good[..good.len() / 2].to_vec()),
            ("pages overwritten from 4096", overwritten(4096)),
            ("pages overwritten from 8192", overwritten(8192)),
        ] {
            std::fs::write(&path, &bytes).unwrap();
            let reads: [(&str, Result<(), MetadataError>); 5] = [
                ("load", MetadataStore::load(dir.path()).map(drop)),
                ("read_tenants", read_tenants(dir.path()).map(drop)),
                ("read_crypto_key_slots", MetadataStore::read_crypto_key_slots(dir.path()).map(drop)),
                ("load_crypto_keys", MetadataStore::load_crypto_keys(dir.path()).map(drop)),
                ("open", MetadataStore::open(dir.path()).map(drop)),
            ];
            for (read, result) in reads {
                if let Err(error) = result {
                    let message = error.to_string();
                    assert!(message.contains(&path.display().to_string()), "{what}, {read}: {message}");
                    panicked_somewhere |= message.contains("damaged");
                }
            }
        }
        assert!(panicked_somewhere, "no case made redb panic: the cases no longer test the guard");
    }

    #[test]
    fn a_busy_store_is_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let held = MetadataStore::open(dir.path()).unwrap();
        held.create_tenant("alice", &key(1), &TenantSettings::default()).unwrap();
        // What redb 3 says while another holder has the file locked, which is what is waited on.
        assert!(matches!(Database::create(dir.path().join(METADATA_FILE)), Err(DatabaseError::DatabaseAlreadyOpen)));
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(held);
        });
        let started = Instant::now();
        let tenants = read_tenants(dir.path()).unwrap();
        assert!(started.elapsed() >= Duration::from_millis(250), "the read waited for the holder");
        assert_eq!(tenants.len(), 1);
        releaser.join().unwrap();
    }

    #[test]
    fn key_slots_are_created_rotated_and_deleted_durably() {
        let dir = tempfile::tempdir().unwrap();
        assert!(MetadataStore::load_crypto_keys(dir.path()).unwrap().is_empty(), "no store, no keys");
        {
            let store = MetadataStore::open(dir.path()).unwrap();
            assert_eq!(store.create_crypto_key(3, &KeyMaterial([1; KEY_LEN])).unwrap(), 1);
            let again = store.create_crypto_key(3, &KeyMaterial([2; KEY_LEN])).unwrap_err().to_string();
            assert!(again.contains("key slot named \"3\" already exists"), "{again}");
            assert_eq!(store.rotate_crypto_key(3, &KeyMaterial([2; KEY_LEN])).unwrap(), 2);
            assert!(store.rotate_crypto_key(4, &KeyMaterial([2; KEY_LEN])).is_err(), "nothing to rotate");
            assert_eq!(store.create_crypto_key(9, &KeyMaterial([9; KEY_LEN])).unwrap(), 1);
        }
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(dir.path().join(METADATA_FILE)).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600, "a store holding keys is private to its owner");
        let keys = MetadataStore::load_crypto_keys(dir.path()).unwrap();
        assert_eq!(
            keys,
            vec![
                (3, vec![(1, KeyMaterial([1; KEY_LEN])), (2, KeyMaterial([2; KEY_LEN]))]),
                (9, vec![(1, KeyMaterial([9; KEY_LEN]))])
            ]
        );
        assert!(!format!("{keys:?}").contains("1, 1, 1"), "Debug never shows key bytes");
        let store = MetadataStore::open(dir.path()).unwrap();
        assert_eq!(store.delete_crypto_key(3).unwrap(), (vec![1, 2], Vec::new()));
        assert!(store.delete_crypto_key(3).is_err());
        drop(store);
        // What `crypto-key list` shows, read read-only: versions, never keys.
        assert_eq!(MetadataStore::read_crypto_key_slots(dir.path()).unwrap(), vec![(9, vec![1])]);
    }
}
