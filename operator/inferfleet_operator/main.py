"""`inferfleet-operator`: parses the flags, serves /metrics, and runs the kopf operator."""

from __future__ import annotations

import logging
import os
import socket
import sys

import kopf
from prometheus_client import start_http_server

from .handlers import register
from .metrics import Metrics
from .settings import OperatorConfig, parse_args


def configure_logging(level: str) -> None:
    logging.basicConfig(stream=sys.stderr, level=level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # kopf reports every handler run at INFO; at our INFO only its warnings are worth a line.
    logging.getLogger("kopf").setLevel(level if level == "DEBUG" else "WARNING")
    logging.getLogger("httpx").setLevel("WARNING")


def run(config: OperatorConfig) -> None:
    metrics = Metrics()
    if config.metrics_port:
        start_http_server(config.metrics_port, registry=metrics.registry)
    registry = kopf.OperatorRegistry()
    register(registry, config, metrics)
    liveness = f"http://0.0.0.0:{config.health_port}/healthz" if config.health_port else None
    kopf.run(
        registry=registry,
        clusterwide=config.is_clusterwide,
        namespaces=config.namespaces,
        standalone=config.peering is None,
        peering_name=config.peering,
        liveness_endpoint=liveness,
        memo=kopf.Memo(),
    )


def main(argv: list[str] | None = None) -> int:
    default_instance = os.environ.get("POD_NAME") or socket.gethostname()
    config = parse_args(argv, default_instance=default_instance)
    configure_logging(config.log_level)
    run(config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
