"""Kubernetes fan-out through the real daemon process, against the fake API server."""

from __future__ import annotations

import signal
from pathlib import Path

import trio

from tests.fakes.apiserver import run_fake_apiserver, write_kubeconfig
from tests.fanoutprocess import kube_config, sd
from tests.health import status
from tests.proc import EXAMPLE, NotifySocket, acli, free_port, run_daemon


async def test_children_appear_with_lineage_labels(tmp_path: Path) -> None:
    admin_port = free_port()
    with trio.fail_after(60):
        async with run_fake_apiserver(bookmark_interval_s=0.5) as server:
            server.create(sd("web", port=8080))
            kubeconfig = tmp_path / "kubeconfig"
            write_kubeconfig(server, kubeconfig)
            config = kube_config(tmp_path, kubeconfig, admin_port)
            await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
            async with run_daemon(config) as daemon:
                await daemon.wait_log("ready")
                await server.wait_until(
                    lambda: server.get("deployments", "apps", "web") is not None
                    and server.get("services", "apps", "web") is not None)
                deployment = server.get("deployments", "apps", "web")
                assert deployment is not None
                labels = deployment["metadata"]["labels"]
                assert labels["app.kubernetes.io/name"] == "web"
                assert labels["app.kubernetes.io/managed-by"] == "trio-supervisor"
                assert labels["platform.trio-supervisor.dev/servicedefinition"] == "web"
                assert deployment["spec"]["replicas"] == 2
                # A second parent created while the daemon runs is fanned out too.
                server.create(sd("api"))
                await server.wait_until(
                    lambda: server.get("deployments", "apps", "api") is not None)
                report = await status(admin_port)
                assert report["fanout"]["ServiceDefinition"]["state"] == "watching"
                assert report["fanout"]["ServiceDefinition"]["objects"] == 2
                assert report["fanout"]["Workflow"]["state"] == "watching"
                daemon.signal(signal.SIGTERM)
                assert await daemon.wait() == 0


async def test_sigterm_while_the_preflight_waits_exits_0_promptly(tmp_path: Path) -> None:
    admin_port = free_port()
    notify = NotifySocket(tmp_path / "notify")
    await notify.bind()
    with trio.fail_after(60):
        async with run_fake_apiserver(crds_installed=False) as server:
            kubeconfig = tmp_path / "kubeconfig"
            write_kubeconfig(server, kubeconfig)
            config = kube_config(tmp_path, kubeconfig, admin_port)
            await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
            async with run_daemon(config, env={"NOTIFY_SOCKET": str(notify.path)}) as daemon:
                # READY=1 never waits for Kubernetes: the watchers are dormant, not failing.
                await notify.wait_for("READY=1")
                warned = await daemon.wait_log(None, kind="ServiceDefinition",
                                               error_class="namespace_or_rbac_unready")
                assert warned["level"] == "warning"
                assert "manifests/apps-namespace" in str(warned)
                sd_status = (await status(admin_port))["fanout"]["ServiceDefinition"]
                assert sd_status["state"] == "preflight"
                assert sd_status["last_error_class"] == "namespace_or_rbac_unready"
                daemon.signal(signal.SIGTERM)
                start = trio.current_time()
                assert await daemon.wait() == 0
                assert trio.current_time() - start < 2.0
    notify.close()


async def test_sighup_wakes_a_waiting_preflight(tmp_path: Path) -> None:
    # Finding 5: a CRD applied after start was noticed only at the next preflight retry
    # (300 s by default), and SIGHUP did not wake the preflight.
    admin_port = free_port()
    with trio.fail_after(60):
        async with run_fake_apiserver(crds_installed=False) as server:
            kubeconfig = tmp_path / "kubeconfig"
            write_kubeconfig(server, kubeconfig)
            config = kube_config(tmp_path, kubeconfig, admin_port)
            config.write_text(config.read_text().replace("preflight_retry_s = 1",
                                                         "preflight_retry_s = 300"))
            await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
            async with run_daemon(config) as daemon:
                await daemon.wait_log("ready")
                # Retries start near 1 s and double: after the fourth the next is ~8 s away.
                await server.wait_until(
                    lambda: server.count("GET", "/servicedefinitions", status=404) >= 4,
                    recheck_s=None)
                server.install_crd("servicedefinitions")
                server.install_crd("workflows")
                daemon.signal(signal.SIGHUP)
                woken = trio.current_time()
                await daemon.wait_log("fan-out watching", kind="ServiceDefinition")
                assert trio.current_time() - woken < 3.0
                server.create(sd("web"))
                await server.wait_until(lambda: server.get("deployments", "apps", "web")
                                        is not None)
                daemon.signal(signal.SIGTERM)
                assert await daemon.wait() == 0


async def test_sigterm_gives_an_apply_in_flight_a_bounded_drain(tmp_path: Path) -> None:
    # Through the process: on SIGTERM a write in flight is neither cut at
    # once nor waited for beyond the drain (2 s); the daemon exits 0 within its grace.
    from supervisor.fanout.children import DRAIN_S

    admin_port = free_port()
    with trio.fail_after(60):
        async with run_fake_apiserver(bookmark_interval_s=0.5) as server:
            kubeconfig = tmp_path / "kubeconfig"
            write_kubeconfig(server, kubeconfig)
            config = kube_config(tmp_path, kubeconfig, admin_port)
            await acli("publish", "--config", str(config), str(EXAMPLE), "--force")
            async with run_daemon(config) as daemon:
                await daemon.wait_log("fan-out watching", kind="ServiceDefinition")
                server.inject("POST", r"/deployments/web$", status=200, hang=True, times=1)
                server.create(sd("web"))
                await server.wait_until(lambda: server.count("POST", "/deployments/web") >= 1)
                daemon.signal(signal.SIGTERM)
                start = trio.current_time()
                assert await daemon.wait() == 0
                elapsed = trio.current_time() - start
                assert DRAIN_S * 0.9 <= elapsed < DRAIN_S + 3.0, elapsed
