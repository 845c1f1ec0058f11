"""LLMEngine: requests in, token deltas out; step() = schedule → run → postprocess."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from pathlib import Path

from inferfleet_runtime.engine.block_manager import BlockManager
from inferfleet_runtime.engine.config import EngineConfig
from inferfleet_runtime.engine.detokenizer import IncrementalDetokenizer
from inferfleet_runtime.engine.runner_protocol import Runner, Sampled
from inferfleet_runtime.engine.sampling_params import SamplingParams
from inferfleet_runtime.engine.scheduler import ScheduledBatch, Scheduler
from inferfleet_runtime.engine.sequence import FinishReason, Logprob, Sequence


class StepError(RuntimeError):
    """Running one step's batch failed: the requests in it cannot go on; the engine's own state is intact (their
    blocks are still theirs until they are aborted), so the other requests can."""

    def __init__(self, request_ids: list[str], cause: BaseException):
        super().__init__(f"the engine failed on a batch of {len(request_ids)} request(s): {cause!r}")
        self.request_ids = request_ids
        self.cause = cause


class ContextLengthError(ValueError):
    """A request asks for more tokens than the context holds."""


@dataclass
class CompletionOutput:
    """One choice of a request: what changed since its previous output (or, from generate(), all of it)."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[Logprob] = field(default_factory=list)
    finish_reason: str | None = None

    def extend(self, delta: CompletionOutput) -> None:
        self.text += delta.text
        self.token_ids += delta.token_ids
        self.logprobs += delta.logprobs
        self.finish_reason = delta.finish_reason


@dataclass
class RequestOutput:
    request_id: str
    outputs: list[CompletionOutput]  # choices with news this step
    num_prompt_tokens: int
    num_cached_tokens: int
    finished: bool  # every choice has finished


@dataclass
class EngineStats:
    num_waiting: int = 0
    num_running: int = 0
    kv_cache_usage: float = 0.0
    num_preemptions: int = 0
    num_free_blocks: int = 0
    num_blocks: int = 0


@dataclass(eq=False)
class _Request:
    request_id: str
    params: SamplingParams
    seqs: list[Sequence]
    max_tokens: int
    num_pending_children: int  # n - 1 choices forked once the prompt is computed


