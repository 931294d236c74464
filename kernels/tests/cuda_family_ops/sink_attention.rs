//! SinkAttention on CUDA against the CPU kernel: bit-exact on every column
//! the output rope leaves alone; the rotated columns within a tolerance
//! (CUDA's f64 pow/log/sin/cos stand in for glibc's in the rope's
//! frequencies and angles, see cuda/sink_attention.rs), and the count of
//! rotated values whose bits differ is printed (expected 0 almost always).

use crate::cuda_common::*;
use weft_ops::reference::HostMemory;
use weft_ops::{DType, Op, OpNode};
use weft_ops::{SinkAttentionParams, TailRopeParams, YarnScaling};

/// Relative tolerance of a rotated output column, over `|cpu| + ROPE_FLOOR`:
/// a one-ulp change of an f32 cos or sin moves a value by about 1e-7 of
/// its pair's magnitude, a wrong angle or pair by far more than this.
const ROPE_TOL: f32 = 1e-5;
const ROPE_FLOOR: f32 = 1e-2;

/// One test shape.
#[derive(Clone, Copy, Debug)]
struct Case {
    n: usize,
    heads: usize,
    d: usize,
    q_position: u32,
    window: u32,
    ring: u32,
    ratio: u32,
    /// Selected rows per query (0: every visible row).
    top_k: usize,
    /// Compressed rows given (at least the last query's visible count).
    m: usize,
    kv: DType,
    /// The compressed rows' type when it differs from the window's.
    rows_kv: Option<DType>,
    /// Output rope dims (0: none).
    rope_dims: usize,
    yarn: bool,
}

impl Case {
    fn small(n: usize, q_position: u32) -> Case {
        Case {
            n,
            heads: 4,
            d: 40,
            q_position,
            window: 16,
            ring: 20,
            ratio: 0,
            top_k: 0,
            m: 1,
            kv: DType::F32,
            rows_kv: None,
            rope_dims: 0,
            yarn: false,
        }
    }

    /// Compressed rows the last query sees.
    fn visible(&self) -> usize {
        if self.ratio == 0 {
            0
        } else {
            (self.q_position as usize + self.n) / self.ratio as usize
        }
    }

    fn params(&self) -> SinkAttentionParams {
        SinkAttentionParams {
            heads: self.heads,
            head_dim: self.d,
            scale: 1.0 / (self.d as f32).sqrt(),
            q_position: self.q_position,
            window: self.window,
            ring: self.ring,
            ratio: self.ratio,
            top_k: self.top_k,
            out_rope: (self.rope_dims > 0).then_some(TailRopeParams {
                head_dim: self.d,
                n_dims: self.rope_dims,
                base: 160000.0,
                yarn: self.yarn.then_some(YarnScaling {
                    factor: 16.0,
                    orig_ctx: 65536,
                    beta_fast: 32.0,
                    beta_slow: 1.0,
                }),
                inverse: true,
            }),
        }
    }
}

/// The node of `c` over fresh random inputs in `mem` (the output poisoned).
/// Selections hold distinct visible rows in random order with -1 between
/// them (and -1 padding when fewer rows are visible than `top_k`).
fn build(rng: &mut Rng, mem: &mut HostMemory, c: &Case) -> OpNode {
    let (n, h, d) = (c.n, c.heads, c.d);
    assert!(c.m >= c.visible().max(1), "{c:?}: too few rows");
    let q = mem
        .f32_tensor(&[n, h * d], &rng.vec(n * h * d, 2.0))
        .unwrap();
    let win = mem.zeros(c.kv, &[c.ring as usize, d]).unwrap();
    mem.set_f32(&win, &rng.vec(c.ring as usize * d, 1.0))
        .unwrap();
    let rows = mem.zeros(c.rows_kv.unwrap_or(c.kv), &[c.m, d]).unwrap();
    mem.set_f32(&rows, &rng.vec(c.m * d, 1.0)).unwrap();
    let sinks = mem.f32_tensor(&[h], &rng.vec(h, 3.0)).unwrap();
    let out = mem.zeros(DType::F32, &[n, h * d]).unwrap();
    let mut inputs = vec![q, win, rows, sinks];
    if c.top_k > 0 {
        let mut sel = Vec::with_capacity(n * c.top_k);
        for i in 0..n {
            let visible = (c.q_position as usize + i + 1) / c.ratio as usize;
            let mut pool: Vec<i32> = (0..visible as i32).collect();
            let mut row = Vec::with_capacity(c.top_k);
            while row.len() < c.top_k {
                if pool.is_empty() || rng.below(5) == 0 {
                    row.push(-1);
                } else {
                    row.push(pool.swap_remove(rng.below(pool.len())));
                }
            }
            sel.extend(row);
        }
        let t = mem
            .tensor(DType::I32, &[n, c.top_k], bytemuck::cast_slice(&sel))
            .unwrap();
        inputs.push(t);
    }
    let nd = node(Op::SinkAttention(c.params()), inputs, vec![out]);
    poison_outputs(&nd, mem);
    nd
}

