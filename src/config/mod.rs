//! `trident train`'s configuration: Megatron's flag names mapped onto a typed config, the model
//! presets, and every check that makes an impossible configuration a clear error before any work.

mod data;
mod from_checkpoint;
mod presets;
mod schedule;
mod sharding;

use data::data_source;
use from_checkpoint::{checkpoint_args, preset_for};
pub use presets::{llama_on_device, preset, Preset, PRESETS};
use schedule::{adam, batch_sizes, lr_schedule, rampup, step_batches};

use crate::cli::Args;
use crate::data::tokenizer::{ByteTokenizer, Tokenizer};
use crate::error::{Error, Result};
use crate::model::{Arch, GptConfig};
use crate::optim::lr::LrSchedule;
use crate::optim::rampup::BatchSchedule;
use crate::optim::AdamWConfig;
use std::path::PathBuf;

/// Everything `trident train` needs, validated.
#[derive(Clone, Debug)]
pub struct TrainConfig {
    pub preset: String,
    pub model: GptConfig,
    /// Megatron's `--tokenizer-type` of the data, recorded in checkpoints.
    pub tokenizer_type: &'static str,
    /// The tokenizer flags as given, for `checkpoint::tokenizer::save`.
    pub tokenizer_flags: crate::checkpoint::tokenizer::Flags,
    /// `--make-vocab-size-divisible-by`: the vocabulary is padded to a multiple of it times the
    /// tensor-parallel size (recorded in checkpoints, so `convert` pads the same way).
    pub vocab_divisible_by: usize,
    pub seq_length: usize,
    pub micro_batch_size: usize,
    /// Whether --micro-batch-size was given; a preset's micro-batch shrinks to fit the
    /// data-parallel size, an explicit one does not.
    pub micro_batch_explicit: bool,
    pub global_batch_size: usize,
    /// `--rampup-batch-size`: the global batch of each iteration grows to `global_batch_size`
    /// (`global_batch_at`).
    pub rampup: Option<BatchSchedule>,
    /// `--decrease-batch-size-if-needed`: a ramp-up batch that micro-batch x data-parallel size
    /// does not divide is rounded down to a multiple of it (megatron-core's running batch).
    pub decrease_batch_size_if_needed: bool,
    pub train_iters: u64,
    pub lr: LrSchedule,
    pub adam: AdamWConfig,
    pub clip_grad: f64,
    /// `--check-for-nan-in-loss-and-grad` (default on; `--no-...` turns it off): a non-finite loss
    /// or gradient norm of a step that was not skipped ends the run on every rank.
    pub check_for_nan: bool,
    pub seed: u64,
    /// `--train-samples`, else `--train-iters` global batches: the training split's size.
    pub train_samples: u64,
    /// `--data-path` and `--split`, the per-split paths, or `--mock-data`.
    pub data: crate::data::datasets::DataSource,
    /// `--mid-level-dataset-surplus`: the extra fraction each dataset of a blend builds.
    pub data_surplus: f64,
    /// `--data-cache-path`: where the datasets' built indexes are kept for the next run.
    pub data_cache_path: Option<PathBuf>,
    pub eval_interval: u64,
    pub eval_iters: u64,
    pub log_interval: u64,
    pub log_json: Option<PathBuf>,
    /// `--tensorboard-dir`: where rank 0 writes TensorBoard event files.
    pub tensorboard_dir: Option<PathBuf>,
    /// `--tensorboard-log-interval`: every how many iterations the per-iteration TensorBoard
    /// scalars (loss, learning rate, batch size, loss scale, grad norm) are written (Megatron's
    /// default, 1: every iteration).
    pub tensorboard_log_interval: u64,
    pub save: Option<PathBuf>,
    pub save_interval: Option<u64>,
    pub load: Option<PathBuf>,
    /// `--no-save-optim`: checkpoints hold the weights and the run's position, no optimizer state.
    pub no_save_optim: bool,
    /// `--pretrained-checkpoint`: where a run starts, weights alone, while `--load` holds nothing.
    pub pretrained_checkpoint: Option<PathBuf>,
    /// What `--load` restores: everything, or less (`--no-load-optim`, `--finetune`).
    pub load_parts: LoadParts,
    pub exit_interval: Option<u64>,
    /// `--exit-signal-handler`: SIGUSR1 / SIGTERM stop the run after a checkpoint (`stop.rs`).
    pub exit_signal_handler: bool,
    /// `--exit-duration-in-mins`: minutes after the start of `trident train` to stop after.
    pub exit_duration_mins: Option<f64>,
    /// `--device`: only "cpu" is built; the GPU placement is still decided and printed.
    pub device: String,
    /// `--gpu-collectives`: "nccl", "rccl" or "mpi" (host staging); "mpi" on the CPU.
    pub gpu_collectives: String,
    /// None: decided per rank from its share of the node (`Runtime::default_threads`).
    pub cpu_threads: Option<usize>,
    pub tensor_parallel: usize,
    pub pipeline_parallel: usize,
    pub sequence_parallel: bool,
    /// `--context-parallel-size` and `--cp-comm-type` (a2a where it is 1, which changes nothing).
    pub context_parallel: usize,
    pub cp_comm_type: crate::parallel::context::CpCommType,
    /// Under `--cp-comm-type a2a+p2p`, the inner all-to-all groups' size
    /// (`--hierarchical-context-parallel-sizes`' first level); 1 otherwise.
    pub cp_a2a_size: usize,
    /// `--tensor-parallel-mode` and `--tesseract-depth`, checked against the group size when the
    /// layout is made.
    pub tensor_mode: String,
    pub tesseract_depth: Option<usize>,
    pub summa_algorithm: crate::parallel::summa::Algorithm,
    /// `--ddp-bucket-size`; None: Megatron's 40M elements (`DEFAULT_BUCKET_ELEMENTS`), or under
    /// ZeRO-2 one layer's parameters, Megatron FSDP's unit (`Chunk::new`).
    pub ddp_bucket_size: Option<usize>,
    pub layers_per_virtual_stage: Option<usize>,
    /// None: Megatron's choice (interleaved with virtual stages, else 1F1B).
    pub pipeline_schedule: Option<crate::parallel::pipeline::Schedule>,
    pub first_stage_layers: Option<usize>,
    pub last_stage_layers: Option<usize>,
    pub timing_trace: Option<PathBuf>,
    /// `--log-num-zeros-in-grad`: count the zero gradient elements each step.
    pub log_num_zeros_in_grad: bool,
    /// `--eod-mask-loss` and `--calculate-per-token-loss`: the tokens the loss counts and how
    /// it is averaged.
    pub loss: LossAveraging,
    /// `--reset-position-ids` and `--reset-attention-mask`.
    pub documents: DocumentResets,
    /// `--distributed-timeout-minutes`: the longest a rank waits on the others (`comm::watchdog`).
    pub distributed_timeout_minutes: f64,
    /// `--profile`: the iterations it covers and the ranks that take part.
    pub profile: Option<ProfileRange>,
    pub recompute: crate::model::Recompute,
    /// `--hidden-dropout` and `--attention-dropout` (Megatron's 0.1 unless a `--preset` is named:
    /// the presets train without dropout), drawn under `--seed`.
    pub dropout: crate::model::gpt::DropoutRates,
    /// The Megatron flags given that change nothing here (`flags::MEGATRON_NO_EFFECT`), each with
    /// why; `trident train` says so at start.
    pub megatron_no_effect: Vec<(&'static str, &'static str)>,
    /// Start-up lines on values taken in Megatron's way and not used (`--split` with
    /// `--mock-data`); rank 0 prints them after the no-effect flags.
    pub notes: Vec<String>,
    pub use_distributed_optimizer: bool,
    /// `--data-parallel-sharding-strategy optim_grads` (ZeRO-2): the distributed optimizer keeps
    /// only its shard of the summed gradients, each bucket reduce-scattered every micro-batch.
    pub shard_grads: bool,
    /// `--overlap-grad-reduce`: the distributed optimizer's reduce-scatters start during backward.
    pub overlap_grad_reduce: bool,
    /// `--overlap-param-gather`: the distributed optimizer's weight all-gathers finish as the next
    /// forward reaches each bucket.
    pub overlap_param_gather: bool,
    /// `--grad-reduce-in-bf16`: the data-parallel gradient sums in bf16.
    pub grad_reduce_in_bf16: bool,
    pub log_memory: bool,
    /// `--log-params-norm`: the parameters' L2 norm after each step, logged as Megatron logs it.
    pub log_params_norm: bool,
    /// `--log-world-size-to-tensorboard`: TensorBoard's `world-size` with the per-iteration scalars.
    pub log_world_size_to_tensorboard: bool,
    pub log_comm: bool,
    /// `--log-device-work`: each iteration's device work, where the device counts it (the GPU).
    pub log_device_work: bool,
    /// The format weights and activations are held in for compute (`--bf16`, `--fp16`).
    pub precision: crate::real::Precision,
    /// fp16's dynamic loss scaler, or a constant scale (`--loss-scale`); None without scaling.
    pub loss_scaler: Option<crate::optim::scaler::LossScaler>,
}

