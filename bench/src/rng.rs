//! xorshift64*: a small seeded generator, the same on every machine, so a seed reproduces a run.

/// A seeded pseudo-random source.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed` (0 is replaced by 1: xorshift must not start at zero).
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// True with `probability` (0 never, 1 always).
    pub fn chance(&mut self, probability: f64) -> bool {
        probability > 0.0 && ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < probability
    }
}
