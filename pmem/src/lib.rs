//! Byte-addressable memory regions: the I/O memory pool the network touches.
//!
//! A region is one mapping, created at start-up and never resized: anonymous memory (volatile),
//! a file mapping persisted with `msync` of the touched pages, or a DAX mapping (`MAP_SYNC`)
//! persisted with cache-line write-back (`clwb`) and `sfence`. Mappings are pre-faulted
//! (`MAP_POPULATE`) and locked (`mlock`) so the request path never takes a page fault; when the
//! lock limit forbids it the region still works and the log says why.

mod fault;
mod flush;

pub use flush::CacheLineFlush as CacheLineFlushProbe;

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use netdam_isa::memory::SharedMemory;

/// How a region's contents survive a crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Lost when the target stops.
    Volatile,
    /// Acknowledged writes survive a crash.
    Persistent,
}

/// Where a region's bytes live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backing {
    /// Anonymous memory (`mem:`): volatile.
    Anonymous,
    /// A file mapped shared; persisted with `msync`.
    File(PathBuf),
    /// A file on a DAX file system mapped with `MAP_SYNC`; persisted with `clwb` + `sfence`.
    Dax(PathBuf),
}

/// Why a region could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    /// The size is zero or not a whole number of pages.
    #[error("region {name:?}: size {size_bytes} bytes must be a non-zero multiple of the {page_bytes}-byte page")]
    BadSize {
        /// Region name.
        name: String,
        /// Size asked for.
        size_bytes: u64,
        /// The page size.
        page_bytes: usize,
    },
    /// The backing file exists with another size.
    #[error("region {name:?}: {path} holds {actual_bytes} bytes but the configuration says {size_bytes}; fix the size or move the file away")]
    SizeMismatch {
        /// Region name.
        name: String,
        /// Backing file.
        path: PathBuf,
        /// Its size on disk.
        actual_bytes: u64,
        /// Size asked for.
        size_bytes: u64,
    },
    /// The file system does not support DAX mappings.
    #[error("region {name:?}: {path} is not on a DAX-capable file system (mmap with MAP_SYNC failed: {source}); use backend \"file\" for msync-based persistence instead")]
    DaxUnsupported {
        /// Region name.
        name: String,
        /// Backing file.
        path: PathBuf,
        /// What mmap said.
        source: io::Error,
    },
    /// The file system holding the backing file has no room for the whole region.
    #[error("region {name:?}: the file system of {path} has no room for its {size_bytes} bytes ({source}); free space there or make the region smaller")]
    NoSpace {
        /// Region name.
        name: String,
        /// Backing file.
        path: PathBuf,
        /// Size asked for.
        size_bytes: u64,
        /// What the file system said (ENOSPC or EDQUOT).
        source: io::Error,
    },
    /// Any other system call failed.
    #[error("region {name:?}: {what} failed: {source}")]
    System {
        /// Region name.
        name: String,
        /// The call and its subject.
        what: String,
        /// The error.
        source: io::Error,
    },
}

/// How `persist` makes bytes durable.
#[derive(Debug, Clone)]
enum PersistMethod {
    Nothing,
    Msync,
    CacheFlush(flush::CacheLineFlush),
    /// A crash-test region: `persist` copies into the durable image.
    CrashTest(PowerCutImage),
}

/// Bytes a power cut may leave in a persistent memory region: a persisted cache line is
/// durable, and every aligned 8-byte word stored since (the unit persistent memory writes
/// atomically) reaches the medium or not, each on its own (cache evictions happen in any order).
#[derive(Debug, Clone)]
pub struct PowerCutImage {
    durable: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
}

/// Cache line: the unit `persist` writes back on persistent memory.
const CACHE_LINE_BYTES: usize = 64;

/// One mapped region.
#[derive(Debug)]
pub struct Region {
    name: String,
    base: *mut u8,
    len: usize,
    backing: Backing,
    persist_method: PersistMethod,
    locked: bool,
    /// The system page size, read once: `msync` works on whole pages.
    page_bytes: usize,
    /// A file mapping's entry in the bus-error report (`fault`): taken out before the unmap.
    fault_report: Option<fault::Registration>,
}

// SAFETY: the mapping is owned by the Region and lives until Drop; all access to its bytes goes
// through SharedMemory, which is built for concurrent use.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

/// The system page size.
pub fn page_bytes() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(4096)
}

fn last_error(name: &str, what: String) -> RegionError {
    RegionError::System { name: name.to_string(), what, source: io::Error::last_os_error() }
}

impl Region {
    /// Maps a region of `size_bytes` named `name` on `backing`, creating a missing file.
    pub fn open(name: &str, backing: Backing, size_bytes: u64) -> Result<Region, RegionError> {
        Region::open_as("region", name, backing, size_bytes)
    }

