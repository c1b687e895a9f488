//! Every subcommand's flags in one index: the tables `trident <command> --help` prints and
//! `cli::parse` checks a command line against, Megatron's names wherever Megatron has the flag.
//! The parsers that read them live with their commands (`config/` for `train`, `plan/request.rs`
//! for `plan`, `cmd/` for the rest).

use crate::cli::{flag, join, many, switch, FlagSpec};

/// The architecture flags (Megatron's), shared by `train` and `plan`.
pub const ARCH_FLAGS: &[FlagSpec] = &[
    flag("--normalization", "KIND", "LayerNorm (GPT-2, default) or RMSNorm (Llama)"),
    flag("--norm-epsilon", "EPS", "epsilon of the norms (default 1e-5; LayerNorm supports only 1e-5)"),
    switch("--swiglu", "SwiGLU MLP (fc1 makes gate and up; default width 2/3 of 4 x hidden, a multiple of 64)"),
    switch("--openai-gelu", "GELU's tanh form (GPT-2's), as Megatron's default fused bias-GELU computes it"),
    switch(
        "--no-bias-gelu-fusion",
        "GELU's exact erf form, as Megatron computes it unfused (also under --disable-bias-linear)",
    ),
    flag("--position-embedding-type", "KIND", "learned_absolute (GPT-2, default), rope or none"),
    flag("--rotary-base", "B", "rotary embedding base (default 10000)"),
    flag("--rotary-percent", "P", "fraction of each head's dimensions that rotate (default 1.0)"),
    switch("--use-rope-scaling", "Llama 3.1's rotary frequency scaling (factor 8, original context 8192)"),
    switch("--group-query-attention", "grouped-query attention: key/value heads shared by groups of query heads"),
    flag("--num-query-groups", "G", "key/value heads under --group-query-attention (default 1)"),
    flag("--kv-channels", "D", "dimensions per attention head (default hidden size / heads)"),
    switch("--untie-embeddings-and-output-weights", "an output layer of its own instead of the word embedding"),
    switch(
        "--use-rotary-position-embeddings",
        "Megatron's older name for --position-embedding-type rope",
    ),
    switch(
        "--no-position-embedding",
        "Megatron's older flag for no learned positions: --position-embedding-type none (or rope with --use-rotary-position-embeddings)",
    ),
    switch("--disable-bias-linear", "no biases in the QKV, projection and MLP layers"),
    switch(
        "--apply-layernorm-1p",
        "each norm's weight w starts at 0 and scales by 1 + w (zero-centred gamma), LayerNorm and RMSNorm alike",
    ),
];

/// The flags of `trident train`, with Megatron's names: the model's sizes, the architecture, the rest.
pub const TRAIN_FLAGS: &[FlagSpec] = &join::<
    { TRAIN_SIZES.len() + ARCH_FLAGS.len() + TRAIN_REST.len() + TOKENIZER_FLAGS.len() + MEGATRON_NO_EFFECT.len() },
>(&[TRAIN_SIZES, ARCH_FLAGS, TRAIN_REST, TOKENIZER_FLAGS, MEGATRON_NO_EFFECT]);

