//! The pipeline executor: runs this stage's pass list (GPipe, 1F1B or interleaved 1F1B) over the
//! rank's model chunks for a training step, and forward passes in (micro-batch, chunk) order for
//! evaluation. Messages between stages are device buffers, reused: moved by the Device's
//! `DeviceP2p` in order, or else through MPI on host memory matched by tag; sends never block.
//! On the device path a sent buffer is written again only once the schedule shows its message
//! taken (`pipeline::send_releases`), so the buffers a step holds are the schedule's
//! (`pipeline::message_buffers`), allocated with the executor, and no step allocates more.

use super::chunk::Chunk;
use super::setup::Setup;
use super::trace::{SpanKind, Timeline};
use crate::comm::Pending;
use crate::config::TrainConfig;
use crate::data::datasets::Dataset;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::model::gpt::{ChunkOutput, DropoutStep};
use crate::model::Gpt;
use crate::parallel::context::{ContextSplit, CpCommType};
use crate::parallel::grid::{Grid, Groups};
use crate::parallel::pipeline::{self, Pass, Schedule};
use crate::parallel::summa::Summa;
use crate::parallel::tensor::TensorParallel;

/// One micro-batch of this data-parallel rank: `mbs` samples of `seq` tokens and their labels
/// (sample-major), the buffers refilled for each micro-batch. Under context parallelism `seq` is
/// this rank's positions of each sample (`ContextSplit`), taken from the whole samples in `full`.
struct Batch {
    tokens: Vec<u32>,
    labels: Vec<u32>,
    mbs: usize,
    seq: usize,
    /// `--eod-mask-loss`'s end-of-document id.
    eod_mask: Option<u32>,
    split: ContextSplit,
    full: Option<(Vec<u32>, Vec<u32>)>,
}

impl Batch {
    fn new(cfg: &TrainConfig, split: ContextSplit) -> Batch {
        let (mbs, full_seq) = (cfg.micro_batch_size, cfg.seq_length);
        let seq = split.local_seq(full_seq);
        let full = (split.size > 1).then(|| (vec![0u32; mbs * full_seq], vec![0u32; mbs * full_seq]));
        let (tokens, labels) = (vec![0u32; mbs * seq], vec![0u32; mbs * seq]);
        Batch { tokens, labels, mbs, seq, eod_mask: cfg.loss.eod_mask, split, full }
    }

    /// Fills the batch with micro-batch `micro` of the global batch starting at sample
    /// `consumed` (`first_sample`); returns the tokens its loss counts (`mask_loss`) in the whole
    /// samples.
    fn fetch(&mut self, ds: &Dataset, consumed: u64, micro: usize, grid: &Grid) -> Result<usize> {
        let (mbs, seq) = (self.mbs, self.seq * self.split.size);
        let first = first_sample(consumed, micro, mbs, (grid.dp_rank, grid.dp));
        let mut sample = vec![0u32; seq + 1];
        let (tokens, labels) = match &mut self.full {
            Some((t, l)) => (t, l),
            None => (&mut self.tokens, &mut self.labels),
        };
        for i in 0..mbs {
            ds.get(first + i, &mut sample)?;
            tokens[i * seq..(i + 1) * seq].copy_from_slice(&sample[..seq]);
            labels[i * seq..(i + 1) * seq].copy_from_slice(&sample[1..]);
        }
        let counted = mask_loss(self.eod_mask, tokens, labels);
        if let Some((t, l)) = &self.full {
            self.split.take_local(t, seq, &mut self.tokens);
            self.split.take_local(l, seq, &mut self.labels);
        }
        Ok(counted)
    }
}

/// Under `--eod-mask-loss`, the label of each position whose input token is the end-of-document
/// id `eod` becomes `IGNORED_TARGET` (Megatron's loss mask: the first token of the next document
/// is not predicted from the previous one). Returns the tokens the loss counts.
fn mask_loss(eod: Option<u32>, tokens: &[u32], labels: &mut [u32]) -> usize {
    let Some(eod) = eod else { return labels.len() };
    let mut counted = labels.len();
    for (label, _) in labels.iter_mut().zip(tokens).filter(|(_, &t)| t == eod) {
        *label = crate::device::kernels::IGNORED_TARGET;
        counted -= 1;
    }
    counted
}

