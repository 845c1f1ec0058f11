"""`inferfleet-runtime bench compare`: this runtime against llama.cpp's `llama-server` on the same weights, the same
token-id prompts and the same concurrencies (non-streaming /v1/completions); a table with ratios, JSON and a plot.

Servers run one at a time (never both at once, so they do not share the CPU), each started fresh for every round;
round r sends the prompts of seed + r to both, so neither reuses KV cached from an earlier round. Without
llama-server (not on PATH and no --llama-server) only this runtime is measured, and the output says so.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx

from inferfleet_runtime import OMP_WAIT_POLICY_IS_DEFAULT

OURS, LLAMA = "inferfleet", "llama-server"
# `serve --quantization` -> the GGUF matrix type llama-server gets for the same weights (bench.gguf_export).
QUANTIZATION_GGUF = {"none": "F32", "int8": "Q8_0", "int4": "Q4_0"}
# Environment that changes the servers' speed, printed with their commands: OpenMP's (torch and this llama-server
# build both load libgomp), llama.cpp's own, and the form of our quantized matmuls (kernels/native.py).
SPEED_ENV_PREFIXES = ("OMP_", "GOMP_", "KMP_", "LLAMA_ARG_", "INFERFLEET_QUANTIZED_ACTIVATIONS")


@dataclass
class ServerSpec:
    name: str
    argv: list[str]  # with {port} where the port goes
    ready_path: str  # GET answering 200 once the model is loaded
    env: dict[str, str | None] = field(default_factory=dict)  # over this process's environment; None removes one


@dataclass
class LevelResult:
    concurrency: int
    output_tokens: int
    seconds: float
    p50_latency_s: float
    load_avg: float  # 1-minute load average when the level finished
    errors: list[str]

    @property
    def tok_s(self) -> float:
        return self.output_tokens / self.seconds if self.seconds else 0.0


REAL_MODEL = "smollm2"  # --model value naming the real demo model


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        metavar="DIR",
        default=None,
        help="Hugging Face Llama checkpoint, or `smollm2`: the real demo model's GGUF dequantized once into a "
        "float32 checkpoint in the cache (default: a random Llama of the issue's shape, hidden 512, 8 layers, "
        "8/4 heads, vocab 4096, float32, written once into the cache)",
    )
    parser.add_argument(
        "--llama-server",
        metavar="PATH",
        default=None,
        help="llama-server binary (default: llama-server on PATH; none: this runtime alone)",
    )
    parser.add_argument(
        "--gguf",
        metavar="FILE",
        default=None,
        help="GGUF of the same weights (default: written from --model with the gguf package, its matrices in "
        "the type --quantization matches)",
    )
    parser.add_argument(
        "--quantization",
        choices=sorted(QUANTIZATION_GGUF),
        default="none",
        help="serve this runtime with `--quantization` (weight-only int8 per channel, int4 group-wise) and "
        "llama-server on a GGUF of the matching type: none = F32, int8 = Q8_0, int4 = Q4_0 (default none)",
    )
    parser.add_argument("--concurrency", default="1,8,32", help="requests in flight, comma-separated")
    parser.add_argument("--num-prompts", type=_positive_int, default=64)
    parser.add_argument("--input-len", default="32:128", help="prompt tokens, N or LOW:HIGH")
    parser.add_argument("--output-len", type=_positive_int, default=64, help="new tokens per request (EOS ignored)")
    parser.add_argument("--rounds", type=_positive_int, default=3)
    parser.add_argument("--threads", type=_positive_int, default=2, help="llama-server -t (default 2)")
    parser.add_argument("--parallel", type=_positive_int, default=32, help="llama-server -np slots (default 32)")
    parser.add_argument("--serve-args", default="", help="extra flags for `inferfleet-runtime serve`, one string")
    parser.add_argument("--llama-server-args", default="", help="extra flags for llama-server, one string")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    parser.add_argument("--startup-timeout", type=float, default=300.0, help="seconds for a server to get ready")
    parser.add_argument("--result-json", metavar="FILE", default=None)
    parser.add_argument("--plot", metavar="FILE.png", default=None)


def run(args: argparse.Namespace) -> int:
    from .args import fail
    from .datasets import parse_range

    try:
        levels = sorted({int(x) for x in args.concurrency.split(",") if x.strip()})
        if not levels or levels[0] < 1:
            raise ValueError("--concurrency needs positive integers, e.g. 1,8,32")
        input_len = parse_range(args.input_len)
    except ValueError as exc:
        return fail(str(exc))
    if args.model == REAL_MODEL:
        model_dir = real_float_model()
    else:
        model_dir = Path(args.model) if args.model else default_model()
    if not (model_dir / "config.json").is_file():
        return fail(f"{model_dir} is not a checkpoint directory (no config.json)")
    alone = args.llama_server == "none"
    llama = None if alone else args.llama_server or shutil.which("llama-server")
    if args.llama_server and not alone and not (os.path.isfile(llama) and os.access(llama, os.X_OK)):
        return fail(f"--llama-server {llama} is not an executable file")
    serve_args = args.serve_args + ("" if args.quantization == "none" else f" --quantization {args.quantization}")
    specs = [ours_spec(model_dir, serve_args)]
    if llama:
        gguf = Path(args.gguf) if args.gguf else gguf_for(model_dir, QUANTIZATION_GGUF[args.quantization])
        specs.append(llama_spec(llama, gguf, args))
    else:
        why = "--llama-server none" if alone else "not found (not on PATH, no --llama-server)"
        print(f"llama-server: {why}: benchmarking inferfleet alone", flush=True)

    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    results: dict[str, list[list[LevelResult]]] = {spec.name: [] for spec in specs}
    for round_index in range(args.rounds):
        prompts = token_prompts(args.num_prompts, input_len, vocab, args.seed + round_index)
        for spec in specs:
            print(f"round {round_index + 1}/{args.rounds}: {spec.name} ...", flush=True)
            try:
                results[spec.name].append(measure(spec, prompts, levels, args))
            except RuntimeError as exc:
                return fail(str(exc), code=1)
    summary = summarize(results, levels)
    print(format_table(summary, specs, args))
    errors = sorted({e for rounds in results.values() for rnd in rounds for lvl in rnd for e in lvl.errors})
    for error in errors[:5]:
        print(f"error: {error}", file=sys.stderr)
    if args.result_json:
        config = {
            "model": str(model_dir),
            "servers": {s.name: command_line(s) for s in specs},
            "concurrency": levels,
            "num_prompts": args.num_prompts,
            "input_len": list(input_len),
            "output_len": args.output_len,
            "rounds": args.rounds,
            "seed": args.seed,
            "llama_server_found": bool(llama),
            "quantization": args.quantization,
            "cpu_count": os.cpu_count(),
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        raw = {
            name: [[vars(lvl) | {"tok_s": lvl.tok_s} for lvl in rnd] for rnd in rounds]
            for name, rounds in results.items()
        }
        Path(args.result_json).write_text(json.dumps({"config": config, "summary": summary, "rounds": raw}, indent=1))
    if args.plot:
        try:
            write_plot(summary, args.plot)
        except ImportError as exc:
            return fail(str(exc))
    return 1 if errors else 0


# -- inputs ------------------------------------------------------------------------------------------------------
def default_model() -> Path:
    """The issue's random Llama, written once under $INFERFLEET_CACHE/bench-models/ (atomic rename)."""
    from .random_model import Shape, write_random_llama

    return _cached_model("random-llama-h512-l8-v4096", lambda out: write_random_llama(out, Shape(), seed=0))


