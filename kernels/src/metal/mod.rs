//! Metal kernels (macOS, feature `metal`), on `mlx-native`.
//!
//! Every op weft's models use runs here: on an mlx-native kernel where one
//! computes the op's semantics on weft's layouts (RMS norm, GGUF-block
//! matmuls, dense matmuls, NeoX RoPE, softmax, elementwise ops, GELU, casts,
//! argmax, KV-cache row copies), otherwise on weft's own Metal shaders
//! (`shaders/*.metal`, compiled at run time with fast math off): Q4_1
//! matmuls, attention over weft's token-major f16/f32 ring caches, GGUF
//! row gathers with GPU-side id checks, activation quantization, adjacent
//! pair RoPE and YaRN, LayerNorm, row-broadcast add/mul. [`route`] names the
//! kernel of any node; `docs/metal.md` has the table.
//!
//! The runtime resolves every tensor to the Metal buffer holding it
//! ([`MetalTensor`]), owns the command buffer (one concurrent compute
//! encoder per weft command buffer, memory barriers only between levels)
//! and a per-command-buffer [`Arena`] for parameters, staging and scratch
//! that lives until the command buffer completes. A kernel here only
//! encodes dispatches; it never commits, waits or inserts barriers.
//!
//! Activations in a matmul's low-precision format (Q8_0, Q8_1, Q8_K, f16,
//! bf16: what `QuantizeRows` writes) reach mlx-native's kernels, which take
//! f32 activations, as their exact f32 image: `QuantizeRows` writes that
//! image next to its result when the runtime hands it a companion buffer
//! ([`NodeAux::companion_out`]); otherwise the runtime encodes
//! [`MetalKernels::encode_prologue`] before the matmul's level.
//!
//! Same file names as every other backend; `arena.rs` and `library.rs` are
//! the Metal-only plumbing.

mod arena;
mod argmax;
mod attention;
mod elementwise;
mod glu;
mod layer_norm;
mod library;
mod matmul;
mod norm;
mod rope;
mod rows;
mod softmax;

pub use arena::{read_u32s, Arena};
pub use mlx_native;

use mlx_native::{CommandEncoder, KernelArg, KernelRegistry, MTLSize, MlxBuffer, MlxDevice};
use std::sync::{Mutex, MutexGuard};
use weft_ops::{DType, Op, OpError, OpNode, Tensor};

/// mlx-native's element type (what its dispatchers validate buffers by).
pub use mlx_native::DType as MlxDType;

/// A weft tensor resolved to the Metal buffer that holds it.
#[derive(Clone, Debug)]
pub struct MetalTensor {
    /// The whole allocation (a view of it is made per dispatch).
    pub buffer: MlxBuffer,
    /// Offset, type and shape inside `buffer`.
    pub tensor: Tensor,
}

impl MetalTensor {
    /// The tensor's bytes as an mlx-native buffer view of `dtype` elements
    /// (mlx-native's dispatchers check element counts and types).
    pub fn view(&self, dtype: MlxDType) -> Result<MlxBuffer, OpError> {
        view_of(&self.buffer, self.tensor.offset, self.tensor.bytes(), dtype)
    }

    /// The tensor's bytes as a `u8` view (GGUF blocks, weft kernels).
    pub fn bytes(&self) -> Result<MlxBuffer, OpError> {
        self.view(MlxDType::U8)
    }

    /// Elements of the tensor.
    pub fn elements(&self) -> usize {
        self.tensor.shape.elements()
    }
}

/// A view of bytes `offset..offset + bytes` of `base` (relative to its own
/// view) as `bytes / size(dtype)` elements of `dtype`.
pub fn view_of(
    base: &MlxBuffer,
    offset: u64,
    bytes: u64,
    dtype: MlxDType,
) -> Result<MlxBuffer, OpError> {
    let size = dtype.size_of() as u64;
    let total = base.metal_buffer().length();
    let start = base.byte_offset().checked_add(offset);
    let fits = start
        .and_then(|s| s.checked_add(bytes))
        .is_some_and(|e| e <= total);
    let (Some(start), true) = (start, fits) else {
        return Err(OpError::Shape(format!(
            "[weft-kernels::metal] bytes {offset}..+{bytes} lie outside a Metal buffer of {total} bytes"
        )));
    };
    if !bytes.is_multiple_of(size) {
        return Err(OpError::Shape(format!(
            "[weft-kernels::metal] {bytes} bytes are not whole {dtype} elements"
        )));
    }
    let root = MlxBuffer::from_raw(
        base.metal_buffer().clone(),
        dtype,
        vec![(total / size) as usize],
    );
    Ok(root.slice_view(start, (bytes / size) as usize))
}

/// Per-node inputs the runtime prepares besides the tensors.
#[derive(Clone, Debug, Default)]
pub struct NodeAux {
    /// `QuantizeRows`: where to write the f32 image of the quantized rows
    /// (the output's companion), if the runtime keeps one.
    pub companion_out: Option<MlxBuffer>,
    /// `MatMul` with activations that are not f32: their exact f32 image
    /// (a companion written by `QuantizeRows`, or the prologue's scratch).
    pub x_f32: Option<MlxBuffer>,
    /// The command buffer's status words and this node's slot in them:
    /// kernels that validate on the GPU (a gather's ids) write a nonzero
    /// code there, which the runtime reports with the node's label.
    pub status: Option<(MlxBuffer, u32)>,
}