    /// As [`Region::open`], for a space of another `kind` mapped the same way (a pmem
    /// namespace): a bus error in its mapping names it as that.
    pub fn open_as(kind: &str, name: &str, backing: Backing, size_bytes: u64) -> Result<Region, RegionError> {
        let page = page_bytes();
        let len = usize::try_from(size_bytes).unwrap_or(usize::MAX);
        if len == 0 || len % page != 0 || len == usize::MAX {
            return Err(RegionError::BadSize { name: name.to_string(), size_bytes, page_bytes: page });
        }
        let (base, persist_method) = match &backing {
            Backing::Anonymous => (map_anonymous(name, len)?, PersistMethod::Nothing),
            Backing::File(path) => (map_file(name, path, size_bytes, false)?, PersistMethod::Msync),
            Backing::Dax(path) => {
                let method = flush::CacheLineFlush::detect().ok_or_else(|| RegionError::System {
                    name: name.to_string(),
                    what: "finding a cache-line flush instruction (clwb, clflushopt, clflush)".to_string(),
                    source: io::Error::from(io::ErrorKind::Unsupported),
                })?;
                (map_file(name, path, size_bytes, true)?, PersistMethod::CacheFlush(method))
            }
        };
        // SAFETY: base..base+len is the mapping just created.
        let locked = unsafe { libc::mlock(base.cast(), len) } == 0;
        if !locked {
            let error = io::Error::last_os_error();
            tracing::warn!(
                region = name,
                bytes = len,
                %error,
                "could not lock the region in memory (RLIMIT_MEMLOCK too low?); it works, but requests may take page faults. Raise the limit (ulimit -l, LimitMEMLOCK=) or run with CAP_IPC_LOCK"
            );
        }
        let fault_report = match &backing {
            Backing::Anonymous => None,
            Backing::File(path) | Backing::Dax(path) => {
                Some(fault::register(base, len, &format!("{kind} {name:?}"), path, size_bytes))
            }
        };
        Ok(Region {
            name: name.to_string(),
            base,
            len,
            backing,
            persist_method,
            locked,
            page_bytes: page,
            fault_report,
        })
    }

    /// A crash-test region of `size_bytes` (anonymous memory, persistent as far as the target
    /// can tell): `persist` copies the cache lines it covers into a durable image, and
    /// [`Region::power_cut`] draws what a power cut would leave. For crash tests only: `persist`
    /// takes a lock.
    pub fn crash_test(name: &str, size_bytes: u64) -> Result<Region, RegionError> {
        let mut region = Region::open(name, Backing::Anonymous, size_bytes)?;
        let durable = vec![0u8; region.len];
        region.persist_method =
            PersistMethod::CrashTest(PowerCutImage { durable: std::sync::Arc::new(std::sync::Mutex::new(durable)) });
        Ok(region)
    }

    /// One image a power cut now would leave, drawn with `seed`: the persisted bytes, and for
    /// every aligned 8-byte word stored since, the stored or the persisted value. `None` unless
    /// this is a [`Region::crash_test`] region. Call it while no request writes the region.
    pub fn power_cut(&self, seed: u64) -> Option<Vec<u8>> {
        let PersistMethod::CrashTest(image) = &self.persist_method else { return None };
        let durable = image.durable.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut cut = durable.clone();
        let mut live = vec![0u8; self.len];
        self.memory().read(0, &mut live);
        let mut rng = netdam_isa::rng::Rng::new(seed);
        for (word, stored) in cut.chunks_exact_mut(8).zip(live.chunks_exact(8)) {
            if word != stored && rng.chance(0.5) {
                word.copy_from_slice(stored);
            }
        }
        Some(cut)
    }

    /// The region's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty (never, for an opened region).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where its bytes live.
    pub fn backing(&self) -> &Backing {
        &self.backing
    }

    /// Whether acknowledged writes survive a crash.
    pub fn durability(&self) -> Durability {
        match self.backing {
            Backing::Anonymous if matches!(self.persist_method, PersistMethod::CrashTest(_)) => Durability::Persistent,
            Backing::Anonymous => Durability::Volatile,
            Backing::File(_) | Backing::Dax(_) => Durability::Persistent,
        }
    }

    /// Whether the mapping is locked in memory.
    pub fn is_locked(&self) -> bool {
        self.locked
    }

