//! CUDA kernels (feature `cuda`).
//!
//! The CUDA C sources (`*.cu` beside this file, one per op family with the
//! same names as `cpu/`) are compiled at run time with NVRTC for the
//! device's architecture, once per process, and loaded into a
//! [`CudaKernels`] per context. The runtime owns buffers, streams and graphs;
//! this module only enqueues kernels:
//!
//! - [`CudaKernels::supports`] says whether a node runs here;
//! - [`CudaKernels::scratch_bytes`] how much device scratch a launch needs;
//! - [`CudaKernels::step_scalars`] which values change from one decode step
//!   to the next (read by the kernels from device memory, so a captured
//!   CUDA graph replays without recapture);
//! - [`CudaKernels::prepare`] one-time uploads (rope angle tables, the GELU
//!   table), outside graph capture;
//! - [`CudaKernels::launch`] enqueues a node's kernels: no allocation, no
//!   host synchronisation, capturable.
//!
//! **Numerics.** On the SmolLM2 path (Q4_1 and Q8_0 products, Q8 activation
//! quantizers, rms_norm, rope, silu_mul, the three flash-attention
//! variants, f16 cache writes, argmax, add/mul/scale) the kernels compute
//! the same bits as the CPU kernels, which reproduce llama.cpp's x86
//! arithmetic: every fused multiply-add is written out (NVRTC runs with
//! `--fmad=false`), glibc's `expf` and ggml's `ggml_v_expf` are ported, the
//! f64 sums of rms_norm and softmax are reproduced exactly (a tree sum whose
//! error bound fixes the f32 result, or in order by one lane where it
//! cannot).
//! The other weight formats follow the CPU's order too. Exceptions:
//! soft-capped attention scores (CUDA's `tanhf`) and rope positions past the
//! uploaded table (CUDA's `cosf`/`sinf`) are within a few ulp, not
//! bit-exact. `docs/cuda.md` describes each kernel family.
//!
//! On compute capability 9.0 and later every kernel is launched with
//! programmatic dependent launch: its launch overlaps the tail of the one
//! before it. [`CudaKernels::new`] takes the folder where compiled PTX is
//! kept between processes, if any.

mod argmax;
mod attention;
mod compress;
mod elementwise;
mod family;
mod fast;
mod fused;
mod hyper;
mod launch;
mod matmul;
mod matmul_id;
mod module;
mod moe;
mod norm;
mod proj_attention;
mod rope;
mod rows;
mod sink_attention;
mod softmax;
mod tail_rope;

pub use cudarc;
pub use matmul::{GroupMember, GROUP_MAX};
pub use rope::TABLE_POSITIONS as ROPE_TABLE_POSITIONS;

use crate::Numerics;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use launch::{bad_call, driver_error};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use weft_ops::{Op, OpError, OpNode, Tensor};

/// Whether CUDA can run here: `Ok` when the driver library loads and at
/// least one device exists, otherwise the reason in plain words.
pub fn driver_status() -> Result<(), String> {
    // SAFETY: only probes whether the shared library can be opened.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("the CUDA driver library (libcuda.so) was not found on this machine".into());
    }
    let count = std::panic::catch_unwind(CudaContext::device_count)
        .map_err(|_| "the CUDA driver library could not be used".to_string())?
        .map_err(|e| format!("the CUDA driver reports an error: {e}"))?;
    if count < 1 {
        return Err("the CUDA driver found no GPU".into());
    }
    Ok(())
}

const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<CudaKernels>();
};

/// A tensor resolved to device memory: the address of its first byte.
#[derive(Clone, Copy, Debug)]
pub struct DeviceTensor {
    /// `CUdeviceptr` of the tensor's first byte (buffer base + tensor offset).
    pub ptr: u64,
    pub tensor: Tensor,
    /// Nothing writes any of the tensor's bytes while the kernel may run (a
    /// weight; the runtime marks buffers no command buffer has written): a
    /// kernel may read it before waiting on the kernels launched before it
    /// (programmatic dependent launch), overlapping their work. `false` is
    /// always safe.
    pub constant: bool,
}

