//! Turning a job's events into OpenAI responses: one JSON object, or
//! server-sent events in OpenAI's chunk format ending with `data: [DONE]`.
//!
//! Nothing is sent before the first event arrives, so a request the engine
//! refuses (a prompt longer than the context) gets its proper status code
//! even when it asked to stream. A streamed answer carries one chunk per
//! generated token (its text may be empty while it could still begin a stop
//! string), then a chunk with the finish reason, then usage when
//! `stream_options.include_usage` asked for it. An error after streaming
//! began is sent as `data: {"error": ...}` and the stream ends without
//! `[DONE]`.

use super::engine::Shared;
use super::error::ApiError;
use super::handlers::AppState;
use super::job::{Event, FinishReason, TokenLogprob};
use super::metrics::Metrics;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedReceiver;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Which endpoint's shapes to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
}

/// Fields every chunk and response repeats.
struct Header {
    endpoint: Endpoint,
    id: String,
    created: u64,
    model: String,
}

impl Header {
    fn object(&self, stream: bool) -> &'static str {
        match (self.endpoint, stream) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completion, _) => "text_completion",
        }
    }

    fn wrap(&self, stream: bool, choices: Value, usage: Option<Value>) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": self.object(stream),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if let Some(u) = usage {
            v["usage"] = u;
        }
        v
    }
}

