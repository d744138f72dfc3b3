"""Store failure classification, the error hierarchy, hydration check order, DSN redaction.

The driver mappings are exercised on real exception instances (psycopg's
SQLSTATE classes, sqlite3 errors from real faults) for the categories that a
test cannot cheaply produce from a live server (serialization failure,
deadlock, damaged data ...).
"""

from __future__ import annotations

import hashlib
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
from psycopg import errors as pgerrors

from supervisor import reasons
from supervisor.controlplane import postgres, sqlite
from supervisor.controlplane.checks import check_hydrated
from supervisor.controlplane.errors import (
    ControlPlaneError,
    FailureCategory,
    Incompatible,
    TooLarge,
)
from supervisor.dsn import redact, scrub
from supervisor.errors import SupervisorError

C = FailureCategory


@pytest.mark.parametrize(
    ("exc", "category"),
    [
        (pgerrors.SerializationFailure("could not serialize access"), C.CONFLICT),
        (pgerrors.DeadlockDetected("deadlock detected"), C.CONFLICT),
        (pgerrors.LockNotAvailable("could not obtain lock"), C.CONFLICT),
        (pgerrors.QueryCanceled("canceling statement due to statement timeout"), C.UNAVAILABLE),
        (pgerrors.AdminShutdown("terminating connection"), C.UNAVAILABLE),
        (pgerrors.TooManyConnections("too many clients"), C.UNAVAILABLE),
        (psycopg.OperationalError("connection failed: Connection refused"), C.UNAVAILABLE),
        (psycopg.InterfaceError("the connection is closed"), C.UNAVAILABLE),
        (pgerrors.ReadOnlySqlTransaction("read-only transaction"), C.UNAVAILABLE),
        (ConnectionResetError(104, "reset"), C.UNAVAILABLE),
        (pgerrors.InsufficientPrivilege("permission denied for table"), C.DENIED),
        (pgerrors.InvalidAuthorizationSpecification("role does not exist"), C.DENIED),
        (pgerrors.InvalidPassword("password authentication failed"), C.DENIED),
        (pgerrors.UndefinedTable('relation "supervisor_desired" does not exist'), C.INVALID),
        (pgerrors.UndefinedColumn("column does not exist"), C.INVALID),
        (pgerrors.DataCorrupted("invalid page in block"), C.CORRUPT),
        (pgerrors.IndexCorrupted("index contains unexpected zero page"), C.CORRUPT),
        (pgerrors.UniqueViolation("duplicate key"), C.INVALID),
        (pgerrors.SyntaxError("syntax error"), C.INVALID),
        (psycopg.DataError("invalid input"), C.INVALID),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else v.name,
)
def test_postgres_classification(exc: BaseException, category: FailureCategory) -> None:
    assert postgres.classify(exc) is category


def _every_sqlstate() -> list[type[psycopg.Error]]:
    """Every SQLSTATE class psycopg knows: its public module, checked against lookup()."""
    known = [cls for cls in vars(pgerrors).values()
             if isinstance(cls, type) and issubclass(cls, psycopg.Error)
             and isinstance(getattr(cls, "sqlstate", None), str)]
    for cls in known:
        assert pgerrors.lookup(cls.sqlstate) is cls
    return known


# What an operator needs from each SQLSTATE class: a timeout, a cancel, a
# shutdown, a resource the server lacks mean "could not answer" (unavailable:
# the cache serves, the loop backs off); contention clears on retry
# (conflict); refused credentials or grants are denied; damage is corrupt;
# the rest is the request itself being wrong.
_EXPECTED_CLASSES = {
    "08": C.UNAVAILABLE, "53": C.UNAVAILABLE, "54": C.UNAVAILABLE, "57": C.UNAVAILABLE,
    "58": C.UNAVAILABLE, "F0": C.UNAVAILABLE, "XX": C.UNAVAILABLE,
    "40": C.CONFLICT, "55": C.CONFLICT, "28": C.DENIED,
}
_EXPECTED_CODES = {
    "25P03": C.UNAVAILABLE,  # idle_in_transaction_session_timeout
    "25P04": C.UNAVAILABLE,  # transaction_timeout (PostgreSQL 17)
    "25006": C.UNAVAILABLE,  # read-only transaction: a standby during failover
    "40003": C.UNAVAILABLE,  # statement completion unknown: the connection was lost
    "57014": C.UNAVAILABLE,  # statement_timeout, our own cancel
    "57P05": C.UNAVAILABLE,  # idle_session_timeout
    "42501": C.DENIED,
    "55P02": C.INVALID, "55P04": C.INVALID,
    "XX001": C.CORRUPT, "XX002": C.CORRUPT,
}


def test_every_sqlstate_psycopg_knows_has_its_class_label() -> None:
    known = _every_sqlstate()
    classes = {cls.sqlstate[:2] for cls in known}
    # The classes reviewed one by one are all there to be tested.
    assert {"08", "25", "40", "53", "54", "55", "57", "58", "XX"} <= classes
    assert {"25P03", "25P04", "57P05"} <= {cls.sqlstate for cls in known}
    wrong = {}
    for cls in known:
        code = cls.sqlstate
        expected = _EXPECTED_CODES.get(code) or _EXPECTED_CLASSES.get(code[:2], C.INVALID)
        got = postgres.classify(cls(f"a server error {code}"))
        if got is not expected:
            wrong[code] = (cls.__name__, got.name, expected.name)
    assert wrong == {}


def test_every_sqlstate_class_table_entry_says_why() -> None:
    for table in (postgres.SQLSTATE_CLASSES, postgres.SQLSTATE_CODES):
        for code, (category, why) in table.items():
            assert isinstance(category, FailureCategory) and len(why) > 20, code


_SQLITE_EXPECTED = {
    "SQLITE_BUSY": C.CONFLICT, "SQLITE_LOCKED": C.CONFLICT, "SQLITE_ABORT": C.CONFLICT,
    "SQLITE_SCHEMA": C.CONFLICT,
    "SQLITE_NOMEM": C.UNAVAILABLE, "SQLITE_INTERRUPT": C.UNAVAILABLE,
    "SQLITE_IOERR": C.UNAVAILABLE, "SQLITE_FULL": C.UNAVAILABLE,
    "SQLITE_CANTOPEN": C.UNAVAILABLE, "SQLITE_PROTOCOL": C.UNAVAILABLE,
    "SQLITE_NOLFS": C.UNAVAILABLE, "SQLITE_INTERNAL": C.UNAVAILABLE,
    "SQLITE_PERM": C.DENIED, "SQLITE_READONLY": C.DENIED, "SQLITE_AUTH": C.DENIED,
    "SQLITE_TOOBIG": C.DENIED,
    "SQLITE_CORRUPT": C.CORRUPT, "SQLITE_NOTADB": C.CORRUPT,
}
_SQLITE_EXPECTED_EXTENDED = {
    "SQLITE_READONLY_RECOVERY": C.CONFLICT, "SQLITE_READONLY_DBMOVED": C.UNAVAILABLE,
}


def _sqlite_error(code: int) -> sqlite3.Error:
    exc = sqlite3.OperationalError(f"sqlite error {code}")
    exc.sqlite_errorcode = code
    return exc


def test_every_sqlite_result_code_has_its_label() -> None:
    # Every primary result code (1..28) is in the reviewed table, by the
    # sqlite3 module's own constant names.
    primaries = {name: getattr(sqlite3, name) for name in sqlite.RESULT_CODES}
    assert sorted(primaries.values()) == list(range(1, 29))
    for name, code in primaries.items():
        expected = _SQLITE_EXPECTED.get(name, C.INVALID)
        assert sqlite.classify(_sqlite_error(code)) is expected, name
    # Every extended code the module exposes: its primary's label, or its own.
    extended = {name: getattr(sqlite3, name) for name in dir(sqlite3)
                if any(name.startswith(f"{primary}_") for primary in primaries)}
    assert len(extended) > 50
    for name, code in extended.items():
        primary = next(p for p in primaries if name.startswith(f"{p}_"))
        assert code & 0xFF == primaries[primary], name
        expected = _SQLITE_EXPECTED_EXTENDED.get(
            name, _SQLITE_EXPECTED.get(primary, C.INVALID))
        assert sqlite.classify(_sqlite_error(code)) is expected, name


def test_postgres_mapping_names_the_fix_and_hides_the_password() -> None:
    url = "postgresql://app:hunter2@db.internal:5432/cp"
    err = postgres.map_error(
        pgerrors.UndefinedTable('relation "supervisor_desired" does not exist'),
        what="read", url=url,
    )
    assert err.category is C.INVALID and "trio-supervisor db migrate" in str(err)
    leaky = psycopg.OperationalError(f"could not connect with {url} (password hunter2)")
    err = postgres.map_error(leaky, what="read", url=url)
    assert "hunter2" not in str(err)
    assert "postgresql://app@db.internal:5432/cp" in str(err)


def test_sqlite_classification_from_real_faults(tmp_path: Path) -> None:
    def fault(fn: object) -> sqlite3.Error:
        try:
            fn()  # type: ignore[operator]
        except sqlite3.Error as exc:
            return exc
        raise AssertionError("no fault")

    missing_dir = fault(lambda: sqlite3.connect(tmp_path / "no" / "x.db").execute("SELECT 1"))
    assert sqlite.classify(missing_dir) is C.UNAVAILABLE

    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database at all, clearly" * 200)
    not_a_db = fault(lambda: sqlite3.connect(garbage).execute("SELECT * FROM sqlite_master"))
    assert sqlite.classify(not_a_db) is C.CORRUPT

    path = tmp_path / "ok.db"
    sqlite3.connect(path).close()
    no_table = fault(lambda: sqlite3.connect(path).execute("SELECT * FROM supervisor_desired"))
    assert sqlite.classify(no_table) is C.INVALID
    assert "db migrate" in str(sqlite.map_error(no_table, what="read"))

    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    locked = fault(lambda: sqlite3.connect(path, timeout=0).execute("BEGIN EXCLUSIVE"))
    holder.execute("ROLLBACK")
    assert sqlite.classify(locked) is C.CONFLICT

    readonly = fault(
        lambda: sqlite3.connect(f"file:{path}?mode=ro", uri=True).execute("CREATE TABLE t (x)")
    )
    assert sqlite.classify(readonly) is C.DENIED

    bad_sql = fault(lambda: sqlite3.connect(path).execute("SELEC 1"))
    assert sqlite.classify(bad_sql) is C.INVALID


@pytest.mark.parametrize(
    ("category", "reason", "retryable"),
    [
        (C.UNAVAILABLE, reasons.UNAVAILABLE, True),
        (C.CONFLICT, reasons.CONFLICT, True),
        (C.NOT_FOUND, reasons.NOT_FOUND, False),
        (C.INVALID, reasons.INVALID, False),
        (C.DENIED, reasons.DENIED, False),
        (C.CORRUPT, reasons.CORRUPT, False),
    ],
)
def test_reason_and_retryable_per_category(
    category: FailureCategory, reason: str, retryable: bool
) -> None:
    err = ControlPlaneError("x", category=category, revision=3)
    assert (err.reason, err.retryable, err.revision) == (reason, retryable, 3)
    assert reason in reasons.REVISION_REASONS
    assert isinstance(err, SupervisorError)


def test_incompatible_and_too_large() -> None:
    inc = Incompatible(7, 2, 1)
    assert isinstance(inc, ControlPlaneError)
    assert (inc.reason, inc.category, inc.revision, inc.schema_version) == (
        reasons.INCOMPATIBLE, C.DENIED, 7, 2,
    )
    assert not inc.retryable
    big = TooLarge(8, 5000, 1024)
    assert (big.reason, big.category, big.revision, big.size) == (reasons.DENIED, C.DENIED, 8, 5000)
    assert "5000" in str(big) and "1024" in str(big)


BODY = b'{"schema_version": 1}'
NOW = datetime(2024, 1, 1, tzinfo=UTC)


def row(**changes: object) -> tuple[object, ...]:
    """A hydrate row (:func:`~supervisor.controlplane.checks.hydrate_sql`'s columns)."""
    fields: dict[str, object] = {
        "desired": 5, "id": 5, "schema_version": 1, "size": len(BODY), "body": BODY,
        "body_sha256": hashlib.sha256(BODY).digest(), "created_at": NOW, "sequence": None,
    }
    fields.update(changes)
    return tuple(fields.values())


def check(r: tuple[object, ...]) -> object:
    return check_hydrated(r, max_revision_bytes=1024, max_schema_version=1)


def test_hydration_check_order() -> None:
    loaded = check(row())
    assert loaded.body == BODY and loaded.id == 5  # type: ignore[attr-defined]
    everything_wrong = dict(schema_version=2, size=4096, body=None, body_sha256=b"\0" * 32)
    with pytest.raises(ControlPlaneError) as info:
        check(row(id=None, **everything_wrong))
    assert info.value.category is C.NOT_FOUND and info.value.revision == 5
    with pytest.raises(TooLarge):
        check(row(**everything_wrong))
    with pytest.raises(Incompatible):
        check(row(schema_version=2, body=None, body_sha256=b"\0" * 32))
    with pytest.raises(ControlPlaneError) as info:
        check(row(body_sha256=b"\0" * 32))
    assert info.value.category is C.CORRUPT and info.value.revision == 5


def test_a_sequence_no_signed_statement_can_carry_is_malformed() -> None:
    # bigint holds up to 2^63-1; a statement's sequence at most 2^62 (every follower,
    # and this root reading its own cache back, refuses more): refused where it is read.
    assert check(row(sequence=2**62)).sequence == 2**62  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match=r"supervisor_desired\.sequence holds 4611686018427387905"):
        check(row(sequence=2**62 + 1))


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://app:hunter2@db:5432/cp", "postgresql://app@db:5432/cp"),
        ("postgresql://app:p%40ss%2Fw@db/cp", "postgresql://app@db/cp"),
        ("postgres://app:@db/cp", "postgresql://app@db/cp"),
        ("postgresql://app@db/cp", "postgresql://app@db/cp"),
        ("postgresql://db/cp?user=app&password=hunter2&sslmode=require&sslpassword=k3y",
         "postgresql://app@db/cp"),
        ("host=db user=app password=hunter2 dbname=cp", "postgresql://app@db/cp"),
        ("host=db password = 'hun ter\\'2' dbname=cp port=6432", "postgresql://db:6432/cp"),
        ("postgresql://app:P@ss@db/cp", "postgresql://<unparseable>"),  # unencoded @
        ("postgresql://app:p%zz@db/cp", "postgresql://<unparseable>"),
        ("sqlite:///var/cp.db", "sqlite:///var/cp.db"),
    ],
)
def test_redact_names_only_user_host_port_and_database(url: str, expected: str) -> None:
    assert redact(url) == expected


def test_scrub_masks_every_spelling_of_the_password() -> None:
    url = "postgresql://app:p%40ss@db/cp?sslpassword=s3cr%26t"
    text = f"failed for {url}: password p@ss rejected (raw p%40ss), key s3cr&t"
    cleaned = scrub(text, url)
    for spelling in ("p@ss", "p%40ss", "s3cr&t", "s3cr%26t"):
        assert spelling not in cleaned
    assert "postgresql://app@db/cp" in cleaned
    assert scrub("nothing secret", "sqlite:///x.db") == "nothing secret"


def test_scrub_masks_the_pieces_libpq_misreads_from_an_unencoded_password() -> None:
    url = "postgresql://app:Secr3t@Wb14pw@127.0.0.1/cp"
    libpq = 'could not translate host name "Wb14pw@127.0.0.1" to address'
    assert "Wb14pw" not in scrub(libpq, url) and "Secr3t" not in scrub(libpq, url)
