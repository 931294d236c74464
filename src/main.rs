//! The `weft` command line: run, tokenize, perplexity, bench, graph.
//!
//! Exit status: 0 on success, and also when the reader of stdout went away
//! (a broken pipe, as in `weft tokenize ... | head -c 10`: the output was
//! cut short on purpose, so weft stops quietly); 1 for an error, with a
//! message on stderr naming the cause; 2 for a command line the argument
//! parser refuses. Every `WEFT_*` variable is checked before any work.

mod cli;

/// Recording a step makes a few small allocations per node; mimalloc
/// takes about 30 % off the host time of a decode step against glibc's
/// allocator (`cargo bench --bench record_step`, which uses it too). Linux
/// only: elsewhere the system allocator.
#[cfg(target_os = "linux")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::Parser;

fn main() -> std::process::ExitCode {
    reserve_standard_fds();
    weft::models::gguf::install_truncation_guard();
    let args = cli::Cli::parse();
    let result = weft::settings::check_environment()
        .map_err(anyhow::Error::from)
        .and_then(|_| cli::dispatch(args));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) if e.downcast_ref::<cli::output::StdoutClosed>().is_some() => {
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            note!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// A standard descriptor (0, 1, 2) the caller closed would be handed to
/// the next file weft opens, and output meant for stdout would land in it;
/// each closed one is pointed at /dev/null instead.
fn reserve_standard_fds() {
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        for _ in 0..3 {
            match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/null")
            {
                Ok(f) if f.as_raw_fd() <= 2 => std::mem::forget(f),
                _ => break,
            }
        }
    }
}