/// The compiled kernels of one CUDA context, plus the tables they read.
pub struct CudaKernels {
    ctx: Arc<CudaContext>,
    fns: module::Functions,
    rope_tables: Mutex<HashMap<rope::TableKey, rope::Table>>,
    gelu: OnceLock<CudaSlice<u16>>,
    /// Dynamic shared memory the kernels of `matmul::LARGE_SHARED` and
    /// `attention::LARGE_SHARED` may use.
    large_shared_limit: usize,
    /// Whether launches may take the fast kernels (`fast/`).
    numerics: Numerics,
    /// The device's multiprocessors (the split attention's grid).
    sms: usize,
}

impl CudaKernels {
    /// Compiles (once per process and architecture, or reads from
    /// `ptx_cache`, a folder that keeps compiled PTX between processes) and
    /// loads every kernel, launching the exact ones.
    pub fn new(
        ctx: Arc<CudaContext>,
        ptx_cache: Option<&std::path::Path>,
    ) -> Result<Self, OpError> {
        Self::with_numerics(ctx, ptx_cache, Numerics::Exact)
    }

    /// As [`new`](Self::new), launching the kernels of `numerics`: under
    /// [`Numerics::Fast`] a node with a fast kernel (`fast/`) runs that one.
    pub fn with_numerics(
        ctx: Arc<CudaContext>,
        ptx_cache: Option<&std::path::Path>,
        numerics: Numerics,
    ) -> Result<Self, OpError> {
        let names: Vec<&'static str> = [
            argmax::KERNELS,
            attention::KERNELS,
            elementwise::KERNELS,
            fused::KERNELS,
            matmul::KERNELS,
            matmul::GROUP_KERNELS,
            matmul::SILU_KERNELS,
            norm::KERNELS,
            proj_attention::KERNELS,
            proj_attention::SPLIT_KERNELS,
            fast::attention::KERNELS,
            fast::matmul::KERNELS,
            fast::matmul_half::KERNELS,
            fast::matmul_id::KERNELS,
            fast::attention_prefill::KERNELS,
            rope::KERNELS,
            rows::KERNELS,
            softmax::KERNELS,
            &family::kernels(),
        ]
        .concat();
        let fns = module::Functions::load(&ctx, &names, ptx_cache)?;
        let optin = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .map_err(|e| driver_error("cuda", "reading the shared-memory limit", e))?
            .max(48 * 1024) as usize;
        for &name in matmul::LARGE_SHARED
            .iter()
            .chain(matmul::GROUP_KERNELS)
            .chain(attention::LARGE_SHARED)
            .chain(fast::attention_prefill::KERNELS)
            .chain(fast::matmul_id::KERNELS)
            .chain(proj_attention::KERNELS)
            .chain(proj_attention::SPLIT_KERNELS)
        {
            // Static and dynamic shared memory together stay within the limit.
            let f = fns.get("matmul", name)?;
            let fixed = f
                .shared_size_bytes()
                .map_err(|e| driver_error("matmul", "reading static shared memory", e))?;
            f.set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                optin as i32 - fixed,
            )
            .map_err(|e| driver_error("matmul", "raising the shared-memory limit", e))?;
        }
        let sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(|e| driver_error("cuda", "reading the multiprocessor count", e))?
            .max(1) as usize;
        Ok(CudaKernels {
            ctx,
            fns,
            rope_tables: Mutex::new(HashMap::new()),
            gelu: OnceLock::new(),
            large_shared_limit: optin,
            numerics,
            sms,
        })
    }

    /// The numerics mode the launches follow.
    pub fn numerics(&self) -> Numerics {
        self.numerics
    }

    /// The split attention's shape for `node` when its launch takes it
    /// (numerics `fast`, a decode step's few query rows).
    fn split_attention(&self, node: &OpNode) -> Option<fast::attention::SplitShape> {
        if self.numerics != Numerics::Fast {
            return None;
        }
        let (p, rows) = match &node.op {
            Op::Attention(p) | Op::AttentionQuantize(p) => (p, node.inputs[0].rows()),
            Op::ProjAttention(p) => (&p.attn, 1),
            _ => return None,
        };
        fast::attention::takes(p, rows)
            .then(|| fast::attention::SplitShape::new(p, rows, node.inputs[1].rows(), self.sms))
    }

    /// The context the kernels were loaded into.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Does this backend run `node`? (Checked once per recording.)
    pub fn supports(&self, node: &OpNode) -> Result<(), OpError> {
        let f32_inputs = || match node.inputs.iter().find(|t| t.dtype != weft_ops::DType::F32) {
            None => Ok(()),
            Some(t) => Err(launch::unsupported(
                node.op.name(),
                format!("{} inputs", t.dtype),
            )),
        };
        if family::owns(&node.op) {
            return family::supports(node);
        }
        match &node.op {
            Op::MatMul => matmul::supports(node),
            Op::QuantizeRows => rows::supports_quantize(&node.outputs[0]),
            Op::GetRows => rows::supports_get_rows(&node.inputs[0]),
            Op::Copy => rows::supports_copy(&node.inputs[0], &node.outputs[0]),
            Op::SetRows { .. } => rows::supports_set_rows(&node.outputs[0]),
            Op::Attention(p) => attention::supports(node, p),
            Op::AttentionQuantize(p) => attention::supports_quantized(node, p),
            Op::ProjAttention(p) => proj_attention::supports(node, p, self.large_shared_limit),
            Op::MatMulRows { rope, write, bias } => {
                matmul::supports_rows(node, rope.as_ref(), *write, *bias)
            }
            Op::MatMulSiluQuantize { up } => matmul::supports_silu(node, *up),
            Op::Rope(p) => {
                if p.n_dims > p.head_dim || p.head_dim == 0 || !p.n_dims.is_multiple_of(2) {
                    return Err(launch::unsupported(
                        "rope",
                        format!("{} of {} rotated dimensions", p.n_dims, p.head_dim),
                    ));
                }
                Ok(())
            }
            Op::RmsNorm { .. }
            | Op::LayerNorm { .. }
            | Op::Add
            | Op::Mul
            | Op::Scale { .. }
            | Op::SiluMul
            | Op::Gelu
            | Op::GeluMul
            | Op::Softmax { .. }
            | Op::Argmax => f32_inputs(),
            Op::RmsNormQuantize { .. } => {
                f32_inputs()?;
                fused::supports_quantized("rms_norm_quantize", &node.outputs[0])
            }
            Op::NormAddRmsNormQuantize { .. } => {
                f32_inputs()?;
                fused::supports_norm_add_norm(node)
            }
            Op::AddRmsNormQuantize { .. } => {
                f32_inputs()?;
                fused::supports_quantized("add_rms_norm_quantize", &node.outputs[1])
            }
            Op::SiluMulQuantize => {
                f32_inputs()?;
                fused::supports_quantized("silu_mul_quantize", &node.outputs[0])
            }
            Op::RopeSetRows { rope, .. } => {
                if rope.n_dims > rope.head_dim
                    || rope.head_dim == 0
                    || !rope.n_dims.is_multiple_of(2)
                {
                    return Err(launch::unsupported(
                        "rope_set_rows",
                        format!("{} of {} rotated dimensions", rope.n_dims, rope.head_dim),
                    ));
                }
                rows::supports_set_rows(&node.outputs[0])
            }
            Op::Write { .. } => Err(launch::unsupported(
                "write",
                "host writes as kernels (the runtime stages them)".into(),
            )),
            other => Err(launch::unsupported(other.name(), "this op".into())),
        }
    }

    /// Bytes of device scratch one launch of `node` needs (0 for most ops;
    /// a matmul fed f32 activations quantizes them there).
    pub fn scratch_bytes(&self, node: &OpNode) -> usize {
        let split = self.split_attention(node);
        match &node.op {
            Op::MatMul => matmul::scratch_bytes(node),
            Op::Attention(p) | Op::AttentionQuantize(p) => split.map_or(0, |s| s.scratch_bytes(p)),
            Op::ProjAttention(p) => {
                let q = proj_attention::scratch_bytes(node);
                split.map_or(q, |s| q.next_multiple_of(256) + s.scratch_bytes(&p.attn))
            }
            op if family::owns(op) => family::scratch_bytes(self, node),
            _ => 0,
        }
    }

    /// Values the kernels read from device memory at `step` (u32s, in this
    /// order) so a captured graph can be replayed for the next step:
    /// attention `[q_position, rows of the cache view]`, set_rows and
    /// rope_set_rows `[start]`.
    pub fn step_scalars(&self, node: &OpNode) -> Vec<u32> {
        match &node.op {
            Op::Attention(p) | Op::AttentionQuantize(p) => attention::step_scalars(node, p),
            Op::ProjAttention(p) => proj_attention::step_scalars(node, p),
            Op::SetRows { start, .. } | Op::RopeSetRows { start, .. } => vec![*start],
            Op::MatMulRows { write: Some(w), .. } => vec![w.start],
            op if family::owns(op) => family::step_scalars(node),
            _ => Vec::new(),
        }
    }

    /// What a captured graph depends on: `op` with its per-step values
    /// cleared ([`Op::structural`]), which [`step_scalars`](Self::step_scalars)
    /// carries instead. Two nodes with equal structural ops replay one graph.
    pub fn structural(&self, op: &Op) -> Op {
        op.structural()
    }

    /// One-time preparation outside graph capture: uploads the rope angle
    /// table for the node's parameters, or the GELU table.
    pub fn prepare(&self, node: &OpNode, stream: &Arc<CudaStream>) -> Result<(), OpError> {
        let rope = match &node.op {
            Op::Rope(p) => Some(*p),
            _ => fused::rope_params(node),
        };
        match (&node.op, rope) {
            (_, Some(p)) => {
                let key = rope::table_key(&p);
                let mut tables = self
                    .rope_tables
                    .lock()
                    .map_err(|_| bad_call("rope", "rope table lock poisoned".into()))?;
                if let std::collections::hash_map::Entry::Vacant(slot) = tables.entry(key) {
                    slot.insert(rope::build_table(stream, &p)?);
                }
                Ok(())
            }
            (Op::Gelu | Op::GeluMul, None) => {
                if self.gelu.get().is_none() {
                    let table = stream
                        .clone_htod(crate::cpu::glu::gelu_table())
                        .map_err(|e| driver_error("gelu", "uploading the GELU table", e))?;
                    stream
                        .synchronize()
                        .map_err(|e| driver_error("gelu", "uploading the GELU table", e))?;
                    let _ = self.gelu.set(table);
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Device address and length (positions) of the rope table for `p`.
    pub(crate) fn rope_table(&self, p: &weft_ops::RopeParams) -> Option<(u64, u32)> {
        let tables = self.rope_tables.lock().ok()?;
        let t = tables.get(&rope::table_key(p))?;
        let stream = t.data.stream().clone();
        let (ptr, _sync) = t.data.device_ptr(&stream);
        Some((ptr, t.positions))
    }

    fn gelu_table_ptr(&self) -> Option<u64> {
        let t = self.gelu.get()?;
        let stream = t.stream().clone();
        let (ptr, _sync) = t.device_ptr(&stream);
        Some(ptr)
    }

    /// Enqueues `node`'s kernels on `stream`.
    ///
    /// Shapes are the node's static ones, except that for a decode replay
    /// the attention K/V views may be the whole cache (rows = capacity), the
    /// real extent being in `step`. `scratch` is the address of
    /// [`scratch_bytes`](Self::scratch_bytes) bytes (0 when none are needed);
    /// `step` the address of [`step_scalars`](Self::step_scalars) (0: use the
    /// node's own values).
    ///
    /// # Safety
    /// Every tensor's `ptr` must point at live device memory of the
    /// tensor's size in this context, `scratch` and `step` likewise; nothing
    /// else may write what the node reads, or touch what it writes, until
    /// the launch completes on `stream`.
    pub unsafe fn launch(
        &self,
        stream: &Arc<CudaStream>,
        node: &OpNode,
        ins: &[DeviceTensor],
        outs: &[DeviceTensor],
        scratch: u64,
        step: u64,
    ) -> Result<(), OpError> {
        self.launch_early(stream, node, ins, outs, scratch, step, false)
    }

    /// As [`launch`](Self::launch), `early` when the launch pass found the
    /// node followed on its stream by one that lets it start before its
    /// wait ([`launches_early`](Self::launches_early)).
    ///
    /// # Safety
    /// As [`launch`](Self::launch).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn launch_early(
        &self,
        stream: &Arc<CudaStream>,
        node: &OpNode,
        ins: &[DeviceTensor],
        outs: &[DeviceTensor],
        scratch: u64,
        step: u64,
        early: bool,
    ) -> Result<(), OpError> {
        let s: &CudaStream = stream;
        match &node.op {
            Op::GetRows => rows::get_rows(self, s, ins, outs),
            Op::QuantizeRows => rows::quantize(self, s, ins, outs),
            Op::MatMul => matmul::launch(self, s, node, ins, outs, scratch),
            Op::MatMulRows { rope, write, bias } => {
                let member = GroupMember {
                    rope: rope.as_ref(),
                    write: *write,
                    bias: *bias,
                    ins,
                    outs,
                    step,
                };
                matmul::launch_group(self, s, &[member])
            }
            Op::MatMulSiluQuantize { up } => matmul::launch_silu(self, s, *up, ins, outs),
            Op::RmsNorm { eps } => norm::rms_norm(self, s, ins, outs, *eps),
            Op::LayerNorm { eps } => norm::layer_norm(self, s, ins, outs, *eps),
            Op::Add | Op::Mul | Op::Scale { .. } | Op::SiluMul | Op::Gelu | Op::GeluMul => {
                elementwise::launch(self, s, node, ins, outs)
            }
            Op::Rope(p) => rope::launch(self, s, p, ins, outs),
            Op::Softmax { scale } => softmax::launch(self, s, ins, outs, *scale),
            Op::Attention(p) | Op::AttentionQuantize(p) => match self.split_attention(node) {
                Some(shape) => {
                    attention::launch_split(self, s, node, p, shape, ins, outs, scratch, step)
                }
                None if self.numerics == Numerics::Fast
                    && fast::attention_prefill::takes(
                        p,
                        node.inputs[0].rows(),
                        node.inputs[1].dtype,
                        node.outputs[0].dtype,
                    )
                    && fast::attention_prefill::shared_bytes(p.head_dim)
                        <= self.large_shared_limit =>
                {
                    attention::launch_prefill_fast(self, s, node, p, ins, outs, step)
                }
                None => attention::launch(self, s, node, p, ins, outs, step),
            },
            Op::ProjAttention(p) => {
                let split = self.split_attention(node);
                proj_attention::launch(self, s, node, p, ins, outs, scratch, step, split)
            }
            Op::SetRows { start, ring } => rows::set_rows(self, s, ins, outs, *start, *ring, step),
            Op::Argmax => argmax::launch(self, s, ins, outs),
            Op::Copy => rows::copy(self, s, ins, outs),
            Op::RmsNormQuantize { eps } => {
                fused::rms_norm_quantize(self, s, ins, outs, *eps, early)
            }
            Op::NormAddRmsNormQuantize { eps_b, eps } => {
                fused::norm_add_norm_quantize(self, s, ins, outs, *eps_b, *eps)
            }
            Op::AddRmsNormQuantize { eps } => {
                fused::add_rms_norm_quantize(self, s, ins, outs, *eps, early)
            }
            Op::SiluMulQuantize => fused::silu_mul_quantize(self, s, ins, outs),
            Op::RopeSetRows { rope, start, ring } => {
                fused::rope_set_rows(self, s, rope, *start, *ring, ins, outs, step)
            }
            op if family::owns(op) => family::launch(self, s, node, ins, outs, scratch, step),
            other => Err(launch::unsupported(other.name(), "this op".into())),
        }
    }

    /// How many nodes of `node`'s [`OpNode::shared_launch_key`] one
    /// [`launch_group`](Self::launch_group) takes: [`GROUP_MAX`] for a
    /// `matmul_rows` node and a decode matmul whose activation row is
    /// already in the weights' dot type (32-element formats), 1 (launched
    /// alone) for every other node.
    pub fn shared_launch_limit(&self, node: &OpNode) -> usize {
        if matmul::groups(node) {
            GROUP_MAX
        } else {
            1
        }
    }

    /// Whether a norm followed on its stream by `next` alone launches
    /// before its wait: a decode norm followed by the fused attention
    /// (`qkv+attention+quantize`), so the fused kernel's weight and cache
    /// copies overlap the kernel before the norm (the fused kernel reads
    /// nothing before its wait that a running kernel writes). Elsewhere
    /// an early launch was measured no faster, so only there.
    pub fn launches_early(&self, node: &OpNode, next: &OpNode) -> bool {
        matches!(
            node.op,
            Op::RmsNormQuantize { .. } | Op::AddRmsNormQuantize { .. }
        ) && matches!(next.op, Op::ProjAttention(_))
    }

    /// Launches up to [`GROUP_MAX`] nodes of one [`OpNode::shared_launch_key`]
    /// whose [`shared_launch_limit`](Self::shared_launch_limit) is above 1
    /// as one kernel, each computed exactly as its own launch computes it.
    /// Needs no scratch.
    ///
    /// # Safety
    /// As [`launch`](Self::launch), for every member.
    pub unsafe fn launch_group(
        &self,
        stream: &Arc<CudaStream>,
        members: &[GroupMember],
    ) -> Result<(), OpError> {
        matmul::launch_group(self, stream, members)
    }
}

/// Test hooks: the numeric building blocks on their own (synchronous,
/// allocating; never inside a graph).
#[doc(hidden)]
pub mod testing {
    use super::launch::{blocks_for, driver_error, launch, Arg, BLOCK};
    use super::CudaKernels;
    use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};
    use std::sync::Arc;
    use weft_ops::OpError;

    fn run_unary(
        k: &CudaKernels,
        stream: &Arc<CudaStream>,
        name: &'static str,
        xs: &[f32],
    ) -> Result<Vec<f32>, OpError> {
        let err = |e| driver_error("test", name, e);
        let x = stream.clone_htod(xs).map_err(err)?;
        let mut y = stream.alloc_zeros::<f32>(xs.len()).map_err(err)?;
        {
            let (xp, _a) = x.device_ptr(stream);
            let (yp, _b) = y.device_ptr_mut(stream);
            // SAFETY: both buffers hold xs.len() floats.
            unsafe {
                launch(
                    stream,
                    k.fns.get("test", name)?,
                    (blocks_for(xs.len() as u64), 1, 1),
                    BLOCK,
                    0,
                    &[Arg::Ptr(xp), Arg::Ptr(yp), Arg::U64(xs.len() as u64)],
                    "test",
                )?;
            }
        }
        stream.clone_dtoh(&y).map_err(err)
    }

    /// The device port of glibc's `expf` over `xs`.
    pub fn glibc_expf(
        k: &CudaKernels,
        stream: &Arc<CudaStream>,
        xs: &[f32],
    ) -> Result<Vec<f32>, OpError> {
        run_unary(k, stream, "test_glibc_expf", xs)
    }

    /// The device port of ggml's `ggml_v_expf` over `xs`.
    pub fn v_expf(
        k: &CudaKernels,
        stream: &Arc<CudaStream>,
        xs: &[f32],
    ) -> Result<Vec<f32>, OpError> {
        run_unary(k, stream, "test_v_expf", xs)
    }

    /// The device's exact reproduction of `let mut s = 0.0; for t in ts { s += t }`,
    /// and whether it took its sequential fallback.
    pub fn seq_sum(
        k: &CudaKernels,
        stream: &Arc<CudaStream>,
        ts: &[f64],
    ) -> Result<(f64, bool), OpError> {
        run_sum_hook(k, stream, "test_seq_sum", ts)
    }

    /// `(s / n) as f32` for the sequential sum `s` of `ts` (n terms) by the
    /// bounded method, and whether it fell back to summing in order.
    pub fn bounded_mean(
        k: &CudaKernels,
        stream: &Arc<CudaStream>,
        ts: &[f64],
    ) -> Result<(f32, bool), OpError> {
        let (m, fell_back) = run_sum_hook(k, stream, "test_bounded_mean", ts)?;
        Ok((m as f32, fell_back))
    }

    /// Microseconds per grid-wide wait of `blocks` blocks of 64 threads
    /// (common.cu's `test_grid_barrier`), from two runs of `rounds` and
    /// `2 * rounds` waits (their difference cancels the launch). `blocks`
    /// must all be resident at once (at most one per SM is safe).
    pub fn grid_barrier_us(
        k: &CudaKernels,
        stream: &Arc<CudaStream>,
        blocks: u32,
        rounds: i32,
    ) -> Result<f64, OpError> {
        let err = |e| driver_error("test", "grid barrier", e);
        let run = |n: i32| -> Result<f64, OpError> {
            let mut counter = stream.alloc_zeros::<u32>(1).map_err(err)?;
            stream.synchronize().map_err(err)?;
            let t = std::time::Instant::now();
            {
                let (cp, _c) = counter.device_ptr_mut(stream);
                // SAFETY: `counter` holds one u32; every block is resident.
                unsafe {
                    launch(
                        stream,
                        k.fns.get("test", "test_grid_barrier")?,
                        (blocks, 1, 1),
                        64,
                        0,
                        &[Arg::Ptr(cp), Arg::I32(n)],
                        "test",
                    )?;
                }
            }
            stream.synchronize().map_err(err)?;
            Ok(t.elapsed().as_secs_f64() * 1e6)
        };
        let (one, two) = (run(rounds)?, run(2 * rounds)?);
        Ok((two - one) / rounds as f64)
    }

    /// Runs a one-warp sum hook: `name(ts, out, n)` writes a value and a
    /// fallback flag as two doubles.
    fn run_sum_hook(
        k: &CudaKernels,
        stream: &Arc<CudaStream>,
        name: &str,
        ts: &[f64],
    ) -> Result<(f64, bool), OpError> {
        let err = |e| driver_error("test", "sum hook", e);
        let t = stream.clone_htod(ts).map_err(err)?;
        let mut out = stream.alloc_zeros::<f64>(2).map_err(err)?;
        {
            let (tp, _a) = t.device_ptr(stream);
            let (op, _b) = out.device_ptr_mut(stream);
            // SAFETY: `t` holds ts.len() doubles, `out` two.
            unsafe {
                launch(
                    stream,
                    k.fns.get("test", name)?,
                    (1, 1, 1),
                    32,
                    0,
                    &[Arg::Ptr(tp), Arg::Ptr(op), Arg::I32(ts.len() as i32)],
                    "test",
                )?;
            }
        }
        let v = stream.clone_dtoh(&out).map_err(err)?;
        Ok((v[0], v[1] != 0.0))
    }
}

#[cfg(test)]
mod tests {
    /// The CUDA sources compile with NVRTC for sm_90 and sm_80 (needs only the NVRTC
    /// library, no GPU; skipped where NVRTC is absent unless
    /// `WEFT_TEST_REQUIRE_NVRTC=1`, as CI sets it with the PyPI NVRTC). With
    /// `WEFT_CUDA_PTX_CACHE` set it goes through that cache: the file it
    /// leaves there is the one a GPU machine's first start would compile
    /// (`scripts/cuda/make-ptx-cache.sh` carries it).
    #[test]
    fn sources_compile_with_nvrtc() {
        // SAFETY: only probes whether the shared library can be opened.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            if std::env::var("WEFT_TEST_REQUIRE_NVRTC").is_ok_and(|v| v == "1") {
                panic!("WEFT_TEST_REQUIRE_NVRTC=1 but NVRTC (libnvrtc.so) cannot be loaded");
            }
            eprintln!("skipping: NVRTC (libnvrtc.so) is not installed here");
            return;
        }
        // sm_90 (the H200 the kernels are tuned on) and sm_80: the cluster
        // kernels must still compile where clusters do not exist.
        // `WEFT_TEST_NVRTC_ARCHS` (comma-separated) narrows the list, as
        // scripts/cuda/make-ptx-cache.sh does to sm_90, which also names
        // the folder the PTX is written to (`WEFT_CUDA_PTX_CACHE`).
        let archs = std::env::var("WEFT_TEST_NVRTC_ARCHS").unwrap_or("sm_90,sm_80".into());
        let cache = std::env::var_os("WEFT_CUDA_PTX_CACHE").map(std::path::PathBuf::from);
        for arch in archs.split(',').map(str::trim).filter(|a| !a.is_empty()) {
            if let Err(e) = super::module::ptx_for(arch, cache.as_deref()) {
                panic!("NVRTC ({arch}): {e}");
            }
        }
    }
}
