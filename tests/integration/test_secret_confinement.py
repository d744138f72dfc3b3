"""Where a published revision's secrets may come from, in the real daemon."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
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

    # The hostile revisions come from a database writer (the CLI refuses them): the
    # replica must refuse them itself.
    from tests.stores import make_store

    store = make_store(f"sqlite:///{tmp_path}/cp.db")

    async def publish(reference: str) -> int:
        return await store.publish(_revision(reference), 1, None)

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
    await store.aclose()
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


def _revision(reference: str) -> bytes:
    return json.dumps({
        "schema_version": 1,
        "aliases": {"chat": {"upstream": "https://llm.internal:8443/v1"}},
        "keys": {"team-a": {"secret": reference, "aliases": ["chat"]}},
    }).encode()


async def test_the_daemons_own_secrets_are_refused_under_the_default_configuration(
    tmp_path: Path,
) -> None:
    """With no allow-list set (as in conf/dev.toml), a database writer stores
    revisions naming the replica's own secrets and places whose value anyone knows:
    every one is refused (``secret``), and none of their digests is served in
    /v1/snapshot or written to the snapshot file."""
    import hashlib

    import httpx

    from tests.stores import make_store

    key = tmp_path / "signing.key"
    verify = cli("keygen", "--out", str(key)).stdout.strip().splitlines()[-1].split()[-1]
    token = tmp_path / "admin.token"
    token.write_text("admin-token-of-this-replica\n")
    token.chmod(0o600)
    (tmp_path / "run").mkdir(mode=0o700)
    (tmp_path / "cache").mkdir(mode=0o700)
    url = f"sqlite:///{tmp_path}/cp.db"
    port = free_port()
    config = write_config(
        tmp_path, url, port=port, poll_interval_s=0.2, backoff_initial_s=0.1,
        backoff_max_s=0.3,
        extra=f'token_file = "{token}"\n[snapshot]\npath = "{tmp_path}/run/snapshot.json"\n'
              f'[cache]\npath = "{tmp_path}/cache/lkg.bin"\nsigning_key = "{key}"\n'
              f'trusted_keys = ["{verify}"]\n',
    )
    link = tmp_path / "innocent-name"
    link.symlink_to(key)
    store = make_store(url)
    try:
        await store.publish(_revision("env:TEAM_X"), 1, None)
        env = {"SUPERVISOR_CONTROL_PLANE__URL": url, "TEAM_X": "ok"}
        hostile = {
            "environ": "file:/proc/self/environ",
            "signing key": f"file:{key}",
            "signing key by a symlink": f"file:{link}",
            "admin token": f"file:{token}",
            "ostype": "file:/proc/sys/kernel/ostype",
            "dsn": "env:SUPERVISOR_CONTROL_PLANE__URL",
        }
        known = {hashlib.sha256(value).hexdigest() for value in (
            key.read_bytes().rstrip(b"\n"), b"admin-token-of-this-replica", b"Linux",
            url.encode())}
        details: dict[str, str] = {}
        with trio.fail_after(60):
            async with run_daemon(config, env=env) as daemon:
                await daemon.wait_log("ready")
                for name, reference in hostile.items():
                    revision = await store.publish(_revision(reference), 1, None)
                    line = await daemon.wait_log(
                        "revision refused; previous snapshot keeps serving", revision=revision)
                    assert line["reason"] == "secret" and line["active"] == 1, (name, line)
                    details[name] = line["detail"]
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
                    served = (await http.get("/v1/snapshot", headers={
                        "authorization": "Bearer admin-token-of-this-replica"})).text
                written = (tmp_path / "run" / "snapshot.json").read_text()
                daemon.signal(signal.SIGTERM)
                assert await daemon.wait() == 0
    finally:
        await store.aclose()
    for digest in known:
        assert digest not in served and digest not in written
    assert hashlib.sha256(b"ok").hexdigest() in served  # the first revision still serves
    assert "under /proc, /sys or /dev" in details["environ"]
    assert "under /proc, /sys or /dev" in details["ostype"]
    assert "one the daemon itself reads" in details["dsn"]
    # The daemon's own files read like any unusable file: nothing says what they are.
    for name in ("signing key", "signing key by a symlink", "admin token"):
        assert "cannot be resolved" in details[name], details[name]


def test_a_device_or_a_fifo_is_never_opened_for_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever is at a ``file:`` path is looked at without being opened (``O_PATH``),
    so no device driver runs (``/dev/watchdog`` under a root daemon) and no FIFO
    blocks; only a regular file is then opened for reading. /dev itself is refused
    on its name. Every ``os.open`` is recorded: none of them reads these."""
    import os
    import stat

    from supervisor.revision.errors import RevisionError
    from supervisor.revision.secrets import EnvFileResolver

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    places = [str(fifo), "/dev/zero"]
    if os.geteuid() == 0:  # a device node outside /dev (only root can make one)
        os.mknod(tmp_path / "zero", 0o600 | stat.S_IFCHR, os.makedev(1, 5))
        places.append(str(tmp_path / "zero"))
    (tmp_path / "link-to-zero").symlink_to("/dev/zero")
    places.append(str(tmp_path / "link-to-zero"))
    opened: list[tuple[str, int]] = []
    real_open = os.open

    def recording_open(path: str, flags: int, *args: int, **kwargs: int) -> int:
        opened.append((str(path), flags))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", recording_open)
    resolver = EnvFileResolver({})
    for place in places:
        with pytest.raises(RevisionError) as refusal:
            resolver.resolve(f"file:{place}")
        assert refusal.value.reason == "secret", place
    reads = [(path, flags) for path, flags in opened if not flags & os.O_PATH]
    assert reads == [], reads
    assert "/dev/zero" not in [path for path, _ in opened]  # refused on its name
    opened.clear()
    (tmp_path / "regular").write_text("value\n")
    assert resolver.resolve(f"file:{tmp_path / 'regular'}") == b"value"
    assert [flags & os.O_PATH for _, flags in opened] == [os.O_PATH, 0]  # looked, then read


