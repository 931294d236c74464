//! Tokenizers built from GGUF metadata, token-exact with llama.cpp (commit
//! 0c1e5709, the one in llama-cpp-python 0.3.36).
//!
//! Two algorithms, chosen by `tokenizer.ggml.model`:
//! - `gpt2`: byte-level BPE with the pre-tokenizer `tokenizer.ggml.pre` names
//!   (SmolLM2's `smollm`, `gpt-2`, Llama 3's `llama-bpe`, Qwen 2's, ...);
//! - `llama`: SentencePiece-style merges by score with byte fallback (Gemma 3).
//!
//! Prompts are tokenized like `llama_tokenize(add_special = true,
//! parse_special = false)`: BOS/EOS only where the metadata asks for them,
//! special-token text in the prompt taken as plain text
//! ([`EncodeOptions`] changes both). Decoding renders control tokens as
//! nothing unless asked, like `llama_token_to_piece(special = false)`;
//! [`StreamDecoder`] streams text without splitting characters.
//!
//! Why not the `tokenizers` crate: llama.cpp does not run the regexes its
//! vocabularies name. It runs hand-written matchers that differ from a true
//! regex (fragment ends count as end of text, its own Unicode 15.1 tables,
//! unassigned code points count as punctuation), partitions user-defined
//! tokens out of plain text first, and rewrites token attributes by text.
//! Matching all of that through `tokenizers`' configuration would take more
//! code than the small BPE and SentencePiece loops here, and would still
//! drift with that crate's own Unicode tables.
//!
//! Files:
//! - `vocab.rs`: [`Vocab`] (the metadata as plain data), reading it from GGUF,
//!   and the text-to-id index;
//! - `attrs.rs`: [`TokenAttr`] and llama.cpp's rules deriving attributes and
//!   end-of-generation tokens from types and texts;
//! - `special.rs`: splitting text on special tokens before tokenization;
//! - `pretokenize.rs`: the BPE pre-tokenizers (`tokenizer.ggml.pre`);
//! - `bpe.rs`, `spm.rs`: the two merge algorithms;
//! - `stream.rs`: [`StreamDecoder`];
//! - `unicode.rs`, `unicode_table.rs` (generated): code point categories and
//!   GPT-2's byte mapping;
//! - `error.rs`: [`TokenizerError`].

mod attrs;
mod bpe;
mod error;
mod pretokenize;
mod special;
mod spm;
mod stream;
mod unicode;
mod unicode_table;
mod vocab;

use std::borrow::Cow;
use std::fmt;

use crate::gguf::GgufFile;

pub use attrs::TokenAttr;
pub use error::TokenizerError;
pub use stream::StreamDecoder;
pub use vocab::{TokenType, Vocab};

use bpe::Bpe;
use pretokenize::PreTokenizer;
use special::Fragment;
use spm::{Spm, SpmVocab};
use vocab::TokenIndex;

/// A token id: an index into the vocabulary.
pub type TokenId = u32;

/// The tokenizer algorithm (`tokenizer.ggml.model`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelKind {
    /// `gpt2`: byte-level BPE.
    Bpe,
    /// `llama`: SentencePiece-style merges by score, byte fallback.
    Spm,
}

/// How [`Tokenizer::encode_with`] treats special tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EncodeOptions {
    /// Add BOS/EOS where the vocabulary's `add_bos_token`/`add_eos_token`
    /// say so (llama.cpp's `add_special`).
    pub add_special: bool,
    /// Turn the text of control tokens (`<|im_start|>`, `<eos>`) into those
    /// tokens (llama.cpp's `parse_special`). User-defined tokens are always
    /// matched.
    pub parse_special: bool,
}

impl Default for EncodeOptions {
    /// A raw prompt: `add_special = true`, `parse_special = false`.
    fn default() -> EncodeOptions {
        EncodeOptions {
            add_special: true,
            parse_special: false,
        }
    }
}

#[derive(Clone, Debug)]
enum Model {
    Bpe(Bpe),
    Spm(Spm),
}

/// Special token ids after metadata and defaults (absent or out of range ->
/// `None`).
#[derive(Clone, Copy, Debug, Default)]
struct Specials {
    bos: Option<TokenId>,
    eos: Option<TokenId>,
    eot: Option<TokenId>,
    eom: Option<TokenId>,
    unk: Option<TokenId>,
    pad: Option<TokenId>,
}

