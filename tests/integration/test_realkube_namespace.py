"""The apps namespace deleted and made again while the daemon runs, on a real kube-apiserver.

kube-apiserver v1.20.2 (../shared/realkube) runs no controllers: a deleted
namespace stays ``Terminating`` (its ``kubernetes`` finalizer) with everything in
it, and the server refuses new content there (403, "because it is being
terminated"). The test does the namespace controller's part itself (delete the
content, then ``/finalize``), and the operator's (apply ``manifests/apps-namespace``
again: the namespace, and the daemon's Role and RoleBinding in it, deleted with
it). The daemon runs throughout on its ServiceAccount token, as in
tests/integration/test_realkube.py. The fake-server version with faults is
tests/integration/test_fanout_ownership.py. Skipped with the reason when
``SUPERVISOR_TEST_KUBE_ASSETS`` is unset.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from tests.health import status
from tests.polling import poll_until
from tests.proc import free_port, run_daemon
from tests.realkube import (
    NAMESPACED,
    Installation,
    RealKube,
    aget,
    aget_ready,
    condition,
    daemon_config,
    deployment_path,
    gone,
    parent_path,
    sd,
    start_realkube,
)

CHILDREN = (("/apis/apps/v1", "deployments"), ("/api/v1", "services"))


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealKube]:
    with start_realkube(tmp_path_factory.mktemp("kube")) as server:
        server.install_crds()
        yield server


async def uid(kube: RealKube, path: str) -> str | None:
    found = await aget(kube, path)
    return None if found is None else str(found["metadata"]["uid"])


async def test_the_apps_namespace_deleted_and_made_again(kube: RealKube, tmp_path: Path) -> None:
    inst = await trio.to_thread.run_sync(kube.install)
    namespace = f"/api/v1/namespaces/{inst.apps}"
    service = f"{namespace}/services/web"
    port = free_port()
    config = await daemon_config(tmp_path, inst, port, resync_s=1)
    with trio.fail_after(120):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("fan-out watching", kind="ServiceDefinition")
            await trio.to_thread.run_sync(kube.apply, sd(inst, "web", port=8080))
            await poll_until(lambda: aget_ready(kube, inst, "web"))
            before = {path: await uid(kube, path) for path in (deployment_path(inst, "web"),
                                                               service)}
            assert None not in before.values()

            response = await trio.to_thread.run_sync(kube.request, "DELETE", namespace)
            assert response.status_code == 200, response.text
            ns = await aget(kube, namespace)
            assert ns is not None and ns["status"]["phase"] == "Terminating"
            # No namespace controller: the children stay until someone deletes them. Once
            # they are gone, the daemon's repairs are refused while the namespace
            # terminates: logged and requeued, never a crash.
            await trio.to_thread.run_sync(kube.delete_namespace_content, inst.apps, CHILDREN)
            await poll_until(lambda: any(
                line.get("event") == "reconcile failed; requeued"
                and "being terminated" in str(line.get("error")) for line in daemon.lines))
            assert await aget(kube, deployment_path(inst, "web")) is None
            await poll_until(lambda: ready_is(kube, inst, "False"))
            await trio.to_thread.run_sync(kube.delete_namespace_content, inst.apps, NAMESPACED)
            await trio.to_thread.run_sync(kube.finalize_namespace, inst.apps)
            await poll_until(lambda: gone(kube, namespace))

            await trio.to_thread.run_sync(kube.install_apps_namespace, inst)
            made = trio.current_time()
            for path, old in before.items():
                await poll_until(lambda p=path, o=old: renewed(kube, p, o))
            back_s = trio.current_time() - made
            await poll_until(lambda: ready_is(kube, inst, "True"))
            assert back_s < 30.0, back_s
            assert (await status(port))["fanout"]["ServiceDefinition"]["state"] == "watching"
            assert not [line for line in daemon.lines if line.get("level") == "critical"]
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0


async def ready_is(kube: RealKube, inst: Installation, value: str) -> bool:
    return condition(await aget(kube, parent_path(inst, "web")), "Ready").get("status") == value


async def renewed(kube: RealKube, path: str, old_uid: str | None) -> bool:
    """``path`` exists again, as a new object."""
    now = await uid(kube, path)
    return now is not None and now != old_uid
