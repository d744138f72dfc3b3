"""Where a published revision's secrets may come from, in the real daemon."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import trio

from tests.proc import acli, cli, free_port, run_daemon, write_config

REVISION = """schema_version = 1
[aliases.chat]
upstream = "https://llm.internal:8443/v1"
[keys.team-a]
secret = "{reference}"
aliases = ["chat"]
"""


async def test_references_outside_the_allowed_places_are_refused_alike(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "team-a").write_text("in-the-allowed-dir\n")
    (secrets / "a-directory").mkdir()
    port = free_port()
    config = write_config(
        tmp_path, f"sqlite:///{tmp_path}/cp.db", port=port, poll_interval_s=0.2,
        backoff_initial_s=0.1, backoff_max_s=0.3,
        extra=f'[revision]\nsecret_env_prefixes = ["TEAM_"]\nsecret_dirs = ["{secrets}"]\n',
    )

    # The hostile revisions come from a publisher whose own configuration does not
    # confine (the CLI refuses them under this one): the replica must refuse them itself.
    (tmp_path / "publisher").mkdir()
    unconfined = write_config(tmp_path / "publisher", f"sqlite:///{tmp_path}/cp.db")

    async def publish(reference: str) -> int:
        doc = tmp_path / "rev.toml"
        doc.write_text(REVISION.format(reference=reference))
        return int((await acli("publish", "--config", str(unconfined),
                               str(doc))).stdout.split()[-1])

    doc = tmp_path / "first.toml"
    doc.write_text(REVISION.format(reference=f"file:{secrets / 'team-a'}"))
    cli("publish", "--config", str(config), str(doc))
    env = {"SUPERVISOR_CONTROL_PLANE__URL": f"sqlite:///{tmp_path}/cp.db", "TEAM_X": "ok"}
    details: dict[str, str] = {}
    with trio.fail_after(60):
        async with run_daemon(config, env=env) as daemon:
            await daemon.wait_log("ready")
            for name, reference in {
                "environ": "file:/proc/self/environ",
                "dsn": "env:SUPERVISOR_CONTROL_PLANE__URL",
                "dotdot": f"file:{secrets}/../cp.db",
                "missing": f"file:{secrets / 'missing'}",
                "unreadable": f"file:{secrets / 'a-directory'}",
            }.items():
                revision = await publish(reference)
                line = await daemon.wait_log(
                    "revision refused; previous snapshot keeps serving", revision=revision)
                assert line["reason"] == "secret" and line["active"] == 1
                details[name] = line["detail"]
            status = json.loads((await acli("status", "--config", str(config),
                                            "--json")).stdout)
            assert status["revision"]["active"] == 1  # the first one kept serving
            assert status["revision"]["last_rejection"]["detail"] == details["unreadable"]
            ok = await publish("env:TEAM_X")
            await daemon.wait_log("published", revision=ok)
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0
    assert "outside [revision].secret_dirs" in details["environ"]
    assert "outside [revision].secret_env_prefixes" in details["dsn"]
    assert "outside [revision].secret_dirs" in details["dotdot"]
    # Missing and unreadable read the same: the refusal does not say which.
    assert details["missing"].replace("missing", "X") == (
        details["unreadable"].replace("a-directory", "X"))


def test_a_symlink_swapped_after_the_check_never_leads_outside(tmp_path: Path) -> None:
    """TOCTOU: whoever can write in a secret directory swaps a symlink between an
    allowed file and one outside (``/proc/self/environ``, the database password's
    file) while the replica resolves it. Whatever the timing, the bytes read are
    never those of the outside file: confinement is decided on what was opened."""
    import os
    import threading

    from supervisor.revision.errors import RevisionError
    from supervisor.revision.secrets import EnvFileResolver

    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "inside").write_text("inside\n")
    outside = tmp_path / "outside"
    outside.write_text("OUTSIDE\n")
    link = secrets / "link"
    link.symlink_to(secrets / "inside")
    resolver = EnvFileResolver({}, dirs=[str(secrets)])
    stop = threading.Event()

    def swap() -> None:
        spare = secrets / ".swap"
        targets = (outside, secrets / "inside")
        n = 0
        while not stop.is_set():
            spare.unlink(missing_ok=True)
            spare.symlink_to(targets[n % 2])
            os.replace(spare, link)  # atomic: the link always exists
            n += 1

    swapper = threading.Thread(target=swap)
    swapper.start()
    seen: dict[bytes, int] = {}
    try:
        for _ in range(20_000):
            try:
                value = resolver.resolve(f"file:{link}")
            except RevisionError:
                value = b"<refused>"
            seen[value] = seen.get(value, 0) + 1
            if b"OUTSIDE" in seen:
                break
    finally:
        stop.set()
        swapper.join()
    assert b"OUTSIDE" not in seen, seen
    assert seen.get(b"inside", 0) > 0 and seen.get(b"<refused>", 0) > 0, seen  # both raced