/// What restarts after each end-of-document token of a sample, as Megatron's GPT dataset does:
/// each holds the end-of-document id where its flag is given.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DocumentResets {
    /// `--reset-position-ids` (learned positions only: rotary ones run on, as megatron-core's).
    pub positions: Option<u32>,
    /// `--reset-attention-mask`: each position attends within its own document.
    pub attention: Option<u32>,
}

/// Which tokens the loss counts and how they are averaged, as Megatron's `loss_func` and
/// schedules do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LossAveraging {
    /// `--eod-mask-loss`: the end-of-document id; a position whose input token is this id has
    /// its prediction (the next document's first token) left out of the loss.
    pub eod_mask: Option<u32>,
    /// `--calculate-per-token-loss`: the gradient is that of the global batch's summed loss over
    /// the tokens it counts. Without it (Megatron's default) each micro-batch's loss is averaged
    /// over its own counted tokens, then over the micro-batches and data-parallel ranks. The two
    /// agree when every token counts. The loss logged is the summed loss over the counted
    /// tokens either way.
    pub per_token: bool,
}

impl TrainConfig {
    /// The global batch of an iteration that starts after `consumed` samples: the ramp's value
    /// under `--rampup-batch-size`, else `global_batch_size`.
    pub fn global_batch_at(&self, consumed: u64) -> usize {
        self.rampup.as_ref().map_or(self.global_batch_size, |r| r.global_batch(consumed) as usize)
    }

    /// The samples an iteration after `consumed` samples trains on with `per_micro` samples per
    /// micro-batch over the data-parallel ranks: `global_batch_at`, rounded down to a multiple of
    /// `per_micro` under `--decrease-batch-size-if-needed` (megatron-core's running batch).
    pub fn running_batch_at(&self, consumed: u64, per_micro: usize) -> usize {
        let batch = self.global_batch_at(consumed);
        if self.decrease_batch_size_if_needed {
            batch / per_micro * per_micro
        } else {
            batch
        }
    }

    /// The configuration for `dp` data-parallel ranks: a preset's micro-batch becomes the
    /// largest size at or below it that splits the global batch evenly over the ranks.
    pub fn for_data_parallel(&self, dp: usize) -> TrainConfig {
        let mut cfg = self.clone();
        if !self.micro_batch_explicit && self.global_batch_size.is_multiple_of(dp) {
            let per_rank = self.global_batch_size / dp;
            cfg.micro_batch_size =
                (1..=self.micro_batch_size.min(per_rank)).rev().find(|m| per_rank.is_multiple_of(*m)).unwrap_or(1);
        }
        cfg
    }

