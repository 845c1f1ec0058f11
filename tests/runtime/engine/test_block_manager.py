"""Block pool: allocation, ref counts, prefix caching with LRU eviction, and invariants over random operations."""

import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from inferfleet_runtime.engine.block_manager import BlockManager
from inferfleet_runtime.engine.sequence import Sequence

BS = 4


def make_seq(seq_id, tokens):
    return Sequence(seq_id=seq_id, request_id=str(seq_id), prompt_token_ids=list(tokens))


def admit(bm, seq):
    """Allocates seq's whole remaining prompt, as the scheduler does for an unchunked admission."""
    num_new = seq.num_tokens - seq.num_computed_tokens - bm.count_prefix_hit_tokens(seq)
    assert bm.can_allocate(seq, num_new)
    bm.allocate(seq, num_new)
    seq.num_computed_tokens += num_new
    bm.cache_full_blocks(seq)


def assert_pool_consistent(bm, live_seqs):
    refs = [0] * bm.num_blocks
    for seq in live_seqs:
        assert len(set(seq.block_ids)) == len(seq.block_ids)
        assert seq.num_computed_tokens <= len(seq.block_ids) * bm.block_size
        for block_id in seq.block_ids:
            refs[block_id] += 1
    assert [bm.ref_count(b) for b in range(bm.num_blocks)] == refs
    assert bm.num_free_blocks + sum(1 for r in refs if r > 0) == bm.num_blocks
    assert bm.num_free_blocks + bm.num_used_blocks == bm.num_blocks


def test_block_manager_and_scheduler_import_no_torch():
    code = (
        "import sys; import inferfleet_runtime.engine.block_manager, inferfleet_runtime.engine.scheduler; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_allocates_blocks_covering_the_prompt_and_frees_them():
    bm = BlockManager(num_blocks=8, block_size=BS)
    seq = make_seq(0, range(10))
    admit(bm, seq)
    assert len(seq.block_ids) == 3 and bm.num_used_blocks == 3
    assert bm.usage == 3 / 8
    bm.deallocate(seq)
    assert bm.num_free_blocks == 8 and bm.usage == 0 and seq.block_ids == [] and seq.num_computed_tokens == 0


def test_refuses_allocation_beyond_free_blocks():
    bm = BlockManager(num_blocks=2, block_size=BS)
    seq = make_seq(0, range(9))
    assert not bm.can_allocate(seq, 9)
    assert bm.can_allocate(seq, 8)


def test_append_takes_a_block_only_when_crossing_a_boundary():
    bm = BlockManager(num_blocks=4, block_size=BS)
    seq = make_seq(0, range(3))
    admit(bm, seq)
    seq.append_token(3)
    assert bm.append(seq, 1)
    assert len(seq.block_ids) == 1
    seq.num_computed_tokens += 1
    seq.append_token(4)
    assert bm.append(seq, 1)
    assert len(seq.block_ids) == 2


def test_append_refuses_without_free_blocks_and_changes_nothing():
    bm = BlockManager(num_blocks=1, block_size=BS)
    seq = make_seq(0, range(4))
    admit(bm, seq)
    seq.append_token(4)
    assert not bm.append(seq, 1)
    assert len(seq.block_ids) == 1 and bm.num_free_blocks == 0


def test_prefix_hit_shares_full_blocks_and_leaves_last_token_to_compute():
    bm = BlockManager(num_blocks=8, block_size=BS)
    first = make_seq(0, range(8))
    admit(bm, first)
    second = make_seq(1, range(8))
    # Both blocks are cached, but the last token must be computed for logits: only the first block hits.
    assert bm.count_prefix_hit_tokens(second) == 4
    admit(bm, second)
    assert second.block_ids[0] == first.block_ids[0] and second.block_ids[1] != first.block_ids[1]
    assert bm.ref_count(first.block_ids[0]) == 2 and second.num_cached_tokens == 4
    third = make_seq(2, [*range(8), 99])
    assert bm.count_prefix_hit_tokens(third) == 8


def test_prefix_hit_requires_the_whole_chain_to_match():
    bm = BlockManager(num_blocks=8, block_size=BS)
    admit(bm, make_seq(0, [1, 2, 3, 4, 5, 6, 7, 8, 9]))
    # Same second block, different first block: chained hashes differ, so nothing hits.
    assert bm.count_prefix_hit_tokens(make_seq(1, [0, 2, 3, 4, 5, 6, 7, 8, 9])) == 0


def test_freed_cached_blocks_hit_until_evicted_oldest_first():
    bm = BlockManager(num_blocks=4, block_size=BS)
    old, new = make_seq(0, [*range(4), 0]), make_seq(1, [*range(10, 14), 0])
    admit(bm, old)
    admit(bm, new)
    bm.deallocate(old)
    bm.deallocate(new)
    assert bm.num_free_blocks == 4 and bm.num_cached_blocks == 2
    assert bm.count_prefix_hit_tokens(make_seq(2, [*range(4), 7])) == 4
    # Taking two fresh blocks evicts the least recently freed: old's tail block, then old's cached prefix.
    filler = make_seq(3, range(100, 108))
    admit(bm, filler)
    assert bm.count_prefix_hit_tokens(make_seq(4, [*range(4), 7])) == 0
    assert bm.count_prefix_hit_tokens(make_seq(5, [*range(10, 14), 7])) == 4


def test_hit_on_a_free_cached_block_takes_it_off_the_free_list():
    bm = BlockManager(num_blocks=3, block_size=BS)
    first = make_seq(0, [*range(4), 9])
    admit(bm, first)
    bm.deallocate(first)
    second = make_seq(1, [*range(4), 9])
    admit(bm, second)
    assert bm.ref_count(second.block_ids[0]) == 1 and bm.num_free_blocks == 1
    assert_pool_consistent(bm, [second])


def test_fork_shares_the_parents_full_prompt_blocks():
    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=False)
    parent = make_seq(0, range(10))
    admit(bm, parent)
    child = make_seq(1, range(10))
    bm.fork(parent, child)
    assert child.block_ids == parent.block_ids[:2] and child.num_computed_tokens == 8
    assert bm.ref_count(parent.block_ids[0]) == 2
    bm.deallocate(parent)
    assert bm.num_used_blocks == 2
    bm.deallocate(child)
    assert bm.num_used_blocks == 0


