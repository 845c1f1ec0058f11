"""Serving metrics from request results, as the field reports them (vLLM's serving benchmark):
TTFT, TPOT = (E2EL - TTFT) / (output_len - 1), ITL, E2EL in ms (mean, median, p90, p99, std),
request and token throughput, and goodput: requests per second meeting every given SLO."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np

from .client import RequestResult

PERCENTILES = (50, 90, 99)
SLO_METRICS = ("ttft", "tpot", "e2el")  # --goodput keys, values in ms


def parse_goodput(items: list[str]) -> dict[str, float]:
    """["ttft:500", "tpot:50"] -> {"ttft": 500.0, "tpot": 50.0} (milliseconds)."""
    slos = {}
    for item in items:
        key, sep, value = item.partition(":")
        if not sep or key not in SLO_METRICS:
            raise ValueError(f"--goodput {item!r}: expected KEY:MS with KEY one of {', '.join(SLO_METRICS)}")
        try:
            slos[key] = float(value)
        except ValueError:
            raise ValueError(f"--goodput {item!r}: {value!r} is not a number of milliseconds") from None
        if slos[key] <= 0:
            raise ValueError(f"--goodput {item!r}: the SLO must be positive")
    return slos


def tpot(result: RequestResult) -> float | None:
    """Seconds per output token after the first; None for a single-token output."""
    if result.output_len < 2:
        return None
    return (result.latency - result.ttft) / (result.output_len - 1)


def _stats(values_s: list[float]) -> dict[str, float]:
    ms = np.asarray(values_s, dtype=float) * 1000.0
    if ms.size == 0:
        return {"mean": 0.0, "median": 0.0, "std": 0.0, **{f"p{p}": 0.0 for p in PERCENTILES if p != 50}}
    out = {"mean": float(ms.mean()), "median": float(np.median(ms)), "std": float(ms.std())}
    out.update({f"p{p}": float(np.percentile(ms, p)) for p in PERCENTILES if p != 50})
    return out


def meets_slos(result: RequestResult, slos: dict[str, float]) -> bool:
    values_ms = {"ttft": result.ttft * 1000, "tpot": (tpot(result) or 0.0) * 1000, "e2el": result.latency * 1000}
    return all(values_ms[key] <= limit for key, limit in slos.items())


def summarize(results: list[RequestResult], duration_s: float, slos: dict[str, float] | None = None) -> dict:
    done = [r for r in results if r.success]
    total_input = sum(r.prompt_len for r in done)
    total_output = sum(r.output_len for r in done)
    summary = {
        "duration_s": duration_s,
        "num_requests": len(results),
        "completed": len(done),
        "failed": len(results) - len(done),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": len(done) / duration_s if duration_s > 0 else 0.0,
        "output_throughput": total_output / duration_s if duration_s > 0 else 0.0,
        "total_token_throughput": (total_input + total_output) / duration_s if duration_s > 0 else 0.0,
        "ttft_ms": _stats([r.ttft for r in done]),
        "tpot_ms": _stats([t for r in done if (t := tpot(r)) is not None]),
        "itl_ms": _stats([gap for r in done for gap in r.itl]),
        "e2el_ms": _stats([r.latency for r in done]),
    }
    if slos:
        num_good = sum(meets_slos(r, slos) for r in done)
        summary["goodput_slos_ms"] = dict(slos)
        summary["num_good_requests"] = num_good
        summary["goodput"] = num_good / duration_s if duration_s > 0 else 0.0  # requests/s
        summary["goodput_fraction"] = num_good / len(results) if results else 0.0
    return summary


def per_request(results: list[RequestResult]) -> dict[str, list]:
    """Column lists (one entry per request, in order) for the JSON file."""
    rows = [asdict(r) for r in results]
    return {key: [row[key] for row in rows] for key in rows[0]} if rows else {}


def format_summary(summary: dict) -> str:
    lines = ["=" * 20 + " Serving benchmark result " + "=" * 20]

    def row(label: str, value) -> None:
        lines.append(f"{label:<40}{value:>12.2f}" if isinstance(value, float) else f"{label:<40}{value:>12}")

    row("Successful requests:", summary["completed"])
    row("Failed requests:", summary["failed"])
    row("Benchmark duration (s):", summary["duration_s"])
    row("Total input tokens:", summary["total_input_tokens"])
    row("Total generated tokens:", summary["total_output_tokens"])
    row("Request throughput (req/s):", summary["request_throughput"])
    if "goodput" in summary:
        row("Request goodput (req/s):", summary["goodput"])
        row("Goodput fraction:", summary["goodput_fraction"])
    row("Output token throughput (tok/s):", summary["output_throughput"])
    row("Total token throughput (tok/s):", summary["total_token_throughput"])
    for key, title in (
        ("ttft_ms", "Time to First Token"),
        ("tpot_ms", "Time per Output Token (excl. 1st token)"),
        ("itl_ms", "Inter-token Latency"),
        ("e2el_ms", "End-to-end Latency"),
    ):
        lines.append(f"{'-' * 15} {title} {'-' * 15}")
        name = key.split("_")[0].upper()
        stats = summary[key]
        row(f"Mean {name} (ms):", stats["mean"])
        row(f"Median {name} (ms):", stats["median"])
        row(f"P90 {name} (ms):", stats["p90"])
        row(f"P99 {name} (ms):", stats["p99"])
    lines.append("=" * 66)
    return "\n".join(lines)