/// The first sample of data-parallel rank `dp_rank`'s micro-batch `micro` in the global batch
/// that starts at sample `consumed`: consecutive samples from there (Megatron's sampler: each
/// chunk of mbs x dp samples is split in rank order).
fn first_sample(consumed: u64, micro: usize, mbs: usize, (dp_rank, dp): (usize, usize)) -> usize {
    (consumed + (micro * mbs * dp + dp_rank * mbs) as u64) as usize
}

/// The tokens a training step's loss counts: in each of this rank's micro-batches, and in the
/// global batch. Every token, unless `--eod-mask-loss` leaves some out.
pub(super) struct LossTokens {
    micro: Vec<usize>,
    pub global: usize,
}

impl LossTokens {
    /// The factor micro-batch `micro`'s summed token loss is scaled by for its gradient (before
    /// the loss scale `loss_scale`): one over the global batch's counted tokens under
    /// `--calculate-per-token-loss`, else Megatron's mean of micro-batch means (over its counted
    /// tokens, at least 1, times the micro-batches and data-parallel ranks). Both are one over
    /// the global batch's tokens when every token counts.
    fn grad_scale(&self, micro: usize, per_token: bool, dp: usize, loss_scale: f32) -> f32 {
        let tokens = if per_token { self.global } else { self.micro[micro].max(1) * self.micro.len() * dp };
        1.0 / tokens as f32 * loss_scale
    }
}

/// Tags of pipeline messages: which (micro-batch, chunk) on the receiving stage, which direction.
fn p2p_tag(micro: usize, chunk: usize, chunks: usize, backward: bool) -> u32 {
    ((micro * chunks + chunk) * 2 + usize::from(backward)) as u32
}

/// Everything one training or evaluation pass over the pipeline needs.
pub(super) struct Pipeline<'a, D: Device> {
    dev: &'a D,
    groups: &'a Groups,
    tp: TensorParallel<'a>,
    schedule: Schedule,
    /// Where the virtual stages sit (zb-v's V, or Megatron's interleaving), and how many chunks
    /// this rank holds.
    lay: pipeline::Placement,
    /// Micro-batches of this iteration (`set_micro`: fewer while `--rampup-batch-size` ramps),
    /// and of a full global batch (evaluation's, whatever the ramp).
    micro: usize,
    full_micro: usize,
    hidden_len: usize,
    /// Whether the optimizer is ZeRO-1 (gradients reduce-scattered after backward, not bucketed).
    pub zero: bool,
    /// Where each send of a training step frees its buffer on the device path
    /// (`pipeline::send_releases`, in this stage's send order).
    releases: Vec<Option<usize>>,
    /// Message buffers: reused across passes; the ones of sends in flight; and the MPI path's
    /// pending sends.
    messages: std::cell::RefCell<Messages<D::Buf>>,
}

/// The pipeline's message buffers (device buffers of `hidden_len`).
struct Messages<B> {
    free: Vec<B>,
    /// Device sends whose buffers are not free yet, each with the count of receives after which
    /// it is (`send_releases`; None: when the sends are waited for).
    in_flight: Vec<(B, Option<usize>)>,
    host_sends: Vec<Box<dyn Pending>>,
    /// Messages handed from one chunk of this stage to another (a V's turn), by the (micro-batch,
    /// chunk, backward) they feed.
    handed: Vec<((usize, usize, bool), B)>,
    /// Device receives and sends made since the last `finish_sends`.
    received: usize,
    sent: usize,
    /// A training step runs (its sends free at `releases`); else evaluation's forward passes,
    /// whose messages get no answer: when no buffer is free they wait for the sends in flight.
    training: bool,
}

impl<B> Default for Messages<B> {
    fn default() -> Self {
        Messages {
            free: Vec::new(),
            in_flight: Vec::new(),
            host_sends: Vec::new(),
            handed: Vec::new(),
            received: 0,
            sent: 0,
            training: true,
        }
    }
}

