//! Token attributes and end-of-generation tokens, derived the way llama.cpp
//! derives them.
//!
//! GGUF stores one [`TokenType`] per token, but llama.cpp does not take it at
//! its word: tokens whose text looks like an end-of-turn or fill-in-the-middle
//! marker are forced to be control tokens (so they are not parsed from plain
//! text and render as nothing), tokens with those texts end generation, and a
//! few model-specific fix-ups apply. Tokenization and decoding both depend
//! on the result, so it is reproduced here.

use std::ops::{BitOr, BitOrAssign};

use super::vocab::{TokenIndex, TokenType};
use super::TokenId;

/// A token's attributes, with llama.cpp's bit values (`llama_token_attr`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TokenAttr(u16);

impl TokenAttr {
    /// No attribute (token type 0 or unknown).
    pub const UNDEFINED: TokenAttr = TokenAttr(0);
    /// The unknown token.
    pub const UNKNOWN: TokenAttr = TokenAttr(1 << 0);
    /// Reserved, unused.
    pub const UNUSED: TokenAttr = TokenAttr(1 << 1);
    /// Ordinary text.
    pub const NORMAL: TokenAttr = TokenAttr(1 << 2);
    /// A control token.
    pub const CONTROL: TokenAttr = TokenAttr(1 << 3);
    /// A user-defined token.
    pub const USER_DEFINED: TokenAttr = TokenAttr(1 << 4);
    /// A byte-fallback token.
    pub const BYTE: TokenAttr = TokenAttr(1 << 5);

    /// The raw bits (llama.cpp's values).
    pub fn bits(self) -> u16 {
        self.0
    }

    /// Whether every bit of `other` is set.
    pub fn contains(self, other: TokenAttr) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether any bit of `other` is set.
    pub fn intersects(self, other: TokenAttr) -> bool {
        self.0 & other.0 != 0
    }
}

impl BitOr for TokenAttr {
    type Output = TokenAttr;

    fn bitor(self, rhs: TokenAttr) -> TokenAttr {
        TokenAttr(self.0 | rhs.0)
    }
}

impl BitOrAssign for TokenAttr {
    fn bitor_assign(&mut self, rhs: TokenAttr) {
        self.0 |= rhs.0;
    }
}

impl From<TokenType> for TokenAttr {
    fn from(t: TokenType) -> TokenAttr {
        match t {
            TokenType::Undefined => TokenAttr::UNDEFINED,
            TokenType::Normal => TokenAttr::NORMAL,
            TokenType::Unknown => TokenAttr::UNKNOWN,
            TokenType::Control => TokenAttr::CONTROL,
            TokenType::UserDefined => TokenAttr::USER_DEFINED,
            TokenType::Unused => TokenAttr::UNUSED,
            TokenType::Byte => TokenAttr::BYTE,
        }
    }
}

/// Texts llama.cpp takes for an end-of-turn token when the metadata names none.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
/// Fill-in-the-middle markers (prefix, suffix, middle): control tokens.
const FIM_TEXTS: &[&[&str]] = &[
    &[
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<fim_prefix>",
        "<｜fim▁begin｜>",
        "<PRE>",
        "▁<PRE>",
        "<|code_prefix|>",
        "<|prefix|>",
    ],
    &[
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<fim_suffix>",
        "<｜fim▁hole｜>",
        "<SUF>",
        "▁<SUF>",
        "<|code_suffix|>",
        "<|suffix|>",
    ],
    &[
        "<|fim_middle|>",
        "<fim-middle>",
        "<fim_middle>",
        "<｜fim▁end｜>",
        "<MID>",
        "▁<MID>",
        "<|code_middle|>",
        "<|middle|>",
    ],
];
/// Fill-in-the-middle markers (pad, repository, file separator): control
/// tokens that also end generation.
const FIM_EOG_TEXTS: &[&[&str]] = &[
    &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
    &[
        "<|fim_repo|>",
        "<|repo_name|>",
        "<fim-repo>",
        "<REPO>",
        "<reponame>",
    ],
    &["<|file_sep|>"],
];
/// Texts that end generation (and are forced to be control tokens).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];
/// gpt-oss markers llama.cpp always renders (made user-defined).
const ALWAYS_RENDERED: &[&str] = &["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"];

/// Special ids after metadata and llama.cpp's defaults have been applied.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct SpecialIds {
    pub eos: Option<TokenId>,
    pub eot: Option<TokenId>,
    pub eom: Option<TokenId>,
}

