//! The `weft` command line: run, tokenize, perplexity, bench, graph.

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
    weft::models::gguf::install_truncation_guard();
    let args = cli::Cli::parse();
    match cli::dispatch(args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