    /// The view instructions execute on.
    pub fn memory(&self) -> SharedMemory<'_> {
        // SAFETY: the mapping is page-aligned, writable and lives as long as &self.
        unsafe { SharedMemory::from_raw(self.base, self.len) }
    }

    /// Makes `len` bytes at `offset` durable; a no-op on volatile regions.
    pub fn persist(&self, offset: usize, len: usize) -> io::Result<()> {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len),
            "persist {offset}+{len} beyond region {:?} of {} bytes",
            self.name,
            self.len
        );
        if len == 0 {
            return Ok(());
        }
        match &self.persist_method {
            PersistMethod::Nothing => Ok(()),
            PersistMethod::CrashTest(image) => {
                let start = offset / CACHE_LINE_BYTES * CACHE_LINE_BYTES;
                let end = ((offset + len).div_ceil(CACHE_LINE_BYTES) * CACHE_LINE_BYTES).min(self.len);
                let mut durable = image.durable.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                self.memory().read(start, &mut durable[start..end]);
                Ok(())
            }
            PersistMethod::Msync => {
                let page = self.page_bytes;
                let start = offset / page * page;
                let end = (offset + len).div_ceil(page) * page;
                // SAFETY: start..end lies within the mapping (page-rounded, and len is a page multiple).
                let result = unsafe { libc::msync(self.base.add(start).cast(), end - start, libc::MS_SYNC) };
                if result == 0 {
                    Ok(())
                } else {
                    Err(io::Error::last_os_error())
                }
            }
            PersistMethod::CacheFlush(method) => {
                // SAFETY: offset..offset+len lies within the mapping (asserted above).
                unsafe { method.flush(self.base.add(offset), len) };
                Ok(())
            }
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // Out of the report first: once unmapped, the addresses may be mapped again for another.
        drop(self.fault_report.take());
        // SAFETY: base..base+len is our mapping and nothing borrows it past &self's lifetime.
        unsafe {
            if self.locked {
                libc::munlock(self.base.cast(), self.len);
            }
            libc::munmap(self.base.cast(), self.len);
        }
    }
}

