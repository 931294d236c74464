//! [`ChatTemplate`]: a Hugging Face chat template run by `minijinja` the way
//! `transformers`' `apply_chat_template` runs it with `jinja2`.

use std::fmt;
use std::path::Path;

use minijinja::value::{Kwargs, Serde, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde::Serialize;

use crate::gguf::GgufFile;
use crate::tokenizer::{EncodeOptions, TokenAttr, TokenId, Tokenizer};

/// The name the template is registered under (errors do not show it).
const NAME: &str = "chat_template";

/// The longest template file [`ChatTemplate::from_file`] reads.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// Engine instructions one render may take: chat templates take a few
/// thousand per message; a template that loops without end stops here.
const FUEL: u64 = 10_000_000;

/// The GGUF key of the template.
pub const GGUF_KEY: &str = "tokenizer.chat_template";

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A template for models without one: the messages' texts, one per line.
pub const PLAIN_TEMPLATE: &str =
    "{% for message in messages %}{{ message['content'] }}{% if not loop.last %}\n{% endif %}{% endfor %}";

/// A compiled chat template with the vocabulary's `bos_token`/`eos_token`.
pub struct ChatTemplate {
    env: Environment<'static>,
    origin: String,
    bos_token: String,
    eos_token: String,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("origin", &self.origin)
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

/// Why a template could not be read, compiled or rendered.
#[derive(Debug, thiserror::Error)]
pub enum ChatTemplateError {
    #[error("[chat] cannot read the chat template `{path}`: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "[chat] the chat template `{path}` has {bytes} bytes; at most {MAX_FILE_BYTES} are read"
    )]
    TooLarge { path: String, bytes: u64 },
    #[error("[chat] {origin}: {0}", origin = .0.origin)]
    Template(Box<TemplateFault>),
}

/// Where in a template something failed, and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateFault {
    /// The file, or the GGUF key, the template came from.
    pub origin: String,
    /// 1-based line and column of the failing expression, where known.
    pub line: Option<usize>,
    pub column: Option<usize>,
    /// What went wrong (a `raise_exception` message verbatim).
    pub message: String,
    /// The failing expression's source text, where known.
    pub expression: Option<String>,
}

impl fmt::Display for TemplateFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.column) {
            (Some(l), Some(c)) => write!(f, "line {l}, column {c}: ")?,
            (Some(l), None) => write!(f, "line {l}: ")?,
            _ => {}
        }
        f.write_str(&self.message)?;
        if let Some(e) = &self.expression {
            write!(f, " (in `{e}`)")?;
        }
        Ok(())
    }
}

impl ChatTemplateError {
    /// The fault inside the template, for compile and render errors.
    pub fn fault(&self) -> Option<&TemplateFault> {
        match self {
            ChatTemplateError::Template(f) => Some(f),
            _ => None,
        }
    }
}

/// Marks the detail of an error `raise_exception` made.
const RAISED: &str = "raise_exception: ";
/// How a fault's message starts when the template raised it.
const RAISED_MESSAGE: &str = "the template raised an exception: ";

impl TemplateFault {
    /// The message of the template's own `raise_exception`, when it made
    /// this fault (the template refused its input).
    pub fn raised(&self) -> Option<&str> {
        self.message.strip_prefix(RAISED_MESSAGE)
    }
}

impl ChatTemplate {
    /// Compiles `source` (`origin` names it in errors) with the given
    /// `bos_token` and `eos_token` texts.
    pub fn new(
        source: &str,
        origin: &str,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<ChatTemplate, ChatTemplateError> {
        let mut env = Environment::new();
        env.set_debug(true);
        env.set_fuel(Some(FUEL));
        let mut syntax = minijinja::syntax::SyntaxConfig::builder();
        syntax.trim_blocks(true).lstrip_blocks(true);
        env.set_syntax(syntax.build().map_err(|e| fault(origin, source, &e))?);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, source.to_string())
            .map_err(|e| fault(origin, source, &e))?;
        Ok(ChatTemplate {
            env,
            origin: origin.into(),
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
        })
    }

