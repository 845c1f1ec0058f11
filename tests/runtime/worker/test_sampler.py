"""Sampler: greedy, temperature, top-k, top-p, min-p, seeds, penalties, logprobs; SamplingParams validation."""

import pytest
import torch

from inferfleet_runtime.engine.sampling_params import SamplingParams
from inferfleet_runtime.engine.sequence import Sequence
from inferfleet_runtime.worker.sampler import Sampler

VOCAB = 50


def seq_with(params, prompt=(1, 2, 3), output=(), index=0):
    seq = Sequence(seq_id=0, request_id="r", prompt_token_ids=list(prompt), index=index, params=params)
    for t in output:
        seq.append_token(t)
    return seq


def logits_from_probs(probs):
    row = torch.full((VOCAB,), -1e9)
    row[: len(probs)] = torch.tensor(probs).log()
    return row


def draw(params, logits_row, num=200, seed=0):
    sampler = Sampler(torch.device("cpu"), seed=seed)
    seq = seq_with(params)
    return [sampler.sample(logits_row[None, :].clone(), [seq])[0][0] for _ in range(num)]


def test_greedy_takes_the_argmax_per_row():
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(0))
    seqs = [seq_with(SamplingParams(temperature=0)) for _ in range(4)]
    tokens = [t for t, _ in Sampler(torch.device("cpu")).sample(logits, seqs)]
    assert tokens == logits.argmax(dim=-1).tolist()


def test_greedy_takes_the_first_of_tied_maxima():
    logits = torch.zeros(2, 50_000)
    logits[0, [7, 40_000]] = 1.0  # a vocabulary past one vectorised chunk: the tie crosses chunks
    logits[1, [30_000, 9]] = 2.0
    seqs = [seq_with(SamplingParams(temperature=0)) for _ in range(2)]
    assert [t for t, _ in Sampler(torch.device("cpu")).sample(logits, seqs)] == [7, 9]


def test_top_k_one_is_greedy_even_at_high_temperature():
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(1))
    assert set(draw(SamplingParams(temperature=2.0, top_k=1), logits, num=30)) == {int(logits.argmax())}


def test_top_k_draws_only_from_the_k_most_likely():
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(2))
    top3 = set(logits.topk(3).indices.tolist())
    drawn = set(draw(SamplingParams(temperature=1.0, top_k=3), logits))
    assert drawn == top3


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    logits = logits_from_probs([0.5, 0.3, 0.15, 0.05])
    assert set(draw(SamplingParams(top_p=0.7), logits)) == {0, 1}
    assert set(draw(SamplingParams(top_p=0.5), logits)) == {0}


def test_min_p_drops_tokens_below_a_fraction_of_the_best():
    logits = logits_from_probs([0.5, 0.3, 0.2])
    assert set(draw(SamplingParams(min_p=0.5), logits)) == {0, 1}


def test_temperature_sampling_follows_the_distribution():
    logits = logits_from_probs([0.8, 0.2])
    drawn = draw(SamplingParams(temperature=1.0), logits, num=400)
    assert 0.7 < drawn.count(0) / len(drawn) < 0.9


def test_seeded_request_draws_the_same_tokens_whatever_it_is_batched_with():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(3, VOCAB, generator=gen)
    params = SamplingParams(temperature=1.0, seed=42)

    def tokens(rows, other_seed):
        sampler = Sampler(torch.device("cpu"), seed=other_seed)
        seqs = [seq_with(params)] + [seq_with(SamplingParams(temperature=1.0)) for _ in rows[1:]]
        return [sampler.sample(logits[rows], seqs)[0][0] for _ in range(10)]

    alone = tokens([0], other_seed=1)
    batched = tokens([0, 1, 2], other_seed=2)
    assert alone == batched
    other = [
        Sampler(torch.device("cpu")).sample(logits[[0]], [seq_with(SamplingParams(temperature=1.0, seed=7))])[0][0]
        for _ in range(10)
    ]
    assert len(set(alone)) > 1 and other != alone


def test_choices_of_a_seeded_request_differ():
    logits = torch.zeros(1, VOCAB)
    params = SamplingParams(temperature=1.0, seed=5, n=2)
    first, second = seq_with(params, index=0), seq_with(params, index=1)
    sampler = Sampler(torch.device("cpu"))
    a = [sampler.sample(logits, [first])[0][0] for _ in range(10)]
    b = [sampler.sample(logits, [second])[0][0] for _ in range(10)]
    assert a != b


def test_repetition_penalty_discourages_tokens_already_seen():
    logits = torch.zeros(1, VOCAB)
    logits[0, 3], logits[0, 4] = 2.0, 1.5
    seq = seq_with(SamplingParams(temperature=0, repetition_penalty=2.0), prompt=(3,))
    assert Sampler(torch.device("cpu")).sample(logits, [seq])[0][0] == 4


def test_frequency_and_presence_penalties_count_output_tokens_only():
    logits = torch.zeros(1, VOCAB)
    logits[0, 3], logits[0, 4] = 2.0, 1.5
    sampler = Sampler(torch.device("cpu"))
    in_prompt = seq_with(SamplingParams(temperature=0, frequency_penalty=1.0), prompt=(3, 3, 3))
    assert sampler.sample(logits, [in_prompt])[0][0] == 3
    frequent = seq_with(SamplingParams(temperature=0, frequency_penalty=0.3), prompt=(1,), output=(3, 3))
    assert sampler.sample(logits, [frequent])[0][0] == 4  # 2.0 - 0.6 < 1.5
    present = seq_with(SamplingParams(temperature=0, presence_penalty=0.6), prompt=(1,), output=(3,))
    assert sampler.sample(logits, [present])[0][0] == 4


def test_logprobs_are_the_models_log_softmax_with_top_alternatives_best_first():
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(4))
    seqs = [seq_with(SamplingParams(temperature=0, logprobs=3)), seq_with(SamplingParams(temperature=0))]
    (token, lp), (_, none) = Sampler(torch.device("cpu")).sample(logits, seqs)
    expected = torch.log_softmax(logits[0], dim=-1)
    assert none is None
    assert lp.token_id == token and lp.logprob == pytest.approx(expected[token].item(), abs=1e-6)
    assert [t for t, _ in lp.top] == expected.topk(3).indices.tolist()
    assert [v for _, v in lp.top] == pytest.approx(expected.topk(3).values.tolist(), abs=1e-6)


@pytest.mark.parametrize(
    "field, value",
    [
        ("temperature", -1.0),
        ("top_p", 0.0),
        ("top_k", 0),
        ("min_p", 1.5),
        ("n", 0),
        ("max_tokens", 0),
        ("logprobs", 21),
        ("presence_penalty", 3.0),
        ("repetition_penalty", 0.0),
        ("stop", [""]),
    ],
)
def test_invalid_sampling_params_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})
