"""Parses `serve` command-line flags the way the CLI does, without running the server."""

import argparse

from inferfleet_runtime.server import cli as serve_cli


def parse_serve(*argv):
    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    return parser.parse_args(list(argv))
