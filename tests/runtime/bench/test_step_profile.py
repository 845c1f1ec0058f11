"""`bench.step_profile` times decode steps and lists each kernel op under its backend's name."""

from __future__ import annotations

import re

import torch

from inferfleet_runtime.bench import step_profile
from inferfleet_runtime.kernels import native


def test_step_profile_lists_the_kernel_ops_of_the_backend_in_use(demo_model_dir, capsys):
    threads = torch.get_num_threads()
    try:
        assert step_profile.main(["--model", str(demo_model_dir), "--batch", "1,3", "--steps", "3", "--top", "30"]) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    backend = "native" if native.library() is not None else "reference"
    for batch in (1, 3):
        [section] = re.findall(rf"batch {batch}: ([\d.]+) ms/step.*?\n((?:  .*\n)+)", out)
        assert float(section[0]) > 0
        rows = {line.split()[0]: line.split() for line in section[1].splitlines()[1:]}
        if backend == "native":  # the decoder stack in one C call, then the LM head on the native matmul
            assert rows["native::forward"][-1] == "1"
            assert rows["native::linear"][-1] == "1"
        else:  # every op once per layer (rms_norm twice, plus the final norm): 3 layers
            assert rows[f"{backend}::paged_attention"][-1] == "3"
            assert rows[f"{backend}::rms_norm"][-1] == "7"
