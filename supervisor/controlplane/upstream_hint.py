"""Follower mode's wake-up hint: the upstream's ``/v1/stream``, read with trio-websocket.

Contract (docs/control-plane.md): polling ``GET /v1/revision`` every
``poll_interval_s`` is the correctness path; this child only makes it faster.
Each ``published`` event from the upstream calls ``wake("upstream")`` and the
convergence loop polls at once; every (re)connect calls ``wake("reconnect")``,
since whatever was published while disconnected was not heard. Nothing the
stream says is believed: the loop still fetches and verifies the signed revision.

Like the LISTEN child it reports started at once (an unreachable upstream must
not hold up readiness), never lets a failure escape (logged as an outage, then
a reconnect with bounded exponential backoff and jitter), and lets Cancelled
through. ``[control_plane].listen = false`` turns it off.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio
from trio_websocket import open_websocket_url

from supervisor.backoff import Backoff
from supervisor.logs import get_logger
from supervisor.outage import OutageLog
from supervisor.tlsconfig import upstream_context

if TYPE_CHECKING:
    from supervisor.config import ControlPlaneConfig

__all__ = ["run_upstream_hint", "stream_url"]

log = get_logger("listen")

CONNECT_TIMEOUT_S = 5.0
#: Without any message (the upstream pings every heartbeat), the connection is presumed dead.
IDLE_TIMEOUT_S = 90.0


def stream_url(upstream: str) -> str:
    """``http(s)://HOST:PORT`` -> ``ws(s)://HOST:PORT/v1/stream``."""
    return "ws" + upstream.rstrip("/").removeprefix("http") + "/v1/stream"


async def run_upstream_hint(
    config: ControlPlaneConfig,
    wake: Callable[[str], None],
    *,
    token: str | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Follow the upstream's stream until cancelled, waking the loop; never raises otherwise."""
    task_status.started()
    url = stream_url(config.url)
    headers = [(b"Authorization", f"Bearer {token}".encode())] if token else []
    backoff = Backoff(config.backoff_initial_s, config.backoff_max_s)
    outage = OutageLog(log, "upstream stream")
    while True:
        try:
            async with open_websocket_url(url, extra_headers=headers,
                                          connect_timeout=CONNECT_TIMEOUT_S,
                                          ssl_context=upstream_context(config)) as ws:
                outage.recovered()
                log.info("following the upstream's stream for wake-ups", url=url)
                wake("reconnect")
                while True:
                    with trio.fail_after(IDLE_TIMEOUT_S):
                        message = await ws.get_message()
                    backoff.reset()
                    if _is_published(message):
                        wake("upstream")
        except Exception as exc:  # noqa: BLE001 - a hint only: logged; polling covers the gap
            outage.failed(error=f"{type(exc).__name__}: {exc}"[:300], url=url)
        await trio.sleep(backoff.next())


def _is_published(message: str | bytes) -> bool:
    try:
        event = json.loads(message)
    except ValueError:
        return False
    return isinstance(event, dict) and event.get("type") == "published"
