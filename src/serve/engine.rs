//! The engine thread: owns the executor, the model and every cache, and
//! serves all requests.
//!
//! Continuous batching: each iteration takes in the jobs that arrived
//! (tokenizing and checking them at once, so a bad prompt is answered
//! without waiting for a slot), admits waiting jobs while fewer than
//! `parallel` sequences run, then advances every running sequence by
//! exactly one step: the sequences that decode go together, up to
//! `decode_batch` rows in one batch step (`Model::step_batch`: the weights
//! read once, each row at its own sequence's position, each row's logits
//! the bits its own step would give), and each sequence still prefilling
//! takes one chunk (the model's chunk policy) on its own. Sequences join
//! and leave between iterations, and a long prompt is prefilled one chunk
//! per iteration while the others keep decoding. Each sequence has its own cache, so a failed step poisons
//! only that sequence's cache (the transaction rules); the sequence is then
//! reset and replayed once, and on a second failure its client gets an
//! error. Finished sequences' caches go to the [`PrefixStore`]; with
//! `--slots-dir`, a request that names a session continues from its file
//! and saves into it (`sessions.rs`).

mod sessions;

use super::error::ApiError;
use super::job::{Event, FinishReason, GenParams, Job, PromptSource, Work};
use super::logprobs::token_logprob;
use super::metrics::Metrics;
use super::prefix::{KeptSequence, PrefixStore, ResumePoint};
use super::prompt::ChatPrompt;
use super::slots::SlotsDir;
use super::text::StopText;
use crate::models::sampling::Sampler;
use crate::models::{LogitRows, Model};
use crate::runtime::cache::{ChunkPolicy, KvCache};
use crate::runtime::GraphExecutor;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Whether the server can take requests.
#[derive(Clone, Debug, PartialEq)]
pub enum Health {
    Loading,
    Ok,
    /// The engine cannot serve (the model failed to load, the engine
    /// stopped): the reason.
    Degraded(String),
}

/// State the handlers and the engine share.
pub struct Shared {
    pub health: Mutex<Health>,
    pub metrics: Metrics,
    /// Set at the shutdown deadline: every running and waiting job is
    /// answered with an error.
    pub cancel_all: AtomicBool,
    /// The engine thread returns at its next iteration.
    pub stop: AtomicBool,
}

impl Shared {
    pub fn new() -> Shared {
        Shared {
            health: Mutex::new(Health::Loading),
            metrics: Metrics::default(),
            cancel_all: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        }
    }

    pub fn health(&self) -> Health {
        self.health.lock().map_or_else(
            |_| Health::Degraded("the health lock is poisoned".into()),
            |h| h.clone(),
        )
    }

    pub fn set_health(&self, h: Health) {
        if let Ok(mut g) = self.health.lock() {
            *g = h;
        }
    }
}

impl Default for Shared {
    fn default() -> Self {
        Self::new()
    }
}

/// Rollback points kept per sequence.
const MAX_POINTS: usize = 4;

/// Loads the executor and the model on the engine thread.
pub type Loader = Box<dyn FnOnce() -> anyhow::Result<(GraphExecutor, Model, ChunkPolicy)> + Send>;

/// How the engine runs.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Sequences generated at once.
    pub parallel: usize,
    /// Context per sequence (`None`: the model's, at most 4096).
    pub ctx: Option<u32>,
    /// Finished sequences kept for prefix reuse.
    pub keep: usize,
    /// Largest prefill chunk (tokens) a sequence takes per round, below
    /// the model's chunk policy, so a long prompt yields to the others.
    pub prefill_chunk: u32,
    /// Where sessions are saved (`--slots-dir`); `None`: sessions are off.
    pub slots_dir: Option<SlotsDir>,
    /// Most decoding sequences stepped together (0: up to `parallel`);
    /// capped where the model's batch rows stop being exact.
    pub decode_batch: usize,
}

/// How a sequence ended.
enum Outcome {
    Finished(FinishReason),
    Failed(ApiError),
    /// The client went away: nothing to send.
    Cancelled,
}

