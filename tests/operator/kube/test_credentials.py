"""credentials.py: kubeconfigs as clusters hand them out, loaded by the official client, used by the operator's
aiohttp sessions (the write path, kube.Kube.connect, and kopf's watches).

A real TLS server on loopback (certificate for a name that is not the address dialled) stands in for the API
server; it records each request's Authorization header. A small CONNECT proxy stands in for `proxy-url`.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import socket
import ssl
import stat
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import aiohttp
import pytest
import yaml

from inferfleet_operator.kube.client import Kube
from inferfleet_operator.kube.credentials import Credentials, CredentialsError

SERVER_NAME = "api.inferfleet.test"
NODE = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """ca.crt, and server.crt/server.key for SERVER_NAME only (not 127.0.0.1), signed by the CA."""
    d = tmp_path_factory.mktemp("pki")
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=inferfleet-test-ca",
        cwd=d,
    )
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        f"/CN={SERVER_NAME}",
        cwd=d,
    )
    (d / "san.ext").write_text(f"subjectAltName=DNS:{SERVER_NAME}\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "san.ext",
        cwd=d,
    )
    return d


class ApiServer:
    """Answers every GET with NODE over TLS (401 for an Authorization in `refused`) and records
    (path, Authorization, SNI)."""

    def __init__(self, pki: Path):
        self.seen: list[tuple[str, str | None, str | None]] = []
        self.refused: set[str] = set()
        seen, server = self.seen, self
        sni: dict[str, str | None] = {}

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                seen.append((self.path, self.headers.get("Authorization"), sni.get("name")))
                refused = self.headers.get("Authorization") in server.refused
                body = json.dumps({"kind": "Status", "reason": "Unauthorized"} if refused else NODE).encode()
                self.send_response(401 if refused else 200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(pki / "server.crt", pki / "server.key")
        context.sni_callback = lambda sock, name, ctx: sni.__setitem__("name", name)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"https://127.0.0.1:{self.httpd.server_address[1]}"

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class ConnectProxy:
    """An HTTP CONNECT proxy that records each tunnel's target and pipes bytes both ways."""

    def __init__(self):
        self.targets: list[str] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._tunnel, args=(client,), daemon=True).start()

    def _tunnel(self, client: socket.socket):
        head = b""
        while b"\r\n\r\n" not in head:
            head += client.recv(4096)
        target = head.split()[1].decode()
        self.targets.append(target)
        host, port = target.rsplit(":", 1)
        upstream = socket.create_connection((host, int(port)))
        client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket):
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stop(self):
        self.sock.close()


@pytest.fixture
def api(pki):
    server = ApiServer(pki)
    yield server
    server.stop()


