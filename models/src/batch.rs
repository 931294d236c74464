//! One decode step over several sequences: B rows, row `b` the next token
//! of sequence `b` at that sequence's own position. The weights are read
//! once for all B rows; each row writes its own cache and attends over it
//! alone. The step is one cohort transaction (`Cohort::run_each_step`):
//! every lane is validated, one gate checks the logits of every row, then
//! every lane is published, or every lane is poisoned.
//!
//! Exactness holds by construction, not by tolerance: the batch is used
//! only at sizes where every matmul sums each activation row in the order
//! a one-row matmul sums it ([`Model::exact_batch_limit`], from the
//! device's kernel orders), and every other op is row-wise or per
//! sequence. On the CPU the 32-element quantized formats (Q4_0, Q4_1,
//! Q5_0, Q8_0) keep their order at every batch size; Q4_K and Q6_K switch
//! kernels from 4 and 8 rows as llama.cpp does, and plain float weights
//! from 2 rows (tinyBLAS), so models holding those batch fewer rows, or
//! none. In fast numerics on the CPU a server batches every decoding
//! sequence ([`Model::batch_limit`]): the many-row kernels may then sum a
//! row in another order than its own step, as fast numerics allows.

use crate::finite::{check_logits, LOGITS_HINT};
use crate::model::{Family, Model};
use crate::ModelError;
use weft_ops::Builder;
use weft_runtime::cache::{Cohort, KvCache};
use weft_runtime::{Device, Numerics};
use weft_runtime::{GraphExecutor, RuntimeError};

impl Model {
    /// The most sequences, up to `max`, that a server decodes in one
    /// [`Model::step_batch`] on `exec`: [`Model::exact_batch_limit`] in
    /// exact numerics; in fast numerics on the CPU, which may sum a row in
    /// another order than its own step does, every size up to `max` (the
    /// matmuls then take their many-row kernels). Other devices keep the
    /// exact limit. 0 when this model does not batch.
    pub fn batch_limit(&self, exec: &GraphExecutor, max: usize) -> usize {
        let fast_cpu = exec.device() == Device::Cpu && exec.config().numerics == Numerics::Fast;
        if fast_cpu && self.batches() {
            max
        } else {
            self.exact_batch_limit(exec, max)
        }
    }

    /// Whether [`Model::step_batch`] runs this model: the Llama family with
    /// dense feed-forwards.
    fn batches(&self) -> bool {
        let Family::Llama(m) = &self.family else {
            return false;
        };
        m.layers
            .iter()
            .all(|l| matches!(l.ffn, crate::llama::LlamaFfn::Dense { .. }))
    }

    /// The most sequences, up to `max`, that [`Model::step_batch`] decodes
    /// in one step on `exec`'s device while giving every row the bits the
    /// sequence's own step gives it. 0 when this model does not batch
    /// (not the Llama family, or a device without that guarantee).
    pub fn exact_batch_limit(&self, exec: &GraphExecutor, max: usize) -> usize {
        let Family::Llama(m) = &self.family else {
            return 0;
        };
        let mut weights = vec![m.output];
        for l in &m.layers {
            // Routed experts are not batched: their matmuls group rows by
            // expert, whose orders this check does not cover.
            let crate::llama::LlamaFfn::Dense { gate, up, down } = l.ffn else {
                return 0;
            };
            weights.extend([l.wq, l.wk, l.wv, l.wo, gate, up, down]);
        }
        (1..=max)
            .take_while(|&b| weights.iter().all(|w| exec.batch_keeps_row_order(w, b)))
            .last()
            .unwrap_or(0)
    }

    /// Decodes `tokens[b]` in `caches[b]` for every `b`, in one step, each
    /// at its cache's position, and returns the logits, `[B, vocab]` (row
    /// `b` for sequence `b`). Refused before anything runs when a cache is
    /// poisoned or full, or the model does not batch; after submission a
    /// failure (non-finite logits in any row, too) poisons every cache.
    pub fn step_batch(
        &self,
        exec: &mut GraphExecutor,
        caches: Vec<&mut KvCache>,
        tokens: &[u32],
    ) -> Result<Vec<f32>, ModelError> {
        let Family::Llama(m) = &self.family else {
            return Err(ModelError::Unsupported(format!(
                "{}: batch steps are built for the Llama family only",
                self.arch
            )));
        };
        if caches.len() != tokens.len() || tokens.is_empty() {
            return Err(ModelError::Input(format!(
                "a batch step takes one token per cache: {} tokens for {} caches",
                tokens.len(),
                caches.len()
            )));
        }
        let rows = m.token_embd.rows();
        if let Some(bad) = tokens.iter().find(|&&t| t as usize >= rows) {
            return Err(ModelError::Input(format!(
                "token id {bad} is outside the vocabulary of {rows}"
            )));
        }
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let vocab = self.vocab();
        let mut cohort = Cohort::new(caches)?;
        let logits = cohort.run_each_step(
            exec,
            |s, lanes, spans| {
                let ids = s.upload_i32(&ids, "token_ids")?;
                m.record_batch(s, lanes, spans, ids)
                    .map_err(|e| RuntimeError::Usage(format!("recording the batch step: {e}")))
            },
            |spans, values| {
                for (b, row) in values.chunks_exact(vocab).enumerate() {
                    check_logits(row, LOGITS_HINT, || {
                        format!(
                            "the logits of batch row {b} (its sequence at position {})",
                            spans[b].start
                        )
                    })
                    .map_err(|e| e.to_string())?;
                }
                Ok(())
            },
        )?;
        Ok(logits)
    }
}
