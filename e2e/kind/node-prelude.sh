#!/bin/bash
# Runs before kind's entrypoint in the locally assembled node image. It changes nothing on a node
# started with --privileged; on one started with the capability set that e2e/kind/docker-shim/docker
# uses instead (hosts where --privileged fails), it makes the node work like a privileged one.
set -euo pipefail
# Docker mounts the cgroup hierarchy read-only without --privileged; kubelet and containerd write it.
while read -r mount_point; do
  mount -o remount,bind,rw "$mount_point" 2>/dev/null || true
done < <(awk '$5 ~ "^/sys/fs/cgroup" && $6 ~ /(^|,)ro(,|$)/ { print $5 }' /proc/self/mountinfo)
# Without CAP_SYS_RESOURCE in the bounding set a negative oom_score_adj cannot be set, and every pod
# sandbox would fail ("can't get final child's PID from pipe"): containerd must not try.
cap_bnd=$(awk '/^CapBnd:/ { print $2 }' /proc/self/status)
if (( ((16#$cap_bnd) >> 24 & 1) == 0 )); then
  sed -i 's/restrict_oom_score_adj = false/restrict_oom_score_adj = true/' /etc/containerd/config.toml
fi
exec "$@"
