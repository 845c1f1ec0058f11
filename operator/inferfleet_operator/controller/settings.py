"""Operator process settings: the command-line flags of `inferfleet-operator`, parsed into one object."""

from __future__ import annotations

import argparse
import dataclasses

from inferfleet_operator.api.names import MANAGER
from inferfleet_operator.api.quantity import to_int
from inferfleet_operator.api.types import PlanSettings
from inferfleet_operator.plan.host_paths import normalise


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
    instance: str = MANAGER  # reportingInstance of Events (the pod name in a cluster)
    log_level: str = "INFO"
    inference_pools: str = "auto"  # "auto": InferencePools where the GAIE CRD is served; "disabled": never
    autoscale_seconds: float = 15.0  # autoscaled services re-read their pods' metrics this often
    scrape_timeout_seconds: float = 2.0  # per pod /metrics request
    scrape_url_template: str = "http://{ip}:{port}/metrics"
    # "delete": a garbage-collected EngineBuild's engine directory is removed by a prune Job; "keep": left on the claim.
    engine_gc: str = "delete"
    # One engine per key for every namespace (the key leaves the namespace out); off: each namespace builds its own.
    share_engines_across_namespaces: bool = False
    # Where the operator's pods run and their labels: every service NetworkPolicy admits them (the autoscaler).
    scraper_namespace: str = ""
    scraper_labels: tuple[tuple[str, str], ...] = ()
    # Host folders file:// model URIs may mount (chart value modelHostPaths.allowedRoots); empty: none.
    model_host_path_roots: tuple[str, ...] = ()
    # The image of the services' routers (the operator's own, chart value image); empty: no router is deployed.
    router_image: str = ""
    router_image_pull_policy: str = ""
    # The node model cache's claim in each namespace (chart value modelCache.claimName) and byte budget; "": off.
    model_cache_claim: str = ""
    model_cache_budget: str = ""

    @property
    def is_clusterwide(self) -> bool:
        return not self.namespaces

    def plan_settings(self) -> PlanSettings:
        return PlanSettings(
            engine_cache_claim=self.engine_cache_claim,
            build_retention_seconds=self.build_retention_seconds,
            max_backoff_seconds=self.max_backoff_seconds,
            share_engines_across_namespaces=self.share_engines_across_namespaces,
            scraper_namespace=self.scraper_namespace,
            scraper_labels=self.scraper_labels,
            host_path_roots=self.model_host_path_roots,
            router_image=self.router_image,
            router_image_pull_policy=self.router_image_pull_policy,
            model_cache_claim=self.model_cache_claim,
            model_cache_budget_bytes=to_int(self.model_cache_budget) if self.model_cache_budget else 0,
        )


def _labels(text: str) -> tuple[tuple[str, str], ...]:
    pairs = []
    for part in (p.strip() for p in text.split(",")):
        key, sep, value = part.partition("=")
        if not part or not sep or not key:
            raise argparse.ArgumentTypeError(f"expected KEY=VALUE,KEY=VALUE,..., got {text!r}")
        pairs.append((key, value))
    return tuple(sorted(pairs))


def _host_root(text: str) -> str:
    if not text.startswith("/"):
        raise argparse.ArgumentTypeError(f"expected an absolute path, got {text!r}")
    return normalise(text)