    /// [`ChatTemplate::new`] with `tokenizer`'s BOS and EOS texts.
    pub fn with_tokenizer(
        source: &str,
        origin: &str,
        tokenizer: &Tokenizer,
    ) -> Result<ChatTemplate, ChatTemplateError> {
        let text = |id: Option<TokenId>| {
            id.and_then(|id| tokenizer.decode(&[id], true).ok())
                .unwrap_or_default()
        };
        ChatTemplate::new(
            source,
            origin,
            &text(tokenizer.bos()),
            &text(tokenizer.eos()),
        )
    }

    /// The template a GGUF file carries (`tokenizer.chat_template`), or
    /// `None` when it has none.
    pub fn from_gguf(
        file: &GgufFile,
        tokenizer: &Tokenizer,
    ) -> Result<Option<ChatTemplate>, ChatTemplateError> {
        let source = file.get_str(GGUF_KEY).map_err(|e| {
            ChatTemplateError::Template(Box::new(TemplateFault {
                origin: format!("the GGUF's `{GGUF_KEY}`"),
                line: None,
                column: None,
                message: e.to_string(),
                expression: None,
            }))
        })?;
        source
            .map(|s| {
                ChatTemplate::with_tokenizer(s, &format!("the GGUF's `{GGUF_KEY}`"), tokenizer)
            })
            .transpose()
    }

    /// A template file (Jinja text, at most 1 MiB).
    pub fn from_file(
        path: &Path,
        tokenizer: &Tokenizer,
    ) -> Result<ChatTemplate, ChatTemplateError> {
        let shown = path.display().to_string();
        let io = |source| ChatTemplateError::Io {
            path: shown.clone(),
            source,
        };
        let bytes = std::fs::metadata(path).map_err(io)?.len();
        if bytes > MAX_FILE_BYTES {
            return Err(ChatTemplateError::TooLarge { path: shown, bytes });
        }
        let source = std::fs::read_to_string(path).map_err(io)?;
        ChatTemplate::with_tokenizer(&source, &shown, tokenizer)
    }

    /// Where the template came from (a file, or the GGUF key).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Renders `messages` (a list of `{role, content, ...}` maps: a slice
    /// of [`Message`] or any serializable list), ending with the assistant
    /// turn's opening when `add_generation_prompt`.
    pub fn render<M: Serialize + ?Sized>(
        &self,
        messages: &M,
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        self.render_with_tools::<M, ()>(messages, None, add_generation_prompt)
    }

    /// [`ChatTemplate::render`] with the template's `tools` variable (a
    /// list of function definitions) set when given.
    pub fn render_with_tools<M: Serialize + ?Sized, T: Serialize + ?Sized>(
        &self,
        messages: &M,
        tools: Option<&T>,
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| fault(&self.origin, "", &e))?;
        let tools = tools.map_or(Value::UNDEFINED, |t| Value::from(Serde(t)));
        let ctx = minijinja::context! {
            messages => Value::from(Serde(messages)),
            tools => tools,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        };
        template
            .render(ctx)
            .map_err(|e| fault(&self.origin, template.source(), &e))
    }

    /// The control token that closes a message in this template
    /// (`<|im_end|>` in ChatML, `<end_of_turn>` in Gemma's), found by
    /// rendering a probe conversation and tokenizing what follows the
    /// assistant's text. `None` when the template puts no control token
    /// there (or cannot render the probe).
    pub fn end_of_turn(&self, tokenizer: &Tokenizer) -> Option<TokenId> {
        const PROBE: &str = "weft-end-of-turn-probe";
        let tries = [
            vec![Message::new("user", "hi"), Message::new("assistant", PROBE)],
            vec![
                Message::new("system", "s"),
                Message::new("user", "hi"),
                Message::new("assistant", PROBE),
            ],
        ];
        let text = tries.iter().find_map(|m| self.render(m, false).ok())?;
        let after = &text[text.rfind(PROBE)? + PROBE.len()..];
        let ids = tokenizer.encode_with(
            after,
            EncodeOptions {
                add_special: false,
                parse_special: true,
            },
        );
        let first = *ids.first()?;
        tokenizer
            .token_attr(first)
            .filter(|a| a.contains(TokenAttr::CONTROL))
            .map(|_| first)
    }
}

