// weft CUDA kernels: shared helpers.
//
// Compiled by NVRTC with --fmad=false: the compiler never fuses a multiply
// and an add on its own; every fused multiply-add below is written out
// (`__fmaf_rn`, `__fma_rn`) where weft's CPU kernels (and gcc's contraction
// of ggml's C) fuse. Division and square root are IEEE (no fast math),
// subnormals are kept (no flush to zero). No CUDA headers are included, so
// the source compiles with any NVRTC without include paths.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef short i16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
typedef long long i64;

#define DEV static __device__ __forceinline__
#define NEG_INF (__int_as_float(0xff800000))
#define POS_INF (__int_as_float(0x7f800000))
#define NONE_U32 0xffffffffu

// ---- programmatic dependent launch ------------------------------------------

// The contract every kernel keeps: before this wait it reads only what no
// kernel still running may write (weights no command buffer writes, the
// step scalars the host copied before the launch, cache rows of earlier
// steps), and writes nothing; a kernel may then start while the kernel
// before it still waits itself (pdl_trigger).
//
// Every kernel calls this first. Launched with programmatic stream
// serialization (launch.rs, on sm_90 and later), a kernel may start while the
// kernel before it finishes: it waits here until that one has completed and
// its writes are visible, then lets the next kernel launch. So the launch
// latency overlaps the previous kernel's tail, never its work. Launched
// without it, both instructions return at once.
DEV void pdl_sync() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Lets the next kernel launch before this one waits (its own pdl_sync
// then waits on this one as before): only where the kernels that may
// follow read nothing before their wait that a kernel still running could
// write (weights, step scalars, earlier steps' cache rows).
DEV void pdl_trigger() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Asks the L2 cache for the lines of [p, p + bytes), this thread's share of
// them when `nt` threads (numbered `t`) share the range. A hint, not a
// read: nothing comes into registers, so it may run before pdl_sync on
// memory the kernels before are still writing (L2 is where their writes
// land). Kernels issue it for what they will read once they have waited.
DEV void prefetch_l2(const void* p, size_t bytes, int t, int nt) {
    const size_t first = (size_t)p & ~(size_t)127, end = (size_t)p + bytes;
    for (size_t a = first + (size_t)t * 128; a < end; a += (size_t)nt * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
}

// ---- f16 / bf16 conversions ----------------------------------------------

DEV float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// f32 -> f16, round to nearest even (F16C's and half's rounding).
DEV u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// The f32 value of f16(x): what an f16 accumulator holds.
DEV float round16(float f) { return h2f(f2h(f)); }

DEV float bf2f(u16 b) { return __uint_as_float(((u32)b) << 16); }

// f32 -> bf16 as `half::bf16::from_f32` and ggml: round to nearest even,
// NaNs quieted.
DEV u16 f2bf(float f) {
    u32 x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (u16)((x >> 16) | 0x40u);
    const u32 round_bit = 0x8000u;
    if ((x & round_bit) != 0 && (x & (3u * round_bit - 1u)) != 0) return (u16)((x >> 16) + 1u);
    return (u16)(x >> 16);
}

// ---- unaligned little-endian loads ----------------------------------------

DEV u16 ld_u16(const u8* p) { return *(const u16*)p; }  // p is 2-aligned
DEV u32 ld_u32_a2(const u8* p) {                         // p is 2-aligned
    const u16* q = (const u16*)p;
    return (u32)q[0] | ((u32)q[1] << 16);
}
DEV u32 ld_u32_a4(const u8* p) { return *(const u32*)p; }
DEV float ld_f16(const u8* p) { return h2f(ld_u16(p)); }

// ---- asynchronous copies (sm_80+) ---------------------------------------------------

DEV u32 smem_addr(const void* p) {
    u64 a;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
    return (u32)a;
}
DEV void cp_async16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src));
}
DEV void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
DEV void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::); }
// Waits until at most one committed group of this thread's copies is
// still in flight (two-stage pipelines: the stage just issued).
DEV void cp_async_wait_one() { asm volatile("cp.async.wait_group 1;\n" ::); }

// ---- thread block clusters (sm_90) --------------------------------------------
// The cluster kernels (argmax_f32_cluster, mm_gate_up_silu_*_pair) are
// launched only on compute capability 9.0 or later (launch.rs's `sm90`);
// for earlier architectures they compile as plain kernels that trap, so
// the one program still builds there.

