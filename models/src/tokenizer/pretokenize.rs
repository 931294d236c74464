//! Pre-tokenizers of byte-level BPE vocabularies: `tokenizer.ggml.pre` names
//! a sequence of regexes, each applied inside the pieces the previous one
//! left (matches and the gaps between them both become pieces).
//!
//! llama.cpp runs its common patterns through hand-written matchers rather
//! than a regex engine, and those matchers differ from a true regex in ways
//! that change token ids: a fragment boundary counts as "end of text" for
//! `\s+(?!\S)`, categories come from llama.cpp's own Unicode 15.1 tables,
//! unassigned code points count as "other" (`[^\s\p{L}\p{N}]`). The steps
//! here re-implement those matchers (and the few simple character-class
//! regexes) so every supported pre-tokenizer splits exactly as llama.cpp's.

use std::ops::Range;

use super::unicode::{Category, Flags};
use super::TokenizerError;

/// One regex of a pre-tokenizer, as a hand-written matcher.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`
    Gpt2,
    /// Llama 3's `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
    /// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`; with `digits = 1`
    /// it is Qwen 2's (`\p{N}` instead of `\p{N}{1,3}`).
    Llama3 { digits: usize },
    /// `\p{N}`: every number on its own.
    EachNumber,
    /// `\p{N}+`
    NumberRuns,
    /// `[\p{P}\$\+<=>\^~\|]+` (with `` ` `` as well when `backtick`).
    PunctuationRuns { backtick: bool },
    /// `[0-9][0-9][0-9]`
    AsciiDigitTriples,
}

/// A pre-tokenizer: the regex steps `tokenizer.ggml.pre` names and the
/// defaults llama.cpp attaches to that name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct PreTokenizer {
    /// The name as the metadata gave it (`"default"` when absent).
    pub name: String,
    steps: &'static [Step],
    /// A word that is itself a token skips the merges (Llama 3 style).
    pub ignore_merges: bool,
    /// llama.cpp's default for `add_bos_token` with this pre-tokenizer.
    pub add_bos_default: bool,
    /// This pre-tokenizer drops the vocabulary's default BOS id.
    pub no_default_bos: bool,
}

const GPT2: &[Step] = &[Step::Gpt2];
const SMOLLM: &[Step] = &[Step::EachNumber, Step::Gpt2];
const LLAMA3: &[Step] = &[Step::Llama3 { digits: 3 }];
const QWEN2: &[Step] = &[Step::Llama3 { digits: 1 }];
const FALCON: &[Step] = &[
    Step::PunctuationRuns { backtick: true },
    Step::Gpt2,
    Step::AsciiDigitTriples,
];
const DEFAULT: &[Step] = &[
    Step::PunctuationRuns { backtick: false },
    Step::Gpt2,
    Step::NumberRuns,
    Step::AsciiDigitTriples,
];

/// `tokenizer.ggml.pre` values weft implements, grouped by regex set.
const TABLE: &[(&[&str], &[Step])] = &[
    (&["default"], DEFAULT),
    (&["falcon"], FALCON),
    (
        &[
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "a.x-4.0",
            "mellum",
            "modern-bert",
            "jina-v1-en",
            "jina-v2-code",
            "roberta-bpe",
            "mpt",
            "olmo",
            "jais",
            "trillion",
            "granite-docling",
            "exaone4",
        ],
        GPT2,
    ),
    (
        &[
            "starcoder",
            "refact",
            "command-r",
            "smollm",
            "codeshell",
            "exaone",
            "minerva-7b",
            "mellum2",
        ],
        SMOLLM,
    ),
    (
        &[
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "jina-v5-nano",
            "dbrx",
            "smaug-bpe",
            "chatglm-bpe",
            "glm4",
            "glm5",
        ],
        LLAMA3,
    ),
    (
        &[
            "qwen2",
            "deepseek-r1-qwen",
            "kormo",
            "f2llmv2",
            "megrez",
            "stablelm2",
            "hunyuan",
            "solar-open",
            "grok-2",
        ],
        QWEN2,
    ),
];

