//! The Device's op families, one trait each, and the shapes and operand groups their ops take.
//! Activations are [rows, cols] row-major; a backend implements every family (`Device`).

use super::dropout::Dropout;
use super::kernels::Gelu;
use super::Memory;

/// The shape of a row-wise op: `rows` rows of `cols` values (a norm's, a bias's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Matrix {
    pub rows: usize,
    pub cols: usize,
}

/// The shape of a linear layer's product: `[rows, k]` inputs times a `[n, k]` weight's transpose
/// into `[rows, n]` outputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gemm {
    pub rows: usize,
    pub k: usize,
    pub n: usize,
}

/// The logits a cross-entropy reads: `[rows, vocab]`, this rank's shard of the vocabulary, whose
/// first id is `vocab_start`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Logits {
    pub rows: usize,
    pub vocab: usize,
    pub vocab_start: usize,
}

/// The token ids a word embedding reads: `batch` samples of `seq` tokens, sample-major, against
/// this rank's shard of the table, whose first row is id `vocab_start`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tokens<'a> {
    pub ids: &'a [u32],
    pub batch: usize,
    pub seq: usize,
    pub vocab_start: usize,
}

/// What a LayerNorm backward reads of its forward: the input, the scale, and the per-row mean and
/// reciprocal std forward saved. `B` is a device buffer, or a slice for the reference kernels.
pub struct LayerNormSaved<'a, B: ?Sized> {
    pub inp: &'a B,
    pub weight: &'a B,
    pub mean: &'a B,
    pub rstd: &'a B,
}

impl<B: ?Sized> Clone for LayerNormSaved<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: ?Sized> Copy for LayerNormSaved<'_, B> {}

impl<'a, B: ?Sized> LayerNormSaved<'a, B> {
    /// The same operands seen through `f` (a host device's buffers as slices of their elements).
    pub fn map<C: ?Sized>(self, f: impl Fn(&'a B) -> &'a C) -> LayerNormSaved<'a, C> {
        LayerNormSaved { inp: f(self.inp), weight: f(self.weight), mean: f(self.mean), rstd: f(self.rstd) }
    }
}

/// Geometry of one causal self-attention call. Activations are sequence-first like Megatron's:
/// row `t * batch + b` holds token `t` of sequence `b`. The fused QKV row is laid out per query
/// group as Megatron lays it out, `[q_g0 .. q_g(n-1) | k_g | v_g]` for each group `g` of
/// `heads / kv_heads` query heads sharing one key and one value head, so that splitting groups
/// across tensor-parallel ranks is a contiguous split of the QKV weight's rows. Multi-head
/// attention is `kv_heads == heads`: `[q_h | k_h | v_h]` per head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    /// Key/value heads (query groups); divides `heads`.
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl AttentionShape {
    /// Multi-head attention: one key and one value head per query head.
    pub fn new(batch: usize, seq: usize, heads: usize, head_dim: usize) -> AttentionShape {
        AttentionShape { batch, seq, heads, kv_heads: heads, head_dim }
    }
    /// Grouped-query attention over `kv_heads` key/value heads.
    pub fn grouped(self, kv_heads: usize) -> AttentionShape {
        assert!(kv_heads > 0 && self.heads.is_multiple_of(kv_heads), "{} heads in {kv_heads} groups", self.heads);
        AttentionShape { kv_heads, ..self }
    }
    pub fn rows(&self) -> usize {
        self.batch * self.seq
    }
    /// Width of the attention output: the query heads.
    pub fn width(&self) -> usize {
        self.heads * self.head_dim
    }
    /// Query heads per key/value head.
    pub fn group_size(&self) -> usize {
        self.heads / self.kv_heads
    }
    /// Width of a fused QKV row: the query heads and each group's key and value heads.
    pub fn qkv_width(&self) -> usize {
        (self.heads + 2 * self.kv_heads) * self.head_dim
    }
    /// Offsets inside a QKV row of query head `head`'s q vector and of its group's k and v.
    pub fn qkv_offsets(&self, head: usize) -> (usize, usize, usize) {
        let (n, d) = (self.group_size(), self.head_dim);
        let (g, j) = (head / n, head % n);
        let base = g * (n + 2) * d;
        (base + j * d, base + n * d, base + (n + 1) * d)
    }
}

