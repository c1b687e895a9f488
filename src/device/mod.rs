//! The Device seam: the fused ops the model calls on buffers that live on one device. A backend
//! implements this trait; no model, parallel or optimizer code branches on which backend it is.
//! What a device's work costs, where it counts it, is `counters::WorkCounters`.

pub mod counters;
pub mod cpu;
pub mod kernels;
pub mod llama;
pub mod reference;

pub use counters::WorkCounters;

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
/// is not here: `Device::adamw` reads it from the device's scalars (`Device::clip_scale`).
#[derive(Clone, Copy, Debug)]
pub struct AdamWStep {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    pub step: u64,
}

/// One tensor of an AdamW group (`Device::adamw_group`): its master weights, gradient and moments,
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

/// Collectives of one process group run directly on a device's buffers (NCCL / RCCL on a GPU),
/// where the backend made a communicator for the group at start-up. Every operation is ordered
/// after the compute work already enqueued, and compute enqueued afterwards sees its result
/// (`all_reduce_start` excepted: its result is visible to compute after `wait`). The host blocks
/// only where it reads values back, and that wait is bounded (a dead peer is an error, not a hang).
pub trait DeviceComm<B> {
    /// The library: "NCCL" or "RCCL".
    fn api(&self) -> &'static str;
    /// `buf` becomes the element-wise sum over the group.
    fn all_reduce(&self, buf: &mut B);
    /// The first `len` values of `scalars` (f64, a device's `Scalars`) become their element-wise
    /// `op` over the group, on device memory: the cross-entropy's row statistics.
    fn all_reduce_f64(&self, scalars: &mut B, len: usize, op: crate::comm::ReduceOp);
    /// Starts summing `buf` over the group; the caller leaves `buf` alone until `wait`.
    fn all_reduce_start(&self, buf: &mut B);
    /// Compute enqueued from now on runs after every operation started on this group.
    fn wait(&self);
    /// The host waits (bounded: a dead peer is an error) until every operation on this group has
    /// finished: before temporary buffers an operation used are freed.
    fn synchronize(&self);
    /// `full` becomes every rank's `local`, in rank order.
    fn all_gather(&self, local: &B, full: &mut B);
    /// `local` becomes the sum over ranks of this rank's block of `full`.
    fn reduce_scatter(&self, full: &B, local: &mut B);
    /// Elements counted so far, as the MPI Comm counts them (for `--log-comm`).
    fn counters(&self) -> crate::comm::CommCounters;
}

/// Pipeline point-to-point on a device's buffers (NCCL / RCCL on a GPU): this rank sends
/// activations to the next pipeline stage and gradients to the previous one, and receives them
/// from the other side. Messages of one kind between two stages arrive in the order they were
/// sent (`pipeline::fifo_order` holds for every schedule). A send reads its buffer after the
/// compute already enqueued; a receive writes its buffer after the compute already enqueued, and
/// compute enqueued after it sees what it received. Neither blocks the host: a send's buffer must
/// be left alone until `wait_sends`, or until this rank has received a message its peer sent
/// after taking that send's (the stream order above then puts any later write after the send's
/// read: `pipeline::send_releases`).
pub trait DeviceP2p<B> {
    /// The library: "NCCL" or "RCCL".
    fn api(&self) -> &'static str;
    /// Sends `buf` to the next stage (activations) or, `backward`, to the previous (gradients).
    fn send(&self, buf: &B, backward: bool);
    /// Receives the next message from the previous stage (activations) or, `backward`, from the
    /// next stage (gradients) into `buf` (exactly its length).
    fn recv(&self, buf: &mut B, backward: bool);
    /// The host waits (bounded: a dead peer is an error) until every send has been delivered.
    fn wait_sends(&self);
    /// Elements sent so far (for `--log-comm`).
    fn counters(&self) -> crate::comm::CommCounters;
}

/// What `group` has moved, through the MPI Comm and through the device's communicator for it.
pub fn comm_counters<D: Device>(dev: &D, group: &dyn crate::comm::Comm) -> crate::comm::CommCounters {
    let mut c = group.counters();
    if let Some(d) = dev.device_comm(group) {
        c.add(&d.counters());
    }
    c
}