/// GPU output against the CPU's: unrotated columns bit for bit, rotated
/// ones within [`ROPE_TOL`].
fn compare(what: &str, p: &SinkAttentionParams, got: &[u8], want: &[u8]) {
    let (rot_lo, rot_hi) = match p.out_rope {
        Some(r) => (
            p.head_dim - r.n_dims,
            p.head_dim - r.n_dims + r.n_dims / 2 * 2,
        ),
        None => (p.head_dim, p.head_dim),
    };
    let g: &[f32] = bytemuck::cast_slice(got);
    let w: &[f32] = bytemuck::cast_slice(want);
    assert_eq!(g.len(), w.len(), "{what}: sizes differ");
    let (mut exact_bad, mut rot_bits, mut rot_err) = (Vec::new(), 0usize, 0f32);
    for (i, (a, b)) in g.iter().zip(w).enumerate() {
        let col = i % p.head_dim;
        let same = a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        if (rot_lo..rot_hi).contains(&col) {
            rot_bits += !same as usize;
            let e = (a - b).abs() / (b.abs() + ROPE_FLOOR);
            rot_err = if e.is_nan() {
                f32::INFINITY
            } else {
                rot_err.max(e)
            };
        } else if !same {
            exact_bad.push(format!("[{i}] gpu {a:e} cpu {b:e}"));
        }
    }
    assert!(
        exact_bad.is_empty(),
        "{what}: {} unrotated values differ: {}",
        exact_bad.len(),
        exact_bad[..exact_bad.len().min(8)].join("; ")
    );
    if rot_hi > rot_lo {
        println!(
            "{what}: rotated columns: {rot_bits} values differ in bits, max rel error {rot_err:e}"
        );
        assert!(
            rot_err <= ROPE_TOL,
            "{what}: rotated columns off by {rot_err:e} (relative, tolerance {ROPE_TOL:e})"
        );
    }
}

/// Runs `cases` on both backends and compares.
fn check(seed: u64, cases: &[Case]) {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(seed);
    for c in cases {
        let mut mem = HostMemory::default();
        let nd = build(&mut rng, &mut mem, c);
        let want = run_cpu(&nd, &mem);
        let got = run_gpu(g, &nd, &mem);
        compare(&format!("{c:?}"), &c.params(), &got[0], &want[0]);
    }
}

#[test]
fn sink_attention_window_only() {
    // Ratio 0: the window alone. Early positions (window partly filled),
    // a full window, a ring that wraps (ring 20 > window 16, positions past
    // 20), decode and prefill, f32 and f16 caches.
    let mut cases = Vec::new();
    for kv in [DType::F32, DType::F16] {
        for (n, qp) in [
            (1, 0),
            (1, 5),
            (1, 15),
            (1, 16),
            (1, 45),
            (7, 0),
            (33, 3),
            (9, 40),
        ] {
            cases.push(Case {
                kv,
                ..Case::small(n, qp)
            });
        }
    }
    // A window as long as the ring, a head size that is not a multiple of
    // 4 and a head count that is not one of 16.
    cases.push(Case {
        heads: 5,
        d: 37,
        window: 12,
        ring: 12,
        ..Case::small(30, 7)
    });
    check(301, &cases);
}

