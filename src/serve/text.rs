//! Generated text as a client sees it: detokenized without splitting a
//! character, cut before the first stop string, and never showing text
//! that a later token could still turn into a stop string.

use crate::models::tokenizer::{StreamDecoder, TokenizerError};
use crate::models::Model;

/// The text of one sequence's generated tokens.
pub struct StopText<'m> {
    decoder: StreamDecoder<'m>,
    stop: Vec<String>,
    text: String,
    /// Bytes of `text` already handed out.
    emitted: usize,
    /// A stop string ended the text.
    stopped: bool,
}

/// What a token did to the text.
pub struct Pushed {
    /// Text now safe to show (possibly empty).
    pub text: String,
    /// A stop string was found: nothing after it is shown.
    pub stopped: bool,
}

impl<'m> StopText<'m> {
    pub fn new(model: &'m Model, stop: Vec<String>) -> StopText<'m> {
        StopText {
            decoder: model.tokenizer.stream_decoder(false),
            stop,
            text: String::new(),
            emitted: 0,
            stopped: false,
        }
    }

    /// The bytes of `id` as detokenized text (log-probabilities).
    pub fn piece(model: &Model, id: u32) -> Vec<u8> {
        model
            .tokenizer
            .token_to_piece(id, false)
            .map(|p| p.into_owned())
            .unwrap_or_default()
    }

    /// Adds a generated token.
    pub fn push(&mut self, id: u32) -> Result<Pushed, TokenizerError> {
        let piece = self.decoder.push(id)?;
        // A stop string may start in text already held back.
        let search_from = self.emitted;
        self.text.push_str(&piece);
        if let Some(at) = first_stop(&self.text, search_from, &self.stop) {
            self.text.truncate(at);
            self.stopped = true;
            return Ok(Pushed {
                text: self.take(at),
                stopped: true,
            });
        }
        let safe = self.text.len() - held_back(&self.text[self.emitted..], &self.stop);
        Ok(Pushed {
            text: self.take(safe),
            stopped: false,
        })
    }

    /// Ends the text: whatever was held back (nothing after a stop string).
    pub fn finish(&mut self) -> String {
        if self.stopped {
            return String::new();
        }
        let rest = self.decoder.flush();
        self.text.push_str(&rest);
        let end = self.text.len();
        self.take(end)
    }

    fn take(&mut self, upto: usize) -> String {
        let upto = upto.max(self.emitted);
        let out = self.text[self.emitted..upto].to_string();
        self.emitted = upto;
        out
    }
}

/// Byte offset of the earliest stop string in `text` at or after `from`.
fn first_stop(text: &str, from: usize, stop: &[String]) -> Option<usize> {
    stop.iter()
        .filter_map(|s| text[from..].find(s.as_str()).map(|i| from + i))
        .min()
}

/// Length of the longest tail of `tail` that begins some stop string (it
/// may still become one), on a character boundary.
fn held_back(tail: &str, stop: &[String]) -> usize {
    let mut hold = 0;
    for s in stop {
        for (i, _) in tail.char_indices() {
            let t = &tail[i..];
            if t.len() <= hold {
                break;
            }
            if s.starts_with(t) {
                hold = t.len();
                break;
            }
        }
    }
    hold
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stops(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_earliest_stop_wins() {
        let s = stops(&["world", "lo"]);
        assert_eq!(first_stop("hello world", 0, &s), Some(3));
        assert_eq!(first_stop("hello world", 4, &s), Some(6));
        assert_eq!(first_stop("hello", 0, &stops(&["xyz"])), None);
    }

    #[test]
    fn a_tail_that_may_become_a_stop_is_held_back() {
        let s = stops(&["</end>", "##"]);
        assert_eq!(held_back("text </e", &s), 3);
        assert_eq!(held_back("text #", &s), 1);
        assert_eq!(held_back("text", &s), 0);
        // Multi-byte characters are never split.
        assert_eq!(held_back("é", &stops(&["éa"])), "é".len());
        assert_eq!(held_back("aé", &stops(&["b"])), 0);
    }
}
