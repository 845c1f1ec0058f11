"""Tensor parallelism on a CPU (gloo): each rank's cut of the checkpoint, greedy equality with transformers at 2 and
4 ranks for each dense family, the server through the official openai client, and a rank that dies."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import openai
import pytest
import torch

from inferfleet_runtime.engine.config import EngineConfig
from inferfleet_runtime.layers.parallel import TensorParallel, check_shardable, local_config, shard_weights
from inferfleet_runtime.model_config import ConfigError
from inferfleet_runtime.models import read_config

from ..support import family_checkpoints
from ..support.family_checkpoints import TINY, prompts_for
from ..support.paged_greedy import truncate_after_eos
from ..support.server_harness import serve_process

HERE = Path(__file__).parents[1]
family_checkpoint = family_checkpoints.family_checkpoint  # the families' checkpoints, built once per module


def tiny_config(**overrides):
    return read_config({"model_type": "llama", **TINY, **overrides})


def full_weights(config, fused: bool = False) -> dict[str, torch.Tensor]:
    """Random checkpoint tensors of one layer (names as checkpoints spell them), fused q/k/v and gate/up if asked."""
    h, d, i = config.hidden_size, config.head_dim, config.intermediate_size
    q, kv = config.num_heads * d, config.num_kv_heads * d
    gen = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=gen)

    weights = {
        "model.embed_tokens.weight": rand(config.vocab_size, h),
        "lm_head.weight": rand(config.vocab_size, h),
        "model.layers.0.self_attn.o_proj.weight": rand(h, q),
        "model.layers.0.self_attn.o_proj.bias": rand(h),
        "model.layers.0.mlp.down_proj.weight": rand(h, i),
        "model.layers.0.input_layernorm.weight": rand(h),
        "model.layers.0.mlp.experts.0.gate_proj.weight": rand(i, h),  # an expert's: replicated
    }
    if fused:
        weights["model.layers.0.self_attn.qkv_proj.weight"] = rand(q + 2 * kv, h)
        weights["model.layers.0.mlp.gate_up_proj.weight"] = rand(2 * i, h)
    else:
        for name, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            weights[f"model.layers.0.self_attn.{name}.weight"] = rand(rows, h)
        weights["model.layers.0.self_attn.q_proj.bias"] = rand(q)
        for name in ("gate_proj", "up_proj"):
            weights[f"model.layers.0.mlp.{name}.weight"] = rand(i, h)
    return weights


def cuts(config, weights: dict, world: int) -> list[dict[str, torch.Tensor]]:
    return [dict(shard_weights(iter(weights.items()), config, TensorParallel(r, world))) for r in range(world)]


@pytest.mark.parametrize(
    "world, overrides",
    [(2, {}), (4, {}), (2, dict(vocab_size=383)), (4, dict(num_key_value_heads=1)), (2, dict(num_key_value_heads=4))],
    ids=["2-ranks", "4-ranks-replicated-kv", "2-ranks-padded-vocab", "4-ranks-one-kv-head", "2-ranks-4-kv"],
)
def test_the_ranks_cuts_put_back_together_give_the_checkpoint(world, overrides):
    config = tiny_config(**overrides)
    weights = full_weights(config)
    parts = cuts(config, weights, world)
    attn, mlp = "model.layers.0.self_attn", "model.layers.0.mlp"
    d, hq, hkv = config.head_dim, config.num_heads, config.num_kv_heads

    def cat(name, dim=0):
        return torch.cat([p[name] for p in parts], dim=dim)

    assert torch.equal(cat(f"{attn}.q_proj.weight"), weights[f"{attn}.q_proj.weight"])
    assert torch.equal(cat(f"{attn}.q_proj.bias"), weights[f"{attn}.q_proj.bias"])
    assert torch.equal(cat(f"{attn}.o_proj.weight", 1), weights[f"{attn}.o_proj.weight"])
    assert torch.equal(cat(f"{mlp}.gate_proj.weight"), weights[f"{mlp}.gate_proj.weight"])
    assert torch.equal(cat(f"{mlp}.down_proj.weight", 1), weights[f"{mlp}.down_proj.weight"])
    for rank, part in enumerate(parts):
        # Each rank's keys are the heads its queries read: query head j reads KV head j // (Hq / Hkv).
        first_query = rank * hq // world
        kv_head = first_query // (hq // hkv)
        count = max(1, hkv // world)
        expected_k = weights[f"{attn}.k_proj.weight"][kv_head * d : (kv_head + count) * d]
        assert torch.equal(part[f"{attn}.k_proj.weight"], expected_k)
        # The row-parallel bias is added once: by rank 0.
        bias = part[f"{attn}.o_proj.bias"]
        assert torch.equal(bias, weights[f"{attn}.o_proj.bias"] if rank == 0 else torch.zeros_like(bias))
        # Replicated tensors pass whole.
        for name in ("model.layers.0.input_layernorm.weight", "model.layers.0.mlp.experts.0.gate_proj.weight"):
            assert torch.equal(part[name], weights[name])
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        table = cat(name)
        assert table.shape[0] % world == 0 and table.shape[0] - config.vocab_size < world
        assert torch.equal(table[: config.vocab_size], weights[name])
        assert not table[config.vocab_size :].any()  # padding rows: zero
    local = local_config(config, world)
    assert parts[0][f"{attn}.k_proj.weight"].shape[0] == local.num_kv_heads * d


def test_fused_checkpoint_tensors_are_cut_part_by_part():
    config = tiny_config(num_key_value_heads=4)
    weights = full_weights(config, fused=True)
    parts = cuts(config, weights, 2)
    q, kv, i = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim, config.intermediate_size
    full_q, full_k, full_v = weights["model.layers.0.self_attn.qkv_proj.weight"].split([q, kv, kv])
    full_gate, full_up = weights["model.layers.0.mlp.gate_up_proj.weight"].split([i, i])
    for rank, part in enumerate(parts):
        got_q, got_k, got_v = part["model.layers.0.self_attn.qkv_proj.weight"].split([q // 2, kv // 2, kv // 2])
        assert torch.equal(got_q, full_q.chunk(2)[rank])
        assert torch.equal(got_k, full_k.chunk(2)[rank]) and torch.equal(got_v, full_v.chunk(2)[rank])
        got_gate, got_up = part["model.layers.0.mlp.gate_up_proj.weight"].split([i // 2, i // 2])
        assert torch.equal(got_gate, full_gate.chunk(2)[rank]) and torch.equal(got_up, full_up.chunk(2)[rank])


@pytest.mark.parametrize(
    "overrides, world, message",
    [
        (dict(num_attention_heads=6, num_key_value_heads=6), 4, "attention heads (6)"),
        (dict(num_attention_heads=6, num_key_value_heads=3), 2, "KV heads (3)"),
        (dict(intermediate_size=130), 4, "MLP width (130)"),
    ],
)
def test_sizes_the_ranks_cannot_split_are_refused_naming_them(overrides, world, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_shardable(tiny_config(**overrides), world)


def test_quantization_with_several_ranks_is_refused():
    with pytest.raises(ValueError, match="quantization with tensor_parallel_size > 1"):
        EngineConfig(tensor_parallel_size=2, quantization="int8")


def tp_generate(model_dir: Path, world: int, kernels: str, prompts: list[list[int]]) -> list[list[int]]:
    done = subprocess.run(
        [sys.executable, str(HERE / "support" / "tp_generate.py"), str(model_dir), str(world), kernels, json.dumps(prompts)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])["tokens"]


# Dense families, each through a layout tensor parallelism treats differently: split and replicated KV heads
# (qwen3-bias-mqa has one), tied embeddings, q/k/v biases, fused checkpoint tensors (phi3), sliding windows,
# Gemma's post-norms, soft-capping and embedding scale, mixtures of experts (replicated).
TP_CASES = [
    ("llama", 2, "auto"),
    ("llama", 4, "auto"),
    ("llama", 2, "reference"),
    ("qwen2-tied-window-off", 2, "auto"),
    ("qwen3-bias-mqa", 2, "auto"),
    ("mistral-window", 2, "auto"),
    ("phi3", 2, "auto"),
    ("gemma2-window", 2, "auto"),
    ("gemma3-text-window", 2, "reference"),
    ("mixtral", 2, "auto"),  # experts replicated on every rank, attention split
    ("qwen3-moe-unnormalised-dense-layer", 2, "auto"),  # and one dense MLP layer split
]


@pytest.mark.slow
@pytest.mark.parametrize("name, world, kernels", TP_CASES, ids=[f"{n}-tp{w}-{k}" for n, w, k in TP_CASES])
def test_tensor_parallel_greedy_matches_transformers(family_checkpoint, name, world, kernels):
    model_dir, expected, _ = family_checkpoint(name)
    got = tp_generate(model_dir, world, kernels, prompts_for(name))
    eos = json.loads((model_dir / "config.json").read_text())["eos_token_id"]
    assert truncate_after_eos(got, [eos]) == expected


def serve_ranks(model_dir: Path, world: int, env: dict | None = None):
    return serve_process(
        "--model", str(model_dir), "--num-kv-blocks", "128", "--tensor-parallel-size", str(world), env=env
    )  # fmt: skip


def complete(base: str, prompts: list[str]) -> list[str]:
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    texts = []
    for prompt in prompts:
        reply = client.chat.completions.create(
            model="inferfleet-demo", max_tokens=12, temperature=0, messages=[{"role": "user", "content": prompt}]
        )
        texts.append(reply.choices[0].message.content)
    return texts


STOP_IN_ORDER = """
import json, sys
import torch.distributed as dist
from inferfleet_runtime.engine.llm_engine import LLMEngine
from inferfleet_runtime.engine.config import EngineConfig
from inferfleet_runtime.engine.sampling_params import SamplingParams

