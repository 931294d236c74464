//! The KV cache: transactional spans, poisoning, cohorts, chunked prefill,
//! snapshots, several sequences on one cache, checkpoints.
//!
//! A step asks for a [`CacheSpan`] (`plan_prefill` / `plan_next_step`:
//! planning changes nothing), records its writes into the rows the span
//! names, and only after every submitted command buffer has drained does it
//! publish the new position (`commit_prefill` / `commit_step`, or
//! `validate_step_commit` then `publish_step_end`). Any failure after work
//! was submitted poisons the cache: every later plan, commit or snapshot is
//! refused until `reset()` or `restore()`, so a half-written cache can never
//! pass for a valid one. [`run_step`] and [`prefill_chunked`] run those
//! rules for a caller's recording; [`Cohort`] runs them for B lanes.
//!
//! Files: `config.rs` (layout, memory report, admission), `kv.rs` (the
//! cache, plan/publish/poison, step tickets), `span.rs`, `chunking.rs`,
//! `transaction.rs`, `cohort.rs`, `lineage.rs` (which rows a snapshot can
//! rely on), `image.rs` (host copies of rows by position), `snapshot.rs`,
//! `sequences.rs` (swap in/out), `checkpoint.rs` (the file format, checked
//! field by field), `checkpoint_file.rs` (atomic writes, bounded reads).
//!
//! Model-agnostic: a layer is K and V rows of some width, optionally a ring
//! of `window + max_chunk` rows for sliding-window attention.

mod checkpoint;
mod checkpoint_file;
mod chunking;
mod cohort;
mod config;
mod image;
mod kv;
mod lineage;
mod sequences;
mod snapshot;
mod span;
mod transaction;

pub use checkpoint::{
    checkpoint_bound, CheckpointInfo, ModelIdentity, CHECKPOINT_MAGIC, CHECKPOINT_VERSION,
};
pub use checkpoint_file::{read_bounded, write_atomically, Bounded, FileError};
pub use chunking::{ChunkPolicy, LARGE_WEIGHTS_BYTES};
pub use cohort::{Cohort, CohortSpan, CohortTickets};
pub use config::{CacheConfig, LayerMemory, LayerSpec, MemoryReport};
pub use image::{CacheImage, LayerRows};
pub use kv::{KvCache, LayerCache, StepTicket};
pub use sequences::{SequenceId, SequenceStore};
pub use snapshot::Snapshot;
pub use span::{CacheSpan, LayerSpan};
pub use transaction::{prefill_chunked, run_step, PrefillOutcome};
