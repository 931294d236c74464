//! Parameters of attention with a learned sink over a window plus
//! compressed rows (`SinkAttention`).

use super::TailRopeParams;

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
