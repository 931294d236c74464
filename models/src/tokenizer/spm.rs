//! SentencePiece-style tokenization (`tokenizer.ggml.model = llama`), as
//! llama.cpp's `llm_tokenizer_spm` runs it.
//!
//! The text (spaces already replaced by U+2581) starts as one symbol per
//! character; the adjacent pair whose concatenation is a token with the
//! highest score merges first (ties: leftmost), until no pair is a token.
//! A final symbol that is not a token falls back to byte tokens `<0xNN>`.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::vocab::TokenIndex;
use super::TokenId;

const NO_LINK: u32 = u32::MAX;

/// The SentencePiece model: byte-fallback tokens, looked up once.
#[derive(Clone, Debug)]
pub(super) struct Spm {
    /// The token for each byte: `<0xNN>`, else the one-byte text, else the
    /// unknown token. `None`: the byte is dropped (llama.cpp would abort).
    byte_tokens: [Option<TokenId>; 256],
}

/// The vocabulary data a tokenization needs.
pub(super) struct SpmVocab<'a> {
    pub texts: &'a [String],
    pub scores: &'a [f32],
    pub index: &'a TokenIndex,
}

impl Spm {
    pub fn new(texts: &[String], index: &TokenIndex, unk: Option<TokenId>) -> Spm {
        let mut byte_tokens = [None; 256];
        for (b, token) in byte_tokens.iter_mut().enumerate() {
            let hex = format!("<0x{b:02X}>");
            *token = index
                .get(texts, hex.as_bytes())
                .or_else(|| index.get(texts, &[b as u8]))
                .or(unk);
        }
        Spm { byte_tokens }
    }

    /// Tokenizes `text` (already escaped), appending token ids to `out`.
    pub fn encode(&self, text: &str, vocab: &SpmVocab<'_>, out: &mut Vec<TokenId>) {
        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        let count = text.chars().count() as u32;
        for (i, (offset, c)) in text.char_indices().enumerate() {
            let i = i as u32;
            symbols.push(Symbol {
                start: offset as u32,
                end: (offset + c.len_utf8()) as u32,
                prev: i.checked_sub(1).unwrap_or(NO_LINK),
                next: if i + 1 < count { i + 1 } else { NO_LINK },
            });
        }
        let mut heap = BinaryHeap::new();
        for right in 1..count {
            push_pair(text, vocab, &symbols, &mut heap, right - 1, right);
        }
        while let Some(pair) = heap.pop() {
            let (left, right) = (pair.left as usize, pair.right as usize);
            let (l, r) = (symbols[left], symbols[right]);
            if l.is_empty() || r.is_empty() || l.len() + r.len() != pair.len {
                continue; // stale: one side has merged since
            }
            symbols[left].end = r.end;
            symbols[right].end = r.start;
            symbols[left].next = r.next;
            if r.next != NO_LINK {
                symbols[r.next as usize].prev = pair.left;
            }
            if l.prev != NO_LINK {
                push_pair(text, vocab, &symbols, &mut heap, l.prev, pair.left);
            }
            if r.next != NO_LINK {
                push_pair(text, vocab, &symbols, &mut heap, pair.left, r.next);
            }
        }
        let mut at = if symbols.is_empty() { NO_LINK } else { 0 };
        while at != NO_LINK {
            let symbol = symbols[at as usize];
            let piece = &text.as_bytes()[symbol.start as usize..symbol.end as usize];
            match vocab.index.get(vocab.texts, piece) {
                Some(id) => out.push(id),
                None => out.extend(
                    piece
                        .iter()
                        .filter_map(|&b| self.byte_tokens[usize::from(b)]),
                ),
            }
            at = symbol.next;
        }
    }
}

/// Queues the merge of `left` and `right` if their text is a token.
fn push_pair(
    text: &str,
    vocab: &SpmVocab<'_>,
    symbols: &[Symbol],
    heap: &mut BinaryHeap<Pair>,
    left: u32,
    right: u32,
) {
    let (start, end) = (symbols[left as usize].start, symbols[right as usize].end);
    let joined = &text.as_bytes()[start as usize..end as usize];
    if let Some(id) = vocab.index.get(vocab.texts, joined) {
        let score = vocab.scores.get(id as usize).copied().unwrap_or(0.0);
        heap.push(Pair {
            score,
            left,
            right,
            len: end - start,
        });
    }
}

/// One character or merged run of the text: bytes `start..end` (empty once
/// merged into its left neighbour).
#[derive(Clone, Copy, Debug)]
struct Symbol {
    start: u32,
    end: u32,
    prev: u32,
    next: u32,
}

impl Symbol {
    fn len(self) -> u32 {
        self.end - self.start
    }

    fn is_empty(self) -> bool {
        self.end == self.start
    }
}

/// A candidate merge: the heap pops the highest score first, then the
/// leftmost pair.
#[derive(Clone, Copy, Debug)]
struct Pair {
    score: f32,
    left: u32,
    right: u32,
    len: u32,
}

impl Ord for Pair {
    fn cmp(&self, other: &Pair) -> Ordering {
        // Like llama.cpp's `<` on floats: -0.0 equals 0.0, NaN ties.
        let by_score = self
            .score
            .partial_cmp(&other.score)
            .unwrap_or(Ordering::Equal);
        by_score.then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Pair {
    fn partial_cmp(&self, other: &Pair) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Pair {
    fn eq(&self, other: &Pair) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Pair {}
