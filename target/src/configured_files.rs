//! Which files the configured spaces (the settings file's regions and namespaces, and the
//! embedded default region) were served from, kept in the metadata store.
//!
//! A configured space's file is created at its first start: the settings file cannot say
//! whether a start came before. The store can. Once a start has succeeded the daemon records
//! each such file ([`record`]); a later start that finds one gone, or cut to no bytes, is
//! refused rather than serving an empty space where the data was (a file system not mounted
//! yet, a file moved), and a file the settings no longer use is warned of once
//! ([`check_and_warn`]).

use std::io;
use std::path::{Path, PathBuf};

use crate::config::{Config, ConfigError, NamespaceBackend, RegionBackend};
use crate::metadata::{ConfiguredFile, MetadataStore, Stored};
use crate::server::StartError;

/// Refuses a start that would make a recorded file again empty, and warns of recorded files
/// no space is served from any more: called by the start with the store as it found it.
pub fn check_and_warn(config: &Config, data_dir: &Path, stored: &Stored) -> Result<(), ConfigError> {
    let files = configured_files(config, data_dir);
    let served_now = served_paths(&files, stored, data_dir);
    check_configured_files(&files, &stored.configured_files, &served_now)?;
    warn_of_block_size_changes(&files, &stored.configured_files);
    warn_of_configured_files_left(config, data_dir, &served_now, &stored.configured_files);
    Ok(())
}

/// The paths every space of this start is served from: the configured spaces' `files` and the
/// stored spaces' paths, by [`stable_path`].
fn served_paths(files: &[ConfiguredFile], stored: &Stored, data_dir: &Path) -> Vec<PathBuf> {
    let stored_paths = stored
        .regions
        .iter()
        .filter_map(|region| region.path.as_deref())
        .chain(stored.namespaces.iter().map(|namespace| namespace.path.as_path()))
        .map(|path| stable_path(path, data_dir));
    files.iter().map(|file| file.path.clone()).chain(stored_paths).collect()
}

/// The files of the configured spaces (the settings file's and the embedded default region)
/// that a start creates where missing, or serves as they are (a namespace without a size), by
/// [`stable_path`].
fn configured_files(config: &Config, data_dir: &Path) -> Vec<ConfiguredFile> {
    // A namespace without a size is served at its file's (0 while the file is missing: the
    // start then fails on it anyway, and the check below says why).
    let file = |kind: &str, name: &str, path: &Path, size_bytes: Option<u64>, block_bytes: Option<u32>| {
        let path = stable_path(path, data_dir);
        let size_bytes = size_bytes.or_else(|| std::fs::metadata(&path).ok().map(|metadata| metadata.len()));
        let (kind, name, size_bytes) = (kind.to_string(), name.to_string(), size_bytes.unwrap_or(0));
        ConfiguredFile { path, kind, name, size_bytes, block_bytes }
    };
    let regions = config.effective_regions().into_iter().filter_map(|region| match (region.backend, &region.path) {
        (RegionBackend::File | RegionBackend::Dax, Some(path)) => {
            Some(file("region", &region.name, path, Some(region.size.0), None))
        }
        _ => None,
    });
    let namespaces = config.namespaces.iter().filter_map(|namespace| match namespace.backend {
        NamespaceBackend::File | NamespaceBackend::Pmem => {
            let size = namespace.size.map(|size| size.0);
            Some(file("namespace", &namespace.name, &namespace.path, size, Some(namespace.block_size)))
        }
        NamespaceBackend::Blockdev => None,
    });
    regions.chain(namespaces).collect()
}

