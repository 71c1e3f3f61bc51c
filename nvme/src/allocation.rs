//! Where a sparse file's data lies, in whole blocks: the walk behind BLOCK_STATUS on a file
//! namespace, over `lseek(SEEK_DATA)` and `lseek(SEEK_HOLE)` answers.
//!
//! The walk is a pure function over a [`SeekData`] source, so it is tested against a model of
//! a file and runs on the real file through [`FileSeek`]. It costs at most two lookups per
//! pass and at most one pass per extent the caller has room for, and allocates nothing: the
//! caller hands it the extent array.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

use netdam_isa::block::{Extent, EXTENT_FLAG_HOLE, EXTENT_FLAG_ZERO};

/// Flags of a hole in a file: unallocated, and it reads as zeroes.
const HOLE_FLAGS: u32 = EXTENT_FLAG_HOLE | EXTENT_FLAG_ZERO;

/// The file system's view of where data lies in a file.
pub(crate) trait SeekData {
    /// The first byte of data at or after `offset`, or `None` when only a hole (or the end of
    /// the file) follows.
    fn next_data(&mut self, offset: u64) -> io::Result<Option<u64>>;

    /// The first byte of a hole at or after `offset` (the end of the file counts as one).
    fn next_hole(&mut self, offset: u64) -> io::Result<u64>;
}

/// Fills `extents` with the allocation of `num_blocks` blocks of `block_bytes` from
/// `offset_blocks`; returns how many it wrote: contiguous extents from `offset_blocks`,
/// covering at most `num_blocks`, at least one when `num_blocks` and `extents` are not empty.
///
/// Only whole blocks are holes: a block that holds any data is data. Neighbouring runs of the
/// same kind are merged. The walk makes at most `extents.len()` passes of two lookups each, so
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
            // Whole blocks of hole before the block that holds the next data.
            Some(data) => (HOLE_FLAGS, (data / block).min(end_block)),
            None => (HOLE_FLAGS, end_block),
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

/// [`SeekData`] of an open file, through `lseek`.
pub(crate) struct FileSeek<'f>(pub &'f File);

impl FileSeek<'_> {
    fn lseek(&self, offset: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
        let offset = libc::off_t::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
        // SAFETY: lseek on a descriptor this File owns; it only moves the file position, which
        // nothing else uses (the ring reads and writes at explicit offsets).
        let found = unsafe { libc::lseek(self.0.as_raw_fd(), offset, whence) };
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file as sorted, disjoint data ranges in bytes, answering as `lseek` does.
    struct Model {
        data: Vec<(u64, u64)>,
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
    }

    fn model(data: &[(u64, u64)], len: u64) -> Model {
        Model { data: data.to_vec(), len, lookups: 0 }
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
        assert!(file.lookups <= 2 * 3, "{} lookups for 3 extents", file.lookups);
        // Many data pieces inside one data run: passes are bounded even when they merge.
        let pieces: Vec<(u64, u64)> = (0..100).map(|i| (i * 512, i * 512 + 256)).collect();
        let mut file = model(&pieces, 100 * 512);
        file.lookups = 0;
        let merged = extents(&mut file, 0, 100, 4);
        assert_eq!(merged, [(4, 0)], "four passes, one merged extent, covering less than asked");
        assert!(file.lookups <= 8);
    }

    #[test]
    fn the_real_file_system_agrees() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sparse");
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        let block = 64 * 1024u64;
        file.set_len(16 * block).unwrap();
        use std::os::unix::fs::FileExt;
        file.write_all_at(&vec![7u8; block as usize], 4 * block).unwrap();
        file.sync_all().unwrap();
        let mut out = [Extent::default(); 8];
        let count = walk(&mut FileSeek(&file), block as u32, 0, 16, &mut out).unwrap();
        let found: Vec<(u32, u32)> = out[..count].iter().map(|extent| (extent.num_blocks, extent.flags)).collect();
        // A file system without hole support reports everything as data; every one used here
        // (ext4, xfs, btrfs, tmpfs) tracks holes at least at 64 KiB.
        assert_eq!(found, [(4, HOLE), (1, 0), (11, HOLE)]);
    }
}
