"""CompiledModelRunner: the engine's `runner.Runner` over a compiled engine's bucket graphs and static KV slots.

Each running sequence owns one slot of the static KV buffer for its whole life; the scheduler and
block manager still decide what runs (their blocks only count capacity: max_batch_size sequences of
max_context_length tokens). A slot's life: a sequence claims it when it first runs, or, for a choice forked
from its parent (n > 1), when it is forked (fork(): the parent's computed prompt is copied while the parent
still holds its slot, since the parent may finish on that very token); it is released at the next step or fork
after the sequence finished or was preempted. Per step, one-token rows go through the smallest decode graph
that holds them (padded), longer rows (prompt chunks) one at a time through the smallest prefill graph that holds
each piece; the graphs return the new K/V and this module writes them into the slots.
"""

from __future__ import annotations

from pathlib import Path

import torch

from inferfleet_runtime.checkpoints.tokenizer import Tokenizer
from inferfleet_runtime.engine.config import EngineConfig
from inferfleet_runtime.engine.runner_protocol import Sampled, sample_last_tokens
from inferfleet_runtime.engine.scheduler import ScheduledBatch
from inferfleet_runtime.engine.sequence import Sequence, SequenceStatus
from inferfleet_runtime.models import read_config_dir
from inferfleet_runtime.worker.sampler import Sampler

from .backends import get_backend
from .envelope import bucket_for
from .export import kv_cache_shape
from .manifest import Manifest, artifact_path, check_compatible, read_manifest, verify_checksums


