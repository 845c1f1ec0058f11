"""Envelope: the fixed limits a compiled engine is built for (context, batch, dtype, parallelism, shape buckets)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

DTYPES = ("float32", "float16", "bfloat16")


class EnvelopeError(ValueError):
    """An envelope that cannot be built: bad limits or buckets outside them."""


def default_decode_buckets(max_batch_size: int) -> tuple[int, ...]:
    """Powers of two up to max_batch_size, then max_batch_size itself: 1, 2, 4, ..., max."""
    buckets, size = [], 1
    while size < max_batch_size:
        buckets.append(size)
        size *= 2
    return tuple(buckets + [max_batch_size])


def default_prefill_buckets(max_context_length: int) -> tuple[int, ...]:
    """Lengths 64, 256, 1024, ... below max_context_length, then the largest chunk: min(max_context, 2048)."""
    largest = min(max_context_length, 2048)
    buckets, size = [], 64
    while size < largest:
        buckets.append(size)
        size *= 4
    return tuple(buckets + [largest])


@dataclass(frozen=True)
class Envelope:
    max_context_length: int  # tokens per sequence, prompt plus completion
    max_batch_size: int  # sequences running at once: the static KV buffer's slots
    dtype: str = "float32"
    tensor_parallel_size: int = 1
    block_size: int = 16  # the scheduler's block granularity (the KV buffers are per slot)
    decode_buckets: tuple[int, ...] = field(default=())  # batch sizes with a decode graph
    prefill_buckets: tuple[int, ...] = field(default=())  # prompt chunk lengths with a prefill graph

    def __post_init__(self) -> None:
        if self.max_context_length < 2:
            raise EnvelopeError(f"--max-context-length must be at least 2, got {self.max_context_length}")
        if self.max_batch_size < 1:
            raise EnvelopeError(f"--max-batch-size must be at least 1, got {self.max_batch_size}")
        if self.dtype not in DTYPES:
            raise EnvelopeError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.tensor_parallel_size != 1:
            # Gap: the export has no tensor-parallel sharding yet; refuse rather than build a wrong engine.
            raise EnvelopeError(
                f"--tensor-parallel-size {self.tensor_parallel_size} is not supported by compiled "
                "engines yet (only 1); serve this model with the paged engine"
            )
        if self.block_size < 1:
            raise EnvelopeError(f"--block-size must be positive, got {self.block_size}")
        decode = tuple(sorted(set(self.decode_buckets))) or default_decode_buckets(self.max_batch_size)
        prefill = tuple(sorted(set(self.prefill_buckets))) or default_prefill_buckets(self.max_context_length)
        if decode[0] < 1 or decode[-1] != self.max_batch_size:
            raise EnvelopeError(
                f"--decode-buckets {_csv(decode)} must be positive and end at --max-batch-size {self.max_batch_size}"
            )
        if prefill[0] < 2 or prefill[-1] > self.max_context_length:
            raise EnvelopeError(
                f"--prefill-buckets {_csv(prefill)} must lie in [2, --max-context-length {self.max_context_length}]"
            )
        object.__setattr__(self, "decode_buckets", decode)
        object.__setattr__(self, "prefill_buckets", prefill)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["decode_buckets"], d["prefill_buckets"] = list(self.decode_buckets), list(self.prefill_buckets)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Envelope:
        return cls(
            **{**d, "decode_buckets": tuple(d["decode_buckets"]), "prefill_buckets": tuple(d["prefill_buckets"])}
        )


def parse_buckets(text: str) -> tuple[int, ...]:
    """ "1,4,8" -> (1, 4, 8); argparse type for the bucket flags."""
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a comma-separated list of integers") from None
    if not values:
        raise ValueError("a bucket list must name at least one size")
    return values


def bucket_for(buckets: tuple[int, ...], size: int) -> int | None:
    """The smallest bucket holding size, or None when size exceeds the largest."""
    for bucket in buckets:
        if bucket >= size:
            return bucket
    return None


def _csv(values) -> str:
    return ",".join(str(v) for v in values)
