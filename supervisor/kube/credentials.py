"""The bearer token of one Kubernetes client: refreshed on a period, re-read after a 401."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import suppress

import outcome
import trio

from supervisor.kube.config import KubeSettings
from supervisor.logs import get_logger

__all__ = ["Credentials"]

log = get_logger("kube")


class Credentials:
    """The ``Authorization`` header value of one client, kept current.

    ``load`` is the client's settings loader (a coroutine function), called again
    after a 401; ``refresh_s`` is the period of the refresh hook. Until :meth:`adopt`
    there is no token. ``lock`` is the client's: loading settings, for the connection
    or the token, is one thing at a time.

    Refreshes and reloads run in worker threads that cancellation abandons. So a hung
    exec plugin or token file cannot outlast the caller's deadline (the leader's renew deadline).
    """

    def __init__(
        self,
        load: Callable[[], Awaitable[KubeSettings]],
        *,
        refresh_s: float,
        lock: trio.Lock,
    ) -> None:
        self._load = load
        self._refresh_s = refresh_s
        self._lock = lock
        self.authorization: str | None = None
        self._refresh: Callable[[], str | None] | None = None
        self._refreshed_at = 0.0
        self._refresh_job: trio.Event | None = None  # set when the refresh thread running ends
        self.reloads = 0

    def adopt(self, settings: KubeSettings) -> None:
        """Take the token and refresh hook of ``settings``, just loaded; refreshed now."""
        self.authorization = settings.authorization
        self._refresh = settings.refresh
        self._refreshed_at = trio.current_time()

    def drop_refresh(self) -> None:
        """Forget a refresh still running: its answer will be dropped."""
        self._refresh_job = None

    async def current(self) -> str | None:
        """The header value to send, refreshed first when the period has passed.

        The refresh runs the settings' refresh hook (in-cluster: the service-account token
        file). A refresh still running blocks callers, cancellably; no second one starts.
        Its token is adopted when its thread ends, unless :meth:`reload_after_401` or
        :meth:`drop_refresh` superseded it. A failed refresh keeps the current token (logged).
        """
        refresh = self._refresh
        if (
            refresh is not None
            and trio.current_time() - self._refreshed_at >= self._refresh_s
        ):
            async with self._lock:
                if trio.current_time() - self._refreshed_at >= self._refresh_s:
                    job = self._refresh_job
                    if job is None:
                        job = self._refresh_job = self._start_refresh(refresh)
                    # Cancellable; the thread runs on and its answer is adopted when it ends.
                    await job.wait()
        return self.authorization

    def _start_refresh(self, refresh: Callable[[], str | None]) -> trio.Event:
        done = trio.Event()
        trio_token = trio.lowlevel.current_trio_token()

        def finish(result: outcome.Outcome[str | None]) -> None:
            """The refresh thread ended (in trio's thread): adopt its token unless superseded."""
            done.set()
            if self._refresh_job is not done:
                return  # a reload after 401 or aclose came first: this answer is stale
            self._refresh_job = None
            self._refreshed_at = trio.current_time()
            try:
                self.authorization = result.unwrap()
            except Exception as exc:  # noqa: BLE001 - the loader's own errors; keep the old token
                log.warning("token refresh failed; keeping the current token",
                            error=f"{type(exc).__name__}: {exc}")

        def deliver(result: outcome.Outcome[str | None]) -> None:  # in the worker thread
            with suppress(trio.RunFinishedError):
                trio_token.run_sync_soon(finish, result)

        trio.lowlevel.start_thread_soon(refresh, deliver, name="kube token refresh")
        return done

    async def reload_after_401(self, refused: str | None) -> None:
        """Run the loader again after ``refused`` drew a 401; once for concurrent callers.

        It re-reads a kubeconfig ``tokenFile`` or re-runs an exec plugin, then adopts the
        token and refresh hook. Concurrent 401s for one token reload once; :attr:`reloads` counts.
        """
        async with self._lock:
            if self.authorization != refused:
                return  # another task already reloaded while we waited for the lock
            settings = await self._load()
            # The connection pool stays (TLS identity is fixed for its lifetime);
            # the new token and its refresh hook are adopted.
            self.adopt(settings)
            self._refresh_job = None  # a refresh still running answers for the old settings
            self.reloads += 1
            log.info("credentials re-read after 401", source=settings.source,
                     changed=settings.authorization != refused)