/// A tokenizer: text to token ids and back.
///
/// Usually built with [`Tokenizer::from_gguf`]; a hand-made vocabulary works
/// too:
///
/// ```
/// use weft_models::tokenizer::{Tokenizer, Vocab};
///
/// let vocab = Vocab {
///     model: "gpt2".into(),       // byte-level BPE: `Ġ` stands for a space
///     pre: Some("gpt-2".into()),
///     tokens: ["h", "i", "hi", "Ġ", "Ġhi"].map(String::from).to_vec(),
///     merges: Some(["h i", "Ġ hi"].map(String::from).to_vec()),
///     ..Vocab::default()
/// };
/// let tokenizer = Tokenizer::from_vocab(vocab)?;
/// let ids = tokenizer.encode("hi hi");
/// assert_eq!(ids, [2, 4]);
/// assert_eq!(tokenizer.decode(&ids, false)?, "hi hi");
///
/// let mut stream = tokenizer.stream_decoder(false);
/// let text: String = ids.iter().map(|&id| stream.push(id)).collect::<Result<_, _>>()?;
/// assert_eq!(text + &stream.flush(), "hi hi");
/// # Ok::<(), weft_models::tokenizer::TokenizerError>(())
/// ```
#[derive(Clone)]
pub struct Tokenizer {
    texts: Vec<String>,
    attrs: Vec<TokenAttr>,
    scores: Vec<f32>,
    index: TokenIndex,
    model: Model,
    /// Candidates of the special-token partition, longest text first.
    partition_order: Vec<TokenId>,
    specials: Specials,
    eog: Vec<TokenId>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
}

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.kind())
            .field("pre", &self.pre_tokenizer())
            .field("n_tokens", &self.texts.len())
            .field("specials", &self.specials)
            .field("eog", &self.eog)
            .field("add_bos", &self.add_bos)
            .field("add_eos", &self.add_eos)
            .finish_non_exhaustive()
    }
}

impl Specials {
    /// The ids as the metadata gives them.
    fn from_vocab(vocab: &Vocab) -> Specials {
        Specials {
            bos: vocab.bos,
            eos: vocab.eos,
            eot: vocab.eot,
            eom: vocab.eom,
            unk: vocab.unk,
            pad: vocab.pad,
        }
    }
}

/// llama.cpp's defaults for what the metadata leaves out.
struct Defaults {
    bos: Option<TokenId>,
    eos: Option<TokenId>,
    unk: Option<TokenId>,
    add_bos: bool,
    add_space_prefix: bool,
}

