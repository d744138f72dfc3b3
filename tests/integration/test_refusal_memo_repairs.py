"""The refusal memo lets a revision repaired in place converge, through the real process.

The memo keys a final refusal by (id, body_sha256 column). For ``corrupt``
(the body does not match its stored digest) and ``incompatible`` (the
schema_version column), the repair an operator makes in place (restore the
body's bytes, fix the column) leaves that key unchanged; the replica still
hydrates the repaired revision again and serves it, without a new publish or a
restart. Keys sharing a secret are retried once the secret changes.
"""

from __future__ import annotations

import hashlib
import json
import signal
import sqlite3
from pathlib import Path

import httpx
import trio

from tests.proc import EXAMPLE, acli, free_port, run_daemon, write_config

GOOD = json.dumps({"schema_version": 1, "aliases": {
    "fixed": {"upstream": "https://fixed.example/v1"}}}).encode()


async def test_a_corrupt_revision_repaired_in_place_converges(tmp_path: Path) -> None:
    port = free_port()
    cp = tmp_path / "cp.db"
    config = write_config(tmp_path, f"sqlite:///{cp}", port=port, poll_interval_s=0.2)
    await acli("publish", "--config", str(config), str(EXAMPLE))
    with trio.fail_after(60):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("published", revision=1)
            with sqlite3.connect(cp) as conn:  # bit rot: one byte of the body flipped
                damaged = GOOD.replace(b"fixed.example", b"fixed.exampl3")
                conn.execute(
                    "INSERT INTO supervisor_revisions (id, schema_version, body, body_sha256)"
                    " VALUES (2, 1, ?, ?)", (damaged, hashlib.sha256(GOOD).digest()))
                conn.execute("UPDATE supervisor_desired SET revision_id = 2")
            await daemon.wait_log("revision refused; previous snapshot keeps serving",
                                  revision=2, reason="corrupt")
            with sqlite3.connect(cp) as conn:  # the operator restores the bytes
                conn.execute("UPDATE supervisor_revisions SET body = ? WHERE id = 2", (GOOD,))
            daemon.signal(signal.SIGHUP)
            with trio.move_on_after(5):
                await daemon.wait_log("published", revision=2)
            async with httpx.AsyncClient(timeout=5.0) as client:
                report = (await client.get(f"http://127.0.0.1:{port}/status")).json()
            assert report["revision"]["active"] == 2, (
                f"revision 2 was repaired (its body now matches body_sha256) but the refusal "
                f"memo still answers for it (SIGHUP sent, 25 polls later): /status says "
                f"active={report['revision']['active']} "
                f"last_error={report['revision']['last_error']!r}")


async def test_keys_sharing_a_secret_are_retried_once_the_secret_changes(
        tmp_path: Path) -> None:
    """``snapshot`` is memoised as final, but "keys a and b resolve to the same secret" is
    a fact about the secret files, not the body: once one file is corrected (a rotation
    that briefly wrote the same value into both), the body is unchanged, so the memo
    answers every poll and every SIGHUP and the corrected revision never converges."""
    port = free_port()
    cp = tmp_path / "cp.db"
    config = write_config(tmp_path, f"sqlite:///{cp}", port=port, poll_interval_s=0.2)
    await acli("publish", "--config", str(config), str(_doc(tmp_path, None)))
    first, second = tmp_path / "a.key", tmp_path / "b.key"
    first.write_text("same-secret\n")
    second.write_text("same-secret\n")
    with trio.fail_after(60):
        async with run_daemon(config) as daemon:
            await daemon.wait_log("published", revision=1)
            await acli("publish", "--config", str(config), str(_doc(tmp_path, (first, second))))
            await daemon.wait_log("revision refused; previous snapshot keeps serving",
                                  revision=2, reason="snapshot")
            second.write_text("rotated-secret\n")  # the rotation completes
            daemon.signal(signal.SIGHUP)
            with trio.move_on_after(5):
                await daemon.wait_log("published", revision=2)
            async with httpx.AsyncClient(timeout=5.0) as client:
                report = (await client.get(f"http://127.0.0.1:{port}/status")).json()
            assert report["revision"]["active"] == 2, (
                f"the two secret files differ now, but revision 2 is still answered by the "
                f"refusal memo (SIGHUP sent, 25 polls later): last_error="
                f"{report['revision']['last_error']!r}")


def _doc(tmp_path: Path, files: tuple[Path, Path] | None) -> Path:
    document: dict[str, object] = {
        "schema_version": 1, "aliases": {"chat": {"upstream": "https://chat.example/v1"}}}
    if files is not None:
        document["keys"] = {name: {"secret": f"file:{path}", "aliases": ["chat"]}
                            for name, path in zip(("a", "b"), files, strict=True)}
    path = tmp_path / f"doc-{files is not None}.json"
    path.write_text(json.dumps(document))
    return path
