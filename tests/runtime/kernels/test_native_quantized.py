"""native.c's weight-only int8 / int4 matmuls: each against QuantizedLinear's torch reference (which dequantizes),
odd shapes handled or refused, and a quantized model through the whole-stack native forward: the same hidden
states as its op-by-op native path, and the reference backend's greedy tokens."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from inferfleet_runtime.checkpoints.loader import load_model
from inferfleet_runtime.kernels import native
from inferfleet_runtime.layers.linear import NativeQuantizedLinear, pack_linears
from inferfleet_runtime.layers.quantized import QuantizedLinear

from ..support.native_runs import fused_and_op_by_op
from ..support.paged_greedy import check_int8_activation_agreement, greedy_paged

pytestmark = pytest.mark.skipif(native.library() is None, reason="no C compiler here: native kernels unavailable")

# (bits, group size or None for per output channel, in_features, out_features, kind of offset)
# Out widths that end inside a panel (3, 70, 250), K that is no multiple of a vector width (6, 7, 90), group 2.
LAYERS = [
    (8, None, 96, 256, "none"),
    (8, None, 7, 70, "none"),
    (8, 32, 96, 250, "zeros"),
    (4, 32, 96, 256, "none"),
    (4, 128, 512, 64, "zeros"),
    (4, 32, 256, 3, "offsets"),
    (4, 2, 6, 5, "zeros"),
    (4, 30, 90, 33, "offsets"),
]
ROWS = [0, 1, 2, 5, 7, 12, 13, 40, 97]  # every microkernel height, one-row calls, more than a pass (96) of rows


def quantized_layer(bits, group_size, in_features, out_features, offset_kind, seed=0) -> QuantizedLinear:
    torch.manual_seed(seed)
    linear = nn.Linear(in_features, out_features, bias=True)
    ref = QuantizedLinear.from_float(linear, bits, group_size)
    layer = QuantizedLinear(
        in_features, out_features, bits, ref.group_size, True,
        has_zeros=offset_kind == "zeros", has_offsets=offset_kind == "offsets",
    )  # fmt: skip
    for name in ("qweight", "scales", "bias"):
        getattr(layer, name).copy_(getattr(ref, name))
    if offset_kind == "zeros":
        qmax = 127 if bits == 8 else 7
        layer.zeros.copy_(torch.randint(-qmax // 2, qmax // 2, layer.zeros.shape, dtype=torch.int8))
    elif offset_kind == "offsets":
        layer.offsets.copy_(torch.randn(layer.offsets.shape) * 0.05)
    return layer


@pytest.fixture
def float_activations(monkeypatch):
    """NativeQuantizedLinear packs for float activations (the widening kernels) whatever the default here."""
    monkeypatch.setenv(native.ACTIVATIONS_ENV, "float")


@pytest.mark.parametrize("bits,group_size,in_features,out_features,offset_kind", LAYERS)
def test_quantized_matmul_matches_the_dequantizing_reference(
    bits, group_size, in_features, out_features, offset_kind, float_activations
):
    layer = quantized_layer(bits, group_size, in_features, out_features, offset_kind, seed=in_features + out_features)
    native_layer = NativeQuantizedLinear(layer)
    assert native_layer.packed.activations == "float"
    weight = layer.dequantize()
    for rows in ROWS:
        x = torch.randn(rows, in_features)
        with torch.inference_mode():
            got, expected = native_layer(x), layer(x)
        # Both are float32 sums of the same products in another order: bounded by K ulps of sum |x w|.
        bound = (x.abs() @ weight.abs().T + layer.bias.abs()) * in_features * 1.2e-7 + 1e-6
        assert ((got - expected).abs() <= bound).all(), (rows, (got - expected).abs().max())
    assert native_layer.packed.bits == bits


@pytest.mark.parametrize("activations", ["float", "int8"])
@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_matmul_on_many_threads_matches_one(bits, activations, monkeypatch):
    monkeypatch.setenv(native.ACTIVATIONS_ENV, activations)
    layer = NativeQuantizedLinear(quantized_layer(bits, 32 if bits == 4 else None, 512, 700, "zeros"))
    assert layer.packed.activations == activations
    before = torch.get_num_threads()
    for rows in [1, 24]:
        x = torch.randn(rows, 512)
        try:
            torch.set_num_threads(1)
            one = layer(x)
            torch.set_num_threads(3)
            three = layer(x)
        finally:
            torch.set_num_threads(before)
        assert torch.equal(one, three)  # each output column is one thread's, summed in the same order


# Int8 activations: (bits, group size or None, in_features, out_features, kind of offset). Groups of 8, 16, 24
# (activation blocks of 8), 32, 96 and whole rows; out widths that end inside a panel; K = 8 (one 8-column step).
INT8_ACTIVATION_LAYERS = [
    (4, 32, 96, 256, "none"),
    (4, 128, 512, 70, "zeros"),
    (4, 32, 256, 3, "offsets"),
    (4, 8, 8, 33, "zeros"),
    (4, 24, 72, 65, "offsets"),
    (4, 16, 48, 100, "none"),
    (8, None, 96, 250, "none"),
    (8, 96, 576, 40, "zeros"),
    (8, 16, 32, 17, "offsets"),
]
INT8_ACTIVATION_ROWS = [1, 2, 3, 4, 5, 9, 16, 17, 40]  # one-row calls, 2 panels x 2 rows up to 16, 1 x 4 beyond


def quantize_activations_reference(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What native.c's int8-activation matmul does to each row of x, in torch: per block of columns,
    xq = round-half-even(x * (127 / amax)) and scale amax / 127 (float32 throughout)."""
    m, k = x.shape
    blocks = x.view(m, k // block, block)
    amax = blocks.abs().amax(-1)
    # 127 / amax as one correctly rounded division, as C's 127.0f / amax (a scalar over a tensor is computed
    # through the reciprocal: one ulp off, and 105.49998 * the scale rounded to 106 instead of 105).
    inv = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))
    xq = torch.round(blocks * inv[..., None]).to(torch.int8).view(m, k)
    return xq, amax / 127


