"""Loading Hugging Face checkpoint directories: sharded weights, config forms, dtype, tokenizer and chat template."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from inferfleet_runtime.checkpoints.loader import CheckpointError, load_model
from inferfleet_runtime.checkpoints.tokenizer import Tokenizer, TokenizerError
from inferfleet_runtime.device import pick_device
from inferfleet_runtime.layers.attention_backend import PagedAttention, allocate_kv_cache, build_attention_metadata
from inferfleet_runtime.model_config import ConfigError
from inferfleet_runtime.models import read_config

PROMPT = [5, 17, 99, 3, 250, 41, 7, 8, 200]


@torch.inference_mode()
def prefill_logits(lm, ids=PROMPT) -> torch.Tensor:
    kv_caches = allocate_kv_cache(lm.config, 4, 8, lm.device)
    meta, positions = build_attention_metadata([[1, 2]], [len(ids)], [len(ids)], 8)
    attn = PagedAttention(kv_caches, meta, lm.model.ops)
    return lm.model.compute_logits(lm.model(torch.tensor(ids), positions, attn))


@pytest.fixture(scope="module")
def gqa_dir(tiny_llama_factory):
    return tiny_llama_factory("loader-gqa", num_key_value_heads=2)


def test_sharded_checkpoint_loads_the_same_weights(tiny_llama_factory, gqa_dir):
    sharded = tiny_llama_factory("loader-sharded", num_key_value_heads=2, max_shard_size="60KB")
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert not (sharded / "model.safetensors").exists()
    torch.testing.assert_close(
        prefill_logits(load_model(sharded, kernels="reference")),
        prefill_logits(load_model(gqa_dir, kernels="reference")),
        rtol=0,
        atol=0,
    )


def test_missing_shard_and_missing_tensor_are_reported(tiny_llama_factory, gqa_dir, tmp_path):
    sharded = tiny_llama_factory("loader-sharded", num_key_value_heads=2, max_shard_size="60KB")
    broken = tmp_path / "broken"
    shutil.copytree(sharded, broken)
    index = json.loads((broken / "model.safetensors.index.json").read_text())
    (broken / sorted(set(index["weight_map"].values()))[-1]).unlink()
    with pytest.raises(CheckpointError, match="lacks shard"):
        load_model(broken, kernels="reference")
    partial = tmp_path / "partial"
    shutil.copytree(gqa_dir, partial)
    tensors = load_file(partial / "model.safetensors")
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    save_file(tensors, partial / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="lacks 1 tensors, e.g. layers.1.self_attn.qkv_proj.weight"):
        load_model(partial, kernels="reference")


def test_dtype_comes_from_the_flag_over_the_config(gqa_dir):
    assert json.loads((gqa_dir / "config.json").read_text())["dtype"] == "float32"
    lm16 = load_model(gqa_dir, dtype="bfloat16", kernels="reference")
    assert lm16.config.dtype == torch.bfloat16
    assert {p.dtype for p in lm16.model.parameters()} == {torch.bfloat16}
    assert allocate_kv_cache(lm16.config, 2, 4, lm16.device)[0][0].dtype == torch.bfloat16
    logits16 = prefill_logits(lm16)
    logits32 = prefill_logits(load_model(gqa_dir, kernels="reference"))
    assert logits16.dtype == torch.float32  # compute_logits always hands back float32
    assert (logits16 - logits32).abs().max() < 0.3


def test_old_and_new_rope_config_forms_agree():
    base = {
        "model_type": "llama",
        "vocab_size": 10,
        "hidden_size": 64,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "max_position_embeddings": 4096,
    }
    scaling = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 512}
    old = read_config(
        {
            **base,
            "rope_theta": 500000.0,
            "rope_scaling": {"rope_type": "llama3", **scaling},
            "torch_dtype": "bfloat16",
            "eos_token_id": [1, 2],
        }
    )
    new = read_config(
        {
            **base,
            "rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", **scaling},
            "dtype": "bfloat16",
            "eos_token_id": [1, 2],
        }
    )
    assert old == new
    assert old.rope_theta == 500000.0 and old.rope_scaling["rope_type"] == "llama3"
    assert old.num_kv_heads == 4 and old.head_dim == 16 and old.dtype == torch.bfloat16
    plain = read_config({**base, "rope_scaling": None})
    assert plain.rope_scaling is None and plain.rope_theta == 10000.0 and plain.dtype == torch.float32


@pytest.mark.parametrize(
    "change, message",
    [
        ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope type 'yarn' is not supported"),
        ({"torch_dtype": "float64"}, "dtype 'float64' is not supported"),
        (
            {"model_type": "mistral", "sliding_window": 0, "max_position_embeddings": 32768},
            "sliding_window must be a positive number of tokens, got 0",
        ),
    ],
)
def test_unsupported_configs_are_refused_with_a_reason(change, message):
    hf = {
        "model_type": "llama",
        "vocab_size": 10,
        "hidden_size": 64,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        **change,
    }
    with pytest.raises(ConfigError, match=message):
        read_config(hf)


def test_mistral_without_a_sliding_window_reads_as_llama():
    hf = {
        "vocab_size": 10,
        "hidden_size": 64,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "rope_theta": 1e6,
    }
    mistral = read_config({**hf, "model_type": "mistral", "sliding_window": None})
    assert mistral == read_config({**hf, "model_type": "llama"})


def test_eos_ids_merge_config_generation_config_and_tokenizer(gqa_dir, tmp_path):
    model_dir = tmp_path / "eos"
    shutil.copytree(gqa_dir, model_dir)
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 7]}))
    lm = load_model(model_dir, kernels="reference")
    end_id = lm.tokenizer.token_to_id("<|end|>")  # the tokenizer_config's eos_token
    assert end_id not in (5, 7, 9)
    (model_dir / "config.json").write_text(
        json.dumps({**json.loads((model_dir / "config.json").read_text()), "eos_token_id": 9})
    )
    lm = load_model(model_dir, kernels="reference")
    assert lm.config.eos_token_ids == [9, 5, 7, end_id]
    assert lm.tokenizer.eos_token_ids == [end_id, 9, 5, 7]


def test_chat_template_jinja_file_wins_over_tokenizer_config(gqa_dir, tmp_path):
    model_dir = tmp_path / "chat"
    shutil.copytree(gqa_dir, model_dir)
    messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]
    from_config = Tokenizer.from_dir(model_dir)
    assert (
        from_config.apply_chat_template(messages)
        == "<|bos|><|system|>\nBe terse.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\n"
    )
    assert from_config.apply_chat_template(messages, add_generation_prompt=False).endswith("Hi<|end|>\n")
    (model_dir / "chat_template.jinja").write_text(
        "{% for m in messages %}[{{ m.role | upper }}] {{ m.content }}{{ eos_token }}{% endfor %}"
        "{% if add_generation_prompt %}[ASSISTANT]{% endif %}"
    )
    assert (
        Tokenizer.from_dir(model_dir).apply_chat_template(messages)
        == "[SYSTEM] Be terse.<|end|>[USER] Hi<|end|>[ASSISTANT]"
    )


def test_chat_template_matches_transformers_rendering(gqa_dir):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(gqa_dir)
    ours = Tokenizer.from_dir(gqa_dir)
    messages = [
        {"role": "user", "content": "Complete: Beautiful is"},
        {"role": "assistant", "content": "ugly"},
        {"role": "user", "content": "Again, ünïcode"},
    ]
    for add in (True, False):
        assert ours.apply_chat_template(messages, add_generation_prompt=add) == hf.apply_chat_template(
            messages, add_generation_prompt=add, tokenize=False
        )
    text = "Errors should never pass silently. ünïcode ✓"
    assert ours.encode(text) == hf(text)["input_ids"]
    assert ours.decode(ours.encode(text)) == text


def test_pick_device_prefers_what_is_asked_and_refuses_what_is_absent():
    assert pick_device("cpu") == torch.device("cpu")
    assert pick_device().type in ("cuda", "xpu", "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="not available"):
            pick_device("cuda")


@pytest.mark.parametrize(
    "has_cuda, hip, has_xpu, expected",
    [
        (True, None, True, ("cuda", "nvidia")),
        (True, "6.2", False, ("cuda", "amd")),  # ROCm builds of torch expose AMD GPUs as cuda
        (False, None, True, ("xpu", "intel")),
        (False, None, False, ("cpu", "cpu")),
    ],
)
def test_pick_device_order_is_cuda_then_xpu_then_cpu(monkeypatch, has_cuda, hip, has_xpu, expected):
    from inferfleet_runtime import device as device_module

    monkeypatch.setattr(torch.cuda, "is_available", lambda: has_cuda)
    monkeypatch.setattr(torch.version, "hip", hip, raising=False)
    if hasattr(torch, "xpu"):
        monkeypatch.setattr(torch.xpu, "is_available", lambda: has_xpu)
    elif has_xpu:
        pytest.skip("this torch build has no torch.xpu")
    picked = pick_device()
    assert (picked.type, device_module.vendor(picked)) == expected


# Templates in the shapes real checkpoints use: a system preamble taken out of the list, alternation
# checked with raise_exception, tojson, whitespace control, namespace() and loop variables.
TEMPLATES = {
    "system-preamble": (
        "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}"
        "{% set messages = messages[1:] %}{% else %}{% set system = 'You are helpful.' %}{% endif %}"
        "<<SYS>>{{ system | trim }}<</SYS>>\n"
        "{% for message in messages %}"
        "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
        "{% if message['role'] == 'user' %}[INST] {{ message['content'] | trim }} [/INST]"
        "{% else %} {{ message['content'] | trim }}{{ eos_token }}{% endif %}"
        "{% endfor %}"
    ),
    "header-blocks": (
        "{% set ns = namespace(count=0) %}{{ bos_token }}"
        "{%- for message in messages %}\n"
        "    {%- set ns.count = ns.count + 1 %}\n"
        "    {{- '<|start|>' + message['role'] + '<|sep|>\\n\\n' + message['content'] | trim + '<|stop|>' }}\n"
        "{%- endfor %}\n"
        "{%- if add_generation_prompt %}{{- '<|start|>assistant<|sep|>\\n\\n' }}{% endif %}"
        "{{- '' if ns.count else 'empty' }}"
    ),
    "json-content": (
        "{% for message in messages %}{{ message['role'] }}: {{ message['content'] | tojson }}"
        "{% if not loop.last %}\n{% endif %}{% endfor %}"
    ),
}
CONVERSATION = [
    {"role": "system", "content": " Be brief. "},
    {"role": "user", "content": "Zen, ünïcode?"},
    {"role": "assistant", "content": "Flat is better than nested. "},
    {"role": "user", "content": "More"},
]


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_real_world_template_shapes_render_as_transformers_does(gqa_dir, tmp_path, name):
    from transformers import AutoTokenizer

    model_dir = tmp_path / name
    shutil.copytree(gqa_dir, model_dir)
    (model_dir / "chat_template.jinja").write_text(TEMPLATES[name])
    hf = AutoTokenizer.from_pretrained(model_dir)
    ours = Tokenizer.from_dir(model_dir)
    for add in (True, False):
        expected = hf.apply_chat_template(CONVERSATION, add_generation_prompt=add, tokenize=False)
        assert ours.apply_chat_template(CONVERSATION, add_generation_prompt=add) == expected


def test_template_errors_surface_as_exceptions(gqa_dir, tmp_path):
    model_dir = tmp_path / "strict"
    shutil.copytree(gqa_dir, model_dir)
    (model_dir / "chat_template.jinja").write_text(TEMPLATES["system-preamble"])
    with pytest.raises(TokenizerError, match="chat template: Conversation roles must alternate"):
        Tokenizer.from_dir(model_dir).apply_chat_template([{"role": "assistant", "content": "hi"}])


LOAD_AND_LIST_MODULES = """
import json, sys
import torch
from inferfleet_runtime.checkpoints.loader import load_model
before = set(sys.modules)
for quantization in ("none", "int4"):
    load_model(sys.argv[1], device="cpu", kernels="native", quantization=quantization)
print(json.dumps(sorted({name.split(".")[0] for name in set(sys.modules) - before})))
"""


def test_loading_on_a_cpu_imports_neither_triton_nor_symbolic_shapes(gqa_dir):
    """Building the model on the meta device and giving it memory must not pull in Triton, dynamo or sympy (about
    100 MiB resident, more than an int4 SmolLM2's own weights)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", LOAD_AND_LIST_MODULES, str(gqa_dir)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    imported = json.loads(done.stdout.strip().splitlines()[-1])
    assert not {"triton", "sympy"} & set(imported), imported
    assert not any(name.startswith("torch._dynamo") for name in imported)