/// Megatron flags that choose among PyTorch implementations, or ask for what trident always does,
/// accepted so that a Megatron job script runs unchanged; `trident train` says which it got and
/// why each changes nothing (its help line, which starts "no effect").
pub const MEGATRON_NO_EFFECT: &[FlagSpec] = &[
    switch("--use-mcore-models", "no effect: Megatron's model classes; trident has one implementation"),
    flag("--transformer-impl", "KIND", "no effect: local or transformer_engine; trident has one implementation"),
    flag("--attention-backend", "KIND", "no effect: trident's attention is its own fused kernel"),
    switch("--use-flash-attn", "no effect: trident's attention is its own fused kernel"),
    switch("--no-masked-softmax-fusion", "no effect: a PyTorch kernel choice; trident's kernels are its own"),
    switch("--no-bias-swiglu-fusion", "no effect: a PyTorch kernel choice; trident's kernels are its own"),
    switch("--no-bias-dropout-fusion", "no effect: a PyTorch kernel choice; trident's kernels are its own"),
    switch("--no-rope-fusion", "no effect: a PyTorch kernel choice; trident's kernels are its own"),
    switch("--no-persist-layer-norm", "no effect: a PyTorch kernel choice; trident's kernels are its own"),
    switch("--no-gradient-accumulation-fusion", "no effect: a PyTorch kernel choice; trident's kernels are its own"),
    switch("--attention-softmax-in-fp32", "no effect: the softmax always runs in f32"),
    switch("--accumulate-allreduce-grads-in-fp32", "no effect: gradients are always accumulated and reduced in f32"),
    flag(
        "--distributed-backend",
        "KIND",
        "no effect: MPI starts the ranks; NCCL/RCCL or MPI move tensors, as --gpu-collectives chooses",
    ),
    flag("--num-workers", "N", "no effect: datasets are memory-mapped, with no loader processes"),
    flag(
        "--ckpt-format",
        "FORMAT",
        "no effect: --save writes trident's checksummed shards in Megatron's layout; --load reads them and Megatron's torch_dist and torch files alike (`convert --save-megatron` writes torch_dist)",
    ),
    flag(
        "--timing-log-level",
        "N",
        "no effect: trident times the iteration (the log line) and collectives (--log-comm)",
    ),
    switch("--log-throughput", "no effect: the log line always shows TFLOP/s and MFU"),
    switch("--log-timers-to-tensorboard", "no effect: iteration-time and throughput always go to TensorBoard"),
    switch("--log-validation-ppl-to-tensorboard", "no effect: validation perplexity always goes to TensorBoard"),
    switch(
        "--cross-entropy-loss-fusion",
        "no effect: trident's vocab-parallel cross-entropy is always its own fused kernels, the gradient written over the logits",
    ),
    flag(
        "--cross-entropy-fusion-impl",
        "KIND",
        "no effect: native or te picks a PyTorch implementation; trident's cross-entropy kernels are its own",
    ),
    switch(
        "--distribute-checkpointed-activations",
        "no effect: Megatron's older name for --distribute-saved-activations, a memory layout of PyTorch's recompute",
    ),
    flag("--DDP-impl", "KIND", "no effect: Megatron's older choice of PyTorch's data-parallel wrapper; trident has one"),
    switch(
        "--use-contiguous-buffers-in-local-ddp",
        "no effect: trident's gradients are always bucketed in contiguous buffers",
    ),
    switch(
        "--no-scatter-gather-tensors-in-pipeline",
        "no effect: a PyTorch transfer choice; trident's pipeline messages are its own",
    ),
    flag("--timing-log-option", "KIND", "no effect: trident times the iteration (the log line) and collectives (--log-comm)"),
    switch("--barrier-with-L1-time", "no effect: trident's timers need no barrier"),
    switch(
        "--defer-embedding-wgrad-compute",
        "no effect: a PyTorch overlap choice; trident's embedding gradient is its own kernel",
    ),
    switch("--use-dist-ckpt", "no effect: trident writes its own checksummed shards in Megatron's directory layout"),
    switch("--auto-detect-ckpt-format", "no effect: --load tells trident's shards from Megatron's torch_dist and torch files itself"),
    switch("--ckpt-fully-parallel-save", "no effect: every model-parallel rank already writes its own shard"),
    switch("--no-ckpt-fully-parallel-save", "no effect: every model-parallel rank writes its own shard"),
    switch("--ckpt-fully-parallel-load", "no effect: every rank already reads its own shard"),
    switch("--async-save", "no effect: checkpoints are written in place of the iteration, each rank its own shard"),
    switch(
        "--dist-ckpt-optim-fully-reshardable",
        "no effect: trident saves its own shards; --load reads either layout of Megatron's distributed optimizer",
    ),
    switch(
        "--distrib-optim-fully-reshardable-mem-efficient",
        "no effect: trident saves its own shards, each rank its own state",
    ),
    flag("--dist-ckpt-strictness", "KIND", "no effect: trident's loads check every key and tensor, always strict"),
    switch(
        "--override-opt_param-scheduler",
        "no effect: the learning-rate schedule always comes from the flags, never the checkpoint",
    ),
    switch("--no-save-rng", "no effect: trident keeps no generator state, so checkpoints hold none"),
    switch(
        "--distribute-saved-activations",
        "no effect: a memory layout of PyTorch's recompute; trident's recompute keeps each layer's input as the layout splits it",
    ),
    switch(
        "--fp16-lm-cross-entropy",
        "no effect: a PyTorch kernel choice; trident's cross-entropy always runs in f32",
    ),
    switch(
        "--no-async-tensor-model-parallel-allreduce",
        "no effect: a PyTorch overlap choice; trident's tensor-parallel collectives are its own",
    ),
    switch(
        "--async-tensor-model-parallel-allreduce",
        "no effect: a PyTorch overlap choice; trident's tensor-parallel collectives are its own",
    ),
    switch(
        "--apply-query-key-layer-scaling",
        "no effect: it rescales fp16 attention scores around a softmax that trident always runs in f32, the same result",
    ),
    switch("--no-query-key-layer-scaling", "no effect: trident's attention softmax always runs in f32"),
    switch("--use-cpu-initialization", "no effect: initial weights are a function of (seed, name, position) on any device"),
    switch("--use-legacy-models", "no effect: Megatron's older model classes; trident has one implementation"),
    flag("--tensorboard-queue-size", "N", "no effect: trident writes each TensorBoard event as it comes"),
    switch("--log-batch-size-to-tensorboard", "no effect: the batch size always goes to TensorBoard"),
    switch("--log-memory-to-tensorboard", "no effect: PyTorch's allocator statistics; trident has its own (--log-memory)"),
    flag("--logging-level", "N", "no effect: Python's logging level; trident prints its own lines"),
    flag("--cuda-graph-impl", "KIND", "no effect: PyTorch's CUDA-graph capture; trident launches its own kernels"),
    switch("--init-model-with-meta-device", "no effect: PyTorch's deferred allocation; trident allocates what it initialises"),
    switch(
        "--no-load-rng",
        "no effect: trident's random numbers are a function of (seed, name, position); a checkpoint holds no generator state",
    ),
    switch("--manual-gc", "no effect: it schedules Python's garbage collector; trident has none"),
    flag("--manual-gc-interval", "N", "no effect: it schedules Python's garbage collector; trident has none"),
    switch("--no-manual-gc-eval", "no effect: it schedules Python's garbage collector; trident has none"),
    flag(
        "--empty-unused-memory-level",
        "N",
        "no effect: it empties PyTorch's caching allocator, which trident does not use",
    ),
    switch(
        "--no-create-attention-mask-in-dataloader",
        "no effect: the attention is causal by construction; no mask is ever built (refused with --reset-attention-mask)",
    ),
    switch("--no-mmap-bin-files", "no effect: the .bin files are always memory-mapped; the samples are the same"),
    switch(
        "--log-memory-to-tensorboard",
        "no effect: the peak resident memory (mem-max-rss-bytes) always goes to TensorBoard",
    ),
];

const TRAIN_SIZES: &[FlagSpec] = &[
    flag(
        "--preset",
        "NAME",
        "model and recipe: tiny, small, gpt2-124m, gpt2-350m, gpt2-760m, gpt2-1.5b, llama-tiny, llama-124m, llama3-8b, llama3-70b (default tiny)",
    ),
    flag("--num-layers", "N", "transformer layers"),
    flag("--hidden-size", "H", "hidden size"),
    flag("--num-attention-heads", "A", "attention heads (must divide the hidden size)"),
    flag("--ffn-hidden-size", "F", "MLP width (default 4 x hidden size)"),
];

