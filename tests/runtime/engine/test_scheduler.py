"""Scheduler: token budget, running cap, chunked prefill, preemption of the newest, abort; random-op invariants."""

from hypothesis import given, settings
from hypothesis import strategies as st

from inferfleet_runtime.engine.block_manager import BlockManager
from inferfleet_runtime.engine.scheduler import Scheduler
from inferfleet_runtime.engine.sequence import FinishReason, Sequence, SequenceStatus

BS = 4


def make_seq(seq_id, num_prompt, token=1):
    return Sequence(seq_id=seq_id, request_id=str(seq_id), prompt_token_ids=[token] * num_prompt)


def assert_every_scheduled_token_has_its_own_slot(batch, live, block_size):
    """Each token a step computes has a KV slot, and no two live sequences write one block.

    A block may sit in several block tables only as a shared prefix: full, and wholly computed
    for every sharer before the step, so nobody writes into it.
    """
    for seq, num_new in zip(batch.seqs, batch.num_new_tokens):
        assert seq.num_computed_tokens + num_new <= len(seq.block_ids) * block_size, "a token without a slot"
    holders = {}
    for seq in live:
        for index, block_id in enumerate(seq.block_ids):
            holders.setdefault(block_id, []).append((seq, index))
    for block_id, sharers in holders.items():
        if len(sharers) > 1:
            for seq, index in sharers:
                assert (index + 1) * block_size <= seq.num_computed_tokens, f"block {block_id} shared while written"


def run_step(sched, max_output=None, on_first_token=None):
    """schedule → (no model) → commit; a sequence that reaches its length gets token 7 appended."""
    batch = sched.schedule()
    assert_every_scheduled_token_has_its_own_slot(
        batch, sched.running + list(sched.waiting), sched.block_manager.block_size
    )
    samplers = [seq for i, seq in enumerate(batch.seqs) if batch.samples(i)]
    sched.commit(batch)
    for seq in samplers:
        if on_first_token is not None and seq.num_output_tokens == 0:
            on_first_token(seq)
        seq.append_token(7)
        if max_output is not None and seq.num_output_tokens >= max_output(seq):
            sched.finish(seq, FinishReason.LENGTH)
    return batch


def test_prefill_is_chunked_under_the_token_budget():
    sched = Scheduler(BlockManager(32, BS), max_num_seqs=8, max_num_batched_tokens=10)
    seq = make_seq(0, 25)
    sched.add(seq)
    assert run_step(sched).num_new_tokens == [10]
    assert run_step(sched).num_new_tokens == [10]
    batch = run_step(sched)
    assert batch.num_new_tokens == [5]
    assert seq.num_output_tokens == 1 and seq.num_computed_tokens == 25


def test_running_requests_go_first_then_waiting_fill_the_budget():
    sched = Scheduler(BlockManager(64, BS), max_num_seqs=8, max_num_batched_tokens=8)
    a, b = make_seq(0, 6, token=1), make_seq(1, 6, token=2)
    sched.add(a)
    run_step(sched)
    sched.add(b)
    batch = run_step(sched)
    assert batch.seqs == [a, b] and batch.num_new_tokens == [1, 6]


def test_running_sequences_are_capped():
    sched = Scheduler(BlockManager(64, BS), max_num_seqs=2, max_num_batched_tokens=100)
    seqs = [make_seq(i, 3) for i in range(3)]
    for seq in seqs:
        sched.add(seq)
    batch = run_step(sched)
    assert batch.seqs == seqs[:2] and sched.num_waiting == 1


def test_preempts_newest_when_out_of_blocks_and_recomputes_it_later():
    sched = Scheduler(BlockManager(4, BS, enable_prefix_caching=False), max_num_seqs=4, max_num_batched_tokens=100)
    old, new = make_seq(0, 4), make_seq(1, 4)
    sched.add(old)
    sched.add(new)
    run_step(sched)  # both prefill: 2 blocks used
    for _ in range(4):
        run_step(sched)  # both at 8 tokens: 4 blocks used
    assert sched.block_manager.num_free_blocks == 0
    batch = run_step(sched)  # old needs a third block: new is preempted
    assert batch.preempted == [new] and batch.seqs == [old]
    assert new.status is SequenceStatus.WAITING and new.block_ids == [] and new.num_computed_tokens == 0
    assert sched.num_preemptions == 1 and sched.waiting[0] is new
    sched.finish(old, FinishReason.STOP)
    batch = run_step(sched)
    # Recompute: the prompt plus every token generated so far, in one prefill.
    assert batch.seqs == [new] and batch.num_new_tokens == [9]
    assert new.num_computed_tokens == 9 and new.num_output_tokens == 6