/// One running sequence.
struct Lane<'m> {
    job: Job,
    cache: KvCache,
    /// Tokens whose rows the cache holds.
    tokens: Vec<u32>,
    prompt_len: usize,
    /// Tokens still to prefill.
    pending: Vec<u32>,
    /// The sampled token the next decode step embeds.
    to_step: Option<u32>,
    /// Logits after `tokens` (valid once nothing is pending).
    logits: Vec<f32>,
    sampler: Sampler,
    generated: usize,
    max_new: usize,
    text: StopText<'m>,
    /// Points this sequence can be rolled back to: its prompt's end and
    /// those of the kept sequence it continued.
    points: Vec<ResumePoint>,
    /// Whether `points` holds this prompt's end.
    prompt_end_taken: bool,
    cached: usize,
    recoveries: u32,
    last_token: Option<Instant>,
    outcome: Option<Outcome>,
    /// The session this sequence saves into when it finishes.
    session: Option<String>,
}

/// A checked job waiting for a sequence slot.
struct Waiting {
    job: Job,
    tokens: Vec<u32>,
}

/// The engine's state on its thread.
struct Engine<'m> {
    exec: GraphExecutor,
    model: &'m Model,
    chat: ChatPrompt,
    policy: ChunkPolicy,
    prefill_chunk: u32,
    ctx: u32,
    parallel: usize,
    caches_limit: usize,
    caches_made: usize,
    free: Vec<KvCache>,
    prefix: PrefixStore,
    lanes: Vec<Lane<'m>>,
    waiting: VecDeque<Waiting>,
    shared: Arc<Shared>,
    slots: Option<SlotsDir>,
    /// Most rows of a batch decode step (below 2: one sequence per step).
    batch_limit: usize,
}

/// Runs the engine until `shared.stop` is set or every sender is gone.
pub fn run(loader: Loader, config: EngineConfig, shared: Arc<Shared>, jobs: Receiver<Work>) {
    let (exec, model, policy) = match loader() {
        Ok(loaded) => loaded,
        Err(e) => {
            let why = format!("the model failed to load: {e:#}");
            eprintln!("error: {why}");
            shared.set_health(Health::Degraded(why.clone()));
            // Answer whatever arrives until the server stops.
            while !shared.stop.load(Ordering::Relaxed) {
                match jobs.recv_timeout(Duration::from_millis(100)) {
                    Ok(Work::Generate(job)) => {
                        shared.metrics.queue_depth.fetch_sub(1, Ordering::Relaxed);
                        let _ = job
                            .events
                            .send(Event::Error(ApiError::unavailable(why.clone(), 60)));
                    }
                    Ok(Work::Session(job)) => {
                        let _ = job.reply.send(Err(ApiError::unavailable(why.clone(), 60)));
                    }
                    Err(_) => {}
                }
            }
            return;
        }
    };
    let ctx = config
        .ctx
        .unwrap_or_else(|| model.trained_context().min(4096))
        .max(2);
    let parallel = config.parallel.max(1);
    let wanted = match config.decode_batch {
        0 => parallel,
        n => n.min(parallel),
    };
    let batch_limit = if model.check_finite() {
        // The per-layer check probes one sequence's step.
        1
    } else {
        model.batch_limit(&exec, wanted).max(1)
    };
    let mut engine = Engine {
        exec,
        model: &model,
        chat: ChatPrompt::new(&model),
        policy,
        prefill_chunk: config.prefill_chunk.max(1),
        ctx,
        parallel,
        caches_limit: parallel + config.keep,
        caches_made: 0,
        free: Vec::new(),
        prefix: PrefixStore::new(config.keep),
        lanes: Vec::new(),
        waiting: VecDeque::new(),
        shared: shared.clone(),
        slots: config.slots_dir,
        batch_limit,
    };
    shared.set_health(Health::Ok);
    eprintln!(
        "weft serve: model `{}` loaded; context {ctx} tokens, up to {parallel} sequences at once, \
         up to {batch_limit} decoding in one step",
        model.name
    );
    engine.serve(&jobs);
}

