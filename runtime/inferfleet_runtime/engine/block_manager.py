"""BlockManager: the pool of KV cache blocks, with reference counts, block tables and prefix caching.

Invariants (checked by tests over random operation sequences):
- a block is in the free list exactly when its reference count is 0; free + used == total;
- a block shared by several sequences (prefix hit or fork) is full and lies before every sharer's first
  uncomputed token, so no sequence ever writes into a block another one reads;
- a free block may still hold a cached prefix: it is evicted only when handed out again, oldest freed first.

Imports no torch: the engine turns block tables into tensors elsewhere.
"""

from __future__ import annotations

from collections import OrderedDict

from inferfleet_runtime.engine.sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        assert num_blocks > 0 and block_size > 0
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._ref_counts = [0] * num_blocks
        self._block_hashes: list[int | None] = [None] * num_blocks  # hash a block is cached under
        self._cached: dict[int, int] = {}  # block hash -> block id
        # Free list in LRU order: freed blocks go to the tail, new blocks come from the head. An OrderedDict
        # rather than a deque so a prefix hit can take a cached block out of the middle in O(1).
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.num_prefix_queried_tokens = 0
        self.num_prefix_hit_tokens = 0

    # -- figures ------------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    @property
    def usage(self) -> float:
        """KV cache utilisation, 0..1: blocks referenced by some sequence over all blocks."""
        return self.num_used_blocks / self.num_blocks

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- prefix cache -------------------------------------------------------------------------------
    def _hashes(self, seq: Sequence, num_full_blocks: int) -> list[int]:
        """Chained hashes of seq's first num_full_blocks blocks: hash(parent hash, token ids of the block)."""
        bs = self.block_size
        hashes = seq.block_hashes
        while len(hashes) < num_full_blocks:
            i = len(hashes)
            parent = hashes[-1] if hashes else None
            hashes.append(hash((parent, tuple(seq.token_ids[i * bs : (i + 1) * bs]))))
        return hashes

    def _prefix_hit(self, seq: Sequence) -> list[int]:
        """Cached blocks matching seq's leading full blocks; only for a sequence that holds no blocks."""
        if not self.enable_prefix_caching or seq.block_ids:
            return []
        # At least one token is always left to compute: the last one yields the logits to sample from.
        num_full = (seq.num_tokens - 1) // self.block_size
        hits = []
        for block_hash in self._hashes(seq, num_full)[:num_full]:
            block_id = self._cached.get(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def count_prefix_hit_tokens(self, seq: Sequence) -> int:
        """Tokens of seq that allocate() would take from the prefix cache instead of computing."""
        return len(self._prefix_hit(seq)) * self.block_size

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Offers seq's computed full blocks to the prefix cache (call after the step that computed them)."""
        if not self.enable_prefix_caching:
            return
        num_full = seq.num_computed_tokens // self.block_size
        if num_full <= seq.num_registered_blocks:
            return
        hashes = self._hashes(seq, num_full)
        for i in range(seq.num_registered_blocks, num_full):
            block_id = seq.block_ids[i]
            # A block whose content another block already caches stays uncached (it is freed normally).
            if self._block_hashes[block_id] is None and hashes[i] not in self._cached:
                self._cached[hashes[i]] = block_id
                self._block_hashes[block_id] = hashes[i]
        seq.num_registered_blocks = num_full

    # -- allocation ---------------------------------------------------------------------------------
    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Whether a waiting seq can be admitted with num_new_tokens to compute after its prefix hit."""
        hits = self._prefix_hit(seq)
        num_computed = seq.num_computed_tokens + len(hits) * self.block_size
        num_needed = self.num_blocks_for(num_computed + num_new_tokens) - len(seq.block_ids) - len(hits)
        num_hits_free = sum(1 for block_id in hits if self._ref_counts[block_id] == 0)
        return max(num_needed, 0) + num_hits_free <= len(self._free)

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        """Takes seq's prefix hit and enough new blocks for num_new_tokens more tokens."""
        hits = self._prefix_hit(seq)
        self.num_prefix_queried_tokens += seq.num_tokens
        self.num_prefix_hit_tokens += len(hits) * self.block_size
        for block_id in hits:
            if self._ref_counts[block_id] == 0:
                del self._free[block_id]
            self._ref_counts[block_id] += 1
        seq.block_ids.extend(hits)
        seq.num_computed_tokens += len(hits) * self.block_size
        seq.num_cached_tokens = len(hits) * self.block_size
        seq.num_registered_blocks = len(seq.block_ids) if hits else seq.num_registered_blocks
        is_grown = self.append(seq, num_new_tokens)
        assert is_grown, "allocate without can_allocate"

    def append(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Grows a running seq's block table to hold num_new_tokens more tokens, if the free blocks allow.

        Returns whether it did; on False nothing changed. The one way a block table grows.
        """
        num_needed = self.num_blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_ids)
        if num_needed > len(self._free):
            return False
        for _ in range(num_needed):
            seq.block_ids.append(self._take_free_block())
        return True

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Shares parent's computed full blocks of child's tokens with child (a fresh sequence, n > 1)."""
        num_shared = min(parent.num_computed_tokens, child.num_tokens - 1) // self.block_size
        num_shared_tokens = num_shared * self.block_size
        assert not child.block_ids and child.token_ids[:num_shared_tokens] == parent.token_ids[:num_shared_tokens]
        for block_id in parent.block_ids[:num_shared]:
            self._ref_counts[block_id] += 1
        child.block_ids = parent.block_ids[:num_shared]
        child.num_computed_tokens = num_shared * self.block_size
        child.num_cached_tokens = child.num_computed_tokens
        child.num_registered_blocks = min(num_shared, parent.num_registered_blocks)

    def deallocate(self, seq: Sequence) -> None:
        """Drops seq's references at once; its K/V are gone, so nothing of it counts as computed."""
        # Tail blocks first, so under LRU eviction a shared prefix outlives the suffixes hanging off it.
        for block_id in reversed(seq.block_ids):
            count = self._ref_counts[block_id]
            assert count > 0, f"block {block_id} freed twice"
            self._ref_counts[block_id] = count - 1
            if count == 1:
                self._free[block_id] = None
        seq.block_ids = []
        seq.num_computed_tokens = 0
        seq.num_registered_blocks = 0

    def _take_free_block(self) -> int:
        block_id, _ = self._free.popitem(last=False)
        block_hash = self._block_hashes[block_id]
        if block_hash is not None:  # evict the cached prefix this block held
            del self._cached[block_hash]
            self._block_hashes[block_id] = None
        self._ref_counts[block_id] = 1
        return block_id
