"""Every ``--url`` naming a replica is checked before anything is stored or sent:
exit 2 naming the option, never a traceback, and nothing published."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.proc import EXAMPLE, acli, write_config

BAD_URLS = ["http://[::1", "ftp://replica:9464", "localhost:9464", "http://:9464",
            "http://replica:99999"]


@pytest.mark.parametrize("url", BAD_URLS)
async def test_publish_wait_refuses_a_bad_url_before_publishing(tmp_path: Path,
                                                                url: str) -> None:
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db")
    result = await acli("publish", "--config", str(config), str(EXAMPLE), "--wait",
                        "--url", url, "--timeout", "3", check=False)
    assert result.returncode == 2, result.stderr
    assert "argument --url:" in result.stderr and repr(url) in result.stderr
    assert "Traceback" not in result.stderr
    assert "published" not in result.stdout
    assert not (tmp_path / "cp.db").exists()  # nothing was stored, nothing created


async def test_a_url_without_scheme_gets_the_one_that_was_meant(tmp_path: Path) -> None:
    result = await acli("status", "--url", "localhost:9464", check=False)
    assert result.returncode == 2
    assert "did you mean http://localhost:9464?" in result.stderr


@pytest.mark.parametrize(("command", "url"), [
    (("status",), "http://[::1"),
    (("status",), "ws://127.0.0.1:9464"),
    (("watch", "--no-reconnect"), "ws://[::1"),
    (("watch", "--no-reconnect"), "ftp://127.0.0.1:9464"),
])
async def test_status_and_watch_refuse_a_bad_url_without_a_traceback(
        command: tuple[str, ...], url: str) -> None:
    result = await acli(*command, "--url", url, check=False)
    assert result.returncode == 2, result.stderr
    assert "argument --url:" in result.stderr
    assert "Traceback" not in result.stderr


async def test_status_json_says_why_a_bad_url_was_refused() -> None:
    result = await acli("status", "--json", "--url", "http://[::1", check=False)
    assert result.returncode == 2
    doc = json.loads(result.stdout)
    assert doc["ok"] is False and doc["reason"] == "invalid"
    assert "--url" in doc["detail"]


@pytest.mark.parametrize("command", [("status", "--json"), ("watch", "--no-reconnect"),
                                     ("rollback", "1", "--json")])
async def test_a_url_with_credentials_is_refused_without_echoing_them(
        tmp_path: Path, command: tuple[str, ...]) -> None:
    """user:password@ would be sent as Basic auth in place of the bearer token (httpx
    replaces the header) and echoed in every error line: refused before anything is sent."""
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/cp.db")
    result = await acli(*command, "--config", str(config),
                        "--url", "http://op:hunter2@127.0.0.1:9", check=False)
    assert result.returncode == 2, result.stderr
    assert "hunter2" not in result.stderr + result.stdout
    assert "argument --url:" in result.stderr and "--token-file" in result.stderr
    if "--json" in command:
        assert json.loads(result.stdout)["reason"] == "invalid"


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/?debug=1", "http://127.0.0.1:9#top"])
async def test_a_url_with_a_query_or_fragment_is_refused(url: str) -> None:
    # Appending /status to either asked for something else than the replica's report.
    result = await acli("status", "--url", url, check=False)
    assert result.returncode == 2, result.stderr
    assert "argument --url:" in result.stderr and "query or fragment" in result.stderr