/// `s[..len]` becomes its element-wise `op` over `group`: in place where the device keeps scalars
/// in host memory; on device memory through the device's communicator for the group, where it
/// has one (`--gpu-collectives nccl|rccl`); else staged through the host (one read, the MPI
/// all-reduce, one write). A group of one rank leaves device scalars alone.
pub fn all_reduce_scalars<D: Device>(
    dev: &D,
    group: &dyn crate::comm::Comm,
    s: &mut D::Scalars,
    len: usize,
    op: crate::comm::ReduceOp,
) {
    if let Some(host) = dev.host_scalars(s) {
        return group.all_reduce(&mut host[..len], op);
    }
    if group.size() > 1 && !dev.device_all_reduce_scalars(group, s, len, op) {
        let mut host = vec![0f64; len];
        dev.read_scalars(s, &mut host);
        group.all_reduce(&mut host, op);
        dev.write_scalars(s, &host);
    }
}

/// The library `--gpu-collectives` asks a device's collectives to use: NCCL, RCCL, or MPI (the
/// device's buffers staged through host memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CollectiveLibrary {
    Nccl,
    Rccl,
    Mpi,
}

impl CollectiveLibrary {
    /// The flag's value: "nccl", "rccl" or "mpi".
    pub fn name(self) -> &'static str {
        match self {
            CollectiveLibrary::Nccl => "nccl",
            CollectiveLibrary::Rccl => "rccl",
            CollectiveLibrary::Mpi => "mpi",
        }
    }
}

/// What `Device::attach_collectives` makes communicators for: the run's process groups, as the
/// `Comm`s that `device_comm` later finds them by, and the library asked for.
pub struct CollectivesRequest<'a> {
    pub library: CollectiveLibrary,
    /// Every rank of the job: the ranks agree here that each could load the library.
    pub world: &'a dyn crate::comm::Comm,
    /// The groups that move tensors, named for messages, in the order every rank creates their
    /// communicators: tensor parallel, the tied-embedding pair, data parallel x depth, and the
    /// group the gradient norm's sum of squares is summed over (model parallel, or the world
    /// under ZeRO-1).
    pub groups: [(&'static str, &'a dyn crate::comm::Comm); 4],
    /// The pipeline group; the caller checked that its schedule keeps each link's messages in
    /// the order they were sent (`pipeline::fifo_order`), as `DeviceP2p` delivers them.
    pub pipeline: &'a dyn crate::comm::Comm,
    /// Whether the pipeline's links wrap from the last stage to the first (virtual stages).
    pub pipeline_wraps: bool,
}

/// The throughput a rank's device is measured against for MFU: the CPU's measured FMA peak, or
/// a GPU's nominal dense bf16 tensor-core peak.
pub struct DevicePeak {
    pub gflops: f64,
    pub what: String,
}

/// The ops a backend provides. Buffers are flat arrays of `len` elements; shapes are passed
/// explicitly. Outputs marked "+=" accumulate into what the buffer holds; all others overwrite.
pub trait Device: Send + Sync {
    type Buf: Send + Sync;
    /// A 16-bit copy of a buffer (bf16 or f16 bits) where the device keeps it: mixed precision's
    /// saved activations between a layer's forward and its backward.
    type Half: Send + Sync;
    /// f64 values where the device computes them: the cross-entropy's row statistics and the
    /// step's accumulators (the loss, the gradients' sum of squares), read by the host only when
    /// it needs them (`read_scalars`), so a step makes no host round trip for them.
    type Scalars: Send + Sync;

