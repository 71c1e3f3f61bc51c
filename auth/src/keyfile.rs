//! Tenant keys and the key files that carry them to initiators.
//!
//! A key file is a few lines of text an operator can read and copy:
//!
//! ```text
//! # netdam tenant key: whoever holds this file acts as the tenant. Keep it owner-only (0600).
//! tenant = "alice"
//! id = 2
//! version = 1
//! key = "5f0c…(64 hex digits)"
//! ```
//!
//! `version` counts rotations; the target states it in its refusals so a user holding an old
//! file learns that the key was rotated. Files are written owner-only and a key file readable or
//! writable by group or others is refused, as ssh refuses such a private key.

use std::fmt;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use ring::rand::{SecureRandom, SystemRandom};

/// Bytes of a tenant key.
pub const KEY_BYTES: usize = 32;

/// A tenant's secret: 32 random bytes, shared by the target's metadata store and the tenant's
/// key file. `Debug` never shows it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct TenantKey([u8; KEY_BYTES]);

impl TenantKey {
    /// A fresh key from the operating system's random source.
    pub fn generate() -> Result<TenantKey, KeyError> {
        let mut bytes = [0; KEY_BYTES];
        SystemRandom::new().fill(&mut bytes).map_err(|_| KeyError::Random)?;
        Ok(TenantKey(bytes))
    }

    /// A key of these bytes.
    pub const fn from_bytes(bytes: [u8; KEY_BYTES]) -> TenantKey {
        TenantKey(bytes)
    }

    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8; KEY_BYTES] {
        &self.0
    }

    /// The key as 64 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|byte| format!("{byte:02x}")).collect()
    }

    /// A key from 64 hex digits.
    pub fn from_hex(hex: &str) -> Result<TenantKey, KeyError> {
        let hex = hex.trim();
        if hex.len() != 2 * KEY_BYTES || !hex.is_ascii() {
            return Err(KeyError::BadHex);
        }
        let mut bytes = [0; KEY_BYTES];
        for (byte, pair) in bytes.iter_mut().zip(hex.as_bytes().chunks(2)) {
            let pair = std::str::from_utf8(pair).map_err(|_| KeyError::BadHex)?;
            *byte = u8::from_str_radix(pair, 16).map_err(|_| KeyError::BadHex)?;
        }
        Ok(TenantKey(bytes))
    }
}

impl fmt::Debug for TenantKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TenantKey(<secret>)")
    }
}

/// Why a key could not be made or read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    /// The operating system's random source failed.
    #[error("the system random source failed")]
    Random,
    /// Not 64 hex digits.
    #[error("a key is 64 hex digits")]
    BadHex,
}

/// What a key file holds: who the tenant is and its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyFile {
    /// The tenant's name.
    pub tenant: String,
    /// The tenant's number, which HELLO carries.
    pub id: u32,
    /// Rotations of the key so far (1 for the first key).
    pub version: u32,
    /// The secret.
    pub key: TenantKey,
}

/// Why a key file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    /// The file could not be read or written.
    #[error("key file {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// A line is not what a key file holds.
    #[error("key file {path}, line {line}: {message}")]
    Parse { path: PathBuf, line: usize, message: String },
    /// A field is missing.
    #[error("key file {path} has no `{field}` line")]
    Missing { path: PathBuf, field: &'static str },
    /// Group or others may read, write or execute it.
    #[error(
        "key file {path} is {} (mode {mode:o}); whoever reads it acts as the tenant, and whoever writes it \
         chooses the key: run `chmod 600 {path}`",
        open_to(*.mode)
    )]
    TooOpen { path: PathBuf, mode: u32 },
    /// A device, a FIFO or a socket, whose mode says nothing of who may read the key.
    #[error("key file {path} is not a regular file ({kind}); give the path of a key file")]
    NotRegular { path: PathBuf, kind: &'static str },
    /// It exists and would be overwritten.
    #[error("key file {path} exists already; remove it or choose another path")]
    Exists { path: PathBuf },
}

