//! Greedy decoding one step ahead of the device.
//!
//! Each decode step ends with the argmax of its logits, written on the
//! device into one of two one-id buffers, and the next step embeds that id
//! from there: no step waits for the host to pick its token. So while step
//! `k` runs, the host records and submits step `k + 1`, and only then reads
//! step `k`'s id (4 bytes, beside the running step). On a GPU the host's
//! recording hides behind the device's work instead of adding to it.
//!
//! Steps stay cache transactions: each is published, in order, once it has
//! drained and its id was read; a failure poisons the cache. The step
//! submitted after the one whose id ended the generation (a stop token, or
//! the caller's stop) is drained and never published, so the rows it wrote
//! past the published position are never visible.
//!
//! The logits never come back to the host, so each step also writes their
//! sum beside the id: a step whose logits are not finite fails instead of
//! handing over an arbitrary id.

use crate::finite::{check_logits, record_row_sums, LayerProbe};
use crate::model::Model;
use crate::step::LogitRows;
use crate::ModelError;
use weft_ops::{Builder, DType, Op, Shape, Tensor};
use weft_runtime::cache::{CacheSpan, KvCache};
use weft_runtime::{GraphExecutor, InFlight};

/// A submitted step: its work, the id buffer its argmax writes, its span,
/// and its per-layer sums when the finiteness check is on.
struct Pending {
    work: InFlight,
    slot: usize,
    span: CacheSpan,
    probe: Option<LayerProbe>,
}

/// One step's output on the device: `[id (i32), sum of the logits (f32)]`.
#[derive(Clone, Copy)]
struct Slot {
    both: Tensor,
}

impl Slot {
    /// The chosen id, `i32 [1]`: what the next step embeds.
    fn id(&self) -> Result<Tensor, ModelError> {
        Ok(Tensor::new(
            self.both.buffer,
            self.both.offset,
            DType::I32,
            Shape::new(&[1]),
        )?)
    }

    /// The sum of the step's logits, `f32 [1, 1]`.
    fn sum(&self) -> Result<Tensor, ModelError> {
        Ok(Tensor::new(
            self.both.buffer,
            self.both.offset + 4,
            DType::F32,
            Shape::new(&[1, 1]),
        )?)
    }
}

