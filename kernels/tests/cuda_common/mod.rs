//! Shared harness of the CUDA tests: device setup (skip without a GPU,
//! fail with `WEFT_TEST_REQUIRE_CUDA=1`), host <-> device mirrors of a
//! `HostMemory`, the CPU kernels as the reference, bitwise comparison.

#![allow(dead_code)]

pub mod experts;

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use weft_kernels::cuda::cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use weft_kernels::cuda::{self, CudaKernels, DeviceTensor, GroupMember};
use weft_ops::reference::HostMemory;
use weft_ops::{DType, OpNode, Tensor};
use weft_testkit::require::skip_or_fail;

/// The environment variable that turns skips into failures (device runs).
pub const REQUIRE_ENV: &str = weft_testkit::require::REQUIRE_CUDA;

pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub kernels: CudaKernels,
}

/// The process-wide device and kernels, or `None` (after saying why) when
/// this machine has no usable GPU.
pub fn gpu() -> Option<&'static Gpu> {
    static GPU: OnceLock<Result<Gpu, String>> = OnceLock::new();
    let g = GPU.get_or_init(|| {
        cuda::driver_status()?;
        let ctx = CudaContext::new(0).map_err(|e| format!("CudaContext::new(0): {e}"))?;
        // SAFETY: called before this context allocates anything.
        unsafe { ctx.disable_event_tracking() };
        // The device scripts keep compiled PTX between runs.
        let ptx_cache = std::env::var_os("WEFT_CUDA_PTX_CACHE").map(std::path::PathBuf::from);
        let kernels = CudaKernels::new(ctx.clone(), ptx_cache.as_deref())
            .map_err(|e| format!("CudaKernels::new: {e}"))?;
        Ok(Gpu { ctx, kernels })
    });
    match g {
        Ok(g) => Some(g),
        Err(why) => {
            skip_or_fail(REQUIRE_ENV, &format!("CUDA is unavailable: {why}"));
            None
        }
    }
}

/// The environment variable for a dry run without a GPU: the tests build
/// their nodes and run the CPU side only (checks the harness itself).
pub const DRY_RUN_ENV: &str = "WEFT_TEST_CUDA_DRY_RUN";

/// `None`: skip the test. `Some(None)`: a dry run (no GPU, see
/// [`DRY_RUN_ENV`]); the comparisons then hold trivially.
pub fn gpu_or_dry() -> Option<Option<&'static Gpu>> {
    if std::env::var(DRY_RUN_ENV).is_ok_and(|v| v == "1") && std::env::var(REQUIRE_ENV).is_err() {
        return Some(gpu_quiet());
    }
    gpu().map(Some)
}

fn gpu_quiet() -> Option<&'static Gpu> {
    weft_kernels::cuda::driver_status().ok()?;
    gpu()
}

impl Gpu {
    pub fn stream(&self) -> Arc<CudaStream> {
        self.ctx.new_stream().expect("new stream")
    }
}

/// Deterministic random numbers, seeded per test (`Rng::new(seed)`).
pub use weft_testkit::Rng;

/// Device copies of the buffers a node touches.
pub struct DevMem {
    bufs: HashMap<u32, CudaSlice<u8>>,
}

impl DevMem {
    pub fn upload(stream: &Arc<CudaStream>, mem: &HostMemory, tensors: &[Tensor]) -> DevMem {
        let mut bufs = HashMap::new();
        for t in tensors {
            bufs.entry(t.buffer.0).or_insert_with(|| {
                let host = mem.buffer(t.buffer);
                let data = if host.is_empty() {
                    vec![0u8; 1]
                } else {
                    host.to_vec()
                };
                stream.clone_htod(&data).expect("upload")
            });
        }
        DevMem { bufs }
    }

    pub fn tensor(&self, stream: &Arc<CudaStream>, t: &Tensor) -> DeviceTensor {
        let (base, _sync) = self.bufs[&t.buffer.0].device_ptr(stream);
        DeviceTensor {
            ptr: base + t.offset,
            tensor: *t,
            constant: false,
        }
    }

    /// The bytes of `t` as the device holds them.
    pub fn read(&self, stream: &Arc<CudaStream>, t: &Tensor) -> Vec<u8> {
        let all = stream
            .clone_dtoh(&self.bufs[&t.buffer.0])
            .expect("download");
        all[t.offset as usize..(t.offset + t.bytes()) as usize].to_vec()
    }
}

/// A device buffer for raw values (scratch, step scalars).
pub fn device_u8(stream: &Arc<CudaStream>, bytes: usize) -> CudaSlice<u8> {
    stream.alloc_zeros::<u8>(bytes.max(16)).expect("alloc")
}

