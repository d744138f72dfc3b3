"""The daemon imports only what its configuration uses: no PostgreSQL driver, Kubernetes
client or upstream HTTP client on the embedded default (SQLite, Kubernetes off).

The daemon runs with ``PYTHONPROFILEIMPORTTIME=1``: the interpreter itself lists every
module it imports on stderr, from start through READY to exit.
"""

from __future__ import annotations

import signal
from pathlib import Path

import trio

from tests.proc import EXAMPLE, NotifySocket, cli, run_daemon, write_config

#: Top-level packages the embedded default has no use for.
UNUSED_ON_SQLITE = {"psycopg", "psycopg_c", "psycopg_binary", "kubernetes", "httpx",
                    "httpcore", "trio_websocket"}


def imported(raw: list[str]) -> set[str]:
    """The top-level packages named by the interpreter's ``import time:`` lines."""
    return {line.rsplit("|", 1)[-1].strip().split(".")[0]
            for line in raw if line.startswith("import time:")}


async def test_sqlite_default_imports_no_postgres_kubernetes_or_upstream_client(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db")
    cli("publish", "--config", str(config), str(EXAMPLE), "--force", "--message", "test")
    notify = NotifySocket(tmp_path / "notify")
    await notify.bind()
    env = {"NOTIFY_SOCKET": str(notify.path), "PYTHONPROFILEIMPORTTIME": "1"}
    with trio.fail_after(60):
        async with run_daemon(config, env=env) as daemon:
            await notify.wait_for("READY=1")
            daemon.signal(signal.SIGTERM)
            await daemon.wait_log("stopped")  # the last line: every import listed before it
            assert await daemon.wait() == 0
    notify.close()
    modules = imported(daemon.raw)
    assert {"trio", "msgspec", "supervisor", "sqlite3"} <= modules  # the listing is real
    assert modules & UNUSED_ON_SQLITE == set()
