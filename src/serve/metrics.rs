//! Server counters and histograms, written as Prometheus text by
//! `GET /metrics`.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Upper bounds (seconds) of the latency histograms' buckets.
const TTFT_BUCKETS: &[f64] = &[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
const ITL_BUCKETS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];

/// A cumulative histogram over fixed buckets.
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, v: f64) {
        for (b, c) in self.bounds.iter().zip(&mut self.counts) {
            if v <= *b {
                *c += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }

    fn write(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

/// Everything `/metrics` reports; shared by the handlers and the engine.
pub struct Metrics {
    pub requests: AtomicU64,
    pub requests_failed: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub completion_tokens: AtomicU64,
    pub cached_prompt_tokens: AtomicU64,
    /// Jobs sent and not yet admitted to a sequence: the queue bound
    /// itself, so the gauge is never stale.
    pub queue_depth: AtomicU64,
    pub batch_size: AtomicU64,
    pub kv_used_tokens: AtomicU64,
    pub kv_capacity_tokens: AtomicU64,
    pub lane_recoveries: AtomicU64,
    /// Batch decode steps, and the rows (sequence tokens) they decoded.
    pub batch_steps: AtomicU64,
    pub batch_rows: AtomicU64,
    /// Command buffers committed, and those that reused a step plan.
    pub commits: AtomicU64,
    pub planned_commits: AtomicU64,
    ttft: Mutex<Histogram>,
    itl: Mutex<Histogram>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: AtomicU64::new(0),
            requests_failed: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            completion_tokens: AtomicU64::new(0),
            cached_prompt_tokens: AtomicU64::new(0),
            queue_depth: AtomicU64::new(0),
            batch_size: AtomicU64::new(0),
            kv_used_tokens: AtomicU64::new(0),
            kv_capacity_tokens: AtomicU64::new(0),
            lane_recoveries: AtomicU64::new(0),
            batch_steps: AtomicU64::new(0),
            batch_rows: AtomicU64::new(0),
            commits: AtomicU64::new(0),
            planned_commits: AtomicU64::new(0),
            ttft: Mutex::new(Histogram::new(TTFT_BUCKETS)),
            itl: Mutex::new(Histogram::new(ITL_BUCKETS)),
        }
    }
}

impl Metrics {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn set(gauge: &AtomicU64, v: u64) {
        gauge.store(v, Ordering::Relaxed);
    }

    /// Seconds from a request's arrival to its first token.
    pub fn time_to_first_token(&self, seconds: f64) {
        if let Ok(mut h) = self.ttft.lock() {
            h.observe(seconds);
        }
    }

    /// Seconds between two tokens of one request.
    pub fn inter_token(&self, seconds: f64) {
        if let Ok(mut h) = self.itl.lock() {
            h.observe(seconds);
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let counters = [
            (
                "weft_requests_total",
                "Requests received by the completion endpoints.",
                &self.requests,
            ),
            (
                "weft_requests_failed_total",
                "Requests answered with an error.",
                &self.requests_failed,
            ),
            (
                "weft_prompt_tokens_total",
                "Prompt tokens of finished requests.",
                &self.prompt_tokens,
            ),
            (
                "weft_completion_tokens_total",
                "Tokens generated.",
                &self.completion_tokens,
            ),
            (
                "weft_prompt_tokens_cached_total",
                "Prompt tokens whose cache rows were reused.",
                &self.cached_prompt_tokens,
            ),
            (
                "weft_lane_recoveries_total",
                "Sequences reset and replayed after a failed step.",
                &self.lane_recoveries,
            ),
            (
                "weft_batch_steps_total",
                "Decode steps that stepped several sequences together.",
                &self.batch_steps,
            ),
            (
                "weft_batch_rows_total",
                "Sequence tokens decoded by batch steps.",
                &self.batch_rows,
            ),
            (
                "weft_commits_total",
                "Steps committed to the executor.",
                &self.commits,
            ),
            (
                "weft_planned_commits_total",
                "Commits that reused a kept step plan (no fusion or scheduling).",
                &self.planned_commits,
            ),
        ];
        for (name, help, c) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                get(c)
            );
        }
        let gauges = [
            (
                "weft_queue_depth",
                "Requests waiting for a sequence slot.",
                &self.queue_depth,
            ),
            (
                "weft_batch_size",
                "Sequences being generated now.",
                &self.batch_size,
            ),
            (
                "weft_kv_cache_used_tokens",
                "Cache rows held by active and kept sequences.",
                &self.kv_used_tokens,
            ),
            (
                "weft_kv_cache_capacity_tokens",
                "Cache rows allocated.",
                &self.kv_capacity_tokens,
            ),
        ];
        for (name, help, g) in gauges {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {}",
                get(g)
            );
        }
        if let Ok(h) = self.ttft.lock() {
            h.write(
                &mut out,
                "weft_time_to_first_token_seconds",
                "Arrival to first generated token.",
            );
        }
        if let Ok(h) = self.itl.lock() {
            h.write(
                &mut out,
                "weft_inter_token_latency_seconds",
                "Time between consecutive tokens of a request.",
            );
        }
        out
    }
}
