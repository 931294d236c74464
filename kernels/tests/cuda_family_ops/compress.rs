//! The KV compressor (`Compress`) and the lightning indexer's top-k
//! (`IndexerTopK`) on CUDA against the CPU kernels.
//!
//! `IndexerTopK` must give the CPU's rows exactly (its scores are the CPU's
//! bits, so the selection is the same, ties included). `Compress` is
//! bit-exact in its pass-through columns; in the rotated tail the CUDA
//! kernel calls CUDA's f64 `pow`/`sincos` where the CPU calls glibc's, so
//! each rotated pair is allowed [`ROPE_TOL`] of the pair's norm (one f32
//! ulp of a cos/sin is 6e-8; in practice the bits agree).

use crate::cuda_common::*;
use weft_ops::reference::HostMemory;
use weft_ops::{CompressParams, IndexerParams, TailRopeParams, YarnScaling};
use weft_ops::{DType, Op, OpNode, Shape, Tensor};

/// Largest |gpu - cpu| of a rotated value, relative to its pair's norm.
const ROPE_TOL: f32 = 2e-6;

/// DeepSeek-V4's compressor rope: theta 160000 with YaRN (factor 16 over
/// 65536 tokens, beta 32/1).
fn yarn() -> Option<YarnScaling> {
    Some(YarnScaling {
        factor: 16.0,
        orig_ctx: 65536,
        beta_fast: 32.0,
        beta_slow: 1.0,
    })
}

struct CompressCase {
    ratio: u32,
    overlap: bool,
    dc: usize,
    n_dims: usize,
    ring: u32,
    first_row: u32,
    rows: usize,
    yarn: Option<YarnScaling>,
    inverse: bool,
}

impl CompressCase {
    fn new(ratio: u32, dc: usize, ring: u32, first_row: u32, rows: usize) -> CompressCase {
        CompressCase {
            ratio,
            overlap: ratio == 4,
            dc,
            n_dims: 64.min(dc & !1),
            ring,
            first_row,
            rows,
            yarn: yarn(),
            inverse: false,
        }
    }

    fn name(&self) -> String {
        format!(
            "compress ratio {} overlap {} dc {} (rope {}) ring {} rows {}..+{}{}{}",
            self.ratio,
            self.overlap,
            self.dc,
            self.n_dims,
            self.ring,
            self.first_row,
            self.rows,
            if self.yarn.is_some() { " yarn" } else { "" },
            if self.inverse { " inverse" } else { "" },
        )
    }

    fn params(&self) -> CompressParams {
        CompressParams {
            ratio: self.ratio,
            overlap: self.overlap,
            first_row: self.first_row,
            rows: self.rows as u32,
            ring: self.ring,
            eps: 1e-6,
            rope: TailRopeParams {
                head_dim: self.dc,
                n_dims: self.n_dims,
                base: if self.yarn.is_some() {
                    160000.0
                } else {
                    10000.0
                },
                yarn: self.yarn,
                inverse: self.inverse,
            },
        }
    }

    /// Random rings, ape and norm weight; returns the node and the same
    /// node with `first_row` cleared (as `dsv4::structural` leaves it).
    fn build(&self, rng: &mut Rng, mem: &mut HostMemory) -> (OpNode, OpNode) {
        let width = if self.overlap { 2 * self.dc } else { self.dc };
        let ring = self.ring as usize;
        let ratio = self.ratio as usize;
        let kv = mem
            .f32_tensor(&[ring, width], &rng.rows(ring, width))
            .unwrap();
        let gate = mem
            .f32_tensor(&[ring, width], &rng.vec(ring * width, 3.0))
            .unwrap();
        let ape = mem
            .f32_tensor(&[ratio, width], &rng.vec(ratio * width, 1.0))
            .unwrap();
        let norm = mem.f32_tensor(&[self.dc], &rng.vec(self.dc, 1.0)).unwrap();
        // The whole row table, random, two rows past the pooled ones: rows
        // the op must leave alone keep their bits on both sides, and a row
        // the GPU fails to write keeps a value the CPU overwrote.
        let table = self.first_row as usize + self.rows + 2;
        let out = mem
            .f32_tensor(&[table, self.dc], &rng.vec(table * self.dc, 1.0))
            .unwrap();
        let p = self.params();
        let ins = vec![kv, gate, ape, norm];
        let real = node(Op::Compress(p), ins.clone(), vec![out]);
        let zeroed = node(
            Op::Compress(CompressParams { first_row: 0, ..p }),
            ins,
            vec![out],
        );
        (real, zeroed)
    }
}

