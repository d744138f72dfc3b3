"""Where the API server is and how to authenticate: the ``kubernetes`` package's loaders."""

from __future__ import annotations

import functools
import os
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from supervisor.kube.errors import KubeConfigError
from supervisor.threads import ThreadDeadline, in_thread

__all__ = ["KubeSettings", "load_settings", "load_settings_async"]


@dataclass(frozen=True)
class KubeSettings:
    """What the HTTP client needs, copied out of a ``kubernetes.client.Configuration``.

    ``authorization`` is the full header value (``Bearer ...``) or None. ``refresh`` re-runs
    the loader's ``refresh_api_key_hook`` and returns the current header value. In-cluster
    it re-reads the service-account token once a minute. It blocks: call it in a thread.
    ``source`` describes where the settings came from, for logs (never a secret).
    """

    host: str
    source: str
    verify: bool = True
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    tls_server_name: str | None = None
    proxy: str | None = None
    authorization: str | None = field(default=None, repr=False)
    refresh: Callable[[], str | None] | None = field(default=None, repr=False, compare=False)

    def ssl_context(self) -> ssl.SSLContext | bool:
        """The TLS context for httpx: CA verification and the client certificate.

        Blocks (reads files). ``False`` only when the kubeconfig says
        ``insecure-skip-tls-verify``.
        """
        if not self.host.startswith("https"):
            return True  # plain HTTP (a local proxy or a test server): no TLS at all
        if not self.verify:
            return False
        try:
            ctx = ssl.create_default_context(cafile=self.ca_file)
            if self.cert_file:
                ctx.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise KubeConfigError(f"cannot load TLS material for {self.host}: {exc}") from exc
        return ctx


def _header(cfg: Any) -> str | None:
    # The loaders store the token already prefixed ("Bearer x" / "bearer x").
    # get_api_key_with_prefix also runs refresh_api_key_hook when one is set.
    value = cfg.get_api_key_with_prefix("BearerToken")
    return str(value) if value else None


def load_settings(
    kubeconfig: str | None, *, environ: Mapping[str, str] | None = None
) -> KubeSettings:
    """Load the settings with the official loaders; blocking; KubeConfigError on failure.

    Only ``load_kube_config`` and ``load_incluster_config`` read configuration. We
    never parse a kubeconfig, so contexts, exec plugins, embedded certificates and
    ``tokenFile`` behave as in kubectl's Python sibling.

    Source (docs/configuration.md, ``kubeconfig``): a path given, that kubeconfig.
    None and ``KUBERNETES_SERVICE_HOST`` set: the in-cluster service account.
    Otherwise the loader's default (``$KUBECONFIG`` or ``~/.kube/config``).

    ``kubernetes`` is imported here only. It costs about 0.17 s, which a daemon with
    ``[kubernetes]`` disabled must not pay. Every loader failure is
    :class:`~supervisor.kube.errors.KubeConfigError`, chained to the loader's exception.
    """
    env = os.environ if environ is None else environ
    try:
        # Deliberately lazy: see the docstring above.
        import yaml  # type: ignore[import-untyped]
        from kubernetes import client as k8s_client
        from kubernetes import config as _k8s_config
    except ImportError as exc:  # pragma: no cover - a packaging error
        raise KubeConfigError(f"the kubernetes package is not installed: {exc}") from exc

    # The loaders are untyped; treat the module as dynamic.
    k8s_config: Any = _k8s_config
    cfg = k8s_client.Configuration()
    try:
        if kubeconfig is None and env.get("KUBERNETES_SERVICE_HOST"):
            source = "in-cluster service account"
            k8s_config.load_incluster_config(client_configuration=cfg)
        else:
            path = os.path.expanduser(kubeconfig) if kubeconfig is not None else None
            source = f"kubeconfig {path or '(default)'}"
            k8s_config.load_kube_config(
                config_file=path, client_configuration=cfg, persist_config=False
            )
    except (
        k8s_config.ConfigException, yaml.YAMLError, OSError, ValueError, KeyError, TypeError
    ) as exc:
        raise KubeConfigError(f"cannot load Kubernetes configuration: {exc}") from exc

    return KubeSettings(
        host=str(cfg.host).rstrip("/"),
        source=source,
        verify=bool(cfg.verify_ssl),
        ca_file=cfg.ssl_ca_cert or None,
        cert_file=cfg.cert_file or None,
        key_file=cfg.key_file or None,
        tls_server_name=getattr(cfg, "tls_server_name", None) or None,
        proxy=cfg.proxy or None,
        authorization=_header(cfg),
        refresh=functools.partial(_header, cfg) if cfg.refresh_api_key_hook is not None else None,
    )


#: Loading credentials (a kubeconfig's exec plugin runs a subprocess) ends within this.
CREDENTIALS_DEADLINE_S = 30.0


async def load_settings_async(kubeconfig: str | None, *,
                              timeout_s: float = CREDENTIALS_DEADLINE_S) -> KubeSettings:
    """:func:`load_settings` in a worker thread of the client's own limit, within ``timeout_s``.

    Exec plugins run subprocesses, so it needs a thread and a deadline. Past the
    deadline: :class:`~supervisor.kube.errors.KubeConfigError`.
    """
    # A hung exec plugin must not block its caller; the thread finishes on its own
    # (its token given back then) and its result is dropped.
    try:
        return await in_thread(partial(load_settings, kubeconfig), dependency="kube",
                               deadline_s=timeout_s, what="the Kubernetes credentials")
    except ThreadDeadline as exc:
        raise KubeConfigError(f"loading the Kubernetes configuration took more than "
                              f"{timeout_s:g} s (an exec plugin or a file that does not "
                              "answer); the next request tries again") from exc
