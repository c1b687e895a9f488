//! Megatron's rank grid: `rank = tp + t * (cp + c * (dp + d * pp))`, tensor-parallel peers
//! adjacent (one node), then the context-parallel ranks that split each sequence, pipeline
//! outermost (Megatron's tp-cp-dp-pp order); and the process groups built on it, created in the
//! same order on every rank.

use crate::comm::runtime::Runtime;
use crate::comm::{Comm, SelfComm};
use crate::error::{Error, Result};

/// How a tensor-parallel group splits each layer (`--tensor-parallel-mode`): Megatron's 1-D split
/// of weights along one dimension, or the SUMMA layouts of Optimus (2-D: a q x q grid, t = q²) and
/// Tesseract (2.5-D: d stacked q x q grids, t = d q²), which split weights and activations into
/// blocks (docs/design.md, 2-D and 2.5-D tensor parallelism). 2-D is the depth-1 case of 2.5-D.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorMode {
    OneD,
    Summa { q: usize, depth: usize },
}

impl TensorMode {
    /// The mode from `--tensor-parallel-mode` and `--tesseract-depth` for a group of `t` ranks;
    /// a size that is not q² (2-D) or d q² (2.5-D) is an error naming the sizes that would work.
    pub fn new(mode: &str, depth: Option<usize>, t: usize) -> Result<TensorMode> {
        let depth_flag = |d: usize| -> Result<usize> {
            if d == 0 {
                return Err(Error::flag("--tesseract-depth", 0, "a positive whole number"));
            }
            Ok(d)
        };
        match mode {
            "1d" => {
                if depth.is_some() {
                    return Err(Error::Config("--tesseract-depth needs --tensor-parallel-mode 2.5d".into()));
                }
                Ok(TensorMode::OneD)
            }
            "2d" | "2.5d" => {
                let d = match (mode, depth) {
                    ("2d", Some(_)) => {
                        return Err(Error::Config(
                            "--tesseract-depth is for --tensor-parallel-mode 2.5d (2-D has depth 1)".into(),
                        ))
                    }
                    ("2d", None) => 1,
                    (_, None) => {
                        return Err(Error::Config("--tensor-parallel-mode 2.5d needs --tesseract-depth d".into()))
                    }
                    (_, Some(d)) => depth_flag(d)?,
                };
                let q = (1..=t).find(|q| q * q * d >= t).unwrap_or(1);
                if q * q * d != t || q < 2 {
                    let what = if d == 1 {
                        "a square q x q grid with q >= 2 (4, 9, 16, ...)".to_string()
                    } else {
                        format!(
                            "d x q x q with --tesseract-depth {d} and q >= 2 ({}, {}, {}, ...)",
                            4 * d,
                            9 * d,
                            16 * d
                        )
                    };
                    return Err(Error::Config(format!(
                        "--tensor-model-parallel-size {t} does not form {what}, which --tensor-parallel-mode {mode} needs"
                    )));
                }
                Ok(TensorMode::Summa { q, depth: d })
            }
            _ => Err(Error::flag("--tensor-parallel-mode", format!("'{mode}'"), "1d, 2d or 2.5d")),
        }
    }

    /// `1d`, `2d (q 2)`, `2.5d (q 2, depth 2)`.
    pub fn describe(&self) -> String {
        match *self {
            TensorMode::OneD => "1d".into(),
            TensorMode::Summa { q, depth: 1 } => format!("2d (q {q})"),
            TensorMode::Summa { q, depth } => format!("2.5d (q {q}, depth {depth})"),
        }
    }
}

/// Megatron's `--cp-comm-type`: how a context-parallel group computes attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpCommType {
    /// A ring passing key/value blocks (Megatron's default).
    P2p,
    /// Keys and values all-gathered, each rank's queries attending to them.
    AllGather,
    /// The all-to-all swap of positions for heads (DeepSpeed Ulysses).
    A2a,
    /// All-to-all inside `--hierarchical-context-parallel-sizes`' inner groups, a ring across.
    A2aP2p,
}