    /// Parses and checks `trident train`'s flags: what the build cannot do first, then the model,
    /// batch, schedule, optimizer, data, stopping and layout flags in named steps (each bad flag
    /// is one error naming it), and last the flags that need no check beyond their own parse.
    pub fn from_args(args: &Args) -> Result<TrainConfig> {
        let mut notes = Vec::new();
        let base = preset(args.str("--preset").unwrap_or("tiny"))?;
        let from_checkpoint = checkpoint_args(args, &mut notes)?;
        let owned = from_checkpoint.as_ref().map(|c| preset_for(base, c));
        let p = owned.as_ref().unwrap_or(base);
        // A Llama-family model on a GPU is checked before any GPU library is looked for.
        let features = architecture(args, &p.arch)?.features();
        let sixteen_bit = args.has("--bf16") || args.has("--fp16");
        llama_on_device("train", args.str("--device").unwrap_or("cpu"), &features, sixteen_bit)?;
        reject_unbuilt(args)?;
        let (tokenizer, tokenizer_flags) = tokenizer(args, from_checkpoint.as_ref())?;
        if let Some(c) = &from_checkpoint {
            notes.push(format!(
                "--use-checkpoint-args: the model, sequence length and tokenizer of {} (flags given here apply on top)",
                c.path.display()
            ));
        }
        let (model, seq_length) = model_shape(args, p, &tokenizer)?;
        let seed = args.u64("--seed")?.unwrap_or(1234);
        let dropout = dropout(args, seed, &mut notes)?;
        let documents = document_resets(args, &model, tokenizer.eod(), &mut notes)?;
        let steps = step_batches(args, seq_length)?;
        let (micro_batch_size, global_batch_size) = batch_sizes(args, p, steps.as_ref())?;
        let rampup = rampup(args, global_batch_size, steps)?;
        let (train_iters, train_samples, lr) = lr_schedule(args, p, global_batch_size, rampup.as_ref())?;
        let adam = adam(args)?;
        let data = data_source(args, &tokenizer, model.vocab_size, &mut notes)?;
        let cpu_threads = nonzero(args, "--cpu-threads", "a positive whole number")?;
        let (save, exit_signal_handler, exit_duration_mins) = stop_rules(args)?;
        let tensor_parallel = nonzero(args, "--tensor-model-parallel-size", "a positive whole number")?.unwrap_or(1);
        let (context_parallel, cp_comm_type, cp_a2a_size) = context_parallel(args, &mut notes)?;
        let ddp_bucket_size = nonzero(args, "--ddp-bucket-size", "a positive number of elements")?;
        let sharded = sharding::strategy(args)?;
        Ok(TrainConfig {
            preset: p.name.to_string(),
            model,
            tokenizer_type: tokenizer.type_name(),
            tokenizer_flags,
            vocab_divisible_by: vocab_divisible_by(args)?,
            seq_length,
            micro_batch_size,
            micro_batch_explicit: args.has("--micro-batch-size"),
            global_batch_size,
            rampup,
            decrease_batch_size_if_needed: args.has("--decrease-batch-size-if-needed"),
            train_iters,
            lr,
            adam,
            clip_grad: args.f64("--clip-grad")?.unwrap_or(1.0),
            check_for_nan: check_for_nan(args)?,
            seed,
            dropout,
            train_samples,
            data,
            data_cache_path: args.path("--data-cache-path"),
            data_surplus: match args.f64("--mid-level-dataset-surplus")? {
                Some(v) if v < 0.0 => {
                    return Err(Error::flag("--mid-level-dataset-surplus", v, "a fraction of at least 0"))
                }
                v => v.unwrap_or(0.005),
            },
            eval_interval: positive("--eval-interval", args.u64("--eval-interval")?.unwrap_or(p.eval_interval))?,
            eval_iters: args.u64("--eval-iters")?.unwrap_or(p.eval_iters),
            log_interval: positive("--log-interval", args.u64("--log-interval")?.unwrap_or(p.log_interval))?,
            log_json: args.path("--log-json"),
            tensorboard_dir: args.path("--tensorboard-dir"),
            tensorboard_log_interval: positive(
                "--tensorboard-log-interval",
                args.u64("--tensorboard-log-interval")?.unwrap_or(1),
            )?,
            save,
            save_interval: args.u64("--save-interval")?.map(|v| positive("--save-interval", v)).transpose()?,
            load: args.path("--load"),
            exit_interval: args.u64("--exit-interval")?.map(|v| positive("--exit-interval", v)).transpose()?,
            exit_signal_handler,
            exit_duration_mins,
            device: args.str("--device").unwrap_or("cpu").to_string(),
            gpu_collectives: gpu_collectives(args).to_string(),
            cpu_threads,
            tensor_parallel,
            pipeline_parallel: nonzero(args, "--pipeline-model-parallel-size", "a positive whole number")?.unwrap_or(1),
            layers_per_virtual_stage: nonzero(
                args,
                "--num-layers-per-virtual-pipeline-stage",
                "a positive whole number",
            )?,
            pipeline_schedule: args
                .str("--pipeline-schedule")
                .map(crate::parallel::pipeline::Schedule::parse)
                .transpose()?,
            first_stage_layers: args.usize("--decoder-first-pipeline-num-layers")?,
            last_stage_layers: args.usize("--decoder-last-pipeline-num-layers")?,
            timing_trace: args.path("--timing-trace"),
            profile: profile_range(args)?,
            log_num_zeros_in_grad: args.has("--log-num-zeros-in-grad"),
            loss: LossAveraging {
                eod_mask: args.has("--eod-mask-loss").then(|| tokenizer.eod()),
                per_token: args.has("--calculate-per-token-loss"),
            },
            documents,
            no_save_optim: args.has("--no-save-optim"),
            pretrained_checkpoint: args.path("--pretrained-checkpoint"),
            load_parts: match (args.has("--finetune"), args.has("--no-load-optim")) {
                (true, _) => LoadParts::WeightsOnly,
                (false, true) => LoadParts::NoOptimizer,
                (false, false) => LoadParts::All,
            },
            distributed_timeout_minutes: match args.f64("--distributed-timeout-minutes")? {
                Some(m) if m <= 0.0 => {
                    return Err(Error::flag("--distributed-timeout-minutes", m, "a positive number of minutes"))
                }
                Some(m) => m,
                None => 10.0,
            },
            precision: precision(args),
            loss_scaler: loss_scaler(args)?,
            use_distributed_optimizer: sharded.0,
            shard_grads: sharded.1,
            overlap_grad_reduce: args.has("--overlap-grad-reduce"),
            overlap_param_gather: args.has("--overlap-param-gather"),
            grad_reduce_in_bf16: sharding::grad_reduce_in_bf16(args)?,
            log_memory: args.has("--log-memory"),
            log_comm: args.has("--log-comm"),
            log_params_norm: args.has("--log-params-norm"),
            log_world_size_to_tensorboard: args.has("--log-world-size-to-tensorboard"),
            log_device_work: args.has("--log-device-work"),
            recompute: recompute(args)?,
            megatron_no_effect: crate::flags::MEGATRON_NO_EFFECT
                .iter()
                .filter(|f| args.has(f.name))
                .map(|f| (f.name, f.help.trim_start_matches("no effect: ")))
                .collect(),
            notes,
            sequence_parallel: args.has("--sequence-parallel"),
            context_parallel,
            cp_comm_type,
            cp_a2a_size,
            tensor_mode: args.str("--tensor-parallel-mode").unwrap_or("1d").to_string(),
            tesseract_depth: args.usize("--tesseract-depth")?,
            summa_algorithm: args
                .str("--summa-algorithm")
                .map(crate::parallel::summa::Algorithm::parse)
                .transpose()?
                .unwrap_or_default(),
            ddp_bucket_size,
        })
    }
}