/// Runs `gpu_node` (with `step`, if any) against the CPU run of `cpu_node`:
/// the pass-through columns bit for bit, the rotated pairs within
/// [`ROPE_TOL`] of their norm.
fn check_compress(
    g: Option<&Gpu>,
    what: &str,
    cpu_node: &OpNode,
    gpu_node: &OpNode,
    step: Option<Vec<u32>>,
    mem: &mut HostMemory,
) {
    let want = run_cpu(cpu_node, mem);
    let got = match g {
        Some(_) => run_gpu_with(g, gpu_node, mem, step),
        // Dry run: the CPU side only.
        None => run_cpu(cpu_node, mem),
    };
    let Op::Compress(p) = cpu_node.op else {
        unreachable!()
    };
    let (w, gv): (&[f32], &[f32]) = (
        bytemuck::cast_slice(&want[0]),
        bytemuck::cast_slice(&got[0]),
    );
    let dc = cpu_node.outputs[0].cols();
    let nope = dc - p.rope.n_dims;
    let mut exact_misses = Vec::new();
    let (mut worst, mut tail_inexact) = (0f32, 0usize);
    for (r, (wr, gr)) in w.chunks_exact(dc).zip(gv.chunks_exact(dc)).enumerate() {
        for c in 0..nope {
            if wr[c].to_bits() != gr[c].to_bits() && exact_misses.len() < 8 {
                exact_misses.push(format!(
                    "[{r}, {c}] gpu {:e} ({:#010x}) cpu {:e} ({:#010x})",
                    gr[c],
                    gr[c].to_bits(),
                    wr[c],
                    wr[c].to_bits()
                ));
            }
        }
        for j in (nope..dc).step_by(2) {
            let norm = wr[j].hypot(wr[j + 1]).max(f32::MIN_POSITIVE);
            for c in [j, j + 1] {
                if wr[c].to_bits() != gr[c].to_bits() {
                    tail_inexact += 1;
                }
                let e = (gr[c] - wr[c]).abs() / norm;
                worst = if e.is_nan() {
                    f32::INFINITY
                } else {
                    worst.max(e)
                };
            }
        }
    }
    assert!(
        exact_misses.is_empty(),
        "{what}: pass-through columns differ: {}",
        exact_misses.join("; ")
    );
    assert!(
        worst <= ROPE_TOL,
        "{what}: a rotated value is {worst:e} of its pair's norm off (tolerance {ROPE_TOL:e}: CUDA's f64 pow/sincos vs glibc's)"
    );
    if tail_inexact > 0 {
        eprintln!(
            "{what}: {tail_inexact} rotated values not bit-exact (max {worst:e} of the pair norm)"
        );
    }
}

