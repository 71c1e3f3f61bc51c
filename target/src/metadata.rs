//! The metadata store: regions and namespaces created by `netdam-target region|namespace
//! create`, kept in an embedded ACID database (redb) in the data directory. Every change is
//! committed durably (fsync'd) before the command returns.
//!
//! The target reads the store once at start-up and closes it, so admin commands can change it
//! while a target runs; they tell the user to restart the target to serve the change. Entries
//! are stored as JSON of the same structs the TOML file uses, so both describe a space alike.

use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, TableError};

use netdam_isa::crypto::KEY_LEN;

use crate::config::{NamespaceConfig, RegionConfig};

const REGIONS: TableDefinition<&str, &str> = TableDefinition::new("regions");
const NAMESPACES: TableDefinition<&str, &str> = TableDefinition::new("namespaces");
/// Key slots of ENCRYPT and DECRYPT: slot number to its key versions, each 4 bytes of version
/// (little-endian) then 32 bytes of AES-256 key, in increasing version order.
const CRYPTO_KEYS: TableDefinition<u32, &[u8]> = TableDefinition::new("crypto_keys");
/// Bytes of one stored key version.
const KEY_ENTRY_LEN: usize = 4 + KEY_LEN;

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
}

/// Regions and namespaces kept in the store.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stored {
    /// Regions, by name.
    pub regions: Vec<RegionConfig>,
    /// Namespaces, by name.
    pub namespaces: Vec<NamespaceConfig>,
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
    /// Opens (creating where missing) the store in `data_dir`.
    pub fn open(data_dir: &Path) -> Result<MetadataStore, MetadataError> {
        let path = data_dir.join(METADATA_FILE);
        let db = Database::create(&path).map_err(|error| store_error(&path, error))?;
        Ok(MetadataStore { db, path })
    }

    /// Reads what `data_dir`'s store holds; an absent store holds nothing.
    pub fn load(data_dir: &Path) -> Result<Stored, MetadataError> {
        if !data_dir.join(METADATA_FILE).exists() {
            return Ok(Stored::default());
        }
        let store = MetadataStore::open(data_dir)?;
        Ok(Stored { regions: store.list(REGIONS)?, namespaces: store.list(NAMESPACES)? })
    }

    /// Where the store lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stored regions.
    pub fn regions(&self) -> Result<Vec<RegionConfig>, MetadataError> {
        self.list(REGIONS)
    }

    /// Stored namespaces.
    pub fn namespaces(&self) -> Result<Vec<NamespaceConfig>, MetadataError> {
        self.list(NAMESPACES)
    }

    /// Adds a region, durably; refuses a name already stored.
    pub fn create_region(&self, region: &RegionConfig) -> Result<(), MetadataError> {
        self.insert(REGIONS, "region", &region.name, region)
    }

    /// Adds a namespace, durably; refuses a name already stored.
    pub fn create_namespace(&self, namespace: &NamespaceConfig) -> Result<(), MetadataError> {
        self.insert(NAMESPACES, "namespace", &namespace.name, namespace)
    }

    /// Removes a region, durably, and returns what it was.
    pub fn delete_region(&self, name: &str) -> Result<RegionConfig, MetadataError> {
        self.remove(REGIONS, "region", name)
    }

    /// Removes a namespace, durably, and returns what it was.
    pub fn delete_namespace(&self, name: &str) -> Result<NamespaceConfig, MetadataError> {
        self.remove(NAMESPACES, "namespace", name)
    }

    /// Stores version 1 of key slot `slot`, durably; refuses a slot that holds a key.
    pub fn create_key(&self, slot: u32, key: &KeyMaterial) -> Result<u32, MetadataError> {
        self.change_key(slot, |versions| {
            if !versions.is_empty() {
                return Err(MetadataError::Exists {
                    kind: "key slot",
                    name: slot.to_string(),
                    where_: " (rotate it, or delete it first)",
                });
            }
            versions.push((1, key.clone()));
            Ok(1)
        })
    }

    /// Adds the next version of key slot `slot`, durably; the older versions stay, so what they
    /// sealed still opens. Returns the new version.
    pub fn rotate_key(&self, slot: u32, key: &KeyMaterial) -> Result<u32, MetadataError> {
        let path = self.path.clone();
        self.change_key(slot, |versions| {
            let Some((last, _)) = versions.last() else {
                return Err(MetadataError::Missing { kind: "key slot", name: slot.to_string(), path });
            };
            let version = last.checked_add(1).ok_or_else(|| MetadataError::Store {
                path: path.clone(),
                message: format!("key slot {slot} has used every version number"),
            })?;
            versions.push((version, key.clone()));
            Ok(version)
        })
    }

    /// Removes key slot `slot` and every version of its key, durably; returns the versions.
    pub fn delete_key(&self, slot: u32) -> Result<Vec<u32>, MetadataError> {
        let path = self.path.clone();
        self.change_key(slot, |versions| {
            if versions.is_empty() {
                return Err(MetadataError::Missing { kind: "key slot", name: slot.to_string(), path });
            }
            Ok(std::mem::take(versions).into_iter().map(|(version, _)| version).collect())
        })
    }

    /// Every key slot with the versions of its key (never the keys).
    pub fn key_slots(&self) -> Result<Vec<(u32, Vec<u32>)>, MetadataError> {
        Ok(self
            .keys()?
            .into_iter()
            .map(|(slot, versions)| (slot, versions.into_iter().map(|(v, _)| v).collect()))
            .collect())
    }

    /// Every key slot with its key versions: what a target loads at start.
    pub fn keys(&self) -> Result<Vec<StoredKeySlot>, MetadataError> {
        let fail = |error: redb::Error| store_error(&self.path, error);
        let read = self.db.begin_read().map_err(|error| fail(error.into()))?;
        let table = match read.open_table(CRYPTO_KEYS) {
            Ok(table) => table,
            Err(TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(error) => return Err(fail(error.into())),
        };
        let mut slots = Vec::new();
        for entry in table.iter().map_err(|error| fail(error.into()))? {
            let (slot, bytes) = entry.map_err(|error| fail(error.into()))?;
            slots.push((slot.value(), self.decode_versions(slot.value(), bytes.value())?));
        }
        Ok(slots)
    }

    /// Reads `data_dir`'s key slots; an absent store holds none.
    pub fn load_keys(data_dir: &Path) -> Result<Vec<StoredKeySlot>, MetadataError> {
        if !data_dir.join(METADATA_FILE).exists() {
            return Ok(Vec::new());
        }
        MetadataStore::open(data_dir)?.keys()
    }

    fn decode_versions(&self, slot: u32, bytes: &[u8]) -> Result<Vec<(u32, KeyMaterial)>, MetadataError> {
        if !bytes.len().is_multiple_of(KEY_ENTRY_LEN) {
            return Err(MetadataError::Store {
                path: self.path.clone(),
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

    /// Reads slot `slot`'s versions, lets `change` edit them, and commits the result durably
    /// (an empty list removes the slot) unless `change` refuses.
    fn change_key<T>(
        &self,
        slot: u32,
        change: impl FnOnce(&mut Vec<(u32, KeyMaterial)>) -> Result<T, MetadataError>,
    ) -> Result<T, MetadataError> {
        let fail = |error: redb::Error| store_error(&self.path, error);
        let write = self.db.begin_write().map_err(|error| fail(error.into()))?;
        let result = {
            let mut table = write.open_table(CRYPTO_KEYS).map_err(|error| fail(error.into()))?;
            let stored = table.get(slot).map_err(|error| fail(error.into()))?.map(|bytes| bytes.value().to_vec());
            let mut versions = match stored {
                Some(bytes) => self.decode_versions(slot, &bytes)?,
                None => Vec::new(),
            };
            let result = change(&mut versions)?;
            if versions.is_empty() {
                table.remove(slot).map_err(|error| fail(error.into()))?;
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
        // The store now holds keys: only its owner may read it.
        restrict_to_owner(&self.path)?;
        // redb's default durability fsyncs the commit before returning.
        write.commit().map_err(|error| fail(error.into()))?;
        Ok(result)
    }

    fn list<T: serde::de::DeserializeOwned>(
        &self,
        table: TableDefinition<&str, &str>,
    ) -> Result<Vec<T>, MetadataError> {
        let fail = |error: redb::Error| store_error(&self.path, error);
        let read = self.db.begin_read().map_err(|error| fail(error.into()))?;
        let table = match read.open_table(table) {
            Ok(table) => table,
            Err(TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(error) => return Err(fail(error.into())),
        };
        let mut entries = Vec::new();
        for entry in table.iter().map_err(|error| fail(error.into()))? {
            let (name, json) = entry.map_err(|error| fail(error.into()))?;
            let value = serde_json::from_str(json.value()).map_err(|error| MetadataError::Store {
                path: self.path.clone(),
                message: format!("entry {:?} is unreadable: {error}", name.value()),
            })?;
            entries.push(value);
        }
        Ok(entries)
    }

    fn insert<T: serde::Serialize>(
        &self,
        table: TableDefinition<&str, &str>,
        kind: &'static str,
        name: &str,
        value: &T,
    ) -> Result<(), MetadataError> {
        let fail = |error: redb::Error| store_error(&self.path, error);
        let json = serde_json::to_string(value).expect("settings always serialize");
        let write = self.db.begin_write().map_err(|error| fail(error.into()))?;
        {
            let mut table = write.open_table(table).map_err(|error| fail(error.into()))?;
            if table.get(name).map_err(|error| fail(error.into()))?.is_some() {
                return Err(MetadataError::Exists { kind, name: name.to_string(), where_: " in the metadata store" });
            }
            table.insert(name, json.as_str()).map_err(|error| fail(error.into()))?;
        }
        // redb's default durability fsyncs the commit before returning.
        write.commit().map_err(|error| fail(error.into()))
    }

    fn remove<T: serde::de::DeserializeOwned>(
        &self,
        table: TableDefinition<&str, &str>,
        kind: &'static str,
        name: &str,
    ) -> Result<T, MetadataError> {
        let fail = |error: redb::Error| store_error(&self.path, error);
        let write = self.db.begin_write().map_err(|error| fail(error.into()))?;
        let removed = {
            let mut table = write.open_table(table).map_err(|error| fail(error.into()))?;
            let removed = table.remove(name).map_err(|error| fail(error.into()))?;
            removed.map(|json| json.value().to_string())
        };
        let Some(json) = removed else {
            return Err(MetadataError::Missing { kind, name: name.to_string(), path: self.path.clone() });
        };
        write.commit().map_err(|error| fail(error.into()))?;
        serde_json::from_str(&json)
            .map_err(|error| MetadataError::Store { path: self.path.clone(), message: error.to_string() })
    }
}

/// Makes the store file readable and writable by its owner only (it holds the crypto keys).
fn restrict_to_owner(path: &Path) -> Result<(), MetadataError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|error| MetadataError::Store {
        path: path.to_path_buf(),
        message: format!("cannot make it private to its owner: {error}"),
    })
}

fn store_error(path: &Path, error: impl Into<redb::Error>) -> MetadataError {
    let error: redb::Error = error.into();
    let message = match &error {
        redb::Error::DatabaseAlreadyOpen => {
            "another process has it open (an admin command running at the same time?); try again".to_string()
        }
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
        assert_eq!(store.delete_namespace("disk").unwrap(), namespace);
        let missing = store.delete_namespace("disk").unwrap_err().to_string();
        assert!(missing.contains("no namespace named \"disk\""), "{missing}");
        assert_eq!(store.namespaces().unwrap(), vec![]);
        assert_eq!(store.regions().unwrap(), vec![region]);
    }

    #[test]
    fn key_slots_are_created_rotated_and_deleted_durably() {
        let dir = tempfile::tempdir().unwrap();
        assert!(MetadataStore::load_keys(dir.path()).unwrap().is_empty(), "no store, no keys");
        {
            let store = MetadataStore::open(dir.path()).unwrap();
            assert_eq!(store.create_key(3, &KeyMaterial([1; KEY_LEN])).unwrap(), 1);
            let again = store.create_key(3, &KeyMaterial([2; KEY_LEN])).unwrap_err().to_string();
            assert!(again.contains("key slot named \"3\" already exists"), "{again}");
            assert_eq!(store.rotate_key(3, &KeyMaterial([2; KEY_LEN])).unwrap(), 2);
            assert!(store.rotate_key(4, &KeyMaterial([2; KEY_LEN])).is_err(), "nothing to rotate");
            assert_eq!(store.create_key(9, &KeyMaterial([9; KEY_LEN])).unwrap(), 1);
        }
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(dir.path().join(METADATA_FILE)).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600, "a store holding keys is private to its owner");
        let keys = MetadataStore::load_keys(dir.path()).unwrap();
        assert_eq!(
            keys,
            vec![
                (3, vec![(1, KeyMaterial([1; KEY_LEN])), (2, KeyMaterial([2; KEY_LEN]))]),
                (9, vec![(1, KeyMaterial([9; KEY_LEN]))])
            ]
        );
        assert!(!format!("{keys:?}").contains("1, 1, 1"), "Debug never shows key bytes");
        let store = MetadataStore::open(dir.path()).unwrap();
        assert_eq!(store.delete_key(3).unwrap(), vec![1, 2]);
        assert!(store.delete_key(3).is_err());
        assert_eq!(store.key_slots().unwrap(), vec![(9, vec![1])]);
    }
}
