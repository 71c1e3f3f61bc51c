//! Each region test is written once and run against every backend this machine has.

use netdam_pmem::{Backing, Durability, Region, RegionError};

fn exercise_read_write(region: &Region) {
    let memory = region.memory();
    let data: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
    memory.write(4096 - 17, &data);
    let mut back = vec![0u8; data.len()];
    memory.read(4096 - 17, &mut back);
    assert_eq!(back, data);
    region.persist(4096 - 17, data.len()).unwrap();
    region.persist(region.len() - 1, 1).unwrap();
}

macro_rules! for_each_backend {
    ($test:ident) => {
        mod $test {
            use super::*;

            #[test]
            fn anonymous() {
                $test(Backing::Anonymous);
            }

            #[test]
            fn file() {
                let dir = tempfile::tempdir().unwrap();
                $test(Backing::File(dir.path().join("sub/region.bin")));
            }
        }
    };
}

fn read_write_and_persist(backing: Backing) {
    let region = Region::open("test", backing, 1 << 20).unwrap();
    assert_eq!(region.len(), 1 << 20);
    exercise_read_write(&region);
}
for_each_backend!(read_write_and_persist);

fn rejects_sizes_that_are_not_pages(backing: Backing) {
    for size in [0, 100, 4097] {
        match Region::open("odd", backing.clone(), size) {
            Err(RegionError::BadSize { size_bytes, .. }) => assert_eq!(size_bytes, size),
            other => panic!("size {size}: expected BadSize, got {other:?}"),
        }
    }
}
for_each_backend!(rejects_sizes_that_are_not_pages);

#[test]
fn file_region_keeps_its_bytes_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("durable.region");
    {
        let region = Region::open("durable", Backing::File(path.clone()), 65536).unwrap();
        assert_eq!(region.durability(), Durability::Persistent);
        region.memory().write(1000, b"survives");
        region.persist(1000, 8).unwrap();
    }
    let region = Region::open("durable", Backing::File(path.clone()), 65536).unwrap();
    let mut back = [0u8; 8];
    region.memory().read(1000, &mut back);
    assert_eq!(&back, b"survives");
    drop(region);
    match Region::open("durable", Backing::File(path.clone()), 131072) {
        Err(error @ RegionError::SizeMismatch { .. }) => {
            let message = error.to_string();
            assert!(message.contains("65536") && message.contains("131072"), "{message}");
        }
        other => panic!("expected SizeMismatch, got {other:?}"),
    }
    assert!(path.exists(), "a refused open keeps a file it did not create");
}

/// A region larger than its file system's free space is refused before anything is allocated,
/// and the file the attempt created is gone again: a refusal must not leave the file system full
/// (a reservation that fails part way keeps what it took) or a sparse file behind.
#[test]
fn a_file_region_larger_than_the_free_space_is_refused_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub/huge.region");
    let free = free_bytes(dir.path());
    let page = netdam_pmem::page_bytes() as u64;
    let size = (free + (1 << 30)).div_ceil(page) * page;
    match Region::open("huge", Backing::File(path.clone()), size) {
        Err(error @ RegionError::NoSpace { .. }) => {
            let message = error.to_string();
            assert!(message.contains("huge") && message.contains("available"), "{message}");
        }
        other => panic!("expected NoSpace, got {other:?}"),
    }
    assert!(!path.exists(), "the refused region's file was left behind");
    assert!(free_bytes(dir.path()) + (64 << 20) >= free, "space was taken by a refused region");
}

/// The file system's free bytes for an unprivileged user, as `df` would say.
fn free_bytes(path: &std::path::Path) -> u64 {
    let output = std::process::Command::new("df").args(["--output=avail", "-B1"]).arg(path).output().unwrap();
    String::from_utf8(output.stdout).unwrap().lines().nth(1).unwrap().trim().parse().unwrap()
}

#[test]
fn dax_on_a_plain_file_system_names_the_fallback() {
    let dir = tempfile::tempdir().unwrap();
    match Region::open("pm", Backing::Dax(dir.path().join("pm.region")), 65536) {
        Err(error @ RegionError::DaxUnsupported { .. }) => {
            let message = error.to_string();
            assert!(message.contains("DAX") && message.contains("backend \"file\""), "{message}");
            assert!(!dir.path().join("pm.region").exists(), "the refused region's file was left behind");
        }
        Ok(region) => {
            // A real DAX file system: the backend must then work like the others.
            println!("{} is on a DAX file system; running the region test on it", dir.path().display());
            exercise_read_write(&region);
        }
        Err(other) => panic!("unexpected error: {other}"),
    }
}

#[test]
fn cache_line_flush_runs_on_ordinary_memory() {
    // clwb/clflushopt are valid on any write-back memory; this checks the instruction encoding
    // and the fence on this processor, which the DAX backend relies on.
    let Some(method) = netdam_pmem::CacheLineFlushProbe::detect() else {
        println!("skipped: no cache-line flush instruction on this architecture");
        return;
    };
    let mut buffer = vec![7u8; 4096];
    // SAFETY: the buffer is mapped memory we own.
    unsafe { method.flush(buffer.as_mut_ptr().add(3), 1000) };
    assert!(buffer.iter().all(|byte| *byte == 7));
}

/// A crash-test region: persisted cache lines survive every power cut; a word stored and not
/// persisted survives some and not others, whole (8 bytes at once); other regions draw none.
#[test]
fn crash_test_region_keeps_persisted_lines_and_draws_the_rest() {
    let region = Region::crash_test("cut", 16384).unwrap();
    assert_eq!(region.durability(), Durability::Persistent);
    exercise_read_write(&region);
    let memory = region.memory();
    memory.write(100, &[0xAB; 8]);
    region.persist(100, 8).unwrap();
    let mut persisted = vec![0u8; 10_000];
    memory.read(4096 - 17, &mut persisted);
    memory.write(4096, &[0xCD; 16]);
    let (mut survived, mut lost) = ([false; 2], [false; 2]);
    for seed in 0..64 {
        let cut = region.power_cut(seed).unwrap();
        assert_eq!(cut[96..108], [0, 0, 0, 0, 0xAB, 0xAB, 0xAB, 0xAB, 0xAB, 0xAB, 0xAB, 0xAB], "persisted");
        assert_eq!(cut[4079..4096], persisted[..17], "persisted bytes outside the new store");
        for word in 0..2 {
            let at = 4096 + 8 * word;
            if cut[at..at + 8] == [0xCD; 8] {
                survived[word] = true;
            } else {
                assert_eq!(cut[at..at + 8], persisted[at - 4079..at - 4079 + 8], "a word is old or new, whole");
                lost[word] = true;
            }
        }
    }
    assert!(survived == [true; 2] && lost == [true; 2], "survived {survived:?}, lost {lost:?}");
    let plain = Region::open("plain", Backing::Anonymous, 4096).unwrap();
    assert!(plain.power_cut(1).is_none(), "only a crash-test region draws power cuts");
}
