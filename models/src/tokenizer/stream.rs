//! Streaming detokenization: text out as tokens come in, without ever
//! printing half a character.
//!
//! A token may end in the middle of a UTF-8 sequence (byte-level BPE splits
//! emoji and CJK characters across tokens; SentencePiece byte fallback emits
//! them byte by byte). [`StreamDecoder`] holds such an incomplete tail back
//! until the bytes that complete it arrive. Bytes that can never become valid
//! UTF-8 are emitted as U+FFFD right away, and [`StreamDecoder::flush`]
//! renders whatever is still held the same way.

use super::{TokenId, Tokenizer, TokenizerError};

/// Decodes a stream of token ids into text chunks; see the module doc.
#[derive(Debug)]
pub struct StreamDecoder<'t> {
    tokenizer: &'t Tokenizer,
    special: bool,
    pending: Vec<u8>,
}

impl<'t> StreamDecoder<'t> {
    /// A decoder rendering control tokens as their text when `special`.
    pub fn new(tokenizer: &'t Tokenizer, special: bool) -> StreamDecoder<'t> {
        StreamDecoder {
            tokenizer,
            special,
            pending: Vec::new(),
        }
    }

    /// Adds one token; returns the text that is now complete (possibly
    /// empty while a character is still incomplete).
    pub fn push(&mut self, id: TokenId) -> Result<String, TokenizerError> {
        let piece = self.tokenizer.token_to_piece(id, self.special)?;
        self.pending.extend_from_slice(&piece);
        Ok(self.take_complete())
    }

    /// Ends the stream: returns the held-back bytes, invalid ones as U+FFFD.
    pub fn flush(&mut self) -> String {
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        rest
    }

    /// Bytes held back because they may start a character still to come.
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }

    /// Moves every complete character out of `pending`; invalid sequences
    /// become U+FFFD, an incomplete sequence at the very end stays.
    fn take_complete(&mut self) -> String {
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(valid) => {
                    out.push_str(valid);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // `valid` was just checked, so this conversion never replaces anything.
                    out.push_str(&String::from_utf8_lossy(valid));
                    match e.error_len() {
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[bad..];
                        }
                        None => {
                            rest = after; // incomplete: wait for more bytes
                            break;
                        }
                    }
                }
            }
        }
        let kept = rest.len();
        let start = self.pending.len() - kept;
        self.pending.drain(..start);
        out
    }
}
