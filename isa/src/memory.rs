//! A view of memory that instructions execute on.
//!
//! Region memory is shared: several workers (and, for file mappings, other processes) touch it at
//! once, like an RDMA memory region. A `&mut [u8]` over it would promise exclusivity that does not
//! exist, so instructions go through this view instead: bulk moves are plain copies (atomic only
//! per aligned word in practice, as the protocol promises no more), and atomics use the hardware's
//! atomic instructions on aligned words.

use core::marker::PhantomData;
use core::sync::atomic::{AtomicU16, AtomicU32, AtomicU64};

/// The most [`SharedMemory::prefetch`] asks for at once (an operand is at most 8 KiB), so that
/// a prefetch never evicts much of what the cache holds.
const PREFETCH_MAX_BYTES: usize = 9 * 1024;

/// Bytes of a cache line on the CPUs we run on.
const CACHE_LINE_BYTES: usize = 64;

/// A bounds-checked view of `len` bytes of shared memory.
#[derive(Debug, Clone, Copy)]
pub struct SharedMemory<'a> {
    base: *mut u8,
    len: usize,
    _lifetime: PhantomData<&'a core::cell::UnsafeCell<[u8]>>,
}

// SAFETY: every access goes through raw-pointer copies or atomics within `len`; the memory is
// meant to be shared between threads (see the module comment).
unsafe impl Send for SharedMemory<'_> {}
// SAFETY: as above.
unsafe impl Sync for SharedMemory<'_> {}

impl<'a> SharedMemory<'a> {
    /// A view of words owned by the caller (8-byte aligned, as a region's base is).
    pub fn from_words(words: &'a mut [u64]) -> SharedMemory<'a> {
        SharedMemory {
            base: words.as_mut_ptr().cast::<u8>(),
            len: core::mem::size_of_val(words),
            _lifetime: PhantomData,
        }
    }

    /// A view of raw memory.
    ///
    /// # Safety
    /// `base..base + len` must be mapped, writable, 8-byte aligned at `base`, and stay so for `'a`.
    pub unsafe fn from_raw(base: *mut u8, len: usize) -> SharedMemory<'a> {
        assert!((base as usize).is_multiple_of(8), "shared memory base must be 8-byte aligned");
        SharedMemory { base, len, _lifetime: PhantomData }
    }

