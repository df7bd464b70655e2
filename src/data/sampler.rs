//! Which samples an epoch visits, in which order, and on which rank: a pure function of
//! (seed, epoch, rank, world), so every process and every resumed run agrees on it without
//! saved state or communication. The whole epoch's order is drawn before the loader sees it,
//! so it does not depend on the number of loader threads either.

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::util::seeds::{mix64, GOLDEN_GAMMA};

/// Mixes the run seed and the epoch into one generator seed (splitmix64's finaliser), so that
/// neighbouring epochs get unrelated permutations.
fn epoch_seed(seed: u64, epoch: u64) -> u64 {
    mix64(seed ^ epoch.wrapping_add(1).wrapping_mul(GOLDEN_GAMMA))
}

/// A permutation of `0..len` for this epoch.
pub fn epoch_permutation(len: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..len).collect();
    order.shuffle(&mut ChaCha8Rng::seed_from_u64(epoch_seed(seed, epoch)));
    order
}

/// How an epoch's samples are chosen (`data.sampler`), over all ranks: [`rank_shard`] splits
/// the epoch's order among them.
#[derive(Debug, Clone, PartialEq)]
pub enum Sampler {
    /// Every sample once, in a seeded random order ([`epoch_permutation`]).
    Shuffle { len: usize },
    /// `draws` samples with replacement, each class equally likely and each sample equally
    /// likely within its class: PyTorch's `WeightedRandomSampler(weights = 1 / count_c,
    /// num_samples = draws, replacement = True)`. Classes without samples are never drawn.
    Balanced { by_class: Vec<Vec<usize>>, draws: usize },
}

impl Sampler {
    /// The balanced sampler of a split whose sample `i` has class `labels[i]`, drawing `draws`
    /// samples an epoch (0: as many as there are samples).
    pub fn balanced(labels: &[usize], classes: usize, draws: usize) -> Sampler {
        let mut by_class = vec![Vec::new(); classes];
        for (index, &label) in labels.iter().enumerate() {
            if let Some(members) = by_class.get_mut(label) {
                members.push(index);
            }
        }
        by_class.retain(|members| !members.is_empty());
        let draws = if draws == 0 { labels.len() } else { draws };
        Sampler::Balanced { by_class, draws }
    }

    /// Samples per epoch, over all ranks.
    pub fn len(&self) -> usize {
        match self {
            Sampler::Shuffle { len } => *len,
            Sampler::Balanced { by_class, .. } if by_class.is_empty() => 0,
            Sampler::Balanced { draws, .. } => *draws,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The samples of epoch `epoch`, in order, before they are split among the ranks.
    pub fn epoch_order(&self, seed: u64, epoch: u64) -> Vec<usize> {
        match self {
            Sampler::Shuffle { len } => epoch_permutation(*len, seed, epoch),
            Sampler::Balanced { by_class, .. } => {
                // A stream of its own: the balanced draws do not reuse the shuffle's numbers.
                let mut rng = ChaCha8Rng::seed_from_u64(epoch_seed(seed, epoch));
                rng.set_stream(1);
                (0..self.len())
                    .map(|_| {
                        let members = &by_class[rng.random_range(0..by_class.len())];
                        members[rng.random_range(0..members.len())]
                    })
                    .collect()
            }
        }
    }
}

/// What to do when the dataset does not divide evenly among the ranks. Either way every rank
/// gets the same number of samples, so no rank waits in a collective for one that has finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnevenTail {
    /// Repeat samples from the start of the permutation, as PyTorch's DistributedSampler does.
    Pad,
    /// Leave out the last `len % world` samples of the permutation.
    Drop,
}

/// This rank's samples for the epoch: the strided part `rank, rank + world, ...` of the epoch
/// permutation, after padding or dropping its tail so that all ranks get the same count.
///
/// With strided parts, step k's global batch (the union over ranks) is a contiguous chunk of
/// the permutation, the same samples one process with `world` times the batch would see.
pub fn rank_shard(order: &[usize], rank: usize, world: usize, tail: UnevenTail) -> Vec<usize> {
    if world <= 1 {
        return order.to_vec();
    }
    let total = shard_len(order.len(), world, tail) * world;
    (rank..total).step_by(world).map(|i| order[i % order.len().max(1)]).collect()
}

/// How many samples each rank gets per epoch from a split of `len`.
pub fn shard_len(len: usize, world: usize, tail: UnevenTail) -> usize {
    let world = world.max(1);
    match tail {
        UnevenTail::Pad => len.div_ceil(world),
        UnevenTail::Drop => len / world,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_disjoint_complete_and_equal_with_drop() {
        let order = epoch_permutation(103, 9, 0);
        let world = 4;
        let shards: Vec<Vec<usize>> =
            (0..world).map(|r| rank_shard(&order, r, world, UnevenTail::Drop)).collect();
        assert!(shards.iter().all(|s| s.len() == 25), "103 / 4 rounds down to 25 each");
        let mut seen: Vec<usize> = shards.concat();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 100, "disjoint: no sample on two ranks");
    }

    #[test]
    fn padding_repeats_the_start_like_distributed_sampler() {
        let order: Vec<usize> = (0..10).collect();
        let shards: Vec<Vec<usize>> = (0..4).map(|r| rank_shard(&order, r, 4, UnevenTail::Pad)).collect();
        // torch.utils.data.DistributedSampler(range(10), 4, r, shuffle=False): indices + [0, 1],
        // then indices[r::4].
        assert_eq!(shards, vec![vec![0, 4, 8], vec![1, 5, 9], vec![2, 6, 0], vec![3, 7, 1]]);
        let mut all: Vec<usize> = shards.concat();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 10, "every sample is visited");
    }

