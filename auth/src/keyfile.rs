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
//! file learns that the key was rotated. Files are written owner-only and a key file readable by
//! group or others is refused, as ssh refuses such a private key.

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
    /// Others may read it.
    #[error(
        "key file {path} is readable by group or others (mode {mode:o}); whoever reads it acts as the tenant: \
         run `chmod 600 {path}`"
    )]
    TooOpen { path: PathBuf, mode: u32 },
    /// It exists and would be overwritten.
    #[error("key file {path} exists already; remove it or choose another path")]
    Exists { path: PathBuf },
}

/// Checks that `path` is a file only its owner may read, as a key file (or a key to import)
/// must be: whoever reads it acts as the tenant.
pub fn check_owner_only(path: &Path) -> Result<(), KeyFileError> {
    let io = |source| KeyFileError::Io { path: path.to_path_buf(), source };
    let metadata = std::fs::metadata(path).map_err(io)?;
    if metadata.is_dir() {
        return Err(io(std::io::Error::new(std::io::ErrorKind::IsADirectory, "this is a directory, not a key file")));
    }
    let mode = metadata.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(KeyFileError::TooOpen { path: path.to_path_buf(), mode });
    }
    Ok(())
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

    /// Reads the key file at `path`, refusing one that group or others may read.
    pub fn load(path: &Path) -> Result<KeyFile, KeyFileError> {
        let io = |source| KeyFileError::Io { path: path.to_path_buf(), source };
        check_owner_only(path)?;
        let text = std::fs::read_to_string(path).map_err(io)?;
        KeyFile::parse(&text, path)
    }

    /// Writes the key file at `path`, owner-only, durably (the file and its directory are
    /// synced). With `replace` an existing file is replaced atomically; without, an existing
    /// file is an error.
    pub fn write(&self, path: &Path, replace: bool) -> Result<(), KeyFileError> {
        let io = |source| KeyFileError::Io { path: path.to_path_buf(), source };
        if !replace && path.exists() {
            return Err(KeyFileError::Exists { path: path.to_path_buf() });
        }
        let file_name = path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
        let temporary = path.with_file_name(format!(".{file_name}.new"));
        let _ = std::fs::remove_file(&temporary);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temporary)
            .map_err(|source| KeyFileError::Io { path: temporary.clone(), source })?;
        file.write_all(self.to_text().as_bytes()).and_then(|()| file.sync_all()).map_err(io)?;
        drop(file);
        if !replace {
            // Linking fails if the path appeared meanwhile: never overwrite another key.
            std::fs::hard_link(&temporary, path).map_err(|source| {
                let _ = std::fs::remove_file(&temporary);
                if source.kind() == std::io::ErrorKind::AlreadyExists {
                    KeyFileError::Exists { path: path.to_path_buf() }
                } else {
                    io(source)
                }
            })?;
            let _ = std::fs::remove_file(&temporary);
        } else {
            std::fs::rename(&temporary, path).map_err(io)?;
        }
        if let Some(directory) = path.parent().filter(|parent| !parent.as_os_str().is_empty()) {
            std::fs::File::open(directory).and_then(|directory| directory.sync_all()).map_err(io)?;
        }
        Ok(())
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
