//! The mutations of each model file and what each must do: SmolLM2's
//! metadata and tensor table, the DeepSeek-V4 tiny fixture's, Gemma 3's.

use super::*;

pub(super) fn smollm2_cases() -> Vec<Case> {
    use Edit::*;
    use Expect::*;
    let mut c = Vec::new();
    // Layers: none, more than the file holds, 2^32 - 1; fewer than it holds.
    refused_counts("llama.block_count", &[0, 31, BIG], &mut c);
    c.push(case(
        vec![Set("llama.block_count", u(29))],
        Refused(vec!["blk.29."]),
    ));
    c.push(case(
        vec![Set("llama.block_count", u(1))],
        Refused(vec!["blk.1."]),
    ));
    for v in [Value::U64(1 << 40), Value::I32(-1), Value::from("thirty")] {
        c.push(case(
            vec![Set("llama.block_count", v)],
            Refused(vec!["llama.block_count"]),
        ));
    }
    // Widths: 0 and 1 everywhere, 2^32 - 1 once.
    for (k, also) in [
        ("llama.embedding_length", "token_embd"),
        ("llama.feed_forward_length", "ffn_"),
        ("llama.attention.head_count", "heads"),
        ("llama.attention.head_count_kv", "attn_k"),
    ] {
        c.push(case(vec![Set(k, u(0))], Refused(vec![k])));
        c.push(case(vec![Set(k, u(1))], Refused(vec![k, also])));
    }
    refused_counts("llama.feed_forward_length", &[BIG], &mut c);
    c.push(case(
        vec![Set("llama.attention.key_length", u(0))],
        Refused(vec!["llama.attention.key_length"]),
    ));
    c.push(case(
        vec![Set("llama.attention.key_length", u(32))],
        Refused(vec!["attn_q", "attn_k", "llama.rope.dimension_count"]),
    ));
    refused_counts("llama.rope.dimension_count", &[0, 1, 63, 66], &mut c);
    // Vocabulary sizes that disagree with the tensors and the tokenizer.
    refused_counts("llama.vocab_size", &[0, 49151, BIG], &mut c);
    c.push(case(
        vec![Shorten("tokenizer.ggml.tokens")],
        Refused(vec!["tokenizer.ggml.tokens", "vocab"]),
    ));
    c.push(case(
        vec![Shorten("tokenizer.ggml.token_type")],
        Refused(vec!["tokenizer.ggml.token_type"]),
    ));
    // Floats.
    refused_floats(
        "llama.attention.layer_norm_rms_epsilon",
        &BAD_FLOATS,
        &mut c,
    );
    refused_floats("llama.rope.freq_base", &BAD_FLOATS, &mut c);
    for v in [f32::NAN, 0.0] {
        c.push(case(
            vec![
                Set("llama.rope.scaling.type", Value::from("linear")),
                Set("llama.rope.scaling.factor", f(v)),
            ],
            Refused(vec!["llama.rope.scaling.factor"]),
        ));
    }
    c.push(case(
        vec![Set("llama.rope.freq_base", Value::F64(1e300))],
        Refused(vec!["llama.rope.freq_base"]),
    ));
    // Special ids and token types.
    for k in ["tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"] {
        refused_counts(k, &[49152, BIG], &mut c);
    }
    for k in [
        "tokenizer.ggml.unknown_token_id",
        "tokenizer.ggml.padding_token_id",
        "tokenizer.ggml.eot_token_id",
    ] {
        refused_counts(k, &[49152], &mut c);
    }
    for v in [7, -1] {
        c.push(case(
            vec![SetElement("tokenizer.ggml.token_type", 5, Value::I32(v))],
            Refused(vec!["tokenizer.ggml.token_type"]),
        ));
    }
    c.push(case(
        vec![Set(
            "tokenizer.ggml.scores",
            Value::Array(Array::F32(vec![f32::NAN; 49152])),
        )],
        Refused(vec!["tokenizer.ggml.scores"]),
    ));
    // Tensors removed, added, aliased.
    for name in [
        "blk.7.attn_k.weight",
        "output_norm.weight",
        "blk.29.ffn_down.weight",
    ] {
        c.push(case(vec![DropTensor(name)], Refused(vec![name])));
    }
    c.push(case(
        vec![AddTensor("blk.3.attn_extra.weight", 8)],
        Refused(vec!["blk.3.attn_extra.weight"]),
    ));
    c.push(case(
        vec![AddTensor("blk.30.attn_norm.weight", 576)],
        Refused(vec!["blk.30.attn_norm.weight"]),
    ));
    c.push(case(
        vec![AddTensor("rope_freqs.weight", 32)],
        Refused(vec!["rope_freqs.weight"]),
    ));
    c.push(case(
        vec![Overlap("blk.2.attn_q.weight", "blk.2.attn_k.weight")],
        Refused(vec!["blk.2.attn_q.weight"]),
    ));
    c.push(case(
        vec![Overlap("output_norm.weight", "blk.29.ffn_norm.weight")],
        Refused(vec!["output_norm.weight", "blk.29.ffn_norm.weight"]),
    ));
    // Harmless: what the metadata repeats or only names.
    c.push(case(vec![Remove("llama.vocab_size")], Same));
    c.push(case(vec![Remove("llama.rope.dimension_count")], Same));
    c.push(case(vec![Set("llama.context_length", u(BIG))], Same));
    c.push(case(
        vec![Set("general.name", Value::from("renamed"))],
        Same,
    ));
    c.push(case(
        vec![
            Set("llama.rope.scaling.type", Value::from("linear")),
            Set("llama.rope.scaling.factor", f(1.0)),
        ],
        Same,
    ));
    c
}

