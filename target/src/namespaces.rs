//! The block namespaces a target serves: opened once at start-up from the configuration and the
//! metadata store, then each worker opens its own device on every namespace (its own ring and
//! buffers), so workers share nothing but the backing store.

use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use netdam_isa::limits::BLOCK_QUEUE_DEPTH;
use netdam_nvme::{BlockDevice, RegionDevice, Submission, UringDevice};
use netdam_pmem::{Backing, Region};

use crate::config::{NamespaceBackend, NamespaceConfig};

/// Opens one worker's device on a namespace, given the largest transfer in bytes.
pub type DeviceFactory = Arc<dyn Fn(usize, Submission) -> io::Result<Box<dyn BlockDevice>> + Send + Sync>;

/// Why a namespace could not be opened; names the namespace and its backing.
#[derive(Debug, thiserror::Error)]
#[error("namespace {name:?} ({backing}): {message}")]
pub struct NamespaceError {
    /// The namespace.
    pub name: String,
    /// What backs it.
    pub backing: String,
    /// What went wrong.
    pub message: String,
}

/// One namespace.
#[derive(Clone)]
pub struct Namespace {
    name: String,
    backing: String,
    block_bytes: u32,
    capacity_blocks: u64,
    reports_allocation: bool,
    factory: DeviceFactory,
}

impl std::fmt::Debug for Namespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Namespace")
            .field("name", &self.name)
            .field("backing", &self.backing)
            .field("block_bytes", &self.block_bytes)
            .field("capacity_blocks", &self.capacity_blocks)
            .field("reports_allocation", &self.reports_allocation)
            .finish_non_exhaustive()
    }
}

impl Namespace {
    /// A namespace whose devices `factory` opens (tests use this for the crash-test device).
    /// HELLO lists it as not reporting allocation unless [`Namespace::reporting_allocation`]
    /// says otherwise.
    pub fn new(name: &str, backing: &str, block_bytes: u32, capacity_blocks: u64, factory: DeviceFactory) -> Namespace {
        Namespace {
            name: name.to_string(),
            backing: backing.to_string(),
            block_bytes,
            capacity_blocks,
            reports_allocation: false,
            factory,
        }
    }

    /// The same namespace, listed by HELLO as reporting allocation (BLOCK_STATUS) or not: what
    /// its devices' [`BlockDevice::reports_allocation`] says.
    pub fn reporting_allocation(self, reports_allocation: bool) -> Namespace {
        Namespace { reports_allocation, ..self }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What backs it, for people.
    pub fn backing(&self) -> &str {
        &self.backing
    }

    /// Bytes per block.
    pub fn block_bytes(&self) -> u32 {
        self.block_bytes
    }

    /// Blocks it holds.
    pub fn capacity_blocks(&self) -> u64 {
        self.capacity_blocks
    }

    /// Whether BLOCK_STATUS tells holes from data on it (a file namespace).
    pub fn reports_allocation(&self) -> bool {
        self.reports_allocation
    }

    /// Opens a device on it for one worker; `submission` applies where the device has a ring.
    pub fn open_device(
        &self,
        max_transfer_bytes: usize,
        submission: Submission,
    ) -> Result<Box<dyn BlockDevice>, NamespaceError> {
        (self.factory)(max_transfer_bytes, submission).map_err(|error| self.error(error.to_string()))
    }

    fn error(&self, message: String) -> NamespaceError {
        NamespaceError { name: self.name.clone(), backing: self.backing.clone(), message }
    }
}

/// Namespaces by id: the id is the position (configured ones first, then stored ones).
#[derive(Debug, Default)]
pub struct NamespaceTable {
    namespaces: Vec<Namespace>,
}

impl NamespaceTable {
    /// Opens (creating missing files) every namespace; relative paths are under `data_dir`.
    pub fn open(configs: &[NamespaceConfig], data_dir: &Path) -> Result<NamespaceTable, NamespaceError> {
        let mut table = NamespaceTable::default();
        for config in configs {
            table.push(open_namespace(config, data_dir)?);
        }
        Ok(table)
    }

    /// Adds a namespace at the next id.
    pub fn push(&mut self, namespace: Namespace) {
        self.namespaces.push(namespace);
    }

    /// Every namespace with its id.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (u16, &Namespace)> + Clone {
        // Config validation bounds the count by MAX_NAMESPACES, which fits u16.
        self.namespaces.iter().enumerate().map(|(id, namespace)| (id as u16, namespace))
    }