/// The model's shape (the preset's, overridden flag by flag) and the sequence length, checked:
/// the model's own rules (`GptConfig::validate`), a vocabulary that holds the tokenizer's ids,
/// padded as Megatron pads it (to a multiple of `--make-vocab-size-divisible-by` times the
/// tensor-parallel size), and a sequence that fits the position table.
fn model_shape(args: &Args, p: &Preset, tokenizer: &Tokenizer) -> Result<(GptConfig, usize)> {
    let arch = architecture(args, &p.arch)?;
    let num_layers = args.usize("--num-layers")?.unwrap_or(p.num_layers);
    let hidden_size = args.usize("--hidden-size")?.unwrap_or(p.hidden_size);
    let heads = args.usize("--num-attention-heads")?.unwrap_or(p.num_attention_heads);
    let seq_length = args.usize("--seq-length")?.unwrap_or(p.seq_length);
    let max_pos = args.usize("--max-position-embeddings")?.unwrap_or(p.max_position_embeddings.max(seq_length));
    let divisible_by = vocab_divisible_by(args)?;
    let tensor_parallel = nonzero(args, "--tensor-model-parallel-size", "a positive whole number")?.unwrap_or(1);
    // A BPE tokenizer's vocabulary, as Megatron takes it; else the preset's, else the bytes'. The
    // null tokenizer's is `--vocab-size` and its end-of-document id.
    let from_tokenizer = matches!(tokenizer, Tokenizer::Bpe(_)).then(|| tokenizer.vocab_size());
    let vocab = match tokenizer {
        Tokenizer::Null { .. } => tokenizer.vocab_size(),
        _ => args.usize("--vocab-size")?.or(from_tokenizer).or(p.vocab_size).unwrap_or(ByteTokenizer::VOCAB_SIZE),
    };
    if vocab < tokenizer.vocab_size() {
        return Err(Error::flag(
            "--vocab-size",
            vocab,
            format!("at least {} ({}'s ids)", tokenizer.vocab_size(), tokenizer.type_name()),
        ));
    }
    let model = GptConfig {
        num_layers,
        hidden_size,
        num_attention_heads: heads,
        ffn_hidden_size: match (args.usize("--ffn-hidden-size")?, p.ffn_hidden_size) {
            (Some(f), _) => f,
            // A flag that changes the hidden size (or turns SwiGLU on) takes Megatron's default.
            (None, Some(f)) if !args.has("--hidden-size") && (arch.swiglu || !args.has("--swiglu")) => f,
            // Megatron's SwiGLU default: two thirds of 4 h, rounded down to a multiple of 64.
            _ if arch.swiglu => 4 * hidden_size * 2 / 3 / 64 * 64,
            _ => 4 * hidden_size,
        },
        max_position_embeddings: max_pos,
        vocab_size: vocab,
        padded_vocab_size: GptConfig::padded_vocab(vocab, divisible_by, tensor_parallel, None)?,
        init_method_std: args.f64("--init-method-std")?.unwrap_or(0.02),
        arch,
    };
    model.validate()?;
    if seq_length == 0 {
        return Err(Error::flag("--seq-length", 0, "a positive whole number"));
    }
    if seq_length > max_pos {
        return Err(Error::Config(format!("--seq-length {seq_length} is above --max-position-embeddings {max_pos}")));
    }
    Ok((model, seq_length))
}

/// `--make-vocab-size-divisible-by` (Megatron's default 128).
fn vocab_divisible_by(args: &Args) -> Result<usize> {
    Ok(nonzero(args, "--make-vocab-size-divisible-by", "a positive whole number")?.unwrap_or(128))
}

