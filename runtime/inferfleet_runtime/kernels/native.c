/* CPU kernels of the "native" backend: float32, one C call per op instead of the reference's chains of torch ops.
 *
 * Built at first use by native.py (cc -O3 -march=native -fopenmp) and called through ctypes with raw pointers;
 * every shape, stride and layout check happens in native.py before the call. The math of each op is its
 * reference's in the module named beside it (rms_norm.py, rotary.py, activation.py, kv_cache.py,
 * paged_attention.py). Written for this project; the attention is the online-softmax (flash) formulation
 * over the block-table cache layout.
 *
 * Also the linear layers' matmul over weights repacked once (inferfleet_pack_linear, model.NativeLinear).
 *
 * Parallelism: only the attention and the linear layers have enough work per call to pay for waking threads;
 * they run on up to `num_threads` OpenMP threads (the libgomp torch already loaded, so one thread pool). The
 * element-wise ops run on the calling thread.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE__
#include <xmmintrin.h>
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

/* Rotates the first and second halves of each head (GPT-NeoX layout) by the position's cos/sin row:
 * out = (x1 cos - x2 sin, x2 cos + x1 sin). x rows are token_stride apart, heads head_dim apart. */
static void rotate_heads(const float *x, int64_t token_stride, float *out, const int64_t *positions,
                         const float *cos_sin, int64_t num_tokens, int64_t num_heads, int64_t head_dim) {
    const int64_t half = head_dim / 2;
    for (int64_t t = 0; t < num_tokens; t++) {
        const float *cos = cos_sin + positions[t] * head_dim, *sin = cos + half;
        for (int64_t h = 0; h < num_heads; h++) {
            const float *x1 = x + t * token_stride + h * head_dim, *x2 = x1 + half;
            float *o1 = out + (t * num_heads + h) * head_dim, *o2 = o1 + half;
#pragma omp simd
            for (int64_t i = 0; i < half; i++) {
                o1[i] = x1[i] * cos[i] - x2[i] * sin[i];
                o2[i] = x2[i] * cos[i] + x1[i] * sin[i];
            }
        }
    }
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
 * denormal result costs Intel cores a microcode assist: 225 us instead of 25 us for 32 x 1376 values. Only values
 * below 1.2e-38 change (to 0). */
void inferfleet_silu_and_mul(const float *x, float *out, int64_t num_tokens, int64_t inter) {
#ifdef __SSE__
    const unsigned int csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040); /* FTZ | DAZ */
#endif
    for (int64_t t = 0; t < num_tokens; t++) {
        const float *gate = x + t * 2 * inter, *up = gate + inter;
        float *o = out + t * inter;
#pragma omp simd
        for (int64_t i = 0; i < inter; i++) o[i] = gate[i] / (1.0f + fast_exp(-gate[i])) * up[i];
    }
#ifdef __SSE__
    _mm_setcsr(csr);
#endif
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

/* One query token, all its heads, over keys 0..last of its sequence, a cache block at a time: the block's
 * rows are read in order (every kv head of a row is adjacent), each kv head's row once for its whole GQA
 * group; per block, each head's scores, then one online-softmax rescale of its accumulator. Inlined at each call
 * site, so the common shapes get loops of a known length (see inferfleet_paged_attention). */
static inline __attribute__((always_inline)) void attend(const float *q, float *out, const float *key_cache, const float *value_cache,
                   const int32_t *block_table, int64_t last, int64_t num_q_heads, int64_t num_kv_heads,
                   int64_t head_dim, int64_t block_size, float scale) {
    /* On the stack: num_q_heads * (head_dim + block_size + 2) floats (Llama-3-70B: 64 * 146, 37 KiB). */
    float acc[num_q_heads][head_dim];
    float scores[num_q_heads][block_size];
    float running_max[num_q_heads], running_sum[num_q_heads];
    for (int64_t h = 0; h < num_q_heads; h++) {
        running_max[h] = -INFINITY;
        running_sum[h] = 0.0f;
        for (int64_t d = 0; d < head_dim; d++) acc[h][d] = 0.0f;
    }
    const int64_t group = num_q_heads / num_kv_heads, row = num_kv_heads * head_dim;
    for (int64_t start = 0; start <= last; start += block_size) {
        const int64_t n = (last - start + 1) < block_size ? (last - start + 1) : block_size;
        const int64_t base = (int64_t)block_table[start / block_size] * block_size * row;
        const float *keys = key_cache + base, *values = value_cache + base;
        for (int64_t j = 0; j < n; j++) {
            for (int64_t h = 0; h < num_q_heads; h++) {
                const float *qh = q + h * head_dim, *kj = keys + j * row + (h / group) * head_dim;
                float s = 0.0f;
#pragma omp simd reduction(+ : s)
                for (int64_t d = 0; d < head_dim; d++) s += qh[d] * kj[d];
                scores[h][j] = s * scale;
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
        for (int64_t j = 0; j < n; j++) {
            for (int64_t h = 0; h < num_q_heads; h++) {
                const float p = scores[h][j], *vj = values + j * row + (h / group) * head_dim;
                float *a = acc[h];
#pragma omp simd
                for (int64_t d = 0; d < head_dim; d++) a[d] += p * vj[d];
            }
        }
    }
    for (int64_t h = 0; h < num_q_heads; h++) {
        const float inv = 1.0f / running_sum[h];
        float *o = out + h * head_dim;
        for (int64_t d = 0; d < head_dim; d++) o[d] = acc[h][d] * inv;
    }
}

/* Causal attention of each new token over its sequence's cached context (paged_attention.py's layouts).
 * query_start_loc NULL: decode, token i is sequence i's only new token. Returns 0, or -1 when a buffer
 * could not be allocated. */
int inferfleet_paged_attention(const float *query, float *out, const float *key_cache, const float *value_cache,
                               const int32_t *block_tables, int64_t block_table_stride, const int32_t *seq_lens,
                               const int32_t *query_start_loc, int64_t num_seqs, int64_t num_tokens,
                               int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
                               float scale, int num_threads) {
    /* Each token's sequence and position, so the tokens below are independent. */
    int64_t *token_seq = malloc(sizeof(int64_t) * num_tokens * 2);
    if (!token_seq) return -1;
    int64_t *token_pos = token_seq + num_tokens;
    int64_t num_keys = 0;
    for (int64_t b = 0; b < num_seqs; b++) {
        const int64_t begin = query_start_loc ? query_start_loc[b] : b;
        const int64_t end = query_start_loc ? query_start_loc[b + 1] : b + 1;
        for (int64_t t = begin; t < end; t++) {
            token_seq[t] = b;
            token_pos[t] = seq_lens[b] - (end - t);
            num_keys += token_pos[t] + 1;
        }
    }
    /* Below ~1k key rows (tens of microseconds) waking threads costs about what it saves. */
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads) if (num_keys >= 1024)
    for (int64_t t = 0; t < num_tokens; t++) {
        const int64_t offset = t * num_q_heads * head_dim;
        const int32_t *table = block_tables + token_seq[t] * block_table_stride;
        /* Head dims 64 and 128 with 16-token blocks as constants: unrolled loops without remainders (decode of 32
         * sequences of 100 tokens, 8 query heads of 64: 540 instead of 690 us on one thread). */
        if (head_dim == 64 && block_size == 16)
            attend(query + offset, out + offset, key_cache, value_cache, table, token_pos[t], num_q_heads, num_kv_heads,
                   64, 16, scale);
        else if (head_dim == 128 && block_size == 16)
            attend(query + offset, out + offset, key_cache, value_cache, table, token_pos[t], num_q_heads, num_kv_heads,
                   128, 16, scale);
        else
            attend(query + offset, out + offset, key_cache, value_cache, table, token_pos[t], num_q_heads, num_kv_heads,
                   head_dim, block_size, scale);
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

/* acc [mr][NR] <- x rows 0..mr-1 (x_stride apart) times one panel. Called with a constant mr, so each call site
 * is its own unrolled kernel with the accumulators in registers. */
static inline __attribute__((always_inline)) void linear_block(const float *x, int64_t x_stride, const float *panel,
                                                               int64_t k, const int mr, float *acc) {
    linear_vec a[LINEAR_MR][2];
#pragma GCC unroll 12
    for (int r = 0; r < LINEAR_MR; r++) a[r][0] = a[r][1] = (linear_vec){0};
    for (int64_t kk = 0; kk < k; kk++) {
        const linear_vec w0 = *(const linear_vec_u *)(panel + kk * LINEAR_NR);
        const linear_vec w1 = *(const linear_vec_u *)(panel + kk * LINEAR_NR + LINEAR_VW);
#pragma GCC unroll 12
        for (int r = 0; r < mr; r++) {
            const float b = x[r * x_stride + kk];
            a[r][0] += b * w0;
            a[r][1] += b * w1;
        }
    }
#pragma GCC unroll 12
    for (int r = 0; r < mr; r++) {
        *(linear_vec_u *)(acc + r * LINEAR_NR) = a[r][0];
        *(linear_vec_u *)(acc + r * LINEAR_NR + LINEAR_VW) = a[r][1];
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

/* out rows 0..rows-1 (N apart), columns col.. of one panel <- acc (+ bias), cut at N. */
static void linear_store(float *out, int64_t n, const float *acc, int rows, int64_t col, const float *bias) {
    const int64_t width = n - col < LINEAR_NR ? n - col : LINEAR_NR;
    for (int r = 0; r < rows; r++)
        for (int64_t c = 0; c < width; c++) out[r * n + col + c] = acc[r * LINEAR_NR + c] + (bias ? bias[col + c] : 0.0f);
}

/* out [M, N] <- x [M, K] (rows x_stride apart) times the packed weight, + bias [N] when given. Threads split the
 * panels; a call under ~256k multiply-adds runs on the calling thread (waking threads would cost more). */
void inferfleet_linear(const float *x, int64_t x_stride, const float *packed, const float *bias, float *out, int64_t m,
                       int64_t n, int64_t k, int num_threads) {
    const int64_t panels = (n + LINEAR_NR - 1) / LINEAR_NR;
    const int parallel = m * n * k >= (1 << 18);
    if (m == 1) {
        const int64_t groups = (panels + LINEAR_GEMV_PANELS - 1) / LINEAR_GEMV_PANELS;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (parallel)
        for (int64_t g = 0; g < groups; g++) {
            float acc[LINEAR_GEMV_PANELS * LINEAR_NR];
            const int64_t first = g * LINEAR_GEMV_PANELS;
            const int np = panels - first < LINEAR_GEMV_PANELS ? (int)(panels - first) : LINEAR_GEMV_PANELS;
            const float *w = packed + first * k * LINEAR_NR;
            switch (np) {
            case 4: linear_row(x, w, k, 4, acc); break;
            case 3: linear_row(x, w, k, 3, acc); break;
            case 2: linear_row(x, w, k, 2, acc); break;
            default: linear_row(x, w, k, 1, acc); break;
            }
            for (int q = 0; q < np; q++) linear_store(out, n, acc + q * LINEAR_NR, 1, (first + q) * LINEAR_NR, bias);
        }
        return;
    }
    for (int64_t m0 = 0; m0 < m; m0 += LINEAR_MC) {
        const int64_t rows = m - m0 < LINEAR_MC ? m - m0 : LINEAR_MC;
        /* The chunk's rows in blocks of at most MR, as even as they go (with 6 per block, 8 rows: 4 + 4, not 6 + 2). */
        const int64_t blocks = (rows + LINEAR_MR - 1) / LINEAR_MR, base = rows / blocks, extra = rows % blocks;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (parallel)
        for (int64_t j = 0; j < panels; j++) {
            float acc[LINEAR_MR * LINEAR_NR];
            const float *panel = packed + j * k * LINEAR_NR;
            int64_t r0 = m0;
            for (int64_t b = 0; b < blocks; b++) {
                const int mr = (int)(base + (b < extra));
                const float *xb = x + r0 * x_stride;
                switch (mr) {
#define LINEAR_CASE(rows) \
    case rows: linear_block(xb, x_stride, panel, k, rows, acc); break;
#if LINEAR_MR > 6
                    LINEAR_CASE(12) LINEAR_CASE(11) LINEAR_CASE(10) LINEAR_CASE(9) LINEAR_CASE(8) LINEAR_CASE(7)
#endif
                    LINEAR_CASE(6) LINEAR_CASE(5) LINEAR_CASE(4) LINEAR_CASE(3) LINEAR_CASE(2)
                default: linear_block(xb, x_stride, panel, k, 1, acc); break;
                }
                linear_store(out + r0 * n, n, acc, mr, j * LINEAR_NR, bias);
                r0 += mr;
            }
        }
    }
}
