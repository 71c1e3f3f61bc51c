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
    #[error("{what} at {path} found, but mapping it is not built yet (FPGA.md §1); use resource0:ADDRESS or a model window (file:PATH)")]
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
    /// A `resource0:` source maps the function's sysfs `resource0` file with the code that maps a
    /// model's window file (root only: the kernel refuses the mapping to anyone else). A `vfio:`
    /// source is probed (does the function exist, is it bound to `vfio-pci`) and then refused:
    /// mapping through VFIO is not built.
    pub fn open(&self, sysfs: &Path) -> Result<std::sync::Arc<dyn Window>, WindowError> {
        let device = |pci_address: &str| sysfs.join("bus/pci/devices").join(pci_address);
        match self {
            WindowSource::File { path } => open_file(path),
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
                open_file(&resource)
            }
        }
    }
}

/// Maps a window file: a model's window, or a PCI function's sysfs `resource0` (one code path).
fn open_file(path: &Path) -> Result<std::sync::Arc<dyn Window>, WindowError> {
    FileWindow::open(path)
        .map(|window| std::sync::Arc::new(window) as std::sync::Arc<dyn Window>)
        .map_err(|source| WindowError::File { path: path.display().to_string(), source })
}

/// PCI vendor id of a netdam card: the FPGA vendor's (Xilinx), under which the bitstream sets
/// its own device id. `auto` maps only functions with both ids, then checks `DEVICE_ID`.
pub const PCI_VENDOR_ID: u16 = 0x10EE;
/// PCI device id the netdam bitstream reports ("ND").
pub const PCI_DEVICE_ID: u16 = 0x4E44;

/// Where [`probe`] looks: `/dev` and `/sys` normally, directory trees in tests.
#[derive(Debug, Clone)]
pub struct ProbeRoots {
    /// Holds `vfio/` when the vfio-pci driver is loaded.
    pub dev: std::path::PathBuf,
    /// Holds `bus/pci/devices/`.
    pub sysfs: std::path::PathBuf,
}

impl Default for ProbeRoots {
    fn default() -> ProbeRoots {
        ProbeRoots { dev: "/dev".into(), sysfs: "/sys".into() }
    }
}

/// A window [`probe`] found and mapped.
pub struct Probed {
    /// What was mapped, for the log line (`resource0:0000:3b:00.0`, `file:PATH`).
    pub source: String,
    /// The mapping.
    pub window: std::sync::Arc<dyn Window>,
    /// The window file, when it is a device model's (whose interrupt socket is beside it).
    pub file: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for Probed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Probed").field("source", &self.source).finish_non_exhaustive()
    }
}

/// PCI functions under `sysfs` whose vendor and device ids are a netdam card's, sorted.
fn netdam_functions(sysfs: &Path) -> Vec<String> {
    let id = |device: &Path, file: &str| {
        std::fs::read_to_string(device.join(file))
            .ok()
            .and_then(|text| u16::from_str_radix(text.trim().trim_start_matches("0x"), 16).ok())
    };
    let Ok(entries) = std::fs::read_dir(sysfs.join("bus/pci/devices")) else {
        return Vec::new();
    };
    let mut found: Vec<String> = entries
        .filter_map(Result::ok)
        .filter(|entry| {
            let path = entry.path();
            id(&path, "vendor") == Some(PCI_VENDOR_ID) && id(&path, "device") == Some(PCI_DEVICE_ID)
        })
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|name| is_pci_address(name))
        .collect();
    found.sort();
    found
}

