"""A reader whose own previous walsender still holds the slot (a network cut the server
has not noticed) ends it and opens the slot at once: with reconnect_max_attempts = 0
(no retries) it must not fail on the slot it has just freed."""

from __future__ import annotations

import contextlib

from conftest import Database
from tidemark.source.postgres import wal_reads as wal
from tidemark.source.postgres.config import PostgresSourceConfig
from tidemark.source.postgres.reader import PostgresReader
from tidemark.source.postgres.replication import ReplicationStream


def test_a_reader_opens_the_slot_it_freed_from_its_old_walsender(db: Database) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    slot, publication = f"s_{db.name}", f"p_{db.name}"
    db.autocommit(f"CREATE PUBLICATION {publication} FOR TABLE t")
    with contextlib.closing(wal.connect(db.dsn, purpose="test")) as conn:
        conn.autocommit = True
        lsn = wal.ensure_slot(conn, slot)
    old = ReplicationStream(db.dsn, slot, publication)
    old.start(lsn)  # the walsender the server keeps after the cut
    (old_pid,) = old.backend_pids
    reader = PostgresReader(PostgresSourceConfig.from_mapping({
        "dsn": db.dsn, "slot_name": slot, "publication_name": publication,
        "table_include_list": ["public.t"], "reconnect_max_attempts": 0}),
        previous_backends=old.backend_pids)
    stream = ReplicationStream(db.dsn, slot, publication, backend_pids=reader._own_backends)
    try:
        reader._open_with_retry(stream, lsn)
        holder = db.scalar("SELECT active_pid FROM pg_replication_slots "
                           "WHERE slot_name = %s", (slot,))
        assert holder is not None and holder != old_pid
    finally:
        stream.close()
        with contextlib.suppress(Exception):
            old.close()
        reader.stop()