impl PreTokenizer {
    /// The pre-tokenizer `tokenizer.ggml.pre` names; `None` (key absent) is
    /// llama.cpp's `default`.
    pub fn from_name(name: Option<&str>) -> Result<PreTokenizer, TokenizerError> {
        let name = match name {
            None | Some("") => "default",
            Some(n) => n,
        };
        let steps = TABLE
            .iter()
            .find(|(names, _)| names.contains(&name))
            .map(|(_, steps)| *steps)
            .ok_or_else(|| TokenizerError::UnsupportedPreTokenizer {
                name: name.to_owned(),
                supported: TABLE
                    .iter()
                    .flat_map(|(names, _)| names.iter())
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        let llama3_family = matches!(
            name,
            "llama3"
                | "llama-v3"
                | "llama-bpe"
                | "falcon3"
                | "falcon-h1"
                | "pixtral"
                | "midm-2.0"
                | "lfm2"
                | "jina-v5-nano"
        );
        Ok(PreTokenizer {
            name: name.to_owned(),
            steps,
            ignore_merges: llama3_family || matches!(name, "glm4" | "glm5"),
            add_bos_default: llama3_family,
            no_default_bos: matches!(name, "chatglm-bpe" | "glm4" | "glm5"),
        })
    }

    /// Appends the byte ranges of `text`'s words to `words`, in order; they
    /// tile `text` exactly.
    pub fn split(&self, text: &str, words: &mut Vec<Range<usize>>) {
        let cps: Vec<CodePoint> = text
            .char_indices()
            .map(|(offset, ch)| CodePoint {
                offset,
                ch,
                flags: Flags::of(ch),
            })
            .collect();
        // Piece lengths in code points, as llama.cpp keeps them.
        let mut pieces = vec![cps.len()];
        let mut next = Vec::with_capacity(cps.len() / 2 + 1);
        for step in self.steps {
            next.clear();
            let mut start = 0;
            for &len in &pieces {
                let mut splitter = Splitter {
                    cps: &cps,
                    end: start + len,
                    prev: start,
                    out: &mut next,
                };
                splitter.run(*step, start);
                start += len;
            }
            std::mem::swap(&mut pieces, &mut next);
        }
        let mut start = 0;
        for len in pieces {
            let from = cps[start].offset;
            let to = cps.get(start + len).map_or(text.len(), |c| c.offset);
            words.push(from..to);
            start += len;
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct CodePoint {
    offset: usize,
    ch: char,
    flags: Flags,
}

/// Splits one piece `[start, end)` of the code points into smaller pieces.
struct Splitter<'a> {
    cps: &'a [CodePoint],
    /// One past the piece's last code point; positions from here on are
    /// "outside", like llama.cpp's `OUT_OF_RANGE`.
    end: usize,
    /// Where the next emitted piece starts.
    prev: usize,
    out: &'a mut Vec<usize>,
}

impl Splitter<'_> {
    fn run(&mut self, step: Step, start: usize) {
        match step {
            Step::Gpt2 => self.gpt2(start),
            Step::Llama3 { digits } => self.llama3(start, digits),
            Step::EachNumber => self.isolate(start, |s, p| s.flags(p).number().then_some(1)),
            Step::NumberRuns => self.isolate(start, |s, p| s.run_len(p, |c| c.flags.number())),
            Step::PunctuationRuns { backtick } => self.isolate(start, |s, p| {
                s.run_len(p, |c| {
                    c.flags.category == Category::P
                        || matches!(c.ch, '$' | '+' | '<' | '=' | '>' | '^' | '~' | '|')
                        || (backtick && c.ch == '`')
                })
            }),
            Step::AsciiDigitTriples => self.isolate(start, |s, p| {
                (0..3)
                    .all(|k| s.char_at(p + k).is_some_and(|c| c.is_ascii_digit()))
                    .then_some(3)
            }),
        }
    }

    fn flags(&self, pos: usize) -> Flags {
        if pos < self.end {
            self.cps[pos].flags
        } else {
            Flags::ABSENT
        }
    }

    fn char_at(&self, pos: usize) -> Option<char> {
        (pos < self.end).then(|| self.cps[pos].ch)
    }

    /// Emits the piece from the last emitted position up to `to` (if not empty).
    fn emit(&mut self, to: usize) {
        if to > self.prev {
            self.out.push(to - self.prev);
        }
        self.prev = to;
    }

    /// Length of the run of code points from `pos` satisfying `pred`, `None` if empty.
    fn run_len(&self, pos: usize, pred: impl Fn(&CodePoint) -> bool) -> Option<usize> {
        let len = self.cps[pos..self.end]
            .iter()
            .take_while(|c| pred(c))
            .count();
        (len > 0).then_some(len)
    }

    /// A regex split with a simple pattern: `matcher(pos)` is the length of
    /// the leftmost match starting at `pos`; matches and the gaps between
    /// them become pieces.
    fn isolate(&mut self, start: usize, matcher: impl Fn(&Self, usize) -> Option<usize>) {
        let mut pos = start;
        while pos < self.end {
            match matcher(self, pos) {
                Some(len) => {
                    self.emit(pos);
                    pos += len;
                    self.emit(pos);
                }
                None => pos += 1,
            }
        }
        self.emit(self.end);
    }

    /// `'s|'t|'re|'ve|'m|'ll|'d` at `pos` (case-insensitive when asked):
    /// the match length.
    fn contraction(&self, pos: usize, ignore_case: bool) -> Option<usize> {
        if self.char_at(pos) != Some('\'') || pos + 1 >= self.end {
            return None;
        }
        let lower = |p: usize| {
            self.char_at(p).map(|c| {
                if ignore_case {
                    c.to_ascii_lowercase()
                } else {
                    c
                }
            })
        };
        let next = lower(pos + 1);
        if matches!(next, Some('s' | 't' | 'm' | 'd')) {
            return Some(2);
        }
        if pos + 2 < self.end {
            let pair = (next, lower(pos + 2));
            if matches!(
                pair,
                (Some('r'), Some('e')) | (Some('v'), Some('e')) | (Some('l'), Some('l'))
            ) {
                return Some(3);
            }
        }
        None
    }

    /// The whitespace alternatives shared by GPT-2 and Llama 3:
    /// `\s+(?!\S)|\s+`, where a run that reaches the end of the piece is
    /// taken whole (llama.cpp treats the boundary as end of text). Returns
    /// the new position, or `None` when there is no whitespace at `pos`.
    fn whitespace_run(&self, pos: usize, count: usize) -> Option<usize> {
        if count > 1 && self.flags(pos + count).present {
            Some(pos + count - 1)
        } else if count > 0 {
            Some(pos + count)
        } else {
            None
        }
    }

    fn count_while(&self, pos: usize, pred: impl Fn(Flags) -> bool) -> usize {
        (pos..self.end)
            .take_while(|&p| pred(self.cps[p].flags))
            .count()
    }

    fn gpt2(&mut self, start: usize) {
        let mut pos = start;
        while pos < self.end {
            if let Some(len) = self.contraction(pos, false) {
                pos += len;
                self.emit(pos);
                continue;
            }
            let space = self.char_at(pos) == Some(' ');
            let flags = if space {
                self.flags(pos + 1)
            } else {
                self.flags(pos)
            };
            let class: Option<fn(Flags) -> bool> = if flags.letter() {
                Some(Flags::letter)
            } else if flags.number() {
                Some(Flags::number)
            } else if flags.other() {
                Some(Flags::other)
            } else {
                None
            };
            if let Some(class) = class {
                pos += usize::from(space);
                pos += self.count_while(pos, class);
                self.emit(pos);
                continue;
            }
            let count = self.count_while(pos, |f| f.whitespace);
            pos = self.whitespace_run(pos, count).unwrap_or(pos + 1);
            self.emit(pos);
        }
    }

    fn llama3(&mut self, start: usize, digits: usize) {
        let mut pos = start;
        while pos < self.end {
            pos = self.llama3_word(pos, digits);
            self.emit(pos);
        }
    }

    /// One match of the Llama 3 pattern at `pos`: the position after it.
    fn llama3_word(&self, pos: usize, digits: usize) -> usize {
        if let Some(len) = self.contraction(pos, true) {
            return pos + len;
        }
        let ch = self.cps[pos].ch;
        let flags = self.flags(pos);
        // [^\r\n\p{L}\p{N}]?\p{L}+
        if !(ch == '\r' || ch == '\n' || flags.number())
            && (flags.letter() || self.flags(pos + 1).letter())
        {
            return pos + 1 + self.count_while(pos + 1, Flags::letter);
        }
        // \p{N}{1,3}: a group of at most `digits`; the next group is the next match.
        if flags.number() {
            return pos + self.count_while(pos, Flags::number).min(digits);
        }
        // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
        let space = ch == ' ';
        let after_space = if space { self.flags(pos + 1) } else { flags };
        if !(after_space.whitespace || after_space.letter() || after_space.number()) {
            let mut end = pos + usize::from(space);
            end += self.count_while(end, Flags::other);
            while matches!(self.char_at(end), Some('\r' | '\n')) {
                end += 1;
            }
            return end;
        }
        // \s*[\r\n]+ : the whitespace run up to its last line break.
        let count = self.count_while(pos, |f| f.whitespace);
        let last_break = (pos..pos + count)
            .rev()
            .find(|&p| matches!(self.cps[p].ch, '\r' | '\n'));
        if let Some(p) = last_break {
            return p + 1;
        }
        self.whitespace_run(pos, count).unwrap_or(pos + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(pre: &str, text: &str) -> Vec<String> {
        let pre = PreTokenizer::from_name(Some(pre)).expect("known pre-tokenizer");
        let mut words = Vec::new();
        pre.split(text, &mut words);
        words.into_iter().map(|r| text[r].to_owned()).collect()
    }

    #[test]
    fn gpt2_pattern() {
        assert_eq!(
            split("gpt-2", "Hello world's  end  "),
            ["Hello", " world", "'s", " ", " end", "  "]
        );
        assert_eq!(split("gpt-2", "a   b"), ["a", "  ", " b"]);
        assert_eq!(split("gpt-2", " 123abc!!?"), [" 123", "abc", "!!?"]);
        assert_eq!(split("gpt-2", "x\n\ny"), ["x", "\n", "\n", "y"]);
    }

    #[test]
    fn smollm_splits_digits_and_uses_fragment_ends() {
        assert_eq!(
            split("smollm", "in 2024 ok"),
            ["in", " ", "2", "0", "2", "4", " ok"]
        );
        // The run of spaces before a digit ends its fragment, so it stays whole.
        assert_eq!(split("smollm", "a  1"), ["a", "  ", "1"]);
    }

    #[test]
    fn llama3_pattern() {
        assert_eq!(
            split("llama-bpe", "I'M 12345 (ok)\n\n  x"),
            ["I", "'M", " ", "123", "45", " (", "ok", ")\n\n", " ", " x"]
        );
        assert_eq!(split("qwen2", "12 ab"), ["1", "2", " ab"]);
    }

    #[test]
    fn unknown_names_are_errors() {
        assert!(PreTokenizer::from_name(Some("no-such-pre")).is_err());
        assert_eq!(
            PreTokenizer::from_name(None)
                .map(|p| p.name)
                .ok()
                .as_deref(),
            Some("default")
        );
    }
}