#if __CUDA_ARCH__ >= 900
#define CLUSTER_DIMS(n) __cluster_dims__(n, 1, 1)
#else
#define CLUSTER_DIMS(n)
#endif

DEV u32 cluster_rank() {
#if __CUDA_ARCH__ >= 900
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
#else
    __trap();
    return 0;
#endif
}

// An arrival that orders nothing: at a cluster kernel's entry, so that
// the wait after it (before any access to another block's shared memory)
// knows every block of the cluster has started.
DEV void cluster_arrive_relaxed() {
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#else
    __trap();
#endif
}
// The two halves of cluster_sync: stores before the arrival are visible to
// the cluster's blocks after their wait; a block may work between them.
DEV void cluster_arrive() {
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#else
    __trap();
#endif
}
DEV void cluster_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#else
    __trap();
#endif
}
// Every thread of every block of the cluster; shared-memory writes before
// it are visible to the cluster's blocks after it.
DEV void cluster_sync() {
    cluster_arrive();
    cluster_wait();
}
// A word of block `rank`'s shared memory at the address `p` has in this one.
DEV u32 cluster_ld_u32(const void* p, u32 rank) {
#if __CUDA_ARCH__ >= 900
    u32 remote, v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(p)), "r"(rank));
    asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(remote) : "memory");
    return v;
#else
    __trap();
    return 0;
#endif
}
// Stores a word into block `rank`'s shared memory at the address `p` has
// in this one.
DEV void cluster_st_u32(void* p, u32 rank, u32 v) {
#if __CUDA_ARCH__ >= 900
    u32 remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(p)), "r"(rank));
    asm volatile("st.shared::cluster.u32 [%0], %1;" ::"r"(remote), "r"(v) : "memory");
#else
    __trap();
#endif
}

// Stores a half word into block `rank`'s shared memory, as cluster_st_u32.
DEV void cluster_st_u16(void* p, u32 rank, u16 v) {
#if __CUDA_ARCH__ >= 900
    u32 remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(p)), "r"(rank));
    asm volatile("st.shared::cluster.u16 [%0], %1;" ::"r"(remote), "h"(v) : "memory");
#else
    __trap();
#endif
}

// ---- warp helpers -----------------------------------------------------------

#define FULL_MASK 0xffffffffu

