"""What a running daemon says about its health: /healthz sampled, /status read."""

from __future__ import annotations

import threading
from typing import Any

import httpx

from tests.polling import POLL_INTERVAL_S


async def status(port: int) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=5.0) as client:
        response = await client.get(f"http://127.0.0.1:{port}/status")
    return dict(response.json())


def sample_health_blocking(port: int, seen: list[tuple[int, dict[str, Any]] | None],
                           stop: threading.Event) -> None:
    with httpx.Client(timeout=2.0) as client:
        while not stop.is_set():
            try:
                response = client.get(f"http://127.0.0.1:{port}/healthz")
                seen.append((response.status_code, response.json()))
            except httpx.TransportError:
                seen.append(None)
            stop.wait(POLL_INTERVAL_S)
