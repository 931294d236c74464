//! The HTTP endpoints: parse and check a request, hand it to the engine
//! as a [`Job`], answer with what comes back ([`super::respond`]).

use super::api::{
    chat_messages, completion_prompt, parse_body, ChatRequest, CompletionRequest, PromptInput,
    MAX_TOP_LOGPROBS,
};
use super::engine::{Health, Shared};
use super::error::ApiError;
use super::job::{gen_params, Event, GenParams, Job, PromptSource, Work};
use super::metrics::Metrics;
use super::respond::{respond, Endpoint};
use super::slots::{check_name, SessionAction, SessionJob};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

/// What every handler needs.
pub struct AppState {
    pub jobs: Sender<Work>,
    pub shared: Arc<Shared>,
    /// The id clients pass as `model` (also accepted: `aliases`).
    pub model_id: String,
    pub aliases: Vec<String>,
    pub api_key: Option<String>,
    pub max_queue: usize,
    pub max_body: usize,
    pub timeout: Duration,
    /// Unix time the server started (`created` of `/v1/models`).
    pub started: u64,
    /// Whether `--slots-dir` was given.
    pub sessions: bool,
}

pub type AppRef = Arc<AppState>;

impl AppState {
    fn check_model(&self, given: &Option<String>) -> Result<(), ApiError> {
        match given.as_deref() {
            None | Some("") => Ok(()),
            Some(m) if m == self.model_id || self.aliases.iter().any(|a| a == m) => Ok(()),
            Some(m) => Err(ApiError::unknown_model(m, &self.model_id)),
        }
    }

    /// Checks a request's `session` field: a plain name, and sessions on.
    fn check_session(&self, session: &Option<String>) -> Result<(), ApiError> {
        let Some(name) = session else {
            return Ok(());
        };
        if !self.sessions {
            return Err(ApiError::invalid_param(
                "session",
                "sessions are off: start the server with --slots-dir DIR",
            ));
        }
        check_name(name, "session")
    }

    /// 503 while loading, when degraded or shutting down.
    fn check_ready(&self) -> Result<(), ApiError> {
        match self.shared.health() {
            Health::Ok => {}
            Health::Loading => return Err(ApiError::unavailable("the model is still loading", 5)),
            Health::Degraded(why) => return Err(ApiError::unavailable(why, 30)),
        }
        if self.shared.cancel_all.load(Ordering::Relaxed) {
            return Err(ApiError::unavailable("the server is shutting down", 5));
        }
        Ok(())
    }

    /// Queues a job; refused with 503 while loading, when degraded, or
    /// when the queue is full.
    fn submit(
        &self,
        prompt: PromptSource,
        params: GenParams,
        session: Option<String>,
    ) -> Result<UnboundedReceiver<Event>, ApiError> {
        self.check_ready()?;
        let depth = &self.shared.metrics.queue_depth;
        let queued = depth.fetch_add(1, Ordering::Relaxed);
        if queued >= self.max_queue as u64 {
            depth.fetch_sub(1, Ordering::Relaxed);
            return Err(ApiError::unavailable(
                format!(
                    "the queue is full ({} requests wait; --queue); retry later",
                    self.max_queue
                ),
                1,
            ));
        }
        let (tx, rx) = unbounded_channel();
        let now = Instant::now();
        let job = Job {
            prompt,
            params,
            session,
            events: tx,
            received: now,
            deadline: now + self.timeout,
        };
        if self.jobs.send(Work::Generate(job)).is_err() {
            depth.fetch_sub(1, Ordering::Relaxed);
            return Err(ApiError::unavailable("the engine has stopped", 30));
        }
        Ok(rx)
    }

    fn body(&self, body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
        body.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::too_large(self.max_body)
            } else {
                ApiError::invalid(format!("cannot read the request body: {e}"))
            }
        })
    }
}

/// Counts a request and answers its error, if it failed.
fn finish(st: &AppState, result: Result<Response, ApiError>) -> Response {
    match result {
        Ok(r) => r,
        Err(e) => {
            Metrics::add(&st.shared.metrics.requests_failed, 1);
            e.into_response()
        }
    }
}

/// `POST /v1/chat/completions`.
pub async fn chat(State(st): State<AppRef>, body: Result<Bytes, BytesRejection>) -> Response {
    Metrics::add(&st.shared.metrics.requests, 1);
    let result = async {
        let body = st.body(body)?;
        let req: ChatRequest = parse_body(&body)?;
        st.check_model(&req.model)?;
        st.check_session(&req.session)?;
        let messages = chat_messages(&req.messages)?;
        let top = req.top_logprobs.unwrap_or(0);
        if top > MAX_TOP_LOGPROBS {
            return Err(ApiError::invalid_param(
                "top_logprobs",
                format!("`top_logprobs` = {top}; at most {MAX_TOP_LOGPROBS}"),
            ));
        }
        if req.top_logprobs.is_some() && !req.logprobs {
            return Err(ApiError::invalid_param(
                "top_logprobs",
                "`top_logprobs` needs `logprobs: true`",
            ));
        }
        let params = gen_params(&req.sampling, req.logprobs.then_some(top))?;
        let rx = st.submit(PromptSource::Chat(messages), params, req.session)?;
        let usage = req
            .sampling
            .stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage);
        respond(&st, rx, Endpoint::Chat, req.sampling.stream, usage).await
    }
    .await;
    finish(&st, result)
}

