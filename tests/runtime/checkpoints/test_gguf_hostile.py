"""Hostile GGUF files: crafted headers (counts, lengths and offsets past the file's end, bad type ids, bad dims, loops
that never advance) and bad metadata values are refused with the loader's error naming the field, quickly and in a
small memory budget; byte-level mutations of a valid file load or raise nothing but that error."""

from __future__ import annotations

import signal
import struct
import subprocess
import sys
import textwrap
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferfleet_runtime.checkpoints.gguf import load_gguf
from inferfleet_runtime.checkpoints.loader import CheckpointError

gguf = pytest.importorskip("gguf")

TIME_LIMIT_S = 5  # each hostile file is refused long before this
MEMORY_BUDGET_MIB = 64  # growth of the peak RSS while refusing the hostile files (the old reader grew without end)
UINT32, STRING, ARRAY = 4, 8, 9
F32, Q8_0 = 0, 8


def u32(n: int) -> bytes:
    return struct.pack("<I", n)


def u64(n: int) -> bytes:
    return struct.pack("<Q", n)


def string(text: str) -> bytes:
    return u64(len(text.encode())) + text.encode()


def field(key: str, value_type: int, payload: bytes) -> bytes:
    return string(key) + u32(value_type) + payload


def tensor_entry(name: str, dims: list[int], type_id: int = F32, offset: int = 0) -> bytes:
    return string(name) + u32(len(dims)) + b"".join(u64(d) for d in dims) + u32(type_id) + u64(offset)


def gguf_bytes(fields=(), tensors=(), data=b"", num_fields=None, num_tensors=None, version=3) -> bytes:
    """A GGUF file from raw entries; the counts are the entries' unless given."""
    counts = u64(len(tensors) if num_tensors is None else num_tensors) + u64(
        len(fields) if num_fields is None else num_fields
    )
    body = b"GGUF" + u32(version) + counts + b"".join(fields) + b"".join(tensors)
    return body + b"\0" * (-len(body) % 32) + data


