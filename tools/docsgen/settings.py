"""``docs/configuration.md`` and ``docs/revision-schema.md``, from msgspec Structs.

Types, defaults and bounds come from the JSON schema msgspec derives from the
Structs of :mod:`supervisor.config` and :mod:`supervisor.revision.document`; the
environment name from the section and key; what a key means from
:mod:`tools.docs_catalog`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from supervisor.config import ENV_PREFIX, Config
from tools import docs_catalog
from tools.docsgen.common import HEADER, UNDESCRIBED, cell, number

__all__ = ["render_configuration", "render_revision_schema", "schema_default", "schema_type"]


# -- types and bounds from a JSON schema ----------------------------------------------


def schema_type(prop: dict[str, Any]) -> str:
    if "enum" in prop:
        return "one of " + ", ".join(f'`"{v}"`' for v in sorted(prop["enum"]))
    if "anyOf" in prop:
        kinds = [schema_type(p) for p in prop["anyOf"] if p.get("type") != "null"]
        return " or ".join(kinds) + " (optional)"
    if "$ref" in prop:
        return "table `" + str(prop["$ref"]).rsplit("/", 1)[-1] + "`"
    kind = prop.get("type")
    if kind == "array":
        return f"list of {schema_type(prop.get('items', {}))}s"
    if kind == "object" and "additionalProperties" in prop:
        return f"table of NAME → {schema_type(prop['additionalProperties'])}"
    return {"number": "float", "integer": "integer", "string": "string",
            "boolean": "boolean"}.get(str(kind), str(kind))


def _bounds(prop: dict[str, Any]) -> str:
    parts = []
    for key, symbol in (("exclusiveMinimum", ">"), ("minimum", "≥"),
                        ("exclusiveMaximum", "<"), ("maximum", "≤")):
        if key in prop:
            parts.append(f"{symbol} {number(prop[key])}")
    if "minLength" in prop:
        parts.append(f"length ≥ {prop['minLength']}")
    if "maxLength" in prop:
        parts.append(f"length ≤ {prop['maxLength']}")
    if "minItems" in prop:
        parts.append(f"at least {prop['minItems']} item{'s' if prop['minItems'] > 1 else ''}")
    if "pattern" in prop:
        parts.append(f"matches `{prop['pattern']}`")
    return ", ".join(parts) or "—"


def schema_default(prop: dict[str, Any], required: bool) -> str:
    if required:
        return "required"
    if "default" not in prop or prop["default"] is None:
        return "unset"
    value = prop["default"]
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, list | dict) and not value:
        return "`[]`" if isinstance(value, list) else "`{}`"
    return f"`{number(value)}`"


# -- the pages ------------------------------------------------------------------------


def render_configuration() -> str:
    schema = msgspec.json.schema(Config)
    defs = schema["$defs"]
    out = [HEADER, "# Configuration reference\n\n",
           "TOML; unknown keys are errors (`check` suggests the closest key). Every key can "
           "be overridden from the environment as `SUPERVISOR_<SECTION>__<KEY>`; the value "
           "is read as a TOML value when it parses as one (`[\"a\"]`, `2.5`, `true`) and as "
           "a string otherwise. The file is named by `--config` or `SUPERVISOR_CONFIG`.\n"]
    for section, ref in defs["Config"]["properties"].items():
        struct = defs[ref["$ref"].rsplit("/", 1)[-1]]
        out.append(f"\n## `[{section}]`\n\n")
        out.append("| key | type | default | bounds | environment | meaning |\n")
        out.append("| --- | --- | --- | --- | --- | --- |\n")
        required = set(struct.get("required", []))
        for key, prop in struct["properties"].items():
            env = f"{ENV_PREFIX}{section.upper()}__{key.upper()}"
            text = docs_catalog.CONFIG_KEYS.get(f"{section}.{key}", UNDESCRIBED)
            default = schema_default(prop, key in required)
            out.append(f"| `{key}` | {cell(schema_type(prop))} | {cell(default)}"
                       f" | {cell(_bounds(prop))} | `{env}` | {cell(text)} |\n")
    return "".join(out)


def render_revision_schema() -> str:
    from supervisor.revision.document import SCHEMA_VERSION, RevisionDocument

    schema = msgspec.json.schema(RevisionDocument)
    defs = schema["$defs"]
    out = [HEADER, "# Revision document reference\n\n",
           f"What `trio-supervisor publish` stores and the daemon compiles; this build reads "
           f"`schema_version` up to {SCHEMA_VERSION}. TOML or JSON; unknown keys are refused "
           "(`validation`, with the `$.path`). `conf/example-revision.toml` is a complete "
           "example. A secret is a reference, `env:NAME` or `file:PATH`, resolved on the "
           "daemon's host (`secret` when it cannot be); the snapshot keeps its SHA-256, never "
           "the value. Every key's aliases must be defined (`projection` otherwise).\n"]
    titles = {"RevisionDocument": "the document (top level)",
              "AliasSpec": "`[aliases.NAME]`", "KeySpec": "`[keys.NAME]`"}
    for name, struct in defs.items():
        out.append(f"\n## {titles.get(name, name)}\n\n")
        out.append(docs_catalog.REVISION_TABLES.get(name, UNDESCRIBED) + "\n\n")
        out.append("| key | type | default | bounds | meaning |\n"
                   "| --- | --- | --- | --- | --- |\n")
        required = set(struct.get("required", []))
        for key, prop in struct["properties"].items():
            text = docs_catalog.REVISION_KEYS.get(f"{name}.{key}", UNDESCRIBED)
            out.append(f"| `{key}` | {cell(schema_type(prop))} | "
                       f"{cell(schema_default(prop, key in required))} | {cell(_bounds(prop))} | "
                       f"{cell(text)} |\n")
    return "".join(out)