def test_abort_frees_blocks_at_once_running_or_waiting():
    bm = BlockManager(8, BS)
    sched = Scheduler(bm, max_num_seqs=1, max_num_batched_tokens=100)
    running, waiting = make_seq(0, 9), make_seq(1, 9)
    sched.add(running)
    sched.add(waiting)
    run_step(sched)
    assert bm.num_used_blocks == 3
    sched.finish(running, FinishReason.ABORT)
    sched.finish(waiting, FinishReason.ABORT)
    assert bm.num_used_blocks == 0 and not sched.has_unfinished()
    assert running.finish_reason is FinishReason.ABORT


def test_waiting_request_reuses_cached_prefix():
    bm = BlockManager(16, BS)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=100)
    first = make_seq(0, 9)
    sched.add(first)
    run_step(sched)
    second = make_seq(1, 9)
    sched.add(second)
    batch = run_step(sched)
    assert batch.num_new_tokens == [1, 1] and second.num_cached_tokens == 8


@settings(max_examples=100, deadline=None)
@given(
    prompts=st.lists(st.integers(1, 20), min_size=1, max_size=12),
    outputs=st.lists(st.integers(1, 10), min_size=12, max_size=12),
    aborts=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 11)), max_size=6),
    forks=st.lists(st.integers(0, 3), min_size=12, max_size=12),
    num_blocks=st.integers(8, 24),
    max_num_seqs=st.integers(1, 6),
    budget=st.integers(1, 32),
    caching=st.booleans(),
)
def test_every_request_finishes_or_is_aborted_and_no_block_leaks(
    prompts, outputs, aborts, forks, num_blocks, max_num_seqs, budget, caching
):
    bm = BlockManager(num_blocks, BS, enable_prefix_caching=caching)
    sched = Scheduler(bm, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget)
    # Every sequence fits the pool on its own (the engine refuses longer requests), so all must finish.
    seqs = [make_seq(i, p, token=i % 2) for i, p in enumerate(prompts)]
    for seq in seqs:
        sched.add(seq)
    abort_at = {}
    for step, index in aborts:
        abort_at.setdefault(step, []).append(index)
    want = {seq.seq_id: min(outputs[seq.seq_id], num_blocks * BS - seq.num_prompt_tokens) for seq in seqs}
    parents = {seq.seq_id for seq in seqs}
    all_seqs = list(seqs)

    def fork_children(seq):
        # n > 1: a request's other choices join once its prompt is computed (as the engine does).
        if seq.seq_id not in parents:
            return
        parents.discard(seq.seq_id)
        for _ in range(forks[seq.seq_id]):
            child = Sequence(
                seq_id=len(all_seqs) + 100, request_id=seq.request_id, prompt_token_ids=list(seq.prompt_token_ids)
            )
            want[child.seq_id] = want[seq.seq_id]
            all_seqs.append(child)
            sched.add_forked(seq, child)

    for step in range(2_000):
        for index in abort_at.get(step, []):
            if index < len(seqs):
                for seq in all_seqs:  # a request's abort ends all its choices
                    if seq.request_id == seqs[index].request_id:
                        sched.finish(seq, FinishReason.ABORT)
        if not sched.has_unfinished():
            break
        batch = run_step(sched, max_output=lambda s: want[s.seq_id], on_first_token=fork_children)
        assert batch.num_batched_tokens <= budget and sched.num_running <= max_num_seqs
        assert not batch.is_empty or batch.preempted, "no progress while requests wait"
        assert all(not seq.block_ids for seq in sched.waiting), "a waiting sequence holds blocks"
        live = sched.running + list(sched.waiting)
        refs = {}
        for seq in live:
            for block_id in seq.block_ids:
                refs[block_id] = refs.get(block_id, 0) + 1
        assert all(bm.ref_count(b) == refs.get(b, 0) for b in range(num_blocks))
        assert bm.num_free_blocks + len(refs) == num_blocks
    assert not sched.has_unfinished()
    for seq in all_seqs:
        assert seq.is_finished
        if seq.finish_reason is FinishReason.LENGTH:
            assert seq.num_output_tokens == want[seq.seq_id]
    assert bm.num_free_blocks == num_blocks and bm.usage == 0
