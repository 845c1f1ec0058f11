"""`inferfleet-runtime serve`: load a model (paged) or a compiled engine and serve the OpenAI-compatible API."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
from pathlib import Path

from inferfleet_runtime.engine.config import KERNEL_BACKENDS, QUANTIZATIONS, EngineConfig
from inferfleet_runtime.fetch.node_cache import lease_for
from inferfleet_runtime.sizes import parse_size


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--model", metavar="DIR", help="Hugging Face checkpoint directory, or a .gguf file (paged engine)"
    )
    source.add_argument("--engine-dir", metavar="DIR", help="compiled engine directory (with manifest.json)")
    parser.add_argument(
        "--engine-digest",
        metavar="DIGEST",
        default=None,
        help="with --engine-dir: serve only the engine of this digest (sha256:..., reported by `compile`); another "
        "engine there is refused as lost (exit 3)",
    )
    parser.add_argument(
        "--engine",
        choices=("paged", "compiled"),
        default=None,
        help="engine mode (default: paged for --model, compiled for --engine-dir)",
    )
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--served-model-name",
        default=None,
        help="the OpenAI model id (default: the model directory's name; inferfleet-demo for the built-in model)",
    )
    add_engine_arguments(parser)
    parser.add_argument(
        "--max-queue-len", type=int, default=1024, help="waiting requests beyond this are refused with 429"
    )
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    parser.add_argument(
        "--api-key",
        action="append",
        default=[],
        metavar="KEY",
        help="require 'Authorization: Bearer KEY' on /v1/* (repeatable; also INFERFLEET_API_KEY, comma-separated)",
    )
    parser.add_argument(
        "--api-key-file",
        action="append",
        default=[],
        metavar="PATH",
        help="read API keys from a file, one a line (e.g. a mounted Secret); repeatable",
    )
    parser.add_argument(
        "--protect-metrics",
        action="store_true",
        help="/metrics and /profile need an API key too (/health and /ready never do)",
    )
    parser.add_argument(
        "--calibrate",
        action="store_true",
        help="before /ready, measure this engine's pool profile (prefill and decode rates, seconds on a GPU) and "
        "serve it at /profile, where the router reads it",
    )
    parser.add_argument(
        "--max-request-bytes",
        type=parse_size,
        default=None,
        metavar="BYTES",
        help="larger request bodies are refused with 413 (default 8MiB)",
    )
    parser.add_argument(
        "--max-request-output-tokens",
        type=_positive_int,
        default=None,
        metavar="N",
        help="a request that may produce more output tokens (prompts x n x max_tokens, a token with logprobs=k "
        "counting k+2) is refused with 400 (default 1048576)",
    )


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """The paged engine's flags (EngineConfig but the queue), shared by `serve` and `profile`."""
    parser.add_argument("--dtype", choices=("auto", "float32", "float16", "bfloat16"), default=None)
    parser.add_argument("--device", default=None, help="torch device (default: the first accelerator, else cpu)")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV cache block")
    kv = parser.add_mutually_exclusive_group()
    kv.add_argument("--num-kv-blocks", type=int, default=None, help="KV cache blocks to allocate")
    kv.add_argument(
        "--kv-cache-memory",
        type=parse_size,
        default=None,
        metavar="BYTES",
        help="KV cache budget, e.g. 2GiB or 500MB (default: 80%% of free GPU memory; 1GiB on CPU)",
    )
    parser.add_argument("--max-num-seqs", type=int, default=64, help="sequences running at once")
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048, help="new tokens per engine step")
    parser.add_argument(
        "--max-context-length",
        "--max-model-len",
        dest="max_context_length",
        type=int,
        default=None,
        help="context limit in tokens, prompt and output together (default: the model's); --max-model-len is vLLM's "
        "name for it",
    )
    parser.add_argument("--no-prefix-caching", action="store_true", help="disable prefix caching")
    parser.add_argument("--kernels", choices=KERNEL_BACKENDS, default="auto")
    parser.add_argument(
        "--quantization",
        choices=QUANTIZATIONS,
        default="none",
        help="quantize a float checkpoint's linear weights at load: int8 per output channel, int4 group-wise "
        "(paged engine only)",
    )
    parser.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        metavar="N",
        help="shard the model over N ranks: N devices, or N processes on a CPU (paged engine only)",
    )


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    """The engine configuration the flags ask for (ValueError on a bad value)."""
    return EngineConfig(
        block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks,
        kv_cache_memory=args.kv_cache_memory,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_context_length=args.max_context_length,
        max_queue_len=getattr(args, "max_queue_len", EngineConfig.max_queue_len),  # `profile` queues nothing
        enable_prefix_caching=not args.no_prefix_caching,
        kernels=args.kernels,
        quantization=args.quantization,
        tensor_parallel_size=args.tensor_parallel_size,
        dtype=None if args.dtype in (None, "auto") else args.dtype,
        device=args.device,
    )