def real_float_model() -> Path:
    """The real demo model (SmolLM2-135M-Instruct, a Q4_1 GGUF) dequantized once into a float32 checkpoint under
    $INFERFLEET_CACHE/bench-models/: llama-server's F32 / Q8_0 / Q4_0 files and this runtime's `--quantization`
    are then made from the same float32 weights."""
    from inferfleet_runtime.demo.smollm2 import ensure_real_model

    from .gguf_export import write_float_checkpoint

    return _cached_model("smollm2-135m-instruct-f32", lambda out: write_float_checkpoint(ensure_real_model(), out))


def _cached_model(name: str, write) -> Path:
    root = Path(os.environ.get("INFERFLEET_CACHE") or Path.home() / ".cache" / "inferfleet") / "bench-models"
    out = root / name
    if not (out / "config.json").is_file():
        tmp = root / f".tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        write(tmp)
        try:
            tmp.rename(out)
        except OSError:  # another process finished first
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def gguf_for(model_dir: Path, qtype: str = "F32") -> Path:
    """model_dir's GGUF with its matrices in qtype (F32, Q8_0, Q4_0), written beside the checkpoint on first use."""
    from .gguf_export import write_gguf

    path = model_dir / f"model-{qtype.lower()}.gguf"
    if not path.is_file():
        tmp = path.with_suffix(f".tmp-{os.getpid()}")
        write_gguf(model_dir, tmp, qtype)
        tmp.rename(path)
    return path


