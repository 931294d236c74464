//! The weight formats of the public DeepSeek-V4 GGUFs besides F32, F16,
//! BF16 and Q8_0 — Q2_K, Q4_K, IQ2_XXS, MXFP4 — against the `gguf` Python
//! package's dequantization of random blocks (`tests/data/dsv4_quants/`,
//! written by `generate.py` there), and their matrix-vector products
//! through weft's expert matmul (and, for Q4_K, the dense matmul).

use weft::ops::builder::FamilyBuilder;
use weft::ops::quant::{dequantize_row, quantize_row, vec_dot_type};
use weft::ops::{Builder, DType, Tensor};
use weft::runtime::{Device, ExecutorConfig, GraphExecutor};

const ROWS: usize = 6;
const COLS: usize = 512;

fn data(name: &str, ext: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/dsv4_quants")
        .join(format!("{name}.{ext}"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

const FORMATS: [(&str, DType); 4] = [
    ("q2_k", DType::Q2_K),
    ("q4_k", DType::Q4_K),
    ("iq2_xxs", DType::IQ2_XXS),
    ("mxfp4", DType::MXFP4),
];

#[test]
fn dequantization_matches_the_gguf_package() {
    for (name, dtype) in FORMATS {
        let blocks = data(name, "blocks");
        let want = floats(&data(name, "f32"));
        let row_bytes = dtype.row_bytes(COLS).expect("row bytes");
        assert_eq!(blocks.len(), ROWS * row_bytes, "{name}: block bytes");
        let mut worst = 0f32;
        for r in 0..ROWS {
            let mut got = vec![0f32; COLS];
            dequantize_row(dtype, &blocks[r * row_bytes..(r + 1) * row_bytes], &mut got)
                .expect("dequantize");
            for (a, b) in got.iter().zip(&want[r * COLS..(r + 1) * COLS]) {
                worst = worst.max((a - b).abs() / b.abs().max(1e-3));
            }
        }
        eprintln!("{name}: dequantized {ROWS}x{COLS} random values, max relative diff vs gguf {worst:.1e}");
        assert!(worst <= 1e-6, "{name}: {worst}");
    }
}

/// `y = W x` through one recorded step: the expert matmul over one expert,
/// and the dense matmul where the CPU has a kernel for the format.
fn matvec(
    exec: &mut GraphExecutor,
    dtype: DType,
    blocks: &[u8],
    x: &[f32],
    dense: bool,
) -> Vec<f32> {
    let w = exec
        .alloc_tensor(dtype, &[1, ROWS, COLS], "experts")
        .expect("weights");
    exec.write_bytes(&w, blocks).expect("write");
    let mut s = exec.begin_recorded();
    let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let xt = s.upload(DType::F32, &[1, COLS], &bytes, "x").expect("x");
    let out: Tensor = if dense {
        let w2 = w.reshape(&[ROWS, COLS]).expect("2-D");
        s.matmul(xt, w2, "matmul").expect("matmul")
    } else {
        let ids = s.upload_i32(&[0], "ids").expect("ids");
        let ids = ids.reshape(&[1, 1]).expect("ids");
        s.matmul_id(xt, w, ids, "matmul_id").expect("matmul_id")
    };
    s.finish().expect("run");
    let y = exec.read_f32(&out).expect("read");
    exec.release_buffer(w.buffer);
    y
}

#[test]
fn matvec_matches_the_gguf_dequantization() {
    let mut exec = GraphExecutor::with_config(
        Device::Cpu,
        ExecutorConfig {
            threads: 2,
            ..ExecutorConfig::default()
        },
    )
    .expect("executor");
    // Deterministic activations in [-1, 1).
    let mut state = 0x1234_5678_u64;
    let x: Vec<f32> = (0..COLS)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect();
    for (name, dtype) in FORMATS {
        let blocks = data(name, "blocks");
        let w = floats(&data(name, "f32"));
        // What the kernels multiply: the activations in the format's
        // activation type (Q8_K or Q8_0), as llama.cpp does.
        let act = vec_dot_type(dtype);
        let mut qx = vec![0u8; act.row_bytes(COLS).expect("act")];
        quantize_row(act, &x, &mut qx).expect("quantize");
        let mut xq = vec![0f32; COLS];
        dequantize_row(act, &qx, &mut xq).expect("dequantize");
        let exact = |xs: &[f32], r: usize| -> (f64, f64) {
            let row = &w[r * COLS..(r + 1) * COLS];
            let dot = row.iter().zip(xs).map(|(a, b)| *a as f64 * *b as f64).sum();
            let mag = row
                .iter()
                .zip(xs)
                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                .sum();
            (dot, mag)
        };
        // The dense CPU matmul has a kernel for Q4_K (Q2_K, IQ2_XXS and
        // MXFP4 are expert formats: the expert matmul covers them).
        let paths: &[bool] = if dtype == DType::Q4_K {
            &[false, true]
        } else {
            &[false]
        };
        for &dense in paths {
            let y = matvec(&mut exec, dtype, &blocks, &x, dense);
            let (mut tight, mut loose) = (0f64, 0f64);
            for (r, &got) in y.iter().enumerate() {
                let (want_q, mag) = exact(&xq, r);
                let (want_f, _) = exact(&x, r);
                tight = tight.max((got as f64 - want_q).abs() / mag);
                loose = loose.max((got as f64 - want_f).abs() / mag);
            }
            let path = if dense { "matmul" } else { "matmul_id" };
            eprintln!(
                "{name} {path}: vs gguf weights x quantized activations {tight:.1e}, vs f32 activations {loose:.1e} (relative to sum |w x|)"
            );
            assert!(tight < 1e-5, "{name} {path}: {tight}");
            assert!(loose < 2e-2, "{name} {path}: {loose}");
        }
    }
}