    #[test]
    fn global_batches_are_contiguous_chunks_of_the_permutation() {
        let order = epoch_permutation(64, 1, 3);
        let (world, batch) = (2, 4);
        let shards: Vec<Vec<usize>> =
            (0..world).map(|r| rank_shard(&order, r, world, UnevenTail::Pad)).collect();
        for step in 0..64 / (world * batch) {
            let mut union: Vec<usize> =
                shards.iter().flat_map(|s| s[step * batch..(step + 1) * batch].iter().copied()).collect();
            let mut chunk = order[step * world * batch..(step + 1) * world * batch].to_vec();
            union.sort_unstable();
            chunk.sort_unstable();
            assert_eq!(union, chunk, "step {step}");
        }
    }

    /// 70/20/10 classes: over 20 epochs of 1000 draws each class is drawn a third of the
    /// time, within 4 standard deviations of the binomial; within a class, every sample is
    /// drawn, about equally often; the shuffle would draw the classes 70/20/10.
    #[test]
    fn balanced_draws_each_class_equally_often() {
        let labels: Vec<usize> = (0..1000)
            .map(|i| {
                if i < 700 {
                    0
                } else if i < 900 {
                    1
                } else {
                    2
                }
            })
            .collect();
        let sampler = Sampler::balanced(&labels, 3, 0);
        assert_eq!(sampler.len(), 1000, "0 draws: the split's size");
        let (epochs, mut per_class, mut per_sample) = (20u64, [0f64; 3], vec![0u32; 1000]);
        for epoch in 0..epochs {
            let order = sampler.epoch_order(7, epoch);
            assert_eq!(order.len(), 1000);
            for index in order {
                per_class[labels[index]] += 1.0;
                per_sample[index] += 1;
            }
        }
        let n = (epochs * 1000) as f64;
        let sd = (n * (1.0 / 3.0) * (2.0 / 3.0)).sqrt();
        for (class, count) in per_class.iter().enumerate() {
            assert!((count - n / 3.0).abs() < 4.0 * sd, "class {class}: {count} of {n}");
        }
        // Class 2's 100 samples share a third of the draws: 66.7 each on average.
        let rare = &per_sample[900..];
        assert!(rare.iter().all(|&c| c > 30), "every rare sample is drawn: {rare:?}");
        assert_eq!(sampler.epoch_order(7, 3), sampler.epoch_order(7, 3), "a function of (seed, epoch)");
        assert_ne!(sampler.epoch_order(7, 3), sampler.epoch_order(7, 4));
        assert_eq!(Sampler::balanced(&labels, 3, 250).epoch_order(7, 0).len(), 250);
    }

    #[test]
    fn balanced_draws_skip_empty_classes() {
        let sampler = Sampler::balanced(&[0, 0, 2, 2, 2], 4, 600);
        let order = sampler.epoch_order(1, 0);
        let zeros = order.iter().filter(|&&i| i < 2).count();
        assert_eq!(order.len(), 600);
        assert!((250..350).contains(&zeros), "classes 0 and 2 drawn equally, 1 and 3 never: {zeros}");
    }

    #[test]
    fn one_rank_sees_everything() {
        let order = epoch_permutation(7, 0, 0);
        assert_eq!(rank_shard(&order, 0, 1, UnevenTail::Drop), order);
    }

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
