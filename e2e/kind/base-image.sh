#!/usr/bin/env bash
# Prints the name of a Debian bookworm base image present in the local Docker engine: the official
# debian:bookworm when a registry answers, otherwise one made here with debootstrap (minbase, from
# the Debian mirror apt uses) and `docker import`, built once and kept. Progress goes to stderr.
set -euo pipefail
official=debian:bookworm
local_name=inferfleet/debian:bookworm
log() { echo "[base] $*" >&2; }

for name in "$official" "$local_name"; do
  if docker image inspect "$name" >/dev/null 2>&1; then echo "$name"; exit 0; fi
done
if [ -z "${INFERFLEET_NO_PULL:-}" ] && timeout 60 docker pull -q "$official" >/dev/null 2>&1; then
  log "Pulled $official"; echo "$official"; exit 0
fi
log "No registry answered for $official: making $local_name with debootstrap"
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi; }
if ! command -v debootstrap >/dev/null; then
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >&2
fi
# The mirror apt is configured with (deb822 or one-line sources), so this works behind a mirror too.
mirror=$(cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null | grep -E '^(URIs:|deb )' |
  grep -v security | head -n 1 | sed -E 's/^URIs: *//; s/^deb (\[[^]]*\] )?//; s/ .*//' || true)
mirror=${mirror:-http://deb.debian.org/debian}
dir=$(mktemp -d "${TMPDIR:-/tmp}/inferfleet-debootstrap.XXXXXX")
trap 'as_root rm -rf "$dir"' EXIT
began=$(date +%s)
as_root debootstrap --variant=minbase --include=ca-certificates bookworm "$dir" "$mirror" >&2
as_root rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
as_root tar -C "$dir" -c . | docker import -c 'CMD ["/bin/bash"]' - "$local_name" >/dev/null
log "Made $local_name in $(( $(date +%s) - began )) s"
echo "$local_name"