/// A run of positions of a fused-QKV buffer (or a buffer laid out like one): positions `first ..
/// first + len` of each of the shape's `batch` samples, in a buffer of `seq` positions (rows
/// `t · batch + b`) starting at element `base`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QkvRun {
    pub base: usize,
    pub seq: usize,
    pub first: usize,
    pub len: usize,
}

impl QkvRun {
    /// The first element of position `t` of the run in sample `b`, rows `width` wide.
    pub fn at(&self, t: usize, b: usize, batch: usize, width: usize) -> usize {
        self.base + ((self.first + t) * batch + b) * width
    }

    /// Elements the buffer must hold, rows `width` wide.
    pub fn end(&self, batch: usize, width: usize) -> usize {
        self.base + self.seq * batch * width
    }
}

/// Which keys of a block its queries see, and how its probabilities drop.
#[derive(Clone, Copy, Debug)]
pub struct BlockMask<'a> {
    /// The diagonal block (queries and keys the same positions): query t sees keys 0..=t.
    pub diagonal: bool,
    /// Attention dropout, with the whole-sequence positions of the block's first query and first
    /// key: the probability of (query t, key j) drops as the one-rank kernel's of (q0 + t, k0 + j)
    /// (`Dropout::attention_index`; the dropout's `seq` is the whole sequence's).
    pub dropout: Option<(&'a Dropout, usize, usize)>,
}

impl BlockMask<'_> {
    /// A block without dropout.
    pub fn plain(diagonal: bool) -> BlockMask<'static> {
        BlockMask { diagonal, dropout: None }
    }

    /// Keys of query `t` in a block of `len` keys: all of them, or up to `t` on the diagonal.
    pub(super) fn keys(&self, t: usize, len: usize) -> usize {
        if self.diagonal {
            t + 1
        } else {
            len
        }
    }

    /// The masks and keep scale, and the index of (batch b, head, query t)'s first key.
    pub(super) fn first<R: crate::real::Real>(&self, (b, head, t): (usize, usize, usize)) -> Option<(u64, R)> {
        self.dropout.map(|(d, q0, k0)| (d.attention_index(b, head, q0 + t) + k0 as u64, R::from_f64(d.scale() as f64)))
    }
}

/// Rotary position embedding (RoPE) of one attention call: the first `rotary_dim` components of
/// every query and key head are rotated in pairs `(i, i + rotary_dim / 2)` (Megatron's and Hugging
/// Face's non-interleaved layout) by `position · inv_freq[i]`. `table` (a device buffer the model
/// makes once, `rotary_table`) holds per position the cosines then the sines of those angles,
/// `[positions, rotary_dim]`; row `t * batch + b` has position `t0 + t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rotary {
    pub rotary_dim: usize,
    pub t0: usize,
}

/// One AdamW update's hyper-parameters; `step` is the 1-based count used for bias correction.
/// The factor each gradient is multiplied by first (the clip coefficient over the loss scale)
/// is not here: `OptimizerOps::adamw` reads it from the device's scalars (`clip_scale`).
#[derive(Clone, Copy, Debug)]
pub struct AdamWStep {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    pub step: u64,
}

impl AdamWStep {
    /// This step for one tensor: its weight decay where the tensor is `decayed`, none where not.
    pub fn for_tensor(self, decayed: bool) -> AdamWStep {
        AdamWStep { weight_decay: if decayed { self.weight_decay } else { 0.0 }, ..self }
    }
}

/// One tensor of an AdamW step (`OptimizerOps::adamw`, `adamw_group`): its master weights, gradient and moments,
/// whether weight decay applies to it, and, where mixed precision keeps one, its rounded working
/// copy with that copy's precision.
pub struct AdamWTensor<'a, B> {
    pub param: &'a mut B,
    pub grad: &'a B,
    pub m: &'a mut B,
    pub v: &'a mut B,
    pub decayed: bool,
    pub working: Option<(&'a mut B, crate::real::Precision)>,
}

/// Element-wise ops and activations.
pub trait ElementwiseOps: Memory {
    /// `acc += x`, element-wise.
    fn add_assign(&self, acc: &mut Self::Buf, x: &Self::Buf);

    /// `out = a + b`, element-wise (the residual connection).
    fn add(&self, out: &mut Self::Buf, a: &Self::Buf, b: &Self::Buf);

    /// GELU, the tanh form (GPT-2's) or the exact erf one (`kernels::Gelu`).
    fn gelu_forward(&self, out: &mut Self::Buf, inp: &Self::Buf, form: Gelu);

