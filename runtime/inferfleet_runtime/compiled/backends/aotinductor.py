"""AOTInductor backend: torch.export.export of the step, compiled to a .pt2 package of C++/Triton code.

Runs wherever torch's Inductor does: on the CPU (needs g++ with OpenMP) and on CUDA/ROCm GPUs. The
package is tied to the device type it was compiled for and to the torch version that built it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from . import BackendUnavailable

NAME = "aotinductor"
FILE_SUFFIX = ".pt2"


def check_available(device: torch.device) -> None:
    if device.type == "cpu" and shutil.which("g++") is None and shutil.which("c++") is None:
        raise BackendUnavailable("the aotinductor backend needs a C++ compiler (g++) on the CPU; install g++")


def build(step: torch.nn.Module, example_inputs: tuple, path: Path) -> None:
    """Exports step at exactly the example inputs' shapes (no dynamic dims: one graph per bucket)."""
    with torch.no_grad():
        program = torch.export.export(step, example_inputs)
        # The wrapper only sequences kernel calls; optimising it costs compile time and buys nothing per token.
        with torch._inductor.config.patch({"aot_inductor.compile_wrapper_opt_level": "O0"}):
            torch._inductor.aoti_compile_and_package(program, package_path=str(path))


def load(path: Path, device: torch.device):
    index = device.index if device.index is not None else -1
    # One engine thread calls the graphs, so the runner-side locking is not needed.
    return torch._inductor.aoti_load_package(str(path), run_single_threaded=True, device_index=index)
