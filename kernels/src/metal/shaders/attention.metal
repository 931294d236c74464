// Causal grouped-query attention over weft's token-major KV cache
// (`[kv_rows, kv_heads * head_dim]`, f32 or f16, plain or ring-shaped,
// optional sliding window and logit soft-capping), the semantics of
// `weft_ops::reference::attention`.
//
// One threadgroup per (query head, query row); its four simdgroups split
// the visible cache slots, each keeping an online softmax (running max,
// running sum, weighted values in registers: lane l holds dims l, l + 32,
// ... up to WEFT_ATTN_DIMS_PER_LANE of them), merged at the end through
// threadgroup memory.

#define WEFT_ATTN_SIMDGROUPS 4u
#define WEFT_ATTN_DIMS_PER_LANE 8u
#define WEFT_ATTN_MAX_HEAD_DIM 256u

struct WeftAttentionParams {
    uint n_q;        // query rows
    uint heads;      // query heads per row
    uint kv_heads;
    uint head_dim;
    uint kv_rows;    // rows of the cache view
    uint q_position; // position of query row 0
    uint window;     // 0: none
    uint ring;       // 0: not a ring
    float scale;
    float softcap;   // 0: off
};

template <typename KV>
static inline void weft_attention_impl(
    device const float *q, device const KV *k, device const KV *v,
    device float *o, constant WeftAttentionParams &p,
    threadgroup float *tg_m, threadgroup float *tg_l, threadgroup float *tg_acc,
    uint head, uint row, uint sg, uint lane) {
    const uint d = p.head_dim;
    const uint group = p.heads / p.kv_heads;
    const uint kvh = head / group;
    const uint q_stride = p.heads * d;
    const uint kv_stride = p.kv_heads * d;
    const uint end = p.q_position + p.n_q;
    const uint pos = p.q_position + row;

    float qv[WEFT_ATTN_DIMS_PER_LANE];
    float acc[WEFT_ATTN_DIMS_PER_LANE];
    for (uint j = 0u; j < WEFT_ATTN_DIMS_PER_LANE; ++j) {
        const uint e = lane + 32u * j;
        qv[j] = e < d ? q[row * q_stride + head * d + e] : 0.0f;
        acc[j] = 0.0f;
    }

    // Candidate slots: a plain cache holds position s in slot s (slots
    // below `end`); a ring of R slots holds in slot s the latest position
    // below `end` congruent to s.
    uint slots = min(p.kv_rows, end);
    if (p.ring != 0u) {
        slots = min(slots, p.ring);
    }
    float m = -INFINITY;
    float l = 0.0f;
    for (uint s = sg; s < slots; s += WEFT_ATTN_SIMDGROUPS) {
        const uint c = p.ring != 0u ? s + (end - 1u - s) / p.ring * p.ring : s;
        if (c > pos || (p.window != 0u && pos - c >= p.window)) {
            continue;
        }
        device const KV *kr = k + s * kv_stride + kvh * d;
        float partial = 0.0f;
        for (uint j = 0u; j < WEFT_ATTN_DIMS_PER_LANE; ++j) {
            const uint e = lane + 32u * j;
            if (e < d) {
                partial += qv[j] * float(kr[e]);
            }
        }
        float score = simd_sum(partial) * p.scale;
        if (p.softcap > 0.0f) {
            score = p.softcap * precise::tanh(score / p.softcap);
        }
        const float m_new = max(m, score);
        const float alpha = exp(m - m_new);
        const float beta = exp(score - m_new);
        l = l * alpha + beta;
        device const KV *vr = v + s * kv_stride + kvh * d;
        for (uint j = 0u; j < WEFT_ATTN_DIMS_PER_LANE; ++j) {
            const uint e = lane + 32u * j;
            if (e < d) {
                acc[j] = acc[j] * alpha + beta * float(vr[e]);
            }
        }
        m = m_new;
    }

    if (lane == 0u) {
        tg_m[sg] = m;
        tg_l[sg] = l;
    }
    for (uint j = 0u; j < WEFT_ATTN_DIMS_PER_LANE; ++j) {
        const uint e = lane + 32u * j;
        if (e < d) {
            tg_acc[sg * WEFT_ATTN_MAX_HEAD_DIM + e] = acc[j];
        }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (sg != 0u) {
        return;
    }
    float mx = -INFINITY;
    for (uint g = 0u; g < WEFT_ATTN_SIMDGROUPS; ++g) {
        mx = max(mx, tg_m[g]);
    }
    float factor[WEFT_ATTN_SIMDGROUPS];
    float total = 0.0f;
    for (uint g = 0u; g < WEFT_ATTN_SIMDGROUPS; ++g) {
        // A simdgroup that saw no visible slot contributes nothing.
        factor[g] = tg_m[g] == -INFINITY ? 0.0f : exp(tg_m[g] - mx);
        total += tg_l[g] * factor[g];
    }
    const float inv = total > 0.0f ? 1.0f / total : 0.0f;
    for (uint j = 0u; j < WEFT_ATTN_DIMS_PER_LANE; ++j) {
        const uint e = lane + 32u * j;
        if (e < d) {
            float sum = 0.0f;
            for (uint g = 0u; g < WEFT_ATTN_SIMDGROUPS; ++g) {
                sum += tg_acc[g * WEFT_ATTN_MAX_HEAD_DIM + e] * factor[g];
            }
            o[row * q_stride + head * d + e] = sum * inv;
        }
    }
}

kernel void weft_attention_f32kv(
    device const float *q [[buffer(0)]],
    device const float *k [[buffer(1)]],
    device const float *v [[buffer(2)]],
    device float *o [[buffer(3)]],
    constant WeftAttentionParams &p [[buffer(4)]],
    uint2 tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]) {
    threadgroup float tg_m[WEFT_ATTN_SIMDGROUPS];
    threadgroup float tg_l[WEFT_ATTN_SIMDGROUPS];
    threadgroup float tg_acc[WEFT_ATTN_SIMDGROUPS * WEFT_ATTN_MAX_HEAD_DIM];
    weft_attention_impl<float>(q, k, v, o, p, tg_m, tg_l, tg_acc, tg.x, tg.y, sg, lane);
}

kernel void weft_attention_f16kv(
    device const float *q [[buffer(0)]],
    device const half *k [[buffer(1)]],
    device const half *v [[buffer(2)]],
    device float *o [[buffer(3)]],
    constant WeftAttentionParams &p [[buffer(4)]],
    uint2 tg [[threadgroup_position_in_grid]],
    uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]) {
    threadgroup float tg_m[WEFT_ATTN_SIMDGROUPS];
    threadgroup float tg_l[WEFT_ATTN_SIMDGROUPS];
    threadgroup float tg_acc[WEFT_ATTN_SIMDGROUPS * WEFT_ATTN_MAX_HEAD_DIM];
    weft_attention_impl<half>(q, k, v, o, p, tg_m, tg_l, tg_acc, tg.x, tg.y, sg, lane);
}