    /// `dinp = dout · gelu'(inp)`.
    fn gelu_backward(&self, dinp: &mut Self::Buf, inp: &Self::Buf, dout: &Self::Buf, form: Gelu);

    /// SwiGLU of rows of `2 f` values, the gate's `f` then the up projection's `f`:
    /// `out[r, i] = silu(inp[r, i]) · inp[r, f + i]`, `out` being [rows, f].
    fn swiglu_forward(&self, out: &mut Self::Buf, inp: &Self::Buf, rows: usize, f: usize);

    /// `dinp` ([rows, 2 f], overwrite) from `dout` ([rows, f]).
    fn swiglu_backward(&self, dinp: &mut Self::Buf, inp: &Self::Buf, dout: &Self::Buf, rows: usize, f: usize);

    /// `out[r] += bias` for each row of `shape` (the bias of a row-parallel layer, added after its
    /// all-reduce).
    fn add_bias(&self, out: &mut Self::Buf, bias: &Self::Buf, shape: Matrix);

    /// Megatron's bias-dropout-add over `shape`'s rows: `out = resid + mask ∘ (x + bias) · scale`,
    /// the mask and scale `dropout`'s (`device::dropout::bias_dropout_add_rows`).
    fn bias_dropout_add(
        &self,
        out: &mut Self::Buf,
        resid_and_x: (&Self::Buf, &Self::Buf),
        bias: Option<&Self::Buf>,
        dropout: &Dropout,
        shape: Matrix,
    );

    /// `x = mask ∘ x · scale` in place over `shape`'s rows (`device::dropout::dropout_rows`): the
    /// embeddings' dropout, and the backward of every hidden dropout.
    fn dropout(&self, x: &mut Self::Buf, dropout: &Dropout, shape: Matrix);
}

/// LayerNorm and RMSNorm over the last dimension of [rows, cols] activations, whole or split
/// across ranks (2-D / 2.5-D tensor parallelism).
pub trait NormOps: Memory {
    /// LayerNorm: `out = (inp - mean) · rstd · weight + bias` per row, saving each row's mean and
    /// reciprocal std into `stats` (`mean`, `rstd`) for backward.
    fn layernorm_forward(
        &self,
        out: &mut Self::Buf,
        stats: (&mut Self::Buf, &mut Self::Buf),
        inp: &Self::Buf,
        scale_shift: (&Self::Buf, &Self::Buf),
        shape: Matrix,
    );

    /// dinp and the scale's and shift's gradients `dparams` (`dweight`, `dbias`) are all "+=":
    /// dinp already holds the residual stream's gradient.
    fn layernorm_backward(
        &self,
        dinp: &mut Self::Buf,
        dparams: (&mut Self::Buf, &mut Self::Buf),
        dout: &Self::Buf,
        saved: LayerNormSaved<'_, Self::Buf>,
        shape: Matrix,
    );

    /// LayerNorm over a hidden dimension split across ranks: each row's sum over these
    /// `shape.cols` columns of `x`, or of `(x - mean)²` when `mean` is given. The caller sums them
    /// over the ranks that hold the row's other columns.
    fn layernorm_sums(&self, inp: &Self::Buf, shape: Matrix, mean: Option<&[f64]>, out: &mut [f64]);

    /// Normalises with the whole rows' statistics `row_stats` (`mean`, `rstd`, saved into
    /// `stats`) and applies this slice of the scale and shift.
    fn layernorm_apply(
        &self,
        out: &mut Self::Buf,
        stats: (&mut Self::Buf, &mut Self::Buf),
        inp: &Self::Buf,
        scale_shift: (&Self::Buf, &Self::Buf),
        row_stats: (&[f64], &[f64]),
        shape: Matrix,
    );

    /// Split LayerNorm backward, step 1: per row `Σ dy·w` and `Σ dy·w·x̂` over these columns
    /// (pairs in `out`).
    fn layernorm_backward_sums(
        &self,
        dout: &Self::Buf,
        saved: LayerNormSaved<'_, Self::Buf>,
        shape: Matrix,
        out: &mut [f64],
    );

    /// Step 2, with `row_sums`: those sums over the whole rows and the rows' width `n`. dinp and
    /// `dparams` (`dweight`, `dbias`) "+=".
    fn layernorm_backward_apply(
        &self,
        dinp: &mut Self::Buf,
        dparams: (&mut Self::Buf, &mut Self::Buf),
        dout: &Self::Buf,
        saved: LayerNormSaved<'_, Self::Buf>,
        row_sums: (&[f64], usize),
        shape: Matrix,
    );

