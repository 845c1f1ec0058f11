"""Tensor-parallel serving processes. Rank 0 is the server: it owns the scheduler, the block manager and the
sampler, and starts one worker process per other rank (`python -m inferfleet_runtime.worker.tp_worker`). Each step rank 0
broadcasts the batch's inputs (token ids, positions, slot mapping, block tables, the rows whose logits are needed)
and every rank runs the forward on its part of the weights (layers.parallel); the all-reduces and the logits'
all-gather happen inside it. Backends: NCCL on CUDA (RCCL on ROCm builds of torch), gloo on a CPU.

A rank that exits ends the server: rank 0 watches its workers and exits non-zero naming the rank and its exit
code (also as the container's termination message); a worker dies with rank 0 (its stdin pipe from rank 0 closes) or when its
collective loses rank 0. The process group waits without a timeout: an idle server sends no step for hours.

A server that ends normally ends its ranks in order, before the interpreter finalizes: rank 0 broadcasts stop, each
rank waits until the backend's thread has let go of that broadcast's tensor, the workers leave the group and exit 0,
then rank 0 leaves it. (The wait matters: gloo's threads drop a collective's tensors just after it completes, and a
thread that needs the Python lock for that while the interpreter finalizes aborts the whole process.)

Every rank runs in the server's pod, so the ranks meet on loopback alone: the rendezvous store (whose clients may
read and write any key, unauthenticated) and the collectives' sockets (gloo's, NCCL's bootstrap) listen on
127.0.0.1, out of reach of anything else on the pod network. Multi-node tensor parallelism (ranks in several pods)
is not supported yet: it would need the pod network, and a shared secret to keep strangers out of the store.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from inferfleet_runtime.device import pick_device
from inferfleet_runtime.engine.config import EngineConfig
from inferfleet_runtime.layers.attention_backend import AttentionMetadata

log = logging.getLogger(__name__)

PROGRAM = "inferfleet-runtime serve"
NO_TIMEOUT = timedelta(days=365)
WATCH_INTERVAL_S = 0.2
STOP_TIMEOUT_S = 10.0  # for the stop broadcast, then for the workers to exit
SETTLE_TIMEOUT_S = 2.0  # for a backend's thread to drop a finished collective's tensor (NCCL's may keep it)
_STOP, _STEP = 0, 1
_HEADER = 8  # int64: command, tokens, sequences, block table width, max query len, max seq len, logit rows, unused
LOOPBACK = "127.0.0.1"
LOOPBACK_INTERFACE = "lo0" if sys.platform == "darwin" else "lo"


def rank_device(preferred: str | None, rank: int) -> torch.device:
    """The device of a rank: the accelerator after the preferred one's index by `rank`, or the CPU."""
    device = pick_device(preferred)
    if device.type in ("cuda", "xpu"):
        device = torch.device(device.type, (device.index or 0) + rank)
        pick_device(device)  # refuses a device this machine does not have, naming it
    return device