def test_a_hard_link_inside_the_allowed_directory_is_refused(tmp_path: Path) -> None:
    """Whoever can write in a secret directory may hard-link any file they can read
    into it (the file keeps its inode, so no path check sees it leave): a secret
    file with more than one name is refused, with the one message of every cause."""
    import os

    from supervisor.revision.errors import RevisionError
    from supervisor.revision.secrets import EnvFileResolver

    secrets = tmp_path / "secrets"
    secrets.mkdir()
    outside = tmp_path / "outside"
    outside.write_text("OUTSIDE\n")
    os.link(outside, secrets / "linked")
    (secrets / "own").write_text("own\n")
    resolver = EnvFileResolver({}, dirs=[str(secrets)])
    with pytest.raises(RevisionError) as refusal:
        resolver.resolve(f"file:{secrets / 'linked'}")
    assert refusal.value.reason == "secret"
    assert "cannot be resolved" in refusal.value.detail
    assert "OUTSIDE" not in refusal.value.detail
    assert resolver.resolve(f"file:{secrets / 'own'}") == b"own"


def test_the_daemons_own_variables_and_files_are_refused_whatever_the_lists_say(
    tmp_path: Path,
) -> None:
    """Allow-lists that would admit them change nothing: SUPERVISOR_*, PG*, KUBECONFIG
    and a credential file of the configuration (here the follower's token, inside
    the allowed directory) are refused; HOME is the allow-lists' business."""
    from supervisor.config import Config, ControlPlaneConfig, RevisionConfig
    from supervisor.revision.errors import RevisionError
    from supervisor.revision.secrets import EnvFileResolver

    token = tmp_path / "upstream.token"
    token.write_text("upstream-token\n")
    config = Config(control_plane=ControlPlaneConfig(url="https://upstream:9464",
                                                     token_file=str(token)),
                    revision=RevisionConfig(secret_dirs=[str(tmp_path)]))
    environ = {"SUPERVISOR_CONTROL_PLANE__URL": "postgresql://u:pw@db/cp",
               "PGPASSWORD": "pw", "KUBECONFIG": "/k", "HOME": "/root"}
    resolver = EnvFileResolver.for_daemon(config, environ=environ)
    for reference in ("env:SUPERVISOR_CONTROL_PLANE__URL", "env:PGPASSWORD", "env:KUBECONFIG",
                      f"file:{token}"):
        with pytest.raises(RevisionError) as refusal:
            resolver.resolve(reference)
        assert refusal.value.reason == "secret", reference
    assert resolver.resolve("env:HOME") == b"/root"


def test_proc_or_sys_mounted_inside_the_allowed_directory_is_refused(tmp_path: Path) -> None:
    """A bind mount (or a hostPath volume) of /proc or /sys inside a secret directory
    gives paths that no path check sees leave it: the file opened is refused by the
    kind of filesystem it lives on."""
    import subprocess

    from supervisor.revision.errors import RevisionError
    from supervisor.revision.secrets import EnvFileResolver

    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "own").write_text("own\n")
    mounted = []
    for name, source in (("kernel", "/proc/sys/kernel"), ("power", "/sys/power")):
        (secrets / name).mkdir()
        done = subprocess.run(["mount", "--bind", source, str(secrets / name)],
                              capture_output=True, check=False)
        if done.returncode == 0:
            mounted.append(name)
    if not mounted:
        pytest.skip("needs the right to bind-mount (root with CAP_SYS_ADMIN)")
    try:
        resolver = EnvFileResolver({}, dirs=[str(secrets)])
        for reference in (f"file:{secrets}/kernel/ostype", f"file:{secrets}/power/state"):
            if reference.split("/")[-2] not in mounted:
                continue
            with pytest.raises(RevisionError) as refusal:
                resolver.resolve(reference)
            assert refusal.value.reason == "secret"
            assert "cannot be resolved" in refusal.value.detail
        assert resolver.resolve(f"file:{secrets / 'own'}") == b"own"
    finally:
        for name in mounted:
            subprocess.run(["umount", str(secrets / name)], check=False)
