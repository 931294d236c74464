//! Cohorts: B sequences decoding one token each in one recorded step,
//! published all together or not at all; at one shared position and plan
//! (`plan_next_step`, `run_step`), or each at its own (`plan_each`,
//! `run_each_step`: a server's sequences, which joined at different times).
//!
//! Before anything runs, [`Cohort::plan_next_step`] checks that every lane
//! is healthy, at the same position and has the same plan (layout and
//! span); a refusal there changes nothing and poisons nothing. After the
//! step drained, publication has three phases: `validate_step_commit` on
//! every lane (each hands back a ticket that borrows its lane), the
//! caller's commit gate, then `publish_step_end` on every lane, which cannot
//! fail. A failure in execution, in validation or at the gate poisons every
//! lane: the lanes advance together or are all marked for reset/restore.

use super::kv::{KvCache, StepTicket};
use super::span::CacheSpan;
use crate::{GraphExecutor, GraphSession, RuntimeError, SubmissionChain};
use weft_ops::Tensor;

/// The shared plan of a cohort step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CohortSpan {
    /// Number of lanes (B); row `b` of the step belongs to lane `b`.
    pub lanes: usize,
    /// The span every lane writes (one token at the shared position).
    pub span: CacheSpan,
}

impl CohortSpan {
    /// The shared position.
    pub fn position(&self) -> u32 {
        self.span.start
    }
}

/// B caches stepping together.
pub struct Cohort<'a> {
    lanes: Vec<&'a mut KvCache>,
}

/// Validated, unpublished steps of every lane.
#[must_use = "validated steps must be published (publish) or aborted"]
pub struct CohortTickets<'c> {
    tickets: Vec<StepTicket<'c>>,
}

impl CohortTickets<'_> {
    /// Publishes every lane. Cannot fail.
    pub fn publish(self) {
        for ticket in self.tickets {
            KvCache::publish_step_end(ticket);
        }
    }

    /// Gives the step up: every lane is poisoned with `why`.
    pub fn abort(self, why: &str) {
        for ticket in self.tickets {
            ticket.abort(why);
        }
    }
}

impl<'a> Cohort<'a> {
    /// A cohort of `lanes` (at least one).
    pub fn new(lanes: Vec<&'a mut KvCache>) -> Result<Cohort<'a>, RuntimeError> {
        if lanes.is_empty() {
            return Err(RuntimeError::Usage(
                "cohort: no lanes; pass at least one cache".into(),
            ));
        }
        Ok(Cohort { lanes })
    }

    /// Number of lanes (B).
    pub fn len(&self) -> usize {
        self.lanes.len()
    }

    /// Always false: a cohort has at least one lane.
    pub fn is_empty(&self) -> bool {
        self.lanes.is_empty()
    }

    /// Lane `b`'s cache.
    pub fn lane(&self, b: usize) -> Option<&KvCache> {
        self.lanes.get(b).map(|l| &**l)
    }

    /// Plans one decode token for every lane. Refused, without poisoning
    /// anything, when a lane is poisoned, the lanes' positions differ, or
    /// their plans (layouts, spans) differ.
    pub fn plan_next_step(&self) -> Result<CohortSpan, RuntimeError> {
        let first = &self.lanes[0];
        let span = first
            .plan_next_step()
            .map_err(|e| RuntimeError::Usage(format!("cohort lane 0: {e}")))?;
        for (b, lane) in self.lanes.iter().enumerate().skip(1) {
            if lane.position() != first.position() {
                return Err(RuntimeError::Usage(format!(
                    "cohort: lane {b} is at position {} but lane 0 at {}; a cohort steps lanes at one position: \
                     step the lagging lanes alone first (nothing was run or poisoned)",
                    lane.position(),
                    first.position()
                )));
            }
            let lane_span = lane
                .plan_next_step()
                .map_err(|e| RuntimeError::Usage(format!("cohort lane {b}: {e}")))?;
            if lane.config() != first.config() || lane_span != span {
                return Err(RuntimeError::Usage(format!(
                    "cohort: lane {b} has another cache layout or plan than lane 0 ({lane_span:?} vs {span:?}); \
                     build every lane's cache with the same config (nothing was run or poisoned)"
                )));
            }
        }
        Ok(CohortSpan {
            lanes: self.lanes.len(),
            span,
        })
    }

    /// Marks every lane unusable until reset or restore.
    pub fn poison(&mut self, why: &str) {
        for lane in &mut self.lanes {
            lane.poison(why);
        }
    }

    /// Plans one decode token for every lane, each at its own position:
    /// lane `b` writes `spans[b]`. Refused, without poisoning anything, when
    /// a lane is poisoned or full.
    pub fn plan_each(&self) -> Result<Vec<CacheSpan>, RuntimeError> {
        self.lanes
            .iter()
            .enumerate()
            .map(|(b, lane)| {
                lane.plan_next_step().map_err(|e| {
                    RuntimeError::Usage(format!(
                        "cohort lane {b}: {e} (nothing was run or poisoned)"
                    ))
                })
            })
            .collect()
    }

    /// Validates a drained step at `position` on every lane. If any lane
    /// fails, every lane is poisoned and the error names the lane.
    pub fn validate_step_commit(
        &mut self,
        position: u32,
    ) -> Result<CohortTickets<'_>, RuntimeError> {
        let positions = vec![position; self.lanes.len()];
        self.validate_each(&positions)
    }

