//! The Device seam: the fused ops the model calls on buffers that live on one device. A backend
//! implements this trait; no model, parallel or optimizer code branches on which backend it is.

pub mod cpu;
pub mod kernels;
pub mod reference;

/// Geometry of one causal self-attention call. Activations are sequence-first like Megatron's:
/// row `t * batch + b` holds token `t` of sequence `b`. The fused QKV row is laid out per head,
/// `[q_h | k_h | v_h]` for each head `h`, so that splitting heads across tensor-parallel ranks
/// later is a contiguous split of the QKV weight's rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub head_dim: usize,
}

impl AttentionShape {
    pub fn rows(&self) -> usize {
        self.batch * self.seq
    }
    pub fn width(&self) -> usize {
        self.heads * self.head_dim
    }
}

/// One AdamW update's hyper-parameters. `grad_scale` multiplies the raw gradient first (it carries
/// the clipping coefficient), and `step` is the 1-based count used for bias correction.
#[derive(Clone, Copy, Debug)]
pub struct AdamWStep {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    pub step: u64,
    pub grad_scale: f32,
}

/// The ops a backend provides. Buffers are flat arrays of `len` elements; shapes are passed
/// explicitly. Outputs marked "+=" accumulate into what the buffer holds; all others overwrite.
pub trait Device: Send + Sync {
    type Buf: Send + Sync;

    /// A one-line description for logs (`cpu: 2 threads, avx512f`).
    fn describe(&self) -> String;
    /// A zero-filled buffer of `len` elements.
    fn alloc(&self, len: usize) -> Self::Buf;
    fn len(&self, buf: &Self::Buf) -> usize;
    fn upload(&self, dst: &mut Self::Buf, src: &[f32]);
    fn download(&self, src: &Self::Buf, dst: &mut [f32]);
    fn fill(&self, dst: &mut Self::Buf, value: f32);

    /// `acc += x`, element-wise.
    fn add_assign(&self, acc: &mut Self::Buf, x: &Self::Buf);
    /// `out = a + b`, element-wise (the residual connection).
    fn add(&self, out: &mut Self::Buf, a: &Self::Buf, b: &Self::Buf);
    /// Sum of squares of every element, accumulated in f64 (for the global gradient norm).
    fn sum_squares(&self, buf: &Self::Buf) -> f64;

    /// `out[t*batch+b] = wte[tokens[b*seq+t]] + wpe[t]`; tokens are sample-major as read.
    #[allow(clippy::too_many_arguments)]
    fn embedding_forward(
        &self,
        out: &mut Self::Buf,
        tokens: &[u32],
        wte: &Self::Buf,
        wpe: &Self::Buf,
        batch: usize,
        seq: usize,
        hidden: usize,
    );
    /// `dwte[tokens] += dout`, `dwpe[t] += Σ_b dout` (both "+=").
    #[allow(clippy::too_many_arguments)]
    fn embedding_backward(
        &self,
        dwte: &mut Self::Buf,
        dwpe: &mut Self::Buf,
        dout: &Self::Buf,
        tokens: &[u32],
        batch: usize,
        seq: usize,
        hidden: usize,
    );

    /// LayerNorm over the last dimension; saves per-row mean and reciprocal std for backward.
    #[allow(clippy::too_many_arguments)]
    fn layernorm_forward(
        &self,
        out: &mut Self::Buf,
        mean: &mut Self::Buf,
        rstd: &mut Self::Buf,
        inp: &Self::Buf,
        weight: &Self::Buf,
        bias: &Self::Buf,
        rows: usize,
        cols: usize,
    );
    /// dinp, dweight and dbias are all "+=": dinp already holds the residual stream's gradient.
    #[allow(clippy::too_many_arguments)]
    fn layernorm_backward(
        &self,
        dinp: &mut Self::Buf,
        dweight: &mut Self::Buf,
        dbias: &mut Self::Buf,
        dout: &Self::Buf,
        inp: &Self::Buf,
        weight: &Self::Buf,
        mean: &Self::Buf,
        rstd: &Self::Buf,
        rows: usize,
        cols: usize,
    );

    /// `out[rows, n] = inp[rows, k] · weight[n, k]ᵀ (+ bias[n])`: Megatron's [out, in] weight layout.
    #[allow(clippy::too_many_arguments)]
    fn linear_forward(
        &self,
        out: &mut Self::Buf,
        inp: &Self::Buf,
        weight: &Self::Buf,
        bias: Option<&Self::Buf>,
        rows: usize,
        k: usize,
        n: usize,
    );
    /// `dinp = dout · weight` (overwrite, skipped when None), `dweight += doutᵀ · inp`,
    /// `dbias += Σ_rows dout`.
    #[allow(clippy::too_many_arguments)]
    fn linear_backward(
        &self,
        dinp: Option<&mut Self::Buf>,
        dweight: &mut Self::Buf,
        dbias: Option<&mut Self::Buf>,
        dout: &Self::Buf,
        inp: &Self::Buf,
        weight: &Self::Buf,
        rows: usize,
        k: usize,
        n: usize,
    );

    /// GELU with the tanh approximation (GPT-2's).
    fn gelu_forward(&self, out: &mut Self::Buf, inp: &Self::Buf);
    /// `dinp = dout · gelu'(inp)`.
    fn gelu_backward(&self, dinp: &mut Self::Buf, inp: &Self::Buf, dout: &Self::Buf);

    /// Causal softmax attention; `out` is [rows, heads*head_dim], `lse` the per-(b, head, t)
    /// log-sum-exp of the scaled scores, which is all backward needs to rebuild probabilities.
    fn attention_forward(&self, out: &mut Self::Buf, lse: &mut Self::Buf, qkv: &Self::Buf, shape: AttentionShape);
    /// `dqkv` (overwrite) from `dout`, recomputing probabilities from `qkv` and `lse`.
    fn attention_backward(
        &self,
        dqkv: &mut Self::Buf,
        dout: &Self::Buf,
        qkv: &Self::Buf,
        out: &Self::Buf,
        lse: &Self::Buf,
        shape: AttentionShape,
    );

    /// Softmax cross-entropy over `vocab` logits per row against `targets` (one per row). Returns
    /// the sum of the rows' losses; when `grad_scale` is given, the logits are overwritten in place
    /// with `grad_scale · (softmax − onehot)`, so the [rows, vocab] matrix is touched once.
    fn cross_entropy(
        &self,
        logits: &mut Self::Buf,
        targets: &[u32],
        rows: usize,
        vocab: usize,
        grad_scale: Option<f32>,
    ) -> f64;

    /// One decoupled-weight-decay Adam step on one parameter tensor.
    fn adamw(&self, param: &mut Self::Buf, grad: &Self::Buf, m: &mut Self::Buf, v: &mut Self::Buf, step: AdamWStep);
}
