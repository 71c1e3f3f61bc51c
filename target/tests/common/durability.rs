//! The durability contract as the crash and power-loss tests check it: what a slot or block may
//! hold after a crash, and the contents of each version written to it.

/// One 8-byte word of `version` of slot or block `index` of `writer`, under `seed`; version 0
/// is the content never written (or trimmed): zeroes. Written words are never zero.
pub fn word(seed: u64, kind: u64, writer: usize, index: u64, version: u64, word: usize) -> u64 {
    if version == 0 {
        return 0;
    }
    let mut x = seed ^ kind.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    for part in [writer as u64, index, version, word as u64] {
        // splitmix64 steps: every input bit moves every output bit.
        x = x.wrapping_add(part).wrapping_add(0x9E37_79B9_7F4A_7C15);
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^= x >> 31;
    }
    x | 1
}

/// The `bytes` of `version` of slot or block `index` of `writer`.
pub fn pattern(seed: u64, kind: u64, writer: usize, index: u64, version: u64, bytes: usize) -> Vec<u8> {
    (0..bytes / 8).flat_map(|at| word(seed, kind, writer, index, version, at).to_le_bytes()).collect()
}

/// Whether `bytes`, found at word `first_word` of slot or block `index`, are those of `version`.
pub fn holds(bytes: &[u8], seed: u64, kind: u64, writer: usize, index: u64, version: u64, first_word: usize) -> bool {
    bytes.chunks_exact(8).enumerate().all(|(at, found)| {
        word(seed, kind, writer, index, version, first_word + at) == u64::from_le_bytes(found.try_into().unwrap())
    })
}

/// What a slot or block may hold after a crash: its last durable version, and the versions
/// written after it (answered but not yet durable, or unanswered), each with whether it was
/// answered.
#[derive(Debug, Clone, Default)]
pub struct Candidates {
    pub durable: u64,
    pub later: Vec<(u64, bool)>,
}

impl Candidates {
    /// Every version it may hold.
    pub fn versions(&self) -> impl Iterator<Item = u64> + '_ {
        std::iter::once(self.durable).chain(self.later.iter().map(|&(version, _)| version))
    }

    /// An answered write that is durable (a persistent region's WRITE, a BWRITE with FUA).
    pub fn made_durable(&mut self, version: u64) {
        self.durable = version;
        self.later.clear();
    }

    /// A FLUSH was answered: the last answered version is durable (unanswered ones after it may
    /// still have happened or not).
    pub fn flushed(&mut self) {
        if let Some(last) = self.later.iter().rposition(|&(_, answered)| answered) {
            self.durable = self.later[last].0;
            self.later.drain(..=last);
        }
    }
}
