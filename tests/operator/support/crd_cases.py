"""Admission cases of the CEL rules and schema bounds added for placement, quantities, images, tolerations, model
access and builds: each rule with a valid and an invalid object, shared by the offline check (test_crds) and the
real API server (test_crds_apiserver)."""

from __future__ import annotations

import copy

SERVICE = {
    "apiVersion": "inferfleet.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "llama", "namespace": "default"},
    "spec": {"model": {"name": "llama-3-8b", "uri": "hf://meta-llama/Llama-3-8B"}},
}
RUNTIME = {
    "apiVersion": "inferfleet.dev/v1alpha1",
    "kind": "InferenceRuntime",
    "metadata": {"name": "rt"},
    "spec": {"engine": "Paged", "vendors": ["intel"], "image": "inferfleet/runtime-xpu:1"},
}


def service(**spec) -> dict:
    obj = copy.deepcopy(SERVICE)
    for key, value in spec.items():
        obj["spec"][key] = value if not isinstance(value, dict) else obj["spec"].get(key, {}) | value
    return obj


def runtime(**spec) -> dict:
    obj = copy.deepcopy(RUNTIME)
    obj["spec"].update(spec)
    return obj


def toleration(**fields) -> dict:
    return service(placement={"tolerations": [fields]})


MODEL = SERVICE["spec"]["model"]