def test_disabled_prefix_caching_never_hits():
    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=False)
    admit(bm, make_seq(0, range(9)))
    assert bm.count_prefix_hit_tokens(make_seq(1, range(9))) == 0


ops = st.lists(st.tuples(st.sampled_from(["add", "grow", "free", "fork"]), st.integers(0, 1_000)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(ops=ops, num_blocks=st.integers(1, 12), caching=st.booleans())
def test_random_operations_keep_the_pool_consistent_and_leak_nothing(ops, num_blocks, caching):
    bm = BlockManager(num_blocks=num_blocks, block_size=BS, enable_prefix_caching=caching)
    live: list[Sequence] = []
    next_id = 0
    for op, arg in ops:
        if op == "add":
            # Few distinct prompts, so prefix hits happen.
            seq = make_seq(next_id, [arg % 3] * (1 + arg % 11))
            next_id += 1
            num_new = seq.num_tokens - bm.count_prefix_hit_tokens(seq)
            if bm.can_allocate(seq, num_new):
                admit(bm, seq)
                live.append(seq)
        elif op == "grow" and live:
            seq = live[arg % len(live)]
            seq.append_token(arg % 3)
            if bm.append(seq, 1):
                seq.num_computed_tokens += 1
                bm.cache_full_blocks(seq)
            else:
                seq.token_ids.pop()
        elif op == "free" and live:
            bm.deallocate(live.pop(arg % len(live)))
        elif op == "fork" and live:
            parent = live[arg % len(live)]
            child = make_seq(next_id, parent.token_ids)
            next_id += 1
            bm.fork(parent, child)
            live.append(child)
        assert_pool_consistent(bm, live)
    for seq in live:
        bm.deallocate(seq)
    assert bm.num_free_blocks == num_blocks and bm.usage == 0
    assert all(bm.ref_count(b) == 0 for b in range(num_blocks))
