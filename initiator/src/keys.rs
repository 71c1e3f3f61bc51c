//! Where an initiator finds its tenant key: `--key FILE` (or `NETDAM_KEY`), else the key file of
//! the default tenant that a target started with its embedded default writes into the user's
//! data directory, so the quickstart needs no flag. None found, or `none` given as the key file:
//! the session is unauthenticated, which only a target with `auth = "none"` accepts.

use std::path::{Path, PathBuf};

use netdam_auth::{Credentials, KeyFile};

/// The key file a target started with its embedded default writes for its default tenant:
/// `$XDG_DATA_HOME/netdam/tenants/default.key` or `~/.local/share/netdam/tenants/default.key`.
pub fn default_key_path() -> Option<PathBuf> {
    let data = match std::env::var_os("XDG_DATA_HOME").filter(|value| !value.is_empty()) {
        Some(data) => PathBuf::from(data),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".local/share"),
    };
    Some(data.join("netdam").join("tenants").join("default.key"))
}

/// What `--key` (or `NETDAM_KEY`) says to present no key at all, not even the default
/// tenant's: for a target with `auth = "none"` (a file of that name is `./none`).
pub const NO_KEY: &str = "none";

/// The credentials to use: none for [`NO_KEY`], those of `explicit` (an error names the file
/// if it cannot be used), else those of the default key file if it exists, else none.
pub fn resolve(explicit: Option<&Path>) -> Result<Option<Credentials>, String> {
    if explicit.is_some_and(|path| path.as_os_str() == NO_KEY) {
        return Ok(None);
    }
    if let Some(path) = explicit {
        return KeyFile::load(path).map(|file| Some(file.credentials())).map_err(|error| error.to_string());
    }
    match default_key_path() {
        Some(path) if path.exists() => {
            KeyFile::load(&path).map(|file| Some(file.credentials())).map_err(|error| error.to_string())
        }
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netdam_auth::TenantKey;

    #[test]
    fn an_explicit_key_file_is_read_and_a_missing_one_is_named() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("alice.key");
        let file = KeyFile { tenant: "alice".into(), id: 4, version: 2, key: TenantKey::from_bytes([3; 32]) };
        file.write(&path, false).unwrap();
        assert_eq!(resolve(Some(&path)).unwrap(), Some(file.credentials()));
        let missing = directory.path().join("nope.key");
        let error = resolve(Some(&missing)).unwrap_err();
        assert!(error.contains("nope.key"), "{error}");
        assert_eq!(resolve(Some(Path::new(NO_KEY))).unwrap(), None, "`none` presents no key");
    }
}
