//! numpy's legacy `RandomState` for an integer seed (MT19937 seeded with `init_genrand`) and its
//! 1-D `shuffle`, reproduced bit for bit so our dataset indices match Megatron's; and the
//! `Generator` of `numpy.random.default_rng(seed)` (PCG64 seeded through `SeedSequence`) as far as
//! Megatron's mock data draws from it (bounded 32-bit integers).

const STATE_WORDS: usize = 624;
const SHIFT_WORDS: usize = 397;
const MATRIX_A: u32 = 0x9908_b0df;
const UPPER_MASK: u32 = 0x8000_0000;
const LOWER_MASK: u32 = 0x7fff_ffff;

/// The Mersenne Twister behind `numpy.random.RandomState(seed)`.
///
/// Megatron's GPT dataset draws every shuffle from one such generator, so the order in which
/// the shuffles run is part of the format: see `gpt_dataset`.
#[derive(Clone)]
pub struct RandomState {
    state: [u32; STATE_WORDS],
    /// The next state word to temper; `STATE_WORDS` means the state must be regenerated first.
    next: usize,
}

impl RandomState {
    /// numpy's legacy seeding for an integer seed, which is MT19937's `init_genrand`. numpy
    /// rejects seeds above `u32::MAX`, hence the type.
    pub fn new(seed: u32) -> RandomState {
        let mut state = [0u32; STATE_WORDS];
        state[0] = seed;
        for i in 1..STATE_WORDS {
            let previous = state[i - 1];
            state[i] = 1_812_433_253u32.wrapping_mul(previous ^ (previous >> 30)).wrapping_add(i as u32);
        }
        RandomState { state, next: STATE_WORDS }
    }

    /// Regenerates all 624 state words at once (the "twist").
    fn twist(&mut self) {
        for i in 0..STATE_WORDS {
            let bits = (self.state[i] & UPPER_MASK) | (self.state[(i + 1) % STATE_WORDS] & LOWER_MASK);
            let mut word = self.state[(i + SHIFT_WORDS) % STATE_WORDS] ^ (bits >> 1);
            if bits & 1 != 0 {
                word ^= MATRIX_A;
            }
            self.state[i] = word;
        }
        self.next = 0;
    }

    pub fn next_u32(&mut self) -> u32 {
        if self.next >= STATE_WORDS {
            self.twist();
        }
        let mut y = self.state[self.next];
        self.next += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// numpy's 64-bit draw from MT19937: the first 32-bit output is the high half.
    pub fn next_u64(&mut self) -> u64 {
        let high = u64::from(self.next_u32());
        (high << 32) | u64::from(self.next_u32())
    }

    /// A uniform integer in `[0, max]` by masked rejection, as numpy's `random_interval`: draw
    /// under the smallest all-ones mask covering `max` until the draw is not above `max`, with
    /// 32-bit draws while `max` fits in 32 bits and 64-bit draws beyond.
    pub fn random_interval(&mut self, max: u64) -> u64 {
        if max == 0 {
            return 0;
        }
        let mask = u64::MAX >> max.leading_zeros();
        loop {
            let draw =
                if max <= u64::from(u32::MAX) { u64::from(self.next_u32()) & mask } else { self.next_u64() & mask };
            if draw <= max {
                return draw;
            }
        }
    }

    /// numpy's legacy `RandomState.shuffle` of a 1-D array: Fisher–Yates from the last element
    /// down, swapping element `i` with a uniform pick from `[0, i]`. Arrays of length 0 or 1
    /// consume no random numbers, as in numpy.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            // The pick is at most i, so it is a valid index.
            let j = self.random_interval(i as u64) as usize;
            items.swap(i, j);
        }
    }
}

/// The 32-bit hashing constants of numpy's `SeedSequence` (Melissa O'Neill's seed_seq_fe).
const SEED_INIT_A: u32 = 0x43b0_d7e5;
const SEED_MULT_A: u32 = 0x931e_8875;
const SEED_INIT_B: u32 = 0x8b51_f9dd;
const SEED_MULT_B: u32 = 0x58f3_8ded;
const SEED_MIX_L: u32 = 0xca01_f9dd;
const SEED_MIX_R: u32 = 0x4973_f715;
const SEED_POOL: usize = 4;

/// numpy's `SeedSequence(seed)` for a non-negative integer seed and no spawn key: the entropy
/// pool that `generate_state` hashes into seeding words.
struct SeedSequence {
    pool: [u32; SEED_POOL],
}

