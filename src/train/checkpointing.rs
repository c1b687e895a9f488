//! Checkpoint glue of the training loop: the run's position (`Progress`), saving every chunk's
//! weights, whole AdamW moments and the run's metadata as one shard per model-parallel rank
//! (`checkpoint::begin` / `write_shard` / `commit`), and restoring them, refusing a checkpoint of
//! another layout or model shape with a line that says which.

use super::chunk::{Chunk, Optimizer};
use crate::checkpoint::convert::{placement_name, FullCheckpoint};
use crate::checkpoint::shape::{model_from_shard, model_meta};
use crate::checkpoint::{self, SavedTensor, Shard};
use crate::comm::ReduceOp;
use crate::config::LoadParts;
use crate::config::TrainConfig;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::optim::scaler::LossScaler;
use crate::parallel::grid::{Grid, Groups};
use std::collections::BTreeMap;
use std::path::Path;

/// Where the run stands: the iterations done, the samples consumed, the loss scaler.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Progress {
    pub iteration: u64,
    pub consumed_train: u64,
    pub consumed_valid: u64,
    /// The fp16 loss scaler's state, when there is one.
    pub scaler: Option<LossScaler>,
    /// The consumed samples at which the learning-rate schedule started counting: 0, or where
    /// `--no-load-optim` restarted it (Megatron's scheduler counts from 0 again there).
    pub lr_schedule_start: u64,
}

impl Progress {
    /// The samples the learning-rate and weight-decay schedules have counted.
    pub fn schedule_samples(&self) -> u64 {
        self.consumed_train - self.lr_schedule_start
    }
}