def backend_of(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def rendezvous(world: int, port: int | None = None) -> dist.TCPStore:
    """The store the ranks meet at, on loopback. Rank 0 (no port) listens on a port the kernel picks and holds it from
    then on, so no other process can take the port between its choice and its use; the other ranks connect to
    `port`."""
    if port is None:
        # TCPStore's own server listens on every interface (::) whatever host it is given: it gets a socket already
        # listening on loopback instead.
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind((LOOPBACK, 0))
        listener.listen()
        return dist.TCPStore(
            LOOPBACK, listener.getsockname()[1], world, is_master=True, timeout=NO_TIMEOUT, wait_for_workers=False,
            master_listen_fd=listener.detach(),
        )  # fmt: skip
    return dist.TCPStore(LOOPBACK, port, world, is_master=False, timeout=NO_TIMEOUT)


def init_group(rank: int, world: int, store: dist.TCPStore, device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # The collectives listen on loopback too. Unset, gloo listens on the address the host name resolves to (the pod's)
    # and NCCL's bootstrap on the first network interface; a value from the pod's environment is overridden, since
    # every rank is in this pod.
    os.environ["GLOO_SOCKET_IFNAME"] = LOOPBACK_INTERFACE
    os.environ["NCCL_SOCKET_IFNAME"] = LOOPBACK_INTERFACE
    dist.init_process_group(backend_of(device), store=store, rank=rank, world_size=world, timeout=NO_TIMEOUT)


def fatal(message: str) -> None:
    """Ends this process at once with `message` as its error (stderr and termination message), exit code 1."""
    from inferfleet_runtime.termination import fail

    fail(PROGRAM, message, 1)
    sys.stderr.flush()
    os._exit(1)


class Workers:
    """The worker processes of ranks 1 .. world-1, and the thread that ends the server when one of them exits."""

    def __init__(self, model_dir: Path, config: EngineConfig, port: int):
        spec = {"model_dir": str(model_dir), "config": dataclasses.asdict(config), "port": port}
        self.stopping = False
        self.device: torch.device | None = None  # rank 0's, once its group is up and its part loaded (ready())
        self.processes = {
            rank: subprocess.Popen(
                [sys.executable, "-m", "inferfleet_runtime.worker.tp_worker", json.dumps({**spec, "rank": rank})],
                stdin=subprocess.PIPE,  # never written: it closes when this process exits, which ends the worker
            )
            for rank in range(1, config.tensor_parallel_size)
        }
        atexit.register(self.stop)
        threading.Thread(target=self._watch, name="inferfleet-tp-watch", daemon=True).start()

    def _watch(self) -> None:
        while not self.stopping:
            for rank, process in self.processes.items():
                code = process.poll()
                if code is not None and not self.stopping:
                    self.stop()
                    fatal(f"tensor-parallel rank {rank} exited with code {code}; the server cannot go on without it")
            time.sleep(WATCH_INTERVAL_S)

    def ready(self, device: torch.device) -> None:
        """Rank 0 is in the group with its part loaded: from now on stop() ends the ranks in order."""
        self.device = device

    def stop(self) -> None:
        """Ends the workers: in order (stop broadcast, workers exit, rank 0 leaves the group) when every rank is up
        and answers within STOP_TIMEOUT_S, else by killing them (a rank that died or hangs cannot take part)."""
        if self.stopping:
            return
        self.stopping = True
        in_order = self.device is not None and all(p.poll() is None for p in self.processes.values())
        if in_order:
            in_order = _within(STOP_TIMEOUT_S, send_stop, self.device)
        deadline = time.monotonic() + (STOP_TIMEOUT_S if in_order else 0.0)
        for process in self.processes.values():
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                in_order = False
        if in_order:  # nobody is left in a collective: leaving cannot wait on a peer
            dist.destroy_process_group()


def _within(seconds: float, call, *args) -> bool:
    """Whether call(*args) returned within `seconds` (it runs on a daemon thread, left behind if it does not)."""
    done = threading.Event()

    def run() -> None:
        call(*args)
        done.set()

    threading.Thread(target=run, name="inferfleet-tp-stop", daemon=True).start()
    return done.wait(seconds)


def send_step(
    input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, last_rows: torch.Tensor
) -> None:
    """Rank 0: the step's inputs to every other rank (two broadcasts: a header, then one int64 payload)."""
    batch, width = meta.block_tables.shape
    header = [_STEP, input_ids.numel(), batch, width, meta.max_query_len, meta.max_seq_len, last_rows.numel(), 0]
    dist.broadcast(torch.tensor(header, dtype=torch.int64, device=input_ids.device), src=0)
    payload = torch.cat(
        [
            input_ids,
            positions,
            meta.slot_mapping,
            meta.block_tables.flatten().long(),
            meta.seq_lens.long(),
            meta.query_start_loc.long(),
            last_rows,
        ]  # fmt: skip
    )
    dist.broadcast(payload, src=0)


def send_stop(device: torch.device) -> None:
    header = torch.tensor([_STOP] + [0] * (_HEADER - 1), dtype=torch.int64, device=device)
    dist.broadcast(header, src=0)
    settle(header)


def settle(tensor: torch.Tensor, timeout_s: float = SETTLE_TIMEOUT_S) -> None:
    """Waits (GIL released, at most timeout_s) until the only reference to the tensor of a completed collective is
    the caller's, i.e. the backend's thread has dropped its own."""
    deadline = time.monotonic() + timeout_s
    while tensor._use_count() > 1 and time.monotonic() < deadline:
        time.sleep(0.001)


def receive_step(device: torch.device):
    """Ranks > 0: (input_ids, positions, meta, last_rows) of rank 0's next step, or None when it says stop."""
    header = torch.empty(_HEADER, dtype=torch.int64, device=device)
    dist.broadcast(header, src=0)
    command, tokens, batch, width, max_query_len, max_seq_len, rows, _ = header.tolist()
    if command == _STOP:
        settle(header)  # the last collective of this rank: its process may end next
        return None
    payload = torch.empty(3 * tokens + batch * width + 2 * batch + 1 + rows, dtype=torch.int64, device=device)
    dist.broadcast(payload, src=0)
    ids, positions, slots, tables, seq_lens, starts, last_rows = payload.split(
        [tokens, tokens, tokens, batch * width, batch, batch + 1, rows]
    )
    meta = AttentionMetadata(
        slot_mapping=slots,
        block_tables=tables.view(batch, width).int(),
        seq_lens=seq_lens.int(),
        query_start_loc=starts.int(),
        max_query_len=max_query_len,
        max_seq_len=max_seq_len,
    )
    return ids, positions, meta, last_rows