#[test]
fn compress_matches_cpu() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(0xc0de);
    let small = |ratio, dc, n_dims, ring, first_row, rows| CompressCase {
        n_dims,
        yarn: None,
        ..CompressCase::new(ratio, dc, ring, first_row, rows)
    };
    let cases = [
        // Decode, real sizes: CSA (ratio 4, overlapping) and HCA (ratio
        // 128); both rings wrap.
        CompressCase::new(4, 512, 16, 700, 1),
        CompressCase::new(128, 512, 256, 20, 1),
        // The indexer's compressor (dc 128).
        CompressCase::new(4, 128, 12, 9001, 1),
        // Prefill from the start (row 0 has no previous window) and further on.
        CompressCase::new(4, 512, 128, 0, 24),
        CompressCase::new(4, 512, 40, 3, 37),
        CompressCase::new(128, 512, 640, 1, 4),
        CompressCase::new(4, 512, 1024, 0, 200),
        // Small odd sizes, wrapping rings, no YaRN.
        small(4, 37, 8, 9, 3, 5),
        small(4, 37, 8, 8, 11, 3), // the smallest ring that holds a CSA window
        small(128, 72, 16, 300, 2, 3),
        small(16, 33, 2, 40, 6, 9),
        small(1, 45, 12, 1, 5, 4),
        small(3, 100, 0, 5, 17, 6),
        // Inverse rotation.
        CompressCase {
            inverse: true,
            ..CompressCase::new(4, 96, 24, 50, 5)
        },
    ];
    for case in cases {
        let mut mem = HostMemory::default();
        let (real, _) = case.build(&mut rng, &mut mem);
        check_compress(g, &case.name(), &real, &real, None, &mut mem);
    }
}

#[test]
fn compress_reads_first_row_from_step() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(0xc0df);
    for case in [
        CompressCase::new(4, 512, 16, 513, 1),
        CompressCase::new(4, 512, 64, 90, 7),
        CompressCase::new(128, 512, 256, 7, 1),
        CompressCase::new(128, 64, 512, 3, 2),
    ] {
        let mut mem = HostMemory::default();
        let (real, zeroed) = case.build(&mut rng, &mut mem);
        check_compress(
            g,
            &format!("{} (first_row from step)", case.name()),
            &real,
            &zeroed,
            Some(vec![case.first_row]),
            &mut mem,
        );
    }
}

struct IndexerCase {
    heads: usize,
    head_dim: usize,
    top_k: usize,
    ratio: u32,
    q_position: u32,
    queries: usize,
    key_rows: usize,
}

impl IndexerCase {
    fn name(&self) -> String {
        format!(
            "indexer {} heads x {}, top-{} ratio {}, {} queries from {} over {} rows",
            self.heads,
            self.head_dim,
            self.top_k,
            self.ratio,
            self.queries,
            self.q_position,
            self.key_rows
        )
    }

    fn params(&self) -> IndexerParams {
        IndexerParams {
            heads: self.heads,
            head_dim: self.head_dim,
            top_k: self.top_k,
            ratio: self.ratio,
            q_position: self.q_position,
        }
    }

    /// The node over `q`, `weights` and `keys`, and the same node with
    /// `q_position` cleared.
    fn node_over(&self, mem: &mut HostMemory, q: Tensor, w: Tensor, k: Tensor) -> (OpNode, OpNode) {
        let out = mem.zeros(DType::I32, &[self.queries, self.top_k]).unwrap();
        let p = self.params();
        let real = node(Op::IndexerTopK(p), vec![q, w, k], vec![out]);
        let zeroed = node(
            Op::IndexerTopK(IndexerParams { q_position: 0, ..p }),
            vec![q, w, k],
            vec![out],
        );
        (real, zeroed)
    }

    /// Random queries, weights (both signs) and keys. With `misalign`, q
    /// starts 4 bytes into its buffer (the kernel's scalar path).
    fn build(&self, rng: &mut Rng, mem: &mut HostMemory, misalign: bool) -> (OpNode, OpNode) {
        let (n, hd) = (self.queries, self.heads * self.head_dim);
        let q = if misalign {
            let all = mem
                .f32_tensor(&[n * hd + 1], &rng.vec(n * hd + 1, 1.0))
                .unwrap();
            Tensor::new(all.buffer, 4, DType::F32, Shape::new(&[n, hd])).unwrap()
        } else {
            mem.f32_tensor(&[n, hd], &rng.vec(n * hd, 1.0)).unwrap()
        };
        let w = mem
            .f32_tensor(&[n, self.heads], &rng.vec(n * self.heads, 1.0))
            .unwrap();
        let k = mem
            .f32_tensor(
                &[self.key_rows, self.head_dim],
                &rng.vec(self.key_rows * self.head_dim, 1.0),
            )
            .unwrap();
        self.node_over(mem, q, w, k)
    }
}