#[test]
fn sink_attention_all_visible_rows() {
    // Ratio 16 / 128 with every visible row, more rows given than visible
    // (a whole row table), decode and prefill, with and without the rope.
    let mut cases = Vec::new();
    for kv in [DType::F32, DType::F16] {
        for (n, qp, rope) in [
            (1, 70, 0),
            (1, 200, 8),
            (20, 0, 8),
            (40, 90, 0),
            (64, 300, 8),
        ] {
            cases.push(Case {
                ratio: 16,
                m: 40,
                kv,
                rope_dims: rope,
                ..Case::small(n, qp)
            });
        }
    }
    cases.push(Case {
        heads: 8,
        d: 64,
        window: 128,
        ring: 128,
        ratio: 128,
        m: 12,
        rope_dims: 16,
        yarn: true,
        ..Case::small(50, 1000)
    });
    check(302, &cases);
}

#[test]
fn sink_attention_selected_rows() {
    // Ratio 4 with a top-k selection (random order, -1 between and after),
    // fewer and more visible rows than top_k.
    let mut cases = Vec::new();
    for kv in [DType::F32, DType::F16] {
        for (n, qp, top_k, rope) in [
            (1, 3, 8, 8),
            (1, 60, 8, 8),
            (1, 100, 40, 0),
            (12, 0, 8, 8),
            (70, 30, 24, 8),
        ] {
            let mut c = Case {
                ratio: 4,
                top_k,
                kv,
                rope_dims: rope,
                yarn: true,
                ..Case::small(n, qp)
            };
            c.m = c.visible().max(1) + 3;
            cases.push(c);
        }
    }
    // A window cache of f16 beside f32 rows, and the other way round.
    for (kv, rows_kv) in [(DType::F16, DType::F32), (DType::F32, DType::F16)] {
        cases.push(Case {
            ratio: 4,
            top_k: 8,
            m: 30,
            kv,
            rows_kv: Some(rows_kv),
            rope_dims: 8,
            ..Case::small(9, 90)
        });
    }
    check(303, &cases);
}

#[test]
fn sink_attention_rope_pairs_at_odd_offsets() {
    // head_dim 41 with 8 rotated dims: the rotated pairs start at column 33
    // (odd), and an odd rope (7 dims) leaves its last column alone.
    let mut cases = Vec::new();
    for (d, rope, yarn) in [
        (41, 8, false),
        (41, 8, true),
        (40, 7, false),
        (130, 64, true),
    ] {
        cases.push(Case {
            heads: 3,
            d,
            ratio: 4,
            m: 30,
            rope_dims: rope,
            yarn,
            ..Case::small(25, 90)
        });
    }
    check(304, &cases);
}

#[test]
fn sink_attention_real_sizes() {
    // DeepSeek-V4-Flash: 64 heads of 512, window 128, rope 64 with YaRN;
    // ratio 4 layers with top-512 (decode, and a short prefill), ratio 128
    // layers with every visible row, a window-only layer.
    let real = Case {
        n: 1,
        heads: 64,
        d: 512,
        q_position: 5000,
        window: 128,
        ring: 128,
        ratio: 4,
        top_k: 512,
        m: 1251,
        kv: DType::F32,
        rows_kv: None,
        rope_dims: 64,
        yarn: true,
    };
    let cases = [
        real,
        Case {
            kv: DType::F16,
            q_position: 9001,
            m: 2400,
            ..real
        },
        Case { n: 5, ..real },
        Case {
            ratio: 128,
            top_k: 0,
            m: 64,
            q_position: 7000,
            ..real
        },
        Case {
            ratio: 128,
            top_k: 0,
            m: 2,
            n: 3,
            q_position: 300,
            kv: DType::F16,
            ..real
        },
        Case {
            ratio: 0,
            top_k: 0,
            m: 1,
            q_position: 77,
            ..real
        },
    ];
    check(305, &cases);
}