def token_prompts(num: int, input_len: tuple[int, int], vocab_size: int, seed: int) -> list[list[int]]:
    """Random token ids (avoiding the first 16 ids, where the special tokens live) of lengths in input_len."""
    rng = random.Random(seed)
    low = min(16, vocab_size - 1)
    return [[rng.randrange(low, vocab_size) for _ in range(rng.randint(*input_len))] for _ in range(num)]


# -- servers -----------------------------------------------------------------------------------------------------
def ours_spec(model_dir: Path, extra: str) -> ServerSpec:
    argv = [
        sys.executable,
        "-m",
        "inferfleet_runtime.cli",
        "serve",
        "--model",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
        "--log-level",
        "warning",
        *extra.split(),
    ]
    return ServerSpec(OURS, argv, "/ready")


def llama_spec(binary: str, gguf: Path, args: argparse.Namespace) -> ServerSpec:
    # Each of the -np slots gets ctx / np tokens: enough for the longest prompt plus its output.
    per_slot = int(args.input_len.split(":")[-1]) + args.output_len + 16
    ctx = args.parallel * per_slot
    argv = [
        binary,
        "-m",
        str(gguf),
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
        "-np",
        str(args.parallel),
        "-cb",
        "-t",
        str(args.threads),
        "-c",
        str(ctx),
        *args.llama_server_args.split(),
    ]
    # This llama-server build loads libgomp too: it runs under the user's OpenMP settings, not this package's default.
    env = {"OMP_WAIT_POLICY": None} if OMP_WAIT_POLICY_IS_DEFAULT else {}
    return ServerSpec(LLAMA, argv, "/health", env)


def measure(spec: ServerSpec, prompts: list[list[int]], levels: list[int], args) -> list[LevelResult]:
    """Starts the server, warms it with one request, runs every level, stops it."""
    port = _free_port()
    argv = [a.replace("{port}", str(port)) for a in spec.argv]
    # The server's log goes to a file, never to a pipe nobody reads: a full pipe would block the server mid-run.
    with tempfile.TemporaryFile(mode="w+") as log:
        process = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=server_env(spec), start_new_session=True
        )
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(process, log, url + spec.ready_path, args.startup_timeout, spec.name)
            _warm_up(url, prompts[0][:8], args.startup_timeout, spec.name)
            return [asyncio.run(run_level(url, prompts, level, args.output_len, args.timeout)) for level in levels]
        finally:
            _stop(process)


def _wait_ready(process: subprocess.Popen, log, url: str, timeout: float, name: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"{name} exited with code {process.returncode} before it was ready: {log.read()[-600:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{name} was not ready after {timeout:.0f}s")