const TRAIN_REST: &[FlagSpec] = &[
    flag("--seq-length", "S", "tokens per sample"),
    flag(
        "--max-position-embeddings",
        "P",
        "rows of the position embedding (default: the preset's, at least the sequence length)",
    ),
    flag("--make-vocab-size-divisible-by", "K", "pad the vocabulary to a multiple of K (default 128)"),
    flag("--init-method-std", "X", "standard deviation of weight initialisation (default 0.02)"),
    flag("--micro-batch-size", "B", "samples per micro-batch"),
    flag("--global-batch-size", "G", "samples per iteration (a multiple of the micro-batch size)"),
    flag("--train-iters", "N", "iterations to train"),
    many(
        "--rampup-batch-size",
        "START INCR SAMPLES",
        "ramp the global batch from START up by INCR over SAMPLES samples (with --train-samples)",
    ),
    flag(
        "--step-batch-size-schedule",
        "\"T:B T:B ...\"",
        "global batch B from T tokens consumed on (K, M, B, T suffixes; the first T 0); --global-batch-size, if given, must be its last B",
    ),
    switch(
        "--decrease-batch-size-if-needed",
        "round a ramp-up batch down to a multiple of micro-batch x data-parallel size instead of an error",
    ),
    flag("--train-samples", "N", "samples to train instead: the schedule's flags then count samples"),
    flag("--lr", "LR", "peak learning rate"),
    flag("--min-lr", "LR", "learning rate at the end of decay (default 0)"),
    flag(
        "--decoupled-lr",
        "LR",
        "the word embedding's and output layer's own peak rate, on the same warmup and decay (Megatron's decoupled AdamW)",
    ),
    flag("--decoupled-min-lr", "LR", "their rate at the end of decay (default --min-lr)"),
    flag(
        "--lr-warmup-iters",
        "N",
        "iterations of linear warmup (default: the preset's, at most a tenth of the run)",
    ),
    flag("--lr-warmup-samples", "N", "samples of linear warmup (with --train-samples)"),
    flag("--lr-warmup-fraction", "F", "warmup as a fraction of the decay span instead"),
    flag("--lr-warmup-init", "LR", "learning rate the warmup starts from (default 0)"),
    flag("--lr-decay-iters", "N", "iterations over which to decay (default --train-iters)"),
    flag("--lr-decay-samples", "N", "samples over which to decay (default --train-samples)"),
    flag("--lr-decay-style", "STYLE", "constant, linear, cosine (default), inverse-square-root or WSD"),
    flag("--lr-wsd-decay-style", "STYLE", "WSD's anneal: exponential (default), linear, cosine or minus_sqrt"),
    flag("--lr-wsd-decay-iters", "N", "WSD: iterations of the anneal, the end of the decay span"),
    flag("--lr-wsd-decay-samples", "N", "WSD: samples of the anneal (with --train-samples)"),
    flag("--weight-decay", "WD", "decoupled weight decay (default 0.01; none on biases and LayerNorm)"),
    flag("--weight-decay-incr-style", "STYLE", "constant (default), linear or cosine from start to end over the run"),
    flag("--start-weight-decay", "WD", "weight decay at the start (linear or cosine incr style)"),
    flag("--end-weight-decay", "WD", "weight decay at the end (linear or cosine incr style)"),
    switch(
        "--check-for-nan-in-loss-and-grad",
        "stop the run at a non-finite loss or gradient norm, before it is checkpointed (default on)",
    ),
    switch("--no-check-for-nan-in-loss-and-grad", "keep training through a non-finite loss or gradient norm (logged)"),
    flag("--clip-grad", "C", "global gradient-norm clip (default 1.0; 0 disables)"),
    flag("--adam-beta1", "B1", "AdamW beta1 (default 0.9)"),
    flag("--adam-beta2", "B2", "AdamW beta2 (default 0.999)"),
    flag("--adam-eps", "EPS", "AdamW epsilon (default 1e-8)"),
    flag("--seed", "SEED", "random seed for initialisation and data order (default 1234)"),
    many(
        "--data-path",
        "PREFIX",
        "dataset prefix written by `trident prepare` (P_text_document), or a blend: WEIGHT PREFIX WEIGHT PREFIX ...",
    ),
    flag("--data-args-path", "FILE", "a file holding the --data-path list (for long blends)"),
    flag("--split", "A,B,C", "train/valid/test split weights of every --data-path dataset (default 969,30,1)"),
    many("--train-data-path", "PREFIX", "the training split's dataset or blend, used whole (instead of --data-path)"),
    many("--valid-data-path", "PREFIX", "the validation split's dataset or blend, used whole"),
    many("--test-data-path", "PREFIX", "the test split's dataset or blend, used whole"),
    flag(
        "--per-split-data-args-path",
        "FILE",
        "a JSON object {\"train\": LIST, \"valid\": LIST, \"test\": LIST} of the per-split lists",
    ),
    flag("--data-cache-path", "DIR", "keep the datasets' built indexes here (.npy) and reuse them on the next run"),
    switch(
        "--mock-data",
        "Megatron's mock data (100,000 generated sequences, split 1,1,1 whatever --split says, as in Megatron) instead of a dataset",
    ),
    flag(
        "--mid-level-dataset-surplus",
        "F",
        "extra fraction of samples each dataset of a weighted blend builds (default 0.005)",
    ),
    flag("--eval-interval", "N", "validate every N iterations (default 1000)"),
    flag("--eval-iters", "N", "global batches per validation (default 100)"),
    flag("--log-interval", "N", "log every N iterations (default 100)"),
    flag("--log-json", "FILE", "also write each logged iteration as a JSON line to FILE"),
    flag(
        "--tensorboard-dir",
        "DIR",
        "write TensorBoard event files (loss, lr, grad norm, loss scale, throughput, memory, validation) to DIR",
    ),
    flag(
        "--tensorboard-log-interval",
        "N",
        "write each N-th iteration's loss, lr, batch size, loss scale and grad norm to TensorBoard (default 1)",
    ),
    flag("--save", "DIR", "checkpoint directory to write"),
    flag("--save-interval", "N", "checkpoint every N iterations (and at the end)"),
    flag("--load", "DIR", "checkpoint directory to resume from (none there yet: start from scratch, as Megatron does)"),
    switch(
        "--no-load-optim",
        "--load restores no optimizer state: fresh AdamW moments and loss scale, and the learning-rate schedule restarts, as in Megatron",
    ),
    switch(
        "--use-checkpoint-args",
        "the model's shape, sequence length and tokenizer from the checkpoint --load names (flags given apply on top)",
    ),
    switch(
        "--no-save-optim",
        "checkpoints without AdamW's moments and loss scale (a third the size); loading one starts them fresh, as --no-load-optim",
    ),
    flag(
        "--pretrained-checkpoint",
        "DIR",
        "while --load holds no checkpoint yet, start from DIR's weights alone, as --finetune (a requeued fine-tuning job's first launch)",
    ),
    switch("--finetune", "--load restores the weights alone: iteration 0, no samples consumed, fresh optimizer and schedule"),
    flag("--exit-interval", "N", "stop (after a checkpoint, with --save) when the iteration is a multiple of N"),
    switch(
        "--exit-signal-handler",
        "on SIGUSR1 or SIGTERM: finish the iteration, checkpoint to --save, exit 75 (requeue me)",
    ),
    flag(
        "--exit-duration-in-mins",
        "N",
        "after N minutes (fractions allowed) from start: checkpoint to --save at the iteration's end, exit 75",
    ),
    flag("--cpu-threads", "N", "CPU threads (default: SLURM_CPUS_PER_TASK or the affinity mask)"),
    flag(
        "--device",
        "KIND",
        "cpu, cuda or hip (both need --bf16 or --fp16; head dim 32, 64 or 128; Llama-family models on hip, GPT-2's architecture only on cuda so far); `trident info` lists the GPU libraries found; reference: the f64 oracle the others are tested against (serial, slow)",
    ),
    flag(
        "--gpu-collectives",
        "LIB",
        "how GPU ranks move tensors: nccl (default with --device cuda) or rccl (default with --device hip) on device memory, or mpi (staged through host memory)",
    ),
    flag("--hidden-dropout", "P", "dropout of the embeddings and residual branches (default 0.1; 0 under --preset)"),
    flag("--attention-dropout", "P", "dropout of the attention probabilities (default 0.1; 0 under --preset)"),
    flag("--tensor-model-parallel-size", "T", "tensor-parallel ranks per model replica (default 1)"),
    flag(
        "--context-parallel-size",
        "C",
        "ranks splitting each sequence (default 1): rank i holds chunks i and 2C-1-i of 2C",
    ),
    many(
        "--cp-comm-type",
        "KIND",
        "p2p (Megatron's default: keys and values passed around a ring, blockwise attention), all_gather (gathered, blockwise), a2a (heads swapped for positions) or a2a+p2p (a2a inside groups, the ring across)",
    ),
    many(
        "--hierarchical-context-parallel-sizes",
        "N",
        "the inner all-to-all and outer ring sizes of --cp-comm-type a2a+p2p (adjacent CP ranks swap), multiplying to C",
    ),
    switch("--sequence-parallel", "split LayerNorm, dropout and residuals along the sequence over the TP group"),
    flag(
        "--tensor-parallel-mode",
        "MODE",
        "1d (Megatron, default), 2d (SUMMA on a q x q grid, T = q²) or 2.5d (d stacked q x q grids, T = d q²)",
    ),
    flag("--tesseract-depth", "D", "depth d of the 2.5d grid (the batch splits over d q rows of grids)"),
    flag(
        "--summa-algorithm",
        "NAME",
        "panel (gathered panels, 2 collectives per product; default) or broadcast (q double-buffered steps)",
    ),
    flag("--pipeline-model-parallel-size", "P", "pipeline stages (default 1)"),
    flag("--num-layers-per-virtual-pipeline-stage", "N", "layers per virtual stage (interleaved 1F1B)"),
    flag(
        "--pipeline-schedule",
        "NAME",
        "gpipe, 1f1b, interleaved-1f1b, zb-h1 or zb-v (zero-bubble: backward split into B and W; zb-v: two chunks \
         per stage in a V; default: Megatron's choice)",
    ),
    flag("--decoder-first-pipeline-num-layers", "N", "layers on the first pipeline stage"),
    flag("--decoder-last-pipeline-num-layers", "N", "layers on the last pipeline stage"),
    flag("--timing-trace", "FILE", "write a Chrome trace (Perfetto) of every rank's passes and waits"),
    switch("--use-distributed-optimizer", "shard AdamW state over data-parallel ranks (ZeRO-1)"),
    flag(
        "--data-parallel-sharding-strategy",
        "KIND",
        "no_shard (AdamW's state whole), optim (sharded: ZeRO-1, as --use-distributed-optimizer) or optim_grads \
         (gradients too: ZeRO-2); optim_grads_params is not built yet",
    ),
    switch(
        "--use-megatron-fsdp",
        "Megatron FSDP: runs with --data-parallel-sharding-strategy no_shard, optim or optim_grads (its default, \
         optim_grads_params, is not built yet)",
    ),
    switch(
        "--overlap-grad-reduce",
        "under the distributed optimizer, reduce-scatter each gradient bucket during the last micro-batch's backward \
         (the replicated all-reduce always overlaps it)",
    ),
    switch(
        "--grad-reduce-in-bf16",
        "sum the data-parallel gradient buckets in bf16 (half the bytes; with --bf16); they accumulate in f32",
    ),
    switch(
        "--overlap-param-gather",
        "under the distributed optimizer, each bucket's weight all-gather finishes as the next forward reaches it \
         (over MPI; with NCCL/RCCL the gathers are ordered on their stream before the next forward)",
    ),
    switch("--log-memory", "report bytes per rank of weights, gradients, optimizer state and activations"),
    switch("--log-comm", "report the elements each rank moves per layer and per step, by group and collective"),
    switch(
        "--log-num-zeros-in-grad",
        "log the gradient elements that are zero each step, each parameter counted once (copies the gradients to the host)",
    ),
    switch("--log-params-norm", "log the L2 norm of the parameters after each step (log line, JSON, TensorBoard)"),
    switch("--log-world-size-to-tensorboard", "write the number of ranks to TensorBoard with the per-iteration scalars"),
    switch(
        "--log-device-work",
        "print each iteration's device work (launches, copies, synchronisations, allocations) on every rank where it is counted",
    ),
    flag(
        "--recompute-granularity",
        "KIND",
        "full (recompute layers from their inputs) or selective (the attention core)",
    ),
    switch("--recompute-activations", "Megatron's name for --recompute-granularity selective"),
    flag(
        "--recompute-method",
        "KIND",
        "uniform only, with --recompute-num-layers 1: full recompute checkpoints every layer's input (block is not built)",
    ),
    flag("--recompute-num-layers", "N", "1 only: the layers per recomputed group of --recompute-method uniform"),
    switch(
        "--checkpoint-activations",
        "Megatron's older name for --recompute-granularity full --recompute-method uniform --recompute-num-layers 1",
    ),
    flag("--checkpoint-num-layers", "N", "1 only: Megatron's older name for --recompute-num-layers"),
    flag("--activations-checkpoint-method", "KIND", "uniform only: Megatron's older name for --recompute-method"),
    flag("--activations-checkpoint-num-layers", "N", "1 only: Megatron's older name for --recompute-num-layers"),
    flag("--data-impl", "KIND", "mmap only: Megatron's older flag; the .bin files are always memory-mapped"),
    flag("--vocab-extra-ids", "N", "0 only: T5's sentinel tokens; a GPT or Llama vocabulary has none"),
    flag(
        "--rotary-seq-len-interpolation-factor",
        "F",
        "not built yet: rotary positions are not interpolated (--use-rope-scaling is Llama 3.1's scaling)",
    ),
    switch(
        "--eod-mask-loss",
        "leave out of the loss the prediction after each end-of-document token (training and validation)",
    ),
    switch(
        "--reset-position-ids",
        "restart a sample's learned positions at 0 after each end-of-document token (rotary ones run on, as in Megatron)",
    ),
    switch(
        "--reset-attention-mask",
        "attend within each document of a sample (each end-of-document token ends its document), on every device",
    ),
    switch(
        "--fp32-residual-connection",
        "not built yet: under --bf16 or --fp16 the residual stream is held in 16 bits, as Megatron's default",
    ),
    switch("--qk-layernorm", "not built yet: no norm on queries and keys (Qwen 3's, OLMo 2's)"),
    switch("--add-qkv-bias", "not built yet: QKV biases without --disable-bias-linear's other biases (Qwen 2's)"),
    switch("--init-method-xavier-uniform", "not built yet: weights start normal with --init-method-std"),
    switch(
        "--use-checkpoint-opt_param-scheduler",
        "not built yet: the learning-rate schedule always comes from the flags (a checkpoint stores no schedule parameters)",
    ),

    flag("--wandb-project", "NAME", "not built: Weights & Biases logging; trident writes TensorBoard and --log-json"),
    flag("--wandb-exp-name", "NAME", "not built: Weights & Biases logging; trident writes TensorBoard and --log-json"),
    switch(
        "--tp-comm-overlap",
        "not built yet: the sequence-parallel all-gather and reduce-scatter run beside, not inside, the linears (issue 53)",
    ),
    switch(
        "--use-precision-aware-optimizer",
        "not built yet: AdamW keeps f32 masters and moments; 16-bit optimizer state is not built",
    ),
    flag("--fp8-format", "KIND", "not built: FP8 training (after issues 49 to 53); use --bf16"),
    flag("--dataloader-type", "KIND", "single (Megatron's default sample order, the only one built)"),
    switch(
        "--calculate-per-token-loss",
        "the gradient of the global batch's summed loss over its counted tokens, not the mean of each \
         micro-batch's mean (the same where --eod-mask-loss is not given)",
    ),
    flag(
        "--distributed-timeout-minutes",
        "M",
        "stop the job when a rank waits on the others longer than M minutes (a collective, a message, the device's queued collectives; default 10, as Megatron)",
    ),
    switch(
        "--profile",
        "profile iterations --profile-step-start + 1 to --profile-step-end: on CUDA and HIP the profiler API's capture range (nsys --capture-range=cudaProfilerApi), and --timing-trace records only them",
    ),
    flag("--profile-step-start", "N", "--profile starts after N iterations (default 10)"),
    flag("--profile-step-end", "N", "--profile stops after iteration N (default 12)"),
    many("--profile-ranks", "R", "the global ranks that profile (default every rank)"),
    flag("--ddp-bucket-size", "N", "elements per data-parallel gradient bucket (default 40000000)"),
    switch("--bf16", "bf16 mixed precision: bf16 weights and activations, f32 masters, gradients and AdamW state"),
    switch("--fp16", "fp16 mixed precision with dynamic loss scaling"),
    flag("--initial-loss-scale", "S", "fp16: the first loss scale (default 4294967296 = 2^32)"),
    flag("--min-loss-scale", "S", "fp16: the smallest loss scale (default 1)"),
    flag("--loss-scale-window", "N", "fp16: clean steps before the scale doubles (default 1000)"),
    flag("--hysteresis", "N", "fp16: overflowing steps tolerated before the scale halves (default 2)"),
    flag("--loss-scale", "S", "a constant loss scale instead of the dynamic one"),
];

