"""`inferfleet-runtime bench serve`: a serving benchmark client for any OpenAI-compatible server (streaming
completions; TTFT, TPOT, ITL, E2EL, throughput, goodput; JSON and PNG output); `bench compare`: this runtime
against llama.cpp's llama-server (see compare.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from datetime import UTC, datetime

from .args import fail, positive_int
from .datasets import parse_range


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from . import compare

    sub = parser.add_subparsers(dest="bench_command", metavar="{serve,compare}", required=True)
    compare.add_arguments(
        sub.add_parser(
            "compare",
            help="this runtime against llama-server on the same model and prompts",
            description="Starts this runtime (and llama-server when found) on the same model, sends the same token-id "
            "prompts at several concurrencies and prints output tokens/s with ratios.",
        )
    )
    serve = sub.add_parser(
        "serve",
        help="benchmark a running OpenAI-compatible server",
        description="Sends streaming completions at a request rate and reports latency metrics.",
    )
    serve.add_argument("--url", required=True, help="the server's base URL, e.g. http://127.0.0.1:8000")
    serve.add_argument("--model", default=None, help="model id to request (default: the first in /v1/models)")
    serve.add_argument("--dataset", choices=("random", "sharegpt"), default="random")
    serve.add_argument("--dataset-path", default=None, help="ShareGPT-format JSON file (for --dataset sharegpt)")
    serve.add_argument("--num-prompts", type=positive_int, default=100, help="requests to send")
    serve.add_argument(
        "--random-input-len",
        type=_range,
        default=(32, 32),
        metavar="N|LOW:HIGH",
        help="prompt length range in tokens for --dataset random (default 32)",
    )
    serve.add_argument(
        "--random-output-len",
        type=_range,
        default=(32, 32),
        metavar="N|LOW:HIGH",
        help="max_tokens range for --dataset random (default 32)",
    )
    serve.add_argument(
        "--sharegpt-output-len",
        type=positive_int,
        default=None,
        help="max_tokens for every ShareGPT request (default: the reply's length)",
    )
    serve.add_argument(
        "--tokenizer",
        metavar="DIR",
        default=None,
        help="count tokens with this model directory's tokenizer (default: approximate by words)",
    )
    serve.add_argument(
        "--request-rate", type=float, default=float("inf"), help="requests per second (default inf: all at once)"
    )
    serve.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        help="gamma shape of the arrival gaps: 1 is a Poisson process, lower is burstier",
    )
    serve.add_argument("--max-concurrency", type=positive_int, default=None, help="requests in flight at most")
    serve.add_argument(
        "--goodput",
        nargs="+",
        default=[],
        metavar="KEY:MS",
        help="SLOs for goodput, e.g. ttft:500 tpot:50 (keys ttft, tpot, e2el; milliseconds)",
    )
    serve.add_argument("--temperature", type=float, default=0.0)
    serve.add_argument(
        "--no-ignore-eos",
        dest="ignore_eos",
        action="store_false",
        help="let requests stop at end-of-sequence (default: generate max_tokens each)",
    )
    serve.add_argument("--seed", type=int, default=0, help="seeds prompts, sampling order and arrivals")
    serve.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    serve.add_argument(
        "--api-key",
        default=os.environ.get("INFERFLEET_API_KEY"),
        help="sent as 'Authorization: Bearer KEY' (default: $INFERFLEET_API_KEY)",
    )
    serve.add_argument("--result-json", metavar="FILE", default=None, help="write metrics and per-request data")
    serve.add_argument("--plot", metavar="FILE.png", default=None, help="write a PNG of the latency distributions")
    serve.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    if args.bench_command == "serve":
        return serve(args)
    if args.bench_command == "compare":
        from .compare import run as compare

        return compare(args)
    return fail(f"unknown bench command {args.bench_command!r}")


def serve(args: argparse.Namespace) -> int:
    from .arrivals import arrival_offsets
    from .client import run_requests, served_model
    from .metrics import format_summary, parse_goodput, per_request, summarize

    try:
        slos = parse_goodput(args.goodput)
        samples = _samples(args)
        offsets = arrival_offsets(len(samples), args.request_rate, args.burstiness, args.seed)
    except ValueError as exc:
        return fail(str(exc))
    try:
        model = args.model or asyncio.run(_model(args.url, served_model, args.api_key))
    except Exception as exc:  # unreachable server, not OpenAI-compatible: one line, not a trace
        return fail(f"cannot list models at {args.url}: {type(exc).__name__}: {exc}", code=1)

    progress = None
    if args.progress:
        from tqdm import tqdm

        progress = tqdm(total=len(samples), desc="requests", unit="req", file=sys.stderr)
    try:
        results, duration = asyncio.run(
            run_requests(
                args.url,
                model,
                samples,
                offsets,
                args.max_concurrency,
                args.ignore_eos,
                args.temperature,
                args.timeout,
                progress,
                args.api_key,
            )
        )
    finally:
        if progress is not None:
            progress.close()
    summary = summarize(results, duration, slos)
    print(format_summary(summary))
    errors = sorted({r.error for r in results if r.error})
    for error in errors[:5]:
        print(f"error: {error}", file=sys.stderr)
    if args.result_json:
        config = {
            "url": args.url,
            "model": model,
            "dataset": args.dataset,
            "dataset_path": args.dataset_path,
            "num_prompts": len(samples),
            "request_rate": _json_rate(args.request_rate),
            "burstiness": args.burstiness,
            "max_concurrency": args.max_concurrency,
            "seed": args.seed,
            "tokenizer": args.tokenizer,
            "ignore_eos": args.ignore_eos,
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        with open(args.result_json, "w") as f:
            json.dump({"config": config, **summary, "requests": per_request(results)}, f, indent=1)
    if args.plot:
        from .plot import write_plot

        try:
            write_plot(results, summary, args.plot)
        except ImportError as exc:
            return fail(str(exc))
    return 0 if summary["completed"] else 1


def _samples(args: argparse.Namespace):
    from .datasets import random_requests, sharegpt_requests, token_counter, word_count

    count = word_count
    if args.tokenizer:
        from inferfleet_runtime.checkpoints.tokenizer import Tokenizer

        try:
            count = token_counter(Tokenizer.from_dir(args.tokenizer))
        except Exception as exc:
            raise ValueError(f"cannot load a tokenizer from {args.tokenizer}: {exc}") from None
    if args.dataset == "sharegpt":
        if not args.dataset_path:
            raise ValueError("--dataset sharegpt needs --dataset-path FILE")
        return sharegpt_requests(args.dataset_path, args.num_prompts, args.seed, count, args.sharegpt_output_len)
    return random_requests(args.num_prompts, args.random_input_len, args.random_output_len, args.seed, count)


async def _model(url: str, served_model, api_key: str | None = None) -> str:
    import httpx

    from .client import bearer

    async with httpx.AsyncClient(timeout=30, headers=bearer(api_key)) as client:
        return await served_model(client, url)


def _json_rate(rate: float):
    return "inf" if rate == float("inf") else rate


def _range(text: str) -> tuple[int, int]:
    try:
        return parse_range(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