ARCH = field("general.architecture", STRING, string("llama"))
NORM = tensor_entry("output_norm.weight", [8])
# (id, file bytes, what the error must name)
HOSTILE = [
    ("huge-metadata-count", gguf_bytes(num_fields=2**62), "metadata count"),
    ("huge-tensor-count", gguf_bytes(num_tensors=2**62), "tensor count"),
    ("unknown-version", gguf_bytes(version=7), "version 7"),
    ("key-longer-than-file", gguf_bytes([u64(10**12) + b"key"], num_fields=1), "metadata entry 0's key"),
    ("string-longer-than-file", gguf_bytes([field("general.name", STRING, u64(2**40) + b"x")]), "'general.name'"),
    ("array-longer-than-file", gguf_bytes([field("a.list", ARRAY, u32(UINT32) + u64(2**61))]), "'a.list''s length"),
    # The old reader looped over 2^62 empty reads past the end, its memory growing without end.
    ("loop-forever-strings", gguf_bytes([field("a.list", ARRAY, u32(STRING) + u64(2**62))]), "'a.list''s length"),
    ("loop-forever-arrays", gguf_bytes([field("a.list", ARRAY, u32(ARRAY) + u64(2**62))]), "'a.list' is an array of arrays"),
    ("bad-value-type", gguf_bytes([field("a.value", 99, u64(0))]), "'a.value''s value type 99"),
    ("bad-element-type", gguf_bytes([field("a.list", ARRAY, u32(77) + u64(1))]), "'a.list' is of element type 77"),
    ("zero-alignment", gguf_bytes([ARCH, field("general.alignment", UINT32, u32(0))]), "general.alignment"),
    ("odd-alignment", gguf_bytes([ARCH, field("general.alignment", UINT32, u32(3))]), "general.alignment"),
    ("string-alignment", gguf_bytes([ARCH, field("general.alignment", STRING, string("32"))]), "general.alignment"),
    ("duplicate-key", gguf_bytes([ARCH, ARCH]), "'general.architecture' appears twice"),
    ("name-longer-than-file", gguf_bytes([ARCH], [u64(2**50)], num_tensors=1), "tensor entry 0's name"),
    ("no-dims", gguf_bytes([ARCH], [tensor_entry("output_norm.weight", [])]), "'output_norm.weight' has 0 dims"),
    ("five-dims", gguf_bytes([ARCH], [tensor_entry("output_norm.weight", [1] * 5)]), "has 5 dims"),
    ("zero-dim", gguf_bytes([ARCH], [tensor_entry("output_norm.weight", [8, 0])], b"\0" * 32), "dims \\[8, 0\\]"),
    ("negative-dim", gguf_bytes([ARCH], [tensor_entry("output_norm.weight", [2**64 - 8])]), "dims"),
    ("dims-past-end", gguf_bytes([ARCH], [string("t") + u32(4) + u64(8)], num_tensors=1), "'t''s dims"),
    ("bad-tensor-type", gguf_bytes([ARCH], [tensor_entry("output_norm.weight", [8], 1000)]), "type 1000"),
    ("offset-past-end", gguf_bytes([ARCH], [tensor_entry("output_norm.weight", [8], F32, 2**40)]), "'output_norm.weight''s data"),
    ("data-past-end", gguf_bytes([ARCH], [tensor_entry("output_norm.weight", [1024, 1024])], b"\0" * 32), "'output_norm.weight''s data"),
    ("huge-data", gguf_bytes([ARCH], [tensor_entry("output_norm.weight", [2**31] * 4)]), "'output_norm.weight''s data"),
    ("unaligned-offset", gguf_bytes([ARCH], [tensor_entry("output_norm.weight", [8], F32, 4)], b"\0" * 64), "offset 4"),
    ("partial-block", gguf_bytes([ARCH], [tensor_entry("output_norm.weight", [31], Q8_0)], b"\0" * 64), "Q8_0 blocks"),
    ("duplicate-tensor", gguf_bytes([ARCH], [NORM, NORM], b"\0" * 32), "'output_norm.weight' appears twice"),
]  # fmt: skip


@contextmanager
def quickly(seconds: float = TIME_LIMIT_S):
    """Fails the block if it runs longer than `seconds` (a reader stuck in a loop is interrupted, not waited for);
    an outer alarm (pytest-timeout's) is put back afterwards."""

    def expire(signum, frame):
        raise TimeoutError(f"still reading after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    started = time.monotonic()
    outer_delay, outer_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer_delay:
            signal.setitimer(signal.ITIMER_REAL, max(0.001, outer_delay - (time.monotonic() - started)), outer_interval)


@pytest.mark.parametrize("data, field_name", [case[1:] for case in HOSTILE], ids=[case[0] for case in HOSTILE])
def test_a_hostile_header_is_refused_naming_the_field(tmp_path, data, field_name):
    path = tmp_path / "hostile.gguf"
    path.write_bytes(data)
    with quickly(), pytest.raises(CheckpointError, match=f"hostile.gguf is not a readable GGUF file: .*{field_name}"):
        load_gguf(path)


def test_hostile_headers_are_refused_in_a_fixed_memory_budget(tmp_path):
    """All the hostile files, one after the other, in a fresh process: its peak memory barely moves."""
    for name, data, _ in HOSTILE:
        (tmp_path / f"{name}.gguf").write_bytes(data)
    script = textwrap.dedent(
        """
        import resource, sys
        from pathlib import Path
        import gguf
        from inferfleet_runtime.checkpoints.gguf import load_gguf
        from inferfleet_runtime.checkpoints.loader import CheckpointError

        paths = sorted(Path(sys.argv[1]).glob("*.gguf"))
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for path in paths:
            try:
                load_gguf(path)
            except CheckpointError:
                pass
        print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
        """
    )
    try:
        done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("reading the hostile files did not end within 60 s")
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.split()[-1]) < MEMORY_BUDGET_MIB


