"""The generated pages list everything the code has: nothing skipped, nothing stale.

Regeneration equality (tests/unit/test_docsgen.py) proves a page matches its
generator; these prove each generator reads all of its source: a skipped metric,
subcommand, option, route, column or label fails here. The ``/status`` page is
written from a catalogue (``docs_catalog.STATUS_KEYS``), so it is held to the
keys of a real document served by the admin app.
"""

from __future__ import annotations

import ast
import sqlite3
from typing import Any

import msgspec
import trio

from supervisor import cli
from supervisor.admin.app import AdminApp
from supervisor.commands import common
from supervisor.controlplane import migrations
from supervisor.events import EVENT_TYPES
from supervisor.fanout import labels
from supervisor.fanout.children import KINDS
from supervisor.fanout.status import FanoutStatus
from supervisor.lifecycle import signals
from supervisor.status_doc import StatusDocument
from supervisor.telemetry import Metrics
from tests.adminserver import make_ctx
from tools import docs_catalog, docsgen
from tools.docsgen import adminapi, controlplane, kubernetes, process, sourcescan
from tools.docsgen.common import DOCS


def section(text: str, heading: str) -> str:
    """The part of ``text`` under ``heading`` (a Markdown heading line), up to the next one."""
    level = heading.split(" ", 1)[0]
    start = text.index(heading + "\n")
    rest = text[start + len(heading) + 1:]
    ends = [i for i in (rest.find("\n" + level + " "),) if i >= 0]
    return rest[:min(ends)] if ends else rest


def row(text: str, first_cell: str) -> str:
    """The table row whose first cell is ``first_cell`` (exactly one)."""
    found = [line for line in text.splitlines() if line.startswith(f"| {first_cell} |")]
    assert len(found) == 1, (first_cell, found)
    return found[0]


# -- the set of pages -------------------------------------------------------------


def test_docs_holds_exactly_the_generated_and_the_hand_written_pages() -> None:
    from tools.docsgen.index import HAND_WRITTEN

    assert {p.name for p in DOCS.glob("*.md")} == set(docsgen.PAGES) | set(HAND_WRITTEN)
    assert not set(HAND_WRITTEN) & set(docsgen.PAGES)
    text = docsgen.render_index(docsgen.PAGES)
    for name, says in HAND_WRITTEN.items():
        assert f"- [{name}]({name}): {says}" in text


def test_the_index_lists_every_page_with_its_summary() -> None:
    text = docsgen.render_index(docsgen.PAGES)
    for name in docsgen.PAGES:
        if name != "README.md":
            assert name in docs_catalog.PAGES, f"summarise {name} in docs_catalog.PAGES"
            assert f"- [{name}]({name}): {docs_catalog.PAGES[name]}" in text
    assert set(docs_catalog.PAGES) == set(docsgen.PAGES) - {"README.md"}


# -- /status: the catalogue against a real document ----------------------------------