impl CpCommType {
    pub fn parse(s: &str) -> Result<CpCommType> {
        match s {
            "p2p" => Ok(CpCommType::P2p),
            "all_gather" => Ok(CpCommType::AllGather),
            "a2a" => Ok(CpCommType::A2a),
            "a2a+p2p" => Ok(CpCommType::A2aP2p),
            _ => Err(Error::flag("--cp-comm-type", format!("'{s}'"), "p2p, all_gather, a2a or a2a+p2p")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            CpCommType::P2p => "p2p",
            CpCommType::AllGather => "all_gather",
            CpCommType::A2a => "a2a",
            CpCommType::A2aP2p => "a2a+p2p",
        }
    }
}

/// A rank's place in a SUMMA grid: tensor-parallel rank `col + q * row + q² * dep`
/// (Colossal-AI's order, docs/design.md): row groups are q adjacent ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SummaCoord {
    pub q: usize,
    pub depth: usize,
    pub row: usize,
    pub col: usize,
    pub dep: usize,
}

impl SummaCoord {
    pub fn of(tp_rank: usize, q: usize, depth: usize) -> SummaCoord {
        SummaCoord { q, depth, col: tp_rank % q, row: (tp_rank / q) % q, dep: tp_rank / (q * q) }
    }
    pub fn tp_rank(&self, row: usize, col: usize, dep: usize) -> usize {
        col + self.q * row + self.q * self.q * dep
    }
    /// The batch block this rank's activations hold: depth layer, then row within it.
    pub fn batch_block(&self) -> usize {
        self.dep * self.q + self.row
    }
}

/// This rank's coordinates in a (tp, cp, dp, pp) layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grid {
    pub world_size: usize,
    pub rank: usize,
    pub tp: usize,
    /// Context-parallel ranks splitting each sequence (`--context-parallel-size`; 1: none).
    pub cp: usize,
    pub dp: usize,
    pub pp: usize,
    pub tp_rank: usize,
    pub cp_rank: usize,
    pub dp_rank: usize,
    pub pp_rank: usize,
    pub tensor_mode: TensorMode,
    /// Whether the pipeline places its chunks in a V (zb-v): the first and last virtual stage
    /// both on stage 0.
    pub pipeline_v: bool,
    /// Under `--cp-comm-type a2a+p2p`, the size of the inner groups of adjacent CP ranks that
    /// swap heads (the outer groups, `cp / cp_a2a` ranks, run the ring); 1 otherwise.
    pub cp_a2a: usize,
}

impl Grid {
    /// The layout of `world_size` ranks with the given tensor and pipeline sizes; the
    /// data-parallel size is what remains.
    pub fn new(world_size: usize, rank: usize, tp: usize, pp: usize) -> Result<Grid> {
        Grid::with_context(world_size, rank, tp, 1, pp)
    }

    /// The layout with `cp` context-parallel ranks per sequence as well.
    pub fn with_context(world_size: usize, rank: usize, tp: usize, cp: usize, pp: usize) -> Result<Grid> {
        if tp == 0 || pp == 0 || cp == 0 {
            return Err(Error::Config(
                "--tensor-model-parallel-size, --context-parallel-size and --pipeline-model-parallel-size must \
                 be >= 1"
                    .into(),
            ));
        }
        let cp_part = if cp > 1 { format!("--context-parallel-size {cp} x ") } else { String::new() };
        if !world_size.is_multiple_of(tp * cp * pp) {
            return Err(Error::Config(format!(
                "the world of {world_size} ranks does not factor into --tensor-model-parallel-size {tp} x \
                 {cp_part}--pipeline-model-parallel-size {pp} x a data-parallel size (need a multiple of {})",
                tp * cp * pp
            )));
        }
        let dp = world_size / (tp * cp * pp);
        Ok(Grid {
            world_size,
            rank,
            tp,
            cp,
            dp,
            pp,
            tp_rank: rank % tp,
            cp_rank: (rank / tp) % cp,
            dp_rank: (rank / (tp * cp)) % dp,
            pp_rank: rank / (tp * cp * dp),
            tensor_mode: TensorMode::OneD,
            pipeline_v: false,
            cp_a2a: 1,
        })
    }

