"""``docs/admin-api.md``: routes, the ``/status`` document, the stream's messages.

- Routes: the route table of a real :class:`~supervisor.admin.app.AdminApp`, with
  the method each answers (``POST`` for the converge path, WebSocket for the
  stream path, ``GET``/``HEAD`` otherwise, as the app dispatches) and whether it
  needs the token (:data:`~supervisor.admin.app.OPEN_PATHS`); what each answers
  is prose in :data:`supervisor.docs_catalog.ADMIN_ROUTES`.
- ``/status``: the keys of :data:`supervisor.docs_catalog.STATUS_KEYS`, which
  ``tests/unit/test_docsgen_pages.py`` holds equal to a real document's keys.
- Stream events: every ``events.publish("type", {...})`` in the source
  (:func:`~supervisor.docsgen.sourcescan.stream_events`), with the keys the
  event bus adds (:meth:`supervisor.events.EventBus.publish`).
"""

from __future__ import annotations

from supervisor import docs_catalog
from supervisor.admin import app as admin_app
from supervisor.admin import stream
from supervisor.admin.context import AdminContext
from supervisor.convergence.status import RevisionStatus
from supervisor.docsgen.common import HEADER, UNDESCRIBED, code, table
from supervisor.docsgen.sourcescan import modules, stream_events
from supervisor.events import EventBus
from supervisor.sinks.state import ActiveState
from supervisor.telemetry import Metrics

__all__ = ["all_stream_events", "render_admin_api", "routes"]

# What the event bus adds to every event (supervisor/events.py, EventBus.publish).
BUS_KEYS = ("type", "seq", "at")


def context() -> AdminContext:
    """A context with nothing running, enough to build the app and a /status document."""
    return AdminContext(state=ActiveState(), revision=RevisionStatus(clock=lambda: 0.0),
                        events=EventBus(), metrics=Metrics(process=False),
                        children=lambda: {})


def routes() -> list[tuple[str, str, bool]]:
    """(method, path, needs the token) of every route of the admin app, in table order."""
    app = admin_app.AdminApp(context())
    found = []
    for path in app._routes:
        if path == admin_app.CONVERGE_PATH:
            method = "POST"
        elif path == admin_app.STREAM_PATH:
            method = "WS"
        else:
            method = admin_app.ALLOW.decode()
        found.append((method, path, path not in admin_app.OPEN_PATHS))
    return found


def all_stream_events() -> dict[str, tuple[set[str], set[str]]]:
    """Event type → (payload keys, modules publishing it), found in the source."""
    found: dict[str, tuple[set[str], set[str]]] = {}
    for module, tree in modules():
        for type_, keys in stream_events(tree):
            entry = found.setdefault(type_, (set(), set()))
            entry[0].update(keys)
            entry[1].add(module)
    return found


def render_admin_api() -> str:
    settings = stream.StreamSettings()
    out = [HEADER, "# Admin API\n\n",
           "HTTP and WebSocket on `[admin].listen` (see [configuration.md]"
           "(configuration.md#admin)). When `[admin].token_file` is set, every route that "
           "says so needs `Authorization: Bearer <token>` (401 otherwise, before routing, so "
           "nothing reveals which paths exist); a `Host` the server is not known by gets 421. "
           "Every error body is JSON `{\"error\": \"<code>\", \"detail\": \"<text>\"}`; "
           "an unknown path is 404, a wrong method 405 with `Allow`.\n\n",
           "## Routes\n\n",
           table(("method", "path", "token", "answers"),
                 [(method, code(path), "when set" if token else "never",
                   docs_catalog.ADMIN_ROUTES.get(path, UNDESCRIBED))
                  for method, path, token in routes()]),
           "\n## `GET /status`\n\n",
           "One JSON object. `<name>` stands for each supervised child, `<kind>` for each "
           "fan-out kind (`ServiceDefinition`, `Workflow`).\n\n",
           table(("key", "meaning"),
                 [(code(key), text) for key, text in docs_catalog.STATUS_KEYS.items()]),
           "\n## `WS /v1/stream`\n\n",
           "Text frames, each one compact JSON object with a `type`. The first message is "
           "the current state: the `/status` document plus `\"type\": \"status\"` and "
           f"`heartbeat_s` ({settings.heartbeat_s:g} by default). Then every event below, in "
           "publish order. After `heartbeat_s` without any other message the server sends "
           "`{\"type\": \"ping\", \"at\": ...}` (not an event: `watch` does not print it). "
           f"Close code {stream.CLOSE_GOING_AWAY}: the server shuts down; "
           f"{stream.CLOSE_TOO_SLOW}: the client fell more than {settings.max_buffer} events "
           "behind and should reconnect (its first message is a fresh state).\n\n",
           "Every event carries " + ", ".join(code(k) for k in BUS_KEYS)
           + " (an increasing number and an ISO-8601 UTC time) besides the keys below.\n\n"]
    rows = []
    for type_, (keys, mods) in sorted(all_stream_events().items()):
        rows.append((code(type_), ", ".join(code(k) for k in sorted(keys)) or "—",
                     docs_catalog.STREAM_EVENTS.get(type_, UNDESCRIBED),
                     ", ".join(code(m) for m in sorted(mods))))
    out.append(table(("type", "keys", "when", "published by"), rows))
    return "".join(out)
