"""Weight-only quantized linear layers (int8 per output channel, int4 group-wise packed two per byte, FP8 per
channel) with a torch reference forward, built empty and filled as a checkpoint is read (quantizing a float one, tensor by tensor).

Math: a weight row r, split into groups of `group_size` input columns, is stored as integers q and one scale s (and
optionally an integer zero point z) per group: W[r, c] ~ (q[r, c] - z[r, g(c)]) * s[r, g(c)]. Symmetric
quantization has z = 0 and s = max|W[r, group]| / qmax (qmax 127 for int8, 7 for int4), so every element is off
by at most s / 2 and the output y = x W^T by at most sum_c |x[c]| * s[r, g(c)] / 2 (plus float rounding).

Layouts (out rows, `in` columns, G = in / group_size groups per row):
- qweight: int8 [out, in] for 8 bits; float8_e4m3fn [out, in] for FP8 weights (8 bits, q the float each byte
  encodes, one scale per row: a compressed-tensors FP8 checkpoint served by the Triton kernel); uint8 [out, in / 2]
  for 4 bits, column 2k in the low nibble and 2k+1 in
  the high one, each nibble holding q + 8 (q in [-8, 7]);
- scales: [out, G] in the serving dtype; zeros: None (symmetric) or int8 [out, G] in q's range;
- offsets: None, or [out, G] in the serving dtype added to every weight of the group (GGUF Q4_1's min, which is
  no integer zero point): W[r, c] = (q - z) * s + offset.
Every tensor is per output row, so a fused projection's row range (q/k/v, gate/up) is a narrow along dim 0.

A quantized model's lm_head and token embedding are quantized too, to int8 per vocabulary row, once their weights
are loaded (quantize_vocabulary; a QuantizedEmbedding looks rows up and scales them, and with tied weights it shares
the lm_head's integers and scales, so the vocabulary is held once).

The forward here dequantizes the whole weight per call into the serving dtype and runs one matmul: the reference,
reading the weight about three times per call. On the native CPU backend, layers.pack_linears swaps each layer for
a layers.linear.NativeQuantizedLinear, whose C matmul reads the packed integers directly (kernels/native.c), and
the whole-stack native forward takes them.
"""

from __future__ import annotations

import logging

import torch
from torch import nn
from torch.nn import functional as F

log = logging.getLogger(__name__)

QUANTIZATION_METHODS = ("none", "int8", "int4")
INT4_GROUP_SIZES = (128, 32)  # the first that divides a layer's input width is used