/// Checks that `path` is a regular file only its owner may read or write, as a key file (or a
/// key to import) must be: whoever reads it acts as the tenant, whoever writes it chooses the
/// key. A device or FIFO is refused before its mode is looked at: `chmod` would not make it a
/// key file.
pub fn check_owner_only(path: &Path) -> Result<(), KeyFileError> {
    let io = |source| KeyFileError::Io { path: path.to_path_buf(), source };
    let metadata = std::fs::metadata(path).map_err(io)?;
    if metadata.is_dir() {
        return Err(io(std::io::Error::new(std::io::ErrorKind::IsADirectory, "this is a directory, not a key file")));
    }
    if !metadata.is_file() {
        return Err(KeyFileError::NotRegular { path: path.to_path_buf(), kind: file_kind(&metadata.file_type()) });
    }
    let mode = metadata.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(KeyFileError::TooOpen { path: path.to_path_buf(), mode });
    }
    Ok(())
}

/// Who beyond the owner may do what with a file of `mode`: "readable by group", "readable by
/// others and writable by group and others".
fn open_to(mode: u32) -> String {
    let holders = |bit: u32| {
        let group = mode & (bit << 3) != 0;
        let others = mode & bit != 0;
        match (group, others) {
            (true, true) => Some("group and others"),
            (true, false) => Some("group"),
            (false, true) => Some("others"),
            (false, false) => None,
        }
    };
    let access: Vec<String> = [(0o4, "readable"), (0o2, "writable"), (0o1, "executable")]
        .into_iter()
        .filter_map(|(bit, access)| holders(bit).map(|who| format!("{access} by {who}")))
        .collect();
    access.join(" and ")
}

/// What a file that is neither a regular file nor a directory is, for a refusal.
fn file_kind(file_type: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if file_type.is_char_device() {
        "a character device"
    } else if file_type.is_block_device() {
        "a block device"
    } else if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_socket() {
        "a socket"
    } else {
        "not a file"
    }
}

/// What an initiator needs to authenticate: the tenant's number, its key and the key's
/// version (a plain value, so session settings holding it stay `Copy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Credentials {
    /// The tenant's number.
    pub tenant: u32,
    /// The key's version.
    pub key_version: u32,
    /// The key.
    pub key: TenantKey,
}

impl KeyFile {
    /// The credentials this file gives.
    pub fn credentials(&self) -> Credentials {
        Credentials { tenant: self.id, key_version: self.version, key: self.key }
    }

    /// The file's text.
    pub fn to_text(&self) -> String {
        format!(
            "# netdam tenant key: whoever holds this file acts as the tenant. Keep it owner-only (0600).\n\
             tenant = \"{}\"\nid = {}\nversion = {}\nkey = \"{}\"\n",
            self.tenant,
            self.id,
            self.version,
            self.key.to_hex()
        )
    }

