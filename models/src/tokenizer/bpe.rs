//! Byte-level BPE (`tokenizer.ggml.model = gpt2`), as llama.cpp's
//! `llm_tokenizer_bpe` runs it.
//!
//! Each word of the pre-tokenizer is mapped byte by byte to GPT-2's
//! printable code points, starts as one symbol per byte, and repeatedly
//! merges the adjacent pair with the lowest merge rank (ties: leftmost).
//! Symbols that are not tokens at the end fall back to single-character
//! tokens.
//!
//! Speed: every string that can appear as a symbol (the tokens, and both
//! halves and the result of every merge) is interned to a number once, at
//! load, so a merge lookup during tokenization is one hash of two integers.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::ops::Range;

use super::pretokenize::PreTokenizer;
use super::unicode::{byte_to_char, char_to_byte};
use super::vocab::TokenIndex;
use super::TokenId;

/// Symbol number of a string that is neither a token nor part of a merge.
const NO_SYMBOL: u32 = u32::MAX;
const NO_LINK: u32 = u32::MAX;

/// One merge: its rank and the symbol it produces.
#[derive(Clone, Copy, Debug)]
struct Merge {
    rank: u32,
    result: u32,
}

/// The byte-level BPE model: merges over interned symbols.
#[derive(Clone, Debug)]
pub(super) struct Bpe {
    pub pre: PreTokenizer,
    /// (left symbol, right symbol) -> merge. Symbols below `n_tokens` are
    /// token ids; the others are merge strings that are not tokens.
    merges: HashMap<(u32, u32), Merge, BuildHasherDefault<FastHasher>>,
    /// The symbol of each byte's GPT-2 code point.
    byte_symbols: [u32; 256],
    /// The token whose text is this single ASCII character.
    ascii_tokens: [Option<TokenId>; 128],
    n_tokens: u32,
}

/// Interns strings: tokens keep their ids, other strings get ids from
/// `n_tokens` on.
struct Interner<'a> {
    texts: &'a [String],
    index: &'a TokenIndex,
    extra: HashMap<String, u32, BuildHasherDefault<FastHasher>>,
}

impl Interner<'_> {
    fn intern(&mut self, s: &str) -> u32 {
        if let Some(id) = self.index.get(self.texts, s.as_bytes()) {
            return id;
        }
        let next = (self.texts.len() + self.extra.len()) as u32;
        *self.extra.entry(s.to_owned()).or_insert(next)
    }
}

