"""Flags of `inferfleet-operator` and the kopf settings the startup handler applies."""

import inspect

import kopf
import pytest

from inferfleet_operator.controller import handlers
from inferfleet_operator.controller.handlers import apply_settings, node_view, register
from inferfleet_operator.controller.settings import parse_args


def test_defaults_watch_every_namespace_without_peering():
    config = parse_args([], default_instance="pod-0")
    assert config.is_clusterwide and config.peering is None
    assert (config.health_port, config.metrics_port) == (8080, 9090)
    assert config.instance == "pod-0"


def test_namespaces_repeat_and_exclude_all_namespaces():
    config = parse_args(["--namespace", "team-a", "-n", "team-b"], default_instance="x")
    assert config.namespaces == ("team-a", "team-b") and not config.is_clusterwide
    with pytest.raises(SystemExit):
        parse_args(["--namespace", "a", "--all-namespaces"], default_instance="x")


def test_the_engine_cache_claim_and_retention_reach_the_planner_settings():
    config = parse_args(
        ["--engine-cache-claim", "engines", "--build-retention-seconds", "5", "--max-backoff-seconds", "2"],
        default_instance="x",
    )
    plan = config.plan_settings()
    assert (plan.engine_cache_claim, plan.build_retention_seconds, plan.max_backoff_seconds) == ("engines", 5, 2)


def test_bad_error_delays_are_refused_with_a_message(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--error-delays", "1,x"], default_instance="x")
    assert "comma-separated seconds" in capsys.readouterr().err


def test_peering_turns_on_mandatory_leader_election():
    settings = kopf.OperatorSettings()
    apply_settings(settings, parse_args(["--peering", "inferfleet"], default_instance="x"))
    assert settings.peering.name == "inferfleet"
    assert settings.peering.mandatory and not settings.peering.standalone
    assert settings.peering.clusterwide

    pinned = kopf.OperatorSettings()
    apply_settings(pinned, parse_args(["--peering", "p", "--peering-priority", "7"], default_instance="x"))
    assert pinned.peering.priority == 7
    assert settings.peering.priority >= 1, "replicas without a priority draw one, never tie at 0"

    standalone = kopf.OperatorSettings()
    apply_settings(standalone, parse_args([], default_instance="x"))
    assert standalone.peering.standalone


def test_watches_of_children_jobs_and_pods_are_filtered_by_the_api_server():
    settings = kopf.OperatorSettings()
    apply_settings(settings, parse_args([], default_instance="x"))
    selectors = {(s.group, s.plural or s.any_name): v for s, v in settings.watching.label_selectors.items()}
    managed = "app.kubernetes.io/managed-by=inferfleet-operator"
    assert selectors[("apps", "deployments")] == managed
    assert selectors[("", "services")] == managed
    assert selectors[("policy", "poddisruptionbudgets")] == managed
    assert selectors[("batch", "jobs")] == "inferfleet.dev/engine-build"
    # One pod watch serves both the compile pods and the serving pods: both carry managed-by.
    assert selectors[("", "pods")] == managed


def test_kopf_bookkeeping_stays_under_the_projects_prefix():
    settings = kopf.OperatorSettings()
    apply_settings(settings, parse_args([], default_instance="x"))
    assert settings.persistence.finalizer.startswith("inferfleet.dev/")
    assert settings.posting.reporting_instance == "x"


def test_idle_kopf_workers_go_within_kopfs_default_linger():
    # Each lingering per-object worker holds its object's last event: at 1,000 nodes x 500 services a 30 s linger
    # cost 66 MB of peak RSS (see handlers.apply_settings).
    settings = kopf.OperatorSettings()
    apply_settings(settings, parse_args([], default_instance="x"))
    assert settings.queueing.idle_timeout <= kopf.OperatorSettings().queueing.idle_timeout


def test_every_handler_registers():
    registry = kopf.OperatorRegistry()
    register(registry, parse_args([], default_instance="x"))
    resources = {h.selector.any_name if h.selector else None for h in registry._indexing.get_all_handlers()}
    assert {
        "inferenceservices",
        "enginebuilds",
        "inferenceruntimes",
        "nodes",
        "deployments",
        "services",
        "poddisruptionbudgets",
        "jobs",
        "pods",
        "persistentvolumeclaims",
    } <= resources
    pod_indexes = {h.id for h in registry._indexing.get_all_handlers() if h.selector and h.selector.any_name == "pods"}
    assert pod_indexes == {"pod_index", "service_pod_index"}


def _kwok_node(heartbeat: str, **labels: str) -> dict:
    return {
        "metadata": {"name": "n1", "labels": {"kubernetes.io/arch": "amd64", **labels}, "resourceVersion": heartbeat},
        "spec": {"taints": [], "podCIDR": "10.0.0.0/24"},
        "status": {
            "allocatable": {"nvidia.com/gpu": "8"},
            "capacity": {"nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": heartbeat}],
            "images": [{"names": [heartbeat]}],
        },
    }


