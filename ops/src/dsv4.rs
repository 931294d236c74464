//! Parameters of the ops DeepSeek-V4 brought into the op set: partial
//! interleaved RoPE (tail rope) with YaRN, hyper-connection mixing, the KV
//! compressor, the lightning indexer, attention with sinks over a window
//! plus compressed rows, indexed matmuls and MoE routing.
//!
//! The variants themselves live in [`crate::op::Op`]; their shape rules in
//! `rules.rs`, their reference semantics in `reference/dsv4_*.rs`. Nothing
//! here is specific to one model file: any model with hyper-connections or
//! compressed attention can record these ops.

/// YaRN frequency interpolation without magnitude scaling (DeepSeek-V4's
/// form): pair `i` turns at `f_i / factor * ramp_i + f_i * (1 - ramp_i)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct YarnScaling {
    /// Context extension factor `s`.
    pub factor: f32,
    /// Training context length `L0`.
    pub orig_ctx: u32,
    /// Rotations per context above which a pair keeps its frequency.
    pub beta_fast: f32,
    /// Rotations per context below which a pair is fully interpolated.
    pub beta_slow: f32,
}

/// Rotary embedding of the **last** `n_dims` elements of each head, in
/// interleaved pairs `(j, j + 1)` with `j = head_dim - n_dims + 2i`; the
/// first `head_dim - n_dims` elements pass through. The angle of pair `i`
/// at position `p` is `p * inv_freq[i]`, one f32 product (as PyTorch
/// computes it); `inverse` turns by `-p * inv_freq[i]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TailRopeParams {
    /// Elements per head; a row holds `cols / head_dim` heads.
    pub head_dim: usize,
    /// Rotated elements at the end of each head (even, <= head_dim).
    pub n_dims: usize,
    /// Frequency base `theta`: `f_i = theta^(-2i / n_dims)`.
    pub base: f32,
    /// YaRN interpolation of the frequencies, if any.
    pub yarn: Option<YarnScaling>,
    /// Rotate backwards (undo a rotation at the same position).
    pub inverse: bool,
}

impl TailRopeParams {
    /// The `n_dims / 2` frequencies, computed in f64 and rounded once.
    pub fn inv_freq(&self) -> Vec<f32> {
        let r = self.n_dims as f64;
        let base = self.base as f64;
        let half = self.n_dims / 2;
        let plain = |i: usize| base.powf(-((2 * i) as f64) / r);
        let Some(y) = self.yarn else {
            return (0..half).map(|i| plain(i) as f32).collect();
        };
        // corr(beta) = r ln(L0 / (2 pi beta)) / (2 ln theta)
        let corr = |beta: f64| {
            r * (y.orig_ctx as f64 / (2.0 * std::f64::consts::PI * beta)).ln() / (2.0 * base.ln())
        };
        let lo = corr(y.beta_fast as f64).floor().max(0.0);
        let mut hi = corr(y.beta_slow as f64).ceil().min(r - 1.0);
        if lo == hi {
            hi = lo + 0.001;
        }
        let factor = y.factor as f64;
        (0..half)
            .map(|i| {
                let f = plain(i);
                let ramp = ((i as f64 - lo) / (hi - lo)).clamp(0.0, 1.0);
                (f / factor * ramp + f * (1.0 - ramp)) as f32
            })
            .collect()
    }

    /// `(cos, sin)` of every rotated pair at `position` (sin negated when
    /// `inverse`), from `inv_freq`.
    pub fn angles(&self, inv_freq: &[f32], position: i32, out: &mut Vec<(f32, f32)>) {
        out.clear();
        for &f in inv_freq {
            let theta = position as f32 * f;
            let (s, c) = (theta as f64).sin_cos();
            let s = if self.inverse { -s } else { s };
            out.push((c as f32, s as f32));
        }
    }
}

/// Hyper-connection mixing coefficients from the mixer's raw outputs.
///
/// Inputs `m f32 [n, mix]` (the mixer's projection of the flattened
/// streams), `scale f32 [3]` (or `[1]` for the head), `base f32 [mix]`, and
/// with `norm_eps` the streams `x f32 [n, hc * d]`: `m` is then divided by
/// `sqrt(mean(x^2) + norm_eps)` first (the mixer input's unweighted RMS
/// norm, applied after the linear projection).
/// Output `f32 [n, mix]`: for `mix = (2 + hc) hc` the row is
/// `[pre (hc) | post (hc) | comb (hc x hc, row = source stream)]` with
/// `pre = sigmoid(m s0 + b) + eps`, `post = 2 sigmoid(m s1 + b)` and comb
/// Sinkhorn-normalised (row softmax + eps, one column normalisation, then
/// `iters - 1` times row then column, every denominator `+ eps`); for
/// `mix = hc` (the output head) only `pre`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HcMixParams {
    /// Number of residual streams.
    pub hc: usize,
    /// Sinkhorn iterations (counting the first column normalisation).
    pub iters: usize,
    /// `eps_hc`: added to `pre` and to every Sinkhorn denominator.
    pub eps: f32,
    /// Normalise `m` by the RMS of the streams (fourth input), with this epsilon.
    pub norm_eps: Option<f32>,
}

