//! CPU kernels.
//!
//! The runtime resolves every tensor of a node to host memory
//! ([`HostTensor`]), asks [`work_items`] how many independent pieces the node
//! splits into, and runs the pieces on its threads with [`run_item`]. Pieces of
//! one node write disjoint bytes; the schedule guarantees that nodes running
//! at the same time touch no common bytes where one writes.
//!
//! One file per op family, the same names as every other backend.

mod argmax;
mod attention;
mod compress;
mod elementwise;
mod family;
mod fast;
mod fused;
pub mod glu;
mod hyper;
mod layer_norm;
mod matmul;
mod moe;
mod norm;
pub mod quant;
mod rope;
mod route;
mod rows;
pub mod simd;
mod sink_attention;
mod softmax;
mod tail_rope;

use crate::Numerics;
pub use rope::{angle_cache, angle_cache_with_factors};
use std::sync::Arc;
use weft_ops::{Op, OpError, OpNode, Tensor};

/// A tensor resolved to host memory for one run of a command buffer.
#[derive(Clone, Copy, Debug)]
pub struct HostTensor {
    /// First byte of the tensor (buffer base + tensor offset).
    pub ptr: *mut u8,
    pub tensor: Tensor,
}

// SAFETY: a HostTensor is a plain address; every dereference happens inside
// `run_item`, whose callers guarantee (through the schedule) that no other
// thread writes bytes this node touches while it runs.
unsafe impl Send for HostTensor {}
// SAFETY: as above.
unsafe impl Sync for HostTensor {}

impl HostTensor {
    /// The tensor's bytes.
    ///
    /// # Safety
    /// The memory must be live and not written by another thread meanwhile.
    pub unsafe fn bytes<'a>(&self) -> &'a [u8] {
        std::slice::from_raw_parts(self.ptr, self.tensor.bytes() as usize)
    }

    /// The tensor's values as f32 (must be an f32 tensor).
    ///
    /// # Safety
    /// As [`HostTensor::bytes`]; the pointer must be 4-byte aligned.
    pub unsafe fn f32s<'a>(&self) -> &'a [f32] {
        std::slice::from_raw_parts(self.ptr as *const f32, self.tensor.shape.elements())
    }

    /// Rows `start..start + count` of an f32 tensor, writable.
    ///
    /// # Safety
    /// No other reference to these rows may exist while the slice lives.
    pub unsafe fn f32_rows_mut<'a>(&self, start: usize, count: usize) -> &'a mut [f32] {
        let cols = self.tensor.cols();
        std::slice::from_raw_parts_mut((self.ptr as *mut f32).add(start * cols), count * cols)
    }

    /// Bytes of rows `start..start + count`, writable.
    ///
    /// # Safety
    /// No other reference to these rows may exist while the slice lives.
    pub unsafe fn row_bytes_mut<'a>(&self, start: usize, count: usize) -> &'a mut [u8] {
        let row = self.tensor.row_bytes();
        std::slice::from_raw_parts_mut(self.ptr.add(start * row), count * row)
    }
}

/// How a node's work is split: `items` pieces, each `rows_per_item` units of
/// the op's split dimension (rows, weight rows or attention rows).
#[derive(Clone, Debug)]
pub struct WorkSplit {
    pub items: usize,
    pub per_item: usize,
    pub total: usize,
    /// Where the pieces of a split reduction (fast attention over chunks
    /// of the cache) leave their partial results for the last one to
    /// combine; one per prepared node.
    partials: Option<Arc<fast::attention::Partials>>,
    /// The pieces run the op's fast-numerics kernel.
    fast: bool,
}

impl WorkSplit {
    fn new(total: usize, per_item: usize) -> Self {
        let per_item = per_item.max(1);
        Self {
            items: total.div_ceil(per_item).max(1),
            per_item,
            total,
            partials: None,
            fast: false,
        }
    }

    /// This split, marked as a fast-numerics kernel's.
    fn in_fast_numerics(self) -> Self {
        Self { fast: true, ..self }
    }

