"""native.c's weight-only int8 / int4 matmuls: each against QuantizedLinear's torch reference (which dequantizes),
odd shapes handled or refused, and a quantized model through the whole-stack native forward: the same hidden
states as its op-by-op native path, and the reference backend's greedy tokens."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from inferfleet_runtime.kernels import native
from inferfleet_runtime.layers.linear import NativeQuantizedLinear, pack_linears
from inferfleet_runtime.layers.quantized import QuantizedLinear
from inferfleet_runtime.loader import load_model

from ..paged_greedy import greedy_paged
from .test_native import fused_and_op_by_op

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


@pytest.mark.parametrize("bits,group_size,in_features,out_features,offset_kind", LAYERS)
def test_quantized_matmul_matches_the_dequantizing_reference(bits, group_size, in_features, out_features, offset_kind):
    layer = quantized_layer(bits, group_size, in_features, out_features, offset_kind, seed=in_features + out_features)
    native_layer = NativeQuantizedLinear(layer)
    weight = layer.dequantize()
    for rows in ROWS:
        x = torch.randn(rows, in_features)
        with torch.inference_mode():
            got, expected = native_layer(x), layer(x)
        # Both are float32 sums of the same products in another order: bounded by K ulps of sum |x w|.
        bound = (x.abs() @ weight.abs().T + layer.bias.abs()) * in_features * 1.2e-7 + 1e-6
        assert ((got - expected).abs() <= bound).all(), (rows, (got - expected).abs().max())
    assert native_layer.packed.bits == bits


@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_matmul_on_many_threads_matches_one(bits):
    layer = NativeQuantizedLinear(quantized_layer(bits, 32 if bits == 4 else None, 512, 700, "zeros"))
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
    packed = native.pack_quantized(q, torch.ones(4, 2), None, 8, 5)
    with pytest.raises(ValueError, match="takes 10"):
        native.quantized_linear(torch.randn(2, 8), packed, None)


def test_int4_packs_half_a_byte_per_weight():
    layer = NativeQuantizedLinear(quantized_layer(4, 32, 512, 640, "none"))
    float_layer = nn.Linear(512, 640)
    assert layer.packed.data.numel() == 640 * 512 // 2
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
def test_quantized_model_on_native_gives_the_reference_backends_greedy_tokens(tiny_llama_factory, method):
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