    /// Validates a drained step on every lane, lane `b`'s at
    /// `positions[b]`. If any lane fails, every lane is poisoned and the
    /// error names the lane.
    pub fn validate_each(&mut self, positions: &[u32]) -> Result<CohortTickets<'_>, RuntimeError> {
        if positions.len() != self.lanes.len() {
            let why = format!(
                "{} positions given for {} lanes",
                positions.len(),
                self.lanes.len()
            );
            self.poison(&why);
            return Err(RuntimeError::Usage(format!("cohort: {why}")));
        }
        let failing = self
            .lanes
            .iter()
            .zip(positions)
            .position(|(lane, &p)| lane.step_commit_problem(p).is_some());
        if let Some(b) = failing {
            let position = positions[b];
            // Validating the failing lane poisons it with its own reason.
            let err = match self.lanes[b].validate_step_commit(position) {
                Err(e) => RuntimeError::Usage(format!("cohort lane {b}: {e}")),
                Ok(ticket) => {
                    ticket.abort("a cohort lane failed validation");
                    RuntimeError::Usage(format!("cohort lane {b} failed validation"))
                }
            };
            self.poison(&format!(
                "lane {b} of the cohort failed validation at {position}: {err}"
            ));
            return Err(err);
        }
        // Every lane passed the same check, so none of these fails.
        let tickets = self
            .lanes
            .iter_mut()
            .zip(positions)
            .map(|(lane, &p)| lane.validate_step_commit(p))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(CohortTickets { tickets })
    }

    /// Runs one cohort step as a transaction: `record` records one token per
    /// lane (row `b` for lane `b`) and returns the output to read back;
    /// `gate` sees the output and may refuse the commit. Returns the output
    /// as f32.
    pub fn run_step(
        &mut self,
        exec: &mut GraphExecutor,
        record: impl FnOnce(
            &mut GraphSession<'_>,
            &[&KvCache],
            &CohortSpan,
        ) -> Result<Tensor, RuntimeError>,
        gate: impl FnOnce(&CohortSpan, &[f32]) -> Result<(), String>,
    ) -> Result<Vec<f32>, RuntimeError> {
        let plan = self.plan_next_step()?;
        let mut chain = SubmissionChain::new();
        let mut session = exec.begin_recorded();
        let lanes: Vec<&KvCache> = self.lanes.iter().map(|l| &**l).collect();
        let output = record(&mut session, &lanes, &plan)?;
        chain.push(session.commit()?);
        let position = plan.position();
        if let Err(e) = chain.drain() {
            self.poison(&format!(
                "the cohort step at position {position} failed: {e}"
            ));
            return Err(e);
        }
        let values = match exec.read_f32(&output) {
            Ok(v) => v,
            Err(e) => {
                self.poison(&format!(
                    "reading the output of the cohort step at {position} failed: {e}"
                ));
                return Err(e);
            }
        };
        let tickets = self.validate_step_commit(position)?;
        if let Err(why) = gate(&plan, &values) {
            let why = format!("the commit gate refused the cohort step at {position}: {why}");
            tickets.abort(&why);
            return Err(RuntimeError::Usage(format!(
                "cohort: {why}; every lane is poisoned: reset() and replay, or restore() snapshots"
            )));
        }
        tickets.publish();
        Ok(values)
    }

    /// Runs one step of every lane at its own position as a transaction:
    /// `record` records one token per lane (row `b` for lane `b`, writing
    /// `spans[b]`) and returns the output to read back; `gate` sees the
    /// output and may refuse the commit. Every lane is validated, then the
    /// one gate decides, then every lane is published; a failure anywhere
    /// after submission poisons every lane. Returns the output as f32.
    pub fn run_each_step(
        &mut self,
        exec: &mut GraphExecutor,
        record: impl FnOnce(
            &mut GraphSession<'_>,
            &[&KvCache],
            &[CacheSpan],
        ) -> Result<Tensor, RuntimeError>,
        gate: impl FnOnce(&[CacheSpan], &[f32]) -> Result<(), String>,
    ) -> Result<Vec<f32>, RuntimeError> {
        let spans = self.plan_each()?;
        let mut chain = SubmissionChain::new();
        let mut session = exec.begin_recorded();
        let lanes: Vec<&KvCache> = self.lanes.iter().map(|l| &**l).collect();
        let output = record(&mut session, &lanes, &spans)?;
        chain.push(session.commit()?);
        if let Err(e) = chain.drain() {
            self.poison(&format!("the cohort step failed: {e}"));
            return Err(e);
        }
        let values = match exec.read_f32(&output) {
            Ok(v) => v,
            Err(e) => {
                self.poison(&format!(
                    "reading the output of the cohort step failed: {e}"
                ));
                return Err(e);
            }
        };
        let positions: Vec<u32> = spans.iter().map(|s| s.start).collect();
        let tickets = self.validate_each(&positions)?;
        if let Err(why) = gate(&spans, &values) {
            let why = format!("the commit gate refused the cohort step: {why}");
            tickets.abort(&why);
            return Err(RuntimeError::Usage(format!(
                "cohort: {why}; every lane is poisoned: reset() and replay, or restore() snapshots"
            )));
        }
        tickets.publish();
        Ok(values)
    }
}