    /// A one-line description for logs (`cpu: 2 threads, avx512f`).
    fn describe(&self) -> String;
    /// A zero-filled buffer of `len` elements.
    fn alloc(&self, len: usize) -> Self::Buf;
    /// A zero-filled buffer of `len` elements held in `precision` where the device stores that
    /// format natively (`stores`); the default is `alloc`, f32 storage whose values mixed
    /// precision rounds where they are stored (`round_to`).
    fn alloc_in(&self, len: usize, _precision: crate::real::Precision) -> Self::Buf {
        self.alloc(len)
    }
    /// Whether `alloc_in(_, precision)` gives native 16-bit storage: its values are rounded to
    /// `precision` by being stored, so they need no rounding pass and no 16-bit copy aside.
    fn stores(&self, _precision: crate::real::Precision) -> bool {
        false
    }
    /// Whether mixed precision holds the working copy of the GEMM weights in `precision` storage
    /// (`alloc_weights`): where the device stores the format (`stores`), and on the CPU where its
    /// bf16 GEMM reads bf16 weights faster than it rounds f32 ones.
    fn holds_weights_in(&self, precision: crate::real::Precision) -> bool {
        self.stores(precision)
    }
    /// A zero-filled buffer for a GEMM weight's working copy: in `precision` storage where
    /// `holds_weights_in`; on the CPU such a buffer reaches only the linear layers (as their
    /// weight), the word embedding (as its table), AdamW (as its working copy) and the buffer
    /// plumbing (`upload`, `download`, `copy`, `fill`, `round_to`).
    fn alloc_weights(&self, len: usize, precision: crate::real::Precision) -> Self::Buf {
        self.alloc_in(len, precision)
    }
    fn len(&self, buf: &Self::Buf) -> usize;
    /// Bytes of device memory the buffer's elements take (4 each on f32 storage).
    fn bytes(&self, buf: &Self::Buf) -> usize {
        4 * self.len(buf)
    }
    fn upload(&self, dst: &mut Self::Buf, src: &[f32]);
    /// Host threads that preparing data for this device (the initial weights) may use.
    fn host_threads(&self) -> usize {
        1
    }
    fn download(&self, src: &Self::Buf, dst: &mut [f32]);
    fn fill(&self, dst: &mut Self::Buf, value: f32);
    /// Every buffer of `bufs` becomes 0 (a step's gradients): `fill` with 0 on each, this default;
    /// a device may zero them all in one pass (the GPU Device: one launch over a table kept on
    /// the device).
    fn zero_buffers(&self, bufs: Vec<&mut Self::Buf>) {
        for b in bufs {
            self.fill(b, 0.0);
        }
    }

    /// `acc += x`, element-wise.
    fn add_assign(&self, acc: &mut Self::Buf, x: &Self::Buf);
    /// `out = a + b`, element-wise (the residual connection).
    fn add(&self, out: &mut Self::Buf, a: &Self::Buf, b: &Self::Buf);
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

