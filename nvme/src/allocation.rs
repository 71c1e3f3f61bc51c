//! Where a sparse file's data lies, in whole blocks: the walk behind BLOCK_STATUS on a file
//! namespace, over `lseek(SEEK_DATA)` and `lseek(SEEK_HOLE)` answers, and `FS_IOC_FIEMAP`
//! answers inside what `lseek` calls a hole.
//!
//! `lseek` counts an allocated but unwritten extent (what `FALLOC_FL_ZERO_RANGE`, the target's
//! WRITE_ZEROES, leaves) as a hole: it reads as zeroes, but it is not a hole, and NBD's
//! `base:allocation` says so apart (a hole may cost an allocation, and fail with no space, when
//! written). So a run `lseek` calls a hole is asked again with FIEMAP, and its allocated blocks
//! are reported as zero, not hole. FIEMAP is asked only there: it does not see data still in the
//! page cache, which `lseek` does, so it never decides what is data. A file system without FIEMAP
//! (tmpfs) reports every such run a hole, as before.
//!
//! The walk is a pure function over a [`SeekData`] source, so it is tested against a model of
//! a file and runs on the real file through [`FileSeek`]. It costs at most three lookups per
//! pass and at most one pass per extent the caller has room for, and allocates nothing: the
//! caller hands it the extent array.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

use netdam_isa::block::{Extent, EXTENT_FLAG_HOLE, EXTENT_FLAG_ZERO};

/// Flags of a hole in a file: unallocated, and it reads as zeroes.
const HOLE_FLAGS: u32 = EXTENT_FLAG_HOLE | EXTENT_FLAG_ZERO;

/// Flags of blocks allocated without data (unwritten extents): they read as zeroes.
const ALLOCATED_ZERO_FLAGS: u32 = EXTENT_FLAG_ZERO;

/// The file system's view of where data lies in a file.
pub(crate) trait SeekData {
    /// The first byte of data at or after `offset`, or `None` when only a hole (or the end of
    /// the file) follows.
    fn next_data(&mut self, offset: u64) -> io::Result<Option<u64>>;

    /// The first byte of a hole at or after `offset` (the end of the file counts as one).
    fn next_hole(&mut self, offset: u64) -> io::Result<u64>;

    /// The first allocated range `[start, end)` that overlaps `[from, to)`, where
    /// [`SeekData::next_data`] found no data: space the file system holds for the file without
    /// data in it. `None` where there is none, or where the file system cannot tell.
    fn first_allocated(&mut self, from: u64, to: u64) -> io::Result<Option<(u64, u64)>>;
}

/// Fills `extents` with the allocation of `num_blocks` blocks of `block_bytes` from
/// `offset_blocks`; returns how many it wrote: contiguous extents from `offset_blocks`,
/// covering at most `num_blocks`, at least one when `num_blocks` and `extents` are not empty.
///
/// Only whole blocks are holes: a block that holds any data is data, and a block without data
/// that is partly allocated is allocated (zero, not hole). Neighbouring runs of the same kind
/// are merged. The walk makes at most `extents.len()` passes of at most three lookups each, so
/// a file of many small holes gets a short answer rather than a long pause.
pub(crate) fn walk(
    seek: &mut impl SeekData,
    block_bytes: u32,
    offset_blocks: u64,
    num_blocks: u32,
    extents: &mut [Extent],
) -> io::Result<usize> {
    let block = u64::from(block_bytes);
    let end_block = offset_blocks + u64::from(num_blocks);
    let mut at = offset_blocks;
    let mut count = 0;
    for _pass in 0..extents.len() {
        if at >= end_block {
            break;
        }
        let start = at * block;
        let (flags, next) = match seek.next_data(start)? {
            // Data inside this block: the block is data, and so is everything up to the block
            // that holds the start of the next hole, rounded up.
            Some(data) if data < start + block => {
                let hole = seek.next_hole(data.max(start))?;
                (0, hole.div_ceil(block).clamp(at + 1, end_block))
            }
            // Whole blocks without data before the block that holds the next data.
            Some(data) => without_data(seek, block, at, (data / block).min(end_block))?,
            None => without_data(seek, block, at, end_block)?,
        };
        debug_assert!(next > at, "every pass covers at least one block");
        // At most `num_blocks` blocks, which is a u32.
        let blocks = (next - at) as u32;
        match count {
            0 => {}
            _ if extents[count - 1].flags == flags => {
                extents[count - 1].num_blocks += blocks;
                at = next;
                continue;
            }
            _ if count == extents.len() => break,
            _ => {}
        }
        extents[count] = Extent { num_blocks: blocks, flags };
        count += 1;
        at = next;
    }
    Ok(count)
}