    /// The same layout with the tensor-parallel group split as `mode` says.
    pub fn with_tensor_mode(self, mode: TensorMode) -> Grid {
        if let TensorMode::Summa { q, depth } = mode {
            assert_eq!(q * q * depth, self.tp, "a SUMMA grid fills the tensor-parallel group");
        }
        Grid { tensor_mode: mode, ..self }
    }

    /// The same layout with the pipeline's chunks in a V (`v`) or not.
    pub fn with_v_pipeline(self, v: bool) -> Grid {
        Grid { pipeline_v: v && self.pp > 1, ..self }
    }

    /// The same layout with a2a+p2p's inner groups of `a2a` adjacent context-parallel ranks.
    pub fn with_cp_levels(self, a2a: usize) -> Grid {
        assert!(a2a >= 1 && self.cp.is_multiple_of(a2a), "the inner groups tile the context-parallel group");
        Grid { cp_a2a: a2a, ..self }
    }

    /// This rank's a2a+p2p inner group (adjacent CP ranks, `cp_a2a` of them) and outer group (the
    /// CP ranks at the same place in their inner groups), both in CP order.
    pub fn cp_level_groups(&self) -> [Vec<usize>; 2] {
        let (a, group) = (self.cp_a2a, self.cp_group());
        let first = self.cp_rank / a * a;
        [group[first..first + a].to_vec(), group.iter().skip(self.cp_rank % a).step_by(a).copied().collect()]
    }

    /// This rank's SUMMA coordinates (None under 1-D tensor parallelism).
    pub fn summa(&self) -> Option<SummaCoord> {
        match self.tensor_mode {
            TensorMode::OneD => None,
            TensorMode::Summa { q, depth } => Some(SummaCoord::of(self.tp_rank, q, depth)),
        }
    }

    /// SUMMA row group: same row and depth layer, every column, in column order (this rank's
    /// hidden block varies along it). A group of one under 1-D.
    pub fn summa_row_group(&self) -> Vec<usize> {
        match self.summa() {
            None => vec![self.rank],
            Some(c) => (0..c.q).map(|j| self.rank_of(c.tp_rank(c.row, j, c.dep), self.dp_rank, self.pp_rank)).collect(),
        }
    }

    /// SUMMA column group: same column and depth layer, every row, in row order.
    pub fn summa_col_group(&self) -> Vec<usize> {
        match self.summa() {
            None => vec![self.rank],
            Some(c) => (0..c.q).map(|i| self.rank_of(c.tp_rank(i, c.col, c.dep), self.dp_rank, self.pp_rank)).collect(),
        }
    }

    /// 2.5-D depth group: same row and column in every depth layer (they hold the same weight
    /// blocks and different batch slices, so their gradients are summed once per step).
    pub fn depth_group(&self) -> Vec<usize> {
        match self.summa() {
            None => vec![self.rank],
            Some(c) => {
                (0..c.depth).map(|k| self.rank_of(c.tp_rank(c.row, c.col, k), self.dp_rank, self.pp_rank)).collect()
            }
        }
    }

    /// Ranks holding the same parameter shard and different data: the data-parallel group, times
    /// the context-parallel group (each holds other positions of the same samples), times the
    /// depth layers under 2.5-D (depth-major within each data-parallel replica), in the order
    /// gradient reduction and ZeRO-1 sharding use.
    pub fn replica_group(&self) -> Vec<usize> {
        let Some(c) = self.summa() else {
            let (t, p) = (self.tp_rank, self.pp_rank);
            return (0..self.dp)
                .flat_map(|d| (0..self.cp).map(move |c| (c, d)))
                .map(|(c, d)| self.rank_at(t, c, d, p))
                .collect();
        };
        (0..self.dp)
            .flat_map(|d| (0..c.depth).map(move |k| (d, k)))
            .map(|(d, k)| self.rank_of(c.tp_rank(c.row, c.col, k), d, self.pp_rank))
            .collect()
    }

    pub fn single() -> Grid {
        Grid::new(1, 0, 1, 1).expect("one rank always factors")
    }

