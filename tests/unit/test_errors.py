"""describe_failure: a foreign error told with its innermost cause, within a bound."""

from __future__ import annotations

import itertools
import ssl

from supervisor.errors import describe_failure


def chained(*excs: BaseException) -> BaseException:
    """``excs[0]`` raised from ``excs[1]``, raised from ``excs[2]`` ..."""
    for upper, lower in itertools.pairwise(excs):
        upper.__cause__ = lower
    return excs[0]


def refused_certificate() -> ssl.SSLCertVerificationError:
    exc = ssl.SSLCertVerificationError(
        1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: unable to get local "
           "issuer certificate (_ssl.c:1006)")
    exc.reason = "CERTIFICATE_VERIFY_FAILED"
    exc.verify_message = "unable to get local issuer certificate"
    return exc


def test_an_error_without_text_is_told_by_its_innermost_cause() -> None:
    exc = chained(ConnectionError(), RuntimeError(), refused_certificate())
    assert describe_failure(exc) == ("ConnectionError: TLS: CERTIFICATE_VERIFY_FAILED: unable "
                                     "to get local issuer certificate")
    assert describe_failure(exc, certificate_hint="--ca-file").endswith(
        "certificate (--ca-file)")


def test_a_suppressed_context_is_followed_and_a_group_s_first_leaf_named() -> None:
    # httpcore re-raises its error `from None`; trio's connect failure holds a group.
    try:
        try:
            raise ExceptionGroup("attempts", [ConnectionRefusedError(111, "Connection refused")])
        except ExceptionGroup:
            raise OSError("all attempts to connect to 127.0.0.1:9 failed") from None
    except OSError as exc:
        told = describe_failure(exc)
    assert told == "OSError: all attempts to connect to 127.0.0.1:9 failed: Connection refused"


def test_a_cause_already_in_the_text_is_not_repeated_and_no_cause_is_the_text_alone() -> None:
    exc = chained(ValueError("bad: Connection refused"),
                  ConnectionRefusedError(111, "Connection refused"))
    assert describe_failure(exc) == "ValueError: bad: Connection refused"
    assert describe_failure(KeyError()) == "KeyError"
    assert describe_failure(ssl.SSLError(1, "x")) == "SSLError: TLS: x"


def test_the_bound_cuts_the_outer_text_first_so_the_cause_survives() -> None:
    exc = chained(RuntimeError("x" * 1000), refused_certificate())
    told = describe_failure(exc, limit=200, certificate_hint="--ca-file")
    assert len(told) == 200 and told.startswith("RuntimeError: xxx")
    assert told.endswith(": TLS: CERTIFICATE_VERIFY_FAILED: unable to get local issuer "
                         "certificate (--ca-file)")
    assert len(describe_failure(exc, limit=10)) == 10
    assert describe_failure(RuntimeError("y" * 1000)) == ("RuntimeError: " + "y" * 1000)[:500]
