"""How a control-plane store fails: :class:`ControlPlaneError`, its category and reason.

Each driver maps its own errors (``postgres.map_error``, ``sqlite.map_error``).
"""

from __future__ import annotations

import enum

from supervisor import reasons
from supervisor.errors import LabelledError

__all__ = ["MIGRATE_HINT", "ControlPlaneError", "FailureCategory", "Incompatible", "SchemaTooNew",
           "StatementRefused", "TooLarge", "malformed", "one_line", "slow_read"]

MIGRATE_HINT = "the control-plane schema is missing or outdated: run `trio-supervisor db migrate`"


class FailureCategory(enum.Enum):
    """What kind of failure a store reports; decides retry and reason label.

    The first two are retryable. The value is the reason label.
    """

    #: Connection failure, timeout, cancelled statement.
    UNAVAILABLE = reasons.UNAVAILABLE
    #: Serialization failure, deadlock, lock contention.
    CONFLICT = reasons.CONFLICT
    #: The desired pointer names a missing revision.
    NOT_FOUND = reasons.NOT_FOUND
    #: Schema not migrated, malformed request or URL.
    INVALID = reasons.INVALID
    #: Privileges; a body too large; a schema_version too new (:class:`Incompatible`).
    DENIED = reasons.DENIED
    #: Body digest mismatch; damaged storage (SQLSTATE class XX, SQLite CORRUPT/NOTADB).
    CORRUPT = reasons.CORRUPT


# A category's value is its reason label: a new one without a catalogued label
# fails here, at import, rather than emitting a label the metrics never pre-initialised.
assert {c.value for c in FailureCategory} <= set(reasons.REVISION_REASONS)


class ControlPlaneError(LabelledError):
    """A store operation failed, with a :class:`FailureCategory`.

    Every store failure is one, chained (``raise ... from``) to the driver's error.
    So callers classify without knowing the driver. The message, also the ``detail``,
    never holds the DSN's password: stores scrub driver messages first. ``reason`` is
    the category's label unless a subclass names its own. A refusal of one revision
    names it in ``revision``; a connection failure leaves it None.
    """

    def __init__(self, message: str, *, category: FailureCategory,
                 revision: int | None = None, reason: str | None = None,
                 answered: bool | None = None) -> None:
        super().__init__(message, reason=reason or category.value, detail=message,
                         revision=revision)
        self.category = category
        self._answered = answered

    @property
    def answered(self) -> bool:
        """True when the control plane answered (a refusal, contention): only an outage is not.

        ``control_plane_up`` follows this. A revoked grant is the database answering, not
        the network down. So is a read too slow after the observe answered (``answered``
        given).
        """
        if self._answered is not None:
            return self._answered
        return self.category is not FailureCategory.UNAVAILABLE

    @property
    def retryable(self) -> bool:
        """True when trying again later may succeed without anyone repairing anything."""
        return self.category in (FailureCategory.UNAVAILABLE, FailureCategory.CONFLICT)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({str(self)!r}, category={self.category.name}, "
                f"revision={self.revision})")


def _which(revision: int | None) -> str:
    return "the revision" if revision is None else f"revision {revision}"


class Incompatible(ControlPlaneError):
    """The desired revision's ``schema_version`` is newer than this build reads.

    Storage is intact; the fix is deploying a newer build, so the reason label
    is ``incompatible`` rather than the category's ``denied``.
    """

    def __init__(self, revision: int | None, schema_version: int, max_schema_version: int) -> None:
        super().__init__(f"{_which(revision)} has schema_version {schema_version}; "
                         f"this build reads up to {max_schema_version}",
                         category=FailureCategory.DENIED, revision=revision,
                         reason=reasons.INCOMPATIBLE)
        self.schema_version = schema_version


class SchemaTooNew(ControlPlaneError):
    """The control-plane schema is newer than the migrations this build ships.

    A newer build ran ``db migrate``; this one cannot know what the new schema
    means, so it neither reads nor migrates it. Not retryable: the fix is
    deploying the newer build (or restoring the database).
    """

    def __init__(self, found: int, supported: int) -> None:
        super().__init__(
            f"the control-plane schema is version {found}, newer than this build's "
            f"version {supported} (a newer trio-supervisor migrated it): upgrade this "
            "replica, or point it at a database it can read", category=FailureCategory.INVALID)


class TooLarge(ControlPlaneError):
    """A revision body is larger than ``max_revision_bytes`` (a bound, so DENIED)."""

    def __init__(self, revision: int | None, size: int, limit: int) -> None:
        super().__init__(f"{_which(revision)} is {size} bytes, over max_revision_bytes ({limit})",
                         category=FailureCategory.DENIED, revision=revision)
        self.size = size
        self.limit = limit


class StatementRefused(ControlPlaneError):
    """Follower mode: the upstream answered, and its statement is refused.

    ``denied`` (signature), ``rollback`` (below the highest accepted), ``corrupt`` (the
    same sequence with another body, damaged framing) or ``stale`` (expired). The
    upstream answered, so it is no outage. At boot a follower serves its own valid
    signed cache instead, as for an unreachable upstream. ``revision`` is None but for
    a body unlike its authentic header (``corrupt``). So a replayed or forged
    statement's revision is never reported as the desired one.
    """

    _CATEGORIES = {reasons.DENIED: FailureCategory.DENIED,
                   reasons.ROLLBACK: FailureCategory.DENIED,
                   reasons.CORRUPT: FailureCategory.CORRUPT,
                   reasons.STALE: FailureCategory.DENIED}

    def __init__(self, reason: str, message: str, *, revision: int | None = None) -> None:
        super().__init__(message, category=self._CATEGORIES[reason], revision=revision,
                         reason=reason)


def malformed(exc: Exception, *, what: str) -> ControlPlaneError:
    """A driver call that failed with something no driver error explains.

    A row the code cannot read (a NULL where the schema promises a value, a type the
    column should not hold) surfaces as TypeError or ValueError from our decoding.
    Storage holds what the contract does not allow, so it is ``corrupt``: reported like
    any refusal, not crashing the loop. The traceback is dropped: its frames hold the
    rows (possibly a whole body).
    """
    detail = " ".join(str(exc).split()) or "no detail"
    return ControlPlaneError(f"control plane {what} returned data this build cannot read "
                             f"({type(exc).__name__}: {detail})", category=FailureCategory.CORRUPT)


def slow_read(what: str, revision: int, size: int, elapsed_s: float,
              received: int | None) -> ControlPlaneError:
    """A read of ``size`` body bytes that outlasted its deadline: the database answered.

    ``unavailable`` (it may pass on a faster link), yet no outage:
    ``control_plane_up`` stays true and the detail names what was read.
    """
    read = f"{size} bytes" if received is None else f"{received} of {size} bytes read"
    return ControlPlaneError(
        f"control plane {what} of revision {revision} timed out after {elapsed_s:.1f} s "
        f"({read}): the link is slower than [control_plane].min_read_rate_kib_s",
        category=FailureCategory.UNAVAILABLE, revision=revision, answered=True)


def one_line(exc: BaseException, text: str | None = None) -> str:
    """``text`` (default: ``exc``'s message) on one line, else ``exc``'s type name.

    Driver messages carry newlines and tab-indented hints.
    """
    return " ".join((str(exc) if text is None else text).split()) or type(exc).__name__
