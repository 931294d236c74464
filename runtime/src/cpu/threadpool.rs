//! The CPU backend's persistent thread pool.
//!
//! Every worker runs every command buffer ("job") in submission order. Inside
//! a job, the threads share each level's pieces of work through an atomic
//! counter, then meet at a spin barrier: one barrier is one thread
//! synchronisation. The submitting thread does not take part, so it can
//! record the next command buffer while this one runs.

use crate::counters::LiveCounters;
use crate::memory::Storage;
use crate::RuntimeError;
use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use weft_graph::Label;
use weft_kernels::cpu::{HostTensor, WorkSplit};
use weft_kernels::{CpuItem, CpuKernels, Kernels};
use weft_ops::OpNode;

/// A node ready to run: its tensors resolved to host memory.
pub(crate) struct PreparedNode {
    pub node: OpNode,
    pub ins: Vec<HostTensor>,
    pub outs: Vec<HostTensor>,
    pub split: WorkSplit,
    pub label: Label,
    pub layer: Option<u32>,
    /// Injected failure (tests).
    pub fail: bool,
}

/// One level: `nodes` (indices into the job's nodes) and the first work
/// item of each node.
pub(crate) struct Level {
    pub nodes: Range<usize>,
    pub item_starts: Vec<usize>,
    next: AtomicUsize,
}

impl Level {
    pub(crate) fn new(nodes: Range<usize>, splits: &[PreparedNode]) -> Level {
        let mut item_starts = Vec::with_capacity(nodes.len() + 1);
        let mut total = 0;
        item_starts.push(0);
        for n in &splits[nodes.clone()] {
            total += n.split.items;
            item_starts.push(total);
        }
        Level {
            nodes,
            item_starts,
            next: AtomicUsize::new(0),
        }
    }

    fn items(&self) -> usize {
        *self.item_starts.last().unwrap_or(&0)
    }
}

/// A timed piece of work (for `finish_with_timing` and traces).
#[derive(Clone, Copy, Debug)]
pub(crate) struct WorkEvent {
    pub node: usize,
    pub thread: usize,
    pub start: Duration,
    pub end: Duration,
}

/// One command buffer on its way through the pool.
pub(crate) struct Job {
    pub nodes: Vec<PreparedNode>,
    pub levels: Vec<Level>,
    /// Buffers this job touches, kept alive until it completes.
    pub _keep_alive: Vec<Arc<Storage>>,
    /// Shared by the command buffers of one commit: once one fails, the rest skip.
    pub commit_failed: Arc<AtomicBool>,
    pub timed: bool,
    pub epoch: Instant,
    pub events: Mutex<Vec<WorkEvent>>,
    error: Mutex<Option<RuntimeError>>,
    done: Mutex<bool>,
    done_cv: Condvar,
    done_flag: AtomicBool,
    pub started: Mutex<Option<Duration>>,
    pub finished: Mutex<Option<Duration>>,
}

impl Job {
    pub(crate) fn new(
        nodes: Vec<PreparedNode>,
        levels: Vec<Level>,
        keep_alive: Vec<Arc<Storage>>,
        commit_failed: Arc<AtomicBool>,
        timed: bool,
        epoch: Instant,
    ) -> Job {
        Job {
            nodes,
            levels,
            _keep_alive: keep_alive,
            commit_failed,
            timed,
            epoch,
            events: Mutex::new(Vec::new()),
            error: Mutex::new(None),
            done: Mutex::new(false),
            done_cv: Condvar::new(),
            done_flag: AtomicBool::new(false),
            started: Mutex::new(None),
            finished: Mutex::new(None),
        }
    }

    fn fail(&self, e: RuntimeError) {
        self.commit_failed.store(true, Ordering::Release);
        let mut slot = lock(&self.error);
        if slot.is_none() {
            *slot = Some(e);
        }
    }