impl<'a, D: Device> Pipeline<'a, D> {
    /// The executor of this rank's chunks over the micro-batches of a step, in its stage's
    /// schedule order.
    pub fn new(setup: &'a Setup<D>) -> Result<Pipeline<'a, D>> {
        let (dev, groups, cfg, mp) = (&setup.dev, &setup.groups, &setup.cfg, setup.mp);
        let (schedule, chunks, micro) = (setup.stage.schedule, setup.stage.plans.len(), setup.n_micro);
        let tp = TensorParallel {
            comm: &*groups.tp,
            sequence_parallel: mp.sequence_parallel,
            summa: mp.summa.map(|c| {
                let (row, col) = (&*groups.summa_row, &*groups.summa_col);
                (Summa { row, col, q: c.q, algorithm: cfg.summa_algorithm }, &*groups.depth)
            }),
            context: (groups.cp.size() > 1).then_some((&*groups.cp, cfg.cp_comm_type)),
            context_levels: (cfg.cp_comm_type == CpCommType::A2aP2p)
                .then(|| [&*groups.cp_levels[0], &*groups.cp_levels[1]]),
        };
        // Elements of the hidden states one rank passes between pipeline stages: its rows (a
        // sequence shard under SP, a batch block under SUMMA; its positions under context
        // parallelism) of its hidden columns.
        let (hidden, seq) = (cfg.model.hidden_size, mp.context.local_seq(cfg.seq_length));
        let hidden_len = match mp.summa {
            Some(c) => cfg.micro_batch_size / (c.q * c.depth) * seq * hidden / c.q,
            None => cfg.micro_batch_size * seq / if mp.sequence_parallel { mp.tp_size } else { 1 } * hidden,
        };
        if (micro * chunks * 2) as u64 >= 1 << 30 {
            return Err(Error::Config(format!(
                "{micro} micro-batches x {chunks} chunks exceed the pipeline's message tags"
            )));
        }
        let (stages, stage) = (groups.grid.pp, groups.grid.pp_rank);
        let lay = pipeline::Placement::new(schedule, stages, chunks);
        let order = |s| pipeline::passes(schedule, stages, s, micro, chunks);
        let mut messages = Messages::default();
        if dev.device_p2p().is_some() {
            // Every buffer the schedule holds at once (evaluation, a forward pass at a time,
            // holds at most a training forward's two), allocated now: no step allocates one.
            let count = pipeline::message_buffers(lay, stage, &order);
            messages.free = (0..count).map(|_| dev.alloc(hidden_len)).collect();
        }
        Ok(Pipeline {
            dev,
            groups,
            tp,
            schedule,
            lay,
            micro,
            full_micro: micro,
            hidden_len,
            zero: cfg.use_distributed_optimizer && groups.replica.size() > 1,
            releases: pipeline::send_releases(lay, stage, &order),
            messages: std::cell::RefCell::new(messages),
        })
    }
}

impl<D: Device> Pipeline<'_, D> {
    /// The micro-batches of the next training steps (the ramp's count; setup checked that the
    /// schedule takes it): their schedule's send releases follow. The message buffers stay the
    /// full batch's (a count that held more would get one more from `buffer`).
    pub fn set_micro(&mut self, micro: usize) {
        if micro != self.micro {
            let (schedule, stages, stage, chunks) = (self.schedule, self.stages(), self.stage(), self.lay.chunks);
            self.releases =
                pipeline::send_releases(self.lay, stage, &|s| pipeline::passes(schedule, stages, s, micro, chunks));
            self.micro = micro;
        }
    }

    fn stages(&self) -> usize {
        self.groups.grid.pp
    }
    fn stage(&self) -> usize {
        self.groups.grid.pp_rank
    }
    /// This rank's positions of each sequence.
    fn split(&self) -> ContextSplit {
        ContextSplit { size: self.groups.grid.cp, rank: self.groups.grid.cp_rank }
    }
    fn virtual_stage(&self, chunk: usize) -> usize {
        self.lay.virtual_stage(self.stage(), chunk)
    }
    fn last_virtual(&self) -> usize {
        self.lay.last()
    }

