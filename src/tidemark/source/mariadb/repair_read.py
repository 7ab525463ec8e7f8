"""A ``tidemark-repair``'s rows from MariaDB (:mod:`tidemark.source.repair`): the listed
keys' current rows, selected and normalised as a snapshot's are
(:func:`~tidemark.source.mariadb.snapshot.select_expression`,
:func:`~tidemark.source.mariadb.snapshot.normalizer`: the binlog decoder's text), with a
key filter."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from tidemark.event import TableId
from tidemark.source.mariadb import client
from tidemark.source.mariadb import snapshot as snap
from tidemark.source.read_plan import ChangeSink, ReadOptions
from tidemark.source.repair import RepairRead, emit_repair, key_text


def read_repair(options: ReadOptions, part: RepairRead, sink: ChangeSink) -> Iterator[None]:
    """The change rows of the partition's repairs, into *sink*."""
    conn = client.connect(client.parse_url(options.dsn), conv=client.RAW_VALUES)
    with contextlib.closing(conn):
        with conn.cursor() as cur:
            cur.execute("SET SESSION time_zone = '+00:00'")
        for request in part.requests:
            table = TableId.parse(request.table)
            columns = snap.describe(conn, table)
            normalize = [snap.normalizer(c) for c in columns]
            key = ", ".join(snap.quote(k) for k in request.key_columns)
            one = "(" + ", ".join(["%s"] * len(request.key_columns)) + ")"
            query = (f"SELECT {', '.join(snap.select_expression(c) for c in columns)} "
                     f"FROM {snap.quote(table.schema)}.{snap.quote(table.table)} "
                     f"WHERE ({key}) IN ({', '.join([one] * len(request.keys))})")
            params: list[Any] = [key_text(v) for k in request.keys for v in k]
            with conn.cursor() as cur:
                cur.execute(query, params)
                rows = [tuple(None if v is None else f(v)
                              for f, v in zip(normalize, row, strict=True))
                        for row in cur.fetchall()]
            conn.commit()
            emit_repair(sink, request, [c.name for c in columns], rows, part.commit_lsn)
            yield
