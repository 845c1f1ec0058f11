"""The runner interface the engine drives (paged `ModelRunner`, `CompiledModelRunner`) and the sampling step both share."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from inferfleet_runtime.engine.scheduler import ScheduledBatch
from inferfleet_runtime.engine.sequence import Logprob

if TYPE_CHECKING:
    import torch

    from inferfleet_runtime.checkpoints.tokenizer import Tokenizer
    from inferfleet_runtime.worker.sampler import Sampler

Sampled = tuple[int, Logprob | None]  # (token id, its logprobs when the request asked for them)


class Runner(Protocol):
    """Owns the model and its KV memory; the engine sizes its block pool and context limit from these attributes."""

    tokenizer: Tokenizer
    model_name: str
    vocab_size: int
    eos_token_ids: list[int]
    max_position_embeddings: int
    num_kv_blocks: int
    block_size: int

    def execute(self, batch: ScheduledBatch) -> list[Sampled | None]:
        """Runs the batch: one entry per scheduled sequence, the sampled next token when the sequence reached its
        last token this step (batch.samples(i)), else None."""
        ...


def sample_last_tokens(
    batch: ScheduledBatch, sampler: Sampler, logits_of: Callable[[list[int]], torch.Tensor]
) -> list[Sampled | None]:
    """execute()'s result: samples a next token for each sequence that reached its last token.

    logits_of(rows) gives [len(rows), vocab] float32 logits, row r for batch.seqs[rows[r]]; it is called only when
    some sequence samples.
    """
    rows = [i for i in range(len(batch.seqs)) if batch.samples(i)]
    results: list[Sampled | None] = [None] * len(batch.seqs)
    if rows:
        for i, sample in zip(rows, sampler.sample(logits_of(rows), [batch.seqs[i] for i in rows])):
            results[i] = sample
    return results