    /// A message buffer: a free one (device sends the schedule shows taken by now included; in
    /// evaluation, when none is, after waiting for the sends in flight), else a new one.
    fn buffer(&self) -> D::Buf {
        let mut m = self.messages.borrow_mut();
        let received = m.received;
        let (taken, flying) =
            std::mem::take(&mut m.in_flight).into_iter().partition(|(_, r)| r.is_some_and(|r| r <= received));
        m.in_flight = flying;
        m.free.extend(taken.into_iter().map(|(b, _): (D::Buf, _)| b));
        if m.free.is_empty() && !m.in_flight.is_empty() && !m.training {
            if let Some(p2p) = self.dev.device_p2p() {
                p2p.wait_sends();
            }
            let delivered = std::mem::take(&mut m.in_flight);
            m.free.extend(delivered.into_iter().map(|(b, _)| b));
        }
        let reused = m.free.pop();
        drop(m);
        reused.unwrap_or_else(|| self.dev.alloc(self.hidden_len))
    }

    /// Gives a buffer whose message the chunk has taken back for reuse.
    fn done_with(&self, buf: D::Buf) {
        self.messages.borrow_mut().free.push(buf);
    }

    /// Receives the message for (micro, chunk) from the previous stage (activations) or the
    /// next (`backward`: gradients): through the device's pipeline links in order, or through
    /// MPI on host memory matched by tag.
    fn recv(&self, tl: &mut Timeline, micro: usize, chunk: usize, backward: bool) -> D::Buf {
        let from = self.lay.source(self.stage(), chunk, backward).0;
        if from == self.stage() {
            let mut m = self.messages.borrow_mut();
            let at = m.handed.iter().position(|(k, _)| *k == (micro, chunk, backward));
            return m.handed.remove(at.expect("a V's turn hands its message over before the chunk takes it")).1;
        }
        let t0 = tl.now_us();
        let mut buf = self.buffer();
        match self.dev.device_p2p() {
            Some(p2p) => {
                p2p.recv(&mut buf, backward, self.lay.upward(chunk, backward));
                self.messages.borrow_mut().received += 1;
            }
            None => {
                let tag = p2p_tag(micro, chunk, self.lay.chunks, backward);
                match self.dev.host_f32(&mut buf) {
                    Some(host) => self.groups.pp.recv_tagged(host, from, tag),
                    None => {
                        let mut host = vec![0f32; self.hidden_len];
                        self.groups.pp.recv_tagged(&mut host, from, tag);
                        self.dev.upload(&mut buf, &host);
                    }
                }
            }
        }
        tl.span(SpanKind::Recv, micro, chunk, t0);
        buf
    }

    /// Sends (micro, chunk)'s output on to the next virtual stage, or (`backward`) the gradient
    /// of its input back to the previous one. Neither path blocks: on the device the buffer is
    /// kept until its release (`buffer`) or the end of the pass (`finish_sends`).
    fn send(&self, tl: &mut Timeline, buf: D::Buf, micro: usize, chunk: usize, backward: bool) {
        let (to, to_chunk) = self.lay.target(self.stage(), chunk, backward);
        if to == self.stage() {
            self.messages.borrow_mut().handed.push(((micro, to_chunk, backward), buf));
            return;
        }
        let t0 = tl.now_us();
        match self.dev.device_p2p() {
            Some(p2p) => {
                p2p.send(&buf, backward, self.lay.upward(chunk, backward));
                let mut m = self.messages.borrow_mut();
                let release = if m.training { self.releases[m.sent] } else { None };
                m.sent += 1;
                m.in_flight.push((buf, release));
            }
            None => {
                let host = match self.dev.host_f32_ref(&buf) {
                    Some(h) => h.to_vec(),
                    None => {
                        let mut h = vec![0f32; self.hidden_len];
                        self.dev.download(&buf, &mut h);
                        h
                    }
                };
                let pending = self.groups.pp.send_start(host, to, p2p_tag(micro, to_chunk, self.lay.chunks, backward));
                let mut m = self.messages.borrow_mut();
                m.host_sends.push(pending);
                m.free.push(buf);
            }
        }
        tl.span(SpanKind::Send, micro, chunk, t0);
    }

