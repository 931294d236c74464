//! Checks that more than one test binary runs: the same cases under
//! different process-wide settings (an instruction-set cap, say), which a
//! binary can only set before its first kernel runs.

use crate::host::{node, run_cpu_in, run_ref};
use crate::Rng;
use weft_kernels::Numerics;
use weft_ops::reference::HostMemory;
use weft_ops::{AttentionParams, DType, Op};

/// Fast attention against the f64 reference: decode (cells split into
/// chunks, combined by log-sum-exp) at lengths from one chunk to many, and
/// prefill (blocks of 64 rows, a KV head's query heads together), with
/// windows, rings and soft-caps: within 1e-4 relative (floor 1e-2) for f32
/// and f16 caches alike, since both compute in f32 from the cached values;
/// the same bits whatever the thread count and item order.
pub fn fast_attention_agrees() {
    let mut rng = Rng::new(41);
    // Head sizes the vector kernels take in blocks of four registers (64,
    // 256), with a one-register tail (80 on AVX-512), in 8-lane registers
    // only (40: AVX2's path) and not at all (36: the portable loop); query
    // heads per KV head from 1 to 7 (passes of 4 and 3).
    let shapes = [
        (6, 2, 64),
        (4, 1, 256),
        (8, 8, 80),
        (14, 2, 64),
        (2, 1, 40),
        (2, 1, 36),
    ];
    for (shape, kv_dtype) in shapes
        .iter()
        .flat_map(|s| [(*s, DType::F32), (*s, DType::F16)])
    {
        for (n, q_position, window, ring, softcap) in [
            (1, 0, None, None, 0.0),
            (1, 9, None, None, 0.0),
            (1, 700, None, None, 0.0),
            (2, 3000, None, None, 0.0),
            (1, 1100, Some(300), None, 0.0),
            (3, 900, Some(128), Some(256), 0.0),
            (4, 2500, None, None, 30.0),
            (5, 0, None, None, 0.0),
            (64, 0, None, None, 0.0),
            (100, 37, None, None, 0.0),
            (300, 200, Some(96), None, 0.0),
            (130, 400, Some(128), Some(256), 0.0),
            (200, 1000, None, None, 50.0),
        ]
        .into_iter()
        .enumerate()
        .filter(|(i, _)| shape == shapes[0] || i % 2 == 0 || *i == 5)
        .map(|(_, c)| c)
        {
            let mut mem = HostMemory::default();
            let (heads, kv_heads, d) = shape;
            let rows = ring.map_or(q_position as usize + n, |r| r as usize);
            let q = mem
                .f32_tensor(&[n, heads * d], &rng.vec(n * heads * d, 1.0))
                .unwrap();
            let k = mem.zeros(kv_dtype, &[rows, kv_heads * d]).unwrap();
            let v = mem.zeros(kv_dtype, &[rows, kv_heads * d]).unwrap();
            mem.set_f32(&k, &rng.vec(rows * kv_heads * d, 1.0)).unwrap();
            mem.set_f32(&v, &rng.vec(rows * kv_heads * d, 1.0)).unwrap();
            let o = mem.zeros(DType::F32, &[n, heads * d]).unwrap();
            let params = AttentionParams {
                heads,
                kv_heads,
                head_dim: d,
                scale: 1.0 / (d as f32).sqrt(),
                q_position,
                window,
                ring,
                softcap,
                kv_capacity: 0,
                // Fast numerics keeps neither of llama.cpp's two orders.
                flash: q_position % 2 == 0,
            };
            let node = node(Op::Attention(params), vec![q, k, v], vec![o]);
            let want = run_ref(&node, &mem).to_f32(&o).unwrap();
            let first = run_cpu_in(&node, &mem, 1, Numerics::Fast)
                .to_f32(&o)
                .unwrap();
            let mut worst = 0f32;
            for (a, b) in first.iter().zip(&want) {
                let e = (a - b).abs() / (b.abs() + 1e-2);
                assert!(e.is_finite(), "non-finite result {a} vs {b}");
                worst = worst.max(e);
            }
            let what = format!(
                "{kv_dtype} {shape:?} n={n} at {q_position} window {window:?} ring {ring:?}"
            );
            assert!(worst <= 1e-4, "fast attention {what}: worst {worst}");
            for threads in [2, 7] {
                let again = run_cpu_in(&node, &mem, threads, Numerics::Fast)
                    .to_f32(&o)
                    .unwrap();
                assert!(
                    again
                        .iter()
                        .zip(&first)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "fast attention {what}: bits differ with {threads} threads"
                );
            }
        }
    }
}