    /// Parses a key file's text; `path` names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<KeyFile, KeyFileError> {
        let (mut tenant, mut id, mut version, mut key) = (None, None, None, None);
        for (index, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fail = |message: String| KeyFileError::Parse { path: path.to_path_buf(), line: index + 1, message };
            let Some((name, value)) = line.split_once('=') else {
                // The line itself is not echoed: it may hold a key.
                return Err(fail("expected `name = value`".to_string()));
            };
            let value = value.trim();
            let unquoted = || {
                value
                    .strip_prefix('"')
                    .and_then(|rest| rest.strip_suffix('"'))
                    .ok_or_else(|| fail(format!("{} must be a quoted string", name.trim())))
            };
            let number = || value.parse::<u32>().map_err(|_| fail(format!("{} must be a number", name.trim())));
            match name.trim() {
                "tenant" => tenant = Some(unquoted()?.to_string()),
                "id" => id = Some(number()?),
                "version" => version = Some(number()?),
                "key" => key = Some(TenantKey::from_hex(unquoted()?).map_err(|error| fail(error.to_string()))?),
                other => return Err(fail(format!("unknown field {other:?} (tenant, id, version, key)"))),
            }
        }
        let missing = |field| KeyFileError::Missing { path: path.to_path_buf(), field };
        Ok(KeyFile {
            tenant: tenant.ok_or_else(|| missing("tenant"))?,
            id: id.ok_or_else(|| missing("id"))?,
            version: version.unwrap_or(1),
            key: key.ok_or_else(|| missing("key"))?,
        })
    }

    /// Reads the key file at `path`, refusing one that group or others may read or write, or
    /// that is not a regular file.
    pub fn load(path: &Path) -> Result<KeyFile, KeyFileError> {
        let io = |source| KeyFileError::Io { path: path.to_path_buf(), source };
        check_owner_only(path)?;
        let text = std::fs::read_to_string(path).map_err(io)?;
        KeyFile::parse(&text, path)
    }

    /// Writes the key file at `path`, owner-only, durably (the file and its directory are
    /// synced). With `replace` an existing file is replaced atomically; without, an existing
    /// file is an error. Nothing but `path` is left behind, even when the write fails.
    pub fn write(&self, path: &Path, replace: bool) -> Result<(), KeyFileError> {
        self.stage(path, replace)?.install().map_err(|error| match error {
            // Dropping the staged file here removes the temporary: a caller of `write` has no
            // use for it.
            InstallError::NotMoved { staged, source } if source.kind() == std::io::ErrorKind::AlreadyExists => {
                KeyFileError::Exists { path: staged.path.clone() }
            }
            InstallError::NotMoved { staged, source } => KeyFileError::Io { path: staged.path.clone(), source },
            InstallError::NotSynced(error) => error,
        })
    }

    /// Writes the key file to a temporary beside `path` (`.NAME.new`), owner-only and synced,
    /// but does not put it in place: [`StagedKeyFile::install`] does, and dropping the staged
    /// file removes the temporary. This lets a caller make the file the key file only once
    /// whatever else must hold the same key (the target's metadata store) has committed.
    /// Without `replace` an existing file at `path` is an error, now and at the install.
    pub fn stage(&self, path: &Path, replace: bool) -> Result<StagedKeyFile, KeyFileError> {
        self.stage_with(path, replace, |file, text| file.write_all(text))
    }

    /// [`KeyFile::stage`] with the bytes written by `write_text`, so that tests can fail the
    /// write (a full file system) after the temporary was created.
    fn stage_with(
        &self,
        path: &Path,
        replace: bool,
        write_text: impl FnOnce(&mut std::fs::File, &[u8]) -> std::io::Result<()>,
    ) -> Result<StagedKeyFile, KeyFileError> {
        if !replace && path.exists() {
            return Err(KeyFileError::Exists { path: path.to_path_buf() });
        }
        let file_name = path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
        let temporary = path.with_file_name(format!(".{file_name}.new"));
        // One left by a crash between staging and installing holds no key in force.
        let _ = std::fs::remove_file(&temporary);
        let io = |source| KeyFileError::Io { path: temporary.clone(), source };
        let mut file =
            std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&temporary).map_err(io)?;
        // From here the temporary is ours: if the write fails (a full file system), dropping
        // `staged` removes it rather than leaving an empty or partial file.
        let staged = StagedKeyFile { path: path.to_path_buf(), temporary: temporary.clone(), replace, pending: true };
        write_text(&mut file, self.to_text().as_bytes()).and_then(|()| file.sync_all()).map_err(io)?;
        Ok(staged)
    }
}

/// A key file written to a temporary beside its path by [`KeyFile::stage`] and not yet put in
/// place. Dropping it removes the temporary, unless it was installed or [`kept`](Self::keep).
#[derive(Debug)]
#[must_use = "dropping a staged key file removes it; install() puts it in place"]
pub struct StagedKeyFile {
    path: PathBuf,
    temporary: PathBuf,
    replace: bool,
    /// Whether the temporary is still there and ours to remove.
    pending: bool,
}

/// Why [`StagedKeyFile::install`] failed.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// The temporary could not be moved to the key file's path (without `replace`: a file
    /// appeared there, `AlreadyExists`). The temporary is still there, held by `staged`:
    /// dropping it removes it, [`StagedKeyFile::keep`] keeps it.
    #[error("cannot move {} to {}: {source}", .staged.temporary.display(), .staged.path.display())]
    NotMoved { staged: StagedKeyFile, source: std::io::Error },
    /// The key file is in place, but its directory could not be synced.
    #[error(transparent)]
    NotSynced(KeyFileError),
}

