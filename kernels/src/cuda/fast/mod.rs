//! The CUDA kernels of numerics `fast`: the same op families as the exact
//! kernels beside this folder, free to reorder floating-point work. Each
//! states its float order and error bound in its source; a node without a
//! fast kernel runs its exact one.

pub(super) mod attention;
pub(super) mod attention_prefill;
pub(super) mod matmul;
pub(super) mod matmul_half;
pub(super) mod matmul_id;
