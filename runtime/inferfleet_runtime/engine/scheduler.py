"""Scheduler: continuous batching under a per-step token budget, chunked prefill, recompute preemption.

No prefill and decode phases: every step each running request catches its computed-token count up to
its length (a whole prompt chunk, or the one token sampled last step), running requests first, then
waiting requests while the budget, the running-sequence cap and the free blocks allow. When a running
request cannot grow, the newest running request is preempted: its blocks are freed and it is recomputed
later from its tokens. Imports no torch.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from inferfleet_runtime.engine.block_manager import BlockManager
from inferfleet_runtime.engine.sequence import FinishReason, Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    """One step's work: seqs[i] computes its next num_new_tokens[i] tokens."""

    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(self.num_new_tokens)

    @property
    def is_empty(self) -> bool:
        return not self.seqs

    def samples(self, i: int) -> bool:
        """Whether seqs[i] reaches its last token this step, so a next token is sampled for it."""
        seq = self.seqs[i]
        return seq.num_computed_tokens + self.num_new_tokens[i] == seq.num_tokens


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int):
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order: the newest is last
        self.num_preemptions = 0

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence, first: bool = False) -> None:
        assert seq.status is SequenceStatus.WAITING
        if first:
            self.waiting.appendleft(seq)
        else:
            self.waiting.append(seq)

    def add_forked(self, parent: Sequence, child: Sequence) -> None:
        """Adds another choice of parent's request, sharing parent's computed prompt blocks when it can run now.

        A child that cannot run yet waits without blocks (it will hit the prefix cache or recompute): no
        waiting sequence ever holds blocks, so the head of the queue can always be admitted eventually.
        """
        assert child.status is SequenceStatus.WAITING and parent.status is SequenceStatus.RUNNING
        if len(self.running) < self.max_num_seqs:
            self.block_manager.fork(parent, child)
            child.status = SequenceStatus.RUNNING
            self.running.append(child)
        else:
            self.waiting.appendleft(child)

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        running = self.running
        append = self.block_manager.append
        seqs, nums = batch.seqs, batch.num_new_tokens
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            num_new = min(len(seq.token_ids) - seq.num_computed_tokens, budget)
            assert num_new > 0, "a running sequence always has a token to compute"
            while not append(seq, num_new):
                victim = running.pop()
                self._preempt(victim)
                batch.preempted.append(victim)
                if victim is seq:
                    break
            else:
                seqs.append(seq)
                nums.append(num_new)
                budget -= num_new
                i += 1
        # After a preemption blocks are short: admitting someone now would only thrash.
        while self.waiting and budget > 0 and not batch.preempted and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            num_hit = self.block_manager.count_prefix_hit_tokens(seq)
            num_new = min(seq.num_tokens - seq.num_computed_tokens - num_hit, budget)
            if not self.block_manager.can_allocate(seq, num_new):
                break
            self.waiting.popleft()
            self.block_manager.allocate(seq, num_new)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            batch.seqs.append(seq)
            batch.num_new_tokens.append(num_new)
            budget -= num_new
        return batch

    def commit(self, batch: ScheduledBatch) -> None:
        """Records that the batch ran: its tokens are computed, its full blocks may be cached."""
        bm = self.block_manager
        if not bm.enable_prefix_caching:
            for seq, num_new in zip(batch.seqs, batch.num_new_tokens):
                seq.num_computed_tokens += num_new
            return
        block_size = bm.block_size
        for seq, num_new in zip(batch.seqs, batch.num_new_tokens):
            seq.num_computed_tokens += num_new
            if seq.num_computed_tokens // block_size > seq.num_registered_blocks:  # a block filled up
                bm.cache_full_blocks(seq)

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """Ends seq (finished or aborted, running or waiting) and frees its blocks at once."""
        if seq.status is SequenceStatus.FINISHED:
            return
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        self.block_manager.deallocate(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.deallocate(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