    /// The rank at these coordinates and this rank's context-parallel one.
    pub fn rank_of(&self, tp_rank: usize, dp_rank: usize, pp_rank: usize) -> usize {
        self.rank_at(tp_rank, self.cp_rank, dp_rank, pp_rank)
    }

    pub fn rank_at(&self, tp_rank: usize, cp_rank: usize, dp_rank: usize, pp_rank: usize) -> usize {
        tp_rank + self.tp * (cp_rank + self.cp * (dp_rank + self.dp * pp_rank))
    }

    /// Ranks that hold the other positions of this rank's sequences, in cp order.
    pub fn cp_group(&self) -> Vec<usize> {
        (0..self.cp).map(|c| self.rank_at(self.tp_rank, c, self.dp_rank, self.pp_rank)).collect()
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
    /// gradients of the tied word embedding; a group of one elsewhere, without a pipeline, and
    /// under a V (stage 0 holds both copies, `sum_tied_within_stage`).
    pub fn embedding_group(&self) -> Vec<usize> {
        if self.pp > 1 && !self.pipeline_v && (self.pp_rank == 0 || self.pp_rank == self.pp - 1) {
            vec![self.rank_of(self.tp_rank, self.dp_rank, 0), self.rank_of(self.tp_rank, self.dp_rank, self.pp - 1)]
        } else {
            vec![self.rank]
        }
    }

    /// Short description for logs: `tp 2 x dp 4 x pp 1`, `tp 2 x cp 2 x dp 1 x pp 2`, or
    /// `tp 8 [2.5d (q 2, depth 2)] x ...`.
    pub fn describe(&self) -> String {
        let cp = if self.cp > 1 { format!(" x cp {}", self.cp) } else { String::new() };
        match self.tensor_mode {
            TensorMode::OneD => format!("tp {}{cp} x dp {} x pp {}", self.tp, self.dp, self.pp),
            m => format!("tp {} [{}]{cp} x dp {} x pp {}", self.tp, m.describe(), self.dp, self.pp),
        }
    }
}

/// The communicators of one rank, passed by value to whatever needs them.
pub struct Groups {
    pub grid: Grid,
    pub world: Box<dyn Comm>,
    pub tp: Box<dyn Comm>,
    pub dp: Box<dyn Comm>,
    pub pp: Box<dyn Comm>,
    /// The context-parallel group (a group of one without context parallelism), and a2a+p2p's
    /// inner (all-to-all) and outer (ring) groups (`Grid::cp_level_groups`; of one otherwise).
    pub cp: Box<dyn Comm>,
    pub cp_levels: [Box<dyn Comm>; 2],
    pub mp: Box<dyn Comm>,
    pub embedding: Box<dyn Comm>,
    /// SUMMA groups (groups of one under 1-D): the row (hidden blocks), the column (batch
    /// blocks), the depth layers, and data-parallel x depth (the ranks that sum gradients).
    pub summa_row: Box<dyn Comm>,
    pub summa_col: Box<dyn Comm>,
    pub depth: Box<dyn Comm>,
    pub replica: Box<dyn Comm>,
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
            summa_row: rt.group(&grid.summa_row_group()),
            summa_col: rt.group(&grid.summa_col_group()),
            depth: rt.group(&grid.depth_group()),
            replica: rt.group(&grid.replica_group()),
            cp: rt.group(&grid.cp_group()),
            cp_levels: grid.cp_level_groups().map(|g| rt.group(&g)),
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
            cp: Box::new(SelfComm),
            cp_levels: [Box::new(SelfComm), Box::new(SelfComm)],
            mp: Box::new(SelfComm),
            embedding: Box::new(SelfComm),
            summa_row: Box::new(SelfComm),
            summa_col: Box::new(SelfComm),
            depth: Box::new(SelfComm),
            replica: Box::new(SelfComm),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_match_megatrons_worked_example() {
        // 16 ranks, t=2, p=4, d=2 (docs/design.md, The rank grid).
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
    fn summa_groups_follow_the_col_row_depth_order() {
        // 16 ranks: tp 8 as 2.5-D [q 2, depth 2], dp 2, pp 1.
        let g = |r| Grid::new(16, r, 8, 1).unwrap().with_tensor_mode(TensorMode::Summa { q: 2, depth: 2 });
        let c = g(13).summa().unwrap(); // tp rank 5 of replica 1: col 1, row 0, dep 1
        assert_eq!((c.col, c.row, c.dep, c.batch_block()), (1, 0, 1, 2));
        assert_eq!(g(13).summa_row_group(), vec![12, 13]);
        assert_eq!(g(13).summa_col_group(), vec![13, 15]);
        assert_eq!(g(13).depth_group(), vec![9, 13]);
        assert_eq!(g(13).replica_group(), vec![1, 5, 9, 13]);
        let one = Grid::new(16, 13, 8, 1).unwrap();
        assert_eq!(one.summa_row_group(), vec![13]);
        assert_eq!(one.replica_group(), one.dp_group());
        assert!(g(0).describe().contains("2.5d (q 2, depth 2)"));
    }

    #[test]
    fn tensor_modes_check_the_group_size() {
        assert_eq!(TensorMode::new("1d", None, 6).unwrap(), TensorMode::OneD);
        assert_eq!(TensorMode::new("2d", None, 4).unwrap(), TensorMode::Summa { q: 2, depth: 1 });
        assert_eq!(TensorMode::new("2.5d", Some(2), 8).unwrap(), TensorMode::Summa { q: 2, depth: 2 });
        assert_eq!(TensorMode::new("2.5d", Some(1), 9).unwrap(), TensorMode::Summa { q: 3, depth: 1 });
        for (mode, depth, t, needle) in [
            ("2d", None, 8, "does not form a square q x q grid"),
            ("2d", None, 1, "does not form a square"),
            ("2.5d", Some(2), 4, "d x q x q with --tesseract-depth 2"),
            ("2.5d", None, 8, "needs --tesseract-depth"),
            ("2.5d", Some(0), 8, "--tesseract-depth"),
            ("2d", Some(2), 8, "is for --tensor-parallel-mode 2.5d"),
            ("1d", Some(2), 8, "needs --tensor-parallel-mode 2.5d"),
            ("3d", None, 8, "1d, 2d or 2.5d"),
        ] {
            let e = TensorMode::new(mode, depth, t).unwrap_err().to_string();
            assert!(e.contains(needle), "{mode} {depth:?} {t}: {e}");
        }
    }

    #[test]
    fn context_parallel_ranks_sit_between_tensor_and_data() {
        // 16 ranks, t=2, c=2, p=2, d=2: Megatron's tp-cp-dp-pp order.
        let g = |r| Grid::with_context(16, r, 2, 2, 2).unwrap();
        let c = g(13); // 13 = 1 + 2 * (0 + 2 * (1 + 2 * 1))
        assert_eq!((c.tp_rank, c.cp_rank, c.dp_rank, c.pp_rank), (1, 0, 1, 1));
        assert_eq!(c.tp_group(), vec![12, 13]);
        assert_eq!(c.cp_group(), vec![13, 15]);
        assert_eq!(c.dp_group(), vec![9, 13]);
        assert_eq!(c.pp_group(), vec![5, 13]);
        assert_eq!(c.replica_group(), vec![9, 11, 13, 15]);
        assert_eq!(c.mp_group(), vec![4, 5, 12, 13]);
        assert_eq!(c.rank_at(1, 0, 1, 1), 13);
        assert_eq!(c.describe(), "tp 2 x cp 2 x dp 2 x pp 2");
        let e = Grid::with_context(12, 0, 2, 4, 1).unwrap_err().to_string();
        assert!(e.contains("--context-parallel-size 4") && e.contains("multiple of 8"), "{e}");
    }

    #[test]
    fn a_world_that_does_not_factor_is_an_error() {
        let e = Grid::new(6, 0, 4, 1).unwrap_err().to_string();
        assert!(e.contains("6 ranks") && e.contains("--tensor-model-parallel-size 4"), "{e}");
    }
}
