"""The daemon: builds every component from the configuration and runs the root nursery.

The start-up and shutdown order: :meth:`Daemon.run`.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import trio

from supervisor import health, logs, reasons
from supervisor.config import Config
from supervisor.convergence.side_sinks import SinkStatus
from supervisor.convergence.signal import ChangeSignal
from supervisor.convergence.status import RevisionStatus
from supervisor.errors import ConfigError
from supervisor.events import EventBus, StatusChanged
from supervisor.fanout.status import FanoutStatus
from supervisor.lifecycle.reload import RELOAD_TIMEOUT_S, ConfigReload
from supervisor.lifecycle.signals import HANDLED, HupHooks
from supervisor.lifecycle.systemd import Notifier, run_watchdog, watchdog_interval
from supervisor.sinks.state import ActiveState
from supervisor.telemetry import Metrics
from supervisor.threads import FILE_IO_DEADLINE_S, ThreadDeadline, in_thread
from supervisor.tree import ChildSpec, Restart, Supervisor
from supervisor.wakeup import Wakeup

if TYPE_CHECKING:
    from supervisor.admin.context import AdminContext
    from supervisor.admin.signed import SignedRevisionFile
    from supervisor.fanout.leadership import LeadershipStatus
    from supervisor.sinks.hook import ReloadHook
    from supervisor.sinks.lkg import LastKnownGood
    from supervisor.sinks.lkg.accepted import AcceptedStatements

__all__ = ["Daemon", "run_daemon"]

log = logs.get_logger("daemon")

# After a second signal, or past the grace, how long cancellation may take
# before the process is ended without further cleanup. Every write the daemon
# makes is atomic (temp file + rename), so nothing is lost either way.
HARD_EXIT_AFTER_S = 2.0


@dataclass
class Daemon:
    config: Config
    config_path: str | None = None
    notifier: Notifier = field(default_factory=Notifier)
    metrics: Metrics = field(default_factory=Metrics)
    events: EventBus = field(default_factory=EventBus)
    # The serving revision; a follower's names its upstream ([control_plane].url).
    state: ActiveState = field(init=False)
    # Reads the state: the serving revision is kept there only.
    status: RevisionStatus = field(init=False)
    signal: ChangeSignal = field(default_factory=ChangeSignal)
    hup: HupHooks = field(default_factory=HupHooks)
    listener_poke: Wakeup = field(default_factory=Wakeup)
    sinks: SinkStatus = field(default_factory=SinkStatus)
    fanout: dict[str, FanoutStatus] = field(default_factory=dict)
    tree: Supervisor | None = None
    leadership: LeadershipStatus | None = None
    _stopping: bool = False
    _convergence_started: bool = False
    _ready: bool = False
    _watchdog_was_healthy: bool = True
    _reload: ConfigReload | None = None
    _admin_ctx: AdminContext | None = None
    # Follower mode: the highest statement accepted, kept across child restarts.
    _accepted: AcceptedStatements | None = None

    def __post_init__(self) -> None:
        cp = self.config.control_plane
        self.state = ActiveState(upstream=cp.url if cp.backend == "follower" else None)
        self.status = RevisionStatus(self.state)
        if cp.backend == "follower":  # named on each fetch and stream, for the fleet view
            from supervisor.admin.fleet import describe_follower
            from supervisor.controlplane.replica_name import name_this_replica

            name_this_replica(partial(describe_follower, self.config, self.status))

    # -- children --------------------------------------------------------------

    def _admin_child(self) -> ChildSpec:
        from supervisor.admin.auth import admin_tokens
        from supervisor.admin.context import AdminContext
        from supervisor.admin.server import serve_admin

        cfg = self.config.admin
        tls = None
        if cfg.tls_cert_file is not None and cfg.tls_key_file is not None:
            from supervisor.tlsconfig import ServerContexts

            # Loaded once, here (a bad file exits 2); SIGHUP loads the files again.
            tls = ServerContexts(cfg.tls_cert_file, cfg.tls_key_file, cfg.client_ca_file)
            self.hup.register("admin-tls-reload", tls.reload)

        async def run(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            # Built by every start: a restart re-reads the token files.
            token, read = admin_tokens(cfg.token_file, cfg.read_token_file)
            # converge: POST /v1/converge, a request on the change signal; signed: what
            # GET /v1/revision serves; leadership None (reported "disabled"): no election.
            ctx = AdminContext(
                state=self.state, revision=self.status, events=self.events, metrics=self.metrics,
                children=lambda: self.tree.report() if self.tree is not None else {},
                fanout=self.fanout, token=token, read_token=read, unhealthy=self.unhealthy,
                allowed_hosts=tuple(cfg.allowed_hosts), allowed_origins=tuple(cfg.allowed_origins),
                converge=self.signal.converge, signed=self._signed_revision_file(),
                leadership=self.leadership.report if self.leadership is not None else None,
                sinks=self.sinks)
            self._admin_ctx = ctx  # SIGHUP replaces its tokens
            async with trio.open_nursery() as nursery:
                await nursery.start(
                    partial(serve_admin, tls=tls.current if tls is not None else None),
                    ctx, cfg.listen)
                task_status.started()

        return ChildSpec("admin", run, Restart.PERMANENT, shutdown_timeout_s=2.0)

    def _open_cache(self) -> LastKnownGood | None:
        if self.config.cache.path is None:
            return None
        from supervisor.revision.document import SCHEMA_VERSION
        from supervisor.sinks.lkg import LastKnownGood

        cache = LastKnownGood(
            self.config.cache.path, signing_key_path=self.config.cache.signing_key,
            trusted_keys=self.config.cache.trusted_keys, max_schema_version=SCHEMA_VERSION)
        if self.config.control_plane.backend == "follower":
            cache.refuse_own_key_among(self.config.control_plane.trusted_keys,
                                       "$.control_plane.trusted_keys")
        if not cache.signing_key_trusted:
            log.warning("the cache signing key is not among cache.trusted_keys: this "
                        "replica would refuse its own cache at boot",
                        path=self.config.cache.path)
        return cache

    def _convergence_child(self) -> ChildSpec:
        cp = self.config.control_plane
        self.hup.register("converge-now", lambda: self.signal.notify("sighup"))

        async def run(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            # Everything this child owns is made here, by every start, and
            # closed on the way out: a restart after a crash starts fresh (a
            # store closed by the previous run's ``finally`` is never reused).
            from supervisor.controlplane.factory import open_source
            from supervisor.convergence.loop import ConvergenceLoop, Reporting
            from supervisor.convergence.side_sinks import SideSinks
            from supervisor.revision.document import SCHEMA_VERSION
            from supervisor.revision.secrets import EnvFileResolver
            from supervisor.sinks.file import SnapshotFile

            try:
                cache = self._open_cache()
            except ConfigError as exc:
                if not self._convergence_started:
                    raise  # at boot: a configuration error, exit 2
                # A restart after a crash must not turn a serving replica into
                # a configuration error (systemd would not restart exit 2): the
                # cache is left out until the process restarts.
                log.error("last-known-good cache unusable after a restart; serving "
                          "without it until the process restarts", error=str(exc))
                cache = None
            self._convergence_started = True
            snapshot_file = (SnapshotFile(self.config.snapshot.path)
                             if self.config.snapshot.path is not None else None)
            if cp.backend == "follower" and self._accepted is None:
                # Made once per process, read at its first start: a restarted
                # child keeps the highest statement accepted.
                from supervisor.sinks.lkg.accepted import ACCEPTED_SUFFIX, AcceptedStatements

                path = self.config.cache.path
                self._accepted = await in_thread(
                    partial(AcceptedStatements, None if path is None else path + ACCEPTED_SUFFIX),
                    dependency="files", deadline_s=FILE_IO_DEADLINE_S,
                    what="the accepted statement read")
                await self._restore_accepted(self._accepted)
            source = open_source(cp, max_schema_version=SCHEMA_VERSION, accepted=self._accepted)
            try:
                reconciler = ConvergenceLoop(
                    source, control_plane=cp, cache=self.config.cache,
                    report=Reporting(status=self.status, metrics=self.metrics,
                                     events=self.events, on_status=self.notifier.status,
                                     on_outage_change=lambda _down: self.listener_poke.wake()),
                    sinks=SideSinks(self.metrics, cache=cache, snapshot_file=snapshot_file,
                                    status=self.sinks,
                                    forward_to=self._forward_path()),
                    signal=self.signal,
                    resolver=EnvFileResolver.for_daemon(self.config, self.config_path))
                await reconciler.run(task_status=task_status)
            finally:
                with trio.move_on_after(2.0, shield=True):
                    await source.aclose()

        return ChildSpec("convergence", run, Restart.PERMANENT, shutdown_timeout_s=3.0)

    async def _restore_accepted(self, accepted: AcceptedStatements) -> None:
        """At start: the statement this follower passes on, when above its accepted file."""
        from supervisor.sinks.lkg.errors import CacheError
        from supervisor.sinks.lkg.fileformat import MAX_HEADER_BYTES, SIGNATURE_BYTES

        forward = self._forward_path()
        if forward is None or accepted.path is None:
            return
        cp = self.config.control_plane
        limit = cp.max_revision_bytes + MAX_HEADER_BYTES + SIGNATURE_BYTES + 64
        try:
            restored = await in_thread(
                partial(accepted.restore_from, forward, list(cp.trusted_keys), limit=limit,
                        root_identity=cp.root_identity),
                dependency="files", deadline_s=FILE_IO_DEADLINE_S,
                what="the accepted statement restore")
        except (CacheError, ThreadDeadline) as exc:
            log.warning("cannot persist the highest accepted statement; a restart would "
                        "forget it", error=str(exc))
            restored = accepted.highest
        if restored is not None:
            log.warning("the accepted statements file was missing or behind: the highest "
                        "accepted is the statement this follower passes on", path=accepted.path,
                        sequence=restored.sequence, revision=restored.revision)

    def _listen_child(self) -> ChildSpec | None:
        """The wake-ups ahead of the poll: PostgreSQL's LISTEN, or (a follower) the
        upstream's /v1/stream."""
        cp = self.config.control_plane
        if not cp.listen or cp.backend == "sqlite":
            return None

        async def run(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            if cp.backend == "follower":
                from supervisor.controlplane.follower import upstream_token
                from supervisor.controlplane.upstream_hint import run_upstream_hint

                await run_upstream_hint(cp, self.signal.notify, token=upstream_token(cp),
                                        reconnecting=self._listen_reconnecting,
                                        task_status=task_status)
            else:
                from supervisor.controlplane.listen import run_listener

                await run_listener(cp, self.signal.notify, self.metrics,
                                   poke=self.listener_poke, reconnecting=self._listen_reconnecting,
                                   task_status=task_status)

        return ChildSpec("listen", run, Restart.PERMANENT, shutdown_timeout_s=2.0)

    def _listen_reconnecting(self, on: bool) -> None:
        """The listen child (LISTEN, or a follower's stream) retrying its connection shows
        ``reconnecting`` in /status."""
        if self.tree is not None:
            self.tree.report_substate("listen", "reconnecting" if on else None)

    def _forward_path(self) -> str | None:
        """Where a follower keeps the statement it passes on (None: not a follower, no cache)."""
        if self.config.control_plane.backend != "follower":
            return None
        from supervisor.controlplane.follower import forward_path  # httpx: followers only

        return forward_path(self.config.cache.path)

    def _signed_revision_file(self) -> SignedRevisionFile:
        """What GET /v1/revision serves: a follower forwards its upstream's signed bytes."""
        from supervisor.admin.signed import SignedRevisionFile

        cp, cache = self.config.control_plane, self.config.cache
        follower = cp.backend == "follower"
        return SignedRevisionFile(self._forward_path() if follower else cache.path,
                                  follower or cache.signing_key is not None,
                                  max_bytes=cp.max_revision_bytes)

    # -- health ----------------------------------------------------------------

    # The rules live in supervisor/health.py; these read them for this daemon.

    def unhealthy(self) -> list[str]:
        """Why /healthz answers 503 (:func:`supervisor.health.unhealthy`)."""
        return health.unhealthy(self.tree, self.status, self.config.control_plane,
                                ready=self._ready, sinks=self.sinks)

    def _watchdog_healthy(self) -> bool:
        """The watchdog's question; its answer changing is said on the STATUS= line too.

        A stuck child or a stall changes nothing in the tree, so without this
        ``systemctl status`` would keep showing the last line from before.
        """
        healthy = health.watchdog_healthy(self.tree, self.status, self.config.control_plane)
        if healthy != self._watchdog_was_healthy:
            self._watchdog_was_healthy = healthy
            self.notifier.status(health.status_line(healthy, self.unhealthy(), self.status.active))
        return healthy

    def _fanout_children(self) -> list[ChildSpec]:
        if not self.config.kubernetes.enabled:
            # Reported, not absent: an operator sees "disabled", not a missing key.
            for kind in reasons.FANOUT_KINDS:
                self.fanout[kind] = FanoutStatus(state="disabled")
            return []
        kube = self.config.kubernetes
        if not kube.leader_election:
            from supervisor.fanout.children import fanout_children

            return fanout_children(kube, self.metrics, self.fanout, hup=self.hup)
        from supervisor.fanout.children import elected_fanout_child
        from supervisor.fanout.leadership import LeadershipStatus, announcer, default_identity

        self.leadership = LeadershipStatus(lease=f"{kube.control_namespace}/{kube.lease_name}")
        return [elected_fanout_child(kube, self.metrics, self.fanout, self.leadership,
                                     kube.identity or default_identity(), hup=self.hup,
                                     on_change=announcer(self.events, self.notifier.status))]


    def build_tree(self) -> Supervisor:
        # Before the loop's first start, so /status is right from the first request.
        self.sinks.configure("cache", self.config.cache.path is not None)
        self.sinks.configure("snapshot_file", self.config.snapshot.path is not None)
        self.metrics.follow_sinks(self.sinks.state)
        listen = self._listen_child()
        specs = [self._admin_child(), *([listen] if listen is not None else []),
                 self._convergence_child(), *self._fanout_children()]
        for spec in specs:  # pre-initialised: a rate() over a child never restarted is 0
            self.metrics.child_restarts.labels(spec.name)
        sup = self.config.supervisor
        self.tree = Supervisor(
            specs, intensity=sup.restart_intensity, period_s=sup.restart_period_s,
            on_restart=lambda name: self.metrics.child_restarts.labels(name).inc(),
            on_change=self._tree_changed)
        return self.tree

    def _tree_changed(self) -> None:
        if self.tree is None:
            return
        report = self.tree.report()
        self.events.emit(StatusChanged(children=report))
        troubled = [name for name, child in report.items() if child.state in ("backoff", "failed")]
        if troubled and self._ready:
            self.notifier.status("restarting: " + ", ".join(troubled))

    def _reload_hook(self) -> ReloadHook:
        """``[hook].command``, told of each swap through the sinks' status."""
        from supervisor.sinks.hook import ReloadHook

        hook, path = self.config.hook, self.config.snapshot.path
        self.sinks.hook = ReloadHook(hook.command, hook.timeout_s, state=self.state,
                                     metrics=self.metrics,
                                     snapshot_path=os.path.abspath(path) if path else None)
        return self.sinks.hook

    # -- signals ---------------------------------------------------------------

    async def _on_sighup(self) -> None:
        """Re-read the file off the loop (:mod:`~supervisor.lifecycle.reload`), then the hooks.

        Once ready, systemd is told ``RELOADING=1`` first and ``READY=1`` when done.
        """
        ready = self._ready
        if ready:
            self.notifier.reloading()
        failed: list[str] = []
        if self.config_path is not None:
            if self._reload is None:
                self._reload = ConfigReload(self.config_path, self.config)
            fresh = await self._reload.read()
            if fresh is not None:
                logs.set_level(fresh.log.level)
                log.info("SIGHUP: log level set", new_level=fresh.log.level)
                self._reload.restart_needed(fresh)
            else:
                failed.append(f"configuration not reloaded: {self._reload.last_error}")
        admin = self.config.admin
        if self._admin_ctx is not None and (admin.token_file or admin.read_token_file):
            from supervisor.admin.auth import reread_tokens

            tokens = await reread_tokens(admin.token_file, admin.read_token_file,
                                         timeout_s=RELOAD_TIMEOUT_S)
            if tokens is None:
                failed.append("tokens not reloaded")
            else:
                self._admin_ctx.set_tokens(*tokens)
        for name, exc in self.hup.run():
            log.error("SIGHUP hook failed", hook=name, error=str(exc))
            failed.append(f"{name} failed: {exc}")
        if ready:
            active = self.status.active
            # The reload is done (or failed, which the status says): READY=1 again.
            self.notifier.ready("; ".join(["reload failed", *failed]) if failed
                                else f"reloaded; serving revision {active}")

    async def _signals(self, receiver: Any, tree_scope: trio.CancelScope,
                       nursery: trio.Nursery) -> None:
        async for signum in receiver:
            if signum == signal.SIGHUP:
                # A task of its own: a SIGTERM during a slow re-read is still
                # taken at once.
                nursery.start_soon(self._on_sighup)
                continue
            if self._stopping:
                log.warning("second signal: cancelling now", signal=signal.Signals(signum).name)
                tree_scope.cancel()
                nursery.start_soon(self._hard_exit, HARD_EXIT_AFTER_S)
                continue
            self._stopping = True
            log.info("shutting down", signal=signal.Signals(signum).name,
                     grace_s=self.config.supervisor.shutdown_grace_s)
            self.notifier.stopping()
            nursery.start_soon(self._graceful, tree_scope, nursery)

    async def _graceful(self, tree_scope: trio.CancelScope, nursery: trio.Nursery) -> None:
        if self.tree is not None and self._ready:  # still starting: nothing to stop gracefully
            with trio.move_on_after(self.config.supervisor.shutdown_grace_s):
                await self.tree.shutdown()
        tree_scope.cancel()
        nursery.start_soon(self._hard_exit, HARD_EXIT_AFTER_S)

    async def _hard_exit(self, after_s: float) -> None:
        await trio.sleep(after_s)
        log.error("shutdown did not finish; exiting without further cleanup")
        os._exit(1)

    # -- running ---------------------------------------------------------------

    async def run(self) -> None:
        """Run until shutdown. Raises BootRefused, SupervisionGaveUp, ConfigError.

        Start-up order, and why:

        1. The signal receiver, before anything slow: PID 1 in a container drops signals
           that have no handler.
        2. The supervision tree (:meth:`build_tree`), children in order: ``admin`` (so
           /healthz and /readyz answer during bootstrap); ``listen`` (a notification during
           bootstrap wakes the loop right after it); ``convergence`` (started once the first
           snapshot is published; else boot is refused, exit 3). Then one watcher per
           fan-out kind, dormant in its preflight: readiness never waits for Kubernetes.
           With ``[kubernetes].leader_election``, one ``fanout`` child instead: the Lease
           election, running every kind only while this replica leads.
        3. ``READY=1`` once the tree reports every child started.

        Shutdown: the first SIGTERM/SIGINT sends ``STOPPING=1`` and stops the children in
        reverse order within ``shutdown_grace_s``; what still runs is then cancelled. A
        second signal cancels at once. SIGHUP runs :meth:`_on_sighup` in a task of its own.
        """
        # Before anything slow: a start within its deadlines outlasts TimeoutStartSec.
        self.notifier.extend_start(health.boot_deadline_s(self.config.control_plane))
        lock = None
        if self.config.cache.path is not None:
            from supervisor.sinks.lkg.files import hold_cache_lock

            # One daemon per cache; a predecessor still stopping is waited for.
            lock = await in_thread(partial(hold_cache_lock, self.config.cache.path),
                                   dependency="files", deadline_s=FILE_IO_DEADLINE_S,
                                   what="the cache lock")
            if lock is None:
                log.warning("cache lock not taken: its directory cannot be written; serving "
                            "without it", path=self.config.cache.path)
        try:
            await self._run()
        finally:
            if lock is not None:
                lock.release()

    async def _run(self) -> None:
        with trio.open_signal_receiver(*HANDLED) as receiver:
            tree = self.build_tree()
            tree_scope = trio.CancelScope()
            async with trio.open_nursery() as root:
                root.start_soon(self._signals, receiver, tree_scope, root)
                if self.config.hook.command:
                    root.start_soon(self._reload_hook().run)
                try:
                    with tree_scope:
                        async with trio.open_nursery() as tree_nursery:
                            await tree_nursery.start(tree.run)
                            self._ready = True
                            snapshot = self.state.snapshot
                            revision = snapshot.revision if snapshot is not None else None
                            self.notifier.ready(f"serving revision {revision}")
                            log.info("ready", revision=revision, children=sorted(tree.children))
                            interval = watchdog_interval()
                            if interval is not None:
                                tree_nursery.start_soon(run_watchdog, self.notifier, interval,
                                                        self._watchdog_healthy)
                finally:
                    root.cancel_scope.cancel()
        log.info("stopped")


async def run_daemon(config: Config, config_path: str | None = None) -> None:
    await Daemon(config, config_path).run()

