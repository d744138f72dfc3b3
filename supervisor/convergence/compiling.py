"""Compile a revision body without stalling the event loop or keeping its garbage.

Bodies above :data:`THREAD_COMPILE_BYTES` (about 10,000 aliases, ~6 ms of
compile) are compiled in a worker thread so the event loop (admin API,
signals, watchdog) keeps answering during a large compile.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from supervisor.revision.errors import RevisionError

if TYPE_CHECKING:
    from supervisor.revision.secrets import SecretResolver
    from supervisor.revision.snapshot import Snapshot

__all__ = ["THREAD_COMPILE_BYTES", "compile_body"]

THREAD_COMPILE_BYTES = 1024 * 1024


def _fresh(exc: RevisionError) -> RevisionError:
    """The same refusal without traceback or context.

    Raised from a worker thread, a refusal's traceback keeps every frame's
    locals alive (the decoded document of a 16 MB body among them), often in
    cycles the collector rarely frees. The label, the revision and the detail
    are all the loop needs.
    """
    return RevisionError(exc.reason, exc.detail, revision=exc.revision)


async def compile_body(body: bytes, revision: int, generation: int,
                       resolver: SecretResolver | None) -> Snapshot:
    """The immutable snapshot of ``body``; raises :class:`RevisionError` (no context)."""
    from supervisor.revision.compile import compile_revision

    def run() -> Snapshot:
        try:
            return compile_revision(
                body, revision=revision, generation=generation, resolver=resolver
            )
        except RevisionError as exc:
            refusal = _fresh(exc)
        # Raised outside the except block: no __context__ chain either.
        raise refusal

    if len(body) > THREAD_COMPILE_BYTES:
        return await trio.to_thread.run_sync(run, abandon_on_cancel=True)
    return run()