    /// RMSNorm (Llama's): `out = x · rstd · weight`, with the row's
    /// `rstd = 1 / sqrt(mean(x²) + eps)` saved for backward.
    fn rmsnorm_forward(
        &self,
        out: &mut Self::Buf,
        rstd: &mut Self::Buf,
        inp: &Self::Buf,
        weight: &Self::Buf,
        shape: Matrix,
        eps: f64,
    );

    /// From forward's input and scale `inp_weight` and its `rstd`: dinp and dweight "+=" (dinp
    /// already holds the residual stream's gradient).
    fn rmsnorm_backward(
        &self,
        dinp: &mut Self::Buf,
        dweight: &mut Self::Buf,
        dout: &Self::Buf,
        inp_weight: (&Self::Buf, &Self::Buf),
        rstd: &Self::Buf,
        shape: Matrix,
    );
}

/// The linear layers: GEMMs with Megatron's [out, in] weight layout, and the precision of their
/// operands.
pub trait LinearOps: ElementwiseOps {
    /// `out[rows, n] = inp[rows, k] · weight[n, k]ᵀ (+ bias[n])`.
    fn linear_forward(
        &self,
        out: &mut Self::Buf,
        inp: &Self::Buf,
        weight: &Self::Buf,
        bias: Option<&Self::Buf>,
        shape: Gemm,
    );

    /// A row-parallel linear layer without a reduction (one tensor-parallel rank) that writes
    /// back into the residual stream: `out = resid + inp · weightᵀ (+ bias)`, with `tmp` [rows, n]
    /// as scratch. The default is the sequence the reduced layer runs (`linear_forward` into
    /// `tmp`, `add`, `add_bias`); a device may fuse it into one GEMM epilogue.
    fn linear_residual_forward(
        &self,
        out: &mut Self::Buf,
        resid: &Self::Buf,
        inp: &Self::Buf,
        (weight, bias): (&Self::Buf, Option<&Self::Buf>),
        tmp: &mut Self::Buf,
        shape: Gemm,
    ) {
        self.linear_forward(tmp, inp, weight, None, shape);
        self.add(out, resid, tmp);
        if let Some(bias) = bias {
            self.add_bias(out, bias, Matrix { rows: shape.rows, cols: shape.n });
        }
    }

    /// `dinp = dout · weight` (overwrite, skipped when None); of `dparams`, `dweight += doutᵀ ·
    /// inp` and `dbias += Σ_rows dout` (skipped when None).
    fn linear_backward(
        &self,
        dinp: Option<&mut Self::Buf>,
        dparams: (&mut Self::Buf, Option<&mut Self::Buf>),
        dout: &Self::Buf,
        inp: &Self::Buf,
        weight: &Self::Buf,
        shape: Gemm,
    );

    /// `linear_backward`'s input gradient alone, `dinp = dout · weight` (overwrite): the B pass
    /// of a zero-bubble pipeline schedule, whose W pass is `linear_backward` without `dinp`.
    fn linear_backward_input(&self, dinp: &mut Self::Buf, dout: &Self::Buf, weight: &Self::Buf, shape: Gemm);

    /// The precision of the operands of matrix products from now on (bf16 mixed precision runs its
    /// GEMMs on bf16 operands with f32 accumulation where the backend has such a GEMM; others
    /// ignore it).
    fn set_matmul_precision(&self, _precision: crate::real::Precision) {}

    /// Whether matrix products round both operands to `precision` themselves (a bf16 GEMM that
    /// converts f32 operands while packing), so weights read only by GEMMs need no rounded copy.
    fn matmul_rounds_operands(&self, _precision: crate::real::Precision) -> bool {
        false
    }
}

/// Causal self-attention and the rotary position embedding of its queries and keys.
pub trait AttentionOps: Memory {
    /// Rotary position embedding of the query and key heads of the fused QKV activation, in place
    /// (values heads untouched); `table` as `Rotary` describes it.
    fn rope_forward(&self, qkv: &mut Self::Buf, table: &Self::Buf, shape: AttentionShape, rotary: Rotary);

    /// The gradient through `rope_forward`, in place on the QKV gradient: each pair rotated back
    /// by its angle (a rotation's transpose is its inverse).
    fn rope_backward(&self, dqkv: &mut Self::Buf, table: &Self::Buf, shape: AttentionShape, rotary: Rotary);

