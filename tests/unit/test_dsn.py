"""The DSN reader (supervisor.dsn) is total: any text is described, judged or scrubbed.

Whatever the control-plane URL holds (the environment keeps a byte that is not
UTF-8 as a lone surrogate), :func:`problem` answers with its own reason, one
printable line within a detail's bound, and :func:`describe`, :func:`secrets`
and :func:`scrub` answer too: nothing raises a foreign exception.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor import dsn
from supervisor.bounds import DETAIL_BYTES

# The pieces libpq's two spellings are made of, and what a hostile value adds.
_PIECES = st.sampled_from([
    "postgresql://", "postgres://", "host=", "password=", "sslpassword=", "port=", "user=",
    "dbname=", "sslmode", "?", "&", "=", "@", "/", ":", "#", "%", "%40", "'", "\\", " ", "\t",
    "a", "Z", "0", "9", ".", "-", "_", "[", "]", "é", "\ud800", "\udcff", "\x00", "\x1b",
    "x" * 300])
_DSNS = st.lists(_PIECES, max_size=16).map("".join) | st.text(max_size=200)


@settings(max_examples=200, deadline=None)
@given(_DSNS)
def test_any_dsn_is_judged_with_a_bounded_reason_and_never_raises(url: str) -> None:
    why = dsn.problem(url)
    if why is not None:
        assert why.isprintable() and len(why.encode()) <= DETAIL_BYTES
    shown = dsn.describe(url)
    assert shown.startswith("postgresql://") or url.startswith("sqlite:")
    dsn.credential_files(url, {})
    message = dsn.scrub(f"connection to {url} failed", url)
    for secret in dsn.secrets(url):
        assert secret not in message


def test_a_dsn_with_a_byte_that_is_not_utf8_is_refused_with_a_reason() -> None:
    # os.environ keeps the byte 0xff of SUPERVISOR_CONTROL_PLANE__URL as "\udcff".
    url = "postgresql://u:pw@host\udcff/db"
    assert dsn.problem(url) is not None
    assert dsn.describe(url) == "postgresql://<unparseable>"


def test_an_unknown_parameter_is_named_quoted_and_bounded() -> None:
    assert dsn.problem("host=a sslmod=require") == (
        "unknown connection parameter `sslmod` (did you mean `sslmode`?)")
    hostile = "\x1b[31m" + "x" * 100_000
    why = dsn.problem(f"host=a {hostile}=1")
    assert why is not None and why.isprintable() and len(why.encode()) <= DETAIL_BYTES
    assert "\\x1b" in why