    /// The forward pass of (micro, chunk) on this stage: receives its input (after the first
    /// virtual stage), runs the chunk and sends its output on (before the last), or adds the
    /// chunk's loss sum to its accumulator (`take_loss`). `timed` records the pass as busy time
    /// of a training step.
    fn forward(
        &self,
        tl: &mut Timeline,
        model: &mut Gpt<D>,
        (micro, chunk): (usize, usize),
        batch: &Batch,
        timed: bool,
    ) {
        let (tokens, labels, mbs, seq) = (&batch.tokens, &batch.labels, batch.mbs, batch.seq);
        let vs = self.virtual_stage(chunk);
        let hidden = (vs > 0).then(|| self.recv(tl, micro, chunk, false));
        let mut out = (vs < self.last_virtual()).then(|| self.buffer());
        let t0 = tl.now_us();
        let result = model.forward_micro(
            self.dev,
            self.tp,
            micro,
            tokens,
            hidden.as_ref(),
            Some(labels),
            mbs,
            seq,
            out.as_mut(),
        );
        if timed {
            tl.span(SpanKind::Forward, micro, chunk, t0);
        }
        if let Some(h) = hidden {
            self.done_with(h);
        }
        match (result, out) {
            (ChunkOutput::Loss, _) => {}
            (ChunkOutput::Hidden, Some(h)) => self.send(tl, h, micro, chunk, false),
            (ChunkOutput::Hidden, None) => unreachable!("a chunk before the last has an output buffer"),
        }
    }

    /// Waits until every send of this pass was delivered and keeps the buffers for reuse.
    fn finish_sends(&self) {
        let host_sends = std::mem::take(&mut self.messages.borrow_mut().host_sends);
        for s in host_sends {
            s.wait();
        }
        if let Some(p2p) = self.dev.device_p2p() {
            p2p.wait_sends();
        }
        let mut m = self.messages.borrow_mut();
        if m.training && self.dev.device_p2p().is_some() {
            assert_eq!(m.sent, self.releases.len(), "a training step sends what its schedule sends");
        }
        let delivered = std::mem::take(&mut m.in_flight);
        m.free.extend(delivered.into_iter().map(|(b, _)| b));
        (m.received, m.sent) = (0, 0);
    }

    /// What the passes until the next `finish_sends` are: a training step's or evaluation's.
    fn begin(&self, training: bool) {
        self.messages.borrow_mut().training = training;
    }

    /// The tokens the loss of the training step over the global batch starting at sample
    /// `consumed` counts (`LossTokens`). Under `--eod-mask-loss` every rank reads the whole
    /// global batch's tokens for it (no communication); else nothing is read.
    pub fn loss_tokens(&self, ds: &Dataset, cfg: &TrainConfig, consumed: u64) -> Result<LossTokens> {
        let (mbs, seq, dp) = (cfg.micro_batch_size, cfg.seq_length, self.groups.grid.dp);
        let Some(eod) = cfg.loss.eod_mask else {
            return Ok(LossTokens { micro: vec![mbs * seq; self.micro], global: self.micro * dp * mbs * seq });
        };
        let (mut micro, mut global, mut sample) = (vec![0; self.micro], 0, vec![0u32; seq + 1]);
        for (m, mine) in micro.iter_mut().enumerate() {
            for rank in 0..dp {
                let first = first_sample(consumed, m, mbs, (rank, dp));
                let mut counted = 0;
                for i in first..first + mbs {
                    ds.get(i, &mut sample)?;
                    counted += sample[..seq].iter().filter(|&&t| t != eod).count();
                }
                global += counted;
                if rank == self.groups.grid.dp_rank {
                    *mine = counted;
                }
            }
        }
        Ok(LossTokens { micro, global })
    }

