//! Deriving seeds from seeds: splitmix64 (Steele, Lea and Flood, 2014), the one mixing function
//! behind the sampler's epoch permutations, the augmentation streams and the synthetic images.
//! Each caller keeps its own way of combining inputs, so every stream stays bit-identical.

/// splitmix64's increment, the golden ratio in 64 bits.
pub const GOLDEN_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// splitmix64's finaliser: a bijection of `u64` whose outputs of nearby inputs are unrelated.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One splitmix64 step from state `x`: the finaliser of `x + GOLDEN_GAMMA`.
pub fn splitmix64(x: u64) -> u64 {
    mix64(x.wrapping_add(GOLDEN_GAMMA))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_reference_sequence() {
        // The first outputs of splitmix64 seeded with 1234567 (Vigna's splitmix64.c).
        let mut state: u64 = 1_234_567;
        let mut next = || {
            state = state.wrapping_add(GOLDEN_GAMMA);
            mix64(state)
        };
        assert_eq!(next(), 6_457_827_717_110_365_317);
        assert_eq!(next(), 3_203_168_211_198_807_973);
        assert_eq!(splitmix64(1_234_567), 6_457_827_717_110_365_317);
    }
}