/// `trident plan`: the model (sizes, then the architecture flags train takes), the job, the pins,
/// the machine.
pub const PLAN_FLAGS: &[FlagSpec] =
    &join::<{ PLAN_SIZES.len() + ARCH_FLAGS.len() + PLAN_REST.len() }>(&[PLAN_SIZES, ARCH_FLAGS, PLAN_REST]);

const PLAN_SIZES: &[FlagSpec] = &[
    flag(
        "--model",
        "NAME",
        "a named shape: train's presets (tiny .. gpt2-1.5b, llama-tiny .. llama3-70b), megatron-1.7b .. megatron-1t (the 2021 paper's rows), gpt3-175b",
    ),
    flag("--num-layers", "N", "transformer layers (with the next three, instead of or over --model)"),
    flag("--hidden-size", "H", "hidden size"),
    flag("--num-attention-heads", "A", "attention heads"),
    flag("--seq-length", "S", "tokens per sample"),
    flag("--ffn-hidden-size", "F", "MLP width (default 4 x hidden size)"),
    flag("--max-position-embeddings", "P", "rows of the position embedding (default the sequence length)"),
    flag("--vocab-size", "V", "vocabulary before padding (default 50257 without --model)"),
    flag("--make-vocab-size-divisible-by", "K", "pad the vocabulary to a multiple of K x the layout's TP size (default 128)"),
];

