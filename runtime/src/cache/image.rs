//! Host copies of cache rows, addressed by position rather than by slot.
//!
//! A [`CacheImage`] holds everything a sequence needs to continue from its
//! position: every row of the layers without a window, and the last
//! `window - 1` positions of each windowed layer (the only ones a later
//! query can see). Swapping a sequence out and in (`SequenceStore`) and
//! checkpoints (`checkpoint.rs`) are built on it; snapshots reuse its row
//! copies for their windowed layers.
//!
//! Rows are stored by position, so an image can go back into a cache of the
//! same layout whose ring (or context) differs, and a ring that wrapped is
//! read and written as two contiguous slot runs. Continuing bit for bit
//! needs the same ring size too: the CPU attention kernel accumulates in f16
//! in slot order, and the ring size decides the slot order (another ring
//! gives the same maths, rounded differently).

use super::config::LayerSpec;
use super::kv::{KvCache, LayerCache};
use super::lineage::Lineage;
use super::span::rows_written;
use crate::{GraphExecutor, RuntimeError};
use weft_ops::DType;

/// One layer's K and V rows for positions `first..first + count`, in
/// position order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerRows {
    pub(crate) first: u32,
    pub(crate) k: Vec<u8>,
    pub(crate) v: Vec<u8>,
}

impl LayerRows {
    /// First position held.
    pub fn first(&self) -> u32 {
        self.first
    }

    /// Host bytes held (K plus V).
    pub fn bytes(&self) -> u64 {
        (self.k.len() + self.v.len()) as u64
    }

    /// Number of positions held, given the bytes of one row.
    pub(crate) fn count(&self, row_bytes: u64) -> u64 {
        (self.k.len() as u64).checked_div(row_bytes).unwrap_or(0)
    }
}

/// Copies positions `first..end` of `layer` to the host (waits for
/// in-flight work).
pub(crate) fn read_rows(
    exec: &mut GraphExecutor,
    layer: &LayerCache,
    first: u32,
    end: u32,
) -> Result<LayerRows, RuntimeError> {
    let mut rows = LayerRows {
        first,
        k: Vec::new(),
        v: Vec::new(),
    };
    if end <= first {
        return Ok(rows);
    }
    for run in rows_written(first, end - first, layer.ring) {
        let (start, count) = (run.start as usize, (run.end - run.start) as usize);
        rows.k
            .extend(exec.read_bytes(&layer.k.rows_view(start, count)?)?);
        rows.v
            .extend(exec.read_bytes(&layer.v.rows_view(start, count)?)?);
    }
    Ok(rows)
}

/// Writes `rows` back into the slots their positions occupy in `layer`.
pub(crate) fn write_rows(
    exec: &mut GraphExecutor,
    layer: &LayerCache,
    rows: &LayerRows,
) -> Result<(), RuntimeError> {
    let row_bytes = layer.k.row_bytes();
    let count = rows.count(row_bytes as u64) as u32;
    if count == 0 {
        return Ok(());
    }
    let mut done = 0usize;
    for run in rows_written(rows.first, count, layer.ring) {
        let (start, n) = (run.start as usize, (run.end - run.start) as usize);
        let bytes = done * row_bytes..(done + n) * row_bytes;
        let (k, v) = (rows.k.get(bytes.clone()), rows.v.get(bytes));
        let (Some(k), Some(v)) = (k, v) else {
            return Err(RuntimeError::Usage(format!(
                "KV cache: {} bytes of saved rows do not hold {count} rows of {row_bytes} bytes",
                rows.k.len()
            )));
        };
        exec.write_bytes(&layer.k.rows_view(start, n)?, k)?;
        exec.write_bytes(&layer.v.rows_view(start, n)?, v)?;
        done += n;
    }
    Ok(())
}

/// Everything a sequence needs to continue from its position, on the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheImage {
    pub(crate) layout: Vec<LayerSpec>,
    pub(crate) dtype: DType,
    pub(crate) position: u32,
    pub(crate) layers: Vec<LayerRows>,
}