impl SeedSequence {
    fn new(seed: u64) -> SeedSequence {
        // The seed as little-endian 32-bit words; zero is one word.
        let entropy: Vec<u32> =
            if seed >> 32 == 0 { vec![seed as u32] } else { vec![seed as u32, (seed >> 32) as u32] };
        let mut hash_const = SEED_INIT_A;
        let mut hashmix = |value: u32| {
            let mut value = value ^ hash_const;
            hash_const = hash_const.wrapping_mul(SEED_MULT_A);
            value = value.wrapping_mul(hash_const);
            value ^ (value >> 16)
        };
        let mix = |x: u32, y: u32| {
            let r = SEED_MIX_L.wrapping_mul(x).wrapping_sub(SEED_MIX_R.wrapping_mul(y));
            r ^ (r >> 16)
        };
        let mut pool = [0u32; SEED_POOL];
        for (i, word) in pool.iter_mut().enumerate() {
            *word = hashmix(entropy.get(i).copied().unwrap_or(0));
        }
        for src in 0..SEED_POOL {
            for dst in 0..SEED_POOL {
                if src != dst {
                    let h = hashmix(pool[src]);
                    pool[dst] = mix(pool[dst], h);
                }
            }
        }
        SeedSequence { pool }
    }

    /// `generate_state(n, np.uint64)`: 2n hashed 32-bit words read as n little-endian u64s.
    fn generate_u64(&self, n: usize) -> Vec<u64> {
        let mut hash_const = SEED_INIT_B;
        let words: Vec<u32> = (0..2 * n)
            .map(|i| {
                let mut value = self.pool[i % SEED_POOL] ^ hash_const;
                hash_const = hash_const.wrapping_mul(SEED_MULT_B);
                value = value.wrapping_mul(hash_const);
                value ^ (value >> 16)
            })
            .collect();
        words.chunks(2).map(|w| u64::from(w[0]) | (u64::from(w[1]) << 32)).collect()
    }
}

/// PCG's default 128-bit LCG multiplier.
const PCG_MULTIPLIER: u128 = 0x2360_ed05_1fc6_5da4_4385_df64_9fcc_f645;

/// `numpy.random.default_rng(seed)`: PCG64 (XSL-RR output) with numpy's buffered 32-bit draws.
pub struct Pcg64 {
    state: u128,
    increment: u128,
    /// The high half of the last 64-bit output, not yet used by a 32-bit draw.
    spare: Option<u32>,
}

impl Pcg64 {
    pub fn new(seed: u64) -> Pcg64 {
        let words = SeedSequence::new(seed).generate_u64(4);
        let initial = (u128::from(words[0]) << 64) | u128::from(words[1]);
        let sequence = (u128::from(words[2]) << 64) | u128::from(words[3]);
        let mut rng = Pcg64 { state: 0, increment: (sequence << 1) | 1, spare: None };
        rng.step();
        rng.state = rng.state.wrapping_add(initial);
        rng.step();
        rng
    }

    fn step(&mut self) {
        self.state = self.state.wrapping_mul(PCG_MULTIPLIER).wrapping_add(self.increment);
    }

    pub fn next_u64(&mut self) -> u64 {
        self.step();
        let folded = ((self.state >> 64) as u64) ^ (self.state as u64);
        folded.rotate_right((self.state >> 122) as u32)
    }

    /// numpy's 32-bit draw: the low half of a fresh 64-bit output, then its high half.
    pub fn next_u32(&mut self) -> u32 {
        if let Some(high) = self.spare.take() {
            return high;
        }
        let next = self.next_u64();
        self.spare = Some((next >> 32) as u32);
        next as u32
    }

    /// `integers(low, high, dtype=np.int32)` for one value: a uniform integer in `[low, high)` by
    /// Lemire's multiply-and-reject on 32-bit draws, as numpy's bounded 32-bit path.
    pub fn integer_i32(&mut self, low: i32, high: i32) -> i32 {
        assert!(low < high, "an empty range [{low}, {high})");
        let span = (i64::from(high) - i64::from(low)) as u64; // rng + 1 in numpy's terms
        if span > u64::from(u32::MAX) {
            return (i64::from(low) + i64::from(self.next_u32())) as i32;
        }
        let mut m = u64::from(self.next_u32()) * span;
        if (m as u32 as u64) < span {
            let threshold = (u64::from(u32::MAX) + 1 - span) % span;
            while ((m as u32) as u64) < threshold {
                m = u64::from(self.next_u32()) * span;
            }
        }
        (i64::from(low) + (m >> 32) as i64) as i32
    }
}

#[cfg(test)]
mod tests {
    use super::{Pcg64, RandomState};