impl Tokenizer {
    /// Builds the tokenizer a GGUF file's `tokenizer.ggml.*` metadata describes.
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_vocab(Vocab::from_gguf(file)?)
    }

    /// Builds a tokenizer from a vocabulary. Empty token texts are renamed
    /// `[EMPTY_<id>]` and out-of-range special ids fall back to llama.cpp's
    /// defaults, both as llama.cpp does.
    pub fn from_vocab(vocab: Vocab) -> Result<Tokenizer, TokenizerError> {
        let kind = match vocab.model.as_str() {
            "gpt2" => ModelKind::Bpe,
            "llama" => ModelKind::Spm,
            _ => return Err(TokenizerError::UnsupportedModel { model: vocab.model }),
        };
        check_lengths(&vocab.tokens, &vocab.token_types, &vocab.scores)?;
        let from_metadata = Specials::from_vocab(&vocab);
        let (add_bos, add_eos, add_space_prefix) =
            (vocab.add_bos, vocab.add_eos, vocab.add_space_prefix);
        let Vocab {
            pre,
            mut tokens,
            token_types,
            mut scores,
            merges,
            ..
        } = vocab;
        for (id, text) in tokens.iter_mut().enumerate() {
            if text.is_empty() {
                *text = format!("[EMPTY_{id}]");
            }
        }
        let index = TokenIndex::build(&tokens)?;
        let pre = match kind {
            ModelKind::Bpe => Some(PreTokenizer::from_name(pre.as_deref())?),
            ModelKind::Spm => None,
        };
        let defaults = defaults(kind, pre.as_ref());
        let specials = resolve_specials(from_metadata, &defaults, tokens.len());
        let ids = attrs::SpecialIds {
            eos: specials.eos,
            eot: specials.eot,
            eom: specials.eom,
        };
        let derived = attrs::derive(&tokens, &token_types, &index, ids);
        let specials = Specials {
            eot: derived.eot,
            ..specials
        };
        let add_bos = add_bos.unwrap_or(defaults.add_bos);
        let add_eos = add_eos.unwrap_or(false);
        check_added(add_bos, specials.bos, add_eos, specials.eos)?;
        let model = build_model(pre, merges, &tokens, &index, specials.unk)?;
        scores.truncate(tokens.len());
        Ok(Tokenizer {
            partition_order: partition_order(&tokens, &derived.attrs),
            texts: tokens,
            attrs: derived.attrs,
            scores,
            index,
            model,
            specials,
            eog: derived.eog,
            add_bos,
            add_eos,
            add_space_prefix: add_space_prefix.unwrap_or(defaults.add_space_prefix),
        })
    }

    /// Tokenizes a raw prompt: `add_special = true`, `parse_special = false`.
    pub fn encode(&self, text: &str) -> Vec<TokenId> {
        self.encode_with(text, EncodeOptions::default())
    }

    /// Tokenizes `text` with explicit special-token handling.
    pub fn encode_with(&self, text: &str, options: EncodeOptions) -> Vec<TokenId> {
        let fragments = special::partition(
            text,
            &self.partition_order,
            &self.texts,
            &self.attrs,
            options.parse_special,
        );
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if options.add_special && self.add_bos {
            out.extend(self.specials.bos);
        }
        match &self.model {
            Model::Bpe(bpe) => {
                for fragment in fragments {
                    match fragment {
                        Fragment::Text(range) => {
                            bpe.encode(&text[range], &self.texts, &self.index, &mut out)
                        }
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
            Model::Spm(spm) => self.encode_spm(spm, text, &fragments, &mut out),
        }
        if options.add_special && self.add_eos {
            out.extend(self.specials.eos);
        }
        out
    }

    /// SentencePiece: each text fragment gets a leading space when
    /// `add_space_prefix` is set and it follows a special token (or starts
    /// the text); spaces become U+2581.
    fn encode_spm(&self, spm: &Spm, text: &str, fragments: &[Fragment], out: &mut Vec<TokenId>) {
        let vocab = SpmVocab {
            texts: &self.texts,
            scores: &self.scores,
            index: &self.index,
        };
        let mut after_special = true;
        let mut escaped = String::new();
        for fragment in fragments {
            match fragment {
                Fragment::Text(range) => {
                    escaped.clear();
                    if self.add_space_prefix && after_special {
                        escaped.push('\u{2581}');
                    }
                    for c in text[range.clone()].chars() {
                        escaped.push(if c == ' ' { '\u{2581}' } else { c });
                    }
                    spm.encode(&escaped, &vocab, out);
                    after_special = false;
                }
                Fragment::Token(id) => {
                    out.push(*id);
                    after_special = true;
                }
            }
        }
    }

    /// The bytes token `id` renders as (llama.cpp's `llama_token_to_piece`
    /// with `lstrip = 0`): control and unknown tokens render as nothing
    /// unless `special`; unused and undefined tokens always as nothing.
    pub fn token_to_piece(
        &self,
        id: TokenId,
        special: bool,
    ) -> Result<Cow<'_, [u8]>, TokenizerError> {
        let (text, attr) = match (self.texts.get(id as usize), self.attrs.get(id as usize)) {
            (Some(text), Some(&attr)) => (text, attr),
            _ => {
                return Err(TokenizerError::TokenOutOfRange {
                    id,
                    n_tokens: self.texts.len(),
                })
            }
        };
        let shown_raw = TokenAttr::UNKNOWN | TokenAttr::CONTROL;
        if !special && attr.intersects(shown_raw) {
            return Ok(Cow::Borrowed(&[]));
        }
        if attr.intersects(shown_raw | TokenAttr::USER_DEFINED) {
            return Ok(Cow::Borrowed(text.as_bytes()));
        }
        if attr.contains(TokenAttr::NORMAL) {
            return Ok(match self.model {
                Model::Bpe(_) => Cow::Owned(bpe::decode_text(text)),
                Model::Spm(_) if text.contains('\u{2581}') => {
                    Cow::Owned(text.replace('\u{2581}', " ").into_bytes())
                }
                Model::Spm(_) => Cow::Borrowed(text.as_bytes()),
            });
        }
        if attr.contains(TokenAttr::BYTE) {
            return Ok(Cow::Owned(vec![byte_token_value(text)]));
        }
        Ok(Cow::Borrowed(&[]))
    }

    /// The bytes of `ids`, concatenated pieces (see [`Tokenizer::token_to_piece`]).
    pub fn decode_bytes(&self, ids: &[TokenId], special: bool) -> Result<Vec<u8>, TokenizerError> {
        let mut out = Vec::new();
        for &id in ids {
            out.extend_from_slice(&self.token_to_piece(id, special)?);
        }
        Ok(out)
    }

    /// The text of `ids`; invalid UTF-8 (a character cut off) becomes U+FFFD.
    pub fn decode(&self, ids: &[TokenId], special: bool) -> Result<String, TokenizerError> {
        Ok(String::from_utf8_lossy(&self.decode_bytes(ids, special)?).into_owned())
    }

    /// A streaming decoder over this tokenizer.
    pub fn stream_decoder(&self, special: bool) -> StreamDecoder<'_> {
        StreamDecoder::new(self, special)
    }

    /// The number of tokens in the vocabulary.
    pub fn n_tokens(&self) -> usize {
        self.texts.len()
    }

    /// The tokenizer algorithm.
    pub fn kind(&self) -> ModelKind {
        match self.model {
            Model::Bpe(_) => ModelKind::Bpe,
            Model::Spm(_) => ModelKind::Spm,
        }
    }

    /// The BPE pre-tokenizer's name (`"smollm"`, `"default"`, ...); `None`
    /// for SentencePiece.
    pub fn pre_tokenizer(&self) -> Option<&str> {
        match &self.model {
            Model::Bpe(bpe) => Some(&bpe.pre.name),
            Model::Spm(_) => None,
        }
    }

    /// The beginning-of-sequence token.
    pub fn bos(&self) -> Option<TokenId> {
        self.specials.bos
    }

    /// The end-of-sequence token.
    pub fn eos(&self) -> Option<TokenId> {
        self.specials.eos
    }

    /// The end-of-turn token (from metadata, else found by text).
    pub fn eot(&self) -> Option<TokenId> {
        self.specials.eot
    }

    /// The unknown token.
    pub fn unk(&self) -> Option<TokenId> {
        self.specials.unk
    }

    /// The padding token.
    pub fn pad(&self) -> Option<TokenId> {
        self.specials.pad
    }

    /// Whether [`Tokenizer::encode`] prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether [`Tokenizer::encode`] appends EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// Tokens that end generation (EOS, end-of-turn markers, ...), sorted.
    pub fn eog_ids(&self) -> &[TokenId] {
        &self.eog
    }

    /// Whether `id` ends generation.
    pub fn is_eog(&self, id: TokenId) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// Every token that ends generation, ascending.
    pub fn eog_tokens(&self) -> &[TokenId] {
        &self.eog
    }

    /// The stored text of token `id` (byte-level BPE tokens in GPT-2's
    /// mapping, SentencePiece ones with U+2581 for spaces).
    pub fn token_text(&self, id: TokenId) -> Option<&str> {
        self.texts.get(id as usize).map(String::as_str)
    }

    /// The attributes of token `id`.
    pub fn token_attr(&self, id: TokenId) -> Option<TokenAttr> {
        self.attrs.get(id as usize).copied()
    }

    /// The id of the token whose stored text is `text`.
    pub fn token_id(&self, text: &str) -> Option<TokenId> {
        self.index.get(&self.texts, text.as_bytes())
    }
}

