"""Connections to MariaDB share PyMySQL's default TLS context (made once per process,
not per connection: it loads the system's CA certificates)."""

from __future__ import annotations

import contextlib

from conftest import MariaDatabase
from tidemark.source.mariadb import client


def test_connections_share_the_default_tls_context(mdb: MariaDatabase) -> None:
    settings = client.parse_url(mdb.dsn)
    first, second = client.connect(settings), client.connect(settings)
    with contextlib.closing(first), contextlib.closing(second):
        assert first.ctx is second.ctx  # type: ignore[attr-defined]
        with first.cursor() as cur:  # and both work
            cur.execute("SELECT 1")
            assert cur.fetchone() == (1,)
