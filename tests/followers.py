"""Follower trees for integration tests: a replica's directory, keys and configuration.

:func:`make_node` writes one replica (root or follower); :func:`status_of`,
:func:`wait_active` and :func:`wait_status` read it through its admin API;
:func:`revision_bytes` fetches its signed ``GET /v1/revision``;
:func:`document` writes a revision document that differs from the example by
one value (a different body); :func:`rss_mib` and :func:`restarts` read what a
hostile upstream could have done to the process.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from supervisor.sinks.lkg import generate_signing_key
from tests.polling import poll_until
from tests.proc import EXAMPLE, free_port, write_config

__all__ = ["POLL_S", "Node", "capture", "document", "make_node", "restarts", "revision_bytes",
           "rss_mib", "status_of", "wait_active", "wait_status"]

POLL_S = 0.3


@dataclass
class Node:
    name: str
    config: Path
    port: int
    verify_key: str
    cache: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def make_node(root: Path, name: str, url: str, trusted: list[str], *, port: int | None = None,
              key_name: str | None = None, control_plane: str = "", cache: str = "",
              poll_interval_s: float = POLL_S) -> Node:
    """A replica's directory, key and configuration; ``trusted``: the root keys it follows.

    ``control_plane`` and ``cache`` are extra lines for those sections.
    """
    directory = root / name
    directory.mkdir(exist_ok=True)
    key = root / f"{key_name or name}.key"
    if key.exists():
        verify = json.loads((root / f"{key_name or name}.pub").read_text())
    else:
        verify = generate_signing_key(str(key))
        (root / f"{key_name or name}.pub").write_text(json.dumps(verify))
    port = port or free_port()
    cache_path = directory / "cache" / "lkg.bin"
    extra = (f'[cache]\npath = "{cache_path}"\nsigning_key = "{key}"\n'
             f"trusted_keys = {json.dumps([verify])}\n{cache}\n")
    # Followers trust the root's keys for what they receive, their own for their cache.
    lines = [f"trusted_keys = {json.dumps(trusted)}"] if url.startswith("http") else []
    if control_plane:
        lines.append(control_plane)
    config = write_config(directory, url, extra, port=port, poll_interval_s=poll_interval_s,
                          backoff_initial_s=0.1, backoff_max_s=0.5,
                          control_plane_extra="\n".join(lines))
    return Node(name, config, port, verify, cache_path)


def document(directory: Path, retries: int, *, extra: str = "") -> Path:
    """The example revision with ``retries`` of its first alias changed: another body."""
    text = EXAMPLE.read_text().replace("retries = 2 ", f"retries = {retries} ", 1)
    path = directory / f"revision-{retries}.toml"
    path.write_text(text + extra)
    return path


async def status_of(node: Node) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=node.url) as http:
        return dict((await http.get("/status")).json())


async def wait_status(node: Node, predicate: Callable[[dict[str, Any]], bool]
                      ) -> dict[str, Any]:
    """The first ``/status`` for which ``predicate`` holds (the caller bounds the wait)."""
    report: dict[str, Any] = {}

    async def holds() -> bool:
        nonlocal report
        try:
            report = await status_of(node)
        except httpx.HTTPError:
            return False
        return predicate(report)

    await poll_until(holds)
    return report


async def wait_active(node: Node, revision: int) -> dict[str, Any]:
    return await wait_status(node, lambda r: bool(r["revision"]["active"] == revision))


async def revision_bytes(node: Node) -> tuple[int, bytes]:
    async with httpx.AsyncClient(base_url=node.url) as http:
        response = await http.get("/v1/revision")
        return response.status_code, response.content


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def restarts(report: dict[str, Any], child: str = "convergence") -> int:
    return int(report["children"][child]["restarts"])


async def capture(node: Node, revision: int) -> bytes:
    """The root's genuine signed statement of ``revision`` once it serves it."""
    from tests.fakes.statements import statement_of

    captured = b""

    async def serving() -> bool:
        nonlocal captured
        try:
            status, data = await revision_bytes(node)
        except httpx.HTTPError:
            return False
        if status != 200 or statement_of(data).revision != revision:
            return False
        captured = data
        return True

    await poll_until(serving)
    return captured
