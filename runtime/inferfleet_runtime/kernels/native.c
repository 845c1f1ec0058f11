/* CPU kernels of the "native" backend: float32, one C call per op instead of the reference's chains of torch ops.
 *
 * Built at first use by native.py (cc -O3 -march=native -fopenmp) and called through ctypes with raw pointers;
 * every shape, stride and layout check happens in native.py before the call. The math of each op is its
 * reference's in the module named beside it (rms_norm.py, rotary.py, activation.py, kv_cache.py,
 * paged_attention.py). Written for this project; the attention is the online-softmax (flash) formulation
 * over the block-table cache layout.
 *
 * Also the linear layers' matmul over weights repacked once (inferfleet_pack_linear, model.NativeLinear), and the
 * whole decoder stack of a step in one call (inferfleet_forward, at the end), which serves a native model's paged
 * steps: the same ops in the same order, without a Python round trip or a thread wake-up between them.
 *
 * Parallelism: only the attention and the linear layers have enough work per call to pay for waking threads;
 * they run on up to `num_threads` OpenMP threads (the libgomp torch already loaded, so one thread pool). The
 * element-wise ops run on the calling thread. inferfleet_forward instead keeps its threads for the whole step and
 * splits every phase between them (see there).
 */
#include "native.h"

#include <math.h>
#include <omp.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE__
#include <xmmintrin.h>
#endif
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

/* e^x in a form the compiler vectorizes (libm's expf is a scalar call unless -ffast-math, which would also change
 * the process's denormal handling): x = n ln2 + r with |r| <= ln2 / 2, e^r by its degree-6 Taylor polynomial
 * (truncation error below 1.3e-7 relative), times 2^n built in the exponent bits. Inputs are clamped to
 * [-87, 88], so -inf gives ~1.6e-38 where a softmax needs 0: callers multiply it into sums that are still 0. */
static inline float fast_exp(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    const float n = floorf(x * 1.44269504088896341f + 0.5f);
    const float r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f; /* ln2 in two parts */
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* out[t] = r * rsqrt(mean(r^2) + eps) * weight, r = x[t] (+ residual[t], also written to residual_out[t]). */
void inferfleet_rms_norm(const float *x, int64_t x_stride, const float *residual, const float *weight, float *out,
                         float *residual_out, int64_t num_tokens, int64_t hidden, float eps) {
    for (int64_t t = 0; t < num_tokens; t++) {
        const float *xt = x + t * x_stride;
        float *ot = out + t * hidden;
        const float *r = xt;
        if (residual) {
            float *rt = residual_out + t * hidden;
            const float *res = residual + t * hidden;
#pragma omp simd
            for (int64_t i = 0; i < hidden; i++) rt[i] = xt[i] + res[i];
            r = rt;
        }
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < hidden; i++) sum += r[i] * r[i];
        const float inv = 1.0f / sqrtf(sum / (float)hidden + eps);
#pragma omp simd
        for (int64_t i = 0; i < hidden; i++) ot[i] = r[i] * inv * weight[i];
    }
}

/* Rotates the first and second halves of one head (GPT-NeoX layout) by a position's cos/sin row (cos, then sin):
 * out = (x1 cos - x2 sin, x2 cos + x1 sin). */
static inline void rotate_head(const float *x, float *out, const float *cos_sin, int64_t half) {
    const float *x2 = x + half, *cos = cos_sin, *sin = cos_sin + half;
    float *o2 = out + half;
#pragma omp simd
    for (int64_t i = 0; i < half; i++) {
        out[i] = x[i] * cos[i] - x2[i] * sin[i];
        o2[i] = x2[i] * cos[i] + x[i] * sin[i];
    }
}

/* Every head of every token: x rows token_stride apart with heads head_dim apart -> out [T, heads, D]. */
static void rotate_heads(const float *x, int64_t token_stride, float *out, const int64_t *positions,
                         const float *cos_sin, int64_t num_tokens, int64_t num_heads, int64_t head_dim) {
    for (int64_t t = 0; t < num_tokens; t++)
        for (int64_t h = 0; h < num_heads; h++)
            rotate_head(x + t * token_stride + h * head_dim, out + (t * num_heads + h) * head_dim,
                        cos_sin + positions[t] * head_dim, head_dim / 2);
}

void inferfleet_rotary(const float *q, int64_t q_stride, const float *k, int64_t k_stride, float *q_out, float *k_out,
                       const int64_t *positions, const float *cos_sin, int64_t num_tokens, int64_t num_q_heads,
                       int64_t num_kv_heads, int64_t head_dim) {
    rotate_heads(q, q_stride, q_out, positions, cos_sin, num_tokens, num_q_heads, head_dim);
    rotate_heads(k, k_stride, k_out, positions, cos_sin, num_tokens, num_kv_heads, head_dim);
}

/* out[t] = silu(x[t, :I]) * x[t, I:]
 *
 * Run with denormals flushed to zero (x86's MXCSR FTZ and DAZ, restored on return): the vectorized loop also
 * evaluates fast_exp's clamped branch for every lane, gate / (1 + e^88), a denormal for any |gate| < ~2, and each
 * denormal result costs Intel cores a microcode assist, several times the loop's own time (figures:
 * docs/performance/2026-12-07-figures-from-code-comments.md). Only values below 1.2e-38 change (to 0). */
static inline void silu_mul(const float *gate, const float *up, float *out, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) out[i] = gate[i] / (1.0f + fast_exp(-gate[i])) * up[i];
}

#ifdef __SSE__
#define FLUSH_DENORMALS(saved) const unsigned int saved = _mm_getcsr(); _mm_setcsr(saved | 0x8040) /* FTZ | DAZ */
#define RESTORE_DENORMALS(saved) _mm_setcsr(saved)
#else
#define FLUSH_DENORMALS(saved)
#define RESTORE_DENORMALS(saved)
#endif

void inferfleet_silu_and_mul(const float *x, float *out, int64_t num_tokens, int64_t inter) {
    FLUSH_DENORMALS(csr);
    for (int64_t t = 0; t < num_tokens; t++) silu_mul(x + t * 2 * inter, x + t * 2 * inter + inter, out + t * inter, inter);
    RESTORE_DENORMALS(csr);
}

/* Cache row slots[t] (of width row = Hkv * D) <- key/value row t. */
void inferfleet_write_kv(const float *key, int64_t key_stride, const float *value, int64_t value_stride,
                         float *key_cache, float *value_cache, const int64_t *slots, int64_t num_tokens, int64_t row) {
    for (int64_t t = 0; t < num_tokens; t++) {
        float *kc = key_cache + slots[t] * row, *vc = value_cache + slots[t] * row;
        const float *kt = key + t * key_stride, *vt = value + t * value_stride;
#pragma omp simd
        for (int64_t i = 0; i < row; i++) {
            kc[i] = kt[i];
            vc[i] = vt[i];
        }
    }
}

/* Attention's vectors: as many floats as -march=native's widest registers hold. */
#ifdef __AVX512F__
#define ATTN_VW 16
#else
#define ATTN_VW 8
#endif
#define ATTN_MAX_VECS 16 /* head dims up to 16 vectors (256 floats with AVX-512) keep their sums in registers */
typedef float attn_vec __attribute__((vector_size(ATTN_VW * 4)));
typedef float attn_vec_u __attribute__((vector_size(ATTN_VW * 4), aligned(4)));

/* Lane j of the result <- the sum of p[j]'s lanes: ATTN_VW dot products' partial sums reduced together, halves of
 * pairs added level by level (2 shuffles and 1 add per pair), instead of one horizontal sum per dot product. */