pub fn ptr_of<T>(stream: &Arc<CudaStream>, s: &CudaSlice<T>) -> u64 {
    s.device_ptr(stream).0
}

/// Runs `node` on the GPU over a device copy of `mem` and returns the bytes
/// of every output. `step` overrides the node's step scalars.
pub fn run_gpu_with(
    g: Option<&Gpu>,
    node: &OpNode,
    mem: &HostMemory,
    step: Option<Vec<u32>>,
) -> Vec<Vec<u8>> {
    let Some(g) = g else {
        return run_cpu(node, mem);
    };
    let stream = g.stream();
    g.kernels.supports(node).expect("supports");
    g.kernels.prepare(node, &stream).expect("prepare");
    let all: Vec<Tensor> = node.inputs.iter().chain(&node.outputs).copied().collect();
    let dev = DevMem::upload(&stream, mem, &all);
    // Inputs the node does not write are constant: kernels that read those
    // before waiting (DeviceTensor::constant) are tested that way.
    let ins: Vec<DeviceTensor> = node
        .inputs
        .iter()
        .map(|t| DeviceTensor {
            constant: constants_on() && node.outputs.iter().all(|o| o.buffer != t.buffer),
            ..dev.tensor(&stream, t)
        })
        .collect();
    let outs: Vec<DeviceTensor> = node
        .outputs
        .iter()
        .map(|t| dev.tensor(&stream, t))
        .collect();
    let scratch = device_u8(&stream, g.kernels.scratch_bytes(node));
    let scalars = step.unwrap_or_else(|| g.kernels.step_scalars(node));
    let step_buf = stream
        .clone_htod(&if scalars.is_empty() {
            vec![0u32]
        } else {
            scalars.clone()
        })
        .expect("step");
    let step_ptr = if scalars.is_empty() {
        0
    } else {
        ptr_of(&stream, &step_buf)
    };
    // SAFETY: every tensor lies inside its uploaded buffer; scratch and step
    // are sized by the kernels' own answers.
    unsafe {
        g.kernels
            .launch(
                &stream,
                node,
                &ins,
                &outs,
                ptr_of(&stream, &scratch),
                step_ptr,
            )
            .expect("launch");
    }
    stream.synchronize().expect("kernel execution");
    node.outputs.iter().map(|t| dev.read(&stream, t)).collect()
}

/// Whether the harness marks a node's unwritten inputs constant (kernels
/// then read weights before their programmatic-launch wait);
/// `WEFT_TEST_NO_CONSTANT=1` tests the other order, as the runtime runs a
/// kernel whose weights some command buffer has written.
pub fn constants_on() -> bool {
    std::env::var("WEFT_TEST_NO_CONSTANT").map_or(true, |v| v != "1")
}

/// Runs `nodes` as one grouped launch (`CudaKernels::launch_group`) over a
/// device copy of `mem`; returns each node's output bytes. Without a GPU,
/// each node on the CPU.
pub fn run_gpu_group(g: Option<&Gpu>, nodes: &[OpNode], mem: &HostMemory) -> Vec<Vec<u8>> {
    let Some(g) = g else {
        return nodes.iter().map(|n| run_cpu(n, mem).remove(0)).collect();
    };
    let stream = g.stream();
    let mut all = Vec::new();
    for n in nodes {
        g.kernels.supports(n).expect("supports");
        g.kernels.prepare(n, &stream).expect("prepare");
        assert_eq!(
            g.kernels.scratch_bytes(n),
            0,
            "grouped nodes need no scratch"
        );
        all.extend(n.inputs.iter().chain(&n.outputs).copied());
    }
    let dev = DevMem::upload(&stream, mem, &all);
    let written: Vec<_> = nodes
        .iter()
        .flat_map(|n| n.outputs.iter().map(|t| t.buffer))
        .collect();
    let resolved: Vec<(Vec<DeviceTensor>, Vec<DeviceTensor>)> = nodes
        .iter()
        .map(|n| {
            let ins = n
                .inputs
                .iter()
                .map(|t| DeviceTensor {
                    constant: constants_on() && !written.contains(&t.buffer),
                    ..dev.tensor(&stream, t)
                })
                .collect();
            let outs = n.outputs.iter().map(|t| dev.tensor(&stream, t)).collect();
            (ins, outs)
        })
        .collect();
    let steps: Vec<CudaSlice<u32>> = nodes
        .iter()
        .map(|n| {
            let mut s = g.kernels.step_scalars(n);
            s.push(0);
            stream.clone_htod(&s).expect("step")
        })
        .collect();
    let members: Vec<GroupMember> = nodes
        .iter()
        .zip(&resolved)
        .zip(&steps)
        .map(|((n, (ins, outs)), step)| {
            let (rope, write, bias) = match &n.op {
                weft_ops::Op::MatMulRows { rope, write, bias } => (rope.as_ref(), *write, *bias),
                _ => (None, None, false),
            };
            assert!(
                g.kernels.shared_launch_limit(n) > 1,
                "{} is not groupable",
                n.op.name()
            );
            GroupMember {
                rope,
                write,
                bias,
                ins,
                outs,
                step: if g.kernels.step_scalars(n).is_empty() {
                    0
                } else {
                    ptr_of(&stream, step)
                },
            }
        })
        .collect();
    // SAFETY: every tensor lies inside its uploaded buffer.
    unsafe { g.kernels.launch_group(&stream, &members) }.expect("launch");
    stream.synchronize().expect("kernel execution");
    nodes
        .iter()
        .map(|n| dev.read(&stream, &n.outputs[0]))
        .collect()
}

