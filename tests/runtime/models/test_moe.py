"""Mixture-of-Experts pieces: each family's routing normalisation, the sparse block against transformers' own, the
config readers (which layers are sparse, what is refused), the loader's stacked experts, and the refusal of
--quantization."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from inferfleet_runtime.checkpoints.loader import CheckpointError, load_model
from inferfleet_runtime.kernels import REFERENCE_OPS
from inferfleet_runtime.layers.moe import SparseMoE, route
from inferfleet_runtime.model_config import ConfigError
from inferfleet_runtime.models import read_config

from ..support.family_checkpoints import TINY, make_checkpoint

MIXTRAL = dict(model_type="mixtral", num_local_experts=4, num_experts_per_tok=2)
QWEN3_MOE = dict(model_type="qwen3_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)


def test_routing_takes_the_top_k_of_the_softmax_over_all_experts_and_renormalises_when_asked():
    # softmax over 4 experts of logits log(1), log(2), log(3), log(4): probabilities 0.1, 0.2, 0.3, 0.4
    logits = torch.tensor([[math.log(1), math.log(2), math.log(3), math.log(4)], [0.0, 0.0, 0.0, math.log(7)]])
    weights, ids = route(logits, 2, renormalize=False)
    assert ids[0].tolist() == [3, 2] and ids[1, 0] == 3  # row 1's second place is a three-way tie
    torch.testing.assert_close(weights[0], torch.tensor([0.4, 0.3]))
    torch.testing.assert_close(weights[1], torch.tensor([0.7, 0.1]))
    weights, _ = route(logits, 2, renormalize=True)
    torch.testing.assert_close(weights[0], torch.tensor([0.4 / 0.7, 0.3 / 0.7]))
    torch.testing.assert_close(weights[1], torch.tensor([0.875, 0.125]))
    assert weights.dtype == torch.float32  # whatever the logits' dtype
    assert route(logits.half(), 2, True)[0].dtype == torch.float32


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe-normalised", "qwen3_moe-unnormalised"])
@torch.inference_mode()
def test_sparse_block_matches_transformers_for_each_familys_normalisation(family):
    import transformers

    if family == "mixtral":
        hf = {**TINY, **MIXTRAL}
        block_class, config_class = "MixtralSparseMoeBlock", transformers.MixtralConfig
        from transformers.models.mixtral import modeling_mixtral as modeling
    else:
        hf = {**TINY, **QWEN3_MOE, "norm_topk_prob": family.endswith("-normalised")}
        block_class, config_class = "Qwen3MoeSparseMoeBlock", transformers.Qwen3MoeConfig
        from transformers.models.qwen3_moe import modeling_qwen3_moe as modeling
    config = read_config(hf)
    assert config.norm_topk_prob == (family != "qwen3_moe-unnormalised")
    torch.manual_seed(0)
    theirs = getattr(modeling, block_class)(config_class(**{k: v for k, v in hf.items() if k != "model_type"}))
    for param in theirs.parameters():
        param.normal_(0.0, 0.3)
    ours = SparseMoE(config, REFERENCE_OPS)
    ours.gate.weight.copy_(theirs.gate.weight)
    ours.experts.gate_up_proj.copy_(theirs.experts.gate_up_proj)
    ours.experts.down_proj.copy_(theirs.experts.down_proj)
    x = torch.randn(1, 23, hf["hidden_size"])
    expected = theirs(x)[0]
    torch.testing.assert_close(ours(x[0]), expected, atol=2e-5, rtol=1e-4)  # matmul blocking differs
    # The normalisation is what the family says: the other choice gives other outputs.
    ours.renormalize = not ours.renormalize
    assert not torch.allclose(ours(x[0]), expected, atol=1e-3)


@pytest.mark.parametrize(
    "change, moe_layers",
    [
        (dict(), (0, 1, 2, 3)),
        (dict(decoder_sparse_step=2), (1, 3)),
        (dict(mlp_only_layers=[0, 2]), (1, 3)),
        (dict(decoder_sparse_step=2, mlp_only_layers=[3]), (1,)),
        (dict(num_experts=0), ()),
    ],
)
def test_qwen3_moe_reads_which_layers_are_sparse(change, moe_layers):
    config = read_config({**TINY, **QWEN3_MOE, "num_hidden_layers": 4, **change})
    assert config.moe_layers == moe_layers
    assert config.qk_norm and config.moe_intermediate_size == 32 and not config.norm_topk_prob  # transformers' default


def test_mixtral_routes_every_layer_renormalised_with_its_window():
    config = read_config({**TINY, **MIXTRAL, "sliding_window": 16})
    assert config.moe_layers == (0, 1) and config.norm_topk_prob and config.num_experts == 4
    assert config.moe_intermediate_size == TINY["intermediate_size"] and config.sliding_windows == (16, 16)
    assert read_config({**TINY, **MIXTRAL, "sliding_window": None}).sliding_windows == ()


@pytest.mark.parametrize(
    "family, change, message",
    [
        ("qwen3_moe", dict(decoder_sparse_step=0), "decoder_sparse_step must be a positive integer, got 0"),
        ("qwen3_moe", dict(mlp_only_layers=[5]), "mlp_only_layers must list layer indices below num_hidden_layers"),
        ("qwen3_moe", dict(num_experts_per_tok=5), "num_experts_per_tok must be between 1 and the 4 experts, got 5"),
        ("mixtral", dict(num_experts_per_tok=0), "num_experts_per_tok must be between 1 and the 4 experts, got 0"),
        ("mixtral", dict(hidden_act="gelu"), "activation 'gelu' is not supported for experts"),
    ],
)
def test_moe_configs_the_runtime_cannot_run_are_refused_naming_the_field(family, change, message):
    base = MIXTRAL if family == "mixtral" else QWEN3_MOE
    with pytest.raises(ConfigError, match=message.replace("(", "\\(").replace(")", "\\)")):
        read_config({**TINY, **base, **change})


@pytest.fixture(scope="module")
def mixtral_dir(tmp_path_factory) -> Path:
    return make_checkpoint(
        tmp_path_factory.mktemp("mixtral"), "MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=4)
    )


def rewrite_weights(src: Path, dst: Path, edit) -> Path:
    """A copy of checkpoint src in dst with its tensors passed through edit(dict) -> dict."""
    dst.mkdir()
    for path in src.iterdir():
        if path.name != "model.safetensors":
            (dst / path.name).write_bytes(path.read_bytes())
    save_file(edit(load_file(str(src / "model.safetensors"))), str(dst / "model.safetensors"))
    return dst


def test_each_expert_tensor_lands_in_its_stacked_slot(mixtral_dir):
    weights = load_file(str(mixtral_dir / "model.safetensors"))
    layers = load_model(mixtral_dir, device="cpu", kernels="reference").model.layers
    for layer in range(2):
        experts = layers[layer].mlp.experts
        for e in range(4):
            prefix = f"model.layers.{layer}.block_sparse_moe.experts.{e}"
            gate, up = experts.gate_up_proj[e].chunk(2)
            assert torch.equal(gate, weights[f"{prefix}.w1.weight"]) and torch.equal(up, weights[f"{prefix}.w3.weight"])
            assert torch.equal(experts.down_proj[e], weights[f"{prefix}.w2.weight"])
        assert torch.equal(layers[layer].mlp.gate.weight, weights[f"model.layers.{layer}.block_sparse_moe.gate.weight"])


def test_a_missing_expert_tensor_is_refused(mixtral_dir, tmp_path):
    def drop(weights):
        del weights["model.layers.1.block_sparse_moe.experts.2.w3.weight"]
        return weights

    broken = rewrite_weights(mixtral_dir, tmp_path / "broken", drop)
    with pytest.raises(
        CheckpointError, match=r"checkpoint lacks 1 tensors, e.g. layers.1.mlp.experts.gate_up_proj \(expert 2 up\)"
    ):
        load_model(broken, device="cpu", kernels="reference")


def test_an_expert_beyond_the_configs_is_refused(mixtral_dir, tmp_path):
    def add(weights):
        weights["model.layers.0.block_sparse_moe.experts.4.w2.weight"] = torch.zeros(64, 128)
        return weights

    extra = rewrite_weights(mixtral_dir, tmp_path / "extra", add)
    with pytest.raises(CheckpointError, match="'model.layers.0.block_sparse_moe.experts.4.w2.weight' has no place"):
        load_model(extra, device="cpu", kernels="reference")


def test_a_checkpoint_with_experts_already_stacked_loads_the_same(mixtral_dir, tmp_path):
    def stack(weights):
        out = {k: v for k, v in weights.items() if ".experts." not in k}
        for layer in range(2):
            p = f"model.layers.{layer}.block_sparse_moe.experts"
            out[f"{p}.gate_up_proj"] = torch.stack(
                [torch.cat([weights[f"{p}.{e}.w1.weight"], weights[f"{p}.{e}.w3.weight"]]) for e in range(4)]
            )
            out[f"{p}.down_proj"] = torch.stack([weights[f"{p}.{e}.w2.weight"] for e in range(4)])
        return out

    stacked = load_model(rewrite_weights(mixtral_dir, tmp_path / "stacked", stack), device="cpu", kernels="reference")
    per_expert = load_model(mixtral_dir, device="cpu", kernels="reference")
    for (name, ours), (_, theirs) in zip(stacked.model.named_parameters(), per_expert.model.named_parameters()):
        assert torch.equal(ours, theirs), name


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_quantization_is_refused_for_moe_models(mixtral_dir, method):
    with pytest.raises(ValueError, match=f"--quantization {method} does not cover Mixture-of-Experts experts yet"):
        load_model(mixtral_dir, device="cpu", kernels="reference", quantization=method)


def test_serve_refuses_quantizing_an_moe_model_in_one_line(mixtral_dir, capsys):
    from inferfleet_runtime.server import cli

    assert json.loads((mixtral_dir / "config.json").read_text())["model_type"] == "mixtral"
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--model", str(mixtral_dir), "--quantization", "int8", "--device", "cpu"])
    assert cli.run(args) == 2  # before any weight is read or the server starts
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not cover Mixture-of-Experts experts yet (family mixtral)" in err[0], err


@torch.inference_mode()
def test_native_packed_experts_match_the_torch_path():
    from inferfleet_runtime.kernels import native

    if native.library() is None:
        pytest.skip(native.unavailable_reason())
    config = read_config({**TINY, **QWEN3_MOE, "num_experts": 6, "num_experts_per_tok": 3})
    block = SparseMoE(config, REFERENCE_OPS)
    torch.manual_seed(3)
    for param in block.parameters():
        param.normal_(0.0, 0.2)
    for num_tokens in (1, 5, 40):
        x = torch.randn(num_tokens, config.hidden_size)
        expected = block(x)
        packed = SparseMoE(config, REFERENCE_OPS)
        packed.load_state_dict(block.state_dict())
        packed.pack_for_native()
        assert not any(p.dim() == 3 for p in packed.parameters())  # the stacked float weights are gone
        torch.testing.assert_close(packed(x), expected, atol=1e-5, rtol=1e-5)


@torch.inference_mode()
def test_the_dense_form_torch_export_traces_matches_the_grouped_path():
    from inferfleet_runtime.kernels.fused_moe import fused_experts_dense, fused_experts_reference

    config = read_config({**TINY, **MIXTRAL, "num_local_experts": 5, "num_experts_per_tok": 2})
    block = SparseMoE(config, REFERENCE_OPS)
    torch.manual_seed(4)
    for param in block.parameters():
        param.normal_(0.0, 0.2)
    x = torch.randn(6, config.hidden_size)
    weights, ids = route(block.gate(x), 2, True)
    experts = (block.experts.gate_up_proj, block.experts.down_proj)
    torch.testing.assert_close(
        fused_experts_dense(x, *experts, weights, ids), fused_experts_reference(x, *experts, weights, ids)
    )


def test_an_exported_sparse_block_gives_the_eager_blocks_outputs():
    # The compiled engine exports the model: the routing must not make shapes data-dependent.
    config = read_config({**TINY, **QWEN3_MOE})
    block = SparseMoE(config, REFERENCE_OPS)
    torch.manual_seed(5)
    with torch.no_grad():
        for param in block.parameters():
            param.normal_(0.0, 0.2)
    program = torch.export.export(block, (torch.randn(7, config.hidden_size),))
    x = torch.randn(7, config.hidden_size)
    with torch.inference_mode():
        torch.testing.assert_close(program.module()(x), block(x))


@pytest.mark.slow
@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_server_answers_through_the_openai_client_as_transformers_decodes(family, tmp_path):
    # The served MoE model's greedy completion, through the official client, is transformers' greedy continuation.
    import openai
    from transformers import AutoModelForCausalLM

    from inferfleet_runtime.checkpoints.tokenizer import Tokenizer
    from inferfleet_runtime.engine.config import EngineConfig
    from inferfleet_runtime.worker.model_runner import ModelRunner

    from ..support.paged_greedy import hf_greedy
    from ..support.server_harness import running_server

    if family == "mixtral":
        model_dir = make_checkpoint(tmp_path, "MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=4))
    else:
        overrides = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, head_dim=32)
        model_dir = make_checkpoint(tmp_path, "Qwen3MoeConfig", "Qwen3MoeForCausalLM", overrides)
    prompt = "Beautiful is better than"
    prompt_ids = Tokenizer.from_dir(model_dir).encode(prompt)
    hf_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    [expected] = hf_greedy(hf_model, [prompt_ids], 8)
    config = EngineConfig(num_kv_blocks=64, device="cpu")
    with running_server(lambda: ModelRunner.from_model_dir(model_dir, config), config, family) as server:
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
        r = client.completions.create(model=family, prompt=prompt, max_tokens=8, temperature=0)
    assert r.usage.prompt_tokens == len(prompt_ids) and r.usage.completion_tokens == len(expected)
    assert r.choices[0].text == Tokenizer.from_dir(model_dir).decode(expected)
    assert len(set(expected)) > 2  # not a degenerate repetition
