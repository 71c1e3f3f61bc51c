//! Page-aligned transfer buffers, allocated once: O_DIRECT needs aligned memory, and io_uring
//! registers the whole pool once so each transfer skips pinning its pages.

use std::ptr::NonNull;

/// `count` buffers of `buffer_bytes` each (a multiple of the page size), in one mapping.
#[derive(Debug)]
pub struct AlignedBuffers {
    base: NonNull<u8>,
    buffer_bytes: usize,
    count: usize,
}

// SAFETY: the mapping is owned by this value; access goes through &self / &mut self.
unsafe impl Send for AlignedBuffers {}

impl AlignedBuffers {
    /// Maps `count` buffers of `buffer_bytes` (rounded up to 4096) and touches every page.
    pub fn new(count: usize, buffer_bytes: usize) -> std::io::Result<AlignedBuffers> {
        let buffer_bytes = buffer_bytes.div_ceil(4096).max(1) * 4096;
        let len = buffer_bytes * count.max(1);
        // SAFETY: an anonymous private mapping with no address hint has no preconditions.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let base = NonNull::new(ptr.cast::<u8>()).expect("mmap never returns null on success");
        Ok(AlignedBuffers { base, buffer_bytes, count })
    }

    /// Bytes per buffer.
    pub fn buffer_bytes(&self) -> usize {
        self.buffer_bytes
    }

    /// Number of buffers.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Buffer `index`; panics when out of range (callers validate indices first).
    pub fn get(&mut self, index: usize) -> &mut [u8] {
        assert!(index < self.count, "buffer {index} of {}", self.count);
        // SAFETY: in bounds of the mapping; the &mut self borrow makes it exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr().add(index * self.buffer_bytes), self.buffer_bytes) }
    }

    /// Address of buffer `index`, for the kernel.
    pub fn ptr(&self, index: usize) -> *mut u8 {
        assert!(index < self.count, "buffer {index} of {}", self.count);
        // SAFETY: in bounds of the mapping.
        unsafe { self.base.as_ptr().add(index * self.buffer_bytes) }
    }

    /// One iovec per buffer, for `io_uring_register_buffers`.
    pub fn iovecs(&self) -> Vec<libc::iovec> {
        (0..self.count)
            .map(|index| libc::iovec { iov_base: self.ptr(index).cast(), iov_len: self.buffer_bytes })
            .collect()
    }
}

impl Drop for AlignedBuffers {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.buffer_bytes * self.count.max(1));
        }
    }
}
