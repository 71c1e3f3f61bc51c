//! Helpers shared by the target's integration tests: a target on a loopback port with chosen
//! regions, and a seeded random source.

#![allow(dead_code)]

use netdam_target::config::{ByteSize, Config, PollMode, RegionBackend, RegionConfig};
use netdam_target::Target;

/// A running target and the directory its files live in (removed on drop).
pub struct TestTarget {
    pub target: Target,
    pub dir: tempfile::TempDir,
}

/// A region of `size` bytes: anonymous memory when `file` is false, else a file in the data dir.
pub fn region(name: &str, size: u64, file: bool) -> RegionConfig {
    RegionConfig {
        name: name.to_string(),
        backend: if file { RegionBackend::File } else { RegionBackend::Mem },
        path: file.then(|| format!("{name}.region").into()),
        size: ByteSize(size),
    }
}

/// Starts a target on 127.0.0.1 with an ephemeral port. Tests use blocking polling so that the
/// parallel test threads do not compete with spinning workers for the machine's cores.
pub fn start(regions: Vec<RegionConfig>, workers: usize, max_datagram_bytes: usize) -> TestTarget {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: Some(dir.path().to_path_buf()),
        workers,
        poll: PollMode::Blocking,
        max_datagram_bytes,
        regions,
        ..Config::default()
    };
    let target = Target::start(&config).expect("target starts");
    TestTarget { target, dir }
}

/// xorshift64*: a small seeded generator, so a failing run can be repeated from its seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in 0..bound (bound > 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next_u64() % bound
    }

    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next_u64() as u8).collect()
    }
}

/// The seed for a randomized test: $NETDAM_SEED, or one drawn from the clock; printed first.
pub fn seed() -> u64 {
    let seed = std::env::var("NETDAM_SEED").ok().and_then(|text| text.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
    });
    println!("SEED={seed}");
    seed
}
