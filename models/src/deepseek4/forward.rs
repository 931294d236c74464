//! The DeepSeek-V4 forward pass, recorded with the builder API: token
//! embedding copied into `hc` streams, per block two hyper-connection sites
//! (attention, MoE) around their sublayers, and the head that collapses the
//! streams. Attention lives in `attention.rs`.
//!
//! A step has `R` rows: `n` tokens of one sequence at `start..start + n`,
//! or one token for each of `B` lanes (a cohort) at `start`. Everything but
//! the cache reads and writes runs on all rows at once; the attention part
//! that touches a cache runs per lane. Node labels are `blk.{l}.{name}` (and
//! `.lane{b}` for per-lane nodes), so fault injection can aim at a layer.

use super::weights::{Dsv4Layer, HcSite, Router};
use super::DeepSeek4;
use crate::finite::LayerProbe;
use crate::step::LogitRows;
use crate::ModelError;
use std::ops::Range;
use weft_ops::builder::FamilyBuilder;
use weft_ops::{Builder, Op, Tensor};
use weft_ops::{HcMixParams, MoeRouteParams, MoeSelect, MoeWeightsParams};
use weft_runtime::cache::KvCache;
use weft_runtime::{GraphSession, PoolScope};

/// What one step records: its rows and the lanes they belong to.
pub(super) struct StepRows<'a> {
    /// Position of the first row of each lane.
    pub start: u32,
    /// Rows of the step (tokens).
    pub rows: usize,
    /// The lanes; one lane owns every row, or lane `b` owns row `b`.
    pub lanes: &'a [&'a KvCache],
    /// `i32 [R]` positions of the rows.
    pub positions: Tensor,
    /// `i32 [R]` token ids.
    pub ids: Tensor,
}

impl StepRows<'_> {
    /// The rows lane `b` owns.
    pub fn lane_rows(&self, b: usize) -> Range<usize> {
        if self.lanes.len() == 1 {
            0..self.rows
        } else {
            b..b + 1
        }
    }

    /// Label suffix of lane `b`'s nodes.
    pub fn lane_suffix(&self, b: usize) -> String {
        if self.lanes.len() == 1 {
            String::new()
        } else {
            format!(".lane{b}")
        }
    }
}

impl DeepSeek4 {
    /// Records one step and returns its logits `[rows, V]` (rows per `logits`).
    ///
    /// With one lane, `tokens` are consecutive tokens at `start..`; with B
    /// lanes, token `b` is lane `b`'s next token, every lane at `start`.
    pub fn record_step(
        &self,
        s: &mut GraphSession<'_>,
        lanes: &[&KvCache],
        start: u32,
        tokens: &[u32],
        logits: LogitRows,
    ) -> Result<Tensor, ModelError> {
        self.record_step_probed(s, lanes, start, tokens, logits, None)
    }

    /// [`DeepSeek4::record_step`], summing each layer's streams into `probe`.
    pub(crate) fn record_step_probed(
        &self,
        s: &mut GraphSession<'_>,
        lanes: &[&KvCache],
        start: u32,
        tokens: &[u32],
        logits: LogitRows,
        probe: Option<&LayerProbe>,
    ) -> Result<Tensor, ModelError> {
        let c = &self.config;
        let n = tokens.len();
        if n == 0 || lanes.is_empty() || (lanes.len() > 1 && lanes.len() != n) {
            return Err(ModelError::Input(format!(
                "deepseek4: a step of {n} tokens over {} lanes (one lane, or one token per lane)",
                lanes.len()
            )));
        }
        if let Some(bad) = tokens.iter().find(|&&t| t as usize >= c.vocab) {
            return Err(ModelError::Input(format!(
                "token id {bad} is outside the vocabulary of {}",
                c.vocab
            )));
        }
        s.set_layer(None);
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let repeated: Vec<i32> = ids
            .iter()
            .flat_map(|&t| std::iter::repeat_n(t, c.hc))
            .collect();
        let ids = s.upload_i32(&ids, "token_ids")?;
        let rep = s.upload_i32(&repeated, "token_ids.streams")?;
        // The streams: every stream starts as the token's embedding.
        let x = s.get_rows(self.weights.token_embd, rep, "token_embd")?;
        let x = x.reshape(&[n, c.hc * c.hidden])?;
        self.record_rows(s, lanes, start, ids, x, logits, probe)
    }

