//! DeepSeek-V4 attention, recorded: low-rank queries with a per-head norm,
//! the shared K=V vector, the KV compressor (and on CSA layers the
//! indexer's), sink attention over the window ring plus the compressed
//! rows, inverse RoPE, and the grouped low-rank output projection.
//!
//! Projections run on every row of the step; what reads or writes a cache
//! runs per lane: the ring writes, the pooling of windows that complete in
//! this step (normalised, rotated at the window's first position and
//! appended to the row table), the indexer's selection and the attention.

use super::cache::{rows_table, LayerSlots};
use super::forward::StepRows;
use super::weights::{Compressor, Dsv4Layer};
use super::DeepSeek4;
use crate::ModelError;
use weft_ops::builder::FamilyBuilder;
use weft_ops::{Builder, Op, Tensor};
use weft_ops::{CompressParams, IndexerParams, SinkAttentionParams};
use weft_runtime::cache::{KvCache, LayerCache};
use weft_runtime::GraphSession;

/// Per-row inputs of one compressor: values and gates `[R, cw]`.
struct CompressorInputs {
    kv: Tensor,
    gate: Tensor,
}

impl CompressorInputs {
    /// The rows of one lane.
    fn view(&self, v: &dyn Fn(Tensor) -> Result<Tensor, ModelError>) -> Result<Self, ModelError> {
        Ok(CompressorInputs {
            kv: v(self.kv)?,
            gate: v(self.gate)?,
        })
    }
}

/// One lane's rows of the kv vectors, queries and attention output.
struct LaneTensors {
    kv: Tensor,
    q: Tensor,
    out: Tensor,
}

/// Per-row inputs of the indexer.
struct IndexerInputs {
    q: Tensor,
    weights: Tensor,
    comp: CompressorInputs,
}

impl DeepSeek4 {
    /// Records layer `l`'s attention over `h [R, D]`; returns `[R, D]`.
    pub(super) fn record_attention(
        &self,
        s: &mut GraphSession<'_>,
        l: usize,
        w: &Dsv4Layer,
        step: &StepRows<'_>,
        h: Tensor,
    ) -> Result<Tensor, ModelError> {
        let c = &self.config;
        let p = |name: &str| format!("blk.{l}.{name}");
        let (n, nh, hd) = (h.rows(), c.heads, c.head_dim);
        let rope = c.rope(l, hd, false);
        let qa = s.matmul(h, w.q_a, p("attn_q_a"))?;
        let qr = s.rms_norm(qa, w.q_a_norm, c.rms_eps, p("attn_q_a_norm"))?;
        let q = s.matmul(qr, w.q_b, p("attn_q_b"))?;
        let q = s.rms_norm(
            q.reshape(&[n * nh, hd])?,
            self.weights.ones_head,
            c.rms_eps,
            p("attn_q_norm"),
        )?;
        let q = s.tail_rope(
            q.reshape(&[n, nh * hd])?,
            step.positions,
            rope,
            p("attn_q_rope"),
        )?;
        let kv = s.matmul(h, w.kv, p("attn_kv"))?;
        let kv = s.rms_norm(kv, w.kv_norm, c.rms_eps, p("attn_kv_norm"))?;
        let kv = s.tail_rope(kv, step.positions, rope, p("attn_kv_rope"))?;
        let comp = match &w.compressor {
            Some(cw) => Some(compressor_inputs(s, cw, h, &p("attn_compressor"))?),
            None => None,
        };
        let index = match &w.indexer {
            Some(ix) => {
                let q = s.matmul(qr, ix.q_b, p("indexer.q_b"))?;
                let rope = c.rope(l, c.indexer_dim, false);
                let q = s.tail_rope(q, step.positions, rope, p("indexer.q_rope"))?;
                let wt = s.matmul(h, ix.proj, p("indexer.proj"))?;
                let scale = 1.0 / ((c.indexer_dim * c.indexer_heads) as f32).sqrt();
                let weights = s.scale(wt, scale, p("indexer.weights"))?;
                let comp = compressor_inputs(s, &ix.compressor, h, &p("indexer_compressor"))?;
                Some(IndexerInputs { q, weights, comp })
            }
            None => None,
        };
        let o = weft_ops::Recorder::alloc(s, weft_ops::DType::F32, &[n, nh * hd])?;
        for (b, lane) in step.lanes.iter().enumerate() {
            let rows = step.lane_rows(b);
            let v = |t: Tensor| -> Result<Tensor, ModelError> {
                Ok(if step.lanes.len() == 1 {
                    t
                } else {
                    t.rows_view(rows.start, rows.len())?
                })
            };
            let io = LaneIo {
                lane,
                slots: &self.slots[l],
                start: step.start,
                tokens: rows.len() as u32,
                suffix: step.lane_suffix(b),
            };
            let lane_comp = match &comp {
                Some(ci) => Some(ci.view(&v)?),
                None => None,
            };
            let sel = match &index {
                Some(ix) => {
                    let lane_ix = IndexerInputs {
                        q: v(ix.q)?,
                        weights: v(ix.weights)?,
                        comp: ix.comp.view(&v)?,
                    };
                    Some(self.record_selection(s, l, w, &io, &lane_ix)?)
                }
                None => None,
            };
            let lane = LaneTensors {
                kv: v(kv)?,
                q: v(q)?,
                out: v(o)?,
            };
            self.record_lane_attention(s, l, w, &io, lane, lane_comp.as_ref(), sel)?;
        }
        let groups = c.out_groups;
        let ids: Vec<i32> = (0..n).flat_map(|_| 0..groups as i32).collect();
        let ids = s.upload_i32(&ids, p("attn_output_groups"))?;
        let ids = ids.reshape(&[n, groups])?;
        let o = o.reshape(&[n * groups, nh * hd / groups])?;
        let u = s.matmul_id(o, w.out_a, ids, p("attn_output_a"))?;
        Ok(s.matmul(u, w.out_b, p("attn_output_b"))?)
    }