def _kubeconfig(folder: Path, cluster: dict, user: dict) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "test",
        "clusters": [{"name": "test", "cluster": cluster}],
        "users": [{"name": "test", "user": user}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config"
    path.write_text(yaml.safe_dump(config))
    return path


def _exec_plugin(folder: Path, expired: bool) -> dict:
    """A kubeconfig exec plugin printing an ExecCredential whose token counts the plugin's runs."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "credential-plugin"
    expiry = "2000-01-01T00:00:00Z" if expired else "2999-01-01T00:00:00Z"
    script.write_text(f"""#!{sys.executable}
import json, pathlib
runs = pathlib.Path({str(folder / "runs")!r})
n = int(runs.read_text()) + 1 if runs.exists() else 1
runs.write_text(str(n))
print(json.dumps({{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                  "status": {{"token": f"exec-token-{{n}}", "expirationTimestamp": {expiry!r}}}}}))
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return {
        "exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(script), "interactiveMode": "Never"}
    }


def _get_node(credentials: Credentials) -> dict:
    async def go():
        kube = Kube.connect(credentials)
        try:
            return await kube.get("v1", "Node", None, "n1")
        finally:
            await kube.close()

    return asyncio.run(go())


def _get_node_with_aiohttp(credentials: Credentials) -> int:
    async def go():
        async with credentials.aiohttp_session() as session:
            async with session.get(f"{credentials.server}/api/v1/nodes/n1") as response:
                return response.status

    return asyncio.run(go())


def test_relative_ca_path_tls_server_name_and_token_file_authenticate_both_clients(api, pki, tmp_path):
    folder = tmp_path / "kube"
    folder.mkdir()
    (folder / "certs").mkdir()
    (folder / "certs" / "ca.crt").write_bytes((pki / "ca.crt").read_bytes())
    (folder / "token").write_text("file-token\n")
    path = _kubeconfig(
        folder,
        {"server": api.url, "certificate-authority": "certs/ca.crt", "tls-server-name": SERVER_NAME},
        {"tokenFile": "token"},
    )
    credentials = Credentials.load(str(path))
    assert _get_node(credentials) == NODE
    assert _get_node_with_aiohttp(credentials) == 200  # kopf's watches use this session
    assert api.seen == [("/api/v1/nodes/n1", "Bearer file-token", SERVER_NAME)] * 2


def test_without_tls_server_name_the_certificate_does_not_match_the_address(api, pki, tmp_path):
    path = _kubeconfig(tmp_path, {"server": api.url, "certificate-authority": str(pki / "ca.crt")}, {"token": "t"})
    with pytest.raises(aiohttp.ClientConnectorCertificateError, match="CERTIFICATE_VERIFY_FAILED"):
        _get_node(Credentials.load(str(path)))
    assert api.seen == []


def test_exec_plugin_credential_is_used_and_run_again_once_expired(api, pki, tmp_path):
    cluster = {"server": api.url, "certificate-authority-data": _b64(pki / "ca.crt"), "tls-server-name": SERVER_NAME}
    fresh = Credentials.load(str(_kubeconfig(tmp_path / "a", cluster, _exec_plugin(tmp_path / "a", expired=False))))
    _get_node(fresh)
    _get_node(fresh)
    expiring = Credentials.load(str(_kubeconfig(tmp_path / "b", cluster, _exec_plugin(tmp_path / "b", expired=True))))
    _get_node(expiring)
    _get_node(expiring)
    tokens = [auth for _, auth, _ in api.seen]
    assert tokens[:2] == ["Bearer exec-token-1"] * 2  # a valid credential is reused
    assert tokens[2] != tokens[3] and all(t.startswith("Bearer exec-token-") for t in tokens[2:])


def test_a_refused_credential_is_loaded_again_once_and_the_request_retried(api, pki, tmp_path):
    cluster = {"server": api.url, "certificate-authority-data": _b64(pki / "ca.crt"), "tls-server-name": SERVER_NAME}
    credentials = Credentials.load(str(_kubeconfig(tmp_path, cluster, _exec_plugin(tmp_path, expired=False))))
    api.refused.add("Bearer exec-token-1")  # revoked before the expiry the plugin stated

    async def go():
        client = Kube.connect(credentials)
        try:
            return [await client.get("v1", "Node", None, "n1") for _ in range(2)]
        finally:
            await client.close()

    assert asyncio.run(go()) == [NODE, NODE]
    assert [auth for _, auth, _ in api.seen] == ["Bearer exec-token-1", "Bearer exec-token-2", "Bearer exec-token-2"]


def test_proxy_url_carries_both_clients_through_the_proxy(api, pki, tmp_path):
    proxy = ConnectProxy()
    try:
        path = _kubeconfig(
            tmp_path,
            {
                "server": api.url,
                "certificate-authority-data": _b64(pki / "ca.crt"),
                "tls-server-name": SERVER_NAME,
                "proxy-url": proxy.url,
            },
            {"token": "t"},
        )
        credentials = Credentials.load(str(path))
        assert _get_node(credentials) == NODE
        assert _get_node_with_aiohttp(credentials) == 200
    finally:
        proxy.stop()
    assert proxy.targets == [api.url.removeprefix("https://")] * 2
    assert [auth for _, auth, _ in api.seen] == ["Bearer t"] * 2


def test_in_cluster_token_is_read_again_after_rotation(tmp_path):
    from kubernetes import client
    from kubernetes.config.incluster_config import InClusterConfigLoader

    (tmp_path / "token").write_text("first")
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    configuration = client.Configuration()
    loader = InClusterConfigLoader(
        str(tmp_path / "token"),
        str(tmp_path / "ca.crt"),
        environ={"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"},
    )
    loader._token_refresh_period = datetime.timedelta(0)  # the loader re-reads once a minute; here at once
    loader.load_and_set(configuration)
    credentials = Credentials(configuration, "in-cluster")
    assert credentials.server == "https://10.0.0.1:443"
    assert credentials.authorization() == "Bearer first"
    (tmp_path / "token").write_text("second")  # the kubelet rotates the projected token
    assert credentials.authorization() == "Bearer second"


def test_no_kubeconfig_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(CredentialsError, match=r"no kubeconfig at .*absent \(set KUBECONFIG\)"):
        Credentials.load(environ={"KUBECONFIG": str(tmp_path / "absent")})


def _b64(path: Path) -> str:
    import base64

    return base64.b64encode(path.read_bytes()).decode()