/// `path` (relative ones under `data_dir`) spelt one way whatever way it was given: its
/// longest existing ancestor directory with symbolic links and `..` resolved, then the rest as
/// written (`.` and `..` applied by name), like `realpath -m` but keeping the last component
/// unresolved (a link to a file system not mounted yet is the file that is missing). So the
/// file of a directory not mounted yet is still known by the name a start recorded.
fn stable_path(path: &Path, data_dir: &Path) -> PathBuf {
    use std::path::Component;
    let path = crate::namespaces::resolve(path, data_dir);
    let path = std::path::absolute(&path).unwrap_or(path);
    let (Some(directory), Some(name)) = (path.parent(), path.file_name()) else { return path };
    let components: Vec<Component> = directory.components().collect();
    for existing in (1..=components.len()).rev() {
        let Ok(mut stable) = components[..existing].iter().collect::<PathBuf>().canonicalize() else { continue };
        for component in &components[existing..] {
            match component {
                Component::ParentDir => {
                    stable.pop();
                }
                Component::Normal(part) => stable.push(part),
                Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
            }
        }
        return stable.join(name);
    }
    path
}

/// Records in the store, once `config`'s target serves, the files its configured spaces are
/// served from, so that a later start refuses to make one of them again empty
/// ([`check_configured_files`]). The record is replaced by what is served now (a file the
/// settings no longer use was warned of once, [`warn_of_configured_files_left`]), and written
/// only when that differs from what it holds. Files on tmpfs are left out: their data is gone
/// after every reboot by design, and starting them empty then is what their users expect.
///
/// The daemon calls it after a successful start (a start that failed served nothing from
/// them); a library user that starts targets of its own leaves its stores alone.
pub fn record(config: &Config) -> Result<(), StartError> {
    let data_dir = config.data_dir()?;
    let mut files = configured_files(config, &data_dir);
    files.retain(|file| !on_memory_file_system(&file.path));
    // The store keeps paths as text: one that is not is left out, and said once per start.
    files.retain(|file| {
        let text = file.path.to_str().is_some();
        if !text {
            tracing::warn!(
                "{} {:?}: its file's path {} is not UTF-8 text, which the store keeps paths as; a start that finds \
                 it gone will create it again empty",
                file.kind,
                file.name,
                file.path.display()
            );
        }
        text
    });
    let recorded = MetadataStore::load(&data_dir)?.configured_files;
    if files.len() == recorded.len() && files.iter().all(|file| recorded.contains(file)) {
        return Ok(());
    }
    MetadataStore::open(&data_dir)?.record_configured_files(&files)?;
    Ok(())
}

/// Whether `path` is on tmpfs or ramfs, whose files do not outlive a reboot.
pub fn on_memory_file_system(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else { return false };
    // SAFETY: a zeroed statfs is a valid value of the plain C struct.
    let mut stats: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: statfs writes into `stats`, which lives across the call; `path` is a C string.
    let found = unsafe { libc::statfs(path.as_ptr(), &mut stats) } == 0;
    // ramfs's magic number, which the libc crate lacks (linux/magic.h).
    const RAMFS_MAGIC: libc::c_long = 0x8584_58f6;
    found && (stats.f_type == libc::TMPFS_MAGIC || stats.f_type == RAMFS_MAGIC)
}

