//! Megatron's rank grid: `rank = tp + t * (dp + d * pp)`, tensor-parallel peers adjacent (one
//! node), pipeline outermost; and the process groups built on it, created in the same order on
//! every rank.

use crate::comm::runtime::Runtime;
use crate::comm::{Comm, SelfComm};
use crate::error::{Error, Result};

/// This rank's coordinates in a (tp, dp, pp) layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grid {
    pub world_size: usize,
    pub rank: usize,
    pub tp: usize,
    pub dp: usize,
    pub pp: usize,
    pub tp_rank: usize,
    pub dp_rank: usize,
    pub pp_rank: usize,
}

impl Grid {
    /// The layout of `world_size` ranks with the given tensor and pipeline sizes; the
    /// data-parallel size is what remains.
    pub fn new(world_size: usize, rank: usize, tp: usize, pp: usize) -> Result<Grid> {
        if tp == 0 || pp == 0 {
            return Err(Error::Config(
                "--tensor-model-parallel-size and --pipeline-model-parallel-size must be >= 1".into(),
            ));
        }
        if !world_size.is_multiple_of(tp * pp) {
            return Err(Error::Config(format!(
                "the world of {world_size} ranks does not factor into --tensor-model-parallel-size {tp} x \
                 --pipeline-model-parallel-size {pp} x a data-parallel size (need a multiple of {})",
                tp * pp
            )));
        }
        let dp = world_size / (tp * pp);
        Ok(Grid {
            world_size,
            rank,
            tp,
            dp,
            pp,
            tp_rank: rank % tp,
            dp_rank: (rank / tp) % dp,
            pp_rank: rank / (tp * dp),
        })
    }

    pub fn single() -> Grid {
        Grid::new(1, 0, 1, 1).expect("one rank always factors")
    }

    pub fn rank_of(&self, tp_rank: usize, dp_rank: usize, pp_rank: usize) -> usize {
        tp_rank + self.tp * (dp_rank + self.dp * pp_rank)
    }

    /// Ranks that differ only in their tensor-parallel coordinate, in tp order.
    pub fn tp_group(&self) -> Vec<usize> {
        (0..self.tp).map(|t| self.rank_of(t, self.dp_rank, self.pp_rank)).collect()
    }

    pub fn dp_group(&self) -> Vec<usize> {
        (0..self.dp).map(|d| self.rank_of(self.tp_rank, d, self.pp_rank)).collect()
    }

    pub fn pp_group(&self) -> Vec<usize> {
        (0..self.pp).map(|p| self.rank_of(self.tp_rank, self.dp_rank, p)).collect()
    }

    /// The model-parallel group (tp x pp, one data-parallel replica), tp fastest.
    pub fn mp_group(&self) -> Vec<usize> {
        (0..self.pp)
            .flat_map(|p| (0..self.tp).map(move |t| (t, p)))
            .map(|(t, p)| self.rank_of(t, self.dp_rank, p))
            .collect()
    }

    /// The embedding group: the first and last pipeline stage of this replica, which sum the
    /// gradients of the tied word embedding; a group of one elsewhere and without a pipeline.
    pub fn embedding_group(&self) -> Vec<usize> {
        if self.pp > 1 && (self.pp_rank == 0 || self.pp_rank == self.pp - 1) {
            vec![self.rank_of(self.tp_rank, self.dp_rank, 0), self.rank_of(self.tp_rank, self.dp_rank, self.pp - 1)]
        } else {
            vec![self.rank]
        }
    }

    /// Short description for logs: `tp 2 x dp 4 x pp 1`.
    pub fn describe(&self) -> String {
        format!("tp {} x dp {} x pp {}", self.tp, self.dp, self.pp)
    }
}

/// The communicators of one rank, passed by value to whatever needs them.
pub struct Groups {
    pub grid: Grid,
    pub world: Box<dyn Comm>,
    pub tp: Box<dyn Comm>,
    pub dp: Box<dyn Comm>,
    pub pp: Box<dyn Comm>,
    pub mp: Box<dyn Comm>,
    pub embedding: Box<dyn Comm>,
}

impl Groups {
    /// Builds every group; each rank makes the same calls in the same order (MPI's split is
    /// collective over the world).
    pub fn new(rt: &Runtime, grid: Grid) -> Groups {
        let world: Vec<usize> = (0..grid.world_size).collect();
        Groups {
            world: rt.group(&world),
            dp: rt.group(&grid.dp_group()),
            mp: rt.group(&grid.mp_group()),
            tp: rt.group(&grid.tp_group()),
            pp: rt.group(&grid.pp_group()),
            embedding: rt.group(&grid.embedding_group()),
            grid,
        }
    }

    pub fn single() -> Groups {
        Groups {
            grid: Grid::single(),
            world: Box::new(SelfComm),
            tp: Box::new(SelfComm),
            dp: Box::new(SelfComm),
            pp: Box::new(SelfComm),
            mp: Box::new(SelfComm),
            embedding: Box::new(SelfComm),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_match_megatrons_worked_example() {
        // 16 ranks, t=2, p=4, d=2 (shared/reference/megatron.md §1.1).
        let g = |r| Grid::new(16, r, 2, 4).unwrap();
        assert_eq!(g(0).dp, 2);
        assert_eq!(g(5).tp_group(), vec![4, 5]);
        assert_eq!(g(1).dp_group(), vec![1, 3]);
        assert_eq!(g(13).dp_group(), vec![13, 15]);
        assert_eq!(g(2).pp_group(), vec![2, 6, 10, 14]);
        assert_eq!(g(7).pp_group(), vec![3, 7, 11, 15]);
        assert_eq!(g(6).mp_group(), vec![2, 3, 6, 7, 10, 11, 14, 15]);
        assert_eq!(g(3).embedding_group(), vec![3, 15]);
        assert_eq!(g(15).embedding_group(), vec![3, 15]);
        assert_eq!(g(7).embedding_group(), vec![7]);
        let c = g(11);
        assert_eq!((c.tp_rank, c.dp_rank, c.pp_rank), (1, 1, 2));
        assert_eq!(c.rank_of(1, 1, 2), 11);
    }

    #[test]
    fn a_world_that_does_not_factor_is_an_error() {
        let e = Grid::new(6, 0, 4, 1).unwrap_err().to_string();
        assert!(e.contains("6 ranks") && e.contains("--tensor-model-parallel-size 4"), "{e}");
    }
}