impl Bpe {
    /// Builds the merge table from `merges` (rank = position; a line whose
    /// pair is already known keeps its first rank, as in llama.cpp).
    pub fn new(pre: PreTokenizer, merges: &[String], texts: &[String], index: &TokenIndex) -> Bpe {
        let mut interner = Interner {
            texts,
            index,
            extra: HashMap::default(),
        };
        let mut table =
            HashMap::with_capacity_and_hasher(merges.len(), BuildHasherDefault::default());
        let mut joined = String::new();
        for (rank, line) in merges.iter().enumerate() {
            // llama.cpp splits at the first space after the first byte.
            let Some(space) = line.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1) else {
                continue;
            };
            let (left, right) = (&line[..space], &line[space + 1..]);
            if left.is_empty() || right.is_empty() {
                continue;
            }
            joined.clear();
            joined.push_str(left);
            joined.push_str(right);
            let key = (interner.intern(left), interner.intern(right));
            let result = interner.intern(&joined);
            table.entry(key).or_insert(Merge {
                rank: rank as u32,
                result,
            });
        }
        let mut byte_symbols = [NO_SYMBOL; 256];
        let mut buf = [0u8; 4];
        for (b, symbol) in byte_symbols.iter_mut().enumerate() {
            let s = byte_to_char(b as u8).encode_utf8(&mut buf);
            *symbol = index
                .get(texts, s.as_bytes())
                .or_else(|| interner.extra.get(&*s).copied())
                .unwrap_or(NO_SYMBOL);
        }
        let mut ascii_tokens = [None; 128];
        for (c, token) in ascii_tokens.iter_mut().enumerate() {
            *token = index.get(texts, &[c as u8]);
        }
        Bpe {
            pre,
            merges: table,
            byte_symbols,
            ascii_tokens,
            n_tokens: texts.len() as u32,
        }
    }

    /// Tokenizes one fragment of raw text, appending token ids to `out`.
    pub fn encode(&self, text: &str, texts: &[String], index: &TokenIndex, out: &mut Vec<TokenId>) {
        let mut words: Vec<Range<usize>> = Vec::new();
        self.pre.split(text, &mut words);
        let mut scratch = Scratch::default();
        for word in words {
            let bytes = &text.as_bytes()[word];
            if self.pre.ignore_merges {
                scratch.encoded.clear();
                scratch
                    .encoded
                    .extend(bytes.iter().map(|&b| byte_to_char(b)));
                if let Some(id) = index.get(texts, scratch.encoded.as_bytes()) {
                    out.push(id);
                    continue;
                }
            }
            self.encode_word(bytes, &mut scratch, out);
        }
    }

    /// Merges one word and appends its tokens.
    fn encode_word(&self, word: &[u8], scratch: &mut Scratch, out: &mut Vec<TokenId>) {
        let symbols = &mut scratch.symbols;
        symbols.clear();
        for (i, &b) in word.iter().enumerate() {
            let i = i as u32;
            symbols.push(Symbol {
                start: i,
                end: i + 1,
                id: self.byte_symbols[usize::from(b)],
                prev: i.checked_sub(1).unwrap_or(NO_LINK),
                next: if i as usize + 1 < word.len() {
                    i + 1
                } else {
                    NO_LINK
                },
            });
        }
        let heap = &mut scratch.heap;
        heap.clear();
        for right in 1..symbols.len() as u32 {
            self.push_pair(symbols, heap, right - 1, right);
        }
        while let Some(Reverse(pair)) = heap.pop() {
            let (left, right) = (pair.left as usize, pair.right as usize);
            let alive = symbols[left].end > symbols[left].start
                && symbols[right].end > symbols[right].start;
            if !alive || symbols[left].id != pair.left_id || symbols[right].id != pair.right_id {
                continue; // stale: one side has merged since
            }
            symbols[left].end = symbols[right].end;
            symbols[left].id = pair.result;
            symbols[right].end = symbols[right].start;
            let next = symbols[right].next;
            symbols[left].next = next;
            if next != NO_LINK {
                symbols[next as usize].prev = pair.left;
            }
            let prev = symbols[left].prev;
            if prev != NO_LINK {
                self.push_pair(symbols, heap, prev, pair.left);
            }
            if next != NO_LINK {
                self.push_pair(symbols, heap, pair.left, next);
            }
        }
        let mut at = if symbols.is_empty() { NO_LINK } else { 0 };
        while at != NO_LINK {
            let symbol = symbols[at as usize];
            self.emit(symbol, word, out);
            at = symbol.next;
        }
    }

    fn push_pair(
        &self,
        symbols: &[Symbol],
        heap: &mut BinaryHeap<Reverse<Pair>>,
        left: u32,
        right: u32,
    ) {
        let (left_id, right_id) = (symbols[left as usize].id, symbols[right as usize].id);
        if let Some(merge) = self.merges.get(&(left_id, right_id)) {
            heap.push(Reverse(Pair {
                rank: merge.rank,
                left,
                right,
                left_id,
                right_id,
                result: merge.result,
            }));
        }
    }

    /// Appends a final symbol: its token, or (when its text is no token) the
    /// tokens of its single ASCII characters, as llama.cpp does.
    fn emit(&self, symbol: Symbol, word: &[u8], out: &mut Vec<TokenId>) {
        if symbol.id < self.n_tokens {
            out.push(symbol.id);
            return;
        }
        for &b in &word[symbol.start as usize..symbol.end as usize] {
            let c = byte_to_char(b);
            if c.is_ascii() {
                out.extend(self.ascii_tokens[c as usize]);
            }
        }
    }
}

/// The bytes a byte-level token's text stands for. Code points outside
/// GPT-2's mapping are rendered as llama.cpp renders them:
/// `[UNK_BYTE_0x<hex>` followed by the whole token text and `]`.
pub(super) fn decode_text(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
    out
}

/// A fast, non-cryptographic hasher (FxHash's multiply-rotate) for the
/// merge table, whose keys are not attacker-chosen in any useful way: a
/// vocabulary can only slow down its own loading.
#[derive(Default)]
struct FastHasher(u64);

impl Hasher for FastHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.write_u64(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x517c_c1b7_2722_0a95);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// A symbol of the word being merged: the bytes `start..end` of the word
/// (empty once merged into its left neighbour) and its interned id.
#[derive(Clone, Copy, Debug)]
struct Symbol {
    start: u32,
    end: u32,
    id: u32,
    prev: u32,
    next: u32,
}

/// A candidate merge of two adjacent symbols; ordered by rank, then by
/// position (the heap is a min-heap through `Reverse`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Pair {
    rank: u32,
    left: u32,
    right: u32,
    left_id: u32,
    right_id: u32,
    result: u32,
}

/// Buffers reused across the words of one call.
#[derive(Default)]
struct Scratch {
    symbols: Vec<Symbol>,
    heap: BinaryHeap<Reverse<Pair>>,
    encoded: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_maps_bytes_back() {
        assert_eq!(decode_text("ĠhelloĊ"), b" hello\n");
        assert_eq!(
            decode_text("a\u{3042}"),
            b"a[UNK_BYTE_0xe38182a\xe3\x81\x82]"
        );
    }
}
