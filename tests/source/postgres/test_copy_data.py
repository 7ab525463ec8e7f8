"""Reading the replication stream in bulk: the compiled loop (``_copy_data``) against
its Python twin on scripted ``get_copy_data`` results, and the socket wait that makes
mid-batch reads worth their syscall (:mod:`tidemark.source.postgres.socket_fill`), on a
real TCP connection."""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tidemark.source.postgres import copy_data
from tidemark.source.postgres.copy_data import (
    GOT_EMPTY,
    GOT_END,
    GOT_LIMIT,
    GOT_OTHER,
    read_copy_python,
)
from tidemark.source.postgres.socket_fill import FILL_BYTES, SocketFill


def _xlog(start: int, payload: bytes) -> memoryview:
    return memoryview(b"w" + struct.pack(">QQq", start, 7, -1) + payload)


KEEPALIVE = memoryview(b"k" + struct.pack(">QqB", 99, 5, 1))
SCRIPT: list[tuple[int, Any]] = [
    (len(m), m) for m in (_xlog(1, b"B..."), _xlog(2, b""), _xlog(2**64 - 1, b"\x00\xff"))
] + [(0, b""), (len(KEEPALIVE), KEEPALIVE), (5, memoryview(b"wshrt")), (-1, b""),
     (len(_xlog(3, b"x")), _xlog(3, b"x")), (-2, b"")]


def _run(read: Any, limit: int) -> list[tuple[int, Any, list[tuple[bytes, int]]]]:
    """Every call of *read* over SCRIPT until it ends: (status, message bytes, batch)."""
    script = iter(SCRIPT)
    calls: list[tuple[int, int]] = []

    def get(n: int) -> tuple[int, Any]:
        calls.append((n, 0))
        return next(script, (-1, b""))

    out: list[tuple[int, Any, list[tuple[bytes, int]]]] = []
    while len(out) < 20:
        batch: list[tuple[bytes, int]] = []
        status, message = read(get, batch, limit)
        out.append((status, None if message is None else bytes(message), batch))
        if status == GOT_END and len(calls) > len(SCRIPT):
            break
    assert all(n == 1 for n, _ in calls)
    return out


@pytest.mark.skipif(not copy_data.COMPILED_COPY, reason="_copy_data is not built")
@pytest.mark.parametrize("limit", [1, 2, 100])
def test_compiled_loop_reads_as_the_python_loop(limit: int) -> None:
    expected = _run(read_copy_python, limit)
    assert _run(copy_data.read_copy, limit) == expected
    statuses = {status for status, _, _ in expected}
    assert {GOT_EMPTY, GOT_END, GOT_OTHER} <= statuses
    assert (GOT_LIMIT in statuses) == (limit < 3)
    batches = [pair for _, _, batch in expected for pair in batch]
    assert batches == [(b"B...", 1), (b"", 2), (b"\x00\xff", 2**64 - 1), (b"x", 3)]


@pytest.fixture
def tcp_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A connected (sender, receiver) pair of TCP sockets on the loopback."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        sender = socket.create_connection(server.getsockname())
        receiver, _ = server.accept()
    with contextlib.closing(sender), contextlib.closing(receiver):
        receiver.setblocking(False)
        yield sender, receiver


def _readable(sock: socket.socket) -> bool:
    return bool(select.select([sock], [], [], 0)[0])


def test_fill_waits_for_a_worthwhile_read_and_leaves_the_socket_as_it_was(
        tcp_pair: tuple[socket.socket, socket.socket]) -> None:
    sender, receiver = tcp_pair
    fill = SocketFill(receiver.fileno())
    try:
        sender.sendall(b"x" * 100)
        deadline = time.monotonic() + 10
        while not _readable(receiver):  # the bytes arrived: one byte wakes select
            assert time.monotonic() < deadline
        fill.wait(0.01)  # fewer than FILL_BYTES: returns at the timeout
        assert _readable(receiver)  # SO_RCVLOWAT is back at one byte
        sender.sendall(b"y" * FILL_BYTES)
        started = time.monotonic()
        fill.wait(30)  # returns once FILL_BYTES are there, not at the timeout
        assert time.monotonic() - started < 30
        received = b""
        with contextlib.suppress(BlockingIOError):
            while len(received) < 100 + FILL_BYTES:
                received += receiver.recv(65536)
        assert received == b"x" * 100 + b"y" * FILL_BYTES
    finally:
        fill.close()
    receiver.sendall(b"still open")  # closing the fill left the connection's socket
    assert sender.recv(100) == b"still open"