const PLAN_REST: &[FlagSpec] = &[
    flag("--gpus", "N", "GPUs of the job (required)"),
    flag("--gpus-per-node", "G", "GPUs per node (default 8)"),
    flag(
        "--gpu",
        "KIND",
        "a100 (80GB SXM, default), a100-40gb, h100 (SXM), h100-pcie, h200, b200, mi250x (one GCD) or mi300x",
    ),
    flag("--hardware", "FILE", "a JSON file of GPU figures instead of --gpu (docs/planner.md)"),
    flag("--global-batch-size", "B", "sequences per iteration (required)"),
    flag("--precision", "P", "bf16 (default), fp16 or fp32"),
    flag("--tensor-model-parallel-size", "T", "pin the tensor-parallel size"),
    flag("--pipeline-model-parallel-size", "P", "pin the pipeline size"),
    flag("--micro-batch-size", "B", "pin the micro-batch size"),
    flag("--num-virtual-stages-per-pipeline-rank", "V", "pin the virtual stages per pipeline rank (1: plain 1F1B)"),
    flag(
        "--pipeline-schedule",
        "NAME",
        "pin gpipe, 1f1b, interleaved-1f1b, zb-h1 or zb-v, or megatron (1F1B or interleaved only, as Megatron-LM \
         runs; default: all but gpipe)",
    ),
    flag("--recompute-granularity", "KIND", "pin recompute: none, selective or full"),
    flag("--zero1", "on|off", "pin ZeRO-1 (the distributed optimizer) on or off"),
    flag(
        "--data-parallel-sharding-strategy",
        "S",
        "no_shard, optim (ZeRO-1), optim_grads (ZeRO-2) or optim_grads_params (ZeRO-3 / FSDP; priced only, trident does not run it yet)",
    ),
    flag("--tensor-parallel-mode", "MODE", "pin 1d, 2d or 2.5d (default: consider all three)"),
    flag("--tesseract-depth", "D", "pin the depth of 2.5d grids"),
    flag(
        "--context-parallel-size",
        "C",
        "pin context parallelism: each sequence split over C ranks (default: none, or what wins)",
    ),
    flag(
        "--cp-comm-type",
        "TYPE",
        "a2a (the heads swap; the search's choice) or p2p (Megatron's ring, priced with its passes hidden)",
    ),
    switch("--sequence-parallel", "plan with sequence parallelism wherever tp > 1"),
    flag("--gemm-efficiency", "X", "fraction of peak GEMMs with a long inner dimension reach (default: the GPU's)"),
    flag("--attention-efficiency", "X", "fraction of peak flash attention reaches (default: the GPU's)"),
    flag(
        "--calibrate",
        "FILE",
        "fit the GEMM and attention efficiencies to bench records (JSON lines: `bench gemm|attention --json`, tests/gpu/plan-calibrate.sh)",
    ),
    flag(
        "--attention-backend",
        "B",
        "flash (default; fused, auto: the same) or unfused (local: Megatron 2021's, scores in memory)",
    ),
    switch("--tp-comm-overlap", "price Megatron's TP collectives overlapped with the GEMMs (trident does not yet)"),
    switch("--overlap-grad-reduce", "price the ZeRO-1 gradient reduce-scatter behind the backward (as trident and Megatron run it)"),
    switch("--overlap-param-gather", "price the ZeRO-1 weight all-gather behind the next forward (Megatron's)"),
    flag("--peak-tflops", "X", "dense peak of --precision, TFLOP/s (default: the GPU's)"),
    flag("--hbm-bandwidth", "GB/s", "memory bandwidth per GPU (default: the GPU's)"),
    flag("--memory-gib", "GIB", "memory per GPU (default: the GPU's)"),
    flag("--memory-headroom", "X", "fraction of memory kept free for allocator fragmentation (default 0.1)"),
    flag("--runtime-reserve-gib", "GIB", "memory the runtime holds: context, NCCL buffers, workspaces (default 2)"),
    flag("--intra-node-bandwidth", "GB/s", "all-reduce bus bandwidth inside a node (default: the GPU's)"),
    flag("--intra-node-latency-us", "US", "latency per collective step inside a node (default 5)"),
    flag("--inter-node-bandwidth", "GB/s", "network bandwidth per GPU, one direction (default: the GPU's)"),
    flag("--inter-node-latency-us", "US", "latency per step between nodes (default 10)"),
    flag("--top", "K", "layouts to print (default 5; 0 prints all that fit)"),
    switch("--json", "print one JSON object per layout, best first"),
];

