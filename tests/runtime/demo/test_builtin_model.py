"""The built-in model: trained deterministically, cached, loadable by transformers, and it knows the Zen of Python."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from inferfleet_runtime.checkpoints.loader import load_model
from inferfleet_runtime.demo import builtin_model as demo_model
from inferfleet_runtime.demo import text as demo_text

from ..support.paged_greedy import greedy_paged, hf_greedy, truncate_after_eos

TINY_RECIPE = demo_model.Recipe(
    hidden_size=32,
    intermediate_size=64,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    vocab_size=300,
    seq_len=32,
    batch_size=4,
    steps=3,
)


def opening(line: str, num_words: int = 3) -> str:
    return " ".join(line.split()[:num_words])


def unambiguous_lines() -> list[str]:
    """Zen lines whose first three words start no other line (so their continuation is determined)."""
    lines = demo_text.zen_lines()
    openings = [opening(line) for line in lines]
    return [line for line, o in zip(lines, openings) if openings.count(o) == 1]


def test_zen_text_is_read_without_printing(capsys):
    text = demo_text.zen_text()
    assert text.startswith("The Zen of Python, by Tim Peters")
    assert "Beautiful is better than ugly." in text
    assert capsys.readouterr().out == ""


@pytest.mark.slow
def test_training_is_deterministic_under_the_seed(tmp_path):
    demo_model.train_demo_model(tmp_path / "a", TINY_RECIPE)
    demo_model.train_demo_model(tmp_path / "b", TINY_RECIPE)
    assert (tmp_path / "a/model.safetensors").read_bytes() == (tmp_path / "b/model.safetensors").read_bytes()
    other = demo_model.Recipe(**{**TINY_RECIPE.__dict__, "seed": 1})
    demo_model.train_demo_model(tmp_path / "c", other)
    assert (tmp_path / "a/model.safetensors").read_bytes() != (tmp_path / "c/model.safetensors").read_bytes()


def test_ensure_trains_once_into_a_recipe_keyed_cache(tmp_path):
    first = demo_model.ensure_demo_model(TINY_RECIPE, root=tmp_path)
    assert first.parent == tmp_path and first.name == demo_model.recipe_hash(TINY_RECIPE)
    stamp = os.stat(first / "model.safetensors").st_mtime_ns
    assert demo_model.ensure_demo_model(TINY_RECIPE, root=tmp_path) == first
    assert os.stat(first / "model.safetensors").st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".train-")] == []  # no temp dirs left behind
    other = demo_model.Recipe(**{**TINY_RECIPE.__dict__, "steps": 4})
    assert demo_model.recipe_hash(other) != demo_model.recipe_hash(TINY_RECIPE)


def test_concurrent_callers_train_once(tmp_path, monkeypatch):
    calls = []
    train = demo_model.train_demo_model
    monkeypatch.setattr(demo_model, "train_demo_model", lambda out, recipe: (calls.append(out), train(out, recipe)))
    with ThreadPoolExecutor(3) as pool:
        paths = list(pool.map(lambda _: demo_model.ensure_demo_model(TINY_RECIPE, root=tmp_path), range(3)))
    assert len(set(paths)) == 1 and len(calls) == 1
    assert (paths[0] / "model.safetensors").is_file()


def test_cli_writes_a_hugging_face_checkpoint(demo_model_dir, tmp_path):
    from inferfleet_runtime.cli import main

    out = tmp_path / "demo"
    assert main(["demo-model", "--out", str(out)]) == 0
    names = {p.name for p in out.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    } <= names
    assert (out / "model.safetensors").read_bytes() == (demo_model_dir / "model.safetensors").read_bytes()


@pytest.mark.slow
def test_greedy_completion_continues_zen_lines(demo_model_dir):
    lm = load_model(demo_model_dir, kernels="reference")
    lines = unambiguous_lines()
    prompts = [lm.tokenizer.encode(opening(line)) for line in lines]
    outputs = greedy_paged(lm.model, prompts, 40, block_size=16, chunk_size=64)
    continued = [lm.tokenizer.decode(out).startswith(line[len(opening(line)) :]) for line, out in zip(lines, outputs)]
    assert continued[lines.index("Beautiful is better than ugly.")]
    assert sum(continued) >= 0.9 * len(lines), [line for line, ok in zip(lines, continued) if not ok]


@pytest.mark.slow
def test_chat_completion_answers_with_the_zen_line(demo_model_dir):
    lm = load_model(demo_model_dir, kernels="reference")
    prompt = lm.tokenizer.apply_chat_template([{"role": "user", "content": "Complete: Beautiful is"}])
    ids = lm.tokenizer.encode(prompt, add_special_tokens=False)
    [out] = greedy_paged(lm.model, [ids], 16, block_size=16, chunk_size=64)
    end = next(i for i, t in enumerate(out) if t in lm.config.eos_token_ids)  # the answer ends the turn
    assert lm.tokenizer.decode(out[:end]) == "Beautiful is better than ugly."


@pytest.mark.slow
def test_transformers_loads_it_and_agrees_greedily(demo_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf_tokenizer = AutoTokenizer.from_pretrained(demo_model_dir)
    hf_model = AutoModelForCausalLM.from_pretrained(demo_model_dir).eval()
    lm = load_model(demo_model_dir, kernels="reference")
    messages = [{"role": "user", "content": "Continue: Flat is"}]
    hf_prompt = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert lm.tokenizer.apply_chat_template(messages) == hf_prompt
    texts = ["Now is better", "Errors should never", hf_prompt]
    prompts = [lm.tokenizer.encode(text, add_special_tokens=text != hf_prompt) for text in texts]
    assert prompts[:2] == [hf_tokenizer(text)["input_ids"] for text in texts[:2]]
    expected = hf_greedy(hf_model, prompts, 16)
    got = greedy_paged(lm.model, prompts, 16, block_size=4, chunk_size=6)
    assert truncate_after_eos(got, lm.config.eos_token_ids) == expected
    assert lm.tokenizer.decode(expected[2]) == "Flat is better than nested."