engine = LLMEngine.from_model_dir(sys.argv[1], EngineConfig(device="cpu", tensor_parallel_size=2, num_kv_blocks=64))
engine.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=3))
workers = engine.runner.workers
workers.stop()  # what the process's exit runs (atexit)
codes = {rank: process.returncode for rank, process in workers.processes.items()}
print(json.dumps({"codes": codes, "in_group": dist.is_initialized()}))
"""


@pytest.mark.slow
def test_a_server_that_ends_stops_its_ranks_in_order(family_checkpoint):
    """The workers are told to stop and exit 0 (not killed), and rank 0 leaves the group before its interpreter
    finalizes: a gloo thread still holding a collective's tensor then used to abort the process (exit -6)."""
    model_dir, _, _ = family_checkpoint("llama")
    done = subprocess.run(
        [sys.executable, "-c", STOP_IN_ORDER, str(model_dir)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"codes": {"1": 0}, "in_group": False}
    assert "terminate called" not in done.stderr


@pytest.mark.slow
def test_the_server_answers_the_openai_client_the_same_at_one_and_two_ranks(demo_model_dir):
    prompts = ["Complete: Beautiful is", "Explain: errors should never", "Now is better than"]
    answers = {}
    for world in (1, 2):
        with serve_ranks(demo_model_dir, world) as served:
            answers[world] = complete(served.base_url, prompts)
        assert served.returncode == 0, served.output[-3000:]
        if world == 2:
            assert "tensor-parallel rank 0 of 2" in served.output and "tensor-parallel rank 1 of 2" in served.output
    assert answers[2] == answers[1] and all(answers[1])


@pytest.mark.slow
def test_a_rank_that_dies_ends_the_server_non_zero_naming_it(demo_model_dir, tmp_path):
    termination_log = tmp_path / "termination-log"
    termination_log.write_text("")
    with serve_ranks(demo_model_dir, 2, env={"INFERFLEET_TERMINATION_LOG": str(termination_log)}) as served:
        assert complete(served.base_url, ["Complete: Beautiful is"])[0]
        pid = served.proc.pid
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        assert len(children) == 1, children  # the rank 1 worker
        os.kill(int(children[0]), signal.SIGKILL)
        served.proc.wait(timeout=30)  # no hang: the server notices and exits
    assert served.returncode not in (0, None), served.output[-3000:]
    reason = "tensor-parallel rank 1 exited with code -9"
    assert reason in served.output and reason in termination_log.read_text()


def test_rank_zero_holds_the_rendezvous_port_from_the_moment_it_is_chosen():
    """No other process can take the port between rank 0 choosing it and the workers connecting (the port used to be
    picked free, closed, and bound again later)."""
    import socket

    from inferfleet_runtime.worker.tensor_parallel import rendezvous

    store = rendezvous(2)
    with socket.socket() as s, pytest.raises(OSError):
        s.bind(("127.0.0.1", store.port))
    client = rendezvous(2, store.port)
    client.set("seen", "yes")
    assert store.get("seen") == b"yes"
