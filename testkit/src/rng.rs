//! Deterministic random numbers for test inputs (xorshift64*): the same
//! seed gives the same inputs on every machine, so a failure reproduces.

/// Name of the variable that replays a randomised test's seed.
pub const SEED_ENV: &str = "WEFT_TEST_SEED";

/// A xorshift64* generator, with its seed.
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
    seed: u64,
}

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

impl Rng {
    /// The generator of a fixed test seed.
    pub fn new(seed: u64) -> Rng {
        Rng {
            state: seed.wrapping_mul(GOLDEN) | 1,
            seed,
        }
    }

    /// The generator whose state is `state` (made odd, so never stuck at zero).
    pub fn from_state(state: u64) -> Rng {
        Rng {
            state: state | 1,
            seed: state,
        }
    }

    /// A generator seeded from `$WEFT_TEST_SEED`, else from the clock (a
    /// fresh draw every run), mixed with `salt` so the tests of one run
    /// differ. Failure messages print [`Rng::seed`]; setting the variable
    /// to it replays the run.
    pub fn from_env(salt: u64) -> Rng {
        let seed = match std::env::var(SEED_ENV) {
            Ok(s) => s
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("{SEED_ENV}={s:?} is not a whole number")),
            Err(_) => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64),
        };
        Rng {
            state: (seed ^ salt.wrapping_mul(GOLDEN)) | 1,
            seed,
        }
    }

    /// This generator's seed (what `WEFT_TEST_SEED` replays).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The next 64 random bits (a method, not `Iterator`: the stream never ends).
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        self.state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1), 24 bits.
    pub fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in [-scale, scale), never exactly zero.
    pub fn val(&mut self, scale: f32) -> f32 {
        let v = (self.unit() * 2.0 - 1.0) * scale;
        if v == 0.0 {
            scale * 0.5
        } else {
            v
        }
    }

    /// `n` values of [`Rng::val`].
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.val(scale)).collect()
    }

    /// Activation-like values: a random scale per row (10^-2..10^1), a few
    /// outliers, some tiny entries.
    pub fn rows(&mut self, rows: usize, cols: usize) -> Vec<f32> {
        let mut out = Vec::with_capacity(rows * cols);
        for _ in 0..rows {
            let scale = 10f32.powf(self.unit() * 3.0 - 2.0);
            for _ in 0..cols {
                let r = self.next() % 64;
                let v = self.val(scale);
                out.push(match r {
                    0 => v * 20.0,
                    1 => v * 1e-4,
                    _ => v,
                });
            }
        }
        out
    }

    /// A row of `n` values uniform in ±scale around an offset (zero half of
    /// the time), the scale drawn from `10^lo..10^hi`; never all zero.
    pub fn spread_row(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        let scale = 10f32.powf(lo + self.unit() * (hi - lo));
        let offset = if self.next().is_multiple_of(2) {
            0.0
        } else {
            (self.unit() - 0.5) * scale
        };
        (0..n)
            .map(|_| offset + (self.unit() * 2.0 - 1.0) * scale)
            .collect()
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// Uniform in `lo..hi` (lo < hi).
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_one_sequence() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        let xs: Vec<u64> = (0..8).map(|_| a.next()).collect();
        let ys: Vec<u64> = (0..8).map(|_| b.next()).collect();
        assert_eq!(xs, ys);
        assert_ne!(xs, (0..8).map(|_| Rng::new(8).next()).collect::<Vec<_>>());
        // Seed `s` starts the state at `s * GOLDEN | 1`.
        assert_eq!(Rng::new(1).next(), {
            let mut s = GOLDEN | 1;
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            s.wrapping_mul(0x2545_F491_4F6C_DD1D)
        });
    }

    #[test]
    fn values_stay_in_their_ranges() {
        let mut r = Rng::new(3);
        for _ in 0..10_000 {
            let u = r.unit();
            assert!((0.0..1.0).contains(&u), "unit {u}");
            let v = r.val(2.5);
            assert!(v != 0.0 && (-2.5..2.5).contains(&v), "val {v}");
            let k = r.range(5, 9);
            assert!((5..9).contains(&k), "range {k}");
        }
        assert!(r.spread_row(64, -3.0, 2.0).iter().any(|v| *v != 0.0));
    }
}
