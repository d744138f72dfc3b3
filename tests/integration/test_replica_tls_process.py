"""TLS and mutual TLS between replicas, and the read-only token, through real processes.

A root replica (SQLite) serves its admin API over HTTPS and requires client
certificates signed by the fleet's CA; its followers verify it against
``[control_plane].ca_file``, present their own certificate, and authenticate
with the root's read-only token. Certificates are made per test with trustme.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from supervisor.sinks.lkg import generate_signing_key
from tests.polling import poll_until
from tests.proc import EXAMPLE, REPO, Daemon, acli, cli, free_port, run_daemon

trustme = pytest.importorskip("trustme")

POLL_S = 0.3
FULL_TOKEN = "root-admin-token"
READ_TOKEN = "root-read-token"


class Pki:
    """A CA, the root's server certificate and a follower's client certificate, as files."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir()
        self.dir = directory
        self.ca = trustme.CA()
        self.ca_file = directory / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_file))
        self.server_cert, self.server_key = self.issue("server", "127.0.0.1", "localhost")
        self.client_cert, self.client_key = self.issue("follower", "follower.example")

    def issue(self, name: str, *hosts: str) -> tuple[Path, Path]:
        leaf = self.ca.issue_cert(*hosts)
        cert, key = self.dir / f"{name}.pem", self.dir / f"{name}.key"
        for blob in leaf.cert_chain_pems:
            blob.write_to_path(str(cert), append=cert.exists())
        leaf.private_key_pem.write_to_path(str(key))
        key.chmod(0o600)
        return cert, key

    def client_context(self, *, with_cert: bool = True) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        if with_cert:
            context.load_cert_chain(str(self.client_cert), str(self.client_key))
        return context


def _secret(path: Path, text: str) -> Path:
    path.write_text(text + "\n")
    path.chmod(0o600)
    return path


def root_config(tmp: Path, pki: Pki, port: int, *, mtls: bool = True) -> tuple[Path, str]:
    directory = tmp / "root"
    directory.mkdir()
    key = tmp / "root.key"
    verify = generate_signing_key(str(key))
    full = _secret(tmp / "root-admin.token", FULL_TOKEN)
    read = _secret(tmp / "root-read.token", READ_TOKEN)
    config = directory / "supervisor.toml"
    config.write_text(f"""
[log]
level = "info"
format = "json"
[control_plane]
url = "sqlite:///{directory}/cp.db"
poll_interval_s = {POLL_S}
[cache]
path = "{directory}/cache/lkg.bin"
signing_key = "{key}"
trusted_keys = {json.dumps([verify])}
[admin]
listen = "127.0.0.1:{port}"
token_file = "{full}"
read_token_file = "{read}"
tls_cert_file = "{pki.server_cert}"
tls_key_file = "{pki.server_key}"
{f'client_ca_file = "{pki.ca_file}"' if mtls else ""}
""")
    return config, verify


def follower_config(tmp: Path, name: str, pki: Pki, root_port: int, root_verify: str,
                    *, ca: bool = True) -> tuple[Path, int]:
    directory = tmp / name
    directory.mkdir(exist_ok=True)
    key = directory / "own.key"
    verify = (json.loads((directory / "own.pub").read_text()) if key.exists()
              else generate_signing_key(str(key)))
    (directory / "own.pub").write_text(json.dumps(verify))
    port = free_port() if not (directory / "port").exists() else int(
        (directory / "port").read_text())
    (directory / "port").write_text(str(port))
    ca_line = f'ca_file = "{pki.ca_file}"\n' if ca else ""
    config = directory / "supervisor.toml"
    config.write_text(f"""
[log]
level = "info"
format = "json"
[control_plane]
url = "https://127.0.0.1:{root_port}"
poll_interval_s = {POLL_S}
backoff_initial_s = 0.1
backoff_max_s = 0.5
token_file = "{tmp / 'root-read.token'}"
{ca_line}client_cert_file = "{pki.client_cert}"
client_key_file = "{pki.client_key}"
trusted_keys = {json.dumps([root_verify])}
[cache]
path = "{directory}/cache/lkg.bin"
signing_key = "{key}"
trusted_keys = {json.dumps([verify])}
[admin]
listen = "127.0.0.1:{port}"
""")
    return config, port


async def status_of(port: int) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False) as http:
        return dict((await http.get("/status")).json())


async def wait_active(port: int, revision: int) -> dict[str, Any]:
    report: dict[str, Any] = {}

    async def active() -> bool:
        nonlocal report
        try:
            report = await status_of(port)
        except httpx.HTTPError:
            return False
        return bool(report["revision"]["active"] == revision)

    await poll_until(active)
    return report


def peer_certificate(port: int, pki: Pki) -> bytes:
    """The DER certificate the root presents to a new handshake."""
    import socket

    context = pki.client_context()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


