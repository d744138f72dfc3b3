"""The admin server's connection limits and its table (pure logic, real socket pairs)."""

from __future__ import annotations

import errno
import socket

import trio
import trio.testing
from structlog.testing import capture_logs

from supervisor.admin.accept import AcceptLoop
from supervisor.admin.connections import ConnectionTable
from supervisor.admin.limits import derive


def test_limits_keep_a_reserve_and_headroom_below_nofile() -> None:
    limits = derive(1024, 4096)
    assert limits.reserve == 128 and limits.max_connections == 896
    assert limits.max_stream_clients < limits.max_connections
    assert limits.stream_clients_lowered  # 4096 stream clients cannot fit in 1024 descriptors
    roomy = derive(65536, 4096)
    assert roomy.max_stream_clients == 4096 and not roomy.stream_clients_lowered
    assert derive(None, 10).max_stream_clients == 10
    tiny = derive(32, 4096)
    assert tiny.max_connections >= 16 and tiny.max_stream_clients >= 1


def _conn(table: ConnectionTable, port: int, pool: str = ConnectionTable.MAIN) -> tuple[
        trio.SocketStream, socket.socket, socket.socket]:
    ours, theirs = socket.socketpair()
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
    table.add(("127.0.0.1", port), stream, ours, pool)
    return stream, ours, theirs


async def test_full_table_evicts_the_longest_idle_connection_without_pending_bytes() -> None:
    table = ConnectionTable(3, reserved=1, reserve_admits=lambda head: head.startswith(b"GET /h"))
    first = _conn(table, 1)
    second = _conn(table, 2)
    third = _conn(table, 3)
    table.set_idle(("127.0.0.1", 3), third[0], False)  # busy: never evicted
    first[2].send(b"GET / HTTP/1.1\r\n")  # its request is waiting: passed over
    assert table.make_room()
    assert table.get(("127.0.0.1", 2)) is None  # the longest idle without pending bytes
    assert second[1].fileno() == -1  # closed (reset)
    assert table.get(("127.0.0.1", 1)) is first[0]
    _conn(table, 4)
    table.set_idle(("127.0.0.1", 4), table.get(("127.0.0.1", 4)), False)  # type: ignore[arg-type]
    table.set_idle(("127.0.0.1", 1), first[0], False)
    assert not table.make_room()  # all busy: the main pool refuses
    assert table.make_room(ConnectionTable.RESERVE)  # the reserve has a slot
    for _, ours, theirs in (first, second, third):
        ours.close()
        theirs.close()


async def test_reserve_does_not_evict_a_connection_just_accepted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    table = ConnectionTable(1, reserved=1)
    probe = _conn(table, 9, ConnectionTable.RESERVE)
    assert not table.make_room(ConnectionTable.RESERVE)  # too young to be judged idle
    await trio.sleep(1)
    assert table.make_room(ConnectionTable.RESERVE)  # idle for a second: it goes
    assert probe[1].fileno() == -1
    probe[2].close()


class _OutOfDescriptors:
    """A listening socket whose accept fails with EMFILE ``failures`` times, then
    has nothing to accept until :meth:`connect` queues one connection. Readable
    exactly when accept has something to say (a real socket pair's fd)."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0
        self.queued: list[socket.socket] = []
        self._ours, self._theirs = socket.socketpair()
        self._ours.setblocking(False)
        self._theirs.send(b"x")

    def fileno(self) -> int:
        return self._ours.fileno()

    def connect(self) -> socket.socket:
        with socket.create_server(("127.0.0.1", 0)) as server:
            theirs = socket.create_connection(server.getsockname())
            ours, _ = server.accept()
        self.queued.append(ours)
        self._theirs.send(b"x")
        return theirs

    def accept(self) -> tuple[socket.socket, object]:
        self.calls += 1
        if self.calls <= self.failures:
            raise OSError(errno.EMFILE, "Too many open files")
        if self.queued:
            return self.queued.pop(), None
        try:
            while self._ours.recv(64):
                pass
        except BlockingIOError:
            pass
        raise BlockingIOError

    def close(self) -> None:
        self._ours.close()
        self._theirs.close()


async def test_accept_errors_are_logged_once_per_streak_with_a_count(
    autojump_clock: trio.testing.MockClock,
) -> None:
    listener = _OutOfDescriptors(failures=50)
    admitted: list[object] = []
    loop = AcceptLoop(
        listener, ConnectionTable(4), lambda peer, stream, pool: admitted.append(peer)  # type: ignore[arg-type]
    )
    with capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(loop.run)
            await trio.sleep(30)  # 50 failures, 0.1 s apart, then quiet
            client = listener.connect()
            await trio.sleep(1)
            nursery.cancel_scope.cancel()
    listener.close()
    client.close()
    failing = [e for e in logs if e["event"] == "admin accept failing"]
    recovered = [e for e in logs if e["event"] == "admin accept recovered"]
    assert len(failing) == 1 and failing[0]["error"] == "EMFILE"
    # Each retry is two failed accepts: the loop's own, and the one made with the
    # spare descriptor let go (to refuse the waiting client), which fails too.
    assert len(recovered) == 1 and recovered[0]["count"] == 25
    assert len(admitted) == 1


async def test_a_waiting_probe_is_answered_by_the_accept_loop_even_when_every_slot_is_busy(
) -> None:
    """A probe's complete head waiting at accept is answered at once (no slot, no
    handler task); anything else takes the usual path: held, or refused when full."""
    from supervisor.admin.app import AdminApp
    from tests.adminserver import make_ctx

    app = AdminApp(make_ctx())
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]
    table = ConnectionTable(1)  # one slot, taken by a busy connection
    busy = _conn(table, 1)
    table.set_idle(("127.0.0.1", 1), busy[0], False)
    spawned: list[object] = []
    loop = AcceptLoop(listener, table, lambda peer, stream, pool: spawned.append(peer),
                      app.answer_at_once)

    def client(head: bytes) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(head)
        return sock

    probe = client(b"GET /healthz HTTP/1.1\r\nHost: 10.0.0.1:9464\r\nUser-Agent: kube-probe"
                   b"\r\nConnection: close\r\n\r\n")
    head_probe = client(b"HEAD /healthz HTTP/1.1\r\nhost: x\r\nconnection: Close\r\n\r\n")
    keep_alive = client(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    other = client(b"GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    # Connected and sent: all four wait in the backlog, heads included.
    assert loop._accept_batch() is False
    answer = b""
    probe.settimeout(5)
    while chunk := probe.recv(4096):
        answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and b"connection: close" in head
    assert b"content-type: application/json" in head and body == b'{"ok":true}', answer
    head_probe.settimeout(5)
    headed = head_probe.recv(4096)
    assert headed.startswith(b"HTTP/1.1 200 ") and headed.endswith(b"\r\n\r\n")
    assert b"content-length: 11" in headed
    # The keep-alive probe and the other route found the only slot busy: refused,
    # not answered from the accept loop.
    assert spawned == []
    for sock in (keep_alive, other):
        sock.settimeout(5)
        try:
            assert sock.recv(4096) == b""
        except ConnectionResetError:
            pass
        sock.close()
    for sock in (probe, head_probe, listener, busy[1], busy[2]):
        sock.close()
