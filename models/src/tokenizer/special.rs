//! Splitting raw text on the text of special tokens, before any model sees
//! it (llama.cpp's `tokenizer_st_partition`).
//!
//! The candidates are the control, user-defined and unknown tokens, longest
//! text first. Each candidate in turn splits every remaining text fragment at
//! each of its (non-overlapping, leftmost) occurrences. Without
//! `parse_special` only user-defined tokens take part: text such as
//! `<|im_start|>` in a prompt is then ordinary text, while Gemma's
//! user-defined whitespace runs and HTML tags are still matched first.

use std::ops::Range;

use super::attrs::TokenAttr;
use super::TokenId;

/// A piece of the input after partitioning.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Fragment {
    /// Bytes of the input still to be tokenized by the model.
    Text(Range<usize>),
    /// A special token matched in the input.
    Token(TokenId),
}

/// Which byte pairs occur in a text: a cheap filter that skips most special
/// tokens without searching for them.
struct PairFilter {
    bits: Vec<u64>,
}

impl PairFilter {
    fn new(text: &[u8]) -> PairFilter {
        let mut bits = vec![0u64; 65536 / 64];
        for pair in text.windows(2) {
            let index = usize::from(pair[0]) << 8 | usize::from(pair[1]);
            bits[index / 64] |= 1 << (index % 64);
        }
        PairFilter { bits }
    }

    /// False when `needle` (two bytes or more) certainly does not occur.
    fn may_contain(&self, needle: &[u8]) -> bool {
        match needle {
            [a, b, ..] => {
                let index = usize::from(*a) << 8 | usize::from(*b);
                self.bits[index / 64] & (1 << (index % 64)) != 0
            }
            _ => true,
        }
    }
}

/// Partitions `text` on the special tokens `candidates` (already in
/// matching order: longest first) whose attributes allow it.
pub(super) fn partition(
    text: &str,
    candidates: &[TokenId],
    texts: &[String],
    attrs: &[TokenAttr],
    parse_special: bool,
) -> Vec<Fragment> {
    if text.is_empty() {
        return Vec::new();
    }
    let mut fragments = vec![Fragment::Text(0..text.len())];
    let filter = PairFilter::new(text.as_bytes());
    let mut next = Vec::new();
    for &id in candidates {
        let attr = attrs[id as usize];
        if !parse_special && attr.intersects(TokenAttr::CONTROL | TokenAttr::UNKNOWN) {
            continue;
        }
        let needle = texts[id as usize].as_str();
        if needle.is_empty() || !filter.may_contain(needle.as_bytes()) {
            continue;
        }
        next.clear();
        let mut changed = false;
        for fragment in &fragments {
            match fragment {
                Fragment::Text(range) => {
                    changed |= split_on(text, range.clone(), needle, id, &mut next)
                }
                token => next.push(token.clone()),
            }
        }
        if changed {
            std::mem::swap(&mut fragments, &mut next);
        }
    }
    fragments
}

/// Splits the fragment `range` of `text` at each occurrence of `needle`,
/// appending the pieces to `out`. Returns whether anything matched.
fn split_on(
    text: &str,
    range: Range<usize>,
    needle: &str,
    id: TokenId,
    out: &mut Vec<Fragment>,
) -> bool {
    let mut start = range.start;
    let mut matched = false;
    while let Some(found) = text[start..range.end].find(needle) {
        let at = start + found;
        if at > start {
            out.push(Fragment::Text(start..at));
        }
        out.push(Fragment::Token(id));
        start = at + needle.len();
        matched = true;
    }
    if start < range.end {
        out.push(Fragment::Text(start..range.end));
    }
    matched
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_on_allowed_tokens_only() {
        let texts: Vec<String> = ["<ctl>", "  ", "<u>"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let attrs = [
            TokenAttr::CONTROL,
            TokenAttr::USER_DEFINED,
            TokenAttr::USER_DEFINED,
        ];
        let text = "a<ctl>b  c<u><u>";
        let plain = partition(text, &[0, 2, 1], &texts, &attrs, false);
        assert_eq!(
            plain,
            [
                Fragment::Text(0..7),
                Fragment::Token(1),
                Fragment::Text(9..10),
                Fragment::Token(2),
                Fragment::Token(2)
            ]
        );
        let special = partition(text, &[0, 2, 1], &texts, &attrs, true);
        assert_eq!(special[1], Fragment::Token(0));
        assert!(partition("", &[0], &texts, &attrs, true).is_empty());
    }
}