/// Status codes written by weft's kernels (see [`NodeAux::status`]).
pub const STATUS_BAD_ID: u32 = 1;

/// What a status code means, for error messages.
pub fn status_message(code: u32) -> String {
    match code {
        STATUS_BAD_ID => "an id lies outside the table (those rows were zeroed)".into(),
        other => format!("kernel status code {other}"),
    }
}

/// The kernel a node runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// An mlx-native kernel (pipeline name).
    MlxNative(&'static str),
    /// One of weft's own shaders (`shaders/*.metal`).
    Weft(&'static str),
}

impl std::fmt::Display for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Route::MlxNative(k) => write!(f, "mlx-native `{k}`"),
            Route::Weft(k) => write!(f, "weft shader `{k}`"),
        }
    }
}

fn unsupported(node: &OpNode, what: impl Into<String>) -> OpError {
    OpError::Unsupported {
        op: node.op.name(),
        what: format!("{} on Metal", what.into()),
    }
}

/// Does the Metal backend implement `node`? (Checked once per recording.)
pub fn supports(node: &OpNode) -> Result<(), OpError> {
    route(node).map(|_| ())
}

/// The kernel `node` runs on, or why Metal cannot run it. A matmul whose
/// activations are not f32 also runs `weft_dequant_rows` first unless they
/// have a companion (see the module docs).
pub fn route(node: &OpNode) -> Result<Route, OpError> {
    let ins = &node.inputs;
    let outs = &node.outputs;
    let r = match &node.op {
        Op::GetRows => rows::route_get_rows(node, &ins[0])?,
        Op::QuantizeRows => rows::route_quantize(node, &outs[0])?,
        Op::MatMul => matmul::route(node, &ins[0], &ins[1])?,
        Op::RmsNorm { .. } => norm::route(&ins[0]),
        Op::Add | Op::Mul => elementwise::route_binary(node),
        Op::Scale { .. } => Route::MlxNative("scalar_mul_f32"),
        Op::SiluMul => Route::MlxNative("silu_mul_f32"),
        Op::Rope(p) => rope::route(p),
        Op::Softmax { scale } => softmax::route(*scale),
        Op::Attention(p) => attention::route(node, p, &ins[1], &ins[2])?,
        Op::Gelu => Route::MlxNative("gelu_f32"),
        Op::GeluMul => Route::MlxNative("fused_gelu_mul"),
        Op::LayerNorm { .. } => Route::Weft("weft_layer_norm"),
        Op::SetRows { .. } => rows::route_set_rows(&outs[0]),
        Op::Argmax => Route::MlxNative("argmax_f32"),
        Op::Copy => rows::route_copy(node, &ins[0], &outs[0])?,
        Op::Write { .. } => Route::Weft("weft_copy_u8"),
        #[allow(unreachable_patterns)]
        _ => return Err(unsupported(node, "this op (no Metal kernel yet)")),
    };
    Ok(r)
}

/// Checked conversion of a dimension to the u32 Metal kernels take.
fn dim(node: &OpNode, what: &str, v: usize) -> Result<u32, OpError> {
    u32::try_from(v).map_err(|_| unsupported(node, format!("{what} = {v} (above u32)")))
}

/// An mlx-native error as this crate's error, naming the kernel.
fn mlx_error(node: &OpNode, kernel: &'static str) -> impl Fn(mlx_native::MlxError) -> OpError {
    let op = node.op.name();
    move |e| OpError::Unsupported {
        op,
        what: format!("this case on Metal: mlx-native `{kernel}` refused it: {e}"),
    }
}

/// The Metal device with its kernels: mlx-native's registry (its kernels,
/// compiled on first use) and weft's own shader library.
pub struct MetalKernels {
    device: MlxDevice,
    registry: Mutex<KernelRegistry>,
    library: library::WeftLibrary,
}

impl MetalKernels {
    /// Kernels for `device`; nothing is compiled before first use.
    pub fn new(device: MlxDevice) -> MetalKernels {
        MetalKernels {
            device,
            registry: Mutex::new(KernelRegistry::new()),
            library: library::WeftLibrary::default(),
        }
    }

    /// The device.
    pub fn device(&self) -> &MlxDevice {
        &self.device
    }

    /// Does this backend implement `node`?
    pub fn supports(&self, node: &OpNode) -> Result<(), OpError> {
        supports(node)
    }

    /// True when `node` is a matmul whose activations are not f32, so its
    /// f32 image must come from a companion or [`Self::encode_prologue`].
    pub fn needs_f32_activations(node: &OpNode) -> bool {
        matches!(node.op, Op::MatMul) && node.inputs[0].dtype != DType::F32
    }

    /// Compiles weft's shader library now (it is otherwise compiled on
    /// first use): a shader error surfaces here, not in a step.
    pub fn prepare(&self) -> Result<(), OpError> {
        self.library.compile(self.device.metal_device())
    }

