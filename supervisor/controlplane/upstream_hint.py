"""Follower mode's wake-up hint: :func:`run_upstream_hint` reads the upstream's ``/v1/stream``."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING

import trio
from trio_websocket import open_websocket_url

from supervisor.backoff import Backoff
from supervisor.controlplane.follower import CONNECT_TIMEOUT_S
from supervisor.controlplane.listen import WakeFloor
from supervisor.controlplane.replica_name import name_headers
from supervisor.logs import get_logger
from supervisor.streak import Streak
from supervisor.tlsconfig import upstream_context

if TYPE_CHECKING:
    from supervisor.config import ControlPlaneConfig

__all__ = ["run_upstream_hint"]

log = get_logger("listen")

#: Without any message (the upstream pings every heartbeat), the connection is presumed dead.
IDLE_TIMEOUT_S = 90.0


def stream_url(upstream: str) -> str:
    """``http(s)://HOST:PORT`` (the forms ``[control_plane].url`` accepts) ->
    ``ws(s)://HOST:PORT/v1/stream``."""
    return "ws" + upstream.rstrip("/").removeprefix("http") + "/v1/stream"


async def run_upstream_hint(config: ControlPlaneConfig, wake: Callable[[str], None], *,
                            token: str | None = None,
                            reconnecting: Callable[[bool], None] = lambda _on: None,
                            task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Follow the upstream's stream until cancelled, waking the loop; never raises otherwise.

    Polling ``GET /v1/revision`` stays the correctness path; this only makes it faster.
    Each ``published`` event calls ``wake("upstream")``: the loop polls at once. Every
    (re)connect calls ``wake("reconnect")``: what was published meanwhile went unheard.
    Nothing the stream says is believed: the loop still fetches and verifies the revision.
    Hints coalesce (:func:`_follow`) within ``[control_plane].hint_min_interval_s``.
    Each connection names this replica to the upstream (:mod:`.replica_name`).

    Like the LISTEN child it reports started at once: an unreachable upstream must not
    hold up readiness. A failure is logged as an outage, then it reconnects with
    backoff; Cancelled goes through. ``[control_plane].listen = false`` turns it off.
    ``reconnecting(True)`` is called when the stream cannot be opened or ends,
    ``reconnecting(False)`` once it is open again.
    """
    task_status.started()
    url = stream_url(config.url)
    headers = [(b"Authorization", f"Bearer {token}".encode())] if token else []
    backoff = Backoff(config.backoff_initial_s, config.backoff_max_s)
    outage = Streak(log, began="upstream stream unreachable",
                    ongoing="upstream stream still unreachable",
                    ended="upstream stream reachable again")
    while True:
        try:
            named = [(k.encode(), v.encode()) for k, v in name_headers().items()]
            async with open_websocket_url(url, extra_headers=headers + named,
                                          connect_timeout=CONNECT_TIMEOUT_S,
                                          ssl_context=upstream_context(config)) as ws:
                reconnecting(False)
                outage.recovered()
                log.info("following the upstream's stream for wake-ups", url=url)
                wake("reconnect")
                # A stream that delivered resets the backoff (_follow never returns):
                # its cut is a new outage, not the next failure of the last one.
                await _follow(ws.get_message, wake, config.hint_min_interval_s,
                              delivered=backoff.reset)
        except Exception as exc:  # noqa: BLE001 - a hint only: logged; polling covers the gap
            outage.failed(error=f"{type(exc).__name__}: {exc}"[:300], url=url)
            reconnecting(True)
        await trio.sleep(backoff.next())


async def _follow(get_message: Callable[[], Awaitable[str | bytes]],
                  wake: Callable[[str], None], min_interval_s: float, *,
                  delivered: Callable[[], None] = lambda: None) -> None:
    """Wake the loop on ``published`` events, at most once per ``min_interval_s``.

    A flood of hints within the interval becomes one wake-up at its start, and one at
    its end when more came. So the loop fetches at most once per interval and never
    misses the last hint. ``delivered()`` is called at every message. Returns never.
    Raises what ``get_message`` raises, or TooSlowError after IDLE_TIMEOUT_S of silence.
    """
    floor = WakeFloor(partial(wake, "upstream"), min_interval_s)
    while True:
        idle_deadline = trio.current_time() + IDLE_TIMEOUT_S
        with trio.move_on_at(min(floor.due, idle_deadline)) as waiting:
            message = await get_message()
        if not waiting.cancelled_caught:
            delivered()
            if _is_published(message):
                floor.notified()
        elif trio.current_time() >= idle_deadline:
            raise trio.TooSlowError
        else:
            await floor.release()


def _is_published(message: str | bytes) -> bool:
    try:
        event = json.loads(message)
    except ValueError:
        return False
    return isinstance(event, dict) and event.get("type") == "published"
