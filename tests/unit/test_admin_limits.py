"""Stream client limits derived from the descriptor limit, and raising the soft limit."""

from __future__ import annotations

import resource

from supervisor.admin.limits import NOFILE_TARGET, derive, raise_nofile


def test_stream_clients_are_derived_from_the_descriptor_limit() -> None:
    # 10,000 subscribers on one replica need a soft limit of about 13,100.
    assert derive(16384, None).max_stream_clients == 12544
    assert derive(13100, None).max_stream_clients >= 10_000
    assert derive(12000, None).max_stream_clients < 10_000
    small = derive(1024, None)
    assert 0 < small.max_stream_clients < small.max_connections < 1024
    assert not small.stream_clients_lowered  # nothing was configured, nothing lowered
    # A configured value only ever lowers the derived one.
    assert derive(16384, 100).max_stream_clients == 100
    assert derive(1024, 4096).stream_clients_lowered
    assert derive(None, None).max_stream_clients > 50_000


class FakeLimits:
    def __init__(self, soft: int, hard: int, refuse: bool = False) -> None:
        self.soft, self.hard, self.refuse = soft, hard, refuse

    def get(self, which: int) -> tuple[int, int]:
        assert which == resource.RLIMIT_NOFILE
        return self.soft, self.hard

    def set(self, which: int, limits: tuple[int, int]) -> None:
        assert which == resource.RLIMIT_NOFILE
        if self.refuse:
            raise ValueError("not allowed")
        self.soft, self.hard = limits


def test_raise_nofile_moves_the_soft_limit_to_the_hard_one_up_to_the_target() -> None:
    systemd = FakeLimits(1024, 524288)
    assert raise_nofile(getrlimit=systemd.get, setrlimit=systemd.set) == (1024, NOFILE_TARGET)
    assert (systemd.soft, systemd.hard) == (NOFILE_TARGET, 524288)

    unit = FakeLimits(1024, 16384)
    assert raise_nofile(getrlimit=unit.get, setrlimit=unit.set) == (1024, 16384)
    assert unit.soft == 16384

    unlimited = FakeLimits(1024, resource.RLIM_INFINITY)
    assert raise_nofile(getrlimit=unlimited.get, setrlimit=unlimited.set) == (1024, NOFILE_TARGET)

    for already in (FakeLimits(256, 256), FakeLimits(70000, 100000),
                    FakeLimits(resource.RLIM_INFINITY, resource.RLIM_INFINITY)):
        before = (already.soft, already.hard)
        assert raise_nofile(getrlimit=already.get, setrlimit=already.set) is None
        assert (already.soft, already.hard) == before

    sandboxed = FakeLimits(1024, 16384, refuse=True)
    assert raise_nofile(getrlimit=sandboxed.get, setrlimit=sandboxed.set) is None
    assert sandboxed.soft == 1024


def test_a_stream_client_limit_above_what_nofile_allows_is_lowered_with_a_warning() -> None:
    from structlog.testing import capture_logs

    from supervisor.admin.server import connection_limits
    from supervisor.admin.stream import StreamSettings

    with capture_logs() as logs:
        limits = connection_limits(StreamSettings(max_clients=4096), 1024)
        fits = connection_limits(StreamSettings(max_clients=100), 1024)
    assert limits.max_stream_clients == derive(1024, None).max_stream_clients < 4096
    assert fits.max_stream_clients == 100
    (warning,) = [e for e in logs if e["log_level"] == "warning"]
    # Both numbers named, and the descriptor limit they come from.
    assert warning["max_clients"] == 4096 and warning["allowed"] == limits.max_stream_clients
    assert warning["nofile"] == 1024
