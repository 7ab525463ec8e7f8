"""Connections to MariaDB share PyMySQL's default TLS context (made once per process,
not per connection: it loads the system's CA certificates); the binlog stream reads
its packets itself, an event longer than one packet included."""

from __future__ import annotations

import contextlib

from conftest import MariaDatabase
from tidemark.source.mariadb import binlog as b
from tidemark.source.mariadb import client


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
