"""compressed-tensors checkpoints made by the `compressed-tensors` package from a random tiny Llama: each linear
read into a QuantizedLinear equals the package's own decompression, and greedy outputs agree with transformers
running the package-decompressed model."""

from __future__ import annotations

import shutil

import pytest
import torch

from inferfleet_runtime.checkpoints.loader import load_model
from inferfleet_runtime.layers.quantized import QuantizedLinear

from ..support.compressed_checkpoints import NUM_NEW_TOKENS, PROMPTS, hf_greedy, make_compressed
from ..support.paged_greedy import greedy_paged

compressed_tensors = pytest.importorskip("compressed_tensors")

# id -> (bits, group size or None for per channel, symmetric, format)
SCHEMES = {
    "w4a16-g32-sym": (4, 32, True, "pack-quantized"),
    "w4a16-g32-asym": (4, 32, False, "pack-quantized"),
    "w4a16-g64-sym": (4, 64, True, "pack-quantized"),
    "w8a16-channel-sym": (8, None, True, "int-quantized"),
}


@pytest.fixture(scope="module", params=sorted(SCHEMES))
def compressed(request, tiny_llama_factory, tmp_path_factory):
    float_dir = tiny_llama_factory("compressed-float")
    out_dir = tmp_path_factory.mktemp(request.param)
    return (request.param, *make_compressed(float_dir, out_dir, *SCHEMES[request.param]))


def test_every_linear_equals_the_packages_decompression_within_half_a_step_of_the_float_one(
    compressed, tiny_llama_factory
):
    name, model_dir, hf = compressed
    bits, group_size, symmetric, _ = SCHEMES[name]
    model = load_model(model_dir, kernels="reference").model
    float_model = load_model(tiny_llama_factory("compressed-float"), kernels="reference").model
    for ours, original in zip(model.layers, float_model.layers):
        for path in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"):
            layer, float_weight = ours.get_submodule(path), original.get_submodule(path).weight
            step = layer.scales.repeat_interleave(layer.group_size, dim=1)  # [out, in]
            assert ((layer.dequantize() - float_weight).abs() <= step / 2 * (1 + 1e-5) + 1e-7).all(), path
            assert (layer.zeros is None) == symmetric
            assert symmetric or layer.zeros.abs().sum() > 0  # asymmetric groups really are offset
    hf_layers = hf.model.layers
    for ours, theirs in zip(model.layers, hf_layers):
        attn, mlp = ours.self_attn, ours.mlp
        for layer in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj):
            assert isinstance(layer, QuantizedLinear) and layer.bits == bits
        expected = {
            "qkv": torch.cat([theirs.self_attn.q_proj.weight, theirs.self_attn.k_proj.weight,
                              theirs.self_attn.v_proj.weight]),
            "o": theirs.self_attn.o_proj.weight,
            "gate_up": torch.cat([theirs.mlp.gate_proj.weight, theirs.mlp.up_proj.weight]),
            "down": theirs.mlp.down_proj.weight,
        }  # fmt: skip
        got = {
            "qkv": attn.qkv_proj.dequantize(), "o": attn.o_proj.dequantize(),
            "gate_up": mlp.gate_up_proj.dequantize(), "down": mlp.down_proj.dequantize(),
        }  # fmt: skip
        for key in expected:
            torch.testing.assert_close(got[key], expected[key].detach(), rtol=1e-6, atol=1e-6, msg=key)


def test_greedy_outputs_agree_with_transformers_on_the_decompressed_model(compressed, capsys):
    name, model_dir, hf = compressed
    ours = greedy_paged(load_model(model_dir, kernels="reference").model, PROMPTS, NUM_NEW_TOKENS, 4, 5)
    theirs = hf_greedy(hf)
    num_agreeing = sum(a == b for o, t in zip(ours, theirs) for a, b in zip(o, t))
    with capsys.disabled():
        print(f"\n{name}: greedy agreement with transformers {num_agreeing}/{NUM_NEW_TOKENS * len(PROMPTS)}")
    assert ours == theirs


def test_greedy_outputs_agree_with_transformers_loading_the_checkpoint_itself(compressed):
    """transformers reads the symmetric checkpoints itself (5.25 reinitialises the packed asymmetric zero points
    on a size mismatch, so those are compared with the package's decompression only)."""
    from transformers import AutoModelForCausalLM

    name, model_dir, _ = compressed
    if not SCHEMES[name][2]:
        pytest.skip("transformers misreads packed asymmetric zero points")
    hf = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    assert greedy_paged(load_model(model_dir, kernels="reference").model, PROMPTS, NUM_NEW_TOKENS, 4, 5) == hf_greedy(
        hf
    )


@pytest.mark.parametrize("strategy", ["tensor", "channel"])
def test_fp8_weights_are_dequantized_at_load_as_the_package_does(tiny_llama_factory, tmp_path, strategy, caplog):
    float_dir = tiny_llama_factory("compressed-float")
    model_dir, hf = make_compressed(float_dir, tmp_path / "fp8", 8, None, True, "float-quantized", "float", strategy)
    with caplog.at_level("INFO"):
        lm = load_model(model_dir, kernels="reference")
    assert any("Dequantized the checkpoint's FP8 weights" in r.getMessage() for r in caplog.records)
    layer, theirs = lm.model.layers[1], hf.model.layers[1]
    assert isinstance(layer.mlp.down_proj, torch.nn.Linear) and layer.mlp.down_proj.weight.dtype == torch.float32
    torch.testing.assert_close(layer.mlp.down_proj.weight, theirs.mlp.down_proj.weight.detach(), rtol=0, atol=0)
    qkv = torch.cat([theirs.self_attn.q_proj.weight, theirs.self_attn.k_proj.weight, theirs.self_attn.v_proj.weight])
    torch.testing.assert_close(layer.self_attn.qkv_proj.weight, qkv.detach(), rtol=0, atol=0)
    assert greedy_paged(lm.model, PROMPTS, NUM_NEW_TOKENS, 4, 5) == hf_greedy(hf)


@pytest.mark.parametrize(
    "quantization, message",
    [
        ({"format": "marlin-24"}, "format 'marlin-24'"),
        ({"format": "pack-quantized", "weights": {"type": "int", "num_bits": 4, "strategy": "tensor"}}, "strategy"),
        ({"format": "int-quantized", "input_activations": {"num_bits": 8}}, "activation quantization"),
    ],
)
def test_schemes_not_read_are_refused_by_serve_in_one_line(tiny_llama_factory, tmp_path, capsys, quantization, message):
    import json

    from inferfleet_runtime.server import cli as serve_cli

    from ..support.serve_args import parse_serve

    model_dir = tmp_path / "ct"
    shutil.copytree(tiny_llama_factory("compressed-float"), model_dir)
    capsys.readouterr()
    weights = quantization.get("weights", {"type": "int", "num_bits": 8, "strategy": "channel"})
    group = {"targets": ["Linear"], "weights": weights, "input_activations": quantization.get("input_activations")}
    config = json.loads((model_dir / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": quantization["format"], "config_groups": {"group_0": group},
    }  # fmt: skip
    (model_dir / "config.json").write_text(json.dumps(config))
    assert serve_cli.run(parse_serve("--model", str(model_dir))) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("inferfleet-runtime serve: error: cannot serve") and message in line
