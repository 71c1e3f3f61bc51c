//! The memory both sides share: the register block, the host-memory area holding the rings and
//! data slots, and the on-board memory aperture.
//!
//! In hardware the registers are BAR0 (through VFIO or a sysfs `resource0` file), the rings are
//! DMA-able host memory and on-board memory is another BAR. For tests and the software model,
//! all three live in one shared file mapped by both processes ([`FileWindow`]); bus addresses are
//! then offsets into that file. Every access is bounds-checked or goes through atomics: the other
//! side may be another process, or a device writing garbage.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64};

use netdam_isa::memory::SharedMemory;

/// Memory shared with the device (or with the host, seen from the model).
///
/// # Safety
/// `as_ptr()..as_ptr() + len()` must be mapped, readable and writable, 4096-byte aligned, and
/// stay so (at the same address) for as long as the implementor lives: the provided methods
/// hand out atomics and copies within that range on that promise alone.
pub unsafe trait Window: Send + Sync {
    /// The first byte of the window, 4096-byte aligned.
    fn as_ptr(&self) -> *mut u8;

    /// Bytes in the window.
    fn len(&self) -> usize;

    /// Whether the window is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The 4-byte register or word at `offset`. Panics if `offset` is out of the window or
    /// unaligned: callers pass the constants of [`crate::registers`] or checked ring offsets.
    fn u32_at(&self, offset: u64) -> &AtomicU32 {
        let pointer = self.pointer(offset, 4).expect("register offset within the window");
        assert!((pointer as usize).is_multiple_of(4), "register at {offset:#x} is not 4-byte aligned");
        // SAFETY: in bounds and aligned (checked); the window lives as long as `self`, and the
        // shared words are only ever accessed atomically or by plain copies.
        unsafe { AtomicU32::from_ptr(pointer.cast()) }
    }

    /// The 8-byte register or word at `offset`; as [`Window::u32_at`].
    fn u64_at(&self, offset: u64) -> &AtomicU64 {
        let pointer = self.pointer(offset, 8).expect("register offset within the window");
        assert!((pointer as usize).is_multiple_of(8), "register at {offset:#x} is not 8-byte aligned");
        // SAFETY: as for u32_at.
        unsafe { AtomicU64::from_ptr(pointer.cast()) }
    }

    /// A pointer to `offset..offset + len`, if that lies within the window.
    fn pointer(&self, offset: u64, len: usize) -> Option<*mut u8> {
        let start = usize::try_from(offset).ok()?;
        let end = start.checked_add(len)?;
        // SAFETY: `start <= end <= len()` (checked just before the add).
        (end <= self.len()).then(|| unsafe { self.as_ptr().add(start) })
    }

    /// Copies `out.len()` bytes at `offset` into `out`; `None` (and nothing copied) out of bounds.
    fn read_bytes(&self, offset: u64, out: &mut [u8]) -> Option<()> {
        let source = self.pointer(offset, out.len())?;
        // SAFETY: in bounds (checked); `out` is a caller buffer outside the window. The other
        // side does not write this range while this side owns it (FPGA.md "Ownership"); if it
        // does anyway, the bytes are garbage, never out-of-bounds memory.
        unsafe { std::ptr::copy_nonoverlapping(source, out.as_mut_ptr(), out.len()) };
        Some(())
    }

    /// Copies `data` into the window at `offset`; `None` (and nothing copied) out of bounds.
    fn write_bytes(&self, offset: u64, data: &[u8]) -> Option<()> {
        let destination = self.pointer(offset, data.len())?;
        // SAFETY: in bounds (checked); `data` is outside the window.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), destination, data.len()) };
        Some(())
    }

    /// A view of `offset..offset + len` for instruction semantics, if in bounds and 8-byte aligned.
    fn memory(&self, offset: u64, len: usize) -> Option<SharedMemory<'_>> {
        let base = self.pointer(offset, len)?;
        if !(base as usize).is_multiple_of(8) {
            return None;
        }
        // SAFETY: mapped, writable, in bounds and aligned (checked), and lives as long as `self`.
        Some(unsafe { SharedMemory::from_raw(base, len) })
    }
}

/// A window over a shared file, mapped `MAP_SHARED` so that another process mapping the same
/// file sees every store.
#[derive(Debug)]
pub struct FileWindow {
    base: *mut u8,
    len: usize,
    _file: File,
}

