//! A captured CUDA graph that weft owns from the end of capture: between
//! capture and instantiation, the edges that a level's fork and join made
//! through events (plain edges: the later kernel launches only once the
//! earlier one has finished) are made programmatic, as the edges between
//! consecutive kernels of one stream already are. Every weft kernel waits at
//! its entry for the kernels before it (`pdl_sync`), so a programmatic edge
//! only lets its launch, and its reads of constant weights, overlap them.

use std::sync::Arc;
use weft_kernels::cuda::cudarc::driver::{result, sys, CudaContext, CudaStream, DriverError};

/// Whether a level's fork and join edges are made programmatic
/// (`WEFT_CUDA_PDL_EDGES`, 0 or 1, default 1; only while programmatic
/// dependent launch is on).
pub(crate) const PDL_EDGES_ENV: &str = "WEFT_CUDA_PDL_EDGES";

/// Reads [`PDL_EDGES_ENV`].
pub(crate) fn pdl_edges_setting() -> Result<bool, String> {
    match std::env::var(PDL_EDGES_ENV) {
        Err(std::env::VarError::NotPresent) => Ok(true),
        Ok(v) if v.trim() == "1" => Ok(true),
        Ok(v) if v.trim() == "0" => Ok(false),
        Ok(v) => Err(format!("{PDL_EDGES_ENV} must be 0 or 1, got {v:?}")),
        Err(e) => Err(format!("{PDL_EDGES_ENV} is not readable: {e}")),
    }
}

/// An instantiated graph and the graph it came from.
pub(crate) struct DeviceGraph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    ctx: Arc<CudaContext>,
}

// SAFETY: the handles are only used through `&self` methods that bind the
// context first; the driver's graph objects may be used from any thread.
unsafe impl Send for DeviceGraph {}
// SAFETY: as above (launches are serialized by the caller's mutex).
unsafe impl Sync for DeviceGraph {}

impl DeviceGraph {
    /// Ends the capture on `stream` and instantiates the graph, first
    /// making every plain kernel-to-kernel edge programmatic when
    /// `programmatic`. Returns the graph (none when nothing was captured)
    /// and how many edges were changed.
    pub(crate) fn end_capture(
        stream: &CudaStream,
        programmatic: bool,
    ) -> Result<(Option<DeviceGraph>, usize), DriverError> {
        let ctx = Arc::clone(stream.context());
        ctx.bind_to_thread()?;
        // SAFETY: the stream is capturing (the caller began it).
        let graph = unsafe { result::stream::end_capture(stream.cu_stream()) }?;
        if graph.is_null() {
            return Ok((None, 0));
        }
        let owned = |exec| DeviceGraph { graph, exec, ctx };
        // SAFETY: `graph` is a live graph that nothing else holds.
        let changed = match unsafe { programmatic_edges(graph, programmatic) } {
            Ok(n) => n,
            Err(e) => {
                drop(owned(std::ptr::null_mut()));
                return Err(e);
            }
        };
        // SAFETY: as above.
        match unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) } {
            Ok(exec) => Ok((Some(owned(exec)), changed)),
            Err(e) => {
                drop(owned(std::ptr::null_mut()));
                Err(e)
            }
        }
    }

    pub(crate) fn launch(&self, stream: &CudaStream) -> Result<(), DriverError> {
        self.ctx.bind_to_thread()?;
        // SAFETY: the executable graph is live; the stream belongs to its
        // context.
        unsafe { result::graph::launch(self.exec, stream.cu_stream()) }
    }
}

impl Drop for DeviceGraph {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_err() {
            return;
        }
        // SAFETY: both handles are owned here and destroyed once.
        unsafe {
            if !self.exec.is_null() {
                let _ = result::graph::exec_destroy(self.exec);
            }
            let _ = result::graph::destroy(self.graph);
        }
    }
}

/// Replaces every plain edge between two kernel nodes of `graph` with a
/// programmatic one (when `on`); returns how many.
///
/// # Safety
/// `graph` must be a live graph no other thread touches.
unsafe fn programmatic_edges(graph: sys::CUgraph, on: bool) -> Result<usize, DriverError> {
    if !on {
        return Ok(0);
    }
    let mut count = 0usize;
    sys::cuGraphGetEdges_v2(
        graph,
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        &mut count,
    )
    .result()?;
    let mut from = vec![std::ptr::null_mut(); count];
    let mut to = vec![std::ptr::null_mut(); count];
    let none = sys::CUgraphEdgeData {
        from_port: 0,
        to_port: 0,
        type_: 0,
        reserved: [0; 5],
    };
    let mut data = vec![none; count];
    sys::cuGraphGetEdges_v2(
        graph,
        from.as_mut_ptr(),
        to.as_mut_ptr(),
        data.as_mut_ptr(),
        &mut count,
    )
    .result()?;
    let is_kernel = |node: sys::CUgraphNode| -> Result<bool, DriverError> {
        let mut t = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        sys::cuGraphNodeGetType(node, &mut t).result()?;
        Ok(t == sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL)
    };
    let plain = sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_DEFAULT as u8;
    let mut changed = 0;
    for i in 0..count {
        if data[i].type_ != plain || !is_kernel(from[i])? || !is_kernel(to[i])? {
            continue;
        }
        sys::cuGraphRemoveDependencies_v2(graph, &from[i], &to[i], &data[i], 1).result()?;
        let edge = sys::CUgraphEdgeData {
            from_port: sys::CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC as u8,
            to_port: 0,
            type_: sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8,
            reserved: [0; 5],
        };
        sys::cuGraphAddDependencies_v2(graph, &from[i], &to[i], &edge, 1).result()?;
        changed += 1;
    }
    Ok(changed)
}
