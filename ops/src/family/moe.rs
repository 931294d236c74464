//! Parameters of expert routing and gating (`MoeRoute`, `MoeWeights`).

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