/// Runs `gpu_node` (with `step`, if any) against the CPU run of `cpu_node`:
/// the same rows, bit for bit. The output starts as a pattern neither
/// writes (not -1, the padding).
fn check_indexer(
    g: Option<&Gpu>,
    what: &str,
    cpu_node: &OpNode,
    gpu_node: &OpNode,
    step: Option<Vec<u32>>,
    mem: &mut HostMemory,
) -> Vec<i32> {
    mem.bytes_mut(&cpu_node.outputs[0]).fill(0x5a);
    let want = run_cpu(cpu_node, mem);
    let got = match g {
        Some(_) => run_gpu_with(g, gpu_node, mem, step),
        None => run_cpu(cpu_node, mem),
    };
    assert_same(what, DType::I32, &got[0], &want[0]);
    bytemuck::pod_collect_to_vec(&want[0])
}

fn ic(
    heads: usize,
    head_dim: usize,
    top_k: usize,
    ratio: u32,
    q_position: u32,
    queries: usize,
    key_rows: usize,
) -> IndexerCase {
    IndexerCase {
        heads,
        head_dim,
        top_k,
        ratio,
        q_position,
        queries,
        key_rows,
    }
}

#[test]
fn indexer_topk_matches_cpu() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(0x1dc5);
    let cases = [
        // Decode: a few rows, then real sizes (64 heads x 128, top-512) at
        // a 64k context (16384 rows).
        (ic(4, 32, 8, 4, 99, 1, 30), false),
        (ic(64, 128, 512, 4, 65535, 1, 16384), false),
        // Prefill: visible rows grow from 0 past top_k (padding, then
        // selection), odd head sizes (scalar path).
        (ic(3, 19, 5, 4, 0, 37, 9), false),
        (ic(5, 36, 17, 16, 1000, 6, 70), false),
        (ic(2, 7, 3, 1, 50, 4, 60), false),
        (ic(8, 128, 512, 4, 11000, 40, 3000), false),
        // The large case: 3000 rows, top-512, 8 heads x 128, every query
        // seeing all of them (more visible positions than rows).
        (ic(8, 128, 512, 4, 12000, 3, 3000), false),
        (ic(64, 128, 512, 4, 12600, 2, 3200), false),
        // head_dim a multiple of 4 but q not 16-byte aligned: scalar path.
        (ic(8, 128, 64, 4, 4000, 3, 1000), true),
        (ic(3, 20, 9, 4, 300, 5, 80), true),
        // Fewer visible rows than top_k: -1 padding (and none visible).
        (ic(4, 16, 64, 4, 40, 3, 20), false),
        (ic(2, 8, 4, 4, 0, 3, 5), false),
        (ic(2, 8, 4, 128, 100, 2, 5), false),
        // More queries than one scratch chunk holds (140000 rows: 59 queries
        // a chunk): two rounds of score + select.
        (ic(1, 4, 16, 4, 560_000, 64, 140_000), false),
    ];
    for (case, misalign) in cases {
        let mut mem = HostMemory::default();
        let (real, _) = case.build(&mut rng, &mut mem, misalign);
        let what = format!(
            "{}{}",
            case.name(),
            if misalign { " (q misaligned)" } else { "" }
        );
        let rows = check_indexer(g, &what, &real, &real, None, &mut mem);
        // The CPU side itself: ascending rows, then -1.
        for sel in rows.chunks_exact(case.top_k) {
            let kept: Vec<i32> = sel.iter().copied().take_while(|&r| r >= 0).collect();
            assert!(kept.windows(2).all(|w| w[0] < w[1]), "{what}: {sel:?}");
            assert!(
                sel[kept.len()..].iter().all(|&r| r == -1),
                "{what}: {sel:?}"
            );
        }
    }
}