class QuantizedLinear(nn.Module):
    """y = x W^T + b with W held as `bits`-bit integers and per-group scales (see the module docstring)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bits: int,
        group_size: int,
        has_bias: bool = False,
        has_zeros: bool = False,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        has_offsets: bool = False,
        fp8: bool = False,
    ):
        super().__init__()
        if bits not in (4, 8) or (fp8 and (bits != 8 or has_zeros)):
            raise ValueError(f"quantized linears hold 4 or 8 bit integer or 8 bit FP8 weights, not {bits} bits")
        if in_features % group_size or (bits == 4 and group_size % 2):
            raise ValueError(f"group size {group_size} does not split {in_features} input columns")
        self.in_features, self.out_features = in_features, out_features
        self.bits, self.group_size = bits, group_size
        num_groups = in_features // group_size
        packed_cols = in_features if bits == 8 else in_features // 2
        qdtype = torch.float8_e4m3fn if fp8 else torch.int8 if bits == 8 else torch.uint8
        self.register_buffer("qweight", torch.zeros(out_features, packed_cols, dtype=qdtype, device=device))
        self.register_buffer("scales", torch.ones(out_features, num_groups, dtype=dtype, device=device))
        zeros = torch.zeros(out_features, num_groups, dtype=torch.int8, device=device) if has_zeros else None
        self.register_buffer("zeros", zeros)
        offsets = torch.zeros(out_features, num_groups, dtype=dtype, device=device) if has_offsets else None
        self.register_buffer("offsets", offsets)
        self.matmul = None  # KernelOps.quantized_matmul, set by the loader (None: the dequantizing forward below)
        # Whether this runtime rounded the integers itself (--quantization, an int8 vocabulary): then the native
        # backend may also round the activations to int8 by default. A checkpoint's own integers (GGUF blocks,
        # compressed-tensors W4A16 / W8A16) keep float activations: transformers' answers on the same file.
        self.runtime_quantized = False
        self.register_buffer("bias", torch.zeros(out_features, dtype=dtype, device=device) if has_bias else None)

    @classmethod
    def from_float(cls, linear: nn.Linear, bits: int, group_size: int | None = None) -> QuantizedLinear:
        """Symmetric quantization of a float linear: per output channel when group_size is None."""
        weight = linear.weight.detach()
        out_features, in_features = weight.shape
        group_size = group_size or in_features
        layer = cls(
            in_features, out_features, bits, group_size, linear.bias is not None,
            dtype=weight.dtype, device=weight.device,
        )  # fmt: skip
        q, scales = quantize_symmetric(weight, bits, group_size)
        layer.qweight.copy_(pack_int4(q) if bits == 4 else q)
        layer.scales.copy_(scales)
        layer.runtime_quantized = True
        if linear.bias is not None:
            layer.bias.copy_(linear.bias.detach())
        return layer

    @property
    def fp8(self) -> bool:
        return self.qweight.dtype == torch.float8_e4m3fn

    def int_weight(self) -> torch.Tensor:
        """The integers q: int8 [out, in] (int4 values unpacked into [-8, 7]); FP8 weights: their floats [out, in]."""
        return self.qweight if self.bits == 8 else unpack_int4(self.qweight)

    def dequantize(self) -> torch.Tensor:
        """W in the scales' dtype: [out, in]."""
        q = self.int_weight().view(self.out_features, -1, self.group_size).to(self.scales.dtype)  # [out, G, gs]
        if self.zeros is not None:
            q = q - self.zeros.to(q.dtype)[..., None]
        w = q * self.scales[..., None]
        if self.offsets is not None:
            w = w + self.offsets[..., None]
        return w.view(self.out_features, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.matmul is not None and x.dim() == 2:  # a kernel reading the packed integers (Triton)
            return self.matmul(x, self.qweight, self.scales, self.zeros, self.offsets, self.bits, self.group_size,
                               self.bias)  # fmt: skip
        return F.linear(x, self.dequantize(), self.bias)  # [T, in] -> [T, out]

    def extra_repr(self) -> str:
        kind = "fp8" if self.fp8 else f"bits={self.bits}"
        return f"in={self.in_features}, out={self.out_features}, {kind}, group_size={self.group_size}"


def quantize_symmetric(weight: torch.Tensor, bits: int, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 [out, in], scales [out, G] in weight's dtype): round-to-nearest with s = max|group| / qmax."""
    qmax = 127 if bits == 8 else 7
    out_features, in_features = weight.shape
    groups = weight.float().view(out_features, in_features // group_size, group_size)  # [out, G, gs]
    # An all-zero group keeps scale 1 (any scale gives q = 0) rather than dividing by zero.
    scales = groups.abs().amax(dim=-1) / qmax
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    scales = scales.to(weight.dtype).float()  # round as stored, so q is computed against the scale used
    q = torch.round(groups / scales[..., None]).clamp(-qmax - 1, qmax).to(torch.int8)
    return q.view(out_features, in_features), scales.to(weight.dtype)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """int8 [out, in] in [-8, 7] -> uint8 [out, in / 2]: column 2k in the low nibble, 2k+1 in the high one."""
    u = (q.to(torch.int16) + 8).to(torch.uint8)
    return u[:, 0::2] | (u[:, 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [out, in / 2] -> int8 [out, in] in [-8, 7] (pack_int4's inverse)."""
    low = (packed & 0x0F).to(torch.int8) - 8
    high = (packed >> 4).to(torch.int8) - 8
    return torch.stack((low, high), dim=-1).view(packed.shape[0], -1)


def int4_group_size(in_features: int) -> int | None:
    return next((g for g in INT4_GROUP_SIZES if in_features % g == 0), None)


def empty_quantized_linears(model: nn.Module, method: str) -> int:
    """Replaces every nn.Linear of the decoder layers (not the embeddings nor lm_head, which is often tied to them)
    by an empty QuantizedLinear for int8 (per output channel) or int4 (group-wise) weights, to be filled as the
    checkpoint is read (quantize_as_read), so the float weights are never all in memory. Call on the meta device.
    Returns how many linears were replaced; ValueError for an unknown method or an input width no int4 group size
    divides."""
    if method not in QUANTIZATION_METHODS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATION_METHODS)}, got {method!r}")
    if method == "none":
        return 0
    if hasattr(model, "config"):  # a decoder of models/ (its ModelConfig)
        check_quantizable(model.config, method)
    bits = 8 if method == "int8" else 4
    targets = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear) and name != "lm_head"]
    for name, linear in targets:
        group_size = linear.in_features
        if bits == 4:
            group_size = int4_group_size(linear.in_features)
            if group_size is None:
                raise ValueError(
                    f"int4 needs an input width divisible by {' or '.join(map(str, INT4_GROUP_SIZES))}; "
                    f"{name} has {linear.in_features}"
                )
        quantized = QuantizedLinear(
            linear.in_features, linear.out_features, bits, group_size, linear.bias is not None,
            dtype=linear.weight.dtype, device=linear.weight.device,
        )  # fmt: skip
        quantized.runtime_quantized = True
        parent_name, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent_name), leaf, quantized)
    log.info(
        "Quantized %d linear layers of the model to %s weights as read (torch reference forward)", len(targets), method
    )
    return len(targets)