    /// `items` single-unit pieces whose results `partials` combines.
    fn with_partials(items: usize, partials: Arc<fast::attention::Partials>) -> Self {
        Self {
            partials: Some(partials),
            fast: true,
            ..Self::new(items, 1)
        }
    }

    /// Units covered by piece `item`.
    pub fn range(&self, item: usize) -> std::ops::Range<usize> {
        let start = (item * self.per_item).min(self.total);
        start..((item + 1) * self.per_item).min(self.total)
    }
}

/// Does this backend implement `node`? (Checked once per recording.)
pub fn supports(node: &OpNode) -> Result<(), OpError> {
    match &node.op {
        Op::MatMul => matmul::supports(&node.inputs[1]),
        Op::QuantizeRows => rows::supports_quantize(&node.outputs[0]),
        Op::GetRows => rows::supports_get_rows(&node.inputs[0]),
        weft_ops::family_ops!() => family::supports(node),
        // Attention splits by heads, quantize by rows, a matmul by weight
        // rows and a rope by rows: apart they use every thread, fused they
        // would run on one (the CPU runs such a node, made elsewhere, as its
        // chain).
        Op::AttentionQuantize(_)
        | Op::ProjAttention(_)
        | Op::MatMulRows { .. }
        | Op::MatMulSiluQuantize { .. } => Err(OpError::Unsupported {
            op: node.op.name(),
            what: "fusing on the CPU (its parts split their work differently)".into(),
        }),
        _ => Ok(()),
    }
}

/// How `node` splits across `threads` threads in exact numerics.
pub fn work_split(node: &OpNode, threads: usize) -> WorkSplit {
    work_split_for(node, threads, Numerics::Exact)
}

/// How `node` splits across `threads` threads in `numerics`: in fast
/// numerics an op with a fast kernel gets that kernel's split, which
/// [`run_item`] then follows.
pub fn work_split_for(node: &OpNode, threads: usize, numerics: Numerics) -> WorkSplit {
    if numerics == Numerics::Fast {
        if let Op::Attention(p) = &node.op {
            let q_rows = node.inputs[0].rows();
            if fast::attention::applies(q_rows, p) {
                return fast::attention::split(q_rows, node.inputs[1].rows(), p, threads);
            }
            if p.kv_heads > 0 && p.heads.is_multiple_of(p.kv_heads) {
                return fast::attention_prefill::split(q_rows, p).in_fast_numerics();
            }
        }
    }
    let threads = threads.max(1);
    let rows = node.inputs.first().map_or(1, |t| t.rows());
    match &node.op {
        Op::MatMul => matmul::split(&node.inputs[0], &node.inputs[1], threads),
        Op::Attention(p) => attention::split(node.inputs[0].rows(), p, threads),
        Op::Write { .. }
        | Op::AttentionQuantize(_)
        | Op::ProjAttention(_)
        | Op::MatMulRows { .. }
        | Op::MatMulSiluQuantize { .. } => WorkSplit::new(1, 1),
        Op::GetRows => WorkSplit::new(
            node.outputs[0].rows(),
            rows_per_item(node.outputs[0].rows(), threads),
        ),
        Op::SetRows { .. }
        | Op::Copy
        | Op::QuantizeRows
        | Op::RmsNorm { .. }
        | Op::Rope(_)
        | Op::RopeFactors(_)
        | Op::MoeTopK { .. }
        | Op::MoeGather { .. }
        | Op::Softmax { .. }
        | Op::Argmax => WorkSplit::new(rows, rows_per_item(rows, threads)),
        Op::Add | Op::Mul | Op::Scale { .. } | Op::SiluMul => {
            elementwise::split(&node.inputs[0], threads)
        }
        Op::Gelu | Op::GeluMul => glu::split(&node.inputs[0], threads),
        Op::LayerNorm { .. } => WorkSplit::new(rows, rows_per_item(rows, threads)),
        weft_ops::family_ops!() => family::split(node, threads),
        Op::RmsNormQuantize { .. }
        | Op::SiluMulQuantize
        | Op::RopeSetRows { .. }
        | Op::AddRmsNormQuantize { .. }
        | Op::NormAddRmsNormQuantize { .. } => WorkSplit::new(rows, rows_per_item(rows, threads)),
    }
}

