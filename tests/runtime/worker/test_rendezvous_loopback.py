"""The ranks of a tensor-parallel server, all in one pod, meet on loopback only: the rendezvous store (which any
client may read and write) and the collectives' sockets listen on 127.0.0.1, not on the pod's network."""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads listening sockets from Linux's /proc")

SIOCGIFADDR = 0x8915

TWO_RANKS = """
import os, subprocess, sys
import torch, torch.distributed as dist
from inferfleet_runtime.worker.tensor_parallel import init_group, rendezvous

if len(sys.argv) > 1:  # rank 1
    init_group(1, 2, rendezvous(2, int(sys.argv[1])), torch.device("cpu"))
    dist.barrier()  # both ranks are in the group
    dist.barrier()  # rank 0's test has looked at the sockets
    dist.destroy_process_group()
    sys.exit(0)
store = rendezvous(2)
worker = subprocess.Popen([sys.executable, __file__, str(store.port)])
init_group(0, 2, store, torch.device("cpu"))
dist.barrier()
print(os.getpid(), worker.pid, flush=True)
sys.stdin.readline()
dist.barrier()
dist.destroy_process_group()
sys.exit(worker.wait())
"""


def listening_addresses(pid: int | str = "self") -> list[tuple[str, int]]:
    """(local IP address, port) of each listening TCP socket of a process."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target.removeprefix("socket:[").removesuffix("]"))
    found = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                address, port = fields[1].split(":")
                raw = bytes.fromhex(address)  # 32-bit words, each little-endian
                ip = socket.inet_ntop(family, b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4)))
                found.append((ip, int(port, 16)))
    return found


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)


def network_interface() -> str | None:
    """A non-loopback interface of this machine with an IPv4 address, if any."""
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address
                continue
        if not ipaddress.ip_address(socket.inet_ntoa(packed[20:24])).is_loopback:
            return name
    return None


def test_the_rendezvous_store_listens_on_loopback_only():
    from inferfleet_runtime.worker.tensor_parallel import rendezvous

    store = rendezvous(2)
    addresses = [ip for ip, port in listening_addresses() if port == store.port]
    assert addresses and all(is_loopback(ip) for ip in addresses), addresses
    client = rendezvous(2, store.port)  # the ranks still meet
    client.set("seen", "yes")
    assert store.get("seen") == b"yes"


def test_two_ranks_listen_on_loopback_only_even_where_gloo_is_pointed_at_the_network(tmp_path):
    """GLOO_SOCKET_IFNAME names a network interface, as a pod's environment could: the ranks still listen on
    loopback alone (the pod's host name resolves to its network address, where gloo would otherwise listen)."""
    script = tmp_path / "two_ranks.py"
    script.write_text(TWO_RANKS)
    interface = network_interface()
    env = {**os.environ, **({"GLOO_SOCKET_IFNAME": interface} if interface else {})}
    ranks = subprocess.Popen(
        [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    watchdog = threading.Timer(120, ranks.kill)  # a rank that hangs fails the test, not the session
    watchdog.start()
    try:
        pids = [int(pid) for pid in ranks.stdout.readline().split()]
        assert len(pids) == 2, "the ranks did not meet"
        addresses = {pid: listening_addresses(pid) for pid in pids}
        ranks.stdin.write("\n")
        ranks.stdin.flush()
        assert ranks.wait(timeout=60) == 0
    finally:
        watchdog.cancel()
        ranks.kill()
    assert all(addresses.values()), addresses  # rank 0: the store and gloo's socket; rank 1: gloo's
    assert all(is_loopback(ip) for found in addresses.values() for ip, _ in found), addresses
