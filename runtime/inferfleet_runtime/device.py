"""Choice of the torch device the runtime runs on: CUDA (NVIDIA, or AMD through ROCm builds), Intel XPU, else CPU."""

from __future__ import annotations

import os

import torch


def pick_device(preferred: str | torch.device | None = None) -> torch.device:
    """The preferred device when given (checked to be usable), else the first accelerator present, else CPU."""
    if preferred is not None:
        device = torch.device(preferred)
        if not is_available(device):
            raise ValueError(f"device {str(device)!r} is not available on this machine")
        return device
    if torch.cuda.is_available():  # ROCm builds of torch report AMD GPUs as "cuda" too
        return torch.device("cuda")
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return torch.device("xpu")
    return torch.device("cpu")


def is_available(device: torch.device) -> bool:
    if device.type == "cpu":
        return True
    if device.type == "cuda":
        return torch.cuda.is_available() and (device.index is None or device.index < torch.cuda.device_count())
    if device.type == "xpu":
        return hasattr(torch, "xpu") and torch.xpu.is_available()
    return False


def vendor(device: torch.device) -> str:
    """ "nvidia", "amd", "intel" or "cpu": the GPU vendor behind a device (ROCm builds set torch.version.hip)."""
    if device.type == "cuda":
        return "amd" if getattr(torch.version, "hip", None) else "nvidia"
    if device.type == "xpu":
        return "intel"
    return "cpu"


def cpu_engine_threads() -> int:
    """Torch threads for an engine running on the CPU: every core this process may use.

    OpenMP workers that busy-wait while idle spin on the core the event loop needs for HTTP and SSE: on 2 cores that
    made a streamed request several times slower than the same engine offline. The package makes them sleep
    (OMP_WAIT_POLICY=PASSIVE, see __init__); when a user sets another wait policy, one core is left to the event
    loop instead. OMP_NUM_THREADS, when set, is the operator's choice and wins.
    """
    if os.environ.get("OMP_NUM_THREADS"):
        return int(os.environ["OMP_NUM_THREADS"])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE":
        return max(1, cores)
    return max(1, cores - 1)
