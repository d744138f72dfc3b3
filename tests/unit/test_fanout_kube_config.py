"""Configuration through the official loaders, and the lazy import of ``kubernetes``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from supervisor.kube.config import load_settings
from supervisor.kube.errors import KubeConfigError


def _kubeconfig(path: Path, cluster: dict[str, Any], user: dict[str, Any]) -> str:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }))
    return str(path)


def test_kubeconfig_with_token_ca_and_client_certificate(tmp_path: Path) -> None:
    for name in ("ca.crt", "client.crt", "client.key"):
        (tmp_path / name).write_text("-----BEGIN CERTIFICATE-----\n")
    path = _kubeconfig(
        tmp_path / "config",
        {"server": "https://k8s.example:6443/", "certificate-authority": str(tmp_path / "ca.crt"),
         "tls-server-name": "kubernetes"},
        {"token": "s3cret", "client-certificate": str(tmp_path / "client.crt"),
         "client-key": str(tmp_path / "client.key")},
    )
    settings = load_settings(path, environ={})
    assert settings.host == "https://k8s.example:6443"
    assert settings.verify is True
    assert settings.ca_file == str(tmp_path / "ca.crt")
    assert settings.cert_file == str(tmp_path / "client.crt")
    assert settings.key_file == str(tmp_path / "client.key")
    assert settings.tls_server_name == "kubernetes"
    assert settings.authorization == "Bearer s3cret"
    assert "s3cret" not in repr(settings)  # never in a log line


def test_token_file_is_read_and_re_read_by_a_new_load(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("one")
    path = _kubeconfig(tmp_path / "config", {"server": "http://127.0.0.1:1"},
                       {"tokenFile": str(token)})
    assert load_settings(path, environ={}).authorization == "Bearer one"
    token.write_text("two")
    assert load_settings(path, environ={}).authorization == "Bearer two"


def test_insecure_skip_tls_verify_disables_verification(tmp_path: Path) -> None:
    path = _kubeconfig(tmp_path / "config",
                       {"server": "https://k8s.example", "insecure-skip-tls-verify": True}, {})
    settings = load_settings(path, environ={})
    assert settings.verify is False
    assert settings.ssl_context() is False
    assert settings.authorization is None


def test_a_missing_or_broken_kubeconfig_is_a_kube_config_error(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError):
        load_settings(str(tmp_path / "absent"), environ={})
    broken = tmp_path / "broken"
    broken.write_text("{: not yaml ::")
    with pytest.raises(KubeConfigError):
        load_settings(str(broken), environ={})


def test_no_kubeconfig_inside_a_cluster_uses_the_service_account(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The in-cluster loader reads the process environment itself; the service-account
    # files do not exist here, and it says so.
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    with pytest.raises(KubeConfigError, match="token file"):
        load_settings(None)


def test_an_unreadable_ca_is_a_kube_config_error(tmp_path: Path) -> None:
    path = _kubeconfig(tmp_path / "config",
                       {"server": "https://k8s.example",
                        "certificate-authority": str(tmp_path / "missing-ca.crt")}, {})
    with pytest.raises(KubeConfigError):
        load_settings(path, environ={}).ssl_context()


def test_the_daemon_does_not_import_kubernetes_until_it_loads_settings() -> None:
    code = (
        "import sys\n"
        "import supervisor.fanout.children, supervisor.fanout.preflight\n"
        "import supervisor.kube.client, supervisor.kube.watching, supervisor.kube.config\n"
        "assert 'kubernetes' not in sys.modules, 'kubernetes imported eagerly'\n"
        "import supervisor.fanout.status\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
