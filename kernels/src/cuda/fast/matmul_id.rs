//! Prefill expert products on the tensor cores (fast/matmul_id.cu): the
//! (token, slot) pairs of a `MatMulId` grouped by expert on the device and
//! multiplied per expert by fast/matmul.cu's int8 tile product, so each
//! expert's weights are read once per tile of up to 64 of its pairs
//! instead of once per four. Taken in numerics `fast` when the experts
//! average [`MIN_PAIRS_PER_EXPERT`] or more pairs (a prefill chunk); decode
//! keeps the exact kernels, which stream the few routed experts at memory
//! speed.
//!
//! Three launches: the activation rows quantized once into the node's
//! scratch (the weights' dot type, as the exact kernels quantize them), the
//! routing (one block: counts, positions, the tile table), the product
//! (grid: weight-row tiles x the most tiles the routing can give; the
//! blocks past the routing's count return at once). The ids never reach
//! the host, so a captured graph replays for any routing.
//!
//! Bound: as the dense product's (fast/matmul.cu), the same block terms in
//! another f32 order.

use super::super::launch::{bad_call, launch as enqueue, Arg};
use super::super::{CudaKernels, DeviceTensor};
use super::matmul::{shared_bytes, THREADS};
use cudarc::driver::CudaStream;
use weft_ops::quant::vec_dot_type;
use weft_ops::{DType, OpError, OpNode};

const OP: &str = "matmul_id";

/// The tiles of fast/matmul_id.cu: (name part, weight rows, pairs).
const TILES: [(&str, usize, usize); 2] = [("w2n4", 64, 64), ("w2n2", 64, 32)];

macro_rules! tile_names {
    ($($f:literal),*) => {
        &["mqid_route", $(concat!("mqid_", $f, "_w2n4"), concat!("mqid_", $f, "_w2n2")),*]
    };
}

pub(in crate::cuda) const KERNELS: &[&str] =
    tile_names!("q4_0", "q4_1", "q5_0", "q8_0", "q4_k", "q6_k", "q2_k", "iq2_xxs", "mxfp4");

/// Fewest pairs per expert, on average, that the grouped product takes.
pub(in crate::cuda) const MIN_PAIRS_PER_EXPERT: usize = 4;
/// Fewest pairs in all (below this the exact tiles of four are as good).
const MIN_PAIRS: usize = 64;
/// Most experts the routing block counts in shared memory (three ints
/// each).
const MAX_EXPERTS: usize = 2048;
/// Threads of the routing block (`MQID_ROUTE_THREADS`).
const ROUTE_THREADS: u32 = 1024;

/// The dense product's formats and the expert formats of DeepSeek-V4's
/// files.
fn format_name(w: DType) -> Option<&'static str> {
    super::matmul::format_name(w).or(match w {
        DType::Q2_K => Some("q2_k"),
        DType::IQ2_XXS => Some("iq2_xxs"),
        DType::MXFP4 => Some("mxfp4"),
        _ => None,
    })
}

/// Scale slots per chunk (Q2_K's two half offsets take four).
fn slots(w: DType) -> usize {
    if w == DType::Q2_K {
        4
    } else {
        2
    }
}

/// How one node runs grouped.
#[derive(Clone, Debug, PartialEq)]
pub(in crate::cuda) struct Grouped {
    name: &'static str,
    act: DType,
    experts: usize,
    m: usize,
    k: usize,
    pairs: usize,
    slots: usize,
    x_rows: usize,
    x_per_pair: bool,
    /// Bytes of the quantized activations (the table follows, 16-aligned).
    act_bytes: usize,
    /// Tiles the table has room for (the most the routing can give).
    max_tiles: usize,
}

impl Grouped {
    /// The grouped plan of a `MatMulId` node (f32 activations, i32 ids,
    /// already checked by the exact plan), or `None` when it stays exact.
    pub(in crate::cuda) fn of(node: &OpNode) -> Option<Grouped> {
        let (x, w, ids) = (&node.inputs[0], &node.inputs[1], &node.inputs[2]);
        let name = format_name(w.dtype)?;
        let dims = w.shape.dims();
        let (experts, m, k) = (dims[0], dims[1], dims[2]);
        let pairs = ids.rows() * ids.cols();
        if pairs < MIN_PAIRS
            || pairs < MIN_PAIRS_PER_EXPERT * experts
            || experts > MAX_EXPERTS
            || k == 0
            || !k.is_multiple_of(32)
        {
            return None;
        }
        let act = vec_dot_type(w.dtype);
        let act_bytes = act.row_bytes(k)?.checked_mul(x.rows())?;
        // The smallest tile gives the most tiles: each expert's last one
        // may be partial.
        let max_tiles = pairs.div_ceil(TILES[1].2) + experts.min(pairs);
        (max_tiles <= 65_535).then_some(Grouped {
            name,
            act,
            experts,
            m,
            k,
            pairs,
            slots: ids.cols(),
            x_rows: x.rows(),
            x_per_pair: x.rows() != ids.rows(),
            act_bytes,
            max_tiles,
        })
    }