fn map_anonymous(name: &str, len: usize) -> Result<*mut u8, RegionError> {
    // Mapped inaccessible first: a process that has locked its future memory (the target's
    // `mlockall(MCL_FUTURE)`) gets every accessible mapping populated inside `mmap`, with small
    // pages, before any advice could ask for huge ones. An inaccessible mapping is not populated.
    // SAFETY: a fresh anonymous mapping; no existing memory is affected.
    let base = unsafe {
        libc::mmap(core::ptr::null_mut(), len, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
    };
    if base == libc::MAP_FAILED {
        return Err(last_error(name, format!("mmap of {len} anonymous bytes")));
    }
    // Transparent huge pages before the memory is populated: requests land anywhere in a region,
    // and with 4 KiB pages nearly every one of them misses the TLB (a 2048-lane VADD at random
    // offsets of 32 MiB took 628 ns with 4 KiB pages, 502 ns with 2 MiB ones; docs/DECISIONS.md).
    // Where THP is off (`never`) the advice is refused and the region keeps small pages.
    // SAFETY: advice on our own fresh mapping.
    unsafe { libc::madvise(base, len, libc::MADV_HUGEPAGE) };
    // Made accessible with the advice in place; a locked mapping is populated here, now with
    // huge pages where the kernel has them.
    // SAFETY: our own fresh mapping, referenced by nothing yet.
    if unsafe { libc::mprotect(base, len, libc::PROT_READ | libc::PROT_WRITE) } != 0 {
        let error = last_error(name, format!("mprotect of {len} anonymous bytes"));
        // SAFETY: unmapping our own mapping, which nothing references.
        unsafe { libc::munmap(base, len) };
        return Err(error);
    }
    // Populated now, as MAP_POPULATE did, so no request pays a page fault.
    // SAFETY: as above.
    if unsafe { libc::madvise(base, len, libc::MADV_POPULATE_WRITE) } != 0 {
        // Kernels before 5.14 lack MADV_POPULATE_WRITE: touch every page instead.
        let page = 4096;
        for offset in (0..len).step_by(page) {
            // SAFETY: within the mapping, which nothing else references yet.
            unsafe { core::ptr::write_volatile(base.cast::<u8>().add(offset), 0) };
        }
    }
    Ok(base.cast())
}

/// A system call on the backing file `path` of region `name` failed.
fn file_error(name: &str, path: &Path, what: &str, source: io::Error) -> RegionError {
    RegionError::System { name: name.to_string(), what: format!("{what} {}", path.display()), source }
}

/// Bytes the file system holding `file` still gives an unprivileged user (`statvfs`'s
/// `f_bavail`), or `None` when it cannot tell.
fn available_bytes(file: &File) -> Option<u64> {
    let mut stats = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: fstatvfs fills the struct on success; it is read only then.
    if unsafe { libc::fstatvfs(file.as_raw_fd(), stats.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: initialised by the successful call above.
    let stats = unsafe { stats.assume_init() };
    Some(stats.f_bavail.saturating_mul(stats.f_frsize))
}

fn map_file(name: &str, path: &Path, size_bytes: u64, dax: bool) -> Result<*mut u8, RegionError> {
    let system = |what: &str, source: io::Error| file_error(name, path, what, source);
    if let Some(parent) = path.parent().filter(|parent| !parent.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|source| system("creating the directory of", source))?;
    }
    let mut options = OpenOptions::new();
    options.read(true).write(true).mode(0o600);
    // A file this call creates is removed again if the region cannot be opened on it: a refused
    // region leaves nothing behind (neither a sparse file nor, worse, the blocks a partial
    // reservation took on a full file system).
    let (file, created) = match options.clone().create_new(true).open(path) {
        Ok(file) => (file, true),
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {
            (options.open(path).map_err(|source| system("opening", source))?, false)
        }
        Err(source) => return Err(system("opening", source)),
    };
    let mapped = map_open_file(name, path, &file, size_bytes, dax);
    if mapped.is_err() && created {
        let _ = std::fs::remove_file(path);
    }
    mapped
}

/// Maps `file` (at `path`) as region `name`: sized if empty, every block reserved, mapped shared.
fn map_open_file(name: &str, path: &Path, file: &File, size_bytes: u64, dax: bool) -> Result<*mut u8, RegionError> {
    let system = |what: &str, source: io::Error| file_error(name, path, what, source);
    let metadata = file.metadata().map_err(|source| system("reading the size of", source))?;
    let actual_bytes = metadata.len();
    if actual_bytes != 0 && actual_bytes != size_bytes {
        return Err(RegionError::SizeMismatch {
            name: name.to_string(),
            path: path.to_path_buf(),
            actual_bytes,
            size_bytes,
        });
    }
    // Refused before anything is allocated when the file system plainly lacks the room (the
    // blocks not yet allocated against what an unprivileged user may still take): a reservation
    // that fails part way has filled the file system for everyone else meanwhile.
    let allocated_bytes = metadata.blocks().saturating_mul(512);
    let missing_bytes = size_bytes.saturating_sub(allocated_bytes);
    if let Some(available_bytes) = available_bytes(file) {
        if missing_bytes > available_bytes {
            return Err(RegionError::NoSpace {
                name: name.to_string(),
                path: path.to_path_buf(),
                size_bytes,
                source: io::Error::other(format!(
                    "{missing_bytes} bytes still to allocate, {available_bytes} available"
                )),
            });
        }
    }
    if actual_bytes == 0 {
        file.set_len(size_bytes).map_err(|source| system("sizing", source))?;
        file.sync_all().map_err(|source| system("syncing", source))?;
    }
    // Reserve every block now. A store into a hole of a shared file mapping allocates on its
    // page fault, and on a full file system that fault is a SIGBUS that kills the target with
    // acknowledged requests in flight; reserved, a full file system stops the start instead,
    // with its reason. On a file already allocated this only walks its extents.
    // SAFETY: posix_fallocate on an open descriptor; it returns the error number.
    let reserved = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, size_bytes as libc::off_t) };
    match reserved {
        0 => {}
        libc::ENOSPC | libc::EDQUOT => {
            return Err(RegionError::NoSpace {
                name: name.to_string(),
                path: path.to_path_buf(),
                size_bytes,
                source: io::Error::from_raw_os_error(reserved),
            })
        }
        error => return Err(system("reserving the blocks of", io::Error::from_raw_os_error(error))),
    }
    let flags = if dax { libc::MAP_SHARED_VALIDATE | libc::MAP_SYNC } else { libc::MAP_SHARED | libc::MAP_POPULATE };
    // SAFETY: maps the open file; the mapping stays valid after the descriptor is closed.
    let base = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            size_bytes as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            file.as_raw_fd(),
            0,
        )
    };
    if base == libc::MAP_FAILED {
        let source = io::Error::last_os_error();
        if dax && matches!(source.raw_os_error(), Some(libc::EOPNOTSUPP) | Some(libc::EINVAL)) {
            return Err(RegionError::DaxUnsupported { name: name.to_string(), path: path.to_path_buf(), source });
        }
        return Err(system("mmap of", source));
    }
    if dax {
        // MAP_POPULATE is not combined with MAP_SYNC; touch every page once instead.
        let page = page_bytes();
        for offset in (0..size_bytes as usize).step_by(page) {
            // SAFETY: offset is within the mapping; a volatile read only faults the page in.
            unsafe { core::ptr::read_volatile(base.cast::<u8>().add(offset)) };
        }
    }
    Ok(base.cast())
}
