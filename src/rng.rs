//! Counter-based random numbers (Philox-4x32-10): every weight element and every sampling draw is
//! a pure function of (seed, stream name, index), so any rank can generate exactly its own shard.
//! Also `fill`, the deterministic operands of the GEMM tests and the benchmarks.

/// One Philox-4x32-10 block: 128 random bits from a 128-bit counter and a 64-bit key.
pub fn philox4x32(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    const M0: u64 = 0xD251_1F53;
    const M1: u64 = 0xCD9E_8D57;
    const W0: u32 = 0x9E37_79B9;
    const W1: u32 = 0xBB67_AE85;
    let (mut c, mut k) = (counter, key);
    for round in 0..10 {
        if round > 0 {
            k[0] = k[0].wrapping_add(W0);
            k[1] = k[1].wrapping_add(W1);
        }
        let p0 = M0 * c[0] as u64;
        let p1 = M1 * c[2] as u64;
        c = [((p1 >> 32) as u32) ^ c[1] ^ k[0], p1 as u32, ((p0 >> 32) as u32) ^ c[3] ^ k[1], p0 as u32];
    }
    c
}

/// 64-bit FNV-1a, used to turn a parameter or stream name into part of a Philox key.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The Philox key of stream `name` under `seed`.
pub fn key(seed: u64, name: &str) -> [u32; 2] {
    let h = fnv1a64(name.as_bytes()) ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    [h as u32, (h >> 32) as u32]
}

/// A named stream of random numbers under a seed. `normal(i)` and `uniform(i)` are pure functions
/// of the index, so a shard of a tensor is generated without generating what precedes it.
#[derive(Clone, Copy, Debug)]
pub struct Stream {
    key: [u32; 2],
    /// Distinguishes uses of one name (weight init, dropout, sampling) in the counter's top word.
    domain: u32,
}

impl Stream {
    pub fn new(seed: u64, name: &str, domain: u32) -> Stream {
        Stream { key: key(seed, name), domain }
    }

    fn block(&self, index: u64, extra: u32) -> [u32; 4] {
        philox4x32([index as u32, (index >> 32) as u32, extra, self.domain], self.key)
    }

    /// A uniform draw in the open interval (0, 1) with 24 bits of resolution.
    pub fn uniform(&self, index: u64, extra: u32) -> f64 {
        let r = self.block(index, extra)[0];
        ((r >> 8) as f64 + 0.5) / (1u64 << 24) as f64
    }

    /// A standard normal draw (Box-Muller on the first two words of the block).
    pub fn normal(&self, index: u64) -> f64 {
        let r = self.block(index, 0);
        let u1 = ((r[0] as f64) + 0.5) / 4_294_967_296.0;
        let u2 = (r[1] as f64) / 4_294_967_296.0;
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

/// Deterministic values in [-1, 1): a xorshift64 stream from `seed`, for test and benchmark
/// operands (the GEMM tests, `bench gemm`, the CUDA benches), not for anything trained.
pub fn fill(len: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn philox_matches_the_published_known_answer() {
        // Known-answer vectors of the Random123 distribution for philox4x32-10.
        assert_eq!(philox4x32([0; 4], [0; 2]), [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
        assert_eq!(philox4x32([u32::MAX; 4], [u32::MAX; 2]), [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]);
        assert_eq!(
            philox4x32([0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344], [0xa4093822, 0x299f31d0]),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }

    #[test]
    fn normal_draws_have_unit_moments_and_depend_on_name_and_seed() {
        let s = Stream::new(1234, "decoder.layers.0.mlp.linear_fc1.weight", 0);
        let n = 200_000;
        let (mut sum, mut sq) = (0.0, 0.0);
        for i in 0..n {
            let x = s.normal(i);
            sum += x;
            sq += x * x;
        }
        let mean = sum / n as f64;
        let var = sq / n as f64 - mean * mean;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.01, "var {var}");
        let other_name = Stream::new(1234, "decoder.layers.1.mlp.linear_fc1.weight", 0);
        let other_seed = Stream::new(1235, "decoder.layers.0.mlp.linear_fc1.weight", 0);
        assert_ne!(s.normal(7), other_name.normal(7));
        assert_ne!(s.normal(7), other_seed.normal(7));
        assert_eq!(s.normal(7), Stream::new(1234, "decoder.layers.0.mlp.linear_fc1.weight", 0).normal(7));
    }

    #[test]
    fn fill_gives_the_same_values_as_ever() {
        // The GEMM tests' operands and the benchmarks' inputs, bit for bit (0.71958816, -0.2113974, ...).
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        assert_eq!(bits(fill(4, 1)), [0x3f3836ee, 0xbe587890, 0xbd1f0640, 0xbf1f41f6]);
        assert_eq!(bits(fill(2, 7)), [0x3f6c7eea, 0x3f599dd2]);
    }
}