def _warm_up(url: str, prompt: list[int], timeout: float, name: str) -> None:
    """One short completion, retried while the server still answers 503 (loading) after its ready check."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            errors = asyncio.run(run_level(url, [prompt], 1, 2, timeout)).errors
        except httpx.HTTPStatusError as exc:  # /v1/models answering 503
            errors = [f"HTTP {exc.response.status_code}: {exc}"]
        if not errors:
            return
        if time.monotonic() > deadline or not errors[0].startswith("HTTP 503"):
            raise RuntimeError(f"{name} failed its warm-up request: {errors[0]}")
        time.sleep(0.2)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


# -- the client --------------------------------------------------------------------------------------------------
async def run_level(
    url: str, prompts: list[list[int]], concurrency: int, max_tokens: int, timeout: float
) -> LevelResult:
    """Sends every prompt, `concurrency` at a time, as a non-streaming greedy completion with ignore_eos."""
    semaphore = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), limits=limits) as client:
        model = await _model_id(client, url)

        async def one(prompt: list[int]) -> tuple[int, float, str]:
            body = {
                "model": model,
                "prompt": prompt,
                "max_tokens": max_tokens,
                "temperature": 0.0,
                "ignore_eos": True,
                "stream": False,
            }
            async with semaphore:
                sent = time.perf_counter()
                try:
                    response = await client.post(f"{url}/v1/completions", json=body)
                except httpx.HTTPError as exc:
                    return 0, 0.0, f"{type(exc).__name__}: {exc}"[:200]
                latency = time.perf_counter() - sent
            if response.status_code != 200:
                return 0, latency, f"HTTP {response.status_code}: {response.text[:200]}"
            usage = response.json().get("usage") or {}
            return int(usage.get("completion_tokens", 0)), latency, ""

        started = time.perf_counter()
        done = await asyncio.gather(*(one(p) for p in prompts))
        seconds = time.perf_counter() - started
    latencies = [lat for n, lat, err in done if not err]
    return LevelResult(
        concurrency,
        sum(n for n, _, _ in done),
        seconds,
        statistics.median(latencies) if latencies else 0.0,
        os.getloadavg()[0],
        [err for _, _, err in done if err],
    )


async def _model_id(client: httpx.AsyncClient, url: str) -> str:
    response = await client.get(f"{url}/v1/models")
    response.raise_for_status()
    return response.json()["data"][0]["id"]


# -- output ------------------------------------------------------------------------------------------------------
def summarize(results: dict[str, list[list[LevelResult]]], levels: list[int]) -> dict:
    """Per server and level: best and median tok/s over rounds, median p50 latency, load averages seen."""
    summary: dict = {"levels": {}}
    for i, level in enumerate(levels):
        entry = {}
        for name, rounds in results.items():
            runs = [rnd[i] for rnd in rounds]
            tok_s = [r.tok_s for r in runs]
            entry[name] = {
                "best_tok_s": max(tok_s),
                "median_tok_s": statistics.median(tok_s),
                "tok_s": tok_s,
                "p50_latency_s": statistics.median(r.p50_latency_s for r in runs),
                "load_avg": [r.load_avg for r in runs],
            }
        if LLAMA in entry:
            entry["ratio_best"] = entry[OURS]["best_tok_s"] / max(entry[LLAMA]["best_tok_s"], 1e-9)
            entry["ratio_median"] = entry[OURS]["median_tok_s"] / max(entry[LLAMA]["median_tok_s"], 1e-9)
        summary["levels"][str(level)] = entry
    return summary


def format_table(summary: dict, specs: list[ServerSpec], args) -> str:
    has_llama = any(s.name == LLAMA for s in specs)
    lines = [
        f"output tokens/s over {args.rounds} round(s), best / median; {args.num_prompts} prompts of "
        f"{args.input_len} tokens, {args.output_len} new tokens each (ignore_eos, greedy, non-streaming)"
    ]
    head = f"{'conc':>5} | {'inferfleet best/med':>21} | {'p50 lat':>8}"
    if has_llama:
        head += f" | {'llama-server best/med':>21} | {'p50 lat':>8} | {'ratio best/med':>14}"
    lines += [head + f" | {'load avg':>14}", "-" * len(head + " | load avg      ")]
    for level, entry in summary["levels"].items():
        ours = entry[OURS]
        row = f"{level:>5} | {ours['best_tok_s']:>10.1f} /{ours['median_tok_s']:>9.1f} | {ours['p50_latency_s']:>7.2f}s"
        loads = ours["load_avg"]
        if has_llama:
            theirs = entry[LLAMA]
            row += (
                f" | {theirs['best_tok_s']:>10.1f} /{theirs['median_tok_s']:>9.1f} | "
                f"{theirs['p50_latency_s']:>7.2f}s | {entry['ratio_best']:>6.2f} /{entry['ratio_median']:>6.2f}"
            )
            loads = loads + theirs["load_avg"]
        lines.append(row + f" | {min(loads):>5.1f}-{max(loads):<5.1f}")
    for spec in specs:
        lines.append(f"{spec.name}: {command_line(spec)}")
    if not has_llama:
        lines.append("llama-server: not run (not found)")
    return "\n".join(lines)


def server_env(spec: ServerSpec) -> dict[str, str]:
    return {k: v for k, v in {**os.environ, **spec.env}.items() if v is not None}


def command_line(spec: ServerSpec) -> str:
    """How the server was started, with the speed-related environment it ran under (inherited or its own)."""
    env = server_env(spec)
    settings = [f"{k}={env[k]}" for k in sorted(env) if k.startswith(SPEED_ENV_PREFIXES)]
    return " ".join([*settings, *spec.argv])


def write_plot(summary: dict, path: str) -> None:
    try:
        import matplotlib
    except ImportError:
        raise ImportError("--plot needs matplotlib (pip install matplotlib, or the project's dev extra)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = [int(x) for x in summary["levels"]]
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=80)
    names = [n for n in (OURS, LLAMA) if n in next(iter(summary["levels"].values()))]
    width = 0.8 / len(names)
    for k, name in enumerate(names):
        best = [summary["levels"][str(lv)][name]["best_tok_s"] for lv in levels]
        median = [summary["levels"][str(lv)][name]["median_tok_s"] for lv in levels]
        xs = [i + (k - (len(names) - 1) / 2) * width for i in range(len(levels))]
        ax.bar(xs, best, width, label=f"{name} (best)", alpha=0.85)
        ax.scatter(xs, median, color="black", s=14, zorder=3, label="median" if k == 0 else None)
    ax.set_xticks(range(len(levels)), [str(lv) for lv in levels])
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("output tokens/s")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _positive_int(text: str) -> int:
    from .args import positive_int as check

    return check(text)