#[test]
fn indexer_topk_breaks_ties_to_the_lower_row() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(0x7135);
    // Keys drawn from a pool of 3 distinct rows: three scores, each shared
    // by about a third of the rows; top_k cuts through a group.
    {
        let case = ic(4, 32, 50, 4, 4000, 3, 200);
        let mut mem = HostMemory::default();
        let pool = rng.vec(3 * 32, 1.0);
        let mut keys = Vec::with_capacity(200 * 32);
        for _ in 0..200 {
            let p = rng.below(3);
            keys.extend_from_slice(&pool[p * 32..(p + 1) * 32]);
        }
        let q = mem.f32_tensor(&[3, 128], &rng.vec(3 * 128, 1.0)).unwrap();
        let w = mem.f32_tensor(&[3, 4], &rng.vec(3 * 4, 1.0)).unwrap();
        let k = mem.f32_tensor(&[200, 32], &keys).unwrap();
        let (real, _) = case.node_over(&mut mem, q, w, k);
        check_indexer(
            g,
            "indexer: three distinct keys",
            &real,
            &real,
            None,
            &mut mem,
        );
    }
    // One head with a positive weight: every key with a negative dot scores
    // exactly 0 (about half); top_k reaches into those zeros.
    for (top_k, rows) in [(200, 300), (700, 1000), (40, 60)] {
        let case = ic(1, 8, top_k, 4, 8000, 2, rows);
        let mut mem = HostMemory::default();
        let q = mem.f32_tensor(&[2, 8], &rng.vec(16, 1.0)).unwrap();
        let w = mem.f32_tensor(&[2, 1], &[0.75, 2.5]).unwrap();
        let k = mem.f32_tensor(&[rows, 8], &rng.vec(rows * 8, 1.0)).unwrap();
        let (real, _) = case.node_over(&mut mem, q, w, k);
        check_indexer(
            g,
            &format!("indexer: zero scores, top-{top_k} of {rows}"),
            &real,
            &real,
            None,
            &mut mem,
        );
    }
    // All keys equal: the first top_k rows.
    {
        let case = ic(2, 16, 30, 4, 400, 2, 100);
        let mut mem = HostMemory::default();
        let row = rng.vec(16, 1.0);
        let keys: Vec<f32> = (0..100).flat_map(|_| row.iter().copied()).collect();
        let q = mem.f32_tensor(&[2, 32], &rng.vec(64, 1.0)).unwrap();
        let w = mem.f32_tensor(&[2, 2], &rng.vec(4, 1.0)).unwrap();
        let k = mem.f32_tensor(&[100, 16], &keys).unwrap();
        let (real, _) = case.node_over(&mut mem, q, w, k);
        let rows = check_indexer(g, "indexer: all keys equal", &real, &real, None, &mut mem);
        let first: Vec<i32> = (0..30).collect();
        assert_eq!(&rows[..30], &first[..], "all keys equal: the lowest rows");
    }
}

#[test]
fn indexer_reads_q_position_from_step() {
    let Some(g) = gpu_or_dry() else { return };
    let mut rng = Rng::new(0x57e9);
    for case in [
        ic(8, 128, 512, 4, 4001, 1, 1100),
        ic(64, 128, 512, 4, 2000, 9, 600),
        ic(3, 19, 5, 4, 10, 12, 9),
    ] {
        let mut mem = HostMemory::default();
        let (real, zeroed) = case.build(&mut rng, &mut mem, false);
        check_indexer(
            g,
            &format!("{} (q_position from step)", case.name()),
            &real,
            &zeroed,
            Some(vec![case.q_position]),
            &mut mem,
        );
    }
}

#[test]
fn indexer_too_large_for_shared_memory_is_unsupported() {
    let Some(Some(g)) = gpu_or_dry() else { return };
    let mut rng = Rng::new(3);
    let case = ic(512, 128, 8, 4, 100, 1, 30);
    let mut mem = HostMemory::default();
    let (real, _) = case.build(&mut rng, &mut mem, false);
    assert!(g.kernels.supports(&real).is_err());
}
