"""compressed-tensors checkpoints made by the package from a float one, and transformers' greedy tokens to compare."""

from __future__ import annotations

import shutil

import torch

NUM_NEW_TOKENS = 12
PROMPTS = [[1, 17, 42, 99, 5], [1, 250, 3, 77, 12, 8, 141], [1, 9]]


def make_compressed(float_dir, out_dir, bits, group_size, symmetric, fmt, type_="int", strategy=None):
    """(checkpoint dir, transformers model holding the package's decompressed weights)."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
        apply_quantization_config,
    )
    from compressed_tensors.quantization.utils import calculate_qparams
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(float_dir).eval()
    strategy = strategy or ("group" if group_size else "channel")
    args = QuantizationArgs(num_bits=bits, type=type_, symmetric=symmetric, strategy=strategy, group_size=group_size)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"]))
    with torch.no_grad():  # min/max calibration of each weight, through the package's own qparams
        for module in model.modules():
            if hasattr(module, "weight_scale"):
                w = module.weight
                groups = w.view(1, 1, -1) if strategy == "tensor" else w.view(w.shape[0], -1, group_size or w.shape[1])
                scale, zero_point = calculate_qparams(groups.amin(-1), groups.amax(-1), args)
                module.weight_scale.copy_(scale.view_as(module.weight_scale))
                if hasattr(module, "weight_zero_point"):
                    module.weight_zero_point.copy_(zero_point.view_as(module.weight_zero_point))
    compressor = ModelCompressor.from_pretrained_model(model, fmt)
    compressor.compress_model(model)
    model.save_pretrained(out_dir)
    compressor.update_config(out_dir)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(float_dir / name, out_dir / name)
    compressor.decompress_model(model)
    return out_dir, model


def hf_greedy(hf_model) -> list[list[int]]:
    outputs = []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = torch.tensor([prompt])
            out = hf_model.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NUM_NEW_TOKENS,
                min_new_tokens=NUM_NEW_TOKENS, pad_token_id=0,
            )  # fmt: skip
            outputs.append(out[0, len(prompt) :].tolist())
    return outputs