impl StagedKeyFile {
    /// Where the key file goes.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where the staged key file is until it is installed.
    pub fn temporary(&self) -> &Path {
        &self.temporary
    }

    /// Puts the staged file in place, durably: renamed over the path with `replace`, else
    /// linked there so that a file which appeared meanwhile is never overwritten; then the
    /// directory is synced.
    pub fn install(mut self) -> Result<(), InstallError> {
        let moved = if self.replace {
            std::fs::rename(&self.temporary, &self.path)
        } else {
            std::fs::hard_link(&self.temporary, &self.path)
        };
        if let Err(source) = moved {
            return Err(InstallError::NotMoved { staged: self, source });
        }
        if !self.replace {
            // The link is in place; failing to remove the other name only leaves a copy.
            let _ = std::fs::remove_file(&self.temporary);
        }
        self.pending = false;
        if let Some(directory) = self.path.parent().filter(|parent| !parent.as_os_str().is_empty()) {
            std::fs::File::open(directory)
                .and_then(|directory| directory.sync_all())
                .map_err(|source| InstallError::NotSynced(KeyFileError::Io { path: self.path.clone(), source }))?;
        }
        Ok(())
    }

    /// Keeps the staged key, for a key that is in force although it could not be installed,
    /// which the operator must then move by hand; returns where it is. It is renamed out of the
    /// temporary's place (to `NAME.unplaced-<unique>`), which the next stage for this path
    /// clears: a retried command must not delete the only copy of a key in force.
    pub fn keep(mut self) -> PathBuf {
        self.pending = false;
        let temporary = std::mem::take(&mut self.temporary);
        let file_name = self.path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
        let unique = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|since| since.as_nanos())
            .unwrap_or_default();
        let kept = self.path.with_file_name(format!("{file_name}.unplaced-{unique}"));
        // Where even the rename fails, the temporary is the copy, and its name is returned.
        match std::fs::rename(&temporary, &kept) {
            Ok(()) => kept,
            Err(_) => temporary,
        }
    }
}

impl Drop for StagedKeyFile {
    fn drop(&mut self) {
        if self.pending {
            let _ = std::fs::remove_file(&self.temporary);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> KeyFile {
        KeyFile { tenant: "alice".into(), id: 7, version: 2, key: TenantKey::from_bytes([0xA5; KEY_BYTES]) }
    }

    #[test]
    fn a_key_file_round_trips_through_its_text() {
        let file = sample();
        assert_eq!(KeyFile::parse(&file.to_text(), Path::new("k")).unwrap(), file);
    }

    #[test]
    fn a_written_key_file_is_owner_only_and_is_not_overwritten() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("alice.key");
        sample().write(&path, false).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(KeyFile::load(&path).unwrap(), sample());
        assert!(matches!(sample().write(&path, false), Err(KeyFileError::Exists { .. })));
        let rotated = KeyFile { version: 3, key: TenantKey::from_bytes([1; KEY_BYTES]), ..sample() };
        rotated.write(&path, true).unwrap();
        assert_eq!(KeyFile::load(&path).unwrap(), rotated);
    }

    fn names_in(directory: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(directory)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_staged_key_file_replaces_the_old_one_only_once_installed() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("alice.key");
        sample().write(&path, false).unwrap();
        let old_bytes = std::fs::read(&path).unwrap();
        let rotated = KeyFile { version: 3, key: TenantKey::from_bytes([1; KEY_BYTES]), ..sample() };
        let staged = rotated.stage(&path, true).unwrap();
        assert_eq!(staged.temporary(), directory.path().join(".alice.key.new"));
        assert_eq!(KeyFile::load(staged.temporary()).unwrap(), rotated, "staged owner-only");
        assert_eq!(std::fs::read(&path).unwrap(), old_bytes);
        drop(staged);
        assert_eq!(std::fs::read(&path).unwrap(), old_bytes, "a dropped staged file changes nothing");
        assert_eq!(names_in(directory.path()), ["alice.key"], "and leaves no temporary");
        rotated.stage(&path, true).unwrap().install().unwrap();
        assert_eq!(KeyFile::load(&path).unwrap(), rotated);
        assert_eq!(names_in(directory.path()), ["alice.key"]);
    }

    #[test]
    fn a_failed_write_leaves_no_temporary_behind() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("alice.key");
        let full = |_: &mut std::fs::File, _: &[u8]| Err(std::io::Error::from_raw_os_error(28)); // ENOSPC
        let error = sample().stage_with(&path, false, full).unwrap_err();
        assert!(error.to_string().contains(".alice.key.new"), "{error}");
        assert!(names_in(directory.path()).is_empty(), "no empty temporary on a full file system");
        sample().write(&path, false).unwrap();
        let old_bytes = std::fs::read(&path).unwrap();
        assert!(sample().stage_with(&path, true, full).is_err());
        assert_eq!(std::fs::read(&path).unwrap(), old_bytes);
        assert_eq!(names_in(directory.path()), ["alice.key"]);
    }

