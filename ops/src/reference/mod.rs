//! Reference semantics: plain, obviously-correct implementations of every op
//! over host memory. Backends are tested against these on random inputs.
//!
//! Numerics are "the maths", not any backend's shortcuts: f32 values, f64
//! where a long sum would otherwise dominate the error.
//!
//! [`run`] executes one node on a [`HostMemory`]; [`Interpreter`] is a
//! [`Recorder`](crate::Recorder) that runs every builder call at once.

mod attention;
mod compress;
mod elementwise;
mod family;
mod hyper;
mod interpreter;
mod matmul;
mod matmul_id;
mod moe;
mod norm;
mod rope;
mod route;
mod rows;
mod sink_attention;
mod tail_rope;

use crate::dtype::DType;
use crate::op::{Op, OpNode};
use crate::tensor::{Shape, Tensor};
use crate::OpError;
use weft_graph::BufferId;

pub use compress::{compress_slots, select_top_k};
pub use hyper::hc_mix_row;
pub use interpreter::Interpreter;
pub use moe::{route_top_k, sqrt_softplus, swiglu_clamp};
pub use rope::{rope_angles, rope_angles_with_factors};

/// Host buffers indexed by [`BufferId`], for reference runs and tests.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HostMemory {
    buffers: Vec<Vec<u8>>,
}

impl HostMemory {
    /// A new zeroed buffer.
    pub fn alloc(&mut self, bytes: usize) -> BufferId {
        self.buffers.push(vec![0; bytes]);
        BufferId(self.buffers.len() as u32 - 1)
    }

    /// A new buffer holding `t`'s shape and dtype, filled with `bytes`.
    pub fn tensor(
        &mut self,
        dtype: DType,
        dims: &[usize],
        bytes: &[u8],
    ) -> Result<Tensor, OpError> {
        let id = self.alloc(bytes.len());
        self.buffers[id.0 as usize].copy_from_slice(bytes);
        let t = Tensor::new(id, 0, dtype, Shape::new(dims))?;
        if t.bytes() != bytes.len() as u64 {
            return Err(OpError::Shape(format!(
                "{} bytes for {:?} of {dtype}",
                bytes.len(),
                dims
            )));
        }
        Ok(t)
    }

    /// A new f32 tensor.
    pub fn f32_tensor(&mut self, dims: &[usize], values: &[f32]) -> Result<Tensor, OpError> {
        self.tensor(DType::F32, dims, bytemuck::cast_slice(values))
    }

    /// A new zeroed tensor.
    pub fn zeros(&mut self, dtype: DType, dims: &[usize]) -> Result<Tensor, OpError> {
        let t = Tensor::new(BufferId(0), 0, dtype, Shape::new(dims))?;
        let id = self.alloc(t.bytes() as usize);
        Ok(Tensor { buffer: id, ..t })
    }

    /// The bytes of `t`.
    pub fn bytes(&self, t: &Tensor) -> &[u8] {
        &self.buffers[t.buffer.0 as usize][t.offset as usize..(t.offset + t.bytes()) as usize]
    }

    /// The bytes of `t`, writable.
    pub fn bytes_mut(&mut self, t: &Tensor) -> &mut [u8] {
        &mut self.buffers[t.buffer.0 as usize][t.offset as usize..(t.offset + t.bytes()) as usize]
    }

    /// A whole buffer.
    pub fn buffer(&self, id: BufferId) -> &[u8] {
        &self.buffers[id.0 as usize]
    }

    /// `t`'s values as f32 (f32, f16, bf16 or quantized, dequantized).
    pub fn to_f32(&self, t: &Tensor) -> Result<Vec<f32>, OpError> {
        to_f32(self.bytes(t), t.dtype, t.shape.elements())
    }

    /// `t`'s values as i32.
    pub fn to_i32(&self, t: &Tensor) -> Vec<i32> {
        bytemuck::pod_collect_to_vec(self.bytes(t))
    }

    /// Overwrites `t` with f32 `values`, converting to its float type.
    pub fn set_f32(&mut self, t: &Tensor, values: &[f32]) -> Result<(), OpError> {
        let bytes = from_f32(values, t.dtype)?;
        self.bytes_mut(t).copy_from_slice(&bytes);
        Ok(())
    }
}