/// Megatron's tokenizer flags, shared by `prepare`, `train` and `generate`
/// (`data::tokenizer_files::from_args` reads them).
pub const TOKENIZER_FLAGS: &[FlagSpec] = &[
    flag(
        "--tokenizer-type",
        "NAME",
        "ByteTokenizer (default), GPT2BPETokenizer, HuggingFaceTokenizer, TikTokenizer or NullTokenizer (ids as numbers, for --mock-data)",
    ),
    flag(
        "--vocab-size",
        "V",
        "vocabulary before padding (default: the tokenizer's, the byte tokenizer's 257); NullTokenizer: V ids, then its end-of-document id V; TikTokenizer: its ids (default 131072)",
    ),
    flag("--vocab-file", "FILE", "GPT2BPETokenizer: GPT-2's vocab.json (encoder.json)"),
    flag("--merge-file", "FILE", "GPT2BPETokenizer: GPT-2's merges.txt (vocab.bpe)"),
    flag(
        "--tokenizer-model",
        "PATH",
        "HuggingFaceTokenizer: a tokenizer.json, or the directory holding it; TikTokenizer: Megatron's tiktoken .json",
    ),
    flag(
        "--eod-token",
        "TOKEN",
        "HuggingFaceTokenizer: the end-of-document token (default: tokenizer_config.json's eos_token)",
    ),
    flag(
        "--tiktoken-pattern",
        "v1|v2",
        "TikTokenizer's split pattern (default v2); the other tokenizers do not read it, as in Megatron",
    ),
    flag(
        "--tiktoken-num-special-tokens",
        "N",
        "TikTokenizer: ids 0..N are special tokens (<unk> <s> </s> <mask> <pad> <cls> <sep> <SPECIAL_7> ...; default 1000)",
    ),
    many(
        "--tokenizer-special-tokens",
        "TOKEN",
        "TikTokenizer: the first special tokens, in id order (unique, holding <unk> <s> </s> <mask> <pad> <cls> <sep>)",
    ),
    many("--tiktoken-special-tokens", "TOKEN", "the older name of --tokenizer-special-tokens"),
    switch(
        "--tokenizer-hf-include-special-tokens",
        "HuggingFaceTokenizer: add the tokenizer.json's template tokens (Llama 3's <|begin_of_text|>) to every text",
    ),
];

