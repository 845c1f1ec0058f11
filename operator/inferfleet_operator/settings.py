"""Operator process settings: the command-line flags of `inferfleet-operator`, parsed into one object."""

from __future__ import annotations

import argparse
import dataclasses

from .api import PlanSettings


@dataclasses.dataclass(frozen=True)
class OperatorConfig:
    namespaces: tuple[str, ...] = ()  # empty: every namespace
    health_port: int = 8080  # GET /healthz; 0 turns it off
    metrics_port: int = 9090  # GET /metrics; 0 turns it off
    peering: str | None = None  # leader election through kopf peering under this name
    peering_priority: int | None = None  # the highest live priority is active; None: random
    engine_cache_claim: str = "inferfleet-engine-cache"
    resync_seconds: float = 300.0  # every object is reconciled at least this often
    debounce_seconds: float = 0.2  # triggers for one object within this window run one reconcile
    error_delays: tuple[float, ...] = (1, 2, 5, 10, 30, 60)  # retry delays after failed reconciles
    build_retention_seconds: int = 3600
    max_backoff_seconds: int = 600
    concurrency: int = 8  # reconciles running at once across all objects
    instance: str = "inferfleet-operator"  # reportingInstance of Events (the pod name in a cluster)
    log_level: str = "INFO"
    inference_pools: str = "auto"  # "auto": InferencePools where the GAIE CRD is served; "disabled": never
    autoscale_seconds: float = 15.0  # autoscaled services re-read their pods' metrics this often
    scrape_timeout_seconds: float = 2.0  # per pod /metrics request
    scrape_url_template: str = "http://{ip}:{port}/metrics"

    @property
    def is_clusterwide(self) -> bool:
        return not self.namespaces

    def plan_settings(self) -> PlanSettings:
        return PlanSettings(
            engine_cache_claim=self.engine_cache_claim,
            build_retention_seconds=self.build_retention_seconds,
            max_backoff_seconds=self.max_backoff_seconds,
        )


def _delays(text: str) -> tuple[float, ...]:
    try:
        delays = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated seconds, got {text!r}") from None
    if not delays or any(d < 0 for d in delays):
        raise argparse.ArgumentTypeError(f"expected non-negative seconds, got {text!r}")
    return delays


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="inferfleet-operator",
        description="Runs the inferfleet operator: InferenceServices become engine builds and "
        "per-pool serving Deployments.",
    )
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        metavar="NAME",
        help="watch this namespace (repeatable; globs allowed)",
    )
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace (the default)")
    parser.add_argument(
        "--health-port", type=int, default=8080, help="port of the liveness endpoint GET /healthz (0: off)"
    )
    parser.add_argument(
        "--metrics-port", type=int, default=9090, help="port of the Prometheus endpoint GET /metrics (0: off)"
    )
    peering = parser.add_mutually_exclusive_group()
    peering.add_argument(
        "--peering", metavar="NAME", help="elect one active replica through kopf peering objects named NAME"
    )
    peering.add_argument(
        "--standalone", action="store_true", help="no peering: this process is the only operator (the default)"
    )
    parser.add_argument(
        "--peering-priority",
        type=int,
        default=None,
        metavar="N",
        help="with --peering: the replica with the highest priority is active "
        "(default: random, so that replicas never tie)",
    )
    parser.add_argument(
        "--engine-cache-claim",
        default="inferfleet-engine-cache",
        metavar="NAME",
        help="PersistentVolumeClaim that holds compiled engines",
    )
    parser.add_argument(
        "--resync-seconds", type=float, default=300.0, help="reconcile every object at least this often"
    )
    parser.add_argument(
        "--debounce-seconds", type=float, default=0.2, help="coalesce triggers for one object within this window"
    )
    parser.add_argument(
        "--error-delays",
        type=_delays,
        default=(1, 2, 5, 10, 30, 60),
        metavar="S,S,...",
        help="seconds between retries of a failing reconcile",
    )
    parser.add_argument(
        "--build-retention-seconds",
        type=int,
        default=3600,
        help="delete an EngineBuild this long after no service references it",
    )
    parser.add_argument(
        "--max-backoff-seconds", type=int, default=600, help="cap on the delay between engine build attempts"
    )
    parser.add_argument("--concurrency", type=int, default=8, help="reconciles running at once")
    parser.add_argument(
        "--instance", default=None, help="name of this replica in Events (default: $POD_NAME or the host name)"
    )
    parser.add_argument(
        "--inference-pools",
        choices=["auto", "disabled"],
        default="auto",
        help="auto: apply InferencePools (Gateway API Inference Extension) where the CRD is "
        "served; disabled: never (the chart's RBAC then grants no inferencepools)",
    )
    parser.add_argument(
        "--autoscale-seconds", type=float, default=15.0, help="how often autoscaled services read their pods' /metrics"
    )
    parser.add_argument(
        "--scrape-timeout-seconds",
        type=float,
        default=2.0,
        help="timeout of one pod's /metrics request (a pod that does not answer counts as missing)",
    )
    parser.add_argument(
        "--scrape-url-template",
        default="http://{ip}:{port}/metrics",
        metavar="URL",
        help="where a serving pod's /metrics is, from {ip} {port} {namespace} {pod} {pool} "
        "(tests point it at a stand-in on loopback)",
    )
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return parser


def parse_args(argv: list[str] | None, *, default_instance: str) -> OperatorConfig:
    args = build_parser().parse_args(argv)
    if args.concurrency < 1:
        build_parser().error("--concurrency must be at least 1")
    if args.autoscale_seconds <= 0 or args.scrape_timeout_seconds <= 0:
        build_parser().error("--autoscale-seconds and --scrape-timeout-seconds must be positive")
    try:
        args.scrape_url_template.format(ip="10.0.0.1", port=8000, namespace="ns", pod="pod", pool="pool")
    except (KeyError, IndexError, ValueError) as error:
        build_parser().error(
            f"--scrape-url-template may only use {{ip}} {{port}} {{namespace}} {{pod}} {{pool}}: {error}"
        )
    return OperatorConfig(
        namespaces=tuple(args.namespace),
        health_port=args.health_port,
        metrics_port=args.metrics_port,
        peering=args.peering,
        peering_priority=args.peering_priority,
        engine_cache_claim=args.engine_cache_claim,
        resync_seconds=args.resync_seconds,
        debounce_seconds=args.debounce_seconds,
        error_delays=tuple(args.error_delays),
        build_retention_seconds=args.build_retention_seconds,
        max_backoff_seconds=args.max_backoff_seconds,
        concurrency=args.concurrency,
        instance=args.instance or default_instance,
        log_level=args.log_level,
        inference_pools=args.inference_pools,
        autoscale_seconds=args.autoscale_seconds,
        scrape_timeout_seconds=args.scrape_timeout_seconds,
        scrape_url_template=args.scrape_url_template,
    )
