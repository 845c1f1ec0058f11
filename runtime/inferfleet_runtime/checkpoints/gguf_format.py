"""Reads the container of a GGUF file (header, metadata, tensor table) with every count, length and offset checked
against the file's size before it is used: a hostile file is refused naming the field, after work and memory
proportional to its size, instead of sending the reader past its end (or round a loop that never advances).

Layout (llama.cpp's gguf.md; little-endian, byte-swapped files are refused): magic "GGUF", uint32 version (2 or 3),
uint64 tensor count, uint64 metadata count; the metadata, each a string key, a uint32 value type and the value; the
tensor table, each a string name, uint32 n_dims, n_dims uint64 dims (fastest-varying first), uint32 ggml type and
uint64 offset; padding to `general.alignment` (32 unless set); then the tensor data, each tensor at the data start
plus its offset (a multiple of the alignment). A string is a uint64 byte length and UTF-8 bytes; an array a uint32
element type, a uint64 count and the elements (arrays of arrays are legal there, but llama.cpp reads none: refused).
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from inferfleet_runtime.checkpoints.errors import CheckpointError


class GGUFError(CheckpointError):
    """A GGUF file is unreadable, or describes a model or tokenizer this runtime cannot load."""


VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
STRING, ARRAY = 8, 9  # value types; the others are the scalars, as struct codes:
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
# The fewest bytes a metadata entry (key, type, 1-byte value) and a tensor entry (name, n_dims, one dim, type,
# offset) take: a count is bounded by the bytes left before any entry is read.
MIN_FIELD_BYTES, MIN_TENSOR_BYTES = 8 + 4 + 1, 8 + 4 + 8 + 4 + 8
# Tensor types whose data comes as elements [*reversed(shape)]; the others as bytes [..., bytes per row].
ELEMENT_TYPES = {
    "F32": np.float32, "F16": np.float16, "F64": np.float64,
    "I8": np.int8, "I16": np.int16, "I32": np.int32, "I64": np.int64,
}  # fmt: skip


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    tensor_type: object  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # GGUF's order: the fastest-varying dim first, each >= 1
    data: np.ndarray  # read-only, memory-mapped: elements (ELEMENT_TYPES) or bytes [..., bytes per row]


def read_gguf(path: Path) -> tuple[dict[str, object], list[GGUFTensor]]:
    """(metadata: key -> str, int, float, bool or a list of one of those; the tensors in file order) of a GGUF file;
    GGUFError naming the field for anything its layout does not allow or that lies past the end of the file."""
    try:
        import gguf  # its tensor types and their block sizes
    except ImportError:
        raise GGUFError("reading a GGUF file needs the gguf package (pip install gguf)") from None
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise GGUFError(f"{path} is not a GGUF file (it does not start with the GGUF magic)")
        cursor = _Cursor(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), path.name)
    cursor.pos = 4
    version = cursor.scalar("I", "version")
    if version not in VERSIONS:
        swapped = " (a byte-swapped, big-endian file?)" if version & 0xFFFF == 0 else ""
        raise cursor.error(f"version {version}{swapped} is not read (read: {', '.join(map(str, VERSIONS))})")
    num_tensors = cursor.count("tensor count", MIN_TENSOR_BYTES)
    num_fields = cursor.count("metadata count", MIN_FIELD_BYTES)
    metadata: dict[str, object] = {}
    for i in range(num_fields):
        key = cursor.string(f"metadata entry {i}'s key")
        if key in metadata:
            raise cursor.error(f"metadata {key!r} appears twice")
        metadata[key] = cursor.value(cursor.scalar("I", f"metadata {key!r}'s type"), f"metadata {key!r}")
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if type(alignment) is not int or alignment <= 0 or alignment & (alignment - 1):
        raise cursor.error(f"metadata 'general.alignment' is {alignment!r}, not a power of two")
    entries = [cursor.tensor_entry(i) for i in range(num_tensors)]
    names = [name for name, *_ in entries]
    if len(set(names)) != len(names):
        raise cursor.error(f"tensor {next(n for n in names if names.count(n) > 1)!r} appears twice")
    data_start = -(-cursor.pos // alignment) * alignment
    return metadata, [cursor.tensor(gguf, *entry, data_start, alignment) for entry in entries]


class _Cursor:
    """Reads the header front to back: nothing is read, nor a count looped over, before its size is checked
    against the bytes left in the file."""

    def __init__(self, data: mmap.mmap, file_name: str):
        self.data, self.file_name, self.pos = data, file_name, 0

    def error(self, message: str) -> GGUFError:
        return GGUFError(f"{self.file_name} is not a readable GGUF file: {message}")

    def take(self, num_bytes: int, what: str) -> int:
        """The offset of the next num_bytes, which the cursor moves past."""
        if num_bytes > len(self.data) - self.pos:
            raise self.error(
                f"{what} ({num_bytes} bytes at offset {self.pos}) runs past the end of the file ({len(self.data)} bytes)"
            )
        self.pos += num_bytes
        return self.pos - num_bytes

    def scalar(self, code: str, what: str):
        return struct.unpack_from("<" + code, self.data, self.take(struct.calcsize(code), what))[0]

    def count(self, what: str, min_item_bytes: int) -> int:
        num = self.scalar("Q", what)
        num_left = len(self.data) - self.pos
        if num * min_item_bytes > num_left:
            raise self.error(f"{what} {num} cannot fit in the {num_left} bytes left of the file")
        return num

    def string(self, what: str) -> str:
        num_bytes = self.scalar("Q", f"{what}'s length")
        start = self.take(num_bytes, what)
        return self.data[start : start + num_bytes].decode("utf-8", errors="replace")

    def value(self, value_type: int, what: str):
        if value_type == STRING:
            return self.string(what)
        if value_type in SCALARS:
            return self.scalar(SCALARS[value_type], what)
        if value_type != ARRAY:
            raise self.error(f"{what}'s value type {value_type} is no GGUF value type")
        item_type = self.scalar("I", f"{what}'s element type")
        if item_type == STRING:
            return [self.string(what) for _ in range(self.count(f"{what}'s length", 8))]
        if item_type in SCALARS:
            dtype = np.dtype("<" + SCALARS[item_type])
            num = self.count(f"{what}'s length", dtype.itemsize)
            return np.frombuffer(self.data, dtype, num, self.take(num * dtype.itemsize, what)).tolist()
        kind = "an array of arrays (not read)" if item_type == ARRAY else f"of element type {item_type}, no GGUF type"
        raise self.error(f"{what} is {kind}")

    def tensor_entry(self, index: int) -> tuple[str, tuple[int, ...], int, int]:
        """(name, shape, raw type, data offset) of the next tensor table entry."""
        name = self.string(f"tensor entry {index}'s name")
        what = f"tensor {name!r}"
        num_dims = self.scalar("I", f"{what}'s dim count")
        if not 1 <= num_dims <= MAX_DIMS:
            raise self.error(f"{what} has {num_dims} dims (read: 1 to {MAX_DIMS})")
        shape = tuple(self.scalar("Q", f"{what}'s dims") for _ in range(num_dims))
        if not all(1 <= n < 2**63 for n in shape):  # ggml's dims are int64
            raise self.error(f"{what} has dims {list(shape)}: each must be 1 to 2^63 - 1")
        return name, shape, self.scalar("I", f"{what}'s type"), self.scalar("Q", f"{what}'s data offset")

    def tensor(self, gguf, name: str, shape: tuple[int, ...], raw_type: int, offset: int, data_start: int,
               alignment: int) -> GGUFTensor:  # fmt: skip
        what = f"tensor {name!r}"
        try:
            tensor_type = gguf.GGMLQuantizationType(raw_type)
            block_size, type_size = gguf.GGML_QUANT_SIZES[tensor_type]
        except (ValueError, KeyError):
            raise self.error(f"{what}'s type {raw_type} is no GGML tensor type") from None
        if shape[0] % block_size:
            raise self.error(f"{what}'s rows of {shape[0]} are no whole number of {tensor_type.name} blocks")
        if offset % alignment:
            raise self.error(f"{what}'s data offset {offset} is not a multiple of the alignment {alignment}")
        num_bytes, start = math.prod(shape) // block_size * type_size, data_start + offset
        if start + num_bytes > len(self.data):
            raise self.error(
                f"{what}'s data ({num_bytes} bytes at offset {start}) runs past the end of the file "
                f"({len(self.data)} bytes)"
            )
        raw = np.frombuffer(self.data, np.uint8, num_bytes, start)
        rows = tuple(reversed(shape))
        if tensor_type.name in ELEMENT_TYPES:
            return GGUFTensor(name, tensor_type, shape, raw.view(ELEMENT_TYPES[tensor_type.name]).reshape(rows))
        return GGUFTensor(name, tensor_type, shape, raw.reshape(*rows[:-1], shape[0] // block_size * type_size))
