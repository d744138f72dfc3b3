"""SIGHUP's re-read: a deadline on a read that hangs, and the keys that need a restart."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import msgspec
import trio
import trio.testing
from structlog.testing import capture_logs

from supervisor.config import Config
from supervisor.configfile import MAX_CONFIG_BYTES, load_text
from supervisor.errors import ConfigError
from supervisor.lifecycle.reload import ConfigReload, changed_keys, read_regular_config

TEXT = '[control_plane]\nurl = "sqlite:///cp.db"\n'


def _config(extra: str = "") -> Config:
    return load_text(TEXT + extra, source="test.toml", environ={})


async def test_a_read_that_hangs_is_given_up_at_the_deadline(
    mock_clock: trio.testing.MockClock,
) -> None:
    entered, release = threading.Event(), threading.Event()
    calls: list[str] = []

    def hung(path: str) -> Config:
        calls.append(path)
        entered.set()
        release.wait(30)
        return _config()

    reload = ConfigReload("/mnt/gone/supervisor.toml", _config(), timeout_s=5.0, read=hung)
    results: list[Config | None] = []

    async def read() -> None:
        results.append(await reload.read())

    try:
        with trio.fail_after(60), capture_logs() as logs:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read)
                await trio.to_thread.run_sync(entered.wait)
                mock_clock.jump(4.9)
                await trio.testing.wait_all_tasks_blocked()
                assert results == []
                mock_clock.jump(0.2)
            assert results == [None]
            # The hung thread still holds the reload limiter: the next SIGHUP
            # waits out its own deadline instead of starting a second thread.
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read)
                await trio.testing.wait_all_tasks_blocked()
                mock_clock.jump(5.1)
            assert results == [None, None]
        assert calls == ["/mnt/gone/supervisor.toml"]
        errors = [entry for entry in logs if entry["event"] == "SIGHUP: configuration not reloaded"]
        assert len(errors) == 2 and "within 5 s" in errors[0]["error"]
    finally:
        release.set()


async def test_a_second_sighup_reads_the_file_whatever_the_first_read_it_waited_for_found(
) -> None:
    # Two quick SIGHUPs: the first read finds the file mid-edit, the second
    # (waiting for the one reload thread) finds it complete.
    entered, release = threading.Event(), threading.Event()
    calls: list[str] = []

    def reader(path: str) -> Config:
        calls.append(path)
        if len(calls) == 1:
            entered.set()
            release.wait(30)
            raise ConfigError("$", "half-written", source=path)
        return _config('[log]\nlevel = "debug"\n')

    reload = ConfigReload("supervisor.toml", _config(), timeout_s=5.0, read=reader)
    results: dict[str, Config | None] = {}

    async def read(name: str) -> None:
        results[name] = await reload.read()

    try:
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read, "first")
                await trio.to_thread.run_sync(entered.wait, 10)
                nursery.start_soon(read, "second")
                await trio.testing.wait_all_tasks_blocked()
                release.set()
    finally:
        release.set()
    assert results["first"] is None
    second = results["second"]
    assert second is not None and second.log.level == "debug"
    assert reload.last_error is None


async def test_restart_needed_names_every_changed_key_but_the_log_level() -> None:
    running = _config()
    fresh = _config('poll_interval_s = 7.0\n[log]\nlevel = "debug"\n[admin]\nlisten = "127.0.0.1:1"\n')
    assert changed_keys(running, fresh) == [
        "admin.listen", "control_plane.poll_interval_s", "log.level"]
    reload = ConfigReload("x.toml", running)
    with capture_logs() as logs:
        assert reload.restart_needed(fresh) == ["admin.listen", "control_plane.poll_interval_s"]
        assert reload.restart_needed(_config('[log]\nlevel = "debug"\n')) == []
    assert [(entry["event"], entry["keys"], entry["log_level"]) for entry in logs] == [
        ("SIGHUP: restart needed for", ["admin.listen", "control_plane.poll_interval_s"],
         "warning")]
    assert msgspec.to_builtins(running) == msgspec.to_builtins(_config())


def test_only_a_regular_file_is_read(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    for path, words in ((fifo, "FIFO"), (tmp_path, "not a regular file"),
                        (tmp_path / "missing.toml", "cannot read")):
        try:
            read_regular_config(str(path))
        except ConfigError as exc:
            assert words in str(exc) and str(path) in str(exc)
        else:
            raise AssertionError(f"{path} was read")
    good = tmp_path / "good.toml"
    good.write_text(TEXT)
    assert read_regular_config(str(good)).control_plane.url == "sqlite:///cp.db"


def test_a_file_over_the_size_bound_is_refused_without_being_read_whole(tmp_path: Path) -> None:
    # A runaway template or a log written to the config's path: parsing it
    # would go on in the abandoned thread, holding the GIL, long after the deadline.
    huge = tmp_path / "huge.toml"
    filler = "# " + "." * 77 + "\n"
    huge.write_text(TEXT + filler * (MAX_CONFIG_BYTES // len(filler) + 1))
    with open(huge, "ab") as file:
        file.truncate(100 * 1024 * 1024)  # sparse: 100 MB without writing them
    try:
        read_regular_config(str(huge))
    except ConfigError as exc:
        assert "larger than 1 MiB" in str(exc) and str(huge) in str(exc)
    else:
        raise AssertionError("a 100 MB configuration file was loaded")
    just_under = tmp_path / "big.toml"
    just_under.write_text(TEXT + filler * ((MAX_CONFIG_BYTES - len(TEXT)) // len(filler)))
    assert read_regular_config(str(just_under)).control_plane.url == "sqlite:///cp.db"
