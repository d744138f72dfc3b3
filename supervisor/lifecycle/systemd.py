"""The systemd notify protocol (``sd_notify``), our own small implementation.

The messages and when they are sent: docs/exit-codes.md.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping

import trio

from supervisor.logs import get_logger

__all__ = ["Notifier", "watchdog_interval"]

log = get_logger("systemd")


class Notifier:
    """Sends notify messages; a no-op when ``NOTIFY_SOCKET`` is not set.

    One datagram of ``KEY=VALUE`` lines to ``$NOTIFY_SOCKET``: a path, or ``@name`` for an
    abstract socket (``@`` stands for a leading NUL).

    Sending never blocks and never raises: the daemon must keep serving whatever happens
    to its supervisor's socket. The socket is non-blocking; a full or vanished receiver
    costs one warning per failure streak.
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        raw = env.get("NOTIFY_SOCKET")
        self.address: str | bytes | None = None
        if raw:
            self.address = ("\0" + raw[1:]) if raw.startswith("@") else raw
        self._sock: socket.socket | None = None
        self._failing = False
        self.last_status: str | None = None

    def send(self, **fields: str) -> bool:
        """Send one datagram with ``KEY=VALUE`` lines; True when it was sent."""
        if self.address is None:
            return False
        payload = "\n".join(f"{key}={value}" for key, value in fields.items()).encode()
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.setblocking(False)
            self._sock.sendto(payload, self.address)
        except OSError as exc:
            if not self._failing:
                log.warning("systemd notify failed", error=str(exc))
            self._failing = True
            return False
        self._failing = False
        return True

    def ready(self, status: str) -> None:
        self.last_status = status
        self.send(READY="1", STATUS=status)

    def extend_start(self, seconds: float) -> None:
        """Ask systemd for ``seconds`` more to start (``EXTEND_TIMEOUT_USEC``)."""
        self.send(EXTEND_TIMEOUT_USEC=str(round(seconds * 1_000_000)))

    def status(self, text: str) -> None:
        if text != self.last_status:
            self.last_status = text
            self.send(STATUS=text)

    def reloading(self) -> None:
        """A reload begins; ``MONOTONIC_USEC`` is CLOCK_MONOTONIC now, as systemd 253 asks."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.send(RELOADING="1", MONOTONIC_USEC=str(usec))

    def stopping(self) -> None:
        self.send(STOPPING="1", STATUS="stopping")


def watchdog_interval(environ: Mapping[str, str] | None = None) -> float | None:
    """Half of ``WATCHDOG_USEC`` in seconds, or None when the watchdog is off for us.

    ``$WATCHDOG_PID`` is honoured: a watchdog meant for another process is off for us.
    """
    env = os.environ if environ is None else environ
    usec = env.get("WATCHDOG_USEC")
    pid = env.get("WATCHDOG_PID")
    if not usec or not usec.isdigit() or int(usec) == 0:
        return None
    if pid and pid.isdigit() and int(pid) != os.getpid():
        return None
    return int(usec) / 2 / 1_000_000


async def run_watchdog(notifier: Notifier, interval_s: float, healthy: Callable[[], bool]) -> None:
    """Ping ``WATCHDOG=1`` every ``interval_s`` while ``healthy()``; runs until cancelled.

    A crash-looping tree stops the pings, so systemd's ``WatchdogSec`` restarts
    the whole process, the same escalation as exit 4.
    """
    while True:
        if healthy():
            notifier.send(WATCHDOG="1")
        await trio.sleep(interval_s)
