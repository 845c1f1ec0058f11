"""The whole runtime model run through the Triton kernels (interpreter) gives the reference path's tokens."""

from __future__ import annotations

import pytest
import torch

from inferfleet_runtime.checkpoints.loader import load_model
from inferfleet_runtime.kernels import activation, fused_moe, kv_cache, paged_attention, rms_norm, rotary

from ..support.paged_greedy import greedy_paged

# Tiny Llama checkpoints: GQA with head_dim 16, MQA with a non-power-of-two head_dim (80), and a sliding window.
CONFIGS = {
    "gqa-d16": dict(num_attention_heads=4, num_key_value_heads=2),
    "mqa-d80": dict(hidden_size=160, num_attention_heads=2, num_key_value_heads=1, intermediate_size=96),
    # Mistral with a 5-token window: shorter than all but the shortest prompts, sliding across 4-token blocks.
    "mistral-window": dict(classes=("MistralConfig", "MistralForCausalLM"), num_key_value_heads=2, sliding_window=5),
    # Mixture-of-Experts: 4 experts, top-2 (every layer sparse); Qwen3-MoE's q/k norms and unnormalised weights.
    "mixtral-e4k2": dict(classes=("MixtralConfig", "MixtralForCausalLM"), num_local_experts=4, num_experts_per_tok=2),
    "qwen3-moe-e4k2": dict(
        classes=("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=48,
        head_dim=16,
        norm_topk_prob=False,
    ),
}
PROMPT_LENGTHS = [1, 3, 8, 13]
NUM_NEW_TOKENS = 5
KERNELS = [
    activation._silu_and_mul_kernel,
    kv_cache._write_kv_kernel,
    paged_attention._paged_attention_kernel,
    rms_norm._rms_norm_kernel,
    rotary._rotary_kernel,
]
MOE_KERNELS = [fused_moe._fused_moe_kernel]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_tokens_through_triton_kernels_match_reference(tiny_llama_factory, monkeypatch, name):
    model_dir = tiny_llama_factory(name, **CONFIGS[name])
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, 384, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]
    reference = load_model(model_dir, device="cpu", kernels="reference")
    expected = greedy_paged(reference.model, prompts, NUM_NEW_TOKENS, block_size=4, chunk_size=5)

    launched = set()
    for kernel in KERNELS + MOE_KERNELS:
        on = kernel.on
        monkeypatch.setattr(kernel, "on", lambda device, kernel=kernel, on=on: launched.add(kernel) or on(device))
    triton_lm = load_model(model_dir, device="cpu", kernels="triton")
    got = greedy_paged(triton_lm.model, prompts, NUM_NEW_TOKENS, block_size=4, chunk_size=5)

    sparse_layers = len(triton_lm.config.moe_layers)
    expected_kernels = set(KERNELS + (MOE_KERNELS if sparse_layers else []))
    if sparse_layers == triton_lm.config.num_layers:  # no dense MLP: the experts kernel fuses its SiLU-and-mul
        expected_kernels.remove(activation._silu_and_mul_kernel)
    assert launched == expected_kernels, "every Triton kernel the model has must have run"
    assert got == expected
    assert len({tuple(out) for out in expected}) == len(prompts), "degenerate reference outputs prove little"


@pytest.mark.slow
@pytest.mark.parametrize("method", ["int8", "int4"])
def test_quantized_model_through_the_triton_matmul_gives_the_reference_tokens(tiny_llama_factory, monkeypatch, method):
    from inferfleet_runtime.kernels import quantized_matmul

    model_dir = tiny_llama_factory("gqa-d16", **CONFIGS["gqa-d16"])
    prompts = [[5, 17, 99, 3, 250], [33, 7]]
    reference = load_model(model_dir, device="cpu", kernels="reference", quantization=method)
    expected = greedy_paged(reference.model, prompts, 3, block_size=4, chunk_size=5)
    kernel, launches = quantized_matmul._quantized_matmul_kernel, []
    on = kernel.on
    monkeypatch.setattr(kernel, "on", lambda device: launches.append(device) or on(device))
    triton_lm = load_model(model_dir, device="cpu", kernels="triton", quantization=method)
    assert greedy_paged(triton_lm.model, prompts, 3, block_size=4, chunk_size=5) == expected
    assert len(launches) >= 4 * triton_lm.config.num_layers  # every linear of every layer, each step