// SAFETY: the mapping is plain shared memory; every access goes through bounds-checked copies or
// atomics (see `Window`), which is what sharing it between threads needs.
unsafe impl Send for FileWindow {}
// SAFETY: as above.
unsafe impl Sync for FileWindow {}

impl FileWindow {
    /// Creates (or truncates) `path` as a zeroed window of `len` bytes and maps it.
    pub fn create(path: &Path, len: usize) -> io::Result<FileWindow> {
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(path)?;
        file.set_len(len as u64)?;
        FileWindow::map(file, len, path)
    }

    /// Maps an existing window file, whole.
    pub fn open(path: &Path) -> io::Result<FileWindow> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let len = usize::try_from(file.metadata()?.len()).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidData, format!("{} is too large to map", path.display()))
        })?;
        FileWindow::map(file, len, path)
    }

    fn map(file: File, len: usize, path: &Path) -> io::Result<FileWindow> {
        if len < crate::registers::REGISTER_BLOCK_BYTES as usize {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} holds {len} bytes, less than the register block: not a window", path.display()),
            ));
        }
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh shared mapping of `len` bytes of an open file; the kernel picks the
        // address, so nothing existing is replaced.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            let error = io::Error::last_os_error();
            return Err(io::Error::new(error.kind(), format!("mmap of {}: {error}", path.display())));
        }
        Ok(FileWindow { base: base.cast(), len, _file: file })
    }
}

// SAFETY: `base..base + len` is a shared read-write mapping made in `map` (page aligned, as
// mmap returns) and unmapped only in `drop`.
unsafe impl Window for FileWindow {
    fn as_ptr(&self) -> *mut u8 {
        self.base
    }

    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for FileWindow {
    fn drop(&mut self) {
        // SAFETY: `base..base + len` is the mapping made in `map`, and nothing borrows it any
        // more (every borrow is tied to `&self`).
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// Where a device window comes from, as written in configuration: `vfio:DDDD:BB:DD.F`,
/// `resource0:DDDD:BB:DD.F` or `file:PATH` (FPGA.md §1). Parsed here and nowhere else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WindowSource {
    /// A PCI function bound to `vfio-pci`.
    Vfio {
        /// Its PCI address, `DDDD:BB:DD.F`.
        pci_address: String,
    },
    /// A PCI function's BAR0 through sysfs.
    Resource0 {
        /// Its PCI address, `DDDD:BB:DD.F`.
        pci_address: String,
    },
    /// A window file created by `netdam-fpga-model`.
    File {
        /// The file.
        path: std::path::PathBuf,
    },
}

/// Why a window could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum WindowError {
    /// The text is not one of the accepted forms.
    #[error("window source {text:?}: expected vfio:DDDD:BB:DD.F, resource0:DDDD:BB:DD.F or file:PATH")]
    BadSource {
        /// What was given.
        text: String,
    },
    /// Probing found no such device.
    #[error("{what}: {path} does not exist; check the PCI address with lspci -D")]
    NotFound {
        /// What was looked for.
        what: &'static str,
        /// The sysfs path probed.
        path: String,
    },
    /// The device exists but this build cannot map it that way yet.
    #[error("{what} at {path} found, but mapping it is not built yet (FPGA.md §1); use a model window (file:PATH)")]
    NotBuilt {
        /// The kind of window.
        what: &'static str,
        /// What was found.
        path: String,
    },
    /// Mapping the file failed.
    #[error("window file {path}: {source}")]
    File {
        /// The file.
        path: String,
        /// What failed.
        source: io::Error,
    },
}

fn is_pci_address(text: &str) -> bool {
    let bytes = text.as_bytes();
    let hex = |range: std::ops::Range<usize>| bytes[range].iter().all(u8::is_ascii_hexdigit);
    bytes.len() == 12
        && hex(0..4)
        && bytes[4] == b':'
        && hex(5..7)
        && bytes[7] == b':'
        && hex(8..10)
        && bytes[10] == b'.'
        && (b'0'..=b'7').contains(&bytes[11])
}

impl std::str::FromStr for WindowSource {
    type Err = WindowError;

