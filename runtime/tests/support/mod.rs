//! Shared test code for the cache and pool tests: a tiny transformer with
//! random weights recorded from weft's own ops (`tiny.rs`), an executor
//! configured the same way everywhere (so runs are comparable bit for bit),
//! and comparison helpers.
#![allow(dead_code, unused_imports)]

pub mod tiny;

pub use tiny::{ScopeMode, Tiny, TinyConfig};
use weft_runtime::{Device, DiagnosticsConfig, ExecutorConfig, GraphExecutor};

/// Worker threads of every test executor (fixed: work splits depend on it).
pub const THREADS: usize = 2;

/// A CPU executor that checks every schedule.
pub fn executor() -> GraphExecutor {
    let config = ExecutorConfig {
        threads: THREADS,
        diagnostics: DiagnosticsConfig::checked(),
        ..Default::default()
    };
    match GraphExecutor::with_config(Device::Cpu, config) {
        Ok(e) => e,
        Err(e) => panic!("cannot build a test executor: {e}"),
    }
}

/// The bit patterns of `values` (comparisons that treat -0.0 and NaN exactly).
pub fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

/// Asserts two logit vectors are identical bit for bit.
#[track_caller]
pub fn assert_same_bits(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths differ");
    if let Some(i) = a
        .iter()
        .zip(b)
        .position(|(x, y)| x.to_bits() != y.to_bits())
    {
        panic!("{what}: first difference at {i}: {} vs {}", a[i], b[i]);
    }
}

/// Asserts `err`'s message contains every one of `needles`.
#[track_caller]
pub fn assert_err_contains<T: std::fmt::Debug>(
    r: Result<T, weft_runtime::RuntimeError>,
    needles: &[&str],
) -> String {
    let msg = match r {
        Ok(v) => panic!("expected an error containing {needles:?}, got Ok({v:?})"),
        Err(e) => e.to_string(),
    };
    for n in needles {
        assert!(msg.contains(n), "error `{msg}` does not mention `{n}`");
    }
    msg
}

/// A deterministic token sequence over `vocab` ids.
pub fn tokens(n: usize, seed: u32, vocab: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| {
            (i.wrapping_mul(2_654_435_761)
                .wrapping_add(seed.wrapping_mul(40_503)))
                % vocab as u32
        })
        .collect()
}