    /// Iteration `iteration`'s forward and backward passes in this stage's schedule order (its
    /// global batch starts at sample `consumed`, its loss counts `tokens`, its gradients are
    /// scaled by `loss_scale`); the last stage's summed token loss stays in its last chunk's
    /// accumulator (`take_loss`).
    pub fn train_step(
        &self,
        chunks: &mut [Chunk<D>],
        ds: &Dataset,
        cfg: &TrainConfig,
        (iteration, consumed): (u64, u64),
        (tokens, loss_scale): (&LossTokens, f32),
        tl: &mut Timeline,
    ) -> Result<()> {
        let mut batch = Batch::new(cfg, self.split());
        self.begin(true);
        // Micro-batch m of this rank holds samples m·mbs·dp + dp_rank·mbs .. of the global batch.
        let grid = &self.groups.grid;
        let mbs = cfg.micro_batch_size as u64;
        let step = DropoutStep { iteration, micro_stride: mbs * grid.dp as u64, first: mbs * grid.dp_rank as u64 };
        for c in chunks.iter_mut() {
            c.model.set_dropout_step(Some(step));
            c.model.set_weight_pass(self.schedule.splits_backward());
        }
        let started = tl.now_us();
        let mut peak_live = 0;
        for pass in pipeline::passes(self.schedule, self.stages(), self.stage(), self.micro, self.lay.chunks) {
            match pass {
                Pass::Forward { micro, chunk } => {
                    batch.fetch(ds, consumed, micro, &self.groups.grid)?;
                    let model = &mut chunks[chunk].model;
                    self.forward(tl, model, (micro, chunk), &batch, true);
                    // Activation sets the chunks hold right now, counted by the model itself.
                    peak_live = peak_live.max(chunks.iter().map(|c| c.model.in_flight()).sum::<usize>());
                }
                Pass::Weight { micro, chunk } => {
                    let Chunk { model, buckets, opt, .. } = &mut chunks[chunk];
                    let mut ready = self.bucket_marker(buckets, opt, &mut model.params, micro);
                    let t0 = tl.now_us();
                    model.weight_micro(self.dev, micro, &mut ready);
                    tl.span(SpanKind::Weight, micro, chunk, t0);
                }
                Pass::Backward { micro, chunk } | Pass::Input { micro, chunk } => {
                    let vs = self.virtual_stage(chunk);
                    let d_out = (vs < self.last_virtual()).then(|| self.recv(tl, micro, chunk, true));
                    let mut d_in = (vs > 0).then(|| self.buffer());
                    let Chunk { model, buckets, opt, .. } = &mut chunks[chunk];
                    let mut ready = self.bucket_marker(buckets, opt, &mut model.params, micro);
                    let t0 = tl.now_us();
                    model.backward_micro(
                        self.dev,
                        self.tp,
                        micro,
                        d_out.as_ref(),
                        d_in.as_mut(),
                        tokens.grad_scale(micro, cfg.loss.per_token, grid.dp, loss_scale),
                        &mut ready,
                    );
                    tl.span(SpanKind::Backward, micro, chunk, t0);
                    if let Some(d) = d_out {
                        self.done_with(d);
                    }
                    if let Some(d) = d_in {
                        self.send(tl, d, micro, chunk, true);
                    }
                }
            }
        }
        self.finish_sends();
        tl.wall_secs += (tl.now_us() - started) * 1e-6;
        tl.peak_live = tl.peak_live.max(peak_live);
        Ok(())
    }