/// `base` (a preset's architecture) with Megatron's architecture flags applied: each turns a
/// Llama-family feature on or names the choice (`--normalization`, `--position-embedding-type`).
pub fn architecture(args: &Args, base: &Arch) -> Result<Arch> {
    let mut a = base.clone();
    if let Some(n) = args.str("--normalization") {
        a.normalization = Arch::parse_normalization(n)?;
    }
    if let Some(e) = args.f64("--norm-epsilon")? {
        a.norm_epsilon = e;
    }
    // Megatron's older flags: --use-rotary-position-embeddings, --no-position-embedding.
    let older = match (args.has("--use-rotary-position-embeddings"), args.has("--no-position-embedding")) {
        (true, _) => Some("rope"),
        (false, true) => Some("none"),
        (false, false) => None,
    };
    match (args.str("--position-embedding-type"), older) {
        (Some(t), Some(o)) if t != o => {
            return Err(Error::Usage(format!(
                "--position-embedding-type {t} contradicts the older flags, which mean --position-embedding-type {o}"
            )))
        }
        (Some(t), _) | (None, Some(t)) => a.position_embedding = Arch::parse_position(t)?,
        (None, None) => {}
    }
    a.rotary_base = args.f64("--rotary-base")?.unwrap_or(a.rotary_base);
    a.rotary_percent = args.f64("--rotary-percent")?.unwrap_or(a.rotary_percent);
    a.rope_scaling |= args.has("--use-rope-scaling");
    a.swiglu |= args.has("--swiglu");
    a.untie_embeddings |= args.has("--untie-embeddings-and-output-weights");
    a.add_bias_linear &= !args.has("--disable-bias-linear");
    a.gelu = gelu(args, &a);
    a.zero_centered_gamma |= args.has("--apply-layernorm-1p");
    if args.has("--group-query-attention") {
        // Megatron's default is one group (multi-query attention).
        a.num_query_groups = Some(args.usize("--num-query-groups")?.unwrap_or(1));
    } else if args.has("--num-query-groups") {
        return Err(Error::Usage("--num-query-groups needs --group-query-attention (as in Megatron)".into()));
    }
    if let Some(k) = args.usize("--kv-channels")? {
        a.kv_channels = Some(k);
    }
    let rope_flags = ["--rotary-base", "--rotary-percent", "--use-rope-scaling"];
    if a.position_embedding != crate::model::PositionEmbedding::Rope {
        if let Some(f) = rope_flags.iter().find(|f| args.has(f)) {
            return Err(Error::Usage(format!("{f} needs --position-embedding-type rope")));
        }
    }
    if a.normalization == crate::model::Normalization::LayerNorm && a.norm_epsilon != Arch::GPT2.norm_epsilon {
        return Err(Error::Unsupported(format!(
            "--norm-epsilon {} with LayerNorm: the LayerNorm kernels are built for Megatron's default 1e-5 (RMSNorm \
             takes any epsilon)",
            a.norm_epsilon
        )));
    }
    Ok(a)
}

/// What a `--load` restores, as Megatron's flags choose.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LoadParts {
    /// Weights, optimizer state, the schedule's position, the iteration and consumed samples.
    #[default]
    All,
    /// `--no-load-optim`: all but the optimizer (AdamW's moments and step, the loss scaler) and
    /// the learning-rate schedule's position, which restarts from 0 as Megatron's does.
    NoOptimizer,
    /// `--finetune`: the weights alone; the run starts at iteration 0 with no samples consumed.
    WeightsOnly,
}

/// `--profile`'s range: iterations `start + 1` through `end` (as the log line counts them), as
/// Megatron starts the profiler before the iteration after `--profile-step-start` and stops it
/// after iteration `--profile-step-end`, on `ranks` (None: every rank).
#[derive(Clone, Debug, PartialEq)]
pub struct ProfileRange {
    pub start: u64,
    pub end: u64,
    pub ranks: Option<Vec<usize>>,
}

impl ProfileRange {
    /// Whether `rank` profiles.
    pub fn on(&self, rank: usize) -> bool {
        self.ranks.as_ref().is_none_or(|r| r.contains(&rank))
    }
}

/// `--profile` with `--profile-step-start`, `--profile-step-end` and `--profile-ranks`; the range
/// flags without `--profile` are one error (they would silently profile nothing).
fn profile_range(args: &Args) -> Result<Option<ProfileRange>> {
    let range_flags = ["--profile-step-start", "--profile-step-end", "--profile-ranks"];
    if !args.has("--profile") {
        return match range_flags.iter().find(|f| args.has(f)) {
            Some(f) => Err(Error::Usage(format!("{f} sets the range of --profile, which is not given"))),
            None => Ok(None),
        };
    }
    let (start, end) = (args.u64("--profile-step-start")?.unwrap_or(10), args.u64("--profile-step-end")?.unwrap_or(12));
    if end <= start {
        return Err(Error::Config(format!(
            "--profile-step-end {end} must be above --profile-step-start {start} (the profiled iterations are \
             start + 1 to end)"
        )));
    }
    let ranks = args
        .list("--profile-ranks")
        .map(|list| {
            list.iter()
                .map(|r| {
                    r.parse::<usize>().map_err(|_| Error::flag("--profile-ranks", format!("'{r}'"), "global ranks"))
                })
                .collect::<Result<Vec<_>>>()
        })
        .transpose()?;
    Ok(Some(ProfileRange { start, end, ranks }))
}

/// `--check-for-nan-in-loss-and-grad` (Megatron's default) unless `--no-check-for-nan-in-loss-and-grad`.
fn check_for_nan(args: &Args) -> Result<bool> {
    let (on, off) = ("--check-for-nan-in-loss-and-grad", "--no-check-for-nan-in-loss-and-grad");
    if args.has(on) && args.has(off) {
        return Err(Error::Usage(format!("{on} and {off} contradict each other: give one")));
    }
    Ok(!args.has(off))
}

/// `--save`, `--exit-signal-handler` and `--exit-duration-in-mins`: a run that stops early
/// checkpoints first, so either way of stopping needs --save.
fn stop_rules(args: &Args) -> Result<(Option<PathBuf>, bool, Option<f64>)> {
    let save = args.path("--save");
    let exit_signal_handler = args.has("--exit-signal-handler");
    let exit_duration_mins = match args.f64("--exit-duration-in-mins")? {
        Some(m) if m <= 0.0 => return Err(Error::flag("--exit-duration-in-mins", m, "a positive number of minutes")),
        other => other,
    };
    if (exit_signal_handler || exit_duration_mins.is_some()) && save.is_none() {
        let name = if exit_signal_handler { "--exit-signal-handler" } else { "--exit-duration-in-mins" };
        return Err(Error::Usage(format!(
            "{name} checkpoints before it stops the run: it needs --save DIR (and --load DIR to resume)"
        )));
    }
    Ok((save, exit_signal_handler, exit_duration_mins))
}

/// The value of a count flag that may not be 0 (`expected` says what it must be), if given.
fn nonzero(args: &Args, name: &str, expected: &str) -> Result<Option<usize>> {
    match args.usize(name)? {
        Some(0) => Err(Error::flag(name, 0, expected)),
        other => Ok(other),
    }
}

/// `v`, unless it is 0: an interval flag's value.
fn positive(name: &str, v: u64) -> Result<u64> {
    if v == 0 {
        Err(Error::flag(name, 0, "a positive whole number"))
    } else {
        Ok(v)
    }
}

