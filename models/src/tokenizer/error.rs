//! The tokenizer's error type.

use crate::gguf::GgufError;

/// Why a tokenizer could not be built, or a token id could not be decoded.
/// Each variant names the metadata key or token at fault.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// Reading tokenizer metadata from the GGUF file failed (wrong type, ...);
    /// the inner error names the key and its offset.
    #[error("tokenizer metadata: {0}")]
    Gguf(#[from] GgufError),

    /// A metadata key the tokenizer cannot do without is absent.
    #[error("missing tokenizer metadata `{key}`: {why}")]
    MissingKey {
        /// The key.
        key: &'static str,
        /// What it is needed for.
        why: &'static str,
    },

    /// `tokenizer.ggml.model` names an algorithm weft does not implement.
    #[error(
        "unsupported tokenizer model `{model}` (tokenizer.ggml.model); weft implements \"gpt2\" \
         (byte-level BPE) and \"llama\" (SentencePiece)"
    )]
    UnsupportedModel {
        /// The value of `tokenizer.ggml.model`.
        model: String,
    },

    /// `tokenizer.ggml.pre` names a pre-tokenizer weft does not implement.
    #[error(
        "unsupported pre-tokenizer `{name}` (tokenizer.ggml.pre); weft implements: {supported}"
    )]
    UnsupportedPreTokenizer {
        /// The value of `tokenizer.ggml.pre`.
        name: String,
        /// The names weft implements, comma-separated.
        supported: String,
    },

    /// `tokenizer.ggml.tokens` is empty.
    #[error("tokenizer.ggml.tokens is empty")]
    EmptyVocab,

    /// More tokens than a token id can count.
    #[error("tokenizer.ggml.tokens has {n} entries, more than token ids (u32) can address")]
    TooManyTokens {
        /// The number of tokens.
        n: usize,
    },

    /// A per-token array is shorter than the token list.
    #[error("`{key}` has {found} entries but tokenizer.ggml.tokens has {expected}")]
    ShortArray {
        /// The array's key.
        key: &'static str,
        /// Its length.
        found: usize,
        /// The number of tokens.
        expected: usize,
    },

    /// Two tokens have the same text, so text-to-id lookups are ambiguous
    /// (llama.cpp refuses such a vocabulary too).
    #[error(
        "token text {text:?} appears twice in tokenizer.ggml.tokens (ids {first} and {second})"
    )]
    DuplicateToken {
        /// The repeated text.
        text: String,
        /// The first id with that text.
        first: u32,
        /// The second id with that text.
        second: u32,
    },

    /// The metadata asks for a special token the vocabulary does not have.
    #[error(
        "`{flag}` is set but the vocabulary has no {what} token (`{key}` absent or out of range)"
    )]
    MissingSpecialToken {
        /// Which token (`"BOS"`, `"EOS"`).
        what: &'static str,
        /// The key that would give its id.
        key: &'static str,
        /// The flag asking for it.
        flag: &'static str,
    },

    /// A special-token id in the metadata outside the vocabulary.
    #[error(
        "`{key}` is {id}, outside the vocabulary of {n_tokens} tokens (tokenizer.ggml.tokens)"
    )]
    SpecialOutOfRange {
        /// The key.
        key: &'static str,
        /// The id it holds.
        id: u32,
        /// The vocabulary size.
        n_tokens: usize,
    },

    /// A token type outside the ones GGUF defines.
    #[error("tokenizer.ggml.token_type: entry {index} is {value}; token types are 0 to 6 (undefined, normal, unknown, control, user-defined, unused, byte)")]
    BadTokenType {
        /// The token id.
        index: usize,
        /// The type found.
        value: i32,
    },

    /// A NaN merge score.
    #[error("tokenizer.ggml.scores: entry {index} is NaN")]
    NanScore {
        /// The token id.
        index: usize,
    },

    /// A token id outside the vocabulary was given to decode.
    #[error("token id {id} is outside the vocabulary of {n_tokens} tokens")]
    TokenOutOfRange {
        /// The id.
        id: u32,
        /// The vocabulary size.
        n_tokens: usize,
    },
}
