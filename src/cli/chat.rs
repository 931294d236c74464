//! `weft chat`: a conversation on the terminal, and the chat-template flags
//! of `weft run` (`--chat`, `--system`, `--template`, `--no-template`).
//!
//! Each line read is one user message. The conversation stays in the KV
//! cache between turns: a turn prefills only what the rendered conversation
//! adds to what the cache holds (`weft_models::chat::Conversation`). An
//! answer ends at the template's end-of-turn token or any
//! end-of-generation token, at `-n` tokens, when the context is full, or
//! at Ctrl-C, which stops the answer and not the program (a second Ctrl-C
//! at the prompt quits). `/reset` starts over, `/exit` or end of input
//! (Ctrl-D) quits.

use super::session::{load_messages, save_messages, Session};
use super::ModelArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use std::io::{BufRead, IsTerminal, Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use weft::models::chat::{
    encode_rendered, ChatTemplate, Conversation, Message, TurnError, PLAIN_TEMPLATE,
};
use weft::models::sampling::{argmax, Sampler, SamplingParams};
use weft::models::tokenizer::TokenId;
use weft::models::{LogitRows, Model};
use weft::runtime::cache::KvCache;
use weft::runtime::GraphExecutor;

/// The template choice, shared by `weft run` and `weft chat`.
#[derive(Args, Clone, Debug, Default)]
pub struct TemplateArgs {
    /// A system message opening the conversation.
    #[arg(long, value_name = "TEXT")]
    system: Option<String>,
    /// A Jinja chat template file to use instead of the model's
    /// `tokenizer.chat_template`.
    #[arg(long, value_name = "FILE", conflicts_with = "no_template")]
    template: Option<std::path::PathBuf>,
    /// No chat template: `weft run` takes the prompt as raw text (the
    /// default without --chat); `weft chat` sends the turns as plain text,
    /// one per line.
    #[arg(long)]
    no_template: bool,
}

impl TemplateArgs {
    /// The template to render with: the file, the GGUF's, or the plain one
    /// with --no-template.
    fn load(&self, model: &Model) -> Result<ChatTemplate> {
        if self.no_template {
            return Ok(ChatTemplate::with_tokenizer(
                PLAIN_TEMPLATE,
                "the plain template",
                &model.tokenizer,
            )?);
        }
        if let Some(path) = &self.template {
            return Ok(ChatTemplate::from_file(path, &model.tokenizer)?);
        }
        match ChatTemplate::from_gguf(&model.file, &model.tokenizer)? {
            Some(t) => Ok(t),
            None => bail!(
                "{} has no chat template (no `tokenizer.chat_template` in its GGUF); give one with --template FILE, or --no-template for plain text",
                model.name
            ),
        }
    }

    /// The conversation's opening messages.
    fn opening(&self) -> Vec<Message> {
        self.system
            .iter()
            .map(|s| Message::new("system", s))
            .collect()
    }
}

/// `weft run`'s chat flags.
#[derive(Args, Clone, Debug, Default)]
pub struct ChatArgs {
    /// Send the prompt as one user message through the model's chat
    /// template; the answer stops at the template's end-of-turn token.
    #[arg(long, conflicts_with_all = ["prompt_ids", "no_template"])]
    chat: bool,
    #[command(flatten)]
    template: TemplateArgs,
}

/// A prompt rendered through a chat template.
pub struct ChatPrompt {
    /// The token ids of the rendered conversation.
    pub ids: Vec<TokenId>,
    /// The template's end-of-turn token, where it has one.
    pub end_of_turn: Option<TokenId>,
}

impl ChatPrompt {
    /// Whether `id` closes the answer's turn.
    pub fn ends_turn(&self, id: TokenId) -> bool {
        self.end_of_turn == Some(id)
    }
}

impl ChatArgs {
    /// `prompt` rendered as the user's message, or `None` without --chat.
    pub fn prompt(&self, model: &Model, prompt: Option<&str>) -> Result<Option<ChatPrompt>> {
        if !self.chat {
            if self.template.system.is_some() || self.template.template.is_some() {
                bail!("--system and --template apply to the chat template: add --chat");
            }
            return Ok(None);
        }
        let Some(text) = prompt else {
            bail!("--chat takes its message from --prompt TEXT");
        };
        let template = self.template.load(model)?;
        let mut messages = self.template.opening();
        messages.push(Message::new("user", text));
        let rendered = template.render(&messages, true)?;
        Ok(Some(ChatPrompt {
            ids: encode_rendered(&model.tokenizer, &rendered),
            end_of_turn: template.end_of_turn(&model.tokenizer),
        }))
    }
}

#[derive(Args)]
pub struct ChatCmdArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    template: TemplateArgs,
    /// Most tokens per answer.
    #[arg(short = 'n', long = "n-predict", default_value_t = 512)]
    n: usize,
    /// Sampling temperature; 0 is greedy (argmax, ties to the lowest id).
    #[arg(long, default_value_t = 0.8)]
    temp: f32,
    /// Seed of the sampler (default: from the clock).
    #[arg(long)]
    seed: Option<u64>,
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    #[arg(long, default_value_t = 0.05)]
    min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    repeat_penalty: f32,
    /// Context length (default: the model's, at most 4096).
    #[arg(long)]
    ctx: Option<u32>,
    /// Per turn on stderr: prompt tokens, how many came from the cache,
    /// how many were prefilled; the answer's length and why it ended.
    #[arg(long, short = 'v')]
    verbose: bool,
    /// Keep the conversation in FILE (the KV cache) and FILE.messages.json
    /// after every turn, and continue it from there when they exist: only
    /// the new message is prefilled.
    #[arg(long, value_name = "FILE")]
    session: Option<std::path::PathBuf>,
}

