use weft_graph::GraphError;
use weft_ops::OpError;

/// Errors of the runtime. Execution errors name the node that failed.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Op(#[from] OpError),
    #[error(transparent)]
    Graph(#[from] GraphError),
    /// A node failed while its command buffer ran.
    #[error("[weft-runtime] node `{op}` ({label}) failed: {message}")]
    Execution {
        op: &'static str,
        label: String,
        message: String,
    },
    /// Something the caller asked for cannot be done in this state.
    #[error("[weft-runtime] {0}")]
    Usage(String),
    /// A buffer could not be allocated.
    #[error("[weft-runtime] cannot allocate {bytes} bytes for `{name}`")]
    OutOfMemory { bytes: u64, name: String },
    /// Encoding failed and draining what was submitted failed too.
    #[error("[weft-runtime] {first}; and while draining: {second}")]
    Both {
        first: Box<RuntimeError>,
        second: Box<RuntimeError>,
    },
}
