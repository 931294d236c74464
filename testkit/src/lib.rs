//! What weft's tests share, in one place so that no test carries its own
//! copy: a deterministic random generator ([`Rng`]), host tensors and the
//! CPU kernels and reference semantics run on them ([`host`]), the op case
//! lists every backend harness runs ([`cases`]) and the checks several
//! test binaries run ([`checks`]), the
//! reference-file lookup ([`reference`]), the helpers that skip a test
//! whose model or device is missing, or fail it where the run requires them
//! ([`require`]), checked-in schedule snapshots ([`snapshot`]), and the
//! plain f64 DeepSeek-V4 forward pass the recorded one is tested against
//! ([`deepseek4`]).
//!
//! A development dependency only: nothing here ships in `weft`.

pub mod cases;
pub mod checks;
pub mod deepseek4;
pub mod host;
pub mod reference;
pub mod require;
mod rng;
pub mod snapshot;

pub use rng::Rng;
