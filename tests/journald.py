"""A journald stand-in: a unix datagram socket the test binds, and the native protocol parsed."""

from __future__ import annotations

import fcntl
import os
import socket
import struct
from pathlib import Path

import trio


def parse_datagram(data: bytes) -> dict[str, bytes]:
    """``KEY=value`` lines and the length-prefixed form (``KEY\\n`` <u64 le> value ``\\n``)."""
    fields: dict[str, bytes] = {}
    at = 0
    while at < len(data):
        end = data.index(b"\n", at)
        line = data[at:end]
        if b"=" in line:
            key, _, value = line.partition(b"=")
            fields[key.decode()] = value
            at = end + 1
        else:
            (size,) = struct.unpack("<Q", data[end + 1:end + 9])
            fields[line.decode()] = data[end + 9:end + 9 + size]
            assert data[end + 9 + size:end + 10 + size] == b"\n"
            at = end + 10 + size
    return fields


class Journal:
    """Binds ``path``; :meth:`receive` is the next datagram's fields."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.entries: list[dict[str, bytes]] = []

    async def bind(self) -> None:
        await self.sock.bind(str(self.path))

    async def receive(self) -> dict[str, bytes]:
        """The next entry: a datagram's payload, or, as journald reads an entry too large
        for one, the contents of the sealed memfd it carries."""
        data, ancillary, _, _ = await self.sock.recvmsg(1 << 20, socket.CMSG_SPACE(4))
        fds = [fd for level, kind, raw in ancillary
               if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
               for fd in struct.unpack(f"{len(raw) // 4}i", raw)]
        if fds:
            assert data == b"" and len(fds) == 1
            seals = fcntl.fcntl(fds[0], fcntl.F_GET_SEALS)
            assert seals & fcntl.F_SEAL_WRITE, "journald takes a sealed memfd only"
            try:  # from its start, as journald maps it: the offset is the sender's
                data = os.pread(fds[0], os.fstat(fds[0]).st_size, 0)
            finally:
                os.close(fds[0])
        fields = parse_datagram(data)
        self.entries.append(fields)
        return fields

    async def wait_for(self, **fields: str) -> dict[str, bytes]:
        """The next entry whose fields have these values."""
        while True:
            entry = await self.receive()
            if all(entry.get(k) == v.encode() for k, v in fields.items()):
                return entry

    def close(self) -> None:
        self.sock.close()
