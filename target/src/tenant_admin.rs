//! What `netdam-target tenant …`, `grant` and `revoke` do besides changing the store: key files
//! (written owner-only into `<data_dir>/tenants/` unless a path is given), imported keys, the
//! `default` tenant a secure-by-default target starts with, and the command-line spelling of
//! spaces, permissions and ranges.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use netdam_auth::keyfile::{InstallError, StagedKeyFile};
use netdam_auth::{KeyFile, KeyFileError, TenantKey};

use crate::metadata::{normalize_permissions, MetadataError, MetadataStore, TenantSettings};
use crate::tenants::{GrantRecord, GrantSpace, TenantRecord};

/// Directory under the data directory holding the key files the target writes.
pub const TENANTS_DIR: &str = "tenants";

/// Name of the tenant a secure-by-default target creates when the store holds none.
pub const DEFAULT_TENANT: &str = "default";

/// Why a tenant command failed.
#[derive(Debug, thiserror::Error)]
pub enum TenantAdminError {
    /// The store refused or failed.
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    /// A key file could not be read or written.
    #[error(transparent)]
    KeyFile(#[from] KeyFileError),
    /// The store committed a new key, but its key file could not be put in place: the key is
    /// in force and only in the temporary file, which is kept.
    #[error(
        "the metadata store holds tenant {tenant:?}'s new key (version {version}), but it could not be put in \
         place as {path}: {source}. The new key is in {temporary}: hand that file to the tenant's initiators, \
         moved where they read it ({path}, unless that path holds another file)"
    )]
    KeyFileNotInstalled { tenant: String, version: u32, path: PathBuf, temporary: PathBuf, source: std::io::Error },
    /// A directory could not be made.
    #[error("cannot create {path}: {source}")]
    Directory { path: PathBuf, source: std::io::Error },
    /// An imported key is neither a key file nor 64 hex digits.
    #[error("{path}: neither a netdam key file nor 64 hex digits ({message})")]
    Import { path: PathBuf, message: String },
    /// An imported key's bytes are all the same: anyone would guess it.
    #[error(
        "{path}: the key's {} bytes are all {byte:#04x}, a key anyone could guess; import one of random bytes \
         (`head -c 32 /dev/urandom | xxd -p -c 64`), or create the tenant without --import-key for a new one",
        netdam_auth::KEY_BYTES
    )]
    WeakKey { path: PathBuf, byte: u8 },
}

/// Where tenant `name`'s key file goes unless a path is given: `<data_dir>/tenants/<name>.key`.
pub fn default_key_file(data_dir: &Path, name: &str) -> PathBuf {
    data_dir.join(TENANTS_DIR).join(format!("{name}.key"))
}

