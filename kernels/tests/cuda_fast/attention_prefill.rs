//! The tensor-core prefill attention (numerics `fast`) against the
//! reference's f64 softmax attention over the same f16 caches: causal
//! prefills from an empty cache and after cached cells, grouped and
//! multi-head, windows, a ring, a soft cap, both head sizes; outputs
//! poisoned first, a second launch giving the same bits.
//!
//! Bound: per query row and head, max |gpu - reference| <= 1e-2 of the
//! largest |reference| value (queries and weights rounded to f16; see
//! fast/attention_prefill.cu).

use super::*;

/// Error bound relative to the (row, head)'s largest reference value.
const PREFILL_TOLERANCE: f32 = 1e-2;

#[test]
fn tensor_core_prefill_attention_matches_the_reference() {
    let Some(g) = fast() else { return };
    let mut rng = Rng::new(93);
    let mut failures = Vec::new();
    let cases: &[Case] = &[
        (9, 3, 64, 200, 0, None, None, 0.0), // SmolLM2
        (9, 3, 64, 100, 300, None, None, 0.0),
        (9, 3, 64, 64, 0, None, None, 0.0),
        (14, 2, 64, 77, 1000, None, None, 0.0), // Qwen2.5-0.5B
        (8, 2, 128, 130, 0, None, None, 0.0),
        (8, 2, 128, 33, 500, Some(100), None, 0.0),
        (4, 4, 64, 70, 40, Some(16), None, 50.0),
        (4, 1, 128, 40, 900, Some(512), Some(512), 0.0),
        (2, 1, 64, 16, 0, None, None, 0.0),
    ];
    for &(heads, kvh, d, n, qp, window, ring, softcap) in cases {
        let extent = ring.map_or(qp as usize + n, |r| r as usize);
        let mut mem = HostMemory::default();
        let p = params(heads, kvh, d, qp, window, ring, softcap, extent);
        let nd = case(
            &mut rng,
            &mut mem,
            DType::F16,
            p,
            n,
            extent,
            extent,
            DType::F32,
        );
        let want = reference_out(&nd, &mem, extent);
        poison_outputs(&nd, &mut mem);
        let got: Vec<Vec<u8>> = run_fast(g, &nd, &mem, vec![qp, extent as u32], 2)
            .into_iter()
            .map(|mut outs| outs.remove(0))
            .collect();
        let what = format!(
            "h{heads}/{kvh} d{d} n={n} pos={qp} window={window:?} ring={ring:?} softcap={softcap}"
        );
        let values: &[f32] = bytemuck::cast_slice(&got[0]);
        let mut worst = 0f32;
        for (gs, ws) in values.chunks(d).zip(want.chunks(d)) {
            let scale = ws.iter().fold(1e-3f32, |m, v| m.max(v.abs()));
            let err = gs
                .iter()
                .zip(ws)
                .map(|(a, b)| (a - b).abs())
                .fold(
                    0f32,
                    |m, e| if e.is_nan() { f32::INFINITY } else { m.max(e) },
                );
            worst = worst.max(err / scale);
        }
        eprintln!("NOTE fast prefill attention {what}: worst error / row max {worst:.2e}");
        if worst > PREFILL_TOLERANCE {
            failures.push(format!("{what}: worst error / row max {worst:e}"));
        }
        if got[0] != got[1] {
            failures.push(format!("{what}: a second launch gave other bits"));
        }
    }
    assert!(
        failures.is_empty(),
        "prefill attention:\n{}",
        failures.join("\n")
    );
}