    fn table_offset(&self) -> usize {
        self.act_bytes.next_multiple_of(16)
    }

    /// Scratch: the quantized activations, then the routing table.
    pub(in crate::cuda) fn scratch_bytes(&self) -> usize {
        self.table_offset() + 4 * (4 + 3 * self.max_tiles + 2 * self.pairs)
    }

    /// The product's tile: 64 pairs once the experts average 48.
    fn tile(&self) -> (&'static str, usize, usize) {
        if self.pairs >= 48 * self.experts {
            TILES[0]
        } else {
            TILES[1]
        }
    }

    /// Enqueues the three launches.
    ///
    /// # Safety
    /// As [`CudaKernels::launch`]; `scratch` holds [`Self::scratch_bytes`].
    pub(in crate::cuda) unsafe fn launch(
        &self,
        kernels: &CudaKernels,
        stream: &CudaStream,
        ins: &[DeviceTensor],
        out: u64,
        scratch: u64,
    ) -> Result<(), OpError> {
        let (x, w, ids) = (&ins[0], &ins[1], &ins[2]);
        if scratch == 0 || !scratch.is_multiple_of(16) {
            return Err(bad_call(
                OP,
                format!(
                    "the grouped product needs {} bytes of 16-aligned scratch, got {scratch:#x}",
                    self.scratch_bytes()
                ),
            ));
        }
        let (part, rows, tokens) = self.tile();
        let as_i32 = |v: usize, what: &str| {
            i32::try_from(v).map_err(|_| bad_call(OP, format!("{what} {v} exceeds one launch")))
        };
        let (m, k, pairs) = (
            as_i32(self.m, "rows")?,
            as_i32(self.k, "columns")?,
            as_i32(self.pairs, "pairs")?,
        );
        let expert_bytes = self
            .m
            .checked_mul(w.tensor.dtype.row_bytes(self.k).unwrap_or(0))
            .ok_or_else(|| bad_call(OP, "expert size overflows".into()))?;
        super::super::rows::quantize_into(
            kernels,
            stream,
            x.ptr,
            scratch,
            self.act,
            self.x_rows,
            self.k,
        )?;
        let table = scratch + self.table_offset() as u64;
        enqueue(
            stream,
            kernels.fns.get(OP, "mqid_route")?,
            (1, 1, 1),
            ROUTE_THREADS,
            (12 * self.experts) as u32,
            &[
                Arg::Ptr(ids.ptr),
                Arg::Ptr(out),
                Arg::Ptr(table),
                Arg::I32(pairs),
                Arg::I32(self.slots as i32),
                Arg::I32(self.x_per_pair as i32),
                Arg::I32(self.experts as i32),
                Arg::I32(m),
                Arg::I32(tokens as i32),
                Arg::I32(self.max_tiles as i32),
            ],
            OP,
        )?;
        let f = kernels.fns.get(OP, &format!("mqid_{}_{part}", self.name))?;
        enqueue(
            stream,
            f,
            (self.m.div_ceil(rows) as u32, self.max_tiles as u32, 1),
            THREADS,
            shared_bytes(rows, tokens, slots(w.tensor.dtype)) as u32,
            &[
                Arg::Ptr(w.ptr),
                Arg::Ptr(scratch),
                Arg::Ptr(out),
                Arg::Ptr(table),
                Arg::I32(m),
                Arg::I32(k),
                Arg::I32(self.max_tiles as i32),
                Arg::I32(pairs),
                Arg::U64(expert_bytes as u64),
            ],
            OP,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouped_tiles_fit_the_opt_in_shared_memory() {
        // Q2_K's four slots take 52 KiB at the large tile (the kernels are
        // given the opt-in limit, 227 KiB on an H200).
        assert_eq!(shared_bytes(64, 64, 4), 53_248);
        assert!(shared_bytes(64, 32, 2) <= 48 * 1024);
        assert!(KERNELS.contains(&"mqid_iq2_xxs_w2n2"));
        assert_eq!(KERNELS.len(), 19);
    }
}