    /// One worker's devices, by namespace id.
    pub fn open_devices(
        &self,
        max_transfer_bytes: usize,
        submission: Submission,
    ) -> Result<Vec<Box<dyn BlockDevice>>, NamespaceError> {
        self.namespaces.iter().map(|namespace| namespace.open_device(max_transfer_bytes, submission)).collect()
    }
}

/// The absolute path of a namespace's backing.
pub fn resolve(path: &Path, data_dir: &Path) -> PathBuf {
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        data_dir.join(path)
    }
}

/// Opens a namespace's backing, creating a missing file at the configured size, and checks that
/// a device opens on it.
pub fn open_namespace(config: &NamespaceConfig, data_dir: &Path) -> Result<Namespace, NamespaceError> {
    let path = resolve(&config.path, data_dir);
    let block_bytes = config.block_size;
    let fail = |message: String| NamespaceError {
        name: config.name.clone(),
        backing: format!("{} {}", backend_name(config.backend), path.display()),
        message,
    };
    let factory: DeviceFactory = match config.backend {
        NamespaceBackend::File | NamespaceBackend::Blockdev => {
            let metadata = std::fs::metadata(&path);
            match (config.backend, metadata) {
                (NamespaceBackend::File, Err(error)) if error.kind() == io::ErrorKind::NotFound => {
                    let Some(size) = config.size else {
                        return Err(fail("the file does not exist and no size is given to create it".into()));
                    };
                    create_sparse_file(&path, size.0).map_err(|error| fail(format!("cannot create it: {error}")))?;
                }
                (_, Err(error)) => return Err(fail(error.to_string())),
                (NamespaceBackend::File, Ok(metadata)) => {
                    use std::os::unix::fs::FileTypeExt;
                    if metadata.file_type().is_block_device() {
                        return Err(fail("this is a block device: use backend \"blockdev\"".into()));
                    }
                    if metadata.is_dir() {
                        return Err(fail("this is a directory: give the path of a file (created if missing)".into()));
                    }
                    if let Some(size) = config.size.filter(|size| size.0 != metadata.len()) {
                        return Err(fail(format!(
                            "the file holds {} bytes but size says {}: fix size or remove it",
                            metadata.len(),
                            size.0
                        )));
                    }
                }
                (_, Ok(metadata)) => {
                    use std::os::unix::fs::FileTypeExt;
                    if !metadata.file_type().is_block_device() {
                        return Err(fail("not a block device: use backend \"file\" for a regular file".into()));
                    }
                }
            }
            if config.backend == NamespaceBackend::File {
                warn_if_overcommitted(&config.name, &path);
            }
            let path = path.clone();
            Arc::new(move |max_transfer: usize, submission: Submission| {
                let device = UringDevice::open_with(&path, block_bytes, BLOCK_QUEUE_DEPTH, max_transfer, submission)?;
                Ok(Box::new(device) as Box<dyn BlockDevice>)
            })
        }
        NamespaceBackend::Pmem => {
            let size = match (config.size, std::fs::metadata(&path)) {
                (Some(size), _) => size.0,
                (None, Ok(metadata)) => metadata.len(),
                (None, Err(error)) => return Err(fail(format!("{error}, and no size is given to create it"))),
            };
            let region = Region::open_as("namespace", &config.name, Backing::File(path.clone()), size)
                .map_err(|error| fail(error.to_string()))?;
            let region = Arc::new(region);
            // A region device answers at submission: there is no ring to hand over.
            Arc::new(move |max_transfer: usize, _: Submission| {
                let device = RegionDevice::new(region.clone(), block_bytes, BLOCK_QUEUE_DEPTH, max_transfer)?;
                Ok(Box::new(device) as Box<dyn BlockDevice>)
            })
        }
    };
    let probe = factory(block_bytes as usize, Submission::Inline).map_err(|error| fail(error.to_string()))?;
    let capacity_blocks = probe.geometry().capacity_blocks;
    let reports_allocation = probe.reports_allocation();
    drop(probe);
    if capacity_blocks == 0 {
        return Err(fail(format!("it holds less than one block of {block_bytes} bytes")));
    }
    warn_of_a_partial_last_block(config, &path);
    let backing = format!("{} {}", backend_name(config.backend), path.display());
    Ok(Namespace::new(&config.name, &backing, block_bytes, capacity_blocks, factory)
        .reporting_allocation(reports_allocation))
}