impl<'m> Engine<'m> {
    fn serve(&mut self, jobs: &Receiver<Work>) {
        loop {
            if self.shared.stop.load(Ordering::Relaxed) {
                self.cancel_everything("the server stopped");
                return;
            }
            if self.lanes.is_empty() && self.waiting.is_empty() {
                match jobs.recv_timeout(Duration::from_millis(100)) {
                    Ok(job) => self.intake(job),
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
            while let Ok(job) = jobs.try_recv() {
                self.intake(job);
            }
            if self.shared.cancel_all.load(Ordering::Relaxed) {
                self.cancel_everything("the server is shutting down");
                continue;
            }
            self.drop_abandoned_waiting();
            self.admit();
            for i in 0..self.lanes.len() {
                self.check_client(i);
            }
            let batched = self.decode_together();
            for i in 0..self.lanes.len() {
                if self.lanes[i].outcome.is_none() && !batched.contains(&i) {
                    self.advance(i);
                }
            }
            self.retire();
            self.update_gauges();
        }
    }

    /// Tokenizes and checks a new job, answered at once when bad; answers
    /// a session save or restore.
    fn intake(&mut self, work: Work) {
        let job = match work {
            Work::Generate(job) => job,
            Work::Session(job) => return self.session_job(job),
        };
        match self.prompt_tokens(&job) {
            Ok(tokens) => self.waiting.push_back(Waiting { job, tokens }),
            Err(e) => {
                self.shared
                    .metrics
                    .queue_depth
                    .fetch_sub(1, Ordering::Relaxed);
                let _ = job.events.send(Event::Error(e));
            }
        }
    }

    fn prompt_tokens(&self, job: &Job) -> Result<Vec<u32>, ApiError> {
        let model = self.model;
        let (tokens, what) = match &job.prompt {
            PromptSource::Chat(messages) => (self.chat.tokens(model, messages)?, "messages"),
            PromptSource::Text(text) => (model.tokenizer.encode(text), "prompt"),
            PromptSource::Ids(ids) => {
                if let Some(bad) = ids.iter().find(|&&t| t as usize >= model.vocab()) {
                    return Err(ApiError::invalid_param(
                        "prompt",
                        format!(
                            "token id {bad} is outside the vocabulary of {}",
                            model.vocab()
                        ),
                    ));
                }
                (ids.clone(), "prompt")
            }
        };
        if tokens.is_empty() {
            return Err(ApiError::invalid_param(
                what,
                "the prompt is empty after tokenization; give some text",
            ));
        }
        let ctx = self.ctx as usize;
        if tokens.len() >= ctx {
            return Err(ApiError::context_exceeded(format!(
                "the prompt has {} tokens but the context holds {ctx} tokens (--ctx), leaving no room to generate; shorten the {what}",
                tokens.len()
            )));
        }
        if let Some(max) = job.params.max_tokens {
            if tokens.len().saturating_add(max) > ctx {
                return Err(ApiError::context_exceeded(format!(
                    "the prompt has {} tokens and max_tokens asks for {max} more, but the context holds {ctx} tokens (--ctx); lower max_tokens to at most {}",
                    tokens.len(),
                    ctx - tokens.len()
                )));
            }
        }
        Ok(tokens)
    }

    /// Waiting jobs whose client left or whose time ran out.
    fn drop_abandoned_waiting(&mut self) {
        let now = Instant::now();
        let shared = &self.shared;
        self.waiting.retain(|w| {
            let gone = w.job.events.is_closed();
            let late = now >= w.job.deadline;
            if gone || late {
                shared.metrics.queue_depth.fetch_sub(1, Ordering::Relaxed);
                if late && !gone {
                    let secs = (w.job.deadline - w.job.received).as_secs_f64();
                    let _ = w.job.events.send(Event::Error(ApiError::timeout(secs)));
                }
            }
            !(gone || late)
        });
    }

    /// Starts waiting jobs while slots are free.
    fn admit(&mut self) {
        while self.lanes.len() < self.parallel {
            let Some(w) = self.waiting.pop_front() else {
                return;
            };
            self.shared
                .metrics
                .queue_depth
                .fetch_sub(1, Ordering::Relaxed);
            if let Some(lane) = self.start_lane(w) {
                self.lanes.push(lane);
            }
        }
    }

    /// A sequence for `w`, or `None` (its client told why) when no cache
    /// can be had.
    fn start_lane(&mut self, w: Waiting) -> Option<Lane<'m>> {
        let Waiting { job, tokens } = w;
        let from_file = match &job.session {
            Some(name) => match self.session_start(name, &tokens) {
                Ok(r) => r,
                Err(e) => {
                    let _ = job.events.send(Event::Error(e));
                    return None;
                }
            },
            None => None,
        };
        let reused = match from_file {
            Some(r) => Some(r),
            None => self.prefix.take(&mut self.exec, &tokens),
        };
        let (cache, position, logits, points) = match reused {
            Some(r) => (r.cache, r.position, r.logits, r.points),
            None => match self.fresh_cache() {
                Ok(c) => (c, 0, None, Vec::new()),
                Err(e) => {
                    let _ = job.events.send(Event::Error(e));
                    return None;
                }
            },
        };
        let room = self.ctx as usize - tokens.len();
        let max_new = job.params.max_tokens.unwrap_or(room).min(room);
        let GenParams { sampling, stop, .. } = job.params.clone();
        Metrics::add(&self.shared.metrics.cached_prompt_tokens, position as u64);
        let (tokens_cached, pending) = tokens.split_at(position);
        Some(Lane {
            cache,
            prompt_len: tokens.len(),
            tokens: tokens_cached.to_vec(),
            pending: pending.to_vec(),
            to_step: None,
            logits: logits.unwrap_or_default(),
            sampler: Sampler::new(sampling),
            generated: 0,
            max_new,
            text: StopText::new(self.model, stop),
            prompt_end_taken: points.last().is_some_and(|p| p.position == tokens.len()),
            points,
            cached: position,
            recoveries: 0,
            last_token: None,
            outcome: None,
            session: job.session.clone(),
            job,
        })
    }

    /// An empty cache: a free one, a new one, or the least recently used
    /// kept one.
    fn fresh_cache(&mut self) -> Result<KvCache, ApiError> {
        if let Some(mut c) = self.free.pop() {
            c.reset();
            return Ok(c);
        }
        if self.caches_made < self.caches_limit {
            let c = self
                .model
                .new_cache(&mut self.exec, self.ctx, self.policy.max_chunk())
                .map_err(|e| {
                    ApiError::internal(format!(
                        "cannot make a KV cache of {} tokens: {e}",
                        self.ctx
                    ))
                })?;
            self.caches_made += 1;
            return Ok(c);
        }
        self.prefix
            .evict()
            .ok_or_else(|| ApiError::internal("no KV cache is free (every cache is in use)"))
    }

    /// Ends a sequence whose client left or whose time ran out.
    fn check_client(&mut self, i: usize) {
        let lane = &mut self.lanes[i];
        if lane.outcome.is_some() {
            return;
        }
        if lane.job.events.is_closed() {
            lane.outcome = Some(Outcome::Cancelled);
        } else if Instant::now() >= lane.job.deadline {
            let secs = (lane.job.deadline - lane.job.received).as_secs_f64();
            lane.outcome = Some(Outcome::Failed(ApiError::timeout(secs)));
        }
    }

    /// One step of sequence `i`: a prefill chunk or a decode token.
    fn advance(&mut self, i: usize) {
        let model = self.model;
        let lane = &mut self.lanes[i];
        let stepped = if !lane.pending.is_empty() {
            let n = self
                .policy
                .next_chunk(lane.pending.len() as u32, lane.cache.position())
                .min(self.prefill_chunk)
                .min(lane.cache.config().max_chunk) as usize;
            let chunk = &lane.pending[..n];
            match model.step(&mut self.exec, &mut lane.cache, chunk, LogitRows::Last) {
                Ok(logits) => {
                    lane.tokens.extend_from_slice(chunk);
                    lane.pending.drain(..n);
                    lane.logits = logits;
                    Ok(())
                }
                Err(e) => Err(e),
            }
        } else if let Some(t) = lane.to_step {
            match model.step(&mut self.exec, &mut lane.cache, &[t], LogitRows::Last) {
                Ok(logits) => {
                    lane.tokens.push(t);
                    lane.to_step = None;
                    lane.logits = logits;
                    Ok(())
                }
                Err(e) => Err(e),
            }
        } else {
            Ok(())
        };
        if let Err(e) = stepped {
            self.recover(i, &e.to_string());
            return;
        }
        let lane = &mut self.lanes[i];
        if lane.tokens.len() == lane.prompt_len && !lane.prompt_end_taken {
            lane.prompt_end_taken = true;
            if let Ok(snapshot) = lane.cache.snapshot(&mut self.exec) {
                if lane.points.len() >= MAX_POINTS {
                    lane.points.remove(0);
                }
                lane.points.push(ResumePoint {
                    snapshot: Some(snapshot),
                    position: lane.prompt_len,
                    logits: lane.logits.clone(),
                });
            }
        }
        if lane.pending.is_empty() {
            self.sample_and_send(i);
        }
    }

    /// Steps the sequences that decode (nothing to prefill, a sampled token
    /// to embed) in batch steps of up to `batch_limit` rows and sends each
    /// its next token; returns the lanes it stepped. With fewer than two
    /// such sequences, or batching off, steps none.
    fn decode_together(&mut self) -> Vec<usize> {
        let ready: Vec<usize> = (0..self.lanes.len())
            .filter(|&i| {
                let l = &self.lanes[i];
                l.outcome.is_none() && l.pending.is_empty() && l.to_step.is_some()
            })
            .collect();
        if self.batch_limit < 2 || ready.len() < 2 {
            return Vec::new();
        }
        for group in ready.chunks(self.batch_limit) {
            let tokens: Vec<u32> = group
                .iter()
                .filter_map(|&i| self.lanes[i].to_step)
                .collect();
            let caches: Vec<&mut KvCache> = self
                .lanes
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| group.contains(i))
                .map(|(_, l)| &mut l.cache)
                .collect();
            match self.model.step_batch(&mut self.exec, caches, &tokens) {
                Ok(logits) => {
                    let m = &self.shared.metrics;
                    Metrics::add(&m.batch_steps, 1);
                    Metrics::add(&m.batch_rows, group.len() as u64);
                    let vocab = logits.len() / group.len();
                    for (row, &i) in logits.chunks_exact(vocab).zip(group) {
                        let lane = &mut self.lanes[i];
                        lane.tokens.extend(lane.to_step.take());
                        lane.logits = row.to_vec();
                        self.sample_and_send(i);
                    }
                }
                Err(e) => {
                    // The transaction poisoned every lane of the batch.
                    let why = e.to_string();
                    for &i in group {
                        self.recover(i, &why);
                    }
                }
            }
        }
        ready
    }

