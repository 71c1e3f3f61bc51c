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
pub trait Window: Send + Sync {
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

impl Window for FileWindow {
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
