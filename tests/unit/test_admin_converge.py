"""POST /v1/converge on the ASGI app, called directly, with a real change signal.

A stand-in loop takes wake-ups off the signal and answers them the way the
convergence loop does (one answer per consumed wake-up, after its "attempt").
"""

from __future__ import annotations

from typing import Any

import msgspec
import trio
import trio.testing

from supervisor.admin.app import AdminApp
from supervisor.convergence.signal import ChangeSignal, ConvergeAnswer
from tests.adminserver import make_ctx

TOKEN = "s3cr3t-token"
AUTH = [(b"authorization", f"Bearer {TOKEN}".encode())]


class Loop:
    """Answers every wake-up with the next answer after ``attempt_s`` of (virtual) time."""

    def __init__(self, signal: ChangeSignal, attempt_s: float = 1.0) -> None:
        self.signal = signal
        self.attempt_s = attempt_s
        self.attempts = 0

    async def run(self) -> None:
        while True:
            wakeup = await self.signal.next_wakeup()
            self.attempts += 1
            await trio.sleep(self.attempt_s)
            wakeup.resolve(ConvergeAnswer("published", self.attempts))


class Client:
    """One HTTP exchange; ``disconnect_after`` makes the client hang up while waiting."""

    def __init__(self, disconnect_after: float | None = None) -> None:
        self.sent: list[dict[str, Any]] = []
        self.disconnect_after = disconnect_after
        self._body_sent = False

    async def receive(self) -> dict[str, Any]:
        if not self._body_sent:
            self._body_sent = True
            return {"type": "http.request", "body": b"", "more_body": False}
        if self.disconnect_after is None:
            await trio.sleep_forever()
        await trio.sleep(self.disconnect_after)
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    async def call(self, app: AdminApp, method: str = "POST", path: str = "/v1/converge",
                   headers: list[tuple[bytes, bytes]] | None = None,
                   query: bytes = b"") -> tuple[int, dict[bytes, bytes], Any] | None:
        scope = {"type": "http", "method": method, "path": path, "query_string": query,
                 "headers": AUTH if headers is None else headers}
        await app(scope, self.receive, self.send)
        if not self.sent:
            return None
        body = self.sent[1]["body"]
        return self.sent[0]["status"], dict(self.sent[0]["headers"]), (
            msgspec.json.decode(body) if body else None)


def app_with(signal: ChangeSignal | None) -> AdminApp:
    ctx = make_ctx(token=TOKEN)
    ctx.converge = None if signal is None else signal.converge
    return AdminApp(ctx)


async def test_answers_the_attempt_outcome(autojump_clock: trio.testing.MockClock) -> None:
    signal = ChangeSignal()
    loop = Loop(signal)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(loop.run)
        started = trio.current_time()
        answered = await Client().call(app_with(signal))
        assert answered is not None
        status, headers, doc = answered
        assert status == 200 and headers[b"cache-control"] == b"no-store"
        assert doc == {"outcome": "published", "revision": 1, "reason": None}
        assert trio.current_time() - started >= 1.0  # answered after the attempt, not before
        nursery.cancel_scope.cancel()


async def test_ten_concurrent_requests_share_one_attempt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    signal = ChangeSignal()
    loop = Loop(signal)
    app = app_with(signal)
    docs: list[Any] = []

    async def one() -> None:
        answered = await Client().call(app)
        assert answered is not None
        docs.append(answered[2])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(loop.run)
        signal.notify("sighup")  # attempt 1 runs for a second
        await trio.testing.wait_all_tasks_blocked()
        async with trio.open_nursery() as clients:
            for _ in range(10):
                clients.start_soon(one)
        nursery.cancel_scope.cancel()
    assert docs == [{"outcome": "published", "revision": 2, "reason": None}] * 10
    assert loop.attempts == 2


async def test_a_client_that_disconnects_does_not_disturb_the_loop(
    autojump_clock: trio.testing.MockClock,
) -> None:
    signal = ChangeSignal()
    loop = Loop(signal, attempt_s=5.0)
    app = app_with(signal)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(loop.run)
        gone = Client(disconnect_after=0.5)
        assert await gone.call(app) is None  # returned at the hang-up, nothing sent
        assert gone.sent == []
        assert trio.current_time() < 1.0
        # The loop finishes the abandoned request's attempt and serves the next caller.
        answered = await Client().call(app)
        assert answered is not None and answered[0] == 200
        assert answered[2]["revision"] == 2
        nursery.cancel_scope.cancel()


async def test_deadline_method_token_and_no_loop(autojump_clock: trio.testing.MockClock) -> None:
    signal = ChangeSignal()  # nobody takes wake-ups: every wait runs into its deadline
    app = app_with(signal)
    answered = await Client().call(app, query=b"timeout_s=2.5")
    assert answered is not None and answered[0] == 504
    assert answered[2]["error"] == "timeout" and "2.5 s" in answered[2]["detail"]
    for bad in (b"timeout_s=0", b"timeout_s=nan", b"timeout_s=301", b"timeout_s=x"):
        answered = await Client().call(app, query=bad)
        assert answered is not None and answered[0] == 400, bad
    answered = await Client().call(app, method="GET")
    assert answered is not None and answered[0] == 405 and answered[1][b"allow"] == b"POST"
    answered = await Client().call(app, headers=[])
    assert answered is not None and answered[0] == 401
    answered = await Client().call(app, headers=[(b"authorization", b"Bearer wrong")])
    assert answered is not None and answered[0] == 401
    assert signal.requests == 1  # only the authorised, well-formed request reached the loop
    answered = await Client().call(app_with(None))
    assert answered is not None and answered[0] == 503


async def test_the_read_token_reads_but_its_post_is_refused_403(
    autojump_clock: trio.testing.MockClock,
) -> None:
    signal = ChangeSignal()
    app = app_with(signal)
    app.ctx.read_token = "read-only-token"
    read = [(b"authorization", b"Bearer read-only-token")]
    answered = await Client().call(app, headers=read)
    assert answered is not None and answered[0] == 403
    assert answered[2]["error"] == "read_only"
    assert answered[1][b"connection"] == b"close"
    assert signal.requests == 0  # nothing reached the loop
    answered = await Client().call(app, method="GET", path="/status", headers=read)
    assert answered is not None and answered[0] == 200
    answered = await Client().call(app, method="GET", path="/status",
                                   headers=[(b"authorization", b"Bearer read-only-tokeN")])
    assert answered is not None and answered[0] == 401
