"""A fake Kubernetes API server over real HTTP on loopback, for tests.

No kube-apiserver can run here and tests never patch the client: they point it at
this server (``server.url``, plain HTTP, optional bearer token). It is an ASGI app
served by hypercorn's trio worker inside the caller's trio run
(:func:`run_fake_apiserver`), or as its own process
(``python -m tests.fakes.apiserver --port 0 --ready-file PATH``) driven over
``/_fake/...`` control endpoints (:class:`FakeControl`).

Real (behaves as a kube-apiserver does):

* Paths: ``/api/v1/namespaces[/{name}]``, ``/api/v1/namespaces/{ns}/{services,configmaps}``,
  ``/apis/apps/v1/.../deployments``, ``/apis/batch/v1/.../cronjobs``,
  ``/apis/platform.trio-supervisor.dev/v1/.../{servicedefinitions,workflows}`` with
  ``/status``, ``/apis/coordination.k8s.io/v1/.../leases`` (election tests:
  :mod:`tests.fakes.leases`); all-namespace lists and watches (``/apis/apps/v1/deployments``), the legacy
  ``/watch/`` prefix, discovery (``/api``, ``/apis``, ``/api/v1``, ``/apis/{g}/{v}``), ``/version``.
  Uninstalled CRDs 404 with a ``Status`` body and vanish from discovery.
* ``metadata.uid``, ``creationTimestamp``, ``resourceVersion`` from one global counter
  (strings), ``generation`` bumped only when something outside metadata and status changes.
* Lists: ``kind: <Kind>List``, items with kind/apiVersion, ``metadata.resourceVersion``,
  ``limit``/``continue`` (+ ``remainingItemCount``), ``labelSelector`` (``=``, ``==``, ``!=``,
  ``k``, ``!k``, ``in``, ``notin``), ``fieldSelector`` on metadata.name/namespace. A list in a
  missing namespace is empty.
* Watches: chunked newline-delimited JSON events after ``resourceVersion`` (no RV or
  ``0``: synthetic ADDED events for the current state first), selectors applied (an object
  leaving the selector is sent as DELETED, entering as ADDED), ``timeoutSeconds`` ends the stream
  cleanly, ``allowWatchBookmarks`` gives BOOKMARK events every ``bookmark_interval_s``, an RV
  older than the history window (see ``compact()``) gives an ``ERROR`` event carrying a 410
  ``Expired`` Status and the stream ends. DELETED objects carry the deletion's RV.
  ``compact()`` expires every RV handed out so far (and moves the RV on by one, so a fresh
  list gives a watchable RV); so does falling out of the ``history_limit`` window. A list with
  ``resourceVersionMatch=Exact`` and an expired RV, or an expired ``continue``, is a 410 too.
* An RV newer than the server's (after ``reset_state()``, an etcd restore): a watch from it
  waits up to ``too_large_rv_wait_s`` for the server to reach it (kube-apiserver's watch cache
  waits 3 s), then, as the watch cache does, answers 200 with one ``ERROR`` event carrying a
  504 ``Timeout`` Status (``Timeout: Too large resource version: N, current: M``, cause
  ``ResourceVersionTooLarge``, ``retryAfterSeconds: 1``) and ends the stream; client-go logs
  it as "watch of ... ended with: Timeout: Too large resource version". A list with such a
  non-zero ``resourceVersion`` gets the same Status as an HTTP 504 after the same wait.
* Writes: POST (201; 409 AlreadyExists; 404 when the namespace does not exist), PUT with the
  ``resourceVersion`` precondition (409 Conflict), PATCH merge-patch / JSON-patch /
  apply-patch+yaml (JSON or YAML body, ``fieldManager`` required, ``force``), DELETE (returns the
  object; ``preconditions`` honoured; deleting a namespace deletes its contents at once),
  DELETE on a collection (deletecollection), ``dryRun=All``. ``/status`` writes change only
  ``.status``; writes to the main resource ignore ``.status``. A write that changes nothing
  (identical content and field ownership, e.g. a repeated apply) does not bump the RV or the
  generation and sends no watch event.
* Server-side apply with per-manager field ownership (``metadata.managedFields``, FieldsV1):
  a manager's apply removes the fields it stopped applying (unless someone else owns them);
  changing a field another manager owns is a 409 ``Conflict`` with ``FieldManagerConflict``
  causes unless ``force=true``; update operations (PUT/merge patch/create) take ownership of
  the fields they change, so an apply after someone's "kubectl edit" conflicts.
* Defaulting (``defaulting=True``): Deployment replicas/revisionHistoryLimit/
  progressDeadlineSeconds/strategy, Service type/sessionAffinity/clusterIP(s)/ports protocol and
  targetPort, CronJob suspend/concurrencyPolicy/history limits and Job backoffLimit/completions/
  parallelism/completionMode/suspend, pod templates (restartPolicy, dnsPolicy, schedulerName,
  securityContext, terminationGracePeriodSeconds; containers' imagePullPolicy, resources,
  terminationMessagePath/Policy, ports protocol), ServiceDefinition replicas=1, Namespace phase
  and ``kubernetes.io/metadata.name`` label. So "skip the write when nothing changed" must not
  compare live specs with desired ones naively.
* Validation (``validation=True``, 422 Invalid Status with causes): names, label keys/values,
  Deployment selector present/matching the template/immutable, containers with name and image,
  Service ports, CronJob schedule and a job restartPolicy of OnFailure/Never, the CRD specs'
  types (ServiceDefinition image:str required, replicas:int, port:int, env:map[str]str; Workflow
  image and schedule required, args:[]str).
* Held requests (``hold()``): received, then served as usual once released, against the
  state of that moment, as a write slow on the wire is.
* Auth: bearer token (401 Status), ``set_token`` rotates it; ``deny()`` gives 403 Forbidden with
  the real message shape. Errors are ``Status`` objects throughout.

Simplified (documented gaps):

* Lists are not snapshots: a ``continue`` token resumes after the last key against the current
  state (it does 410 once the history is compacted past it); ``resourceVersion`` on a list is
  otherwise ignored (always "latest").
* Field ownership is at leaf granularity with atomic lists (true for CRDs without list-type
  markers; built-in associative lists such as containers are treated as atomic). Strategic merge
  patch is treated as a JSON merge patch for built-in resources (415 for CRDs, as real).
* No finalizers, graceful deletion, Terminating namespaces, ownerReference GC, admission,
  controllers (tests write Deployment status themselves with ``set_status``), protobuf, CBOR,
  ``sendInitialEvents``, or watch-cache RV semantics beyond "events after RV".
* A stalled watch (``stall_watches``) ignores its ``timeoutSeconds`` and bookmarks until
  unstalled or closed, as a stream hung behind a load balancer would; what queued meanwhile
  is delivered on ``unstall_watches``.
* One user for RBAC messages; no impersonation, no client certificates, no TLS.

Test helpers: ``wait_until(predicate)`` / ``wait_for_watches(n, plural)`` wait without fixed
sleeps; ``requests`` (:class:`RecordedRequest`), ``count()``, ``find_requests()``,
``writes()``; direct state access ``get/objects/create/apply/patch/set_status/delete/put_raw``;
``reset_state()`` wipes everything and restarts the RV counter (the RV goes backwards).

The fake is split by concern; this module runs it and re-exports the names tests import:
:mod:`~tests.fakes.apiserver_app` (:class:`FakeApiServer`, the ASGI app and request
handling), ``apiserver_state`` (direct state access), ``apiserver_faults`` (injections,
auth, deny rules, stalled watches), ``apiserver_watch`` (watch streams),
``apiserver_routing`` (REST paths and verbs), ``apiserver_discovery``,
``apiserver_control`` (``/_fake/...`` and :class:`FakeControl`), ``apiserver_requests``
(the request log), ``apiserver_http`` (ASGI plumbing); the store side is
``apiserver_store`` (objects, RVs, history, ``DEFAULT_RESOURCES``), ``apiserver_writes``,
``apiserver_apply`` (field ownership), ``apiserver_patches``, ``apiserver_selectors``,
``apiserver_validation``, ``apiserver_defaults``, ``apiserver_errors`` and
``apiserver_resources``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any, Protocol, cast

import trio

from tests.fakes.apiserver_app import FakeApiServer, log
from tests.fakes.apiserver_control import FakeControl
from tests.fakes.apiserver_faults import DEFAULT_USER, DenyRule, Hold, Injection
from tests.fakes.apiserver_http import Receive, Scope, Send
from tests.fakes.apiserver_requests import RecordedRequest
from tests.fakes.apiserver_store import (
    CRD_GROUP,
    DEFAULT_RESOURCES,
    ApiError,
    Obj,
    ResourceType,
    Store,
    WatchEvent,
    fields_match,
    labels_match,
    parse_field_selector,
    parse_label_selector,
    reason_for,
    status_body,
    too_large_resource_version,
)

# --------------------------------------------------------------------------------------
# Running it


@contextlib.asynccontextmanager
async def run_fake_apiserver(
    *,
    token: str | None = None,
    bookmark_interval_s: float = 1.0,
    namespaces: Iterable[str] = ("trio-supervisor", "apps"),
    crds_installed: bool = True,
    defaulting: bool = True,
    validation: bool = True,
    history_limit: int = 10_000,
    too_large_rv_wait_s: float = 0.1,
    host: str = "127.0.0.1",
    port: int = 0,
    resources: Iterable[ResourceType] = DEFAULT_RESOURCES,
) -> AsyncIterator[FakeApiServer]:
    """Serve a :class:`FakeApiServer` on ``host:port`` (port 0: the OS picks) inside the
    caller's trio run; ``server.url`` is set on entry, everything stops on exit."""
    from hypercorn.config import Config
    from hypercorn.trio import serve

    server = FakeApiServer(token=token, bookmark_interval_s=bookmark_interval_s,
                           namespaces=namespaces, crds_installed=crds_installed,
                           defaulting=defaulting, validation=validation,
                           history_limit=history_limit, too_large_rv_wait_s=too_large_rv_wait_s,
                           resources=resources)
    config = Config()
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("tests.fakes.apiserver.hypercorn")
    config.graceful_timeout = 1.0
    config.keep_alive_timeout = 30.0
    shutdown = trio.Event()

    async def _trigger() -> None:
        await shutdown.wait()

    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status: serve(cast(Any, server), config, shutdown_trigger=_trigger,
                                      task_status=task_status))
        server.url = binds[0]
        try:
            yield server
        finally:
            server._closing.set()
            server.close_watches()
            shutdown.set()
            nursery.cancel_scope.deadline = trio.current_time() + 3.0


