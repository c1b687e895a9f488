//! The chunk API the pipeline executor drives: `forward_micro` and `backward_micro` of one
//! micro-batch through this chunk's embeddings, blocks and head, the activation sets they take
//! from the chunk's pool (keyed by micro-batch, given back after backward), and the whole-model
//! passes built on them (`forward`, `loss`, `forward_backward`).

use super::activations::{Activations, LayerActs, Rows, Widths};
use super::block::{layer_backward, layer_forward, layer_weight_backward, saved_layer, Dims, Redo};
use super::tensor_parallel::{add_since, tp_counters, Norm, Pass};
use super::{ChunkOutput, Gpt, Weights};
use crate::device::{AttentionShape, Device, Rotary, WorkCounters};
use crate::model::Recompute;
use crate::parallel::tensor::TensorParallel;
use crate::tensor::ParamSet;
use std::ops::Range;

impl<D: Device> Gpt<D> {
    /// The activation set for micro-batch `key`, taking a free one (or allocating one) for a new
    /// key. Sets of another shape are dropped first.
    fn slot(&mut self, dev: &D, key: usize, batch: usize, seq: usize) -> usize {
        if let Some(i) = self.pool.iter().position(|(k, _)| *k == Some(key)) {
            return i;
        }
        self.pool.retain(|(k, a)| k.is_some() || (a.rows.batch == batch && a.rows.seq == seq));
        self.live += 1;
        self.peak_live = self.peak_live.max(self.live);
        if let Some(i) = self.pool.iter().position(|(k, _)| k.is_none()) {
            self.pool[i].0 = Some(key);
            return i;
        }
        let compact = self.compacting();
        let how = (self.recompute, compact, self.precision);
        let set = Activations::new(dev, &self.cfg, &self.mp, &self.plan, how, batch, seq);
        self.pool.push((Some(key), set));
        let rows = Rows::new(&self.mp, batch, seq);
        // Full recompute rebuilds each layer into one spare set, and 16-bit storage computes each
        // layer there (with its attention output unless selective recompute drops it).
        let with_attention = self.recompute != Recompute::Selective;
        if (self.recompute == Recompute::Full || compact)
            && self.spare.as_ref().is_none_or(|(r, l)| *r != rows || l.attn.is_some() != with_attention)
        {
            let spare = LayerActs::new(dev, &self.cfg, &self.mp, (rows, self.precision), with_attention);
            self.spare = Some((rows, spare));
        }
        if self.recompute == Recompute::Selective && self.spare_attention.as_ref().is_none_or(|(r, _, _)| *r != rows) {
            let wd = Widths::new(&self.cfg, &self.mp);
            let attn = dev.alloc_in(rows.full * wd.al, self.precision);
            let lse = dev.alloc(rows.sub_batch * wd.heads * rows.seq);
            self.spare_attention = Some((rows, attn, lse));
        }
        self.pool.len() - 1
    }

    fn release(&mut self, index: usize) {
        if self.pool[index].0.take().is_some() {
            self.live -= 1;
        }
    }

    /// Drops micro-batch `key`'s activations without a backward (evaluation).
    pub fn discard(&mut self, key: usize) {
        if let Some(i) = self.pool.iter().position(|(k, _)| *k == Some(key)) {
            self.release(i);
        }
    }

    fn held(&self, key: usize) -> usize {
        self.pool.iter().position(|(k, _)| *k == Some(key)).expect("backward of a micro-batch that ran forward")
    }

