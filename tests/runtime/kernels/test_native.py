"""The native (C, CPU float32) kernels match their torch references, the model through them gives the reference's
greedy tokens, and the facade picks them on a CPU only when they build."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch import nn

import inferfleet_runtime.kernels as kernels
from inferfleet_runtime.checkpoints.loader import load_model
from inferfleet_runtime.kernels import REFERENCE_OPS, get_ops, native
from inferfleet_runtime.layers.attention_backend import allocate_kv_cache
from inferfleet_runtime.layers.linear import NativeLinear, pack_linears

from ..support.native_runs import fused_and_op_by_op, paged_steps
from ..support.paged_batches import DECODE_SEQ_LENS, VARLEN_BATCH, WINDOWS, make_paged_batch, varlen_query
from ..support.paged_greedy import greedy_paged

pytestmark = pytest.mark.skipif(native.library() is None, reason="no C compiler here: native kernels unavailable")

NATIVE = get_ops("native")
TOLERANCE = dict(atol=2e-5, rtol=2e-5)
HEAD_CONFIGS = [(4, 4), (4, 2), (8, 2), (4, 1)]  # GQA ratios 1, 2, 4 and MQA


def fused_qkv(num_tokens, num_heads, num_kv_heads, head_dim, seed=0):
    """q, k, v as the model has them: column slices of one fused projection (rows strided, heads packed)."""
    gen = torch.Generator().manual_seed(seed)
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    qkv = torch.randn(num_tokens, q_size + 2 * kv_size, generator=gen)
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    return (
        q.view(num_tokens, num_heads, head_dim),
        k.view(num_tokens, num_kv_heads, head_dim),
        v.view(num_tokens, num_kv_heads, head_dim),
    )


@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_reference(with_residual):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(7, 96, generator=gen)[:, :80]  # rows strided: a slice of a wider tensor
    weight = torch.randn(80, generator=gen)
    residual = torch.randn(7, 80, generator=gen) if with_residual else None
    out, residual_out = NATIVE.rms_norm(x, weight, 1e-5, residual)
    expected, expected_residual = REFERENCE_OPS.rms_norm(x, weight, 1e-5, residual)
    torch.testing.assert_close(out, expected, **TOLERANCE)
    torch.testing.assert_close(residual_out, expected_residual, **TOLERANCE)


@pytest.mark.parametrize("head_dim", [16, 80, 128])
def test_rotary_matches_reference_on_fused_qkv_slices(head_dim):
    q, k, _ = fused_qkv(6, 8, 2, head_dim)
    cos_sin_cache = torch.randn(64, head_dim)
    positions = torch.tensor([0, 5, 63, 7, 7, 31])
    got = NATIVE.rotary(q, k, positions, cos_sin_cache)
    expected = REFERENCE_OPS.rotary(q, k, positions, cos_sin_cache)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, **TOLERANCE)


def test_silu_and_mul_matches_reference_over_the_whole_range():
    x = torch.linspace(-120, 120, 9 * 2 * 50).reshape(9, 100)  # exp's clamps at both ends included
    torch.testing.assert_close(NATIVE.silu_and_mul(x), REFERENCE_OPS.silu_and_mul(x), **TOLERANCE)


def test_write_kv_matches_reference():
    _, k, v = fused_qkv(5, 4, 2, 16)
    caches = [torch.zeros(6, 4, 2, 16) for _ in range(4)]
    slots = torch.tensor([3, 17, 4, 22, 9])
    NATIVE.write_kv(k, v, caches[0], caches[1], slots)
    REFERENCE_OPS.write_kv(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    assert caches[0].abs().sum() > 0


@pytest.mark.parametrize("block_size", [8, 16])
@pytest.mark.parametrize("head_dim", [64, 80, 128])
@pytest.mark.parametrize("heads", HEAD_CONFIGS, ids=lambda h: f"h{h[0]}kv{h[1]}")
def test_decode_attention_matches_reference(block_size, head_dim, heads):
    num_heads, num_kv_heads = heads
    key_cache, value_cache, block_tables, seq_lens = make_paged_batch(
        DECODE_SEQ_LENS + [300], block_size, num_kv_heads, head_dim, torch.float32
    )
    query = torch.randn(len(DECODE_SEQ_LENS) + 1, num_heads, head_dim, generator=torch.Generator().manual_seed(2))
    args = (query, key_cache, value_cache, block_tables, seq_lens, head_dim**-0.5)
    torch.testing.assert_close(NATIVE.paged_attention(*args), REFERENCE_OPS.paged_attention(*args), **TOLERANCE)


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("block_size", [8, 16])
def test_windowed_attention_matches_reference(block_size, window):
    num_heads, num_kv_heads, head_dim = 4, 2, 64
    seq_lens = [s for s, _ in VARLEN_BATCH]
    key_cache, value_cache, block_tables, seq_lens_t = make_paged_batch(
        seq_lens, block_size, num_kv_heads, head_dim, torch.float32
    )
    query, query_start_loc, max_q = varlen_query(VARLEN_BATCH, num_heads, head_dim, torch.float32)
    args = (query, key_cache, value_cache, block_tables, seq_lens_t, head_dim**-0.5)
    kwargs = dict(query_start_loc=query_start_loc, max_query_len=max_q, window=window)
    got = NATIVE.paged_attention(*args, **kwargs)
    torch.testing.assert_close(got, REFERENCE_OPS.paged_attention(*args, **kwargs), **TOLERANCE)
    decode = (query[: len(seq_lens)], key_cache, value_cache, block_tables, seq_lens_t, head_dim**-0.5)
    got = NATIVE.paged_attention(*decode, window=window)
    torch.testing.assert_close(got, REFERENCE_OPS.paged_attention(*decode, window=window), **TOLERANCE)


@pytest.mark.parametrize("block_size", [8, 16])
@pytest.mark.parametrize("heads", HEAD_CONFIGS, ids=lambda h: f"h{h[0]}kv{h[1]}")
def test_prefill_and_extend_attention_match_reference(block_size, heads):
    num_heads, num_kv_heads, head_dim = heads[0], heads[1], 64
    key_cache, value_cache, block_tables, seq_lens = make_paged_batch(
        [s for s, _ in VARLEN_BATCH], block_size, num_kv_heads, head_dim, torch.float32
    )
    query, query_start_loc, max_q = varlen_query(VARLEN_BATCH, num_heads, head_dim, torch.float32)
    args = (query, key_cache, value_cache, block_tables, seq_lens, head_dim**-0.5)
    kwargs = dict(query_start_loc=query_start_loc, max_query_len=max_q)
    got = NATIVE.paged_attention(*args, **kwargs)
    torch.testing.assert_close(got, REFERENCE_OPS.paged_attention(*args, **kwargs), **TOLERANCE)


def test_attention_on_many_threads_matches_one(monkeypatch):
    """Enough key rows that the kernel runs its tokens on an OpenMP team: the same result as one thread."""
    key_cache, value_cache, block_tables, seq_lens = make_paged_batch([500] * 8, 16, 2, 64, torch.float32)
    query = torch.randn(8, 4, 64, generator=torch.Generator().manual_seed(3))
    args = (query, key_cache, value_cache, block_tables, seq_lens, 0.125)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = NATIVE.paged_attention(*args)
        torch.set_num_threads(2)
        two = NATIVE.paged_attention(*args)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)
    torch.testing.assert_close(two, REFERENCE_OPS.paged_attention(*args), **TOLERANCE)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 1), (17, 5), (200, 96), (512, 512), (1376, 512)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_native_linear_equals_nn_linear(shape, bias):
    """Rows from none to past one pass over the weights (96), every microkernel height with 4, 2 and 1 panels at
    once (up to 3 rows, 4 to 32, more), output widths that end inside a panel, odd panel counts per thread."""
    out_features, in_features = shape
    torch.manual_seed(out_features)
    linear = nn.Linear(in_features, out_features, bias=bias)
    native_linear = NativeLinear(linear)
    for rows in [0, 1, 2, 3, 4, 5, 7, 8, 13, 32, 33, 97, 200]:
        x = torch.randn(rows, in_features)
        with torch.inference_mode():
            torch.testing.assert_close(native_linear(x), linear(x), rtol=1e-4, atol=1e-4)


def test_native_linear_reads_strided_and_transposed_rows():
    torch.manual_seed(0)
    linear = nn.Linear(80, 70)
    native_linear = NativeLinear(linear)
    wide = torch.randn(9, 96)
    with torch.inference_mode():
        torch.testing.assert_close(native_linear(wide[:, 8:88]), linear(wide[:, 8:88]), rtol=1e-4, atol=1e-4)
        x = torch.randn(9, 80)
        torch.testing.assert_close(native_linear(x.t().contiguous().t()), linear(x), rtol=1e-4, atol=1e-4)


def test_native_linear_on_many_threads_matches_one():
    """Large enough to run on an OpenMP team (the panels split between threads): the same bits as one thread."""
    torch.manual_seed(1)
    native_linear = NativeLinear(nn.Linear(512, 1000))
    before = torch.get_num_threads()
    try:
        for rows in [1, 8, 40]:
            x = torch.randn(rows, 512)
            torch.set_num_threads(1)
            one = native_linear(x)
            torch.set_num_threads(2)
            assert torch.equal(native_linear(x), one)
    finally:
        torch.set_num_threads(before)


def test_native_linear_refuses_a_weight_packed_for_another_shape():
    packed = native.pack_linear(torch.randn(64, 32))
    with pytest.raises(ValueError, match="not \\[64, 48\\]"):
        native.linear(torch.randn(2, 48), packed, None, 64)


def test_pack_linears_gives_a_native_model_native_linears_everywhere(tiny_llama_factory):
    model_dir = tiny_llama_factory("native-linears", num_attention_heads=4, num_key_value_heads=2)
    lm = load_model(model_dir, device="cpu", kernels="native")
    assert pack_linears(lm.model) == 4 * lm.config.num_layers + 1  # small layers too: no per-call cost to avoid
    assert not any(isinstance(m, nn.Linear) for m in lm.model.modules())
    assert isinstance(lm.model.lm_head, NativeLinear)


def test_wrong_dtype_is_refused_with_the_tensor_named():
    with pytest.raises(ValueError, match="float32 CPU tensors.*x is torch.float16"):
        NATIVE.rms_norm(torch.randn(2, 8).half(), torch.ones(8), 1e-5)
    with pytest.raises(ValueError, match="runs float32 models on a CPU"):
        get_ops("native", torch.float16)


@pytest.mark.slow
def test_greedy_tokens_through_native_kernels_match_reference(tiny_llama_factory):
    model_dir = tiny_llama_factory("native-gqa", num_attention_heads=4, num_key_value_heads=2)
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, 384, (n,), generator=gen).tolist() for n in [1, 3, 8, 13]]
    reference = load_model(model_dir, device="cpu", kernels="reference")
    expected = greedy_paged(reference.model, prompts, 5, block_size=4, chunk_size=5)
    native_lm = load_model(model_dir, device="cpu", kernels="auto")
    assert native_lm.model.ops.backend == "native"
    assert greedy_paged(native_lm.model, prompts, 5, block_size=4, chunk_size=5) == expected
    assert len({tuple(out) for out in expected}) == len(prompts), "degenerate reference outputs prove little"


def test_auto_picks_native_for_float32_on_a_cpu(monkeypatch):
    monkeypatch.setattr(kernels, "has_triton_device", lambda: False)
    assert get_ops("auto", torch.float32, torch.device("cpu")).backend == "native"
    assert get_ops("auto", torch.float16, torch.device("cpu")).backend == "reference"


@pytest.mark.slow
def test_without_a_compiler_auto_falls_back_to_reference_and_says_why(tmp_path):
    code = (
        "import torch, inferfleet_runtime.kernels as k\n"
        "print(k.get_ops('auto', torch.float32, torch.device('cpu')).backend)\n"
        "print(k.native.unavailable_reason())\n"
    )
    env = dict(os.environ, CC=str(tmp_path / "no-such-cc"), INFERFLEET_KERNEL_CACHE=str(tmp_path / "kernels"))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    backend, reason = result.stdout.splitlines()
    assert backend == "reference"
    assert "native kernels unavailable" in reason and "no-such-cc" in reason
    assert "native kernels unavailable" in result.stderr  # logged as a warning too


@pytest.mark.slow
def test_build_lands_in_the_kernel_cache_and_is_reused(tmp_path):
    code = "import inferfleet_runtime.kernels.native as n; print(n.library() is not None)"
    env = dict(os.environ, INFERFLEET_KERNEL_CACHE=str(tmp_path))
    built_at = []
    for _ in range(2):
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert result.stdout.strip() == "True", result.stderr
        built = list(tmp_path.glob("native-*.so"))
        assert len(built) == 1 and not list(tmp_path.glob(".native-*")), list(tmp_path.iterdir())
        built_at.append(built[0].stat().st_mtime_ns)
    assert built_at[0] == built_at[1], "the second process rebuilt instead of loading the cached build"


FORWARD_CONFIGS = {
    "gqa": dict(num_attention_heads=4, num_key_value_heads=2),
    "mqa-bias-wide-heads": dict(num_key_value_heads=1, head_dim=32, attention_bias=True, mlp_bias=True),
    "head-dim-64": dict(num_attention_heads=2, num_key_value_heads=2, hidden_size=128),
    "qwen3-qk-norm": dict(classes=("Qwen3Config", "Qwen3ForCausalLM"), head_dim=32, attention_bias=True),
    # A window of 7 keys: inside a 16-token block, then across a block edge as the contexts grow.
    "mistral-window": dict(classes=("MistralConfig", "MistralForCausalLM"), sliding_window=7),
}


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("name", list(FORWARD_CONFIGS))
def test_one_call_forward_equals_the_op_by_op_native_path_bit_for_bit(tiny_llama_factory, name, threads):
    # A prefill of three prompts in chunks (one extending its cached prefix), then decodes of all three, through
    # native.forward (what pack_linears sets up) and through the layers' op-by-op native kernels: the same hidden
    # states and the same caches, exactly, on any number of threads.

    model_dir = tiny_llama_factory(f"forward-{name}", **FORWARD_CONFIGS[name])
    model = load_model(model_dir, device="cpu", kernels="native").model
    pack_linears(model)
    assert model.native_weights is not None
    block_size, gen = 16, torch.Generator().manual_seed(3)
    tables = [[5, 2, 7], [1, 9], [3, 4, 8]]
    ids = lambda n: torch.randint(0, model.config.vocab_size, (n,), generator=gen).tolist()  # noqa: E731
    steps = [
        (tables, [20, 3, 17], [20, 3, 17], ids(40)),  # prefill
        (tables, [20, 9, 33], [1, 6, 16], ids(23)),  # decode, extend, prefill chunk past a block edge
        *[(tables, [21 + i, 10 + i, 34 + i], [1, 1, 1], ids(3)) for i in range(4)],  # decodes
    ]
    fused, fused_caches, op_by_op, op_caches = fused_and_op_by_op(model, steps, block_size, threads)
    for a, b in zip(fused, op_by_op):
        assert torch.equal(a, b)
    for (k1, v1), (k2, v2) in zip(fused_caches, op_caches):
        assert torch.equal(k1, k2) and torch.equal(v1, v2)
    assert op_caches[0][0].abs().sum() > 0


def test_one_call_forward_refuses_a_token_past_the_vocabulary(tiny_llama_factory):

    model = load_model(tiny_llama_factory("forward-gqa", **FORWARD_CONFIGS["gqa"]), device="cpu", kernels="native")
    pack_linears(model.model)
    caches = allocate_kv_cache(model.config, 4, 16, torch.device("cpu"))
    with pytest.raises(IndexError, match=f"token ids must be in \\[0, {model.config.vocab_size}\\)"):
        paged_steps(model.model, caches, [([[1]], [2], [2], [0, model.config.vocab_size])], 16)
    assert all(k.abs().sum() == 0 for k, _ in caches)  # nothing written