class LLMEngine:
    def __init__(self, runner: Runner, config: EngineConfig):
        self.runner = runner
        self.config = config
        self.tokenizer = runner.tokenizer
        self.block_manager = BlockManager(runner.num_kv_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, config.max_num_batched_tokens)
        # A sequence must fit the whole pool on its own, or it could never finish.
        self.max_context_length = min(
            config.max_context_length or runner.max_position_embeddings,
            runner.max_position_embeddings,
            runner.num_kv_blocks * config.block_size,
        )
        self.eos_token_ids = set(runner.eos_token_ids)
        self._requests: dict[str, _Request] = {}
        self._seq_ids = itertools.count()
        self.num_aborted_requests = 0

    @classmethod
    def from_model_dir(
        cls, model_dir: str | Path, config: EngineConfig | None = None, model_name: str | None = None
    ) -> LLMEngine:
        from inferfleet_runtime.worker.model_runner import ModelRunner

        config = config or EngineConfig()
        return cls(ModelRunner.from_model_dir(model_dir, config, model_name), config)

    # -- requests -----------------------------------------------------------------------------------
    def encode(self, prompt: str | list[int]) -> list[int]:
        return list(prompt) if isinstance(prompt, list) else self.tokenizer.encode(prompt)

    def check_length(self, num_prompt_tokens: int, max_tokens: int | None) -> int:
        """The request's max_tokens (resolved when None); ContextLengthError when it does not fit."""
        if num_prompt_tokens == 0:
            raise ValueError("the prompt is empty")
        if max_tokens is None:
            if num_prompt_tokens >= self.max_context_length:
                raise ContextLengthError(
                    f"This model's maximum context length is {self.max_context_length} tokens. However, your prompt "
                    f"has {num_prompt_tokens} tokens, leaving no room for the completion."
                )
            return self.max_context_length - num_prompt_tokens
        if num_prompt_tokens + max_tokens > self.max_context_length:
            raise ContextLengthError(
                f"This model's maximum context length is {self.max_context_length} tokens. However, you requested "
                f"{num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in the prompt, {max_tokens} in "
                f"the completion). Please reduce the prompt or max_tokens."
            )
        return max_tokens

    def add_request(
        self, request_id: str, prompt: str | list[int], params: SamplingParams, arrival_time: float | None = None
    ) -> None:
        if request_id in self._requests:
            raise ValueError(f"request {request_id!r} already exists")
        prompt_ids = self.encode(prompt)
        max_tokens = self.check_length(len(prompt_ids), params.max_tokens)
        parent = self._new_seq(request_id, prompt_ids, params, 0, arrival_time or time.monotonic())
        self._requests[request_id] = _Request(request_id, params, [parent], max_tokens, params.n - 1)
        self.scheduler.add(parent)

    def abort_request(self, request_id: str) -> bool:
        """Ends a request at once and frees its blocks; False when it is unknown or already finished."""
        request = self._requests.pop(request_id, None)
        if request is None:
            return False
        for seq in request.seqs:
            self.scheduler.finish(seq, FinishReason.ABORT)
        self.num_aborted_requests += 1
        return True

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    @property
    def num_requests(self) -> int:
        return len(self._requests)

    def stats(self) -> EngineStats:
        bm = self.block_manager
        return EngineStats(
            self.scheduler.num_waiting,
            self.scheduler.num_running,
            bm.usage,
            self.scheduler.num_preemptions,
            bm.num_free_blocks,
            bm.num_blocks,
        )

    # -- the loop -----------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        batch = self.scheduler.schedule()
        try:
            sampled = self.runner.execute(batch)
        except Exception as exc:  # the model or a kernel failed on this batch; the scheduler has not committed it
            raise StepError(list(dict.fromkeys(seq.request_id for seq in batch.seqs)), exc) from exc
        return self._postprocess(batch, sampled)

    def generate(
        self, prompts: list[str | list[int]], params: SamplingParams | list[SamplingParams]
    ) -> list[RequestOutput]:
        """Runs prompts to completion (offline use, benchmarks): one RequestOutput with whole choices each."""
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        base = next(self._seq_ids)
        ids = [f"generate-{base}-{i}" for i in range(len(prompts))]
        results = {}
        for request_id, prompt, p in zip(ids, prompts, params_list):
            self.add_request(request_id, prompt, p)
            results[request_id] = None
        choices: dict[str, dict[int, CompletionOutput]] = {request_id: {} for request_id in ids}
        while any(results[request_id] is None for request_id in ids):
            for out in self.step():
                for delta in out.outputs:
                    choices[out.request_id].setdefault(delta.index, CompletionOutput(delta.index)).extend(delta)
                if out.finished:
                    whole = [choices[out.request_id][i] for i in sorted(choices[out.request_id])]
                    results[out.request_id] = RequestOutput(
                        out.request_id, whole, out.num_prompt_tokens, out.num_cached_tokens, True
                    )
        return [results[request_id] for request_id in ids]

    # -- postprocess --------------------------------------------------------------------------------
    def _postprocess(self, batch: ScheduledBatch, sampled: list[Sampled | None]) -> list[RequestOutput]:
        self.scheduler.commit(batch)
        changed: dict[str, tuple[_Request, list[Sequence]]] = {}
        requests = self._requests
        check_finished = self._check_finished
        for seq, sample in zip(batch.seqs, sampled):
            if sample is None:
                continue
            request_id = seq.request_id
            request = requests[request_id]
            if request.num_pending_children and seq is request.seqs[0]:
                self._fork_children(request)
            token_id, logprob = sample
            seq.token_ids.append(token_id)
            if logprob is not None:
                seq.logprobs.append(logprob)
            check_finished(seq, request, token_id)
            entry = changed.get(request_id)
            if entry is None:
                changed[request_id] = (request, [seq])
            else:
                entry[1].append(seq)
        outputs = []
        delta = self._delta
        for request_id, (request, seqs) in changed.items():
            if len(request.seqs) == 1:  # n == 1 (children are forked before this loop)
                finished = seqs[0].is_finished and not request.num_pending_children
            else:
                finished = all(s.is_finished for s in request.seqs) and not request.num_pending_children
            if finished:
                del requests[request_id]
            parent = request.seqs[0]
            outputs.append(
                RequestOutput(
                    request_id,
                    [delta(s) for s in seqs],
                    len(parent.prompt_token_ids),
                    parent.num_cached_tokens,
                    finished,
                )
            )
        return outputs

    def _new_seq(
        self, request_id: str, prompt_ids: list[int], params: SamplingParams, index: int, arrival_time: float
    ) -> Sequence:
        seq = Sequence(
            next(self._seq_ids), request_id, list(prompt_ids), index=index, params=params, arrival_time=arrival_time
        )
        seq.detokenizer = IncrementalDetokenizer(self.tokenizer, prompt_ids, params.skip_special_tokens)
        return seq

    def _fork_children(self, request: _Request) -> None:
        # The parent's prompt is computed: the other choices share its full blocks instead of recomputing.
        parent = request.seqs[0]
        children = [
            self._new_seq(request.request_id, parent.prompt_token_ids, request.params, i, parent.arrival_time)
            for i in range(1, request.params.n)
        ]
        for child in children:
            self.scheduler.add_forked(parent, child)
        # A runner that keeps K/V per sequence (compiled slots) copies the shared prompt now: the parent may finish on
        # this very token and give its K/V up before a child first runs.
        fork = getattr(self.runner, "fork", None)
        if fork is not None:
            fork(parent, children)
        request.seqs.extend(children)
        request.num_pending_children = 0

    def _check_finished(self, seq: Sequence, request: _Request, token_id: int) -> None:
        params = request.params
        reason = None
        num_held_chars = len(seq.output_text) - seq.num_stable_chars  # a possible start of a stop string
        if token_id in params.stop_token_ids or (not params.ignore_eos and token_id in self.eos_token_ids):
            reason = FinishReason.STOP  # the stop token's text is not part of the output
        else:
            delta = seq.detokenizer.add(token_id)
            if delta:
                seq.output_text += delta
                if params.stop:
                    start = stop_window_start(len(seq.output_text), len(delta), num_held_chars)
                    stop_at, num_held_chars = match_stops(seq.output_text[start:], len(delta), params.stop)
                    if stop_at is not None:
                        seq.output_text = seq.output_text[: start + stop_at]
                        reason = FinishReason.STOP
        num_tokens = len(seq.token_ids)
        if reason is None and (
            num_tokens - len(seq.prompt_token_ids) >= request.max_tokens or num_tokens >= self.max_context_length
        ):
            reason = FinishReason.LENGTH
            seq.output_text += seq.detokenizer.flush()
        if reason is None:
            seq.num_stable_chars = len(seq.output_text) - num_held_chars
            return
        seq.num_stable_chars = len(seq.output_text)
        self.scheduler.finish(seq, reason)

    def _delta(self, seq: Sequence) -> CompletionOutput:
        num_stable = seq.num_stable_chars
        num_sent = seq.num_sent_chars
        text = seq.output_text[num_sent:num_stable] if num_stable > num_sent else ""
        if num_stable > num_sent:
            seq.num_sent_chars = num_stable
        token_ids = seq.token_ids
        num_output = len(token_ids) - len(seq.prompt_token_ids)
        num_sent_tokens = seq.num_sent_tokens
        tokens = token_ids[len(token_ids) - num_output + num_sent_tokens :]
        logprobs = seq.logprobs[num_sent_tokens:] if seq.logprobs else []
        seq.num_sent_tokens = num_output
        reason = seq.finish_reason
        return CompletionOutput(seq.index, text, tokens, logprobs, reason.value if reason is not None else None)