    /// Encodes the f32 image of `node`'s activations (a matmul's input 0)
    /// into fresh `arena` scratch and returns it; the caller puts a memory
    /// barrier between this and the matmul.
    pub fn encode_prologue(
        &self,
        enc: &mut CommandEncoder,
        arena: &mut Arena,
        node: &OpNode,
        x: &MetalTensor,
    ) -> Result<MlxBuffer, OpError> {
        let mut cx = self.context(enc, arena);
        rows::dequant_rows(&mut cx, node, x)
    }

    /// Encodes `node` (no barriers, no commit).
    pub fn encode(
        &self,
        enc: &mut CommandEncoder,
        arena: &mut Arena,
        node: &OpNode,
        ins: &[MetalTensor],
        outs: &[MetalTensor],
        aux: &NodeAux,
    ) -> Result<(), OpError> {
        if outs.iter().all(|t| t.tensor.bytes() == 0) {
            return Ok(());
        }
        let mut cx = self.context(enc, arena);
        let out = &outs[0];
        match &node.op {
            Op::GetRows => rows::get_rows(&mut cx, node, &ins[0], &ins[1], out, aux),
            Op::QuantizeRows => rows::quantize(&mut cx, node, &ins[0], out, aux),
            Op::MatMul => matmul::matmul(&mut cx, node, &ins[0], &ins[1], out, aux),
            Op::RmsNorm { eps } => norm::rms_norm(&mut cx, node, &ins[0], &ins[1], out, *eps),
            Op::Add => elementwise::binary(&mut cx, node, &ins[0], &ins[1], out, false),
            Op::Mul => elementwise::binary(&mut cx, node, &ins[0], &ins[1], out, true),
            Op::Scale { factor } => elementwise::scale(&mut cx, node, &ins[0], out, *factor),
            Op::SiluMul => elementwise::silu_mul(&mut cx, node, &ins[0], &ins[1], out),
            Op::Rope(p) => rope::rope(&mut cx, node, &ins[0], &ins[1], out, p),
            Op::Softmax { scale } => softmax::softmax(&mut cx, node, &ins[0], out, *scale),
            Op::Attention(p) => attention::attention(&mut cx, node, ins, out, p),
            Op::Gelu => glu::gelu(&mut cx, node, &ins[0], out),
            Op::GeluMul => glu::gelu_mul(&mut cx, node, &ins[0], &ins[1], out),
            Op::LayerNorm { eps } => layer_norm::layer_norm(&mut cx, node, ins, out, *eps),
            Op::SetRows { start, ring } => {
                rows::set_rows(&mut cx, node, &ins[0], out, *start, *ring)
            }
            Op::Argmax => argmax::argmax(&mut cx, node, &ins[0], out),
            Op::Copy => rows::copy(&mut cx, node, &ins[0], out),
            Op::Write { data } => rows::write(&mut cx, node, data, out),
            #[allow(unreachable_patterns)]
            _ => Err(unsupported(node, "this op (no Metal kernel yet)")),
        }
    }

    fn context<'a>(&'a self, enc: &'a mut CommandEncoder, arena: &'a mut Arena) -> Ctx<'a> {
        Ctx {
            device: &self.device,
            registry: self.registry.lock().unwrap_or_else(|p| p.into_inner()),
            library: &self.library,
            enc,
            arena,
        }
    }
}

/// What an op family's encoder works with.
struct Ctx<'a> {
    device: &'a MlxDevice,
    registry: MutexGuard<'a, KernelRegistry>,
    library: &'a library::WeftLibrary,
    enc: &'a mut CommandEncoder,
    arena: &'a mut Arena,
}

impl Ctx<'_> {
    /// Dispatches weft kernel `name` over `groups` threadgroups of
    /// `threads` threads.
    fn weft(
        &mut self,
        name: &'static str,
        bindings: &[(u64, KernelArg<'_>)],
        groups: MTLSize,
        threads: MTLSize,
    ) -> Result<(), OpError> {
        let pipeline = self.library.pipeline(self.device.metal_device(), name)?;
        self.enc
            .encode_threadgroups_with_args(&pipeline, bindings, groups, threads);
        Ok(())
    }

    /// Dispatches weft kernel `name` over a grid of `grid` threads
    /// (threadgroups of up to `threads`, the last ones partial).
    fn weft_grid(
        &mut self,
        name: &'static str,
        bindings: &[(u64, KernelArg<'_>)],
        grid: MTLSize,
        threads: MTLSize,
    ) -> Result<(), OpError> {
        let pipeline = self.library.pipeline(self.device.metal_device(), name)?;
        self.enc
            .encode_with_args(&pipeline, bindings, grid, threads);
        Ok(())
    }
}

/// 1-D grid helpers.
fn size1(n: u64) -> MTLSize {
    MTLSize::new(n.max(1), 1, 1)
}

/// Threads per threadgroup for a 1-D grid of `n`.
fn threads1(n: u64) -> MTLSize {
    MTLSize::new(n.clamp(1, 256), 1, 1)
}
