"""How a follower names itself to its upstream: request headers on each fetch and stream.

The daemon names its process once (:func:`name_this_replica`); without a name, nothing is sent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final, Literal, get_args

import msgspec

from supervisor.bounds import MAX_SEQUENCE, OutOfRange, TooLarge, check_range
from supervisor.reasons import FOLLOWER_STATES, STALE

#: What a follower fetches from its upstream: the signed revision (admin.routes serves it).
REVISION_PATH: Final = "/v1/revision"

__all__ = ["HEADERS", "MAX_URL_BYTES", "ReplicaName", "State", "follower_state",
           "name_headers", "name_this_replica", "parse"]

State = Literal["converged", "converging", "refusing", "stale"]
STATES: Final = get_args(State)
assert STATES == FOLLOWER_STATES
#: Each header's name, by the field it carries.
HEADERS: Final = {field: f"x-supervisor-follower-{field.replace('_', '-')}"
                  for field in ("url", "sequence", "etag", "state", "reason", "poll_interval_s")}
MAX_URL_BYTES: Final = 512
MAX_ETAG_BYTES: Final = 128
MAX_REASON_BYTES: Final = 32
#: A follower claiming a longer poll interval is listed as if it polled this often.
MAX_POLL_INTERVAL_S: Final = 3600.0


def follower_state(*, stale: bool, failing: bool, reason: str | None,
                   serves_desired: bool) -> tuple[State, str | None]:
    """A follower's state and its reason, from what its status says.

    ``stale`` (its statement expired, or refused as stale), ``refusing`` (its
    attempts refused while its upstream answers), ``converging`` (it does not
    serve the desired revision yet), else ``converged``.
    """
    if stale:
        return "stale", STALE
    if failing:
        return ("stale", STALE) if reason == STALE else ("refusing", reason)
    return ("converged" if serves_desired else "converging"), None


class ReplicaName(msgspec.Struct, frozen=True, kw_only=True):
    """What one follower says about itself (:data:`HEADERS`), on each fetch and handshake.

    ``url`` is its admin address (``[admin].advertise_url``, else its listen address).
    ``sequence`` and ``etag`` are what it serves; ``reason`` a refusal's. Its upstream
    lists it for 3 ``poll_interval_s``. Nothing here is believed beyond a listing: a
    fleet walk follows an address only when it answers with the root's statement.
    """

    url: str
    sequence: int | None
    etag: str | None
    state: State
    reason: str | None
    poll_interval_s: float


_describe: Callable[[], ReplicaName | None] = lambda: None  # noqa: E731 - the default name


def name_this_replica(describe: Callable[[], ReplicaName | None]) -> None:
    """Name this process's fetches and streams with ``describe()`` (read at each one)."""
    global _describe
    _describe = describe


def name_headers() -> dict[str, str]:
    """The headers naming this replica now (empty when it has no name)."""
    name = _describe()
    if name is None:
        return {}
    values = {"url": name.url, "sequence": name.sequence, "etag": name.etag,
              "state": name.state, "reason": name.reason,
              "poll_interval_s": f"{name.poll_interval_s:g}"}
    return {HEADERS[field]: str(value) for field, value in values.items() if value is not None}


def _text(values: dict[str, str], field: str, limit: int) -> str | None:
    value = values.get(HEADERS[field])
    if value is None:
        return None
    if len(value) > limit:
        raise TooLarge(HEADERS[field], limit, len(value))
    if not value.isascii() or not value.isprintable():
        raise OutOfRange(HEADERS[field], value, "printable", "ASCII")
    return value


def _number(text: str | None, field: str, kind: type[int] | type[float],
            low: float, high: float) -> float | None:
    if text is None:
        return None
    try:
        value = kind(text)
    except ValueError:
        raise OutOfRange(HEADERS[field], text, low, high) from None
    return check_range(HEADERS[field], value, low, high)


def parse(headers: Sequence[tuple[bytes, bytes]]) -> ReplicaName | None:
    """The name a request's headers carry (None: it names no replica); :class:`TooLarge`
    or :class:`OutOfRange` from :mod:`supervisor.bounds` when one is malformed.

    The upstream calls it where they enter. A malformed set is ignored there: the
    fetch is answered as ever.
    """
    wanted = {name.encode() for name in HEADERS.values()}
    values = {key.lower().decode(): value.decode("latin-1")
              for key, value in headers if key.lower() in wanted}
    url = _text(values, "url", MAX_URL_BYTES)
    if url is None:
        return None
    if not url.startswith(("http://", "https://")):
        raise OutOfRange(HEADERS["url"], url, "http://", "https://")
    if "@" in url.split("/")[2]:  # credentials, which a listing would show its readers
        raise OutOfRange(HEADERS["url"], "(a URL with credentials)", "http://", "https://")
    state = _text(values, "state", 16) or "converged"
    if state not in STATES:
        raise OutOfRange(HEADERS["state"], state, STATES[0], STATES[-1])
    reason = _text(values, "reason", MAX_REASON_BYTES)
    if reason is not None and not reason.replace("_", "").isalpha():
        raise OutOfRange(HEADERS["reason"], reason, "a", "z")
    sequence = _number(_text(values, "sequence", 24), "sequence", int, 0, MAX_SEQUENCE)
    poll = _number(_text(values, "poll_interval_s", 24), "poll_interval_s", float, 0.01,
                   float("inf"))
    return ReplicaName(url=url, sequence=None if sequence is None else int(sequence),
                       etag=_text(values, "etag", MAX_ETAG_BYTES), state=state,  # type: ignore[arg-type]
                       reason=reason,
                       poll_interval_s=min(poll or MAX_POLL_INTERVAL_S, MAX_POLL_INTERVAL_S))
