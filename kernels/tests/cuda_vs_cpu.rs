//! The CUDA kernels against weft's CPU kernels, on fresh random inputs.
//!
//! Every op on the SmolLM2 path must give the CPU's bits exactly (the CPU
//! kernels reproduce llama.cpp's x86 arithmetic, and activations are
//! re-quantized to 8 bits before every matmul, so any deviation cascades).
//! The other formats follow the CPU's order too and are checked bit for bit
//! as well; the stated exceptions (soft-capped attention, rope positions
//! past the angle table) are checked against a tolerance.
//!
//! Without a GPU every test prints why and passes; `WEFT_TEST_REQUIRE_CUDA=1`
//! makes that a failure (the device script sets it).

#![cfg(feature = "cuda")]

mod cuda_common;

use cuda_common::*;
use weft_kernels::cuda::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use weft_kernels::cuda::DeviceTensor;
use weft_ops::quant::vec_dot_type;
use weft_ops::reference::HostMemory;
use weft_ops::{AttentionParams, DType, Op, RopeMode, RopeParams, Tensor};
use weft_testkit::host::quantized;

#[path = "cuda_vs_cpu/attention.rs"]
mod attention;
#[path = "cuda_vs_cpu/graphs.rs"]
mod graphs;
#[path = "cuda_vs_cpu/matmul.rs"]
mod matmul;
#[path = "cuda_vs_cpu/rows_norms.rs"]
mod rows_norms;

/// `rows` rows of random weights in `dtype`.
fn weights(rng: &mut Rng, mem: &mut HostMemory, dtype: DType, rows: usize, k: usize) -> Tensor {
    let mut bytes = Vec::with_capacity(dtype.row_bytes(k).unwrap() * rows);
    for _ in 0..rows {
        let row = rng.rows(1, k);
        bytes.extend(quantized(dtype, &row));
    }
    mem.tensor(dtype, &[rows, k], &bytes).unwrap()
}

/// Plain causal attention (scale 1/8) at `qp` over a cache of `capacity` rows.
fn decode_params(heads: usize, kvh: usize, d: usize, qp: u32, capacity: usize) -> AttentionParams {
    AttentionParams {
        heads,
        kv_heads: kvh,
        head_dim: d,
        scale: 0.125,
        q_position: qp,
        window: None,
        ring: None,
        softcap: 0.0,
        kv_capacity: capacity as u32,
        flash: true,
    }
}