async def status_document(ctx: Any) -> dict[str, Any]:
    """GET /status from the real admin app."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/status", "headers": []}
    with trio.fail_after(5):
        await AdminApp(ctx)(scope, receive, send)
    assert sent[0]["status"] == 200
    doc: dict[str, Any] = msgspec.json.decode(sent[1]["body"])
    return doc


def key_paths(doc: dict[str, Any]) -> set[str]:
    """The document's keys as the catalogue spells them: ``children.<name>.state``.

    A level is "by name" where the catalogue says so (a ``<...>`` part).
    """
    placeholders = {k.split(".")[0]: k.split(".")[1] for k in docs_catalog.STATUS_KEYS
                    if k.count(".") == 2 and k.split(".")[1].startswith("<")}
    paths = set(doc)
    for top, value in doc.items():
        # A count by dependency name, described in its own row (and process-wide: another
        # test's abandoned thread may show in it).
        if not isinstance(value, dict) or top == "threads_past_deadline":
            continue
        if top in placeholders:
            for entry in value.values():
                paths |= {f"{top}.{placeholders[top]}.{k}" for k in entry}
        else:
            paths |= {f"{top}.{k}" for k in value}
    return paths


async def test_status_has_exactly_the_documented_top_level_keys() -> None:
    doc = await status_document(make_ctx())
    documented = {k for k in docs_catalog.STATUS_KEYS if "." not in k}
    assert set(doc) == documented, "update docs_catalog.STATUS_KEYS (and regenerate docs/)"


async def test_status_keys_at_every_level_are_documented() -> None:
    ctx = make_ctx()
    plain = key_paths(await status_document(ctx))
    # Every optional key present: follower mode, skewed parents, a refusal.
    ctx.state.upstream = "http://upstream:9464"
    ctx.fanout["Workflow"] = FanoutStatus("preflight", "schema_skew", 0, ["bad-one"])
    ctx.revision.failed(7, "projection", "unknown alias")
    full = key_paths(await status_document(ctx))
    documented = set(docs_catalog.STATUS_KEYS)
    assert plain <= full
    assert full == documented, (
        f"undocumented: {full - documented}; documented but absent: {documented - full}")
    page = docsgen.render_admin_api()
    for key in documented:
        assert row(page, f"`{key}`")


def test_every_route_of_the_app_is_on_the_page_with_its_method() -> None:
    page = docsgen.render_admin_api()
    routes = adminapi.routes()
    assert {path for _, path, _ in routes} == set(docs_catalog.ADMIN_ROUTES)
    assert ("POST", "/v1/converge", True) in routes
    assert ("WS", "/v1/stream", True) in routes
    assert ("GET, HEAD", "/healthz", False) in routes
    for method, path, token in routes:
        line = next(x for x in page.splitlines() if x.startswith(f"| {method} | `{path}` |"))
        assert ("when set" if token else "never") in line


def test_every_stream_event_struct_is_documented_with_its_emitters() -> None:
    events = adminapi.all_stream_events()
    assert set(events) == set(EVENT_TYPES) == {"published", "rejected", "status"}
    assert all(emitters for _, _, emitters in events.values()), events
    page = docsgen.render_admin_api()
    line = row(page, "`rejected`")
    for key in ("active", "detail", "reason", "revision"):
        assert f"`{key}`" in line
    assert "`supervisor.convergence.reporting`" in line


def test_the_source_scanners_read_literals_names_and_conditionals() -> None:
    tree = ast.parse(
        "def f(self, events, ok):\n"
        "    self.events.emit(One(x=1))\n"
        "    events.emit(Two(a=1, b=2))\n"
        "    why = 'Bad' if ok else 'Worse'\n"
        "    self.reporter.event(obj, 'Warning', why, 'text')\n"
        "    self.reporter.event(obj, 'Normal', 'Fine', 'text')\n"
    )
    assert sorted(sourcescan.emitted_events(tree)) == ["One", "Two"]
    assert sorted(sourcescan.kube_event_reasons(tree)) == [
        ("Normal", "Fine"), ("Warning", "Bad"), ("Warning", "Worse")]


# -- metrics ---------------------------------------------------------------------------


def test_every_metric_and_label_value_of_the_registry_is_on_the_page() -> None:
    page = docsgen.render_metrics()
    families = list(Metrics(process=False).registry.collect())
    assert len(families) >= 20
    for family in families:
        series = {"counter": f"{family.name}_total", "histogram": f"{family.name}_bucket"}.get(
            family.type, family.name)
        line = next((x for x in page.splitlines() if f"`{series}`" in x), None)
        assert line is not None, f"{series} missing from metrics.md"
        assert f"| {family.type} |" in line
        assert family.name.startswith("supervisor_")
        for sample in family.samples:
            for label, value in sample.labels.items():
                if label not in ("le", "version"):
                    assert f"`{label}`: " in line and f"`{value}`" in line, (series, value)


def test_a_label_without_preset_values_is_still_named() -> None:
    line = next(x for x in docsgen.render_metrics().splitlines()
                if "`supervisor_child_restarts_total`" in x)
    assert "`child`: any" in line


# -- commands and exit codes ----------------------------------------------------------


def test_every_subcommand_and_option_of_the_parser_is_on_the_page() -> None:
    page = docsgen.render_commands()
    parser = cli._parser()
    subcommands = process.subcommands(parser)
    assert all(callable(sub.get_default("handler")) for sub in subcommands.values())
    for name, sub in subcommands.items():
        part = section(page, f"## {name}")
        assert f"trio-supervisor {name}" in part
        for action in sub._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}" in part, f"{name} {flag} missing from commands.md"
            if not action.option_strings:
                assert f"| `{process._metavar(action)}` |" in part, (name, action.dest)


def test_every_exit_code_and_the_errors_that_lead_to_it() -> None:
    page = docsgen.render_exit_codes()
    constants = process.exit_constants()
    assert constants == {n: getattr(common, n) for n in dir(common) if n.startswith("EXIT_")}
    for name, value in constants.items():
        assert row(page, f"`{value}`").startswith(f"| `{value}` | `{name}` |")
    mapped = {kind: exit_name for kinds, exit_name in process.exception_exits()
              for kind in kinds}
    assert mapped["ConfigError"] == "EXIT_USAGE"
    assert mapped["UsageError"] == "EXIT_USAGE"
    assert mapped["BootRefused"] == "EXIT_REFUSED"
    assert mapped["StartError"] == "EXIT_ERROR"
    assert mapped["SupervisionGaveUp"] == "EXIT_GAVE_UP"
    for kind, exit_name in mapped.items():
        assert row(page, f"`{kind}`").startswith(f"| `{kind}` | `{constants[exit_name]}` |")


def test_every_handled_signal_is_described() -> None:
    page = docsgen.render_exit_codes()
    for sig in signals.HANDLED:
        assert sig.name in docs_catalog.SIGNALS
        assert row(page, f"`{sig.name}`")


# -- control plane --------------------------------------------------------------------


def test_the_parsed_schema_is_what_the_migrations_create() -> None:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        migrations.migrate_sqlite(conn)
        parsed = controlplane.schema("sqlite")
        for table, found in parsed.items():
            columns = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
            assert list(found.columns) == columns, table
        real = {r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")}
        assert real - {migrations.MIGRATIONS_TABLE} == set(parsed)
    finally:
        conn.close()


def test_both_backends_have_the_same_tables_and_every_column_is_described() -> None:
    pg, lite = controlplane.schema("postgresql"), controlplane.schema("sqlite")
    assert {t: list(c.columns) for t, c in pg.items()} == {
        t: list(c.columns) for t, c in lite.items()}
    described = {f"{t}.{c}" for t, table in pg.items() for c in table.columns}
    assert described == set(docs_catalog.CONTROL_PLANE_COLUMNS)
    assert set(pg) == set(docs_catalog.CONTROL_PLANE_TABLES)
    page = docsgen.render_control_plane()
    assert "`supervisor_desired_notify(channel)`" in page
    for table, found in pg.items():
        part = section(page, f"## `{table}`")
        for column in found.columns:
            assert row(part, f"`{column}`")


# -- Kubernetes -----------------------------------------------------------------------


def test_every_kind_label_and_resource_is_on_the_page() -> None:
    page = docsgen.render_kubernetes()
    for kind in KINDS:
        part = section(page, f"### `{kind.kind}`")
        assert f"`apiVersion: {kind.resource.api_version}`" in part
        assert f"plural `{kind.resource.plural}`" in part
        for key in labels.labels("p", kind.lineage_key, "i"):
            assert row(page, f"`{key}`")
    for resource, _ in kubernetes.resources().values():
        assert f"| `{resource.kind}` | `{resource.api_version}` | `{resource.plural}` |" in page
    others = set(kubernetes.group_keys()) - {
        k for kind in KINDS for k in labels.labels("p", kind.lineage_key, "i")}
    assert others == set(docs_catalog.KUBE_KEYS)


def test_the_contract_event_reasons_and_conditions_are_found() -> None:
    page = docsgen.render_kubernetes()
    found = {reason for _, tree in sourcescan.modules()
             for _, reason in sourcescan.kube_event_reasons(tree)}
    assert {"Applied", "ApplyFailed", "Invalid", "DriftRepaired"} <= found
    for reason in found:
        assert row(section(page, "## Events"), f"`{reason}`")
    for condition in ("Ready", "Available"):
        assert condition in docs_catalog.KUBE_CONDITIONS
        assert row(page, f"`{condition}`")


def test_every_sd_notify_line_sent_is_described() -> None:
    page = section(docsgen.render_exit_codes(), "## Under systemd")
    keys = {key for _, tree in sourcescan.modules()
            for key, _ in sourcescan.notify_messages(tree)}
    assert {"READY", "STATUS", "STOPPING", "WATCHDOG"} <= keys
    assert keys == set(docs_catalog.SYSTEMD)
    assert "`READY=1`" in page and "`WATCHDOG=1`" in page


def test_the_control_plane_page_has_its_sections() -> None:
    page = docsgen.render_control_plane()
    for heading in ("## NOTIFY", "## The desired pointer", "## Follower mode",
                    "## How a read fails"):
        assert section(page, heading).strip()
    for rule in (*docs_catalog.POINTER_RULES, *docs_catalog.FOLLOWER):
        assert f"- {rule}\n" in page


async def test_real_status_documents_decode_strictly_into_the_declared_struct() -> None:
    """The Structs are the contract: a real document (plain, and with every optional
    part present) decodes into them with unknown keys refused, and back unchanged."""
    ctx = make_ctx()
    plain = await status_document(ctx)
    ctx.state.upstream = "http://upstream:9464"
    ctx.fanout["Workflow"] = FanoutStatus("preflight", "schema_skew", 0, ["bad-one"])
    ctx.revision.failed(7, "projection", "unknown alias")
    full = await status_document(ctx)
    for doc in (plain, full):
        decoded = msgspec.convert(doc, StatusDocument)
        assert msgspec.to_builtins(decoded) == doc
    assert full["revision"]["upstream"] == "http://upstream:9464"


def test_the_status_catalogue_describes_exactly_the_declared_fields() -> None:
    assert list(adminapi.status_fields()) == list(docs_catalog.STATUS_KEYS)