    /// Records one decode step of one lane whose token id is already on the
    /// device (`ids`: i32 `[1]`, inside the vocabulary, as an argmax of the
    /// logits leaves it): the greedy decoding one step ahead
    /// (`Model::decode_greedy`).
    pub fn record_ids(
        &self,
        s: &mut GraphSession<'_>,
        lane: &KvCache,
        start: u32,
        ids: Tensor,
        logits: LogitRows,
    ) -> Result<Tensor, ModelError> {
        self.record_ids_probed(s, lane, start, ids, logits, None)
    }

    /// [`DeepSeek4::record_ids`], summing each layer's streams into `probe`.
    pub(crate) fn record_ids_probed(
        &self,
        s: &mut GraphSession<'_>,
        lane: &KvCache,
        start: u32,
        ids: Tensor,
        logits: LogitRows,
        probe: Option<&LayerProbe>,
    ) -> Result<Tensor, ModelError> {
        let c = &self.config;
        if ids.shape.elements() != 1 || ids.dtype != weft_ops::DType::I32 {
            return Err(ModelError::Input(format!(
                "deepseek4: device-fed steps take one i32 token id, not {} {:?}",
                ids.dtype, ids.shape
            )));
        }
        s.set_layer(None);
        let ids = ids.reshape(&[1])?;
        // One embedding row copied into each stream (a stream of one row is
        // a contiguous slice of it).
        let x = weft_ops::Recorder::alloc(s, weft_ops::DType::F32, &[1, c.hc * c.hidden])?;
        for j in 0..c.hc {
            let stream = Tensor::new(
                x.buffer,
                x.offset + (j * c.hidden * 4) as u64,
                weft_ops::DType::F32,
                weft_ops::Shape::new(&[1, c.hidden]),
            )?;
            s.push(
                Op::GetRows,
                vec![self.weights.token_embd, ids],
                vec![stream],
                format!("token_embd.stream{j}"),
            )?;
        }
        self.record_rows(s, &[lane], start, ids, x, logits, probe)
    }

    /// The blocks and the head over the streams `x` `[R, hc * d]` (each
    /// stream holding its row's embedding), with `ids` the rows' token ids.
    #[allow(clippy::too_many_arguments)]
    fn record_rows(
        &self,
        s: &mut GraphSession<'_>,
        lanes: &[&KvCache],
        start: u32,
        ids: Tensor,
        x: Tensor,
        logits: LogitRows,
        probe: Option<&LayerProbe>,
    ) -> Result<Tensor, ModelError> {
        let n = x.rows();
        let positions: Vec<i32> = if lanes.len() == 1 {
            (0..n as i32).map(|i| start as i32 + i).collect()
        } else {
            vec![start as i32; n]
        };
        let step = StepRows {
            start,
            rows: n,
            lanes,
            positions: s.upload_i32(&positions, "positions")?,
            ids,
        };
        // The streams ping-pong between `x` and `y`, outside the per-layer
        // pool scopes.
        let y = weft_ops::Recorder::alloc(s, x.dtype, x.shape.dims())?;
        let kind = if n == 1 {
            PoolScope::DecodeToken
        } else {
            PoolScope::PrefillLayer
        };
        for (l, layer) in self.weights.layers.iter().enumerate() {
            s.set_layer(Some(l as u32));
            s.begin_pool_scope(kind);
            self.record_layer(s, l, layer, &step, x, y)?;
            if let Some(p) = probe {
                p.record(s, l, x)?;
            }
            s.end_pool_scope()?;
        }
        s.set_layer(None);
        let first = if lanes.len() == 1 {
            logits.first_row(start, n)
        } else {
            0
        };
        let x = x.rows_view(first, n - first)?;
        self.record_head(s, x)
    }

    /// One block: streams in `x`, through `y`, back in `x`.
    fn record_layer(
        &self,
        s: &mut GraphSession<'_>,
        l: usize,
        w: &Dsv4Layer,
        step: &StepRows<'_>,
        x: Tensor,
        y: Tensor,
    ) -> Result<(), ModelError> {
        let c = &self.config;
        let p = |name: &str| format!("blk.{l}.{name}");
        let (h, co) = self.hc_pre(s, x, &w.hc_attn, w.attn_norm, &p("hc_attn"))?;
        let f = self.record_attention(s, l, w, step, h)?;
        s.push(
            Op::HcExpand { hc: c.hc },
            vec![x, f, co],
            vec![y],
            p("hc_attn.post"),
        )?;
        let (h, co) = self.hc_pre(s, y, &w.hc_ffn, w.ffn_norm, &p("hc_ffn"))?;
        let f = self.record_moe(s, l, w, step, h)?;
        s.push(
            Op::HcExpand { hc: c.hc },
            vec![y, f, co],
            vec![x],
            p("hc_ffn.post"),
        )?;
        // The streams leaving the layer (diagnostics: `GraphExecutor::enable_taps`).
        s.tap(format_args!("streams-{l}"), x)?;
        Ok(())
    }

