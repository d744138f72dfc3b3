"""The root of every exception this package raises on purpose, and how a foreign one is told."""

from __future__ import annotations

import ssl
from typing import TypeVar


class SupervisorError(Exception):
    """Base class of every error raised on purpose by this package.

    The module that touches a foreign library (psycopg, httpx, msgspec, nacl, OS) maps
    its errors to these, ``from`` the original. So a caller never needs to know the
    driver underneath. :func:`describe_failure` tells the foreign error in the message.
    Each feature's errors module lists its own sub-tree::

        SupervisorError
        ├── ConfigError              invalid configuration (exit 2); names the $.path
        ├── UsageError               bad command line or input file (exit 2)
        ├── BootRefused              nothing servable at boot (exit 3); names the refusal
        ├── SupervisionGaveUp        a child exceeded its restart intensity (exit 4)
        ├── StartError               a resource needed at start cannot be had now (exit 1)
        ├── LabelledError            a failure told by .reason, .revision, .detail
        │   ├── controlplane.errors.ControlPlaneError  store failures, by category
        │   ├── revision.errors.RevisionError          decode and compile refusals, by reason
        │   └── sinks.lkg.CacheError                   last-known-good refusals
        ├── kube.errors.KubeError                  Kubernetes API failures
        └── admin.errors.AdminError                admin server start failures
    """


class LabelledError(SupervisorError):
    """A failure the convergence loop reports as it is: a reason label, a revision, a detail.

    ``reason`` is a low-cardinality label (:mod:`supervisor.reasons`) for metrics and
    status. ``revision`` is the revision it is about (None: none, an outage say).
    ``detail`` is the human text for logs and ``/status``. The message (``str``) is each
    subclass's own.
    """

    def __init__(self, message: str, *, reason: str, detail: str,
                 revision: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.detail = detail
        self.revision = revision


class ConfigError(SupervisorError):
    """The configuration is invalid. ``path`` is the JSON-path of the bad key."""

    def __init__(self, path: str, reason: str, *, source: str | None = None) -> None:
        self.path = path
        self.reason = reason
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{path}: {reason}")


class UsageError(SupervisorError):
    """The command line or an input file named on it is invalid (exit 2)."""


class BootRefused(SupervisorError):
    """No servable snapshot could be reached at boot (exit 3).

    ``refusal`` is a short label (``empty``, ``corrupt``, ``rejected``,
    ``unavailable``, ``cache`` ...); the message says why in full.
    """

    def __init__(self, refusal: str, message: str) -> None:
        self.refusal = refusal
        super().__init__(message)


class StartError(SupervisorError):
    """Something the process needs at start cannot be had right now (exit 1).

    Not restarted inside the process: the tree ends the process with it, as with a
    :class:`ConfigError`. Unlike that, a restart of the whole process may succeed: a port
    held by a previous instance, an address not yet assigned. Exit 1 lets systemd's
    ``Restart=on-failure`` retry; exit 2 stays for what no restart fixes.
    """


class SupervisionGaveUp(SupervisorError):
    """A child crashed more than ``restart_intensity`` times within the period (exit 4)."""

    def __init__(self, child: str, restarts: int, period_s: float) -> None:
        self.child = child
        self.restarts = restarts
        self.period_s = period_s
        super().__init__(
            f"child {child!r} restarted {restarts} times within {period_s:g} s; giving up")


_E = TypeVar("_E", bound=BaseException)


def find_leaf(exc: BaseException, kinds: type[_E] | tuple[type[_E], ...]) -> _E | None:
    """The first leaf of ``kinds`` in ``exc``, looking inside (nested) exception groups.

    trio's nurseries wrap a child's error in groups. The CLI's exit-code mapping, the
    tree's "fatal, do not restart" and the admin client's endings all look through them.
    """
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = find_leaf(inner, kinds)
            if found is not None:
                return found
        return None
    return exc if isinstance(exc, kinds) else None


def innermost(exc: BaseException) -> BaseException:
    """The last exception of ``exc``'s chain: its cause, else its context, and so on. In a
    group, its first exception (trio's "all attempts to connect failed" holds each).

    The context counts even when suppressed: httpcore re-raises its ConnectError
    ``from None``, which hides the TLS error it was raised from.
    """
    seen = {id(exc)}
    while True:
        if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            below: BaseException | None = exc.exceptions[0]
        else:
            below = exc.__cause__ or exc.__context__
        if below is None or id(below) in seen:
            return exc
        seen.add(id(below))
        exc = below


def _own_text(exc: BaseException) -> str:
    # ssl sets reason and verify_message on what it raises; one made by hand has neither.
    reason = getattr(exc, "reason", None) if isinstance(exc, ssl.SSLError) else None
    if isinstance(exc, ssl.SSLCertVerificationError):
        verify = getattr(exc, "verify_message", None) or exc
        return f"TLS: {reason or 'CERTIFICATE_VERIFY_FAILED'}: {verify}"
    if isinstance(exc, ssl.SSLError):
        return f"TLS: {reason or exc}"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return " ".join(str(exc).split())


def describe_failure(exc: BaseException, *, limit: int = 500,
                     certificate_hint: str | None = None) -> str:
    """``<type>: <text>`` of a foreign error ``exc``, then its innermost cause's text.

    httpx's ConnectError, trio's BrokenResourceError and the like often carry no text.
    What failed (a certificate, a refused connection) is at the end of their chain, so it
    is named too. A TLS error reads ``TLS: <reason>``. A refused certificate reads
    ``TLS: CERTIFICATE_VERIFY_FAILED: <why>`` and then ``(<certificate_hint>)``: where the
    CA to verify against is configured. At most ``limit`` characters; ``exc``'s own text
    is cut first, so the cause survives a long message.
    """
    inner = innermost(exc)
    why = "" if inner is exc else (_own_text(inner) or type(inner).__name__)
    own = _own_text(exc)
    if why and why in own:
        why = ""
    tail = f": {why}" if why else ""
    if certificate_hint and isinstance(inner, ssl.SSLCertVerificationError):
        tail += f" ({certificate_hint})"
    head = f"{type(exc).__name__}: {own}" if own else type(exc).__name__
    return (head[:max(0, limit - len(tail))] + tail)[:limit]
