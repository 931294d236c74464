//! Executor settings.

use weft_graph::cut::CutPolicy;
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
    /// Run the independent checker on every schedule (on in debug builds).
    pub check_schedules: bool,
    /// Fault injection (tests).
    pub fault: Option<Fault>,
    /// Print one line per command buffer (`WEFT_GRAPH_DIAG=1`).
    pub graph_diag: bool,
    /// Run the fusion pass before scheduling (`WEFT_FUSE=0` turns it off).
    pub fuse: bool,
    /// Whether kernels keep their fixed float order (`exact`) or may
    /// reorder work for speed (`fast`): `--numerics`, `WEFT_NUMERICS`.
    pub numerics: Numerics,
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        Self {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            reorder: true,
            cut: CutPolicy::default(),
            check_schedules: cfg!(debug_assertions),
            fault: None,
            graph_diag: false,
            fuse: true,
            numerics: Numerics::Exact,
        }
    }
}
