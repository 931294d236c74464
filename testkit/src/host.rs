//! Host tensors for op tests: random values encoded in any weight format,
//! validated nodes, and one node run by the CPU kernels (through the work
//! split, as the thread pool runs it) or by the reference semantics.

use weft_kernels::cpu::{self, HostTensor};
use weft_kernels::Numerics;
use weft_ops::quant::quantize_row;
use weft_ops::reference::{self, HostMemory};
use weft_ops::{DType, Op, OpError, OpNode, Tensor};

/// A node of `op`, checked by its shape and dtype rules.
pub fn node(op: Op, inputs: Vec<Tensor>, outputs: Vec<Tensor>) -> OpNode {
    let n = OpNode::new(op, inputs, outputs);
    n.validate()
        .unwrap_or_else(|e| panic!("invalid {} node: {e}", n.op.name()));
    n
}

/// One row of values encoded in `dtype` by the reference quantizer.
pub fn quantized(dtype: DType, x: &[f32]) -> Vec<u8> {
    let mut q = vec![0u8; dtype.row_bytes(x.len()).expect("whole blocks")];
    quantize_row(dtype, x, &mut q).expect("quantize");
    q
}

/// A tensor of `dims` in `dtype` holding `values` (row-major, rows of the
/// last dimension), each row encoded by [`quantized`].
pub fn encoded_tensor(
    mem: &mut HostMemory,
    dtype: DType,
    dims: &[usize],
    values: &[f32],
) -> Tensor {
    let k = dims.last().copied().unwrap_or(1).max(1);
    let bytes: Vec<u8> = values
        .chunks(k)
        .flat_map(|row| quantized(dtype, row))
        .collect();
    mem.tensor(dtype, dims, &bytes).expect("tensor")
}

/// Runs `node` with the CPU kernels (exact numerics) on a copy of `mem`,
/// its work split as for `threads` threads, the items one after another and
/// last first (a kernel whose items depend on each other shows).
pub fn run_cpu(node: &OpNode, mem: &HostMemory, threads: usize) -> HostMemory {
    run_cpu_in(node, mem, threads, Numerics::Exact)
}

/// As [`run_cpu`], in `numerics`.
pub fn run_cpu_in(
    node: &OpNode,
    mem: &HostMemory,
    threads: usize,
    numerics: Numerics,
) -> HostMemory {
    try_run_cpu(node, mem, threads, numerics)
        .unwrap_or_else(|e| panic!("cpu kernel of {}: {e}", node.op.name()))
}

/// As [`run_cpu_in`], returning the first kernel error instead of panicking.
pub fn try_run_cpu(
    node: &OpNode,
    mem: &HostMemory,
    threads: usize,
    numerics: Numerics,
) -> Result<HostMemory, OpError> {
    let mut out = mem.clone();
    let resolve = |m: &mut HostMemory, t: &Tensor| HostTensor {
        ptr: m
            .bytes_mut(&Tensor { offset: 0, ..*t })
            .as_mut_ptr()
            .wrapping_add(t.offset as usize),
        tensor: *t,
    };
    let ins: Vec<HostTensor> = node.inputs.iter().map(|t| resolve(&mut out, t)).collect();
    let outs: Vec<HostTensor> = node.outputs.iter().map(|t| resolve(&mut out, t)).collect();
    let split = cpu::work_split_for(node, threads, numerics);
    for item in (0..split.items).rev() {
        // SAFETY: single-threaded; the tensors live in `out`, which outlives the loop.
        unsafe { cpu::run_item(node, &ins, &outs, &split, item) }?;
    }
    Ok(out)
}

/// Runs `node` with the reference semantics on a copy of `mem`.
pub fn run_ref(node: &OpNode, mem: &HostMemory) -> HostMemory {
    let mut out = mem.clone();
    reference::run(node, &mut out).unwrap_or_else(|e| panic!("reference {}: {e}", node.op.name()));
    out
}