# A valid tiny Llama: 1 layer, hidden 8, 2 heads of 4 (1 KV head), MLP 16, 8 tokens.
TOKENS = ["a", "b", "c", "d", "ab", "cd", "<s>", "</s>"]
METADATA = {
    "llama.context_length": (64, gguf.GGUFValueType.UINT32),
    "llama.embedding_length": (8, gguf.GGUFValueType.UINT32),
    "llama.feed_forward_length": (16, gguf.GGUFValueType.UINT32),
    "llama.block_count": (1, gguf.GGUFValueType.UINT32),
    "llama.attention.head_count": (2, gguf.GGUFValueType.UINT32),
    "llama.attention.head_count_kv": (1, gguf.GGUFValueType.UINT32),
    "llama.attention.layer_norm_rms_epsilon": (1e-5, gguf.GGUFValueType.FLOAT32),
    "llama.rope.freq_base": (10000.0, gguf.GGUFValueType.FLOAT32),
    "tokenizer.ggml.model": ("gpt2", gguf.GGUFValueType.STRING),
    "tokenizer.ggml.tokens": (TOKENS, gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING),
    "tokenizer.ggml.token_type": ([1] * 6 + [3, 3], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32),
    "tokenizer.ggml.merges": (["a b", "c d"], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING),
    "tokenizer.ggml.bos_token_id": (6, gguf.GGUFValueType.UINT32),
    "tokenizer.ggml.eos_token_id": (7, gguf.GGUFValueType.UINT32),
}
SHAPES = {  # numpy order: [out, in]
    "token_embd.weight": (8, 8),
    "output_norm.weight": (8,),
    "blk.0.attn_norm.weight": (8,),
    "blk.0.attn_q.weight": (8, 8),
    "blk.0.attn_k.weight": (4, 8),
    "blk.0.attn_v.weight": (4, 8),
    "blk.0.attn_output.weight": (8, 8),
    "blk.0.ffn_norm.weight": (8,),
    "blk.0.ffn_gate.weight": (16, 8),
    "blk.0.ffn_up.weight": (16, 8),
    "blk.0.ffn_down.weight": (8, 16),
}


def tiny_llama_gguf(path: Path, metadata: dict | None = None, tensors: dict | None = None) -> Path:
    """The valid tiny Llama with some metadata replaced ({key: (value, type[, element type])}, None drops it) and
    some tensors replaced ({name: array})."""
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, spec in {**METADATA, **(metadata or {})}.items():
        if spec is not None:
            writer.add_key_value(key, *spec)
    rng = np.random.default_rng(0)
    for name, shape in SHAPES.items():
        writer.add_tensor(name, rng.standard_normal(shape, dtype=np.float32))
    for name, array in (tensors or {}).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def load_all(path: Path):
    config, tokenizer, weights = load_gguf(path)
    return config, tokenizer, dict(weights)


def test_the_tiny_valid_file_loads(tmp_path):
    config, tokenizer, weights = load_all(tiny_llama_gguf(tmp_path / "tiny.gguf"))
    assert (config.vocab_size, config.hidden_size, config.num_layers, config.head_dim) == (8, 8, 1, 4)
    assert tokenizer.encode("abcd") == [4, 5]
    assert weights["model.layers.0.mlp.up_proj.weight"].shape == (16, 8)