    /// The `len` bytes at `offset` as a view of their own (byte 0 is `offset`): what an
    /// extension handler is given, so it cannot reach beyond its range. Its base need not be
    /// 8-byte aligned; atomics check their own alignment.
    pub fn sub_view(&self, offset: usize, len: usize) -> SharedMemory<'a> {
        self.assert_within(offset, len);
        // SAFETY: in bounds (asserted), so the sub-range is mapped for 'a like the whole.
        let base = unsafe { self.base.add(offset) };
        SharedMemory { base, len, _lifetime: PhantomData }
    }

    /// Bytes in the view.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the view is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The start of the view, for persistence of a sub-range by the region that owns it.
    pub fn base(&self) -> *mut u8 {
        self.base
    }

    /// `offset..offset + len` as a range of this view, if it lies within it.
    pub fn range(&self, offset: u64, len: usize) -> Option<core::ops::Range<usize>> {
        let start = usize::try_from(offset).ok()?;
        let end = start.checked_add(len)?;
        (end <= self.len).then_some(start..end)
    }

    /// Asks the CPU to start bringing `len` bytes at `offset` into its cache (`for_write`: in a
    /// state it may write, saving the upgrade when it does) without waiting for them. A hint:
    /// it changes no byte and never faults; a range beyond the view is ignored, and at most
    /// 9 KiB are asked for.
    pub fn prefetch(&self, offset: u64, len: usize, for_write: bool) {
        let Some(range) = self.range(offset, len.min(PREFETCH_MAX_BYTES)) else { return };
        #[cfg(target_arch = "x86_64")]
        {
            use core::arch::x86_64::{_mm_prefetch, _MM_HINT_ET0, _MM_HINT_T0};
            let start = self.base as usize + range.start;
            let end = self.base as usize + range.end;
            let mut line = start & !(CACHE_LINE_BYTES - 1);
            while line < end {
                // SAFETY: a prefetch reads nothing architecturally and cannot fault, so an address
                // outside the view is harmless (the first line, rounded down, may begin before it).
                unsafe {
                    if for_write {
                        _mm_prefetch::<_MM_HINT_ET0>(line as *const i8);
                    } else {
                        _mm_prefetch::<_MM_HINT_T0>(line as *const i8);
                    }
                }
                line += CACHE_LINE_BYTES;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (range, for_write);
    }

    fn assert_within(&self, offset: usize, len: usize) {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len),
            "access {offset}+{len} beyond shared memory of {} bytes: the executor must bounds-check",
            self.len
        );
    }

    /// Copies `out.len()` bytes starting at `offset` into `out`.
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        self.assert_within(offset, out.len());
        // SAFETY: in bounds (asserted); `out` is a distinct caller buffer.
        unsafe { core::ptr::copy_nonoverlapping(self.base.add(offset), out.as_mut_ptr(), out.len()) }
    }

    /// Copies `data` into the view at `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) {
        self.assert_within(offset, data.len());
        // SAFETY: in bounds (asserted); `data` is a caller buffer outside the view.
        unsafe { core::ptr::copy_nonoverlapping(data.as_ptr(), self.base.add(offset), data.len()) }
    }

    /// Sets `len` bytes at `offset` to `value`.
    pub fn fill(&self, offset: usize, len: usize, value: u8) {
        self.assert_within(offset, len);
        // SAFETY: in bounds (asserted).
        unsafe { core::ptr::write_bytes(self.base.add(offset), value, len) }
    }

    /// Copies `len` bytes from `source` at `source_offset` to this view at `offset`; the two may
    /// be the same memory and overlap (memmove semantics).
    pub fn copy_from(&self, offset: usize, source: &SharedMemory<'_>, source_offset: usize, len: usize) {
        self.assert_within(offset, len);
        source.assert_within(source_offset, len);
        // SAFETY: both ranges in bounds (asserted); `copy` allows overlap.
        unsafe { core::ptr::copy(source.base.add(source_offset), self.base.add(offset), len) }
    }

    /// CRC32 (IEEE) of `len` bytes at `offset`.
    pub fn crc32(&self, offset: usize, len: usize) -> u32 {
        self.assert_within(offset, len);
        // SAFETY: in bounds (asserted). Concurrent writers may change bytes under the hash; the
        // protocol promises a CRC of some interleaving, as a READ would return.
        let bytes = unsafe { core::slice::from_raw_parts(self.base.add(offset), len) };
        crc32fast::hash(bytes)
    }

    fn aligned_pointer(&self, offset: usize, size: usize) -> *mut u8 {
        self.assert_within(offset, size);
        // SAFETY: in bounds (asserted).
        let pointer = unsafe { self.base.add(offset) };
        assert!((pointer as usize).is_multiple_of(size), "atomic access at {offset} not aligned to {size}");
        pointer
    }

    /// The aligned 8-byte word at `offset`.
    pub fn atomic_u64(&self, offset: usize) -> &'a AtomicU64 {
        let pointer = self.aligned_pointer(offset, 8);
        // SAFETY: aligned and in bounds (checked); memory lives for 'a and is only ever accessed
        // through raw copies or atomics.
        unsafe { AtomicU64::from_ptr(pointer.cast()) }
    }

    /// The aligned 4-byte word at `offset`.
    pub fn atomic_u32(&self, offset: usize) -> &'a AtomicU32 {
        let pointer = self.aligned_pointer(offset, 4);
        // SAFETY: as for atomic_u64.
        unsafe { AtomicU32::from_ptr(pointer.cast()) }
    }

    /// The aligned 2-byte word at `offset`.
    pub fn atomic_u16(&self, offset: usize) -> &'a AtomicU16 {
        let pointer = self.aligned_pointer(offset, 2);
        // SAFETY: as for atomic_u64.
        unsafe { AtomicU16::from_ptr(pointer.cast()) }
    }
}

/// The CRC32 (IEEE, as the CRC32 instruction answers) of two ranges one after the other, from
/// the CRC of each and the second's length: what an initiator that split a long CRC32 into
/// several instructions combines their answers with.
pub fn crc32_combine(first: u32, second: u32, second_len: u64) -> u32 {
    let mut whole = crc32fast::Hasher::new_with_initial_len(first, 0);
    whole.combine(&crc32fast::Hasher::new_with_initial_len(second, second_len));
    whole.finalize()
}

#[cfg(test)]
mod tests {
    use super::crc32_combine;

    /// Pieces of any length, empty ones included, combine into the CRC of the whole.
    #[test]
    fn crc32_pieces_combine_into_the_crc_of_the_whole() {
        let bytes: Vec<u8> = (0..10_000u32).map(|index| (index * 31 % 251) as u8).collect();
        for cuts in [vec![0], vec![1], vec![4096, 4096], vec![0, 7, 0, 9_999], vec![3_333, 3_333, 3_334]] {
            let (mut whole, mut at) = (0, 0);
            for &cut in &cuts {
                let cut = cut.min(bytes.len() - at);
                whole = crc32_combine(whole, crc32fast::hash(&bytes[at..at + cut]), cut as u64);
                at += cut;
            }
            assert_eq!(whole, crc32fast::hash(&bytes[..at]), "pieces {cuts:?}");
        }
    }
}