    /// Causal softmax attention; `out` is [rows, heads*head_dim], `lse` the per-(b, head, t)
    /// log-sum-exp of the scaled scores, which is all backward needs to rebuild probabilities.
    /// With `dropout`, the probabilities that multiply the values are masked and scaled first
    /// (`Dropout::attention_index` numbers them); `lse` stays that of the unmasked ones. With
    /// `documents` (`--reset-attention-mask`), query t of sequence b sees only the keys from
    /// `documents[b * seq + t]` (its document's first position, at most t) to t.
    #[allow(clippy::too_many_arguments)]
    fn attention_forward(
        &self,
        out: &mut Self::Buf,
        lse: &mut Self::Buf,
        qkv: &Self::Buf,
        shape: AttentionShape,
        dropout: Option<&Dropout>,
        documents: Option<&[u32]>,
    );

    /// `dqkv` (overwrite) from `dout`, recomputing probabilities from `qkv` and `lse` (and the
    /// forward's dropout masks from `dropout`, its document bounds from `documents`).
    #[allow(clippy::too_many_arguments)]
    fn attention_backward(
        &self,
        dqkv: &mut Self::Buf,
        dout: &Self::Buf,
        qkv: &Self::Buf,
        out: &Self::Buf,
        lse: &Self::Buf,
        shape: AttentionShape,
        dropout: Option<&Dropout>,
        documents: Option<&[u32]>,
    );

    /// One block of blockwise causal attention (`device::blocks::block_forward`): `out` ([q.len ·
    /// batch, heads · head_dim]) and `lse` ([batch, heads, q.len], f32 storage) from the queries
    /// at `q` of one fused-QKV buffer and the keys and values at `kv` of another (or the same);
    /// every key, or key j ≤ query j on `mask`'s diagonal; its probabilities dropped as `mask` says.
    fn attention_block_forward(
        &self,
        out_lse: (&mut Self::Buf, &mut Self::Buf),
        q: (&Self::Buf, QkvRun),
        kv: (&Self::Buf, QkvRun),
        shape: AttentionShape,
        mask: BlockMask,
    );

    /// `(out, lse)` becomes the attention over the keys of both blocks (`blocks::merge`) of
    /// `positions` queries.
    fn attention_merge(
        &self,
        acc: (&mut Self::Buf, &mut Self::Buf),
        part: (&Self::Buf, &Self::Buf),
        shape: AttentionShape,
        positions: usize,
    );

    /// A block's backward (`blocks::block_backward`), adding to `grad`'s query columns at `dq` and
    /// key and value columns at `dkv`.
    #[allow(clippy::too_many_arguments)]
    fn attention_block_backward(
        &self,
        grad: &mut Self::Buf,
        runs: (QkvRun, QkvRun),
        saved: ((&Self::Buf, &Self::Buf), usize),
        lse: (&Self::Buf, usize),
        q: (&Self::Buf, QkvRun),
        kv: (&Self::Buf, QkvRun),
        shape: AttentionShape,
        mask: BlockMask,
    );

    /// Causal attention of the newest positions of one sequence against every position up to
    /// each (generation with a key/value cache): `qkv` holds the fused QKV rows of positions
    /// `0..shape.seq` (batch 1), rows `t0..` being the new queries; `out` ([seq - t0, heads ·
    /// head_dim]) becomes their attention output, as `attention_forward` computes those rows.
    fn attention_decode(&self, out: &mut Self::Buf, qkv: &Self::Buf, shape: AttentionShape, t0: usize);
}