def run(args: argparse.Namespace) -> int:
    from inferfleet_runtime.server.auth import ENV_VAR, ApiKeyError, ApiKeys

    try:
        config = config_from_args(args)
        api_keys = ApiKeys.from_sources(args.api_key, os.environ.get(ENV_VAR), args.api_key_file)
    except (ValueError, ApiKeyError) as exc:
        return _fail(str(exc))
    if args.protect_metrics and api_keys is None:
        return _fail("--protect-metrics needs an API key (--api-key, --api-key-file or INFERFLEET_API_KEY)")
    mode = args.engine or ("compiled" if args.engine_dir else "paged")
    if mode == "paged":
        if not args.model:
            return _fail("--engine paged needs --model DIR")
        model_dir = Path(args.model)
        try:
            gguf_file = check_paged_model(model_dir, config)
        except ValueError as exc:
            return _fail(str(exc))
        make_runner = _paged_runner(model_dir, config)
        default_name = gguf_file.stem if gguf_file else _default_name(model_dir)
    else:
        if not args.engine_dir:
            return _fail("--engine compiled needs --engine-dir DIR")
        if config.quantization != "none":
            return _fail("--quantization needs the paged engine: a compiled engine serves float weights only")
        if config.tensor_parallel_size != 1:
            return _fail("--tensor-parallel-size needs the paged engine: compiled engines are exported for one device")
        try:
            from inferfleet_runtime import compiled
        except ImportError as exc:
            return _fail(f"the compiled engine is not available in this build ({exc}); serve with --engine paged")
        from inferfleet_runtime.compiled.manifest import ENGINE_LOST_EXIT_CODE, EngineLost

        engine_dir = Path(args.engine_dir)
        if not (engine_dir / "manifest.json").is_file():
            # Exit code 3: the operator reads it from the pod and rebuilds the engine instead of restarting this.
            message = f"{engine_dir} is not a compiled engine directory (no manifest.json): engine lost; rebuild it"
            return _fail(message, ENGINE_LOST_EXIT_CODE)
        try:
            make_runner = compiled.runner_factory(engine_dir, config, args.engine_digest)  # refuses mismatched engines
        except EngineLost as exc:
            return _fail(str(exc), ENGINE_LOST_EXIT_CODE)
        except ValueError as exc:
            return _fail(str(exc))
        default_name = engine_dir.name
    name = args.served_model_name or default_name
    limits = {"max_body_bytes": args.max_request_bytes} if args.max_request_bytes else {}
    if args.max_request_output_tokens:
        limits["max_request_output_tokens"] = args.max_request_output_tokens
    # A model in the node's cache stays there while this process serves it: the lease keeps eviction away.
    lease = lease_for(Path(args.model)) if mode == "paged" else None
    with lease or contextlib.nullcontext():
        serve(
            make_runner,
            config,
            name,
            args.host,
            args.port,
            args.log_level,
            api_keys,
            args.protect_metrics,
            calibrate=args.calibrate,
            **limits,
        )
    return 0


