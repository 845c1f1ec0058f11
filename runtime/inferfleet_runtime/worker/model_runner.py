"""ModelRunner: the one module that owns tensors: KV caches, batch inputs, the forward pass, sampling.

It implements `runner.Runner` over the paged KV cache (the compiled engine's `CompiledModelRunner` is the other).
"""

from __future__ import annotations

import itertools
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from inferfleet_runtime.checkpoints.loader import release_freed_memory
from inferfleet_runtime.engine.config import EngineConfig
from inferfleet_runtime.engine.runner_protocol import Sampled, sample_last_tokens
from inferfleet_runtime.engine.scheduler import ScheduledBatch
from inferfleet_runtime.layers.attention_backend import (
    PagedAttention,
    allocate_kv_cache,
    build_attention_metadata,
    kv_cache_bytes_per_block,
)
from inferfleet_runtime.layers.linear import pack_linears
from inferfleet_runtime.worker.sampler import Sampler

if TYPE_CHECKING:
    from torch.distributed import TCPStore

log = logging.getLogger(__name__)

DEFAULT_CPU_KV_BYTES = 1 << 30  # KV budget on a CPU when none is given
DEFAULT_GPU_KV_FRACTION = 0.8  # of the device memory still free after loading the weights


class ModelRunner:
    def __init__(self, loaded, config: EngineConfig, model_name: str | None = None, tensor_parallel=None):
        self.model, self.ops = loaded.model, loaded.model.ops
        self.tensor_parallel = tensor_parallel  # layers.parallel.TensorParallel, or None on one rank
        self.workers = None  # rank 0 of several: distributed.Workers
        pack_linears(self.model)  # float32 on a CPU: packed weights, native or oneDNN (a no-op elsewhere)
        release_freed_memory()  # what the load and the packing dropped (once, when the weights are final)
        self.model_config = loaded.config
        self.tokenizer = loaded.tokenizer
        self.device = loaded.device
        self.model_name = model_name or loaded.config.name
        self.eos_token_ids = list(loaded.config.eos_token_ids)
        self.max_position_embeddings = loaded.config.max_position_embeddings
        self.vocab_size = loaded.config.vocab_size
        self.block_size = config.block_size
        # A rank's model holds its share of the KV heads (self.model.config; loaded.config is the whole model's).
        self.kv_config = self.model.config
        self.num_kv_blocks = config.num_kv_blocks or self._num_blocks_for_budget(config)
        if tensor_parallel is not None:  # every rank holds the same blocks: the fewest any rank's budget allows
            fewest = torch.tensor([self.num_kv_blocks], dtype=torch.int64, device=self.device)
            torch.distributed.all_reduce(fewest, op=torch.distributed.ReduceOp.MIN)
            self.num_kv_blocks = int(fewest.item())
        self.kv_caches = allocate_kv_cache(self.kv_config, self.num_kv_blocks, self.block_size, self.device)
        self.sampler = Sampler(self.device, seed=config.seed)
        log.info(
            "%s: %s on %s, kernels %s, %d KV blocks of %d tokens%s",
            self.model_name, str(loaded.config.dtype).removeprefix("torch."), self.device, self.ops.backend,
            self.num_kv_blocks, self.block_size,
            f", tensor-parallel rank {tensor_parallel.rank} of {tensor_parallel.world}" if tensor_parallel else "",
        )  # fmt: skip

    @classmethod
    def from_model_dir(cls, model_dir: str | Path, config: EngineConfig, model_name: str | None = None) -> ModelRunner:
        """The runner of this process; with tensor_parallel_size > 1 it is rank 0, and starts the other ranks."""
        if config.tensor_parallel_size > 1:
            from inferfleet_runtime.worker.tensor_parallel import Workers, rendezvous

            store = rendezvous(config.tensor_parallel_size)
            workers = Workers(
                Path(model_dir), config, store.port
            )  # they load their parts while this rank loads its own
            runner = cls.for_rank(Path(model_dir), config, 0, store, model_name)
            runner.workers = workers
            workers.ready(runner.device)
            return runner
        from inferfleet_runtime.checkpoints.loader import load_model

        loaded = load_model(
            model_dir,
            dtype=config.dtype,
            device=config.device,
            kernels=config.kernels,
            quantization=config.quantization,
        )
        return cls(loaded, config, model_name)

    @classmethod
    def for_rank(
        cls, model_dir: Path, config: EngineConfig, rank: int, store: TCPStore, model_name: str | None = None
    ) -> ModelRunner:
        """Rank `rank` of config.tensor_parallel_size: joins the process group, then loads its part of the model."""
        from inferfleet_runtime.checkpoints.loader import load_model
        from inferfleet_runtime.layers.parallel import TensorParallel
        from inferfleet_runtime.worker.tensor_parallel import init_group, rank_device

        tp = TensorParallel(rank, config.tensor_parallel_size)
        device = rank_device(config.device, rank)
        init_group(rank, tp.world, store, device)
        if device.type == "cpu":  # the ranks share this machine's cores
            from inferfleet_runtime.device import cpu_engine_threads

            torch.set_num_threads(max(1, cpu_engine_threads() // tp.world))
        loaded = load_model(model_dir, dtype=config.dtype, device=device, kernels=config.kernels, tensor_parallel=tp)
        return cls(loaded, config, model_name, tp)

    def _num_blocks_for_budget(self, config: EngineConfig) -> int:
        bytes_per_block = kv_cache_bytes_per_block(self.kv_config, self.block_size)
        budget = config.kv_cache_memory
        if budget is None and self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            budget = int(free * DEFAULT_GPU_KV_FRACTION)
        if budget is None:
            # Enough for every running sequence at full length, within a fixed CPU budget.
            max_len = config.max_context_length or self.max_position_embeddings
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
        ends = list(itertools.accumulate(num_new))  # flat index + 1 of each sequence's last new token
        rows = [ends[i] - 1 for i in range(len(seqs)) if batch.samples(i)]  # sample_last_tokens' rows, as tokens
        last_rows = torch.tensor(rows, dtype=torch.int64, device=self.device)
        if self.tensor_parallel is not None:
            from inferfleet_runtime.worker.tensor_parallel import fatal, send_step

            try:
                send_step(input_ids, positions, meta, last_rows)
                logits = self._forward(input_ids, positions, meta, last_rows)
            except Exception as exc:  # the ranks are out of step now: none of them can go on
                log.exception("A tensor-parallel step failed")
                fatal(f"a tensor-parallel step failed: {exc!r}")
        else:
            logits = self._forward(input_ids, positions, meta, last_rows)
        return sample_last_tokens(batch, self.sampler, lambda _rows: logits)

    def _forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta, last_rows: torch.Tensor
    ) -> torch.Tensor | None:
        """The step's forward: [len(last_rows), vocab] float32 logits of the hidden rows last_rows (None if none)."""
        hidden = self.model(input_ids, positions, PagedAttention(self.kv_caches, meta, self.ops))  # [T, hidden]
        if last_rows.numel() == 0:
            return None
        if last_rows.numel() < hidden.shape[0]:  # else every token is its sequence's last (decode): no gather
            hidden = hidden[last_rows]
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def follow(self) -> None:
        """Ranks > 0: runs rank 0's steps (its broadcasts) until it says stop."""
        from inferfleet_runtime.worker.tensor_parallel import receive_step

        while (step := receive_step(self.device)) is not None:
            self._forward(*step)
