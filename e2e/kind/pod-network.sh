#!/usr/bin/env bash
# The pod network across a kind cluster's real nodes: usage pod-network.sh KUBECONFIG KUBECTL NODE...
# The assembled node image has no kindnetd (none can be pulled): each node's bridge CNI config gives its pods
# addresses from one /24, the same on every node. Here each node's config is set to the podCIDR the
# controller-manager allocated to it, and every node gets a route to every other node's pod range through that node
# (what kindnetd does). A pod already running on a node with an address outside its range is deleted, so its
# controller recreates it with a right one. Safe to run again.
set -euo pipefail
kubeconfig=$1 kubectl_bin=$2
shift 2
nodes=("$@")
kubectl=("$kubectl_bin" --kubeconfig "$kubeconfig")
conf=/etc/cni/net.d/10-inferfleet-bridge.conflist
declare -A cidr ip
for n in "${nodes[@]}"; do
  for _ in $(seq 60); do
    cidr[$n]=$("${kubectl[@]}" get node "$n" -o jsonpath='{.spec.podCIDR}')
    [ -z "${cidr[$n]}" ] || break
    sleep 1
  done
  [ -n "${cidr[$n]}" ] || { echo "[kind] node $n has no podCIDR" >&2; exit 1; }
  case "${cidr[$n]}" in *.0/24) ;; *) echo "[kind] node $n: podCIDR ${cidr[$n]} is not a /24" >&2; exit 1 ;; esac
  ip[$n]=$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$n")
done
for n in "${nodes[@]}"; do
  docker exec "$n" sed -i -E "s|\"subnet\": \"[0-9./]+\"|\"subnet\": \"${cidr[$n]}\"|" "$conf"
  for other in "${nodes[@]}"; do
    [ "$other" = "$n" ] || docker exec "$n" ip route replace "${cidr[$other]}" via "${ip[$other]}"
  done
  prefix=${cidr[$n]%.0/24}.
  "${kubectl[@]}" get pods -A --field-selector "spec.nodeName=$n" \
    -o jsonpath='{range .items[*]}{.metadata.namespace} {.metadata.name} {.status.podIP} {.spec.hostNetwork}{"\n"}{end}' |
    while read -r namespace name pod_ip host_network; do
      if [ "$host_network" != true ] && [ -n "$pod_ip" ] && [ "${pod_ip#"$prefix"}" = "$pod_ip" ]; then
        "${kubectl[@]}" delete pod -n "$namespace" "$name" --wait=false >/dev/null
        echo "[kind]   $namespace/$name on $n had $pod_ip, outside ${cidr[$n]}: deleted (its controller makes it again)" >&2
      fi
    done
  echo "[kind]   $n: pods from ${cidr[$n]}, routes to the other nodes' ranges" >&2
done
