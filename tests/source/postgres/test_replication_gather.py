"""How long ``ReplicationStream.read_batch`` gathers a batch once it has messages: at
most its gathering time (50 ms), whatever the pace of what follows.

The walsender's pace is what matters here, and a real one cannot be held to a steady
trickle below the reader's 2 ms pause (its commits come in bursts and gaps), so the
stream's bytes come from a process writing CopyData frames to a TCP socket, at the pace
the test sets, and the connection's two libpq calls the reader makes are served from that
socket. Everything else, the bulk reader and the socket fill waits included, is the
reader's own.
"""

from __future__ import annotations

import multiprocessing
import socket
import struct
import time
from multiprocessing.synchronize import Event

from tidemark.source.postgres.replication import ReplicationStream
from tidemark.source.postgres.socket_fill import SocketFill
from waiting import wait_for


class _SocketConnection:
    """``consume_input`` and ``get_copy_data`` of a libpq connection, over a socket."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffer = bytearray()
        self.socket = sock.fileno()

    def consume_input(self) -> None:
        try:
            data = self._sock.recv(65536)
        except BlockingIOError:
            return
        if not data:
            raise ConnectionError("the sender closed the stream")
        self._buffer += data

    def get_copy_data(self, _async: int) -> tuple[int, memoryview]:
        if len(self._buffer) < 5:
            return 0, memoryview(b"")
        size = struct.unpack(">I", self._buffer[1:5])[0]
        if len(self._buffer) < 1 + size:
            return 0, memoryview(b"")
        message = bytes(self._buffer[5:1 + size])
        del self._buffer[:1 + size]
        return len(message), memoryview(message)

    def put_copy_data(self, _data: bytes) -> int:
        return 1

    def flush(self) -> int:
        return 0


def _xlog(lsn: int) -> bytes:
    payload = b"w" + struct.pack(">QQq", lsn, lsn, 0) + b"I" + b"x" * 80
    return b"d" + struct.pack(">I", len(payload) + 4) + payload


def _send(port: int, stop: Event) -> None:
    """A burst of 400 messages, then one every 0.5 ms (less than a socket fill in 2 ms,
    and never a 2 ms pause) until told to stop, for at most 10 s."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"".join(_xlog(i) for i in range(1, 401)))
        lsn = 401
        end = time.monotonic() + 10
        while not stop.is_set() and time.monotonic() < end:
            time.sleep(0.0005)
            sock.sendall(_xlog(lsn))
            lsn += 1


def test_a_batch_is_handed_on_within_its_gathering_time_under_a_trickle() -> None:
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    with socket.create_server(("127.0.0.1", 0)) as server:
        sender = context.Process(target=_send, args=(server.getsockname()[1], stop))
        sender.start()
        peer, _ = server.accept()
    try:
        peer.setblocking(False)
        stream = ReplicationStream("host=unused", "slot", "publication")
        connection = _SocketConnection(peer)
        stream._conn = connection  # type: ignore[assignment]
        stream._streaming = True
        stream._fill = SocketFill(peer.fileno())
        stream._last_status = stream._last_received = time.monotonic()

        def burst_at_hand() -> bool:
            connection.consume_input()
            return len(connection._buffer) >= 400 * 105

        wait_for(burst_at_hand, 30, "the burst read before the batch", interval_s=0.001)
        started = time.monotonic()
        batch = stream.read_batch(1_000_000, 0.2)
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        sender.join(timeout=30)
        peer.close()
    assert len(batch) >= 400
    # Gathering lasts 50 ms. Before the fix, the reads that wait for a socket fill
    # soaked up the pauses that end a batch, and it grew until max_messages or a pause
    # of 4 ms in the trickle (on a loaded 2-core machine: 0.1-4.4 s, mostly over 1 s).
    assert elapsed < 1.0, f"read_batch held {len(batch)} messages for {elapsed:.1f} s"