    /// One lane's cache writes, compressed rows and attention.
    #[allow(clippy::too_many_arguments)]
    fn record_lane_attention(
        &self,
        s: &mut GraphSession<'_>,
        l: usize,
        w: &Dsv4Layer,
        io: &LaneIo<'_>,
        t: LaneTensors,
        comp: Option<&CompressorInputs>,
        selection: Option<Tensor>,
    ) -> Result<(), ModelError> {
        let c = &self.config;
        let p = |name: &str| format!("blk.{l}.{name}{}", io.suffix);
        let ratio = c.ratio(l);
        let win = io.lane.layer(io.slots.window);
        s.set_rows(t.kv, win.k, io.start, win.ring, p("attn_kv.cache"))?;
        let mut rows = None;
        if let (Some(inputs), Some(cw)) = (comp, &w.compressor) {
            let state = io.layer(io.slots.compressor)?;
            let table = rows_table(io.lane, io.slots, ratio, c.head_dim, false)?;
            self.record_compressor(
                s,
                l,
                cw,
                state,
                inputs,
                table,
                io,
                c.head_dim,
                &p("attn_compressor"),
            )?;
            // The whole row table: the op sees the rows visible at each
            // query's position, and a decode step's recording keeps its
            // shape from one step to the next (a CUDA graph replays).
            rows = table;
        }
        // Without rows (a window-only layer, or a context shorter than one
        // window of the ratio) the window stands in for them; the op never
        // reads it as rows.
        let (rows, ratio) = match rows {
            Some(r) => (r, ratio),
            None => (win.k.rows_view(0, 1)?, 0),
        };
        let params = SinkAttentionParams {
            out_rope: Some(c.rope(l, c.head_dim, true)),
            heads: c.heads,
            head_dim: c.head_dim,
            scale: 1.0 / (c.head_dim as f32).sqrt(),
            q_position: io.start,
            // A context shorter than the window keeps every position
            // (ring = context), so the window is the whole ring.
            window: c.window.min(win.k.rows() as u32),
            ring: win.k.rows() as u32,
            ratio,
            top_k: if selection.is_some() && ratio != 0 {
                c.indexer_top_k
            } else {
                0
            },
        };
        let mut inputs = vec![t.q, win.k, rows, w.sinks];
        if params.top_k > 0 {
            inputs.extend(selection);
        }
        s.push(Op::SinkAttention(params), inputs, vec![t.out], p("attn"))?;
        Ok(())
    }