def int8_activation_reference(x: torch.Tensor, layer: QuantizedLinear, block: int) -> torch.Tensor:
    """The int8-activation matmul's math in float64: out = sum_g s[g] * sum_b sx[b] * (xq . q)_b + o[g] * sum_g x
    (+ bias), with o[g] = offset - zero * s; differs from the kernel by its float32 rounding only."""
    n, k = layer.out_features, layer.in_features
    gs = layer.group_size
    xq, sx = quantize_activations_reference(x, block)
    q = layer.int_weight().double()  # [N, K]
    dots = torch.einsum("mbi,nbi->mnb", xq.double().view(-1, k // block, block), q.view(n, k // block, block))
    in_group = (dots * sx.double()[:, None, :]).view(x.shape[0], n, k // gs, gs // block).sum(-1)  # [M, N, G]
    scales = layer.scales.double()
    offsets = torch.zeros_like(scales)
    if layer.zeros is not None:
        offsets = offsets - layer.zeros.double() * scales
    if layer.offsets is not None:
        offsets = offsets + layer.offsets.double()
    xsum = x.double().view(x.shape[0], k // gs, gs).sum(-1)  # [M, G]
    out = (in_group * scales[None]).sum(-1) + xsum @ offsets.T
    return (out + layer.bias.double()).float()


@pytest.mark.parametrize("bits,group_size,in_features,out_features,offset_kind", INT8_ACTIVATION_LAYERS)
def test_int8_activation_matmul_matches_its_torch_reference_and_the_float_result_within_the_rounding(
    bits, group_size, in_features, out_features, offset_kind, monkeypatch
):
    monkeypatch.setenv(native.ACTIVATIONS_ENV, "int8")
    layer = quantized_layer(bits, group_size, in_features, out_features, offset_kind, seed=in_features + out_features)
    native_layer = NativeQuantizedLinear(layer)
    block = native_layer.packed.act_block
    assert native_layer.packed.activations == "int8" and layer.group_size % block == 0
    weight = layer.dequantize()
    gen = torch.Generator().manual_seed(out_features)
    for rows in INT8_ACTIVATION_ROWS:
        x = torch.randn(rows, in_features, generator=gen) * torch.rand(rows, 1, generator=gen) * 4
        if rows > 1:
            x[-1, :block] = 0  # an all-zero block: scale 0, no division by it
        with torch.inference_mode():
            got = native_layer(x)
        xq, sx = native.quantize_activations(x, block)
        ref_xq, ref_sx = quantize_activations_reference(x, block)
        assert torch.equal(xq, ref_xq) and torch.equal(sx, ref_sx), rows
        # Against the same math in float64: float32 rounding of the per-block and per-group sums.
        expected = int8_activation_reference(x, layer, block)
        magnitude = x.abs() @ weight.abs().T + layer.bias.abs()
        tolerance = magnitude * in_features * 1.2e-7 + 1e-5
        assert ((got - expected).abs() <= tolerance).all(), (rows, (got - expected).abs().max())
        # Against float activations: each x off by at most its block's scale / 2, so the output by at most
        # sum_k sx[k] / 2 * |W[n, k]| (plus the float rounding above).
        float_result = layer(x)
        rounding = (sx.repeat_interleave(block, dim=1) / 2) @ weight.abs().T
        assert ((got - float_result).abs() <= rounding * 1.0001 + tolerance).all(), (
            rows,
            (got - float_result).abs().max(),
        )
        assert (got - float_result).abs().max() > 0, "int8 activations round: a zero difference means they did not"


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_int8_activations_turn_a_nan_or_infinite_input_into_nan_outputs_of_its_row_only(bad, monkeypatch):
    monkeypatch.setenv(native.ACTIVATIONS_ENV, "int8")
    layer = NativeQuantizedLinear(quantized_layer(4, 32, 96, 70, "none"))
    x = torch.randn(3, 96)
    x[1, 40] = bad
    with torch.inference_mode():
        out = layer(x)
    assert out[1].isnan().all() and out[[0, 2]].isfinite().all()


def test_int8_activations_by_default_for_int4_on_simd_builds_and_for_int8_only_with_vnni(monkeypatch):
    monkeypatch.delenv(native.ACTIVATIONS_ENV, raising=False)
    isa = native.qdot_isa()
    assert native.default_activations(4, 32) == ("float" if isa == "plain C" else "int8")
    assert native.default_activations(4, 2) == "float"  # no block of 8 divides the group
    assert native.default_activations(8, 576) == ("int8" if isa == "AVX-512 VNNI" else "float")
    # A checkpoint's own integers keep float activations unless the user asks for int8.
    assert native.default_activations(4, 32, runtime_quantized=False) == "float"
    assert native.default_activations(8, 576, runtime_quantized=False) == "float"
    monkeypatch.setenv(native.ACTIVATIONS_ENV, "int8")
    assert native.default_activations(4, 32, runtime_quantized=False) == "int8"
    monkeypatch.setenv(native.ACTIVATIONS_ENV, "float")
    assert native.default_activations(4, 32) == "float"
    monkeypatch.setenv(native.ACTIVATIONS_ENV, "int4")
    with pytest.raises(ValueError, match="must be int8 or float"):
        native.default_activations(4, 32)
    assert native.qdot_isa() in native.QDOT_ISAS.values()


def test_quantized_packing_refuses_a_group_that_does_not_split_the_row():
    q = torch.zeros(4, 10, dtype=torch.int8)
    with pytest.raises(ValueError, match="group size that divides the 10 input columns"):
        native.pack_quantized(q, torch.ones(4, 3), None, 8, 3)
    with pytest.raises(ValueError, match="and is even"):
        native.pack_quantized(q, torch.ones(4, 2), None, 4, 5)
    with pytest.raises(ValueError, match="scales/offsets must be"):
        native.pack_quantized(q, torch.ones(4, 3), None, 8, 5)
    with pytest.raises(ValueError, match="8 or 4 bit"):
        native.pack_quantized(q, torch.ones(4, 2), None, 2, 5)
    with pytest.raises(ValueError, match="multiple of 8"):
        native.pack_quantized(q, torch.ones(4, 2), None, 4, 5, activations="int8")
    with pytest.raises(ValueError, match="float or int8"):
        native.pack_quantized(q, torch.ones(4, 2), None, 4, 5, activations="int4")
    packed = native.pack_quantized(q, torch.ones(4, 2), None, 8, 5)
    with pytest.raises(ValueError, match="takes 10"):
        native.quantized_linear(torch.randn(2, 8), packed, None)


@pytest.mark.parametrize("activations", ["float", "int8"])
def test_int4_packs_half_a_byte_per_weight(activations, monkeypatch):
    monkeypatch.setenv(native.ACTIVATIONS_ENV, activations)
    layer = NativeQuantizedLinear(quantized_layer(4, 32, 512, 640, "none"))
    float_layer = nn.Linear(512, 640)
    assert layer.packed.data.numel() == 640 * 512 // 2 and layer.packed.activations == activations
    assert layer.packed.nbytes() <= 0.16 * float_layer.weight.numel() * 4


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("method", ["int8", "int4"])
def test_quantized_one_call_forward_equals_the_op_by_op_native_path(tiny_llama_factory, method, threads):

    model_dir = tiny_llama_factory("quant-forward-bias", num_key_value_heads=2, attention_bias=True, mlp_bias=True)
    model = load_model(model_dir, device="cpu", kernels="native", quantization=method).model
    pack_linears(model)
    assert model.native_weights is not None
    assert all(isinstance(layer.mlp.down_proj, NativeQuantizedLinear) for layer in model.layers)
    block_size, gen = 16, torch.Generator().manual_seed(3)
    tables = [[5, 2, 7], [1, 9], [3, 4, 8]]
    ids = lambda n: torch.randint(0, model.config.vocab_size, (n,), generator=gen).tolist()  # noqa: E731
    steps = [
        (tables, [20, 3, 17], [20, 3, 17], ids(40)),
        (tables, [20, 9, 33], [1, 6, 16], ids(23)),
        *[(tables, [21 + i, 10 + i, 34 + i], [1, 1, 1], ids(3)) for i in range(3)],
    ]
    fused, fused_caches, op_by_op, op_caches = fused_and_op_by_op(model, steps, block_size, threads)
    for a, b in zip(fused, op_by_op):
        assert torch.equal(a, b)
    assert op_caches[0][0].abs().sum() > 0


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_quantized_model_on_native_gives_the_reference_backends_greedy_tokens(
    tiny_llama_factory, method, float_activations
):
    model_dir = tiny_llama_factory("native-gqa", num_attention_heads=4, num_key_value_heads=2)
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, 384, (n,), generator=gen).tolist() for n in [1, 3, 8, 13]]
    reference = load_model(model_dir, device="cpu", kernels="reference", quantization=method).model
    expected = greedy_paged(reference, prompts, 6, block_size=4, chunk_size=5)
    native_model = load_model(model_dir, device="cpu", kernels="native", quantization=method).model
    pack_linears(native_model)
    assert native_model.native_weights is not None
    assert greedy_paged(native_model, prompts, 6, block_size=4, chunk_size=5) == expected
    assert len({tuple(out) for out in expected}) == len(prompts), "degenerate reference outputs prove little"


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_int8_activations_keep_the_reference_backends_greedy_tokens_but_at_near_ties(
    tiny_llama_factory, method, monkeypatch
):
    monkeypatch.setenv(native.ACTIVATIONS_ENV, "int8")
    model_dir = tiny_llama_factory("native-gqa", num_attention_heads=4, num_key_value_heads=2)
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, 384, (n,), generator=gen).tolist() for n in [1, 3, 8, 13]]
    reference = load_model(model_dir, device="cpu", kernels="reference", quantization=method).model
    sequences = [p + out for p, out in zip(prompts, greedy_paged(reference, prompts, 6, block_size=4, chunk_size=5))]
    native_model = load_model(model_dir, device="cpu", kernels="native", quantization=method).model
    pack_linears(native_model)
    assert native_model.layers[0].mlp.down_proj.packed.activations == "int8"
    check_int8_activation_agreement(reference, native_model, sequences, method)