async def test_followers_converge_over_mutual_tls_with_the_read_token(tmp_path: Path) -> None:
    pki = Pki(tmp_path / "pki")
    root_port = free_port()
    root, root_verify = root_config(tmp_path, pki, root_port)
    f1, f1_port = follower_config(tmp_path, "f1", pki, root_port, root_verify)
    f2, f2_port = follower_config(tmp_path, "f2", pki, root_port, root_verify)
    cli("publish", "--config", str(root), str(EXAMPLE))
    base = f"https://127.0.0.1:{root_port}"
    with trio.fail_after(120):
        async with AsyncExitStack() as stack:
            up: Daemon = await stack.enter_async_context(run_daemon(root))
            listening = await up.wait_log("admin API listening")
            assert listening["tls"] is True
            await up.wait_log("published", revision=1)
            await stack.enter_async_context(run_daemon(f1))
            async with run_daemon(f2) as second:
                for port in (f1_port, f2_port):
                    report = await wait_active(port, 1)
                    assert report["revision"]["source"] == base
                second.signal(signal.SIGTERM)
                assert await second.wait() == 0

            # Mutual TLS: the CA alone is not enough, a client certificate is needed.
            with pytest.raises(httpx.HTTPError):
                async with httpx.AsyncClient(verify=pki.client_context(with_cert=False),
                                             trust_env=False) as http:
                    await http.get(f"{base}/healthz")
            with pytest.raises(httpx.HTTPError):  # plain HTTP on the TLS port
                async with httpx.AsyncClient(trust_env=False) as http:
                    await http.get(f"http://127.0.0.1:{root_port}/healthz")
            async with httpx.AsyncClient(verify=pki.client_context(), trust_env=False,
                                         base_url=base) as http:
                assert (await http.get("/healthz")).status_code == 200
                read = {"authorization": f"Bearer {READ_TOKEN}"}
                full = {"authorization": f"Bearer {FULL_TOKEN}"}
                assert (await http.get("/status", headers=read)).status_code == 200
                assert (await http.get("/status")).status_code == 401
                # The read-only token reads but cannot act.
                r = await http.post("/v1/converge?timeout_s=10", headers=read)
                assert (r.status_code, r.json()["error"]) == (403, "read_only")
                r = await http.post("/v1/converge?timeout_s=10", headers=full)
                assert r.status_code == 200 and r.json()["outcome"] == "converged"

            # f2 without the CA: it refuses the root's certificate (the system's
            # trust store does not know it) and keeps serving its signed cache,
            # while f1 moves on to the next revision.
            follower_config(tmp_path, "f2", pki, root_port, root_verify, ca=False)
            async with run_daemon(f2) as blind:
                await blind.wait_log("ready")
                report = await wait_active(f2_port, 1)
                assert report["revision"]["source"] == "last_known_good"
                await acli("publish", "--config", str(root), "--force", str(EXAMPLE))
                await up.wait_log("published", revision=2)
                await wait_active(f1_port, 2)

                seen: list[Any] = []

                async def refused_the_certificate() -> bool:
                    revision = (await status_of(f2_port))["revision"]
                    seen[:] = [revision]
                    # The handshake fails (httpx reports it as a ConnectError with no
                    # text: the certificate's refusal is its innermost cause, named), where
                    # f1, with the CA, fetched revision 2 from the same root.
                    error = revision["last_error"] or ""
                    return (revision["control_plane_up"] is False
                            and revision["consecutive_failures"] > 0
                            and "unreachable: ConnectError: TLS: CERTIFICATE_VERIFY_FAILED: "
                            "self-signed certificate in certificate chain" in error
                            and error.endswith("([control_plane].ca_file)"))
                with trio.move_on_after(10) as waited:
                    await poll_until(refused_the_certificate)
                assert not waited.cancelled_caught, str(seen)
                assert (await status_of(f2_port))["revision"]["active"] == 1
                async with httpx.AsyncClient(trust_env=False) as http:
                    assert (await http.get(f"http://127.0.0.1:{f2_port}/healthz")
                            ).status_code == 200
                blind.signal(signal.SIGTERM)
                assert await blind.wait() == 0
            up.signal(signal.SIGTERM)
            assert await up.wait() == 0


async def test_sighup_serves_a_renewed_certificate_to_new_handshakes(tmp_path: Path) -> None:
    pki = Pki(tmp_path / "pki")
    port = free_port()
    root, _ = root_config(tmp_path, pki, port)
    cli("publish", "--config", str(root), str(EXAMPLE))
    with trio.fail_after(60):
        async with run_daemon(root) as daemon:
            await daemon.wait_log("ready")
            before = await trio.to_thread.run_sync(peer_certificate, port, pki)
            # Renewed in place, as a certificate manager does.
            renewed = pki.ca.issue_cert("127.0.0.1", "localhost")
            pki.server_cert.unlink()
            for blob in renewed.cert_chain_pems:
                blob.write_to_path(str(pki.server_cert), append=pki.server_cert.exists())
            renewed.private_key_pem.write_to_path(str(pki.server_key))
            assert await trio.to_thread.run_sync(peer_certificate, port, pki) == before
            daemon.signal(signal.SIGHUP)
            await daemon.wait_log("SIGHUP: admin TLS certificate reloaded")
            after = await trio.to_thread.run_sync(peer_certificate, port, pki)
            assert after != before
            # A reload that fails keeps the certificate in force.
            pki.server_key.write_text("not a key\n")
            daemon.signal(signal.SIGHUP)
            await daemon.wait_log(
                "SIGHUP: admin TLS certificate not reloaded; the previous one stays")
            assert await trio.to_thread.run_sync(peer_certificate, port, pki) == after
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0


