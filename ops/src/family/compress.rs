//! Parameters of the KV compressor (`Compress`) and the indexer's top-k
//! (`IndexerTopK`).

use super::TailRopeParams;

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