    fn from_str(text: &str) -> Result<WindowSource, WindowError> {
        let bad = || WindowError::BadSource { text: text.to_owned() };
        let (kind, rest) = text.split_once(':').ok_or_else(bad)?;
        match kind {
            "vfio" if is_pci_address(rest) => Ok(WindowSource::Vfio { pci_address: rest.to_owned() }),
            "resource0" if is_pci_address(rest) => Ok(WindowSource::Resource0 { pci_address: rest.to_owned() }),
            "file" if !rest.is_empty() => Ok(WindowSource::File { path: rest.into() }),
            _ => Err(bad()),
        }
    }
}

impl WindowSource {
    /// Probes and opens the window; `sysfs` is normally `/sys` (a directory tree in tests).
    /// VFIO and `resource0` are probed (does the device exist, is it bound to `vfio-pci`) and
    /// then refused as not built yet.
    pub fn open(&self, sysfs: &Path) -> Result<std::sync::Arc<dyn Window>, WindowError> {
        let device = |pci_address: &str| sysfs.join("bus/pci/devices").join(pci_address);
        match self {
            WindowSource::File { path } => FileWindow::open(path)
                .map(|window| std::sync::Arc::new(window) as std::sync::Arc<dyn Window>)
                .map_err(|source| WindowError::File { path: path.display().to_string(), source }),
            WindowSource::Vfio { pci_address } => {
                let driver = device(pci_address).join("driver");
                let bound = std::fs::read_link(&driver)
                    .ok()
                    .is_some_and(|target| target.file_name().is_some_and(|name| name == "vfio-pci"));
                if !bound {
                    let what = "a PCI function bound to vfio-pci";
                    return Err(WindowError::NotFound { what, path: driver.display().to_string() });
                }
                Err(WindowError::NotBuilt { what: "VFIO device", path: device(pci_address).display().to_string() })
            }
            WindowSource::Resource0 { pci_address } => {
                let resource = device(pci_address).join("resource0");
                if !resource.exists() {
                    return Err(WindowError::NotFound { what: "BAR0", path: resource.display().to_string() });
                }
                Err(WindowError::NotBuilt { what: "sysfs resource0", path: resource.display().to_string() })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_parse_in_one_place_and_unknown_forms_are_refused() {
        assert_eq!(
            "vfio:0000:3b:00.0".parse::<WindowSource>().unwrap(),
            WindowSource::Vfio { pci_address: "0000:3b:00.0".into() }
        );
        assert_eq!(
            "resource0:0000:3B:00.1".parse::<WindowSource>().unwrap(),
            WindowSource::Resource0 { pci_address: "0000:3B:00.1".into() }
        );
        assert_eq!(
            "file:run/window".parse::<WindowSource>().unwrap(),
            WindowSource::File { path: "run/window".into() }
        );
        for bad in
            ["", "vfio", "vfio:3b:00.0", "vfio:0000:3b:00.8", "file:", "dax:0000:3b:00.0", "resource0:0000-3b-00.0"]
        {
            assert!(matches!(bad.parse::<WindowSource>(), Err(WindowError::BadSource { .. })), "{bad:?}");
        }
    }

    #[test]
    fn pci_windows_are_probed_and_refused_as_not_built() {
        let sysfs = tempfile::tempdir().unwrap();
        let vfio: WindowSource = "vfio:0000:3b:00.0".parse().unwrap();
        let resource: WindowSource = "resource0:0000:3b:00.0".parse().unwrap();
        assert!(matches!(vfio.open(sysfs.path()), Err(WindowError::NotFound { .. })));
        assert!(matches!(resource.open(sysfs.path()), Err(WindowError::NotFound { .. })));
        let device = sysfs.path().join("bus/pci/devices/0000:3b:00.0");
        std::fs::create_dir_all(&device).unwrap();
        std::fs::write(device.join("resource0"), b"").unwrap();
        std::os::unix::fs::symlink("../../../bus/pci/drivers/vfio-pci", device.join("driver")).unwrap();
        assert!(matches!(vfio.open(sysfs.path()), Err(WindowError::NotBuilt { .. })));
        assert!(matches!(resource.open(sysfs.path()), Err(WindowError::NotBuilt { .. })));
        let missing: WindowSource = "file:no-such-window".parse().unwrap();
        assert!(matches!(missing.open(sysfs.path()), Err(WindowError::File { .. })));
    }
}
