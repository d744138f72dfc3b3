"""``--json`` answers on stdout when the command fails too: one document
``{"ok": false, "reason": LABEL, "detail": TEXT}``, the exit code unchanged."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import trio

from supervisor.admin.context import AdminContext
from supervisor.reasons import REVISION_REASONS
from supervisor.status_doc import Rejection
from tests.adminserver import make_ctx, running_admin
from tests.fakes.snapshot import FakeSnapshot, serve
from tests.proc import EXAMPLE, acli, free_port, write_config


def failure(result: subprocess.CompletedProcess[str]) -> dict[str, object]:
    doc = json.loads(result.stdout)  # exactly one document: anything else does not parse
    assert set(doc) == {"ok", "reason", "detail"}, doc
    assert doc["ok"] is False and doc["reason"] in REVISION_REASONS
    assert isinstance(doc["detail"], str) and doc["detail"]
    return doc


async def test_an_unreachable_database_is_unavailable(tmp_path: Path) -> None:
    config = write_config(tmp_path, f"postgresql://postgres@127.0.0.1:{free_port()}/nodb"
                                    "?connect_timeout=2")
    for command in (("publish", str(EXAMPLE)), ("history",), ("show", "1"), ("diff", "1"),
                    ("rollback", "1"), ("db", "prune", "--keep", "1")):
        result = await acli(*command, "--json", "--config", str(config), check=False)
        # diff(1): 1 says the revisions differ, trouble is 2.
        assert result.returncode == (2 if command[0] == "diff" else 1), (command, result.stderr)
        assert failure(result)["reason"] == "unavailable", command


async def test_a_missing_revision_is_not_found(tmp_path: Path) -> None:
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db")
    await acli("publish", "--config", str(config), str(EXAMPLE))
    for command in (("show", "99"), ("rollback", "99"), ("diff", "99")):
        result = await acli(*command, "--json", "--config", str(config), check=False)
        assert result.returncode == (2 if command[0] == "diff" else 1), (command, result.stderr)
        assert failure(result)["reason"] == "not_found", (command, result.stdout)


async def test_a_bad_argument_is_invalid_with_exit_2(tmp_path: Path) -> None:
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db")
    for command in (("show", "99999999999999999999"), ("history", "--limit", "x"),
                    ("db", "prune"),
                    # Past a bigint: the argument is wrong, not the control plane corrupt.
                    ("history", "--limit", "99999999999999999999"),
                    ("db", "prune", "--keep", "99999999999999999999")):
        result = await acli(*command, "--json", "--config", str(config), check=False)
        assert result.returncode == 2, (command, result.stderr)
        assert failure(result)["reason"] == "invalid", command
        assert "Traceback" not in result.stderr


async def test_an_unreachable_replica_is_unavailable() -> None:
    result = await acli("status", "--json", "--url", f"http://127.0.0.1:{free_port()}",
                        check=False)
    assert result.returncode == 1
    doc = failure(result)
    assert doc["reason"] == "unavailable" and "127.0.0.1" in str(doc["detail"])


async def test_each_of_several_unreachable_replicas_is_the_failure_document() -> None:
    urls = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    result = await acli("status", "--json", "--url", urls[0], "--url", urls[1], check=False)
    assert result.returncode == 1
    docs = json.loads(result.stdout)
    assert list(docs) == urls
    for url in urls:
        assert set(docs[url]) == {"ok", "reason", "detail"}, docs[url]
        assert docs[url]["ok"] is False and docs[url]["reason"] == "unavailable"
        assert url.removeprefix("http://") in docs[url]["detail"]


def _replica_refusing_no_revision() -> AdminContext:
    """A replica serving revision 1, desired 2, whose last refusal named no revision."""
    ctx = make_ctx()
    serve(ctx.state, FakeSnapshot(1, 1))
    ctx.revision.desired = 2
    ctx.revision.consecutive_failures = 1
    ctx.revision.last_rejection = Rejection(revision=None, reason="stale", detail="expired",
                                            at="2026-01-01T00:00:00Z")
    return ctx


async def test_status_check_json_carries_its_verdict() -> None:
    with trio.fail_after(60):
        async with running_admin(_replica_refusing_no_revision()) as admin:
            one = await acli("status", "--check", "--json", "--url", admin.base, check=False)
            assert one.returncode == 1
            check = json.loads(one.stdout)["check"]
            assert check["ok"] is False
            assert "active revision 1, desired 2" in check["why"]
            assert "refused revision - (stale)" in check["why"]
            several = await acli("status", "--check", "--json", "--url", admin.base,
                                 "--url", admin.base + "/", check=False)
            assert several.returncode == 1
            for doc in json.loads(several.stdout).values():
                assert doc["check"] == check
            unchecked = await acli("status", "--json", "--url", admin.base, check=False)
            assert "check" not in json.loads(unchecked.stdout)


async def test_the_status_tables_never_print_none() -> None:
    with trio.fail_after(60):
        async with running_admin(_replica_refusing_no_revision()) as admin:
            for args in (("--url", admin.base), ("--url", admin.base, "--url", admin.base + "/"),
                         ("--check", "--url", admin.base, "--url", admin.base + "/")):
                result = await acli("status", *args, check=False)
                assert "None" not in result.stdout + result.stderr, result.stdout
            several = await acli("status", "--url", admin.base, "--url", admin.base + "/",
                                 check=False)
            assert "last rejection: - (stale)" in several.stdout