def check_quantizable(config, method: str) -> None:
    """ValueError when quantization `method` cannot serve a model of config (a ModelConfig): the experts of a
    Mixture-of-Experts model are stacked tensors run by the fused-experts op, which has no quantized form yet."""
    if method != "none" and config.moe_layers:
        raise ValueError(
            f"--quantization {method} does not cover Mixture-of-Experts experts yet (family {config.family}); "
            "serve this model with --quantization none"
        )


@torch.no_grad()
def quantize_as_read(layer: QuantizedLinear, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(qweight, scales) of a float weight (or a fused part of one: its rows) in layer's layout."""
    q, scales = quantize_symmetric(weight.to(layer.scales.dtype), layer.bits, layer.group_size)
    return (pack_int4(q) if layer.bits == 4 else q), scales


class QuantizedEmbedding(nn.Module):
    """A token embedding held as int8 rows and one scale per row: E[v] ~ qweight[v] * scales[v]."""

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor):
        super().__init__()
        self.num_embeddings, self.embedding_dim = qweight.shape
        self.register_buffer("qweight", qweight)  # int8 [V, H]
        self.register_buffer("scales", scales)  # [V, 1] in the serving dtype

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.qweight[input_ids].to(self.scales.dtype) * self.scales[input_ids]  # [T, H]

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, int8 per row"


@torch.no_grad()
def quantize_vocabulary(model: nn.Module, with_embedding: bool = True) -> list[str]:
    """A quantized model's float lm_head [vocab, hidden] becomes an int8 QuantizedLinear and (with_embedding) its
    float token embedding a QuantizedEmbedding, both int8 with one scale per vocabulary row. Tied, they share one set of
    integers and scales (the same rounding), so the vocabulary matrix is held once. On a small model these are the
    largest matrices: SmolLM2-135M's is 28M of its 135M weights, and as float32 108 MiB of the int4 model's 199 MiB.
    Returns what was replaced (nothing for a float model, nor for parts already quantized)."""
    if not has_quantized_linears(model):
        return []
    replaced = []
    head, embedding = getattr(model, "lm_head", None), getattr(model, "embed_tokens", None) if with_embedding else None
    tied = type(head) is nn.Linear and type(embedding) is nn.Embedding and head.weight is embedding.weight
    if type(head) is nn.Linear:
        model.lm_head = QuantizedLinear.from_float(head, 8)
        replaced.append("lm_head")
    if type(embedding) is nn.Embedding:
        if tied:
            qweight, scales = model.lm_head.qweight, model.lm_head.scales
        else:
            qweight, scales = quantize_symmetric(embedding.weight.detach(), 8, embedding.embedding_dim)
        model.embed_tokens = QuantizedEmbedding(qweight, scales)
        replaced.append("embed_tokens (tied: the lm_head's rows)" if tied else "embed_tokens")
    if replaced:
        log.info("Quantized %s to int8 per vocabulary row", " and ".join(replaced))
    return replaced


def has_quantized_linears(model: nn.Module) -> bool:
    return any(isinstance(m, QuantizedLinear) for m in model.modules())


def quantized_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every QuantizedLinear's tensors by their names in the model, for the loader to fill."""
    return {
        f"{name}.{leaf}": tensor
        for name, module in model.named_modules()
        if isinstance(module, QuantizedLinear)
        for leaf, tensor in module.named_buffers(recurse=False)
        if tensor is not None
    }