/// `--gpu-collectives`, or the device's own library by default (MPI on the CPU).
fn gpu_collectives(args: &Args) -> &str {
    args.str("--gpu-collectives").unwrap_or(match args.str("--device") {
        Some("cuda") => "nccl",
        Some("hip") => "rccl",
        _ => "mpi",
    })
}

/// The compute format: `--bf16`, `--fp16` or f32.
fn precision(args: &Args) -> crate::real::Precision {
    if args.has("--bf16") {
        crate::real::Precision::Bf16
    } else if args.has("--fp16") {
        crate::real::Precision::F16
    } else {
        crate::real::Precision::F32
    }
}

/// A constant `--loss-scale` (positive), fp16's dynamic scaler, or none.
fn loss_scaler(args: &Args) -> Result<Option<crate::optim::scaler::LossScaler>> {
    Ok(match (args.f64("--loss-scale")?, args.has("--fp16")) {
        (Some(s), _) if s > 0.0 => Some(crate::optim::scaler::LossScaler::constant(s)),
        (Some(s), _) => return Err(Error::flag("--loss-scale", s, "a positive number")),
        (None, true) => Some(crate::optim::scaler::LossScaler::dynamic(
            args.f64("--initial-loss-scale")?.unwrap_or(4294967296.0),
            args.f64("--min-loss-scale")?.unwrap_or(1.0),
            args.u64("--loss-scale-window")?.unwrap_or(1000).max(1),
            args.u64("--hysteresis")?.unwrap_or(2).max(1) as u32,
        )),
        (None, false) => None,
    })
}

/// `--recompute-granularity`, or `--recompute-activations` (Megatron's name for selective).
/// `--checkpoint-activations` (Megatron's older name for full recompute), with
/// `--recompute-method uniform --recompute-num-layers 1`: what trident's full recompute is.
fn recompute(args: &Args) -> Result<crate::model::Recompute> {
    // The older names of the method and its layer count.
    for (older, name) in [
        ("--activations-checkpoint-method", "--recompute-method"),
        ("--activations-checkpoint-num-layers", "--recompute-num-layers"),
        ("--checkpoint-num-layers", "--recompute-num-layers"),
    ] {
        if args.has(older) && args.has(name) {
            return Err(Error::Usage(format!("{older} is Megatron's older name for {name}: give one")));
        }
    }
    let old = args.has("--checkpoint-activations").then_some("full");
    let granularity = match (args.str("--recompute-granularity"), args.has("--recompute-activations"), old) {
        (Some(g), true, _) if g != "selective" => {
            return Err(Error::Usage(format!(
                "--recompute-activations means --recompute-granularity selective, not {g}"
            )))
        }
        (Some(g), _, Some(_)) if g != "full" => {
            return Err(Error::Usage(format!("--checkpoint-activations means --recompute-granularity full, not {g}")))
        }
        (_, true, Some(_)) => {
            return Err(Error::Usage(
                "--checkpoint-activations (full) and --recompute-activations (selective) contradict each other".into(),
            ))
        }
        (g, activations, old) => g.or(old).or(activations.then_some("selective")),
    };
    if let Some(method) = args.str("--recompute-method").or(args.str("--activations-checkpoint-method")) {
        if granularity != Some("full") {
            return Err(Error::Usage(format!(
                "--recompute-method {method} goes with --recompute-granularity full (as in Megatron)"
            )));
        }
        if method != "uniform" {
            return Err(Error::flag(
                "--recompute-method",
                method,
                "uniform: trident's full recompute checkpoints every layer's input (block is not built)",
            ));
        }
    }
    for name in ["--recompute-num-layers", "--activations-checkpoint-num-layers", "--checkpoint-num-layers"] {
        if let Some(n) = args.usize(name)?.filter(|&n| n != 1) {
            return Err(Error::flag(name, n, "1: trident's full recompute checkpoints every layer's input"));
        }
    }
    Ok(granularity.map(crate::model::Recompute::parse).transpose()?.unwrap_or_default())
}

/// The tokenizer and its flags: those given; else, under --use-checkpoint-args, those saved
/// beside the checkpoint.
fn tokenizer(
    args: &Args,
    from_checkpoint: Option<&from_checkpoint::CheckpointArgs>,
) -> Result<(crate::data::tokenizer::Tokenizer, crate::checkpoint::tokenizer::Flags)> {
    let given: crate::checkpoint::tokenizer::Flags = crate::flags::TOKENIZER_FLAGS
        .iter()
        .filter(|f| args.has(f.name))
        .map(|f| (f.name.to_string(), crate::checkpoint::tokenizer::value_of(args, f)))
        .collect();
    let saved = from_checkpoint.and_then(|c| c.tokenizer.clone()).filter(|_| given.is_empty());
    Ok(match saved {
        Some(flags) => (crate::checkpoint::tokenizer::load(&flags)?, flags),
        None => (crate::data::tokenizer_files::from_args(args)?, given),
    })
}

/// `--context-parallel-size` and `--cp-comm-type` (Megatron's per-layer list, which trident takes
/// when every layer has the same type), and a2a+p2p's inner size (`hierarchy`). The document
/// resets are refused by name.
fn context_parallel(
    args: &Args,
    notes: &mut Vec<String>,
) -> Result<(usize, crate::parallel::context::CpCommType, usize)> {
    use crate::parallel::context::CpCommType;
    let size = nonzero(args, "--context-parallel-size", "a positive whole number")?.unwrap_or(1);
    let types = args.list("--cp-comm-type").unwrap_or_default();
    let parsed = types.iter().map(|t| CpCommType::parse(t)).collect::<Result<Vec<_>>>()?;
    if parsed.windows(2).any(|w| w[0] != w[1]) {
        return Err(Error::Unsupported(format!(
            "--cp-comm-type {}: one type for every layer is built, not a type per layer",
            types.join(" ")
        )));
    }
    let kind = parsed.first().copied().unwrap_or(CpCommType::P2p);
    if size == 1 {
        return Ok((1, CpCommType::A2a, 1));
    }
    let inner = hierarchy(args, size, kind, notes)?;
    for (name, what) in [
        ("--reset-attention-mask", "per-document attention bounds"),
        ("--reset-position-ids", "per-document positions"),
    ] {
        if args.has(name) {
            return Err(Error::Unsupported(format!(
                "{name} with --context-parallel-size {size}: the context-parallel layers do not place {what} yet"
            )));
        }
    }
    let device = args.str("--device").unwrap_or("cpu");
    if matches!(kind, CpCommType::P2p | CpCommType::A2aP2p)
        && device != "cpu"
        && args.str("--gpu-collectives") == Some("mpi")
    {
        notes.push(format!(
            "--cp-comm-type {} on --device {device} with --gpu-collectives mpi: the ring's passes stage through \
             host memory between the blocks (over NCCL/RCCL its key/value passes run beside them)",
            kind.name()
        ));
    }
    Ok((size, kind, inner))
}