fn rows_per_item(rows: usize, threads: usize) -> usize {
    rows.div_ceil(threads * 4).max(1)
}

/// Runs piece `item` of `node` (split by `split`).
///
/// # Safety
/// `ins` and `outs` point at live memory holding `node`'s tensors, and no
/// other thread writes the bytes this node reads or touches the bytes this
/// piece writes while it runs.
pub unsafe fn run_item(
    node: &OpNode,
    ins: &[HostTensor],
    outs: &[HostTensor],
    split: &WorkSplit,
    item: usize,
) -> Result<(), OpError> {
    let units = split.range(item);
    if units.is_empty() {
        return Ok(());
    }
    let out = &outs[0];
    match &node.op {
        Op::GetRows => rows::get_rows(&ins[0], &ins[1], out, units),
        Op::QuantizeRows => rows::quantize(&ins[0], out, units),
        Op::MatMul => matmul::matmul(&ins[0], &ins[1], out, units),
        Op::RmsNorm { eps } => {
            norm::rms_norm(&ins[0], &ins[1], out, *eps, units);
            Ok(())
        }
        Op::Add => elementwise::binary(&ins[0], &ins[1], out, units, |a, b| a + b),
        Op::Mul => elementwise::binary(&ins[0], &ins[1], out, units, |a, b| a * b),
        Op::Scale { factor } => elementwise::scale(&ins[0], out, *factor, units),
        Op::SiluMul => elementwise::silu_mul(&ins[0], &ins[1], out, units),
        Op::Gelu => {
            glu::gelu_rows(&ins[0], out, units);
            Ok(())
        }
        Op::GeluMul => {
            glu::gelu_mul_rows(&ins[0], &ins[1], out, units);
            Ok(())
        }
        Op::LayerNorm { eps } => {
            layer_norm::layer_norm(&ins[0], &ins[1], &ins[2], out, *eps, units);
            Ok(())
        }
        Op::Rope(p) => {
            rope::rope(&ins[0], &ins[1], None, out, p, units);
            Ok(())
        }
        Op::RopeFactors(p) => {
            rope::rope(&ins[0], &ins[1], Some(&ins[2]), out, p, units);
            Ok(())
        }
        Op::MoeTopK { k } => {
            route::top_k(&ins[0], out, *k, units);
            Ok(())
        }
        Op::MoeGather { normalize } => route::gather(&ins[0], &ins[1], out, *normalize, units),
        Op::Softmax { scale } => {
            softmax::softmax(&ins[0], out, *scale, units);
            Ok(())
        }
        Op::Attention(p) => match (&split.partials, split.fast) {
            (Some(parts), _) => {
                fast::attention::attention(&ins[0], &ins[1], &ins[2], out, p, parts, units)
            }
            (None, true) => {
                fast::attention_prefill::attention(&ins[0], &ins[1], &ins[2], out, p, units);
                Ok(())
            }
            (None, false) => attention::attention(&ins[0], &ins[1], &ins[2], out, p, units),
        },
        Op::SetRows { start, ring } => rows::set_rows(&ins[0], out, *start, *ring, units),
        Op::Argmax => {
            argmax::argmax(&ins[0], out, units);
            Ok(())
        }
        Op::Copy => rows::copy(&ins[0], out, units),
        Op::RmsNormQuantize { .. }
        | Op::SiluMulQuantize
        | Op::RopeSetRows { .. }
        | Op::AddRmsNormQuantize { .. }
        | Op::NormAddRmsNormQuantize { .. } => fused::run(node, ins, outs, units).map(|_| ()),
        Op::AttentionQuantize(_)
        | Op::ProjAttention(_)
        | Op::MatMulRows { .. }
        | Op::MatMulSiluQuantize { .. } => fused::run_whole(node, ins, outs),
        weft_ops::family_ops!() => family::run_item(node, ins, outs, units),
        Op::Write { data } => {
            out.row_bytes_mut(0, out.tensor.rows())
                .copy_from_slice(data);
            Ok(())
        }
    }
}
