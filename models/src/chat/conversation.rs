//! [`Conversation`]: a multi-turn chat over one KV cache.
//!
//! Every turn renders the whole conversation with the template and
//! tokenizes it; the cache already holds the ids of the previous render's
//! prompt and the answer generated after it. Only the ids past the longest
//! common prefix of the new ids and the cached ones are prefilled, so the
//! history is not prefilled again.
//!
//! The new render usually extends the cached ids (previous prompt, the
//! answer's ids, then the end-of-turn marker and the new message). It does
//! not when the template rewrites history (Gemma's `| trim` of a message,
//! templates that drop an earlier system prompt or reasoning) or when the
//! answer's text tokenizes differently from the ids that were sampled. Then
//! the cache has to go back to the common prefix: rows of append-only
//! layers below a position stay valid, but windowed layers are rings whose
//! older rows later steps overwrote, so the way back is a
//! [`Snapshot`] (`weft_runtime::cache::snapshot`), taken after each turn's
//! prefill. The newest snapshot at or below the common prefix is restored
//! and everything after it prefilled; with none, the cache is reset and the
//! whole conversation prefilled. Snapshots past the restored one are
//! dropped (they can no longer be restored), and only the last few are
//! kept: each holds a host copy of the windowed layers' rows.

use super::template::{encode_rendered, ChatTemplate, ChatTemplateError, Message};
use crate::model::Model;
use crate::step::LogitRows;
use crate::tokenizer::TokenId;
use crate::ModelError;
use weft_runtime::cache::{ChunkPolicy, KvCache, Snapshot};
use weft_runtime::{GraphExecutor, RuntimeError};

/// Snapshots kept (the newest turns).
const KEPT_SNAPSHOTS: usize = 4;

/// A conversation and what of it the cache holds.
#[derive(Default)]
pub struct Conversation {
    messages: Vec<Message>,
    /// The ids at the cache's positions `0..position()`.
    cached: Vec<TokenId>,
    /// Snapshots after a turn's prefill, oldest first.
    snapshots: Vec<Snapshot>,
    /// The ids of the last prompt and the answer generated after it.
    pending: Vec<TokenId>,
}

/// How a turn's prompt was brought into the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TurnPrefill {
    /// Ids of the whole rendered conversation.
    pub prompt_tokens: usize,
    /// Of those, already in the cache.
    pub reused: usize,
    /// Prefilled in this turn (`prompt_tokens - reused`).
    pub prefilled: usize,
    /// Whether the cache went back (restored a snapshot or reset) first.
    pub rolled_back: bool,
}

/// Why a turn could not start.
#[derive(Debug, thiserror::Error)]
pub enum TurnError {
    #[error(transparent)]
    Template(#[from] ChatTemplateError),
    #[error("[chat] the conversation is {tokens} tokens long and the context holds {context}")]
    ContextFull { tokens: usize, context: u32 },
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

impl Conversation {
    /// An empty conversation, opened by `system` when given.
    pub fn new(system: Option<&str>) -> Conversation {
        let mut c = Conversation::default();
        if let Some(s) = system {
            c.messages.push(Message::new("system", s));
        }
        c
    }

    /// A conversation continued from `messages` whose cache already holds
    /// `cached` (a saved session: the ids at positions `0..cached.len()`).
    /// It has no snapshots, so a turn whose render departs from `cached`
    /// prefills from the start.
    pub fn resume(messages: Vec<Message>, cached: Vec<TokenId>) -> Conversation {
        Conversation {
            messages,
            pending: cached.clone(),
            cached,
            snapshots: Vec::new(),
        }
    }

    /// The messages so far.
    pub fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// The ids the cache holds (after [`Conversation::prefill_user`]: the
    /// rendered conversation).
    pub fn cached(&self) -> &[TokenId] {
        &self.cached
    }

    /// Back to the system prompt alone, with an empty cache.
    pub fn reset(&mut self, cache: &mut KvCache) {
        self.messages.retain(|m| m.role == "system");
        self.messages.truncate(1);
        self.cached.clear();
        self.snapshots.clear();
        self.pending.clear();
        cache.reset();
    }

    /// Adds the user's `text` and brings the cache to the rendered
    /// conversation (with the assistant's opening): returns the logits of
    /// its last token and what was prefilled. On failure the message is not
    /// added.
    #[allow(clippy::too_many_arguments)]
    pub fn prefill_user(
        &mut self,
        model: &Model,
        exec: &mut GraphExecutor,
        cache: &mut KvCache,
        template: &ChatTemplate,
        policy: &ChunkPolicy,
        text: &str,
    ) -> Result<(Vec<f32>, TurnPrefill), TurnError> {
        self.messages.push(Message::new("user", text));
        let result = self.prefill(model, exec, cache, template, policy);
        if result.is_err() {
            self.messages.pop();
        }
        result
    }

    fn prefill(
        &mut self,
        model: &Model,
        exec: &mut GraphExecutor,
        cache: &mut KvCache,
        template: &ChatTemplate,
        policy: &ChunkPolicy,
    ) -> Result<(Vec<f32>, TurnPrefill), TurnError> {
        let text = template.render(&self.messages, true)?;
        let ids = encode_rendered(&model.tokenizer, &text);
        let context = cache.config().context;
        // One position stays free for the answer's first token.
        if ids.len() >= context as usize {
            return Err(TurnError::ContextFull {
                tokens: ids.len(),
                context,
            });
        }
        let common = common_prefix(&ids, &self.cached);
        // At least one id is prefilled: its logits start the answer.
        let keep = common.min(ids.len().saturating_sub(1));
        let rolled_back = keep < self.cached.len();
        if rolled_back {
            self.roll_back(exec, cache, keep)?;
        }
        let reused = cache.position() as usize;
        let logits = model.prefill(exec, cache, &ids[reused..], policy, LogitRows::Last)?;
        self.cached = ids.clone();
        self.pending = ids;
        self.snapshots.push(cache.snapshot(exec)?);
        if self.snapshots.len() > KEPT_SNAPSHOTS {
            self.snapshots.remove(0);
        }
        let prompt_tokens = self.cached.len();
        Ok((
            logits,
            TurnPrefill {
                prompt_tokens,
                reused,
                prefilled: prompt_tokens - reused,
                rolled_back,
            },
        ))
    }

    /// Moves the cache back to the newest snapshot at or below `keep`, or
    /// resets it.
    fn roll_back(
        &mut self,
        exec: &mut GraphExecutor,
        cache: &mut KvCache,
        keep: usize,
    ) -> Result<(), RuntimeError> {
        while let Some(s) = self.snapshots.pop() {
            if s.position() as usize <= keep && cache.restore(exec, &s).is_ok() {
                self.cached.truncate(s.position() as usize);
                self.snapshots.push(s);
                return Ok(());
            }
        }
        cache.reset();
        self.cached.clear();
        Ok(())
    }

    /// Ends the assistant's turn: `answer` is its text, `ids` the tokens
    /// generated for it (the end-of-turn token left out); the cache holds
    /// the prompt and a prefix of `ids` (up to its position).
    pub fn finish_answer(&mut self, answer: &str, ids: &[TokenId], cache: &KvCache) {
        self.messages.push(Message::new("assistant", answer));
        self.pending.extend_from_slice(ids);
        let held = (cache.position() as usize).min(self.pending.len());
        self.cached = self.pending[..held].to_vec();
    }
}

/// The length of the longest common prefix of `a` and `b`.
fn common_prefix(a: &[TokenId], b: &[TokenId]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