/// Decodes `n` values of `dtype` from `bytes` as f32.
pub fn to_f32(bytes: &[u8], dtype: DType, n: usize) -> Result<Vec<f32>, OpError> {
    let mut out = vec![0f32; n];
    match dtype {
        DType::F32 => out.copy_from_slice(&bytemuck::pod_collect_to_vec::<u8, f32>(bytes)[..n]),
        DType::I32 => {
            let ints: Vec<i32> = bytemuck::pod_collect_to_vec(bytes);
            out.iter_mut().zip(ints).for_each(|(o, i)| *o = i as f32);
        }
        _ => crate::quant::dequantize_row(dtype, bytes, &mut out)?,
    }
    Ok(out)
}

/// Encodes f32 `values` as `dtype` (float types only).
pub fn from_f32(values: &[f32], dtype: DType) -> Result<Vec<u8>, OpError> {
    Ok(match dtype {
        DType::F32 => bytemuck::cast_slice(values).to_vec(),
        DType::F16 => values
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect(),
        DType::BF16 => values
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect(),
        other => {
            return Err(OpError::Unsupported {
                op: "from_f32",
                what: format!("{other}"),
            })
        }
    })
}

/// Runs `node` on `mem` with the reference semantics.
pub fn run(node: &OpNode, mem: &mut HostMemory) -> Result<(), OpError> {
    node.validate()?;
    // A fused op is its chain, run with scratch intermediates.
    let mut scratch = Vec::new();
    let parts = crate::fused::decompose(node, |dtype, dims| {
        let t = mem.zeros(dtype, dims)?;
        scratch.push(t.buffer);
        Ok(t)
    })?;
    if let Some(parts) = parts {
        for part in &parts {
            run(part, mem)?;
        }
        return Ok(());
    }
    let ins = &node.inputs;
    let out = node.outputs[0];
    let result: Vec<u8> = match &node.op {
        Op::GetRows => rows::get_rows(mem, &ins[0], &ins[1])?,
        Op::QuantizeRows => rows::quantize(mem, &ins[0], out.dtype)?,
        Op::MatMul => matmul::matmul(mem, &ins[0], &ins[1])?,
        Op::RmsNorm { eps } => norm::rms_norm(mem, &ins[0], &ins[1], *eps)?,
        Op::Add => elementwise::binary(mem, &ins[0], &ins[1], |a, b| a + b)?,
        Op::Mul => elementwise::binary(mem, &ins[0], &ins[1], |a, b| a * b)?,
        Op::Scale { factor } => elementwise::unary(mem, &ins[0], |a| a * factor)?,
        Op::Rope(p) => rope::rope(mem, &ins[0], &ins[1], None, p)?,
        Op::RopeFactors(p) => rope::rope(mem, &ins[0], &ins[1], Some(&ins[2]), p)?,
        Op::MoeTopK { k } => route::top_k(mem, &ins[0], *k)?,
        Op::MoeGather { normalize } => route::gather(mem, &ins[0], &ins[1], *normalize)?,
        Op::Softmax { scale } => elementwise::softmax(mem, &ins[0], *scale)?,
        Op::Attention(p) => attention::attention(mem, &ins[0], &ins[1], &ins[2], p)?,
        Op::SiluMul => {
            elementwise::binary(mem, &ins[0], &ins[1], |g, u| g / (1.0 + (-g).exp()) * u)?
        }
        Op::Gelu => elementwise::unary(mem, &ins[0], elementwise::gelu)?,
        Op::GeluMul => elementwise::binary(mem, &ins[0], &ins[1], |g, u| elementwise::gelu(g) * u)?,
        Op::LayerNorm { eps } => norm::layer_norm(mem, &ins[0], &ins[1], &ins[2], *eps)?,
        Op::SetRows { start, ring } => return rows::set_rows(mem, &ins[0], &out, *start, *ring),
        Op::Argmax => elementwise::argmax(mem, &ins[0])?,
        Op::Copy => from_f32(&mem.to_f32(&ins[0])?, out.dtype)?,
        Op::Write { data } => data.to_vec(),
        crate::family_ops!() => family::run(node, mem)?,
        Op::RmsNormQuantize { .. }
        | Op::SiluMulQuantize
        | Op::RopeSetRows { .. }
        | Op::AddRmsNormQuantize { .. }
        | Op::NormAddRmsNormQuantize { .. }
        | Op::AttentionQuantize(_)
        | Op::ProjAttention(_)
        | Op::MatMulRows { .. }
        | Op::MatMulSiluQuantize { .. } => {
            return Err(OpError::Record(format!(
                "`{}` was not decomposed",
                node.op.name()
            )))
        }
    };
    mem.bytes_mut(&out).copy_from_slice(&result);
    Ok(())
}

fn f32_bytes(values: Vec<f32>) -> Vec<u8> {
    bytemuck::cast_slice(&values).to_vec()
}
