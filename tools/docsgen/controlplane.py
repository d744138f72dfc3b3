"""``docs/control-plane.md``: the schema, read from the migrations that create it.

The SQL files of :mod:`supervisor.controlplane.migrations` are parsed
(``CREATE TABLE`` and ``ALTER TABLE ... ADD COLUMN``, in version order), per
backend, so a new migration shows up here; the NOTIFY trigger comes from the
migration runner's constants and the configuration's default channel; how a
read fails from :class:`~supervisor.controlplane.errors.FailureCategory`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from supervisor.config import ControlPlaneConfig
from supervisor.controlplane import migrations
from supervisor.controlplane.checks import observe_sql
from supervisor.controlplane.errors import ControlPlaneError, FailureCategory
from tools import docs_catalog
from tools.docsgen.common import HEADER, UNDESCRIBED, code, table

__all__ = ["Column", "render_control_plane", "schema"]

_CREATE = re.compile(r"CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)\s*\((.*?)\)\s*;",
                     re.S | re.I)
# ``ADD CONSTRAINT name ...`` adds no column.
_ADD = re.compile(r"ALTER\s+TABLE\s+(\w+)\s+ADD\s+(?!CONSTRAINT\b)(?:COLUMN\s+)?"
                  r"(?:IF\s+NOT\s+EXISTS\s+)?"
                  r"(\w+)\s+([^;]*?)\s*;", re.S | re.I)
_FUNCTION = re.compile(r"CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+(\w+)", re.I)
_TABLE_CONSTRAINT = ("PRIMARY", "FOREIGN", "UNIQUE", "CHECK", "CONSTRAINT", "EXCLUDE")


@dataclass
class Column:
    name: str
    definition: str
    version: int


@dataclass
class Table:
    name: str
    columns: dict[str, Column] = field(default_factory=dict)


def _strip_comments(sql: str) -> str:
    return re.sub(r"--[^\n]*", "", sql)


def _split_top_level(body: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in body:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [" ".join(p.split()) for p in parts if p.strip()]


def schema(backend: migrations.Backend) -> dict[str, Table]:
    """Table name → columns, as the backend's migrations leave them, in creation order."""
    tables: dict[str, Table] = {}
    for migration in migrations.load_migrations(backend):
        sql = _strip_comments(migration.sql)
        for name, body in _CREATE.findall(sql):
            found = tables.setdefault(name, Table(name))
            for part in _split_top_level(body):
                column, _, definition = part.partition(" ")
                if column.upper() in _TABLE_CONSTRAINT:
                    continue
                found.columns[column] = Column(column, definition, migration.version)
        for name, column, definition in _ADD.findall(sql):
            tables.setdefault(name, Table(name)).columns[column] = Column(
                column, " ".join(definition.split()), migration.version)
    return tables


def notify_function() -> str | None:
    """The trigger function the PostgreSQL migrations create (None: none)."""
    for migration in migrations.load_migrations("postgresql"):
        match = _FUNCTION.search(_strip_comments(migration.sql))
        if match:
            return match.group(1)
    return None


def render_control_plane() -> str:
    pg, lite = schema("postgresql"), schema("sqlite")
    out = [HEADER, "# Control plane\n\n",
           "The tables a replica reads its desired revision from, as the migrations in "
           "`supervisor/controlplane/migrations/` create them (`trio-supervisor db migrate`, "
           "idempotent; applied versions are recorded in "
           f"`{migrations.MIGRATIONS_TABLE}`). PostgreSQL is the production store; the "
           "embedded SQLite store mirrors it. Schema version "
           f"{migrations.latest_version('postgresql')} (PostgreSQL), "
           f"{migrations.latest_version('sqlite')} (SQLite).\n"]
    for name in [*pg, *(n for n in lite if n not in pg)]:
        out.append(f"\n## `{name}`\n\n")
        out.append(docs_catalog.CONTROL_PLANE_TABLES.get(name, UNDESCRIBED) + "\n\n")
        columns = [*pg.get(name, Table(name)).columns,
                   *(c for c in lite.get(name, Table(name)).columns
                     if c not in pg.get(name, Table(name)).columns)]
        rows = []
        for column in columns:
            p = pg.get(name, Table(name)).columns.get(column)
            s = lite.get(name, Table(name)).columns.get(column)
            since = min(c.version for c in (p, s) if c is not None)
            rows.append((code(column), code(p.definition) if p else "—",
                         code(s.definition) if s else "—", str(since),
                         docs_catalog.CONTROL_PLANE_COLUMNS.get(f"{name}.{column}",
                                                               UNDESCRIBED)))
        out.append(table(("column", "PostgreSQL", "SQLite", "since", "meaning"), rows))
    channel = ControlPlaneConfig().channel
    function = notify_function()
    out.append("\n## NOTIFY\n\n"
               f"PostgreSQL only. The trigger `{migrations.TRIGGER_NAME}` on "
               f"`supervisor_desired` (after insert or update, each row) runs "
               f"`{function}(channel)`, which sends `NOTIFY <channel>` with the revision id "
               "as payload, at commit. The channel is `[control_plane].channel` (default "
               f"`{channel}`); `db migrate` re-points the trigger when it changes. SQLite has "
               "no NOTIFY: replicas on it converge by polling alone. A notification is only "
               "a hint that wakes the loop early; polling every `poll_interval_s` is the "
               "correctness path.\n")
    out.append("\n## The desired pointer\n\n")
    out.append("".join(f"- {rule}\n" for rule in docs_catalog.POINTER_RULES))
    out.append(f"\nEvery poll reads the pointer and its body's digest with:\n\n```sql\n"
               f"{observe_sql()}\n```\n")
    out.append("\n## Follower mode\n\n")
    out.append("".join(f"- {rule}\n" for rule in docs_catalog.FOLLOWER))
    out.append("\n## How a read fails\n\n"
               "Every store failure carries one category; the reason label is what "
               "`/status`, the log and the metrics show ([reasons.md](reasons.md)). A "
               "retryable failure is tried again with backoff; the others wait for someone "
               "to repair something (or a new publish).\n\n")
    failures = []
    for category in FailureCategory:
        error = ControlPlaneError("", category=category)
        failures.append((code(category.name), code(error.reason),
                     "yes" if error.retryable else "no",
                     docs_catalog.FAILURE_CATEGORIES.get(category.name, UNDESCRIBED)))
    out.append(table(("category", "reason", "retryable", "raised for"), failures))
    return "".join(out)