    /// `len` f64 values, all 0.
    fn scalars(&self, len: usize) -> Self::Scalars;
    /// Copies the first `out.len()` values to the host: one device->host copy, which waits for
    /// the work that writes them.
    fn read_scalars(&self, src: &Self::Scalars, out: &mut [f64]);
    /// The first `values.len()` values become `values`.
    fn write_scalars(&self, dst: &mut Self::Scalars, values: &[f64]);
    /// The values as host memory, when the device keeps them there; collectives then work on
    /// them in place. Devices without host-visible scalars return None and are staged through
    /// `read_scalars` / `write_scalars`.
    fn host_scalars<'a>(&self, _s: &'a mut Self::Scalars) -> Option<&'a mut [f64]> {
        None
    }

    /// Word embedding: `out[t*batch+b] = wte[tokens[b*seq+t] - vocab_start]` for tokens in this
    /// vocabulary shard (the `wte` rows), zero rows for the others; tokens are sample-major.
    #[allow(clippy::too_many_arguments)]
    fn embedding_forward(
        &self,
        out: &mut Self::Buf,
        tokens: &[u32],
        wte: &Self::Buf,
        vocab_start: usize,
        batch: usize,
        seq: usize,
        hidden: usize,
    );
    /// `dwte[token - vocab_start] += dout[row]` for the tokens in this shard ("+=").
    #[allow(clippy::too_many_arguments)]
    fn embedding_backward(
        &self,
        dwte: &mut Self::Buf,
        dout: &Self::Buf,
        tokens: &[u32],
        vocab_start: usize,
        batch: usize,
        seq: usize,
        hidden: usize,
    );
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

    /// LayerNorm over a hidden dimension split across ranks (2-D / 2.5-D tensor parallelism):
    /// each row's sum over these `cols` columns of `x`, or of `(x - mean)²` when `mean` is given.
    /// The caller sums them over the ranks that hold the row's other columns.
    fn layernorm_sums(&self, inp: &Self::Buf, rows: usize, cols: usize, mean: Option<&[f64]>, out: &mut [f64]);
    /// Normalises with the whole rows' `mean` and `rstd` (saved into `mean_out`/`rstd_out`) and
    /// applies this slice of the scale and shift.
    #[allow(clippy::too_many_arguments)]
    fn layernorm_apply(
        &self,
        out: &mut Self::Buf,
        mean_out: &mut Self::Buf,
        rstd_out: &mut Self::Buf,
        inp: &Self::Buf,
        weight: &Self::Buf,
        bias: &Self::Buf,
        mean: &[f64],
        rstd: &[f64],
        rows: usize,
        cols: usize,
    );
    /// Split LayerNorm backward, step 1: per row `Σ dy·w` and `Σ dy·w·x̂` over these columns
    /// (pairs in `out`).
    #[allow(clippy::too_many_arguments)]
    fn layernorm_backward_sums(
        &self,
        dout: &Self::Buf,
        inp: &Self::Buf,
        weight: &Self::Buf,
        mean: &Self::Buf,
        rstd: &Self::Buf,
        rows: usize,
        cols: usize,
        out: &mut [f64],
    );
    /// Step 2, with those sums over the whole rows of `n` columns: dinp, dweight and dbias "+=".
    #[allow(clippy::too_many_arguments)]
    fn layernorm_backward_apply(
        &self,
        dinp: &mut Self::Buf,
        dweight: &mut Self::Buf,
        dbias: &mut Self::Buf,
        dout: &Self::Buf,
        inp: &Self::Buf,
        weight: &Self::Buf,
        mean: &Self::Buf,
        rstd: &Self::Buf,
        sums: &[f64],
        n: usize,
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
    /// A row-parallel linear layer without a reduction (one tensor-parallel rank) that writes
    /// back into the residual stream: `out = resid + inp · weightᵀ (+ bias)`, with `tmp` [rows, n]
    /// as scratch. The default is the sequence the reduced layer runs (`linear_forward` into
    /// `tmp`, `add`, `add_bias`); a device may fuse it into one GEMM epilogue.
    #[allow(clippy::too_many_arguments)]
    fn linear_residual_forward(
        &self,
        out: &mut Self::Buf,
        resid: &Self::Buf,
        inp: &Self::Buf,
        (weight, bias): (&Self::Buf, Option<&Self::Buf>),
        tmp: &mut Self::Buf,
        rows: usize,
        k: usize,
        n: usize,
    ) {
        self.linear_forward(tmp, inp, weight, None, rows, k, n);
        self.add(out, resid, tmp);
        if let Some(bias) = bias {
            self.add_bias(out, bias, rows, n);
        }
    }
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

    /// RMSNorm over the last dimension (Llama's): `out = x · rstd · weight`, with the row's
    /// `rstd = 1 / sqrt(mean(x²) + eps)` saved for backward.
    #[allow(clippy::too_many_arguments)]
    fn rmsnorm_forward(
        &self,
        out: &mut Self::Buf,
        rstd: &mut Self::Buf,
        inp: &Self::Buf,
        weight: &Self::Buf,
        rows: usize,
        cols: usize,
        eps: f64,
    );
    /// dinp and dweight are "+=" (dinp already holds the residual stream's gradient).
    #[allow(clippy::too_many_arguments)]
    fn rmsnorm_backward(
        &self,
        dinp: &mut Self::Buf,
        dweight: &mut Self::Buf,
        dout: &Self::Buf,
        inp: &Self::Buf,
        weight: &Self::Buf,
        rstd: &Self::Buf,
        rows: usize,
        cols: usize,
    );
    /// SwiGLU of rows of `2 f` values, the gate's `f` then the up projection's `f`:
    /// `out[r, i] = silu(inp[r, i]) · inp[r, f + i]`, `out` being [rows, f].
    fn swiglu_forward(&self, out: &mut Self::Buf, inp: &Self::Buf, rows: usize, f: usize);
    /// `dinp` ([rows, 2 f], overwrite) from `dout` ([rows, f]).
    fn swiglu_backward(&self, dinp: &mut Self::Buf, inp: &Self::Buf, dout: &Self::Buf, rows: usize, f: usize);
    /// Rotary position embedding of the query and key heads of the fused QKV activation, in place
    /// (values heads untouched); `table` as `Rotary` describes it.
    fn rope_forward(&self, qkv: &mut Self::Buf, table: &Self::Buf, shape: AttentionShape, rotary: Rotary);
    /// The gradient through `rope_forward`, in place on the QKV gradient: each pair rotated back
    /// by its angle (a rotation's transpose is its inverse).
    fn rope_backward(&self, dqkv: &mut Self::Buf, table: &Self::Buf, shape: AttentionShape, rotary: Rotary);

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

    /// Causal attention of the newest positions of one sequence against every position up to
    /// each (generation with a key/value cache): `qkv` holds the fused QKV rows of positions
    /// `0..shape.seq` (batch 1), rows `t0..` being the new queries; `out` ([seq - t0, heads ·
    /// head_dim]) becomes their attention output, as `attention_forward` computes those rows.
    fn attention_decode(&self, out: &mut Self::Buf, qkv: &Self::Buf, shape: AttentionShape, t0: usize);

    /// `out[r] += bias` for each of `rows` rows of width `cols` (the bias of a row-parallel layer,
    /// added after its all-reduce).
    fn add_bias(&self, out: &mut Self::Buf, bias: &Self::Buf, rows: usize, cols: usize);

    /// Cross-entropy, step 1: each row's largest logit in this vocabulary shard, into `max[..rows]`.
    fn cross_entropy_max(&self, logits: &Self::Buf, rows: usize, vocab: usize, max: &mut Self::Scalars);
    /// Step 2, against the global max: this shard's `Σ exp(logit - max)` per row into
    /// `stats[..rows]`, and the target's logit where the target (`targets[r] - vocab_start`) is in
    /// this shard, else 0, into `stats[rows..2 rows]`.
    #[allow(clippy::too_many_arguments)]
    fn cross_entropy_partials(
        &self,
        logits: &Self::Buf,
        targets: &[u32],
        vocab_start: usize,
        rows: usize,
        vocab: usize,
        max: &Self::Scalars,
        stats: &mut Self::Scalars,
    );
    /// Step 3, with the global statistics: `acc[slot] += Σ_r ln(sum_exp_r) + max_r - target_logit_r`
    /// (the rows' summed loss, the rows added in order, then added to the accumulator).
    fn cross_entropy_loss(
        &self,
        max: &Self::Scalars,
        stats: &Self::Scalars,
        rows: usize,
        acc: &mut Self::Scalars,
        slot: usize,
    );
    /// Step 4, with the global max and denominator (`stats[..rows]`): logits become
    /// `grad_scale * (softmax - onehot)` in place, so the [rows, vocab] matrix is never copied.
    #[allow(clippy::too_many_arguments)]
    fn cross_entropy_backward(
        &self,
        logits: &mut Self::Buf,
        targets: &[u32],
        vocab_start: usize,
        rows: usize,
        vocab: usize,
        max: &Self::Scalars,
        stats: &Self::Scalars,
        grad_scale: f32,
    );

    /// The precision of the operands of matrix products from now on (bf16 mixed precision runs its
    /// GEMMs on bf16 operands with f32 accumulation where the backend has such a GEMM; others
    /// ignore it).
    fn set_matmul_precision(&self, _precision: crate::real::Precision) {}

    /// Whether matrix products round both operands to `precision` themselves (a bf16 GEMM that
    /// converts f32 operands while packing), so weights read only by GEMMs need no rounded copy.
    fn matmul_rounds_operands(&self, _precision: crate::real::Precision) -> bool {
        false
    }

    /// Rounds every element to `precision` where it would be stored (bf16 / fp16 emulation on
    /// backends that compute in f32).
    fn round_to(&self, buf: &mut Self::Buf, precision: crate::real::Precision);

    /// A 16-bit copy of `buf`, whose values are already rounded to `precision` (bf16 or f16), so
    /// the copy is exact: mixed precision keeps saved activations this way between a layer's
    /// forward and its backward, in the device's memory.
    fn to_half(&self, buf: &Self::Buf, precision: crate::real::Precision) -> Self::Half;
    /// `half` (of as many elements as `buf`) becomes `to_half(buf, precision)`, in place.
    fn to_half_into(&self, buf: &Self::Buf, precision: crate::real::Precision, half: &mut Self::Half);
    /// `dst` (of as many elements as `src`) becomes the values of the 16-bit copy `src`.
    fn load_half(&self, src: &Self::Half, precision: crate::real::Precision, dst: &mut Self::Buf);
    /// Elements of a 16-bit copy.
    fn half_len(&self, half: &Self::Half) -> usize;

    /// The buffer as host f32 memory, when the device keeps it there; collectives then work on it
    /// in place. Devices without host-visible f32 buffers return None and are staged through
    /// `download` / `upload`.
    fn host_f32<'a>(&self, _buf: &'a mut Self::Buf) -> Option<&'a mut [f32]> {
        None
    }
    fn host_f32_ref<'a>(&self, _buf: &'a Self::Buf) -> Option<&'a [f32]> {
        None
    }

    /// `dst[dst_at..dst_at+len] = src[src_at..src_at+len]`, on the device where it has such a copy
    /// (the default stages through the host).
    fn copy(&self, dst: &mut Self::Buf, dst_at: usize, src: &Self::Buf, src_at: usize, len: usize) {
        let mut s = vec![0f32; self.len(src)];
        self.download(src, &mut s);
        let mut d = vec![0f32; self.len(dst)];
        self.download(dst, &mut d);
        d[dst_at..dst_at + len].copy_from_slice(&s[src_at..src_at + len]);
        self.upload(dst, &d);
    }

    /// The collectives of `group` on this device's buffers, when the backend made a communicator
    /// for it at start-up (`--gpu-collectives nccl`); None: the caller stages through the host
    /// and the MPI Comm.
    fn device_comm(&self, _group: &dyn crate::comm::Comm) -> Option<&dyn DeviceComm<Self::Buf>> {
        None
    }
    /// `s[..len]` becomes its element-wise `op` over `group` on the device, through the
    /// communicator the backend made for the group (`device_comm`); false, doing nothing, where
    /// it has none (the caller stages through the host).
    fn device_all_reduce_scalars(
        &self,
        _group: &dyn crate::comm::Comm,
        _s: &mut Self::Scalars,
        _len: usize,
        _op: crate::comm::ReduceOp,
    ) -> bool {
        false
    }
    /// Pipeline point-to-point on device buffers, where the backend made communicators for this
    /// rank's pipeline neighbours at start-up; None: messages are staged through host memory.
    fn device_p2p(&self) -> Option<&dyn DeviceP2p<Self::Buf>> {
        None
    }

    /// Makes device collectives for the run's process groups (`device_comm` and `device_p2p`
    /// answer for them from then on), collectively over `request.world` and in the same order on
    /// every rank; returns the start-up line saying which path collectives take. A device without
    /// its own (the default) moves tensors through the MPI Comm on host memory.
    fn attach_collectives(&mut self, _request: &CollectivesRequest) -> crate::error::Result<String> {
        Ok("collectives: MPI on host memory".into())
    }

    /// One decoupled-weight-decay Adam step on one parameter tensor, each gradient multiplied
    /// first by the f32 factor at `grad_scale` (scalars and slot, as `clip_scale` writes it: read
    /// where the device computes, never by the host); `working`, where mixed precision keeps a
    /// rounded working copy of the parameter, becomes the updated master rounded to its
    /// precision in the same pass (no separate refresh of the copy).
    #[allow(clippy::too_many_arguments)]
    fn adamw(
        &self,
        param: &mut Self::Buf,
        grad: &Self::Buf,
        m: &mut Self::Buf,
        v: &mut Self::Buf,
        step: AdamWStep,
        grad_scale: (&Self::Scalars, usize),
        working: Option<(&mut Self::Buf, crate::real::Precision)>,
    );

    /// One AdamW step on every tensor of an optimizer group, bit for bit `adamw` on each tensor in
    /// order with `step`, whose weight decay applies to the `decayed` tensors only (0 on the
    /// others). A device may update them all in one pass (the GPU Device: one launch over a table
    /// of the tensors kept on the device); this default loops over `adamw`.
    fn adamw_group(
        &self,
        tensors: Vec<AdamWTensor<'_, Self::Buf>>,
        step: AdamWStep,
        grad_scale: (&Self::Scalars, usize),
    ) {
        for t in tensors {
            let weight_decay = if t.decayed { step.weight_decay } else { 0.0 };
            self.adamw(t.param, t.grad, t.m, t.v, AdamWStep { weight_decay, ..step }, grad_scale, t.working);
        }
    }

    /// What this device's work has cost since it was opened (kernel launches, copies,
    /// synchronisations, allocations), where the device counts it: the GPU Device does; None on
    /// devices that count nothing (the CPU, the reference). Subtract two snapshots
    /// (`WorkCounters::since`) for the work between them.
    fn work_counters(&self) -> Option<WorkCounters> {
        None
    }
}
