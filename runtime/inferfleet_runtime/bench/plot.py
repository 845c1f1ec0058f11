"""A PNG summary of one serving benchmark: TTFT, TPOT and ITL histograms, and E2EL over the run (matplotlib)."""

from __future__ import annotations

from pathlib import Path

from .client import RequestResult
from .metrics import tpot


def write_plot(results: list[RequestResult], summary: dict, path: str | Path, title: str = "") -> None:
    """Raises ImportError (with how to install it) when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError("--plot needs matplotlib (pip install matplotlib, or the project's dev extra)") from None
    matplotlib.use("Agg")  # no display: render straight to the file
    import matplotlib.pyplot as plt

    done = [r for r in results if r.success]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), dpi=80)
    panels = [
        (axes[0][0], [r.ttft * 1000 for r in done], "TTFT (ms)"),
        (axes[0][1], [t * 1000 for r in done if (t := tpot(r)) is not None], "TPOT (ms)"),
        (axes[1][0], [gap * 1000 for r in done for gap in r.itl], "ITL (ms)"),
    ]
    for ax, values, label in panels:
        ax.hist(values, bins=30, color="tab:blue")
        ax.set_xlabel(label)
        ax.set_ylabel("requests" if label != "ITL (ms)" else "token gaps")
    ax = axes[1][1]
    ax.scatter([r.start for r in done], [r.latency * 1000 for r in done], s=12, color="tab:orange")
    ax.set_xlabel("request sent at (s)")
    ax.set_ylabel("E2EL (ms)")
    fig.suptitle(
        title
        or (
            f"{summary['completed']} requests, {summary['output_throughput']:.1f} output tok/s, "
            f"median TTFT {summary['ttft_ms']['median']:.0f} ms"
        )
    )
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
