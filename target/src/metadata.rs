//! The metadata store: regions and namespaces created by `netdam-target region|namespace
//! create`, kept in an embedded ACID database (redb) in the data directory. Every change is
//! committed durably (fsync'd) before the command returns.
//!
//! The target reads the store once at start-up and closes it, so admin commands can change it
//! while a target runs; they tell the user to restart the target to serve the change. Entries
//! are stored as JSON of the same structs the TOML file uses, so both describe a space alike.

use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, TableError};

use crate::config::{NamespaceConfig, RegionConfig};

const REGIONS: TableDefinition<&str, &str> = TableDefinition::new("regions");
const NAMESPACES: TableDefinition<&str, &str> = TableDefinition::new("namespaces");

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
}