impl CacheImage {
    /// An empty sequence for caches of this layout.
    pub fn empty(layout: &[LayerSpec], dtype: DType) -> CacheImage {
        CacheImage {
            layout: layout.to_vec(),
            dtype,
            position: 0,
            layers: layout
                .iter()
                .map(|_| LayerRows {
                    first: 0,
                    k: Vec::new(),
                    v: Vec::new(),
                })
                .collect(),
        }
    }

    /// Position the sequence continues from.
    pub fn position(&self) -> u32 {
        self.position
    }

    /// Layer layout the image was taken from.
    pub fn layout(&self) -> &[LayerSpec] {
        &self.layout
    }

    /// Element type of the rows.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Host bytes held.
    pub fn bytes(&self) -> u64 {
        self.layers.iter().map(LayerRows::bytes).sum()
    }
}

impl KvCache {
    /// Copies the sequence's frontier to the host (every row a later step
    /// can read). Refused on a poisoned cache.
    pub fn export(&self, exec: &mut GraphExecutor) -> Result<CacheImage, RuntimeError> {
        self.refuse_if_poisoned("export")?;
        let mut layers = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            let first = layer.needed_from(self.position);
            layers.push(read_rows(exec, layer, first, self.position)?);
        }
        Ok(CacheImage {
            layout: self.config.layers.clone(),
            dtype: self.config.dtype,
            position: self.position,
            layers,
        })
    }

    /// Replaces the cache's sequence with `image` (a new sequence: clears
    /// poison; snapshots of what was here can no longer be restored). The
    /// image is checked against the cache first; a mismatch changes nothing.
    pub fn import(
        &mut self,
        exec: &mut GraphExecutor,
        image: &CacheImage,
    ) -> Result<(), RuntimeError> {
        self.check_image(image)?;
        self.lineage = Lineage::fresh();
        self.import_rows(exec, image)
    }

    /// Writes a checked image's rows and publishes its position (lineage
    /// untouched: the caller decides whose sequence this is). A device
    /// write that fails halfway poisons the cache.
    pub(crate) fn import_rows(
        &mut self,
        exec: &mut GraphExecutor,
        image: &CacheImage,
    ) -> Result<(), RuntimeError> {
        for (layer, rows) in self.layers.iter().zip(&image.layers) {
            if let Err(e) = write_rows(exec, layer, rows) {
                self.poison(&format!("an import failed halfway: {e}"));
                return Err(e);
            }
        }
        self.position = image.position;
        self.poisoned = None;
        Ok(())
    }

    /// Why `image` cannot go into this cache, if it cannot.
    pub(crate) fn check_image(&self, image: &CacheImage) -> Result<(), RuntimeError> {
        let refuse = |why: String| {
            Err(RuntimeError::Usage(format!(
                "KV cache: the saved sequence does not fit this cache: {why}; \
                 load it into a cache built with the same model and layout"
            )))
        };
        if image.layout != self.config.layers {
            return refuse(format!(
                "its layers {:?} differ from the cache's {:?}",
                image.layout, self.config.layers
            ));
        }
        if image.dtype != self.config.dtype {
            return refuse(format!(
                "its rows are {}, the cache's {}",
                image.dtype, self.config.dtype
            ));
        }
        if image.position > self.config.context {
            return refuse(format!(
                "its position {} is past the context length of {}",
                image.position, self.config.context
            ));
        }
        for (i, (layer, rows)) in self.layers.iter().zip(&image.layers).enumerate() {
            let first = layer.needed_from(image.position);
            let want = (image.position - first) as u64 * layer.k.row_bytes() as u64;
            let (k, v) = (rows.k.len() as u64, rows.v.len() as u64);
            if rows.first != first || k != want || v != want {
                return refuse(format!(
                    "layer {i} holds {k}+{v} bytes from position {}, expected {want}+{want} from {first}",
                    rows.first
                ));
            }
        }
        Ok(())
    }
}