def check_paged_model(model_dir: Path, config: EngineConfig) -> Path | None:
    """The .gguf file that model_dir names (None for a checkpoint directory); ValueError, in one line, for a path
    that is neither or a family this runtime cannot serve: refused here rather than at load."""
    from inferfleet_runtime.checkpoints.gguf import find_gguf

    gguf_file = find_gguf(model_dir)  # GGUFError is a ValueError
    if gguf_file is None and not (model_dir / "config.json").is_file():
        raise ValueError(f"{model_dir} is not a model directory (no config.json) nor a .gguf file")
    if gguf_file is None:
        from inferfleet_runtime.layers.quantized import check_quantizable
        from inferfleet_runtime.model_config import ConfigError
        from inferfleet_runtime.models import read_config_dir

        try:
            check_quantizable(read_config_dir(model_dir), config.quantization)
        except (ConfigError, ValueError, KeyError) as exc:
            raise ValueError(f"cannot serve {model_dir}: {exc}") from None
    return gguf_file


def serve(
    make_runner,
    config: EngineConfig,
    served_model_name: str,
    host: str,
    port: int,
    log_level: str = "info",
    api_keys=None,
    protect_metrics: bool = False,
    calibrate: bool = False,
    **state_fields,
) -> None:
    """Starts uvicorn at once (/health answers, /ready says 503) and loads the model in the background (calibrate:
    then measures its profile, still before /ready)."""
    import uvicorn

    from inferfleet_runtime.server.app import create_app

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    state, load = build_state(
        make_runner, config, served_model_name, api_keys, protect_metrics, calibrate=calibrate, **state_fields
    )
    if api_keys is not None:
        logging.getLogger(__name__).info(
            "Required an API key on /v1/*%s (%d key(s))", " and /metrics" if protect_metrics else "", len(api_keys.keys)
        )
    uvicorn.run(create_app(state, load), host=host, port=port, log_level=log_level)


def build_state(
    make_runner,
    config: EngineConfig,
    served_model_name: str,
    api_keys=None,
    protect_metrics=False,
    calibrate: bool = False,
    **state_fields,
):
    """(ServerState, load) for create_app: load() builds the runner, engine and engine thread (calibrate: measures
    the engine's profile first, into state.profile)."""
    from inferfleet_runtime.engine.async_engine import AsyncEngine
    from inferfleet_runtime.engine.llm_engine import LLMEngine
    from inferfleet_runtime.engine.metrics import ServerMetrics
    from inferfleet_runtime.server.app import ServerState

    state = ServerState(
        served_model_name=served_model_name,
        metrics=ServerMetrics(served_model_name),
        api_keys=api_keys,
        protect_metrics=protect_metrics,
        **state_fields,
    )

    def load() -> AsyncEngine:
        llm = LLMEngine(make_runner(), config)
        if calibrate:
            from inferfleet_runtime.engine.calibration import calibrate_engine

            state.profile = calibrate_engine(llm)
        engine = AsyncEngine(llm, config.max_queue_len, state.metrics)
        engine.start()
        return engine

    return state, load


def _paged_runner(model_dir: Path, config: EngineConfig):
    def make():
        from inferfleet_runtime.worker.model_runner import ModelRunner

        return ModelRunner.from_model_dir(model_dir, config)

    return make


def _default_name(model_dir: Path) -> str:
    """The built-in model (a copy made by `demo-model`, or its cache) is inferfleet-demo; others, their directory."""
    from inferfleet_runtime.demo.builtin_model import SERVED_NAME, cache_root

    resolved = model_dir.resolve()
    if resolved.name == SERVED_NAME or resolved.is_relative_to(cache_root().resolve()):
        return SERVED_NAME
    return model_dir.name


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _fail(message: str, code: int = 2) -> int:
    """The error line on stderr and as the container's termination message (the operator reports it)."""
    from inferfleet_runtime.termination import fail

    return fail("inferfleet-runtime serve", message, code)
