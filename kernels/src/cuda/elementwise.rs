//! Elementwise kernels on CUDA: add, mul, scale, silu_mul, gelu, gelu_mul.

use super::launch::{
    bad_call, blocks_for, check_aligned, check_arity, launch as enqueue, Arg, BLOCK,
};
use super::{CudaKernels, DeviceTensor};
use cudarc::driver::CudaStream;
use weft_ops::{Op, OpError, OpNode};

pub(super) const KERNELS: &[&str] = &[
    "add_f32",
    "mul_f32",
    "scale_f32",
    "silu_mul_f32",
    "gelu_f32",
    "gelu_mul_f32",
    "test_glibc_expf",
    "test_v_expf",
    "test_grid_barrier",
];

/// # Safety
/// See [`CudaKernels::launch`].
pub(super) unsafe fn launch(
    kernels: &CudaKernels,
    stream: &CudaStream,
    node: &OpNode,
    ins: &[DeviceTensor],
    outs: &[DeviceTensor],
) -> Result<(), OpError> {
    let op = node.op.name();
    let unary = matches!(node.op, Op::Scale { .. } | Op::Gelu);
    check_arity(op, ins, outs, if unary { 1 } else { 2 })?;
    for t in ins.iter().chain(outs) {
        check_aligned(op, t, 4)?;
    }
    let (a, out) = (&ins[0], &outs[0]);
    let count = a.tensor.shape.elements() as u64;
    let grid = (blocks_for(count), 1, 1);
    let table = || -> Result<u64, OpError> {
        kernels.gelu_table_ptr().ok_or_else(|| {
            bad_call(
                op,
                "the GELU table is not uploaded: call prepare() first".into(),
            )
        })
    };
    let (name, args) = match &node.op {
        Op::Add | Op::Mul => {
            let b = &ins[1];
            let broadcast = b.tensor.rows() == 1 && a.tensor.rows() != 1;
            let name = if matches!(node.op, Op::Add) {
                "add_f32"
            } else {
                "mul_f32"
            };
            (
                name,
                vec![
                    Arg::Ptr(a.ptr),
                    Arg::Ptr(b.ptr),
                    Arg::Ptr(out.ptr),
                    Arg::U64(count),
                    Arg::I32(a.tensor.cols() as i32),
                    Arg::I32(broadcast as i32),
                ],
            )
        }
        Op::Scale { factor } => (
            "scale_f32",
            vec![
                Arg::Ptr(a.ptr),
                Arg::Ptr(out.ptr),
                Arg::U64(count),
                Arg::F32(*factor),
            ],
        ),
        Op::SiluMul => (
            "silu_mul_f32",
            vec![
                Arg::Ptr(a.ptr),
                Arg::Ptr(ins[1].ptr),
                Arg::Ptr(out.ptr),
                Arg::U64(count),
            ],
        ),
        Op::Gelu => (
            "gelu_f32",
            vec![
                Arg::Ptr(a.ptr),
                Arg::Ptr(out.ptr),
                Arg::U64(count),
                Arg::Ptr(table()?),
            ],
        ),
        Op::GeluMul => (
            "gelu_mul_f32",
            vec![
                Arg::Ptr(a.ptr),
                Arg::Ptr(ins[1].ptr),
                Arg::Ptr(out.ptr),
                Arg::U64(count),
                Arg::Ptr(table()?),
            ],
        ),
        _ => return Err(bad_call(op, "not an elementwise op".into())),
    };
    let f = kernels.fns.get(op, name)?;
    enqueue(stream, f, grid, BLOCK, 0, &args, op)
}