pub(super) fn dsv4_cases() -> Vec<Case> {
    use Edit::*;
    use Expect::*;
    let mut c = Vec::new();
    refused_counts(
        "deepseek4.hyper_connection.sinkhorn_iterations",
        &[0, 1001, BIG],
        &mut c,
    );
    refused_counts(
        "deepseek4.attention.indexer.top_k",
        &[0, 262_145, BIG],
        &mut c,
    );
    refused_counts("deepseek4.block_count", &[0, BIG], &mut c);
    c.push(case(
        vec![Set("deepseek4.block_count", u(5))],
        Refused(vec!["blk.5."]),
    ));
    refused_counts("deepseek4.hyper_connection.count", &[0], &mut c);
    c.push(case(
        vec![Set("deepseek4.hyper_connection.count", u(3))],
        Refused(vec!["hc_attn_fn", "output_hc"]),
    ));
    refused_counts("deepseek4.expert_count", &[0], &mut c);
    refused_counts("deepseek4.expert_used_count", &[0, 9], &mut c);
    refused_counts("deepseek4.hash_layer_count", &[7], &mut c);
    refused_counts("deepseek4.attention.sliding_window", &[0], &mut c);
    refused_counts("deepseek4.rope.dimension_count", &[0, 15, 66], &mut c);
    refused_counts("deepseek4.vocab_size", &[0], &mut c);
    c.push(case(
        vec![Set("deepseek4.vocab_size", u(511))],
        Refused(vec!["deepseek4.vocab_size", "token_embd.weight"]),
    ));
    c.push(case(
        vec![SetElement("deepseek4.attention.compress_ratios", 3, u(BIG))],
        Refused(vec!["deepseek4.attention.compress_ratios"]),
    ));
    c.push(case(
        vec![SetElement("deepseek4.attention.compress_ratios", 3, u(8))],
        Refused(vec!["attn_compressor"]),
    ));
    refused_floats(
        "deepseek4.attention.layer_norm_rms_epsilon",
        &BAD_FLOATS,
        &mut c,
    );
    refused_floats("deepseek4.hyper_connection.epsilon", &BAD_FLOATS, &mut c);
    refused_floats("deepseek4.expert_weights_scale", &BAD_FLOATS, &mut c);
    refused_floats("deepseek4.rope.scaling.factor", &[0.0, f32::NAN], &mut c);
    refused_floats("deepseek4.rope.freq_base", &[0.0, f32::NAN], &mut c);
    refused_floats(
        "deepseek4.attention.compress_rope_freq_base",
        &[-1.0],
        &mut c,
    );
    refused_floats("deepseek4.rope.scaling.yarn_beta_fast", &[f32::NAN], &mut c);
    for v in [f32::NAN, -1.0] {
        c.push(case(
            vec![SetElement("deepseek4.swiglu_clamp_exp", 2, f(v))],
            Refused(vec!["deepseek4.swiglu_clamp_exp"]),
        ));
    }
    refused_counts("tokenizer.ggml.eos_token_id", &[512], &mut c);
    c.push(case(
        vec![SetElement("tokenizer.ggml.token_type", 9, Value::I32(99))],
        Refused(vec!["tokenizer.ggml.token_type"]),
    ));
    c.push(case(
        vec![DropTensor("blk.3.attn_sinks.weight")],
        Refused(vec!["blk.3.attn_sinks.weight"]),
    ));
    c.push(case(
        vec![AddTensor("blk.2.mystery.weight", 4)],
        Refused(vec!["blk.2.mystery.weight"]),
    ));
    c.push(case(
        vec![Overlap("blk.1.attn_q_b.weight", "blk.1.attn_kv.weight")],
        Refused(vec!["blk.1.attn_q_b.weight", "blk.1.attn_kv.weight"]),
    ));
    // Harmless.
    c.push(case(vec![Remove("deepseek4.vocab_size")], Same));
    c.push(case(
        vec![Set("general.name", Value::from("renamed"))],
        Same,
    ));
    c.push(case(
        vec![Set("deepseek4.hyper_connection.sinkhorn_iterations", u(20))],
        Same,
    ));
    c
}