/// The longest message line read.
const MAX_LINE_BYTES: u64 = 1 << 20;

/// Set by Ctrl-C during an answer; the decode loop stops at the next token.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);
/// Whether the program waits at the prompt (Ctrl-C there counts toward quitting).
static AT_PROMPT: AtomicBool = AtomicBool::new(false);
/// Ctrl-Cs at the current prompt.
static PROMPT_INTERRUPTS: AtomicU32 = AtomicU32::new(0);

fn on_ctrl_c() {
    if AT_PROMPT.load(Ordering::SeqCst) {
        if PROMPT_INTERRUPTS.fetch_add(1, Ordering::SeqCst) >= 1 {
            eprintln!();
            std::process::exit(130);
        }
        eprint!("\n(Ctrl-C again, /exit or Ctrl-D quits)\n> ");
    } else {
        INTERRUPTED.store(true, Ordering::SeqCst);
    }
}

/// Why an answer ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ending {
    EndOfTurn,
    Limit,
    Interrupted,
    ContextFull,
}

impl Ending {
    fn describe(self) -> &'static str {
        match self {
            Ending::EndOfTurn => "end of turn",
            Ending::Limit => "the -n limit",
            Ending::Interrupted => "Ctrl-C",
            Ending::ContextFull => "context full",
        }
    }
}

/// One answer: its ids (without the end-of-turn token) and text.
struct Answer {
    ids: Vec<TokenId>,
    text: String,
    ending: Ending,
}

/// The decoding settings of a conversation.
struct Generator<'m> {
    model: &'m Model,
    sampler: Sampler,
    greedy_on_device: bool,
    max: usize,
    end_of_turn: Option<TokenId>,
}