/// `trident prepare`: its own flags and the tokenizer's.
pub const PREPARE_FLAGS: &[FlagSpec] =
    &join::<{ PREPARE_OWN.len() + TOKENIZER_FLAGS.len() }>(&[PREPARE_OWN, TOKENIZER_FLAGS]);

const PREPARE_OWN: &[FlagSpec] = &[
    many("--input", "FILE", "text files, or JSON-lines files (.json/.jsonl)"),
    flag("--output-prefix", "P", "writes P_<key>_document.bin/.idx"),
    many("--json-keys", "KEY", "JSON fields to extract, one dataset each (default text)"),
    switch("--append-eod", "end every document with the end-of-document token"),
    flag("--text-documents", "MODE", "how plain text splits into documents: paragraph (default), line, file"),
    flag("--workers", "N", "threads that tokenize (default: every CPU)"),
];

/// `trident generate`: its own flags and the tokenizer's (the one the model was trained with).
pub const GENERATE_FLAGS: &[FlagSpec] =
    &join::<{ GENERATE_OWN.len() + TOKENIZER_FLAGS.len() }>(&[GENERATE_OWN, TOKENIZER_FLAGS]);

const GENERATE_OWN: &[FlagSpec] = &[
    flag("--load", "DIR", "checkpoint directory written by `trident train --save`"),
    flag("--prompt", "TEXT", "text to continue (default: start of a document)"),
    flag("--max-new-tokens", "N", "tokens to sample (default 256)"),
    flag("--temperature", "T", "softmax temperature (default 1.0; 0 is greedy)"),
    flag("--top-k", "K", "sample among the K likeliest tokens (default 40; 1 is greedy, 0 all)"),
    flag("--seed", "SEED", "sampling seed (default 1234)"),
    flag("--cpu-threads", "N", "CPU threads"),
    switch(
        "--no-kv-cache",
        "recompute the whole context for every token (the default caches keys and values, one position per token, until the position table is full)",
    ),
];

/// `trident convert`.
pub const CONVERT_FLAGS: &[FlagSpec] = &[
    flag("--load", "DIR", "checkpoint to read (its latest iteration): trident's, or Megatron-LM's (torch_dist or torch)"),
    flag("--load-hf", "DIR", "a Hugging Face GPT-2 or Llama directory (config.json, safetensors) to read instead"),
    flag("--save", "DIR", "write a checkpoint of the target layout"),
    flag("--save-hf", "DIR", "write config.json and model.safetensors for Hugging Face transformers"),
    flag("--save-megatron", "DIR", "write the weights as a Megatron-LM torch_dist checkpoint (f32, one rank)"),
    flag("--target-tensor-parallel-size", "T", "tensor-parallel size of the written checkpoint (default 1)"),
    flag("--target-pipeline-parallel-size", "P", "pipeline size of the written checkpoint (default 1)"),
    flag("--target-num-layers-per-virtual-pipeline-stage", "N", "virtual stages of the written checkpoint"),
    flag("--target-pipeline-schedule", "zb-v", "place the written checkpoint's two chunks per stage in zb-v's V"),
    switch("--target-sequence-parallel", "mark the written checkpoint as sequence parallel"),
    flag("--target-tensor-parallel-mode", "MODE", "1d (default), 2d or 2.5d: how the written checkpoint's TP splits"),
    flag("--target-tesseract-depth", "D", "depth of a written 2.5d checkpoint"),
    flag(
        "--make-vocab-size-divisible-by",
        "K",
        "pad the written vocabulary to a multiple of K x its tensor-parallel size (default: the checkpoint's, else 128)",
    ),
];

/// `trident info`.
pub const INFO_FLAGS: &[FlagSpec] = &[flag("--cpu-threads", "N", "CPU threads to measure the peak with")];

/// `trident bench`.
pub const BENCH_FLAGS: &[FlagSpec] = &[
    flag("--cpu-threads", "N", "CPU threads"),
    flag("--min-seconds", "S", "time per shape or size (default 0.3; 0.1 for collectives)"),
    flag("--max-size", "BYTES", "largest collective size (default 1G; suffixes K, M, G)"),
    switch("--json", "print one JSON object per measurement"),
    flag("--dtype", "T", "gemm and step: f32 (default) or bf16; step on the CPU also takes two, f32,bf16: their steps interleaved one by one, with the ratio of their times (step --device cuda|hip needs bf16)"),
    flag("--preset", "NAME", "step, generate, summa: the model (default gpt2-124m)"),
    flag("--num-layers", "L", "step: transformer layers (default: the preset's)"),
    flag("--hidden-size", "H", "step, summa: hidden size (default: the preset's)"),
    flag("--num-attention-heads", "A", "step: attention heads (default: the preset's)"),
    flag("--num-query-groups", "G", "step: key/value heads, grouped-query attention (default: the preset's)"),
    flag("--ffn-hidden-size", "F", "step: MLP width (default: the preset's; Megatron's default for a new hidden size)"),
    flag("--micro-batch-size", "B", "step, summa: samples per step (default 4)"),
    flag(
        "--seq-length",
        "S",
        "step: tokens per sample (default 64); generate: the new token's position (default 512); summa: (default: the preset's, at most 256)",
    ),
    flag("--vocab-size", "V", "step: vocabulary (default 50257, GPT-2's)"),
    flag("--steps", "N", "step --device cuda|hip: timed steps after the first (default: enough to fill --min-seconds, at least 2)"),
    flag(
        "--device",
        "D",
        "gemm, attention, layernorm, step, allreduce: cpu (default), cuda (an NVIDIA GPU; allreduce through NCCL) or hip (an AMD GPU; allreduce through RCCL, against the host-staged MPI path); gemm-bwd, gelu, xent, embedding: cuda or hip",
    ),
    flag("--comm-library", "LIB", "allreduce --device cuda: nccl (default) or rccl"),
    flag(
        "--shape",
        "S",
        "one shape instead of the sweep (gemm MxNxK, also on the CPU; with --device cuda|hip: attention BxSxHxD; layernorm RxC; gelu N; xent RxV; embedding BxSxH)",
    ),
];

