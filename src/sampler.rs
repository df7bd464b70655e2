//! Which samples an epoch visits, in which order: a pure function of (seed, epoch), so every
//! process and every resumed run agrees on it without saved state.

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// Mixes the run seed and the epoch into one generator seed (splitmix64's finaliser), so that
/// neighbouring epochs get unrelated permutations.
fn epoch_seed(seed: u64, epoch: u64) -> u64 {
    let mut z = seed ^ epoch.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A permutation of `0..len` for this epoch.
pub fn epoch_permutation(len: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..len).collect();
    order.shuffle(&mut ChaCha8Rng::seed_from_u64(epoch_seed(seed, epoch)));
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_is_complete_and_seed_stable() {
        let a = epoch_permutation(100, 3, 1);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..100).collect::<Vec<_>>());
        assert_eq!(a, epoch_permutation(100, 3, 1));
        assert_ne!(a, epoch_permutation(100, 3, 2), "epochs differ");
        assert_ne!(a, epoch_permutation(100, 4, 1), "seeds differ");
        assert_ne!(a, (0..100).collect::<Vec<_>>(), "actually shuffled");
    }
}