/// A configured space's file that an earlier start served, and that is gone now or cut to no
/// bytes, is not made again empty (as for a stored space, `server::backing_present`): that
/// would serve zeroes where the data was, and on a file system not mounted yet, write beside
/// it. The start is refused, as for any configured space that cannot be opened, saying how to
/// start it empty on purpose.
///
/// The same holds for a space an earlier start served from another path and whose file here is
/// missing: a data directory moved or restored without the space's file (the embedded default
/// region's file is in the data directory), or settings that moved it. Its data is elsewhere,
/// and serving zeroes under its name would look like a loss; the refusal names both files. An
/// old file that another space of this start is served from (`served_now`) is that space's now
/// (a space renamed, and a new one given the old name): the new one is new.
fn check_configured_files(
    files: &[ConfiguredFile],
    served_before: &[ConfiguredFile],
    served_now: &[PathBuf],
) -> Result<(), ConfigError> {
    for file in files {
        let same_path = served_before.iter().find(|before| before.path == file.path);
        let elsewhere = || {
            served_before.iter().find(|before| {
                before.kind == file.kind
                    && before.name == file.name
                    && before.size_bytes != 0
                    && before.path != file.path
                    && !served_now.contains(&before.path)
            })
        };
        let Some(before) = same_path.or_else(elsewhere) else { continue };
        let what = match std::fs::metadata(&file.path) {
            Err(error) if error.kind() == io::ErrorKind::NotFound => "is missing",
            // A region's or pmem namespace's file of no bytes would be sized and served as new.
            Ok(metadata) if metadata.len() == 0 && before.size_bytes != 0 => "holds no bytes",
            _ => continue,
        };
        let path = file.path.display();
        let size = if file.size_bytes == 0 { before.size_bytes } else { file.size_bytes };
        if same_path.is_none() {
            let old = before.path.display();
            let bring = if before.path.exists() {
                format!(
                    "Copy its file there (cp --sparse=always {old} {path}) or put the old path back in the settings"
                )
            } else {
                format!("{old} is gone too: restore the file from a backup to either path")
            };
            return Err(ConfigError::Invalid(format!(
                "{} {:?}: its file {path} {what}, but an earlier start served it from {old} with {} bytes (a data \
                 directory moved or restored without its file? settings that moved it?); the target does not serve \
                 it empty. {bring}, and start again; to serve it empty from now on, make an empty file of its size \
                 there first: truncate -s {size} {path}",
                file.kind, file.name, before.size_bytes
            )));
        }
        let then = if before.kind == file.kind && before.name == file.name {
            String::new()
        } else {
            format!(" as {} {:?}", before.kind, before.name)
        };
        return Err(ConfigError::Invalid(format!(
            "{} {:?}: its file {path} {what}, but an earlier start served it{then} with {} bytes (a file system not \
             mounted yet? a file moved, deleted or cut short?); the target does not serve it again empty. Restore it \
             and start again, or take the {} out of the settings; to serve it empty from now on, make an empty \
             file of its size there first: truncate -s {} {path}",
            file.kind, file.name, before.size_bytes, file.kind, size
        )));
    }
    Ok(())
}

/// Warns of a configured namespace whose file an earlier start served in blocks of another
/// size. Its bytes are unchanged, and the start goes on: the change may be meant. But what was
/// made on it may no longer work (a file system whose blocks are smaller than the device's
/// does not mount; a partition table is read at block 1). Once: the record then written
/// ([`record`]) holds the new size.
fn warn_of_block_size_changes(files: &[ConfiguredFile], served_before: &[ConfiguredFile]) {
    for file in files {
        let Some(before) = served_before.iter().find(|before| before.path == file.path) else { continue };
        let (Some(then), Some(now)) = (before.block_bytes, file.block_bytes) else { continue };
        if then == now {
            continue;
        }
        // Bytes the new size leaves past the last whole block are named by the namespace's
        // own check as it opens (`namespaces::open_namespace`).
        tracing::warn!(
            "namespace {:?}: an earlier start served {} in blocks of {then} bytes, and the settings now say \
             block_size = {now}; the bytes are unchanged, but what was made on it in {then}-byte blocks (a file \
             system, a partition table) may not be read the same way. Put block_size = {then} back to \
             serve it as before",
            file.name,
            file.path.display()
        );
    }
}