/// Creates the directory a key file goes into: owner-only (0700) when it is new.
fn create_key_directory(key_file: &Path) -> Result<(), TenantAdminError> {
    let Some(directory) = key_file.parent().filter(|parent| !parent.as_os_str().is_empty()) else {
        return Ok(());
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(directory)
        .map_err(|source| TenantAdminError::Directory { path: directory.to_path_buf(), source })
}

fn key_file_of(record: &TenantRecord, key: &TenantKey) -> KeyFile {
    KeyFile { tenant: record.name.clone(), id: record.id, version: record.key_version, key: *key }
}

/// Runs `store_step`, a change of the store that calls the `stage` it is given with the new key
/// file before its commit, and puts that file in place at `key_file` only once the step has
/// committed. A key file written before the commit would outlive a failed commit (a full file
/// system): the tenant would hold a file the store does not know, or, rotating, lose its old
/// key. A failed step drops the staged temporary, leaving any old key file as it was. The
/// caller keeps the store open until this returns; as the store admits one process at a time,
/// no other change stages over the temporary before it is installed.
fn commit_then_install<T>(
    key_file: &Path,
    replace: bool,
    store_step: impl FnOnce(&mut dyn FnMut(KeyFile) -> Result<(), String>) -> Result<T, MetadataError>,
) -> Result<T, TenantAdminError> {
    let mut staged: Option<(StagedKeyFile, KeyFile)> = None;
    let committed = store_step(&mut |file| {
        let temporary = file.stage(key_file, replace).map_err(|error| error.to_string())?;
        staged = Some((temporary, file));
        Ok(())
    })?;
    let Some((staged, file)) = staged else {
        unreachable!("the store step commits only after staging the key file");
    };
    staged.install().map_err(|error| match error {
        // The store holds the new key now, so the temporary is the only copy an initiator
        // can use: keep it and say where it is.
        InstallError::NotMoved { staged, source } => TenantAdminError::KeyFileNotInstalled {
            tenant: file.tenant,
            version: file.version,
            path: key_file.to_path_buf(),
            temporary: staged.keep(),
            source,
        },
        InstallError::NotSynced(error) => error.into(),
    })?;
    Ok(committed)
}

/// Creates tenant `name` with `key` (a new one when `None`) and `settings`, and writes its key
/// file to `key_file` (default: [`default_key_file`]), which must not exist. The key file is
/// staged beside its path before the tenant is committed and put in place after: a failure
/// leaves neither tenant nor file. Returns the record and the key file's path.
pub fn create_tenant(
    data_dir: &Path,
    name: &str,
    key: Option<TenantKey>,
    settings: &TenantSettings,
    key_file: Option<PathBuf>,
) -> Result<(TenantRecord, PathBuf), TenantAdminError> {
    create_with_grants(data_dir, name, key, settings, &[], key_file, false)
}

fn create_with_grants(
    data_dir: &Path,
    name: &str,
    key: Option<TenantKey>,
    settings: &TenantSettings,
    grants: &[GrantRecord],
    key_file: Option<PathBuf>,
    replace_key_file: bool,
) -> Result<(TenantRecord, PathBuf), TenantAdminError> {
    crate::metadata::check_tenant_name(name)?;
    let key = match key {
        Some(key) => key,
        None => TenantKey::generate().map_err(|error| MetadataError::Refused(format!("cannot draw a key: {error}")))?,
    };
    let key_file = key_file.unwrap_or_else(|| default_key_file(data_dir, name));
    let store = MetadataStore::open(data_dir)?;
    // The name first: a taken name is the likelier mistake, and its key file exists too.
    if store.tenants()?.iter().any(|tenant| tenant.name == name) {
        return Err(
            MetadataError::Exists { kind: "tenant", name: name.to_string(), where_: " in the metadata store" }.into()
        );
    }
    if !replace_key_file && key_file.exists() {
        return Err(KeyFileError::Exists { path: key_file }.into());
    }
    create_key_directory(&key_file)?;
    let record = commit_then_install(&key_file, replace_key_file, |stage| {
        store.create_tenant_with(name, &key, settings, grants, |record| stage(key_file_of(record, &key)))
    })?;
    Ok((record, key_file))
}

/// Gives tenant `name` a new key and writes it to `key_file` (default: [`default_key_file`]),
/// replacing that file. The new file is staged beside it before the new key is committed and
/// replaces it only after, so a failure leaves the old key and its file in force. Returns the
/// record and the key file's path.
pub fn rotate_key(
    data_dir: &Path,
    name: &str,
    key_file: Option<PathBuf>,
) -> Result<(TenantRecord, PathBuf), TenantAdminError> {
    let key_file = key_file.unwrap_or_else(|| default_key_file(data_dir, name));
    create_key_directory(&key_file)?;
    let store = MetadataStore::open(data_dir)?;
    let (record, _) = commit_then_install(&key_file, true, |stage| {
        store.rotate_key_with(name, |record| {
            let key = TenantKey::from_hex(&record.key_hex).map_err(|error| error.to_string())?;
            stage(key_file_of(record, &key))
        })
    })?;
    Ok((record, key_file))
}

/// What [`delete_tenant`] did.
#[derive(Debug)]
pub struct DeletedTenant {
    /// The tenant as it was.
    pub record: TenantRecord,
    /// Its key file, removed from the default place.
    pub key_file_removed: Option<PathBuf>,
    /// Whether it was the last tenant: no initiator can open a session until one is created,
    /// and a target does not create the default tenant for this store.
    pub was_last: bool,
}

/// Deletes tenant `name`, and its key file at the default place when that file holds the
/// deleted tenant's key (a key file elsewhere is the user's to remove).
pub fn delete_tenant(data_dir: &Path, name: &str) -> Result<DeletedTenant, TenantAdminError> {
    let store = MetadataStore::open(data_dir)?;
    let record = store.delete_tenant(name)?;
    let was_last = store.tenants()?.is_empty();
    drop(store);
    let key_file = default_key_file(data_dir, name);
    let holds_its_key = KeyFile::load(&key_file).is_ok_and(|file| {
        file.id == record.id && TenantKey::from_hex(&record.key_hex).is_ok_and(|key| key == file.key)
    });
    let key_file_removed = (holds_its_key && std::fs::remove_file(&key_file).is_ok()).then_some(key_file);
    Ok(DeletedTenant { record, key_file_removed, was_last })
}

/// Reads a key to import: a netdam key file, or a file holding 64 hex digits. Like a key file,
/// it must be owner-only. A key of one byte repeated (all zeros, all 0xff) is refused: it is
/// what a placeholder or a mistake gives, never a random key.
pub fn import_key(path: &Path) -> Result<TenantKey, TenantAdminError> {
    let io = |source| KeyFileError::Io { path: path.to_path_buf(), source };
    netdam_auth::keyfile::check_owner_only(path)?;
    let text = std::fs::read_to_string(path).map_err(io)?;
    let key = match TenantKey::from_hex(&text) {
        Ok(key) => key,
        Err(_) => KeyFile::parse(&text, path)
            .map(|file| file.key)
            .map_err(|error| TenantAdminError::Import { path: path.to_path_buf(), message: error.to_string() })?,
    };
    let [first, rest @ ..] = key.as_bytes();
    if rest.iter().all(|byte| byte == first) {
        return Err(TenantAdminError::WeakKey { path: path.to_path_buf(), byte: *first });
    }
    Ok(key)
}

/// For a target that authenticates tenants: when the store of `data_dir` has never held a
/// tenant, creates tenant [`DEFAULT_TENANT`] holding every permission on every space (`grant
/// default all all`) and its key file at `<data_dir>/tenants/default.key`, and returns that
/// path. A data directory whose store is gone while key files it made remain is refused
/// (`MetadataStore::open`): a lost store is not a new start. Returns `None` when the store
/// holds a tenant (or one was created meanwhile by another process), and when `tenant delete`
/// removed its last one: an administrator who emptied the store meant to let no one in, and a
/// restart must not re-open the target to a new key with every permission.
pub fn ensure_default_tenant(data_dir: &Path) -> Result<Option<PathBuf>, TenantAdminError> {
    let (held, emptied) = {
        let store = MetadataStore::open(data_dir)?;
        (store.tenants()?.len(), store.tenants_emptied()?)
    };
    if held > 0 || emptied {
        return Ok(None);
    }
    let everything = GrantRecord { space: GrantSpace::All, permissions: vec!["all".into()], range: None };
    let settings = TenantSettings::default();
    match create_with_grants(data_dir, DEFAULT_TENANT, None, &settings, &[everything], None, true) {
        Ok((_, key_file)) => Ok(Some(key_file)),
        Err(TenantAdminError::Metadata(MetadataError::Exists { .. })) => Ok(None),
        Err(error) => Err(error),
    }
}

/// What a grant held on a namespace lacks to be of use, if anything: block instructions need
/// `block` together with `read` (BREAD, BLOCK_STATUS) or `write` (BWRITE, TRIM, WRITE_ZEROES),
/// so `block` alone allows FLUSH only, and `read` or `write` without `block` nothing
/// (PROTOCOL.md, Grants). Not refused: a grant may be built up in steps.
pub fn grant_advice(tenant: &str, held: &GrantRecord) -> Option<String> {
    let GrantSpace::Namespace(_) = &held.space else {
        return None;
    };
    let has = |name: &str| held.permissions.iter().any(|held| held == name);
    let space = crate::metadata::space_text(&held.space);
    let fix = format!("netdam-target grant {tenant} {space} block,read,write");
    if has("block") && !has("read") && !has("write") {
        Some(format!(
            "on a namespace, block alone allows only FLUSH: BREAD and BLOCK_STATUS need block and read, BWRITE, \
             TRIM and WRITE_ZEROES block and write (e.g.  {fix})"
        ))
    } else if !has("block") && (has("read") || has("write")) {
        Some(format!("on a namespace, read and write count only together with block (e.g.  {fix})"))
    } else {
        None
    }
}

/// Advice on a namespace grant's byte range that does not fall on `block_bytes` boundaries: a
/// block transfer must lie wholly inside the range, so a range within one block allows none,
/// and the ends of an unaligned one allow nothing.
pub fn range_advice(namespace: &str, (offset, len): (u64, u64), block_bytes: u64) -> Option<String> {
    if block_bytes == 0 || (offset.is_multiple_of(block_bytes) && len.is_multiple_of(block_bytes)) {
        return None;
    }
    let first = offset.div_ceil(block_bytes);
    let end = offset.saturating_add(len) / block_bytes;
    let blocks = if end > first {
        format!("only blocks {first}..{end} lie wholly inside it, and only they can be read or written")
    } else {
        "no whole block lies inside it, so it allows no block transfer at all".to_string()
    };
    Some(format!(
        "the range {offset}:{len} is not on namespace {namespace:?}'s {block_bytes}-byte block boundaries: {blocks} \
         (give an offset and length that are multiples of {block_bytes})"
    ))
}

/// A space as the command line names it: `region:NAME`, `namespace:NAME`, `key:SLOT` (a key
/// slot of ENCRYPT and DECRYPT, 0 to 255) or `all`.
pub fn parse_space(text: &str) -> Result<GrantSpace, String> {
    let bad = || format!("space {text:?}: write region:NAME, namespace:NAME, key:SLOT or all");
    match text.split_once(':') {
        None if text == "all" => Ok(GrantSpace::All),
        Some(("region", name)) if !name.is_empty() => Ok(GrantSpace::Region(name.to_string())),
        Some(("namespace", name)) if !name.is_empty() => Ok(GrantSpace::Namespace(name.to_string())),
        Some(("key", slot)) => {
            parse_key_slot(slot).map(GrantSpace::KeySlot).map_err(|error| format!("space {text:?}: {error}"))
        }
        _ => Err(bad()),
    }
}

/// A key slot number, 0 to 255, as `crypto-key` and `grant key:SLOT` take it.
pub fn parse_key_slot(text: &str) -> Result<u32, String> {
    let last = netdam_isa::limits::CRYPTO_KEY_SLOTS - 1;
    let slot: u32 = text.parse().map_err(|_| format!("{text:?} is not a slot number (slots run from 0 to {last})"))?;
    if slot > last {
        return Err(format!("slot {slot} is beyond the last slot, {last} (slots run from 0 to {last})"));
    }
    Ok(slot)
}

/// A comma list of permission names (`read,write` or `all`), in stored form.
pub fn parse_permission_list(text: &str) -> Result<Vec<String>, String> {
    let names: Vec<String> = text.split(',').map(|name| name.trim().to_string()).collect();
    normalize_permissions(&names).map_err(|error| error.to_string())
}

/// A byte range `OFFSET:LEN`, each a size as elsewhere (`4096`, `0x1000`, `64KiB`); the length
/// above 0 and the end within 64 bits.
pub fn parse_range(text: &str) -> Result<(u64, u64), String> {
    let bad = |why: String| format!("range {text:?}: {why} (write OFFSET:LEN, e.g. 0:64KiB)");
    let (offset, len) = text.split_once(':').ok_or_else(|| bad("no colon".into()))?;
    let offset = netdam_isa::units::parse_bytes(offset).map_err(bad)?;
    let len = netdam_isa::units::parse_bytes(len).map_err(bad)?;
    if len == 0 {
        return Err(bad("the length is 0".into()));
    }
    if offset.checked_add(len).is_none() {
        return Err(bad("it ends past 2^64".into()));
    }
    Ok((offset, len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_namespace_range_off_block_boundaries_is_explained() {
        assert_eq!(range_advice("disk", (0, 8192), 4096), None);
        let none = range_advice("disk", (0, 1000), 4096).unwrap();
        assert!(none.contains("no whole block") && none.contains("4096-byte"), "{none}");
        let some = range_advice("disk", (100, 3 * 4096), 4096).unwrap();
        assert!(some.contains("only blocks 1..3"), "{some}");
    }

    #[test]
    fn command_line_spellings_parse_and_bad_ones_name_the_culprit() {
        assert_eq!(parse_space("all"), Ok(GrantSpace::All));
        assert_eq!(parse_space("region:scratch"), Ok(GrantSpace::Region("scratch".into())));
        assert_eq!(parse_space("namespace:disk"), Ok(GrantSpace::Namespace("disk".into())));
        assert_eq!(parse_space("key:0"), Ok(GrantSpace::KeySlot(0)));
        assert_eq!(parse_space("key:255"), Ok(GrantSpace::KeySlot(255)));
        for bad in ["region:", "disk", "volume:x", "all:x", "key:", "key:256", "key:-1", "key:one"] {
            assert!(parse_space(bad).unwrap_err().contains(&format!("{bad:?}")), "{bad}");
        }
        assert!(parse_space("key:256").unwrap_err().contains("from 0 to 255"));
        assert_eq!(parse_permission_list("write, read").unwrap(), ["read", "write"]);
        assert_eq!(parse_permission_list("all").unwrap().len(), 8);
        let unknown = parse_permission_list("read,wirte").unwrap_err();
        assert!(unknown.contains("\"wirte\""), "{unknown}");
        assert_eq!(parse_range("4KiB:0x1000"), Ok((4096, 4096)));
        assert!(parse_range("4096").unwrap_err().contains("no colon"));
        assert!(parse_range("0:0").unwrap_err().contains("length is 0"));
        assert!(parse_range("0xffffffffffffffff:2").unwrap_err().contains("past 2^64"));
        assert!(parse_range("x:1").unwrap_err().contains("\"x\""));
    }

    #[test]
    fn the_default_tenant_is_made_once_with_everything_granted() {
        let dir = tempfile::tempdir().unwrap();
        let key_file = ensure_default_tenant(dir.path()).unwrap().expect("an empty store gets a default tenant");
        assert_eq!(key_file, dir.path().join("tenants/default.key"));
        assert_eq!(std::fs::metadata(dir.path().join("tenants")).unwrap().permissions().mode() & 0o777, 0o700);
        let file = KeyFile::load(&key_file).unwrap();
        let stored = MetadataStore::open(dir.path()).unwrap().tenant(DEFAULT_TENANT).unwrap();
        assert_eq!((file.tenant.as_str(), file.id, file.version), (DEFAULT_TENANT, stored.id, 1));
        assert_eq!(file.key.to_hex(), stored.key_hex);
        assert_eq!(stored.grants.len(), 1);
        assert_eq!(stored.grants[0].space, GrantSpace::All);
        assert_eq!(stored.grants[0].permissions, crate::metadata::PERMISSION_NAMES);
        assert_eq!(ensure_default_tenant(dir.path()).unwrap(), None, "a store with a tenant is left alone");
        assert_eq!(KeyFile::load(&key_file).unwrap(), file, "and its key file too");
    }

    #[test]
    fn a_store_whose_tenants_were_deleted_gets_no_default_tenant() {
        let dir = tempfile::tempdir().unwrap();
        let key_file = ensure_default_tenant(dir.path()).unwrap().unwrap();
        let deleted = delete_tenant(dir.path(), DEFAULT_TENANT).unwrap();
        assert!(deleted.was_last);
        assert_eq!(deleted.key_file_removed, Some(key_file.clone()));
        assert_eq!(ensure_default_tenant(dir.path()).unwrap(), None, "emptied on purpose: it stays closed");
        assert!(MetadataStore::open(dir.path()).unwrap().tenants().unwrap().is_empty());
        assert!(!key_file.exists());
    }

    #[test]
    fn a_namespace_grant_that_allows_no_block_transfer_is_explained() {
        let grant = |space: GrantSpace, permissions: &[&str]| GrantRecord {
            space,
            permissions: permissions.iter().map(|name| name.to_string()).collect(),
            range: None,
        };
        let disk = || GrantSpace::Namespace("disk".into());
        let advice = grant_advice("alice", &grant(disk(), &["block"])).unwrap();
        assert!(advice.contains("only FLUSH") && advice.contains("grant alice namespace:disk block,read,write"));
        let advice = grant_advice("alice", &grant(disk(), &["read", "write"])).unwrap();
        assert!(advice.contains("only together with block"), "{advice}");
        assert_eq!(grant_advice("alice", &grant(disk(), &["read", "block"])), None);
        assert_eq!(grant_advice("alice", &grant(GrantSpace::Region("r".into()), &["read"])), None);
        assert_eq!(grant_advice("alice", &grant(GrantSpace::All, &["block"])), None);
    }

    /// A store deleted beside the key file it made is a lost store, not a new start: no new
    /// default tenant is made over the old key file (that gave whoever started the target a
    /// new key with every permission, and lost the crypto keys without a word).
    #[test]
    fn a_default_key_file_left_from_a_lost_store_is_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let key_file = ensure_default_tenant(dir.path()).unwrap().unwrap();
        let old = std::fs::read(&key_file).unwrap();
        std::fs::remove_file(dir.path().join(crate::metadata::METADATA_FILE)).unwrap();
        let error = ensure_default_tenant(dir.path()).unwrap_err().to_string();
        assert!(error.contains("the file is missing") && error.contains("default.key"), "{error}");
        assert_eq!(std::fs::read(&key_file).unwrap(), old);
        assert!(!dir.path().join(crate::metadata::METADATA_FILE).exists(), "no new store");
    }

    #[test]
    fn a_key_file_that_cannot_be_written_leaves_no_tenant() {
        let dir = tempfile::tempdir().unwrap();
        let taken = dir.path().join("taken.key");
        std::fs::write(&taken, "someone else's").unwrap();
        let error = create_tenant(dir.path(), "alice", None, &TenantSettings::default(), Some(taken.clone()));
        assert!(matches!(error, Err(TenantAdminError::KeyFile(KeyFileError::Exists { .. }))), "{error:?}");
        // A directory where the key file's temporary goes fails the write inside the
        // transaction, which is then dropped: no tenant without its key file.
        std::fs::create_dir_all(dir.path().join(".alice.key.new/in-the-way")).unwrap();
        let error =
            create_tenant(dir.path(), "alice", None, &TenantSettings::default(), Some(dir.path().join("alice.key")))
                .unwrap_err();
        assert!(error.to_string().contains(".alice.key.new"), "{error}");
        assert!(MetadataStore::open(dir.path()).unwrap().tenants().unwrap().is_empty());
        assert!(!dir.path().join("alice.key").exists());
    }

    #[test]
    fn rotating_rewrites_the_key_file_and_deleting_removes_it() {
        let dir = tempfile::tempdir().unwrap();
        let (record, key_file) = create_tenant(dir.path(), "bob", None, &TenantSettings::default(), None).unwrap();
        let first = KeyFile::load(&key_file).unwrap();
        let (rotated, again) = rotate_key(dir.path(), "bob", None).unwrap();
        assert_eq!(again, key_file);
        let second = KeyFile::load(&key_file).unwrap();
        assert_eq!((second.version, rotated.key_version, second.id), (2, 2, record.id));
        assert_ne!(second.key, first.key);
        assert_eq!(second.key.to_hex(), rotated.key_hex);
        let deleted = delete_tenant(dir.path(), "bob").unwrap();
        assert_eq!(deleted.record.name, "bob");
        assert_eq!(deleted.key_file_removed, Some(key_file.clone()));
        assert!(deleted.was_last);
        assert!(!key_file.exists());
    }

    /// A store step as `create_tenant` or `rotate_key` runs it, whose commit fails after the
    /// key file was staged (as on a full file system): the real store's transaction is dropped.
    fn failing_commit(stage: &mut dyn FnMut(KeyFile) -> Result<(), String>, file: KeyFile) -> Result<(), String> {
        stage(file)?;
        Err("injected: no space left on device".into())
    }

    fn names_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|entry| entry.unwrap().file_name().to_string_lossy().into()).collect();
        names.sort();
        names
    }

    #[test]
    fn a_rotation_whose_commit_fails_leaves_the_old_key_file_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let (record, key_file) = create_tenant(dir.path(), "bob", None, &TenantSettings::default(), None).unwrap();
        let old_bytes = std::fs::read(&key_file).unwrap();
        let store = MetadataStore::open(dir.path()).unwrap();
        let error = commit_then_install(&key_file, true, |stage| {
            store.rotate_key_with("bob", |record| {
                failing_commit(stage, key_file_of(record, &TenantKey::from_hex(&record.key_hex).unwrap()))
            })
        })
        .unwrap_err();
        assert!(error.to_string().contains("no space left"), "{error}");
        assert_eq!(store.tenant("bob").unwrap().key_version, 1, "the store kept the old key");
        drop(store);
        assert_eq!(std::fs::read(&key_file).unwrap(), old_bytes, "and the key file too");
        assert_eq!(names_in(key_file.parent().unwrap()), ["bob.key"], "no temporary left behind");
        // The old key still works, and a later rotation goes through.
        let (rotated, _) = rotate_key(dir.path(), "bob", None).unwrap();
        assert_eq!((rotated.id, rotated.key_version), (record.id, 2));
        assert_eq!(KeyFile::load(&key_file).unwrap().key.to_hex(), rotated.key_hex);
    }

    #[test]
    fn a_create_whose_commit_fails_leaves_nothing_and_can_be_retried() {
        let dir = tempfile::tempdir().unwrap();
        let key_file = default_key_file(dir.path(), "t1");
        create_key_directory(&key_file).unwrap();
        let store = MetadataStore::open(dir.path()).unwrap();
        let key = TenantKey::generate().unwrap();
        let error = commit_then_install(&key_file, false, |stage| {
            store.create_tenant_with("t1", &key, &TenantSettings::default(), &[], |record| {
                failing_commit(stage, key_file_of(record, &key))
            })
        })
        .unwrap_err();
        assert!(error.to_string().contains("no space left"), "{error}");
        assert!(store.tenants().unwrap().is_empty());
        drop(store);
        assert!(names_in(key_file.parent().unwrap()).is_empty(), "neither key file nor temporary left behind");
        let (record, again) = create_tenant(dir.path(), "t1", None, &TenantSettings::default(), None)
            .expect("a create after a failed one is not refused for a key file left behind");
        assert_eq!(again, key_file);
        assert_eq!(KeyFile::load(&key_file).unwrap().key.to_hex(), record.key_hex);
        assert_eq!(names_in(key_file.parent().unwrap()), ["t1.key"]);
    }

    #[test]
    fn a_rotated_key_file_that_cannot_be_put_in_place_is_kept_and_named() {
        let dir = tempfile::tempdir().unwrap();
        create_tenant(dir.path(), "bob", None, &TenantSettings::default(), None).unwrap();
        // A non-empty directory at the key file's path: staging beside it works, the rename
        // after the commit fails.
        let in_the_way = dir.path().join("in-the-way.key");
        std::fs::create_dir_all(in_the_way.join("something")).unwrap();
        let error = rotate_key(dir.path(), "bob", Some(in_the_way.clone())).unwrap_err();
        let TenantAdminError::KeyFileNotInstalled { temporary, path, version, .. } = &error else {
            panic!("{error:?}");
        };
        assert_eq!((path, *version), (&in_the_way, 2));
        let kept_name = temporary.file_name().unwrap().to_string_lossy().into_owned();
        assert!(kept_name.starts_with("in-the-way.key.unplaced-"), "kept out of the temporary's place: {kept_name}");
        assert!(!dir.path().join(".in-the-way.key.new").exists());
        let message = error.to_string();
        assert!(message.contains("holds tenant \"bob\"'s new key (version 2)"), "{message}");
        assert!(message.contains(&format!("The new key is in {}", temporary.display())), "{message}");
        let kept = KeyFile::load(temporary).expect("the only copy of the key in force is kept, owner-only");
        let stored = MetadataStore::open(dir.path()).unwrap().tenant("bob").unwrap();
        assert_eq!((kept.version, kept.key.to_hex()), (stored.key_version, stored.key_hex));
        // A retry that fails the same way keeps its own copy and leaves the first one alone.
        let again = rotate_key(dir.path(), "bob", Some(in_the_way.clone())).unwrap_err();
        let TenantAdminError::KeyFileNotInstalled { temporary: second, .. } = &again else { panic!("{again:?}") };
        assert_ne!(second, temporary);
        assert_eq!(KeyFile::load(temporary).unwrap().version, 2, "the first kept key is still there");
        assert_eq!(KeyFile::load(second).unwrap().version, 3);
    }

    #[test]
    fn an_imported_key_is_a_key_file_or_hex_and_must_be_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        let hex = dir.path().join("hex");
        let key = TenantKey::from_bytes(std::array::from_fn(|index| index as u8 * 7));
        std::fs::write(&hex, format!("{}\n", key.to_hex())).unwrap();
        std::fs::set_permissions(&hex, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(import_key(&hex).unwrap(), key);
        let file = dir.path().join("file.key");
        KeyFile { tenant: "x".into(), id: 3, version: 1, key }.write(&file, false).unwrap();
        assert_eq!(import_key(&file).unwrap(), key);
        std::fs::set_permissions(&hex, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(import_key(&hex).unwrap_err().to_string().contains("chmod 600"));
        std::fs::write(&hex, "not a key").unwrap();
        std::fs::set_permissions(&hex, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(import_key(&hex), Err(TenantAdminError::Import { .. })));
    }

    #[test]
    fn an_imported_key_of_one_repeated_byte_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let hex = dir.path().join("weak.hex");
        for (text, byte) in [("0".repeat(64), 0x00), ("ff".repeat(32), 0xff), ("5A".repeat(32), 0x5a)] {
            std::fs::write(&hex, &text).unwrap();
            std::fs::set_permissions(&hex, std::fs::Permissions::from_mode(0o600)).unwrap();
            let error = import_key(&hex).unwrap_err();
            assert!(matches!(error, TenantAdminError::WeakKey { byte: found, .. } if found == byte), "{error}");
            let message = error.to_string();
            assert!(message.contains("weak.hex") && message.contains(&format!("all {byte:#04x}")), "{message}");
        }
        // In a key file too.
        let file = dir.path().join("weak.key");
        let weak = KeyFile { tenant: "x".into(), id: 3, version: 1, key: TenantKey::from_bytes([0; 32]) };
        weak.write(&file, false).unwrap();
        assert!(matches!(import_key(&file), Err(TenantAdminError::WeakKey { byte: 0, .. })));
    }
}