    /// What `backward_micro` and `weight_micro` tell of each range of finished gradients: to
    /// ZeRO-2, every micro-batch, which buckets it may reduce-scatter and release; in the step's
    /// last micro-batch, that they are final, so the chunk's data-parallel buckets start reducing
    /// during backward (the distributed optimizer's reduce-scatters under
    /// `--overlap-grad-reduce`, bucket by bucket as well). ZeRO-2's reduce-scatters still in
    /// flight from the pass before land first, before this pass makes gradients again.
    fn bucket_marker<'a>(
        &'a self,
        buckets: &'a mut crate::parallel::data::GradBuckets<D::Buf>,
        opt: &'a mut super::chunk::Optimizer<D>,
        params: &mut crate::tensor::ParamSet<D>,
        micro: usize,
    ) -> impl FnMut(&mut crate::tensor::ParamSet<D>, std::ops::Range<usize>) + 'a {
        let last = micro + 1 == self.micro && self.groups.replica.size() > 1;
        let (dev, dp) = (self.dev, &*self.groups.replica);
        if let super::chunk::Optimizer::Distributed(z) = opt {
            z.land_in_flight(dev, dp, params);
        }
        move |set, params| match opt {
            super::chunk::Optimizer::Distributed(z) => z.grads_ready(dev, dp, set, params, last),
            super::chunk::Optimizer::Replicated(_) if last => buckets.mark_final(dev, dp, set, params),
            super::chunk::Optimizer::Replicated(_) => {}
        }
    }

    /// The summed token loss of the forwards since the last call, read from the device once
    /// (nonzero on the last stage only).
    pub fn take_loss(&self, chunks: &mut [Chunk<D>]) -> f64 {
        chunks.iter_mut().map(|c| c.model.take_loss(self.dev, self.tp)).sum()
    }

    /// Per step of the window, `out[k]`: the token loss the training forwards of step `k` summed
    /// into loss slot `k` (`Gpt::set_loss_slot`), over this rank's chunks, then over the pipeline
    /// and data-parallel groups: one read of the device, one all-gather per group.
    /// Returns this rank's own share of each step's loss (before the sums), by which a
    /// non-finite loss is traced to the ranks it came from.
    pub fn take_step_losses(&self, chunks: &mut [Chunk<D>], out: &mut [f64]) -> Vec<f64> {
        out.fill(0.0);
        let mut chunk_losses = vec![0.0; out.len()];
        for c in chunks.iter_mut() {
            c.model.take_losses(self.dev, self.tp, &mut chunk_losses);
            for (o, l) in out.iter_mut().zip(&chunk_losses) {
                *o += l;
            }
        }
        let local = out.to_vec();
        self.groups.pp.sum_f64s(out);
        self.groups.cp.sum_f64s(out);
        self.groups.dp.sum_f64s(out);
        local
    }

    /// Forward passes only over `iters` global batches from sample `first` (validation): every
    /// stage runs (micro-batch, chunk) in order, which respects every dependency.
    pub fn evaluate(
        &self,
        chunks: &mut [Chunk<D>],
        ds: &Dataset,
        cfg: &TrainConfig,
        first: u64,
        iters: u64,
        tl: &mut Timeline,
    ) -> Result<f64> {
        let mut batch = Batch::new(cfg, self.split());
        self.begin(false);
        for c in chunks.iter_mut() {
            c.model.set_dropout_step(None);
        }
        // The training steps' slots have been read (the log line before validation): slot 0.
        for c in chunks.iter_mut() {
            c.model.set_loss_slot(0);
        }
        let mut counted = 0;
        for it in 0..iters {
            let consumed = first + it * cfg.global_batch_size as u64;
            for micro in 0..self.full_micro {
                counted += batch.fetch(ds, consumed, micro, &self.groups.grid)?;
                for chunk in 0..self.lay.chunks {
                    let model = &mut chunks[chunk].model;
                    self.forward(tl, model, (micro, chunk), &batch, false);
                    model.discard(micro);
                }
            }
            self.finish_sends();
        }
        // The loss lives on the last stage; the sum over the pipeline and data-parallel groups
        // gives every rank the mean over the tokens counted (Megatron's evaluation: its summed
        // loss over its summed count).
        let g = self.groups;
        let total = g.dp.sum_f64(g.cp.sum_f64(g.pp.sum_f64(self.take_loss(chunks))));
        let tokens = match cfg.loss.eod_mask {
            None => (iters as usize * cfg.global_batch_size * cfg.seq_length) as f64,
            Some(_) => self.groups.dp.sum_f64(counted as f64).max(1.0),
        };
        Ok(total / tokens)
    }
}
