"""ModelRunner: the one module that owns tensors: KV caches, batch inputs, the forward pass, sampling.

It implements `runner.Runner` over the paged KV cache (the compiled engine's `CompiledModelRunner` is the other).
"""

from __future__ import annotations

import itertools
import logging
from pathlib import Path

import torch

from inferfleet_runtime.attention import (
    PagedAttention,
    allocate_kv_cache,
    build_attention_metadata,
    kv_cache_bytes_per_block,
)
from inferfleet_runtime.engine_config import EngineConfig
from inferfleet_runtime.layers.linear import pack_linears
from inferfleet_runtime.runner import Sampled, sample_last_tokens
from inferfleet_runtime.sampling import Sampler
from inferfleet_runtime.scheduler import ScheduledBatch

log = logging.getLogger(__name__)

DEFAULT_CPU_KV_BYTES = 1 << 30  # KV budget on a CPU when none is given
DEFAULT_GPU_KV_FRACTION = 0.8  # of the device memory still free after loading the weights


class ModelRunner:
    def __init__(self, loaded, config: EngineConfig, model_name: str | None = None):
        self.model, self.ops = loaded.model, loaded.model.ops
        pack_linears(self.model)  # float32 on a CPU: packed weights, native or oneDNN (a no-op elsewhere)
        self.model_config = loaded.config
        self.tokenizer = loaded.tokenizer
        self.device = loaded.device
        self.model_name = model_name or loaded.config.name
        self.eos_token_ids = list(loaded.config.eos_token_ids)
        self.max_position_embeddings = loaded.config.max_position_embeddings
        self.vocab_size = loaded.config.vocab_size
        self.block_size = config.block_size
        self.num_kv_blocks = config.num_kv_blocks or self._num_blocks_for_budget(config)
        self.kv_caches = allocate_kv_cache(loaded.config, self.num_kv_blocks, self.block_size, self.device)
        self.sampler = Sampler(self.device, seed=config.seed)
        log.info(
            "%s: %s on %s, kernels %s, %d KV blocks of %d tokens",
            self.model_name, str(loaded.config.dtype).removeprefix("torch."), self.device, self.ops.backend,
            self.num_kv_blocks, self.block_size,
        )  # fmt: skip

    @classmethod
    def from_model_dir(cls, model_dir: str | Path, config: EngineConfig, model_name: str | None = None) -> ModelRunner:
        from inferfleet_runtime.loader import load_model

        loaded = load_model(
            model_dir,
            dtype=config.dtype,
            device=config.device,
            kernels=config.kernels,
            quantization=config.quantization,
        )
        return cls(loaded, config, model_name)

    def _num_blocks_for_budget(self, config: EngineConfig) -> int:
        bytes_per_block = kv_cache_bytes_per_block(self.model_config, self.block_size)
        budget = config.kv_cache_memory
        if budget is None and self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            budget = int(free * DEFAULT_GPU_KV_FRACTION)
        if budget is None:
            # Enough for every running sequence at full length, within a fixed CPU budget.
            max_len = config.max_model_len or self.max_position_embeddings
            wanted = config.max_num_seqs * -(-max_len // self.block_size)
            return max(1, min(wanted, DEFAULT_CPU_KV_BYTES // bytes_per_block))
        return max(1, budget // bytes_per_block)

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> list[Sampled | None]:
        if batch.is_empty:
            return []
        seqs, num_new = batch.seqs, batch.num_new_tokens
        seq_lens = [seq.num_computed_tokens + n for seq, n in zip(seqs, num_new)]
        meta, positions = build_attention_metadata(
            [seq.block_ids for seq in seqs], seq_lens, num_new, self.block_size, self.device
        )
        token_ids: list[int] = []
        for seq, n in zip(seqs, num_new):
            token_ids += seq.token_ids[seq.num_computed_tokens : seq.num_computed_tokens + n]
        input_ids = torch.tensor(token_ids, dtype=torch.int64, device=self.device)
        attn = PagedAttention(self.kv_caches, meta, self.ops)
        hidden = self.model(input_ids, positions, attn)  # [num_tokens, hidden]

        def logits_of(rows: list[int]) -> torch.Tensor:
            last = hidden
            if len(rows) < hidden.shape[0]:  # else every token is its sequence's last (decode): no gather
                ends = list(itertools.accumulate(num_new))  # flat index + 1 of each sequence's last new token
                last = hidden[torch.tensor([ends[i] - 1 for i in rows], dtype=torch.int64, device=self.device)]
            return self.model.compute_logits(last)  # [len(rows), vocab] float32

        return sample_last_tokens(batch, self.sampler, logits_of)
