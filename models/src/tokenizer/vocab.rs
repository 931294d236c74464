//! The vocabulary as plain data ([`Vocab`]), read from GGUF metadata
//! (`tokenizer.ggml.*`) or built by hand, and the text-to-id index the
//! tokenizers look tokens up in.

use crate::gguf::GgufFile;

use super::{TokenId, TokenizerError};

/// `tokenizer.ggml.model`: `"gpt2"` (byte-level BPE) or `"llama"` (SentencePiece).
pub const KEY_MODEL: &str = "tokenizer.ggml.model";
/// `tokenizer.ggml.pre`: the pre-tokenizer of a BPE vocabulary.
pub const KEY_PRE: &str = "tokenizer.ggml.pre";
/// `tokenizer.ggml.tokens`: every token's text, indexed by id.
pub const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
/// `tokenizer.ggml.token_type`: every token's [`TokenType`], as i32.
pub const KEY_TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
/// `tokenizer.ggml.scores`: SentencePiece merge scores.
pub const KEY_SCORES: &str = "tokenizer.ggml.scores";
/// `tokenizer.ggml.merges`: BPE merges (`"left right"`), by rank.
pub const KEY_MERGES: &str = "tokenizer.ggml.merges";
/// `tokenizer.ggml.bos_token_id`
pub const KEY_BOS: &str = "tokenizer.ggml.bos_token_id";
/// `tokenizer.ggml.eos_token_id`
pub const KEY_EOS: &str = "tokenizer.ggml.eos_token_id";
/// `tokenizer.ggml.eot_token_id`
pub const KEY_EOT: &str = "tokenizer.ggml.eot_token_id";
/// `tokenizer.ggml.eom_token_id`
pub const KEY_EOM: &str = "tokenizer.ggml.eom_token_id";
/// `tokenizer.ggml.unknown_token_id`
pub const KEY_UNK: &str = "tokenizer.ggml.unknown_token_id";
/// `tokenizer.ggml.padding_token_id`
pub const KEY_PAD: &str = "tokenizer.ggml.padding_token_id";
/// `tokenizer.ggml.add_bos_token`
pub const KEY_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
/// `tokenizer.ggml.add_eos_token`
pub const KEY_ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
/// `tokenizer.ggml.add_space_prefix`
pub const KEY_ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";

/// A token's type as GGUF stores it (`tokenizer.ggml.token_type`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TokenType {
    /// 0, and any value GGUF does not define.
    Undefined,
    /// 1: ordinary text.
    #[default]
    Normal,
    /// 2: the unknown token.
    Unknown,
    /// 3: a control token (BOS, EOS, chat markers); never produced from text
    /// unless special tokens are parsed, rendered only on request.
    Control,
    /// 4: a user-defined token, matched in text before the model runs.
    UserDefined,
    /// 5: reserved, unused.
    Unused,
    /// 6: a byte-fallback token `<0xNN>`.
    Byte,
}