/// The kind and end of the run from block `at` inside blocks `at..until`, which hold no data:
/// allocated blocks (zero) up to the end of the allocated range that covers block `at`, or hole
/// up to the first block any allocated range touches.
fn without_data(seek: &mut impl SeekData, block: u64, at: u64, until: u64) -> io::Result<(u32, u64)> {
    Ok(match seek.first_allocated(at * block, until * block)? {
        None => (HOLE_FLAGS, until),
        Some((start, end)) if start / block <= at => (ALLOCATED_ZERO_FLAGS, end.div_ceil(block).clamp(at + 1, until)),
        Some((start, _)) => (HOLE_FLAGS, (start / block).min(until)),
    })
}

/// [`SeekData`] of an open file, through `lseek` and `FS_IOC_FIEMAP`.
pub(crate) struct FileSeek<'f> {
    pub file: &'f File,
    /// Whether the file system answers FIEMAP; set to false at its first refusal, so a file
    /// system without it costs one refused call per device, not one per pass.
    pub fiemap: &'f mut bool,
}

/// `struct fiemap` of `<linux/fiemap.h>` with room for one extent.
#[repr(C)]
#[derive(Default)]
struct Fiemap {
    start: u64,
    length: u64,
    flags: u32,
    mapped_extents: u32,
    extent_count: u32,
    reserved: u32,
    extents: [FiemapExtent; 1],
}

/// `struct fiemap_extent` of `<linux/fiemap.h>`.
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct FiemapExtent {
    logical: u64,
    physical: u64,
    length: u64,
    reserved64: [u64; 2],
    flags: u32,
    reserved: [u32; 3],
}

/// `_IOWR('f', 11, struct fiemap)`: `struct fiemap` without its extents is 32 bytes.
const FS_IOC_FIEMAP: libc::c_ulong = 0xC020_660B;

impl FileSeek<'_> {
    fn lseek(&self, offset: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
        let offset = libc::off_t::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
        // SAFETY: lseek on a descriptor this File owns; it only moves the file position, which
        // nothing else uses (the ring reads and writes at explicit offsets).
        let found = unsafe { libc::lseek(self.file.as_raw_fd(), offset, whence) };
        if found >= 0 {
            return Ok(Some(found as u64));
        }
        let error = io::Error::last_os_error();
        // ENXIO: no data (SEEK_DATA), or the offset is at or past the end of the file.
        if error.raw_os_error() == Some(libc::ENXIO) {
            Ok(None)
        } else {
            Err(error)
        }
    }
}

