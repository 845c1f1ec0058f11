"""TensorRT backend (NVIDIA): the step exported to ONNX, built into a serialized TensorRT engine per bucket.

TensorRT is imported only when this backend is used (the `tensorrt` extra). A builder needs a CUDA
GPU, and an engine runs only on the GPU architecture and TensorRT version that built it (the manifest
records both and `serve` checks them). Inputs and outputs are bound as torch CUDA tensors, so the
runner's KV slots stay torch tensors on the GPU.

Not yet run on a GPU in this project's CI (none there): tests/runtime/compiled/test_tensorrt.py and
`python -m inferfleet_runtime.compiled.gpu_check` exercise it where TensorRT and a GPU exist.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from . import BackendUnavailable

NAME = "tensorrt"
FILE_SUFFIX = ".engine"
INPUT_NAMES = ("input_ids", "start_pos", "num_new", "slot_ids", "kv_cache")
OUTPUT_NAMES = ("logits", "new_kv")


def _import_tensorrt():
    try:
        import tensorrt
    except ImportError:
        raise BackendUnavailable(
            "the tensorrt backend needs TensorRT (pip install 'inferfleet[tensorrt]'); "
            "use --backend aotinductor on machines without it"
        ) from None
    return tensorrt


def check_available(device: torch.device) -> None:
    if device.type != "cuda" or not torch.cuda.is_available() or getattr(torch.version, "hip", None):
        raise BackendUnavailable(
            "the tensorrt backend needs an NVIDIA CUDA GPU, and this machine has none; use --backend aotinductor"
        )
    _import_tensorrt()


def build(step: torch.nn.Module, example_inputs: tuple, path: Path) -> None:
    trt = _import_tensorrt()
    logger = trt.Logger(trt.Logger.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = Path(tmp) / "step.onnx"
        export_onnx(step, example_inputs, onnx_path)
        builder = trt.Builder(logger)
        # Strongly typed: TensorRT keeps the exported dtypes (the envelope's) instead of choosing its own.
        network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
        parser = trt.OnnxParser(network, logger)
        if not parser.parse_from_file(str(onnx_path)):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise RuntimeError(f"TensorRT could not parse the exported step: {errors}")
        serialized = builder.build_serialized_network(network, builder.create_builder_config())
        if serialized is None:
            raise RuntimeError("TensorRT failed to build the engine (see its log above)")
    path.write_bytes(bytes(serialized))


def export_onnx(step: torch.nn.Module, example_inputs: tuple, path: Path) -> None:
    """The step at the example inputs' shapes as ONNX (weights in a file beside it), the builder's input."""
    with torch.no_grad():
        torch.onnx.export(
            step,
            example_inputs,
            str(path),
            input_names=list(INPUT_NAMES),
            output_names=list(OUTPUT_NAMES),
            dynamo=True,
            external_data=True,
        )


class _EngineCall:
    """Calls a deserialized engine with torch CUDA tensors; returns (logits, new_kv) as new torch tensors."""

    def __init__(self, trt, engine, device: torch.device):
        self.trt, self.engine, self.device = trt, engine, device
        self.context = engine.create_execution_context()
        self.output_specs = [
            (name, tuple(engine.get_tensor_shape(name)), _torch_dtype(trt, engine.get_tensor_dtype(name)))
            for name in OUTPUT_NAMES
        ]

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        keep = [t.contiguous() for t in inputs]  # held until the stream has consumed them
        for name, tensor in zip(INPUT_NAMES, keep):
            self.context.set_tensor_address(name, tensor.data_ptr())
        outputs = [torch.empty(shape, dtype=dtype, device=self.device) for _, shape, dtype in self.output_specs]
        for (name, _, _), tensor in zip(self.output_specs, outputs):
            self.context.set_tensor_address(name, tensor.data_ptr())
        stream = torch.cuda.current_stream(self.device)
        if not self.context.execute_async_v3(stream.cuda_stream):
            raise RuntimeError("TensorRT engine execution failed")
        stream.synchronize()
        return outputs[0], outputs[1]


def load(path: Path, device: torch.device):
    trt = _import_tensorrt()
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine(Path(path).read_bytes())
    if engine is None:
        raise RuntimeError(f"TensorRT could not load {path} (built by another TensorRT version or GPU?)")
    return _EngineCall(trt, engine, device)


def _torch_dtype(trt, dtype) -> torch.dtype:
    table = {
        trt.float32: torch.float32,
        trt.float16: torch.float16,
        trt.bfloat16: torch.bfloat16,
        trt.int64: torch.int64,
        trt.int32: torch.int32,
    }
    return table[dtype]