impl TokenType {
    /// The type GGUF's integer `value` stands for.
    pub fn from_i32(value: i32) -> TokenType {
        match value {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }
}

/// A tokenizer vocabulary as plain data, the way GGUF metadata describes it.
///
/// `None` means "absent from the metadata": the tokenizer then uses
/// llama.cpp's default for the model kind (for example BOS id 1 and
/// `add_bos = true` for SentencePiece vocabularies).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Vocab {
    /// `tokenizer.ggml.model`: `"gpt2"` or `"llama"`.
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer of a `gpt2` vocabulary.
    pub pre: Option<String>,
    /// Every token's text, indexed by id.
    pub tokens: Vec<String>,
    /// Every token's type; empty means all [`TokenType::Normal`].
    pub token_types: Vec<TokenType>,
    /// Every token's score; empty means all 0.
    pub scores: Vec<f32>,
    /// BPE merges by rank, each `"left right"`; `None` when absent.
    pub merges: Option<Vec<String>>,
    /// `tokenizer.ggml.bos_token_id`
    pub bos: Option<TokenId>,
    /// `tokenizer.ggml.eos_token_id`
    pub eos: Option<TokenId>,
    /// `tokenizer.ggml.eot_token_id`
    pub eot: Option<TokenId>,
    /// `tokenizer.ggml.eom_token_id`
    pub eom: Option<TokenId>,
    /// `tokenizer.ggml.unknown_token_id`
    pub unk: Option<TokenId>,
    /// `tokenizer.ggml.padding_token_id`
    pub pad: Option<TokenId>,
    /// `tokenizer.ggml.add_bos_token`
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix`
    pub add_space_prefix: Option<bool>,
}

impl Vocab {
    /// Reads the `tokenizer.ggml.*` metadata of `file`.
    pub fn from_gguf(file: &GgufFile) -> Result<Vocab, TokenizerError> {
        let model = file.get_str(KEY_MODEL)?.ok_or(TokenizerError::MissingKey {
            key: KEY_MODEL,
            why: "it says which tokenizer to build",
        })?;
        let tokens = file
            .get_str_array(KEY_TOKENS)?
            .ok_or(TokenizerError::MissingKey {
                key: KEY_TOKENS,
                why: "it is the vocabulary",
            })?;
        let token_types = match file.get_i32_array(KEY_TOKEN_TYPE)? {
            Some(types) => checked_types(&types)?,
            None => Vec::new(),
        };
        let n_tokens = tokens.len();
        let special = |key: &'static str| -> Result<Option<TokenId>, TokenizerError> {
            match file.get_u32(key)? {
                Some(id) if id as usize >= n_tokens => {
                    Err(TokenizerError::SpecialOutOfRange { key, id, n_tokens })
                }
                id => Ok(id),
            }
        };
        Ok(Vocab {
            model: model.to_owned(),
            pre: file.get_str(KEY_PRE)?.map(str::to_owned),
            tokens: tokens.to_vec(),
            token_types,
            scores: read_scores(file)?,
            merges: file.get_str_array(KEY_MERGES)?.map(<[String]>::to_vec),
            bos: special(KEY_BOS)?,
            eos: special(KEY_EOS)?,
            eot: special(KEY_EOT)?,
            eom: special(KEY_EOM)?,
            unk: special(KEY_UNK)?,
            pad: special(KEY_PAD)?,
            add_bos: file.get_bool(KEY_ADD_BOS)?,
            add_eos: file.get_bool(KEY_ADD_EOS)?,
            add_space_prefix: file.get_bool(KEY_ADD_SPACE_PREFIX)?,
        })
    }
}

/// The token types GGUF defines (0 to 6), or an error naming the first
/// value outside them: a type weft would have to guess at.
fn checked_types(types: &[i32]) -> Result<Vec<TokenType>, TokenizerError> {
    types
        .iter()
        .enumerate()
        .map(|(index, &value)| match value {
            0..=6 => Ok(TokenType::from_i32(value)),
            _ => Err(TokenizerError::BadTokenType { index, value }),
        })
        .collect()
}

/// Scores are f32 in practice; llama.cpp also accepts i32. A NaN score
/// would make the merge order meaningless, so it is refused.
fn read_scores(file: &GgufFile) -> Result<Vec<f32>, TokenizerError> {
    let scores = match file.get_f32_array(KEY_SCORES) {
        Ok(scores) => scores.map(|s| s.into_owned()).unwrap_or_default(),
        Err(as_float) => match file.get_i32_array(KEY_SCORES) {
            Ok(Some(scores)) => scores.iter().map(|&s| s as f32).collect(),
            _ => return Err(as_float.into()),
        },
    };
    if let Some(index) = scores.iter().position(|s| s.is_nan()) {
        return Err(TokenizerError::NanScore { index });
    }
    Ok(scores)
}

/// Text-to-id lookup over the token texts, without copying them: an
/// open-addressing table of ids, hashed by text.
#[derive(Clone, Debug)]
pub(super) struct TokenIndex {
    slots: Vec<TokenId>,
    shift: u32,
}

const EMPTY_SLOT: TokenId = TokenId::MAX;

impl TokenIndex {
    /// Indexes `texts` (ids are positions). Two equal texts are an error
    /// naming both ids.
    pub fn build(texts: &[String]) -> Result<TokenIndex, TokenizerError> {
        let bits = (texts.len().max(1) * 2)
            .next_power_of_two()
            .trailing_zeros()
            .max(4);
        let mut index = TokenIndex {
            slots: vec![EMPTY_SLOT; 1 << bits],
            shift: 64 - bits,
        };
        for (id, text) in texts.iter().enumerate() {
            let id = id as TokenId;
            let mut slot = index.home(text.as_bytes());
            loop {
                let held = index.slots[slot];
                if held == EMPTY_SLOT {
                    index.slots[slot] = id;
                    break;
                }
                if texts[held as usize] == *text {
                    return Err(TokenizerError::DuplicateToken {
                        text: text.clone(),
                        first: held,
                        second: id,
                    });
                }
                slot = (slot + 1) & (index.slots.len() - 1);
            }
        }
        Ok(index)
    }

    /// The id of the token whose text is `key`.
    pub fn get(&self, texts: &[String], key: &[u8]) -> Option<TokenId> {
        let mut slot = self.home(key);
        loop {
            let held = self.slots[slot];
            if held == EMPTY_SLOT {
                return None;
            }
            if texts[held as usize].as_bytes() == key {
                return Some(held);
            }
            slot = (slot + 1) & (self.slots.len() - 1);
        }
    }

    fn home(&self, key: &[u8]) -> usize {
        (hash(key) >> self.shift) as usize
    }
}

/// A fast multiplicative hash over 8-byte words (FxHash's scheme); the top
/// bits pick the slot.
fn hash(bytes: &[u8]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let mut h = bytes.len() as u64;
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(word)).wrapping_mul(K);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut word = [0u8; 8];
        word[..rest.len()].copy_from_slice(rest);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(word)).wrapping_mul(K);
    }
    // Fold the well-mixed high bits back down once more for short keys.
    (h ^ (h >> 29)).wrapping_mul(K)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_finds_every_token_and_rejects_duplicates() {
        let texts: Vec<String> = (0..1000).map(|i| format!("tok{i}")).collect();
        let index = TokenIndex::build(&texts).expect("unique texts");
        for (i, t) in texts.iter().enumerate() {
            assert_eq!(index.get(&texts, t.as_bytes()), Some(i as TokenId));
        }
        assert_eq!(index.get(&texts, b"nope"), None);
        let dup = vec!["a".to_owned(), "b".to_owned(), "a".to_owned()];
        assert!(matches!(
            TokenIndex::build(&dup),
            Err(TokenizerError::DuplicateToken {
                first: 0,
                second: 2,
                ..
            })
        ));
    }
}