/// A namespace serves whole blocks: a file whose size is not a multiple of the block size (one
/// named without a size, or made by hand) has bytes past its last whole block that no
/// instruction reaches. Said at every start, as the file stays so; a `size` that is not a
/// multiple is refused by the settings' check instead.
fn warn_of_a_partial_last_block(config: &NamespaceConfig, path: &Path) {
    let Ok(metadata) = std::fs::metadata(path) else { return };
    let tail = metadata.len() % u64::from(config.block_size);
    if metadata.is_file() && tail != 0 {
        tracing::warn!(
            namespace = %config.name,
            path = %path.display(),
            "the file holds {} bytes, {tail} past its last whole block of {} bytes: those are not served (truncate \
             or extend the file to a multiple of block_size to serve all of it)",
            metadata.len(),
            config.block_size
        );
    }
}

fn backend_name(backend: NamespaceBackend) -> &'static str {
    match backend {
        NamespaceBackend::File => "file",
        NamespaceBackend::Blockdev => "block device",
        NamespaceBackend::Pmem => "pmem region",
    }
}

/// A file namespace is sparse: blocks take disk space when first written. Says so at start
/// when the file system cannot hold the blocks not yet written, so that a user learns it now
/// rather than from `no_space` answers later. Nothing is refused: a namespace larger than its
/// disk is a legitimate thin-provisioned choice.
fn warn_if_overcommitted(name: &str, path: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(metadata) = std::fs::metadata(path) else { return };
    if !metadata.is_file() {
        return;
    }
    let Some(free) = free_bytes(path) else { return };
    if let Some(warning) = overcommit_warning(metadata.len(), metadata.blocks() * 512, free) {
        tracing::warn!(namespace = name, path = %path.display(), "{warning}");
    }
}

/// The warning for a sparse file of `len` bytes, `allocated` of them on disk, whose file
/// system has `free` bytes left; `None` when the unwritten blocks fit.
fn overcommit_warning(len: u64, allocated: u64, free: u64) -> Option<String> {
    let unwritten = len.saturating_sub(allocated);
    (unwritten > free).then(|| {
        format!(
            "the namespace is {}, {} of it not yet written, but its file system has {} free: \
             writes to unwritten blocks past that are answered no_space",
            describe_bytes(len),
            describe_bytes(unwritten),
            describe_bytes(free)
        )
    })
}

/// Bytes the unprivileged user may still allocate on the file system holding `path`.
fn free_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let name = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut stats = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: a NUL-terminated path and a buffer of the right type; statvfs fills it on success.
    if unsafe { libc::statvfs(name.as_ptr(), stats.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it filled the buffer.
    let stats = unsafe { stats.assume_init() };
    Some(stats.f_bavail.saturating_mul(stats.f_frsize))
}

/// `1.5 TiB`, `30.2 GiB`, `512 bytes`: sizes for people.
fn describe_bytes(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    match UNITS.iter().find(|(_, unit)| bytes >= *unit) {
        Some((name, unit)) => format!("{:.1} {name}", bytes as f64 / *unit as f64),
        None => format!("{bytes} bytes"),
    }
}

/// Creates `path` as a sparse file of `bytes`. A file it created and could not size (a length
/// past the file system's limit: "File too large") is removed again, so that a corrected
/// retry does not meet an empty file of the wrong size.
fn create_sparse_file(path: &Path, bytes: u64) -> io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    // Owner-only, as region files and the store are: it holds the initiators' data.
    let file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    file.set_len(bytes).and_then(|()| file.sync_all()).inspect_err(|_| {
        let _ = std::fs::remove_file(path);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sparse_file_larger_than_its_free_space_is_warned_about() {
        let warning = overcommit_warning(1 << 40, 0, 30 << 30).expect("1 TiB unwritten on 30 GiB free");
        assert!(warning.contains("1.0 TiB") && warning.contains("30.0 GiB free") && warning.contains("no_space"));
        // Written blocks take no more space: what counts is what is not yet written.
        assert!(overcommit_warning(1 << 40, (1 << 40) - (1 << 30), 2 << 30).is_none());
        assert!(overcommit_warning(1 << 30, 0, 1 << 30).is_none(), "exactly fits");
        assert!(overcommit_warning(1 << 30, 1 << 31, 0).is_none(), "more allocated than its length");
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(describe_bytes(512), "512 bytes");
        assert_eq!(describe_bytes(1536), "1.5 KiB");
        assert_eq!(describe_bytes(30 << 30), "30.0 GiB");
        assert_eq!(describe_bytes(u64::MAX), "16777216.0 TiB");
    }

    #[test]
    fn the_free_space_of_an_existing_path_is_known() {
        let dir = tempfile::tempdir().unwrap();
        assert!(free_bytes(dir.path()).is_some());
        assert!(free_bytes(&dir.path().join("missing/deeper")).is_none());
    }
}