    /// A failed step poisoned sequence `i`'s cache: reset and replay it
    /// once; a second failure ends it with an error.
    fn recover(&mut self, i: usize, why: &str) {
        let lane = &mut self.lanes[i];
        if lane.recoveries >= 1 {
            lane.outcome = Some(Outcome::Failed(ApiError::internal(format!(
                "generation failed twice on this request's sequence: {why}"
            ))));
            return;
        }
        eprintln!(
            "weft serve: a step failed ({why}); resetting the sequence and replaying its {} tokens",
            lane.tokens.len() + lane.pending.len() + lane.to_step.is_some() as usize
        );
        Metrics::add(&self.shared.metrics.lane_recoveries, 1);
        lane.recoveries += 1;
        let mut replay = std::mem::take(&mut lane.tokens);
        replay.extend(lane.to_step.take());
        replay.append(&mut lane.pending);
        lane.pending = replay;
        lane.cache.reset();
        lane.points.clear();
        lane.prompt_end_taken = false;
    }

    /// Draws the next token of sequence `i` from its logits and sends it.
    fn sample_and_send(&mut self, i: usize) {
        let model = self.model;
        let metrics = &self.shared.metrics;
        let lane = &mut self.lanes[i];
        let tok = if lane.job.params.ignore_eos {
            // A copy: the lane's logits may be kept for prefix reuse.
            let mut masked = lane.logits.clone();
            for &t in model.tokenizer.eog_tokens() {
                if let Some(l) = masked.get_mut(t as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
            lane.sampler.sample(&masked, &lane.tokens)
        } else {
            lane.sampler.sample(&lane.logits, &lane.tokens)
        };
        if model.tokenizer.is_eog(tok) {
            lane.outcome = Some(Outcome::Finished(FinishReason::Stop));
            return;
        }
        lane.generated += 1;
        let logprob = lane
            .job
            .params
            .logprobs
            .map(|top| token_logprob(model, &lane.logits, tok, top));
        let pushed = match lane.text.push(tok) {
            Ok(p) => p,
            Err(e) => {
                lane.outcome = Some(Outcome::Failed(ApiError::internal(format!(
                    "detokenizing token {tok} failed: {e}"
                ))));
                return;
            }
        };
        let now = Instant::now();
        match lane.last_token {
            None => metrics.time_to_first_token((now - lane.job.received).as_secs_f64()),
            Some(t) => metrics.inter_token((now - t).as_secs_f64()),
        }
        lane.last_token = Some(now);
        Metrics::add(&metrics.completion_tokens, 1);
        let _ = lane.job.events.send(Event::Token {
            id: tok,
            text: pushed.text,
            logprob,
        });
        if pushed.stopped {
            lane.outcome = Some(Outcome::Finished(FinishReason::Stop));
        } else if lane.generated >= lane.max_new {
            lane.outcome = Some(Outcome::Finished(FinishReason::Length));
        } else {
            lane.to_step = Some(tok);
        }
    }

    /// Answers and removes finished sequences; their caches are kept.
    fn retire(&mut self) {
        let mut i = 0;
        while i < self.lanes.len() {
            if self.lanes[i].outcome.is_none() {
                i += 1;
                continue;
            }
            let mut lane = self.lanes.swap_remove(i);
            let mut saved = None;
            if let (Some(Outcome::Finished(_)), Some(name)) = (&lane.outcome, &lane.session) {
                if let Err(e) = self.save_into(name, &lane.cache, &lane.tokens) {
                    lane.outcome = Some(Outcome::Failed(e));
                } else {
                    saved = Some(name.clone());
                }
            }
            let metrics = &self.shared.metrics;
            match lane.outcome.take() {
                Some(Outcome::Finished(finish)) => {
                    let tail = lane.text.finish();
                    Metrics::add(&metrics.prompt_tokens, lane.prompt_len as u64);
                    let _ = lane.job.events.send(Event::Done {
                        tail,
                        finish,
                        prompt_tokens: lane.prompt_len,
                        completion_tokens: lane.generated,
                        cached_tokens: lane.cached,
                    });
                }
                Some(Outcome::Failed(e)) => {
                    let _ = lane.job.events.send(Event::Error(e));
                }
                Some(Outcome::Cancelled) | None => {}
            }
            let freed = self.prefix.keep(KeptSequence {
                cache: lane.cache,
                end_logits: (lane.to_step.is_none() && lane.pending.is_empty())
                    .then_some(lane.logits),
                tokens: lane.tokens,
                points: lane.points,
                session: saved,
            });
            self.free.extend(freed);
        }
    }

    /// Answers every running and waiting job with an error.
    fn cancel_everything(&mut self, why: &str) {
        for lane in &mut self.lanes {
            if lane.outcome.is_none() {
                lane.outcome = Some(Outcome::Failed(ApiError::unavailable(why, 5)));
            }
        }
        self.retire();
        for w in self.waiting.drain(..) {
            self.shared
                .metrics
                .queue_depth
                .fetch_sub(1, Ordering::Relaxed);
            let _ = w
                .job
                .events
                .send(Event::Error(ApiError::unavailable(why, 5)));
        }
        self.update_gauges();
    }

    fn update_gauges(&self) {
        let m = &self.shared.metrics;
        Metrics::set(&m.batch_size, self.lanes.len() as u64);
        let used: u64 = self
            .lanes
            .iter()
            .map(|l| l.cache.position() as u64)
            .sum::<u64>()
            + self.prefix.used_tokens();
        Metrics::set(&m.kv_used_tokens, used);
        Metrics::set(
            &m.kv_capacity_tokens,
            self.caches_made as u64 * self.ctx as u64,
        );
        let c = self.exec.counters();
        Metrics::set(&m.commits, c.commits);
        Metrics::set(&m.planned_commits, c.planned_commits);
    }
}
