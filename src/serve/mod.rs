//! `weft serve`: an OpenAI-compatible HTTP server.
//!
//! Two halves joined by channels. The HTTP side (tokio and axum) parses and
//! checks requests, bounds the queue and the body size, checks the API key
//! and streams answers; one engine thread ([`engine`]) owns the executor,
//! the model and the caches, and generates for every request, batching
//! them continuously. A handler sends a [`job::Job`] on a standard channel
//! and reads [`job::Event`]s from a tokio channel of its own; the engine
//! notices a closed channel (the client went away) at its next step and
//! frees that sequence.
//!
//! Endpoints: `POST /v1/chat/completions`, `POST /v1/completions`, `GET
//! /v1/models`, `GET /health`, `GET /metrics`, and with `--slots-dir`
//! `POST /v1/sessions/{name}/save` and `.../restore` ([`slots`]).

mod api;
pub mod engine;
mod error;
mod handlers;
mod job;
mod logprobs;
mod metrics;
mod prefix;
mod prompt;
mod respond;
pub mod slots;
mod text;

pub use engine::{EngineConfig, Loader};
pub use error::ApiError;

use anyhow::{Context, Result};
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use engine::Shared;
use handlers::AppState;
use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// Everything `weft serve` is configured with.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub host: String,
    /// 0: any free port (the bound address is printed).
    pub port: u16,
    pub api_key: Option<String>,
    pub max_body: usize,
    /// Requests that may wait for a sequence slot.
    pub max_queue: usize,
    /// Per-request limit, from arrival to the last token.
    pub timeout: Duration,
    /// After SIGTERM/SIGINT: how long in-flight requests may finish.
    pub shutdown_grace: Duration,
    pub model_id: String,
    pub aliases: Vec<String>,
    pub engine: EngineConfig,
}

/// Serves until SIGTERM or SIGINT. Prints `weft serve: listening on
/// http://ADDR` on stdout once the socket is bound; the model loads (on
/// the engine thread, through `loader`) while `/health` says `loading`.
pub fn serve(opts: ServeOptions, loader: Loader) -> Result<()> {
    let shared = Arc::new(Shared::new());
    let (jobs, rx) = std::sync::mpsc::channel();
    let engine = {
        let shared = shared.clone();
        let config = opts.engine.clone();
        std::thread::Builder::new()
            .name("weft-engine".into())
            .spawn(move || {
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    engine::run(loader, config, shared.clone(), rx)
                }));
                if ran.is_err() {
                    shared.set_health(engine::Health::Degraded(
                        "the engine thread panicked; restart the server".into(),
                    ));
                }
            })
            .context("cannot start the engine thread")?
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let state = Arc::new(AppState {
        jobs,
        shared: shared.clone(),
        model_id: opts.model_id.clone(),
        aliases: opts.aliases.clone(),
        api_key: opts.api_key.clone(),
        max_queue: opts.max_queue,
        max_body: opts.max_body,
        timeout: opts.timeout,
        started: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        sessions: opts.engine.slots_dir.is_some(),
    });
    let served = runtime.block_on(run_http(&opts, state, shared.clone()));
    shared.stop.store(true, Ordering::Relaxed);
    if engine.join().is_err() {
        eprintln!("weft serve: the engine thread panicked");
    }
    served
}

fn router(state: Arc<AppState>, max_body: usize) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(handlers::chat))
        .route("/v1/completions", post(handlers::completions))
        .route("/v1/models", get(handlers::models))
        .route("/health", get(handlers::health))
        .route("/metrics", get(handlers::metrics))
        .route("/v1/sessions/{name}/save", post(handlers::session_save))
        .route(
            "/v1/sessions/{name}/restore",
            post(handlers::session_restore),
        )
        .fallback(handlers::not_found)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            handlers::require_key,
        ))
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(state)
}

async fn run_http(opts: &ServeOptions, state: Arc<AppState>, shared: Arc<Shared>) -> Result<()> {
    let listener = tokio::net::TcpListener::bind((opts.host.as_str(), opts.port))
        .await
        .with_context(|| format!("cannot listen on {}:{}", opts.host, opts.port))?;
    let addr = listener.local_addr().context("the socket has no address")?;
    println!("weft serve: listening on http://{addr}");
    let _ = std::io::stdout().flush();
    let app = router(state, opts.max_body);
    let signalled = Arc::new(Notify::new());
    let server = axum::serve(listener, app).with_graceful_shutdown({
        let signalled = signalled.clone();
        async move {
            shutdown_signal().await;
            eprintln!("weft serve: shutting down; in-flight requests may finish");
            signalled.notify_one();
        }
    });
    let mut server = std::pin::pin!(std::future::IntoFuture::into_future(server));
    let grace = opts.shutdown_grace;
    tokio::select! {
        served = &mut server => served.context("the HTTP server failed")?,
        () = async { signalled.notified().await; tokio::time::sleep(grace).await } => {
            eprintln!("weft serve: {} s passed; cancelling the requests still running", grace.as_secs_f64());
            shared.cancel_all.store(true, Ordering::Relaxed);
            let _ = tokio::time::timeout(Duration::from_secs(2), &mut server).await;
        }
    }
    Ok(())
}

/// SIGINT or (on Unix) SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}
