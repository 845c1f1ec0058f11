"""`inferfleet-runtime compile`: build a compiled engine directory for an envelope (exit 2 bad input, 1 failed build).

Progress goes to stdout as `progress stage=<stage> percent=<0..100>` lines; the last line on success is
`built engine=<key> dir=<out> seconds=<s> digest=<engine digest>`. In a Kubernetes container (where the kubelet
provides /dev/termination-log, or $INFERFLEET_TERMINATION_LOG names a file) the result is also written there for
the operator: a JSON object ({"artifactSizeBytes": ..., "modelDigest": ..., "engineDigest": ...}) on success, the
one error line on failure. With --content-addressed the engine goes to OUT/<model digest>
(inferfleet_runtime.fetch.content_digest). An engine already at the output is rebuilt unless --engine-digest names
it or --keep-existing is given; the engine digest (manifest.engine_digest) is what serving pods are told to load.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

from inferfleet_runtime.termination import write_termination_message

from .envelope import DTYPES, Envelope, EnvelopeError, parse_buckets


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", metavar="DIR", required=True, help="Hugging Face checkpoint directory")
    parser.add_argument("--out", metavar="DIR", required=True, help="engine directory to write")
    parser.add_argument(
        "--backend",
        choices=("aotinductor", "tensorrt"),
        default=None,
        help="compiler (default: tensorrt on an NVIDIA GPU, else aotinductor)",
    )
    parser.add_argument(
        "--max-context-length",
        type=int,
        default=None,
        help="tokens per sequence, prompt plus completion (default: the model's, at most 2048)",
    )
    parser.add_argument("--max-batch-size", type=int, default=8, help="sequences running at once")
    parser.add_argument(
        "--dtype", choices=("auto", *DTYPES), default="auto", help="weights and activations (default: the checkpoint's)"
    )
    parser.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs per engine (only 1 for now)")
    parser.add_argument("--block-size", type=int, default=16, help="the scheduler's KV block granularity")
    parser.add_argument(
        "--prefill-buckets",
        type=_buckets,
        default=(),
        help="prompt chunk lengths with a graph, e.g. 64,256 (default: 64, 256, ... up to the context)",
    )
    parser.add_argument(
        "--decode-buckets",
        type=_buckets,
        default=(),
        help="batch sizes with a decode graph, e.g. 1,4,8 (default: powers of two up to the batch)",
    )
    parser.add_argument(
        "--engine-key", default=None, help="the engine's key (default: a hash of what it is built from)"
    )
    parser.add_argument(
        "--target-architecture",
        default=None,
        help="refuse to build unless this machine is it (sm90, gfx942, amd64/cpu-x86_64, ...)",
    )
    parser.add_argument(
        "--content-addressed",
        action="store_true",
        help="write the engine to OUT/<digest of the model's content manifest> (names, sizes, sha256, hub commit)",
    )
    parser.add_argument("--device", default=None, help="torch device to build on (default: the first GPU, else cpu)")
    keep = parser.add_mutually_exclusive_group()
    keep.add_argument(
        "--engine-digest",
        type=_digest,
        default=None,
        metavar="DIGEST",
        help="keep an engine already at the output only when it is this one (sha256:..., the digest its EngineBuild "
        "recorded) and intact; without this or --keep-existing an engine found there is rebuilt",
    )
    keep.add_argument(
        "--keep-existing",
        action="store_true",
        help="keep an intact engine of the key already at the output whatever its digest (an engine cache shared "
        "across namespaces by an administrator's choice)",
    )


def run(args: argparse.Namespace) -> int:
    import torch

    from inferfleet_runtime.device import pick_device
    from inferfleet_runtime.fetch.content_digest import content_digest, content_manifest
    from inferfleet_runtime.model_config import ConfigError
    from inferfleet_runtime.models import read_config_dir

    from .backends import BackendUnavailable, get_backend
    from .export import build_engine
    from .manifest import device_architecture, engine_digest, normalize_architecture

    model_dir, out_dir = Path(args.model), Path(args.out)
    if not (model_dir / "config.json").is_file():
        return _fail(f"{model_dir} is not a model directory (no config.json)")
    model_digest, model_commit = "", ""
    if args.content_addressed:
        try:
            content = content_manifest(model_dir)
        except ValueError as exc:
            return _fail(str(exc))
        model_digest, model_commit = content_digest(content), content["commit"]
        out_dir = out_dir / model_digest
    try:
        device = pick_device(args.device)
        model_config = read_config_dir(model_dir)
        dtype = str(model_config.dtype).removeprefix("torch.") if args.dtype == "auto" else args.dtype
        max_context = args.max_context_length or min(model_config.max_position_embeddings, 2048)
        if max_context > model_config.max_position_embeddings:
            raise EnvelopeError(
                f"--max-context-length {max_context} exceeds the model's max_position_embeddings "
                f"{model_config.max_position_embeddings}"
            )
        envelope = Envelope(
            max_context_length=max_context,
            max_batch_size=args.max_batch_size,
            dtype=dtype,
            tensor_parallel_size=args.tensor_parallel_size,
            block_size=args.block_size,
            decode_buckets=args.decode_buckets,
            prefill_buckets=args.prefill_buckets,
        )
        backend = args.backend or ("tensorrt" if device.type == "cuda" and not torch.version.hip else "aotinductor")
        here = device_architecture(device)
        if args.target_architecture and normalize_architecture(args.target_architecture) != here:
            raise EnvelopeError(
                f"the build targets {args.target_architecture}, but this machine's {device.type} "
                f"is {here}; run the build on a {args.target_architecture} node"
            )
        get_backend(backend).check_available(device)
    except (EnvelopeError, ConfigError, BackendUnavailable, ValueError) as exc:
        return _fail(str(exc))

    def progress(stage: str, percent: int) -> None:
        print(f"progress stage={stage} percent={percent}", flush=True)

    try:
        manifest = build_engine(
            model_dir,
            out_dir,
            envelope,
            backend,
            device,
            args.engine_key,
            progress,
            model_digest,
            model_commit,
            keep_digest=args.engine_digest or "",
            keep_existing=args.keep_existing,
        )
    except Exception as exc:  # the build itself failed: say why in one line, keep the trace for the Job's log
        traceback.print_exc(file=sys.stderr)
        return _fail(f"build failed: {type(exc).__name__}: {exc}", code=1)
    digest = engine_digest(manifest)
    print(
        f"built engine={manifest.engine_key} dir={out_dir} seconds={manifest.build_seconds} digest={digest}", flush=True
    )
    _write_termination_log(
        json.dumps(
            {
                "engineKey": manifest.engine_key,
                "artifactPath": str(out_dir),
                "artifactSizeBytes": manifest.sizes.get("total_bytes", 0),
                "buildSeconds": manifest.build_seconds,
                "backend": manifest.backend,
                "targetArchitecture": manifest.target_architecture,
                "modelDigest": model_digest,
                "modelCommit": model_commit,
                "engineDigest": digest,
            }
        )
    )
    return 0


def _buckets(text: str) -> tuple[int, ...]:
    try:
        return parse_buckets(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _digest(text: str) -> str:
    from .manifest import DIGEST_PATTERN

    if not DIGEST_PATTERN.match(text):
        raise argparse.ArgumentTypeError(f"expected sha256:<64 lowercase hex digits>, got {text!r}")
    return text


def _fail(message: str, code: int = 2) -> int:
    line = f"inferfleet-runtime compile: error: {message}"
    print(line, file=sys.stderr)
    _write_termination_log(line)
    return code


def _write_termination_log(text: str) -> None:
    write_termination_message(text)