def stop_window_start(num_chars: int, num_new_chars: int, num_held_chars: int) -> int:
    """Where a step's stop search begins in a text of num_chars: at the characters held back before the
    num_new_chars just added (the longest end of the previous text that could grow into a stop string, so at most
    the longest stop string less one). A stop string the new characters complete begins no earlier: the previous
    text held no whole one, and its part before them is such an end. Each step reads this window, not the text."""
    return num_chars - num_new_chars - num_held_chars


def match_stops(window: str, num_new_chars: int, stops: list[str]) -> tuple[int | None, int]:
    """(where in window the stop string that the last num_new_chars complete and that begins first begins, or None;
    the length of the longest end of window that could still grow into a stop string, 0 when one was found).
    Time: each stop string once over the window, then its first character's places in the window's end."""
    found = None
    num_chars = len(window)
    for stop in stops:
        index = window.find(stop, max(0, num_chars - num_new_chars - len(stop) + 1))
        if index != -1 and (found is None or index < found):
            found = index
    if found is not None:
        return found, 0
    num_held = 0
    for stop in stops:
        # The ends of window that are proper prefixes of stop begin with stop[0]: try those places, longest first.
        start = window.find(stop[0], max(0, num_chars - len(stop) + 1))
        while start != -1 and num_chars - start > num_held:
            if stop.startswith(window[start:]):
                num_held = num_chars - start
                break
            start = window.find(stop[0], start + 1)
    return None, num_held