pub fn run_gpu(g: Option<&Gpu>, node: &OpNode, mem: &HostMemory) -> Vec<Vec<u8>> {
    run_gpu_with(g, node, mem, None)
}

/// Runs `node` with the CPU kernels (split as for 3 threads, pieces in
/// reverse order) and returns the bytes of every output.
pub fn run_cpu(node: &OpNode, mem: &HostMemory) -> Vec<Vec<u8>> {
    let out = weft_testkit::host::run_cpu(node, mem, 3);
    node.outputs.iter().map(|t| out.bytes(t).to_vec()).collect()
}

/// Fills every output (that is not also an input) with 0xff bytes, so an
/// element the GPU fails to write (or writes where the CPU does not) shows.
pub fn poison_outputs(node: &OpNode, mem: &mut HostMemory) {
    for t in &node.outputs {
        if node.inputs.iter().any(|i| i.buffer == t.buffer) {
            continue;
        }
        mem.bytes_mut(t).fill(0xff);
    }
}

pub use weft_testkit::host::node;

/// Bitwise comparison (f32 outputs as words, NaN equal to NaN); panics
/// with the first differences.
pub fn assert_same(what: &str, dtype: DType, got: &[u8], want: &[u8]) {
    assert_eq!(got.len(), want.len(), "{what}: sizes differ");
    let mut diffs = Vec::new();
    let mut count = 0usize;
    if dtype == DType::F32 {
        let g: &[f32] = bytemuck::cast_slice(got);
        let w: &[f32] = bytemuck::cast_slice(want);
        for (i, (a, b)) in g.iter().zip(w).enumerate() {
            if a.to_bits() != b.to_bits() && !(a.is_nan() && b.is_nan()) {
                count += 1;
                if diffs.len() < 8 {
                    diffs.push(format!(
                        "[{i}] gpu {a:e} ({:#010x}) cpu {b:e} ({:#010x})",
                        a.to_bits(),
                        b.to_bits()
                    ));
                }
            }
        }
        if count > 0 {
            panic!(
                "{what}: {count} of {} values differ: {}",
                g.len(),
                diffs.join("; ")
            );
        }
    } else {
        for (i, (a, b)) in got.iter().zip(want).enumerate() {
            if a != b {
                count += 1;
                if diffs.len() < 8 {
                    diffs.push(format!("[{i}] gpu {a:#04x} cpu {b:#04x}"));
                }
            }
        }
        if count > 0 {
            panic!(
                "{what}: {count} of {} bytes differ: {}",
                got.len(),
                diffs.join("; ")
            );
        }
    }
}

/// Largest |a - b| / (|b| + floor) of two f32 outputs.
pub fn max_rel(got: &[u8], want: &[u8], floor: f32) -> f32 {
    let g: &[f32] = bytemuck::cast_slice(got);
    let w: &[f32] = bytemuck::cast_slice(want);
    g.iter()
        .zip(w)
        .map(|(a, b)| (a - b).abs() / (b.abs() + floor))
        .fold(
            0f32,
            |m, e| if e.is_nan() { f32::INFINITY } else { m.max(e) },
        )
}

/// Runs `node` on both backends and asserts bit-identical outputs.
pub fn check_exact(g: Option<&Gpu>, what: &str, node: &OpNode, mem: &mut HostMemory) {
    poison_outputs(node, mem);
    let want = run_cpu(node, mem);
    let got = run_gpu(g, node, mem);
    for (i, t) in node.outputs.iter().enumerate() {
        assert_same(&format!("{what} (output {i})"), t.dtype, &got[i], &want[i]);
    }
}
