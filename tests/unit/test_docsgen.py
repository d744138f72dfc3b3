"""The reference pages in docs/ match the code they document (python -m tools.docsgen)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from supervisor import reasons
from supervisor.config import Config
from tools import docs_catalog, docsgen

REPO = Path(__file__).resolve().parents[2]


def test_docs_are_up_to_date() -> None:
    stale = docsgen.check(REPO / "docs")
    assert not stale, f"stale: {stale}; run `python -m tools.docsgen` and commit docs/"


def test_check_command_fails_on_a_stale_page(tmp_path: Path) -> None:
    docsgen.write(tmp_path)
    assert docsgen.check(tmp_path) == []
    page = tmp_path / "configuration.md"
    page.write_text(page.read_text().replace("poll_interval_s", "poll_s"))
    assert docsgen.check(tmp_path) == ["configuration.md"]
    # Every page is compared, the generated index and a missing page included.
    (tmp_path / "metrics.md").unlink()
    index = tmp_path / "README.md"
    index.write_text(index.read_text() + "- [old.md](old.md): gone\n")
    assert sorted(docsgen.check(tmp_path)) == ["README.md", "configuration.md", "metrics.md"]
    result = subprocess.run([sys.executable, "-m", "tools.docsgen", "--check"],
                            cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr


def test_every_configuration_key_is_documented_with_its_environment_name() -> None:
    text = docsgen.render_configuration()
    for section in Config.__struct_fields__:
        sub = type(getattr(Config(), section))
        for key in sub.__struct_fields__:
            assert f"| `{key}` |" in text
            assert f"`SUPERVISOR_{section.upper()}__{key.upper()}`" in text
    assert "| `poll_interval_s` | float | `5` | ≥ 0.01, ≤ 86400 |" in text
    assert "| `max_revision_bytes` | integer | `16777216` | ≥ 1024, ≤ 1073741824 |" in text


def test_every_key_and_label_has_prose() -> None:
    described = set(docs_catalog.CONFIG_KEYS)
    for section in Config.__struct_fields__:
        sub = type(getattr(Config(), section))
        missing = {f"{section}.{k}" for k in sub.__struct_fields__} - described
        assert not missing, f"describe in tools/docs_catalog.py: {missing}"
    labels = {*reasons.REVISION_REASONS, *reasons.BOOT_REFUSALS, *reasons.FANOUT_ERROR_CLASSES}
    assert labels <= set(docs_catalog.REASONS), labels - set(docs_catalog.REASONS)


def test_log_events_page_lists_the_calls_it_finds() -> None:
    text = docsgen.render_log_events()
    assert "| refused to boot | critical | `detail`, `reason`, `refusal` |" in text
    assert "| revision refused; previous snapshot keeps serving | warning |" in text
    # Keys passed as **fields are resolved from the dict literal.
    row = next(line for line in text.splitlines()
               if line.startswith("| convergence attempt refused by the control plane"))
    assert "`reason`" in row and "`revision`" in row and "`retry_in_s`" in row
    # An outage Streak's events, found through its constructor.
    assert "| control plane unreachable | warning |" in text
    assert "| LISTEN connection reachable again | info | `after_s`, `attempts` |" in text
    # Its fields are those of the .failed() calls on it in the same module, and its own.
    assert ("| LISTEN connection still unreachable | warning | `attempts`, `error`, `for_s`, "
            "`retry_in_s`, `url` |") in text
    # A streak's own levels and count name (admin/accept.py).
    assert "| admin accept recovered | warning | `after_s`, `count` |" in text


def test_every_log_event_name_is_a_constant() -> None:
    """An event built with an f-string embeds variable text: no alert can match it by
    `event`, and the log-events page cannot list it. Variable parts go in fields."""
    import ast

    from tools.docsgen.sourcescan import modules, non_constant_events

    found = [f"{module}:{line}: {call}" for module, tree in modules()
             for line, call in non_constant_events(tree)]
    assert not found, "\n".join(found)
    probe = ast.parse('log.error(f"sweep refused: {n} objects", n=n)\nlog.info("a" if x else "b")\n'
                      'Streak(log, began="a", ended=f"{what} ended")\nStreak(log, began="b")')
    assert [line for line, _ in non_constant_events(probe)] == [1, 3]


def test_log_events_page_lists_conditional_and_streak_events() -> None:
    text = docsgen.render_log_events()
    for event in ("control-plane file replaced or removed; reopening",
                  "control-plane file removed", "orphan sweep refused",
                  "fan-out object failed to decode and is skipped",
                  "fan-out child API not served; retrying",
                  "fan-out watch response failed to decode; retrying",
                  "fan-out watch not available yet; retrying",
                  "admin accept failing", "admin connections accepted again",
                  "invalid configuration"):
        assert f"| {event} |" in text, event
