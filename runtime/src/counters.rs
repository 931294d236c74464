//! Counters kept apart, as hf2q's runtime did: dispatches, barriers,
//! command buffers, commits (and those that reused a step plan), waits,
//! pool allocations; and the host's time in each part of a step (recording,
//! submitting, waiting, reading back), which bounds decode on a GPU.

use std::sync::atomic::{AtomicU64, Ordering};

/// Live counters of one executor (shared with in-flight work).
#[derive(Debug, Default)]
pub(crate) struct LiveCounters {
    pub dispatches: AtomicU64,
    pub barriers: AtomicU64,
    pub command_buffers: AtomicU64,
    pub commits: AtomicU64,
    pub waits: AtomicU64,
    pub pool_allocations: AtomicU64,
    pub planned_commits: AtomicU64,
    pub record_ns: AtomicU64,
    pub submit_ns: AtomicU64,
    pub wait_ns: AtomicU64,
    pub read_ns: AtomicU64,
}

/// A snapshot of an executor's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counters {
    /// Nodes executed.
    pub dispatches: u64,
    /// Barriers executed (level boundaries inside command buffers).
    pub barriers: u64,
    /// Command buffers submitted.
    pub command_buffers: u64,
    /// `commit` calls (one may submit several command buffers).
    pub commits: u64,
    /// Waits on in-flight work.
    pub waits: u64,
    /// Buffers the pools had to allocate (not recycle).
    pub pool_allocations: u64,
    /// Commits that reused the previous recording's plan (fusion,
    /// schedule, captured graphs) instead of making one (GPU backends).
    pub planned_commits: u64,
    /// Host nanoseconds recording sessions (begin to commit).
    pub record_ns: u64,
    /// Host nanoseconds in commit: fusion, scheduling (or reusing a plan),
    /// encoding or replaying, submitting.
    pub submit_ns: u64,
    /// Host nanoseconds waiting for submitted work.
    pub wait_ns: u64,
    /// Host nanoseconds reading tensors back.
    pub read_ns: u64,
}

impl LiveCounters {
    pub(crate) fn snapshot(&self) -> Counters {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Counters {
            dispatches: g(&self.dispatches),
            barriers: g(&self.barriers),
            command_buffers: g(&self.command_buffers),
            commits: g(&self.commits),
            waits: g(&self.waits),
            pool_allocations: g(&self.pool_allocations),
            planned_commits: g(&self.planned_commits),
            record_ns: g(&self.record_ns),
            submit_ns: g(&self.submit_ns),
            wait_ns: g(&self.wait_ns),
            read_ns: g(&self.read_ns),
        }
    }

    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// Adds the time since `start` to `c`, in nanoseconds.
    pub(crate) fn add_since(c: &AtomicU64, start: std::time::Instant) {
        Self::add(c, start.elapsed().as_nanos() as u64);
    }
}

impl std::ops::Sub for Counters {
    type Output = Counters;
    fn sub(self, o: Counters) -> Counters {
        Counters {
            dispatches: self.dispatches - o.dispatches,
            barriers: self.barriers - o.barriers,
            command_buffers: self.command_buffers - o.command_buffers,
            commits: self.commits - o.commits,
            waits: self.waits - o.waits,
            pool_allocations: self.pool_allocations - o.pool_allocations,
            planned_commits: self.planned_commits - o.planned_commits,
            record_ns: self.record_ns - o.record_ns,
            submit_ns: self.submit_ns - o.submit_ns,
            wait_ns: self.wait_ns - o.wait_ns,
            read_ns: self.read_ns - o.read_ns,
        }
    }
}
