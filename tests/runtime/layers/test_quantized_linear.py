"""Weight-only quantized linears: the error bound against the float matmul, the packed layout, the smaller memory,
and greedy agreement of the quantized built-in model with the float one."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from inferfleet_runtime.checkpoints.loader import load_model
from inferfleet_runtime.kernels import native
from inferfleet_runtime.layers.quantized import (
    QuantizedEmbedding,
    QuantizedLinear,
    empty_quantized_linears,
    has_quantized_linears,
    pack_int4,
    quantize_vocabulary,
    unpack_int4,
)

from ..support.paged_greedy import greedy_paged

# (bits, group size or None for per output channel, in_features, out_features)
LAYER_GRID = [(8, None, 96, 256), (8, None, 512, 64), (4, 32, 96, 256), (4, 128, 512, 64), (4, 32, 256, 3)]
FLOAT_SLACK = 1e-4  # float32 accumulation over at most 512 terms, relative to the bound's scale


@pytest.mark.parametrize("bits,group_size,in_features,out_features", LAYER_GRID)
def test_output_error_stays_within_half_a_step_per_weight(bits, group_size, in_features, out_features):
    torch.manual_seed(bits * in_features + out_features)
    linear = nn.Linear(in_features, out_features, bias=True)
    layer = QuantizedLinear.from_float(linear, bits, group_size)
    x = torch.randn(7, in_features)  # [T, in]
    with torch.no_grad():
        error = (layer(x) - linear(x)).abs()  # [T, out]
    # |w - w_q| <= s / 2 per weight, so |y - y_q| <= sum_c |x[c]| * s[r, group(c)] / 2.
    step = layer.scales.repeat_interleave(layer.group_size, dim=1)  # [out, in]
    bound = x.abs() @ step.T / 2  # [T, out]
    assert (error <= bound * (1 + FLOAT_SLACK) + 1e-6).all(), (error - bound).max()
    assert error.max() > 0  # the weights really were rounded


def test_int4_packs_two_columns_a_byte_low_nibble_first():
    q = torch.tensor([[-8, 7, 0, -1], [3, -3, 5, 2]], dtype=torch.int8)
    packed = pack_int4(q)
    assert packed.dtype == torch.uint8 and packed.shape == (2, 2)
    assert packed[0, 0].item() == (-8 + 8) | ((7 + 8) << 4)
    torch.testing.assert_close(unpack_int4(packed), q)


def test_a_fused_row_range_narrows_every_tensor_along_rows():
    linear = nn.Linear(64, 48, bias=False)
    layer = QuantizedLinear.from_float(linear, 4, 32)
    rows = layer.dequantize()[16:32]
    part = QuantizedLinear.from_float(nn.Linear(64, 16, bias=False), 4, 32)
    part.qweight.copy_(layer.qweight.narrow(0, 16, 16))
    part.scales.copy_(layer.scales.narrow(0, 16, 16))
    torch.testing.assert_close(part.dequantize(), rows)


def decoder_linear_bytes(model: nn.Module) -> int:
    return sum(
        t.numel() * t.element_size()
        for name, t in model.named_buffers()
        if ".layers." in f".{name}" and name.rsplit(".", 1)[-1] in ("qweight", "scales", "zeros")
    ) + sum(p.numel() * p.element_size() for name, p in model.named_parameters() if "_proj." in name)


@pytest.mark.parametrize("method,max_ratio", [("int8", 0.27), ("int4", 0.16)])
def test_quantized_model_drops_the_float_weights(demo_model_dir, method, max_ratio):
    float_model = load_model(demo_model_dir, kernels="reference").model
    model = load_model(demo_model_dir, kernels="reference", quantization=method).model
    assert has_quantized_linears(model)
    assert not any("_proj.weight" in name for name, _ in model.named_parameters())  # no float copy kept
    assert decoder_linear_bytes(model) <= max_ratio * decoder_linear_bytes(float_model)


class TinyLM(nn.Module):
    def __init__(self, tied: bool):
        super().__init__()
        torch.manual_seed(7)
        self.embed_tokens = nn.Embedding(50, 32)
        self.proj = QuantizedLinear.from_float(nn.Linear(32, 32), 8)  # a quantized model
        self.lm_head = nn.Linear(32, 50, bias=False)
        if tied:
            self.lm_head.weight = self.embed_tokens.weight


@pytest.mark.parametrize("tied", [True, False])
def test_the_vocabulary_is_int8_per_row_and_held_once_when_tied(tied):
    model = TinyLM(tied)
    float_rows = model.embed_tokens.weight.detach().clone()
    float_head = model.lm_head.weight.detach().clone()
    assert quantize_vocabulary(model) == [
        "lm_head",
        "embed_tokens (tied: the lm_head's rows)" if tied else "embed_tokens",
    ]
    embedding, head = model.embed_tokens, model.lm_head
    assert isinstance(embedding, QuantizedEmbedding) and isinstance(head, QuantizedLinear) and head.bits == 8
    assert (embedding.qweight.data_ptr() == head.qweight.data_ptr()) == tied  # one copy of the integers when tied
    assert not any(p.dtype.is_floating_point and p.numel() >= 50 * 32 for p in model.parameters())
    ids = torch.tensor([3, 0, 49, 3])
    rows = embedding(ids)
    step = embedding.scales[ids]  # [T, 1]: one scale per row, error at most half of it per element
    assert ((rows - float_rows[ids]).abs() <= step / 2 * (1 + 1e-5)).all() and (rows != float_rows[ids]).any()
    torch.testing.assert_close(head.dequantize(), float_head, atol=head.scales.max().item() / 2, rtol=0)
    assert quantize_vocabulary(model) == []  # already quantized


def test_the_embedding_stays_float_when_asked_and_in_float_models():
    model = TinyLM(tied=True)
    assert quantize_vocabulary(model, with_embedding=False) == ["lm_head"]
    assert type(model.embed_tokens) is nn.Embedding
    float_model = nn.Module()
    float_model.embed_tokens, float_model.lm_head = nn.Embedding(10, 8), nn.Linear(8, 10)
    assert quantize_vocabulary(float_model) == [] and type(float_model.embed_tokens) is nn.Embedding


@pytest.mark.skipif(native.library() is None, reason="no C compiler here: native kernels unavailable")
def test_native_forward_looks_up_int8_embedding_rows_as_the_module_does(demo_model_dir):
    model = load_model(demo_model_dir, kernels="native", quantization="int8").model
    from inferfleet_runtime.layers.linear import pack_linears

    pack_linears(model)
    assert isinstance(model.embed_tokens, QuantizedEmbedding) and model.native_weights is not None
    struct = model.native_weights.struct
    assert not struct.embed and struct.embed_q == model.embed_tokens.qweight.data_ptr()
    # The whole-stack forward and the op-by-op one (native kernels layer by layer, the module's lookup) agree.
    from ..support.paged_greedy import greedy_paged

    prompts = [[1, 5, 9, 200, 3], [1, 42]]
    whole = greedy_paged(model, prompts, 8, block_size=16, chunk_size=64)
    weights, model.native_weights = model.native_weights, None
    assert greedy_paged(model, prompts, 8, block_size=16, chunk_size=64) == whole
    model.native_weights = weights


def test_unknown_method_and_indivisible_width_are_refused():
    with pytest.raises(ValueError, match="int8, int4"):
        empty_quantized_linears(nn.Sequential(nn.Linear(64, 64)), "int3")
    with pytest.raises(ValueError, match="divisible by 128 or 32"):
        empty_quantized_linears(nn.Sequential(nn.Linear(48, 64)), "int4")


@pytest.mark.slow
@pytest.mark.parametrize("method", ["int8", "int4"])
def test_quantized_built_in_model_agrees_greedily_with_the_float_one(demo_model_dir, method, capsys):
    float_lm = load_model(demo_model_dir, kernels="reference")
    quant_lm = load_model(demo_model_dir, kernels="reference", quantization=method)
    texts = ["Beautiful is", "Errors should never", "Now is better", "Flat is", "Simple is better", "In the face of"]
    prompts = [float_lm.tokenizer.encode(text) for text in texts]
    expected = greedy_paged(float_lm.model, prompts, 16, block_size=16, chunk_size=64)
    got = greedy_paged(quant_lm.model, prompts, 16, block_size=16, chunk_size=64)
    num_agreeing = sum(a == b for out_e, out_g in zip(expected, got) for a, b in zip(out_e, out_g))
    # The float model's own continuations, teacher-forced: the largest logit difference along them.
    with torch.inference_mode():
        ids = [p + out for p, out in zip(prompts, expected)]
        max_logit_error = max(
            (greedy_logits(quant_lm.model, seq) - greedy_logits(float_lm.model, seq)).abs().max().item() for seq in ids
        )
    rate = num_agreeing / (16 * len(prompts))
    with capsys.disabled():
        print(
            f"\n{method}: greedy agreement {rate:.3f} over {16 * len(prompts)} tokens, max logit error {max_logit_error:.4f}"
        )
    if method == "int8":
        assert got == expected
    else:
        assert rate >= 0.5


def greedy_logits(model, ids: list[int]) -> torch.Tensor:
    from inferfleet_runtime.layers.attention_backend import PagedAttention, allocate_kv_cache, build_attention_metadata

    block_size = 16
    num_blocks = -(-len(ids) // block_size)
    kv_caches = allocate_kv_cache(model.config, num_blocks + 1, block_size, torch.device("cpu"))
    meta, positions = build_attention_metadata([list(range(1, num_blocks + 1))], [len(ids)], [len(ids)], block_size)
    return model.compute_logits(model(torch.tensor(ids), positions, PagedAttention(kv_caches, meta, model.ops)))


def test_serve_flag_reaches_the_engine_config_and_compiled_engines_refuse_it(tmp_path, capsys):
    from inferfleet_runtime.server import cli as serve_cli

    from ..support.serve_args import parse_serve

    assert serve_cli.config_from_args(parse_serve("--model", "m", "--quantization", "int4")).quantization == "int4"
    assert serve_cli.config_from_args(parse_serve("--model", "m")).quantization == "none"
    (tmp_path / "manifest.json").write_text("{}")
    assert serve_cli.run(parse_serve("--engine-dir", str(tmp_path), "--quantization", "int8")) == 2
    assert "--quantization needs the paged engine" in capsys.readouterr().err


@pytest.mark.parametrize("kernels", ["native", "reference"])
def test_model_runner_serves_a_quantized_model_on_every_cpu_backend(demo_model_dir, kernels):
    from inferfleet_runtime.engine.config import EngineConfig
    from inferfleet_runtime.worker.model_runner import ModelRunner

    float_lm = load_model(demo_model_dir, kernels="reference")
    runner = ModelRunner.from_model_dir(
        demo_model_dir, EngineConfig(kernels=kernels, quantization="int8", num_kv_blocks=16, device="cpu")
    )
    assert (runner.model.native_weights is not None) == (kernels == "native")  # whole-stack forward, quantized
    prompt = float_lm.tokenizer.encode("Beautiful is")
    [expected] = greedy_paged(float_lm.model, [prompt], 8, block_size=16, chunk_size=64)
    [got] = greedy_paged(runner.model, [prompt], 8, block_size=16, chunk_size=64)
    assert got == expected


def test_a_checkpoint_quantized_by_its_producer_is_refused_in_one_line(tiny_llama_factory, tmp_path, capsys):
    import json
    import shutil

    from inferfleet_runtime.model_config import ConfigError
    from inferfleet_runtime.server import cli as serve_cli

    from ..support.serve_args import parse_serve

    model_dir = tmp_path / "w4a16"
    shutil.copytree(tiny_llama_factory("quantized-config"), model_dir)
    capsys.readouterr()  # the factory's progress output
    config = json.loads((model_dir / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4}
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"quantization_config: gptq\)"):
        load_model(model_dir, kernels="reference")
    assert serve_cli.run(parse_serve("--model", str(model_dir))) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("inferfleet-runtime serve: error: cannot serve")
    assert "checkpoints quantized by their producer are not read yet" in line and "--quantization int8|int4" in line
