//! Parameters of hyper-connection stream mixing (`HcMix`).

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
