"""`inferfleet-operator`: parses the flags, serves /metrics, and runs the kopf operator."""

from __future__ import annotations

import importlib.abc
import logging
import os
import socket
import sys

from inferfleet_operator.controller.settings import OperatorConfig, parse_args

# kopf imports these client libraries at import time when they are installed, for integrations
# the operator never uses. The official `kubernetes` package is used (credentials.py loads its config);
# importing it costs ~18 MB of resident memory (README, Running the operator).
UNUSED_CLIENTS = ("kubernetes_asyncio", "pykube")


class _RefuseUnusedClients(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in UNUSED_CLIENTS:
            raise ImportError(f"{name} is not used by inferfleet-operator")
        return None


def configure_logging(level: str) -> None:
    logging.basicConfig(stream=sys.stderr, level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # kopf reports every handler run at INFO; at our INFO only its warnings are worth a line.
    logging.getLogger("kopf").setLevel(level if level == "DEBUG" else "WARNING")
    logging.getLogger("httpx").setLevel("WARNING")


def run(config: OperatorConfig) -> None:
    import kopf
    from prometheus_client import start_http_server

    from inferfleet_operator.controller.handlers import register
    from inferfleet_operator.controller.metrics import Metrics

    metrics = Metrics()
    if config.metrics_port:
        start_http_server(config.metrics_port, registry=metrics.registry)
    registry = kopf.OperatorRegistry()
    register(registry, config)
    liveness = f"http://0.0.0.0:{config.health_port}/healthz" if config.health_port else None
    kopf.run(
        registry=registry,
        clusterwide=config.is_clusterwide,
        namespaces=config.namespaces,
        standalone=config.peering is None,
        peering_name=config.peering,
        liveness_endpoint=liveness,
        memo=kopf.Memo(config=config, metrics=metrics),  # what handlers read (handlers.py)
    )


def main(argv: list[str] | None = None) -> int:
    default_instance = os.environ.get("POD_NAME") or socket.gethostname()
    config = parse_args(argv, default_instance=default_instance)
    if not any(isinstance(f, _RefuseUnusedClients) for f in sys.meta_path):
        sys.meta_path.insert(0, _RefuseUnusedClients())
    configure_logging(config.log_level)
    run(config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
