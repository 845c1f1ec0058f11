"""A tensor-parallel worker: one rank > 0 of a paged server (distributed.Workers starts it with its spec as JSON)."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from pathlib import Path

import torch.distributed

from inferfleet_runtime.engine.config import EngineConfig
from inferfleet_runtime.worker.model_runner import ModelRunner
from inferfleet_runtime.worker.tensor_parallel import rendezvous

log = logging.getLogger(__name__)


def _die_with_parent() -> None:
    """Ends this worker when rank 0's process exits: its end of our stdin pipe closes then. (PR_SET_PDEATHSIG
    would fire when the starting *thread* exits, and rank 0 starts workers from a loading thread.)"""

    def wait_for_eof() -> None:
        # The raw descriptor, not sys.stdin's buffer: a daemon thread blocked inside the buffer holds its lock, and an
        # interpreter that finalizes (a worker told to stop) aborts on that lock.
        chunk = os.read(0, 4096)
        while chunk:
            chunk = os.read(0, 4096)
        os._exit(1)

    threading.Thread(target=wait_for_eof, name="inferfleet-tp-parent", daemon=True).start()


def worker_main(spec: dict) -> int:
    """A rank > 0: joins the group, loads its part of the model, then runs rank 0's steps until told to stop."""
    _die_with_parent()
    rank = spec["rank"]
    logging.basicConfig(level="INFO", format=f"%(asctime)s %(levelname)s rank {rank} %(name)s: %(message)s")
    config = EngineConfig(**spec["config"])
    try:
        store = rendezvous(config.tensor_parallel_size, spec["port"])
        runner = ModelRunner.for_rank(Path(spec["model_dir"]), config, rank, store)
        runner.follow()
        torch.distributed.destroy_process_group()  # rank 0 said stop: leave the group before the interpreter ends
    except Exception as exc:  # the watching rank 0 reports this exit; the line says why
        log.exception("Tensor-parallel rank %d failed", rank)
        print(f"inferfleet-runtime serve (rank {rank}): error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(worker_main(json.loads(sys.argv[1])))
