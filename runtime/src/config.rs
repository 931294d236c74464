//! Executor settings: one typed configuration per executor, built by the
//! caller (the `weft` crate parses it from defaults, the environment and
//! flags) and handed down to the backend it creates. Nothing below reads
//! the process environment.

use std::path::PathBuf;
use weft_graph::cut::CutPolicy;
use weft_kernels::cpu::quant::Isa;
use weft_kernels::Numerics;

/// A deliberate failure, for fault-injection tests: the first node whose
/// label contains `label` fails when it runs, `after` matching nodes later
/// (0: the first match).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    pub label: String,
    pub after: usize,
}

/// How an executor schedules and runs what it records.
#[derive(Clone, Debug, PartialEq)]
pub struct ExecutorConfig {
    /// Worker threads (CPU).
    pub threads: usize,
    /// Run the reorder pass on `commit` (off: recorded order, for diagnosis).
    pub reorder: bool,
    /// Where command buffers are cut.
    pub cut: CutPolicy,
    /// Run the fusion pass before scheduling (`WEFT_FUSE=0` turns it off).
    pub fuse: bool,
    /// Whether kernels keep their fixed float order (`exact`) or may
    /// reorder work for speed (`fast`): `--numerics`, `WEFT_NUMERICS`.
    pub numerics: Numerics,
    /// CPU backend settings.
    pub cpu: CpuConfig,
    /// CUDA backend settings (read only by a CUDA executor).
    pub cuda: CudaConfig,
    /// Checks, reports and injected faults for finding problems.
    pub diagnostics: DiagnosticsConfig,
}

/// What an executor checks and reports beyond running the work.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiagnosticsConfig {
    /// Run the independent checker on every schedule (on in debug builds).
    pub check_schedules: bool,
    /// Print one line per command buffer (`WEFT_GRAPH_DIAG=1`).
    pub graph_diag: bool,
    /// Fault injection (tests, `weft serve --inject-fault`).
    pub fault: Option<Fault>,
}

impl DiagnosticsConfig {
    /// The defaults with every schedule checked (what the tests run).
    pub fn checked() -> Self {
        Self {
            check_schedules: true,
            ..Self::default()
        }
    }
}

// Not derivable in debug builds, where schedules are checked by default.
#[allow(clippy::derivable_impls)]
impl Default for DiagnosticsConfig {
    fn default() -> Self {
        Self {
            check_schedules: cfg!(debug_assertions),
            graph_diag: false,
            fault: None,
        }
    }
}

/// Settings of the CPU kernels.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuConfig {
    /// Caps the instruction set of the quantized kernels (`WEFT_CPU_ISA`;
    /// `None`: the best this CPU has). Process-wide: the first executor
    /// that sets it fixes it, before any kernel runs.
    pub isa: Option<Isa>,
}

/// Settings of the CUDA backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaConfig {
    /// Capture command buffers as CUDA graphs and replay them
    /// (`WEFT_CUDA_GRAPHS`; off: every kernel launched eagerly).
    pub graphs: bool,
    /// Streams a level's independent nodes are spread over, 1 to
    /// [`CudaConfig::MAX_STREAMS`] (`WEFT_CUDA_STREAMS`).
    pub streams: usize,
    /// A folder keeping NVRTC's compiled kernels between processes
    /// (`WEFT_CUDA_PTX_CACHE`; `None`: compile in every process).
    pub ptx_cache: Option<PathBuf>,
}

impl CudaConfig {
    /// The most streams a level is spread over.
    pub const MAX_STREAMS: usize = 4;
}

impl Default for CudaConfig {
    fn default() -> Self {
        Self {
            graphs: true,
            streams: Self::MAX_STREAMS,
            ptx_cache: None,
        }
    }
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        Self {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            reorder: true,
            cut: CutPolicy::default(),
            fuse: true,
            numerics: Numerics::Exact,
            cpu: CpuConfig::default(),
            cuda: CudaConfig::default(),
            diagnostics: DiagnosticsConfig::default(),
        }
    }
}
