//! DeepSeek-V4's cache state, held entirely in weft's `KvCache`.
//!
//! Per layer the model needs (FORMAT.md 3.10): the last `W` kv vectors
//! (rotated at their own positions), the compressor's per-token values and
//! gates of windows not yet pooled, the compressed rows emitted so far, and
//! on CSA layers the indexer's compressor state and rows. Each is a
//! `KvCache` layer, so the cache module's rules cover all of it: plan,
//! publish after drain, poison on failure, reset, snapshot/restore with
//! lineage checks, checkpoints, swapping sequences, cohorts.
//!
//! | state | `KvCache` layer | snapshot / rollback |
//! |---|---|---|
//! | window kv | width `d`, window `W` (a ring of `W + max_chunk`); `k` holds the K=V vector, `v` is unused | ring rows copied, like any windowed layer |
//! | compressor values / gates | width `cw`, window `2c` (CSA: the previous window is still pooled) or `c` (HCA); `k` = values, `v` = gates, one row per position | the last `window - 1` positions are copied: exactly the pending tokens the next rows need |
//! | indexer compressor (CSA) | width `2 ID`, window 8 | as above |
//! | compressed rows (+ indexer rows on CSA) | no window, width `wt = max(ceil(d / c), ceil(ID / 4))`: `k` seen as `f32 [context / c, d]`, `v` as `f32 [context / 4, ID]` | append-only |
//!
//! Why the row tables are safe as an append-only layer: table row `w`
//! occupies cache rows `[w d / wt, (w + 1) d / wt)`, all below `(w + 1) c`,
//! the position after the token that completes window `w`. So a row lies
//! inside the published rows once the step that wrote it is published (a
//! checkpoint of `0..position` holds every complete row), and a failed or
//! rolled-back step can only have written rows that no published query
//! sees: query `t` reads rows `w < (t + 1) / c`, which a replay rewrites
//! before any query reads them.

use super::config::Dsv4Config;
use crate::ModelError;
use weft_ops::{DType, Shape, Tensor};
use weft_runtime::cache::{CacheConfig, KvCache, LayerCache, LayerSpec, MemoryReport};

/// Which `KvCache` layers hold one model layer's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerSlots {
    /// The window ring.
    pub window: usize,
    /// The attention compressor's values (`k`) and gates (`v`).
    pub compressor: Option<usize>,
    /// The indexer compressor's values and gates (CSA layers).
    pub indexer: Option<usize>,
    /// The row tables (compressed rows in `k`, indexer rows in `v`).
    pub table: Option<usize>,
}

/// The layout of a DeepSeek-V4 cache.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheLayout {
    pub kv: CacheConfig,
    pub slots: Vec<LayerSlots>,
}

/// Width of the table layer of a layer with ratio `ratio`.
fn table_width(c: &Dsv4Config, ratio: u32) -> usize {
    let rows = c.head_dim.div_ceil(ratio as usize);
    if ratio == 4 {
        rows.max(c.indexer_dim.div_ceil(4))
    } else {
        rows
    }
}

impl CacheLayout {
    /// The layout for `context` tokens and steps of up to `max_chunk`.
    pub fn new(c: &Dsv4Config, context: u32, max_chunk: u32) -> CacheLayout {
        let mut layers = Vec::new();
        let mut add = |width: usize, window: Option<u32>| {
            layers.push(LayerSpec { width, window });
            layers.len() - 1
        };
        let mut slots = Vec::with_capacity(c.layers);
        for l in 0..c.layers {
            let ratio = c.ratio(l);
            let overlap = ratio == 4;
            let window = add(c.head_dim, Some(c.window));
            let compressor = (ratio != 0).then(|| {
                let width = c.head_dim * (1 + overlap as usize);
                add(width, Some(ratio * (1 + overlap as u32)))
            });
            let indexer = overlap.then(|| add(2 * c.indexer_dim, Some(8)));
            let table = (ratio != 0).then(|| add(table_width(c, ratio), None));
            slots.push(LayerSlots {
                window,
                compressor,
                indexer,
                table,
            });
        }
        CacheLayout {
            kv: CacheConfig {
                layers,
                context,
                max_chunk: max_chunk.min(context).max(1),
                dtype: DType::F32,
            },
            slots,
        }
    }

    /// Bytes per layer and per token (before allocating anything).
    pub fn memory(&self) -> MemoryReport {
        self.kv.memory_report()
    }

    /// Admission: the bytes the cache needs, or an error naming them when
    /// they exceed `budget`.
    pub fn admit(&self, budget: u64) -> Result<u64, ModelError> {
        Ok(self.kv.admit(budget)?)
    }
}

/// The compressed-row table of layer `l` (ratio `ratio`) as `f32 [rows, d]`,
/// where `rows = context / ratio`; `None` when no row fits the context.
pub fn rows_table(
    cache: &KvCache,
    slots: &LayerSlots,
    ratio: u32,
    width: usize,
    value_half: bool,
) -> Result<Option<Tensor>, ModelError> {
    let Some(i) = slots.table else {
        return Ok(None);
    };
    let layer: &LayerCache = cache.layer(i);
    let t = if value_half { layer.v } else { layer.k };
    let rows = cache.config().context as usize / ratio as usize;
    if rows == 0 || rows * width > t.shape.elements() {
        return Ok(None);
    }
    Ok(Some(Tensor::new(
        t.buffer,
        t.offset,
        t.dtype,
        Shape::new(&[rows, width]),
    )?))
}
