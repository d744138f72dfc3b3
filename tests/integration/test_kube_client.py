"""The Kubernetes client against the fake API server over real HTTP (and HTTPS).

No patching: the client is configured from a kubeconfig through the official
loaders and talks HTTP to :mod:`tests.fakes.apiserver`; faults come from the
fake (``inject``, ``deny``, ``set_token``, ``stall_watches``).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import socket
import ssl
import subprocess
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
from trio.testing import wait_all_tasks_blocked

from supervisor import reasons
from supervisor.fanout.preflight import classify_watch_error
from supervisor.fanout.servicedefinition import (
    DEPLOYMENTS,
    SERVICEDEFINITIONS,
    SERVICES,
    ServiceDefinition,
)
from supervisor.kube.client import KubeClient
from supervisor.kube.config import load_settings_async
from supervisor.kube.errors import (
    ApiError,
    Conflict,
    DecodeError,
    Forbidden,
    KubeConfigError,
    NotFound,
    SchemaSkew,
    StreamStalled,
    TimedOut,
    TooLargeResponse,
    TooManyRequests,
    TransportError,
    Unauthorized,
)
from supervisor.kube.models import PartialObject, RawWatchEvent
from supervisor.kube.wire import MAX_RESPONSE_BYTES, MAX_WATCH_LINE_BYTES
from tests import needs
from tests.fakes.apiserver import (
    FakeApiServer,
    run_fake_apiserver,
    write_kubeconfig,
)

CONTROL = "trio-supervisor"
APPS = "apps"


@asynccontextmanager
async def client_for(fake: FakeApiServer, tmp_path: Path, *, token_file: Path | None = None,
                     timeout_s: float = 10.0) -> AsyncIterator[KubeClient]:
    path = tmp_path / "kubeconfig"
    write_kubeconfig(fake, path, token_file=str(token_file) if token_file else None)
    client = KubeClient.from_kubeconfig(str(path), timeout_s=timeout_s)
    try:
        yield client
    finally:
        with trio.move_on_after(2, shield=True):
            await client.aclose()


def deployment(name: str, image: str = "nginx") -> dict[str, Any]:
    labels = {"app": name, "tier": "web"}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": APPS, "labels": labels},
        "spec": {"selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [{"name": "c", "image": image}]}}},
    }


async def test_apply_get_list_delete_round_trip(tmp_path: Path) -> None:
    with trio.fail_after(10):
        async with run_fake_apiserver() as fake, client_for(fake, tmp_path) as client:
            body = deployment("web")
            created = await client.apply(DEPLOYMENTS, APPS, "web", body, field_manager="me",
                                         force=True)
            assert created["metadata"]["name"] == "web"
            assert len(fake.writes()) == 1
            again = await client.apply(DEPLOYMENTS, APPS, "web", body, field_manager="me")
            assert again["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
            assert len(fake.writes()) == 1  # a no-op apply changes nothing
            got = await client.get(DEPLOYMENTS, APPS, "web", PartialObject)
            assert got.metadata.labels["tier"] == "web"
            page = await client.list(DEPLOYMENTS, APPS, PartialObject, label_selector="tier=web")
            assert [item.metadata.name for item in page.items] == ["web"]
            assert page.metadata.resource_version
            assert await client.delete(DEPLOYMENTS, APPS, "web") is True
            assert await client.delete(DEPLOYMENTS, APPS, "web") is False
            patch = fake.find_requests("PATCH")[0]
            assert patch.content_type == "application/apply-patch+yaml"
            assert patch.query == {"fieldManager": "me", "force": "true"}


async def test_paged_lists_follow_continue_tokens(tmp_path: Path) -> None:
    with trio.fail_after(10):
        async with run_fake_apiserver() as fake, client_for(fake, tmp_path) as client:
            for i in range(5):
                fake.create(deployment(f"d{i}"))
            first = await client.list(DEPLOYMENTS, APPS, PartialObject, limit=2)
            assert len(first.items) == 2 and first.metadata.continue_
            second = await client.list(DEPLOYMENTS, APPS, PartialObject, limit=2,
                                       continue_token=first.metadata.continue_)
            assert [i.metadata.name for i in second.items] == ["d2", "d3"]


async def test_error_statuses_map_to_our_errors(tmp_path: Path) -> None:
    with trio.fail_after(10):
        async with run_fake_apiserver() as fake, client_for(fake, tmp_path) as client:
            with pytest.raises(NotFound) as missing:
                await client.get(DEPLOYMENTS, APPS, "absent", PartialObject)
            assert missing.value.status == 404 and "absent" in missing.value.message
            fake.deny("list", "deployments", APPS)
            with pytest.raises(Forbidden) as denied:
                await client.list(DEPLOYMENTS, APPS, PartialObject, limit=1)
            assert "cannot list" in denied.value.message
            assert classify_watch_error(denied.value) == reasons.NAMESPACE_OR_RBAC_UNREADY
            fake.allow()
            fake.inject("GET", "/deployments$", status=500)
            with pytest.raises(ApiError) as boom:
                await client.list(DEPLOYMENTS, APPS, PartialObject)
            assert (boom.value.status, boom.value.reason) == (500, "InternalError")
            fake.inject("GET", "/deployments$", status=429, headers={"Retry-After": "0.5"})
            with pytest.raises(TooManyRequests) as slow:
                await client.list(DEPLOYMENTS, APPS, PartialObject)
            assert slow.value.retry_after == 0.5
            fake.inject("PATCH", "/deployments/web$", status=409)
            with pytest.raises(Conflict):
                await client.apply(DEPLOYMENTS, APPS, "web", deployment("web"),
                                   field_manager="me")
            # The original httpx/msgspec error is chained, never lost.
            with pytest.raises(NotFound) as chained:
                await client.get(DEPLOYMENTS, APPS, "absent", PartialObject)
            assert chained.value.path.endswith("/deployments/absent")


async def test_a_429_holds_every_request_until_its_retry_after(tmp_path: Path) -> None:
    # The server's own protection (API Priority and Fairness) sets the pace: after its
    # first 429 nothing more is sent, on any path, until Retry-After has passed.
    with trio.fail_after(10):
        async with run_fake_apiserver() as fake, client_for(fake, tmp_path) as client:
            fake.inject("GET", "/deployments$", status=429, headers={"Retry-After": "1"})
            with pytest.raises(TooManyRequests):
                await client.list(DEPLOYMENTS, APPS, PartialObject)
            refused = fake.requests[-1].time
            await client.list(SERVICES, APPS, PartialObject)  # another resource: held too
            assert fake.requests[-1].time - refused >= 0.9
            assert 0.9 <= client.paused_s <= 1.0
            fake.inject("GET", "/deployments$", status=429, headers={"Retry-After": "86400"})
            with pytest.raises(TooManyRequests):
                await client.list(DEPLOYMENTS, APPS, PartialObject)
            with trio.move_on_after(0.1):
                await client.list(SERVICES, APPS, PartialObject)
            assert 30.0 <= client.paused_s <= 1.0 + 30.0  # a day is not believed: 30 s


async def test_a_huge_retry_after_is_capped_in_the_error_too(tmp_path: Path) -> None:
    # The error's retry_after is what the reconcile requeue and the watcher's backoff
    # wait for: a Retry-After of a day held the client 30 s, but requeued the parent
    # (or put its watch to sleep) for the whole day.
    with trio.fail_after(10):
        async with run_fake_apiserver() as fake, client_for(fake, tmp_path) as client:
            fake.inject("GET", "/deployments$", status=429, headers={"Retry-After": "86400"})
            with pytest.raises(TooManyRequests) as slow:
                await client.list(DEPLOYMENTS, APPS, PartialObject)
            assert slow.value.retry_after == 30.0


async def test_bodies_of_the_wrong_shape_are_schema_skew(tmp_path: Path) -> None:
    with trio.fail_after(10):
        async with run_fake_apiserver() as fake, client_for(fake, tmp_path) as client:
            fake.inject("GET", "/servicedefinitions$", status=200,
                        body={"kind": "ServiceDefinitionList",
                              "items": [{"metadata": {"name": "a"}, "spec": {"replicas": 2}}]})
            with pytest.raises(SchemaSkew) as skew:
                await client.list(SERVICEDEFINITIONS, CONTROL, ServiceDefinition, limit=1)
            assert "image" in str(skew.value) and skew.value.path.startswith("$.items[0]")
            assert isinstance(skew.value.__cause__, msgspec.ValidationError)
            fake.inject("GET", "/servicedefinitions$", status=200, body=b"<html>proxy</html>",
                        headers={"Content-Type": "text/html"})
            with pytest.raises(DecodeError) as garbage:
                await client.list(SERVICEDEFINITIONS, CONTROL, ServiceDefinition, limit=1)
            assert not isinstance(garbage.value, SchemaSkew)
            assert classify_watch_error(garbage.value) == reasons.SCHEMA_SKEW


async def test_a_refused_connection_is_a_transport_error(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    class Nowhere:
        url = f"http://127.0.0.1:{port}"
        token: str | None = None

    write_kubeconfig(Nowhere(), tmp_path / "kubeconfig")
    client = KubeClient.from_kubeconfig(str(tmp_path / "kubeconfig"))
    with trio.fail_after(10):
        with pytest.raises(TransportError) as refused:
            await client.list(DEPLOYMENTS, APPS, PartialObject, limit=1)
        assert refused.value.__cause__ is not None
        assert classify_watch_error(refused.value) == reasons.NAMESPACE_OR_RBAC_UNREADY
        await client.aclose()


async def test_a_missing_kubeconfig_fails_the_request_and_heals_when_written(
    tmp_path: Path,
) -> None:
    path = tmp_path / "kubeconfig"
    client = KubeClient.from_kubeconfig(str(path))
    with trio.fail_after(10):
        async with run_fake_apiserver() as fake:
            with pytest.raises(KubeConfigError) as missing:
                await client.list(DEPLOYMENTS, APPS, PartialObject, limit=1)
            assert classify_watch_error(missing.value) == reasons.NAMESPACE_OR_RBAC_UNREADY
            write_kubeconfig(fake, path)
            page = await client.list(DEPLOYMENTS, APPS, PartialObject, limit=1)
            assert page.items == []
            await client.aclose()


async def test_a_401_re_reads_the_token_file_and_retries_once(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first")
    with trio.fail_after(10):
        async with run_fake_apiserver(token="first") as fake, \
                client_for(fake, tmp_path, token_file=token) as client:
            await client.list(DEPLOYMENTS, APPS, PartialObject, limit=1)
            # The bound token rotates: on disk and on the server.
            token.write_text("second")
            fake.set_token("second")
            await client.list(DEPLOYMENTS, APPS, PartialObject, limit=1)
            assert fake.count("GET", "/deployments", status=401) == 1
            assert fake.count("GET", "/deployments", status=200) == 2
            assert client.token_reloads == 1
            # Concurrent requests after another rotation reload once.
            token.write_text("third")
            fake.set_token("third")
            async with trio.open_nursery() as nursery:
                for _ in range(5):
                    nursery.start_soon(client.list, DEPLOYMENTS, APPS, PartialObject)
            assert client.token_reloads == 2


async def test_a_token_that_stays_refused_is_unauthorized_after_one_retry(
    tmp_path: Path,
) -> None:
    token = tmp_path / "token"
    token.write_text("stale")
    with trio.fail_after(10):
        async with run_fake_apiserver(token="fresh") as fake, \
                client_for(fake, tmp_path, token_file=token) as client:
            with pytest.raises(Unauthorized):
                await client.list(DEPLOYMENTS, APPS, PartialObject, limit=1)
            assert fake.count("GET", "/deployments") == 2
            assert "stale" not in repr(client.__dict__.get("_settings"))


async def test_a_watch_streams_events_and_bookmarks(tmp_path: Path) -> None:
    with trio.fail_after(10):
        async with run_fake_apiserver(bookmark_interval_s=0.1) as fake, \
                client_for(fake, tmp_path) as client:
            page = await client.list(DEPLOYMENTS, APPS, PartialObject)
            fake.create(deployment("web"))
            types: list[str] = []
            async with client.watch(DEPLOYMENTS, APPS,
                                    resource_version=page.metadata.resource_version,
                                    timeout_s=5, inactivity_s=1.0) as stream:
                while len(types) < 3:
                    line = await stream.next_line()
                    assert line is not None
                    types.append(msgspec.json.decode(line, type=RawWatchEvent).type)
            assert types[0] == "ADDED" and types[1:] == ["BOOKMARK", "BOOKMARK"]
            (watch,) = fake.find_requests("GET", "/deployments", watch=True)
            assert watch.query["allowWatchBookmarks"] == "true"
            assert watch.query["timeoutSeconds"] == "5"


async def test_a_stalled_watch_raises_stream_stalled(tmp_path: Path) -> None:
    with trio.fail_after(10):
        async with run_fake_apiserver(bookmark_interval_s=0.1) as fake, \
                client_for(fake, tmp_path) as client:
            page = await client.list(DEPLOYMENTS, APPS, PartialObject)
            fake.stall_watches()
            start = trio.current_time()
            with pytest.raises(StreamStalled):
                async with client.watch(DEPLOYMENTS, APPS,
                                        resource_version=page.metadata.resource_version,
                                        timeout_s=5, inactivity_s=0.5) as stream:
                    while await stream.next_line() is not None:
                        pass
            assert 0.5 <= trio.current_time() - start < 3.0


async def test_a_watch_whose_headers_never_come_times_out_at_the_request_timeout(
    tmp_path: Path,
) -> None:
    with trio.fail_after(10):
        async with run_fake_apiserver() as fake, \
                client_for(fake, tmp_path, timeout_s=0.5) as client:
            page = await client.list(DEPLOYMENTS, APPS, PartialObject)
            held = fake.hold_watch_headers("deployments")
            start = trio.current_time()
            with pytest.raises(TimedOut, match=r"no response headers within 0\.5 s"):
                async with client.watch(DEPLOYMENTS, APPS,
                                        resource_version=page.metadata.resource_version,
                                        timeout_s=5, inactivity_s=60.0):
                    pass
            assert 0.5 <= trio.current_time() - start < 2.0 and held.hits == 1
            # Lists are answered meanwhile; a cleared hold lets the next watch open.
            await client.list(DEPLOYMENTS, APPS, PartialObject)
            fake.clear_injections()
            async with client.watch(DEPLOYMENTS, APPS,
                                    resource_version=page.metadata.resource_version,
                                    timeout_s=5, inactivity_s=60.0):
                pass


async def test_a_body_over_its_bound_is_refused_before_it_is_read_whole(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with run_fake_apiserver() as fake, client_for(fake, tmp_path) as client:
            fake.inject("GET", r"/deployments$", status=200,
                        body=b'{"items": ["' + b"x" * MAX_RESPONSE_BYTES + b'"]}')
            with pytest.raises(TooLargeResponse, match=f"more than {MAX_RESPONSE_BYTES} bytes"):
                await client.list(DEPLOYMENTS, APPS, PartialObject)
            # An error answer's body is read only so far, and its message cut.
            fake.inject("GET", r"/deployments$", status=503, body=msgspec.json.encode(
                {"kind": "Status", "code": 503, "reason": "ServiceUnavailable",
                 "message": "m" * 10_000}))
            with pytest.raises(ApiError) as refused:
                await client.list(DEPLOYMENTS, APPS, PartialObject)
            assert refused.value.status == 503 and len(str(refused.value)) < 1200
            assert (await client.list(DEPLOYMENTS, APPS, PartialObject)).items == []


async def test_a_watch_line_over_its_bound_is_refused(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with run_fake_apiserver(bookmark_interval_s=10) as fake, \
                client_for(fake, tmp_path) as client:
            page = await client.list(DEPLOYMENTS, APPS, PartialObject)
            with pytest.raises(TooLargeResponse, match="one line"):
                async with client.watch(DEPLOYMENTS, APPS,
                                        resource_version=page.metadata.resource_version,
                                        timeout_s=5, inactivity_s=5.0) as stream:
                    await fake.wait_for_watches(1, "deployments")
                    fake.inject_watch_line(b'{"type": "ADDED", "object": {"x": "'
                                           + b"x" * MAX_WATCH_LINE_BYTES + b'"}}')
                    while await stream.next_line() is not None:
                        pass


async def test_a_hung_exec_plugin_ends_at_its_deadline_on_the_clients_own_threads(
    tmp_path: Path,
) -> None:
    # trio's shared thread limiter exhausted (as a stuck database's abandoned calls would):
    # the credentials load on the client's own limit all the same.
    shared = trio.to_thread.current_default_thread_limiter()
    shared.total_tokens = 1
    release = threading.Event()
    with trio.fail_after(20):
        async with run_fake_apiserver() as fake, trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(
                trio.to_thread.run_sync, release.wait, abandon_on_cancel=True))
            await wait_all_tasks_blocked()
            assert shared.borrowed_tokens == 1
            path = tmp_path / "kubeconfig"
            write_kubeconfig(fake, path)
            config = json.loads(path.read_text())
            config["users"][0]["user"] = {"exec": {
                "apiVersion": "client.authentication.k8s.io/v1beta1", "command": "sleep",
                "args": ["3"], "interactiveMode": "Never"}}
            path.write_text(json.dumps(config))
            hung = KubeClient(functools.partial(load_settings_async, str(path), timeout_s=0.5))
            start = trio.current_time()
            with pytest.raises(KubeConfigError, match=r"took more than 0\.5 s"):
                await hung.list(DEPLOYMENTS, APPS, PartialObject)
            assert trio.current_time() - start < 2.0
            await hung.aclose()
            write_kubeconfig(fake, path)  # no plugin: loads on the client's threads
            async with client_for(fake, tmp_path) as client:
                assert (await client.list(DEPLOYMENTS, APPS, PartialObject)).items == []
            release.set()


async def test_a_watch_ending_normally_returns_none(tmp_path: Path) -> None:
    with trio.fail_after(10):
        async with run_fake_apiserver(bookmark_interval_s=10) as fake, \
                client_for(fake, tmp_path) as client:
            page = await client.list(DEPLOYMENTS, APPS, PartialObject)
            async with client.watch(DEPLOYMENTS, APPS,
                                    resource_version=page.metadata.resource_version,
                                    timeout_s=1, inactivity_s=5) as stream:
                assert await stream.next_line() is None


# -- TLS ---------------------------------------------------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    needs.program("openssl", "apt-get install openssl")
    d = tmp_path_factory.mktemp("pki")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", *ec, "-keyout", f"{ca}.key", "-out", f"{ca}.crt",
                 "-days", "2", "-subj", f"/CN={ca}", cwd=d)
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for leaf, cn in (("server", "localhost"), ("client", "trio-supervisor")):
        _openssl("req", *ec, "-keyout", f"{leaf}.key", "-out", f"{leaf}.csr",
                 "-subj", f"/CN={cn}", cwd=d)
        _openssl("x509", "-req", "-in", f"{leaf}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{leaf}.crt", "-days", "2",
                 "-extfile", "san.ext", cwd=d)
    return d


@asynccontextmanager
async def tls_fake(pki: Path) -> AsyncIterator[FakeApiServer]:
    """The fake API server behind HTTPS that requires a client certificate."""
    from hypercorn.config import Config
    from hypercorn.trio import serve

    app = FakeApiServer()
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.certfile = str(pki / "server.crt")
    config.keyfile = str(pki / "server.key")
    config.ca_certs = str(pki / "ca.crt")
    config.verify_mode = ssl.CERT_REQUIRED
    config.accesslog = None
    done = trio.Event()

    async def trigger() -> None:
        await done.wait()

    async with trio.open_nursery() as nursery:
        asgi: Any = app
        binds = await nursery.start(lambda task_status: serve(
            asgi, config, shutdown_trigger=trigger, task_status=task_status))
        app.url = binds[0].replace("http://", "https://")
        try:
            yield app
        finally:
            app.close_watches()
            done.set()
            nursery.cancel_scope.deadline = trio.current_time() + 2


def _tls_kubeconfig(path: Path, url: str, ca: Path, pki: Path, *, cert: bool = True) -> str:
    user = {"client-certificate": str(pki / "client.crt"),
            "client-key": str(pki / "client.key")} if cert else {}
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": url,
                                               "certificate-authority": str(ca)}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }))
    return str(path)


async def test_tls_is_verified_and_client_certificates_are_presented(
    tmp_path: Path, pki: Path,
) -> None:
    with trio.fail_after(20):
        async with tls_fake(pki) as fake:
            assert fake.url.startswith("https://127.0.0.1:")
            good = KubeClient.from_kubeconfig(
                _tls_kubeconfig(tmp_path / "good", fake.url, pki / "ca.crt", pki))
            page = await good.list(DEPLOYMENTS, APPS, PartialObject, limit=1)
            assert page.items == []
            await good.aclose()
            # A server certificate from a CA we were not told to trust is refused.
            wrong = KubeClient.from_kubeconfig(
                _tls_kubeconfig(tmp_path / "wrong", fake.url, pki / "other-ca.crt", pki))
            with pytest.raises(TransportError):
                await wrong.list(DEPLOYMENTS, APPS, PartialObject, limit=1)
            await wrong.aclose()
            # Without our client certificate the server refuses us.
            anonymous = KubeClient.from_kubeconfig(
                _tls_kubeconfig(tmp_path / "anon", fake.url, pki / "ca.crt", pki, cert=False))
            with pytest.raises(TransportError):
                await anonymous.list(DEPLOYMENTS, APPS, PartialObject, limit=1)
            await anonymous.aclose()


async def test_the_refresh_hook_rotates_the_token_before_any_401(tmp_path: Path) -> None:
    """In-cluster, the loader's refresh hook re-reads the service-account token; the
    client calls it every ``token_refresh_s`` (0 here: before every request)."""
    from supervisor.kube.config import KubeSettings

    current = {"token": "one"}
    with trio.fail_after(10):
        async with run_fake_apiserver(token="one") as fake:

            async def settings() -> KubeSettings:
                return KubeSettings(
                    host=fake.url, source="test",
                    authorization=f"Bearer {current['token']}",
                    refresh=lambda: f"Bearer {current['token']}",
                )

            client = KubeClient(settings, token_refresh_s=0.0)
            await client.list(DEPLOYMENTS, APPS, PartialObject, limit=1)
            current["token"] = "two"
            fake.set_token("two")
            await client.list(DEPLOYMENTS, APPS, PartialObject, limit=1)
            assert fake.count(status=401) == 0
            assert client.token_reloads == 0
            await client.aclose()


async def test_a_hung_token_refresh_is_abandoned_on_cancel_and_never_run_twice() -> None:
    """A refresh hook that hangs (an exec plugin, an NFS token file) must not hold a
    request past its caller's deadline: the request is cancellable, the worker thread is
    abandoned, and while it still runs later requests wait for it rather than start a
    second thread. Once it ends, its token is adopted: no 401."""
    import threading

    from supervisor.kube.config import KubeSettings

    calls: list[int] = []
    gate = threading.Event()

    def refresh() -> str | None:
        calls.append(1)
        gate.wait(30)  # only the first call hangs: the test opens the gate before any other
        return "Bearer fresh"

    with trio.fail_after(10):
        async with run_fake_apiserver(token="one") as fake:

            async def settings() -> KubeSettings:
                return KubeSettings(host=fake.url, source="test", authorization="Bearer one",
                                    refresh=refresh)

            client = KubeClient(settings, token_refresh_s=0.0)
            try:
                for _ in range(2):
                    with trio.move_on_after(0.3) as scope:
                        await client.list(DEPLOYMENTS, APPS, PartialObject, limit=1)
                    assert scope.cancelled_caught, "a hung refresh held the request"
                assert len(calls) == 1, "a second refresh thread started beside the hung one"
                fake.set_token("fresh")
                gate.set()
                await client.list(DEPLOYMENTS, APPS, PartialObject, limit=1)
                assert fake.count(status=401) == 0 and client.token_reloads == 0
            finally:
                gate.set()
                await client.aclose()


@pytest.mark.parametrize("proxy", ["socks4://admin:s3cret@proxy.test:1080",
                                   "http://admin:s3cret@proxy.test:notaport",
                                   pytest.param("socks5://admin:s3cret@proxy.test:1080",
                                                marks=pytest.mark.skipif(
                                                    importlib.util.find_spec("socksio")
                                                    is not None, reason="socksio installed"))])
async def test_a_proxy_url_that_cannot_be_used_is_a_config_error_without_its_password(
        tmp_path: Path, proxy: str) -> None:
    # The kubeconfig's proxy-url, refused before anything is sent: an unknown scheme, a
    # bad port, or socks5 without socksio installed. The error names the setting and the
    # proxy, never its password (the error is logged).
    class Proxied:
        url = "http://127.0.0.1:1"
        token: str | None = None

    path = tmp_path / "kubeconfig"
    write_kubeconfig(Proxied(), path)
    config = json.loads(path.read_text())
    config["clusters"][0]["cluster"]["proxy-url"] = proxy
    path.write_text(json.dumps(config))
    client = KubeClient.from_kubeconfig(str(path))
    with trio.fail_after(10):
        try:
            with pytest.raises(KubeConfigError) as refused:
                await client.list(DEPLOYMENTS, APPS, PartialObject, limit=1)
        finally:
            await client.aclose()
    message = str(refused.value)
    assert "s3cret" not in message, message
    assert "proxy-url" in message and "proxy.test" in message, message