async def test_status_watch_and_publish_wait_verify_the_replica_with_ca_file(
    tmp_path: Path,
) -> None:
    pki = Pki(tmp_path / "pki")
    port = free_port()
    root, _ = root_config(tmp_path, pki, port, mtls=False)
    cli("publish", "--config", str(root), str(EXAMPLE))
    token = ["--token-file", str(tmp_path / "root-read.token")]
    base = f"https://127.0.0.1:{port}"
    with trio.fail_after(90):
        async with run_daemon(root) as daemon:
            await daemon.wait_log("ready")
            result = await acli("status", "--url", base, "--ca-file", str(pki.ca_file),
                                *token, "--json")
            assert json.loads(result.stdout)["revision"]["active"] == 1
            # From --config alone: the replica serves TLS, so its URL is https.
            result = await acli("status", "--config", str(root), "--ca-file", str(pki.ca_file))
            assert "revision" in result.stdout.lower(), result.stdout
            # Without the CA the certificate is not trusted: unreachable, exit 1.
            unverified = await acli("status", "--url", base, *token, check=False)
            assert unverified.returncode == 1
            assert "CERTIFICATE_VERIFY_FAILED" in unverified.stderr, unverified.stderr
            assert "--ca-file" in unverified.stderr
            bad = await acli("status", "--url", base, "--ca-file", str(tmp_path / "nope.pem"),
                             check=False)
            assert bad.returncode == 2 and "--ca-file" in bad.stderr, bad.stderr
            # publish --wait follows the replica over wss (and nudges it over https)
            # with the full token the config names.
            waited = await acli("publish", "--config", str(root), "--force", str(EXAMPLE), "--wait",
                                "--url", base, "--ca-file", str(pki.ca_file))
            assert "active" in waited.stdout, waited.stdout
            watcher = await trio.lowlevel.open_process(
                [sys.executable, "-m", "supervisor", "watch", "--no-reconnect",
                 "--url", f"wss://127.0.0.1:{port}/v1/stream", "--ca-file", str(pki.ca_file),
                 "--config", str(root)],
                stdout=subprocess.PIPE, cwd=str(REPO),
                env={**os.environ, "PYTHONUNBUFFERED": "1"})
            assert watcher.stdout is not None
            first = await watcher.stdout.receive_some()
            assert b'"type":"status"' in first.replace(b" ", b""), first
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0
            assert await watcher.wait() == 0


async def test_rollback_reads_a_tls_replicas_refusal_with_ca_file(tmp_path: Path) -> None:
    """``rollback`` asks the replica its --config names over https, verified with
    --ca-file, and refuses a revision that replica refused (exit 2)."""
    pki = Pki(tmp_path / "pki")
    port = free_port()
    root, _ = root_config(tmp_path, pki, port, mtls=False)
    cli("publish", "--config", str(root), str(EXAMPLE))
    unresolvable = tmp_path / "unresolvable.toml"
    unresolvable.write_text(
        'schema_version = 1\n[aliases.chat]\nupstream = "https://llm.internal/v1"\n'
        '[keys.k]\nsecret = "env:TRIO_SUP_TLS_ROLLBACK_UNSET"\naliases = ["chat"]\n')
    ca = ["--ca-file", str(pki.ca_file)]
    with trio.fail_after(90):
        async with run_daemon(root) as daemon:
            await daemon.wait_log("ready")
            refused = await acli("publish", "--config", str(root), str(unresolvable), "--wait",
                                 "--timeout", "30", *ca, check=False)
            assert refused.returncode == 5, refused.stdout + refused.stderr
            await acli("publish", "--config", str(root), "--force", str(EXAMPLE), "--wait",
                       "--timeout", "30", *ca)
            asked = await acli("rollback", "2", "--config", str(root), *ca, check=False)
            assert asked.returncode == 2, asked.stdout + asked.stderr
            assert f"https://127.0.0.1:{port} refused revision 2" in asked.stderr, asked.stderr
            assert "desired was not changed" in asked.stderr
            history = json.loads((await acli("history", "--config", str(root), "--json")).stdout)
            assert history["desired"] == 3
            # Without the CA the replica cannot be read: the rollback goes on, and says so.
            blind = await acli("rollback", "1", "--config", str(root), check=False)
            assert blind.returncode == 0, blind.stdout + blind.stderr
            assert "warning: cannot check the replica's last refusal" in blind.stderr
            assert "CERTIFICATE_VERIFY_FAILED" in blind.stderr, blind.stderr
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0
