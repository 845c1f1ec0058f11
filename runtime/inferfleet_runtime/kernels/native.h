/* The native kernels' ABI: the structs and functions native.c exports, in one place. native.c includes it (so its
 * definitions are checked against these declarations) and native.py mirrors it with ctypes (SIGNATURES, _QWeight,
 * _Layer, _Model); tests/runtime/kernels/test_native_abi.py holds the two equal: every function's return and
 * argument types, every struct's field names, order, offsets and size. Shapes, strides and layouts are checked in
 * native.py before any call; see native.c for what each function computes. */
#ifndef INFERFLEET_NATIVE_H
#define INFERFLEET_NATIVE_H

#include <stdint.h>

/* A weight-only int8 / int4 matrix in matmul panels (native.py pack_quantized): W = q * scale + offset per group. */
typedef struct {
    int64_t bits, group_size;
    const uint8_t *data;
    const float *scales, *offsets; /* [panels][G][NR] each; offsets NULL: all 0 (symmetric int8) */
    int64_t act_block; /* 0: float activations; > 0: activations quantized to int8 per act_block columns, and data
                        * in the integer dot-product layout (native.c, "Int8 activations") */
} inferfleet_qweight;

/* One decoder layer for inferfleet_forward; a NULL float pointer is an absent bias or norm. */
typedef struct {
    const float *input_norm, *qkv, *qkv_bias, *o, *o_bias, *post_norm, *gate_up, *gate_up_bias, *down, *down_bias;
    const float *q_norm, *k_norm; /* [D] each, or NULL: every head of q and of k RMS-normalised before RoPE (Qwen3) */
    int64_t window;               /* > 0: a sliding-window layer's window (see inferfleet_paged_attention); 0: none */
    /* A quantized linear's weight, or NULL where the layer's float panels above serve (each slot its own kind). */
    const inferfleet_qweight *qkv_q, *o_q, *gate_up_q, *down_q;
} inferfleet_layer;

typedef struct {
    int64_t num_layers, hidden, num_q_heads, num_kv_heads, head_dim, intermediate, block_size;
    int64_t vocab_size, max_positions; /* rows of embed and of cos_sin */
    float eps, scale;
    const float *embed, *final_norm, *cos_sin; /* [V, H] (NULL when embed_q is given), [H], [positions, D] */
    const int8_t *embed_q; const float *embed_scales; /* or the embedding as int8 rows [V, H] times scales [V] */
    const inferfleet_layer *layers;
} inferfleet_model;

void inferfleet_rms_norm(const float *x, int64_t x_stride, const float *residual, const float *weight, float *out,
    float *residual_out, int64_t num_tokens, int64_t hidden, float eps);
void inferfleet_rotary(const float *q, int64_t q_stride, const float *k, int64_t k_stride, float *q_out, float *k_out,
    const int64_t *positions, const float *cos_sin, int64_t num_tokens, int64_t num_q_heads, int64_t num_kv_heads,
    int64_t head_dim);
void inferfleet_silu_and_mul(const float *x, float *out, int64_t num_tokens, int64_t inter);
void inferfleet_write_kv(const float *key, int64_t key_stride, const float *value, int64_t value_stride,
    float *key_cache, float *value_cache, const int64_t *slots, int64_t num_tokens, int64_t row);
int inferfleet_paged_attention(const float *query, float *out, const float *key_cache, const float *value_cache,
    const int32_t *block_tables, int64_t block_table_stride, const int32_t *seq_lens, const int32_t *query_start_loc,
    int64_t num_seqs, int64_t num_tokens, int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim,
    int64_t block_size, float scale, int64_t window, int num_threads);
int inferfleet_linear_panel_width(void);
void inferfleet_pack_linear(const float *w, int64_t w_stride, float *packed, int64_t n, int64_t k);
void inferfleet_linear(const float *x, int64_t x_stride, const float *packed, const float *bias, float *out, int64_t m,
    int64_t n, int64_t k, int num_threads);
void inferfleet_qlinear(const float *x, int64_t x_stride, const inferfleet_qweight *w, const float *bias, float *out,
    int64_t m, int64_t n, int64_t k, int num_threads);
int inferfleet_qdot_isa(void);
void inferfleet_quantize_activations(const float *x, int64_t x_stride, int8_t *xq, float *scales, int64_t m,
    int64_t k, int64_t block);
int64_t inferfleet_forward_workspace(const inferfleet_model *m, int64_t num_tokens, int num_threads);
int inferfleet_forward(const inferfleet_model *m, float *const *kv_caches, const int64_t *input_ids,
    const int64_t *positions, const int64_t *slots, const int32_t *block_tables, int64_t block_table_stride,
    const int32_t *seq_lens, const int32_t *query_start_loc, int64_t num_seqs, int64_t num_tokens, float *out,
    float *workspace, int num_threads);

#endif