class _AppendToTuple(argparse.Action):
    """A repeatable flag whose value is a tuple (argparse's append cannot extend one)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, (*getattr(namespace, self.dest), values))


def _budget(text: str) -> str:
    if text == "":  # the default: no budget
        return text
    try:
        value = to_int(text)
    except (ValueError, TypeError):
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive quantity of bytes (e.g. 200Gi), got {text!r}")
    return text


def _delays(text: str) -> tuple[float, ...]:
    try:
        delays = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated seconds, got {text!r}") from None
    if not delays or any(d < 0 for d in delays):
        raise argparse.ArgumentTypeError(f"expected non-negative seconds, got {text!r}")
    return delays


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(OperatorConfig)}


def _flag(parser, name: str, *aliases: str, help: str, shown: str | None = None, **kwargs) -> None:
    """Adds the flag of OperatorConfig field `name` (--name-with-dashes), its default read from the dataclass;
    the help ends with the default (`shown`, when the value itself reads badly) unless it says one itself."""
    if "default" not in help and (shown is not None or _DEFAULTS[name] is not None):
        help += f" (default: {shown or '%(default)s'})"
    flag = "--" + name.replace("_", "-")
    parser.add_argument(flag, *aliases, dest=name, default=_DEFAULTS[name], help=help, **kwargs)


def build_parser(default_instance: str = _DEFAULTS["instance"]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="inferfleet-operator",
        description="Runs the inferfleet operator: InferenceServices become engine builds and "
        "per-pool serving Deployments.",
    )
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace",
        "-n",
        dest="namespaces",
        action="append",
        default=None,  # None: no --namespace given (argparse appends to a default list in place)
        metavar="NAME",
        help="watch this namespace (repeatable; globs allowed)",
    )
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace (the default)")
    _flag(parser, "health_port", type=int, help="port of the liveness endpoint GET /healthz (0: off)")
    _flag(parser, "metrics_port", type=int, help="port of the Prometheus endpoint GET /metrics (0: off)")
    peering = parser.add_mutually_exclusive_group()
    _flag(peering, "peering", metavar="NAME", help="elect one active replica through kopf peering objects named NAME")
    peering.add_argument(
        "--standalone", action="store_true", help="no peering: this process is the only operator (the default)"
    )
    _flag(
        parser,
        "peering_priority",
        type=int,
        metavar="N",
        help="with --peering: the replica with the highest priority is active "
        "(default: random, so that replicas never tie)",
    )
    _flag(parser, "engine_cache_claim", metavar="NAME", help="PersistentVolumeClaim that holds compiled engines")
    _flag(parser, "resync_seconds", type=float, help="reconcile every object at least this often")
    _flag(parser, "debounce_seconds", type=float, help="coalesce triggers for one object within this window")
    _flag(
        parser,
        "error_delays",
        type=_delays,
        metavar="S,S,...",
        help="seconds between retries of a failing reconcile",
        shown=",".join(f"{d:g}" for d in _DEFAULTS["error_delays"]),
    )
    _flag(
        parser,
        "build_retention_seconds",
        type=int,
        help="delete an EngineBuild this long after no service references it",
    )
    _flag(parser, "max_backoff_seconds", type=int, help="cap on the delay between engine build attempts")
    _flag(parser, "concurrency", type=int, help="reconciles running at once")
    parser.add_argument(
        "--instance",
        default=default_instance,
        help="name of this replica in Events (default: $POD_NAME or the host name, here %(default)s)",
    )
    _flag(
        parser,
        "inference_pools",
        choices=["auto", "disabled"],
        help="auto: apply InferencePools (Gateway API Inference Extension) where the CRD is "
        "served; disabled: never (the chart's RBAC then grants no inferencepools)",
    )
    _flag(parser, "autoscale_seconds", type=float, help="how often autoscaled services read their pods' /metrics")
    _flag(
        parser,
        "scrape_timeout_seconds",
        type=float,
        help="timeout of one pod's /metrics request (a pod that does not answer counts as missing)",
    )
    _flag(
        parser,
        "scrape_url_template",
        metavar="URL",
        help="where a serving pod's /metrics is, from {ip} {port} {namespace} {pod} {pool} "
        "(tests point it at a stand-in on loopback)",
    )
    _flag(
        parser,
        "engine_gc",
        choices=["delete", "keep"],
        help="delete: a garbage-collected EngineBuild's engine directory is removed by a prune Job; keep: it "
        "stays on the engine cache claim",
    )
    _flag(
        parser,
        "share_engines_across_namespaces",
        action="store_true",
        help="let services of different namespaces share one compiled engine: its key leaves the namespace out and "
        "a compile Job keeps an engine of the key it finds on the cache, so every namespace that can write the "
        "engine cache is trusted with every other's engines (default: off, each namespace builds its own)",
    )
    _flag(
        parser,
        "scraper_namespace",
        metavar="NAMESPACE",
        help="the operator's own namespace, admitted by every service NetworkPolicy (spec.networkPolicy) so "
        "the autoscaler can read the pods' /metrics; empty: none is admitted",
        shown="none",
    )
    _flag(
        parser,
        "scraper_labels",
        type=_labels,
        metavar="K=V,...",
        help="labels of the operator's pods, with --scraper-namespace",
        shown="none",
    )
    parser.add_argument(
        "--model-host-path-root",
        dest="model_host_path_roots",
        action=_AppendToTuple,
        type=_host_root,
        default=_DEFAULTS["model_host_path_roots"],
        metavar="PATH",
        help="a host folder under which file:// model URIs may mount a hostPath (repeatable; compared on whole "
        "path components after normalising); services naming any other are refused with HostPathNotAllowed "
        "(default: none)",
    )
    _flag(
        parser,
        "router_image",
        metavar="IMAGE",
        help="the image whose inferfleet-router serves services of spec.routing.mode Router (the operator's own "
        "image); empty: every service is served through its plain Service and status.routing says why",
        shown="none",
    )
    _flag(
        parser,
        "router_image_pull_policy",
        choices=["", "Always", "IfNotPresent", "Never"],
        metavar="POLICY",
        help="the router pods' imagePullPolicy (Always, IfNotPresent, Never; default: the cluster's)",
        shown="the cluster's",
    )
    _flag(
        parser,
        "model_cache_claim",
        metavar="NAME",
        help="the PersistentVolumeClaim, in each service's namespace, that mounts the node's model cache folder: "
        "hf:// and s3:// models are fetched into it once per node and verified by their content digest; empty: "
        "each pod fetches its own copy",
        shown="none",
    )
    _flag(
        parser,
        "model_cache_budget",
        type=_budget,
        metavar="QUANTITY",
        help="the node model cache's byte budget on each node (e.g. 200Gi): entries no pod uses are evicted, least "
        "recently used first, and a model that cannot fit fails its fetch",
        shown="none",
    )
    _flag(parser, "log_level", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="how much the operator logs")
    return parser


def parse_args(argv: list[str] | None, *, default_instance: str) -> OperatorConfig:
    parser = build_parser(default_instance)
    args = parser.parse_args(argv)
    if args.concurrency < 1:
        parser.error("--concurrency must be at least 1")
    if args.autoscale_seconds <= 0 or args.scrape_timeout_seconds <= 0:
        parser.error("--autoscale-seconds and --scrape-timeout-seconds must be positive")
    try:
        args.scrape_url_template.format(ip="10.0.0.1", port=8000, namespace="ns", pod="pod", pool="pool")
    except (KeyError, IndexError, ValueError) as error:
        parser.error(f"--scrape-url-template may only use {{ip}} {{port}} {{namespace}} {{pod}} {{pool}}: {error}")
    values = {name: getattr(args, name) for name in _DEFAULTS}
    values["namespaces"] = tuple(args.namespaces or _DEFAULTS["namespaces"])
    values["error_delays"] = tuple(args.error_delays)
    values["scraper_labels"] = tuple(args.scraper_labels)
    values["model_host_path_roots"] = tuple(args.model_host_path_roots)
    return OperatorConfig(**values)