/// The BPE model when there is a pre-tokenizer (a `gpt2` vocabulary, whose
/// merges are then required), else the SentencePiece one.
fn build_model(
    pre: Option<PreTokenizer>,
    merges: Option<Vec<String>>,
    tokens: &[String],
    index: &TokenIndex,
    unk: Option<TokenId>,
) -> Result<Model, TokenizerError> {
    Ok(match pre {
        Some(pre) => {
            let merges = merges.ok_or(TokenizerError::MissingKey {
                key: vocab::KEY_MERGES,
                why: "a gpt2 (BPE) vocabulary needs its merges",
            })?;
            Model::Bpe(Bpe::new(pre, &merges, tokens, index))
        }
        None => Model::Spm(Spm::new(tokens, index, unk)),
    })
}

/// Per-token arrays must cover every token; the vocabulary must be non-empty
/// and addressable by `TokenId`.
fn check_lengths(
    tokens: &[String],
    types: &[TokenType],
    scores: &[f32],
) -> Result<(), TokenizerError> {
    if tokens.is_empty() {
        return Err(TokenizerError::EmptyVocab);
    }
    if tokens.len() >= TokenId::MAX as usize {
        return Err(TokenizerError::TooManyTokens { n: tokens.len() });
    }
    for (key, len) in [
        (vocab::KEY_TOKEN_TYPE, types.len()),
        (vocab::KEY_SCORES, scores.len()),
    ] {
        if len != 0 && len < tokens.len() {
            return Err(TokenizerError::ShortArray {
                key,
                found: len,
                expected: tokens.len(),
            });
        }
    }
    Ok(())
}

