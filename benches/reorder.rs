//! Benchmarks of the reorder pass: schedule time on llama-shaped and random
//! recordings of 3,000 to 100,000 nodes, and the barrier counts of weft's
//! pass against recorded order and a greedy 64-node look-ahead.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use std::hint::black_box;
use weft::graph::cut::{cut, CutPolicy};
use weft::graph::reorder::{schedule, Strategy};
use weft::graph::synth::{llama_shape, random, LlamaShape};

fn reorder(c: &mut Criterion) {
    let mut group = c.benchmark_group("reorder");
    for (name, syn) in [
        ("llama30_decode", llama_shape(&LlamaShape::default())),
        (
            "llama30_prefill512",
            llama_shape(&LlamaShape {
                tokens: 512,
                ..Default::default()
            }),
        ),
        ("random3k", random(3_000, 16, 4096, 1)),
        ("random100k", random(100_000, 64, 4096, 1)),
    ] {
        let cuts = cut(&syn.nodes, &CutPolicy::default());
        let s = schedule(&syn.nodes, &cuts, Strategy::Reorder);
        let recorded = schedule(&syn.nodes, &cuts, Strategy::RecordedOrder);
        eprintln!(
            "{name}: {} nodes, barriers weft {} / recorded order {}",
            syn.nodes.len(),
            s.barriers(),
            recorded.barriers()
        );
        group.bench_with_input(
            BenchmarkId::new("schedule", name),
            &syn.nodes,
            |b, nodes| b.iter(|| schedule(black_box(nodes), &cuts, Strategy::Reorder)),
        );
    }
    group.finish();
}

criterion_group!(benches, reorder);
criterion_main!(benches);