static inline __attribute__((always_inline)) attn_vec sum_lanes(const attn_vec *p) {
#if ATTN_VW == 16
    attn_vec a[8], b[4], c[2];
    for (int i = 0; i < 8; i++) /* lanes 0-7: p[2i]'s halves summed; 8-15: p[2i+1]'s */
        a[i] = __builtin_shufflevector(p[2 * i], p[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
               __builtin_shufflevector(p[2 * i], p[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30,
                                       31);
    for (int i = 0; i < 4; i++) /* 4 lanes each of p[4i .. 4i+3] */
        b[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
               __builtin_shufflevector(a[2 * i], a[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30,
                                       31);
    for (int i = 0; i < 2; i++) /* 2 lanes each of p[8i .. 8i+7] */
        c[i] = __builtin_shufflevector(b[2 * i], b[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
               __builtin_shufflevector(b[2 * i], b[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30,
                                       31);
    return __builtin_shufflevector(c[0], c[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
           __builtin_shufflevector(c[0], c[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
#else
    attn_vec a[4], b[2];
    for (int i = 0; i < 4; i++) /* lanes 0-3: p[2i]'s halves summed; 4-7: p[2i+1]'s */
        a[i] = __builtin_shufflevector(p[2 * i], p[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
               __builtin_shufflevector(p[2 * i], p[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15);
    for (int i = 0; i < 2; i++) /* 2 lanes each of p[4i .. 4i+3] */
        b[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13) +
               __builtin_shufflevector(a[2 * i], a[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15);
    return __builtin_shufflevector(b[0], b[1], 0, 2, 4, 6, 8, 10, 12, 14) +
           __builtin_shufflevector(b[0], b[1], 1, 3, 5, 7, 9, 11, 13, 15);
#endif
}

/* One query token's heads 0..num_q_heads-1 (head h reads kv head h / group of rows `row` floats apart; all of a
 * token's heads, or one GQA group with key_cache and value_cache offset to its kv head), over keys first..last of
 * its sequence (first > 0 in a sliding-window layer), a cache block at a time: the block's rows are read in
 * order, each kv head's row once for its whole group; per block, each head's scores, then one online-softmax
 * rescale of its accumulator. Inlined at each call site, so the common shapes get loops of a known length (see
 * inferfleet_paged_attention). */
static inline __attribute__((always_inline)) void attend(const float *q, float *out, const float *key_cache,
                                                         const float *value_cache, const int32_t *block_table,
                                                         int64_t first, int64_t last, int64_t num_q_heads,
                                                         int64_t group, int64_t row, int64_t head_dim,
                                                         int64_t block_size, float scale) {
    /* On the stack: num_q_heads * (head_dim + block_size + 2) floats (Llama-3-70B: 64 * 146, 37 KiB). */
    float acc[num_q_heads][head_dim];
    float scores[num_q_heads][block_size];
    /* Whole vectors (constants where attend_any inlines it): head dims and blocks in multiples of ATTN_VW. */
    const int vectors = head_dim % ATTN_VW == 0 && head_dim <= ATTN_MAX_VECS * ATTN_VW && block_size % ATTN_VW == 0;
    float running_max[num_q_heads], running_sum[num_q_heads];
    for (int64_t h = 0; h < num_q_heads; h++) {
        running_max[h] = -INFINITY;
        running_sum[h] = 0.0f;
        for (int64_t d = 0; d < head_dim; d++) acc[h][d] = 0.0f;
    }
    /* Every chunk but the first starts on a block boundary; the first starts inside its block where first does. */
    for (int64_t start = first, n; start <= last; start += n) {
        const int64_t skip = start % block_size;
        n = (last - start + 1) < block_size - skip ? (last - start + 1) : block_size - skip;
        const int64_t base = ((int64_t)block_table[start / block_size] * block_size + skip) * row;
        const float *keys = key_cache + base, *values = value_cache + base;
        if (start + n <= last) { /* the next block's rows asked for while this one is worked on (blocks lie apart) */
            const int64_t next_rows = last - (start + n) + 1 < block_size ? last - (start + n) + 1 : block_size;
            const int64_t next = (int64_t)block_table[(start + n) / block_size] * block_size * row;
            const int64_t used = (num_q_heads / group) * head_dim; /* floats of a row this call reads */
            for (int64_t j = 0; j < next_rows; j++)
                for (int64_t f = 0; f < used; f += 64 / sizeof(float)) {
                    __builtin_prefetch(key_cache + next + j * row + f);
                    __builtin_prefetch(value_cache + next + j * row + f);
                }
        }
        if (vectors) { /* ATTN_VW keys' scores at a time: partial sums per key, then sum_lanes */
            for (int64_t h = 0; h < num_q_heads; h++) {
                const float *qh = q + h * head_dim, *kh = keys + (h / group) * head_dim;
                for (int64_t j0 = 0; j0 < n; j0 += ATTN_VW) {
                    attn_vec partial[ATTN_VW];
                    for (int64_t j = 0; j < ATTN_VW; j++) {
                        attn_vec sum = {0};
                        if (j0 + j < n)
                            for (int64_t d = 0; d < head_dim; d += ATTN_VW)
                                sum += *(const attn_vec_u *)(qh + d) * *(const attn_vec_u *)(kh + (j0 + j) * row + d);
                        partial[j] = sum;
                    }
                    *(attn_vec_u *)(scores[h] + j0) = sum_lanes(partial) * scale;
                }
            }
        } else {
            for (int64_t j = 0; j < n; j++) {
                for (int64_t h = 0; h < num_q_heads; h++) {
                    const float *qh = q + h * head_dim, *kj = keys + j * row + (h / group) * head_dim;
                    float s = 0.0f;
#pragma omp simd reduction(+ : s)
                    for (int64_t d = 0; d < head_dim; d++) s += qh[d] * kj[d];
                    scores[h][j] = s * scale;
                }
            }
        }
        for (int64_t h = 0; h < num_q_heads; h++) {
            float block_max = -INFINITY;
            for (int64_t j = 0; j < n; j++) block_max = scores[h][j] > block_max ? scores[h][j] : block_max;
            const float new_max = block_max > running_max[h] ? block_max : running_max[h];
            const float correction = fast_exp(running_max[h] - new_max); /* ~0 on the first block (-inf) */
            running_max[h] = new_max;
            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int64_t j = 0; j < n; j++) {
                scores[h][j] = fast_exp(scores[h][j] - new_max);
                sum += scores[h][j];
            }
            running_sum[h] = running_sum[h] * correction + sum;
#pragma omp simd
            for (int64_t d = 0; d < head_dim; d++) acc[h][d] *= correction;
        }
        if (vectors) { /* a head at a time, its accumulator in registers over the block's values */
            for (int64_t h = 0; h < num_q_heads; h++) {
                const float *vh = values + (h / group) * head_dim;
                attn_vec a[ATTN_MAX_VECS];
                for (int64_t c = 0; c < head_dim / ATTN_VW; c++) a[c] = *(const attn_vec_u *)(acc[h] + c * ATTN_VW);
                for (int64_t j = 0; j < n; j++) {
                    const float p = scores[h][j];
                    for (int64_t c = 0; c < head_dim / ATTN_VW; c++)
                        a[c] += p * *(const attn_vec_u *)(vh + j * row + c * ATTN_VW);
                }
                for (int64_t c = 0; c < head_dim / ATTN_VW; c++) *(attn_vec_u *)(acc[h] + c * ATTN_VW) = a[c];
            }
        } else {
            for (int64_t j = 0; j < n; j++) {
                for (int64_t h = 0; h < num_q_heads; h++) {
                    const float p = scores[h][j], *vj = values + j * row + (h / group) * head_dim;
                    float *a = acc[h];
#pragma omp simd
                    for (int64_t d = 0; d < head_dim; d++) a[d] += p * vj[d];
                }
            }
        }
    }
    for (int64_t h = 0; h < num_q_heads; h++) {
        const float inv = 1.0f / running_sum[h];
        float *o = out + h * head_dim;
        for (int64_t d = 0; d < head_dim; d++) o[d] = acc[h][d] * inv;
    }
}

/* attend() with head dims 64 and 128 and 16-token blocks as constants: unrolled loops without remainders (decode
 * of 32 sequences of 100 tokens, 8 query heads of 64: 540 instead of 690 us on one thread). */
static void attend_any(const float *q, float *out, const float *key_cache, const float *value_cache,
                       const int32_t *block_table, int64_t first, int64_t last, int64_t num_q_heads, int64_t group,
                       int64_t row, int64_t head_dim, int64_t block_size, float scale) {
    if (head_dim == 64 && block_size == 16)
        attend(q, out, key_cache, value_cache, block_table, first, last, num_q_heads, group, row, 64, 16, scale);
    else if (head_dim == 128 && block_size == 16)
        attend(q, out, key_cache, value_cache, block_table, first, last, num_q_heads, group, row, 128, 16, scale);
    else
        attend(q, out, key_cache, value_cache, block_table, first, last, num_q_heads, group, row, head_dim, block_size,
               scale);
}

/* The first key a query at position pos sees: pos - window + 1 in a sliding-window layer (window > 0), else 0. */
static inline int64_t first_key(int64_t pos, int64_t window) {
    return window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
}

/* token_seq[t], token_pos[t]: the sequence and position of each new token t (query_start_loc NULL: decode, token
 * i is sequence i's only new token). Returns how many key rows the tokens attend to in all (window as first_key). */
static int64_t token_table(const int32_t *seq_lens, const int32_t *query_start_loc, int64_t num_seqs,
                           int64_t window, int64_t *token_seq, int64_t *token_pos) {
    int64_t num_keys = 0;
    for (int64_t b = 0; b < num_seqs; b++) {
        const int64_t begin = query_start_loc ? query_start_loc[b] : b;
        const int64_t end = query_start_loc ? query_start_loc[b + 1] : b + 1;
        for (int64_t t = begin; t < end; t++) {
            token_seq[t] = b;
            token_pos[t] = seq_lens[b] - (end - t);
            num_keys += token_pos[t] + 1 - first_key(token_pos[t], window);
        }
    }
    return num_keys;
}

/* Causal attention of each new token over its sequence's cached context (paged_attention.py's layouts), over the
 * last `window` keys up to the token's own where window > 0 (a sliding-window layer), else over all of them.
 * query_start_loc NULL: decode, token i is sequence i's only new token. Returns 0, or -1 when a buffer
 * could not be allocated. */
int inferfleet_paged_attention(const float *query, float *out, const float *key_cache, const float *value_cache,
                               const int32_t *block_tables, int64_t block_table_stride, const int32_t *seq_lens,
                               const int32_t *query_start_loc, int64_t num_seqs, int64_t num_tokens,
                               int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
                               float scale, int64_t window, int num_threads) {
    /* Each token's sequence and position, so the tokens below are independent. */
    int64_t *token_seq = malloc(sizeof(int64_t) * num_tokens * 2);
    if (!token_seq) return -1;
    int64_t *token_pos = token_seq + num_tokens;
    const int64_t num_keys = token_table(seq_lens, query_start_loc, num_seqs, window, token_seq, token_pos);
    /* Below ~1k key rows (tens of microseconds) waking threads costs about what it saves. */
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads) if (num_keys >= 1024)
    for (int64_t t = 0; t < num_tokens; t++) {
        const int64_t offset = t * num_q_heads * head_dim;
        const int32_t *table = block_tables + token_seq[t] * block_table_stride;
        attend_any(query + offset, out + offset, key_cache, value_cache, table, first_key(token_pos[t], window),
                   token_pos[t], num_q_heads, num_q_heads / num_kv_heads, num_kv_heads * head_dim, head_dim, block_size,
                   scale);
    }
    free(token_seq);
    return 0;
}

/* Linear layers: out = x W^T (+ bias) with W [N, K] repacked once into panels of LINEAR_NR output columns,
 * panel j holding W[j*NR : j*NR + NR, :] transposed ([K][NR], zero rows past N), so a panel's k-th row is one
 * contiguous load of NR weights. The microkernel keeps an MR x NR block of out in registers (two vectors per
 * row) and, per k, loads the panel row once and broadcasts each of the MR x values into it: every weight read
 * from memory serves MR rows, and a batch-1 step streams each weight once. Vector width follows the ISA
 * -march=native found (16 floats with AVX-512, else 8), so NR is 32 or 16: inferfleet_linear_panel_width(). */
#ifdef __AVX512F__
#define LINEAR_VW 16
#define LINEAR_MR 12 /* rows per microkernel: 24 accumulators, 2 weight vectors, 1 broadcast of 32 registers */
#else
#define LINEAR_VW 8
#define LINEAR_MR 6 /* 12 accumulators, 2 weight vectors, 1 broadcast of 16 registers */
#endif
#define LINEAR_NR (2 * LINEAR_VW)
#define LINEAR_MC 96  /* rows per pass over the weights: their x rows stay in L2 while every panel is applied */
#define LINEAR_GEMV_PANELS 4 /* one-row calls: 4 panels at once, 8 independent accumulators */
#define LINEAR_PREFETCH 16   /* panel rows (2 KiB with AVX-512) the multi-row kernel prefetches ahead */
typedef float linear_vec __attribute__((vector_size(LINEAR_VW * 4)));
typedef float linear_vec_u __attribute__((vector_size(LINEAR_VW * 4), aligned(4)));

int inferfleet_linear_panel_width(void) { return LINEAR_NR; }

/* packed [ceil(N / NR) * K * NR] <- w [N, K] (rows w_stride apart). */
void inferfleet_pack_linear(const float *w, int64_t w_stride, float *packed, int64_t n, int64_t k) {
    const int64_t panels = (n + LINEAR_NR - 1) / LINEAR_NR;
    for (int64_t j = 0; j < panels; j++)
        for (int64_t kk = 0; kk < k; kk++)
            for (int64_t c = 0; c < LINEAR_NR; c++) {
                const int64_t row = j * LINEAR_NR + c;
                packed[(j * k + kk) * LINEAR_NR + c] = row < n ? w[row * w_stride + kk] : 0.0f;
            }
}

/* acc [np][mr][NR] <- x rows 0..mr-1 (x_stride apart) times np panels (panel_stride floats apart), mr * np <=
 * LINEAR_MR. Called with constant mr and np, so each call site is its own unrolled kernel with the accumulators in
 * registers. Several panels at once are several sequential streams from memory: one alone is too few for the
 * hardware prefetchers to keep up with weights read once per step (SmolLM2's lm_head at 8 rows: 14.6 GB/s with
 * one panel per thread vs 38 with four panels in the one-row kernel), so each stream also asks for its rows
 * LINEAR_PREFETCH ahead (past the end: into the next panel). */
static inline __attribute__((always_inline)) void linear_block(const float *x, int64_t x_stride, const float *panels,
                                                               int64_t panel_stride, int64_t k, const int mr,
                                                               const int np, float *acc) {
    linear_vec a[LINEAR_MR][2];
#pragma GCC unroll 12
    for (int i = 0; i < LINEAR_MR; i++) a[i][0] = a[i][1] = (linear_vec){0};
    for (int64_t kk = 0; kk < k; kk++) {
#pragma GCC unroll 4
        for (int q = 0; q < np; q++) {
            const float *panel = panels + q * panel_stride;
            const linear_vec w0 = *(const linear_vec_u *)(panel + kk * LINEAR_NR);
            const linear_vec w1 = *(const linear_vec_u *)(panel + kk * LINEAR_NR + LINEAR_VW);
            __builtin_prefetch(panel + (kk + LINEAR_PREFETCH) * LINEAR_NR);
            __builtin_prefetch(panel + (kk + LINEAR_PREFETCH) * LINEAR_NR + LINEAR_VW);
#pragma GCC unroll 12
            for (int r = 0; r < mr; r++) {
                const float b = x[r * x_stride + kk];
                a[q * mr + r][0] += b * w0;
                a[q * mr + r][1] += b * w1;
            }
        }
    }
#pragma GCC unroll 12
    for (int i = 0; i < mr * np; i++) {
        *(linear_vec_u *)(acc + i * LINEAR_NR) = a[i][0];
        *(linear_vec_u *)(acc + i * LINEAR_NR + LINEAR_VW) = a[i][1];
    }
}

/* acc [np][NR] <- one x row times np consecutive panels (np <= LINEAR_GEMV_PANELS, constant per call site). */
static inline __attribute__((always_inline)) void linear_row(const float *x, const float *panels, int64_t k,
                                                             const int np, float *acc) {
    linear_vec a[LINEAR_GEMV_PANELS][2];
#pragma GCC unroll 4
    for (int q = 0; q < LINEAR_GEMV_PANELS; q++) a[q][0] = a[q][1] = (linear_vec){0};
    for (int64_t kk = 0; kk < k; kk++) {
        const float b = x[kk];
#pragma GCC unroll 4
        for (int q = 0; q < np; q++) {
            const float *w = panels + (q * k + kk) * LINEAR_NR;
            a[q][0] += b * *(const linear_vec_u *)w;
            a[q][1] += b * *(const linear_vec_u *)(w + LINEAR_VW);
        }
    }
#pragma GCC unroll 4
    for (int q = 0; q < np; q++) {
        *(linear_vec_u *)(acc + q * LINEAR_NR) = a[q][0];
        *(linear_vec_u *)(acc + q * LINEAR_NR + LINEAR_VW) = a[q][1];
    }
}

/* out rows 0..rows-1 (N apart), columns col.. of one panel <- acc (+ bias), cut at N; with `accumulate`, added to
 * what out holds (the residual stream of inferfleet_forward). */
static void linear_store(float *out, int64_t n, const float *acc, int rows, int64_t col, const float *bias,
                         int accumulate) {
    const int64_t width = n - col < LINEAR_NR ? n - col : LINEAR_NR;
    for (int r = 0; r < rows; r++)
        for (int64_t c = 0; c < width; c++) {
            const float v = acc[r * LINEAR_NR + c] + (bias ? bias[col + c] : 0.0f);
            out[r * n + col + c] = accumulate ? out[r * n + col + c] + v : v;
        }
}

/* [*begin, *end): the share of `units` work items that thread `tid` of `nth` takes (contiguous, even). */
static void thread_share(int64_t units, int tid, int nth, int64_t *begin, int64_t *end) {
    *begin = units * tid / nth;
    *end = units * (tid + 1) / nth;
}

/* out rows 0..m-1, the columns of np panels from panel j <- x rows times those float panels (+ bias; added to out
 * with `accumulate`). */
static void linear_panel_rows(const float *x, int64_t x_stride, const float *panels, int np, const float *bias,
                              float *out, int64_t m, int64_t n, int64_t k, int64_t j, int accumulate) {
    /* The rows in blocks of at most MR / np, as even as they go (with 6 per block, 8 rows: 4 + 4, not 6 + 2). */
    const int64_t blocks = (m + LINEAR_MR / np - 1) / (LINEAR_MR / np), base = m / blocks, extra = m % blocks;
    const int64_t stride = k * LINEAR_NR;
    float acc[LINEAR_MR * LINEAR_NR];
    int64_t r0 = 0;
    for (int64_t b = 0; b < blocks; b++) {
        const int mr = (int)(base + (b < extra));
        const float *xb = x + r0 * x_stride;
        switch (np * 16 + mr) {
#define LINEAR_CASE(count, rows) \
    case count * 16 + rows: linear_block(xb, x_stride, panels, stride, k, rows, count, acc); break;
#if LINEAR_MR > 6
            LINEAR_CASE(1, 12) LINEAR_CASE(1, 11) LINEAR_CASE(1, 10) LINEAR_CASE(1, 9) LINEAR_CASE(1, 8)
            LINEAR_CASE(1, 7) LINEAR_CASE(2, 6) LINEAR_CASE(2, 5) LINEAR_CASE(2, 4) LINEAR_CASE(4, 3)
            LINEAR_CASE(4, 2)
#endif
            LINEAR_CASE(1, 6) LINEAR_CASE(1, 5) LINEAR_CASE(1, 4) LINEAR_CASE(1, 3) LINEAR_CASE(1, 2)
            LINEAR_CASE(1, 1) LINEAR_CASE(2, 3) LINEAR_CASE(2, 2) LINEAR_CASE(2, 1) LINEAR_CASE(4, 1)
        default: abort();
        }
        for (int q = 0; q < np; q++)
            linear_store(out + r0 * n, n, acc + q * mr * LINEAR_NR, mr, (j + q) * LINEAR_NR, bias, accumulate);
        r0 += mr;
    }
}

/* Panels of thread `tid`'s share (of `nth`) of out [M, N] <- x [M, K] (rows x_stride apart) times the packed
 * weight, + bias [N] when given (added to out with `accumulate`). One-row calls take panels 4 at a time. */
static void linear_share(const float *x, int64_t x_stride, const float *packed, const float *bias, float *out,
                         int64_t m, int64_t n, int64_t k, int accumulate, int tid, int nth) {
    const int64_t panels = (n + LINEAR_NR - 1) / LINEAR_NR;
    int64_t first, last;
    if (m == 1) {
        thread_share(panels, tid, nth, &first, &last); /* panels, not groups of 4: 18 on 2 threads 9 + 9, not 8 + 10 */
        for (int64_t p = first; p < last; p += LINEAR_GEMV_PANELS) {
            float acc[LINEAR_GEMV_PANELS * LINEAR_NR];
            const int np = last - p < LINEAR_GEMV_PANELS ? (int)(last - p) : LINEAR_GEMV_PANELS;
            const float *w = packed + p * k * LINEAR_NR;
            switch (np) {
            case 4: linear_row(x, w, k, 4, acc); break;
            case 3: linear_row(x, w, k, 3, acc); break;
            case 2: linear_row(x, w, k, 2, acc); break;
            default: linear_row(x, w, k, 1, acc); break;
            }
            for (int q = 0; q < np; q++)
                linear_store(out, n, acc + q * LINEAR_NR, 1, (p + q) * LINEAR_NR, bias, accumulate);
        }
        return;
    }
    thread_share(panels, tid, nth, &first, &last);
    /* Panels at once: several streams from memory while a step is bound by reading the weights (a few rows), one
     * with the most rows per block once the multiply-adds bound it (SmolLM2's matrices on a 2-core Xeon: 4 panels
     * best at 2 rows, 2 at 4 to 32, 1 from 48 up: docs/performance/2026-12-07-smollm2-on-the-xeon.md). */
    const int panels_at_once = m <= 3 ? 4 : m <= 32 ? 2 : 1;
    for (int64_t m0 = 0; m0 < m; m0 += LINEAR_MC) {
        const int64_t rows = m - m0 < LINEAR_MC ? m - m0 : LINEAR_MC;
        for (int64_t j = first; j < last;) {
            const int np = last - j >= panels_at_once ? panels_at_once : 1;
            linear_panel_rows(x + m0 * x_stride, x_stride, packed + j * k * LINEAR_NR, np, bias, out + m0 * n, rows,
                              n, k, j, accumulate);
            j += np;
        }
    }
}

/* out [M, N] <- x [M, K] (rows x_stride apart) times the packed weight, + bias [N] when given. Threads split the
 * panels; a call under ~256k multiply-adds runs on the calling thread (waking threads would cost more). */
void inferfleet_linear(const float *x, int64_t x_stride, const float *packed, const float *bias, float *out, int64_t m,
                       int64_t n, int64_t k, int num_threads) {
#pragma omp parallel num_threads(num_threads) if (m * n * k >= (1 << 18))
    linear_share(x, x_stride, packed, bias, out, m, n, k, 0, omp_get_thread_num(), omp_get_num_threads());
}

/* Weight-only quantized linear layers (layers.quantized.QuantizedLinear served by the native backend): out = x W^T
 * (+ bias) with W [N, K] held as 8- or 4-bit integers and, per output row and group of `group_size` input columns,
 * a float scale s and optional offset o: W[n, k] = q[n, k] * s[n, g] + o[n, g], q signed (int8, or a nibble
 * holding q + 8 for 4 bits); o = -zero * s for an asymmetric checkpoint (GGUF Q4_1: its min + 8 s), absent when
 * symmetric; see native.py pack_quantized.
 *
 * Layout, packed once at load (native.py pack_quantized): the panels of the float matmul above, LINEAR_NR output
 * columns each, holding bytes instead of floats: int8 panel j is [K][NR] bytes (row k = W[jNR .. jNR+NR-1, k]);
 * int4 panel j is [K/2][NR] bytes whose low nibble is row 2i and high nibble row 2i+1. Scales and offsets are
 * [panels][G][NR] floats. So a panel row is one load of NR (int8) or 2 NR (int4) weights, widened to float in
 * registers (sign or zero extension, int -> float conversion) and never written back: the weights stream from
 * memory at 1 or 1/2 byte each instead of 4. Accumulation is float32 throughout.
 *
 * Two microkernels, as for float: several rows at once (each widened weight vector scaled and offset in registers,
 * then used by every row: the conversion cost is shared) and one row over LINEAR_GEMV_PANELS panels (sums of x u
 * per group, scaled and offset once per group: per weight, one widening and one multiply-add). Vector extensions
 * let the compiler pick AVX-512 (16 lanes), AVX2 (8) or plain SSE/scalar code from -march=native. */
/* inferfleet_qweight: native.h. */

typedef signed char qvec_s __attribute__((vector_size(LINEAR_VW), aligned(1)));
typedef unsigned char qvec_u __attribute__((vector_size(LINEAR_VW), aligned(1)));

/* The two float vectors (columns 0..VW-1, VW..NR-1) of one panel row (int8), or of rows 2i and 2i+1 (int4:
 * lo0/lo1 then hi0/hi1, each nibble less 8) from the bytes at p. */
#if defined(__AVX512F__) && defined(__AVX512BW__)
/* GCC 12 turns __builtin_convertvector from bytes to floats into scalar code: the widening is spelled out. */
static inline __m512 bytes_to_floats(__m128i b) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)); }
static inline __attribute__((always_inline)) void widen8(const uint8_t *p, linear_vec *w0, linear_vec *w1) {
    const __m256i b = _mm256_loadu_si256((const __m256i *)p);
    *w0 = (linear_vec)bytes_to_floats(_mm256_castsi256_si128(b));
    *w1 = (linear_vec)bytes_to_floats(_mm256_extracti128_si256(b, 1));
}
static inline __attribute__((always_inline)) void widen4(const uint8_t *p, linear_vec *lo0, linear_vec *lo1,
                                                         linear_vec *hi0, linear_vec *hi1) {
    const __m256i b = _mm256_loadu_si256((const __m256i *)p), mask = _mm256_set1_epi8(15), eight = _mm256_set1_epi8(8);
    const __m256i lo = _mm256_sub_epi8(_mm256_and_si256(b, mask), eight);
    const __m256i hi = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(b, 4), mask), eight);
    *lo0 = (linear_vec)bytes_to_floats(_mm256_castsi256_si128(lo));
    *lo1 = (linear_vec)bytes_to_floats(_mm256_extracti128_si256(lo, 1));
    *hi0 = (linear_vec)bytes_to_floats(_mm256_castsi256_si128(hi));
    *hi1 = (linear_vec)bytes_to_floats(_mm256_extracti128_si256(hi, 1));
}
#elif defined(__AVX2__) && !defined(__AVX512F__)
static inline __m256 bytes_to_floats(__m128i b) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)); }
static inline __attribute__((always_inline)) void widen8(const uint8_t *p, linear_vec *w0, linear_vec *w1) {
    const __m128i b = _mm_loadu_si128((const __m128i *)p);
    *w0 = (linear_vec)bytes_to_floats(b);
    *w1 = (linear_vec)bytes_to_floats(_mm_srli_si128(b, 8));
}
static inline __attribute__((always_inline)) void widen4(const uint8_t *p, linear_vec *lo0, linear_vec *lo1,
                                                         linear_vec *hi0, linear_vec *hi1) {
    const __m128i b = _mm_loadu_si128((const __m128i *)p), mask = _mm_set1_epi8(15), eight = _mm_set1_epi8(8);
    const __m128i lo = _mm_sub_epi8(_mm_and_si128(b, mask), eight);
    const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(b, 4), mask), eight);
    *lo0 = (linear_vec)bytes_to_floats(lo);
    *lo1 = (linear_vec)bytes_to_floats(_mm_srli_si128(lo, 8));
    *hi0 = (linear_vec)bytes_to_floats(hi);
    *hi1 = (linear_vec)bytes_to_floats(_mm_srli_si128(hi, 8));
}
#else /* portable: whatever the compiler makes of vector conversions (scalar loops at worst) */
static inline __attribute__((always_inline)) void widen8(const uint8_t *p, linear_vec *w0, linear_vec *w1) {
    *w0 = __builtin_convertvector(*(const qvec_s *)p, linear_vec);
    *w1 = __builtin_convertvector(*(const qvec_s *)(p + LINEAR_VW), linear_vec);
}
static inline __attribute__((always_inline)) void widen4(const uint8_t *p, linear_vec *lo0, linear_vec *lo1,
                                                         linear_vec *hi0, linear_vec *hi1) {
    const qvec_u b0 = *(const qvec_u *)p, b1 = *(const qvec_u *)(p + LINEAR_VW);
    *lo0 = __builtin_convertvector((qvec_s)(b0 & 15) - 8, linear_vec);
    *lo1 = __builtin_convertvector((qvec_s)(b1 & 15) - 8, linear_vec);
    *hi0 = __builtin_convertvector((qvec_s)(b0 >> 4) - 8, linear_vec);
    *hi1 = __builtin_convertvector((qvec_s)(b1 >> 4) - 8, linear_vec);
}
#endif

/* acc [mr][NR] <- x rows 0..mr-1 times quantized panel `panel` (its bytes, scales and offsets [G][NR]). */
static inline __attribute__((always_inline)) void qlinear_block(const float *x, int64_t x_stride,
                                                                const uint8_t *panel, const float *scales,
                                                                const float *offsets, int64_t k, int64_t gs,
                                                                const int bits, const int mr, float *acc) {
    linear_vec a[LINEAR_MR][2];
#pragma GCC unroll 12
    for (int r = 0; r < LINEAR_MR; r++) a[r][0] = a[r][1] = (linear_vec){0};
    for (int64_t g = 0, k0 = 0; k0 < k; g++, k0 += gs) {
        const linear_vec s0 = *(const linear_vec_u *)(scales + g * LINEAR_NR);
        const linear_vec s1 = *(const linear_vec_u *)(scales + g * LINEAR_NR + LINEAR_VW);
        const linear_vec o0 = offsets ? *(const linear_vec_u *)(offsets + g * LINEAR_NR) : (linear_vec){0};
        const linear_vec o1 = offsets ? *(const linear_vec_u *)(offsets + g * LINEAR_NR + LINEAR_VW) : (linear_vec){0};
        if (bits == 8) {
            for (int64_t kk = k0; kk < k0 + gs; kk++) {
                linear_vec w0, w1;
                widen8(panel + kk * LINEAR_NR, &w0, &w1);
                w0 = w0 * s0 + o0;
                w1 = w1 * s1 + o1;
#pragma GCC unroll 12
                for (int r = 0; r < mr; r++) {
                    const float b = x[r * x_stride + kk];
                    a[r][0] += b * w0;
                    a[r][1] += b * w1;
                }
            }
        } else {
            for (int64_t kk = k0; kk < k0 + gs; kk += 2) {
                linear_vec l0, l1, h0, h1;
                widen4(panel + kk / 2 * LINEAR_NR, &l0, &l1, &h0, &h1);
                l0 = l0 * s0 + o0;
                l1 = l1 * s1 + o1;
                h0 = h0 * s0 + o0;
                h1 = h1 * s1 + o1;
#pragma GCC unroll 12
                for (int r = 0; r < mr; r++) {
                    const float b = x[r * x_stride + kk], c = x[r * x_stride + kk + 1];
                    a[r][0] += b * l0 + c * h0;
                    a[r][1] += b * l1 + c * h1;
                }
            }
        }
    }
#pragma GCC unroll 12
    for (int r = 0; r < mr; r++) {
        *(linear_vec_u *)(acc + r * LINEAR_NR) = a[r][0];
        *(linear_vec_u *)(acc + r * LINEAR_NR + LINEAR_VW) = a[r][1];
    }
}

/* acc [np][NR] <- one x row times np consecutive quantized panels (panel bytes `panel_bytes` apart, scales and
 * offsets G * NR apart): per group, p = sum x u and xs = sum x, then acc += p s + xs o. */
static inline __attribute__((always_inline)) void qlinear_row(const float *x, const uint8_t *panels,
                                                              int64_t panel_bytes, const float *scales,
                                                              const float *offsets, int64_t k, int64_t gs,
                                                              const int bits, const int np, float *acc) {
    const int64_t groups = k / gs;
    linear_vec a[LINEAR_GEMV_PANELS][2];
#pragma GCC unroll 4
    for (int q = 0; q < LINEAR_GEMV_PANELS; q++) a[q][0] = a[q][1] = (linear_vec){0};
    for (int64_t g = 0, k0 = 0; g < groups; g++, k0 += gs) {
        linear_vec p[LINEAR_GEMV_PANELS][2];
#pragma GCC unroll 4
        for (int q = 0; q < LINEAR_GEMV_PANELS; q++) p[q][0] = p[q][1] = (linear_vec){0};
        float xs = 0.0f;
        if (bits == 8) {
            for (int64_t kk = k0; kk < k0 + gs; kk++) {
                const float b = x[kk];
                xs += b;
#pragma GCC unroll 4
                for (int q = 0; q < np; q++) {
                    linear_vec w0, w1;
                    widen8(panels + q * panel_bytes + kk * LINEAR_NR, &w0, &w1);
                    p[q][0] += b * w0;
                    p[q][1] += b * w1;
                }
            }
        } else {
            for (int64_t kk = k0; kk < k0 + gs; kk += 2) {
                const float b = x[kk], c = x[kk + 1];
                xs += b + c;
#pragma GCC unroll 4
                for (int q = 0; q < np; q++) {
                    linear_vec l0, l1, h0, h1;
                    widen4(panels + q * panel_bytes + kk / 2 * LINEAR_NR, &l0, &l1, &h0, &h1);
                    p[q][0] += b * l0 + c * h0;
                    p[q][1] += b * l1 + c * h1;
                }
            }
        }
#pragma GCC unroll 4
        for (int q = 0; q < np; q++) {
            const float *s = scales + (q * groups + g) * LINEAR_NR;
            a[q][0] += p[q][0] * *(const linear_vec_u *)s;
            a[q][1] += p[q][1] * *(const linear_vec_u *)(s + LINEAR_VW);
            if (offsets) {
                const float *o = offsets + (q * groups + g) * LINEAR_NR;
                a[q][0] += xs * *(const linear_vec_u *)o;
                a[q][1] += xs * *(const linear_vec_u *)(o + LINEAR_VW);
            }
        }
    }
#pragma GCC unroll 4
    for (int q = 0; q < np; q++) {
        *(linear_vec_u *)(acc + q * LINEAR_NR) = a[q][0];
        *(linear_vec_u *)(acc + q * LINEAR_NR + LINEAR_VW) = a[q][1];
    }
}

/* A float panel [K][NR] <- quantized panel j (its bytes, scales and offsets [G][NR]). */
static inline __attribute__((always_inline)) void dequantize_panel(const uint8_t *panel, const float *scales,
                                                                   const float *offsets, int64_t k, int64_t gs,
                                                                   const int bits, float *dst) {
    for (int64_t g = 0, k0 = 0; k0 < k; g++, k0 += gs) {
        const linear_vec s0 = *(const linear_vec_u *)(scales + g * LINEAR_NR);
        const linear_vec s1 = *(const linear_vec_u *)(scales + g * LINEAR_NR + LINEAR_VW);
        const linear_vec o0 = offsets ? *(const linear_vec_u *)(offsets + g * LINEAR_NR) : (linear_vec){0};
        const linear_vec o1 = offsets ? *(const linear_vec_u *)(offsets + g * LINEAR_NR + LINEAR_VW) : (linear_vec){0};
        for (int64_t kk = k0; kk < k0 + gs; kk += (bits == 8 ? 1 : 2)) {
            float *d = dst + kk * LINEAR_NR;
            linear_vec l0, l1, h0, h1;
            if (bits == 8) {
                widen8(panel + kk * LINEAR_NR, &l0, &l1);
            } else {
                widen4(panel + kk / 2 * LINEAR_NR, &l0, &l1, &h0, &h1);
                *(linear_vec_u *)(d + LINEAR_NR) = h0 * s0 + o0;
                *(linear_vec_u *)(d + LINEAR_NR + LINEAR_VW) = h1 * s1 + o1;
            }
            *(linear_vec_u *)d = l0 * s0 + o0;
            *(linear_vec_u *)(d + LINEAR_VW) = l1 * s1 + o1;
        }
    }
}

/* linear_share for a quantized weight: thread `tid`'s share of the panels (one-row calls 4 panels at a time). */
static inline __attribute__((always_inline)) void qlinear_share_bits(const float *x, int64_t x_stride,
                                                                     const inferfleet_qweight *w, const int bits,
                                                                     const float *bias, float *out, int64_t m,
                                                                     int64_t n, int64_t k, int accumulate, int tid,
                                                                     int nth) {
    const int64_t panels = (n + LINEAR_NR - 1) / LINEAR_NR, gs = w->group_size, groups = k / gs;
    const int64_t panel_bytes = k * LINEAR_NR * bits / 8, panel_floats = groups * LINEAR_NR;
    int64_t first, last;
    if (m == 1) {
        thread_share(panels, tid, nth, &first, &last); /* panels, not groups of 4: 18 on 2 threads 9 + 9, not 8 + 10 */
        for (int64_t p = first; p < last; p += LINEAR_GEMV_PANELS) {
            float acc[LINEAR_GEMV_PANELS * LINEAR_NR];
            const int np = last - p < LINEAR_GEMV_PANELS ? (int)(last - p) : LINEAR_GEMV_PANELS;
            const uint8_t *d = w->data + p * panel_bytes;
            const float *s = w->scales + p * panel_floats, *o = w->offsets ? w->offsets + p * panel_floats : NULL;
            switch (np) {
            case 4: qlinear_row(x, d, panel_bytes, s, o, k, gs, bits, 4, acc); break;
            case 3: qlinear_row(x, d, panel_bytes, s, o, k, gs, bits, 3, acc); break;
            case 2: qlinear_row(x, d, panel_bytes, s, o, k, gs, bits, 2, acc); break;
            default: qlinear_row(x, d, panel_bytes, s, o, k, gs, bits, 1, acc); break;
            }
            for (int q = 0; q < np; q++)
                linear_store(out, n, acc + q * LINEAR_NR, 1, (p + q) * LINEAR_NR, bias, accumulate);
        }
        return;
    }
    thread_share(panels, tid, nth, &first, &last);
    /* More rows than one microkernel takes: each panel is widened to float once into a scratch panel (K * NR
     * floats, in L2), which the float microkernel then applies to every block of rows. */
    float *scratch = m > LINEAR_MR ? malloc(sizeof(float) * k * LINEAR_NR) : NULL;
    if (scratch) {
        for (int64_t j = first; j < last; j++) {
            dequantize_panel(w->data + j * panel_bytes, w->scales + j * panel_floats,
                             w->offsets ? w->offsets + j * panel_floats : NULL, k, gs, bits, scratch);
            linear_panel_rows(x, x_stride, scratch, 1, bias, out, m, n, k, j, accumulate);
        }
        free(scratch);
        return;
    }
    for (int64_t m0 = 0; m0 < m; m0 += LINEAR_MC) {
        const int64_t rows = m - m0 < LINEAR_MC ? m - m0 : LINEAR_MC;
        const int64_t blocks = (rows + LINEAR_MR - 1) / LINEAR_MR, base = rows / blocks, extra = rows % blocks;
        for (int64_t j = first; j < last; j++) {
            float acc[LINEAR_MR * LINEAR_NR];
            const uint8_t *panel = w->data + j * panel_bytes;
            const float *s = w->scales + j * panel_floats, *o = w->offsets ? w->offsets + j * panel_floats : NULL;
            int64_t r0 = m0;
            for (int64_t b = 0; b < blocks; b++) {
                const int mr = (int)(base + (b < extra));
                const float *xb = x + r0 * x_stride;
                switch (mr) {
#define QLINEAR_CASE(rows) \
    case rows: qlinear_block(xb, x_stride, panel, s, o, k, gs, bits, rows, acc); break;
#if LINEAR_MR > 6
                    QLINEAR_CASE(12) QLINEAR_CASE(11) QLINEAR_CASE(10) QLINEAR_CASE(9) QLINEAR_CASE(8) QLINEAR_CASE(7)
#endif
                    QLINEAR_CASE(6) QLINEAR_CASE(5) QLINEAR_CASE(4) QLINEAR_CASE(3) QLINEAR_CASE(2)
                default: qlinear_block(xb, x_stride, panel, s, o, k, gs, bits, 1, acc); break;
                }
                linear_store(out + r0 * n, n, acc, mr, j * LINEAR_NR, bias, accumulate);
                r0 += mr;
            }
        }
    }
}

/* Int8 activations (inferfleet_qweight.act_block > 0): each row of x is quantized on the fly, per block of
 * act_block columns (32, 16 or 8, dividing the weight's group), to symmetric int8 (xq = rint(x * 127 / amax),
 * scale amax / 127), and the weights are multiplied by it in integers, four products summed per 32-bit lane by one
 * instruction: AVX-512 VNNI's vpdpbusd where the build has it, else AVX-512BW's or AVX2's pmaddubsw + pmaddwd, else
 * plain C. Per block, per row and output column, the int32 dot product is converted to float once and scaled; so
 * per weight the work is a quarter of an instruction per row instead of a widening and a float multiply-add.
 *
 * Those instructions take one unsigned and one signed byte, so the weight is stored unsigned, u = q + c (c = 128
 * for 8 bits, 8 for 4 bits; the 4-bit nibbles already hold q + 8), and the block's dot product is corrected by
 * c * sum(xq), which each row's quantization computes once: sum u xq - c sum xq = sum q xq. Exact in int32 (4 x
 * 255 x 127 per lane per instruction, at most 32 of them per block). pmaddubsw sums two products into a saturating
 * int16, safe for nibbles (2 x 15 x 127) but not for 8-bit u (2 x 255 x 127): 8-bit weights with int8 activations
 * take the plain C kernel on builds without VNNI (native.py picks float activations for them there).
 *
 * Layout (native.py pack_quantized with activations="int8"), per panel of NR output columns: 8 bits, [K/4][NR][4]
 * bytes (the four bytes of a 32-bit lane are one column's four consecutive k); 4 bits, [K/8][NR][4] bytes, the low
 * nibbles columns 8i..8i+3, the high nibbles 8i+4..8i+7. Scales and offsets as for float activations.
 *
 * Per row and group g: out += s[g] * sum_b sx[b] * (dot_b - c * sum_b xq) + o[g] * sum_g x, the offset's sum over
 * x in float (not rounded). Against float activations, the error is that of rounding x to 8 bits per block
 * (|x - sx xq| <= sx / 2 per element): see tests/runtime/kernels/test_native_quantized.py for the bound. */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define QDOT_ISA 3
#elif defined(__AVX512BW__)
#define QDOT_ISA 2
#elif defined(__AVX2__) && !defined(__AVX512F__)
#define QDOT_ISA 1
#else
#define QDOT_ISA 0
#endif

int inferfleet_qdot_isa(void) { return QDOT_ISA; }

/* One call's quantized rows of x: xq [M][K], per block sx [M][B] (scale) and cq [M][B] (c * sum xq), and per
 * group xsum [M][G] (sum x; only for weights with offsets). */
typedef struct {
    int8_t *xq;
    float *sx, *xsum;
    int32_t *cq;
    int64_t k, blocks, groups;
} qdot_rows;

/* Quantizes rows 0..m-1 of x into r (allocated here; free(r->xq) frees it all). Returns 0, -1 out of memory. */
static int qdot_quantize(const float *x, int64_t x_stride, int64_t m, int64_t k, int64_t gs, int64_t ab, int c,
                         int with_sums, qdot_rows *r) {
    const int64_t blocks = k / ab, groups = k / gs;
    const size_t floats = (size_t)m * (2 * blocks + (with_sums ? groups : 0));
    char *mem = malloc((size_t)m * k + sizeof(float) * floats + 64);
    if (!mem) return -1;
    r->k = k, r->blocks = blocks, r->groups = groups;
    r->xq = (int8_t *)mem; /* first, so that free(r->xq) frees the lot; the floats after it, 64-byte aligned */
    r->sx = (float *)(mem + (((size_t)m * k + 63) & ~(size_t)63));
    r->cq = (int32_t *)(r->sx + m * blocks);
    r->xsum = with_sums ? (float *)(r->cq + m * blocks) : NULL;
    for (int64_t i = 0; i < m; i++) {
        const float *xi = x + i * x_stride;
        int8_t *qi = r->xq + i * k;
        for (int64_t b = 0; b < blocks; b++) {
            const float *xb = xi + b * ab;
            float amax = 0.0f, nonfinite = 0.0f; /* x * 0 is NaN exactly for a NaN or infinite x */
            for (int64_t j = 0; j < ab; j++) {
                amax = fabsf(xb[j]) > amax ? fabsf(xb[j]) : amax;
                nonfinite += xb[j] * 0.0f;
            }
            if (nonfinite != nonfinite) { /* a NaN scale, so the outputs are NaN as the float path's would be */
                memset(qi + b * ab, 0, (size_t)ab);
                r->sx[i * blocks + b] = NAN;
                r->cq[i * blocks + b] = 0;
                continue;
            }
            const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            int32_t sum = 0;
            for (int64_t j = 0; j < ab; j++) {
                const int32_t v = (int32_t)rintf(xb[j] * inv);
                qi[b * ab + j] = (int8_t)v;
                sum += v;
            }
            r->sx[i * blocks + b] = amax / 127.0f;
            r->cq[i * blocks + b] = c * sum;
        }
        if (with_sums)
            for (int64_t g = 0; g < groups; g++) {
                float s = 0.0f;
                for (int64_t j = g * gs; j < (g + 1) * gs; j++) s += xi[j];
                r->xsum[i * groups + g] = s;
            }
    }
    return 0;
}

/* A 32-bit lane's four bytes of row `row` at column kk, as an int (memcpy: any alignment, no aliasing). */
static inline int32_t qdot_quad(const qdot_rows *r, int64_t row, int64_t kk) {
    int32_t v;
    memcpy(&v, r->xq + row * r->k + kk, sizeof v);
    return v;
}

/* The plain C kernel (any build; 8-bit weights on builds without VNNI): acc [mr * np][NR] <- rows row0.. of the
 * quantized x times np consecutive panels, in the order of the vector kernel below. */
static void qdot_block_c(const qdot_rows *xr, int64_t row0, const uint8_t *panels, int64_t panel_bytes,
                         const float *scales, const float *offsets, int64_t gs, int64_t ab, int bits, int mr, int np,
                         float *acc) {
    const int64_t k = xr->k, groups = k / gs, per_group = gs / ab;
    for (int r = 0; r < mr; r++)
        for (int q = 0; q < np; q++)
            for (int c = 0; c < LINEAR_NR; c++) {
                const uint8_t *panel = panels + q * panel_bytes;
                const int8_t *xq = xr->xq + (row0 + r) * k;
                float total = 0.0f;
                for (int64_t g = 0; g < groups; g++) {
                    float in_group = 0.0f;
                    for (int64_t b = g * per_group; b < (g + 1) * per_group; b++) {
                        int32_t dot = -xr->cq[(row0 + r) * xr->blocks + b];
                        for (int64_t kk = b * ab; kk < (b + 1) * ab; kk++) {
                            const int64_t i = kk % 4;
                            const int u = bits == 8 ? panel[((kk / 4) * LINEAR_NR + c) * 4 + i]
                                                    : (panel[((kk / 8) * LINEAR_NR + c) * 4 + i] >> (kk % 8 & 4)) & 15;
                            dot += u * xq[kk];
                        }
                        in_group += (float)dot * xr->sx[(row0 + r) * xr->blocks + b];
                    }
                    const float *s = scales + (q * groups + g) * LINEAR_NR;
                    total += in_group * s[c];
                    if (offsets) total += xr->xsum[(row0 + r) * groups + g] * offsets[(q * groups + g) * LINEAR_NR + c];
                }
                acc[(r * np + q) * LINEAR_NR + c] = total;
            }
}

#if QDOT_ISA > 0
#if QDOT_ISA >= 2
typedef __m512i qdot_vec;
#define QDOT_MR 4 /* rows per microkernel: 3 x 2 vectors per row (int32 block sums, group sums, totals) */
#define qdot_load(p) _mm512_loadu_si512((const void *)(p))
#define qdot_set1(v) _mm512_set1_epi32(v)
#define qdot_nibbles(v) _mm512_and_si512(v, _mm512_set1_epi8(15))
#define qdot_high_nibbles(v) _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(15))
#define qdot_float(v) ((linear_vec)_mm512_cvtepi32_ps(v))
#if QDOT_ISA == 3
#define qdot_dot(acc, u, s) _mm512_dpbusd_epi32(acc, u, s)
#else
#define qdot_dot(acc, u, s) _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)))
#endif
#else
typedef __m256i qdot_vec;
#define QDOT_MR 2 /* 16 registers */
#define qdot_load(p) _mm256_loadu_si256((const __m256i *)(p))
#define qdot_set1(v) _mm256_set1_epi32(v)
#define qdot_nibbles(v) _mm256_and_si256(v, _mm256_set1_epi8(15))
#define qdot_high_nibbles(v) _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(15))
#define qdot_float(v) ((linear_vec)_mm256_cvtepi32_ps(v))
#define qdot_dot(acc, u, s) _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)))
#endif
#define QDOT_GEMV_PANELS 2 /* one-row calls: 2 panels at once (4 independent sums; 4 panels spill registers) */

/* acc [mr * np][NR] <- rows row0..row0+mr-1 of the quantized x times np consecutive panels (mr = 1, np = 1 or both 2;
 * both constant per call site). Vector v of a panel row is lanes v * VW.. of its NR columns. */
static inline __attribute__((always_inline)) void qdot_block(const qdot_rows *xr, int64_t row0, const uint8_t *panels,
                                                             int64_t panel_bytes, const float *scales,
                                                             const float *offsets, int64_t gs, int64_t ab,
                                                             const int bits, const int mr, const int np, float *acc) {
    const int64_t k = xr->k, groups = k / gs, per_group = gs / ab, blocks = xr->blocks;
    linear_vec total[QDOT_MR][QDOT_GEMV_PANELS][2];
#pragma GCC unroll 4
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 2
        for (int q = 0; q < np; q++) total[r][q][0] = total[r][q][1] = (linear_vec){0};
    for (int64_t g = 0; g < groups; g++) {
        linear_vec in_group[QDOT_MR][QDOT_GEMV_PANELS][2];
#pragma GCC unroll 4
        for (int r = 0; r < mr; r++)
#pragma GCC unroll 2
            for (int q = 0; q < np; q++) in_group[r][q][0] = in_group[r][q][1] = (linear_vec){0};
        for (int64_t b = g * per_group; b < (g + 1) * per_group; b++) {
            qdot_vec dot[QDOT_MR][QDOT_GEMV_PANELS][2];
#pragma GCC unroll 4
            for (int r = 0; r < mr; r++) {
                const qdot_vec start = qdot_set1(-xr->cq[(row0 + r) * blocks + b]);
#pragma GCC unroll 2
                for (int q = 0; q < np; q++) dot[r][q][0] = dot[r][q][1] = start;
            }
            if (bits == 8) {
                for (int64_t kk = b * ab; kk < (b + 1) * ab; kk += 4) {
                    qdot_vec w[QDOT_GEMV_PANELS][2];
#pragma GCC unroll 2
                    for (int q = 0; q < np; q++) {
                        const uint8_t *p = panels + q * panel_bytes + (kk / 4) * LINEAR_NR * 4;
                        w[q][0] = qdot_load(p);
                        w[q][1] = qdot_load(p + LINEAR_VW * 4);
                    }
#pragma GCC unroll 4
                    for (int r = 0; r < mr; r++) {
                        const qdot_vec xv = qdot_set1(qdot_quad(xr, row0 + r, kk));
#pragma GCC unroll 2
                        for (int q = 0; q < np; q++) {
                            dot[r][q][0] = qdot_dot(dot[r][q][0], w[q][0], xv);
                            dot[r][q][1] = qdot_dot(dot[r][q][1], w[q][1], xv);
                        }
                    }
                }
            } else {
                for (int64_t kk = b * ab; kk < (b + 1) * ab; kk += 8) {
                    qdot_vec lo[QDOT_GEMV_PANELS][2], hi[QDOT_GEMV_PANELS][2];
#pragma GCC unroll 2
                    for (int q = 0; q < np; q++) {
                        const uint8_t *p = panels + q * panel_bytes + (kk / 8) * LINEAR_NR * 4;
                        for (int v = 0; v < 2; v++) {
                            const qdot_vec raw = qdot_load(p + v * LINEAR_VW * 4);
                            lo[q][v] = qdot_nibbles(raw);
                            hi[q][v] = qdot_high_nibbles(raw);
                        }
                    }
#pragma GCC unroll 4
                    for (int r = 0; r < mr; r++) {
                        const qdot_vec xl = qdot_set1(qdot_quad(xr, row0 + r, kk));
                        const qdot_vec xh = qdot_set1(qdot_quad(xr, row0 + r, kk + 4));
#pragma GCC unroll 2
                        for (int q = 0; q < np; q++)
                            for (int v = 0; v < 2; v++)
                                dot[r][q][v] = qdot_dot(qdot_dot(dot[r][q][v], lo[q][v], xl), hi[q][v], xh);
                    }
                }
            }
#pragma GCC unroll 4
            for (int r = 0; r < mr; r++) {
                const float sx = xr->sx[(row0 + r) * blocks + b];
#pragma GCC unroll 2
                for (int q = 0; q < np; q++)
                    for (int v = 0; v < 2; v++) in_group[r][q][v] += qdot_float(dot[r][q][v]) * sx;
            }
        }
#pragma GCC unroll 2
        for (int q = 0; q < np; q++) {
            const float *s = scales + (q * groups + g) * LINEAR_NR;
            const float *o = offsets ? offsets + (q * groups + g) * LINEAR_NR : NULL;
            for (int v = 0; v < 2; v++) {
                const linear_vec sv = *(const linear_vec_u *)(s + v * LINEAR_VW);
#pragma GCC unroll 4
                for (int r = 0; r < mr; r++) total[r][q][v] += in_group[r][q][v] * sv;
                if (o) {
                    const linear_vec ov = *(const linear_vec_u *)(o + v * LINEAR_VW);
#pragma GCC unroll 4
                    for (int r = 0; r < mr; r++) total[r][q][v] += xr->xsum[(row0 + r) * groups + g] * ov;
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 2
        for (int q = 0; q < np; q++)
            for (int v = 0; v < 2; v++)
                *(linear_vec_u *)(acc + (r * np + q) * LINEAR_NR + v * LINEAR_VW) = total[r][q][v];
}
#else
#define QDOT_MR 4
#define QDOT_GEMV_PANELS 2
#endif

/* acc as qdot_block for any mr <= QDOT_MR and np <= QDOT_GEMV_PANELS (one of them 1, or both 2 where QDOT_MR is 4):
 * a constant per case. */
static void qdot_any(const qdot_rows *xr, int64_t row0, const uint8_t *panels, int64_t panel_bytes,
                     const float *scales, const float *offsets, int64_t gs, int64_t ab, int bits, int mr, int np,
                     float *acc) {
#if QDOT_ISA > 0
    if (bits == 4 || QDOT_ISA == 3) {
#define QDOT_CASE(B, R, P)                                                                                      \
    if (bits == B && mr == R && np == P) {                                                                      \
        qdot_block(xr, row0, panels, panel_bytes, scales, offsets, gs, ab, B, R, P, acc);                       \
        return;                                                                                                 \
    }
        QDOT_CASE(4, 1, 1) QDOT_CASE(4, 1, 2) QDOT_CASE(4, 2, 1)
        QDOT_CASE(8, 1, 1) QDOT_CASE(8, 1, 2) QDOT_CASE(8, 2, 1)
#if QDOT_MR > 2
        QDOT_CASE(4, 3, 1) QDOT_CASE(4, 4, 1) QDOT_CASE(8, 3, 1) QDOT_CASE(8, 4, 1)
        QDOT_CASE(4, 2, 2) QDOT_CASE(8, 2, 2)
#endif
#undef QDOT_CASE
    }
#endif
    qdot_block_c(xr, row0, panels, panel_bytes, scales, offsets, gs, ab, bits, mr, np, acc);
}

/* qlinear_share with int8 activations: each thread quantizes the rows itself (no barrier; x is small beside the
 * weight), then takes its share of the panels as linear_share does. */
static void qdot_share(const float *x, int64_t x_stride, const inferfleet_qweight *w, const float *bias, float *out,
                       int64_t m, int64_t n, int64_t k, int accumulate, int tid, int nth) {
    const int64_t panels = (n + LINEAR_NR - 1) / LINEAR_NR, gs = w->group_size, ab = w->act_block;
    const int64_t panel_bytes = k * LINEAR_NR * w->bits / 8, panel_floats = (k / gs) * LINEAR_NR;
    qdot_rows xr;
    /* A few KiB to a few MiB; without them the process is out of memory (the float path's own scratch falls back
     * to a slower kernel, this one has none): stop rather than return wrong numbers. */
    if (qdot_quantize(x, x_stride, m, k, gs, ab, w->bits == 8 ? 128 : 8, w->offsets != NULL, &xr)) abort();
    float acc[QDOT_MR * QDOT_GEMV_PANELS * LINEAR_NR];
    int64_t first, last;
    thread_share(panels, tid, nth, &first, &last); /* panels, not groups: even shares, as linear_share */
    /* Two panels at once (two memory streams, as linear_share) for one row, and for up to 32 where a 2-row block
     * over 2 panels fits the registers (AVX-512); one panel with the most rows a block beyond. */
    const int np_most = m == 1 || (QDOT_MR > 2 && m <= 16) ? QDOT_GEMV_PANELS : 1;
    const int mr_most = np_most > 1 ? QDOT_MR / 2 : QDOT_MR;
    const int64_t blocks = (m + mr_most - 1) / mr_most, base = m / blocks, extra = m % blocks;
    for (int64_t j = first; j < last;) {
        const int np = last - j >= np_most ? np_most : 1;
        int64_t r0 = 0;
        for (int64_t b = 0; b < blocks; b++) {
            const int mr = (int)(base + (b < extra));
            qdot_any(&xr, r0, w->data + j * panel_bytes, panel_bytes, w->scales + j * panel_floats,
                     w->offsets ? w->offsets + j * panel_floats : NULL, gs, ab, (int)w->bits, mr, np, acc);
            for (int r = 0; r < mr; r++)
                for (int q = 0; q < np; q++)
                    linear_store(out + (r0 + r) * n, n, acc + (r * np + q) * LINEAR_NR, 1, (j + q) * LINEAR_NR, bias,
                                 accumulate);
            r0 += mr;
        }
        j += np;
    }
    free(xr.xq);
}

/* xq [M, K] int8 and scales [M, K / block] <- x's rows quantized as the int8-activation matmul does (for tests). */
void inferfleet_quantize_activations(const float *x, int64_t x_stride, int8_t *xq, float *scales, int64_t m,
                                     int64_t k, int64_t block) {
    qdot_rows r;
    if (qdot_quantize(x, x_stride, m, k, k, block, 0, 0, &r)) abort();
    memcpy(xq, r.xq, (size_t)(m * k));
    memcpy(scales, r.sx, sizeof(float) * m * r.blocks);
    free(r.xq);
}

static void qlinear_share(const float *x, int64_t x_stride, const inferfleet_qweight *w, const float *bias,
                          float *out, int64_t m, int64_t n, int64_t k, int accumulate, int tid, int nth) {
    if (w->act_block > 0)
        qdot_share(x, x_stride, w, bias, out, m, n, k, accumulate, tid, nth);
    else if (w->bits == 8)
        qlinear_share_bits(x, x_stride, w, 8, bias, out, m, n, k, accumulate, tid, nth);
    else
        qlinear_share_bits(x, x_stride, w, 4, bias, out, m, n, k, accumulate, tid, nth);
}

/* A linear layer of inferfleet_forward: the quantized weight where the layer has one, else the float panels. */
static void any_linear_share(const float *x, int64_t x_stride, const float *packed, const inferfleet_qweight *qw,
                             const float *bias, float *out, int64_t m, int64_t n, int64_t k, int accumulate, int tid,
                             int nth) {
    if (qw)
        qlinear_share(x, x_stride, qw, bias, out, m, n, k, accumulate, tid, nth);
    else
        linear_share(x, x_stride, packed, bias, out, m, n, k, accumulate, tid, nth);
}

/* out [M, N] <- x [M, K] (rows x_stride apart) times a quantized weight, + bias [N] when given; as
 * inferfleet_linear (K a multiple of group_size, group_size even for 4 bits: native.py checks). */
void inferfleet_qlinear(const float *x, int64_t x_stride, const inferfleet_qweight *w, const float *bias, float *out,
                        int64_t m, int64_t n, int64_t k, int num_threads) {
#pragma omp parallel num_threads(num_threads) if (m * n * k >= (1 << 18))
    qlinear_share(x, x_stride, w, bias, out, m, n, k, 0, omp_get_thread_num(), omp_get_num_threads());
}

/* The whole decoder stack of one step in one call (model.NativeForward): what the model's layers do with the ops
 * above, op for op and bit for bit, but inside one OpenMP region whose threads meet at spin barriers instead of
 * one region (and one wake-up of sleeping threads) per op, and with no Python between the ops. Per layer:
 *   normed = rms_norm(residual)              each thread its own copy (no barrier; T x H is small)
 *   qkv = normed Wqkv                        threads split the weight's panels
 *   rotary of q; rotary of k into the cache at the token's slot; v into the cache (each q and k head first
 *   RMS-normalised over D where the layer has q_norm / k_norm)
 *                                            threads split (token, kv head) pairs
 *   attn = attention over the cache (the last `window` keys in a sliding-window layer)
 *                                            threads take (token, kv head group) pairs in turn
 *   residual += attn Wo                      the o projection's store adds into the residual stream
 *   normed = rms_norm(residual); gate_up = normed Wgu; act = silu(gate) * up; residual += act Wdown
 * then out = rms_norm(residual) with the final norm. Adding the projection into the residual is the addition the
 * next norm's fused residual add did (x + r == r + x in IEEE arithmetic), so the result equals the op-by-op path. */
/* inferfleet_layer and inferfleet_model: native.h. */

/* Threads of one region waiting for each other: spinning (the waits between a step's ops are microseconds, and
 * libgomp's own barrier sleeps at once under OMP_WAIT_POLICY=PASSIVE, which the server sets), then yielding the
 * core after 2,000 pauses (0.1-0.3 ms) in case the thread waited for was descheduled. Served one request at a
 * time with a busy loop taking one of 2 cores: 88-95 tok/s with 2,000, 43-48 with 20,000, 48 yielding at once, 81
 * with 300; without the busy loop all within 266-292. */
typedef struct {
    atomic_int arrived, phase;
} spin_barrier;

static void spin_barrier_wait(spin_barrier *b, int nth) {
    if (nth == 1) return;
    const int phase = atomic_load_explicit(&b->phase, memory_order_relaxed);
    if (atomic_fetch_add_explicit(&b->arrived, 1, memory_order_acq_rel) == nth - 1) {
        atomic_store_explicit(&b->arrived, 0, memory_order_relaxed);
        atomic_store_explicit(&b->phase, phase + 1, memory_order_release);
        return;
    }
    for (long spins = 0; atomic_load_explicit(&b->phase, memory_order_acquire) == phase; spins++) {
        if (spins < 2000) {
#ifdef __SSE__
            _mm_pause();
#endif
        } else {
            sched_yield();
        }
    }
}

/* Floats of scratch inferfleet_forward needs for num_tokens tokens on num_threads threads. */
int64_t inferfleet_forward_workspace(const inferfleet_model *m, int64_t num_tokens, int num_threads) {
    const int64_t q = m->num_q_heads * m->head_dim, kv = m->num_kv_heads * m->head_dim;
    return num_tokens * ((1 + num_threads) * m->hidden + (q + 2 * kv) + 2 * q + 3 * m->intermediate);
}

/* out [T, H] <- the decoder stack over input_ids [T] at positions [T], writing each layer's keys and values at
 * slots [T] of its cache (kv_caches: key then value cache of layer 0, 1, ...; [blocks, block_size, Hkv, D]) and
 * attending over the sequences' block tables as inferfleet_paged_attention does. workspace: at least
 * inferfleet_forward_workspace floats. Returns 0; -1 when a buffer could not be allocated; -2 when a token id or
 * position is past the embedding's or the RoPE table's rows (nothing written). */
int inferfleet_forward(const inferfleet_model *m, float *const *kv_caches, const int64_t *input_ids,
                       const int64_t *positions, const int64_t *slots, const int32_t *block_tables,
                       int64_t block_table_stride, const int32_t *seq_lens, const int32_t *query_start_loc,
                       int64_t num_seqs, int64_t num_tokens, float *out, float *workspace, int num_threads) {
    const int64_t T = num_tokens, H = m->hidden, D = m->head_dim, Hq = m->num_q_heads, Hkv = m->num_kv_heads;
    const int64_t I = m->intermediate, q = Hq * D, kv = Hkv * D, nqkv = q + 2 * kv, group = Hq / Hkv;
    for (int64_t t = 0; t < T; t++)
        if (input_ids[t] < 0 || input_ids[t] >= m->vocab_size || positions[t] < 0 || positions[t] >= m->max_positions)
            return -2;
    int64_t *token_seq = malloc(sizeof(int64_t) * T * 2);
    if (!token_seq) return -1;
    int64_t *token_pos = token_seq + T;
    token_table(seq_lens, query_start_loc, num_seqs, 0, token_seq, token_pos);
    float *residual = workspace, *qkv = residual + T * H, *q_rot = qkv + T * nqkv, *attn = q_rot + T * q;
    float *gate_up = attn + T * q, *act = gate_up + T * 2 * I, *normed_all = act + T * I;
    spin_barrier barrier = {0, 0};
#pragma omp parallel num_threads(num_threads)
    {
        const int tid = omp_get_thread_num(), nth = omp_get_num_threads();
        float *normed = normed_all + tid * T * H;
        int64_t first, last;
        thread_share(T, tid, nth, &first, &last);
        for (int64_t t = first; t < last; t++) {
            if (m->embed_q) {
                const int8_t *row = m->embed_q + input_ids[t] * H;
                const float scale = m->embed_scales[input_ids[t]];
                for (int64_t h = 0; h < H; h++) residual[t * H + h] = (float)row[h] * scale;
            } else {
                memcpy(residual + t * H, m->embed + input_ids[t] * H, sizeof(float) * H);
            }
        }
        spin_barrier_wait(&barrier, nth);
        for (int64_t l = 0; l < m->num_layers; l++) {
            const inferfleet_layer *w = m->layers + l;
            float *key_cache = kv_caches[2 * l], *value_cache = kv_caches[2 * l + 1];
            inferfleet_rms_norm(residual, H, NULL, w->input_norm, normed, NULL, T, H, m->eps);
            any_linear_share(normed, H, w->qkv, w->qkv_q, w->qkv_bias, qkv, T, nqkv, H, 0, tid, nth);
            spin_barrier_wait(&barrier, nth);
            thread_share(T * Hkv, tid, nth, &first, &last);
            for (int64_t i = first; i < last; i++) {
                const int64_t t = i / Hkv, g = i % Hkv;
                const float *row = qkv + t * nqkv, *cos_sin = m->cos_sin + positions[t] * D;
                float head[D]; /* a normalised head: inferfleet_rms_norm over one row, as the op-by-op path does */
                for (int64_t h = g * group; h < (g + 1) * group; h++) {
                    const float *x = row + h * D;
                    if (w->q_norm) inferfleet_rms_norm(x, D, NULL, w->q_norm, head, NULL, 1, D, m->eps);
                    rotate_head(w->q_norm ? head : x, q_rot + (t * Hq + h) * D, cos_sin, D / 2);
                }
                const float *k = row + q + g * D;
                if (w->k_norm) inferfleet_rms_norm(k, D, NULL, w->k_norm, head, NULL, 1, D, m->eps);
                rotate_head(w->k_norm ? head : k, key_cache + slots[t] * kv + g * D, cos_sin, D / 2);
                memcpy(value_cache + slots[t] * kv + g * D, row + q + kv + g * D, sizeof(float) * D);
            }
            spin_barrier_wait(&barrier, nth);
            /* Units taken in turn (later tokens of a prompt attend to more keys): whole tokens, each reading its
             * keys' and values' rows whole and in order (a step's cache is read from memory: sequential rows beat a
             * unit per kv head, whose reads skip through every row; figures in docs/performance/2026-12-07-figures-
             * from-code-comments.md), or, with too few
             * tokens to keep the threads busy, a kv head of a token each. */
            const int64_t heads_per_unit = T >= 4 * nth ? Hkv : 1;
            for (int64_t i = tid; i < T * Hkv / heads_per_unit; i += nth) {
                const int64_t t = i * heads_per_unit / Hkv, g = i * heads_per_unit % Hkv;
                const int64_t offset = (t * Hq + g * group) * D;
                attend_any(q_rot + offset, attn + offset, key_cache + g * D, value_cache + g * D,
                           block_tables + token_seq[t] * block_table_stride, first_key(token_pos[t], w->window),
                           token_pos[t], heads_per_unit * group, group, kv, D, m->block_size, m->scale);
            }
            spin_barrier_wait(&barrier, nth);
            any_linear_share(attn, q, w->o, w->o_q, w->o_bias, residual, T, H, q, 1, tid, nth);
            spin_barrier_wait(&barrier, nth);
            inferfleet_rms_norm(residual, H, NULL, w->post_norm, normed, NULL, T, H, m->eps);
            any_linear_share(normed, H, w->gate_up, w->gate_up_q, w->gate_up_bias, gate_up, T, 2 * I, H, 0, tid, nth);
            spin_barrier_wait(&barrier, nth);
            thread_share(I, tid, nth, &first, &last);
            {
                FLUSH_DENORMALS(csr); /* see inferfleet_silu_and_mul */
                for (int64_t t = 0; t < T; t++)
                    silu_mul(gate_up + t * 2 * I + first, gate_up + t * 2 * I + I + first, act + t * I + first,
                             last - first);
                RESTORE_DENORMALS(csr);
            }
            spin_barrier_wait(&barrier, nth);
            any_linear_share(act, I, w->down, w->down_q, w->down_bias, residual, T, H, I, 1, tid, nth);
            spin_barrier_wait(&barrier, nth);
        }
        thread_share(T, tid, nth, &first, &last);
        inferfleet_rms_norm(residual + first * H, H, NULL, m->final_norm, out + first * H, NULL, last - first, H, m->eps);
    }
    free(token_seq);
    return 0;
}
