"""``docs/admin-api.md``: routes, the ``/status`` document, the stream's messages.

- Routes: the route table of a real :class:`~supervisor.admin.app.AdminApp`, with
  the method each answers (``POST`` for the converge path, WebSocket for the
  stream path, ``GET``/``HEAD`` otherwise, as the app dispatches) and whether it
  needs the token (:data:`~supervisor.admin.app.OPEN_PATHS`); what each answers
  is prose in :data:`tools.docs_catalog.ADMIN_ROUTES`.
- ``/status``: every field of :class:`~supervisor.status_doc.StatusDocument`
  (walked with :func:`status_fields`) with its type, and the prose of
  :data:`tools.docs_catalog.STATUS_KEYS`, which the tests hold to the same
  fields and to a real document's keys.
- Stream events: the Structs of :mod:`supervisor.events` (their keys, types
  and docstrings), with the modules that emit each (found by
  :func:`~tools.docsgen.sourcescan.emitted_events`).
"""

from __future__ import annotations

import msgspec
import msgspec.inspect

from supervisor.admin import app as admin_app
from supervisor.admin import routes as admin_routes
from supervisor.admin import stream
from supervisor.admin.context import AdminContext
from supervisor.convergence.status import RevisionStatus
from supervisor.events import EVENT_TYPES, EventBus
from supervisor.sinks.state import ActiveState
from supervisor.status_doc import StatusDocument
from supervisor.telemetry import Metrics
from tools import docs_catalog
from tools.docsgen.common import HEADER, UNDESCRIBED, code, table
from tools.docsgen.sourcescan import emitted_events, modules

__all__ = ["all_stream_events", "render_admin_api", "routes", "status_fields"]

# What the event bus stamps on every event (supervisor/events.py, EventBus.emit).
BUS_KEYS = ("type", "seq", "at")


def context() -> AdminContext:
    """A context with nothing running, enough to build the app and a /status document."""
    state = ActiveState()
    return AdminContext(state=state, revision=RevisionStatus(state, clock=lambda: 0.0),
                        events=EventBus(), metrics=Metrics(process=False),
                        children=lambda: {})


def routes() -> list[tuple[str, str, bool]]:
    """(method, path, needs the token) of every route of the admin app, in table order."""
    app = admin_app.AdminApp(context())
    found = []
    for path in app._routes:
        if path == admin_routes.CONVERGE_PATH:
            method = "POST"
        elif path == admin_routes.STREAM_PATH:
            method = "WS"
        else:
            method = admin_app.ALLOW.decode()
        found.append((method, path, path not in admin_app.OPEN_PATHS))
    return found


def all_stream_events() -> dict[str, tuple[dict[str, str], str, set[str]]]:
    """Event type → (key → type, what it means, modules emitting it), from the Structs."""
    emitters: dict[str, set[str]] = {}
    for module, tree in modules():
        for name in emitted_events(tree):
            emitters.setdefault(name, set()).add(module)
    found = {}
    for type_, struct in EVENT_TYPES.items():
        keys = {field.name: _field_type(field, "only when it changed")
                for field in msgspec.inspect.type_info(struct).fields  # type: ignore[attr-defined]
                if field.name not in BUS_KEYS}
        doc = " ".join((struct.__doc__ or UNDESCRIBED).split()).replace("``", "`")
        found[type_] = (keys, doc, emitters.get(struct.__name__, set()))
    return found


_SCALARS = {msgspec.inspect.IntType: "integer", msgspec.inspect.FloatType: "number",
            msgspec.inspect.StrType: "string", msgspec.inspect.BoolType: "boolean",
            msgspec.inspect.NoneType: "null"}