class CompiledModelRunner:
    def __init__(
        self,
        engine_dir: str | Path,
        config: EngineConfig,
        device: torch.device | None = None,
        model_name: str | None = None,
        manifest: Manifest | None = None,
    ):
        """manifest: the one already read and verified (runner_factory), so the engine loaded is the one checked."""
        engine_dir = Path(engine_dir)
        self.manifest: Manifest = manifest or read_manifest(engine_dir)
        self.device = device or _manifest_device(self.manifest)
        check_compatible(self.manifest, self.device)
        envelope = self.manifest.envelope
        self.envelope = envelope
        model_config = read_config_dir(engine_dir / "model", dtype=envelope.dtype)
        self.tokenizer = Tokenizer.from_dir(engine_dir / "model", extra_eos_token_ids=model_config.eos_token_ids)
        self.model_name = model_name or self.manifest.model.get("name") or engine_dir.name
        self.eos_token_ids = list(model_config.eos_token_ids or self.tokenizer.eos_token_ids)
        self.vocab_size = model_config.vocab_size
        self.max_position_embeddings = envelope.max_context_length
        self.block_size = config.block_size
        # Exactly the slots' capacity, so the scheduler never runs more than the envelope holds.
        self.num_kv_blocks = envelope.max_batch_size * -(-envelope.max_context_length // self.block_size)
        backend = get_backend(self.manifest.backend)
        self.graphs = {
            (g.kind, g.bucket): backend.load(artifact_path(engine_dir, self.manifest, g.file), self.device)
            for g in self.manifest.graphs
        }
        self.kv_cache = torch.zeros(
            kv_cache_shape(model_config, envelope), dtype=model_config.dtype, device=self.device
        )
        self.sampler = Sampler(self.device, seed=config.seed)
        self._slot_of: dict[int, int] = {}  # seq_id -> slot
        self._seq_in: dict[int, Sequence] = {}  # slot -> sequence holding it
        self._free_slots = list(range(envelope.max_batch_size - 1, -1, -1))

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> list[Sampled | None]:
        if batch.is_empty:
            return []
        self._release_done_slots()
        for seq in batch.seqs:
            if seq.seq_id not in self._slot_of:
                # Only a forked choice starts with computed tokens, and fork() gave it its slot (no prefix caching).
                assert not seq.num_computed_tokens, f"sequence {seq.seq_id} has computed tokens but no slot"
                self._claim_slot(seq)
        logits_by_row: dict[int, torch.Tensor] = {}  # index in batch -> logits [vocab]
        decode_rows = [i for i, n in enumerate(batch.num_new_tokens) if n == 1]
        largest = self.envelope.decode_buckets[-1]
        for start in range(0, len(decode_rows), largest):
            rows = decode_rows[start : start + largest]
            logits = self._run_decode([batch.seqs[i] for i in rows])
            logits_by_row.update(zip(rows, logits))
        for i, n in enumerate(batch.num_new_tokens):
            if n > 1:
                logits_by_row[i] = self._run_prefill(batch.seqs[i], n)
        # [num_rows, vocab] float32
        return sample_last_tokens(batch, self.sampler, lambda rows: torch.stack([logits_by_row[i] for i in rows]))

    # -- graphs -------------------------------------------------------------------------------------
    def _run_decode(self, seqs: list[Sequence]) -> torch.Tensor:
        """One new token for each seq (at most the largest decode bucket); logits [len(seqs), vocab]."""
        num = len(seqs)
        bucket = bucket_for(self.envelope.decode_buckets, num)
        pad = bucket - num
        # Padding rows read slot 0 at position 0 and are dropped; their K/V are never stored.
        tokens = [seq.token_ids[seq.num_computed_tokens] for seq in seqs] + [0] * pad
        starts = [seq.num_computed_tokens for seq in seqs] + [0] * pad
        slots = [self._slot_of[seq.seq_id] for seq in seqs] + [0] * pad
        dev = self.device
        starts_t = torch.tensor(starts, dtype=torch.int64, device=dev)
        slots_t = torch.tensor(slots, dtype=torch.int64, device=dev)
        logits, new_kv = self.graphs["decode", bucket](
            torch.tensor(tokens, dtype=torch.int64, device=dev).view(bucket, 1),
            starts_t,
            torch.ones(bucket, dtype=torch.int64, device=dev),
            slots_t,
            self.kv_cache,
        )
        self.kv_cache[:, :, slots_t[:num], starts_t[:num]] = new_kv[:, :, :num, 0]
        return logits[:num]

    def _run_prefill(self, seq: Sequence, num_new: int) -> torch.Tensor:
        """num_new tokens of seq from its first uncomputed one, in pieces of at most the largest prefill bucket;
        the logits [vocab] after the last."""
        slot = self._slot_of[seq.seq_id]
        dev = self.device
        start, end = seq.num_computed_tokens, seq.num_computed_tokens + num_new
        largest = self.envelope.prefill_buckets[-1]
        logits = None
        while start < end:
            n = min(end - start, largest)
            bucket = bucket_for(self.envelope.prefill_buckets, n)
            tokens = seq.token_ids[start : start + n] + [0] * (bucket - n)
            out, new_kv = self.graphs["prefill", bucket](
                torch.tensor(tokens, dtype=torch.int64, device=dev).view(1, bucket),
                torch.tensor([start], dtype=torch.int64, device=dev),
                torch.tensor([n], dtype=torch.int64, device=dev),
                torch.tensor([slot], dtype=torch.int64, device=dev),
                self.kv_cache,
            )
            self.kv_cache[:, :, slot, start : start + n] = new_kv[:, :, 0, :n]
            logits = out[0]
            start += n
        return logits

    # -- slots --------------------------------------------------------------------------------------
    @torch.inference_mode()
    def fork(self, parent: Sequence, children: list[Sequence]) -> None:
        """Called by the engine as it forks the other choices of parent's request (parent has just computed its
        prompt, in its slot): each child that shares computed tokens gets its own slot with a copy of them now.
        Later the parent's slot may be gone: it finishes on this very token (max_tokens=1, a stop token) and is
        released before the children first run, which need not be the next step (the token budget)."""
        self._release_done_slots()
        parent_slot = self._slot_of[parent.seq_id]
        for child in children:
            num_shared = child.num_computed_tokens  # 0: it waits and computes its prompt itself
            if num_shared:
                assert child.token_ids[:num_shared] == parent.token_ids[:num_shared]
                slot = self._claim_slot(child)
                self.kv_cache[:, :, slot, :num_shared] = self.kv_cache[:, :, parent_slot, :num_shared]

    def _release_done_slots(self) -> None:
        # Finished sequences are gone; preempted ones are back to waiting and will be recomputed from 0.
        for slot, seq in list(self._seq_in.items()):
            if seq.status is SequenceStatus.FINISHED or seq.status is SequenceStatus.WAITING:
                del self._seq_in[slot], self._slot_of[seq.seq_id]
                self._free_slots.append(slot)

    def _claim_slot(self, seq: Sequence) -> int:
        if not self._free_slots:
            raise RuntimeError(
                f"no free KV slot: more than max_batch_size={self.envelope.max_batch_size} "
                "sequences are running (the engine config must cap max_num_seqs)"
            )
        slot = self._free_slots.pop()
        self._slot_of[seq.seq_id], self._seq_in[slot] = slot, seq
        return slot


def fit_engine_config(manifest: Manifest, config: EngineConfig) -> None:
    """Clamps the serving config (in place: the server builds its engine from this object) to the envelope:
    batch cap, context limit, and no prefix caching (KV lives per slot, not in shareable blocks)."""
    envelope = manifest.envelope
    config.max_num_seqs = min(config.max_num_seqs, envelope.max_batch_size)
    config.max_context_length = min(
        config.max_context_length or envelope.max_context_length, envelope.max_context_length
    )
    config.enable_prefix_caching = False
    config.num_kv_blocks, config.kv_cache_memory = None, None


def _manifest_device(manifest: Manifest) -> torch.device:
    return torch.device("cpu" if manifest.target_architecture.startswith("cpu-") else "cuda")


def make_compiled_engine(
    engine_dir: str | Path, config: EngineConfig | None = None, device: torch.device | None = None
):
    """An LLMEngine over a compiled engine directory (offline use, benchmarks, tests)."""
    from inferfleet_runtime.engine.llm_engine import LLMEngine

    config = config or EngineConfig()
    manifest = read_manifest(engine_dir)
    verify_checksums(engine_dir, manifest)
    fit_engine_config(manifest, config)
    return LLMEngine(CompiledModelRunner(engine_dir, config, device, manifest=manifest), config)