impl Generator<'_> {
    /// Generates after `logits` (of the prompt's last token), streaming
    /// the text to `out`. The cache then holds every id but the last one
    /// sampled when the limit or the context ended the answer.
    fn answer(
        &mut self,
        exec: &mut GraphExecutor,
        cache: &mut KvCache,
        logits: Vec<f32>,
        history: &[TokenId],
        out: &mut dyn Write,
    ) -> Result<Answer> {
        INTERRUPTED.store(false, Ordering::SeqCst);
        let model = self.model;
        let mut decoder = model.tokenizer.stream_decoder(false);
        let mut ans = Answer {
            ids: Vec::new(),
            text: String::new(),
            ending: Ending::Limit,
        };
        let room = (cache.config().context - cache.position()) as usize;
        let max = self.max.min(room);
        let mut history = history.to_vec();
        let end_of_turn = self.end_of_turn;
        // Takes a token: false once the answer ends.
        let mut accept =
            |tok: TokenId, ans: &mut Answer, history: &mut Vec<TokenId>| -> Result<bool> {
                if model.tokenizer.is_eog(tok) || end_of_turn == Some(tok) {
                    ans.ending = Ending::EndOfTurn;
                    return Ok(false);
                }
                ans.ids.push(tok);
                history.push(tok);
                let piece = decoder.push(tok)?;
                ans.text.push_str(&piece);
                out.write_all(piece.as_bytes())?;
                out.flush()?;
                if INTERRUPTED.load(Ordering::SeqCst) {
                    ans.ending = Ending::Interrupted;
                    return Ok(false);
                }
                Ok(true)
            };
        if max == 0 {
            ans.ending = Ending::ContextFull;
            return Ok(ans);
        }
        let first = if self.greedy_on_device {
            argmax(&logits) as TokenId
        } else {
            self.sampler.sample(&logits, &history)
        };
        if !accept(first, &mut ans, &mut history)? {
            return Ok(ans);
        }
        if self.greedy_on_device {
            let mut failed = None;
            model
                .decode_greedy(exec, cache, first, max - 1, &mut |t| {
                    accept(t, &mut ans, &mut history).unwrap_or_else(|e| {
                        failed = Some(e);
                        false
                    })
                })
                .context("decode failed")?;
            if let Some(e) = failed {
                return Err(e);
            }
        } else {
            let mut tok = first;
            while ans.ids.len() < max {
                let logits = model
                    .step(exec, cache, &[tok], LogitRows::Last)
                    .context("decode step failed")?;
                tok = self.sampler.sample(&logits, &history);
                if !accept(tok, &mut ans, &mut history)? {
                    break;
                }
            }
        }
        if ans.ending == Ending::Limit && max < self.max {
            ans.ending = Ending::ContextFull;
        }
        let rest = decoder.flush();
        ans.text.push_str(&rest);
        out.write_all(rest.as_bytes())?;
        Ok(ans)
    }
}

/// The conversation a session file continues: its saved messages over the
/// tokens its cache holds, or a new one when it has none.
fn continued(path: &std::path::Path, s: &Session, system: Option<&str>) -> Result<Conversation> {
    let Some(messages) = load_messages(path)? else {
        if s.resumed() {
            bail!(
                "--session {}: it holds a cache but no messages ({} is missing); weft chat continues the sessions it saved (weft run --session keeps tokens, not messages)",
                path.display(),
                super::session::messages_path(path).display()
            );
        }
        return Ok(Conversation::new(system));
    };
    if let Some(system) = system {
        let saved = messages
            .first()
            .filter(|m| m.role == "system")
            .map(|m| m.content.as_str());
        if saved != Some(system) && !messages.is_empty() {
            bail!(
                "--session {}: --system differs from the system message the saved conversation opens with; leave it out to continue, or use a new session file",
                path.display()
            );
        }
    }
    if messages.is_empty() && system.is_some() {
        return Ok(Conversation::new(system));
    }
    Ok(Conversation::resume(messages, s.tokens.clone()))
}