    /// Pre-mix: the coefficients, and the collapsed streams normalised
    /// with the sublayer's `norm` (the sublayer's input). The mixer runs on
    /// the raw streams; `hc_mix` divides its outputs by the streams' RMS
    /// (the unweighted norm of FORMAT.md 3.3, moved past the linear map).
    fn hc_pre(
        &self,
        s: &mut GraphSession<'_>,
        x: Tensor,
        site: &HcSite,
        norm: Tensor,
        label: &str,
    ) -> Result<(Tensor, Tensor), ModelError> {
        let c = &self.config;
        let m = s.matmul(x, site.mixer, format!("{label}.fn"))?;
        let params = HcMixParams {
            hc: c.hc,
            iters: c.sinkhorn_iters,
            eps: c.hc_eps,
            norm_eps: Some(c.rms_eps),
        };
        let co = s.hc_mix(
            m,
            site.scale,
            site.base,
            Some(x),
            params,
            format!("{label}.mix"),
        )?;
        let h = s.hc_collapse(x, co, c.hc, Some((norm, c.rms_eps)), format!("{label}.pre"))?;
        Ok((h, co))
    }

    /// The MoE: routed experts (hash or top-k routing) plus the shared expert.
    fn record_moe(
        &self,
        s: &mut GraphSession<'_>,
        l: usize,
        w: &Dsv4Layer,
        step: &StepRows<'_>,
        x: Tensor,
    ) -> Result<Tensor, ModelError> {
        let c = &self.config;
        let p = |name: &str| format!("blk.{l}.{name}");
        let n = x.rows();
        let logits = s.matmul(x, w.gate_inp, p("ffn_gate_inp"))?;
        let route = |select| MoeRouteParams {
            k: c.experts_used,
            select,
        };
        let ids = match w.router {
            Router::Hash(table) => s.moe_route(
                logits,
                &[table, step.ids],
                route(MoeSelect::Hash),
                p("ffn_route"),
            )?,
            Router::TopK(bias) => {
                s.moe_route(logits, &[bias], route(MoeSelect::TopK), p("ffn_route"))?
            }
        };
        let weights = s.moe_weights(
            logits,
            ids,
            MoeWeightsParams {
                normalize: c.weights_norm,
                scale: c.routed_scale,
            },
            p("ffn_weights"),
        )?;
        let g = s.matmul_id(x, w.gate_exps, ids, p("ffn_gate_exps"))?;
        let u = s.matmul_id(x, w.up_exps, ids, p("ffn_up_exps"))?;
        let a = s.swiglu_clamp(g, u, c.clamp_exp[l], p("ffn_swiglu"))?;
        let a = a.reshape(&[n * c.experts_used, c.expert_ff])?;
        let y = s.matmul_id(a, w.down_exps, ids, p("ffn_down_exps"))?;
        let gs = s.matmul(x, w.gate_shexp, p("ffn_gate_shexp"))?;
        let us = s.matmul(x, w.up_shexp, p("ffn_up_shexp"))?;
        let a = s.swiglu_clamp(gs, us, c.clamp_shexp[l], p("ffn_swiglu_shexp"))?;
        let shared = s.matmul(a, w.down_shexp, p("ffn_down_shexp"))?;
        Ok(s.moe_combine(y, weights, Some(shared), p("ffn_combine"))?)
    }

    /// The head: collapse the streams (pre only), norm, logits.
    fn record_head(&self, s: &mut GraphSession<'_>, x: Tensor) -> Result<Tensor, ModelError> {
        let c = &self.config;
        let w = &self.weights;
        let m = s.matmul(x, w.output_hc.mixer, "output_hc.fn")?;
        let params = HcMixParams {
            hc: c.hc,
            iters: c.sinkhorn_iters,
            eps: c.hc_eps,
            norm_eps: Some(c.rms_eps),
        };
        let (scale, base) = (w.output_hc.scale, w.output_hc.base);
        let pre = s.hc_mix(m, scale, base, Some(x), params, "output_hc.mix")?;
        let norm = Some((w.output_norm, c.rms_eps));
        let z = s.hc_collapse(x, pre, c.hc, norm, "output_hc.pre")?;
        Ok(s.matmul(z, w.output, "output")?)
    }
}