def test_node_heartbeats_do_not_change_what_pools_are_made_of():
    assert node_view(_kwok_node("t1")) == node_view(_kwok_node("t2"))


def test_node_labels_taints_capacity_and_readiness_do():
    base = _kwok_node("t1")
    relabelled = _kwok_node("t1", **{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})
    assert node_view(relabelled) != node_view(base)
    tainted = _kwok_node("t1")
    tainted["spec"]["taints"] = [{"key": "gpu", "effect": "NoSchedule"}]
    assert node_view(tainted) != node_view(base)
    shrunk = _kwok_node("t1")
    shrunk["status"]["allocatable"] = {"nvidia.com/gpu": "4"}
    assert node_view(shrunk) != node_view(base)
    not_ready = _kwok_node("t1")
    not_ready["status"]["conditions"][0]["status"] = "False"
    assert node_view(not_ready) != node_view(base)


def test_routing_and_autoscaling_flags_parse_and_bad_ones_are_refused_naming_the_flag(capsys):
    config = parse_args(
        [
            "--inference-pools=disabled",
            "--autoscale-seconds=5",
            "--scrape-url-template=http://127.0.0.1:9000/{namespace}/{pod}",
        ],
        default_instance="x",
    )
    assert (config.inference_pools, config.autoscale_seconds) == ("disabled", 5.0)
    assert config.scrape_url_template == "http://127.0.0.1:9000/{namespace}/{pod}"
    assert parse_args([], default_instance="x").inference_pools == "auto"
    with pytest.raises(SystemExit):
        parse_args(["--scrape-url-template=http://{host}/metrics"], default_instance="x")
    assert "--scrape-url-template" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--autoscale-seconds=0"], default_instance="x")
    assert "--autoscale-seconds" in capsys.readouterr().err


def test_the_inference_pool_crd_is_watched_only_when_inference_pools_are_on():
    def watched(argv):
        registry = kopf.OperatorRegistry()
        register(registry, parse_args(argv, default_instance="x"))
        return {h.selector.any_name for h in registry._watching.get_all_handlers() if h.selector}

    assert "customresourcedefinitions" in watched([])
    assert "customresourcedefinitions" not in watched(["--inference-pools=disabled"])


def test_every_module_level_handler_is_registered_and_none_needs_a_finalizer():
    registry = kopf.OperatorRegistry()
    register(registry, parse_args([], default_instance="x"))
    kinds = (registry._activities, registry._indexing, registry._watching, registry._spawning)
    registered = {h.fn for kind in kinds for h in kind.get_all_handlers()}
    defined = {
        fn
        for name, fn in vars(handlers).items()
        if inspect.iscoroutinefunction(fn) and not name.startswith("_") and fn.__module__ == handlers.__name__
    }
    assert defined and defined == registered
    # No timer or daemon: kopf would put its finalizer on every object one runs for (a write per object on
    # create and on delete); the resync is the work queue's requeue (test_the_work_queue_resyncs_...).
    assert not registry._spawning.get_all_handlers()
    assert not any(getattr(h, "requires_finalizer", None) for kind in kinds for h in kind.get_all_handlers())


def test_no_handler_needs_kopfs_diff_base_so_none_is_built():
    # NoDiffBase skips kopf's per-event copy of each object; only on.create/update/field handlers read it.
    registry = kopf.OperatorRegistry()
    register(registry, parse_args([], default_instance="x"))
    assert not registry._changing.get_all_handlers()
    settings = kopf.OperatorSettings()
    apply_settings(settings, parse_args([], default_instance="x"))
    body = kopf.Body({"metadata": {"name": "s", "labels": {"a": "b"}}, "spec": {"replicas": 1}})
    assert settings.persistence.diffbase_storage.build(body=body) == {}
