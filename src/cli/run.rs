//! `weft run`: generate from a prompt, streaming text (or ids / JSON).

use super::diagnostics::DiagArgs;
use super::output::Stdout;
use super::session::Session;
use super::values;
use super::ModelArgs;
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use std::time::Instant;
use weft::models::sampling::{Sampler, SamplingParams};
use weft::models::tokenizer::EncodeOptions;
use weft::models::LogitRows;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Stream the generated text.
    Text,
    /// The generated token ids as one JSON array.
    Ids,
    /// One JSON object: prompt ids, generated ids, text, timings.
    Json,
}

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    diag: DiagArgs,
    #[command(flatten)]
    chat: super::chat::ChatArgs,
    /// The prompt, as raw text (BOS only if the model asks for it), or the
    /// user's message with --chat.
    #[arg(
        long,
        short = 'p',
        required_unless_present = "prompt_ids",
        conflicts_with = "prompt_ids"
    )]
    prompt: Option<String>,
    /// The prompt as token ids, comma-separated (`--prompt-ids 1,2,3`; any model).
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true)]
    prompt_ids: Option<Vec<u32>>,
    /// Tokens to generate, 0 to 1048576 (`-n N`, `-n=N` or `--n-predict N`).
    #[arg(
        short = 'n',
        long = "n-predict",
        default_value_t = 128,
        allow_negative_numbers = true,
        value_parser = values::int_in::<usize>(0, values::MAX_TOKENS)
    )]
    n: usize,
    /// Sampling temperature, a finite number >= 0; 0 is greedy (argmax,
    /// ties to the lowest id), and so is a temperature so small that the
    /// scaled logits overflow.
    #[arg(long, default_value_t = 0.8, allow_hyphen_values = true, value_parser = values::temperature)]
    temp: f32,
    /// Seed of the sampler (default: from the clock).
    #[arg(long, allow_negative_numbers = true)]
    seed: Option<u64>,
    /// Keep the k most likely tokens (0: off).
    #[arg(long, default_value_t = 40, allow_negative_numbers = true)]
    top_k: usize,
    /// Nucleus sampling, 0 to 1 (1: off).
    #[arg(long, default_value_t = 0.95, allow_hyphen_values = true, value_parser = values::probability)]
    top_p: f32,
    /// Drop tokens less likely than this fraction of the most likely one, 0 to 1 (0: off).
    #[arg(long, default_value_t = 0.05, allow_hyphen_values = true, value_parser = values::probability)]
    min_p: f32,
    /// Repetition penalty, a finite number > 0 (1: off).
    #[arg(long, default_value_t = 1.0, allow_hyphen_values = true, value_parser = values::penalty)]
    repeat_penalty: f32,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Stop when the text ends with this string (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Context length, 1 to 1048576 (default: the model's, at most 4096).
    #[arg(allow_negative_numbers = true, long, value_parser = values::tokens_at_least_1)]
    ctx: Option<u32>,
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// Sum every layer's output at each step and fail, naming the first
    /// layer whose output is NaN or infinite (always on in debug builds;
    /// without it only the logits are checked).
    #[arg(long)]
    check_finite: bool,
    /// Continue the conversation saved in FILE (a KV checkpoint with its
    /// tokens) and save it back after generating: the prompt is appended to
    /// the saved tokens (without a BOS) and only it is prefilled. FILE is
    /// created when missing; a file of another model, or a damaged one, is
    /// refused and left as it was.
    #[arg(long, value_name = "FILE", conflicts_with = "chat")]
    session: Option<std::path::PathBuf>,
}

pub fn run(a: RunArgs) -> Result<()> {
    let diag = a.diag.open()?;
    let (mut exec, model) = a.model.load()?;
    model.set_check_finite(a.check_finite || cfg!(debug_assertions));
    let chat = a.chat.prompt(&model, a.prompt.as_deref())?;
    let ctx = a.ctx.unwrap_or_else(|| model.trained_context().min(4096));
    let policy = a.model.chunk_policy(&model)?;
    let mut cache = model.new_cache(&mut exec, ctx, policy.max_chunk())?;
    let session = match &a.session {
        Some(path) => Some(Session::open(&mut exec, &model, &mut cache, path)?),
        None => None,
    };
    let resumed = session.as_ref().is_some_and(Session::resumed);
    // A continued conversation has its BOS already.
    let encode = EncodeOptions {
        add_special: !resumed,
        ..EncodeOptions::default()
    };
    let prompt = match (&a.prompt_ids, &a.prompt, &chat) {
        (Some(ids), _, _) => ids.clone(),
        (None, Some(_), Some(c)) => c.ids.clone(),
        (None, Some(text), None) => model.tokenizer.encode_with(text, encode),
        (None, None, _) => bail!("give the prompt as --prompt TEXT or --prompt-ids 1,2,3"),
    };
    if let Some(bad) = prompt.iter().find(|&&t| t as usize >= model.vocab()) {
        bail!(
            "--prompt-ids: token id {bad} is outside the vocabulary of {}",
            model.vocab()
        );
    }
    if prompt.is_empty() {
        bail!("the prompt is empty after tokenization; give some text");
    }
    let saved = cache.position() as usize;
    let needed = prompt
        .len()
        .checked_add(a.n)
        .and_then(|n| n.checked_add(saved));
    if needed.is_none_or(|n| n > ctx as usize) {
        if saved > 0 {
            bail!("the session's {saved} tokens, the prompt ({} tokens) and {} generated tokens exceed the context of {ctx} tokens (use --ctx, a smaller -n or a new session)", prompt.len(), a.n);
        }
        bail!("the prompt ({} tokens) plus {} generated tokens exceed the context of {ctx} tokens (use --ctx or a smaller -n)", prompt.len(), a.n);
    }
    let seed = a.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    let mut sampler = Sampler::new(SamplingParams {
        temperature: a.temp,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        repeat_penalty: a.repeat_penalty,
        seed,
        ..Default::default()
    });
    let diag = diag.start(&mut exec)?;
    let t0 = Instant::now();
    let mut after = |exec: &mut weft::runtime::GraphExecutor, pos: std::ops::Range<u32>| {
        diag.after_step(exec, pos)
            .map_err(|e| weft::models::ModelError::Input(e.to_string()))
    };
    // `--format json` reports the argmax at every prompt position.
    let rows = if a.format == Format::Json {
        LogitRows::All
    } else {
        LogitRows::Last
    };
    let mut logits = model
        .prefill_with(&mut exec, &mut cache, &prompt, &policy, rows, &mut after)
        .context("prefill failed")?;
    let vocab = model.vocab();
    let prompt_argmax: Vec<usize> = logits
        .chunks_exact(vocab)
        .map(weft::models::sampling::argmax)
        .collect();
    if rows == LogitRows::All {
        logits.drain(..logits.len() - vocab);
    }
    let prompt_time = t0.elapsed();
    let mut history = session.as_ref().map_or_else(Vec::new, |s| s.tokens.clone());
    history.extend_from_slice(&prompt);
    let mut generated = Vec::new();
    let mut text = String::new();
    let mut decoder = model.tokenizer.stream_decoder(false);
    let mut out = Stdout::lock();
    // Takes a generated token: false once generation should stop.
    let mut accept = |tok: u32, history: &mut Vec<u32>| -> Result<bool> {
        let ends_turn = chat.as_ref().is_some_and(|c| c.ends_turn(tok));
        if (model.tokenizer.is_eog(tok) || ends_turn) && !a.ignore_eos {
            return Ok(false);
        }
        generated.push(tok);
        history.push(tok);
        let piece = decoder.push(tok)?;
        text.push_str(&piece);
        if a.format == Format::Text {
            out.write(&piece)?;
        }
        Ok(!a
            .stop
            .iter()
            .any(|s| !s.is_empty() && text.ends_with(s.as_str())))
    };
    // Greedy without a penalty (and without per-step layer dumps) decodes
    // on the device one step ahead: each step's argmax feeds the next.
    let on_device = a.temp <= 0.0
        && a.repeat_penalty == 1.0
        && !diag.dumps_layers()
        && model.feeds_ids_on_device();
    let t1 = Instant::now();
    if a.n > 0 {
        let first = sampler.sample(&logits, &history);
        if on_device {
            if accept(first, &mut history)? {
                let mut failed = None;
                model
                    .decode_greedy(&mut exec, &mut cache, first, a.n - 1, &mut |t| {
                        accept(t, &mut history).unwrap_or_else(|e| {
                            failed = Some(e);
                            false
                        })
                    })
                    .context("decode failed")?;
                if let Some(e) = failed {
                    return Err(e);
                }
            }
        } else {
            let mut tok = first;
            for i in 0..a.n {
                if i > 0 {
                    tok = sampler.sample(&logits, &history);
                }
                if !accept(tok, &mut history)? {
                    break;
                }
                if i + 1 < a.n {
                    let pos = cache.position();
                    logits = model
                        .step(&mut exec, &mut cache, &[tok], LogitRows::Last)
                        .context("decode step failed")?;
                    diag.after_step(&mut exec, pos..pos + 1)?;
                }
            }
        }
    }
    let gen_time = t1.elapsed();
    drop(out);
    diag.finish(&mut exec)?;
    if let Some(session) = &session {
        session.save(&mut exec, &model, &mut cache, &policy, &history, true)?;
    }
    let mut out = Stdout::lock();
    match a.format {
        Format::Text => out.line("")?,
        Format::Ids => out.line(serde_json::to_string(&generated)?)?,
        Format::Json => {
            let v = serde_json::json!({
                "model": model.name,
                "prompt_ids": prompt,
                "prompt_argmax": prompt_argmax,
                "generated_ids": generated,
                "text": text,
                "seed": seed,
                "timings": {
                    "prompt_ms": prompt_time.as_secs_f64() * 1e3,
                    "prompt_tps": prompt.len() as f64 / prompt_time.as_secs_f64(),
                    "gen_ms": gen_time.as_secs_f64() * 1e3,
                    "gen_tps": generated.len() as f64 / gen_time.as_secs_f64(),
                },
            });
            out.line(v)?;
        }
    }
    Ok(())
}
