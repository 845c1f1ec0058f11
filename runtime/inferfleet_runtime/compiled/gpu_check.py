"""GPU check for compiled engines: build the built-in model per backend on this GPU, compare greedy tokens with
the paged engine, and print build seconds and per-token latency. Run on a GPU machine:

    python -m inferfleet_runtime.compiled.gpu_check [--backends tensorrt,aotinductor] [--out DIR]

Prints one `check backend=<b> ...` line per backend and exits 1 when any backend's tokens differ or it fails.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
from pathlib import Path

PROMPTS = [
    "Beautiful is better than",
    "Explicit is",
    "Simple is better than complex. Complex is better than",
    "Errors should never pass silently. Unless explicitly silenced. In the face of ambiguity,",
]
LENGTHS = [8, 12, 16, 20]


def compare_with_paged(model_dir: Path, engine_dir: Path, device: str) -> tuple[list, list]:
    """Greedy tokens of PROMPTS (one concurrent batch) from the compiled engine and from the paged engine."""
    from inferfleet_runtime.engine.config import EngineConfig
    from inferfleet_runtime.engine.llm_engine import LLMEngine
    from inferfleet_runtime.engine.sampling_params import SamplingParams

    from .runner import make_compiled_engine

    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in LENGTHS]
    compiled = make_compiled_engine(engine_dir, EngineConfig(device=device))
    paged = LLMEngine.from_model_dir(model_dir, EngineConfig(device=device, max_num_seqs=4))
    return (
        [o.outputs[0].token_ids for o in compiled.generate(PROMPTS, params)],
        [o.outputs[0].token_ids for o in paged.generate(PROMPTS, params)],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="tensorrt,aotinductor")
    parser.add_argument("--out", default=None, help="where to build (default: a temporary directory)")
    args = parser.parse_args(argv)
    import torch

    from inferfleet_runtime.cli import main as cli
    from inferfleet_runtime.demo.builtin_model import ensure_demo_model

    if not torch.cuda.is_available():
        print("check skipped: no GPU visible to torch", flush=True)
        return 2
    model_dir = ensure_demo_model()
    root = Path(args.out or tempfile.mkdtemp(prefix="inferfleet-gpu-check-"))
    failed = False
    for backend in args.backends.split(","):
        out = root / backend
        try:
            started = time.monotonic()
            code = cli(
                [
                    "compile",
                    "--model",
                    str(model_dir),
                    "--out",
                    str(out),
                    "--backend",
                    backend,
                    "--device",
                    "cuda",
                    "--max-context-length",
                    "64",
                    "--max-batch-size",
                    "4",
                    "--dtype",
                    "float32",
                    "--decode-buckets",
                    "1,4",
                    "--prefill-buckets",
                    "16",
                ]
            )
            if code != 0:
                print(f"check backend={backend} ok=false reason=compile-exit-{code}", flush=True)
                failed = True
                continue
            build_s = time.monotonic() - started
            compiled_tokens, paged_tokens = compare_with_paged(model_dir, out, "cuda")
            same = compiled_tokens == paged_tokens
            failed |= not same
            print(
                f"check backend={backend} ok={str(same).lower()} build_seconds={build_s:.1f} "
                f"gpu={torch.cuda.get_device_name()}",
                flush=True,
            )
        except Exception:
            traceback.print_exc()
            print(f"check backend={backend} ok=false reason=exception", flush=True)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