/// Warns of each file an earlier start served a configured space from that no space uses now
/// (`served_now`: the configured spaces' files and the stored spaces' paths): the settings
/// changed the space's file or backend (to `mem`, say), or dropped it. Its data is then not
/// served, which the settings alone do not show. The file is left alone. Once: the record then
/// written ([`record`]) no longer holds it.
fn warn_of_configured_files_left(
    config: &Config,
    data_dir: &Path,
    served_now: &[PathBuf],
    served_before: &[ConfiguredFile],
) {
    for before in served_before.iter().filter(|before| !served_now.contains(&before.path)) {
        let (kind, name, old) = (&before.kind, &before.name, before.path.display());
        let from = |path: &Path| format!("served from {}", stable_path(path, data_dir).display());
        let now =
            match kind.as_str() {
                "region" => config.effective_regions().into_iter().find(|region| &region.name == name).map(|region| {
                    match (region.backend, region.path) {
                        (RegionBackend::Mem, _) | (_, None) => "kept in memory (volatile)".to_string(),
                        (_, Some(path)) => from(&path),
                    }
                }),
                _ => config
                    .namespaces
                    .iter()
                    .find(|namespace| &namespace.name == name)
                    .map(|namespace| from(&namespace.path)),
            };
        match now {
            Some(now) => tracing::warn!(
                "{kind} {name:?}: an earlier start served it from {old}, and the settings now have it {now}; the data \
                 in {old} is not served (the file is left as it is: put the old settings back to serve it)"
            ),
            None => tracing::warn!(
                "{kind} {name:?}, which an earlier start served from {old}, is no longer in the settings; the data in \
                 {old} is not served (the file is left as it is)"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One file, however its directory is spelt: through a link, with `..`, relative to the
    /// data directory, and in a directory that does not exist yet (a file system not mounted)
    /// beneath a link, which keeps the name a start recorded through the link's target.
    #[test]
    fn a_file_is_known_by_one_path_however_its_directory_is_spelt() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().canonicalize().unwrap().join("real");
        std::fs::create_dir_all(real.join("sub")).unwrap();
        std::os::unix::fs::symlink(&real, dir.path().join("link")).unwrap();
        let expected = real.join("sub/vol.region");
        for spelt in ["link/sub/vol.region", "real/sub/../sub/vol.region", "link/./sub/vol.region"] {
            assert_eq!(stable_path(Path::new(spelt), dir.path()), expected, "{spelt}");
        }
        assert_eq!(stable_path(&dir.path().join("link/sub/vol.region"), Path::new("/elsewhere")), expected);
        let unmounted = real.join("mnt/disk/vol.region");
        for spelt in ["link/mnt/disk/vol.region", "link/mnt/other/../disk/vol.region"] {
            assert_eq!(stable_path(Path::new(spelt), dir.path()), unmounted, "{spelt}");
        }
    }

    /// A space served before from another file, whose file here is missing, is refused with
    /// what to do; unless that other file is another space's now (a space renamed, and a new
    /// one given its old name), which is no reason to refuse the new one.
    #[test]
    fn a_space_served_before_from_another_file_is_refused_unless_that_file_is_served_now() {
        let dir = tempfile::tempdir().unwrap();
        let (old, new) = (dir.path().join("a.region"), dir.path().join("a2.region"));
        std::fs::write(&old, [7u8; 4096]).unwrap();
        let file = |name: &str, path: &Path| ConfiguredFile {
            path: path.to_path_buf(),
            kind: "region".into(),
            name: name.into(),
            size_bytes: 4096,
            block_bytes: None,
        };
        let before = [file("a", &old)];
        // Renamed to b on its file, and a new a elsewhere: served.
        let renamed = [file("a", &new), file("b", &old)];
        assert!(check_configured_files(&renamed, &before, &[new.clone(), old.clone()]).is_ok());
        // a moved to a new file that is missing: refused, naming both and how to copy.
        let moved = [file("a", &new)];
        let refused = check_configured_files(&moved, &before, std::slice::from_ref(&new)).unwrap_err().to_string();
        assert!(
            refused.contains(&format!("served it from {} with 4096 bytes", old.display()))
                && refused.contains(&format!("cp --sparse=always {} {}", old.display(), new.display()))
                && refused.contains(&format!("truncate -s 4096 {}", new.display())),
            "{refused}"
        );
        // Its old file gone too: no copy to advise.
        std::fs::remove_file(&old).unwrap();
        let refused = check_configured_files(&moved, &before, std::slice::from_ref(&new)).unwrap_err().to_string();
        assert!(refused.contains("is gone too") && !refused.contains("cp --sparse"), "{refused}");
        // Its file made on purpose: served.
        std::fs::write(&new, [0u8; 4096]).unwrap();
        assert!(check_configured_files(&moved, &before, std::slice::from_ref(&new)).is_ok());
    }
}