/// The KV compressor of one step: rows `first_row..first_row + rows` of a
/// compressed cache, each pooling `ratio` tokens (and the previous
/// window's `ratio` tokens when `overlap`), then RMS-normalised and rotated
/// at the window's first position `w * ratio`.
///
/// Inputs: `kv f32 [ring, width]` and `gate f32 [ring, width]` (per-token
/// values and gate logits, position `p` in slot `p % ring`), `ape f32
/// [ratio, width]`, `norm f32 [dc]`. `width` is `dc` (or `2 dc` with
/// overlap, first half for the previous window, second half for the own
/// window). Output `f32 [table, dc]` (the cache's whole row table, at
/// least `first_row + rows` rows), of which rows `first_row..first_row +
/// rows` are written: per channel `e`, `softmax_j(gate_j[e] +
/// ape[j][e])`-weighted values, then `rope(rms(pooled; norm), w * ratio)`.
/// (The whole table as the output keeps a decode step's recording the same
/// from one window to the next; `first_row` is the value that changes.)
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CompressParams {
    /// Tokens per window `c`.
    pub ratio: u32,
    /// Overlapping windows (DeepSeek-V4's CSA, ratio 4).
    pub overlap: bool,
    /// Index of the first row pooled.
    pub first_row: u32,
    /// Rows pooled (windows completed in the step).
    pub rows: u32,
    /// Slots of the `kv`/`gate` rings (position `p` lives in `p % ring`).
    pub ring: u32,
    /// Epsilon of the row norm.
    pub eps: f32,
    /// The rotary embedding of the rows (`head_dim = dc`).
    pub rope: TailRopeParams,
}

/// The lightning indexer's selection for a block of queries.
///
/// Inputs: `q f32 [n, heads * head_dim]` (rotated indexer queries),
/// `weights f32 [n, heads]` (per-head weights, already scaled), `keys f32
/// [rows, head_dim]` (the indexer's compressed rows). Query `i` sits at
/// `q_position + i` and sees rows `w < (q_position + i + 1) / ratio`.
/// Score `I(w) = sum_h weights[h] * max(0, q_h . keys[w])`. Output `i32
/// [n, top_k]`: the visible rows with the `top_k` largest scores (ties:
/// the lower row wins), or every visible row when there are at most
/// `top_k`, in ascending row order; `-1` pads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IndexerParams {
    /// Indexer heads.
    pub heads: usize,
    /// Elements per indexer head.
    pub head_dim: usize,
    /// Rows kept per query.
    pub top_k: usize,
    /// Tokens per compressed row.
    pub ratio: u32,
    /// Position of the first query.
    pub q_position: u32,
}

/// Attention with a sink over a sliding window plus compressed rows
/// (DeepSeek-V4). One key/value head shared by every query head (K = V).
///
/// Inputs: `q f32 [n, heads * head_dim]`, `window f32 [ring, head_dim]`
/// (position `p` in slot `p % ring`), `rows f32 [m, head_dim]` (compressed
/// rows), `sinks f32 [heads]`, and with `top_k > 0` a selection `i32 [n,
/// top_k]` of row ids (`-1`: none). Query `i` at `t = q_position + i` sees
/// window positions `max(0, t - window + 1)..=t` and compressed rows `w <
/// (t + 1) / ratio` (all of them, or the selected ones). Scores are `scale
/// q . k`; the sink `e^{z_h}` joins each head's softmax denominator only.
/// With `out_rope`, each head's output is rotated by it at the query
/// position (DeepSeek-V4's inverse RoPE on the output).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SinkAttentionParams {
    /// Query heads.
    pub heads: usize,
    /// Elements per head (queries, keys, values).
    pub head_dim: usize,
    /// Factor on every score.
    pub scale: f32,
    /// Position of the first query.
    pub q_position: u32,
    /// Keys per query in the window (the query's own included).
    pub window: u32,
    /// Slots of the window ring.
    pub ring: u32,
    /// Tokens per compressed row (0: no compressed rows).
    pub ratio: u32,
    /// Selected rows per query (0: every visible row, no selection input).
    pub top_k: usize,
    /// A rotation of each head's output at the query position.
    pub out_rope: Option<TailRopeParams>,
}

/// How a MoE layer picks its experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoeSelect {
    /// Top-k of `sqrt(softplus(logit)) + bias` (inputs: logits, bias).
    TopK,
    /// `table[token]` (inputs: logits, table `i32 [vocab, k]`, tokens `i32 [n]`).
    Hash,
}

/// Expert selection: output `i32 [n, k]`. Ties in top-k go to the lower
/// expert id; the ids are in descending order of the biased score.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeRouteParams {
    /// Experts per token.
    pub k: usize,
    /// How experts are picked.
    pub select: MoeSelect,
}

/// Expert weights of the selected experts: inputs `logits f32 [n, E]`,
/// `ids i32 [n, k]`; output `f32 [n, k]` with `w_j = s_j / sum s * scale`
/// (`s = sqrt(softplus(logit))`, unbiased; without `normalize`, `s_j *
/// scale`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeWeightsParams {
    /// Renormalise over the selected experts.
    pub normalize: bool,
    /// Routed scaling factor `rho`.
    pub scale: f32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yarn_frequencies_match_the_fixture_table() {
        // flash-tiny: theta 160000, r 16, factor 16, L0 65536, beta 32/1 (lo 3, hi 7).
        let p = TailRopeParams {
            head_dim: 64,
            n_dims: 16,
            base: 160000.0,
            yarn: Some(YarnScaling {
                factor: 16.0,
                orig_ctx: 65536,
                beta_fast: 32.0,
                beta_slow: 1.0,
            }),
            inverse: false,
        };
        let want: [f64; 8] = [
            1.0,
            0.223606795,
            0.0500000007,
            0.0111803403,
            0.00191406242,
            0.000296977785,
            3.71093774e-05,
            1.74692821e-06,
        ];
        for (g, w) in p.inv_freq().iter().zip(want) {
            let g = *g as f64;
            assert!((g - w).abs() <= w * 2e-7, "{g} vs {w}");
        }
        let main = TailRopeParams {
            base: 10000.0,
            yarn: None,
            ..p
        };
        assert!((main.inv_freq()[1] as f64 - 0.316227764).abs() < 1e-8);
    }
}