# id -> (file, object, field the API server names or None when valid, message it gives)
CASES = {
    "pool overrides summing to replicas": ("inferenceservices.yaml", service(replicas=4, pools=[{"name": "a", "replicas": 2}, {"name": "b", "replicas": 2}]), None, ""),
    "pool overrides summing past replicas": ("inferenceservices.yaml", service(replicas=2, pools=[{"name": "a", "replicas": 2}, {"name": "b", "replicas": 2}]),
                                             "spec.pools", "the sum of pools[].replicas must be at most replicas"),
    "memory in binary units": ("inferenceservices.yaml", service(resources={"memory": "512Mi"}), None, ""),
    "memory 512m": ("inferenceservices.yaml", service(resources={"memory": "512m"}), "spec.resources.memory", "resources.memory must be whole bytes"),
    "build memory 1.5Gi": ("inferenceservices.yaml", service(build={"resources": {"memory": "1.5Gi"}}), None, ""),
    "build memory 100m": ("inferenceservices.yaml", service(build={"resources": {"memory": "100m"}}), "spec.build.resources.memory", "build.resources.memory must be whole bytes"),
    "model size 20Gi": ("inferenceservices.yaml", service(model=MODEL | {"size": "20Gi"}), None, ""),
    "model size 20m": ("inferenceservices.yaml", service(model=MODEL | {"size": "20m"}), "spec.model.size", "model.size must be whole bytes"),
    "build deadline 600": ("inferenceservices.yaml", service(build={"deadlineSeconds": 600}), None, ""),
    "build deadline 10": ("inferenceservices.yaml", service(build={"deadlineSeconds": 10}), "spec.build.deadlineSeconds", "greater than or equal to 60"),
    "credentials secret hf-token": ("inferenceservices.yaml", service(model=MODEL | {"credentialsSecret": "hf-token"}), None, ""),
    "credentials secret Bad_Name": ("inferenceservices.yaml", service(model=MODEL | {"credentialsSecret": "Bad_Name"}), "spec.model.credentialsSecret", "should match"),
    "model quantization Int4": ("inferenceservices.yaml", service(model=MODEL | {"quantization": "Int4"}), None, ""),
    "model quantization int4": ("inferenceservices.yaml", service(model=MODEL | {"quantization": "int4"}), "spec.model.quantization", "Unsupported value"),
    "api key secret llama-keys": ("inferenceservices.yaml", service(auth={"apiKeySecret": {"name": "llama-keys"}}), None, ""),
    "api key secret Bad_Name": ("inferenceservices.yaml", service(auth={"apiKeySecret": {"name": "Bad_Name"}}), "spec.auth.apiKeySecret.name", "should match"),
    "api key secret key 'a b'": ("inferenceservices.yaml", service(auth={"apiKeySecret": {"name": "k", "key": "a b"}}), "spec.auth.apiKeySecret.key", "should match"),
    "network policy from a gateway's pods": ("inferenceservices.yaml", service(networkPolicy={"allow": [{"namespace": "gateway", "podLabels": {"app.kubernetes.io/name": "envoy"}}]}), None, ""),
    "network policy admitting no one": ("inferenceservices.yaml", service(networkPolicy={}), None, ""),
    "network policy namespace Bad_NS": ("inferenceservices.yaml", service(networkPolicy={"allow": [{"namespace": "Bad_NS"}]}), "spec.networkPolicy.allow[0].namespace", "should match"),
    "network policy exposure Namespace with a gateway": ("inferenceservices.yaml", service(networkPolicy={"exposure": "Namespace", "allow": [{"namespace": "gateway"}]}), None, ""),
    "network policy exposure Cluster": ("inferenceservices.yaml", service(networkPolicy={"exposure": "Cluster"}), None, ""),
    "network policy exposure Cluster with allow": ("inferenceservices.yaml", service(networkPolicy={"exposure": "Cluster", "allow": [{"namespace": "gateway"}]}),
                                                   "spec.networkPolicy", "networkPolicy.allow has no effect with exposure Cluster"),
    "network policy exposure Everyone": ("inferenceservices.yaml", service(networkPolicy={"exposure": "Everyone"}), "spec.networkPolicy.exposure", "Unsupported value"),
    "network policy pod label 'a b'": ("inferenceservices.yaml", service(networkPolicy={"allow": [{"podLabels": {"app": "a b"}}]}), "spec.networkPolicy.allow[0].podLabels.app", "should match"),
    "gpu taint toleration off": ("inferenceservices.yaml", service(placement={"tolerateGpuTaints": False}), None, ""),
    "toleration key nvidia.com/gpu": ("inferenceservices.yaml", toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"), None, ""),
    "toleration key 'bad key!'": ("inferenceservices.yaml", toleration(key="bad key!", operator="Exists"), "spec.placement.tolerations[0].key", "tolerations[].key must be a label key"),
    "toleration without key, Exists": ("inferenceservices.yaml", toleration(operator="Exists"), None, ""),
    "toleration without key, Equal": ("inferenceservices.yaml", toleration(value="x"), "spec.placement.tolerations[0]", "operator must be Exists when key is empty"),
    "toleration value 'a b'": ("inferenceservices.yaml", toleration(key="k", value="a b"), "spec.placement.tolerations[0].value", "tolerations[].value must be a label value"),
    "tolerationSeconds with NoExecute": ("inferenceservices.yaml", toleration(key="k", operator="Exists", effect="NoExecute", tolerationSeconds=60), None, ""),
    "tolerationSeconds with NoSchedule": ("inferenceservices.yaml", toleration(key="k", operator="Exists", effect="NoSchedule", tolerationSeconds=60),
                                          "spec.placement.tolerations[0]", "tolerationSeconds needs effect NoExecute"),
    "runtime image empty": ("inferenceruntimes.yaml", runtime(image=""), "spec.image", "image must name a container image"),
    "runtime image with a space": ("inferenceruntimes.yaml", runtime(image="inferfleet/runtime xpu"), "spec.image", "image must name a container image"),
    "compiled runtime with images": ("inferenceruntimes.yaml", runtime(engine="Compiled", vendors=["nvidia"], compileImage="c:1"), None, ""),
    "compiled runtime compileImage empty": ("inferenceruntimes.yaml", runtime(engine="Compiled", vendors=["nvidia"], compileImage=""),
                                            "spec.compileImage", "compileImage is required when engine is Compiled"),
}  # fmt: skip