/// The word and position embeddings.
pub trait EmbeddingOps: Memory {
    /// Word embedding: `out[t*batch+b] = wte[id - vocab_start]` for the id of token `t` of sample
    /// `b` where it is in this vocabulary shard (the `wte` rows), a zero row where it is not.
    fn embedding_forward(&self, out: &mut Self::Buf, wte: &Self::Buf, tokens: Tokens<'_>, hidden: usize);

    /// `dwte[id - vocab_start] += dout[row]` for the tokens in this shard ("+=").
    fn embedding_backward(&self, dwte: &mut Self::Buf, dout: &Self::Buf, tokens: Tokens<'_>, hidden: usize);

    /// `out[(t - t0)*batch + b] += wpe[t]` for positions `t0..t0+positions`.
    fn position_forward(
        &self,
        out: &mut Self::Buf,
        wpe: &Self::Buf,
        batch: usize,
        t0: usize,
        positions: usize,
        hidden: usize,
    );

    /// `dwpe[t] += Σ_b dout[(t - t0)*batch + b]` ("+=").
    fn position_backward(
        &self,
        dwpe: &mut Self::Buf,
        dout: &Self::Buf,
        batch: usize,
        t0: usize,
        positions: usize,
        hidden: usize,
    );
}

/// The cross-entropy over a vocabulary that may be split across tensor-parallel ranks, in four
/// steps so the caller can combine each row's statistics over the ranks between them.
pub trait LossOps: Memory {
    /// Step 1: each row's largest logit in this vocabulary shard, into `max[..rows]`.
    fn cross_entropy_max(&self, logits: &Self::Buf, rows: usize, vocab: usize, max: &mut Self::Scalars);

    /// Step 2, against the global max: this shard's `Σ exp(logit - max)` per row into
    /// `stats[..rows]`, and the target's logit where the target (`targets[r] - vocab_start`) is in
    /// this shard, else 0, into `stats[rows..2 rows]`.
    fn cross_entropy_partials(
        &self,
        logits: &Self::Buf,
        targets: &[u32],
        shape: Logits,
        max: &Self::Scalars,
        stats: &mut Self::Scalars,
    );

    /// Step 3, with the global statistics: `acc[slot] += Σ_r ln(sum_exp_r) + max_r - target_logit_r`
    /// (the rows' summed loss, the rows added in order, then added to the accumulator), over the
    /// rows whose target is not `kernels::IGNORED_TARGET`.
    fn cross_entropy_loss(
        &self,
        max: &Self::Scalars,
        stats: &Self::Scalars,
        targets: &[u32],
        rows: usize,
        acc: &mut Self::Scalars,
        slot: usize,
    );

    /// Step 4, with the global max and denominator (`stats[..rows]`): logits become
    /// `grad_scale * (softmax - onehot)` in place, so the [rows, vocab] matrix is never copied;
    /// 0 in a row whose target is `kernels::IGNORED_TARGET`.
    fn cross_entropy_backward(
        &self,
        logits: &mut Self::Buf,
        targets: &[u32],
        shape: Logits,
        max: &Self::Scalars,
        stats: &Self::Scalars,
        grad_scale: f32,
    );
}

/// The gradient norm, its clipping, and AdamW.
pub trait OptimizerOps: Memory {
    /// For each buffer of `bufs` in order, `acc[slot] += Σ x²` over its elements, accumulated in
    /// f64 on the device (the global gradient norm's sum): one reduction over all of them.
    fn sum_squares_into(&self, bufs: &[&Self::Buf], acc: &mut Self::Scalars, slot: usize);

    /// The gradient norm and the clip factor from the gradients' global sum of squares
    /// `sum[sum_slot]`, on the device (`kernels::clip_scale`'s formula): `out[slot]` becomes the
    /// norm of the unscaled gradients, `sqrt(sum) / loss_scale`, and `out[slot + 1]` the factor
    /// AdamW multiplies each gradient by, Megatron's clip coefficient (clipping to `clip`; 0 does
    /// not clip) over the loss scale, an f32 value.
    fn clip_scale(
        &self,
        sum: &Self::Scalars,
        sum_slot: usize,
        out: &mut Self::Scalars,
        slot: usize,
        clip: f64,
        loss_scale: f64,
    );

    /// One decoupled-weight-decay Adam step on one parameter tensor, its weight decay applied
    /// where the tensor is `decayed` (`AdamWStep::for_tensor`), each gradient multiplied first by
    /// the f32 factor at `grad_scale` (scalars and slot, as `clip_scale` writes it: read where the
    /// device computes, never by the host); the tensor's `working` copy, where mixed precision
    /// keeps one, becomes the updated master rounded to its precision in the same pass (no
    /// separate refresh of the copy).
    fn adamw(&self, tensor: AdamWTensor<'_, Self::Buf>, step: AdamWStep, grad_scale: (&Self::Scalars, usize));

    /// One AdamW step on every tensor of an optimizer group, bit for bit `adamw` on each tensor in
    /// order. A device may update them all in one pass (the GPU Device: one launch over a table of
    /// the tensors kept on the device); this default loops over `adamw`.
    fn adamw_group(
        &self,
        tensors: Vec<AdamWTensor<'_, Self::Buf>>,
        step: AdamWStep,
        grad_scale: (&Self::Scalars, usize),
    ) {
        for t in tensors {
            self.adamw(t, step, grad_scale);
        }
    }
}
