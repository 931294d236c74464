//! Chat templates: turning a conversation into the prompt text a model was
//! trained on, and knowing where the model's answer ends.
//!
//! A GGUF carries its Hugging Face chat template as
//! `tokenizer.chat_template`, a Jinja program written for Python's `jinja2`
//! as `transformers` runs it (`trim_blocks`, `lstrip_blocks`, the loop
//! controls, `raise_exception`, a `tojson` that writes `json.dumps` text,
//! Python string methods such as `.strip()`). [`ChatTemplate`] runs it with
//! `minijinja` set up the same way, so the rendered text is the one
//! `apply_chat_template` gives (`models/tests/chat_template.rs` compares
//! against `jinja2`'s rendering of real templates).
//!
//! Files:
//! - `template.rs`: [`ChatTemplate`] (load, render, end-of-turn token) and
//!   [`ChatTemplateError`] (where a render failed and why);
//! - `pyjson.rs`: the `tojson` filter as `transformers` defines it;
//! - `strftime.rs`: the `strftime_now` global;
//! - `conversation.rs`: [`Conversation`], multi-turn chat over one KV cache
//!   without prefilling the history again.

mod conversation;
mod pyjson;
mod strftime;
mod template;

pub use conversation::{Conversation, TurnError, TurnPrefill};
pub use strftime::strftime;
pub use template::{
    encode_rendered, ChatTemplate, ChatTemplateError, Message, TemplateFault, GGUF_KEY,
    PLAIN_TEMPLATE,
};
