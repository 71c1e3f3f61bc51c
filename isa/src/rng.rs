//! xorshift64*: a small seeded generator, the same on every machine, so a seed reproduces a run.
//! Sans-IO cores never draw unseeded randomness; simulators, fault injectors and tests use this.

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

    /// Uniform in `0..bound` (`bound` > 0; the modulo bias is negligible for small bounds).
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next_u64() % bound.max(1)
    }

    /// `len` random bytes.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next_u64() as u8).collect()
    }

    /// True with `probability` (0 never, 1 always).
    pub fn chance(&mut self, probability: f64) -> bool {
        probability > 0.0 && ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < probability
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn a_seed_gives_one_stream_and_chance_respects_its_bounds() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        assert!((0..100).all(|_| a.next_u64() == b.next_u64()));
        let mut zero = Rng::new(0);
        assert_ne!(zero.next_u64(), 0, "seed 0 must not stick at zero");
        assert!((0..1000).all(|_| !a.chance(0.0) && a.chance(1.0)));
        let hits = (0..10_000).filter(|_| a.chance(0.25)).count();
        assert!((2000..3000).contains(&hits), "{hits}");
    }
}