def _field_type(field: msgspec.inspect.Field, unset: str) -> str:
    """A Struct field's type in words; ``unset`` follows it for a field sent only sometimes."""
    info = field.type
    names = []
    for kind in info.types if isinstance(info, msgspec.inspect.UnionType) else (info,):
        if isinstance(kind, msgspec.inspect.LiteralType):
            names.append("one of " + ", ".join(f"`{v}`" for v in kind.values))
        elif isinstance(kind, msgspec.inspect.StructType | msgspec.inspect.DictType):
            names.append("object")
        elif isinstance(kind, msgspec.inspect.ListType):
            names.append("list")
        else:
            names.append(_SCALARS.get(type(kind), "any"))
    shown = " or ".join(names)
    # Not required and no default: an UNSET field, present only sometimes.
    if not field.required and field.default is msgspec.NODEFAULT:
        shown += f" ({unset})"
    return shown


# How the placeholder of each dict-of-Structs field is written in key paths.
PLACEHOLDERS = {"children": "<name>", "fanout": "<kind>"}


def status_fields(struct: type[msgspec.Struct] = StatusDocument,
                  prefix: str = "") -> dict[str, str]:
    """Key path → type of every field of the ``/status`` Structs, in declaration order."""
    found: dict[str, str] = {}
    for field in msgspec.inspect.type_info(struct).fields:  # type: ignore[attr-defined]
        path = f"{prefix}{field.name}"
        info = field.type
        kinds = info.types if isinstance(info, msgspec.inspect.UnionType) else (info,)
        nested = [k for k in kinds if isinstance(k, msgspec.inspect.StructType)]
        values = [k.value_type for k in kinds if isinstance(k, msgspec.inspect.DictType)
                  and isinstance(k.value_type, msgspec.inspect.StructType)]
        # last_rejection, statement and hook: objects described in their own row.
        if nested and field.name not in ("last_rejection", "statement", "hook"):
            found[path] = "object"
            found.update(status_fields(nested[0].cls, f"{path}."))
        elif values:
            found[path] = "object"
            found.update(status_fields(values[0].cls,
                                       f"{path}.{PLACEHOLDERS.get(field.name, '<key>')}."))
        else:
            found[path] = _field_type(field, "only when it applies")
    return found


def render_admin_api() -> str:
    settings = stream.StreamSettings()
    out = [HEADER, "# Admin API\n\n",
           "HTTP and WebSocket on `[admin].listen` (see [configuration.md]"
           "(configuration.md#admin)). When `[admin].token_file` is set, every route that "
           "says so needs `Authorization: Bearer <token>` (401 otherwise, before routing, so "
           "nothing reveals which paths exist); the token of `[admin].read_token_file` passes "
           "on every route but `POST /v1/converge`, which answers it 403 `read_only`. A `Host` "
           "the server is not known by gets 421; a WebSocket handshake or a `POST` whose "
           "`Origin` is not the listener's own (scheme, host, port) nor in "
           "`[admin].allowed_origins` gets 403 `forbidden_origin`. HTTP/1.1 only (a request "
           "head over 16 KiB is answered 431 `head_too_large`, a body over 64 KiB 413 "
           "`body_too_large`, a request framed by both `Content-Length` and `Transfer-Encoding` "
           "400 `bad_request`, each ending its connection); with "
           "`[admin].tls_cert_file` HTTPS and WSS (mutual TLS with `client_ca_file`). "
           "The WebSocket handshake negotiates no extension (`permessage-deflate` is "
           "refused); a client message over 64 KiB closes the stream with 1009. "
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
           table(("key", "type", "meaning"),
                 [(code(key), kind, docs_catalog.STATUS_KEYS.get(key, UNDESCRIBED))
                  for key, kind in status_fields().items()]),
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
    for type_, (keys, doc, mods) in sorted(all_stream_events().items()):
        rows.append((code(type_),
                     "; ".join(f"{code(k)}: {kind}" for k, kind in keys.items()) or "—",
                     doc, ", ".join(code(m) for m in sorted(mods)) or "—"))
    out.append(table(("type", "keys", "when", "emitted by"), rows))
    return "".join(out)