fn usage(prompt: usize, completion: usize, cached: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

fn chat_logprob(lp: &TokenLogprob) -> Value {
    json!({
        "token": lp.token,
        "logprob": lp.logprob,
        "bytes": lp.bytes,
        "top_logprobs": lp.top.iter().map(|(t, b, l)| json!({
            "token": t, "logprob": l, "bytes": b,
        })).collect::<Vec<_>>(),
    })
}

/// The legacy completions `logprobs` object over `tokens`.
fn completion_logprobs(tokens: &[TokenLogprob]) -> Value {
    let mut offset = 0usize;
    let mut offsets = Vec::new();
    for t in tokens {
        offsets.push(offset);
        offset += t.token.len();
    }
    json!({
        "tokens": tokens.iter().map(|t| t.token.clone()).collect::<Vec<_>>(),
        "token_logprobs": tokens.iter().map(|t| t.logprob).collect::<Vec<_>>(),
        "top_logprobs": tokens.iter().map(|t| {
            let mut m = serde_json::Map::new();
            for (text, _, l) in &t.top {
                m.entry(text.clone()).or_insert(json!(l));
            }
            Value::Object(m)
        }).collect::<Vec<_>>(),
        "text_offset": offsets,
    })
}

fn seconds_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Waits for the job's events and answers with them.
pub async fn respond(
    st: &AppState,
    mut rx: UnboundedReceiver<Event>,
    endpoint: Endpoint,
    stream: bool,
    include_usage: bool,
) -> Result<Response, ApiError> {
    let first = rx
        .recv()
        .await
        .ok_or_else(|| ApiError::internal("the engine dropped the request"))?;
    if let Event::Error(e) = first {
        return Err(e);
    }
    let n = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let header = Header {
        endpoint,
        id: match endpoint {
            Endpoint::Chat => format!("chatcmpl-{n}"),
            Endpoint::Completion => format!("cmpl-{n}"),
        },
        created: seconds_now(),
        model: st.model_id.clone(),
    };
    if stream {
        Ok(stream_response(
            header,
            first,
            rx,
            include_usage,
            st.shared.clone(),
        ))
    } else {
        whole_response(header, first, rx).await
    }
}

/// Collects every event into one response object.
async fn whole_response(
    header: Header,
    first: Event,
    mut rx: UnboundedReceiver<Event>,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    let mut logprobs: Vec<TokenLogprob> = Vec::new();
    let mut wants_logprobs = false;
    let mut next = Some(first);
    loop {
        let event = match next.take() {
            Some(e) => e,
            None => rx
                .recv()
                .await
                .ok_or_else(|| ApiError::internal("the engine dropped the request"))?,
        };
        match event {
            Event::Token {
                text: t, logprob, ..
            } => {
                text.push_str(&t);
                if let Some(lp) = logprob {
                    wants_logprobs = true;
                    logprobs.push(lp);
                }
            }
            Event::Error(e) => return Err(e),
            Event::Done {
                tail,
                finish,
                prompt_tokens,
                completion_tokens,
                cached_tokens,
            } => {
                text.push_str(&tail);
                let lp = wants_logprobs.then(|| match header.endpoint {
                    Endpoint::Chat => {
                        json!({"content": logprobs.iter().map(chat_logprob).collect::<Vec<_>>()})
                    }
                    Endpoint::Completion => completion_logprobs(&logprobs),
                });
                let choice = match header.endpoint {
                    Endpoint::Chat => json!({
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "logprobs": lp,
                        "finish_reason": finish.as_str(),
                    }),
                    Endpoint::Completion => json!({
                        "index": 0,
                        "text": text,
                        "logprobs": lp,
                        "finish_reason": finish.as_str(),
                    }),
                };
                let u = usage(prompt_tokens, completion_tokens, cached_tokens);
                return Ok(Json(header.wrap(false, json!([choice]), Some(u))).into_response());
            }
        }
    }
}

/// The stream's state between chunks.
struct Streaming {
    header: Header,
    rx: UnboundedReceiver<Event>,
    out: VecDeque<SseEvent>,
    first: Option<Event>,
    started: bool,
    include_usage: bool,
    ended: bool,
    /// Counts an error sent after the stream began.
    shared: Arc<Shared>,
}

impl Streaming {
    fn data(&mut self, v: Value) {
        self.out.push_back(SseEvent::default().data(v.to_string()));
    }

    fn choice(&self, text: &str, lp: Option<Value>, finish: Option<FinishReason>) -> Value {
        let finish = finish.map(FinishReason::as_str);
        match self.header.endpoint {
            Endpoint::Chat => json!({
                "index": 0,
                "delta": if text.is_empty() && finish.is_some() { json!({}) } else { json!({"content": text}) },
                "logprobs": lp.map(|l| json!({"content": [l]})),
                "finish_reason": finish,
            }),
            Endpoint::Completion => json!({
                "index": 0,
                "text": text,
                "logprobs": lp,
                "finish_reason": finish,
            }),
        }
    }

    /// Queues the chunks of one event.
    fn push(&mut self, event: Event) {
        if !self.started && self.header.endpoint == Endpoint::Chat {
            let role = json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]);
            let v = self.header.wrap(true, role, None);
            self.data(v);
        }
        self.started = true;
        match event {
            Event::Token { text, logprob, .. } => {
                let lp = logprob.map(|l| match self.header.endpoint {
                    Endpoint::Chat => chat_logprob(&l),
                    Endpoint::Completion => completion_logprobs(std::slice::from_ref(&l)),
                });
                let choice = self.choice(&text, lp, None);
                let v = self.header.wrap(true, json!([choice]), None);
                self.data(v);
            }
            Event::Done {
                tail,
                finish,
                prompt_tokens,
                completion_tokens,
                cached_tokens,
            } => {
                if !tail.is_empty() {
                    let choice = self.choice(&tail, None, None);
                    let v = self.header.wrap(true, json!([choice]), None);
                    self.data(v);
                }
                let choice = self.choice("", None, Some(finish));
                let v = self.header.wrap(true, json!([choice]), None);
                self.data(v);
                if self.include_usage {
                    let u = usage(prompt_tokens, completion_tokens, cached_tokens);
                    let v = self.header.wrap(true, json!([]), Some(u));
                    self.data(v);
                }
                self.out.push_back(SseEvent::default().data("[DONE]"));
                self.ended = true;
            }
            Event::Error(e) => {
                Metrics::add(&self.shared.metrics.requests_failed, 1);
                self.data(e.body());
                self.ended = true;
            }
        }
    }
}

fn stream_response(
    header: Header,
    first: Event,
    rx: UnboundedReceiver<Event>,
    include_usage: bool,
    shared: Arc<Shared>,
) -> Response {
    let state = Streaming {
        header,
        rx,
        out: VecDeque::new(),
        first: Some(first),
        started: false,
        include_usage,
        ended: false,
        shared,
    };
    let events = futures_util::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(e) = s.out.pop_front() {
                return Some((Ok::<_, Infallible>(e), s));
            }
            if s.ended {
                return None;
            }
            let event = match s.first.take() {
                Some(e) => e,
                None => match s.rx.recv().await {
                    Some(e) => e,
                    None => Event::Error(ApiError::internal("the engine dropped the request")),
                },
            };
            s.push(event);
        }
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}