fn defaults(kind: ModelKind, pre: Option<&PreTokenizer>) -> Defaults {
    match kind {
        ModelKind::Spm => Defaults {
            bos: Some(1),
            eos: Some(2),
            unk: Some(0),
            add_bos: true,
            add_space_prefix: true,
        },
        ModelKind::Bpe => Defaults {
            bos: if pre.is_some_and(|p| p.no_default_bos) {
                None
            } else {
                Some(11)
            },
            eos: Some(11),
            unk: None,
            add_bos: pre.is_some_and(|p| p.add_bos_default),
            add_space_prefix: false,
        },
    }
}

/// Special ids: the metadata's when in range, else the default when in range.
fn resolve_specials(meta: Specials, defaults: &Defaults, n_tokens: usize) -> Specials {
    let in_range = |id: Option<TokenId>| id.filter(|&id| (id as usize) < n_tokens);
    let pick =
        |meta: Option<TokenId>, default: Option<TokenId>| in_range(meta).or(in_range(default));
    Specials {
        bos: pick(meta.bos, defaults.bos),
        eos: pick(meta.eos, defaults.eos),
        eot: in_range(meta.eot),
        eom: in_range(meta.eom),
        unk: pick(meta.unk, defaults.unk),
        pad: in_range(meta.pad),
    }
}

fn check_added(
    add_bos: bool,
    bos: Option<TokenId>,
    add_eos: bool,
    eos: Option<TokenId>,
) -> Result<(), TokenizerError> {
    if add_bos && bos.is_none() {
        return Err(TokenizerError::MissingSpecialToken {
            what: "BOS",
            key: vocab::KEY_BOS,
            flag: vocab::KEY_ADD_BOS,
        });
    }
    if add_eos && eos.is_none() {
        return Err(TokenizerError::MissingSpecialToken {
            what: "EOS",
            key: vocab::KEY_EOS,
            flag: vocab::KEY_ADD_EOS,
        });
    }
    Ok(())
}

/// Control, user-defined and unknown tokens, longest text first (ties by id).
fn partition_order(texts: &[String], attrs: &[TokenAttr]) -> Vec<TokenId> {
    let special = TokenAttr::CONTROL | TokenAttr::USER_DEFINED | TokenAttr::UNKNOWN;
    let mut ids: Vec<TokenId> = (0..texts.len() as TokenId)
        .filter(|&id| attrs[id as usize].intersects(special))
        .collect();
    ids.sort_by_key(|&id| std::cmp::Reverse(texts[id as usize].len()));
    ids
}

/// The byte a byte token stands for: the two characters after `<0x`, read
/// as hex the way llama.cpp's `strtol` reads them (0 when not hex).
fn byte_token_value(text: &str) -> u8 {
    let digits = text.as_bytes().get(3..).unwrap_or_default();
    let mut value = 0u8;
    for &d in digits.iter().take(2) {
        match (d as char).to_digit(16) {
            Some(v) => value = value.wrapping_mul(16).wrapping_add(v as u8),
            None => break,
        }
    }
    value
}
