//! What a handler hands the engine (a [`Job`]) and what comes back on the
//! job's channel ([`Event`]s), and the checks that turn a request's
//! sampling fields into [`GenParams`].

use super::api::{stop_strings, ChatMessage, SamplingFields};
use super::error::ApiError;
use super::slots::SessionJob;
use crate::models::sampling::SamplingParams;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// How one request generates.
#[derive(Clone, Debug)]
pub struct GenParams {
    /// Most tokens to generate (`None`: until the context is full).
    pub max_tokens: Option<usize>,
    pub sampling: SamplingParams,
    /// Generation ends before the first occurrence of any of these.
    pub stop: Vec<String>,
    /// Report each token's log-probability and this many alternatives.
    pub logprobs: Option<usize>,
    /// End-of-generation tokens are never drawn.
    pub ignore_eos: bool,
}

/// A request's prompt before tokenization (done on the engine thread,
/// which owns the model).
#[derive(Clone, Debug)]
pub enum PromptSource {
    /// Rendered with the model's chat template.
    Chat(Vec<ChatMessage>),
    /// Raw text, tokenized as `weft run --prompt` does.
    Text(String),
    Ids(Vec<u32>),
}

/// What a handler sends the engine.
pub enum Work {
    Generate(Job),
    Session(SessionJob),
}

/// A request on its way to the engine.
pub struct Job {
    pub prompt: PromptSource,
    pub params: GenParams,
    /// The session (`--slots-dir`) the request continues and saves into.
    pub session: Option<String>,
    pub events: UnboundedSender<Event>,
    pub received: Instant,
    pub deadline: Instant,
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// `max_tokens` or the context ran out.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// A token's log-probability and the most likely alternatives.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub token: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
    /// (text, bytes, log-probability), most likely first.
    pub top: Vec<(String, Vec<u8>, f32)>,
}

/// What the engine sends back for a job, in order: tokens, then one `Done`
/// or one `Error`.
#[derive(Clone, Debug)]
pub enum Event {
    /// One generated token: its id, the text it completes (held back while
    /// it might start a stop string, so possibly empty) and its logprob.
    Token {
        id: u32,
        text: String,
        logprob: Option<TokenLogprob>,
    },
    Done {
        /// Text held back until the end (the last incomplete bytes, a
        /// partial stop string that never completed).
        tail: String,
        finish: FinishReason,
        prompt_tokens: usize,
        completion_tokens: usize,
        /// Prompt tokens whose cache rows were reused from an earlier request.
        cached_tokens: usize,
    },
    Error(ApiError),
}

/// Default sampling where a request leaves a field out: the settings of
/// `weft run`, except that a temperature of 0 keeps the raw argmax.
const DEFAULT_TEMPERATURE: f32 = 0.8;

/// Checks a request's sampling fields. `logprobs` is the number of
/// alternatives asked for, if log-probabilities were asked for.
pub fn gen_params(f: &SamplingFields, logprobs: Option<usize>) -> Result<GenParams, ApiError> {
    if let Some(n) = f.n {
        if n != 1 {
            return Err(ApiError::invalid_param(
                "n",
                format!("`n` = {n} is not supported; this server generates one choice (n = 1)"),
            ));
        }
    }
    let max_tokens = match f.max_completion_tokens.or(f.max_tokens) {
        None => None,
        Some(0) => {
            return Err(ApiError::invalid_param(
                "max_tokens",
                "`max_tokens` = 0; ask for at least one token",
            ))
        }
        Some(n) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
    };
    let temperature = f.temperature.unwrap_or(DEFAULT_TEMPERATURE);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::invalid_param(
            "temperature",
            format!("`temperature` = {temperature} is outside 0..=2"),
        ));
    }
    let top_p = f.top_p.unwrap_or(0.95);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid_param(
            "top_p",
            format!("`top_p` = {top_p} is outside (0, 1]"),
        ));
    }
    let min_p = f.min_p.unwrap_or(0.05);
    if !(0.0..=1.0).contains(&min_p) {
        return Err(ApiError::invalid_param(
            "min_p",
            format!("`min_p` = {min_p} is outside 0..=1"),
        ));
    }
    let top_k = match f.top_k {
        None => 40,
        Some(k) if k <= 0 => 0,
        Some(k) => usize::try_from(k).unwrap_or(usize::MAX),
    };
    let seed = match f.seed {
        Some(s) => s as u64,
        None => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    };
    Ok(GenParams {
        max_tokens,
        sampling: SamplingParams {
            temperature,
            top_k,
            top_p,
            min_p,
            seed,
            ..Default::default()
        },
        stop: stop_strings(&f.stop)?,
        logprobs,
        ignore_eos: f.ignore_eos,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_fields_are_checked() {
        let f = SamplingFields {
            temperature: Some(0.0),
            max_tokens: Some(16),
            seed: Some(7),
            ..Default::default()
        };
        let p = gen_params(&f, Some(2)).expect("valid");
        assert_eq!(p.sampling.temperature, 0.0);
        assert_eq!(p.sampling.seed, 7);
        assert_eq!(p.max_tokens, Some(16));
        assert_eq!(p.logprobs, Some(2));
        let bad = |f: SamplingFields, param: &str| {
            let e = gen_params(&f, None).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{}", e.message);
        };
        bad(
            SamplingFields {
                n: Some(2),
                ..Default::default()
            },
            "n",
        );
        bad(
            SamplingFields {
                max_tokens: Some(0),
                ..Default::default()
            },
            "max_tokens",
        );
        bad(
            SamplingFields {
                temperature: Some(-1.0),
                ..Default::default()
            },
            "temperature",
        );
        bad(
            SamplingFields {
                top_p: Some(0.0),
                ..Default::default()
            },
            "top_p",
        );
        bad(
            SamplingFields {
                min_p: Some(1.5),
                ..Default::default()
            },
            "min_p",
        );
        // top_k <= 0 turns it off.
        let p = gen_params(
            &SamplingFields {
                top_k: Some(-1),
                ..Default::default()
            },
            None,
        );
        assert_eq!(p.map(|p| p.sampling.top_k).ok(), Some(0));
    }
}