/// Token ids of a rendered conversation: control-token text becomes those
/// tokens, and BOS is prepended when the vocabulary asks for it and the
/// template did not write it already; no EOS.
pub fn encode_rendered(tokenizer: &Tokenizer, text: &str) -> Vec<TokenId> {
    let mut ids = tokenizer.encode_with(
        text,
        EncodeOptions {
            add_special: false,
            parse_special: true,
        },
    );
    if let Some(bos) = tokenizer.bos().filter(|_| tokenizer.add_bos()) {
        if ids.first() != Some(&bos) {
            ids.insert(0, bos);
        }
    }
    ids
}

/// `raise_exception(message)`: fails the render with the template's words.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("{RAISED}{message}"),
    ))
}

/// `strftime_now(format)`: the current UTC time in a C `strftime` format.
fn strftime_now(format: &str) -> Result<String, Error> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    super::strftime::strftime(format, now)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("strftime_now: {e}")))
}

/// `tojson` as `transformers` defines it: Python's `json.dumps`.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let separators = match separators.as_deref() {
        None => None,
        Some([item, key]) => Some((item.clone(), key.clone())),
        Some(other) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!(
                    "tojson: separators must be two strings (item, key), not {}",
                    other.len()
                ),
            ))
        }
    };
    let style = super::pyjson::Style {
        indent,
        sort_keys: sort_keys.unwrap_or(false),
        ensure_ascii: ensure_ascii.unwrap_or(false),
        separators,
    };
    Ok(Value::from_safe_string(super::pyjson::dumps(
        value, &style,
    )?))
}

/// A minijinja error as a [`ChatTemplateError`] with line, column and the
/// failing expression.
fn fault(origin: &str, source: &str, e: &Error) -> ChatTemplateError {
    let source = e.template_source().unwrap_or(source);
    let range = e.range().filter(|r| {
        r.start <= r.end
            && r.end <= source.len()
            && source.is_char_boundary(r.start)
            && source.is_char_boundary(r.end)
    });
    // minijinja's span of `a.b.c` starts at the first dot: include `a`.
    let range = range.map(|mut r| {
        if source[r.clone()].starts_with('.') {
            let head = source[..r.start]
                .chars()
                .rev()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .map(char::len_utf8)
                .sum::<usize>();
            r.start -= head;
        }
        r
    });
    let (line, column) = match &range {
        Some(r) => {
            let before = &source[..r.start];
            let line = before.matches('\n').count() + 1;
            let line_start = before.rfind('\n').map_or(0, |i| i + 1);
            (Some(line), Some(before[line_start..].chars().count() + 1))
        }
        None => (e.line(), None),
    };
    let expression = range.map(|r| {
        let text = source[r].trim();
        match text.char_indices().nth(80) {
            Some((cut, _)) => format!("{}...", &text[..cut]),
            None => text.to_string(),
        }
    });
    let message = match e.detail() {
        Some(d) if d.starts_with(RAISED) => {
            format!("{RAISED_MESSAGE}{}", &d[RAISED.len()..])
        }
        Some(d) => format!("{}: {d}", e.kind()),
        None if e.kind() == ErrorKind::OutOfFuel => {
            format!("the template did not finish within {FUEL} engine steps")
        }
        None => e.kind().to_string(),
    };
    ChatTemplateError::Template(Box::new(TemplateFault {
        origin: origin.into(),
        line,
        column,
        message,
        expression,
    }))
}
