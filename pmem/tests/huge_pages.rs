//! A memory region gets transparent huge pages even in a process that has locked its future
//! memory, as the target does (`lock_memory`): there `mmap` populates an accessible mapping at
//! once, with small pages, before any advice could ask for huge ones. Its own test binary, since
//! `mlockall` applies to the whole process.

use netdam_pmem::{Backing, Region};

/// Bytes of the mapping `base..base + len` that `/proc/self/smaps` says are huge pages.
fn anon_huge_bytes(base: usize, len: usize) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").expect("read /proc/self/smaps");
    let mut inside = false;
    let mut huge = 0;
    for line in smaps.lines() {
        if let Some((range, _)) = line.split_once(' ') {
            if let Some((start, end)) = range.split_once('-') {
                if let (Ok(start), Ok(end)) = (usize::from_str_radix(start, 16), usize::from_str_radix(end, 16)) {
                    inside = start < base + len && base < end;
                    continue;
                }
            }
        }
        if inside {
            if let Some(kib) = line.strip_prefix("AnonHugePages:") {
                huge += kib.trim().trim_end_matches("kB").trim().parse::<u64>().expect("a size in kB") * 1024;
            }
        }
    }
    huge
}

#[test]
fn a_memory_region_gets_huge_pages_in_a_process_that_locked_its_future_memory() {
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if !thp.contains("[always]") && !thp.contains("[madvise]") {
        println!("skipped: transparent huge pages are off on this machine ({:?})", thp.trim());
        return;
    }
    // SAFETY: mlockall has no memory-safety effects.
    if unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) } != 0 {
        println!("skipped: mlockall refused ({}); raise RLIMIT_MEMLOCK", std::io::Error::last_os_error());
        return;
    }
    let len = 64 << 20;
    let region = match Region::open("huge", Backing::Anonymous, len) {
        Ok(region) => region,
        Err(error) => {
            // SAFETY: as above.
            unsafe { libc::munlockall() };
            // A memory-lock limit above what the process holds but below 64 MiB more.
            println!("skipped: a locked 64 MiB region cannot be mapped here ({error}); raise RLIMIT_MEMLOCK");
            return;
        }
    };
    assert!(region.is_locked(), "the region is locked, as under the target's mlockall");
    let base = region.memory().base() as usize;
    let huge = anon_huge_bytes(base, len as usize);
    // SAFETY: as above.
    unsafe { libc::munlockall() };
    let defrag = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/defrag").unwrap_or_default();
    if huge == 0 && defrag.contains("[never]") {
        // Without compaction at fault time fragmented memory may have no 2 MiB page to give.
        println!("skipped: no huge page, and THP defrag is off ({:?})", defrag.trim());
    } else {
        // Fragmented memory may leave a few 2 MiB ranges small; with small pages only it is 0.
        assert!(huge >= len / 2, "only {huge} of {len} bytes of the locked region are huge pages");
    }
    // The region is usable and zeroed.
    let mut probe = [1u8; 64];
    region.memory().read(len as usize - 64, &mut probe);
    assert_eq!(probe, [0u8; 64]);
}
