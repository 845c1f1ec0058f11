"""Sampler: logits of a batch → next tokens and logprobs.

Order per row: logprobs are taken from the model's raw distribution; then repetition, frequency and
presence penalties; then greedy argmax, or temperature → top-k → top-p → min-p → a draw. A request with
a seed draws from its own torch.Generator, so its output does not depend on what it was batched with.
"""

from __future__ import annotations

import torch

from inferfleet_runtime.engine.sampling_params import SamplingParams
from inferfleet_runtime.engine.sequence import Logprob, Sequence


class Sampler:
    def __init__(self, device: torch.device, seed: int = 0):
        self.device = device
        self.generator = torch.Generator(device=device)  # for requests without a seed
        self.generator.manual_seed(seed)

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[tuple[int, Logprob | None]]:
        # logits: [num_seqs, vocab] float32, row i for seqs[i]
        params: list[SamplingParams] = [seq.params for seq in seqs]
        num_top = max((p.logprobs for p in params if p.logprobs is not None), default=None)
        raw_logprobs = torch.log_softmax(logits, dim=-1) if num_top is not None else None
        penalised = [i for i, p in enumerate(params) if p.has_penalties]
        if penalised:  # penalties edit rows in place; the caller's logits stay as the model gave them
            logits = logits.clone()
            for i in penalised:
                _apply_penalties(logits[i], seqs[i], params[i])
        token_ids = torch.max(logits, dim=-1).indices  # argmax's answer (first maximum), faster on a CPU
        random_rows = [i for i, p in enumerate(params) if not p.is_greedy]
        if random_rows:
            token_ids[random_rows] = self._draw(logits[random_rows], [seqs[i] for i in random_rows])
        chosen = token_ids.tolist()
        if raw_logprobs is None:
            return [(token_id, None) for token_id in chosen]
        chosen_lp = raw_logprobs.gather(1, token_ids[:, None])[:, 0].tolist()
        top_lp, top_ids = raw_logprobs.topk(num_top, dim=-1) if num_top else (None, None)
        top_lp = top_lp.tolist() if num_top else None
        top_ids = top_ids.tolist() if num_top else None
        results = []
        for i, (token_id, p) in enumerate(zip(chosen, params)):
            if p.logprobs is None:
                results.append((token_id, None))
                continue
            top = tuple(zip(top_ids[i][: p.logprobs], top_lp[i][: p.logprobs])) if p.logprobs else ()
            results.append((token_id, Logprob(token_id, chosen_lp[i], top)))
        return results

    def _draw(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        # logits: [num_rows, vocab]
        params = [seq.params for seq in seqs]
        vocab = logits.shape[-1]
        temperature = torch.tensor([p.temperature for p in params], device=logits.device)
        logits = logits / temperature[:, None]
        if any(p.top_k is not None or p.top_p < 1 for p in params):
            top_k = torch.tensor([min(p.top_k or vocab, vocab) for p in params], device=logits.device)
            top_p = torch.tensor([p.top_p for p in params], device=logits.device)
            logits = _top_k_top_p(logits, top_k, top_p)
        if any(p.min_p > 0 for p in params):
            min_p = torch.tensor([p.min_p for p in params], device=logits.device)
            probs = torch.softmax(logits, dim=-1)
            logits = logits.masked_fill(probs < min_p[:, None] * probs.max(dim=-1, keepdim=True).values, -torch.inf)
        probs = torch.softmax(logits, dim=-1)
        # argmax(p / E) with E ~ Exp(1) draws from p; each seeded row uses its own generator.
        noise = torch.empty_like(probs)
        for i, seq in enumerate(seqs):
            generator = self.generator
            if seq.params.seed is not None:
                if seq.generator is None:
                    seq.generator = torch.Generator(device=logits.device)
                    seq.generator.manual_seed(seq.params.seed_for(seq.index))
                generator = seq.generator
            noise[i].exponential_(generator=generator)
        return (probs / noise).argmax(dim=-1)


def _top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    # logits: [num_rows, vocab]; top_k: [num_rows] int in 1..vocab; top_p: [num_rows] in (0, 1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(logits.shape[-1], device=logits.device)
    cut = ranks[None, :] >= top_k[:, None]
    sorted_logits = sorted_logits.masked_fill(cut, -torch.inf)
    probs = torch.softmax(sorted_logits, dim=-1)
    # Keep the smallest prefix whose mass reaches top_p (the token crossing the line stays).
    cut |= (probs.cumsum(dim=-1) - probs) >= top_p[:, None]
    sorted_logits = sorted_logits.masked_fill(cut, -torch.inf)
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def _apply_penalties(logits: torch.Tensor, seq: Sequence, p: SamplingParams) -> None:
    # logits: [vocab], modified in place. Repetition (CTRL/HF) over prompt and output; frequency and
    # presence (OpenAI) over the output only.
    if p.repetition_penalty != 1:
        seen = torch.tensor(sorted(set(seq.token_ids)), dtype=torch.int64, device=logits.device)
        values = logits[seen]
        logits[seen] = torch.where(values > 0, values / p.repetition_penalty, values * p.repetition_penalty)
    if (p.frequency_penalty or p.presence_penalty) and seq.num_output_tokens:
        output = torch.tensor(seq.output_token_ids, dtype=torch.int64, device=logits.device)
        counts = torch.bincount(output, minlength=logits.shape[-1])[: logits.shape[-1]].to(logits.dtype)
        logits -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)
