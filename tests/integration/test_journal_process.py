"""journald through the real process: ``auto`` detects ``$JOURNAL_STREAM``; the native protocol.

A real systemd-journald, in a mount namespace of the test's own, takes an entry too
large for a datagram (its memfd).

systemd sets ``JOURNAL_STREAM=DEV:INODE`` for a service whose stderr is the
journal; here stderr is a file and the variable names that file, which is
exactly what the daemon compares (``fstat(2)``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import trio

from tests import needs
from tests.journald import Journal
from tests.proc import REPO, cli, run_daemon, write_config

LINE = re.compile(r"^<([0-7])>(\{.*\})$")


def _run_with_stderr_file(config: Path, err: Path, env: dict[str, str],
                          name_it: bool) -> int:
    with open(err, "w") as stream:
        st = os.fstat(stream.fileno())
        full = {**os.environ, **env}
        full.pop("JOURNAL_STREAM", None)
        if name_it:
            full["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
        return subprocess.run(
            [sys.executable, "-m", "supervisor", "run", "--config", str(config)],
            stderr=stream, stdout=subprocess.DEVNULL, env=full, cwd=REPO, timeout=60,
            check=False,
        ).returncode


def _uncompilable(tmp_path: Path) -> Path:
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db")
    bad = tmp_path / "bad.toml"
    bad.write_text('schema_version = 1\n[aliases.a]\nupstream = "https://a/"\n'
                   '[keys.k]\nsecret = "env:TSUP_JOURNAL_UNSET"\naliases = ["a"]\n')
    cli("publish", "--config", str(config), str(bad))
    return config


async def test_auto_under_journald_prefixes_every_line_with_its_priority(
        tmp_path: Path) -> None:
    config = _uncompilable(tmp_path)
    err = tmp_path / "stderr"
    with trio.fail_after(60):
        code = await trio.to_thread.run_sync(
            _run_with_stderr_file, config, err, {"SUPERVISOR_LOG__FORMAT": "auto"}, True)
    assert code == 3
    raw = [x for x in err.read_text().splitlines() if x.strip()]
    parsed = []
    for line in raw:
        match = LINE.match(line)
        assert match, f"not a journal line: {line!r}"
        parsed.append((int(match.group(1)), json.loads(match.group(2))))
    levels = {"debug": 7, "info": 6, "warning": 4, "error": 3, "critical": 2}
    assert all(levels[doc["level"]] == priority for priority, doc in parsed), parsed
    assert any(priority == 6 for priority, _ in parsed)  # info lines before the refusal
    # What `journalctl -p err` finds: priority 3 or more severe.
    [(priority, refused)] = [(p, d) for p, d in parsed if d["event"] == "refused to boot"]
    assert priority <= 3 and refused["reason"] == "secret"


async def test_auto_without_journal_stream_writes_plain_json(tmp_path: Path) -> None:
    config = _uncompilable(tmp_path)
    err = tmp_path / "stderr"
    with trio.fail_after(60):
        code = await trio.to_thread.run_sync(
            _run_with_stderr_file, config, err, {"SUPERVISOR_LOG__FORMAT": "auto"}, False)
    assert code == 3
    lines = [json.loads(x) for x in err.read_text().splitlines() if x.strip()]
    assert lines[-1]["event"] == "refused to boot"


async def test_journal_format_sends_every_field_to_the_journal_socket(tmp_path: Path) -> None:
    """``journalctl REASON=secret`` works: the refusal's fields are journal fields."""
    config = _uncompilable(tmp_path)
    journal = Journal(tmp_path / "journal.sock")
    await journal.bind()
    env = {"SUPERVISOR_LOG__FORMAT": "journal", "SUPERVISOR_JOURNAL_SOCKET": str(journal.path)}
    try:
        with trio.fail_after(60):
            async with run_daemon(config, env=env) as daemon:
                refused = await journal.wait_for(REASON="secret", EVENT="refused to boot")
                assert await daemon.wait() == 3
    finally:
        journal.close()
    assert refused["PRIORITY"] == b"2" and refused["SYSLOG_IDENTIFIER"] == b"trio-supervisor"
    assert json.loads(refused["MESSAGE"])["event"] == "refused to boot"
    assert any(entry["PRIORITY"] == b"6" for entry in journal.entries)  # info lines before it
    assert daemon.raw == []  # nothing on stderr: the journal took every line


# A private /run, so the journald started here is no one else's: it binds its sockets in
# /run/systemd/journal and keeps its files in /run/log/journal. In a PID namespace of its
# own, so nothing it started outlives the test.
_REAL_JOURNAL = """set -e
mount -t tmpfs tmpfs /run
mkdir -p /run/systemd/journal /run/log/journal
"$JOURNALD" >/dev/null 2>&1 &
JOURNALD_PID=$!
trap 'kill $JOURNALD_PID' EXIT
for _ in $(seq 100); do [ -S /run/systemd/journal/socket ] && break; sleep 0.05; done
"$PYTHON" -c "$LOG"
for _ in $(seq 100); do
  "$JOURNALCTL" -D /run/log/journal -o json --all --no-pager EVENT=small > "$OUT"
  [ -s "$OUT" ] && break; sleep 0.05
done
"$JOURNALCTL" -D /run/log/journal -o json --all --no-pager SYSLOG_IDENTIFIER=trio-supervisor > "$OUT"
"""
_LOG = """import io
from supervisor import logs
logs.configure("info", "journal", io.StringIO(), journal_socket="/run/systemd/journal/socket")
logs.get_logger("t").error("large", detail="y" * 400_000, revision=42)
logs.get_logger("t").error("small", revision=43)
"""


def test_the_real_journald_takes_an_entry_too_large_for_a_datagram(tmp_path: Path) -> None:
    journald = needs.program("systemd-journald", "Debian's systemd package",
                             also=("/lib/systemd", "/usr/lib/systemd"))
    journalctl = needs.program("journalctl", "Debian's systemd package")
    unshare = needs.program("unshare", "util-linux")
    if os.geteuid() != 0:
        needs.missing("root", "a private mount namespace for a journald of the test's own")
    out = tmp_path / "entries.json"
    env = {**os.environ, "JOURNALD": journald, "JOURNALCTL": journalctl, "OUT": str(out),
           "PYTHON": sys.executable, "LOG": _LOG, "PYTHONPATH": str(REPO)}
    subprocess.run([unshare, "--mount", "--propagation", "private", "--fork", "--pid",
                    "--kill-child", "sh", "-c", _REAL_JOURNAL],
                   env=env, cwd=REPO, timeout=60, check=True, capture_output=True)
    entries = {e["EVENT"]: e for e in map(json.loads, out.read_text().splitlines())}
    assert entries["large"]["DETAIL"] == "y" * 400_000 and entries["large"]["REVISION"] == "42"
    assert entries["large"]["PRIORITY"] == "3"
    assert json.loads(entries["large"]["MESSAGE"])["detail"] == "y" * 400_000
    assert entries["small"]["REVISION"] == "43"