/// `trident check data`: `train`'s flags, and what to write.
pub const CHECK_DATA_FLAGS: &[FlagSpec] =
    &join::<{ TRAIN_FLAGS.len() + CHECK_DATA_REST.len() }>(&[TRAIN_FLAGS, CHECK_DATA_REST]);

const CHECK_DATA_REST: &[FlagSpec] = &[
    flag("--dump", "FILE", "write samples as JSON lines {\"split\", \"sample\", \"tokens\": seq-length + 1 ids}"),
    flag("--dump-samples", "N", "samples written from the start of each split (default 1000)"),
];

/// `trident check ops`.
pub const CHECK_OPS_FLAGS: &[FlagSpec] = &[
    flag("--device", "D", "cuda (default), hip or cpu"),
    flag("--size", "S", "small (ragged shapes, seconds on an emulated GPU) or full (default: adds GPT-2-sized shapes)"),
    flag("--gpu", "N", "the GPU to check (default 0)"),
    switch("--fp16", "check the GPU's fp16 module (binary16 storage) with fp16's bounds; default bf16"),
];

/// `trident check nccl`.
pub const CHECK_NCCL_FLAGS: &[FlagSpec] =
    &[flag("--comm-library", "LIB", "nccl (default; TRIDENT_NCCL names the file) or rccl (TRIDENT_RCCL)")];

/// `train`'s flags that Megatron-LM does not have: trident's own.
pub const TRIDENT_OWN: &[&str] = &[
    "--preset",
    "--cpu-threads",
    "--device",
    "--gpu-collectives",
    "--log-comm",
    "--log-device-work",
    "--log-json",
    "--log-memory",
    "--pipeline-schedule",
    "--summa-algorithm",
    "--tensor-parallel-mode",
    "--tesseract-depth",
    "--timing-trace",
    "--eod-token",
];

/// How a flag of `trident train` stands against Megatron-LM's, as docs/megatron.md lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MegatronStatus {
    /// Megatron's flag, with Megatron's meaning.
    Works,
    /// Megatron's flag, with some of its values: the others are refused by name.
    Limited,
    /// Accepted so a Megatron script runs unchanged; rank 0 says why it changes nothing.
    NoEffect,
    /// Accepted by the parser but refused when given: the feature is not built.
    Refused,
    /// trident's own flag.
    Own,
}

impl MegatronStatus {
    /// `spec`'s status: `TRIDENT_OWN` names trident's own; a help line that opens with "no
    /// effect" or "not built" marks the next two; one that says "only" limits the values.
    pub fn of(spec: &FlagSpec) -> MegatronStatus {
        if TRIDENT_OWN.contains(&spec.name) {
            MegatronStatus::Own
        } else if spec.help.starts_with("no effect") {
            MegatronStatus::NoEffect
        } else if spec.help.starts_with("not built") {
            MegatronStatus::Refused
        } else if spec.help.contains("only") {
            MegatronStatus::Limited
        } else {
            MegatronStatus::Works
        }
    }

    fn name(self) -> &'static str {
        match self {
            MegatronStatus::Works => "works",
            MegatronStatus::Limited => "works for the values named",
            MegatronStatus::NoEffect => "accepted, no effect",
            MegatronStatus::Refused => "refused",
            MegatronStatus::Own => "trident's own",
        }
    }
}

/// The Markdown table of `trident train`'s flags against Megatron-LM's (docs/megatron.md holds
/// it; a test keeps the two equal).
pub fn megatron_table() -> String {
    let mut out = String::from("| flag | status | in trident |\n|---|---|---|\n");
    for spec in TRAIN_FLAGS {
        let value = if spec.value.is_empty() { String::new() } else { format!(" {}", spec.value.replace('|', "\\|")) };
        let help = spec.help.replace('|', "\\|");
        out.push_str(&format!("| `{}{value}` | {} | {help} |\n", spec.name, MegatronStatus::of(spec).name()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/megatron.md holds `megatron_table()` between its markers; `TRIDENT_BLESS=1` rewrites it.
    #[test]
    fn the_migration_guide_lists_every_train_flag_as_it_stands() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/megatron.md");
        let text = std::fs::read_to_string(path).expect("docs/megatron.md");
        let (begin, end) = ("<!-- flags: generated -->\n", "<!-- flags: end -->");
        let start = text.find(begin).expect("the opening marker") + begin.len();
        let stop = start + text[start..].find(end).expect("the closing marker");
        let want = megatron_table();
        if text[start..stop] != want {
            if std::env::var("TRIDENT_BLESS").as_deref() == Ok("1") {
                std::fs::write(path, format!("{}{want}{}", &text[..start], &text[stop..])).unwrap();
            } else {
                panic!("docs/megatron.md's flag table is not src/flags.rs's: rerun with TRIDENT_BLESS=1 to write it");
            }
        }
        assert!(TRIDENT_OWN.iter().all(|own| TRAIN_FLAGS.iter().any(|f| f.name == *own)), "a stale TRIDENT_OWN entry");
    }
}