    /// The indexer of one lane: its compressor rows, then the top-k.
    fn record_selection(
        &self,
        s: &mut GraphSession<'_>,
        l: usize,
        w: &Dsv4Layer,
        io: &LaneIo<'_>,
        ix: &IndexerInputs,
    ) -> Result<Tensor, ModelError> {
        let c = &self.config;
        let p = |name: &str| format!("blk.{l}.{name}{}", io.suffix);
        let indexer = w.indexer.as_ref().ok_or_else(|| {
            ModelError::Shape(format!("deepseek4: layer {l} has no indexer weights"))
        })?;
        let state = io.layer(io.slots.indexer)?;
        let table = rows_table(io.lane, io.slots, 4, c.indexer_dim, true)?;
        let label = p("indexer_compressor");
        self.record_compressor(
            s,
            l,
            &indexer.compressor,
            state,
            &ix.comp,
            table,
            io,
            c.indexer_dim,
            &label,
        )?;
        let n = ix.q.rows();
        let Some(table) = table else {
            // No row fits the context: nothing to select.
            let none = s.upload_i32(&vec![-1i32; n * c.indexer_top_k], p("indexer.none"))?;
            return Ok(none.reshape(&[n, c.indexer_top_k])?);
        };
        let keys = table; // all rows: the op sees the visible ones
        let params = IndexerParams {
            heads: c.indexer_heads,
            head_dim: c.indexer_dim,
            top_k: c.indexer_top_k,
            ratio: 4,
            q_position: io.start,
        };
        Ok(s.indexer_topk(ix.q, ix.weights, keys, params, p("indexer.topk"))?)
    }

    /// Writes one lane's compressor inputs into its rings and appends the
    /// rows of the windows this step completes to `table`.
    #[allow(clippy::too_many_arguments)]
    fn record_compressor(
        &self,
        s: &mut GraphSession<'_>,
        l: usize,
        w: &Compressor,
        state: &LayerCache,
        inputs: &CompressorInputs,
        table: Option<Tensor>,
        io: &LaneIo<'_>,
        dc: usize,
        label: &str,
    ) -> Result<(), ModelError> {
        let c = &self.config;
        let ratio = w.ape.rows() as u32;
        s.set_rows(
            inputs.kv,
            state.k,
            io.start,
            state.ring,
            format!("{label}.kv.cache"),
        )?;
        s.set_rows(
            inputs.gate,
            state.v,
            io.start,
            state.ring,
            format!("{label}.gate.cache"),
        )?;
        let (first, end) = (io.start / ratio, (io.start + io.tokens) / ratio);
        let Some(table) = table else { return Ok(()) };
        if end <= first {
            return Ok(());
        }
        let params = CompressParams {
            ratio,
            overlap: ratio == 4,
            first_row: first,
            rows: end - first,
            ring: state.k.rows() as u32,
            eps: c.rms_eps,
            rope: c.rope(l, dc, false),
        };
        // The whole table is the output (rows `first..end` written), so the
        // recording of a step that completes a window is the same for every
        // window.
        s.compress_into(
            state.k,
            state.v,
            w.ape,
            w.norm,
            params,
            table,
            format!("{label}.pool"),
        )?;
        Ok(())
    }
}

/// One lane's place in a step.
struct LaneIo<'a> {
    lane: &'a KvCache,
    slots: &'a LayerSlots,
    /// Position of the lane's first row.
    start: u32,
    /// The lane's rows in this step.
    tokens: u32,
    suffix: String,
}

impl LaneIo<'_> {
    fn layer(&self, slot: Option<usize>) -> Result<&LayerCache, ModelError> {
        let i = slot.ok_or_else(|| {
            ModelError::Shape("deepseek4: the cache has no compressor state for this layer".into())
        })?;
        if i >= self.lane.layers().len() {
            return Err(ModelError::Shape(format!(
                "deepseek4: the cache has {} layers, the model's layout needs layer {i}; build it with DeepSeek4::new_cache",
                self.lane.layers().len()
            )));
        }
        Ok(self.lane.layer(i))
    }
}

fn compressor_inputs(
    s: &mut GraphSession<'_>,
    w: &Compressor,
    h: Tensor,
    label: &str,
) -> Result<CompressorInputs, ModelError> {
    Ok(CompressorInputs {
        kv: s.matmul(h, w.kv, format!("{label}.kv"))?,
        gate: s.matmul(h, w.gate, format!("{label}.gate"))?,
    })
}
