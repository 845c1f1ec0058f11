"""EngineConfig: the serving engine's limits (KV blocks, batch caps, context length, queue, kernels)."""

from __future__ import annotations

from dataclasses import dataclass

KERNEL_BACKENDS = ("auto", "triton", "native", "reference")
QUANTIZATIONS = ("none", "int8", "int4")  # load-time weight-only quantization of a float checkpoint


@dataclass
class EngineConfig:
    block_size: int = 16
    num_kv_blocks: int | None = None  # None: derived from kv_cache_memory
    kv_cache_memory: int | None = None  # bytes for all layers' K and V; None: a default budget
    max_num_seqs: int = 64  # running sequences at once
    max_num_batched_tokens: int = 2048  # new tokens per step (prefill chunks + decodes)
    max_context_length: int | None = None  # None: the model's max_position_embeddings
    max_queue_len: int = 1024  # waiting requests beyond this are refused (HTTP 429)
    enable_prefix_caching: bool = True
    kernels: str = "auto"
    quantization: str = "none"
    dtype: str | None = None
    device: str | None = None
    seed: int = 0  # seeds sampling of requests that give no seed
    tensor_parallel_size: int = 1  # ranks (devices, or CPU processes) one model is sharded over

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be positive, got {self.num_kv_blocks}")
        if self.kv_cache_memory is not None and self.kv_cache_memory < 1:
            raise ValueError(f"kv_cache_memory must be positive, got {self.kv_cache_memory}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be positive, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be positive, got {self.max_num_batched_tokens}")
        if self.max_context_length is not None and self.max_context_length < 2:
            raise ValueError(f"max_context_length must be at least 2, got {self.max_context_length}")
        if self.max_queue_len < 0:
            raise ValueError(f"max_queue_len must not be negative, got {self.max_queue_len}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be positive, got {self.tensor_parallel_size}")
        if self.tensor_parallel_size > 1 and self.quantization != "none":
            raise ValueError("quantization with tensor_parallel_size > 1 is not supported yet: serve it on one rank")
        if self.kernels not in KERNEL_BACKENDS:
            raise ValueError(f"kernels must be one of {', '.join(KERNEL_BACKENDS)}, got {self.kernels!r}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {self.quantization!r}")
