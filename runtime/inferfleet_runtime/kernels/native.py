"""The "native" backend: the five ops as C kernels for float32 on a CPU (native.c), built at first use.

On a CPU the reference runs each op as a chain of torch ops, and a batch-1 decode step of a small model is
mostly their per-call overhead (~600 calls; `python -m inferfleet_runtime.bench.step_profile`); its attention
also copies every sequence's blocks out of the cache before attending. These kernels are one call per op and
attend over the cache in place; `forward` runs a whole step's decoder stack (every layer's ops and matmuls) in one
call, which is how a packed native model (layers.linear.pack_linears) serves.

Build: `cc -O3 -march=native -fopenmp -shared` (the compiler from $CC, else `cc`) into
$INFERFLEET_KERNEL_CACHE, else $XDG_CACHE_HOME/inferfleet/kernels, else ~/.cache/inferfleet/kernels; the file
name carries a hash of the source (native.c and its ABI header native.h), the flags, the compiler's version and
this CPU's feature flags, so a cache shared between different machines never loads a build for another CPU. No
compiler, or a failed build: `library()` is None, `unavailable_reason()` says why, and the "auto" backend is the
reference (kernels.resolve_backend). The tests also build it with -Wall -Wextra -Werror and under AddressSanitizer
and UndefinedBehaviorSanitizer (tests/runtime/kernels/test_native_abi.py); the build here has no -Werror, so a
compiler with new warnings still gets the kernels.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import subprocess
import tempfile
from pathlib import Path

import torch

logger = logging.getLogger("inferfleet_runtime")

SOURCE = Path(__file__).with_name("native.c")
HEADER = SOURCE.with_name("native.h")  # the ABI: the structs and prototypes this module mirrors with ctypes
FLAGS = ("-O3", "-march=native", "-fno-trapping-math", "-fopenmp", "-shared", "-fPIC")

_i64, _f32, _ptr, _int = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p, ctypes.c_int
SIGNATURES = {
    "inferfleet_rms_norm": (None, [_ptr, _i64, _ptr, _ptr, _ptr, _ptr, _i64, _i64, _f32]),
    "inferfleet_rotary": (None, [_ptr, _i64, _ptr, _i64, _ptr, _ptr, _ptr, _ptr, _i64, _i64, _i64, _i64]),
    "inferfleet_silu_and_mul": (None, [_ptr, _ptr, _i64, _i64]),
    "inferfleet_write_kv": (None, [_ptr, _i64, _ptr, _i64, _ptr, _ptr, _ptr, _i64, _i64]),
    "inferfleet_linear_panel_width": (_int, []),
    "inferfleet_pack_linear": (None, [_ptr, _i64, _ptr, _i64, _i64]),
    "inferfleet_linear": (None, [_ptr, _i64, _ptr, _ptr, _ptr, _i64, _i64, _i64, _int]),
    "inferfleet_qlinear": (None, [_ptr, _i64, _ptr, _ptr, _ptr, _i64, _i64, _i64, _int]),
    "inferfleet_qdot_isa": (_int, []),
    "inferfleet_quantize_activations": (None, [_ptr, _i64, _ptr, _ptr, _i64, _i64, _i64]),
    "inferfleet_forward_workspace": (_i64, [_ptr, _i64, _int]),
    "inferfleet_forward": (
        _int,
        [_ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _i64, _ptr, _ptr, _i64, _i64, _ptr, _ptr, _int],
    ),
    "inferfleet_paged_attention": (
        _int,
        [_ptr, _ptr, _ptr, _ptr, _ptr, _i64, _ptr, _ptr, _i64, _i64, _i64, _i64, _i64, _i64, _f32, _i64, _int],
    ),
}


def cache_dir() -> Path:
    if explicit := os.environ.get("INFERFLEET_KERNEL_CACHE"):
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "inferfleet" / "kernels"


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""


def _build(compiler: str) -> Path:
    """Compiles native.c unless this machine's build is cached; returns the shared library's path."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
    key = hashlib.sha256(
        "\0".join(
            [SOURCE.read_text(), HEADER.read_text(), " ".join(FLAGS), version, platform.machine(), _cpu_flags()]
        ).encode()
    ).hexdigest()[:16]
    target = cache_dir() / f"native-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Built beside the target and renamed into place: processes starting together never load a half-written file.
    fd, partial = tempfile.mkstemp(dir=target.parent, prefix=".native-", suffix=".so")
    os.close(fd)
    try:
        result = subprocess.run([compiler, *FLAGS, "-o", partial, str(SOURCE)], capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {result.stderr.strip()[-500:]}")
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


_unavailable: list[str] = []  # why library() is None, once it has been tried


@functools.cache
def library() -> ctypes.CDLL | None:
    """The built kernels, or None (logged once, with the reason) when they cannot be built or loaded here."""
    compiler = os.environ.get("CC") or "cc"
    try:
        # INFERFLEET_NATIVE_LIBRARY: a build of native.c made elsewhere (the sanitizer test's), loaded as it is.
        path = os.environ.get("INFERFLEET_NATIVE_LIBRARY") or _build(compiler)
        lib = ctypes.CDLL(str(path))
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        _unavailable.append(f"native kernels unavailable ({e}); using the torch reference ops")
        logger.warning(_unavailable[0])
        return None
    for name, (restype, argtypes) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def unavailable_reason() -> str | None:
    return None if library() is not None else _unavailable[0]


def _check(name: str, t: torch.Tensor, dims: int) -> None:
    if t.dtype != torch.float32 or t.device.type != "cpu" or t.dim() != dims or t.stride(-1) != 1:
        raise ValueError(
            f"native kernels take float32 CPU tensors with a contiguous last dim; {name} is {t.dtype} on "
            f"{t.device} with shape {tuple(t.shape)} and strides {t.stride()}"
        )


def rms_norm(x, weight, eps, residual=None):
    """rms_norm.rms_norm_reference's contract: (out, residual_out); x [T, H] with contiguous rows."""
    _check("x", x, 2)
    num_tokens, hidden = x.shape
    out = torch.empty(num_tokens, hidden)
    if residual is None:
        library().inferfleet_rms_norm(x.data_ptr(), x.stride(0), None, weight.data_ptr(), out.data_ptr(), None,
                                      num_tokens, hidden, eps)  # fmt: skip
        return out, x
    residual = residual.contiguous()
    residual_out = torch.empty(num_tokens, hidden)
    library().inferfleet_rms_norm(x.data_ptr(), x.stride(0), residual.data_ptr(), weight.data_ptr(), out.data_ptr(),
                                  residual_out.data_ptr(), num_tokens, hidden, eps)  # fmt: skip
    return out, residual_out


def _token_stride(name: str, t: torch.Tensor) -> int:
    """Row stride of [T, H, D] whose heads are packed within a row (a column slice of the fused qkv output)."""
    _check(name, t, 3)
    if t.stride(1) != t.shape[2]:
        raise ValueError(f"native kernels need {name}'s heads packed in each row; strides {t.stride()}")
    return t.stride(0)


def rotary(query, key, positions, cos_sin_cache):
    """rotary.rotary_reference's contract: rotated (query, key) as new contiguous tensors."""
    q_stride, k_stride = _token_stride("query", query), _token_stride("key", key)
    num_tokens, num_q_heads, head_dim = query.shape
    q_out, k_out = torch.empty(query.shape), torch.empty(key.shape)
    positions = positions.to(torch.int64).contiguous()
    cos_sin_cache = cos_sin_cache.contiguous()
    library().inferfleet_rotary(query.data_ptr(), q_stride, key.data_ptr(), k_stride, q_out.data_ptr(),
                                k_out.data_ptr(), positions.data_ptr(), cos_sin_cache.data_ptr(), num_tokens,
                                num_q_heads, key.shape[1], head_dim)  # fmt: skip
    return q_out, k_out


def silu_and_mul(x):
    """activation.silu_and_mul_reference's contract: x [T, 2I] -> [T, I]."""
    x = x.contiguous()
    _check("x", x, 2)
    num_tokens, inter = x.shape[0], x.shape[1] // 2
    out = torch.empty(num_tokens, inter)
    library().inferfleet_silu_and_mul(x.data_ptr(), out.data_ptr(), num_tokens, inter)
    return out


def write_kv(key, value, key_cache, value_cache, slot_mapping):
    """kv_cache.write_kv_reference's contract: in-place scatter of key/value rows into the caches."""
    k_stride, v_stride = _token_stride("key", key), _token_stride("value", value)
    for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        _check(name, cache, 4)
        if not cache.is_contiguous():
            raise ValueError(f"native kernels need a contiguous {name}")
    slots = slot_mapping.to(torch.int64).contiguous()
    library().inferfleet_write_kv(key.data_ptr(), k_stride, value.data_ptr(), v_stride, key_cache.data_ptr(),
                                  value_cache.data_ptr(), slots.data_ptr(), key.shape[0],
                                  key.shape[1] * key.shape[2])  # fmt: skip


def paged_attention(
    query,
    key_cache,
    value_cache,
    block_tables,
    seq_lens,
    scale,
    query_start_loc=None,
    max_query_len=1,
    max_seq_len=None,
    window=None,
):
    """paged_attention.paged_attention_reference's contract, window included (max_query_len and max_seq_len are
    not needed here: the kernel reads each sequence's own lengths)."""
    query = query.contiguous()
    _check("query", query, 3)
    num_tokens, num_q_heads, head_dim = query.shape
    out = torch.empty(query.shape)
    if num_tokens == 0:
        return out
    num_blocks, block_size, num_kv_heads, _ = key_cache.shape
    block_tables = block_tables.to(torch.int32).contiguous()
    seq_lens = seq_lens.to(torch.int32).contiguous()
    loc = None if query_start_loc is None else query_start_loc.to(torch.int32).contiguous()
    code = library().inferfleet_paged_attention(
        query.data_ptr(), out.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(), block_tables.data_ptr(),
        block_tables.stride(0), seq_lens.data_ptr(), None if loc is None else loc.data_ptr(), seq_lens.shape[0],
        num_tokens, num_q_heads, num_kv_heads, head_dim, block_size, scale, _window_arg(window),
        torch.get_num_threads(),
    )  # fmt: skip
    if code != 0:
        raise MemoryError("native paged attention could not allocate its token table")
    return out


def _window_arg(window: int | None) -> int:
    """A sliding window as native.c takes it: the window, or 0 for full attention."""
    if window is not None and window < 1:
        raise ValueError(f"a sliding window holds at least one key, got {window}")
    return window or 0


@functools.cache
def panel_width() -> int:
    """Output columns per panel of a packed weight (32 with AVX-512, else 16)."""
    return library().inferfleet_linear_panel_width()


def pack_linear(weight: torch.Tensor) -> torch.Tensor:
    """A linear layer's weight [N, K] in the panel layout `linear` reads (native.c): a flat float32 tensor of
    ceil(N / panel_width()) * panel_width() * K values."""
    _check("weight", weight, 2)
    n, k = weight.shape
    packed = torch.empty(-(-n // panel_width()) * panel_width() * k)
    library().inferfleet_pack_linear(weight.data_ptr(), weight.stride(0), packed.data_ptr(), n, k)
    return packed


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """x [T, K] (contiguous rows) times the weight `pack_linear` packed, + bias [N] -> [T, out_features]."""
    _check("x", x, 2)
    num_tokens, in_features = x.shape
    if packed.numel() != -(-out_features // panel_width()) * panel_width() * in_features:
        raise ValueError(f"packed weight of {packed.numel()} values is not [{out_features}, {in_features}]")
    out = torch.empty(num_tokens, out_features)
    if num_tokens:
        library().inferfleet_linear(x.data_ptr(), x.stride(0), packed.data_ptr(), None if bias is None else bias.data_ptr(),
                                    out.data_ptr(), num_tokens, out_features, in_features, torch.get_num_threads())  # fmt: skip
    return out


class _QWeight(ctypes.Structure):
    _fields_ = [
        ("bits", _i64), ("group_size", _i64), ("data", _ptr), ("scales", _ptr), ("offsets", _ptr), ("act_block", _i64),
    ]  # fmt: skip


# The integer dot product native.c's int8-activation matmul uses on this build (inferfleet_qdot_isa).
QDOT_ISAS = {0: "plain C", 1: "AVX2", 2: "AVX-512BW", 3: "AVX-512 VNNI"}
ACTIVATIONS_ENV = "INFERFLEET_QUANTIZED_ACTIVATIONS"  # "int8" or "float": overrides default_activations


@functools.cache
def qdot_isa() -> str:
    """Which integer dot product the int8-activation matmul runs on here (QDOT_ISAS)."""
    return QDOT_ISAS[library().inferfleet_qdot_isa()]


def activation_block(group_size: int) -> int | None:
    """Columns per int8 activation scale for a weight of this group size: 32, 16 or 8, the largest that divides the
    group; None (float activations only) when none does."""
    return next((b for b in (32, 16, 8) if group_size % b == 0), None)


def default_activations(bits: int, group_size: int, runtime_quantized: bool = True) -> str:
    """How a quantized weight's matmul takes its activations, "int8" or "float", unless
    $INFERFLEET_QUANTIZED_ACTIVATIONS says ("int8" is used only where the group size allows it). int8 activations
    only for weights this runtime quantized itself (runtime_quantized: `--quantization`, an int8 vocabulary); a
    checkpoint's own integers (GGUF blocks, compressed-tensors) keep float activations and so give transformers'
    answers on the same file (int8 activations give llama.cpp's: on the real SmolLM2 Q4_1 file both answer the
    capital question "L'Étoile, ..." off a near tie, where transformers says Paris). Among runtime-quantized: for
    4-bit ones on every SIMD build, for 8-bit ones only with VNNI (pmaddubsw's int16 sums would overflow: native.c
    runs them in plain C, far slower); none on builds without SIMD dot products (plain C: the float kernels'
    vector code is faster)."""
    if activation_block(group_size) is None:
        return "float"
    chosen = os.environ.get(ACTIVATIONS_ENV, "").strip().lower()
    if chosen in ("int8", "float"):
        return chosen
    if chosen:
        raise ValueError(f"${ACTIVATIONS_ENV} must be int8 or float, not {chosen!r}")
    if not runtime_quantized:
        return "float"
    isa = qdot_isa()
    return "int8" if isa == "AVX-512 VNNI" or (bits == 4 and isa != "plain C") else "float"


def quantize_activations(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] as the int8-activation matmul quantizes it: (xq int8 [M, K], scales [M, K / block]), per block
    xq = rint(x * 127 / amax) and scale amax / 127."""
    _check("x", x, 2)
    m, k = x.shape
    if block < 1 or k % block:
        raise ValueError(f"activation block {block} does not split {k} columns")
    xq, scales = torch.empty(m, k, dtype=torch.int8), torch.empty(m, k // block)
    library().inferfleet_quantize_activations(x.data_ptr(), x.stride(0), xq.data_ptr(), scales.data_ptr(), m, k, block)
    return xq, scales


class QuantizedWeight:
    """A weight-only quantized linear weight [N, K] in the layout native.c's quantized matmul reads (see there):
    `data` uint8 panels of bytes (int8) or nibble pairs (int4), `scales` and `offsets` float32 [panels, G, NR], so
    that W[n, k] = u[n, k] * s[n, g] + o[n, g] (offsets None: all 0). Holds the tensors its C descriptor (`struct`)
    points at."""

    def __init__(self, data, scales, offsets, bits: int, group_size: int, out_features: int, in_features: int,
                 act_block: int = 0):  # fmt: skip
        self.data, self.scales, self.offsets = data, scales, offsets
        self.bits, self.group_size, self.act_block = bits, group_size, act_block
        self.out_features, self.in_features = out_features, in_features
        self.struct = _QWeight(bits, group_size, data.data_ptr(), scales.data_ptr(),
                               None if offsets is None else offsets.data_ptr(), act_block)  # fmt: skip

    @property
    def activations(self) -> str:
        return "int8" if self.act_block else "float"

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.data, self.scales, self.offsets) if t is not None)


def pack_quantized(q: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor | None, bits: int,
                   group_size: int, activations: str = "float") -> QuantizedWeight:  # fmt: skip
    """Packs W = q * scales + offsets (q int8 [N, K] in [-128, 127] for 8 bits, [-8, 7] for 4; scales, offsets
    [N, K / group_size], offsets None for 0) into native.c's quantized panels: for float activations (the weights
    widened to float) or for int8 activations (quantized per `activation_block` columns, integer dot products; see
    native.c). ValueError, before anything is built, for a group size that does not split K (or is odd, for 4
    bits; or has no activation block, for int8 activations) or mismatched shapes."""
    if activations not in ("float", "int8"):
        raise ValueError(f"activations are float or int8, not {activations!r}")
    act_block = activation_block(group_size) if activations == "int8" else 0
    if act_block is None:
        raise ValueError(f"int8 activations need a group size that is a multiple of 8; got {group_size}")
    if bits not in (4, 8):
        raise ValueError(f"native quantized matmuls take 8 or 4 bit weights, not {bits}")
    if q.dim() != 2 or q.dtype != torch.int8:
        raise ValueError(f"quantized weight must be int8 [out, in], got {q.dtype} {tuple(q.shape)}")
    n, k = q.shape
    if group_size < 1 or k % group_size or (bits == 4 and group_size % 2):
        raise ValueError(
            f"native {bits}-bit matmul needs a group size that divides the {k} input columns"
            f"{' and is even' if bits == 4 else ''}; got {group_size}"
        )
    groups = k // group_size
    if scales.shape != (n, groups) or (offsets is not None and offsets.shape != (n, groups)):
        raise ValueError(f"scales/offsets must be [{n}, {groups}], got {tuple(scales.shape)}")
    nr = panel_width()
    panels = -(-n // nr)
    scales = scales.float()
    offsets = None if offsets is None else offsets.float()
    if bits == 4:  # stored as the nibble q + 8 (the kernel subtracts the 8)
        u = (q.to(torch.int16) + 8).to(torch.uint8)
    else:
        u = q.view(torch.uint8)
    pad = panels * nr - n
    if act_block:  # unsigned, q + 128 (8 bits) or the nibble q + 8 (4 bits): native.c's integer dot products
        u = (q.to(torch.int16) + 128).to(torch.uint8) if bits == 8 else u
    u = torch.nn.functional.pad(u, (0, 0, 0, pad))  # padded rows: any weight, with scale and offset 0
    if act_block and bits == 8:  # [P, K/4, NR, 4]: a 32-bit lane is one column's 4 consecutive k
        u = u.view(panels, nr, k // 4, 4).permute(0, 2, 1, 3)
    elif act_block:  # [P, K/8, NR, 4]: k 8i..8i+3 in the low nibbles, 8i+4..8i+7 in the high ones
        u = u.view(panels, nr, k // 8, 2, 4)
        u = (u[:, :, :, 0] | (u[:, :, :, 1] << 4)).permute(0, 2, 1, 3)
    else:
        u = u.view(panels, nr, k).transpose(1, 2)  # [P, K, NR]
        if bits == 4:
            u = u[:, 0::2] | (u[:, 1::2] << 4)  # [P, K/2, NR]: row 2i low nibble, 2i+1 high
    data = u.contiguous().view(-1)

    def per_group(t):  # [N, G] -> [P, G, NR]
        return torch.nn.functional.pad(t, (0, 0, 0, pad)).view(panels, nr, groups).transpose(1, 2).contiguous()

    return QuantizedWeight(data, per_group(scales), None if offsets is None else per_group(offsets), bits, group_size,
                           n, k, act_block)  # fmt: skip


def quantized_linear(x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None) -> torch.Tensor:
    """x [T, K] (contiguous rows) times a `pack_quantized` weight, + bias [N] -> [T, N] (float32 accumulation)."""
    _check("x", x, 2)
    num_tokens, in_features = x.shape
    if in_features != weight.in_features:
        raise ValueError(f"x has {in_features} columns, the quantized weight takes {weight.in_features}")
    out = torch.empty(num_tokens, weight.out_features)
    if num_tokens:
        library().inferfleet_qlinear(x.data_ptr(), x.stride(0), ctypes.byref(weight.struct),
                                     None if bias is None else bias.data_ptr(), out.data_ptr(), num_tokens,
                                     weight.out_features, in_features, torch.get_num_threads())  # fmt: skip
    return out


LAYER_WEIGHTS = (
    "input_norm",
    "qkv",
    "qkv_bias",
    "o",
    "o_bias",
    "post_norm",
    "gate_up",
    "gate_up_bias",
    "down",
    "down_bias",
    "q_norm",
    "k_norm",
)


LAYER_LINEARS = ("qkv", "o", "gate_up", "down")  # the slots that take a float panel tensor or a QuantizedWeight


class _Layer(ctypes.Structure):
    _fields_ = [
        *[(name, _ptr) for name in LAYER_WEIGHTS],
        ("window", _i64),
        *[(f"{name}_q", ctypes.POINTER(_QWeight)) for name in LAYER_LINEARS],
    ]


class _Model(ctypes.Structure):
    _fields_ = [
        *[(name, _i64) for name in ("num_layers", "hidden", "num_q_heads", "num_kv_heads", "head_dim",
                                    "intermediate", "block_size", "vocab_size", "max_positions")],
        ("eps", _f32), ("scale", _f32), ("embed", _ptr), ("final_norm", _ptr), ("cos_sin", _ptr),
        ("embed_q", _ptr), ("embed_scales", _ptr), ("layers", ctypes.POINTER(_Layer)),
    ]  # fmt: skip


class DecoderWeights:
    """A Llama decoder stack as `forward` reads it: the layers' tensors by the names of LAYER_WEIGHTS (linears
    packed by `pack_linear`, or a QuantizedWeight from `pack_quantized`, each slot its own kind; biases and the q/k
    norms None when absent), the embedding [V, H] (float32, or int8 rows with embed_scales [V] float32), the final
    norm's weight and the RoPE table [positions, D], and
    each layer's sliding window (None: full attention; no windows: all full). Holds every tensor it points C at, so
    none is freed while it lives."""

    def __init__(self, *, layers: list[dict], embed, final_norm, cos_sin, num_q_heads, num_kv_heads, head_dim,
                 intermediate, eps, scale, windows: list[int | None] | None = None, embed_scales=None):  # fmt: skip
        quantized = [{n: w for n, w in layer.items() if isinstance(w, QuantizedWeight)} for layer in layers]
        layers = [{n: None if n in q else w for n, w in layer.items()} for layer, q in zip(layers, quantized)]
        for q in quantized:
            for name in q:
                if name not in LAYER_LINEARS:
                    raise ValueError(f"native forward takes quantized weights only for {LAYER_LINEARS}, not {name}")
        self.quantized = quantized
        quantized_embed = embed_scales is not None
        if quantized_embed and (embed.dtype != torch.int8 or embed_scales.numel() != embed.shape[0]):
            raise ValueError("a quantized embedding is int8 rows [V, H] with one scale per row")
        # The float tensors C reads (a quantized embedding's float part is its scales).
        floats = [embed_scales if quantized_embed else embed, final_norm, cos_sin]
        floats += [t for layer in layers for t in layer.values() if t is not None]
        for i, t in enumerate(floats):
            _check(f"weight {i}", t.view(-1), 1)
        tensors = floats + [embed] if quantized_embed else floats
        if not all(t.is_contiguous() for t in tensors):
            raise ValueError("native forward needs contiguous weights")
        self.tensors = tensors
        self.hidden, self.kv_row = embed.shape[1], (num_kv_heads, head_dim)
        self.layer_array = (_Layer * len(layers))(
            *[
                _Layer(
                    *[None if layer[name] is None else layer[name].data_ptr() for name in LAYER_WEIGHTS],
                    _window_arg(windows[i] if windows else None),
                    *[
                        ctypes.pointer(quantized[i][name].struct) if name in quantized[i] else None
                        for name in LAYER_LINEARS
                    ],
                )
                for i, layer in enumerate(layers)
            ]
        )
        self.struct = _Model(len(layers), self.hidden, num_q_heads, num_kv_heads, head_dim, intermediate, 0,
                             embed.shape[0], cos_sin.shape[0], eps, scale,
                             None if quantized_embed else embed.data_ptr(), final_norm.data_ptr(), cos_sin.data_ptr(),
                             embed.data_ptr() if quantized_embed else None,
                             embed_scales.data_ptr() if quantized_embed else None, self.layer_array)  # fmt: skip
        self._kv: tuple[list, ctypes.Array] | None = None

    def kv_pointers(self, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> ctypes.Array:
        """The caches as the C array forward takes (built once per list of caches, which it keeps alive)."""
        if self._kv is None or self._kv[0] is not kv_caches:
            if len(kv_caches) != len(self.layer_array):
                raise ValueError(f"{len(kv_caches)} KV caches for a model of {len(self.layer_array)} layers")
            shape = kv_caches[0][0].shape
            for key_cache, value_cache in kv_caches:
                for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
                    _check(name, cache, 4)
                    if not cache.is_contiguous() or cache.shape != shape or shape[2:] != self.kv_row:
                        raise ValueError(
                            f"native forward needs contiguous caches of one shape [blocks, block_size, "
                            f"{self.kv_row[0]}, {self.kv_row[1]}]; {name} is {tuple(cache.shape)}"
                        )
            self.struct.block_size = shape[1]
            pointers = [t.data_ptr() for pair in kv_caches for t in pair]
            self._kv = (kv_caches, (_ptr * len(pointers))(*pointers))
        return self._kv[1]


def forward(weights: DecoderWeights, kv_caches, input_ids, positions, slot_mapping, block_tables, seq_lens,
            query_start_loc) -> torch.Tensor:  # fmt: skip
    """The decoder stack of one paged step in one C call (native.c inferfleet_forward): input_ids and positions
    [T] int64, the step's attention metadata (attention.AttentionMetadata's tensors) -> hidden states [T, H] with
    the final norm applied; writes the step's keys and values into kv_caches as write_kv does."""
    num_tokens, threads = input_ids.shape[0], torch.get_num_threads()
    kv = weights.kv_pointers(kv_caches)
    out = torch.empty(num_tokens, weights.hidden)
    if num_tokens == 0:
        return out
    lib = library()
    struct = ctypes.byref(weights.struct)
    workspace = torch.empty(lib.inferfleet_forward_workspace(struct, num_tokens, threads))
    ids, positions, slots = (t.to(torch.int64).contiguous() for t in (input_ids, positions, slot_mapping))
    block_tables, seq_lens, loc = (t.to(torch.int32).contiguous() for t in (block_tables, seq_lens, query_start_loc))
    code = lib.inferfleet_forward(
        struct, kv, ids.data_ptr(), positions.data_ptr(), slots.data_ptr(), block_tables.data_ptr(),
        block_tables.stride(0), seq_lens.data_ptr(), loc.data_ptr(), seq_lens.shape[0], num_tokens, out.data_ptr(),
        workspace.data_ptr(), threads,
    )  # fmt: skip
    if code == -2:
        raise IndexError(
            f"token ids must be in [0, {weights.struct.vocab_size}) and positions in [0, {weights.struct.max_positions})"
        )
    if code != 0:
        raise MemoryError("native forward could not allocate its token table")
    return out
