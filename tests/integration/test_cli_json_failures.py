"""``--json`` answers on stdout when the command fails too: one document
``{"ok": false, "reason": LABEL, "detail": TEXT}``, the exit code unchanged."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from supervisor.reasons import REVISION_REASONS
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
