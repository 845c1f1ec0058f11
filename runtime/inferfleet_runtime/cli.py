"""`inferfleet-runtime`: one entry point whose subcommands live in their own modules, imported on use."""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module exposing add_arguments(parser) and run(args) -> int, one-line help)
SUBCOMMANDS = {
    "serve": ("inferfleet_runtime.server.cli", "serve a model over the OpenAI-compatible HTTP API"),
    "demo-model": ("inferfleet_runtime.demo.builtin_model", "make the small built-in model"),
    "fetch": ("inferfleet_runtime.fetch.sources", "download a model (file://, hf://, s3://)"),
    "compile": ("inferfleet_runtime.compiled.cli", "build a compiled engine ahead of time"),
    "prune-engine": ("inferfleet_runtime.compiled.prune", "remove a compiled engine from the engine cache"),
    "bench": ("inferfleet_runtime.bench.cli", "run a serving benchmark"),
    "profile": ("inferfleet_runtime.bench.pool_profile", "measure a pool profile for the router (offline)"),
}


class _Parser(argparse.ArgumentParser):
    """Usage errors (exit 2) also become the termination message, as the subcommands' own errors do:
    an init container run with flags its image does not know says so in the pod's status."""

    def error(self, message: str):
        from inferfleet_runtime.termination import write_termination_message

        write_termination_message(f"{self.prog}: error: {message}")
        super().error(message)


def _usage() -> str:
    lines = ["usage: inferfleet-runtime <subcommand> [options]", "", "subcommands:"]
    lines += [f"  {name:<12} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    lines += ["", "Run `inferfleet-runtime <subcommand> --help` for its options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(
            f"inferfleet-runtime: error: unknown subcommand {name!r} (choose from {', '.join(SUBCOMMANDS)})",
            file=sys.stderr,
        )
        return 2
    module_name, help_ = SUBCOMMANDS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            print(f"inferfleet-runtime: error: subcommand {name!r} is not available in this build", file=sys.stderr)
            return 2
        raise
    parser = _Parser(prog=f"inferfleet-runtime {name}", description=help_)
    module.add_arguments(parser)
    args = parser.parse_args(rest)
    return module.run(args)


if __name__ == "__main__":
    sys.exit(main())
