//! Saving a model's KV cache to a file and continuing from it later: the
//! checkpoint format of `weft_runtime::cache` bound to this model's
//! identity ([`crate::identity`]), so a file only loads into a cache of the
//! same weights and layout.

use crate::identity::{model_identity, GgufDigest, ModelIdentity};
use crate::model::Model;
use crate::ModelError;
use std::path::Path;
use weft_runtime::cache::{CacheConfig, CheckpointInfo, KvCache};
use weft_runtime::GraphExecutor;

impl Model {
    /// The digest of the model's GGUF file, computed on first use.
    pub fn gguf_digest(&self) -> &GgufDigest {
        self.digest.get_or_init(|| GgufDigest::of(&self.file))
    }

    /// The identity of this model running with caches of `cache`'s layout.
    pub fn identity(&self, cache: &CacheConfig) -> ModelIdentity {
        model_identity(self.gguf_digest(), &self.arch, cache)
    }

    /// Saves `cache` (a cache of this model) to `path`, atomically, with
    /// `tokens`, the token at each of its positions (or none). The file
    /// loads back with [`Model::load_session`] into a cache of the same
    /// model and layout, and decoding continues exactly as it would have.
    /// A poisoned cache is refused.
    pub fn save_session(
        &self,
        exec: &mut GraphExecutor,
        cache: &KvCache,
        tokens: &[u32],
        path: &Path,
    ) -> Result<CheckpointInfo, ModelError> {
        let identity = self.identity(cache.config());
        Ok(cache.save_checkpoint(exec, &identity, tokens, path)?)
    }

    /// Replaces what `cache` holds by the sequence saved at `path`, and
    /// returns its token list (empty if it was saved without one). A file
    /// of another model or layout, or one that is damaged or inconsistent
    /// (a listed token outside the vocabulary, too), is refused with the
    /// reason and leaves `cache` as it was.
    pub fn load_session(
        &self,
        exec: &mut GraphExecutor,
        cache: &mut KvCache,
        path: &Path,
    ) -> Result<CheckpointInfo, ModelError> {
        let identity = self.identity(cache.config());
        let vocab = u32::try_from(self.vocab()).unwrap_or(u32::MAX);
        Ok(cache.load_checkpoint(exec, &identity, vocab, path)?)
    }
}
