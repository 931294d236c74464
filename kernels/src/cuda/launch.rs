//! Launch plumbing shared by the op families: kernel arguments, launch
//! configurations, alignment checks and error mapping.

use super::DeviceTensor;
use cudarc::driver::{CudaFunction, CudaStream};
use weft_ops::{DType, OpError};

/// One kernel argument, by value.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Arg {
    /// A device address (or 0 for a null pointer).
    Ptr(u64),
    I32(i32),
    U32(u32),
    U64(u64),
    F32(f32),
    Attn(super::attention::AttnArgs),
    Rope(super::rope::RopeArgs),
    Seg(super::matmul::RowsSeg),
    Proj(super::proj_attention::ProjArgs),
}

/// Threads per block of the one-element-per-thread kernels.
pub(crate) const BLOCK: u32 = 256;

/// Blocks of `BLOCK` threads covering `count` elements.
pub(crate) fn blocks_for(count: u64) -> u32 {
    count.div_ceil(BLOCK as u64).max(1) as u32
}

/// Rows up to this many bytes are staged in shared memory by the one-warp
/// row kernels (rms_norm, layer_norm, softmax and the fused norms), beside
/// their 12 KiB of static scratch.
pub(crate) const ROW_STAGE_LIMIT: usize = 32 * 1024;

/// `(dynamic shared bytes, staged flag)` for a row of `cols` f32 values.
pub(crate) fn row_stage(cols: usize) -> (u32, i32) {
    if cols * 4 <= ROW_STAGE_LIMIT {
        ((cols * 4) as u32, 1)
    } else {
        (0, 0)
    }
}

/// The kernels' `method` argument (common.cu's `SUM_BOUNDED`): how the row
/// kernels reproduce the CPU's sequential f64 sums (rms_norm, layer_norm,
/// softmax). A tree sum whose error bound decides the f32 the kernel needs,
/// with lane 0 summing in order in the rare row where it cannot; the CPU's
/// bits at about the cost of a plain tree sum (H200, 576 columns: lane 0
/// in order 8.2 µs, the exact parallel scheme 10.9 µs per rms_norm node).
pub(crate) const F64_SUM_BOUNDED: i32 = 3;

/// Whether every device loaded so far has compute capability 9.0 or later
/// (programmatic dependent launch, thread block clusters).
static SM90_DEVICES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Records a loaded device's compute capability (major version): below 9,
/// launches stay plain and the cluster kernels are not used.
pub(crate) fn note_compute_capability(major: i32) {
    if major < 9 {
        SM90_DEVICES.store(false, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Whether every device loaded so far has compute capability 9.0 or later:
/// thread block clusters (the `*_cluster` and `*_pair` kernels) need it.
pub(crate) fn sm90() -> bool {
    SM90_DEVICES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Enqueues `func` on `stream` through `cuLaunchKernelEx`, allowed to start
/// early (programmatic stream serialization) on a device that has it
/// (compute capability 9.0 or later): the kernel is launched while the
/// kernel before it in its stream (or captured graph) finishes, and waits
/// at its entry (`pdl_sync` in common.cu) until that one completed, so
/// only the launch latency overlaps, never the work.
///
/// # Safety
/// `args` must match the kernel's parameters in number, order and type, and
/// every pointer must cover what the kernel touches for this grid.
pub(crate) unsafe fn launch(
    stream: &CudaStream,
    func: &CudaFunction,
    grid: (u32, u32, u32),
    block: u32,
    shared_bytes: u32,
    args: &[Arg],
    op: &'static str,
) -> Result<(), OpError> {
    use cudarc::driver::sys;
    use std::ffi::c_void;
    let mut params: Vec<*mut c_void> = args
        .iter()
        .map(|a| match a {
            Arg::Ptr(v) | Arg::U64(v) => v as *const u64 as *mut c_void,
            Arg::I32(v) => v as *const i32 as *mut c_void,
            Arg::U32(v) => v as *const u32 as *mut c_void,
            Arg::F32(v) => v as *const f32 as *mut c_void,
            Arg::Attn(v) => v as *const super::attention::AttnArgs as *mut c_void,
            Arg::Rope(v) => v as *const super::rope::RopeArgs as *mut c_void,
            Arg::Seg(v) => v as *const super::matmul::RowsSeg as *mut c_void,
            Arg::Proj(v) => v as *const super::proj_attention::ProjArgs as *mut c_void,
        })
        .collect();
    // Programmatic dependent launch, where the device has it: the only
    // launch attribute.
    // SAFETY: a zeroed attribute is a valid plain-data value; id and value set below.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let attrs = sm90() as u32;
    let config = sys::CUlaunchConfig {
        gridDimX: grid.0,
        gridDimY: grid.1,
        gridDimZ: grid.2,
        blockDimX: block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: shared_bytes,
        hStream: stream.cu_stream(),
        attrs: &mut attr,
        numAttrs: attrs,
    };
    stream
        .context()
        .bind_to_thread()
        .map_err(|e| driver_error(op, "binding the context", e))?;
    // SAFETY: `params` points at `args`' values, which outlive the call; the
    // caller vouches for their match with the kernel.
    let r = unsafe {
        sys::cuLaunchKernelEx(
            &config,
            func.cu_function(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(driver_error(op, "kernel launch", format!("{r:?}")));
    }
    Ok(())
}

/// A driver or compiler failure while running `op`.
pub(crate) fn driver_error(op: &'static str, what: &str, e: impl std::fmt::Display) -> OpError {
    OpError::Param {
        op,
        message: format!("[weft-kernels::cuda] {what} failed: {e}"),
    }
}

/// `op` does not run on CUDA for this reason.
pub(crate) fn unsupported(op: &'static str, what: String) -> OpError {
    OpError::Unsupported {
        op,
        what: format!("{what} on CUDA"),
    }
}

/// A malformed call (wrong arity, misaligned tensor, missing preparation).
pub(crate) fn bad_call(op: &'static str, message: String) -> OpError {
    OpError::Param {
        op,
        message: format!("[weft-kernels::cuda] {message}"),
    }
}

/// Checks that `t` starts at a multiple of `align` bytes.
pub(crate) fn check_aligned(op: &'static str, t: &DeviceTensor, align: u64) -> Result<(), OpError> {
    if !t.ptr.is_multiple_of(align) {
        return Err(bad_call(
            op,
            format!(
                "tensor {:?} at device address {:#x} is not {align}-byte aligned",
                t.tensor, t.ptr
            ),
        ));
    }
    Ok(())
}

/// The alignment a kernel's loads need for tensors of `dtype`.
pub(crate) fn natural_alignment(dtype: DType) -> u64 {
    match dtype {
        DType::F32 | DType::I32 | DType::Q4_1 | DType::Q4_K | DType::Q8_1 | DType::Q8_K => 4,
        _ => 2,
    }
}

/// Checks the count of inputs and outputs.
pub(crate) fn check_arity(
    op: &'static str,
    ins: &[DeviceTensor],
    outs: &[DeviceTensor],
    want_ins: usize,
) -> Result<(), OpError> {
    if ins.len() < want_ins || outs.is_empty() {
        return Err(bad_call(
            op,
            format!(
                "expected {want_ins} inputs and 1 output, got {} and {}",
                ins.len(),
                outs.len()
            ),
        ));
    }
    Ok(())
}