    /// Blocks until the job has run; returns its first failure.
    pub(crate) fn wait(&self) -> Result<(), RuntimeError> {
        self.wait_done();
        match lock(&self.error).take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Blocks until the job has run.
    pub(crate) fn wait_done(&self) {
        let spin_until = Instant::now() + Duration::from_micros(50);
        while !self.done_flag.load(Ordering::Acquire) && Instant::now() < spin_until {
            std::hint::spin_loop();
        }
        let mut done = lock(&self.done);
        while !*done {
            done = self.done_cv.wait(done).unwrap_or_else(|p| p.into_inner());
        }
    }

    pub(crate) fn is_done(&self) -> bool {
        self.done_flag.load(Ordering::Acquire)
    }

    fn complete(&self) {
        let mut done = lock(&self.done);
        *done = true;
        self.done_flag.store(true, Ordering::Release);
        self.done_cv.notify_all();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The barrier between levels: spin briefly (the common case on idle cores
/// costs well under a microsecond), then sleep on a condition variable so a
/// preempted partner does not leave a thread burning a whole time slice.
struct LevelBarrier {
    threads: usize,
    arrived: AtomicUsize,
    generation: AtomicUsize,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
}

/// How long a thread spins at a barrier before it sleeps.
const BARRIER_SPIN: Duration = Duration::from_micros(30);

impl LevelBarrier {
    fn new(threads: usize) -> Self {
        Self {
            threads,
            arrived: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            cv: Condvar::new(),
        }
    }

    fn wait(&self) {
        if self.threads == 1 {
            return;
        }
        let gen = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.threads {
            self.arrived.store(0, Ordering::Relaxed);
            self.generation.fetch_add(1, Ordering::SeqCst);
            if self.sleepers.load(Ordering::SeqCst) > 0 {
                let _guard = lock(&self.lock);
                self.cv.notify_all();
            }
            return;
        }
        let start = Instant::now();
        let mut spins = 0u32;
        while self.generation.load(Ordering::Acquire) == gen {
            std::hint::spin_loop();
            spins += 1;
            if spins.is_multiple_of(64) && start.elapsed() > BARRIER_SPIN {
                break;
            }
        }
        if self.generation.load(Ordering::Acquire) != gen {
            return;
        }
        let mut guard = lock(&self.lock);
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        while self.generation.load(Ordering::SeqCst) == gen {
            guard = self.cv.wait(guard).unwrap_or_else(|p| p.into_inner());
        }
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }
}

struct Shared {
    threads: usize,
    queue: Mutex<VecDeque<(u64, Arc<Job>)>>,
    queue_cv: Condvar,
    published: AtomicU64,
    shutdown: AtomicBool,
    barrier: LevelBarrier,
    counters: Arc<LiveCounters>,
}

/// The pool: `threads` workers running jobs in submission order.
pub(crate) struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    next_seq: Mutex<u64>,
}

impl ThreadPool {
    pub(crate) fn new(
        threads: usize,
        counters: Arc<LiveCounters>,
    ) -> Result<ThreadPool, RuntimeError> {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            threads,
            queue: Mutex::new(VecDeque::new()),
            queue_cv: Condvar::new(),
            published: AtomicU64::new(0),
            shutdown: AtomicBool::new(false),
            barrier: LevelBarrier::new(threads),
            counters,
        });
        let mut workers = Vec::with_capacity(threads);
        for index in 0..threads {
            let s = Arc::clone(&shared);
            let handle = std::thread::Builder::new()
                .name(format!("weft-cpu-{index}"))
                .spawn(move || worker(s, index))
                .map_err(|e| {
                    RuntimeError::Usage(format!("cannot start CPU worker thread {index}: {e}"))
                })?;
            workers.push(handle);
        }
        Ok(ThreadPool {
            shared,
            workers,
            next_seq: Mutex::new(0),
        })
    }

    pub(crate) fn threads(&self) -> usize {
        self.shared.threads
    }

    /// Queues `job`; it runs after every job submitted before it.
    pub(crate) fn submit(&self, job: Arc<Job>) {
        let mut seq = lock(&self.next_seq);
        let mut q = lock(&self.shared.queue);
        q.push_back((*seq, job));
        *seq += 1;
        self.shared.published.store(*seq, Ordering::Release);
        self.shared.queue_cv.notify_all();
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        {
            let _q = lock(&self.shared.queue);
            self.shared.shutdown.store(true, Ordering::Release);
            self.shared.queue_cv.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// The job with sequence number `seq`, once published; `None` on shutdown.
fn next_job(s: &Shared, seq: u64) -> Option<Arc<Job>> {
    let spin_until = Instant::now() + Duration::from_micros(30);
    while s.published.load(Ordering::Acquire) <= seq && Instant::now() < spin_until {
        std::hint::spin_loop();
    }
    let mut q = lock(&s.queue);
    loop {
        if let Some((_, job)) = q.iter().find(|(n, _)| *n == seq) {
            return Some(Arc::clone(job));
        }
        if s.shutdown.load(Ordering::Acquire) {
            return None;
        }
        q = s.queue_cv.wait(q).unwrap_or_else(|p| p.into_inner());
    }
}

fn worker(s: Arc<Shared>, index: usize) {
    let mut seq = 0u64;
    while let Some(job) = next_job(&s, seq) {
        run_job(&s, &job, index);
        if index == 0 {
            let mut q = lock(&s.queue);
            if q.front().is_some_and(|(n, _)| *n == seq) {
                q.pop_front();
            }
        }
        seq += 1;
    }
}

fn run_job(s: &Shared, job: &Job, index: usize) {
    if index == 0 {
        *lock(&job.started) = Some(job.epoch.elapsed());
    }
    let skip = job.commit_failed.load(Ordering::Acquire);
    let mut events = Vec::new();
    for level in &job.levels {
        if !skip && !job.commit_failed.load(Ordering::Relaxed) {
            run_level(job, level, index, &mut events);
        }
        s.barrier.wait();
    }
    if job.timed && !events.is_empty() {
        lock(&job.events).extend(events);
    }
    // Everyone has passed the last barrier: the job is over.
    s.barrier.wait();
    if index == 0 {
        if !skip {
            let nodes = job.nodes.len() as u64;
            LiveCounters::add(&s.counters.dispatches, nodes);
            LiveCounters::add(
                &s.counters.barriers,
                job.levels.len().saturating_sub(1) as u64,
            );
        }
        *lock(&job.finished) = Some(job.epoch.elapsed());
        job.complete();
    }
}

fn run_level(job: &Job, level: &Level, thread: usize, events: &mut Vec<WorkEvent>) {
    let total = level.items();
    loop {
        let i = level.next.fetch_add(1, Ordering::Relaxed);
        if i >= total {
            return;
        }
        let k = level.item_starts.partition_point(|&start| start <= i) - 1;
        let node_index = level.nodes.start + k;
        let n = &job.nodes[node_index];
        let item = i - level.item_starts[k];
        let start = job.timed.then(|| job.epoch.elapsed());
        let result = if n.fail {
            Err(weft_ops::OpError::Record("injected fault".into()))
        } else {
            // SAFETY: the tensors were bounds-checked against live buffers
            // when recorded, the job keeps those buffers alive, and the
            // schedule puts no conflicting node in this level.
            unsafe {
                let mut at = CpuItem {
                    split: &n.split,
                    item,
                };
                CpuKernels.launch(&mut at, &n.node, &n.ins, &n.outs)
            }
        };
        if let Some(start) = start {
            events.push(WorkEvent {
                node: node_index,
                thread,
                start,
                end: job.epoch.elapsed(),
            });
        }
        if let Err(e) = result {
            job.fail(RuntimeError::Execution {
                op: n.node.op.name(),
                label: n.label.to_string(),
                message: e.to_string(),
            });
        }
    }
}