/// `POST /v1/completions`.
pub async fn completions(
    State(st): State<AppRef>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    Metrics::add(&st.shared.metrics.requests, 1);
    let result = async {
        let body = st.body(body)?;
        let req: CompletionRequest = parse_body(&body)?;
        st.check_model(&req.model)?;
        st.check_session(&req.session)?;
        if req.echo {
            return Err(ApiError::invalid_param("echo", "`echo` is not supported"));
        }
        if let Some(top) = req.logprobs {
            if top > MAX_TOP_LOGPROBS {
                return Err(ApiError::invalid_param(
                    "logprobs",
                    format!("`logprobs` = {top}; at most {MAX_TOP_LOGPROBS}"),
                ));
            }
        }
        let prompt = match completion_prompt(&req.prompt)? {
            PromptInput::Text(t) => PromptSource::Text(t),
            PromptInput::Ids(ids) => PromptSource::Ids(ids),
        };
        let params = gen_params(&req.sampling, req.logprobs)?;
        let rx = st.submit(prompt, params, req.session)?;
        let usage = req
            .sampling
            .stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage);
        respond(&st, rx, Endpoint::Completion, req.sampling.stream, usage).await
    }
    .await;
    finish(&st, result)
}

/// `POST /v1/sessions/{name}/save` and `.../restore`.
async fn session_action(st: AppRef, name: String, action: SessionAction) -> Response {
    Metrics::add(&st.shared.metrics.requests, 1);
    let result = async {
        st.check_session(&Some(name.clone()))?;
        st.check_ready()?;
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job = SessionJob {
            action,
            name,
            reply,
        };
        if st.jobs.send(Work::Session(job)).is_err() {
            return Err(ApiError::unavailable("the engine has stopped", 30));
        }
        let info = answer
            .await
            .map_err(|_| ApiError::unavailable("the engine has stopped", 30))??;
        Ok(Json(json!({
            "object": "session",
            "session": info.name,
            "action": action.as_str(),
            "tokens": info.tokens,
            "file_bytes": info.file_bytes,
        }))
        .into_response())
    }
    .await;
    finish(&st, result)
}

/// `POST /v1/sessions/{name}/save`: the session's kept sequence to its file.
pub async fn session_save(State(st): State<AppRef>, Path(name): Path<String>) -> Response {
    session_action(st, name, SessionAction::Save).await
}

/// `POST /v1/sessions/{name}/restore`: the session's file into memory.
pub async fn session_restore(State(st): State<AppRef>, Path(name): Path<String>) -> Response {
    session_action(st, name, SessionAction::Restore).await
}

/// `GET /v1/models`.
pub async fn models(State(st): State<AppRef>) -> Response {
    Json(json!({
        "object": "list",
        "data": [{
            "id": st.model_id,
            "object": "model",
            "created": st.started,
            "owned_by": "weft",
        }],
    }))
    .into_response()
}

/// `GET /health`: 200 `{"status": "ok"}`, or 503 with `loading` or
/// `degraded` (and why).
pub async fn health(State(st): State<AppRef>) -> Response {
    match st.shared.health() {
        Health::Ok => Json(json!({"status": "ok"})).into_response(),
        Health::Loading => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "loading"})),
        )
            .into_response(),
        Health::Degraded(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "degraded", "reason": why})),
        )
            .into_response(),
    }
}

/// `GET /metrics`: Prometheus text.
pub async fn metrics(State(st): State<AppRef>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        st.shared.metrics.render(),
    )
        .into_response()
}

/// Any other path.
pub async fn not_found(req: Request) -> Response {
    ApiError::no_route(req.method().as_str(), req.uri().path()).into_response()
}

/// Equal byte strings, in time that depends only on their lengths.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a
        .iter()
        .zip(b)
        .fold(0u8, |acc, (x, y)| acc | std::hint::black_box(x ^ y));
    diff == 0
}

/// `--api-key`: every route but `/health` wants `Authorization: Bearer KEY`.
pub async fn require_key(State(st): State<AppRef>, req: Request, next: Next) -> Response {
    let Some(key) = &st.api_key else {
        return next.run(req).await;
    };
    if req.uri().path() == "/health" {
        return next.run(req).await;
    }
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(g) if constant_time_eq(g.trim().as_bytes(), key.as_bytes()) => next.run(req).await,
        Some(_) => ApiError::unauthorized("the API key is wrong").into_response(),
        None => ApiError::unauthorized(
            "no API key: send `Authorization: Bearer KEY` (the server runs with --api-key)",
        )
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn keys_compare_exactly() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
    }
}
