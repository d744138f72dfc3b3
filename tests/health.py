"""What a running daemon says about its health: /healthz sampled, /status and /metrics read."""

from __future__ import annotations

import threading
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.polling import POLL_INTERVAL_S


async def status(port: int) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=5.0) as client:
        response = await client.get(f"http://127.0.0.1:{port}/status")
    return dict(response.json())


def metric_sum(text: str, name: str, **labels: str) -> float | None:
    """The sum of ``name``'s samples in a /metrics page whose labels include ``labels``.

    None when there is no such sample.
    """
    found = [sample.value for family in text_string_to_metric_families(text)
             for sample in family.samples
             if sample.name == name and labels.items() <= sample.labels.items()]
    return sum(found) if found else None


async def scrape(port: int) -> str:
    """The daemon's /metrics page."""
    async with httpx.AsyncClient(timeout=5.0) as client:
        return (await client.get(f"http://127.0.0.1:{port}/metrics")).text


async def metric(port: int, name: str, **labels: str) -> float:
    """:func:`metric_sum` of the daemon's /metrics now; 0.0 when there is no such sample."""
    return metric_sum(await scrape(port), name, **labels) or 0.0


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
