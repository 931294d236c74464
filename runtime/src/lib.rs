//! weft-runtime: devices and buffers, the executor and its sessions, command
//! buffers and their submission, scoped buffer pools and the KV cache (transactions, cohorts, snapshots,
//! checkpoints: see [`cache`]).
//!
//! The flow of one step: [`GraphExecutor::begin_recorded`] opens a
//! [`GraphSession`]; model code records nodes through the builder API; the
//! session's [`GraphSession::commit`] schedules them (reorder pass, command
//! buffer cuts, checker in debug builds) and submits them to the device
//! asynchronously; a [`SubmissionChain`] drains what was submitted.
//!
//! Invariant: the runtime knows nothing about model architectures.

mod backend;
pub mod cache;
mod commit;
mod config;
mod counters;
mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
mod error;
mod executor;
mod fusion;
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod launches;
mod memory;
#[cfg(all(feature = "metal", target_os = "macos"))]
mod metal;
mod plan;
mod pool;
mod profile;
mod session;
mod submission;
mod trace;
mod widen;

pub use config::{CpuConfig, CudaConfig, DiagnosticsConfig, ExecutorConfig, Fault};
pub use counters::Counters;
pub use error::RuntimeError;
pub use executor::{Device, GraphExecutor, Tapped};
pub use memory::HostBytes;
pub use pool::{ExecutorScope, PoolScope, PoolStats, SessionScope};
pub use profile::{stage_of, Profile, Row};
pub use session::{GraphSession, NodeTiming, SessionMode};
pub use submission::{InFlight, SubmissionChain};
pub use trace::{NodeSpan, Trace, TraceEvent};
pub use weft_kernels::Numerics;