/// Saves weights, whole AdamW moments and the run's position as the checkpoint of
/// `progress.iteration` in `dir`, one shard per model-parallel rank.
pub(super) fn save_checkpoint<D: Device>(
    dir: &Path,
    dev: &D,
    groups: &Groups,
    chunks: &[Chunk<D>],
    cfg: &TrainConfig,
    progress: Progress,
    say: bool,
) -> Result<()> {
    let grid = &groups.grid;
    let mut shard = Shard::default();
    let first = &chunks[0];
    let meta = [
        ("format", "trident-checkpoint".to_string()),
        ("iteration", progress.iteration.to_string()),
        ("consumed_train_samples", progress.consumed_train.to_string()),
        ("consumed_valid_samples", progress.consumed_valid.to_string()),
        ("lr_schedule_samples", progress.schedule_samples().to_string()),
        ("adam_step", first.opt.step_count().to_string()),
        ("seed", cfg.seed.to_string()),
        ("rng", "philox4x32-10 keyed by (seed, name); no other state".to_string()),
        ("seq_length", cfg.seq_length.to_string()),
        ("tokenizer", cfg.tokenizer_type.to_string()),
        ("make_vocab_size_divisible_by", cfg.vocab_divisible_by.to_string()),
        ("tensor_model_parallel_size", grid.tp.to_string()),
        ("tensor_model_parallel_rank", grid.tp_rank.to_string()),
        ("pipeline_model_parallel_size", grid.pp.to_string()),
        ("pipeline_model_parallel_rank", grid.pp_rank.to_string()),
        ("virtual_pipeline_chunks", chunks.len().to_string()),
        ("virtual_pipeline_placement", placement_name(grid.pipeline_v).to_string()),
        ("decoder_first_pipeline_num_layers", cfg.first_stage_layers.map_or("none".into(), |n| n.to_string())),
        ("decoder_last_pipeline_num_layers", cfg.last_stage_layers.map_or("none".into(), |n| n.to_string())),
        ("data_parallel_size", grid.dp.to_string()),
        ("sequence_parallel", first.model.mp.sequence_parallel.to_string()),
        ("tensor_parallel_mode", grid.tensor_mode.describe()),
        ("summa_q", grid.summa().map_or(0, |c| c.q).to_string()),
        ("tesseract_depth", grid.summa().map_or(0, |c| c.depth).to_string()),
    ];
    if cfg.no_save_optim {
        // Megatron's --no-save-optim: no AdamW moments, no loss scaler; loads start them fresh.
        shard.meta.insert("optimizer_state".into(), "none".into());
    } else if let Some(sc) = progress.scaler {
        shard.meta.insert("loss_scale".into(), sc.scale.to_string());
        shard.meta.insert("loss_scale_growth_tracker".into(), sc.growth_tracker.to_string());
        shard.meta.insert("loss_scale_hysteresis_left".into(), sc.hysteresis_left.to_string());
    }
    for (k, v) in meta.into_iter().chain(model_meta(&first.model.cfg)) {
        shard.meta.insert(k.to_string(), v);
    }
    let download = |buf: &D::Buf, n: usize| {
        let mut host = vec![0.0f32; n];
        dev.download(buf, &mut host);
        host
    };
    for (c, chunk) in chunks.iter().enumerate() {
        let model = &chunk.model;
        // Whole moments per parameter (gathered from the data-parallel shards under ZeRO-1), so
        // a checkpoint does not depend on the optimizer's sharding.
        let (m, v): (Vec<Vec<f32>>, Vec<Vec<f32>>) = match &chunk.opt {
            _ if cfg.no_save_optim => (Vec::new(), Vec::new()),
            Optimizer::Replicated(o) => (
                o.m.iter().zip(&model.params.info).map(|(b, p)| download(b, p.numel())).collect(),
                o.v.iter().zip(&model.params.info).map(|(b, p)| download(b, p.numel())).collect(),
            ),
            Optimizer::Distributed(z) => z.gather_state(dev, &*groups.replica, &model.params),
        };
        for (i, info) in model.params.info.iter().enumerate() {
            let value = download(&model.params.values[i], info.numel());
            let moments = (!cfg.no_save_optim).then(|| [("adam_m", m[i].clone()), ("adam_v", v[i].clone())]);
            for (prefix, data) in std::iter::once(("param", value)).chain(moments.into_iter().flatten()) {
                shard.tensors.push(SavedTensor {
                    name: format!("{prefix}/chunk{c}/{}", info.name),
                    shape: info.shape.clone(),
                    data,
                });
            }
        }
    }
    // Rank 0 prepares the staging directory, one data-parallel replica (its first
    // context-parallel rank) writes a shard per model-parallel rank, and rank 0 renames it into place once all are written.
    if grid.rank == 0 {
        checkpoint::begin(dir, progress.iteration)?;
    }
    groups.world.barrier();
    if grid.dp_rank == 0 && grid.cp_rank == 0 {
        checkpoint::write_shard(
            dir,
            progress.iteration,
            &checkpoint::shard_name(grid.tp_rank, grid.pp_rank, grid.pp),
            &shard,
        )?;
    }
    groups.world.barrier();
    if grid.rank == 0 {
        checkpoint::tokenizer::save(dir, &cfg.tokenizer_flags)?;
        let path = checkpoint::commit(dir, progress.iteration)?;
        if say {
            println!(" saved checkpoint at iteration {} to {}", progress.iteration, path.display());
        }
    }
    groups.world.barrier();
    Ok(())
}

/// The directory to resume from: `--load dir` when it holds a checkpoint (its tracker file). A
/// job script passes `--save X --load X` so that a requeued job resumes; on its first run X holds
/// no checkpoint yet, and the run starts from scratch, saying so (rank 0, `say`), as Megatron-LM
/// does. The ranks agree first: where some see a checkpoint there and others do not (a directory
/// local to each node), every rank stops, rather than some resuming while others start over.
pub(super) fn to_resume_from<'a>(load: Option<&'a Path>, groups: &Groups, say: bool) -> Result<Option<&'a Path>> {
    let Some(dir) = load else { return Ok(None) };
    let mut found = [f64::from(u8::from(dir.join(checkpoint::TRACKER).exists()))];
    groups.world.all_reduce(&mut found, ReduceOp::Sum);
    let ranks = groups.world.size();
    if found[0] as usize == ranks {
        return Ok(Some(dir));
    }
    if found[0] > 0.0 {
        return Err(Error::Config(format!(
            "--load {}: {} of {ranks} ranks find a checkpoint there; every rank must see the same directory",
            dir.display(),
            found[0]
        )));
    }
    if say {
        println!(
            " --load {}: no {} there, so no checkpoint yet: starting from scratch (as Megatron-LM does)",
            dir.display(),
            checkpoint::TRACKER
        );
    }
    Ok(None)
}