pub(super) fn gemma3_cases() -> Vec<Case> {
    use Edit::*;
    use Expect::*;
    let mut c = Vec::new();
    refused_counts("gemma3.block_count", &[0, 19, BIG], &mut c);
    c.push(case(
        vec![Set("gemma3.block_count", u(17))],
        Refused(vec!["blk.17."]),
    ));
    refused_counts("gemma3.attention.sliding_window", &[0, BIG], &mut c);
    refused_counts("gemma3.rope.dimension_count", &[255], &mut c);
    refused_floats(
        "gemma3.attention.layer_norm_rms_epsilon",
        &[f32::NAN],
        &mut c,
    );
    refused_floats("gemma3.rope.freq_base", &[-1.0], &mut c);
    refused_floats("gemma3.rope.freq_base_swa", &[0.0], &mut c);
    refused_counts("tokenizer.ggml.bos_token_id", &[262_144], &mut c);
    c.push(case(
        vec![SetElement("tokenizer.ggml.token_type", 7, Value::I32(9))],
        Refused(vec!["tokenizer.ggml.token_type"]),
    ));
    c.push(case(
        vec![DropTensor("blk.4.post_ffw_norm.weight")],
        Refused(vec!["blk.4.post_ffw_norm.weight"]),
    ));
    c.push(case(
        vec![AddTensor("blk.0.attn_sinks.weight", 4)],
        Refused(vec!["blk.0.attn_sinks.weight"]),
    ));
    // Harmless: the defaults, spelled out.
    c.push(case(
        vec![Set("general.name", Value::from("renamed"))],
        Same,
    ));
    c.push(case(
        vec![Set("gemma3.attention.sliding_window_pattern", u(6))],
        Same,
    ));
    c.push(case(
        vec![Set("gemma3.final_logit_softcapping", f(0.0))],
        Same,
    ));
    c
}
