"""One reconcile attempt of one parent, and what its outcome does to the queue.

:class:`ReconcileRetries` is the step each worker of
:class:`~supervisor.fanout.engine.FanoutEngine` runs for a key it took from the
:class:`~supervisor.fanout.workqueue.WorkQueue` (the engine owns the queue, the
workers and the watches; this owns the retry policy). Contract of
:meth:`ReconcileRetries.attempt`:

- It runs the reconcile once; a :class:`~supervisor.kube.errors.KubeError`
  from it is handled here, never raised (anything else, cancellation
  included, propagates).
- **Success** resets the key's backoff.
- **409** (:class:`~supervisor.kube.errors.Conflict`): requeued, never dropped;
  logged at info; the parent reported ``Conflict``.
- **422** (:class:`~supervisor.kube.errors.Invalid`): not requeued (the parent's
  change or the next resync brings it back); logged at warning; the parent
  reported ``Invalid``.
- **Any other** ``KubeError`` (a 403, a 5xx, a timeout, a 429): requeued; logged
  at warning; the parent reported ``ApplyFailed``.
- A requeue waits a per-key backoff counted from the first retry on:
  ``requeue_initial_s`` doubling to ``requeue_max_s`` (0.8 s to 30 s by
  default), jittered down to half; on a 429 at least its ``Retry-After``.
- Metrics: ``fanout_applies{kind,result}`` (``conflict`` or ``error`` for a
  failure), ``fanout_requeues{kind,cause}`` (``conflict``, ``throttled``,
  ``error``) and ``fanout_reconcile_duration_seconds{kind,result}`` (``success``,
  ``conflict``, ``invalid``, ``error``) for every attempt.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

from supervisor.backoff import Backoff
from supervisor.fanout.kind import FanoutTuning
from supervisor.kube.errors import Conflict, Invalid, KubeError, TooManyRequests
from supervisor.telemetry import Metrics

__all__ = ["ReconcileRetries"]


@dataclass(eq=False)
class ReconcileRetries:
    """Runs one key's reconcile and requeues or reports its failure (see the module doc).

    ``reconcile(name)`` makes the children what the parent wants;
    ``failed(name, reason, message)`` reports a failure on the parent (reason
    ``Conflict``, ``Invalid`` or ``ApplyFailed``); ``requeue_after(name, delay)``
    adds the key back to the queue after ``delay`` seconds.
    """

    kind: str
    tuning: FanoutTuning
    metrics: Metrics
    rng: random.Random
    reconcile: Callable[[str], Awaitable[None]]
    failed: Callable[[str, str, str], Awaitable[None]]
    requeue_after: Callable[[str, float], None]
    log: Any

    def __post_init__(self) -> None:
        self._backoff = Backoff(self.tuning.requeue_initial_s, self.tuning.requeue_max_s, self.rng)
        self._failures: dict[str, int] = {}  # key -> failed attempts since its last success

    def requeue(self, name: str, exc: KubeError, cause: str) -> float:
        """Requeue ``name`` after its next backoff delay (returned, in seconds)."""
        failures = self._failures.get(name, 0)
        self._failures[name] = failures + 1
        delay = self._backoff.after(failures, at_least=exc.retry_after)
        self.metrics.fanout_requeues.labels(self.kind, cause).inc()
        self.requeue_after(name, delay)
        return delay

    async def attempt(self, name: str) -> None:
        """Reconcile ``name`` once; a failure is requeued or reported, never raised."""
        started = trio.current_time()
        result = "success"
        try:
            await self.reconcile(name)
        except Conflict as exc:
            result = "conflict"
            self.metrics.fanout_applies.labels(self.kind, "conflict").inc()
            delay = self.requeue(name, exc, "conflict")
            self.log.info("conflict writing a child; requeued", name=name, error=str(exc),
                           delay_s=round(delay, 3))
            await self.failed(name, "Conflict", str(exc))
        except Invalid as exc:
            result = "invalid"
            self.metrics.fanout_applies.labels(self.kind, "error").inc()
            self.log.warning("child refused by the API server; not retried until the parent"
                              " changes", name=name, error=str(exc))
            await self.failed(name, "Invalid", str(exc))
        except KubeError as exc:
            result = "error"
            self.metrics.fanout_applies.labels(self.kind, "error").inc()
            cause = "throttled" if isinstance(exc, TooManyRequests) else "error"
            delay = self.requeue(name, exc, cause)
            self.log.warning("reconcile failed; requeued", name=name, error=str(exc),
                              delay_s=round(delay, 3))
            await self.failed(name, "ApplyFailed", str(exc))
        else:
            self._failures.pop(name, None)
        finally:
            self.metrics.fanout_reconcile_duration.labels(self.kind, result).observe(
                trio.current_time() - started)