/// `--pretrained-checkpoint P` while `--load` holds no checkpoint: P, which every rank must find
/// (said by rank 0; a P without one is an error on every rank).
pub(super) fn pretrained<'a>(p: &'a Path, load: Option<&Path>, groups: &Groups, say: bool) -> Result<&'a Path> {
    let found = to_resume_from(Some(p), groups, false)?;
    let dir = found.ok_or_else(|| {
        Error::Config(format!("--pretrained-checkpoint {}: no {} there", p.display(), checkpoint::TRACKER))
    })?;
    if say {
        let load = load.map_or("--load".to_string(), |l| format!("--load {}", l.display()));
        println!(
            " {load} holds no checkpoint yet: starting from the weights of --pretrained-checkpoint {} (as Megatron \
             does)",
            p.display()
        );
    }
    Ok(dir)
}

/// Restores weights, optimizer state and the run's position from the latest checkpoint in `dir`.
pub(super) fn load_checkpoint<D: Device>(
    dir: &Path,
    dev: &D,
    grid: &Grid,
    chunks: &mut [Chunk<D>],
    scaler_config: Option<LossScaler>,
    parts: LoadParts,
    say: bool,
) -> Result<Progress> {
    let (path, shard) = read_shard(dir, grid, chunks)?;
    let saved = model_from_shard(&shard, &path)?;
    check_layout(&shard, &path, grid, chunks.len())?;
    let ours = &chunks[0].model.cfg;
    // Keys by name: the architecture's are present only where it differs from GPT-2's.
    let (theirs, mine): (BTreeMap<_, _>, BTreeMap<_, _>) =
        (model_meta(&saved).into_iter().collect(), model_meta(ours).into_iter().collect());
    let unset = || "GPT-2's default".to_string();
    let mismatches: Vec<String> = theirs
        .keys()
        .chain(mine.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .filter(|k| theirs.get(*k) != mine.get(*k))
        .map(|k| {
            let (a, b) = (theirs.get(k).cloned().unwrap_or_else(unset), mine.get(k).cloned().unwrap_or_else(unset));
            let why = match *k {
                "padded_vocab_size" => {
                    " (the vocabulary is padded to --make-vocab-size-divisible-by x --tensor-model-parallel-size; \
                     `trident convert` pads a checkpoint for another layout)"
                }
                "gelu_erf" => {
                    " (--no-bias-gelu-fusion or --disable-bias-linear give Megatron's exact erf GELU, \
                     otherwise it is the tanh form)"
                }
                _ => "",
            };
            format!("{k} is {a} in the checkpoint but {b} here{why}")
        })
        .collect();
    if !mismatches.is_empty() {
        return Err(Error::Config(format!("{} does not fit this model: {}", path.display(), mismatches.join("; "))));
    }
    let step: u64 = shard.meta_value(&path, "adam_step")?;
    // A checkpoint saved with --no-save-optim loads as --no-load-optim would (as Megatron does).
    let prefixes = crate::checkpoint::convert::held_prefixes(&shard.meta);
    let unsaved = prefixes.len() == 1 && parts == LoadParts::All;
    let parts = if unsaved { LoadParts::NoOptimizer } else { parts };
    let optimizer = parts == LoadParts::All;
    for (c, chunk) in chunks.iter_mut().enumerate() {
        let model = &mut chunk.model;
        let (mut m, mut v) = (Vec::new(), Vec::new());
        for (i, info) in model.params.info.iter().enumerate() {
            for &prefix in if optimizer { prefixes } else { &prefixes[..1] } {
                let t = shard.tensor(&path, &format!("{prefix}/chunk{c}/{}", info.name))?;
                if t.shape != info.shape {
                    return Err(Error::format(
                        &path,
                        format!("tensor '{}' has shape {:?}, expected {:?}", t.name, t.shape, info.shape),
                    ));
                }
                match prefix {
                    "param" => dev.upload(&mut model.params.values[i], &t.data),
                    "adam_m" => m.push(t.data.clone()),
                    _ => v.push(t.data.clone()),
                }
            }
        }
        match &mut chunk.opt {
            _ if !optimizer => {}
            Optimizer::Replicated(o) => {
                for i in 0..m.len() {
                    dev.upload(&mut o.m[i], &m[i]);
                    dev.upload(&mut o.v[i], &v[i]);
                }
                o.step = step;
            }
            Optimizer::Distributed(z) => {
                z.load_state(dev, &m, &v);
                z.step = step;
            }
        }
    }
    let consumed_train: u64 = shard.meta_value(&path, "consumed_train_samples")?;
    let counted = match shard.meta.contains_key("lr_schedule_samples") {
        true => shard.meta_value::<u64>(&path, "lr_schedule_samples")?,
        false => consumed_train,
    };
    if counted > consumed_train {
        return Err(Error::format(
            &path,
            format!("lr_schedule_samples {counted} is above consumed_train_samples {consumed_train}"),
        ));
    }
    let mut progress = Progress {
        iteration: shard.meta_value(&path, "iteration")?,
        consumed_train,
        consumed_valid: shard.meta_value(&path, "consumed_valid_samples")?,
        scaler: scaler_config,
        lr_schedule_start: consumed_train - counted,
    };
    match parts {
        LoadParts::All => {}
        LoadParts::NoOptimizer => progress.lr_schedule_start = consumed_train,
        LoadParts::WeightsOnly => progress = Progress { scaler: scaler_config, ..Progress::default() },
    }
    if let (Some(sc), true, true) = (progress.scaler.as_mut(), shard.meta.contains_key("loss_scale"), optimizer) {
        sc.scale = shard.meta_value(&path, "loss_scale")?;
        sc.growth_tracker = shard.meta_value(&path, "loss_scale_growth_tracker")?;
        sc.hysteresis_left = shard.meta_value(&path, "loss_scale_hysteresis_left")?;
    }
    for c in chunks.iter_mut() {
        c.model.refresh_working_weights(dev);
    }
    if say {
        let saved_at: u64 = shard.meta_value(&path, "iteration")?;
        println!(
            " loaded checkpoint {} (iteration {saved_at}){}",
            path.display(),
            loaded_parts(parts, unsaved, &shard)
        );
    }
    Ok(progress)
}

/// What a load took, for its start-up line: empty for everything.
fn loaded_parts(parts: LoadParts, unsaved: bool, shard: &Shard) -> String {
    let megatron = shard.meta.get("imported_from").is_some_and(|m| m.starts_with("Megatron-LM"));
    match parts {
        LoadParts::All => String::new(),
        LoadParts::NoOptimizer => format!(
            ": {}: fresh AdamW state and loss scale; the learning-rate schedule restarts (as in Megatron)",
            match () {
                _ if megatron => "a Megatron-LM checkpoint without AdamW state in a layout trident reads",
                _ if unsaved => "saved with --no-save-optim",
                _ => "--no-load-optim",
            }
        ),
        LoadParts::WeightsOnly => ": its weights alone (as --finetune); this run starts at iteration 0".into(),
    }
}

/// A checkpoint resumes in the layout it was written in: the same tensor-parallel mode, pipeline
/// placement (zb-v's V or Megatron's interleaving) and sizes; else an error naming the fix.
fn check_layout(shard: &Shard, path: &Path, grid: &Grid, chunks: usize) -> Result<()> {
    let layout = |key: &str| shard.meta_value::<usize>(path, key).unwrap_or(1);
    let (saved_tp, saved_pp, saved_v) = (
        layout("tensor_model_parallel_size"),
        layout("pipeline_model_parallel_size"),
        layout("virtual_pipeline_chunks"),
    );
    let saved_mode = shard.meta.get("tensor_parallel_mode").cloned().unwrap_or_else(|| "1d".into());
    if saved_mode != grid.tensor_mode.describe() {
        return Err(Error::Config(format!(
            "{} was written with --tensor-parallel-mode {saved_mode}; this run uses {}: resume with the layout it \
             was saved with, or reshard it with `trident convert --target-tensor-parallel-mode`",
            path.display(),
            grid.tensor_mode.describe()
        )));
    }
    let saved_placement = shard.meta.get("virtual_pipeline_placement").map_or("interleaved", String::as_str);
    if saved_placement != placement_name(grid.pipeline_v) {
        return Err(Error::Config(format!(
            "{} places its pipeline chunks {}: {}",
            path.display(),
            if saved_placement == "v" { "in zb-v's V" } else { "interleaved (Megatron's order)" },
            if grid.pipeline_v {
                "--pipeline-schedule zb-v places other layers on each stage: reshard it with `trident convert \
                 --target-pipeline-schedule zb-v`"
            } else {
                "resume it with --pipeline-schedule zb-v, or reshard it with `trident convert` for other schedules"
            }
        )));
    }
    if (saved_tp, saved_pp, saved_v) != (grid.tp, grid.pp, chunks) {
        return Err(Error::Config(format!(
            "{} was written with tensor-parallel size {saved_tp}, pipeline size {saved_pp} and {saved_v} virtual \
             stages per rank; this run uses {}, {} and {}; resharding arrives with `trident convert`",
            path.display(),
            grid.tp,
            grid.pp,
            chunks
        )));
    }
    Ok(())
}

/// This rank's shard of the latest checkpoint in `dir`: trident's own, or cut from a Megatron-LM
/// checkpoint (`megatron_shard`).
fn read_shard<D: Device>(dir: &Path, grid: &Grid, chunks: &[Chunk<D>]) -> Result<(std::path::PathBuf, Shard)> {
    if let Some((iter_dir, full)) = checkpoint::megatron::read_if_megatron(dir)? {
        return Ok((iter_dir, megatron_shard(full, grid, chunks)));
    }
    let (_, path, shard) = checkpoint::load_latest(dir, &checkpoint::shard_name(grid.tp_rank, grid.pp_rank, grid.pp))?;
    Ok((path, shard))
}

/// This rank's shard of a Megatron-LM checkpoint read whole (`checkpoint::megatron`), cut for this
/// run's layout as a trident shard: its weights, and AdamW's moments where they were mapped. A checkpoint that
/// does not record its tokenizer's vocabulary (Megatron pads it and keeps only the padded size)
/// takes this run's, where the padded sizes agree.
fn megatron_shard<D: Device>(mut full: FullCheckpoint, grid: &Grid, chunks: &[Chunk<D>]) -> Shard {
    let ours = &chunks[0].model.cfg;
    if full.model.vocab_size == full.model.padded_vocab_size && ours.padded_vocab_size == full.model.padded_vocab_size {
        full.meta.insert("vocab_size".into(), ours.vocab_size.to_string());
    }
    let mut shard = Shard { meta: full.meta, tensors: Vec::new() };
    for (k, v) in [
        ("tensor_model_parallel_size", grid.tp.to_string()),
        ("pipeline_model_parallel_size", grid.pp.to_string()),
        ("virtual_pipeline_chunks", chunks.len().to_string()),
        ("virtual_pipeline_placement", placement_name(grid.pipeline_v).to_string()),
        ("tensor_parallel_mode", grid.tensor_mode.describe()),
    ] {
        shard.meta.insert(k.into(), v);
    }
    for (c, chunk) in chunks.iter().enumerate() {
        for info in &chunk.model.params.info {
            for prefix in ["param", "adam_m", "adam_v"] {
                let Some(whole) = full.tensors.get(&format!("{prefix}/{}", info.name)) else { continue };
                if whole.len() != info.full_shape.iter().product::<usize>() {
                    continue; // another shape: the model check names the difference
                }
                let data = (0..info.numel()).map(|i| whole[info.global_index(i)]).collect();
                shard.tensors.push(SavedTensor {
                    name: format!("{prefix}/chunk{c}/{}", info.name),
                    shape: info.shape.clone(),
                    data,
                });
            }
        }
    }
    shard
}
