//! The executor end to end on the CPU: reordered execution is bit-identical
//! to recorded order on random recordings of real ops, hf2q's API
//! contract holds, and failures surface with the failing node's label.

use proptest::prelude::*;
use weft_graph::ByteRange;
use weft_ops::{Builder, DType, Op, OpNode, Tensor};
use weft_runtime::{
    Device, DiagnosticsConfig, ExecutorConfig, Fault, GraphExecutor, SubmissionChain,
};

const ROWS: usize = 48;
const COLS: usize = 32;

fn executor(threads: usize, reorder: bool) -> GraphExecutor {
    let config = ExecutorConfig {
        threads,
        reorder,
        diagnostics: DiagnosticsConfig::checked(),
        ..Default::default()
    };
    GraphExecutor::with_config(Device::Cpu, config).unwrap()
}

/// A random op over row views of a few shared buffers.
#[derive(Clone, Debug)]
struct RandomOp {
    kind: u8,
    a: (usize, usize),
    b: (usize, usize),
    out: (usize, usize),
    rows: usize,
}

fn arb_op(buffers: usize) -> impl Strategy<Value = RandomOp> {
    (
        0u8..6,
        0..buffers,
        0..buffers,
        0..buffers,
        1usize..12,
        0..ROWS,
        0..ROWS,
        0..ROWS,
    )
        .prop_map(move |(kind, ba, bb, bo, rows, ra, rb, ro)| RandomOp {
            kind,
            a: (ba, ra.min(ROWS - rows)),
            b: (bb, rb.min(ROWS - rows)),
            out: (bo, ro.min(ROWS - rows)),
            rows,
        })
}

fn view(buffers: &[Tensor], (b, r): (usize, usize), rows: usize) -> Tensor {
    buffers[b].rows_view(r, rows).unwrap()
}

/// Records the ops whose output does not overlap their own inputs.
fn record(
    exec: &mut GraphExecutor,
    bufs: &[Tensor],
    weights: Tensor,
    ops: &[RandomOp],
    recorded: bool,
) -> (usize, usize) {
    let mut s = if recorded {
        exec.begin_recorded()
    } else {
        exec.begin()
    };
    for (i, op) in ops.iter().enumerate() {
        let (a, b, out) = (
            view(bufs, op.a, op.rows),
            view(bufs, op.b, op.rows),
            view(bufs, op.out, op.rows),
        );
        if out.range().overlaps(&a.range()) || out.range().overlaps(&b.range()) {
            continue;
        }
        s.set_layer(Some(i as u32 / 8));
        let (kind, inputs) = match op.kind {
            0 => (Op::Add, vec![a, b]),
            1 => (Op::Mul, vec![a, b]),
            2 => (Op::Scale { factor: 0.5 }, vec![a]),
            3 => (Op::SiluMul, vec![a, b]),
            4 => (Op::RmsNorm { eps: 1e-5 }, vec![a, weights]),
            _ => (Op::Softmax { scale: 1.0 }, vec![a]),
        };
        s.push(kind, inputs, vec![out], format!("op{i}")).unwrap();
    }
    if recorded {
        let (reordered, barriers) = s.finish_with_reorder().unwrap();
        (reordered, barriers)
    } else {
        s.finish().unwrap();
        (0, 0)
    }
}