    /// Forward of micro-batch `key` through this chunk. The first chunk embeds `tokens`
    /// (`batch` samples of `seq`, sample-major); others start from `hidden` (this rank's rows of
    /// the previous chunk's output, on the device). The last chunk computes the loss against
    /// `labels` and adds its sum over tokens to the loss accumulator (`take_loss`); the others copy their output hidden states into
    /// `out` (as long as `hidden`; it stays the caller's, to send while this chunk goes on).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_micro(
        &mut self,
        dev: &D,
        tp: TensorParallel,
        key: usize,
        tokens: &[u32],
        hidden: Option<&D::Buf>,
        labels: Option<&[u32]>,
        batch: usize,
        seq: usize,
        out: Option<&mut D::Buf>,
    ) -> ChunkOutput {
        let index = self.slot(dev, key, batch, seq);
        self.run_forward(dev, tp, index, tokens, hidden, batch, seq);
        if self.layout.last {
            let labels = labels.expect("the last chunk needs labels");
            self.cross_entropy_loss(dev, tp, index, labels);
            ChunkOutput::Loss
        } else {
            let last = &self.pool[index].1.resid[self.layout.num_layers];
            let out = out.expect("a chunk before the last needs a buffer for its output");
            assert_eq!(dev.len(out), dev.len(last), "the output buffer does not match the chunk's hidden states");
            dev.copy(out, 0, last, 0, dev.len(last));
            ChunkOutput::Hidden
        }
    }

    /// Elements of this rank's hidden states of one micro-batch at a chunk boundary (what
    /// `forward_micro` writes to `out` and `backward_micro` to `d_input`).
    pub fn boundary_len(&self, batch: usize, seq: usize) -> usize {
        Rows::new(&self.mp, batch, seq).local * Widths::new(&self.cfg, &self.mp).h
    }

    #[allow(clippy::too_many_arguments)]
    fn run_forward(
        &mut self,
        dev: &D,
        tp: TensorParallel,
        index: usize,
        tokens: &[u32],
        hidden: Option<&D::Buf>,
        batch: usize,
        seq: usize,
    ) {
        assert!(seq <= self.cfg.max_position_embeddings, "sequence longer than the position table");
        assert_eq!(tp.size(), self.mp.tp_size, "the tensor-parallel group does not match the model's split");
        self.bound_documents(index, tokens);
        self.place_rope(dev, seq);
        if self.layout.first {
            self.await_params(dev, self.layout.embeddings());
            self.embed(dev, tp, index, tokens, batch, seq);
        } else {
            let a = &mut self.pool[index].1;
            let hidden = hidden.expect("a chunk after the first needs its input");
            assert_eq!(dev.len(hidden), dev.len(&a.resid[0]), "the input does not match the chunk's hidden states");
            dev.copy(&mut a.resid[0], 0, hidden, 0, dev.len(hidden));
        }
        for l in 0..self.layout.num_layers {
            self.await_params(dev, self.layout.layer_params(l));
            self.forward_layer(dev, tp, index, l);
        }
        self.settle_params(dev);
        if self.layout.last {
            self.head_forward(dev, tp, index);
        }
    }

    /// The sizes one layer of activation set `index` works with.
    fn dims(&self, index: usize) -> Dims {
        let r = self.pool[index].1.rows;
        let wd = Widths::new(&self.cfg, &self.mp);
        let d = self.cfg.head_dim();
        let shape = AttentionShape::new(r.sub_batch, r.seq, wd.heads, d).grouped(wd.kv_heads);
        let rotary = self.rope.as_ref().map(|_| Rotary { rotary_dim: self.cfg.arch.rotary_dim(d), t0: 0 });
        let (ops, swiglu, gelu) = (self.layout.ops, self.cfg.arch.swiglu, self.cfg.arch.gelu);
        Dims { rows: r, shape, wd, precision: self.precision, ops, swiglu, gelu, rotary, dropout: Default::default() }
    }

    /// Block `l`'s forward of activation set `index`, counting what its groups moved; under
    /// 16-bit storage its saved buffers are then copied out.
    fn forward_layer(&mut self, dev: &D, tp: TensorParallel, index: usize, l: usize) {
        let mark = self.work_mark(dev);
        let dims = Dims { dropout: self.layer_dropout(index, l), ..self.dims(index) };
        let (lay, precision) = (self.layout, self.precision);
        let p = Weights { working: self.working.as_deref(), masters: &self.params.values };
        let w = |k| &p[lay.layer(l, k)];
        let a = &mut self.pool[index].1;
        let (before, after) = a.resid.split_at_mut(l + 1);
        let (x_in, x_out) = (&before[l], &mut after[0]);
        // Full recompute writes every layer into the spare set (only the residual stream is
        // kept); selective keeps the layer's set but the attention output goes to the spare.
        let attn_spare = self.spare_attention.as_mut().map(|(_, a, l)| (a, l));
        // Under 16-bit storage the layer computes in the spare set and is then copied out.
        let (la, attn_spare) = match (a.layers.get_mut(l), self.spare.as_mut()) {
            (Some(la), _) => (la, attn_spare),
            (None, Some((_, layer))) if layer.attn.is_none() => (layer, attn_spare),
            (None, Some((_, layer))) => (layer, None),
            (None, None) => unreachable!("full recompute has a spare layer"),
        };
        let tmp = (&mut a.tmp_full, &mut a.tmp_local);
        let before = tp_counters(dev, tp);
        let (norm, rope, documents) =
            (Norm::of(&self.cfg.arch), self.rope.as_ref(), super::documents::bounds(&a.starts));
        let pass = &mut Pass { dev, tp, sc: &mut self.scratch, heads: &mut self.heads, norm, rope, documents };
        layer_forward(pass, &w, dims, x_in, Some(x_out), la, attn_spare, tmp.0, tmp.1);
        add_since(&mut self.layer_comm[l], &tp_counters(dev, tp), &before);
        if let Some(slot) = a.compact.get_mut(l) {
            let copy = la.stash(dev, precision, self.stash_spares.pop());
            self.stashed += copy.iter().map(|s| s.bytes(dev)).sum::<usize>();
            self.peak_stashed = self.peak_stashed.max(self.stashed);
            *slot = Some(copy);
        }
        self.add_layer_work(dev, l, 0, mark);
    }

    /// The device's counters now, when this chunk counts its layers' work.
    fn work_mark(&self, dev: &D) -> Option<WorkCounters> {
        self.layer_work.as_ref().and_then(|_| dev.work_counters())
    }

    /// Adds the work since `mark` to layer `l`'s forward (`pass` 0) or backward (1).
    fn add_layer_work(&mut self, dev: &D, l: usize, pass: usize, mark: Option<WorkCounters>) {
        if let (Some(mark), Some(work)) = (mark, self.layer_work.as_mut()) {
            work[l][pass].add(&dev.work_counters().unwrap_or_default().since(&mark));
        }
    }

    /// Backward of micro-batch `key` through this chunk, adding gradients into `params.grads`
    /// scaled by `grad_scale` (1 / tokens in the global batch, so micro-batches accumulate to the
    /// mean). The last chunk starts from its loss; the others from `d_hidden`, the gradient of
    /// their output. `ready` is told, in order, each range of parameters whose gradients this call
    /// will not touch again (so data-parallel reduction of them can start). Copies the gradient
    /// of the chunk's input for the previous stage into `d_input` (every chunk but the first),
    /// and frees the micro-batch's activations. Under `set_weight_pass` this is the B pass: the
    /// blocks' linear layers leave their parameter gradients to `weight_micro`.
    #[allow(clippy::too_many_arguments)]
    pub fn backward_micro(
        &mut self,
        dev: &D,
        tp: TensorParallel,
        key: usize,
        d_hidden: Option<&D::Buf>,
        d_input: Option<&mut D::Buf>,
        grad_scale: f32,
        ready: &mut dyn FnMut(&mut ParamSet<D>, Range<usize>),
    ) {
        let index = self.held(key);
        if self.layout.last {
            self.head_backward(dev, tp, index, grad_scale, ready);
        } else {
            let d_resid = &mut self.pool[index].1.grad.d_resid;
            let d_hidden = d_hidden.expect("a chunk before the last needs its output's gradient");
            assert_eq!(dev.len(d_hidden), dev.len(d_resid), "the gradient does not match the chunk's hidden states");
            dev.copy(d_resid, 0, d_hidden, 0, dev.len(d_hidden));
        }
        let layers = self.layout.num_layers;
        // Where every layer's activations stay whole until W, W reads its inputs there.
        let kept = self.recompute == Recompute::None && !self.compacting();
        let mut deferred = self.weight_pass.then(|| {
            let mut d = self.deferred_spares.pop().unwrap_or_default();
            d.resize_with(layers, Default::default);
            d.iter_mut().flatten().for_each(|linear| linear.copy_input = !kept);
            d
        });
        for l in (0..layers).rev() {
            let (before, mark) = (tp_counters(dev, tp), self.work_mark(dev));
            self.backward_layer(dev, tp, index, l, deferred.as_mut().map(|d| &mut d[l]));
            add_since(&mut self.layer_comm[l], &tp_counters(dev, tp), &before);
            self.add_layer_work(dev, l, 1, mark);
            if deferred.is_none() {
                ready(&mut self.params, self.layout.layer_params(l));
            }
        }
        let held = deferred.is_some() && kept;
        if let Some(d) = deferred {
            self.deferred.push((key, d));
        }
        if self.layout.first {
            self.embedding_backward(dev, tp, index);
            ready(&mut self.params, self.layout.embeddings());
        } else {
            let d_resid = &self.pool[index].1.grad.d_resid;
            let d = d_input.expect("a chunk after the first needs a buffer for its input's gradient");
            assert_eq!(dev.len(d), dev.len(d_resid), "the input-gradient buffer does not match the hidden states");
            dev.copy(d, 0, d_resid, 0, dev.len(d));
        }
        // The activations W reads stay with the micro-batch until then.
        if !held {
            self.release(index);
        }
    }

    /// The W pass of micro-batch `key` (after its B pass, `backward_micro` under
    /// `set_weight_pass`): the blocks' linear-layer gradients, last block first; `ready` as in
    /// `backward_micro`, told of each block's parameters.
    pub fn weight_micro(&mut self, dev: &D, key: usize, ready: &mut dyn FnMut(&mut ParamSet<D>, Range<usize>)) {
        let at = self.deferred.iter().position(|(k, _)| *k == key).expect("a W pass after its B pass");
        let (_, layers) = self.deferred.remove(at);
        // The micro-batch's activations, where B left them for W to read.
        let index = self.pool.iter().position(|(k, _)| *k == Some(key));
        let lay = self.layout;
        for l in (0..lay.num_layers).rev() {
            let mark = self.work_mark(dev);
            self.params.ensure_grads(dev, lay.layer_params(l));
            let p = Weights { working: self.working.as_deref(), masters: &self.params.values };
            let w = |k| &p[lay.layer(l, k)];
            let saved = index.and_then(|i| self.pool[i].1.layers.get(l));
            let grads = &mut self.params.grads[lay.layer_params(l)];
            layer_weight_backward(dev, &w, grads, lay.ops, &layers[l], saved);
            self.add_layer_work(dev, l, 1, mark);
            ready(&mut self.params, lay.layer_params(l));
        }
        self.deferred_spares.push(layers);
        if let Some(i) = index {
            self.release(i);
        }
    }

    /// Whether backward is split into B and W passes (a zero-bubble schedule): `backward_micro`
    /// then leaves the blocks' linear-layer gradients to `weight_micro`.
    pub fn set_weight_pass(&mut self, split: bool) {
        self.weight_pass = split;
    }

    /// Block `l`'s backward of activation set `index`: its saved activations (rebuilt where
    /// recomputation dropped them, restored where 16-bit storage copied them out), then the
    /// gradients (those of its linear layers left to the W pass where `defer` keeps them).
    fn backward_layer(
        &mut self,
        dev: &D,
        tp: TensorParallel,
        index: usize,
        l: usize,
        defer: Option<&mut super::weight_pass::LayerDeferred<D::Buf>>,
    ) {
        let dims = Dims { dropout: self.layer_dropout(index, l), ..self.dims(index) };
        let lay = self.layout;
        self.params.ensure_grads(dev, lay.layer_params(l));
        let p = Weights { working: self.working.as_deref(), masters: &self.params.values };
        let w = |k| &p[lay.layer(l, k)];
        let grads = &mut self.params.grads[lay.layer_params(l)];
        let a = &mut self.pool[index].1;
        let stash = a.compact.get_mut(l).and_then(Option::take);
        if let Some(stash) = &stash {
            self.stashed -= stash.iter().map(|s| s.bytes(dev)).sum::<usize>();
        }
        let x_in = &a.resid[l];
        let (norm, rope, documents) =
            (Norm::of(&self.cfg.arch), self.rope.as_ref(), super::documents::bounds(&a.starts));
        let pass = &mut Pass { dev, tp, sc: &mut self.scratch, heads: &mut self.heads, norm, rope, documents };
        let (tmp_full, tmp_local) = (&mut a.tmp_full, &mut a.tmp_local);
        let recompute = |redo: Redo<'_, D::Buf>| match redo {
            Redo::Layer(sp) => layer_forward(pass, &w, dims, x_in, None, sp, None, tmp_full, tmp_local),
            Redo::Attention { out, lse, qkv } => {
                pass.attention_forward((out, lse), qkv, dims.shape, dims.dropout.attention.as_ref(), dims.precision)
            }
        };
        let spares = (&mut self.spare, &mut self.spare_attention);
        let saved = saved_layer(dev, dims, (a.layers.get(l), stash.as_deref()), spares, recompute);
        layer_backward(pass, &w, grads, dims, x_in, saved, &mut a.grad, defer);
        // The copy's buffers serve the next layer's stash: no allocation per layer and step.
        self.stash_spares.extend(stash);
    }

    /// Runs the forward pass of the whole model (a chunk that is both first and last) over
    /// `tokens` and returns this rank's logits: [seq * batch, padded_vocab / tp] in row order
    /// `t * batch + b`. Used for generation; the activations are released at once.
    pub fn forward(&mut self, dev: &D, tp: TensorParallel, tokens: &[u32], batch: usize, seq: usize) -> &D::Buf {
        assert!(self.layout.first && self.layout.last, "forward() needs the whole model");
        let index = self.slot(dev, usize::MAX, batch, seq);
        self.run_forward(dev, tp, index, tokens, None, batch, seq);
        self.release(index);
        &self.pool[index].1.head.as_ref().expect("the whole model has a head").logits
    }

    /// Sum over all tokens of the cross-entropy loss of the whole model, without gradients: the
    /// forward of `forward_backward` (micro-batch 0: under a dropout step, the same masks).
    pub fn loss(
        &mut self,
        dev: &D,
        tp: TensorParallel,
        tokens: &[u32],
        labels: &[u32],
        batch: usize,
        seq: usize,
    ) -> f64 {
        self.whole_model_forward(dev, tp, 0, (tokens, labels), batch, seq);
        self.discard(0);
        self.take_loss(dev, tp)
    }

    /// Forward and backward of one micro-batch through the whole model. Returns the sum of the
    /// micro-batch's token losses; see `backward_micro` for `grad_scale` and `ready`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_backward(
        &mut self,
        dev: &D,
        tp: TensorParallel,
        tokens: &[u32],
        labels: &[u32],
        batch: usize,
        seq: usize,
        grad_scale: f32,
        ready: &mut dyn FnMut(&mut ParamSet<D>, Range<usize>),
    ) -> f64 {
        self.whole_model_forward(dev, tp, 0, (tokens, labels), batch, seq);
        self.backward_micro(dev, tp, 0, None, None, grad_scale, ready);
        self.take_loss(dev, tp)
    }

    /// Forward of micro-batch `key` through the whole model (a chunk that is both first and
    /// last): the sum of its token losses against `labels` goes to the loss accumulator.
    fn whole_model_forward(
        &mut self,
        dev: &D,
        tp: TensorParallel,
        key: usize,
        (tokens, labels): (&[u32], &[u32]),
        batch: usize,
        seq: usize,
    ) {
        match self.forward_micro(dev, tp, key, tokens, None, Some(labels), batch, seq, None) {
            ChunkOutput::Loss => {}
            ChunkOutput::Hidden => unreachable!("the whole model ends in its loss"),
        }
    }
}
