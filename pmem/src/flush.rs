//! Cache-line write-back for DAX mappings: the persistence barrier of real persistent memory.

/// Bytes per cache line on every x86-64 processor that supports these instructions.
const CACHE_LINE_BYTES: usize = 64;

/// The best cache-line flush instruction this processor has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheLineFlush {
    /// Write back without evicting (`clwb`).
    WriteBack,
    /// Flush, weakly ordered (`clflushopt`).
    FlushOpt,
    /// Flush, strongly ordered (`clflush`).
    Flush,
}

impl CacheLineFlush {
    /// Picks `clwb`, else `clflushopt`, else `clflush`; `None` off x86-64.
    pub fn detect() -> Option<CacheLineFlush> {
        #[cfg(target_arch = "x86_64")]
        {
            // std's feature macro does not know clwb/clflushopt; read CPUID leaf 7 directly
            // (EBX bit 24: CLWB, bit 23: CLFLUSHOPT).
            use core::arch::x86_64::{__cpuid_count, __get_cpuid_max};
            let (max_leaf, _) = __get_cpuid_max(0);
            if max_leaf >= 7 {
                let features = __cpuid_count(7, 0).ebx;
                if features & (1 << 24) != 0 {
                    return Some(CacheLineFlush::WriteBack);
                }
                if features & (1 << 23) != 0 {
                    return Some(CacheLineFlush::FlushOpt);
                }
            }
            // clflush is part of SSE2, which every x86-64 processor has.
            return Some(CacheLineFlush::Flush);
        }
        #[allow(unreachable_code)]
        None
    }

    /// Writes back every cache line of `start..start + len`, then fences.
    ///
    /// # Safety
    /// The range must be mapped memory.
    #[cfg(target_arch = "x86_64")]
    pub unsafe fn flush(self, start: *mut u8, len: usize) {
        let first = start as usize / CACHE_LINE_BYTES * CACHE_LINE_BYTES;
        let end = start as usize + len;
        for line in (first..end).step_by(CACHE_LINE_BYTES) {
            // SAFETY: the line is part of the mapped range (caller's contract); detect() saw the
            // instruction in CPUID.
            unsafe {
                match self {
                    CacheLineFlush::WriteBack => {
                        core::arch::asm!("clwb [{0}]", in(reg) line, options(nostack, preserves_flags))
                    }
                    CacheLineFlush::FlushOpt => {
                        core::arch::asm!("clflushopt [{0}]", in(reg) line, options(nostack, preserves_flags))
                    }
                    CacheLineFlush::Flush => core::arch::x86_64::_mm_clflush(line as *const u8),
                }
            }
        }
        // SAFETY: sfence has no preconditions; it orders the flushes before later stores.
        unsafe { core::arch::x86_64::_mm_sfence() };
    }

    /// Unreachable off x86-64: `detect` returns `None` there.
    ///
    /// # Safety
    /// Never called.
    #[cfg(not(target_arch = "x86_64"))]
    pub unsafe fn flush(self, _start: *mut u8, _len: usize) {
        unreachable!("cache-line flush is only detected on x86-64")
    }
}
