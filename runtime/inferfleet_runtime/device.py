"""Choice of the torch device the runtime runs on: CUDA (NVIDIA, or AMD through ROCm builds), Intel XPU, else CPU."""

from __future__ import annotations

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
