"""The CLI maps the daemon's outcomes, even nested in exception groups, to exit codes."""

from __future__ import annotations

import pytest

from supervisor.admin.errors import AdminBindError
from supervisor.cli import _report
from supervisor.errors import (
    BootRefused,
    ConfigError,
    SupervisionGaveUp,
    SupervisorError,
    UsageError,
)


def nested(exc: BaseException) -> BaseExceptionGroup[BaseException]:
    return BaseExceptionGroup("outer", [BaseExceptionGroup("inner", [exc])])


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (ConfigError("$.admin.listen", "expected HOST:PORT, got 'x'"), 2),
        (AdminBindError("127.0.0.1:1", "already in use"), 1),
        (UsageError("no configuration"), 2),
        (BootRefused("empty", "nothing published"), 3),
        (SupervisionGaveUp("convergence", 6, 60.0), 4),
        (SupervisorError("store migrate failed"), 1),
        (RuntimeError("a bug"), 1),
    ],
)
def test_exit_codes(exc: BaseException, code: int, capsys: pytest.CaptureFixture[str]) -> None:
    assert _report(exc) == code
    assert _report(nested(exc)) == code


def test_config_error_names_its_path(capsys: pytest.CaptureFixture[str]) -> None:
    _report(nested(ConfigError("$.admin.listen", "address 127.0.0.1:1 already in use")))
    err = capsys.readouterr().err
    assert "$.admin.listen" in err and "127.0.0.1:1" in err


def test_gave_up_wins_over_the_cancellations_around_it() -> None:
    group = BaseExceptionGroup("tree", [KeyboardInterrupt(), SupervisionGaveUp("admin", 6, 60)])
    assert _report(group) == 4