U32, STR = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.STRING
# (id, metadata or tensors replaced, what the error must name); each ended in a stray exception type (or a load).
BAD_VALUES = [
    ("zero-heads", {"llama.attention.head_count": (0, U32)}, "llama.attention.head_count"),
    ("text-width", {"llama.embedding_length": ("eight", STR)}, "llama.embedding_length"),
    ("list-context", {"llama.context_length": ([64], gguf.GGUFValueType.ARRAY, U32)}, "llama.context_length"),
    ("text-epsilon", {"llama.attention.layer_norm_rms_epsilon": ("tiny", STR)}, "layer_norm_rms_epsilon"),
    ("no-width", {"llama.embedding_length": None}, "lacks the metadata key llama.embedding_length"),
    ("many-layers", {"llama.block_count": (2**40, gguf.GGUFValueType.UINT64)}, "llama.block_count"),
    ("huge-vocab", {"llama.vocab_size": (2**40, gguf.GGUFValueType.UINT64)}, "token_embd.weight"),
    ("width-unlike-tensors", {"llama.embedding_length": (16, U32)}, "token_embd.weight"),
    ("heads-unlike-tensors", {"llama.attention.head_count_kv": (2, U32)}, "blk.0.attn_k.weight"),
    ("uneven-heads", {"llama.attention.head_count": (3, U32)}, "llama.attention.head_count"),
    ("no-tokens", {"tokenizer.ggml.tokens": None}, "tokenizer.ggml.tokens"),
    ("number-tokens", {"tokenizer.ggml.tokens": ([1] * 8, gguf.GGUFValueType.ARRAY, U32)}, "tokenizer.ggml.tokens"),
    ("bos-past-vocab", {"tokenizer.ggml.bos_token_id": (1000, U32)}, "tokenizer.ggml.bos_token_id"),
    ("text-eos", {"tokenizer.ggml.eos_token_id": ("7", STR)}, "tokenizer.ggml.eos_token_id"),
    ("short-token-types", {"tokenizer.ggml.token_type": ([1], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32)},
     "tokenizer.ggml.token_type"),
    ("merge-without-space", {"tokenizer.ggml.merges": (["ab"], gguf.GGUFValueType.ARRAY, STR)},
     "tokenizer.ggml.merges"),
    ("merge-of-unknown-tokens", {"tokenizer.ggml.merges": (["x y"], gguf.GGUFValueType.ARRAY, STR)},
     "tokenizer.ggml.merges"),
    ("text-template", {"tokenizer.chat_template": ([1], gguf.GGUFValueType.ARRAY, U32)}, "tokenizer.chat_template"),
]  # fmt: skip


@pytest.mark.parametrize("metadata, field_name", [c[1:] for c in BAD_VALUES], ids=[c[0] for c in BAD_VALUES])
def test_a_bad_metadata_value_is_refused_naming_the_key(tmp_path, metadata, field_name):
    path = tiny_llama_gguf(tmp_path / "bad.gguf", metadata=metadata)
    with quickly(), pytest.raises(CheckpointError, match=field_name):
        load_all(path)


def test_a_tensor_of_a_type_the_runtime_cannot_decode_is_refused_naming_it(tmp_path):
    path = tiny_llama_gguf(tmp_path / "ints.gguf", tensors={"output.weight": np.zeros((8, 8), np.int32)})
    with quickly(), pytest.raises(CheckpointError, match="tensor 'output.weight' of type I32"):
        load_all(path)


@pytest.fixture(scope="module")
def valid_file(tmp_path_factory) -> tuple[Path, int]:
    """The valid file and where its header ends (its tensor data starts)."""
    path = tiny_llama_gguf(tmp_path_factory.mktemp("fuzz") / "valid.gguf")
    return path, int(gguf.GGUFReader(str(path)).data_offset)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_mutated_valid_file_loads_or_raises_only_the_loaders_error(valid_file, tmp_path, data):
    """Overwrites a few bytes (weighted to the header, where the structure is) and may cut the file short."""
    valid, header_end = valid_file
    mutated = bytearray(valid.read_bytes())
    edits = data.draw(st.lists(st.tuples(st.integers(0, header_end), st.binary(min_size=1, max_size=8)), max_size=4))
    for position, replacement in edits:
        mutated[position : position + len(replacement)] = replacement
    cut = data.draw(st.one_of(st.none(), st.integers(0, len(mutated))))
    path = tmp_path / "mutated.gguf"
    path.write_bytes(bytes(mutated[:cut]))
    with quickly():
        try:
            load_all(path)
        except CheckpointError:
            pass
