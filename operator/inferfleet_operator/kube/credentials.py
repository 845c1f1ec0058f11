"""Who the operator is to the API server: loaded by the official `kubernetes` package, shared by kube.py and kopf.

The official loader handles what kubeconfigs carry in practice: exec plugins (EKS, GKE, AKS; re-run when
their credential expires), `tokenFile`, paths relative to the kubeconfig's folder, inline data, `proxy-url`,
`tls-server-name`, client certificates; and in a pod the ServiceAccount token, re-read as the kubelet
rotates it. This module turns its `Configuration` into the operator's one HTTP stack: an aiohttp session
(kopf's watches and the write path, kube.py) with its SSL context, proxy and an Authorization header computed
per request.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class CredentialsError(RuntimeError):
    """Neither in-cluster credentials nor a usable kubeconfig."""


class _NamedServerContext(ssl.SSLContext):
    """An SSL context that sends and verifies `tls_server_name` instead of the host dialled (kubeconfig
    `tls-server-name`: an API server reached by IP or through a tunnel whose certificate names another host).
    asyncio (aiohttp) opens TLS through wrap_bio; wrap_socket covers blocking clients."""

    tls_server_name: str | None = None

    def wrap_bio(self, incoming, outgoing, server_side=False, server_hostname=None, session=None):
        return super().wrap_bio(incoming, outgoing, server_side, self.tls_server_name or server_hostname, session)

    def wrap_socket(
        self,
        sock,
        server_side=False,
        do_handshake_on_connect=True,
        suppress_ragged_eofs=True,
        server_hostname=None,
        session=None,
    ):
        return super().wrap_socket(
            sock,
            server_side,
            do_handshake_on_connect,
            suppress_ragged_eofs,
            self.tls_server_name or server_hostname,
            session,
        )


@dataclass(frozen=True)
class Credentials:
    """A loaded `kubernetes.client.Configuration` and what the operator's clients read from it."""

    configuration: Any  # kubernetes.client.Configuration; Any keeps the import out of module load
    source: str  # "in-cluster" or the kubeconfig path, for the start-up log line

    @classmethod
    def load(
        cls, kubeconfig: str | None = None, context: str | None = None, environ: Mapping[str, str] | None = None
    ) -> Credentials:
        """In a pod (KUBERNETES_SERVICE_HOST set and a ServiceAccount token mounted) its ServiceAccount;
        else the kubeconfig (`kubeconfig`, else $KUBECONFIG, else ~/.kube/config) and its current context."""
        from kubernetes import client, config

        environ = os.environ if environ is None else environ
        configuration = client.Configuration()
        if kubeconfig is None:
            try:
                config.load_incluster_config(client_configuration=configuration, try_refresh_token=True)
                return cls(configuration, "in-cluster")
            except config.ConfigException:
                pass
        path = (
            kubeconfig or (environ.get("KUBECONFIG") or "").split(os.pathsep)[0] or os.path.expanduser("~/.kube/config")
        )
        if not os.path.exists(path):
            raise CredentialsError(f"No credentials: not in a cluster and no kubeconfig at {path} (set KUBECONFIG)")
        try:
            config.load_kube_config(
                config_file=path, context=context, client_configuration=configuration, persist_config=False
            )
        except (config.ConfigException, OSError, ValueError) as exc:
            raise CredentialsError(f"Could not load kubeconfig {path}: {exc}") from exc
        return cls(configuration, path)

    def reloaded(self) -> Credentials:
        """Loaded again from the same source (an exec plugin runs again)."""
        return Credentials.load(None if self.source == "in-cluster" else self.source)

    @property
    def server(self) -> str:
        return self.configuration.host.rstrip("/")

    @property
    def proxy(self) -> str | None:
        return self.configuration.proxy or None

    @property
    def tls_server_name(self) -> str | None:
        return getattr(self.configuration, "tls_server_name", None) or None

    def authorization(self) -> str | None:
        """The Authorization header value now. The loader's refresh hook re-runs an expired exec plugin or
        re-reads a rotated ServiceAccount token; basic auth from the kubeconfig is honoured too."""
        c = self.configuration
        header = c.get_api_key_with_prefix("BearerToken") or c.get_api_key_with_prefix("authorization")
        if header:
            # The loaders store "Bearer <token>" (kubeconfig) or "bearer <token>" (in-cluster).
            scheme, _, token = header.strip().partition(" ")
            return f"Bearer {token.strip()}" if scheme.lower() == "bearer" else f"Bearer {scheme}"
        if c.username and c.password:
            return c.get_basic_auth_token()
        return None

    def ssl_context(self) -> ssl.SSLContext:
        c = self.configuration
        context = _NamedServerContext(ssl.PROTOCOL_TLS_CLIENT)
        context.tls_server_name = self.tls_server_name
        if c.verify_ssl:
            context.verify_mode = ssl.CERT_REQUIRED
            context.check_hostname = True
            if c.ssl_ca_cert:
                context.load_verify_locations(cafile=c.ssl_ca_cert)
            else:
                context.load_default_certs()
        else:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if c.cert_file and c.key_file:
            context.load_cert_chain(c.cert_file, c.key_file)
        return context

    def aiohttp_session(self, timeout: float | None = None, max_connections: int = 0):
        """An aiohttp session for kopf's watches (returned by the login handler as kopf.AiohttpSession) and
        for the write path (kube.Kube.connect): TLS and proxy from the credentials, an Authorization header
        set on each request (the official loader refreshes an expired exec-plugin credential or a rotated
        ServiceAccount token when asked). A 401 loads the credentials again once and retries (a credential
        revoked early, or an exec plugin that states no expiry), as kopf does. `timeout`: seconds per
        request (None: none, for watches); `max_connections`: 0 for no limit (a watch holds one for as
        long as it lasts). Call it inside the event loop that uses it."""
        import aiohttp

        current = self

        async def authorize(request: aiohttp.ClientRequest, handler):
            nonlocal current
            if header := current.authorization():
                request.headers["Authorization"] = header
            response = await handler(request)
            if response.status != 401:
                return response
            response.release()
            current = current.reloaded()
            if header := current.authorization():
                request.headers["Authorization"] = header
            return await handler(request)

        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=max_connections, ssl=self.ssl_context()),
            proxy=self.proxy,
            middlewares=(authorize,),
            timeout=aiohttp.ClientTimeout(total=timeout),
        )