#[test]
fn sink_attention_query_chunks() {
    // Enough key slots per query (a row table of 60,000 rows) that the
    // scratch holds only a few query rows: the launch walks the queries in
    // chunks.
    check(
        306,
        &[
            Case {
                ratio: 4,
                m: 60_000,
                rope_dims: 8,
                ..Case::small(23, 40)
            },
            Case {
                ratio: 4,
                m: 60_000,
                kv: DType::F16,
                ..Case::small(9, 0)
            },
        ],
    );
}

#[test]
fn sink_attention_q_position_from_step() {
    // As a captured graph replays it: the node recorded with q_position 0
    // (dsv4::structural), the real position in the step scalars; equal to
    // the CPU's run of the real node.
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(307);
    let cases = [
        Case {
            kv: DType::F16,
            ..Case::small(1, 45)
        },
        Case {
            ratio: 16,
            m: 40,
            rope_dims: 8,
            ..Case::small(1, 333)
        },
        Case {
            ratio: 16,
            m: 40,
            rope_dims: 8,
            yarn: true,
            ..Case::small(17, 300)
        },
        Case {
            ratio: 4,
            top_k: 16,
            m: 80,
            rope_dims: 8,
            ..Case::small(6, 250)
        },
    ];
    for c in cases {
        let mut mem = HostMemory::default();
        let real = build(&mut rng, &mut mem, &c);
        let want = run_cpu(&real, &mem);
        let Op::SinkAttention(p) = real.op else {
            unreachable!()
        };
        let zeroed = node(
            Op::SinkAttention(SinkAttentionParams { q_position: 0, ..p }),
            real.inputs.clone(),
            real.outputs.clone(),
        );
        // A dry run has no GPU; the zeroed node is not valid on the CPU.
        let got = match g {
            Some(g) => {
                assert_eq!(g.kernels.step_scalars(&real), vec![c.q_position]);
                run_gpu_with(Some(g), &zeroed, &mem, Some(vec![c.q_position]))
            }
            None => want.clone(),
        };
        compare(&format!("step {c:?}"), &p, &got[0], &want[0]);
    }
}

#[test]
fn sink_attention_more_keys_than_one_segment() {
    // More valid keys than the attend kernel keeps in shared memory (640):
    // the softmax and the sums walk the keys in segments. Every visible row
    // (ratio 4 far into the context), a wide selection, f16 caches, and
    // real sizes in a ratio-128 layer at a long context.
    let mut cases = Vec::new();
    for kv in [DType::F32, DType::F16] {
        cases.push(Case {
            ratio: 4,
            m: 800,
            kv,
            rope_dims: 8,
            ..Case::small(3, 3000)
        });
        let mut c = Case {
            ratio: 4,
            top_k: 700,
            kv,
            ..Case::small(2, 4000)
        };
        c.m = c.visible() + 3;
        cases.push(c);
    }
    cases.push(Case {
        n: 1,
        heads: 64,
        d: 512,
        q_position: 100_000,
        window: 128,
        ring: 128,
        ratio: 128,
        top_k: 0,
        m: 800,
        kv: DType::F32,
        rows_kv: None,
        rope_dims: 64,
        yarn: true,
    });
    check(308, &cases);
}

#[test]
fn sink_attention_f16_odd_columns() {
    // f16 caches whose rows do not start on 4 bytes (odd head_dim), rotated
    // pairs at odd offsets over f16 values, and f16 beside f32 at an odd
    // head_dim: the value rows come in one half at a time.
    let mut cases = Vec::new();
    for (d, rope, kv, rows_kv) in [
        (37, 0, DType::F16, None),
        (41, 8, DType::F16, None),
        (38, 8, DType::F16, None),
        (41, 8, DType::F16, Some(DType::F32)),
        (39, 6, DType::F32, Some(DType::F16)),
    ] {
        cases.push(Case {
            heads: 5,
            d,
            ratio: 4,
            top_k: 8,
            m: 30,
            kv,
            rows_kv,
            rope_dims: rope,
            ..Case::small(11, 90)
        });
    }
    check(309, &cases);
}
