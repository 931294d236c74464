use crate::range::ByteRange;

/// Errors of the graph layer. Each names the node or range at fault.
#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    /// A node in a recorded session did not say which bytes it reads.
    #[error("[weft-graph] node `{op}` ({label}) has no read ranges: in recorded mode every node must declare what it reads (use an empty list for a node that reads nothing)")]
    MissingReads { op: &'static str, label: String },
    /// A node did not say which bytes it writes.
    #[error("[weft-graph] node `{op}` ({label}) has no write ranges: in recorded mode every node must declare what it writes")]
    MissingWrites { op: &'static str, label: String },
    /// A range with `start >= end`.
    #[error("[weft-graph] node `{op}` ({label}) declares an empty or inverted range {range}")]
    BadRange {
        op: &'static str,
        label: String,
        range: ByteRange,
    },
    /// A schedule that breaks a hazard or loses a node.
    #[error("[weft-graph::checker] {0}")]
    Check(String),
}