/// `--hierarchical-context-parallel-sizes A B` (Megatron's: adjacent CP ranks in groups of A, the
/// ranks with the same place in their group forming the second level), which a2a+p2p needs: the
/// all-to-all inside the groups of A, the ring across the B of them. Returns A (1 for another
/// type, where the sizes change nothing and a note says so).
fn hierarchy(
    args: &Args,
    size: usize,
    kind: crate::parallel::context::CpCommType,
    notes: &mut Vec<String>,
) -> Result<usize> {
    let flag = "--hierarchical-context-parallel-sizes";
    let sizes = match args.list(flag) {
        None => Vec::new(),
        Some(list) => {
            let parse = |s: &String| s.parse::<usize>().ok().filter(|&n| n > 0);
            list.iter()
                .map(|s| parse(s).ok_or_else(|| Error::flag(flag, s, "positive whole numbers")))
                .collect::<Result<_>>()?
        }
    };
    if kind != crate::parallel::context::CpCommType::A2aP2p {
        if !sizes.is_empty() {
            notes.push(format!("{flag} changes nothing under --cp-comm-type {} (it shapes a2a+p2p only)", kind.name()));
        }
        return Ok(1);
    }
    match sizes[..] {
        [a, b] if a * b == size => Ok(a),
        _ => Err(Error::Config(format!(
            "--cp-comm-type a2a+p2p needs {flag} A B with A x B = --context-parallel-size {size} (the all-to-all \
             inside groups of A adjacent ranks, the ring across B of them){}",
            if sizes.is_empty() { String::new() } else { format!(", not {sizes:?}") }
        ))),
    }
}

fn reject_unbuilt(args: &Args) -> Result<()> {
    // A Megatron flag whose help says "not built" names the missing feature and its issue.
    let unbuilt =
        crate::flags::TRAIN_FLAGS.iter().filter(|f| f.help.starts_with("not built")).find(|f| args.has(f.name));
    if let Some(f) = unbuilt {
        return Err(Error::Unsupported(format!("{}: {}; drop the flag", f.name, f.help)));
    }
    if let Some(kind) = args.str("--data-impl").filter(|k| *k != "mmap") {
        return Err(Error::flag(
            "--data-impl",
            kind,
            "mmap: the .bin files are always memory-mapped (lazy and cached are not built)",
        ));
    }
    if let Some(n) = args.usize("--vocab-extra-ids")?.filter(|&n| n != 0) {
        return Err(Error::flag("--vocab-extra-ids", n, "0: T5's sentinel tokens are not built"));
    }
    if let Some(kind) = args.str("--dataloader-type").filter(|k| *k != "single") {
        return Err(Error::flag("--dataloader-type", kind, "single (Megatron's default order; cyclic is not built)"));
    }
    if args.has("--bf16") && args.has("--fp16") {
        return Err(Error::Usage("--bf16 and --fp16 exclude each other".into()));
    }
    // Flag consistency first, before any GPU runtime is loaded.
    if let Some(g) = args.str("--gpu-collectives") {
        if !["nccl", "rccl", "mpi"].contains(&g) {
            return Err(Error::flag("--gpu-collectives", g, "nccl, rccl or mpi"));
        }
        let device = args.str("--device").unwrap_or("cpu");
        if g != "mpi" && device != "cuda" && device != "hip" {
            return Err(Error::Usage(format!(
                "--gpu-collectives {g} moves device memory and needs --device cuda or hip (CPU ranks use MPI)"
            )));
        }
        if g == "nccl" && device == "hip" {
            return Err(Error::Usage(
                "--gpu-collectives nccl is NVIDIA's library; on AMD GPUs use rccl (the default with --device hip) or mpi"
                    .into(),
            ));
        }
    }
    if let Some(d) = args.str("--device") {
        if d == "cuda" {
            // The CUDA Device computes GEMMs and attention on 16-bit operands (its bf16 module, or
            // the fp16 one): the run must say which. The driver is loaded by `train` itself
            // (`gpu::training`), not here: flags are checked without touching a GPU runtime.
            if !args.has("--bf16") && !args.has("--fp16") {
                return Err(Error::Usage(
                    "--device cuda needs --bf16 or --fp16 (the CUDA kernels multiply 16-bit operands with f32 accumulation)"
                        .into(),
                ));
            }
        }
        if d == "hip" {
            // As CUDA: the 16-bit GEMM and attention operands (the bf16 module, or the fp16 one)
            // said out loud; the runtime is loaded by `train`.
            if !args.has("--bf16") && !args.has("--fp16") {
                return Err(Error::Usage(
                    "--device hip needs --bf16 or --fp16 (the HIP kernels multiply 16-bit operands with f32 accumulation)"
                        .into(),
                ));
            }
        }
        if !["cpu", "cuda", "hip", "reference"].contains(&d) {
            return Err(Error::Unsupported(format!(
                "--device {d}: the cpu, cuda and hip backends are built, and the f64 reference (not {d})"
            )));
        }
    }
    Ok(())
}

/// The GELU Megatron-LM computes for these flags: its fused bias-GELU (the default wherever fc1
/// has a bias) is the tanh form, as `--openai-gelu` is; unfused (`--no-bias-gelu-fusion`, or
/// `--disable-bias-linear`, which turns the fusion off) it is PyTorch's exact erf GELU. Otherwise
/// the base architecture's (a preset's, a checkpoint's). A SwiGLU MLP has no GELU.
fn gelu(args: &Args, a: &Arch) -> crate::device::Gelu {
    use crate::device::Gelu;
    if a.swiglu || args.has("--openai-gelu") {
        Gelu::Tanh
    } else if args.has("--no-bias-gelu-fusion") || args.has("--disable-bias-linear") {
        Gelu::Erf
    } else {
        a.gelu
    }
}

