#!/usr/bin/env bash
# Starts a local Kubernetes control plane on loopback (etcd, kube-apiserver with client-certificate
# and ServiceAccount-token authentication and Node,RBAC authorization, kube-controller-manager,
# kube-scheduler) plus the KWOK controller for simulated GPU nodes, then registers the node fleet in
# e2e/nodes/. Writes the admin kubeconfig to e2e/.state/kubeconfig. Progress goes to stderr; nothing
# goes to stdout. Running it while the cluster is up changes nothing.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
# shellcheck source=pins.env
source "$root/e2e/cluster/pins.env"
lock_cluster
started=$(date +%s.%N)

running=0
for c in "${components[@]}"; do [ -n "$(component_pid "$c")" ] && running=$((running + 1)); done
if [ "$running" -eq "${#components[@]}" ] && [ -s "$state/kubeconfig" ]; then
  bin=$(cluster_bin)
  if "$bin/kubectl" --kubeconfig "$state/kubeconfig" get --raw /readyz >/dev/null 2>&1; then
    log "Cluster already up (kubeconfig $state/kubeconfig)"
    exit 0
  fi
fi
if [ -d "$state" ] && ! is_cluster_state && [ -n "$(ls -A "$state")" ]; then
  log "Refusing to use $state: it is not empty and up.sh did not create it"
  exit 1
fi
if [ "$running" -gt 0 ] || [ -d "$state" ]; then
  log "Found a partial cluster in $state; stopping it first"
  bash "$root/e2e/cluster/down.sh"
fi

bin=$(cluster_bin)
kubectl=("$bin/kubectl" --kubeconfig "$state/kubeconfig")
pki="$state/pki"
mkdir -p "$state"
touch "$state/$marker"
mkdir -p "$pki" "$state/run" "$state/logs"
mkdir -m 700 "$state/etcd"
chmod 700 "$state"