impl SeekData for FileSeek<'_> {
    fn next_data(&mut self, offset: u64) -> io::Result<Option<u64>> {
        self.lseek(offset, libc::SEEK_DATA)
    }

    fn next_hole(&mut self, offset: u64) -> io::Result<u64> {
        Ok(self.lseek(offset, libc::SEEK_HOLE)?.unwrap_or(offset))
    }

    fn first_allocated(&mut self, from: u64, to: u64) -> io::Result<Option<(u64, u64)>> {
        if !*self.fiemap || to <= from {
            return Ok(None);
        }
        // No FIEMAP_FLAG_SYNC: writing back dirty pages is not BLOCK_STATUS's to do, and data in
        // them is data to `lseek`, which decided this range holds none.
        let mut map = Fiemap { start: from, length: to - from, extent_count: 1, ..Fiemap::default() };
        // SAFETY: FS_IOC_FIEMAP reads the header and writes at most `extent_count` (1) extents
        // into `map.extents`, which has room for one; `map` outlives the call.
        let result = unsafe { libc::ioctl(self.file.as_raw_fd(), FS_IOC_FIEMAP, &mut map as *mut Fiemap) };
        if result < 0 {
            let error = io::Error::last_os_error();
            return match error.raw_os_error() {
                Some(libc::EOPNOTSUPP) | Some(libc::ENOTTY) => {
                    *self.fiemap = false;
                    Ok(None)
                }
                _ => Err(error),
            };
        }
        if map.mapped_extents == 0 {
            return Ok(None);
        }
        let extent = map.extents[0];
        let (start, end) = (extent.logical.max(from), extent.logical.saturating_add(extent.length).min(to));
        Ok((start < end).then_some((start, end)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file as sorted, disjoint data ranges in bytes, answering as `lseek` does, and sorted,
    /// disjoint ranges allocated without data, answering as FIEMAP does.
    struct Model {
        data: Vec<(u64, u64)>,
        allocated: Vec<(u64, u64)>,
        len: u64,
        lookups: usize,
    }

    impl SeekData for Model {
        fn next_data(&mut self, offset: u64) -> io::Result<Option<u64>> {
            self.lookups += 1;
            if offset >= self.len {
                return Ok(None);
            }
            Ok(self.data.iter().find(|(_, end)| *end > offset).map(|(start, _)| (*start).max(offset)))
        }

        fn next_hole(&mut self, offset: u64) -> io::Result<u64> {
            self.lookups += 1;
            let inside = self.data.iter().find(|(start, end)| *start <= offset && offset < *end);
            Ok(inside.map_or(offset, |(_, end)| *end).min(self.len))
        }

        fn first_allocated(&mut self, from: u64, to: u64) -> io::Result<Option<(u64, u64)>> {
            self.lookups += 1;
            let found = self.allocated.iter().find(|(start, end)| *end > from && *start < to);
            Ok(found.map(|(start, end)| ((*start).max(from), (*end).min(to))))
        }
    }

    fn model(data: &[(u64, u64)], len: u64) -> Model {
        Model { data: data.to_vec(), allocated: Vec::new(), len, lookups: 0 }
    }

    fn model_allocated(data: &[(u64, u64)], allocated: &[(u64, u64)], len: u64) -> Model {
        Model { data: data.to_vec(), allocated: allocated.to_vec(), len, lookups: 0 }
    }

    fn extents(model: &mut Model, offset_blocks: u64, num_blocks: u32, room: usize) -> Vec<(u32, u32)> {
        let mut out = vec![Extent::default(); room];
        let count = walk(model, 512, offset_blocks, num_blocks, &mut out).unwrap();
        out[..count].iter().map(|extent| (extent.num_blocks, extent.flags)).collect()
    }

    const HOLE: u32 = HOLE_FLAGS;

    #[test]
    fn whole_blocks_of_hole_and_data() {
        // Blocks 0-1 data, 2-5 hole, 6 data, 7-9 hole (end of file at block 10).
        let mut file = model(&[(0, 1024), (3072, 3584)], 5120);
        assert_eq!(extents(&mut file, 0, 10, 64), [(2, 0), (4, HOLE), (1, 0), (3, HOLE)]);
        assert_eq!(extents(&mut file, 3, 2, 64), [(2, HOLE)], "inside a hole");
        assert_eq!(extents(&mut file, 1, 6, 64), [(1, 0), (4, HOLE), (1, 0)], "clipped at both ends");
        let mut empty = model(&[], 5120);
        assert_eq!(extents(&mut empty, 0, 10, 64), [(10, HOLE)]);
        let mut full = model(&[(0, 5120)], 5120);
        assert_eq!(extents(&mut full, 0, 10, 64), [(10, 0)]);
    }

    #[test]
    fn a_block_that_is_partly_data_is_data() {
        // Data only in the middle of block 2, and from the last byte of block 5 into block 6.
        let mut file = model(&[(1100, 1200), (3071, 3073)], 5120);
        assert_eq!(extents(&mut file, 0, 10, 64), [(2, HOLE), (1, 0), (2, HOLE), (2, 0), (3, HOLE)]);
        // A hole shorter than a block between two data blocks merges them.
        let mut file = model(&[(0, 600), (900, 2048)], 2048);
        assert_eq!(extents(&mut file, 0, 4, 64), [(4, 0)]);
    }

    #[test]
    fn the_answer_stops_at_the_room_it_has() {
        // Alternating data and hole blocks: 20 extents for 20 blocks.
        let data: Vec<(u64, u64)> = (0..10).map(|i| (i * 1024, i * 1024 + 512)).collect();
        let mut file = model(&data, 20 * 512);
        let all = extents(&mut file, 0, 20, 64);
        assert_eq!(all.len(), 20);
        file.lookups = 0;
        let some = extents(&mut file, 0, 20, 3);
        assert_eq!(some, [(1, 0), (1, HOLE), (1, 0)], "contiguous from the first block, shorter");
        assert!(file.lookups <= 3 * 3, "{} lookups for 3 extents", file.lookups);
        // Many data pieces inside one data run: passes are bounded even when they merge.
        let pieces: Vec<(u64, u64)> = (0..100).map(|i| (i * 512, i * 512 + 256)).collect();
        let mut file = model(&pieces, 100 * 512);
        file.lookups = 0;
        let merged = extents(&mut file, 0, 100, 4);
        assert_eq!(merged, [(4, 0)], "four passes, one merged extent, covering less than asked");
        assert!(file.lookups <= 12);
    }

    const ZERO: u32 = ALLOCATED_ZERO_FLAGS;

    #[test]
    fn allocated_blocks_without_data_read_as_zeroes_but_are_not_holes() {
        // Blocks 0-1 data, 2-3 allocated without data, 4-5 hole, 6 data, 7 allocated, 8-9 hole.
        let mut file = model_allocated(&[(0, 1024), (3072, 3584)], &[(1024, 2048), (3584, 4096)], 5120);
        assert_eq!(extents(&mut file, 0, 10, 64), [(2, 0), (2, ZERO), (2, HOLE), (1, 0), (1, ZERO), (2, HOLE)]);
        assert_eq!(extents(&mut file, 3, 2, 64), [(1, ZERO), (1, HOLE)], "clipped inside");
        // Allocated from before the range asked: the range starts allocated.
        assert_eq!(extents(&mut file, 3, 1, 64), [(1, ZERO)]);
        // A block only partly allocated is allocated, on either side.
        let mut file = model_allocated(&[], &[(700, 1100)], 2560);
        assert_eq!(extents(&mut file, 0, 5, 64), [(1, HOLE), (2, ZERO), (2, HOLE)]);
        // Neighbouring allocated ranges merge, and a wholly allocated file is one extent.
        let mut file = model_allocated(&[], &[(0, 512), (512, 2560)], 2560);
        assert_eq!(extents(&mut file, 0, 5, 64), [(5, ZERO)]);
        // Data inside an allocated range stays data: lseek decides what is data.
        let mut file = model_allocated(&[(1024, 1536)], &[(1536, 2560)], 2560);
        assert_eq!(extents(&mut file, 0, 5, 64), [(2, HOLE), (1, 0), (2, ZERO)]);
    }

    /// A sparse file of 16 blocks of 64 KiB in `dir` (file systems that track holes coarsely,
    /// xfs and btrfs, agree at that size too), and the block size.
    fn sparse_file(dir: &std::path::Path) -> (File, u64) {
        let path = dir.join("sparse");
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(path).unwrap();
        let block = 64 * 1024u64;
        file.set_len(16 * block).unwrap();
        (file, block)
    }

    /// The walk over all 16 blocks of `file` as (blocks, flags), and whether FIEMAP answered.
    fn walk_file(file: &File, block: u64) -> (Vec<(u32, u32)>, bool) {
        let mut out = [Extent::default(); 8];
        let mut fiemap = true;
        let count = walk(&mut FileSeek { file, fiemap: &mut fiemap }, block as u32, 0, 16, &mut out).unwrap();
        (out[..count].iter().map(|extent| (extent.num_blocks, extent.flags)).collect(), fiemap)
    }

    #[test]
    fn the_real_file_system_agrees() {
        let dir = tempfile::tempdir().unwrap();
        let (file, block) = sparse_file(dir.path());
        use std::os::unix::fs::FileExt;
        file.write_all_at(&vec![7u8; block as usize], 4 * block).unwrap();
        file.sync_all().unwrap();
        let (found, _) = walk_file(&file, block);
        // A file system without hole support reports everything as data; every one used here
        // (ext4, xfs, btrfs, tmpfs) tracks holes at least at 64 KiB.
        assert_eq!(found, [(4, HOLE), (1, 0), (11, HOLE)]);
    }

    /// What WRITE_ZEROES leaves (`FALLOC_FL_ZERO_RANGE`: allocated, unwritten) is zero and not
    /// a hole where the file system answers FIEMAP; what TRIM leaves (a punched hole) is a hole.
    #[test]
    fn the_real_file_system_tells_zeroed_from_punched() {
        let dir = tempfile::tempdir().unwrap();
        let (file, block) = sparse_file(dir.path());
        let fallocate = |mode: libc::c_int, from: u64, blocks: u64| {
            // SAFETY: fallocate on a descriptor `file` owns, inside its length.
            let result = unsafe {
                libc::fallocate(file.as_raw_fd(), mode, (from * block) as libc::off_t, (blocks * block) as libc::off_t)
            };
            (result == 0).then_some(()).ok_or_else(io::Error::last_os_error)
        };
        if let Err(error) = fallocate(libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE, 2, 4) {
            eprintln!("skipped: the file system of {} cannot zero a range ({error})", dir.path().display());
            return;
        }
        fallocate(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, 3, 1).unwrap();
        use std::os::unix::fs::FileExt;
        file.write_all_at(&vec![7u8; block as usize], 10 * block).unwrap();
        file.sync_all().unwrap();
        let (found, fiemap) = walk_file(&file, block);
        if !fiemap {
            eprintln!("skipped: the file system of {} does not answer FIEMAP", dir.path().display());
            assert_eq!(found, [(10, HOLE), (1, 0), (5, HOLE)], "without FIEMAP, lseek's view");
            return;
        }
        assert_eq!(found, [(2, HOLE), (1, ZERO), (1, HOLE), (2, ZERO), (4, HOLE), (1, 0), (5, HOLE)]);
    }
}
