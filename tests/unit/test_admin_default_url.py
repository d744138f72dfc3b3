"""The admin URL a command asks when no --url is given: the one --config's [admin] names."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from supervisor.commands.common import admin_base
from supervisor.config import CONFIG_ENV


@pytest.mark.parametrize(("listen", "tls", "url"), [
    ("127.0.0.1:9464", False, "http://127.0.0.1:9464"),
    ("[::1]:9464", False, "http://[::1]:9464"),
    ("0.0.0.0:9464", True, "https://127.0.0.1:9464"),  # a wildcard is asked on loopback
    ("[::]:9464", True, "https://127.0.0.1:9464"),
])
def test_the_default_url_is_the_listen_address_on_loopback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, listen: str, tls: bool,
        url: str) -> None:
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    config = tmp_path / "supervisor.toml"
    config.write_text(f'[control_plane]\nurl = "sqlite:///{tmp_path}/cp.db"\n[admin]\n'
                      f'listen = "{listen}"\ntoken_file = "{token}"\n' + (
                          f'tls_cert_file = "{tmp_path}/c"\ntls_key_file = "{tmp_path}/k"\n'
                          if tls else ""))
    args = argparse.Namespace(config=str(config))
    assert admin_base(args) == (url, "s3cret-token")
    stream = url.replace("http", "ws", 1) + "/v1/stream"
    assert admin_base(args, "ws", path="/v1/stream")[0] == stream
    assert admin_base(argparse.Namespace(config=None)) == ("http://127.0.0.1:9464", None)