# Free loopback ports, chosen by the kernel, so several work trees can each run a cluster.
read -r etcd_port peer_port api_port kwok_port < <(python3 - <<'PY'
import socket
socks = [socket.socket() for _ in range(4)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
PY
)
printf 'ETCD_PORT=%s\nAPI_PORT=%s\nKWOK_PORT=%s\n' "$etcd_port" "$api_port" "$kwok_port" > "$state/ports.env"

log "Generating certificates in $pki"
ssl() { openssl "$@" 2>/dev/null; }
ssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
  -subj "/CN=inferfleet-e2e-ca" -keyout "$pki/ca.key" -out "$pki/ca.crt"
# cert NAME SUBJECT EXTENSIONS: a P-256 key and a certificate signed by the cluster CA.
cert() {
  ssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "$2" \
    -keyout "$pki/$1.key" -out "$pki/$1.csr"
  ssl x509 -req -in "$pki/$1.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 365 -out "$pki/$1.crt" -extfile <(printf '%s\n' "$3")
}
cert apiserver "/CN=kube-apiserver" "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
extendedKeyUsage=serverAuth
keyUsage=digitalSignature,keyEncipherment"
client_ext="extendedKeyUsage=clientAuth
keyUsage=digitalSignature,keyEncipherment"
cert admin "/O=system:masters/CN=inferfleet-admin" "$client_ext"
cert controller-manager "/CN=system:kube-controller-manager" "$client_ext"
cert scheduler "/CN=system:kube-scheduler" "$client_ext"
cert kwok "/O=system:masters/CN=kwok-controller" "$client_ext"
# ServiceAccount tokens are signed with this key (kube-apiserver issues, kube-controller-manager
# also signs legacy token Secrets); the public half verifies them.
ssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$pki/sa.key"
ssl pkey -in "$pki/sa.key" -pubout -out "$pki/sa.pub"
chmod 600 "$pki"/*.key

server="https://127.0.0.1:$api_port"
b64() { base64 -w0 < "$1"; }
# kubeconfig FILE USER: a kubeconfig that authenticates with USER's client certificate.
kubeconfig() {
  cat > "$1" <<YAML
apiVersion: v1
kind: Config
clusters:
- name: inferfleet-e2e
  cluster:
    server: $server
    certificate-authority-data: $(b64 "$pki/ca.crt")
users:
- name: $2
  user:
    client-certificate-data: $(b64 "$pki/$2.crt")
    client-key-data: $(b64 "$pki/$2.key")
contexts:
- name: inferfleet-e2e
  context: {cluster: inferfleet-e2e, user: $2}
current-context: inferfleet-e2e
YAML
  chmod 600 "$1"
}
kubeconfig "$state/kubeconfig" admin
kubeconfig "$state/controller-manager.kubeconfig" controller-manager
kubeconfig "$state/scheduler.kubeconfig" scheduler
kubeconfig "$state/kwok.kubeconfig" kwok

# start NAME ARGS...: runs a component in its own session, detached from this script.
start() {
  local name=$1; shift
  log "Starting $name"
  setsid "$@" >"$state/logs/$name.log" 2>&1 </dev/null &
  echo $! > "$state/run/$name.pid"
}
# wait_until SECONDS WHAT COMMAND...: retries COMMAND every 0.2 s until it succeeds.
wait_until() {
  local deadline=$(( $(date +%s) + $1 )) what=$2; shift 2
  until "$@" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      log "Timed out waiting for $what; last log lines:"
      for c in "${components[@]}"; do
        [ -f "$state/logs/$c.log" ] && { echo "--- $c" >&2; tail -n 15 "$state/logs/$c.log" >&2; }
      done
      return 1
    fi
    sleep 0.2
  done
}

start etcd "$bin/etcd" --name inferfleet-e2e --data-dir "$state/etcd" \
  --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
  --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
  --initial-cluster "inferfleet-e2e=http://127.0.0.1:$peer_port" \
  --unsafe-no-fsync --log-level warn
wait_until 30 etcd curl -sf "http://127.0.0.1:$etcd_port/health"

# PodSecurity and ServiceAccount admission are on by default; NodeRestriction pairs with the Node
# authorizer. The endpoint reconciler is off because a loopback address is not a valid endpoint
# for the in-cluster "kubernetes" Service.
start kube-apiserver "$bin/kube-apiserver" \
  --etcd-servers "http://127.0.0.1:$etcd_port" \
  --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" \
  --cert-dir "$pki" --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
  --client-ca-file "$pki/ca.crt" \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
  --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
  --service-cluster-ip-range 10.96.0.0/16 --allow-privileged=true \
  --endpoint-reconciler-type none --profiling="${INFERFLEET_APISERVER_PROFILING:-false}"  # true: /debug/pprof for benchmarks
wait_until 60 kube-apiserver "${kubectl[@]}" get --raw /readyz

# Node heartbeats are the fleet simulator's standing load: kwok renews each node's Lease every quarter
# of its duration, and a node whose Lease is older than the node lifecycle controller's grace period
# turns NotReady for good (kwok does not make its pods Ready again). At the 40 s Leases of kubelet's
# default, 1,000 nodes cost 100 Lease writes a second, more than two cores keep up with next to the
# workload under test (the scale benchmark's nodes starved). A 1,200 s Lease is renewed every 300 s
# (3.3 writes a second at 1,000 nodes) and the grace period of an hour leaves twelve renewals of slack.
lease_seconds=1200
node_grace_seconds=3600
start kube-controller-manager "$bin/kube-controller-manager" \
  --kubeconfig "$state/controller-manager.kubeconfig" --secure-port 0 --leader-elect=false \
  --controllers '*' --use-service-account-credentials=true \
  --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
  --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
  --allocate-node-cidrs=false --kube-api-qps 100 --kube-api-burst 200 --profiling=false \
  --node-monitor-grace-period "${node_grace_seconds}s"
start kube-scheduler "$bin/kube-scheduler" \
  --kubeconfig "$state/scheduler.kubeconfig" --secure-port 0 --leader-elect=false --profiling=false
# kwok's own node and pod stages, read from its module in the Go module cache, plus ours.
kwok_mod=$(GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
kwok_stages="$kwok_mod/kustomize/stage"
stage_args=()
for f in "$kwok_stages/node/fast/node-initialize.yaml" "$kwok_stages/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml" \
  "$kwok_stages/pod/fast/pod-ready.yaml" "$kwok_stages/pod/fast/pod-delete.yaml" "$root"/e2e/cluster/stages/*.yaml; do
  [ -f "$f" ] || { log "Missing kwok stage file $f"; exit 1; }
  stage_args+=(--config "$f")
done
# kwok manages only nodes annotated kwok.x-k8s.io/node=fake and renews their leases itself, so the
# node lifecycle controller sees live nodes; pod IPs come from a /16 so fleets of pods fit.
start kwok "$bin/kwok" --kubeconfig "$state/kwok.kubeconfig" "${stage_args[@]}" \
  --manage-all-nodes=false --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
  --node-lease-duration-seconds "$lease_seconds" --cidr 10.244.0.0/16 \
  --server-address "127.0.0.1:$kwok_port" --node-ip 127.0.0.1
wait_until 60 "the default ServiceAccount (kube-controller-manager)" "${kubectl[@]}" get serviceaccount default -n default

log "Registering KWOK nodes from e2e/nodes/"
"${kubectl[@]}" apply -f "$root/e2e/nodes/" >/dev/null
wait_until 60 "KWOK nodes to be Ready" "${kubectl[@]}" wait --for condition=Ready node --all --timeout 1s
for c in "${components[@]}"; do
  [ -n "$(component_pid "$c")" ] || { log "$c exited; see $state/logs/$c.log"; tail -n 20 "$state/logs/$c.log" >&2; exit 1; }
done
log "Cluster up in $(awk "BEGIN { printf \"%.1f\", $(date +%s.%N) - $started }") s; export KUBECONFIG=$state/kubeconfig"