pub fn run(a: ChatCmdArgs) -> Result<()> {
    let (mut exec, model) = a.model.load()?;
    let template = a.template.load(&model)?;
    let ctx = a.ctx.unwrap_or_else(|| model.trained_context().min(4096));
    let policy = a.model.chunk_policy(&model)?;
    let mut cache = model.new_cache(&mut exec, ctx, policy.max_chunk())?;
    let seed = a.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    let mut gen = Generator {
        model: &model,
        sampler: Sampler::new(SamplingParams {
            temperature: a.temp,
            top_k: a.top_k,
            top_p: a.top_p,
            min_p: a.min_p,
            repeat_penalty: a.repeat_penalty,
            seed,
            ..Default::default()
        }),
        greedy_on_device: a.temp <= 0.0 && a.repeat_penalty == 1.0 && model.feeds_ids_on_device(),
        max: a.n,
        end_of_turn: template.end_of_turn(&model.tokenizer),
    };
    if let Err(e) = ctrlc::set_handler(on_ctrl_c) {
        eprintln!("note: Ctrl-C will end the program, not only the answer ({e})");
    }
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!(
            "{} ({ctx} tokens of context). /reset starts over, /exit or Ctrl-D quits, Ctrl-C stops an answer.",
            model.name
        );
    }
    let session = match &a.session {
        Some(path) => Some(Session::open(&mut exec, &model, &mut cache, path)?),
        None => None,
    };
    let mut conversation = match (&a.session, &session) {
        (Some(path), Some(s)) => continued(path, s, a.template.system.as_deref())?,
        _ => Conversation::new(a.template.system.as_deref()),
    };
    if let (Some(path), true) = (&a.session, interactive || a.verbose) {
        if !conversation.messages().is_empty() {
            eprintln!(
                "(continuing {}: {} messages, {} tokens in the cache)",
                path.display(),
                conversation.messages().len(),
                conversation.cached().len()
            );
        }
    }
    // Saves the conversation after a turn or a reset: the messages first,
    // then the cache (see session.rs).
    let save = |conversation: &Conversation,
                exec: &mut GraphExecutor,
                cache: &mut KvCache|
     -> Result<()> {
        if let (Some(path), Some(s)) = (&a.session, &session) {
            save_messages(path, conversation.messages())?;
            s.save(
                exec,
                &model,
                cache,
                &policy,
                conversation.cached(),
                a.verbose,
            )?;
        }
        Ok(())
    };
    let mut stdin = std::io::stdin().lock();
    let mut turn = 0usize;
    loop {
        let mut out = std::io::stdout().lock();
        if interactive {
            write!(out, "> ")?;
            out.flush()?;
        }
        PROMPT_INTERRUPTS.store(0, Ordering::SeqCst);
        AT_PROMPT.store(true, Ordering::SeqCst);
        let mut line = String::new();
        let read = (&mut stdin).take(MAX_LINE_BYTES).read_line(&mut line);
        AT_PROMPT.store(false, Ordering::SeqCst);
        if read.context("cannot read the next message from stdin")? == 0 {
            if interactive {
                writeln!(out)?;
            }
            return Ok(());
        }
        if line.len() as u64 == MAX_LINE_BYTES && !line.ends_with('\n') {
            bail!("a message longer than {MAX_LINE_BYTES} bytes; messages are one line each");
        }
        let text = line.trim_end_matches(['\n', '\r']);
        match text.trim() {
            "" => continue,
            "/exit" | "/quit" => return Ok(()),
            "/reset" => {
                conversation.reset(&mut cache);
                save(&conversation, &mut exec, &mut cache)?;
                eprintln!("(a new conversation)");
                continue;
            }
            cmd if cmd.starts_with('/') && !cmd.contains(' ') => {
                eprintln!("unknown command `{cmd}`: /reset starts over, /exit quits");
                continue;
            }
            _ => {}
        }
        turn += 1;
        let (logits, prefill) = match conversation
            .prefill_user(&model, &mut exec, &mut cache, &template, &policy, text)
        {
            Ok(r) => r,
            Err(TurnError::ContextFull { tokens, context }) => {
                eprintln!("the conversation ({tokens} tokens with this message) no longer fits the context of {context} tokens: /reset starts a new one (--ctx sets a larger context)");
                continue;
            }
            Err(e) => return Err(e).context("cannot prefill the conversation"),
        };
        if a.verbose {
            eprintln!(
                "[chat] turn {turn}: prompt {} tokens, {} from the cache, {} prefilled{}",
                prefill.prompt_tokens,
                prefill.reused,
                prefill.prefilled,
                if prefill.rolled_back {
                    " (the cache went back first)"
                } else {
                    ""
                }
            );
        }
        let history = conversation.cached().to_vec();
        let answer = gen.answer(&mut exec, &mut cache, logits, &history, &mut out)?;
        writeln!(out)?;
        out.flush()?;
        drop(out);
        conversation.finish_answer(&answer.text, &answer.ids, &cache);
        save(&conversation, &mut exec, &mut cache)?;
        if a.verbose {
            eprintln!(
                "[chat] turn {turn}: answer {} tokens, ended by {}, cache at {}",
                answer.ids.len(),
                answer.ending.describe(),
                cache.position()
            );
        }
        match answer.ending {
            Ending::ContextFull => {
                eprintln!("(the context of {ctx} tokens is full: /reset starts a new conversation)")
            }
            Ending::Interrupted if interactive => eprintln!("(stopped)"),
            _ => {}
        }
    }
}
