//! The machine's memory read bandwidth, measured where `weft bench` runs:
//! the decode floor of a memory-bound model is the bytes a step reads over
//! this rate, and a ratio to it means something only when both come from
//! the same machine in the same run.

use std::hint::black_box;
use std::time::Instant;

/// Bytes the probe reads per pass: well past any cache level.
const PROBE_BYTES: usize = 512 << 20;
/// Passes; the fastest counts (a noisy machine's slow passes drop out).
const PASSES: usize = 3;

/// Read bandwidth in bytes per second with `threads` threads, each summing
/// its share of a buffer of [`PROBE_BYTES`] (written first, so every page
/// is real memory).
pub fn read_bytes_per_second(threads: usize) -> f64 {
    let threads = threads.max(1);
    let words = PROBE_BYTES / 8;
    let buffer: Vec<u64> = (0..words as u64).collect();
    let share = words.div_ceil(threads);
    let mut best = f64::INFINITY;
    for _ in 0..PASSES {
        let t0 = Instant::now();
        std::thread::scope(|s| {
            for part in buffer.chunks(share) {
                s.spawn(move || black_box(part.iter().fold(0u64, |a, &x| a.wrapping_add(x))));
            }
        });
        best = best.min(t0.elapsed().as_secs_f64());
    }
    (words * 8) as f64 / best
}