    #[test]
    fn a_staged_file_that_cannot_be_installed_can_be_kept() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("alice.key");
        let staged = sample().stage(&path, false).unwrap();
        std::fs::write(&path, "appeared meanwhile").unwrap();
        let Err(InstallError::NotMoved { staged, source }) = staged.install() else {
            panic!("a file that appeared meanwhile is not overwritten");
        };
        assert_eq!(source.kind(), std::io::ErrorKind::AlreadyExists);
        let temporary = staged.keep();
        assert_eq!(KeyFile::load(&temporary).unwrap(), sample(), "kept");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "appeared meanwhile");
        std::fs::remove_file(&temporary).unwrap();
        // Not kept, it is removed with the error, as `write` does.
        let other = directory.path().join("other.key");
        let staged = sample().stage(&other, false).unwrap();
        std::fs::write(&other, "appeared meanwhile").unwrap();
        drop(staged.install().unwrap_err());
        assert_eq!(names_in(directory.path()), ["alice.key", "other.key"]);
    }

    #[test]
    fn a_key_file_others_can_read_is_refused() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("open.key");
        sample().write(&path, false).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let error = KeyFile::load(&path).unwrap_err();
        assert!(matches!(error, KeyFileError::TooOpen { mode: 0o644, .. }), "{error}");
        assert!(error.to_string().contains("chmod 600"));
    }

    #[test]
    fn a_key_file_group_or_others_can_write_is_refused_saying_so() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("open.key");
        sample().write(&path, false).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o620)).unwrap();
        let error = KeyFile::load(&path).unwrap_err();
        assert!(matches!(error, KeyFileError::TooOpen { mode: 0o620, .. }), "{error}");
        let message = error.to_string();
        assert!(message.contains("is writable by group (mode 620)") && message.contains("chmod 600"), "{message}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o646)).unwrap();
        let message = KeyFile::load(&path).unwrap_err().to_string();
        assert!(message.contains("is readable by group and others and writable by others (mode 646)"), "{message}");
    }

    #[test]
    fn a_key_file_that_is_not_a_regular_file_is_refused_without_mode_advice() {
        let error = KeyFile::load(Path::new("/dev/null")).unwrap_err();
        assert!(matches!(error, KeyFileError::NotRegular { kind: "a character device", .. }), "{error}");
        let message = error.to_string();
        assert!(message.contains("/dev/null is not a regular file") && !message.contains("chmod"), "{message}");
    }

    #[test]
    fn broken_key_files_name_the_line() {
        let path = Path::new("bad.key");
        let short = "tenant = \"a\"\nid = 1\nkey = \"abcd\"\n";
        assert!(matches!(KeyFile::parse(short, path), Err(KeyFileError::Parse { line: 3, .. })));
        let missing = "tenant = \"a\"\nkey = \"".to_string() + &"00".repeat(32) + "\"\n";
        assert!(matches!(KeyFile::parse(&missing, path), Err(KeyFileError::Missing { field: "id", .. })));
        assert!(matches!(KeyFile::parse("colour = 3", path), Err(KeyFileError::Parse { line: 1, .. })));
    }

    #[test]
    fn debug_output_hides_the_key() {
        assert!(!format!("{:?}", sample()).contains("a5a5"));
    }
}