    // Expected values come from numpy 2.4.6 (legacy RandomState, unchanged since numpy 1.17):
    //   rs = np.random.RandomState(seed); rs._bit_generator.random_raw(n)   (raw 32-bit outputs)
    //   rs = np.random.RandomState(1234); int(rs.randint(0, 2**64, dtype=np.uint64))
    //   rs = np.random.RandomState(5); rs.randint(0, 2**40, dtype=np.uint64, size=3)

    #[test]
    fn raw_outputs_match_numpy() {
        let mut rs = RandomState::new(1234);
        let raw: Vec<u32> = (0..6).map(|_| rs.next_u32()).collect();
        assert_eq!(raw, [822569775, 2137449171, 2671936806, 3512589365, 1880026316, 2629000564]);
        for (seed, first) in [
            (0u32, [2357136044u32, 2546248239, 3071714933]),
            (1, [1791095845, 4282876139, 3093770124]),
            (u32::MAX, [419326371, 479346978, 3918654476]),
        ] {
            let mut rs = RandomState::new(seed);
            assert_eq!([rs.next_u32(), rs.next_u32(), rs.next_u32()], first, "seed {seed}");
        }
    }

    #[test]
    fn wide_draws_match_numpy() {
        assert_eq!(RandomState::new(1234).next_u64(), 0x3107_6b2f_7f66_e2d3);
        // randint(0, 2**40) is masked rejection with 64-bit draws, the same path
        // random_interval takes for a bound above u32::MAX.
        let mut rs = RandomState::new(5);
        let draws: Vec<u64> = (0..3).map(|_| rs.random_interval((1 << 40) - 1)).collect();
        assert_eq!(draws, [425438759118, 1030067709629, 989404716150]);
    }

    // Also from numpy 2.4.6:
    //   rs = RandomState(1234); a = arange(10); rs.shuffle(a)
    //   rs = RandomState(42); a = arange(1000); rs.shuffle(a)
    //   rs = RandomState(7); a = arange(100000, dtype=uint32); rs.shuffle(a)
    //   rs = RandomState(3); shuffle arange(5), then arange(7), arange(1), arange(0), then one raw draw
    #[test]
    fn shuffles_match_numpy() {
        let mut items: Vec<u32> = (0..10).collect();
        RandomState::new(1234).shuffle(&mut items);
        assert_eq!(items, [7, 2, 9, 1, 0, 8, 4, 5, 6, 3]);

        let mut items: Vec<i64> = (0..1000).collect();
        RandomState::new(42).shuffle(&mut items);
        assert_eq!(items[..8], [521, 737, 740, 660, 411, 678, 626, 513]);
        assert_eq!(items[992..], [20, 700, 71, 106, 270, 860, 435, 102]);

        let mut items: Vec<u32> = (0..100_000).collect();
        RandomState::new(7).shuffle(&mut items);
        assert_eq!(items[..6], [33909, 92307, 89107, 9538, 31008, 71305]);
        assert_eq!(items[99_994..], [66455, 53459, 10742, 49689, 58564, 61615]);
        let checksum = items.iter().enumerate().fold(0u64, |acc, (i, &v)| acc.wrapping_add(i as u64 * u64::from(v)));
        assert_eq!(checksum % (1 << 32), 1916621237);

        // Consecutive shuffles share one stream, and lengths 0 and 1 draw nothing.
        let mut rs = RandomState::new(3);
        let mut first: Vec<u8> = (0..5).collect();
        let mut second: Vec<i32> = (0..7).collect();
        rs.shuffle(&mut first);
        rs.shuffle(&mut second);
        rs.shuffle(&mut [0u8]);
        rs.shuffle::<u8>(&mut []);
        assert_eq!(first, [3, 4, 1, 0, 2]);
        assert_eq!(second, [4, 2, 3, 1, 5, 6, 0]);
        assert_eq!(rs.next_u32(), 3849549514);
    }

    // numpy 2.4.6: np.random.default_rng(seed).bit_generator.random_raw(3), and
    // default_rng(seed).integers(1, 4096, size=12, dtype=np.int32) (Megatron's mock lengths).
    #[test]
    fn default_rng_matches_numpy() {
        let mut rng = Pcg64::new(0);
        assert_eq!(
            [rng.next_u64(), rng.next_u64(), rng.next_u64()],
            [0xa30febcfd9c2825f, 0x4510bdf882d9d721, 0x0a7d3da94ecde8b8]
        );
        let mut rng = Pcg64::new(0);
        let draws: Vec<i32> = (0..12).map(|_| rng.integer_i32(1, 4096)).collect();
        assert_eq!(draws, [3484, 2609, 2094, 1105, 1261, 168, 309, 68, 718, 3331, 2660, 3738]);
    }
}
