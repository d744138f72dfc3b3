"""A transport failure of the Kubernetes client names its cause: the OS or TLS error.

httpx's ``ConnectError`` often says nothing of its own; the refused connection or the
refused certificate is at the end of its chain, and the client's
:class:`~supervisor.kube.errors.TransportError` says it as
:func:`supervisor.errors.describe_failure` does (a refused certificate with where the
CA comes from).
"""

from __future__ import annotations

import socket
import ssl
from typing import Any

import httpx
import pytest
import trio

from supervisor.kube.client import KubeClient
from supervisor.kube.config import KubeSettings
from supervisor.kube.errors import TransportError, transport_error


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_a_refused_connection_names_the_os_error() -> None:
    port = _closed_port()

    async def settings() -> KubeSettings:
        return KubeSettings(host=f"http://127.0.0.1:{port}", source="kubeconfig /test")

    client = KubeClient(settings)
    try:
        with trio.fail_after(10), pytest.raises(TransportError) as refused:
            await client.request("GET", "/api/v1/namespaces", dict[str, Any])
    finally:
        await client.aclose()
    text = str(refused.value)
    assert text.startswith("GET /api/v1/namespaces: ConnectError: ")
    assert "Connection refused" in text
    assert isinstance(refused.value.__cause__, httpx.ConnectError)


def test_a_refused_certificate_says_why_and_where_the_ca_comes_from() -> None:
    verify = ssl.SSLCertVerificationError(1, "certificate verify failed")
    verify.reason = "CERTIFICATE_VERIFY_FAILED"
    verify.verify_message = "self-signed certificate"
    try:
        raise httpx.ConnectError("") from verify
    except httpx.ConnectError as exc:
        error = transport_error("GET /api", exc, certificate_hint="the CA of kubeconfig /x")
    assert str(error) == ("GET /api: ConnectError: TLS: CERTIFICATE_VERIFY_FAILED:"
                          " self-signed certificate (the CA of kubeconfig /x)")