class _HasUrl(Protocol):
    url: str
    token: str | None


def write_kubeconfig(server: _HasUrl, path: str | os.PathLike[str], *,
                     token_file: str | None = None, namespace: str = "trio-supervisor") -> None:
    """Write a kubeconfig (JSON, valid YAML) that ``kubernetes.config.load_kube_config``
    accepts, pointing at ``server.url`` over plain HTTP; the user has ``tokenFile`` when
    given, else ``server.token`` (or no credentials)."""
    user: Obj = {}
    if token_file is not None:
        user["tokenFile"] = os.fspath(token_file)
    elif server.token is not None:
        user["token"] = server.token
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": server.url}}],
        "users": [{"name": "fake", "user": user}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake",
                                                  "namespace": namespace}}],
        "current-context": "fake",
        "preferences": {},
    }
    Path(path).write_text(json.dumps(config, indent=2) + "\n")


# --------------------------------------------------------------------------------------
# Process mode


def _write_ready(path: str, url: str) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as fh:
        fh.write(url + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


async def _serve_process(args: argparse.Namespace) -> None:
    namespaces = [n for n in args.namespaces.split(",") if n]
    async with run_fake_apiserver(token=args.token, bookmark_interval_s=args.bookmark_interval,
                                  namespaces=namespaces, crds_installed=not args.no_crds,
                                  too_large_rv_wait_s=args.too_large_rv_wait,
                                  host=args.host, port=args.port) as server:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            if args.ready_file:
                _write_ready(args.ready_file, server.url)
            print(server.url, flush=True)
            async for _ in signals:
                break


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fakes.apiserver",
                                     description="Fake Kubernetes API server for tests.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ready-file", help="write the URL here once listening")
    parser.add_argument("--token", help="require this bearer token")
    parser.add_argument("--bookmark-interval", type=float, default=1.0)
    parser.add_argument("--namespaces", default="trio-supervisor,apps",
                        help="comma-separated namespaces to create")
    parser.add_argument("--no-crds", action="store_true", help="start with the CRDs absent")
    parser.add_argument("--too-large-rv-wait", type=float, default=0.1,
                        help="seconds a watch or list from a future resourceVersion waits "
                             "before its 'Too large resource version' error")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    trio.run(_serve_process, args)
    return 0


__all__ = [
    "CRD_GROUP",
    "DEFAULT_RESOURCES",
    "DEFAULT_USER",
    "ApiError",
    "DenyRule",
    "FakeApiServer",
    "FakeControl",
    "Hold",
    "Injection",
    "Obj",
    "Receive",
    "RecordedRequest",
    "ResourceType",
    "Scope",
    "Send",
    "Store",
    "WatchEvent",
    "fields_match",
    "labels_match",
    "log",
    "main",
    "parse_field_selector",
    "parse_label_selector",
    "reason_for",
    "run_fake_apiserver",
    "status_body",
    "too_large_resource_version",
    "write_kubeconfig",
]


if __name__ == "__main__":
    sys.exit(main())