/// `--reset-position-ids` and `--reset-attention-mask` (below).
fn document_resets(args: &Args, model: &GptConfig, eod: u32, notes: &mut Vec<String>) -> Result<DocumentResets> {
    Ok(DocumentResets {
        positions: reset_position_ids(args, model, eod, notes),
        attention: reset_attention_mask(args, eod)?,
    })
}

/// `--reset-position-ids`'s end-of-document id where the model has a learned position embedding.
/// Rotary positions are left as megatron-core leaves them (its rotary embedding runs over the whole
/// sample and never reads the position ids), which a start-up line says.
fn reset_position_ids(args: &Args, model: &GptConfig, eod: u32, notes: &mut Vec<String>) -> Option<u32> {
    if !args.has("--reset-position-ids") {
        return None;
    }
    if model.arch.position_embedding == crate::model::PositionEmbedding::LearnedAbsolute {
        return Some(eod);
    }
    notes.push(
        "--reset-position-ids changes nothing for this model: its positions are not learned ones, and \
         megatron-core's rotary angles run over the whole sample whatever the position ids say"
            .to_string(),
    );
    None
}

/// `--reset-attention-mask`'s end-of-document id. Megatron builds the mask in its data loader and
/// refuses the flag with `--no-create-attention-mask-in-dataloader`, as here.
fn reset_attention_mask(args: &Args, eod: u32) -> Result<Option<u32>> {
    if !args.has("--reset-attention-mask") {
        return Ok(None);
    }
    if args.has("--no-create-attention-mask-in-dataloader") {
        return Err(Error::Usage(
            "--reset-attention-mask needs the attention mask created in the data loader; \
             --no-create-attention-mask-in-dataloader turns it off (Megatron-LM refuses the pair too)"
                .into(),
        ));
    }
    Ok(Some(eod))
}

/// The dropout probabilities: each flag's value, else Megatron's default 0.1, or 0 under a named
/// `--preset` (trident's recipes, like llm.c's GPT-2, train without dropout); drawn under `seed`.
fn dropout(args: &Args, seed: u64, notes: &mut Vec<String>) -> Result<crate::model::gpt::DropoutRates> {
    let default = if args.has("--preset") { 0.0 } else { 0.1 };
    let mut p = [0f32; 2];
    for (slot, name) in p.iter_mut().zip(["--hidden-dropout", "--attention-dropout"]) {
        let v = args.f64(name)?.unwrap_or(default);
        if !(0.0..1.0).contains(&v) {
            return Err(Error::flag(name, v, "a probability in [0, 1)"));
        }
        *slot = v as f32;
    }
    let both_given = args.has("--hidden-dropout") && args.has("--attention-dropout");
    if !args.has("--preset") && !both_given {
        notes.push(format!("dropout: hidden {}, attention {} (Megatron's defaults where not given)", p[0], p[1]));
    }
    Ok(crate::model::gpt::DropoutRates { hidden: p[0], attention: p[1], seed })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The padded vocabulary `train` builds from `flags` (byte tokenizer: 257 ids).
    fn padded(flags: &[&str]) -> usize {
        let words: Vec<String> = ["--data-path", "unused"].iter().chain(flags).map(|s| s.to_string()).collect();
        let args = crate::cli::parse("train", crate::flags::TRAIN_FLAGS, &words).unwrap().unwrap();
        TrainConfig::from_args(&args).unwrap().model.padded_vocab_size
    }

    #[test]
    fn the_gelu_is_the_one_megatron_computes_for_the_flags() {
        use crate::device::Gelu;
        let gelu = |flags: &[&str]| {
            let words: Vec<String> = ["--data-path", "unused"].iter().chain(flags).map(|s| s.to_string()).collect();
            let args = crate::cli::parse("train", crate::flags::TRAIN_FLAGS, &words).unwrap().unwrap();
            TrainConfig::from_args(&args).unwrap().model.arch.gelu
        };
        assert_eq!(gelu(&[]), Gelu::Tanh, "the fused bias-GELU");
        assert_eq!(gelu(&["--preset", "gpt2-124m"]), Gelu::Tanh);
        assert_eq!(gelu(&["--no-bias-gelu-fusion"]), Gelu::Erf);
        assert_eq!(gelu(&["--disable-bias-linear"]), Gelu::Erf, "no bias, no fusion");
        assert_eq!(gelu(&["--no-bias-gelu-fusion", "--openai-gelu"]), Gelu::Tanh);
        assert_eq!(gelu(&["--swiglu", "--no-bias-gelu-fusion"]), Gelu::Tanh, "SwiGLU has no GELU");
    }

    #[test]
    fn the_vocabulary_pads_to_a_multiple_of_divisible_by_times_the_tensor_parallel_size() {
        let tp = |t: &'static str| ["--tensor-model-parallel-size", t];
        assert_eq!(padded(&[]), 384);
        assert_eq!(padded(&tp("2")), 512);
        assert_eq!(padded(&tp("4")), 512);
        assert_eq!(padded(&tp("8")), 1024);
        assert_eq!(padded(&[&tp("2")[..], &["--make-vocab-size-divisible-by", "1"]].concat()), 258);
        // GPT-2's 50257 ids: Megatron's 50304 on one rank, 50432 on two.
        assert_eq!(padded(&["--vocab-size", "50257"]), 50304);
        assert_eq!(padded(&[&tp("2")[..], &["--vocab-size", "50257"]].concat()), 50432);
        // Megatron's null tokenizer adds its end-of-document id: Llama 3's 128256 become 128257,
        // padded to 128384 (megatron-core 0.16).
        assert_eq!(padded(&["--tokenizer-type", "NullTokenizer", "--vocab-size", "128256"]), 128384);
        // 2-D tensor parallelism pads by its whole grid (4 ranks here).
        assert_eq!(padded(&[&tp("4")[..], &["--tensor-parallel-mode", "2d", "--vocab-size", "50257"]].concat()), 50688);
    }
}
