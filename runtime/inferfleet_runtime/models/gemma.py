"""Gemma 2 and Gemma 3 text decoders (`Gemma2ForCausalLM`, `Gemma3ForCausalLM`): the Llama decoder's blocks with
Gemma's differences. Norms scale by (1 + weight), and besides the norm before attention and before the MLP each
output is normalised too (four per layer); GeGLU-tanh; embeddings scaled by sqrt(hidden_size); attention scaled by
query_pre_attn_scalar^-1/2. Gemma 2 soft-caps attention scores and the final logits; Gemma 3 normalises q and k per
head and gives its sliding-window layers their own RoPE base. Sliding-window layers (Gemma 2: every other one; Gemma
3: as layer_types or sliding_window_pattern says) pass their window to the attention backend; bidirectional
attention (use_bidirectional_attention, an encoder's) is refused."""

from __future__ import annotations

import logging

import torch
from torch import nn

from inferfleet_runtime.kernels import KernelOps
from inferfleet_runtime.layers.attention import Attention
from inferfleet_runtime.layers.attention_backend import AttentionBackend
from inferfleet_runtime.layers.mlp import GatedMLP
from inferfleet_runtime.layers.norm import RMSNorm
from inferfleet_runtime.layers.rotary import rope_cos_sin_cache
from inferfleet_runtime.model_config import ConfigError, ModelConfig, read_rope, read_sliding_windows

from .llama import LlamaModel

log = logging.getLogger(__name__)


def gemma2_config_fields(hf: dict) -> dict:
    return _gemma_fields(hf, _sliding_layers(hf, 2))


def gemma3_config_fields(hf: dict) -> dict:
    sliding = _sliding_layers(hf, hf.get("sliding_window_pattern", 6))
    params = hf.get("rope_parameters") or {}
    if "full_attention" in params:  # transformers 5: one RoPE per layer type
        full, local = params["full_attention"], params.get("sliding_attention") or {}
    else:  # rope_theta (+ rope_scaling) for the global layers, rope_local_base_freq for the sliding ones
        full = {"rope_theta": hf.get("rope_theta", 1e6), **(hf.get("rope_scaling") or {})}
        local = {"rope_theta": hf.get("rope_local_base_freq", 1e4)}
    context = {"max_position_embeddings": hf.get("max_position_embeddings", 2048)}
    theta, scaling = read_rope({"rope_parameters": full, **context})
    local_theta, local_scaling = read_rope({"rope_parameters": {"rope_theta": 1e4, **local}, **context})
    if local_scaling is not None:
        raise ConfigError("scaled RoPE on Gemma 3's sliding-window layers is not supported")
    return {
        **_gemma_fields(hf, sliding),
        "qk_norm": True,
        "rope_theta": theta,
        "rope_scaling": scaling,
        "local_rope_theta": local_theta,
        "local_rope_layers": tuple(i for i, is_sliding in enumerate(sliding) if is_sliding),
    }


def _gemma_fields(hf: dict, sliding: list[bool]) -> dict:
    if hf.get("use_bidirectional_attention"):
        raise ConfigError("bidirectional attention (use_bidirectional_attention) is not supported")
    activation = hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"
    if activation != "gelu_pytorch_tanh":
        raise ConfigError(f"activation {activation!r} is not supported (supported: gelu_pytorch_tanh)")
    return {
        "hidden_act": "gelu_tanh",
        "norm_offset": 1.0,
        "embed_scale": hf["hidden_size"] ** 0.5,
        "query_pre_attn_scalar": hf.get("query_pre_attn_scalar", 256),  # transformers' default
        "attn_logit_softcapping": hf.get("attn_logit_softcapping"),
        "final_logit_softcapping": hf.get("final_logit_softcapping"),
        "tie_word_embeddings": bool(hf.get("tie_word_embeddings", True)),  # Gemma's default
        **read_sliding_windows(hf, sliding, default=4096),  # transformers' default
    }


def _sliding_layers(hf: dict, pattern: int) -> list[bool]:
    """Which layers attend through sliding_window: as layer_types says, else all but every pattern-th."""
    if hf.get("layer_types"):
        return [kind == "sliding_attention" for kind in hf["layer_types"]]
    return [(i + 1) % pattern != 0 for i in range(hf["num_hidden_layers"])]


class GemmaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, ops: KernelOps, layer_index: int):
        super().__init__()

        def norm() -> RMSNorm:
            return RMSNorm(config.hidden_size, config.rms_norm_eps, ops, config.norm_offset)

        self.input_layernorm, self.post_attention_layernorm = norm(), norm()
        self.pre_feedforward_layernorm, self.post_feedforward_layernorm = norm(), norm()
        self.self_attn = Attention(config, ops, layer_index)
        self.mlp = GatedMLP(config, ops)

    def forward(self, h, residual, positions, cos_sin_cache, attn: AttentionBackend):
        # As in the Llama layer the residual stream is carried apart, each pre-norm fusing the add before it; the
        # post-norms normalise a sublayer's output before it is added.
        x, residual = self.input_layernorm(h, residual)
        x, _ = self.post_attention_layernorm(self.self_attn(x, positions, cos_sin_cache, attn))
        x, residual = self.pre_feedforward_layernorm(x, residual)
        x, _ = self.post_feedforward_layernorm(self.mlp(x))
        return x, residual


class GemmaModel(LlamaModel):
    layer_class = GemmaDecoderLayer

    def __init__(self, config: ModelConfig, ops: KernelOps):
        super().__init__(config, ops)
        self.register_buffer("local_cos_sin_cache", torch.empty(0), persistent=False)
        reference_only = ["GeGLU-tanh"] + (["soft-capped attention"] if config.attn_logit_softcapping else [])
        if ops.backend != "reference":
            log.info(
                "Chose the torch reference ops for %s of %s (family %s): the %s kernels have none",
                " and ".join(reference_only), config.name, config.family, ops.backend,
            )  # fmt: skip

    def init_rope(self) -> None:
        super().init_rope()
        c = self.config
        if c.local_rope_layers:
            self.local_cos_sin_cache = rope_cos_sin_cache(
                c.head_dim, c.local_rope_theta, None, c.max_position_embeddings, self.norm.weight.device
            )

    def native_forward_gaps(self) -> list[str]:
        gaps = ["(1 + weight) norms after attention and the MLP", "GeGLU-tanh", "an embedding scale"]
        if self.config.qk_norm:
            gaps.append("per-head q/k RMSNorm")
        if self.config.attn_logit_softcapping:
            gaps.append("soft-capped attention")
        if self.config.local_rope_layers:
            gaps.append("a second RoPE table")
        return gaps

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend) -> torch.Tensor:
        """input_ids, positions: [T] int64 -> hidden states [T, hidden] (final norm applied)."""
        h = self.embed_tokens(input_ids)  # [T, hidden]
        h = h * torch.tensor(self.config.embed_scale, dtype=h.dtype, device=h.device)  # rounded as Gemma rounds it
        residual = None
        local_layers = self.config.local_rope_layers
        for i, layer in enumerate(self.layers):
            cos_sin_cache = self.local_cos_sin_cache if i in local_layers else self.cos_sin_cache
            h, residual = layer(h, residual, positions, cos_sin_cache, attn)
        h, _ = self.norm(h, residual)
        return h

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden).float()  # [N, hidden] -> [N, vocab] float32
        cap = self.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap
