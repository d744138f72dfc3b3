"""Which environment variables are the daemon's own (never a secret's place)."""

from __future__ import annotations

import pytest

from supervisor.configchecks import own_env_name


@pytest.mark.parametrize("name", ["SUPERVISOR_ADMIN__TOKEN_FILE", "SUPERVISOR_", "PG",
                                  "PGPASSWORD", "PGSERVICEFILE", "KUBECONFIG",
                                  "KUBERNETES_SERVICE_HOST", "NOTIFY_SOCKET", "WATCHDOG_USEC",
                                  "JOURNAL_STREAM", "SSL_CERT_FILE", "HTTPS_PROXY", "no_proxy",
                                  "NETRC"])
def test_the_daemons_own_variables(name: str) -> None:
    assert own_env_name(name)


@pytest.mark.parametrize("name", ["LLM_KEY", "SUPERVISOR", "KUBECONFIG_EXTRA", "HTTPS_PROXY_2",
                                  "NETRC2", "NOTIFY_SOCKETS", "Pg", "XPGPASSWORD", ""])
def test_other_variables(name: str) -> None:
    """Only the names ending in ``_`` (and PG) are prefixes; the others match whole."""
    assert not own_env_name(name)
