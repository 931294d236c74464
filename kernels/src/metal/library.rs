//! weft's own Metal shaders: one library compiled at run time from
//! `shaders/*.metal` (helpers first), with fast math off so division,
//! square roots and rounding are IEEE, as the reference semantics assume.
//! Pipelines are made on first use and cached per kernel name.

use mlx_native::metal::{CompileOptions, ComputePipelineState, DeviceRef, Library};
use std::collections::HashMap;
use std::sync::Mutex;
use weft_ops::OpError;

/// The whole source: `common.metal` first (includes and helpers), then one
/// file per op family.
pub(crate) const SOURCE: &str = concat!(
    include_str!("shaders/common.metal"),
    "\n",
    include_str!("shaders/rows.metal"),
    "\n",
    include_str!("shaders/matmul.metal"),
    "\n",
    include_str!("shaders/attention.metal"),
    "\n",
    include_str!("shaders/rope.metal"),
    "\n",
    include_str!("shaders/norm.metal"),
    "\n",
    include_str!("shaders/elementwise.metal"),
);

#[derive(Default)]
struct State {
    library: Option<Library>,
    pipelines: HashMap<&'static str, ComputePipelineState>,
}

/// The compiled library and its pipelines.
#[derive(Default)]
pub(crate) struct WeftLibrary {
    state: Mutex<State>,
}

fn shader_error(what: String) -> OpError {
    OpError::Unsupported {
        op: "metal",
        what: format!("weft's Metal shaders here: {what}"),
    }
}

impl State {
    fn library(&mut self, device: &DeviceRef) -> Result<&Library, OpError> {
        if self.library.is_none() {
            let options = CompileOptions::new();
            options.set_fast_math_enabled(false);
            let lib = device
                .new_library_with_source(SOURCE, &options)
                .map_err(|e| shader_error(format!("compiling failed: {e}")))?;
            self.library = Some(lib);
        }
        self.library
            .as_ref()
            .ok_or_else(|| shader_error("the library is missing after compiling".into()))
    }
}

impl WeftLibrary {
    /// Compiles the library if it is not compiled yet.
    pub(crate) fn compile(&self, device: &DeviceRef) -> Result<(), OpError> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.library(device).map(|_| ())
    }

    /// The pipeline of kernel `name` (compiling the library on first use).
    pub(crate) fn pipeline(
        &self,
        device: &DeviceRef,
        name: &'static str,
    ) -> Result<ComputePipelineState, OpError> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = state.pipelines.get(name) {
            return Ok(p.clone());
        }
        let function = state
            .library(device)?
            .get_function(name, None)
            .map_err(|e| shader_error(format!("kernel `{name}` is missing: {e}")))?;
        let pipeline = device
            .new_compute_pipeline_state_with_function(&function)
            .map_err(|e| shader_error(format!("kernel `{name}` has no pipeline: {e}")))?;
        state.pipelines.insert(name, pipeline.clone());
        Ok(pipeline)
    }
}
