"""No control-plane password in any output of the real process.

A table of DSNs whose passwords hold every special character, in the URL form
(percent-encoded, and raw where libpq accepts it raw), with an ``sslpassword``
too. Each runs through ``check``, ``db migrate``, a
daemon that serves, loses its database (a TCP proxy switched off: LISTEN and
convergence failures are logged with libpq's own text) and gets it back, and
``status`` in between. PostgreSQL here trusts loopback, so any password works.
Every password carries the markers ``Zq7`` and ``Kx9``: if any piece of it
leaks, one of them shows.

The key/value form (``host=... password='...'``) is not a valid
``[control_plane].url`` (docs/configuration.md), so it is driven through the
store's own connect and error mapping against a closed port: libpq's real
message, scrubbed.
"""

from __future__ import annotations

import json
import signal
import string
from pathlib import Path
from urllib.parse import quote

import pytest
import trio

from tests.pgserver import Server
from tests.proc import EXAMPLE, acli, free_port, run_daemon, write_config
from tests.tcpproxy import pg_proxy

EVERY = string.punctuation + " \t\n"  # newline and tab: libpq takes them, encoded or quoted
ENCODED = f"Zq7{EVERY}Kx9"
RAW_IN_URL = "Zq7#?!$&'()*+,;=:~[]^{}|`\"<>-Kx9"  # all libpq takes unencoded in a URL
SSL = "Zq7ssl'\\ @/Kx9"


def _kv_quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _cases(host_port: str, db: str) -> dict[str, str]:
    return {
        "url-encoded": f"postgresql://postgres:{quote(ENCODED, safe='')}@{host_port}/{db}"
                       f"?sslpassword={quote(SSL, safe='')}",
        "url-raw": f"postgresql://postgres:{RAW_IN_URL}@{host_port}/{db}",
        # Refused by the configuration; its libpq message names a misread host.
        "url-misread": f"postgresql://postgres:Zq7x@PWb14Kx9@{host_port}/{db}",
        "keyvalue": f"host={host_port.split(':')[0]} port={host_port.split(':')[1]} "
                    f"dbname={db} user=postgres password={_kv_quote(ENCODED)} "
                    f"sslpassword={_kv_quote(SSL)}",
        # Unencoded in the query: libpq cannot parse it and echoes a piece.
        "url-ssl-unparseable": f"postgresql://postgres@{host_port}/{db}"
                               f"?sslpassword=Zq7&Kx9()*+,;&Zq7:~Kx9",
        # Unquoted spaces: libpq cannot parse it and echoes the word it choked on.
        "keyvalue-unparseable": f"host={host_port.split(':')[0]} password=Zq7 Kx9wd "
                                f"sslpassword=Zq7 Kx9ssl dbname={db}",
    }


def _toml(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def _assert_clean(*texts: str) -> None:
    for text in texts:
        assert "Zq7" not in text and "Kx9" not in text, text[-2000:]


@pytest.mark.parametrize("form", ["url-encoded", "url-raw"])
async def test_passwords_never_leave_the_process(tmp_path: Path, pg_url: str, form: str,
                                                 pg_server: Server) -> None:
    db = pg_url.rsplit("/", 1)[1]
    server = f"{pg_server.host}:{pg_server.port}"
    proxy_port = free_port()
    url = _cases(f"127.0.0.1:{proxy_port}", db)[form]
    direct = _cases(server, db)[form]
    port = free_port()
    config = write_config(tmp_path, "sqlite:///unused.db", port=port, poll_interval_s=0.2,
                          backoff_initial_s=0.1, backoff_max_s=0.3)
    # At debug level: "control-plane connection opened" and the like are covered too.
    config.write_text(config.read_text().replace('"sqlite:///unused.db"', _toml(url))
                      .replace('level = "info"', 'level = "debug"'))
    direct_config = tmp_path / "direct.toml"
    direct_config.write_text(config.read_text().replace(_toml(url), _toml(direct)))
    outputs: list[str] = []
    with trio.fail_after(90):
        for args in (("check",), ("db", "migrate"), ("publish", str(EXAMPLE))):
            result = await acli(*args, "--config", str(direct_config))
            outputs += [result.stdout, result.stderr]
        assert f"postgresql://postgres@{server}/{db}" in outputs[2]  # db migrate's line
        async with pg_proxy(proxy_port, pg_url) as proxy, run_daemon(config) as daemon:
            await daemon.wait_log("ready")
            outputs.append((await acli("status", "--config", str(config), "--json")).stdout)
            proxy.stop()  # the outage: LISTEN and the loop fail with libpq's messages
            await daemon.wait_log("LISTEN connection unreachable")
            await daemon.wait_log("control plane unreachable")
            status = await acli("status", "--config", str(config), "--json")
            outputs.append(status.stdout)
            assert json.loads(status.stdout)["revision"]["consecutive_failures"] >= 1
            await proxy.start()
            await daemon.wait_log("listening for desired-state notifications")
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0
        outputs += daemon.raw
        assert any(line.get("event") == "control-plane connection opened"
                   for line in daemon.lines)  # the debug lines were there to leak
        failed = [line for line in daemon.lines if line.get("event") ==
                  "LISTEN connection unreachable"]
        assert failed[0]["url"] == f"postgresql://postgres@127.0.0.1:{proxy_port}/{db}"
        # With the proxy down for good, db migrate fails: its error is clean too.
        result = await acli("db", "migrate", "--config", str(config), check=False)
        assert result.returncode == 1
        outputs += [result.stdout, result.stderr]
    _assert_clean(*outputs)


async def test_a_url_password_libpq_would_misread_is_refused_without_echoing_it(
    tmp_path: Path,
) -> None:
    url = f"postgresql://postgres:Zq7@/PWb14Kx9@127.0.0.1:{free_port()}/db"  # never reached
    config = write_config(tmp_path, "sqlite:///unused.db")
    config.write_text(config.read_text().replace('"sqlite:///unused.db"', _toml(url)))
    with trio.fail_after(60):
        for args in (("check",), ("db", "migrate"), ("run",)):
            result = await acli(*args, "--config", str(config), check=False)
            assert result.returncode == 2, result
            assert "$.control_plane.url" in result.stderr and "percent-encode" in result.stderr
            _assert_clean(result.stdout, result.stderr)


@pytest.mark.parametrize(
    "form", ["url-encoded", "url-raw", "url-misread", "url-ssl-unparseable", "keyvalue",
             "keyvalue-unparseable"])
async def test_libpq_connect_errors_are_scrubbed_in_every_form(form: str) -> None:
    from supervisor.controlplane import postgres

    url = _cases(f"127.0.0.1:{free_port()}", "cp")[form]
    try:
        await trio.to_thread.run_sync(lambda: postgres.connect(url, connect_timeout_s=2))
    except Exception as exc:  # noqa: BLE001 - any driver error is what we map
        mapped = postgres.map_error(exc, what="read", url=url)
        assert "failed" in str(mapped)
        _assert_clean(str(mapped), repr(mapped))
    else:
        raise AssertionError("connected to a closed port")
