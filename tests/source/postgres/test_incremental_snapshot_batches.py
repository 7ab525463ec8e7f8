"""How an incremental snapshot's chunks reach the engine: batches that carry rows.

The engine waits 50 ms after a batch with nothing in it, as for an idle source. While a
snapshot's marks stream in the source is not idle, so it hands on no such batches (one
now and then all the same, for the engine's stop checks and offset saves).
"""

from __future__ import annotations

import json
import time

import pytest

from capture_helpers import drain, events, make_connector
from conftest import Database
from tidemark.event import Op

pytestmark = [pytest.mark.integration]

SIGNALS = "public.dbz_signal"


def test_windows_streaming_in_come_without_empty_batches_between_them(db: Database) -> None:
    rows, chunk = 6000, 100
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)",
               f"INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, {rows}) g",
               "CREATE TABLE dbz_signal (id varchar(42) PRIMARY KEY, type varchar(32) NOT NULL,"
               " data varchar(2048) NULL)")
    connector = make_connector(db.dsn, "public.t", snapshot_mode="no_data",
                               signal_table=SIGNALS, incremental_snapshot_chunk_size=chunk,
                               heartbeat_interval_ms=0)
    connector.start()
    try:
        drain(connector, db.insert_lsn())
        db.execute("INSERT INTO dbz_signal VALUES ('s1', 'execute-snapshot', %s)",
                   params=(json.dumps({"data-collections": ["public.t"]}),))
        reads = 0
        empty = 0
        deadline = time.monotonic() + 60
        while reads < rows:
            assert time.monotonic() < deadline, f"timed out after {reads} reads"
            batch = connector.poll()
            got = [e for e in events(batch.records) if e.op is Op.READ]
            if reads and not got:
                empty += 1  # polled between the first chunk and the last
            reads += len(got)
            if batch.offset is not None:
                connector.commit(batch.offset)
    finally:
        connector.stop()
    windows = rows // chunk
    # Before: at least one empty batch a window (the watermarks' transactions, left out).
    assert empty < windows // 4, f"{empty} empty batches for {windows} windows"
