"""Shared by the store tests: a minimal revision body and a store for a URL."""

from __future__ import annotations

import json
from typing import Any

from supervisor.config import ControlPlaneConfig
from supervisor.controlplane.factory import open_store
from supervisor.controlplane.store import ControlPlaneStore


def doc(**extra: Any) -> bytes:
    return json.dumps({"schema_version": 1, "aliases": {}, **extra}).encode()


def make_store(url: str, **cp: Any) -> ControlPlaneStore:
    statement_timeout_s = cp.pop("statement_timeout_s", 10.0)
    return open_store(
        ControlPlaneConfig(url=url, **cp), max_schema_version=1,
        statement_timeout_s=statement_timeout_s,
    )