/// Attributes of every token and the sorted end-of-generation ids.
pub(super) struct Derived {
    pub attrs: Vec<TokenAttr>,
    pub eog: Vec<TokenId>,
    pub eot: Option<TokenId>,
}

/// Looks texts up in the vocabulary.
struct Lookup<'a> {
    texts: &'a [String],
    index: &'a TokenIndex,
}

impl Lookup<'_> {
    fn id(&self, text: &str) -> Option<TokenId> {
        self.index.get(self.texts, text.as_bytes())
    }

    /// The lowest id among tokens with one of `texts` (llama.cpp takes the
    /// first its hash map yields; vocabularies hold at most one in practice).
    fn first_of(&self, texts: &[&str]) -> Option<TokenId> {
        texts.iter().filter_map(|t| self.id(t)).min()
    }

    fn text(&self, id: TokenId) -> &str {
        &self.texts[id as usize]
    }
}

/// Derives attributes and end-of-generation tokens from the token types,
/// texts and special ids.
pub(super) fn derive(
    texts: &[String],
    types: &[TokenType],
    index: &TokenIndex,
    ids: SpecialIds,
) -> Derived {
    let lookup = Lookup { texts, index };
    let mut attrs: Vec<TokenAttr> = if types.is_empty() {
        vec![TokenAttr::NORMAL; texts.len()]
    } else {
        types[..texts.len()]
            .iter()
            .map(|&t| TokenAttr::from(t))
            .collect()
    };
    let mut eog: Vec<TokenId> = Vec::new();
    let force_control =
        |attrs: &mut Vec<TokenAttr>, id: TokenId| attrs[id as usize] |= TokenAttr::CONTROL;

    let eot = ids.eot.or_else(|| lookup.first_of(EOT_TEXTS));
    if ids.eot.is_none() {
        eot.into_iter().for_each(|id| force_control(&mut attrs, id));
    }
    if ids.eom.is_none() {
        lookup
            .id("<|eom_id|>")
            .into_iter()
            .for_each(|id| force_control(&mut attrs, id));
    }
    for group in FIM_TEXTS {
        lookup
            .first_of(group)
            .into_iter()
            .for_each(|id| force_control(&mut attrs, id));
    }
    for group in FIM_EOG_TEXTS {
        if let Some(id) = lookup.first_of(group) {
            force_control(&mut attrs, id);
            eog.push(id);
        }
    }
    for (attr, text) in attrs.iter_mut().zip(texts) {
        if attr.contains(TokenAttr::CONTROL) && text.contains("unused") {
            *attr |= TokenAttr::UNUSED;
        }
    }
    for id in EOG_TEXTS.iter().filter_map(|t| lookup.id(t)) {
        force_control(&mut attrs, id);
        eog.push(id);
    }
    for id in ALWAYS_RENDERED.iter().filter_map(|t| lookup.id(t)) {
        attrs[id as usize] = TokenAttr::USER_DEFINED;
    }
    eog.extend([ids.eos, eot, ids.eom].into_iter().flatten());
    eog.sort_unstable();
    eog.dedup();
    apply_eog_fixups(&lookup, &mut attrs, &mut eog);
    Derived { attrs, eog, eot }
}

/// llama.cpp's model-specific corrections of the end-of-generation set:
/// gpt-oss and solar-open's `<|end|>` is not an end, and `</s>` is a normal
/// token where `<|tool_response>` or `<|plamo:eos|>` exist.
fn apply_eog_fixups(lookup: &Lookup<'_>, attrs: &mut [TokenAttr], eog: &mut Vec<TokenId>) {
    let has =
        |eog: &[TokenId], texts: &[&str]| eog.iter().any(|&id| texts.contains(&lookup.text(id)));
    let find =
        |eog: &[TokenId], text: &str| eog.iter().copied().find(|&id| lookup.text(id) == text);

    let has_call = has(eog, &["<|call|>", "<|calls|>"]);
    if let Some(end) = find(eog, "<|end|>") {
        if has_call && (has(eog, &["<|return|>"]) || has(eog, &["<|flush|>"])) {
            eog.retain(|&id| id != end);
            attrs[end as usize] = TokenAttr::USER_DEFINED;
        }
    }
    if let Some(s) = find(eog, "</s>") {
        if has(eog, &["<|tool_response>", "<|plamo:eos|>"]) {
            eog.retain(|&id| id != s);
            attrs[s as usize] = TokenAttr::NORMAL;
        }
    }
}
