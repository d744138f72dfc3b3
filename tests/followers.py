"""Follower replicas as real processes.

One node of a leader-and-followers set, and the wait until it serves.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from supervisor.sinks.lkg import generate_signing_key
from tests.polling import poll_until
from tests.proc import free_port, write_config

POLL_S = 0.3


@dataclass
class Node:
    name: str
    config: Path
    port: int
    verify_key: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def make_node(root: Path, name: str, url: str, trusted: list[str], *, port: int | None = None,
              key_name: str | None = None) -> Node:
    """A replica's directory, key and configuration; ``trusted`` gets its own key added."""
    directory = root / name
    directory.mkdir(exist_ok=True)
    key = root / f"{key_name or name}.key"
    if key.exists():
        verify = json.loads((root / f"{key_name or name}.pub").read_text())
    else:
        verify = generate_signing_key(str(key))
        (root / f"{key_name or name}.pub").write_text(json.dumps(verify))
    port = port or free_port()
    extra = (f'[cache]\npath = "{directory}/cache/lkg.bin"\nsigning_key = "{key}"\n'
             f"trusted_keys = {json.dumps([*trusted, verify])}\n")
    config = write_config(directory, url, extra, port=port, poll_interval_s=POLL_S,
                          backoff_initial_s=0.1, backoff_max_s=0.5)
    return Node(name, config, port, verify)


async def status_of(node: Node) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=node.url) as http:
        return dict((await http.get("/status")).json())


async def wait_active(node: Node, revision: int) -> dict[str, Any]:
    report: dict[str, Any] = {}

    async def active() -> bool:
        nonlocal report
        try:
            report = await status_of(node)
        except httpx.HTTPError:
            return False
        return bool(report["revision"]["active"] == revision)

    await poll_until(active)
    return report