impl Model {
    /// Greedy decoding from `first`, the id that follows the cache's
    /// position: step `k` embeds id `k` (id 0 is `first`) and its argmax is
    /// id `k + 1`, handed to `on_token` as soon as it is read. Produces at
    /// most `max` ids (fewer when the context fills up) and stops early
    /// when `on_token` returns false. Returns how many ids were produced.
    ///
    /// The ids are the argmax of the raw logits, ties to the lowest id, as
    /// [`crate::sampling::argmax`] picks them: temperature 0 without a
    /// repetition penalty.
    pub fn decode_greedy(
        &self,
        exec: &mut GraphExecutor,
        cache: &mut KvCache,
        first: u32,
        max: usize,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<usize, ModelError> {
        if first as usize >= self.embedding_rows() {
            return Err(ModelError::Input(format!(
                "token id {first} is outside the vocabulary of {}",
                self.embedding_rows()
            )));
        }
        if self.vocab() > self.embedding_rows() {
            return Err(ModelError::Unsupported(format!(
                "greedy decoding on the device: {} logits per token but {} embedding rows (an argmax could not be embedded)",
                self.vocab(),
                self.embedding_rows()
            )));
        }
        let room = (cache.config().context - cache.position()) as usize;
        let max = max.min(room);
        if max == 0 {
            return Ok(0);
        }
        let slots = [
            Slot {
                both: exec.named_tensor("greedy.id.0", DType::I32, &[2])?,
            },
            Slot {
                both: exec.named_tensor("greedy.id.1", DType::I32, &[2])?,
            },
        ];
        let ones = self.ones(exec, self.vocab())?;
        self.decode_into(exec, cache, &slots, ones, first, max, on_token)
    }

    #[allow(clippy::too_many_arguments)]
    fn decode_into(
        &self,
        exec: &mut GraphExecutor,
        cache: &mut KvCache,
        slots: &[Slot; 2],
        ones: Tensor,
        first: u32,
        max: usize,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<usize, ModelError> {
        // Step k reads slots[(k + 1) % 2] and writes slots[k % 2].
        exec.write_bytes(&slots[1].id()?, &(first as i32).to_le_bytes())?;
        let mut pending: Option<Pending> = None;
        let (mut submitted, mut produced) = (0usize, 0usize);
        loop {
            let next = if submitted < max {
                let ahead = pending.is_some() as u32;
                match self.submit_greedy_step(exec, cache, slots, ones, submitted % 2, ahead) {
                    Ok(p) => Some(p),
                    Err(e) => {
                        // Nothing new was submitted: the pending step still
                        // completes (published and handed over) before the error.
                        if let Some(p) = pending.take() {
                            let id = complete(exec, cache, slots, p)?;
                            on_token(id);
                        }
                        return Err(e);
                    }
                }
            } else {
                None
            };
            submitted += next.is_some() as usize;
            let Some(done) = pending.take() else {
                match next {
                    Some(p) => {
                        pending = Some(p);
                        continue;
                    }
                    None => return Ok(produced),
                }
            };
            let id = match complete(exec, cache, slots, done) {
                Ok(id) => id,
                Err(e) => {
                    if let Some(p) = next {
                        let _ = p.work.wait();
                    }
                    return Err(e);
                }
            };
            produced += 1;
            if !on_token(id) {
                // The step after it embeds a token the caller refused: drained,
                // never published. Its failure cannot undo the ids handed
                // over, but the device is suspect: the cache says so.
                if let Some(p) = next {
                    if let Err(e) = p.work.wait() {
                        cache.poison(&format!("a discarded greedy step failed: {e}"));
                    }
                }
                return Ok(produced);
            }
            pending = next;
        }
    }

    /// Records and submits step `slot`'s decode at `ahead` tokens past the
    /// published position (embedding the other slot's id, its argmax
    /// (and its logits' sum) into `slots[slot]`).
    fn submit_greedy_step(
        &self,
        exec: &mut GraphExecutor,
        cache: &KvCache,
        slots: &[Slot; 2],
        ones: Tensor,
        slot: usize,
        ahead: u32,
    ) -> Result<Pending, ModelError> {
        let span = cache.plan_ahead(ahead, 1)?;
        let probe = self.layer_probe(exec, &format!("greedy{slot}"), 1)?;
        let mut s = exec.begin_recorded();
        let ids = slots[1 - slot].id()?;
        let logits =
            self.record_ids_probed(&mut s, cache, &span, ids, LogitRows::Last, probe.as_ref())?;
        s.push(
            Op::Argmax,
            vec![logits],
            vec![slots[slot].id()?],
            "greedy_id",
        )?;
        record_row_sums(
            &mut s,
            logits,
            ones,
            slots[slot].sum()?,
            "greedy_logit_sum".into(),
        )?;
        let work = s.commit()?;
        Ok(Pending {
            work,
            slot,
            span,
            probe,
        })
    }
}

/// Waits for a submitted step, reads its id and publishes it; a failure,
/// or logits (or, with the check on, layer outputs) that are not finite,
/// poisons the cache.
fn complete(
    exec: &mut GraphExecutor,
    cache: &mut KvCache,
    slots: &[Slot; 2],
    p: Pending,
) -> Result<u32, ModelError> {
    let at = p.span.start;
    let bytes = match exec.read_after(p.work, &slots[p.slot].both) {
        Ok(b) => b,
        Err(e) => {
            cache.poison(&format!(
                "the greedy decode step at position {at} failed: {e}"
            ));
            return Err(e.into());
        }
    };
    let Some(&[a, b, c, d, e, f, g, h]) = bytes.get(..8) else {
        cache.poison(&format!(
            "the greedy decode step at position {at} read back {} bytes",
            bytes.len()
        ));
        return Err(ModelError::Input("a greedy id read back short".into()));
    };
    let sum = f32::from_le_bytes([e, f, g, h]);
    let hint = crate::finite::logits_hint(p.probe.is_some());
    let checked = match &p.probe {
        Some(probe) => probe.check(exec, at),
        None => Ok(()),
    }
    .and_then(|()| {
        check_logits(&[sum], hint, || {
            format!("the sum of the logits of the greedy decode step at position {at}")
        })
    });
    if let Err(e) = checked {
        cache.poison(&e.to_string());
        return Err(e);
    }
    cache.commit_prefill(at, 1)?;
    Ok(i32::from_le_bytes([a, b, c, d]) as u32)
}
