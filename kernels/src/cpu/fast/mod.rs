//! CPU kernels of the fast numerics mode: the same ops as the exact kernels
//! beside them (same file names), free to reorder floating-point work.
//! Each states its error bound against the reference semantics; an op
//! without a fast kernel here runs its exact one.

pub(super) mod attention;
