//! The fusion pass: fused pairs compute the same bits as the unfused
//! recording, with fewer nodes and levels; intermediates that something
//! else reads (or that live outside an ended pool scope) are never fused away.

use weft_ops::{Builder, DType, RopeMode, RopeParams, Tensor};
use weft_runtime::{Device, DiagnosticsConfig, ExecutorConfig, GraphExecutor, PoolScope};

fn executor(fuse: bool) -> GraphExecutor {
    let config = ExecutorConfig {
        threads: 2,
        fuse,
        diagnostics: DiagnosticsConfig::checked(),
        ..Default::default()
    };
    GraphExecutor::with_config(Device::Cpu, config).expect("executor")
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| (((i as u32 * 2654435761u32) ^ seed) % 1000) as f32 / 400.0 - 1.2)
        .collect()
}

/// A two-layer residual block with every fusable pattern. Returns the
/// outputs read back and the node count after the pass.
fn run(fuse: bool, tap: bool) -> (Vec<Vec<u8>>, usize, usize) {
    let mut exec = executor(fuse);
    let (n, d, ffn) = (5, 64, 96);
    let alloc = |exec: &mut GraphExecutor, dims: &[usize], name: &str, seed: u32| -> Tensor {
        let t = exec.alloc_tensor(DType::F32, dims, name).expect("alloc");
        let v = values(dims.iter().product(), seed);
        exec.write_bytes(&t, bytemuck::cast_slice(&v))
            .expect("write");
        t
    };
    let x = alloc(&mut exec, &[n, d], "x", 1);
    let norm_w = alloc(&mut exec, &[d], "norm_w", 2);
    let wq = alloc(&mut exec, &[d, d], "wq", 3);
    let w_gate = alloc(&mut exec, &[ffn, d], "w_gate", 4);
    let w_up = alloc(&mut exec, &[ffn, d], "w_up", 5);
    let w_down = alloc(&mut exec, &[d, ffn], "w_down", 6);
    let cache = exec
        .alloc_tensor(DType::F16, &[16, d], "cache")
        .expect("cache");
    let out = exec.alloc_tensor(DType::F32, &[n, d], "out").expect("out");
    // Q8_0 weights make the matmuls quantize their activations.
    let quant = |exec: &mut GraphExecutor, w: Tensor, name: &str| -> Tensor {
        let v = exec.read_f32(&w).expect("read");
        let k = w.cols();
        let rb = DType::Q8_0.row_bytes(k).expect("blocks");
        let mut bytes = vec![0u8; rb * w.rows()];
        for (src, dst) in v.chunks(k).zip(bytes.chunks_mut(rb)) {
            weft_ops::quant::quantize_row(DType::Q8_0, src, dst).expect("quantize");
        }
        let t = exec
            .alloc_tensor(DType::Q8_0, &[w.rows(), k], name)
            .expect("alloc");
        exec.write_bytes(&t, &bytes).expect("write");
        t
    };
    let (wq, w_gate, w_up, w_down) = (
        quant(&mut exec, wq, "wq8"),
        quant(&mut exec, w_gate, "g8"),
        quant(&mut exec, w_up, "u8"),
        quant(&mut exec, w_down, "d8"),
    );
    let before = exec.counters();
    let mut s = exec.begin_recorded();
    let positions = s
        .upload_i32(&(3..3 + n as i32).collect::<Vec<_>>(), "positions")
        .expect("positions");
    for layer in 0..2u32 {
        s.set_layer(Some(layer));
        s.begin_pool_scope(PoolScope::PrefillLayer);
        let h = s.rms_norm(x, norm_w, 1e-5, "norm").expect("norm");
        if tap {
            // A second reader of the norm output: it must stay.
            let t = s.scale(h, 1.0, "tap").expect("tap");
            s.add_into(x, t, "tap_use").expect("tap use");
        }
        let hq = s.activations_for(h, DType::Q8_0, "norm.act").expect("act");
        let q = s.matmul(hq, wq, "q").expect("q");
        let rope = RopeParams::plain(RopeMode::Normal, 16, 16, 10000.0);
        let k = s.rope(q, positions, rope, "rope").expect("rope");
        s.set_rows(k, cache, 3, None, "cache_write")
            .expect("set_rows");
        let g = s.matmul(hq, w_gate, "gate").expect("gate");
        let u = s.matmul(hq, w_up, "up").expect("up");
        let m = s.silu_mul(g, u, "silu").expect("silu");
        let dn = s.matmul(m, w_down, "down").expect("down");
        s.add_into(x, dn, "residual").expect("add");
        s.end_pool_scope().expect("scope");
    }
    s.set_layer(None);
    let h = s
        .rms_norm(x, norm_w, 1e-5, "final_norm")
        .expect("final norm");
    s.push(weft_ops::Op::Copy, vec![h], vec![out], "out")
        .expect("copy");
    s.finish_with_reorder().expect("run");
    let c = exec.counters() - before;
    let outputs = vec![
        exec.read_bytes(&cache).expect("cache"),
        exec.read_bytes(&out).expect("out"),
        exec.read_bytes(&x).expect("x"),
    ];
    (outputs, c.dispatches as usize, c.barriers as usize)
}

#[test]
fn fused_and_unfused_recordings_agree_and_fusion_removes_nodes() {
    let (fused, fused_nodes, fused_barriers) = run(true, false);
    let (plain, plain_nodes, plain_barriers) = run(false, false);
    assert_eq!(fused, plain, "fusion changed a result");
    assert!(
        fused_nodes < plain_nodes,
        "fusion removed nothing: {fused_nodes} vs {plain_nodes}"
    );
    assert!(
        fused_barriers < plain_barriers,
        "fusion saved no barrier: {fused_barriers} vs {plain_barriers}"
    );
    eprintln!(
        "nodes {plain_nodes} -> {fused_nodes}, barriers {plain_barriers} -> {fused_barriers}"
    );
}

#[test]
fn an_intermediate_with_another_reader_is_kept() {
    let (fused, _, _) = run(true, true);
    let (plain, _, _) = run(false, true);
    assert_eq!(fused, plain);
}
