"""The Llama-family decoder and the linear-packing pass under their old import path (models/, layers/ hold them)."""

from .layers.linear import (
    PACKED_LINEAR_BATCH_HINT,
    PACKED_LINEAR_MIN_WEIGHT,
    NativeLinear,
    PackedLinear,
    can_pack_linears,
    pack_linears,
)
from .models.llama import LlamaModel, native_decoder_weights

__all__ = [
    "PACKED_LINEAR_BATCH_HINT",
    "PACKED_LINEAR_MIN_WEIGHT",
    "LlamaModel",
    "NativeLinear",
    "PackedLinear",
    "can_pack_linears",
    "native_decoder_weights",
    "pack_linears",
]
