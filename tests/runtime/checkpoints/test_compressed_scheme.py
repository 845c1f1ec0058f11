"""A compressed-tensors quantization_config is read into an IntScheme or refused with the loader's error naming the
field: malformed ones (wrong types, missing keys, unknown bits, strategies or types) never end in another exception."""

from __future__ import annotations

import copy
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferfleet_runtime.checkpoints.compressed_tensors import IntScheme, read_scheme
from inferfleet_runtime.checkpoints.loader import CheckpointError

WEIGHTS = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}
VALID = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "config_groups": {"group_0": {"targets": ["Linear"], "weights": WEIGHTS, "input_activations": None}},
    "ignore": ["lm_head"],
}


def parent_of(config: dict, path: str) -> tuple[dict, str]:
    """(the object holding the field at a dotted path such as config_groups.group_0.weights.num_bits, its key)."""
    *parents, leaf = path.split(".")
    for key in parents:
        config = config[key]
    return config, leaf


def with_field(path: str, value, config: dict = VALID) -> dict:
    """A copy of config with the field at `path` set to value."""
    config = copy.deepcopy(config)
    parent, key = parent_of(config, path)
    parent[key] = copy.deepcopy(value)
    return config


def without_field(path: str) -> dict:
    config = copy.deepcopy(VALID)
    parent, key = parent_of(config, path)
    del parent[key]
    return config


GROUP = "config_groups.group_0"
# (id, quantization_config, what the error must name)
BAD = [
    ("not-an-object", ["compressed-tensors"], "quantization_config"),
    ("groups-a-list", with_field("config_groups", [{"weights": WEIGHTS}]), "quantization_config.config_groups"),
    ("group-a-string", with_field(GROUP, "W4A16"), f"quantization_config.{GROUP}"),
    ("weights-a-list", with_field(f"{GROUP}.weights", [4]), f"{GROUP}.weights"),
    ("no-weights", without_field(f"{GROUP}.weights"), f"{GROUP}.weights"),
    ("bits-a-string", with_field(f"{GROUP}.weights.num_bits", "4"), f"{GROUP}.weights.num_bits"),
    ("bits-a-float", with_field(f"{GROUP}.weights.num_bits", 4.0), f"{GROUP}.weights.num_bits"),
    ("bits-unknown", with_field(f"{GROUP}.weights.num_bits", 3), "3 bits"),
    ("no-bits", without_field(f"{GROUP}.weights.num_bits"), "None bits"),
    ("strategy-a-list", with_field(f"{GROUP}.weights.strategy", ["group"]), "strategy ['group']"),
    ("strategy-unknown", with_field(f"{GROUP}.weights.strategy", "block"), "strategy 'block'"),
    ("type-unknown", with_field(f"{GROUP}.weights.type", "nf4"), "type 'nf4'"),
    ("group-size-a-string", with_field(f"{GROUP}.weights.group_size", "32"), f"{GROUP}.weights.group_size"),
    ("group-size-zero", with_field(f"{GROUP}.weights.group_size", 0), f"{GROUP}.weights.group_size"),
    ("group-size-missing", without_field(f"{GROUP}.weights.group_size"), f"{GROUP}.weights.group_size"),
    ("symmetric-a-string", with_field(f"{GROUP}.weights.symmetric", "false"), f"{GROUP}.weights.symmetric"),
    ("ignore-a-string", with_field("ignore", "lm_head"), "quantization_config.ignore"),
    ("ignore-of-numbers", with_field("ignore", [1, 2]), "quantization_config.ignore"),
    ("format-a-list", with_field("format", ["pack-quantized"]), "format ['pack-quantized']"),
    ("two-groups", with_field("config_groups.group_1", {"weights": WEIGHTS}), "2 config group"),
    ("activations", with_field(f"{GROUP}.input_activations", {"num_bits": 8}), "activation quantization"),
    ("fp8-of-ints", with_field("format", "float-quantized"), "float-quantized weights of type 'int'"),
]


def test_the_valid_config_reads():
    assert read_scheme(copy.deepcopy(VALID)) == IntScheme("pack-quantized", 4, 32, True, ("lm_head",))


@pytest.mark.parametrize("config, field", [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_a_malformed_config_is_refused_naming_the_field(config, field):
    with pytest.raises(CheckpointError, match=re.escape(field)):
        read_scheme(config)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.floats() | st.text(max_size=12),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=12), children, max_size=3),
    max_leaves=8,
)
PATHS = [
    "quant_method", "format", "config_groups", GROUP, f"{GROUP}.weights", f"{GROUP}.input_activations", "ignore",
    *(f"{GROUP}.weights.{key}" for key in ("num_bits", "type", "symmetric", "strategy", "group_size")),
]  # fmt: skip
KNOWN = st.sampled_from(
    ["compressed-tensors", "pack-quantized", "int-quantized", "float-quantized", "int", "float", "group", "channel",
     "tensor", 4, 8, 32, 128, True, False, None, ["lm_head"], {}]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(edits=st.lists(st.tuples(st.sampled_from(PATHS), KNOWN | JSON), min_size=1, max_size=4), top=JSON)
def test_any_config_reads_into_a_sane_scheme_or_raises_only_the_loaders_error(edits, top):
    """Valid configs with some fields replaced by known or random JSON values, and random JSON values whole."""
    edited = VALID
    for path, value in edits:
        try:
            edited = with_field(path, value, edited)
        except (KeyError, TypeError):  # an earlier edit replaced a parent: nothing to set
            pass
    for config in (edited, top):
        try:
            scheme = read_scheme(config)
        except CheckpointError:
            continue
        assert scheme.format in ("pack-quantized", "int-quantized", "naive-quantized", "float-quantized")
        assert type(scheme.num_bits) is int and scheme.num_bits in (4, 8)
        assert scheme.group_size is None or (type(scheme.group_size) is int and scheme.group_size > 0)
        assert type(scheme.symmetric) is bool and all(type(name) is str for name in scheme.ignore)
