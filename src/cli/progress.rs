//! Progress for anything longer than a second: a bar on a terminal, plain
//! lines otherwise (logs, CI).

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;

/// A progress indicator over `total` steps.
pub struct Progress {
    bar: Option<ProgressBar>,
    label: String,
    total: u64,
    done: std::cell::Cell<u64>,
}

impl Progress {
    pub fn new(total: u64, label: &str) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = ProgressBar::new(total);
            if let Ok(style) =
                ProgressStyle::with_template("{spinner} {msg} [{bar:30}] {pos}/{len} {elapsed}")
            {
                b.set_style(style.progress_chars("=> "));
            }
            b
        });
        Progress {
            bar,
            label: label.to_string(),
            total,
            done: std::cell::Cell::new(0),
        }
    }

    pub fn message(&self, msg: &str) {
        match &self.bar {
            Some(b) => b.set_message(msg.to_string()),
            None => crate::note!("{}: {msg}", self.label),
        }
    }

    pub fn inc(&self) {
        self.done.set(self.done.get() + 1);
        match &self.bar {
            Some(b) => b.inc(1),
            None => crate::note!("{}: {}/{} done", self.label, self.done.get(), self.total),
        }
    }

    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
