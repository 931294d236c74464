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
        if let Some(at) = self.first_stop(search_from) {
            self.text.truncate(at);
            self.stopped = true;
            return Ok(Pushed {
                text: self.take(at),
                stopped: true,
            });
        }
        let safe = self.text.len() - self.held_back();
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

    /// Byte offset of the earliest stop string at or after `from`.
    fn first_stop(&self, from: usize) -> Option<usize> {
        self.stop
            .iter()
            .filter_map(|s| self.text[from..].find(s.as_str()).map(|i| from + i))
            .min()
    }

    /// Length of the longest tail of the text that begins some stop string
    /// (it may become one), on a character boundary.
    fn held_back(&self) -> usize {
        let tail = &self.text[self.emitted..];
        let mut hold = 0;
        for s in &self.stop {
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
}