/// `auto`'s search, in FPGA.md §1's order: VFIO, then the `resource0` of a function with the
/// netdam PCI ids whose BAR0 holds `DEVICE_ID`, then `model_window` if one is configured. The
/// first window found is returned; with none, one line saying why each way failed, for the
/// log line of the fallback to software.
pub fn probe(roots: &ProbeRoots, model_window: Option<&Path>) -> Result<Probed, String> {
    let mut misses = Vec::new();
    let functions = netdam_functions(&roots.sysfs);
    let vfio = roots.dev.join("vfio");
    if !vfio.exists() {
        misses.push(format!("VFIO: {} does not exist (vfio-pci not loaded)", vfio.display()));
    } else {
        let bound: Vec<&String> = functions
            .iter()
            .filter(|address| {
                let driver = roots.sysfs.join("bus/pci/devices").join(address).join("driver");
                std::fs::read_link(driver).ok().is_some_and(|target| target.ends_with("vfio-pci"))
            })
            .collect();
        match bound.first() {
            None => misses.push("VFIO: no netdam card bound to vfio-pci".to_string()),
            Some(address) => misses.push(format!("VFIO: card {address} found, but mapping through VFIO is not built")),
        }
    }
    if functions.is_empty() {
        misses.push(format!("resource0: no PCI function {PCI_VENDOR_ID:04x}:{PCI_DEVICE_ID:04x} in sysfs"));
    }
    for address in &functions {
        let source = WindowSource::Resource0 { pci_address: address.clone() };
        match source.open(&roots.sysfs) {
            Ok(window) => {
                let found = window.u32_at(crate::registers::DEVICE_ID).load(std::sync::atomic::Ordering::Acquire);
                if found == crate::DEVICE_ID {
                    return Ok(Probed { source: format!("resource0:{address}"), window, file: None });
                }
                misses.push(format!("resource0:{address}: DEVICE_ID {found:#010x} is not netdam's"));
            }
            Err(error) => misses.push(format!("resource0: {error}")),
        }
    }
    match model_window {
        None => misses.push("model: no fpga_window configured".to_string()),
        Some(path) => match open_file(path) {
            Ok(window) => {
                return Ok(Probed {
                    source: format!("file:{}", path.display()),
                    window,
                    file: Some(path.to_path_buf()),
                })
            }
            Err(error) => misses.push(format!("model: {error}")),
        },
    }
    Err(misses.join("; "))
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
    fn vfio_is_probed_and_refused_as_not_built_and_resource0_is_mapped() {
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
        // An empty resource0 is no window: mapping it fails, naming the file.
        let refused = resource.open(sysfs.path()).err().unwrap().to_string();
        assert!(refused.contains("resource0") && refused.contains("register block"), "{refused}");
        // One the size of a BAR maps, as a model's window file does.
        let bar = std::fs::File::options().write(true).open(device.join("resource0")).unwrap();
        bar.set_len(2 * crate::registers::REGISTER_BLOCK_BYTES).unwrap();
        assert_eq!(resource.open(sysfs.path()).unwrap().len(), 2 * crate::registers::REGISTER_BLOCK_BYTES as usize);
        let missing: WindowSource = "file:no-such-window".parse().unwrap();
        assert!(matches!(missing.open(sysfs.path()), Err(WindowError::File { .. })));
    }

    #[test]
    fn probe_tries_vfio_then_resource0_then_the_model_window_and_says_why_it_found_none() {
        let roots = tempfile::tempdir().unwrap();
        let roots = ProbeRoots { dev: roots.path().join("dev"), sysfs: roots.path().join("sys") };
        std::fs::create_dir_all(&roots.dev).unwrap();
        let why = probe(&roots, None).unwrap_err();
        assert!(why.contains("vfio") && why.contains("does not exist"), "{why}");
        assert!(why.contains("no PCI function 10ee:4e44") && why.contains("no fpga_window"), "{why}");

        // A card of another kind, and a netdam card whose BAR0 holds the register block.
        let devices = roots.sysfs.join("bus/pci/devices");
        for (address, vendor) in [("0000:01:00.0", "0x8086"), ("0000:3b:00.0", "0x10ee")] {
            std::fs::create_dir_all(devices.join(address)).unwrap();
            std::fs::write(devices.join(address).join("vendor"), format!("{vendor}\n")).unwrap();
            std::fs::write(devices.join(address).join("device"), "0x4e44\n").unwrap();
            let bar = std::fs::File::create(devices.join(address).join("resource0")).unwrap();
            bar.set_len(crate::registers::REGISTER_BLOCK_BYTES).unwrap();
        }
        let why = probe(&roots, None).unwrap_err();
        assert!(why.contains("resource0:0000:3b:00.0: DEVICE_ID 0x00000000"), "{why}");
        let bar = FileWindow::open(&devices.join("0000:3b:00.0/resource0")).unwrap();
        bar.u32_at(crate::registers::DEVICE_ID).store(crate::DEVICE_ID, std::sync::atomic::Ordering::Release);
        let found = probe(&roots, None).unwrap();
        assert_eq!(found.source, "resource0:0000:3b:00.0");

        // /dev/vfio present but no card bound to vfio-pci: said so, and resource0 still serves.
        std::fs::create_dir_all(roots.dev.join("vfio")).unwrap();
        assert_eq!(probe(&roots, None).unwrap().source, "resource0:0000:3b:00.0");

        // Without a card, a configured model window is the last resort.
        std::fs::remove_dir_all(&devices).unwrap();
        let model = roots.dev.join("window");
        drop(FileWindow::create(&model, 2 * crate::registers::REGISTER_BLOCK_BYTES as usize).unwrap());
        assert_eq!(probe(&roots, Some(&model)).unwrap().source, format!("file:{}", model.display()));
        let why = probe(&roots, Some(&roots.dev.join("missing"))).unwrap_err();
        assert!(why.contains("no netdam card bound to vfio-pci") && why.contains("missing"), "{why}");
    }
}
