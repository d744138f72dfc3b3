"""Boot: reach a first servable snapshot, or refuse to boot naming why.

:func:`bootstrap` runs one attempt of the loop. The signed last-known-good
cache answers exactly three failures: an unreachable control plane, a
desired revision this build cannot read (``incompatible``, a mixed-version
rollout), and, in follower mode, an upstream statement refused
(``denied``, ``rollback``, ``corrupt``, ``stale``); and, with
``[cache].serve_when_desired_refused``, any refusal of the desired revision.
Otherwise corruption, oversize, refused reads and uncompilable revisions never
fall back: cached state would hide damage an
operator must fix. Every refusal is :class:`~supervisor.errors.BootRefused`
(exit 3), its message naming the cause and, when the cache was tried, why it
could not serve either.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import trio

from supervisor import reasons
from supervisor.controlplane.errors import ControlPlaneError, SchemaTooNew, StatementRefused
from supervisor.convergence.compiling import compile_body
from supervisor.convergence.outcome import Outcome, OutcomeKind, failure_fields
from supervisor.errors import BootRefused, ConfigError
from supervisor.logs import get_logger
from supervisor.revision.errors import RevisionError

if TYPE_CHECKING:
    from supervisor.convergence.loop import ConvergenceLoop

__all__ = ["bootstrap"]

log = get_logger("convergence")


async def bootstrap(loop: ConvergenceLoop) -> Outcome:
    """Reach a first servable snapshot, or raise BootRefused naming the refusal."""
    try:
        outcome = await loop.attempt()
    except SchemaTooNew as exc:
        # A newer build migrated the database: serving a cache meanwhile would
        # hide that this replica must be upgraded; exit 2 as for a bad config.
        raise ConfigError("$.control_plane.url", str(exc)) from exc
    except ControlPlaneError as exc:
        loop.record_failure(exc)
        # A follower's refused statement (denied, rollback, corrupt, stale) is
        # no reason to serve nothing: its own signed cache serves, as for an
        # unreachable upstream, and the refusal stays in last_rejection.
        if (exc.retryable or exc.reason == reasons.INCOMPATIBLE
                or isinstance(exc, StatementRefused)):
            return await _restore(loop, exc)
        if exc.revision is not None and _serving_cache_instead(loop, exc):
            # The desired revision itself is refused (corrupt, too large, missing).
            return await _restore(loop, exc)
        raise BootRefused(
            exc.reason, f"refusing to boot: the control plane refused: {exc}"
        ) from exc
    except RevisionError as exc:
        loop.record_failure(exc)
        # unavailable: a transient OS error while resolving a secret (EMFILE ...).
        if exc.reason in (reasons.INCOMPATIBLE, reasons.UNAVAILABLE):
            return await _restore(loop, exc)
        if _serving_cache_instead(loop, exc):
            return await _restore(loop, exc)
        raise BootRefused(
            exc.reason,
            f"refusing to boot: desired revision {exc.revision} cannot be served "
            f"({exc.reason}): {exc.detail}",
        ) from exc
    if outcome.kind is OutcomeKind.EMPTY:
        raise BootRefused(
            "empty",
            "refusing to boot: the control plane is reachable but has no desired "
            "revision; publish one with `trio-supervisor publish`",
        )
    loop.status.attempt_finished()
    loop.metrics.convergence_attempts.labels(outcome.kind.value).inc()
    return outcome


def _serving_cache_instead(loop: ConvergenceLoop,
                           exc: ControlPlaneError | RevisionError) -> bool:
    """``[cache].serve_when_desired_refused``: a refused desired revision boots the cache."""
    if not loop.serve_cache_on_refusal or loop.sinks.cache is None:
        return False
    reason, revision, detail = failure_fields(exc)
    log.error("desired revision refused at boot; serving the last-known-good cache "
              "([cache].serve_when_desired_refused)", reason=reason, revision=revision,
              detail=detail)
    return True


async def _restore(loop: ConvergenceLoop, cause: ControlPlaneError | RevisionError) -> Outcome:
    from supervisor.sinks.lkg import CacheError, CacheSkew

    reason, _, detail = failure_fields(cause)
    cache = loop.sinks.cache
    if cache is None:
        raise BootRefused(
            reason,
            f"refusing to boot: {detail} ({reason}), and no last-known-good cache is "
            "configured ([cache].path)",
        ) from cause
    events = loop.metrics.last_known_good_events
    try:
        cached = await trio.to_thread.run_sync(cache.load)
    except CacheSkew as exc:
        log.error("last-known-good cache written by a newer build (version skew); "
                  "treating it as no cache", path=cache.path, error=str(exc))
        events.labels("refused").inc()
        raise BootRefused(
            "cache",
            f"refusing to boot: {detail} ({reason}); the last-known-good cache is from "
            f"a newer format (version skew), treated as no cache: {exc}",
        ) from exc
    except CacheError as exc:
        events.labels("refused").inc()
        raise BootRefused(
            "cache",
            f"refusing to boot: {detail} ({reason}); the last-known-good cache was "
            f"refused ({exc.reason}): {exc}",
        ) from exc
    if cached is None:
        raise BootRefused(
            reason,
            f"refusing to boot: {detail} ({reason}), and the last-known-good cache "
            "file does not exist yet",
        ) from cause
    generation = loop.state.generation + 1
    try:
        snapshot = await compile_body(cached.body, cached.revision, generation, loop.resolver)
    except RevisionError as exc:
        events.labels("refused").inc()
        raise BootRefused(
            "cache",
            f"refusing to boot: the last-known-good cache (revision {cached.revision}) "
            f"does not compile ({exc.reason}): {exc.detail}",
        ) from exc
    loop.status.loaded_revision(cached.revision)
    await loop.swap_in(snapshot, "last_known_good", 0.0,
                       body_sha256=hashlib.sha256(cached.body).digest(),
                       statement=cached.statement)
    events.labels("restored").inc()
    loop.status.attempt_finished()
    log.warning("serving the last-known-good cache", revision=cached.revision,
                age_s=round(cached.age_s, 1), cause=reason)
    return Outcome(OutcomeKind.PUBLISHED, revision=cached.revision, generation=generation)