fn run(ops: &[RandomOp], buffers: usize, threads: usize, recorded: bool) -> Vec<Vec<u8>> {
    let mut exec = executor(threads, true);
    let bufs: Vec<Tensor> = (0..buffers)
        .map(|i| {
            exec.alloc_tensor(DType::F32, &[ROWS, COLS], &format!("b{i}"))
                .unwrap()
        })
        .collect();
    let weights = exec.alloc_tensor(DType::F32, &[COLS], "w").unwrap();
    let w: Vec<f32> = (0..COLS).map(|i| 0.5 + i as f32 / COLS as f32).collect();
    exec.write_bytes(&weights, bytemuck::cast_slice(&w))
        .unwrap();
    for (k, t) in bufs.iter().enumerate() {
        let v: Vec<f32> = (0..ROWS * COLS)
            .map(|i| ((i * 7 + k * 13) % 29) as f32 / 10.0 - 1.4)
            .collect();
        exec.write_bytes(t, bytemuck::cast_slice(&v)).unwrap();
    }
    record(&mut exec, &bufs, weights, ops, recorded);
    bufs.iter().map(|t| exec.read_bytes(t).unwrap()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn reordered_execution_is_bit_identical_to_recorded_order(ops in proptest::collection::vec(arb_op(4), 1..40)) {
        let eager = run(&ops, 4, 1, false);
        prop_assert_eq!(&run(&ops, 4, 2, true), &eager);
        prop_assert_eq!(&run(&ops, 4, 3, false), &eager);
    }
}

#[test]
fn missing_ranges_are_refused_with_op_and_label() {
    let mut exec = executor(1, true);
    let x = exec.alloc_tensor(DType::F32, &[4, 8], "x").unwrap();
    let y = exec.alloc_tensor(DType::F32, &[4, 8], "y").unwrap();
    let node = OpNode::new(Op::Scale { factor: 2.0 }, vec![x], vec![y]);
    let mut s = exec.begin_recorded();
    let err = s
        .record_with_ranges(
            node.clone(),
            "blk.7.attn_scale".into(),
            None,
            Some(vec![y.range()]),
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("scale") && err.contains("blk.7.attn_scale"),
        "{err}"
    );
    let err = s
        .record_with_ranges(
            node.clone(),
            "blk.7.other".into(),
            Some(vec![x.range()]),
            None,
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("blk.7.other"), "{err}");
    drop(s);
    // Eager sessions accept unknown ranges and fence the node.
    let mut s = exec.begin();
    s.record_with_ranges(node, "fenced".into(), None, None)
        .unwrap();
    s.finish().unwrap();
}

#[test]
fn declared_ranges_must_cover_inputs_and_stay_in_bounds() {
    let mut exec = executor(1, true);
    let x = exec.alloc_tensor(DType::F32, &[4, 8], "x").unwrap();
    let y = exec.alloc_tensor(DType::F32, &[4, 8], "y").unwrap();
    let mut s = exec.begin_recorded();
    let short = ByteRange::new(x.buffer, 0, 16);
    let err = s
        .record_with_ranges(
            OpNode::new(Op::Scale { factor: 2.0 }, vec![x], vec![y]),
            "short".into(),
            Some(vec![short]),
            Some(vec![y.range()]),
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("do not cover"), "{err}");
    let past = Tensor { offset: 64, ..x };
    let err = s
        .push(Op::Scale { factor: 2.0 }, vec![past], vec![y], "past")
        .unwrap_err()
        .to_string();
    assert!(err.contains("past the end"), "{err}");
}

#[test]
fn seed_contract_barriers_counters_and_drop() {
    let mut exec = executor(2, true);
    let a = exec.alloc_tensor(DType::F32, &[2, 16], "a").unwrap();
    let before = exec.counters();
    {
        let mut s = exec.begin();
        s.barrier(); // before any dispatch: a no-op
        let b = s.scale(a, 2.0, "b").unwrap();
        let c = s.scale(a, 3.0, "c").unwrap(); // no conflict: same level
        s.barrier(); // explicit: forces a level
        let _d = s.add(b, c, "d").unwrap();
        s.finish().unwrap();
    }
    let after = exec.counters() - before;
    assert_eq!(after.dispatches, 3);
    assert_eq!(after.barriers, 1);
    assert_eq!(after.commits, 1);
    assert_eq!(after.command_buffers, 1);
    assert_eq!(after.waits, 1);
    // Dropping an unfinished session runs nothing and leaks no scope.
    {
        let mut s = exec.begin_recorded();
        let _ = s.scale(a, 2.0, "dropped").unwrap();
    }
    assert_eq!(exec.counters().dispatches, 3);
    assert_eq!(exec.pool_stats().in_use, 0);
}

#[test]
fn commit_returns_before_drain_and_the_chain_reports_the_failing_label() {
    let mut exec = executor(2, true);
    let a = exec.alloc_tensor(DType::F32, &[64, 64], "a").unwrap();
    exec.config_mut().diagnostics.fault = Some(Fault {
        label: "blk.2.".into(),
        after: 1,
    });
    let mut chain = SubmissionChain::new();
    for layer in 0..4u32 {
        let mut s = exec.begin_recorded();
        s.set_layer(Some(layer));
        let x = s.scale(a, 1.5, format!("blk.{layer}.scale")).unwrap();
        let _ = s.silu_mul(x, a, format!("blk.{layer}.silu")).unwrap();
        chain.push(s.commit().unwrap());
    }
    let err = chain.drain().unwrap_err().to_string();
    assert!(
        err.contains("blk.2.silu") && err.contains("injected fault"),
        "{err}"
    );
    assert!(chain.is_empty());
}

#[test]
fn layers_per_command_buffer_cut_the_recording() {
    let mut exec = executor(2, true);
    exec.config_mut().cut.layers_per_cb = Some(2);
    let a = exec.alloc_tensor(DType::F32, &[8, 8], "a").unwrap();
    let before = exec.counters();
    let mut s = exec.begin_recorded();
    let mut x = a;
    for layer in 0..6 {
        s.set_layer(Some(layer));
        x = s.scale(x, 1.01, "scale").unwrap();
    }
    let inflight = s.commit().unwrap();
    assert_eq!(inflight.command_buffers(), 3);
    inflight.wait().unwrap();
    assert_eq!((exec.counters() - before).command_buffers, 3);
}

/// A named tensor is allocated once and handed back on later calls; asking
/// with another shape is an error; released, it is forgotten (its id may be
/// reused by another allocation).
#[test]
fn named_tensors_persist_until_released() {
    let mut exec = GraphExecutor::new(Device::Cpu).unwrap();
    let a = exec.named_tensor("ids", DType::I32, &[1]).unwrap();
    let b = exec.named_tensor("ids", DType::I32, &[1]).unwrap();
    assert_eq!(a, b);
    let err = exec.named_tensor("ids", DType::F32, &[2]).unwrap_err();
    assert!(err.to_string().contains("`ids`"), "{err}");
    exec.release_buffer(a.buffer);
    let other = exec.alloc_tensor(DType::F32, &[64], "other").unwrap();
    let c = exec.named_tensor("ids", DType::I32, &[1]).unwrap();
    assert_ne!(c.buffer, other.buffer);
    exec.write_bytes(&c, &7i32.to_le_bytes()).unwrap();
    assert_eq!(exec.read_i32(&c).unwrap(), vec![7]);
}