DEV float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}
DEV int warp_sum_i(int v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

// ggml's hsum_float_8 over the 8 consecutive lanes of a group (lane k holds
// acc[k]): ((x0+x4) + (x2+x6)) + ((x1+x5) + (x3+x7)). Valid in the group's
// first lane.
DEV float hsum8_lanes(float v) {
    float t = v + __shfl_down_sync(FULL_MASK, v, 4, 8);  // t_i = x_i + x_{i+4}
    float u = t + __shfl_down_sync(FULL_MASK, t, 2, 8);  // u_0 = t0 + t2, u_1 = t1 + t3
    return u + __shfl_down_sync(FULL_MASK, u, 1, 8);     // u_0 + u_1
}

// `_mm512_reduce_add_ps` over 16 consecutive lanes (lane l holds x[l]):
// halves, quarters, pairs. Valid in the group's first lane.
DEV float reduce16_lanes(float v) {
    float a = v + __shfl_down_sync(FULL_MASK, v, 8, 16);
    float b = a + __shfl_down_sync(FULL_MASK, a, 4, 16);
    float c = b + __shfl_down_sync(FULL_MASK, b, 2, 16);
    return c + __shfl_down_sync(FULL_MASK, c, 1, 16);
}

// The same tree over 16 values held by one thread.
DEV float reduce16_regs(const float* x) {
    float t8[8];
#pragma unroll
    for (int i = 0; i < 8; i++) t8[i] = x[i] + x[i + 8];
    float t4[4];
#pragma unroll
    for (int i = 0; i < 4; i++) t4[i] = t8[i] + t8[i + 4];
    return (t4[0] + t4[2]) + (t4[1] + t4[3]);
}

// ---- K-quant helpers ---------------------------------------------------------

// Q8_K activation block: d (f32), qs[256] (i8), bsums[16] (i16).
#define Q8K_BYTES 292

DEV void q4k_scales_mins(const u8* s, int j, int* sc, int* mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// ---- glibc's expf ------------------------------------------------------------
// glibc 2.27+ `expf` (ARM optimized-routines, EXP2F_TABLE_BITS = 5), as the
// x86-64 `__expf_fma` variant computes it (the reduction `z - kd` fused).
// Checked against the host's `f32::exp` on all 2^32 inputs.

static __device__ const u64 EXP2F_TAB[32] = {
    0x3ff0000000000000ull, 0x3fefd9b0d3158574ull, 0x3fefb5586cf9890full, 0x3fef9301d0125b51ull,
    0x3fef72b83c7d517bull, 0x3fef54873168b9aaull, 0x3fef387a6e756238ull, 0x3fef1e9df51fdee1ull,
    0x3fef06fe0a31b715ull, 0x3feef1a7373aa9cbull, 0x3feedea64c123422ull, 0x3feece086061892dull,
    0x3feebfdad5362a27ull, 0x3feeb42b569d4f82ull, 0x3feeab07dd485429ull, 0x3feea47eb03a5585ull,
    0x3feea09e667f3bcdull, 0x3fee9f75e8ec5f74ull, 0x3feea11473eb0187ull, 0x3feea589994cce13ull,
    0x3feeace5422aa0dbull, 0x3feeb737b0cdc5e5ull, 0x3feec49182a3f090ull, 0x3feed503b23e255dull,
    0x3feee89f995ad3adull, 0x3feeff76f2fb5e47ull, 0x3fef199bdd85529cull, 0x3fef3720dcef9069ull,
    0x3fef5818dcfba487ull, 0x3fef7c97337b9b5full, 0x3fefa4afa2a490daull, 0x3fefd0765b6e4540ull,
};

// `tab`: EXP2F_TAB or a copy of it (shared memory, for kernels that stage it
// before their wait).
DEV float glibc_expf_with(float x, const u64* tab) {
    const u32 ux = __float_as_uint(x);
    const u32 abstop = (ux >> 20) & 0x7ffu;
    if (abstop >= 0x42bu) {  // |x| >= 88 or NaN
        if (ux == 0xff800000u) return 0.0f;
        if (abstop >= 0x7f8u) return x + x;
        if (x > __uint_as_float(0x42b17217u)) return POS_INF;   // > log(0x1p128)
        if (x < __uint_as_float(0xc2cff1b4u)) return 0.0f;      // < log(0x1p-150)
    }
    const double n = 32.0;
    const double invln2n = __longlong_as_double(0x3ff71547652b82fell) * n;
    const double shift = __longlong_as_double(0x4338000000000000ll);  // 0x1.8p52
    const double c0 = __longlong_as_double(0x3fac6af84b912394ll) / n / n / n;
    const double c1 = __longlong_as_double(0x3fcebfce50fac4f3ll) / n / n;
    const double c2 = __longlong_as_double(0x3fe62e42ff0c52d6ll) / n;
    const double xd = (double)x;
    const double kd0 = __fma_rn(invln2n, xd, shift);
    const u64 ki = (u64)__double_as_longlong(kd0);
    const double kd = __dsub_rn(kd0, shift);
    const double r = __fma_rn(invln2n, xd, -kd);
    u64 t = tab[ki % 32];
    t += ki << 47;
    const double s = __longlong_as_double((i64)t);
    const double z = __fma_rn(c0, r, c1);
    const double r2 = __dmul_rn(r, r);
    double y = __fma_rn(c2, r, 1.0);
    y = __fma_rn(z, r2, y);
    y = __dmul_rn(y, s);
    return __double2float_rn(y);
}

DEV float glibc_expf(float x) { return glibc_expf_with(x, EXP2F_TAB); }

// glibc_expf's table (256 bytes, up to three 128-byte lines) asked of L1 by
// threads t < 3: kernels that call it after their wait issue this before,
// so the table load is an L1 hit instead of a constant-cache miss and an
// L2 round trip.
DEV void prefetch_expf_table(int t) {
    if (t < 3) asm volatile("prefetch.global.L1 [%0];" ::"l"((const u8*)EXP2F_TAB + min(128 * t, 255)));
}

// ---- ggml's AVX-512 ggml_v_expf, one lane --------------------------------------

DEV float ggml_v_expf(float x) {
    const float r = __uint_as_float(0x4b400000u);  // 0x1.8p23
    const float z = __fmaf_rn(x, __uint_as_float(0x3fb8aa3bu), r);
    const float n = __fsub_rn(z, r);
    const float b = __fmaf_rn(-n, __uint_as_float(0x35bfbe8eu),
                              __fmaf_rn(-n, __uint_as_float(0x3f317200u), x));
    const float u = __fmul_rn(b, b);
    const float p = __fmaf_rn(__uint_as_float(0x3c072010u), b, __uint_as_float(0x3d2b9f17u));
    const float q = __fmaf_rn(__uint_as_float(0x3e2aaf33u), b, __uint_as_float(0x3efffedbu));
    const float j = __fmaf_rn(__fmaf_rn(p, u, q), u,
                              __fmaf_rn(__uint_as_float(0x3f7ffff6u), b, 1.0f));
    if (fabsf(n) > 192.0f) return n <= 0.0f ? 0.0f : POS_INF;
    // vscalefps: j * 2^n rounded once. j lies in [0.7, 1.5], so for
    // -125 <= n <= 127 the product is a normal f32 (or overflows as the
    // rounded product would): exact in one f32 multiply. Otherwise in f64
    // (both factors exact there).
    const int ni = (int)n;
    if (ni >= -125 && ni <= 127) return __fmul_rn(j, __int_as_float((127 + ni) << 23));
    const int half = ni / 2;
    const double p1 = __longlong_as_double((i64)(1023 + half) << 52);
    const double p2 = __longlong_as_double((i64)(1023 + ni - half) << 52);
    return __double2float_rn(__dmul_rn(__dmul_rn((double)j, p1), p2));
}

// ---- exact sequential double sums ------------------------------------------------
//
// The CPU sums squares (and softmax terms) as `double s = 0; for i: s += t_i`
// in order, t_i >= 0. One warp reproduces that sum exactly without a chain
// of n dependent additions:
//
// Let E_i be the binade of S_i (the sequential partial sum after term i) and
// U_i = 2^(E_i - 52) its ulp. If E_i == E_{i-1}, S_{i-1} is a multiple of U_i,
// so S_i = S_{i-1} + round_U(t_i), where round_U rounds t_i to the nearest
// multiple of U_i -- unless t_i is exactly halfway (a tie, decided by the
// parity of S_{i-1}). Call element i *special* if E_i != E_{i-1} or it is a
// tie. Between specials the increments round_U(t_j) are known in advance and
// their sum is exact in any order (multiples of U below 2^(E+1)). So the
// chain only visits specials: S = RN(S + t_k) (the hardware rounds exactly as
// the CPU did, since S is exact), then S += (exact sum up to the next
// special). E_i is read off approximate prefix sums (a parallel scan), which
// are within n * 2^-52 relative of S_i; when one lies that close to a power
// of two (or too many specials to list), lane 0 falls back to the plain
// sequential loop.

// Entries one lane may list (its lead segment and its specials).
#define SEQSUM_LANE_CAP 24

struct SeqSumScratch {
    double t[32][SEQSUM_LANE_CAP];
    double after[32][SEQSUM_LANE_CAP];
    int count[32];
};

DEV int dexpo(double a) { return (int)((__double_as_longlong(a) >> 52) & 0x7ff) - 1023; }
DEV double pow2d(int e) { return __longlong_as_double((i64)(e + 1023) << 52); }

// round_U(t) for U = 2^ue; sets *tie when t is exactly halfway.
DEV double round_to_ulp(double t, int ue, bool* tie) {
    *tie = false;
    const u64 bits = (u64)__double_as_longlong(t);
    const int be = (int)((bits >> 52) & 0x7ff);
    if (be == 0 && (bits & 0xfffffffffffffull) == 0) return 0.0;
    u64 m;
    int q;
    if (be == 0) {
        m = bits & 0xfffffffffffffull;
        q = -1074;
    } else {
        m = (bits & 0xfffffffffffffull) | (1ull << 52);
        q = be - 1075;
    }
    const int shift = ue - q;
    if (shift <= 0) return t;
    if (shift >= 55) return 0.0;
    const u64 half = 1ull << (shift - 1);
    const u64 rem = m & ((half << 1) - 1);
    u64 base = m >> shift;
    if (rem == half) *tie = true;
    else if (rem > half) base += 1;
    return __dmul_rn((double)base, pow2d(ue));
}

// Is `a` too close to a power of two to tell its binade? (Its mantissa
// within `tol` units of the last place of either end of the binade.)
DEV bool near_binade_edge(double a, u64 tol) {
    const u64 mant = (u64)__double_as_longlong(a) & 0xfffffffffffffull;
    return a != 0.0 && (mant <= tol || mant >= (1ull << 52) - tol);
}

// Sum of term(i), i in [0, n), as the CPU's sequential double loop. All 32
// lanes of the warp call it; every lane gets the result. `term` must return
// finite values >= 0 and be cheap (it is called twice per element, and
// again on the rare fallback); read it from shared memory where possible.
template <class Term>
DEV double seq_sum_nonneg(Term term, int n, SeqSumScratch* sc, bool* fell_back = nullptr) {
    const int lane = threadIdx.x & 31;
    const int per = (n + 31) / 32;
    const int lo = min(n, lane * per), hi = min(n, lo + per);
    // Pass 1: approximate prefix sums (any order will do).
    double l0 = 0.0, l1 = 0.0;
    int i1 = lo;
    for (; i1 + 1 < hi; i1 += 2) {
        l0 += term(i1);
        l1 += term(i1 + 1);
    }
    if (i1 < hi) l0 += term(i1);
    double incl = l0 + l1;
    for (int o = 1; o < 32; o <<= 1) {
        double v = __shfl_up_sync(FULL_MASK, incl, o);
        if (lane >= o) incl += v;
    }
    double excl = __shfl_up_sync(FULL_MASK, incl, 1);
    if (lane == 0) excl = 0.0;
    // The approximate sums are within (n + 64) 2^-50 relative of the true
    // partial sums: 16 (n + 64) units of the last place, with margin.
    const u64 tol = 16ull * (u64)(n + 64);
    // Pass 2: the lane's entries (its lead segment, then one per special).
    double a = excl;
    int eprev = (a == 0.0) ? -100000 : dexpo(a);
    bool bad = near_binade_edge(a, tol);
    int slot = 0;
    double seg = 0.0, open_t = 0.0;
    for (int i = lo; i < hi; i++) {
        const double t = term(i);
        a += t;
        bad |= near_binade_edge(a, tol);
        const int e = (a == 0.0) ? -100000 : dexpo(a);
        bool special = e != eprev;
        double r = t;
        if (!special && e != -100000) {
            // t is already a multiple of the binade's ulp unless it is
            // small (or subnormal); only then round it, and watch for ties.
            const int te = (int)(((u64)__double_as_longlong(t) >> 52) & 0x7ff);
            if (te == 0 || te - 1075 < e - 52) {
                bool tie;
                r = round_to_ulp(t, e - 52, &tie);
                special = tie;
            }
        }
        if (special) {
            if (slot < SEQSUM_LANE_CAP) {
                sc->t[lane][slot] = open_t;
                sc->after[lane][slot] = seg;
            }
            slot++;
            open_t = t;
            seg = 0.0;
        } else {
            seg += r;  // exact: multiples of one ulp, below the binade's top
        }
        eprev = e;
    }
    if (slot < SEQSUM_LANE_CAP) {
        sc->t[lane][slot] = open_t;
        sc->after[lane][slot] = seg;
    }
    slot++;
    sc->count[lane] = slot;
    bad = __any_sync(FULL_MASK, bad || slot > SEQSUM_LANE_CAP);
    if (fell_back) *fell_back = bad;
    __syncwarp();
    double s = 0.0;
    if (lane == 0) {
        if (bad) {
            for (int i = 0; i < n; i++) s += term(i);
        } else {
            for (int l = 0; l < 32; l++) {
                const int c = sc->count[l];
                for (int k = 0; k < c; k++) {
                    const double tk = sc->t[l][k];
                    if (tk != 0.0) s = s + tk;
                    s = s + sc->after[l][k];
                }
            }
        }
    }
    __syncwarp();
    return __shfl_sync(FULL_MASK, s, 0);
}

// The same sum by lane 0 alone, in order (loads batched ahead of the adds).
template <class Term>
DEV double seq_sum_plain(Term term, int n) {
    double s = 0.0;
    if ((threadIdx.x & 31) == 0) {
        int i = 0;
        for (; i + 8 <= n; i += 8) {
            double t[8];
#pragma unroll
            for (int u = 0; u < 8; u++) t[u] = term(i + u);
#pragma unroll
            for (int u = 0; u < 8; u++) s += t[u];
        }
        for (; i < n; i++) s += term(i);
    }
    return __shfl_sync(FULL_MASK, s, 0);
}

// A tree sum over the warp (lanes stride the row, then a butterfly, which
// gives every lane the same value), with the sum of |term| beside it.
template <class Term>
DEV void tree_sum(Term term, int n, double* sum, double* abs_sum) {
    const int lane = threadIdx.x & 31;
    double s0 = 0.0, s1 = 0.0, a0 = 0.0, a1 = 0.0;
    int i = lane;
    for (; i + 32 < n; i += 64) {
        const double t0 = term(i), t1 = term(i + 32);
        s0 += t0;
        s1 += t1;
        a0 += fabs(t0);
        a1 += fabs(t1);
    }
    if (i < n) {
        const double t0 = term(i);
        s0 += t0;
        a0 += fabs(t0);
    }
    double s = s0 + s1, a = a0 + a1;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        s += __shfl_xor_sync(FULL_MASK, s, o);
        a += __shfl_xor_sync(FULL_MASK, a, o);
    }
    *sum = s;
    *abs_sum = a;
}

// How a row kernel reproduces the CPU's sequential f64 sum (`method`): 0 the
// exact parallel scheme above, 1 lane 0 in order, 3 bounded (below). The
// host always passes 3 (launch.rs); hyper.cu's fallback takes the exact
// parallel scheme.
#define SUM_PARALLEL 0
#define SUM_SEQUENTIAL 1
#define SUM_BOUNDED 3

// `finish(sum)` for the CPU's sequential f64 sum of term(i), i in [0, n):
// the f32 a kernel derives from the sum (a mean, a reciprocal). `finish`
// must be monotone (either way); every lane gets the result.
//
// SUM_BOUNDED: any order of summing n doubles lies within (n - 1) 2^-53 of
// sum |term| of the exact sum, so the CPU's sum lies within twice that of a
// tree sum. When `finish` maps both ends of that interval to the same f32,
// that f32 is the CPU's (monotone); otherwise (the f32 within ~n 2^-52 of a
// rounding boundary, about one row in a million) lane 0 sums in order.
template <class Term, class Finish>
DEV float seq_sum_finish(Term term, int n, SeqSumScratch* sc, int method, Finish finish,
                         bool* fell_back = nullptr) {
    if (fell_back) *fell_back = false;
    if (method == SUM_BOUNDED) {
        double s, a;
        tree_sum(term, n, &s, &a);
        const double margin = a * ((double)(n + 2) * 0x1p-51);  // twice the bound, and more
        const float lo = finish(s - margin), hi = finish(s + margin);
        if (__float_as_uint(lo) == __float_as_uint(hi)) return lo;
        if (fell_back) *fell_back = true;
        return finish(seq_sum_plain(term, n));
    }
    return finish(method == SUM_SEQUENTIAL ? seq_sum_plain(term, n)
                                           : seq_sum_nonneg(term, n, sc));
}

// Copies a row into shared memory (when `stage` is not null), issuing 32
// loads per lane before storing any (a row of up to 1024 values costs one
// memory latency); returns where to read the row from.
DEV const float* stage_row(const float* row, float* stage, int cols) {
    if (!stage) return row;
    const int lane = threadIdx.x & 31;
    for (int c0 = 0; c0 < cols; c0 += 1024) {
        float v[32];
#pragma unroll
        for (int u = 0; u < 32; u++) {
            const int c = c0 + lane + 32 * u;
            v[u] = c < cols ? row[c] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 32; u++) {
            const int c = c0 + lane + 32 * u;
            if (c < cols) stage[c] = v[u];
        }
    }
    __syncwarp();
    return stage;
}

// out[c] = (x[c] * scale) * w[c] over a row, 16 loads of w per lane ahead.
DEV void scale_row(const float* x, const float* w, float* out, float scale, int cols) {
    const int lane = threadIdx.x & 31;
    for (int c0 = 0; c0 < cols; c0 += 512) {
        float wv[16];
#pragma unroll
        for (int u = 0; u < 16; u++) {
            const int c = c0 + lane + 32 * u;
            wv[u] = c < cols ? w[c] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 16; u++) {
            const int c = c0 + lane + 32 * u;
            if (c < cols) out[c] = (x[c] * scale) * wv[u];
        }
    }
}

// ---- test hooks -------------------------------------------------------------

// `rounds` grid-wide waits: each block's first thread adds one to `counter`
// and spins (acquire loads) until every block has added for this round,
// then the block goes on. With one resident block per SM this is the level
// barrier a persistent decode kernel would pay (cuda_bench measures it).
extern "C" __global__ void test_grid_barrier(u32* counter, int rounds) {
    for (int r = 1; r <= rounds; r++) {
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            atomicAdd(counter, 1u);
            const u32 target = (u32)r * gridDim.x;
            u32 seen;
            do {
                asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
            } while (seen < target);
        }
        __syncthreads();
    }
}
