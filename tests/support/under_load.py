"""Runs a command while CPU-bound busy loops run beside it, to check the suite holds on a busy machine.

    python tests/support/under_load.py [--loops 2] [--runs 1] -- bash tests/run.sh

Each busy loop is a separate process spinning in pure Python; they start before the command, are
stopped (and reaped) when it ends however it ends, and the exit status is the first failing run's.
Each run prints its result, wall time and the load average seen at its end.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import time


def _spin() -> None:
    while True:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loops", type=int, default=2, help="busy loops beside the command (default 2)")
    parser.add_argument("--runs", type=int, default=1, help="run the command this many times in a row (default 1)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    loops = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.loops)]
    for loop in loops:
        loop.start()
    print(f"[under_load] Started {args.loops} busy loops (pids {[p.pid for p in loops]})", file=sys.stderr, flush=True)
    status = 0
    try:
        for run in range(1, args.runs + 1):
            start = time.monotonic()
            rc = subprocess.call(command)
            minutes = (time.monotonic() - start) / 60
            load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
            print(
                f"[under_load] Run {run}/{args.runs} exited {rc} after {minutes:.1f} min (load average {load})",
                file=sys.stderr,
                flush=True,
            )
            status = status or rc
    finally:
        for loop in loops:
            loop.terminate()
        for loop in loops:
            loop.join()
        print(f"[under_load] Stopped {args.loops} busy loops", file=sys.stderr, flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
