"""Connections to MariaDB share PyMySQL's default TLS context (made once per process,
not per connection: it loads the system's CA certificates); the binlog stream reads
its packets itself, an event longer than one packet included, and a broken stream as
a lost connection."""

from __future__ import annotations

import contextlib
import socket
from typing import Any

import pymysql
import pytest

from conftest import MariaDatabase
from tidemark.errors import SourceUnavailableError
from tidemark.source.mariadb import binlog as b
from tidemark.source.mariadb import client
from tidemark.source.mariadb.position import BinlogPosition


def test_connections_share_the_default_tls_context(mdb: MariaDatabase) -> None:
    settings = client.parse_url(mdb.dsn)
    first, second = client.connect(settings), client.connect(settings)
    with contextlib.closing(first), contextlib.closing(second):
        assert first.ctx is second.ctx  # type: ignore[attr-defined]
        with first.cursor() as cur:  # and both work
            cur.execute("SELECT 1")
            assert cur.fetchone() == (1,)


def test_an_event_longer_than_a_packet_arrives_whole(mdb: MariaDatabase) -> None:
    """An event of more than 16 MiB comes in several packets; the stream joins them."""
    settings = client.parse_url(mdb.dsn)
    admin = client.connect(settings)
    with contextlib.closing(admin), admin.cursor() as cur:
        cur.execute("SET GLOBAL max_allowed_packet = 64 * 1024 * 1024")
    conn = client.connect(settings)
    with contextlib.closing(conn), conn.cursor() as cur:
        cur.execute("CREATE TABLE big (id INT PRIMARY KEY, v LONGTEXT)")
        start = client.current_position(conn)
        cur.execute("INSERT INTO big VALUES (1, REPEAT('x', 17 * 1024 * 1024))")
        end = client.current_position(conn)
    decoder = b.EventDecoder()
    with client.BinlogStream(settings, start, server_id=4242, blocking=False) as stream:
        decoder.checksum = stream.checksum
        sizes = []
        for event in stream.events():
            header, body = decoder.split(event)
            if header.type in b.ROWS_EVENTS:
                sizes.append(len(body))
            if header.next_position >= end.pos:
                break
    assert len(sizes) == 1 and sizes[0] > 17 * 1024 * 1024, sizes


def _stream_over(sock: socket.socket) -> client.BinlogStream:
    """A binlog stream past its dump command, reading *sock*: PyMySQL's connection over
    a socket whose other end the test writes as the server would."""
    stream = client.BinlogStream(client.parse_url("mariadb://u:p@127.0.0.1:1/db"),
                                 BinlogPosition("b.000001", 4), server_id=4242)
    conn: Any = pymysql.Connection(host="127.0.0.1", defer_connect=True, read_timeout=10)
    conn._sock, conn._rfile = sock, sock.makefile("rb")
    conn._next_seq_id, conn._current_timeout = 1, None  # the dump command was 0
    stream._conn = conn
    return stream


def test_an_empty_packet_is_a_lost_connection() -> None:
    """A packet of no bytes (not even the OK byte) is no event: the stream broke, which
    capture retries, as it does a connection the server closed."""
    ours, server = socket.socketpair()
    with contextlib.closing(server):
        stream = _stream_over(ours)
        try:
            server.sendall(b"\x05\x00\x00\x01" + b"\x00" + b"abcd")  # an event
            server.sendall(b"\x00\x00\x00\x02")  # an empty packet
            events = stream.events()
            assert next(events) == b"abcd"
            with pytest.raises(SourceUnavailableError, match="empty packet"):
                next(events)
        finally:
            stream.close()
